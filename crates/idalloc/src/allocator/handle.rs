//! [`Pool`]: the handle on one pool, the public face of acquire, release, reads, events and remote
//! views. Each operation takes the key's single-flight guard and runs the bind or release path.

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::Ordering;
use std::sync::Arc;

use tracing::warn;

use super::cluster_events::ClusterEvents;
use super::coalesce::{self, Turn};
use super::events::{Events, StampedEvents};
use super::pool_state::{lock, read, write, Held, PoolState};
use super::registry::Inner;
use super::repair_queue::Repair;
use super::types::{Acquired, Binding, Released};
use crate::error::{Error, Input, Result};
use crate::layout::IdRecord;
use crate::pool::{validate_key, validate_stored_durable_holder, validate_stored_holder, PoolSpec};
use crate::remote::{self, Cluster, ClusterEvent, RemoteOptions, RemotePool};
use crate::store::{GetRequest, KeyRange, Store};

/// A handle on one pool of an [`Allocator`](super::Allocator). Cheap to clone.
#[derive(Clone)]
pub struct Pool {
    pub(super) inner: Arc<Inner>,
    pub(super) state: Arc<PoolState>,
}

impl std::fmt::Debug for Pool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Pool").field("spec", &self.state.spec).finish()
    }
}

impl Pool {
    pub(super) fn new(inner: Arc<Inner>, state: Arc<PoolState>) -> Pool {
        Pool { inner, state }
    }

    /// The pool's name.
    pub fn name(&self) -> &str {
        self.state.spec.name()
    }

    /// The pool's spec as this process knows it now: its range and reserved IDs follow a resize
    /// (by any process) as soon as this process learns of it.
    pub fn spec(&self) -> PoolSpec {
        (*self.state.spec_now()).clone()
    }

    /// True once this handle's pool was found deleted or re-created: every operation on it then
    /// fails (`PoolNotFound`, `RangeMismatch` or `PoolReplaced`) and its background work has
    /// stopped; open the pool again with `Allocator::pool` (a long-lived cache of handles checks
    /// this before reusing one).
    pub fn is_retired(&self) -> bool {
        self.state.live().is_err()
    }

    /// The ID of `key`, with a reference of this process on its session lease (refcounted: each
    /// acquire needs one release). Round trips: 0 if this process already holds the key, else 1
    /// when uncontended (DESIGN §5).
    pub async fn acquire(&self, key: &str) -> Result<Acquired> {
        crate::metrics::timed(self.name(), "acquire", self.acquire_untimed(key)).await
    }

    async fn acquire_untimed(&self, key: &str) -> Result<Acquired> {
        validate_key(key)?;
        if let Some(a) = self.count_up(key) {
            return Ok(a);
        }
        let key_lock = self.state.lock_key_owned(key).await;
        {
            match self.count_up(key) {
                Some(a) => Ok(a),
                None => {
                    // The key stays locked until the bookkeeping below is done (`_key`: the lock,
                    // back from a batch that carried it).
                    let (r, _key) =
                        match coalesce::acquire_turn(&self.inner, &self.state, key, key_lock) {
                            Turn::Lead(flight, key_lock) => {
                                let holder = self.inner.holder.clone();
                                let r = self
                                    .inner
                                    .bind(
                                        &self.state,
                                        key,
                                        Some(&holder),
                                        super::RefLease::Session,
                                        None,
                                    )
                                    .await;
                                drop(flight);
                                (r, Some(key_lock))
                            }
                            Turn::Wait(answer) => answer.wait().await,
                        };
                    match &r {
                        Ok(a) => {
                            lock(&self.state.held)
                                .insert(key.to_string(), Held { id: a.id, count: 1 });
                        }
                        Err(Error::Unavailable { .. }) if lock(&self.state.doubt).contains(key) => {
                            // An attempt may still be applied: undo whatever it left, in the
                            // background (the fence bump makes a later apply fail).
                            self.inner
                                .repairs
                                .push(Repair::Abandon(self.state.clone(), key.to_string()));
                        }
                        Err(_) => {}
                    }
                    r
                }
            }
        }
    }

    pub(super) fn count_up(&self, key: &str) -> Option<Acquired> {
        let mut held = lock(&self.state.held);
        let h = held.get_mut(key)?;
        h.count += 1;
        Some(Acquired { id: h.id, new: false })
    }

    /// The ID of `key` with a durable reference of `holder`: not on any lease, it stays until
    /// `release_durable(key, holder)` (Contiv's owner semantics; what the CLI uses). Idempotent per
    /// holder. One round trip when uncontended.
    pub async fn acquire_durable(&self, key: &str, holder: &str) -> Result<Acquired> {
        let f = self.acquire_durable_untimed(key, holder);
        crate::metrics::timed(self.name(), "acquire_durable", f).await
    }

    /// The ID of `key` with `holder`'s reference on `lease` (a client session's: see
    /// [`crate::ClientSession::acquire`]). Idempotent per holder, like a durable reference.
    pub(crate) async fn acquire_on_lease(
        &self,
        key: &str,
        holder: &str,
        lease: crate::store::LeaseId,
    ) -> Result<Acquired> {
        validate_key(key)?;
        let _key = self.state.lock_key(key).await;
        let lease = super::RefLease::Client(lease);
        let a = self.inner.bind(&self.state, key, Some(holder), lease, None).await?;
        // Read-your-writes, as for a durable reference: a client session's reference is not in
        // `held`, so the binding reaches the cache only through the watch.
        self.until_cached(&[(key, a.id)], &[]).await;
        Ok(a)
    }

    /// [`Pool::acquire_durable`] with a preferred ID: `id` is used if it is free or already this
    /// key's, else the key gets a normal pick; an `id` the pool cannot allocate is ignored. What a
    /// caller that lost its binding but still uses the ID (a container that kept its address
    /// while its record was reclaimed) asks, so that the ID it uses comes back to it if it can.
    pub async fn acquire_durable_with_hint(
        &self,
        key: &str,
        holder: &str,
        id: u64,
    ) -> Result<Acquired> {
        let f = self.acquire_durable_hinted(key, holder, self.usable_hint(Some(id)));
        crate::metrics::timed(self.name(), "acquire_durable", f).await
    }

    async fn acquire_durable_untimed(&self, key: &str, holder: &str) -> Result<Acquired> {
        self.acquire_durable_hinted(key, holder, None).await
    }

    async fn acquire_durable_hinted(
        &self,
        key: &str,
        holder: &str,
        hint: Option<u64>,
    ) -> Result<Acquired> {
        validate_key(key)?;
        validate_stored_durable_holder(holder)?;
        let _key = self.state.lock_key(key).await;
        let a =
            self.inner.bind(&self.state, key, Some(holder), super::RefLease::Durable, hint).await?;
        self.until_cached(&[(key, a.id)], &[]).await;
        Ok(a)
    }

    /// Read-your-writes for references that are not in `held` (durable ones, and a client
    /// session's): waits, briefly and bounded (as `Inner::wait_applied`: the request timeout, at
    /// most 500 ms), until the pool's cache shows every `(key, id)` of `bound` bound to `id` and
    /// no key of `freed` bound to its old ID, i.e. what this handle's call just did. A leased
    /// hold of this process is in `held` at once, but these reach the cache only through the
    /// store's watch, so `get` right after `acquire_durable` answered `None` until the watch
    /// brought the write back (found under paused time in a test; with real time it is a race
    /// lost by a caller that reads at once). Waiting keeps the watch the cache's only writer
    /// (`sync.rs`). It costs one watch delay per call on a followed pool, checked on each change
    /// the cache applies (under its lock once per check); a pool opened lazily has no follower,
    /// and its `get` reads its own keys differently (see [`Pool::get`]), so it does not wait.
    /// When the bound passes (a follower cut off from the store), the writes still stand: only
    /// the read may lag, as before.
    pub(super) async fn until_cached(&self, bound: &[(&str, u64)], freed: &[(&str, u64)]) {
        if (bound.is_empty() && freed.is_empty()) || self.inner.view_unloaded(&self.state) {
            return;
        }
        let mut applied = self.state.applied.subscribe();
        let limit = self.inner.opts.request_timeout.min(std::time::Duration::from_millis(500));
        let seen = |_: &_| {
            let cache = self.state.lock_cache();
            bound.iter().all(|(k, id)| cache.get(k) == Some(*id))
                && freed.iter().all(|(k, id)| cache.get(k) != Some(*id))
        };
        let _ = tokio::time::timeout(limit, applied.wait_for(seen)).await;
    }

    /// Drops one local use of `key`. The last local use removes this process's reference (one
    /// round trip) and, if it was the last reference and the pool has no idle grace, the binding in
    /// the same txn. Releasing a key this process does not hold is a no-op (`held == false`).
    pub async fn release(&self, key: &str) -> Result<Released> {
        let r = crate::metrics::timed(self.name(), "release", self.release_untimed(key)).await;
        self.count_reclaim(&r);
        r
    }

    fn count_reclaim(&self, r: &Result<Released>) {
        if matches!(r, Ok(Released { reclaimed: true, .. })) {
            crate::metrics::reclaimed(self.name(), "release", 1);
        }
    }

    async fn release_untimed(&self, key: &str) -> Result<Released> {
        validate_key(key)?;
        self.state.live()?;
        let key_lock = self.state.lock_key_owned(key).await;
        {
            let last_id = {
                let mut held = lock(&self.state.held);
                match held.get_mut(key) {
                    None => Err(false),
                    Some(h) if h.count > 1 => {
                        h.count -= 1;
                        Err(true)
                    }
                    Some(h) => {
                        let id = h.id;
                        held.remove(key);
                        Ok(id)
                    }
                }
            };
            match last_id {
                Err(held) => Ok(Released { held, reclaimed: false }),
                Ok(id) => {
                    // As in `acquire_untimed`: locked until the bookkeeping below is done.
                    let turn = coalesce::release_turn(&self.inner, &self.state, key, id, key_lock);
                    let (r, _key) = match turn {
                        Turn::Lead(flight, key_lock) => {
                            let holder = self.inner.holder.clone();
                            let r =
                                self.inner.release_ref(&self.state, key, id, &holder, false).await;
                            drop(flight);
                            (r, Some(key_lock))
                        }
                        Turn::Wait(answer) => answer.wait().await,
                    };
                    match r {
                        Ok(r) => Ok(Released { held: true, reclaimed: r.reclaimed }),
                        Err(Error::Unavailable { reason, retryable, source }) => {
                            // The store may or may not have applied the release. Restoring the
                            // local hold could claim a key whose reference is gone (and whose
                            // ID another key may take); keeping nothing could leak the
                            // reference. So the key stays released here and the release is
                            // completed in the background, idempotently.
                            warn!(pool = %self.state.spec.name(), key, id, %reason, "release outcome unknown; completing it in the background");
                            self.inner.repairs.push(Repair::Release(
                                self.state.clone(),
                                key.to_string(),
                                id,
                            ));
                            Err(Error::Unavailable {
                                reason: format!(
                                    "{reason}; the release is completed in the background"
                                ),
                                retryable,
                                source,
                            })
                        }
                        Err(e @ (Error::PoolNotFound { .. } | Error::RangeMismatch { .. })) => {
                            // The pool is gone, and every reference with it.
                            Err(e)
                        }
                        Err(e) => {
                            // Rejected, so not applied: nothing changed, the caller may retry.
                            lock(&self.state.held).insert(key.to_string(), Held { id, count: 1 });
                            Err(e)
                        }
                    }
                }
            }
        }
    }

    /// Removes `holder`'s durable reference to `key`; reclaims the binding if it was the last
    /// reference and the pool has no idle grace. A no-op (`held == false`) if `holder` held nothing.
    pub async fn release_durable(&self, key: &str, holder: &str) -> Result<Released> {
        validate_stored_durable_holder(holder)?;
        self.release_reference(key, holder).await
    }

    /// Removes `holder`'s reference to `key`, durable or on a lease: a client session's release
    /// (`ClientSession::release`), whose holder is a generated leased name that
    /// [`Pool::release_durable`] refuses (durable names may not start with `lease:`).
    pub(crate) async fn release_reference(&self, key: &str, holder: &str) -> Result<Released> {
        let f = self.release_reference_untimed(key, holder);
        let r = crate::metrics::timed(self.name(), "release_durable", f).await;
        self.count_reclaim(&r);
        r
    }

    async fn release_reference_untimed(&self, key: &str, holder: &str) -> Result<Released> {
        validate_key(key)?;
        validate_stored_holder(holder)?;
        self.state.live()?;
        let _key = self.state.lock_key(key).await;
        async {
            // A lazily opened pool is not loaded for one key: its record is read.
            let from_view = if self.inner.view_unloaded(&self.state) {
                None
            } else {
                self.inner.wait_synced(&self.state).await.ok().and_then(|_| self.get(key))
            };
            let id = match from_view {
                Some(id) => Some(id),
                None => self.get_consistent(key).await?,
            };
            match id {
                Some(id) => {
                    let r = self.inner.release_ref(&self.state, key, id, holder, true).await?;
                    if r.reclaimed {
                        self.until_cached(&[], &[(key, id)]).await;
                    }
                    Ok(r)
                }
                None => {
                    // No binding: at most a stray reference is left; remove it.
                    self.inner.release_stray_ref(&self.state, key, holder, true).await
                }
            }
        }
        .await
    }

    /// The ID bound to `key`, from the cache (no round trip; this process's own keys are seen at
    /// once — a leased hold at once, a durable acquire or release of this handle because it
    /// returns only once the cache shows it, up to a bound — other nodes' as soon as the watch
    /// delivers them). A pool opened lazily
    /// (`AllocatorOptions::lazy_view`) and not loaded yet knows only this process's own keys:
    /// use [`Pool::get_consistent`], or [`Pool::wait_synced`] first.
    pub fn get(&self, key: &str) -> Option<u64> {
        if let Some(h) = lock(&self.state.held).get(key) {
            return Some(h.id);
        }
        self.state.lock_cache().get(key)
    }

    /// The key bound to `id`, from the cache (no round trip).
    pub fn key_of(&self, id: u64) -> Option<String> {
        self.state.lock_cache().key_of(id).map(str::to_string)
    }

    /// [`Pool::get`] read from the store (one round trip).
    pub async fn get_consistent(&self, key: &str) -> Result<Option<u64>> {
        validate_key(key)?;
        self.inner.read_key_record(&self.state, key).await
    }

    /// [`Pool::key_of`] read from the store (one round trip).
    pub async fn key_of_consistent(&self, id: u64) -> Result<Option<String>> {
        let k = self.inner.layout.id_key(self.state.spec.name(), id);
        let resp =
            self.inner.req.call(|| self.inner.req.store.get(GetRequest::key(k.clone()))).await?;
        Ok(resp.kvs.first().and_then(|kv| match IdRecord::decode(&kv.value) {
            Some(IdRecord::Bound(key)) => Some(key),
            _ => None,
        }))
    }

    /// Every binding with its holders, read from the store at one revision (one round trip per
    /// page, each page bounded by the request timeout, the listing as long as pages keep
    /// coming), sorted by ID. Tombstones are not bindings and are left out.
    pub async fn list(&self) -> Result<Vec<Binding>> {
        let inner = &self.inner;
        let name = self.state.spec.name();
        let range = KeyRange::prefix(inner.layout.pool_data_prefix(name));
        let (kvs, _) = inner.req.pages(&range, format!("pool {name:?}")).collect().await?;
        let mut holders: HashMap<String, Vec<String>> = HashMap::new();
        let mut bound = Vec::new();
        for kv in &kvs {
            if let Some(id) = inner.layout.parse_id_key(name, &kv.key) {
                if let Some(IdRecord::Bound(key)) = IdRecord::decode(&kv.value) {
                    bound.push((id, key));
                }
            } else if let Some((key, holder)) = inner.layout.parse_ref_key(name, &kv.key) {
                holders.entry(key).or_default().push(holder);
            }
        }
        bound.sort();
        Ok(bound
            .into_iter()
            .map(|(id, key)| {
                let mut h = holders.remove(&key).unwrap_or_default();
                h.sort();
                Binding { id, key, holders: h }
            })
            .collect())
    }

    /// ID records of the pool that the cache does not use (unreadable values count as used;
    /// records for IDs the pool never hands out are ignored), as the watch last showed them.
    /// Each was also logged as a warning. `idalloc check` reports and repairs them.
    pub fn unusable_id_records(&self) -> Vec<(u64, crate::cache::Foreign)> {
        self.state.lock_cache().foreign()
    }

    /// Every binding in the cache, sorted by ID.
    pub fn snapshot(&self) -> Vec<(u64, String)> {
        self.state.lock_cache().snapshot()
    }

    /// Subscribes to the pool's events. A subscriber that falls more than `event_buffer` messages
    /// behind (a message is one change, or all the changes of one listing: a listing never makes
    /// a subscriber lag) gets [`Event::Lagged`](crate::Event::Lagged) and should re-read
    /// [`Pool::snapshot`]; it never slows allocation down.
    ///
    /// The subscription starts with the pool as the cache holds it: every binding as an `Upsert`
    /// (by ID) and, if the pool has been listed, one `Synced`; then every change after that, in
    /// order, none twice and none missing. So a subscriber that arrives late, or on another
    /// thread, still sees a complete picture.
    pub fn events(&self) -> Events {
        // A lazily opened pool starts following now: events describe the whole pool.
        self.inner.follow(&self.state);
        let cache = self.state.lock_cache();
        let replay = remote::replay(&cache, self.state.listed.load(Ordering::Acquire));
        let rx = self.state.subscribe();
        drop(cache);
        Events::new(replay, rx)
    }

    /// Subscribes to the pool's changes with their store revisions ([`Stamped`](crate::Stamped)),
    /// from the cache's current revision on, without a replay: for a service that keeps its own
    /// history of the pool (idalloc serve's watch). Pair it with [`Pool::snapshot_at`].
    pub fn stamped_events(&self) -> StampedEvents {
        // A lazily opened pool starts following now: events describe the whole pool.
        self.inner.follow(&self.state);
        let cache = self.state.lock_cache();
        let rx = self.state.stamped.subscribe();
        let revision = cache.revision();
        let complete = self.state.through.load(Ordering::Acquire) == revision;
        drop(cache);
        StampedEvents::new(revision, complete, rx)
    }

    /// Every binding in the cache, sorted by ID, with the cache's revision, if the cache is at a
    /// revision boundary (every change at that revision applied) and has been listed; `None`
    /// while a watch response is being applied or before the first listing (try again after the
    /// next [`Stamped::Through`](crate::Stamped::Through)).
    pub fn snapshot_at(&self) -> Option<(Vec<(u64, String)>, crate::store::Revision)> {
        let cache = self.state.lock_cache();
        let revision = cache.revision();
        let at_boundary = self.state.through.load(Ordering::Acquire) == revision;
        (at_boundary && self.state.listed.load(Ordering::Acquire))
            .then(|| (cache.snapshot(), revision))
    }

    /// The revision [`Pool::snapshot_at`] would answer at now, without copying the bindings: a
    /// service that keeps an encoded snapshot tells from it whether its copy is still current.
    pub fn revision_at(&self) -> Option<crate::store::Revision> {
        let cache = self.state.lock_cache();
        let revision = cache.revision();
        let at_boundary = self.state.through.load(Ordering::Acquire) == revision;
        (at_boundary && self.state.listed.load(Ordering::Acquire)).then_some(revision)
    }

    /// Like [`Pool::events`] for every cluster of the pool: the local cache and each remote view
    /// replay their bindings (then one `Synced` each, if listed), then live events of all of them
    /// follow, each tagged with its cluster; events of one cluster keep their order. A `Lagged`
    /// (tagged `local`) means events of any cluster were missed: re-read
    /// [`Pool::snapshot_all`].
    pub fn cluster_events(&self) -> ClusterEvents {
        // A lazily opened pool starts following now: events describe the whole pool.
        self.inner.follow(&self.state);
        let remotes = read(&self.state.remotes);
        let cache = self.state.lock_cache();
        let views: Vec<_> = remotes.values().map(|v| (v.clone(), v.lock())).collect();
        let mut replay = VecDeque::new();
        let local = remote::replay(&cache, self.state.listed.load(Ordering::Acquire));
        replay
            .extend(local.into_iter().map(|event| ClusterEvent { cluster: Cluster::Local, event }));
        for (v, g) in &views {
            let r = remote::replay(&g.cache, g.listed);
            replay.extend(
                r.into_iter().map(|event| ClusterEvent { cluster: v.cluster.clone(), event }),
            );
        }
        let rx = self.state.mesh.subscribe();
        drop(views);
        drop(cache);
        drop(remotes);
        ClusterEvents::new(replay, rx)
    }

    /// Starts a read-only view of this pool in another cluster's `store` (Cilium's
    /// `WatchRemoteKVStore`): reads the remote pool's spec (one round trip; `PoolNotFound` if it has
    /// none), refuses it if its ID space overlaps this pool's or another remote's, then follows its
    /// bindings in the background. Never writes to `store`. Local operations never wait for it.
    pub async fn watch_remote(
        &self,
        name: &str,
        store: Arc<dyn Store>,
        opts: RemoteOptions,
    ) -> Result<RemotePool> {
        remote::validate_remote_name(name)?;
        if read(&self.state.remotes).contains_key(name) {
            return Err(Error::invalid_str(
                Input::Options,
                "remote name",
                name,
                "this pool already has a remote view of that name; remove it first",
            ));
        }
        let others = self.spaces();
        let view = remote::open(
            name,
            &self.state.spec,
            store,
            opts,
            &others,
            self.state.mesh.sender().clone(),
        )
        .await?;
        let mut remotes = write(&self.state.remotes);
        // Checked again: another call may have added a remote while the spec was read.
        let now: Vec<_> = remotes.values().map(|v| (v.cluster.clone(), v.space())).collect();
        let clash = remotes.contains_key(name)
            || now.iter().any(|(_, (lo, hi))| view.space().0 <= *hi && *lo <= view.space().1);
        if clash {
            return Err(Error::invalid_str(
                Input::Options,
                "remote name",
                name,
                "another remote view of this pool was added meanwhile with this name or an overlapping ID space",
            ));
        }
        remotes.insert(name.to_string(), view.clone());
        view.start(Box::new(Neighbours(Arc::downgrade(&self.state))), self.inner.jitter_seed());
        Ok(RemotePool { view })
    }

    /// Drops remote view `name` (Cilium's `RemoveRemoteKVStore`): stops following it and emits a
    /// `Delete` for every binding it contributed. False if there was none.
    pub fn remove_remote(&self, name: &str) -> bool {
        let mut remotes = write(&self.state.remotes);
        match remotes.remove(name) {
            Some(v) => {
                v.shut();
                true
            }
            None => false,
        }
    }

    /// The remote views of this pool, by name.
    pub fn remotes(&self) -> Vec<RemotePool> {
        read(&self.state.remotes).values().map(|v| RemotePool { view: v.clone() }).collect()
    }

    /// Remote view `name`, if this pool has one.
    pub fn remote(&self, name: &str) -> Option<RemotePool> {
        read(&self.state.remotes).get(name).map(|v| RemotePool { view: v.clone() })
    }

    pub(super) fn spaces(&self) -> Vec<(Cluster, (u64, u64))> {
        let mut v = vec![(Cluster::Local, remote::id_space(&self.state.spec))];
        v.extend(read(&self.state.remotes).values().map(|r| (r.cluster.clone(), r.space())));
        v
    }

    /// The key bound to `id` in any cluster, and which one (no round trip). ID spaces of the
    /// clusters never overlap, so the ID alone picks the one view to ask.
    pub fn key_of_any(&self, id: u64) -> Option<(Cluster, String)> {
        let (lo, hi) = remote::id_space(&self.state.spec);
        if id >= lo && id <= hi {
            return self.key_of(id).map(|k| (Cluster::Local, k));
        }
        // The registry is only read (no writer waits on lookups, lookups not on each other), and
        // held while the one view is asked, so no view is cloned out of it.
        let remotes = read(&self.state.remotes);
        let view = remotes.route(id)?;
        let k = view.key_of(id)?;
        Some((view.cluster.clone(), k))
    }

    /// Every (cluster, ID) `key` is bound to: local first, then remotes by name (no round trip).
    pub fn ids_of(&self, key: &str) -> Vec<(Cluster, u64)> {
        let mut out = Vec::new();
        if let Some(id) = self.get(key) {
            out.push((Cluster::Local, id));
        }
        for v in read(&self.state.remotes).values() {
            if let Some(id) = v.lock().cache.get(key) {
                out.push((v.cluster.clone(), id));
            }
        }
        out
    }

    /// Every binding of every cluster (Cilium's `ForeachCache`): local first, then remotes by
    /// name, each sorted by ID. Each view is read at one instant; views are read one after another.
    pub fn snapshot_all(&self) -> Vec<(Cluster, u64, String)> {
        let mut out: Vec<(Cluster, u64, String)> =
            self.snapshot().into_iter().map(|(id, k)| (Cluster::Local, id, k)).collect();
        let views: Vec<_> = read(&self.state.remotes).values().cloned().collect();
        for v in views {
            let snap = v.lock().cache.snapshot();
            out.extend(snap.into_iter().map(|(id, k)| (v.cluster.clone(), id, k)));
        }
        out
    }

    /// Calls `f` on every binding of every cluster, in [`Pool::snapshot_all`]'s order, without
    /// copying keys; each view is locked while it is visited, so keep `f` short.
    pub fn foreach_all(&self, mut f: impl FnMut(&Cluster, u64, &str)) {
        for (id, k) in self.state.lock_cache().snapshot() {
            f(&Cluster::Local, id, &k);
        }
        let views: Vec<_> = read(&self.state.remotes).values().cloned().collect();
        for v in views {
            let g = v.lock();
            for (id, k) in g.cache.snapshot() {
                f(&v.cluster, id, &k);
            }
        }
    }

    /// Waits until the cache holds the whole pool (the first listing is done).
    pub async fn wait_synced(&self) -> Result<()> {
        self.inner.wait_synced(&self.state).await
    }

    /// Re-lists the pool and re-references every key this process holds (DESIGN §7).
    pub async fn resync(&self) -> Result<()> {
        self.state.synced.send_replace(false);
        self.state.relist.request();
        self.wait_synced().await?;
        let mut keys: Vec<String> = lock(&self.state.held).keys().cloned().collect();
        keys.sort(); // fixed repair order (reproducible simulations)
        for k in keys {
            self.inner.repair_key(&self.state, &k).await?;
        }
        Ok(())
    }

    /// One sweep of the pool now: reclaims bindings that have had no reference for the pool's idle
    /// grace (DESIGN §8). Safe to run in many processes at once and alongside acquires.
    pub async fn sweep(&self) -> Result<super::sweeper::SweepReport> {
        let f = super::sweeper::sweep(&self.inner.req, &self.inner.layout, &self.state, false);
        let r = crate::metrics::timed(self.name(), "sweep", f).await;
        if let Err(e) = self.state.live() {
            // Retired by this sweep: forget the state too, as a failed bind does.
            self.inner.retire(&self.state, e);
        }
        crate::metrics::swept(self.name(), &r);
        if let Ok(report) = &r {
            crate::metrics::reclaimed(self.name(), "sweep", report.reclaimed.len());
        }
        r
    }

    /// What a sweep would reclaim now, without reclaiming it.
    pub async fn sweep_dry_run(&self) -> Result<super::sweeper::SweepReport> {
        super::sweeper::sweep(&self.inner.req, &self.inner.layout, &self.state, true).await
    }

    /// Keys this process holds through its session, with their IDs and local counts.
    pub fn held(&self) -> Vec<(String, u64, u64)> {
        let mut v: Vec<_> =
            lock(&self.state.held).iter().map(|(k, h)| (k.clone(), h.id, h.count)).collect();
        v.sort();
        v
    }
}

/// A pool as its remote views see it when a remote's spec changes (`remote::Neighbours`): the
/// other clusters' ID spaces, with the registry locked for writing so that no remote is added or
/// changes its space meanwhile. Weak: a view must not keep its pool alive.
struct Neighbours(std::sync::Weak<PoolState>);

impl remote::Neighbours for Neighbours {
    fn with_others(&self, me: &str, f: &mut dyn FnMut(&remote::Spaces)) {
        let Some(state) = self.0.upgrade() else { return };
        let mut remotes = write(&state.remotes);
        let mut others = vec![(Cluster::Local, remote::id_space(&state.spec_now()))];
        others.extend(
            remotes
                .iter()
                .filter(|(n, _)| n.as_str() != me)
                .map(|(_, r)| (r.cluster.clone(), r.space())),
        );
        f(&others);
        remotes.reroute();
    }
}
