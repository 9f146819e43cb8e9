//! The bind loop (DESIGN §5): decide, send one txn, learn from the answer, until the key is bound.
//! Enforces G1 (one ID per key, one key per ID) through the protocol's compares, G2 (a held key
//! keeps its ID: only a record read from the store may move a key) and G3 (candidates come from
//! the pool's free set, with its prefix applied).

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use rand::Rng;
use tracing::{debug, warn};

use super::pool_state::{lock, PoolState};
use super::registry::{protocol_error, Inner};
use super::types::Acquired;
use crate::error::{Error, Result};
use crate::pool::Strategy;
use crate::protocol::bind_step::{Action, BindLoop, Candidates, Failure, Input};
pub(super) use crate::protocol::bind_step::{Hints, MAX_BIND_ATTEMPTS};
use crate::protocol::{self, BindOutcome, BindPlan, RefTarget};
use crate::store::{GetRequest, LeaseId, Revision, StoreError, TxnOp, TxnRequest};

/// How many resizes in a row the pinned holder's fence bump follows before it answers "retry".
const FENCE_ATTEMPTS: usize = 4;

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
fn check_key_record(pool: &PoolState, key: &str, id: u64) -> Result<()> {
    if protocol::id_is_allocatable(&pool.spec_now(), id) {
        return Ok(());
    }
    Err(foreign_key_record(pool, key, id))
}

/// The error for a key record naming `id`, which the pool never hands out (DESIGN §11, G3).
fn foreign_key_record(pool: &PoolState, key: &str, id: u64) -> Error {
    let spec = pool.spec_now();
    Error::corrupt(
        format!("the key record of {key:?} in pool {:?}", spec.name()),
        format!(
            "it names ID {id}, which the pool never hands out (range [{}, {}], reserved {:?}, prefix {:#x}); run `idalloc check`",
            spec.min(),
            spec.max(),
            spec.reserved(),
            spec.prefix_bits(),
        ),
    )
}

/// The pool is full (G6 `Exhausted`).
fn exhausted(pool: &PoolState) -> Error {
    let spec = pool.spec_now();
    Error::Exhausted {
        pool: spec.name().to_string(),
        min: spec.min(),
        max: spec.max(),
        capacity: spec.capacity(),
    }
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
        let _interactive = self.req.interactive();
        pool.live()?;
        // Without the pool's view (a lazily opened pool), candidates are guesses
        // the txn checks, for `random` pools. `lowest` needs the bottom of the pool, which no
        // bounded read gives (IDs are decimal, listed in string order): its loop reads the key
        // record first and, for a new key only, the pool's used IDs (keys only), never the view.
        let candidates = if !self.view_unloaded(pool) {
            self.wait_synced(pool).await?;
            Candidates::View
        } else {
            match pool.spec.strategy_kind() {
                Strategy::Random => Candidates::Probe,
                Strategy::Lowest => Candidates::UsedIds,
            }
        };
        let name = pool.spec.name();
        let cached = pool.lock_cache().get(key);
        let spec = pool.spec_now();
        let mut bl =
            BindLoop::new(&spec, key, cached, preferred, Hints::Strict).candidates(candidates);
        // The driver's half of the loop: execute each step, feed back what happened. Every branch
        // of the decisions is `BindLoop`'s (and unit-tested there); this only does the I/O.
        let mut input = Input::Resume;
        loop {
            let step = bl.next(input, |id| pool.lock_cache().record(id));
            if let Some((id, used)) = step.learn {
                pool.lock_cache().learn(id, used);
            }
            input = match step.action {
                Action::Pick { lost } => Input::Picked(self.pick_candidate(pool, lost).ok()),
                Action::ReadUsage => {
                    let (key_rec, used, revision) = self.read_key_and_usage(pool, key).await?;
                    Input::Usage { key_rec, used, revision }
                }
                Action::PeekKeyRecord => Input::KeyRecord(self.read_key_record(pool, key).await?),
                Action::LoadUsedIds => {
                    self.load_used_ids(pool).await?;
                    Input::Resume
                }
                Action::LoadView => {
                    self.wait_synced(pool).await?;
                    Input::Resume
                }
                Action::Wait(revision) => {
                    self.wait_applied(pool, revision).await;
                    Input::Resume
                }
                Action::Send(plan) => self.send_bind(pool, &mut bl, &plan, holder, leased).await?,
                Action::Done { id, new } => {
                    debug!(pool = %name, key, id, attempt = bl.attempts(), "bound");
                    return Ok(Acquired { id, new });
                }
                Action::Fail(failure) => return Err(self.bind_failure(pool, key, failure).await),
            };
        }
    }

    /// Sends one plan of `bl` and returns what it came to. A failure that ends the loop is fed to
    /// `bl` first (so it frees a claimed candidate) and then returned.
    async fn send_bind(
        self: &Arc<Self>,
        pool: &PoolState,
        bl: &mut BindLoop<'_>,
        plan: &BindPlan,
        holder: Option<&str>,
        leased: RefLease,
    ) -> Result<Input> {
        let abort = |bl: &mut BindLoop<'_>, e: Error| {
            if let Some((id, used)) = bl.next(Input::NotApplied { retry: false }, |_| None).learn {
                pool.lock_cache().learn(id, used);
            }
            e
        };
        let key = bl.key();
        let lease = match leased {
            RefLease::Durable => 0,
            RefLease::Session => match self.session_lease().await {
                Ok(l) => l,
                Err(e) => return Err(abort(bl, e)),
            },
            RefLease::Client(l) => l,
        };
        if leased == RefLease::Session {
            if let Err(e) = self.fence_earlier_lives(pool, lease).await {
                return Err(abort(bl, e));
            }
        }
        let target = holder.map(|h| RefTarget { holder: h, lease });
        let fences = match self.bind_fences(pool, [plan]) {
            Ok(f) => f,
            Err(e) => return Err(abort(bl, e)),
        };
        let req = plan.txn_fenced(&self.layout, pool.spec.name(), key, target, fences);
        let (result, doubt) = self.req.txn_noting_doubt(req).await;
        if doubt && leased == RefLease::Session {
            lock(&pool.doubt).insert(key.to_string());
        }
        match result {
            Ok(resp) => match plan.outcome_fenced(&resp, fences) {
                Ok(outcome) => {
                    if let BindOutcome::Observed(obs) = &outcome {
                        debug!(pool = %pool.spec.name(), key, ?obs, attempt = bl.attempts(), "bind compare failed; deciding again");
                    }
                    Ok(Input::Answer(outcome))
                }
                Err(pe) => Err(abort(bl, protocol_error(pe))),
            },
            Err(StoreError::LeaseNotFound(l)) if leased == RefLease::Client(l) => {
                Err(abort(bl, Error::lease_gone(l)))
            }
            Err(StoreError::LeaseNotFound(l)) if leased == RefLease::Session => {
                self.session_lost(l).await;
                Ok(Input::NotApplied { retry: true })
            }
            Err(e) => Err(abort(bl, e.into())),
        }
    }

    /// Before the cluster version is finalized, a process with a pinned holder name bumps its
    /// holder fence record in `pool` (on its session lease, one txn) before its first bind there
    /// on that lease. A bind of an earlier life under the same name, by a build that does not
    /// compare the holder's own reference, compares the holder record: applied after this bump,
    /// it fails, so it cannot move the reference back onto the earlier life's lease (whose end
    /// would take the reference of this life: G2). Nothing to do for a generated holder name
    /// (no earlier life shares it) or once finalized (every process compares its own reference).
    pub(super) async fn fence_earlier_lives(&self, pool: &PoolState, lease: LeaseId) -> Result<()> {
        if self.opts.holder.is_none()
            || !crate::cluster_version::bumps_pinned_holder(self.cluster_version())
            || *lock(&pool.pinned_fenced) == Some(lease)
        {
            return Ok(());
        }
        let name = pool.spec.name();
        let spec_key = self.layout.pool_spec_key(name);
        // The bump compares the spec version in force; a resize meanwhile is adopted and the bump
        // retried (a few times: each retry follows a resize that really happened).
        for _ in 0..FENCE_ATTEMPTS {
            let txn = TxnRequest::new()
                .when([crate::protocol::spec_compare(&self.layout, name, pool.spec_fence())])
                .and_then([TxnOp::put_on_lease(
                    self.layout.holder_key(name, &self.holder),
                    Vec::new(),
                    lease,
                )])
                .or_else([TxnOp::get_key(spec_key.clone())]);
            let resp = match self.req.txn(txn).await {
                Ok(resp) => resp,
                Err(StoreError::LeaseNotFound(_)) => return Ok(()),
                Err(e) => return Err(e.into()),
            };
            self.req.note_seen(resp.revision);
            if resp.succeeded {
                *lock(&pool.pinned_fenced) = Some(lease);
                return Ok(());
            }
            let spec_now = match resp.responses.first() {
                Some(crate::store::OpResponse::Get(g)) => g.kvs.first().cloned(),
                _ => None,
            };
            // Deleted or re-created: the error says so. Resized: adopted, and the bump retried.
            let err = self.pool_gone(pool, spec_now);
            if pool.live().is_err() {
                return Err(err);
            }
        }
        Err(pool.resized_error())
    }

    /// The error for a bind loop's `failure`.
    pub(super) async fn bind_failure(
        &self,
        pool: &PoolState,
        key: &str,
        failure: Failure,
    ) -> Error {
        let name = pool.spec.name();
        match failure {
            Failure::Exhausted => exhausted(pool),
            Failure::ViewBehind => Error::unavailable(format!(
                "pool {name:?}: the store has free IDs this process's view has not caught up with; retry"
            )),
            Failure::Contended => {
                warn!(pool = %name, key, "gave up binding after {MAX_BIND_ATTEMPTS} contended attempts");
                Error::unavailable(format!(
                    "key {key:?} in pool {name:?} stayed contended for {MAX_BIND_ATTEMPTS} attempts"
                ))
            }
            Failure::PoolGone { spec_now } => self.pool_gone(pool, spec_now),
            Failure::ForeignKeyRecord { id } => {
                self.unless_pool_gone(pool, foreign_key_record(pool, key, id)).await
            }
            // The driver returns its own error before asking; kept total rather than panicking.
            Failure::Aborted => Error::unavailable_for_good(format!(
                "the bind of key {key:?} in pool {name:?} stopped"
            )),
        }
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
            Some(kv) if kv.mod_revision == pool.spec_fence() => refusal,
            other => self.pool_gone(pool, other.cloned()),
        }
    }

    /// The key's record and the number of ID records of the pool that count as used (see below),
    /// with the revision they were read at (one round trip, two for a full pool; the exhausted
    /// path's confirmation).
    pub(super) async fn read_key_and_usage(
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
        let spec = pool.spec_now();
        if count < spec.capacity() {
            // Records the pool never hands out only add to the count: below capacity, the store
            // certainly has a free ID.
            return Ok((rec, count, resp.revision));
        }
        // At or over capacity, records the pool never hands out (out of range, reserved, without
        // the prefix, or not an ID at all: edited by hand) may fill the count while in-range IDs
        // are free (a record idalloc cannot read is not counted as free). Count only the IDs the
        // pool hands out; an unreadable
        // value on one still counts as used (DESIGN §11). Only a full (or tampered) pool pays
        // this listing.
        // Names only, counted page by page: the count needs neither the values nor the listing.
        let range = crate::store::KeyRange::prefix(self.layout.id_prefix(name));
        let count = |used: &mut u64, kvs: Vec<crate::store::KeyValue>| {
            *used += kvs
                .iter()
                .filter_map(|kv| self.layout.parse_id_key(name, &kv.key))
                .filter(|id| protocol::id_is_allocatable(&spec, *id))
                .count() as u64;
        };
        let pages = self.req.pages(&range, format!("pool {name:?}")).keys_only();
        let (used, revision) = pages.fold(|| 0u64, count).await?;
        self.req.note_seen(revision);
        Ok((rec, used, revision.max(resp.revision)))
    }

    /// Reads every ID record's name in `pool` (keys only: `used_ids.rs`) and marks each ID used
    /// in the cache's free set, one page at a time: what a lazily opened `lowest` pool needs to
    /// find its lowest free ID (see [`Candidates::UsedIds`]). The memory is one page plus the free
    /// set, whose runs of consecutive used IDs are one node each (a `lowest` pool is mostly one
    /// run), instead of the whole view (every key, every record value, a watch).
    ///
    /// What the cache knew before stays: IDs this process claimed or learned taken are still
    /// used, so a concurrent bind of this process does not pick them; anything stale is settled
    /// by the txn's compares, as for a guess.
    pub(super) async fn load_used_ids(&self, pool: &PoolState) -> Result<()> {
        let name = pool.spec.name();
        let range = crate::store::KeyRange::prefix(self.layout.id_prefix(name));
        let page = self.req.list_page.saturating_mul(super::used_ids::PAGE_FACTOR);
        let what = format!("pool {name:?}");
        let revision = super::used_ids::for_each_page(&self.req, &range, page, &what, |kvs| {
            let mut cache = pool.lock_cache();
            for kv in kvs {
                if let Some(id) = self.layout.parse_id_key(name, &kv.key) {
                    cache.learn(id, true);
                }
            }
        })
        .await?;
        self.req.note_seen(revision);
        Ok(())
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
            None => Err(exhausted(pool)),
        }
    }

    /// Waits until the pool's cache holds the whole pool, starting its follower first if the
    /// pool was opened lazily (`AllocatorOptions::lazy_view`). A large pool takes many pages to
    /// list; the wait gives up only when no page has arrived for a whole request budget
    /// (timeout × attempts), not after a fixed total. The time spent applying a complete
    /// listing is not held to that budget (`PoolState::applying`).
    pub(super) async fn wait_synced(&self, pool: &PoolState) -> Result<()> {
        self.follow(pool);
        let mut synced = pool.synced.subscribe();
        let mut progress = pool.list_progress.subscribe();
        let bound = self.opts.request_timeout * self.opts.retry.max_attempts;
        loop {
            pool.live()?;
            if *synced.borrow_and_update() {
                return Ok(());
            }
            // A listing that met damaged data: no retry will cure it (`sync::ends_waits`).
            pool.listing_failed()?;
            let moved = async {
                tokio::select! {
                    biased;
                    r = synced.changed() => r.is_ok(),
                    r = progress.changed() => r.is_ok(),
                }
            };
            // Every page is in and the view is being swapped: local work, not a stalled store
            // (`PoolState::applying`); it ends with `synced` or a wake-up.
            let moved = if pool.applying.load(std::sync::atomic::Ordering::Acquire) {
                Ok(moved.await)
            } else {
                tokio::time::timeout(bound, moved).await
            };
            if !matches!(moved, Ok(true)) {
                return Err(Error::unavailable(format!(
                    "pool {:?} could not be listed from the store: no progress within {bound:?}",
                    pool.spec.name()
                )));
            }
        }
    }
}
