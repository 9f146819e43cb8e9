//! The allocator's shared state ([`Inner`]) and its pool registry: one [`PoolState`] per open pool,
//! each with its sync task (and sweeper), read from and checked against its spec record
//! (DESIGN §11: nothing is written into a deleted or re-created pool).

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use rand::rngs::StdRng;
use rand::Rng;
use tokio::sync::broadcast;
use tokio::task::AbortHandle;
use tracing::{info, warn};

use super::pool_state::{lock, PoolState};
use super::repair_queue::RepairQueue;
use super::request::Requester;
use super::types::AllocatorOptions;
use crate::cache::PoolCache;
use crate::error::{Error, Result};
use crate::layout::Layout;
use crate::pool::PoolSpec;
use crate::protocol::{self, init_pool_outcome, Fences};
use crate::store::{GetRequest, LeaseId, Revision};

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

    /// Every fence of a write to `pool` sent now (see [`Fences`]).
    pub(super) fn fences(&self, pool: &PoolState) -> Fences {
        Fences { spec_rev: Some(pool.spec_rev), seen: Some(self.fence(pool)) }
    }

    /// The error for a write that found `pool`'s spec changed (`spec_now`: the spec there now, if
    /// the pool was re-created): `PoolNotFound` (deleted), `RangeMismatch` (re-created with
    /// another spec) or `PoolReplaced` (re-created with the same spec). Retires the pool's state
    /// (every handle on it returns that error from now on, its background tasks stop) and forgets
    /// it, so the next `pool()` reads the spec afresh.
    pub(super) fn pool_gone(&self, pool: &PoolState, spec_now: Option<Vec<u8>>) -> Error {
        let name = pool.spec.name();
        warn!(pool = %name, "the pool was deleted (or re-created) under this handle");
        let err = pool.gone_error(spec_now);
        self.retire(pool, err.clone());
        pool.live().err().unwrap_or(err)
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

    /// The spec of pool `name` and the create revision of its record (every write compares it),
    /// `None` if it has none. A spec record that cannot be used (unreadable, or holding another
    /// pool's spec) is an error naming the record, never trusted.
    pub(super) async fn read_spec(&self, name: &str) -> Result<Option<(PoolSpec, Revision)>> {
        let key = self.layout.pool_spec_key(name);
        let resp = self.req.call(|| self.req.store.get(GetRequest::key(key.clone()))).await?;
        self.req.note_seen(resp.revision);
        match resp.kvs.first() {
            None => Ok(None),
            Some(kv) => crate::records::parse_spec(&self.layout, kv)
                .map(|spec| Some((spec, kv.create_revision)))
                .map_err(Error::from),
        }
    }

    pub(super) async fn init_pool(&self, spec: &PoolSpec) -> Result<(PoolSpec, Revision)> {
        spec.validate()?;
        let json = spec.to_json();
        let resp = self.req.txn(protocol::init_pool_txn(&self.layout, spec.name(), json)).await?;
        match init_pool_outcome(&resp).map_err(protocol_error)? {
            (None, rev) => {
                info!(pool = %spec.name(), spec = %spec, "pool created");
                Ok((spec.clone(), rev))
            }
            (Some(existing), rev) => {
                // The one parser of spec records: an unreadable spec or one naming another pool
                // is corrupt data, not a spec that differs.
                let kv = crate::store::KeyValue {
                    key: self.layout.pool_spec_key(spec.name()),
                    value: existing,
                    create_revision: 0,
                    mod_revision: 0,
                    version: 0,
                    lease: 0,
                };
                let existing = crate::records::parse_spec(&self.layout, &kv)?;
                if existing == *spec {
                    Ok((existing, rev))
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

    pub(super) fn open_state(
        self: &Arc<Self>,
        spec: PoolSpec,
        spec_rev: Revision,
    ) -> Arc<PoolState> {
        let mut pools = lock(&self.pools);
        if let Some(p) = pools.get(spec.name()) {
            if p.spec_rev == spec_rev && p.live().is_ok() {
                return p.clone();
            }
            // The pool was deleted and re-created since: a fresh state for the new one, and the
            // old state (and every handle on it) retires.
            let err = if p.spec == spec {
                Error::PoolReplaced { pool: spec.name().to_string() }
            } else {
                Error::RangeMismatch {
                    pool: spec.name().to_string(),
                    existing: Box::new(spec.clone()),
                    requested: Box::new(p.spec.clone()),
                }
            };
            p.retire(err);
        }
        let (events, _) = broadcast::channel(self.opts.event_buffer.max(1));
        let (mesh, _) = broadcast::channel(self.opts.event_buffer.max(1));
        let (stamped, _) = broadcast::channel(self.opts.event_buffer.max(1));
        let (synced, _) = tokio::sync::watch::channel(false);
        let (applied, _) = tokio::sync::watch::channel(0);
        let (list_progress, _) = tokio::sync::watch::channel(0);
        let state = Arc::new(PoolState {
            cache: Mutex::new(PoolCache::new(spec.clone())),
            spec,
            spec_rev,
            doubt: Mutex::new(HashSet::new()),
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
        *state.lock_cache() = PoolCache::new(state.spec.clone());
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
        let task = tokio::spawn(super::spec_watch::run(
            Arc::downgrade(&self.req),
            self.layout.clone(),
            state.clone(),
            self.jitter_seed(),
        ));
        lock(&self.tasks).push(task.abort_handle());
        lock(&state.tasks).push(task.abort_handle());
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
