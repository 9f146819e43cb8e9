//! Per-pool state shared by the pool handles, the sync task and the repairs, and the per-key
//! single-flight lock ([`KeyGuard`]): one async mutex per key makes concurrent acquires of the same
//! key share one request and orders acquire against release of it; the guard removes the key's
//! entry when the last user is gone, also when the future holding it is dropped mid-flight.

use std::collections::{HashMap, HashSet};
use std::ops::Deref;
use std::sync::atomic::AtomicBool;
use std::sync::{Arc, Mutex, MutexGuard, RwLock, RwLockReadGuard, RwLockWriteGuard};

use tokio::sync::broadcast;
use tokio::time::Instant;

use crate::cache::{Batch, Event, PoolCache};
use crate::pool::PoolSpec;
use crate::remote::{Cluster, ClusterEvent, RemoteView};
use crate::store::{LeaseId, Revision};

/// A key this process holds through its session.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Held {
    pub(super) id: u64,
    pub(super) count: u64,
}

/// Per-pool state shared by the pool handles, the sync task and the repairs.
pub(crate) struct PoolState {
    pub(crate) spec: PoolSpec,
    /// The create revision of the spec record `spec` was read from: every write compares it
    /// (DESIGN §11), so nothing is written into a deleted or re-created pool.
    pub(crate) spec_rev: Revision,
    /// Keys with a bind attempt of this process's leased holder whose outcome is unknown (timed
    /// out): it may still be applied late, so the next release of the key bumps the holder's
    /// fence record, which makes such an attempt fail (docs/design-notes.md, "Late commits").
    pub(super) doubt: Mutex<HashSet<String>>,
    pub(super) cache: Mutex<PoolCache>,
    /// Keys this process holds. Asked first by every `Pool::get`, so it hashes with foldhash (as the
    /// cache's bindings do: per-process random seed) rather than SipHash, which cost about 3× more
    /// on a 55-byte key (26 against 8–10 ns a lookup in a 1,000-key map, docs/benchmarks-findings.md).
    pub(super) held: Mutex<HashMap<String, Held, foldhash::fast::RandomState>>,
    pub(super) key_locks: Mutex<HashMap<String, Arc<tokio::sync::Mutex<()>>>>,
    /// The pool's event channel; `None` once the state retired, which ends every subscription
    /// (the receivers see the channel closed after the last buffered event).
    pub(super) events: Mutex<Option<broadcast::Sender<Batch<Event>>>>,
    /// The cache's changes with their revisions (see [`super::events::Stamped`]), sent under the
    /// cache lock by the sync task only.
    pub(super) stamped: broadcast::Sender<super::events::Stamped>,
    /// The revision of the last `Stamped::Through` sent (under the cache lock): the cache is at a
    /// revision boundary when its revision equals this.
    pub(super) through: std::sync::atomic::AtomicI64,
    /// Events of every cluster of the pool (local and remote views), tagged.
    pub(super) mesh: broadcast::Sender<Batch<ClusterEvent>>,
    /// Remote views of this pool by name (lock order: this map, then the cache, then each view).
    /// A read-write lock: lookups across clusters (`key_of_any`, `ids_of`) only read it and must
    /// not queue behind each other; it is written when a remote is added or removed, or changes
    /// its ID space.
    pub(super) remotes: RwLock<Remotes>,
    /// A listing has been applied to the cache (set under the cache lock): replays end with
    /// `Synced`.
    pub(crate) listed: AtomicBool,
    /// The pool's follower (listing, then watch: `sync.rs`) was started. Set at open unless the
    /// allocator opens pools lazily (`AllocatorOptions::lazy_view`), then by the first thing that
    /// needs the whole view (`Inner::follow`). While unset, the cache holds no other process's
    /// bindings and nothing will ever fill it.
    pub(crate) following: AtomicBool,
    pub(super) synced: tokio::sync::watch::Sender<bool>,
    /// The store revision the cache has applied (watch events and listings).
    pub(super) applied: tokio::sync::watch::Sender<Revision>,
    /// Pages read by listings so far: `wait_synced` waits as long as this moves.
    pub(crate) list_progress: tokio::sync::watch::Sender<usize>,
    /// Why the last listing failed, when waiting for the next one is pointless (a damaged store
    /// file: `sync::ends_waits`). Cleared by a listing that succeeds. `wait_synced` returns it at
    /// once instead of waiting out its no-progress budget and reporting `Unavailable`.
    pub(crate) list_failure: Mutex<Option<crate::error::Error>>,
    /// A complete listing is being applied to the cache (set by `sync.rs` once the last page
    /// is in, cleared when the view is swapped): local work that cannot hang on the store, so
    /// `wait_synced` does not hold it to its no-progress budget. At 1M bindings on a loaded
    /// machine the apply alone can outlast that budget, and the waiter reported a pool that was
    /// a moment from synced as one that "could not be listed".
    pub(crate) applying: AtomicBool,
    pub(super) quarantine: tokio::sync::Mutex<Option<(LeaseId, Instant)>>,
    /// Asks the pool's follower to re-list (resync, pool deleted).
    pub(crate) relist: Arc<crate::feed::Relist>,
    pub(crate) idle_since: Mutex<HashMap<(String, i64), Instant>>,
    /// Coalescing of concurrent single-key acquires and releases (see `coalesce`).
    pub(super) lanes: super::lanes::Lanes<OwnedKeyGuard>,
    /// Set once a write found the pool deleted or re-created (or this allocator deleted it): the
    /// error every later operation on this state returns. A retired state never comes back; the
    /// caller opens the pool again (docs/design-notes.md, "Pool handles outlive their pool").
    pub(super) retired: Mutex<Option<crate::error::Error>>,
    /// The pool's own background tasks (sync, sweeper), stopped when it retires.
    pub(super) tasks: Mutex<Vec<tokio::task::AbortHandle>>,
}

pub(super) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // A panic while holding one of these short, non-async critical sections would be a bug in this
    // crate; the data is still consistent at every await-free step, so keep going.
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// The remote views of a pool: by name, and by ID space for lookups.
#[derive(Default)]
pub(crate) struct Remotes {
    by_name: std::collections::BTreeMap<String, Arc<RemoteView>>,
    /// `(lo, hi, view)` by `lo`, without refused views (they have no space); rebuilt on every
    /// change. A lookup by ID searches this short contiguous list instead of walking the map and
    /// reading each view's space (`key_of_any` ≤ 2x a local `key_of`).
    routes: Vec<(u64, u64, Arc<RemoteView>)>,
}

impl Remotes {
    pub(crate) fn get(&self, name: &str) -> Option<&Arc<RemoteView>> {
        self.by_name.get(name)
    }

    pub(crate) fn contains_key(&self, name: &str) -> bool {
        self.by_name.contains_key(name)
    }

    /// The views by name.
    pub(crate) fn iter(&self) -> impl Iterator<Item = (&String, &Arc<RemoteView>)> {
        self.by_name.iter()
    }

    /// The views, by name.
    pub(crate) fn values(&self) -> impl Iterator<Item = &Arc<RemoteView>> {
        self.by_name.values()
    }

    pub(crate) fn insert(&mut self, name: String, view: Arc<RemoteView>) {
        self.by_name.insert(name, view);
        self.reroute();
    }

    pub(crate) fn remove(&mut self, name: &str) -> Option<Arc<RemoteView>> {
        let v = self.by_name.remove(name);
        self.reroute();
        v
    }

    /// Rebuilds the routes from the views' spaces (after one changed).
    pub(crate) fn reroute(&mut self) {
        self.routes = self
            .by_name
            .values()
            .map(|v| (v.space(), v))
            .filter(|((lo, hi), _)| lo <= hi)
            .map(|((lo, hi), v)| (lo, hi, v.clone()))
            .collect();
        self.routes.sort_unstable_by_key(|r| r.0);
    }

    /// The view whose ID space holds `id` (spaces never overlap, so at most one).
    pub(crate) fn route(&self, id: u64) -> Option<&Arc<RemoteView>> {
        let i = self.routes.partition_point(|r| r.0 <= id);
        let (_, hi, v) = self.routes.get(i.checked_sub(1)?)?;
        (id <= *hi).then_some(v)
    }
}

/// [`lock`] for reading a read-write lock.
pub(super) fn read<T>(m: &RwLock<T>) -> RwLockReadGuard<'_, T> {
    m.read().unwrap_or_else(|p| p.into_inner())
}

/// [`lock`] for writing a read-write lock.
pub(super) fn write<T>(m: &RwLock<T>) -> RwLockWriteGuard<'_, T> {
    m.write().unwrap_or_else(|p| p.into_inner())
}

impl PoolState {
    /// Publishes the pool's gauges (bindings, free IDs, capacity, and cache lag behind `seen`, the
    /// newest revision this process has seen) from its cache.
    pub(crate) fn publish_gauges(&self, seen: crate::store::Revision) {
        let (bindings, free, applied) = {
            let mut c = self.lock_cache();
            (c.len(), c.free_ids().free_count(), c.revision())
        };
        crate::metrics::pool_gauges(
            self.spec.name(),
            bindings,
            free,
            self.spec.capacity(),
            seen - applied,
        );
    }
}

impl PoolState {
    /// `Err` with the reason if this state was retired (its pool deleted or re-created).
    pub(crate) fn live(&self) -> crate::error::Result<()> {
        match &*lock(&self.retired) {
            None => Ok(()),
            Some(e) => Err(e.clone()),
        }
    }

    /// `Err` while the pool's last listing failed in a way no retry cures (see `list_failure`).
    pub(crate) fn listing_failed(&self) -> crate::error::Result<()> {
        match &*lock(&self.list_failure) {
            None => Ok(()),
            Some(e) => Err(e.clone()),
        }
    }

    /// Why a write found this pool's spec changed, from the spec there now (`spec_now`, read back
    /// by the write's else branch): `PoolNotFound` (deleted), `RangeMismatch` (re-created with
    /// another spec) or `PoolReplaced` (re-created with the same spec; docs/design-notes.md,
    /// "Pool handles outlive their pool").
    pub(crate) fn gone_error(&self, spec_now: Option<Vec<u8>>) -> crate::error::Error {
        use crate::error::Error;
        let name = self.spec.name().to_string();
        match spec_now.map(|b| PoolSpec::from_json(&b)) {
            None => Error::PoolNotFound { pool: name },
            Some(Ok(existing)) if existing != self.spec => Error::RangeMismatch {
                pool: name,
                existing: Box::new(existing),
                requested: Box::new(self.spec.clone()),
            },
            Some(_) => Error::PoolReplaced { pool: name },
        }
    }

    /// Retires the state for good (see [`PoolState::retired`]): later operations fail with `err`,
    /// its sync task and sweeper stop, and its view and holds are dropped (they described a pool
    /// that no longer exists; keeping them would serve reads of the dead pool as if current).
    pub(crate) fn retire(&self, err: crate::error::Error) {
        {
            let mut r = lock(&self.retired);
            if r.is_some() {
                return;
            }
            *r = Some(err);
        }
        for t in lock(&self.tasks).drain(..) {
            t.abort();
        }
        {
            // Subscribers mirror the pool from its events: tell them every binding is gone (a
            // pool deleted by another process shows the same `Delete`s through the watch, for
            // whatever the watch delivered first) and then end their streams, under the cache
            // lock so that no event of the old view follows (docs/design-notes.md).
            let mut cache = self.lock_cache();
            let deletes: Vec<Event> =
                cache.snapshot().into_iter().map(|(id, key)| Event::Delete { id, key }).collect();
            self.emit_all(deletes);
            *cache = PoolCache::new(self.spec.clone());
            self.listed.store(false, std::sync::atomic::Ordering::Release);
            lock(&self.events).take();
        }
        lock(&self.held).clear();
        lock(&self.doubt).clear();
        // Wake anyone waiting for the first listing (it will never come).
        self.list_progress.send_modify(|pages| *pages += 1);
    }

    /// A receiver of the pool's events; one that is closed already once the state retired.
    pub(super) fn subscribe(&self) -> broadcast::Receiver<Batch<Event>> {
        match &*lock(&self.events) {
            Some(tx) => tx.subscribe(),
            None => broadcast::channel(1).1,
        }
    }

    pub(crate) fn lock_cache(&self) -> MutexGuard<'_, PoolCache> {
        lock(&self.cache)
    }

    /// [`PoolState::emit`] for a change of the store's history at `revision`: also sent to the
    /// stamped subscribers. Called with the cache lock held.
    pub(crate) fn emit_at(&self, revision: Revision, e: Event) {
        let _ = self.stamped.send(super::events::Stamped::Event { revision, event: e.clone() });
        self.emit(e);
    }

    /// [`PoolState::emit_all`] for a listing's changes at `revision`: also sent to the stamped
    /// subscribers, as one [`Stamped::Listing`](super::events::Stamped::Listing) (as `emit_all`
    /// sends one message), so that a re-listing of a big pool never makes them lag. Called with
    /// the cache lock held.
    pub(crate) fn emit_all_at(&self, revision: Revision, events: Vec<Event>) {
        // Subscribers subscribe under the cache lock, which the caller holds: a count of 0 stays
        // 0 until the events are out, and a listing of 1M bindings costs no 1M clones for nobody.
        if !events.is_empty() && self.stamped.receiver_count() > 0 {
            let listing: Batch<Event> = events.iter().cloned().collect();
            let _ =
                self.stamped.send(super::events::Stamped::Listing { revision, events: listing });
        }
        self.emit_all(events);
    }

    /// Whether anyone would receive a listing's changes (stamped, plain or mesh subscribers).
    /// Call with the cache lock held, under which subscribers subscribe: a `false` stays
    /// `false` until the caller has applied the listing.
    pub(crate) fn listening(&self) -> bool {
        self.stamped.receiver_count() > 0
            || self.mesh.receiver_count() > 0
            || lock(&self.events).as_ref().is_some_and(|tx| tx.receiver_count() > 0)
    }

    /// Every change at or before `revision` has been emitted. Called with the cache lock held.
    pub(crate) fn emitted_through(&self, revision: Revision) {
        self.through.store(revision, std::sync::atomic::Ordering::Release);
        let _ = self.stamped.send(super::events::Stamped::Through { revision });
    }

    /// Sends `e` to the pool's subscribers. Changes of the cache's bindings are emitted with the
    /// cache lock held, so that a new subscriber's replay and its live events never overlap or
    /// leave a gap.
    pub(crate) fn emit(&self, e: Event) {
        self.emit_all(vec![e]);
    }

    /// Sends `events` (a listing's changes) to the pool's subscribers as one message, so that a
    /// listing never makes a subscriber lag (`events::Batch`). Call with the cache lock held.
    pub(crate) fn emit_all(&self, events: Vec<Event>) {
        if events.is_empty() {
            return;
        }
        // Only for subscribers there are (they subscribe under the cache lock the caller holds):
        // a first listing of 1M bindings with nobody listening copies nothing.
        let tagged: Option<Batch<ClusterEvent>> = (self.mesh.receiver_count() > 0).then(|| {
            events
                .iter()
                .map(|e| ClusterEvent { cluster: Cluster::Local, event: e.clone() })
                .collect()
        });
        // No subscriber is fine; a full buffer drops the oldest and the subscriber sees `Lagged`.
        if let Some(tx) = &*lock(&self.events) {
            if tx.receiver_count() > 0 {
                let _ = tx.send(Batch::from(events));
            }
        }
        if let Some(tagged) = tagged {
            let _ = self.mesh.send(tagged);
        }
    }

    /// Publishes how far the cache has caught up with the store.
    pub(crate) fn note_applied(&self, revision: Revision) {
        self.applied.send_if_modified(|r| {
            let newer = revision > *r;
            if newer {
                *r = revision;
            }
            newer
        });
    }

    /// Marks the first listing done (the `Synced` event goes out with the listing's changes).
    pub(crate) fn mark_synced(&self) {
        self.synced.send_replace(true);
    }

    /// Takes the single-flight lock of `key` (waits for the current holder). The entry in the
    /// per-key map lives exactly as long as someone holds or waits for it: the returned guard, and
    /// the future while it waits, remove it when dropped, also when the caller is cancelled
    /// mid-flight (a dropped future, a `timeout`).
    pub(crate) async fn lock_key(&self, key: &str) -> KeyGuard<'_> {
        lock_key_in(self, key).await
    }

    /// [`PoolState::lock_key`] with a guard that owns its pool, so it can outlive the caller: a
    /// coalesced call hands it to its batch, which keeps the key locked until its txn is done even
    /// if the caller is cancelled meanwhile (see `coalesce`).
    pub(crate) async fn lock_key_owned(self: &Arc<Self>, key: &str) -> OwnedKeyGuard {
        lock_key_in(self.clone(), key).await
    }

    /// Keys with a single-flight lock held or waited for (tests: the map must not leak).
    #[cfg(test)]
    pub(crate) fn key_locks_len(&self) -> usize {
        lock(&self.key_locks).len()
    }
}

async fn lock_key_in<P: Deref<Target = PoolState>>(pool: P, key: &str) -> KeyGuardOf<P> {
    let lock = lock(&pool.key_locks).entry(key.to_string()).or_default().clone();
    let entry = KeyEntry { pool, key: key.to_string(), lock };
    let held = entry.lock.clone().lock_owned().await;
    KeyGuardOf { _held: held, _entry: entry }
}

/// One user's claim on a key's entry in the per-key lock map; removes the entry on drop if no
/// one else holds or waits for it. `P` is how it reaches the pool: borrowed, or owned (an `Arc`).
struct KeyEntry<P: Deref<Target = PoolState>> {
    pool: P,
    key: String,
    lock: Arc<tokio::sync::Mutex<()>>,
}

impl<P: Deref<Target = PoolState>> Drop for KeyEntry<P> {
    fn drop(&mut self) {
        let mut locks = lock(&self.pool.key_locks);
        // Two references: ours and the map's (others clone theirs under the map lock, which we
        // hold). Nobody else holds or waits, so the entry can go.
        if Arc::strong_count(&self.lock) == 2 {
            locks.remove(&self.key);
        }
    }
}

/// The per-key single-flight lock of one key, held (see [`PoolState::lock_key`]).
pub(crate) struct KeyGuardOf<P: Deref<Target = PoolState>> {
    // Field order matters: the mutex guard (which holds a reference to the mutex) goes first, so
    // the entry's drop sees only its own and the map's reference when nobody else is there.
    _held: tokio::sync::OwnedMutexGuard<()>,
    _entry: KeyEntry<P>,
}

/// A key's single-flight lock borrowed from its pool (the common case).
pub(crate) type KeyGuard<'a> = KeyGuardOf<&'a PoolState>;

/// A key's single-flight lock that owns its pool ([`PoolState::lock_key_owned`]).
pub(crate) type OwnedKeyGuard = KeyGuardOf<Arc<PoolState>>;
