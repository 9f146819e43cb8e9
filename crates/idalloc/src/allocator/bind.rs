//! The bind loop (DESIGN §5): decide, send one txn, learn from the answer, until the key is bound.
//! Enforces G1 (one ID per key, one key per ID) through the protocol's compares, G2 (a held key
//! keeps its ID: only a record read from the store may move a key) and G3 (candidates come from
//! the pool's free set, with its prefix applied).

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use rand::Rng;
use tracing::{debug, warn};

use super::pool_state::{lock, PoolState};
use super::registry::{protocol_error, Inner};
use super::types::Acquired;
use crate::error::{Error, Result};
use crate::layout::IdRecord;
use crate::pool::Strategy;
use crate::protocol::{self, decide, BindOutcome, BindPlan, Decision, RefTarget};
use crate::store::{GetRequest, Revision, StoreError};

/// Attempts of one bind loop before giving up with `Unavailable` (each attempt is one round trip and
/// only repeats because another writer changed the records in between).
pub(super) const MAX_BIND_ATTEMPTS: usize = 64;

/// On which lease a bind puts the holder's reference.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum RefLease {
    /// No lease: a durable reference.
    Durable,
    /// The allocator's own session lease (granted on first use, kept alive by the library).
    Session,
    /// A client session's lease (kept alive by its client; see [`crate::ClientSession`]).
    Client(crate::store::LeaseId),
}

/// A key record's value as an ID of `pool`: refused (never returned, never joined) if it is not a
/// number or names an ID the pool never hands out (outside its range, reserved, without its
/// prefix): the store holds something idalloc did not write (DESIGN §11, G3).
fn key_record_value(pool: &PoolState, key: &str, value: Option<&[u8]>) -> Result<Option<u64>> {
    let Some(value) = value else { return Ok(None) };
    let id = protocol::parse_id_value(value).ok_or_else(|| {
        Error::corrupt(
            format!("the key record of {key:?} in pool {:?}", pool.spec.name()),
            format!(
                "it holds {:?}, not an ID; run `idalloc check`",
                String::from_utf8_lossy(value)
            ),
        )
    })?;
    check_key_record(pool, key, id)?;
    Ok(Some(id))
}

/// Refuses a key record naming an ID the pool never hands out (see [`protocol::id_is_allocatable`]).
pub(super) fn check_key_record(pool: &PoolState, key: &str, id: u64) -> Result<()> {
    if protocol::id_is_allocatable(&pool.spec, id) {
        return Ok(());
    }
    Err(Error::corrupt(
        format!("the key record of {key:?} in pool {:?}", pool.spec.name()),
        format!(
            "it names ID {id}, which the pool never hands out (range [{}, {}], reserved {:?}, prefix {:#x}); run `idalloc check`",
            pool.spec.min(),
            pool.spec.max(),
            pool.spec.reserved(),
            pool.spec.prefix_bits(),
        ),
    ))
}

/// The move-off pin of a plan: the ID a key moves off and the mod revision of its record as read
/// from the store (`revision_of`). `decide` only asks to move a key off an ID whose record was
/// read (a cached record never proves another key's claim), so the revision is known; if it were
/// not, 0 ("absent") makes the txn fail and read the record back rather than move blindly.
pub(super) fn pinned(
    moved_from: Option<(u64, IdRecord)>,
    revision_of: impl Fn(u64) -> Option<Revision>,
) -> Option<(u64, Revision)> {
    moved_from.map(|(id, _)| (id, revision_of(id).unwrap_or(0)))
}

impl Inner {
    /// Runs the bind loop for `key` until it is bound (with `holder`'s reference, if given).
    /// `preferred` is the ID to keep if at all possible (repairs). Returns the ID and whether this
    /// call created the binding.
    pub(super) async fn bind(
        self: &Arc<Self>,
        pool: &PoolState,
        key: &str,
        holder: Option<&str>,
        leased: RefLease,
        preferred: Option<u64>,
    ) -> Result<Acquired> {
        pool.live()?;
        self.wait_synced(pool).await?;
        let name = pool.spec.name();
        let mut key_rec = pool.lock_cache().get(key);
        // ID records read from the store, with their mod revisions (0: absent).
        let mut observed: HashMap<u64, (Option<IdRecord>, Revision)> = HashMap::new();
        // Candidates that turned out taken: spreads `lowest` picks after collisions.
        let mut lost = 0u32;
        // The exhausted path's store read was done (and found the pool full / not full).
        let (mut full_confirmed, mut store_has_free) = (false, false);
        for attempt in 0..MAX_BIND_ATTEMPTS {
            let decision = {
                let cache = pool.lock_cache();
                decide(
                    key,
                    key_rec,
                    |id| match observed.get(&id) {
                        Some((rec, _)) => Some(rec.clone()),
                        // The cache may lag behind the store (a broken watch, a partition): it
                        // may still show an ID under a key it no longer belongs to. Only a record
                        // read from the store may prove that an ID belongs to another key (which
                        // moves this key to a fresh ID); an unverified "not ours" counts as
                        // unknown, so the next txn compares on it and reads it back.
                        None => match cache.record(id) {
                            Some(rec) if rec.key() == key => Some(Some(rec)),
                            _ => None,
                        },
                    },
                    preferred,
                )
            };
            let (plan, claimed) = match decision {
                Decision::Send(plan) => (plan, false),
                Decision::NeedCandidate { expect_key, moved_from } => {
                    let moved_from = pinned(moved_from, |id| observed.get(&id).map(|o| o.1));
                    match self.pick_candidate(pool, lost) {
                        Ok(id) => (BindPlan { expect_key, id, expect_id: None, moved_from }, true),
                        Err(_) if store_has_free => {
                            return Err(Error::unavailable(format!(
                                    "pool {name:?}: the store has free IDs this process's view has not caught up with; retry"
                                )));
                        }
                        Err(exhausted) if full_confirmed => return Err(exhausted),
                        Err(exhausted) => {
                            // A full pool is only final once the store confirms it: the key has
                            // no binding yet (the cache may lag behind another node's bind of
                            // it), and the store holds as many ID records as the pool has IDs
                            // (the cache may lag behind other nodes' reclaims). One read.
                            let (rec, records, revision) =
                                self.read_key_and_usage(pool, key).await?;
                            full_confirmed = true;
                            key_rec = rec;
                            if key_rec.is_some() || preferred.is_some() {
                                continue;
                            }
                            if records >= pool.spec.capacity() {
                                return Err(exhausted);
                            }
                            // Let the watch catch up with the store, then pick again.
                            self.wait_applied(pool, revision).await;
                            store_has_free = true;
                            continue;
                        }
                    }
                }
            };
            let lease = match leased {
                RefLease::Durable => 0,
                RefLease::Session => self.session_lease().await?,
                RefLease::Client(l) => l,
            };
            let target = holder.map(|h| RefTarget { holder: h, lease });
            let fences = self.fences(pool);
            let req = plan.txn_fenced(&self.layout, name, key, target, fences);
            let (result, doubt) = self.req.txn_noting_doubt(req).await;
            if doubt && leased == RefLease::Session {
                lock(&pool.doubt).insert(key.to_string());
            }
            let resp = match result {
                Ok(r) => r,
                Err(StoreError::LeaseNotFound(l)) if leased == RefLease::Client(l) => {
                    if claimed {
                        pool.lock_cache().learn(plan.id, false);
                    }
                    return Err(crate::client_session::lease_gone(l));
                }
                Err(StoreError::LeaseNotFound(l)) if leased == RefLease::Session => {
                    if claimed {
                        pool.lock_cache().learn(plan.id, false);
                    }
                    self.session_lost(l).await;
                    continue;
                }
                Err(e) => {
                    if claimed {
                        pool.lock_cache().learn(plan.id, false);
                    }
                    return Err(e.into());
                }
            };
            match plan.outcome_fenced(&resp, fences).map_err(protocol_error)? {
                BindOutcome::PoolGone { spec_now } => {
                    if claimed {
                        pool.lock_cache().learn(plan.id, false);
                    }
                    return Err(self.pool_gone(pool, spec_now));
                }
                BindOutcome::Bound { id, .. } => {
                    pool.lock_cache().learn(id, true);
                    debug!(pool = %name, key, id, attempt, "bound");
                    return Ok(Acquired { id, new: plan.creates_binding() });
                }
                BindOutcome::Observed(obs) => {
                    debug!(pool = %name, key, ?obs, attempt, "bind compare failed; deciding again");
                    pool.lock_cache().learn(obs.id, obs.id_rec.is_some());
                    if claimed && obs.id_rec.is_some() {
                        lost += 1;
                    }
                    // Let the cache catch up with what the failed attempt saw before choosing
                    // again: a collision usually means others are binding too, and the watch
                    // teaches all their IDs at once where the read-back teaches one.
                    self.wait_applied(pool, obs.records_revision).await;
                    observed.insert(obs.id, (obs.id_rec, obs.records_revision));
                    if let Some((from, rec, rev)) = obs.moved_from {
                        observed.insert(from, (rec, rev));
                    }
                    key_rec = obs.key_rec;
                    if let Some(x) = key_rec {
                        if let Err(e) = check_key_record(pool, key, x) {
                            return Err(self.unless_pool_gone(pool, e).await);
                        }
                    }
                }
            }
        }
        warn!(pool = %name, key, "gave up binding after {MAX_BIND_ATTEMPTS} contended attempts");
        Err(Error::unavailable(format!(
            "key {key:?} in pool {name:?} stayed contended for {MAX_BIND_ATTEMPTS} attempts"
        )))
    }

    pub(super) async fn read_key_record(&self, pool: &PoolState, key: &str) -> Result<Option<u64>> {
        let k = self.layout.key_key(pool.spec.name(), key);
        let resp = self.req.call(|| self.req.store.get(GetRequest::key(k.clone()))).await?;
        self.req.note_seen(resp.revision);
        match key_record_value(pool, key, resp.kvs.first().map(|kv| kv.value.as_slice())) {
            Ok(rec) => Ok(rec),
            Err(e) => Err(self.unless_pool_gone(pool, e).await),
        }
    }

    /// `refusal` (a key record this handle's spec would never write), unless the reason is that
    /// the pool was deleted or re-created under this handle: a key record of the new pool may
    /// name an ID outside the old spec. Then the pool's state retires and the error says so
    /// (found by the simulation's pool-deletion step: a stale handle told the caller to run
    /// `idalloc check` on a healthy pool). One read, on this error path only.
    pub(super) async fn unless_pool_gone(&self, pool: &PoolState, refusal: Error) -> Error {
        let key = self.layout.pool_spec_key(pool.spec.name());
        let resp = match self.req.call(|| self.req.store.get(GetRequest::key(key.clone()))).await {
            Ok(r) => r,
            Err(_) => return refusal,
        };
        match resp.kvs.first() {
            Some(kv) if kv.create_revision == pool.spec_rev => refusal,
            other => self.pool_gone(pool, other.map(|kv| kv.value.clone())),
        }
    }

    /// The key's record and the number of ID records of the pool that count as used (see below),
    /// with the revision they were read at (one round trip, two for a full pool; the exhausted
    /// path's confirmation).
    async fn read_key_and_usage(
        &self,
        pool: &PoolState,
        key: &str,
    ) -> Result<(Option<u64>, u64, Revision)> {
        let name = pool.spec.name();
        let txn = crate::store::TxnRequest::new().and_then([
            crate::store::TxnOp::get_key(self.layout.key_key(name, key)),
            crate::store::TxnOp::get(
                GetRequest::new(crate::store::KeyRange::prefix(self.layout.id_prefix(name)))
                    .count_only(),
            ),
        ]);
        let resp = self.req.txn(txn).await?;
        let (rec, count) = match resp.responses.as_slice() {
            [crate::store::OpResponse::Get(k), crate::store::OpResponse::Get(ids)] => {
                (k.kvs.first().map(|kv| kv.value.clone()), ids.count)
            }
            other => {
                return Err(protocol_error(protocol::ProtocolError::Shape(format!(
                    "expected two get results, got {other:?}"
                ))))
            }
        };
        let rec = match key_record_value(pool, key, rec.as_deref()) {
            Ok(rec) => rec,
            Err(e) => return Err(self.unless_pool_gone(pool, e).await),
        };
        let count = u64::try_from(count).unwrap_or(0);
        if count < pool.spec.capacity() {
            // Records the pool never hands out only add to the count: below capacity, the store
            // certainly has a free ID.
            return Ok((rec, count, resp.revision));
        }
        // At or over capacity, records the pool never hands out (out of range, reserved, without
        // the prefix, or not an ID at all: edited by hand) may fill the count while in-range IDs
        // are free (issue 9, weak spot b). Count only the IDs the pool hands out; an unreadable
        // value on one still counts as used (DESIGN §11). Only a full (or tampered) pool pays
        // this listing.
        let range = crate::store::KeyRange::prefix(self.layout.id_prefix(name));
        let (kvs, revision) = self
            .req
            .call(|| crate::store::list_all(&*self.req.store, &range, self.req.list_page))
            .await?;
        self.req.note_seen(revision);
        let used = kvs
            .iter()
            .filter_map(|kv| self.layout.parse_id_key(name, &kv.key))
            .filter(|id| protocol::id_is_allocatable(&pool.spec, *id))
            .count();
        Ok((rec, used as u64, revision.max(resp.revision)))
    }

    /// Waits (briefly, bounded) until the pool's cache has applied `revision`.
    pub(super) async fn wait_applied(&self, pool: &PoolState, revision: Revision) {
        if revision == 0 {
            return;
        }
        let mut rx = pool.applied.subscribe();
        let bound = self.opts.request_timeout.min(Duration::from_millis(500));
        let _ =
            tokio::time::timeout(bound, async { rx.wait_for(|r| *r >= revision).await.is_ok() })
                .await;
    }

    /// [`Inner::pick_candidate`], passing over the IDs in `avoid` (other keys' preferred IDs in a
    /// batched bind). A passed-over ID stays claimed in `passed_over` until the caller frees it
    /// (so the next pick moves on); when nothing else is free, one of them is used after all.
    pub(super) fn pick_avoiding(
        &self,
        pool: &PoolState,
        lost: u32,
        avoid: &HashSet<u64>,
        passed_over: &mut Vec<u64>,
    ) -> Result<u64> {
        loop {
            match self.pick_candidate(pool, lost) {
                Ok(id) if avoid.contains(&id) && passed_over.len() < avoid.len() => {
                    passed_over.push(id)
                }
                Ok(id) => return Ok(id),
                Err(exhausted) => return passed_over.pop().ok_or(exhausted),
            }
        }
    }

    /// Picks a free ID and marks it used locally, so concurrent binds in this process do not race
    /// for the same candidate. After `lost` collisions, `lowest` picks among the lowest
    /// `2^lost` (at most 64) free IDs instead of always the lowest, so nodes that keep choosing the
    /// same ID spread out.
    pub(super) fn pick_candidate(&self, pool: &PoolState, lost: u32) -> Result<u64> {
        let mut cache = pool.lock_cache();
        let raw = {
            let mut rng = lock(&self.rng);
            let free = cache.free_ids();
            match pool.spec.strategy_kind() {
                Strategy::Lowest if lost > 0 => {
                    let spread = (1u64 << lost.min(6)).min(free.free_count());
                    if spread == 0 {
                        None
                    } else {
                        free.nth_free(rng.random_range(0..spread))
                    }
                }
                strategy => free.pick(strategy, &mut *rng),
            }
        };
        match raw {
            Some(raw) => {
                cache.free_ids().insert(raw);
                Ok(pool.spec.apply_prefix(raw))
            }
            None => Err(Error::Exhausted {
                pool: pool.spec.name().to_string(),
                min: pool.spec.min(),
                max: pool.spec.max(),
                capacity: pool.spec.capacity(),
            }),
        }
    }

    /// Waits until the pool's cache holds the whole pool. A large pool takes many pages to list;
    /// the wait gives up only when no page has arrived for a whole request budget (timeout ×
    /// attempts), not after a fixed total.
    pub(super) async fn wait_synced(&self, pool: &PoolState) -> Result<()> {
        let mut synced = pool.synced.subscribe();
        let mut progress = pool.list_progress.subscribe();
        let bound = self.opts.request_timeout * self.opts.retry.max_attempts;
        loop {
            pool.live()?;
            if *synced.borrow_and_update() {
                return Ok(());
            }
            let moved = tokio::time::timeout(bound, async {
                tokio::select! {
                    biased;
                    r = synced.changed() => r.is_ok(),
                    r = progress.changed() => r.is_ok(),
                }
            })
            .await;
            if !matches!(moved, Ok(true)) {
                return Err(Error::unavailable(format!(
                    "pool {:?} could not be listed from the store: no progress within {bound:?}",
                    pool.spec.name()
                )));
            }
        }
    }
}

/// How far a batched bind trusts the cache about a key's preferred ID.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Hints {
    /// A preferred ID the cache shows taken is skipped for a normal pick (restart restoration:
    /// skipping a hint is always safe, and it saves a failing txn).
    Lenient,
    /// Only a record read from the store moves a key off its preferred ID, as in [`Inner::bind`]
    /// (re-referencing held keys: moving one means a `Conflict` for the application, G2).
    Strict,
}
