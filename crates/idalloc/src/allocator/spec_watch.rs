//! Notices that a pool this process has open was deleted (or deleted and re-created) by anyone,
//! this process or another, and retires the pool's state at once, so that its subscribers are told
//! (a `Delete` per binding, then the end of their stream: docs/design/fences.md)
//! instead of mirroring a pool that no longer exists until some write happens to fail its spec
//! compare.
//!
//! The cache follows `id/` only (DESIGN §4), and a pool deleted while empty changes nothing there,
//! so the spec records are followed too: one [`Sink`] of the watch loop (`feed.rs`) on the whole
//! `P/pools/` range for all of the process's pools, not a watch per pool (each etcd watch stream
//! costs its gRPC buffers and an etcd watcher: most of an idle pool's memory). The changes it
//! dispatches by name are a delete, a re-creation (a new create revision) and a resize (the same
//! create revision, a new mod revision), which the state adopts: every process with the pool open
//! learns the new range from here (docs/design/resize.md).
//!
//! A pool joins the shared watch after it read its spec; a change between that read and the
//! shared watch's position would be missed, so each pool also reads its spec record once after
//! joining (in the background, as the per-pool watch's first listing did): every change is then
//! either at or before that read's revision or dispatched by the shared watch. Seeing one twice
//! is harmless: retiring is idempotent and a resize is adopted only when newer than the one in
//! force.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};
use std::sync::{Arc, Mutex, Weak};

use tokio::task::AbortHandle;

use crate::allocator::pool_state::{lock, PoolState};
use crate::allocator::request::Requester;
use crate::error::Error;
use crate::feed::{self, FeedConfig, Gone, Sink};
use crate::layout::Layout;
use crate::store::{KeyRange, KeyValue, Revision, WatchEvent};

/// Spec records per page of the shared watch's listing (at its start and after a compaction).
const LISTING_PAGE: i64 = 500;

/// What a spec record read or watched says about the incarnation `spec_rev`: still there (`None`),
/// or gone with the spec there now (`Some(None)`: deleted; `Some(Some(bytes))`: re-created).
/// A resize keeps the incarnation (same create revision).
fn spec_gone(spec_rev: Revision, now: Option<&KeyValue>) -> Option<Option<Vec<u8>>> {
    match now {
        Some(kv) if kv.create_revision == spec_rev => None,
        Some(kv) => Some(Some(kv.value.clone())),
        None => Some(None),
    }
}

/// Retires `pool` if `now` (its spec record, `None` if absent) says its incarnation is gone, or
/// adopts a newer version of it (a resize); `Gone` once the pool is retired (nothing more to
/// follow for it).
fn check(pool: &PoolState, now: Option<&KeyValue>) -> Result<(), Gone> {
    if pool.live().is_err() {
        return Err(Gone);
    }
    match spec_gone(pool.spec_rev, now) {
        None => {
            // Still this pool; a newer version of its record is a resize, adopted here so that
            // every process learns the new range without waiting for a write to fail.
            if let Some(kv) = now.filter(|kv| kv.mod_revision > pool.spec_fence()) {
                // A version that cannot be used (unreadable, or changing more than the range)
                // retires the state as a re-creation would.
                let _ = pool.spec_moved(Some(kv.clone()));
                if pool.live().is_err() {
                    return Err(Gone);
                }
            }
            Ok(())
        }
        Some(spec_now) => {
            let err: Error = pool.gone_error(spec_now);
            tracing::warn!(pool = %pool.spec.name(), error = %err, "the pool was deleted; its subscribers are told");
            pool.retire(err);
            Err(Gone)
        }
    }
}

/// The process's one watch of the spec records, and the pools it dispatches to by name.
#[derive(Default)]
pub(crate) struct SpecWatch {
    /// The followed pools by name (a re-opened name replaces its retired state). Weak: the
    /// registry owns the states; a retired one is dropped from here at its next change.
    pools: Mutex<HashMap<String, Weak<PoolState>>>,
    /// The newest revision the shared watch has seen (where it resumes).
    revision: AtomicI64,
    started: AtomicBool,
}

impl SpecWatch {
    /// Follows `pool`'s spec record from now on: starts the shared watch if it is not running,
    /// and reads the record once. The tasks to abort when the allocator closes, and (the read)
    /// when the pool retires: `(allocator's, pool's)`.
    pub(crate) fn follow(
        self: &Arc<Self>,
        req: &Arc<Requester>,
        layout: &Layout,
        pool: &Arc<PoolState>,
        jitter_seed: u64,
    ) -> (Option<AbortHandle>, AbortHandle) {
        lock(&self.pools).insert(pool.spec.name().to_string(), Arc::downgrade(pool));
        let config = |range, page| FeedConfig {
            store: req.store.clone(),
            range,
            page,
            relist_after_outage: false,
            probe: None,
            request_timeout: None,
            jitter_seed,
        };
        let shared = (!self.started.swap(true, Ordering::AcqRel)).then(|| {
            let cfg = config(KeyRange::prefix(layout.pools_prefix()), LISTING_PAGE);
            let sink = SharedSink {
                req: Arc::downgrade(req),
                watch: self.clone(),
                layout: layout.clone(),
            };
            tokio::spawn(feed::follow(cfg, Arc::default(), sink)).abort_handle()
        });
        let cfg = config(KeyRange::key(layout.pool_spec_key(pool.spec.name())), 1);
        let sink = OnceSink { req: Arc::downgrade(req), pool: pool.clone() };
        let once = tokio::spawn(feed::follow(cfg, Arc::default(), sink)).abort_handle();
        (shared, once)
    }

    /// `now` for the pool named `name`, if followed; forgets it once it is retired.
    fn dispatch(&self, name: &str, now: Option<&KeyValue>) {
        let Some(pool) = lock(&self.pools).get(name).and_then(Weak::upgrade) else {
            lock(&self.pools).remove(name);
            return;
        };
        if check(&pool, now).is_err() {
            let mut pools = lock(&self.pools);
            // Only this state: the name may have been opened again meanwhile.
            if pools.get(name).is_some_and(|w| std::ptr::eq(w.as_ptr(), Arc::as_ptr(&pool))) {
                pools.remove(name);
            }
        }
    }
}

/// The shared watch: every spec record, dispatched to the followed pools by name.
struct SharedSink {
    req: Weak<Requester>,
    watch: Arc<SpecWatch>,
    layout: Layout,
}

impl Sink for SharedSink {
    fn revision(&self) -> Result<Revision, Gone> {
        self.req.upgrade().ok_or(Gone)?;
        Ok(self.watch.revision.load(Ordering::Acquire))
    }

    type Listing = Vec<KeyValue>;

    fn begin_listing(&self, _records: usize) -> Vec<KeyValue> {
        Vec::new()
    }

    fn listing_page(&self, listing: &mut Vec<KeyValue>, kvs: Vec<KeyValue>) {
        listing.extend(kvs);
    }

    /// The whole range at `revision`: every followed pool is checked against its record there
    /// (absent: deleted).
    fn listed(&self, kvs: Vec<KeyValue>, revision: Revision) -> Result<(), Gone> {
        self.req.upgrade().ok_or(Gone)?;
        self.watch.revision.fetch_max(revision, Ordering::AcqRel);
        let mut now: HashMap<String, KeyValue> = HashMap::with_capacity(kvs.len());
        for kv in kvs {
            if let Some(name) = self.layout.parse_pool_spec_key(&kv.key) {
                now.insert(name, kv);
            }
        }
        let names: Vec<String> = lock(&self.watch.pools).keys().cloned().collect();
        for name in names {
            self.watch.dispatch(&name, now.get(&name));
        }
        Ok(())
    }

    fn watched(&self, events: &[WatchEvent]) -> Result<(), Gone> {
        self.req.upgrade().ok_or(Gone)?;
        for ev in events {
            self.watch.revision.fetch_max(ev.kv().mod_revision, Ordering::AcqRel);
            let Some(name) = self.layout.parse_pool_spec_key(&ev.kv().key) else { continue };
            match ev {
                WatchEvent::Put(kv) => self.watch.dispatch(&name, Some(kv)),
                WatchEvent::Delete(_) => self.watch.dispatch(&name, None),
            }
        }
        Ok(())
    }
}

/// One read of one pool's spec record after it joined the shared watch; ends after it.
struct OnceSink {
    req: Weak<Requester>,
    pool: Arc<PoolState>,
}

impl Sink for OnceSink {
    fn revision(&self) -> Result<Revision, Gone> {
        self.req.upgrade().ok_or(Gone)?;
        self.pool.live().map_err(|_| Gone)?;
        Ok(0)
    }

    type Listing = Option<KeyValue>;

    fn begin_listing(&self, _records: usize) -> Option<KeyValue> {
        None
    }

    fn listing_page(&self, listing: &mut Option<KeyValue>, kvs: Vec<KeyValue>) {
        if let Some(kv) = kvs.into_iter().next() {
            *listing = Some(kv);
        }
    }

    fn listed(&self, kv: Option<KeyValue>, _revision: Revision) -> Result<(), Gone> {
        self.req.upgrade().ok_or(Gone)?;
        let _ = check(&self.pool, kv.as_ref());
        // Done: the shared watch follows from here.
        Err(Gone)
    }

    fn watched(&self, _events: &[WatchEvent]) -> Result<(), Gone> {
        Err(Gone)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn kv(create_revision: Revision) -> KeyValue {
        KeyValue {
            key: b"P/pools/p".to_vec(),
            value: b"{}".to_vec(),
            create_revision,
            mod_revision: create_revision,
            version: 1,
            lease: 0,
        }
    }

    #[test]
    fn only_the_same_incarnation_counts_as_there() {
        assert_eq!(spec_gone(5, Some(&kv(5))), None);
        assert_eq!(spec_gone(5, None), Some(None));
        assert_eq!(spec_gone(5, Some(&kv(9))), Some(Some(b"{}".to_vec())));
    }
}
