//! The allocator's shared state ([`Inner`]) and its pool registry: one [`PoolState`] per open pool,
//! each with its sync task (and sweeper), read from and checked against its spec record
//! (DESIGN §11: nothing is written into a deleted or re-created pool).

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, Mutex};

use super::lazy_broadcast::LazyBroadcast;
use rand::rngs::StdRng;
use rand::Rng;
use tokio::task::AbortHandle;
use tracing::info;

use super::pool_state::{lock, PoolState, SpecVersion};
use super::repair_queue::RepairQueue;
use super::request::Requester;
use super::types::AllocatorOptions;
use crate::cache::PoolCache;
use crate::cluster_version;
use crate::error::{Error, Result};
use crate::layout::Layout;
use crate::pool::PoolSpec;
use crate::protocol::{self, Fences};
use crate::store::{GetRequest, KeyValue, LeaseId, OpResponse, Revision, TxnOp, TxnRequest};

/// A pool's spec as read from its record.
pub(crate) struct SpecRead {
    pub(crate) spec: PoolSpec,
    /// The record's create revision: the pool's incarnation.
    pub(crate) created: Revision,
    /// The record's mod revision: the spec version (a resize changes it).
    pub(crate) rev: Revision,
}

/// The session lease's state (its behaviour: `session.rs`).
#[derive(Default)]
pub(super) struct Session {
    pub(super) lease: Option<LeaseId>,
    pub(super) keepalive_started: bool,
}

/// Everything the allocator shares between its handles and background tasks.
pub(crate) struct Inner {
    /// The one request path (timeouts, retries, revisions seen).
    pub(crate) req: Arc<Requester>,
    pub(crate) layout: Layout,
    pub(crate) opts: AllocatorOptions,
    pub(super) holder: String,
    pub(super) session: tokio::sync::Mutex<Session>,
    pub(super) pools: Mutex<HashMap<String, Arc<PoolState>>>,
    pub(super) rng: Mutex<StdRng>,
    pub(super) tasks: Mutex<Vec<AbortHandle>>,
    pub(super) repairs: RepairQueue,
    pub(super) closed: AtomicBool,
    /// The cluster version in force last read with a pool's spec (0 until then;
    /// `cluster_version.rs`).
    pub(super) cluster_version: AtomicU32,
    /// The one watch of the spec records, for every followed pool (`spec_watch.rs`).
    pub(super) spec_watch: Arc<super::spec_watch::SpecWatch>,
}

impl Drop for Inner {
    fn drop(&mut self) {
        for t in lock(&self.tasks).drain(..) {
            t.abort();
        }
    }
}

impl Inner {
    /// A store request with the allocator's timeout and retries, for [`crate::ClientSession`].
    pub(crate) async fn lease_call<T, F, Fut>(&self, f: F) -> crate::store::StoreResult<T>
    where
        F: Fn(Arc<dyn crate::store::Store>) -> Fut,
        Fut: std::future::Future<Output = crate::store::StoreResult<T>>,
    {
        self.req.call(|| f(self.req.store.clone())).await
    }

    /// This allocator's holder name.
    pub(crate) fn holder(&self) -> &str {
        &self.holder
    }

    /// The fence for a write to `pool` sent now: the newest revision seen in a response or applied
    /// by the pool's cache (both happened before this send).
    pub(super) fn fence(&self, pool: &PoolState) -> Revision {
        self.req.seen().max(*pool.applied.borrow())
    }

    /// The fences of binds sent now for `plans`, which must have been decided against the spec
    /// version the fences name: a plan creating a binding whose ID that version does not hand out
    /// was decided against an older range (a shrink came in between), and is not sent (a
    /// retryable `Unavailable`). Without this check the newer fence would let the stale ID in.
    pub(super) fn bind_fences<'a>(
        &self,
        pool: &PoolState,
        plans: impl IntoIterator<Item = &'a protocol::BindPlan>,
    ) -> Result<Fences> {
        let (spec, rev) = pool.version();
        if plans
            .into_iter()
            .any(|p| p.creates_binding() && !protocol::id_is_allocatable(&spec, p.id))
        {
            return Err(pool.resized_error());
        }
        Ok(Fences { spec_rev: Some(rev), seen: Some(self.fence(pool)) })
    }

    /// Every fence of a write to `pool` sent now (see [`Fences`]).
    pub(super) fn fences(&self, pool: &PoolState) -> Fences {
        Fences { spec_rev: Some(pool.spec_fence()), seen: Some(self.fence(pool)) }
    }

    /// The error for a write that found `pool`'s spec changed (`spec_now`: the spec there now, if
    /// the pool was re-created): `PoolNotFound` (deleted), `RangeMismatch` (re-created with
    /// another spec) or `PoolReplaced` (re-created with the same spec). Retires the pool's state
    /// (every handle on it returns that error from now on, its background tasks stop) and forgets
    /// it, so the next `pool()` reads the spec afresh.
    ///
    /// A record of the same incarnation with a newer version is a resize: the state adopts it
    /// (nothing retires) and the error says to retry (see [`PoolState::spec_moved`]).
    pub(super) fn pool_gone(&self, pool: &PoolState, spec_now: Option<KeyValue>) -> Error {
        let err = pool.spec_moved(spec_now);
        if pool.live().is_err() {
            self.retire(pool, err.clone());
        }
        err
    }

    /// Retires `pool` with `err` (see [`PoolState::retire`]) and removes it from the registry if
    /// it is still the registered state of its name.
    pub(super) fn retire(&self, pool: &PoolState, err: Error) {
        let name = pool.spec.name();
        {
            let mut pools = lock(&self.pools);
            if pools.get(name).is_some_and(|p| std::ptr::eq(&**p, pool)) {
                pools.remove(name);
            }
        }
        pool.retire(err);
    }

    /// The spec of pool `name` with its record's create revision (the incarnation) and mod
    /// revision (the version every write compares), `None` if it has none. A spec record that
    /// cannot be used (unreadable, or holding another pool's spec) is an error naming the record,
    /// never trusted.
    pub(super) async fn read_spec(&self, name: &str) -> Result<Option<SpecRead>> {
        let key = self.layout.pool_spec_key(name);
        // The cluster version comes with the spec, in the same round trip.
        let read = TxnRequest::new().and_then([
            TxnOp::get(GetRequest::key(key.clone())),
            cluster_version::read_op(&self.layout),
        ]);
        let resp = self.req.call(|| self.req.store.txn(read.clone())).await?;
        self.req.note_seen(resp.revision);
        self.note_cluster_version(resp.responses.get(1))?;
        let spec = match resp.responses.first() {
            Some(OpResponse::Get(g)) => g.kvs.first(),
            other => {
                return Err(protocol_error(protocol::ProtocolError::Shape(format!(
                    "expected the spec read, got {other:?}"
                ))))
            }
        };
        match spec {
            None => Ok(None),
            Some(kv) => crate::records::parse_spec(&self.layout, kv)
                .map(|spec| {
                    Some(SpecRead { spec, created: kv.create_revision, rev: kv.mod_revision })
                })
                .map_err(Error::from),
        }
    }

    /// Records the cluster version in force read in `r` and refuses a store whose recorded
    /// version this build does not run on.
    fn note_cluster_version(&self, r: Option<&OpResponse>) -> Result<()> {
        let records = cluster_version::from_response(&self.layout, r)?;
        cluster_version::check_supported(&self.layout, records.version)?;
        let version = records.in_force();
        let before = self.cluster_version.swap(version, Ordering::AcqRel);
        if before != version {
            info!(
                prefix = %self.layout.prefix(),
                cluster_version = records.version,
                grace = records.grace,
                in_force = version,
                "cluster version read"
            );
        }
        Ok(())
    }

    /// The cluster version in force last read (0 if none was read yet; the version before the
    /// recorded one while the grace after its finalize runs).
    pub(super) fn cluster_version(&self) -> u32 {
        self.cluster_version.load(Ordering::Acquire)
    }

    pub(super) async fn init_pool(&self, spec: &PoolSpec) -> Result<SpecRead> {
        spec.validate()?;
        let json = spec.to_json();
        let mut txn = protocol::init_pool_txn(&self.layout, spec.name(), json);
        txn.success.push(cluster_version::read_op(&self.layout));
        txn.failure.push(cluster_version::read_op(&self.layout));
        let resp = self.req.txn(txn).await?;
        self.note_cluster_version(resp.responses.last())?;
        match protocol::init_pool_record(&resp).map_err(protocol_error)? {
            None => {
                info!(pool = %spec.name(), spec = %spec, "pool created");
                Ok(SpecRead { spec: spec.clone(), created: resp.revision, rev: resp.revision })
            }
            Some(kv) => {
                // The one parser of spec records: an unreadable spec or one naming another pool
                // is corrupt data, not a spec that differs.
                let existing = crate::records::parse_spec(&self.layout, kv)?;
                if existing == *spec {
                    Ok(SpecRead {
                        spec: existing,
                        created: kv.create_revision,
                        rev: kv.mod_revision,
                    })
                } else {
                    Err(Error::RangeMismatch {
                        pool: spec.name().to_string(),
                        existing: Box::new(existing),
                        requested: Box::new(spec.clone()),
                    })
                }
            }
        }
    }

    pub(super) fn open_state(self: &Arc<Self>, read: SpecRead) -> Arc<PoolState> {
        let SpecRead { spec, created: spec_rev, rev } = read;
        let mut pools = lock(&self.pools);
        if let Some(p) = pools.get(spec.name()) {
            if p.spec_rev == spec_rev && p.live().is_ok() {
                // The same pool, perhaps resized since this state last looked.
                p.adopt(spec, rev);
                return p.clone();
            }
            // The pool was deleted and re-created since: a fresh state for the new one, and the
            // old state (and every handle on it) retires.
            let err = if *p.spec_now() == spec {
                Error::PoolReplaced { pool: spec.name().to_string() }
            } else {
                Error::RangeMismatch {
                    pool: spec.name().to_string(),
                    existing: Box::new(spec.clone()),
                    requested: Box::new((*p.spec_now()).clone()),
                }
            };
            p.retire(err);
        }
        // Allocated at their first subscriber: an idle pool costs no event buffers.
        let events = LazyBroadcast::new(self.opts.event_buffer);
        let mesh = LazyBroadcast::new(self.opts.event_buffer);
        let stamped = LazyBroadcast::new(self.opts.event_buffer);
        let (synced, _) = tokio::sync::watch::channel(false);
        let (applied, _) = tokio::sync::watch::channel(0);
        let (list_progress, _) = tokio::sync::watch::channel(0);
        let state = Arc::new(PoolState {
            cache: Mutex::new(PoolCache::new(spec.clone())),
            now: std::sync::RwLock::new(SpecVersion { spec: Arc::new(spec.clone()), rev }),
            spec,
            spec_rev,
            doubt: Mutex::new(HashSet::new()),
            pinned_fenced: Mutex::new(None),
            held: Mutex::new(HashMap::default()),
            key_locks: Mutex::new(HashMap::new()),
            events: Mutex::new(Some(events)),
            stamped,
            through: std::sync::atomic::AtomicI64::new(0),
            mesh,
            remotes: std::sync::RwLock::default(),
            listed: AtomicBool::new(false),
            following: AtomicBool::new(false),
            synced,
            applied,
            list_progress,
            list_failure: Mutex::new(None),
            applying: AtomicBool::new(false),
            quarantine: tokio::sync::Mutex::new(None),
            relist: Arc::default(),
            idle_since: Mutex::new(HashMap::new()),
            lanes: Default::default(),
            retired: Mutex::new(None),
            tasks: Mutex::new(Vec::new()),
        });
        pools.insert(state.spec.name().to_string(), state.clone());
        drop(pools);
        crate::metrics::pool_opened(state.spec.name());
        if !self.opts.lazy_view {
            self.follow(&state);
        }
        if let Some(interval) = self.opts.sweep_interval {
            let task = tokio::spawn(super::sweeper::run(
                Arc::downgrade(&self.req),
                self.layout.clone(),
                state.clone(),
                interval,
            ));
            lock(&self.tasks).push(task.abort_handle());
            lock(&state.tasks).push(task.abort_handle());
        }
        state
    }
}

impl Inner {
    /// Starts `pool`'s follower (list `id/`, then watch: DESIGN §6) and its spec watch unless
    /// they run already or the pool retired. Every path that needs the whole view calls this
    /// before it waits for the listing; with `AllocatorOptions::lazy_view` it is the only place
    /// the listing starts.
    pub(crate) fn follow(&self, pool: &PoolState) {
        if pool.live().is_err() || pool.following.swap(true, Ordering::AcqRel) {
            return;
        }
        // The task owns its pool: the registry's `Arc` (a retired state is no longer there, and
        // then nothing needs following).
        let Some(state) =
            lock(&self.pools).get(pool.spec.name()).filter(|p| std::ptr::eq(&***p, pool)).cloned()
        else {
            return;
        };
        // What a lazy pool learned by guessing (IDs found taken) may be stale by the time the
        // listing arrives, and the listing only sets the IDs it holds: start from an empty view
        // so that the listing alone decides. A bind guessing meanwhile at worst picks a candidate
        // another bind of this process holds, and the txn's compares settle that.
        *state.lock_cache() = PoolCache::new((*state.spec_now()).clone());
        let task = tokio::spawn(super::sync::run(
            Arc::downgrade(&self.req),
            self.layout.clone(),
            self.repairs.clone(),
            state.clone(),
            self.jitter_seed(),
        ));
        lock(&self.tasks).push(task.abort_handle());
        lock(&state.tasks).push(task.abort_handle());
        // The spec watch retires the state the moment the pool is deleted, for the view's
        // subscribers; a pool without a view has none, and its writes compare the spec anyway.
        let (shared, once) =
            self.spec_watch.follow(&self.req, &self.layout, &state, self.jitter_seed());
        lock(&self.tasks).extend(shared.into_iter().chain([once.clone()]));
        lock(&state.tasks).push(once);
    }

    /// A seed for a follower's retry jitter (`backoff.rs`), from the allocator's generator: a
    /// seeded allocator replays the same waits, and followers of different processes differ.
    pub(crate) fn jitter_seed(&self) -> u64 {
        lock(&self.rng).random()
    }

    /// True while `pool` has no follower: its cache knows only what this process wrote.
    pub(crate) fn view_unloaded(&self, pool: &PoolState) -> bool {
        !pool.following.load(Ordering::Acquire)
    }
}

pub(super) fn protocol_error(e: protocol::ProtocolError) -> Error {
    e.into()
}
