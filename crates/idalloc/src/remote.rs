//! Read-only views of the same pool in other clusters' stores (DESIGN §12; Cilium's remote caches):
//! a process in cluster A resolves IDs that cluster B allocated, with zero round trips, by
//! following B's `id/` records with the same follower as its own pool (`feed.rs`).
//!
//! A view never writes to its store. It keeps serving its last known picture when the remote
//! becomes unreachable (state [`RemoteState::Stale`]), and on reconnect it re-lists and emits the
//! exact difference, so a binding that vanished while it was away shows up as a `Delete` instead of
//! lingering (the stale identities Cilium users reported). Every entry passes validation first:
//! the ID must lie in the remote pool's declared ID space (its prefix bits and range), the key must
//! be a valid key, and optional user validators must accept it; rejected entries are dropped and
//! counted, never shown. A remote whose ID space overlaps the local pool's (or another remote's) is
//! refused outright: two clusters with the same cluster ID hand out the same IDs for different
//! keys, and no lookup could tell which one is meant.
//!
//! The pure parts (ID spaces, validation, screening listings and events) are plain functions at
//! the top; the view and its sink follow.

use std::collections::VecDeque;
use std::fmt;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::time::{Duration, SystemTime};

use tokio::sync::broadcast;
use tokio::task::AbortHandle;
use tracing::{info, warn};

use crate::cache::{Event, PoolCache};
use crate::error::{Error, Input, Result};
use crate::feed::{self, FeedConfig, Gone, Relist, Sink};
use crate::layout::{IdRecord, Layout};
use crate::pool::{validate_key, PoolSpec};
use crate::store::{GetRequest, KeyRange, KeyValue, Revision, Store, StoreError, WatchEvent};

/// Which cluster a binding or an event comes from.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Cluster {
    /// This allocator's own store.
    Local,
    /// The remote view of that name.
    Remote(Arc<str>),
}

impl Cluster {
    /// `"local"` or the remote's name (the name `local` is refused for remotes).
    pub fn name(&self) -> &str {
        match self {
            Cluster::Local => "local",
            Cluster::Remote(n) => n,
        }
    }
}

impl fmt::Display for Cluster {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// An event of one cluster of a pool ([`crate::Pool::cluster_events`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ClusterEvent {
    pub cluster: Cluster,
    pub event: Event,
}

/// How far a remote view can be trusted.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RemoteState {
    /// The first listing is not done yet: the view may be incomplete.
    Syncing,
    /// The view follows the remote store.
    Synced,
    /// The remote has been unreachable since `since`; the view shows what it last knew.
    Stale { since: SystemTime },
}

/// Checks one remote binding `(id, key)`; `Err` names why it is rejected.
pub type Validator = Arc<dyn Fn(u64, &str) -> std::result::Result<(), String> + Send + Sync>;

/// How a remote view is set up.
#[derive(Clone)]
pub struct RemoteOptions {
    /// Root of the remote's store keys (its `AllocatorOptions::prefix`).
    pub prefix: String,
    /// Checks beyond the built-in ones (ID in the remote's declared space, valid key).
    pub validators: Vec<Validator>,
    /// After the remote has been unreachable this long, drop its entries (with `Delete` events)
    /// rather than keep serving them. `None`: serve the stale view until it reconnects.
    pub stale_ttl: Option<Duration>,
    /// How often a watching view checks that the remote still answers (a paused server sends
    /// nothing and breaks no connection).
    pub probe_interval: Duration,
    /// Bound on each request to the remote (spec read, listing, watch creation, probe).
    pub request_timeout: Duration,
    /// Keys per page when listing.
    pub list_page: i64,
    /// Events buffered per subscriber of the view before it is told it lagged.
    pub event_buffer: usize,
}

impl Default for RemoteOptions {
    fn default() -> Self {
        RemoteOptions {
            prefix: "idalloc".into(),
            validators: Vec::new(),
            stale_ttl: None,
            probe_interval: Duration::from_secs(5),
            request_timeout: Duration::from_secs(5),
            list_page: 1000,
            event_buffer: 4096,
        }
    }
}

impl fmt::Debug for RemoteOptions {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RemoteOptions")
            .field("prefix", &self.prefix)
            .field("validators", &self.validators.len())
            .field("stale_ttl", &self.stale_ttl)
            .field("probe_interval", &self.probe_interval)
            .field("request_timeout", &self.request_timeout)
            .finish()
    }
}

/// The IDs a pool can hand out, as one inclusive interval: `prefix | raw` equals `prefix + raw`
/// because the prefix shares no bit with any raw ID (checked by `PoolSpec::validate`).
pub fn id_space(spec: &PoolSpec) -> (u64, u64) {
    (spec.apply_prefix(spec.min()), spec.apply_prefix(spec.max()))
}

/// Refuses a remote named `name` with spec `spec` if its ID space meets any of `others`.
pub fn check_overlap(name: &str, spec: &PoolSpec, others: &[(Cluster, (u64, u64))]) -> Result<()> {
    let (lo, hi) = id_space(spec);
    for (c, (olo, ohi)) in others {
        if lo <= *ohi && *olo <= hi {
            return Err(Error::invalid(
                Input::Options,
                "remote",
                name,
                format!(
                    "its pool {:?} hands out IDs [{lo:#x}, {hi:#x}], which overlap [{olo:#x}, {ohi:#x}] of cluster {c}; \
                     every cluster needs its own prefix bits (or range) so an ID names one binding",
                    spec.name()
                ),
            ));
        }
    }
    Ok(())
}

/// The built-in checks, then `validators`.
pub fn validate_entry(
    space: (u64, u64),
    validators: &[Validator],
    id: u64,
    key: &str,
) -> std::result::Result<(), String> {
    if id < space.0 || id > space.1 {
        return Err(format!(
            "ID {id:#x} is outside the remote pool's ID space [{:#x}, {:#x}]",
            space.0, space.1
        ));
    }
    validate_key(key).map_err(|e| e.to_string())?;
    for v in validators {
        v(id, key)?;
    }
    Ok(())
}

/// What `check` makes of one record: `None` if it is kept as is, `Some(reason)` if it is a
/// binding that fails validation. Tombstones and unreadable records are not bindings: the cache
/// never shows them, so they pass.
fn rejects(
    kv: &KeyValue,
    parse_id: &impl Fn(&[u8]) -> Option<u64>,
    check: &impl Fn(u64, &str) -> std::result::Result<(), String>,
) -> Option<String> {
    let id = parse_id(&kv.key)?;
    match IdRecord::decode(&kv.value) {
        Some(IdRecord::Bound(key)) => check(id, &key).err(),
        _ => None,
    }
}

/// A listing without the bindings that fail validation, and those reasons.
pub(crate) fn screen_listing(
    kvs: &[KeyValue],
    parse_id: impl Fn(&[u8]) -> Option<u64>,
    check: impl Fn(u64, &str) -> std::result::Result<(), String>,
) -> (Vec<KeyValue>, Vec<String>) {
    let mut kept = Vec::with_capacity(kvs.len());
    let mut dropped = Vec::new();
    for kv in kvs {
        match rejects(kv, &parse_id, &check) {
            None => kept.push(kv.clone()),
            Some(why) => dropped.push(why),
        }
    }
    (kept, dropped)
}

/// A watch event as the view applies it: a binding that fails validation becomes a delete of its
/// ID (whatever the view showed there before is no longer true either).
pub(crate) fn screen_event(
    ev: &WatchEvent,
    parse_id: impl Fn(&[u8]) -> Option<u64>,
    check: impl Fn(u64, &str) -> std::result::Result<(), String>,
) -> (WatchEvent, Option<String>) {
    match ev {
        WatchEvent::Put(kv) => match rejects(kv, &parse_id, &check) {
            None => (ev.clone(), None),
            Some(why) => {
                let del = KeyValue { value: Vec::new(), version: 0, lease: 0, ..kv.clone() };
                (WatchEvent::Delete(del), Some(why))
            }
        },
        WatchEvent::Delete(_) => (ev.clone(), None),
    }
}

/// Checks a remote's name: like a pool name, and not `local`.
pub fn validate_remote_name(name: &str) -> Result<()> {
    crate::pool::validate_pool_name(name).map_err(|_| {
        Error::invalid_str(
            Input::Options,
            "remote name",
            name,
            "[a-z0-9][a-z0-9._-]{0,62}, not \"local\"",
        )
    })?;
    if name == "local" {
        return Err(Error::invalid_str(
            Input::Options,
            "remote name",
            name,
            "\"local\" names this allocator's own store; pick another name",
        ));
    }
    Ok(())
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // Short, await-free critical sections: the data is consistent at every step, so a panic
    // elsewhere while holding the lock leaves nothing half-done.
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// The view and what goes with it under one lock, so that a subscriber's snapshot and its
/// subscription see every change exactly once (changes are emitted while the lock is held).
pub(crate) struct Guarded {
    pub(crate) cache: PoolCache,
    /// A listing has been applied: replays end with `Synced`.
    pub(crate) listed: bool,
    /// `remove_remote` took the view out: the follower must not touch it again.
    removed: bool,
}

/// One remote view, shared by its handles, its follower and the pool.
pub(crate) struct RemoteView {
    pub(crate) cluster: Cluster,
    name: Arc<str>,
    spec: PoolSpec,
    space: (u64, u64),
    layout: Layout,
    validators: Vec<Validator>,
    guarded: Mutex<Guarded>,
    events: broadcast::Sender<Event>,
    /// The pool's all-clusters channel.
    mesh: broadcast::Sender<ClusterEvent>,
    state: tokio::sync::watch::Sender<RemoteState>,
    /// When the current outage began (tokio time, for `stale_ttl`).
    stale_at: Mutex<Option<tokio::time::Instant>>,
    dropped: AtomicU64,
    tasks: Mutex<Vec<AbortHandle>>,
    closing: AtomicBool,
}

impl RemoteView {
    pub(crate) fn lock(&self) -> MutexGuard<'_, Guarded> {
        lock(&self.guarded)
    }

    pub(crate) fn space(&self) -> (u64, u64) {
        self.space
    }

    /// Sends `e` to the view's subscribers and the pool's all-clusters subscribers. Call with the
    /// lock held.
    fn emit(&self, e: Event) {
        let _ = self.events.send(e.clone());
        let _ = self.mesh.send(ClusterEvent { cluster: self.cluster.clone(), event: e });
    }

    fn parse_id(&self, k: &[u8]) -> Option<u64> {
        self.layout.parse_id_key(self.spec.name(), k)
    }

    fn check(&self, id: u64, key: &str) -> std::result::Result<(), String> {
        validate_entry(self.space, &self.validators, id, key)
    }

    fn count_dropped(&self, why: &[String]) {
        if let Some(first) = why.first() {
            self.dropped.fetch_add(why.len() as u64, Ordering::Relaxed);
            warn!(remote = %self.name, pool = %self.spec.name(), dropped = why.len(), reason = %first, "remote entries failed validation and were dropped");
        }
    }

    /// Drops every entry, with `Delete` events (remove_remote, stale_ttl). Not a listing: no
    /// `Synced`.
    fn clear(&self, g: &mut Guarded) {
        let rev = g.cache.revision();
        let events = g.cache.replace_all(&[], rev, |k| self.parse_id(k));
        for e in events {
            if e != Event::Synced {
                self.emit(e);
            }
        }
        g.listed = false;
    }

    /// Ends the view: stops its tasks and drops its entries with `Delete` events.
    pub(crate) fn shut(&self) {
        self.closing.store(true, Ordering::Release);
        for t in lock(&self.tasks).drain(..) {
            t.abort();
        }
        let mut g = self.lock();
        g.removed = true;
        self.clear(&mut g);
    }

    pub(crate) fn abort_tasks(&self) {
        for t in lock(&self.tasks).drain(..) {
            t.abort();
        }
    }

    fn went_unreachable(&self, error: &StoreError) {
        let mut changed = false;
        self.state.send_if_modified(|s| {
            if *s == RemoteState::Synced {
                *s = RemoteState::Stale { since: SystemTime::now() };
                changed = true;
            }
            changed
        });
        if changed {
            *lock(&self.stale_at) = Some(tokio::time::Instant::now());
            warn!(remote = %self.name, pool = %self.spec.name(), error = %error, "remote unreachable; serving its last known view");
        }
    }
}

impl Drop for RemoteView {
    fn drop(&mut self) {
        // The follower holds only a weak reference, but may be waiting on a quiet watch.
        for t in lock(&self.tasks).drain(..) {
            t.abort();
        }
    }
}

/// Feeds one remote view.
struct RemoteSink(Weak<RemoteView>);

impl RemoteSink {
    fn view(&self) -> std::result::Result<Arc<RemoteView>, Gone> {
        match self.0.upgrade() {
            Some(v) if !v.closing.load(Ordering::Acquire) => Ok(v),
            _ => Err(Gone),
        }
    }
}

impl Sink for RemoteSink {
    fn revision(&self) -> std::result::Result<Revision, Gone> {
        Ok(self.view()?.lock().cache.revision())
    }

    fn listed(&self, kvs: &[KeyValue], revision: Revision) -> std::result::Result<(), Gone> {
        let v = self.view()?;
        let (kept, dropped) = screen_listing(kvs, |k| v.parse_id(k), |id, key| v.check(id, key));
        v.count_dropped(&dropped);
        {
            let mut g = v.lock();
            if g.removed {
                return Err(Gone);
            }
            let events = g.cache.replace_all(&kept, revision, |k| v.parse_id(k));
            for e in events {
                if e != Event::Synced {
                    v.emit(e);
                }
            }
            // Exactly one `Synced` per listing.
            v.emit(Event::Synced);
            g.listed = true;
        }
        let was = *v.state.borrow();
        if was != RemoteState::Synced {
            info!(remote = %v.name, pool = %v.spec.name(), bindings = v.lock().cache.len(), "remote view synced");
        }
        *lock(&v.stale_at) = None;
        v.state.send_replace(RemoteState::Synced);
        Ok(())
    }

    fn watched(&self, events: &[WatchEvent]) -> std::result::Result<(), Gone> {
        let v = self.view()?;
        let mut dropped = Vec::new();
        {
            let mut g = v.lock();
            if g.removed {
                return Err(Gone);
            }
            for ev in events {
                let (ev, why) = screen_event(ev, |k| v.parse_id(k), |id, key| v.check(id, key));
                dropped.extend(why);
                if let Some(e) = g.cache.apply(&ev, |k| v.parse_id(k)) {
                    v.emit(e);
                }
            }
        }
        v.count_dropped(&dropped);
        Ok(())
    }

    fn unreachable(&self, error: &StoreError) {
        if let Ok(v) = self.view() {
            v.went_unreachable(error);
        }
    }
}

/// Drops a stale view's entries once it has been unreachable for `ttl`.
async fn expire_stale(view: Weak<RemoteView>, ttl: Duration) {
    let Some(v) = view.upgrade() else { return };
    let mut state = v.state.subscribe();
    drop(v);
    loop {
        let stale = matches!(*state.borrow_and_update(), RemoteState::Stale { .. });
        if stale {
            let at = view.upgrade().and_then(|v| *lock(&v.stale_at));
            if let Some(at) = at {
                tokio::select! {
                    _ = tokio::time::sleep_until(at + ttl) => {
                        let Some(v) = view.upgrade() else { return };
                        if matches!(*v.state.borrow(), RemoteState::Stale { .. }) {
                            warn!(remote = %v.name, pool = %v.spec.name(), ?ttl, "remote unreachable longer than its stale TTL; dropping its entries");
                            let mut g = v.lock();
                            if !g.removed {
                                v.clear(&mut g);
                            }
                        }
                        // Wait for the next change of state.
                        if state.changed().await.is_err() {
                            return;
                        }
                        continue;
                    }
                    r = state.changed() => {
                        if r.is_err() { return; }
                        continue;
                    }
                }
            }
        }
        if state.changed().await.is_err() {
            return;
        }
    }
}

/// Reads the remote's spec of pool `pool`, refuses overlaps with `others`, and starts the view.
pub(crate) async fn open(
    name: &str,
    local: &PoolSpec,
    store: Arc<dyn Store>,
    opts: RemoteOptions,
    others: &[(Cluster, (u64, u64))],
    mesh: broadcast::Sender<ClusterEvent>,
) -> Result<Arc<RemoteView>> {
    validate_remote_name(name)?;
    let layout = Layout::new(&opts.prefix)?;
    if opts.list_page < 1 {
        return Err(Error::invalid(
            Input::Options,
            "remote list page",
            opts.list_page.to_string(),
            "at least 1",
        ));
    }
    let pool = local.name();
    let key = layout.pool_spec_key(pool);
    let t = opts.request_timeout;
    let resp = match tokio::time::timeout(t, store.get(GetRequest::key(key))).await {
        Ok(Ok(r)) => r,
        Ok(Err(e)) => {
            return Err(match Error::from(e) {
                Error::Unavailable { reason, retryable, source } => Error::Unavailable {
                    reason: format!("remote {name:?}: reading pool {pool:?}: {reason}"),
                    retryable,
                    source,
                },
                other => other,
            })
        }
        Err(_) => {
            return Err(Error::unavailable(format!(
                "remote {name:?}: reading pool {pool:?}: no answer within {t:?}"
            )))
        }
    };
    let Some(kv) = resp.kvs.first() else {
        return Err(Error::PoolNotFound { pool: format!("{pool}\" in remote \"{name}") });
    };
    let spec = PoolSpec::from_json(&kv.value).map_err(|e| {
        Error::corrupt(
            format!("remote {name:?}: {}", String::from_utf8_lossy(&kv.key)),
            format!("the spec of pool {pool:?} is unreadable: {e}"),
        )
    })?;
    check_overlap(name, &spec, others)?;
    let (events, _) = broadcast::channel(opts.event_buffer.max(1));
    let (state, _) = tokio::sync::watch::channel(RemoteState::Syncing);
    let name: Arc<str> = Arc::from(name);
    let view = Arc::new(RemoteView {
        cluster: Cluster::Remote(name.clone()),
        name,
        space: id_space(&spec),
        guarded: Mutex::new(Guarded {
            cache: PoolCache::new(spec.clone()),
            listed: false,
            removed: false,
        }),
        spec,
        layout,
        validators: opts.validators.clone(),
        events,
        mesh,
        state,
        stale_at: Mutex::new(None),
        dropped: AtomicU64::new(0),
        tasks: Mutex::new(Vec::new()),
        closing: AtomicBool::new(false),
    });
    let cfg = FeedConfig {
        store,
        range: KeyRange::prefix(view.layout.id_prefix(view.spec.name())),
        page: opts.list_page,
        relist_after_outage: true,
        probe: Some(opts.probe_interval),
        request_timeout: Some(opts.request_timeout),
    };
    let follower = tokio::spawn(feed::follow(
        cfg,
        Arc::new(Relist::default()),
        RemoteSink(Arc::downgrade(&view)),
    ));
    lock(&view.tasks).push(follower.abort_handle());
    if let Some(ttl) = opts.stale_ttl {
        let t = tokio::spawn(expire_stale(Arc::downgrade(&view), ttl));
        lock(&view.tasks).push(t.abort_handle());
    }
    Ok(view)
}

/// A handle on one remote view ([`crate::Pool::watch_remote`]). Cheap to clone.
#[derive(Clone)]
pub struct RemotePool {
    pub(crate) view: Arc<RemoteView>,
}

impl fmt::Debug for RemotePool {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RemotePool")
            .field("name", &self.view.name)
            .field("spec", &self.view.spec)
            .field("state", &self.state())
            .finish()
    }
}

impl RemotePool {
    /// The remote's name.
    pub fn name(&self) -> &str {
        &self.view.name
    }

    /// As a [`Cluster`].
    pub fn cluster(&self) -> Cluster {
        self.view.cluster.clone()
    }

    /// The remote pool's spec, as read when the view was opened.
    pub fn spec(&self) -> &PoolSpec {
        &self.view.spec
    }

    /// How far the view can be trusted now.
    pub fn state(&self) -> RemoteState {
        *self.view.state.borrow()
    }

    /// Waits until the view's state is `Synced` (use a timeout: a remote may never answer).
    pub async fn wait_synced(&self) {
        let mut rx = self.view.state.subscribe();
        let _ = rx.wait_for(|s| *s == RemoteState::Synced).await;
    }

    /// Waits until the view's state is `Stale`.
    pub async fn wait_stale(&self) {
        let mut rx = self.view.state.subscribe();
        let _ = rx.wait_for(|s| matches!(s, RemoteState::Stale { .. })).await;
    }

    /// The ID bound to `key` in the remote pool, as the view knows it (no round trip).
    pub fn get(&self, key: &str) -> Option<u64> {
        self.view.lock().cache.get(key)
    }

    /// The key bound to `id` in the remote pool, as the view knows it (no round trip).
    pub fn key_of(&self, id: u64) -> Option<String> {
        self.view.lock().cache.key_of(id).map(str::to_string)
    }

    /// Every binding of the view, sorted by ID.
    pub fn snapshot(&self) -> Vec<(u64, String)> {
        self.view.lock().cache.snapshot()
    }

    /// The remote store revision the view reflects (0 before the first listing).
    pub fn revision(&self) -> Revision {
        self.view.lock().cache.revision()
    }

    /// Number of bindings in the view.
    pub fn len(&self) -> usize {
        self.view.lock().cache.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Entries dropped by validation so far (each listing or event that carried one counts).
    pub fn dropped(&self) -> u64 {
        self.view.dropped.load(Ordering::Relaxed)
    }

    /// Subscribes to the view's events: first the current bindings as `Upsert`s and, if a listing
    /// was applied, one `Synced`; then every change, in order.
    pub fn events(&self) -> crate::Events {
        let g = self.view.lock();
        let replay = replay(&g.cache, g.listed);
        let rx = self.view.events.subscribe();
        drop(g);
        crate::Events::new(replay, rx)
    }
}

/// The replay a new subscriber gets: the bindings as `Upsert`s by ID, then `Synced` if the view
/// is the result of a listing.
pub(crate) fn replay(cache: &PoolCache, listed: bool) -> VecDeque<Event> {
    let mut r: VecDeque<Event> =
        cache.snapshot().into_iter().map(|(id, key)| Event::Upsert { id, key }).collect();
    if listed {
        r.push_back(Event::Synced);
    }
    r
}

#[cfg(test)]
mod tests {
    use super::*;

    fn kv(id: u64, rec: IdRecord) -> KeyValue {
        KeyValue {
            key: id.to_string().into_bytes(),
            value: rec.encode(),
            create_revision: 1,
            mod_revision: 1,
            version: 1,
            lease: 0,
        }
    }

    fn parse(k: &[u8]) -> Option<u64> {
        std::str::from_utf8(k).ok()?.parse().ok()
    }

    #[test]
    fn id_spaces_of_clusters_with_prefix_bits() {
        let a = PoolSpec::new("p", 1, 0xffff).prefix(1 << 16);
        let b = PoolSpec::new("p", 1, 0xffff).prefix(2 << 16);
        assert_eq!(id_space(&a), (0x10001, 0x1ffff));
        assert_eq!(id_space(&b), (0x20001, 0x2ffff));
        let others = vec![(Cluster::Local, id_space(&a))];
        assert!(check_overlap("b", &b, &others).is_ok());
        // Same prefix bits as the local pool: refused, naming both spaces and the cluster.
        let err = check_overlap("twin", &a, &others).expect_err("overlap");
        let msg = err.to_string();
        assert!(msg.contains("twin") && msg.contains("0x10001") && msg.contains("local"), "{msg}");
        // No prefix, range overlapping at one ID.
        let c = PoolSpec::new("p", 0x1ffff, 0x2ffff);
        let others = vec![(Cluster::Remote("x".into()), id_space(&a))];
        assert!(check_overlap("c", &c, &others).expect_err("touching").to_string().contains("x"));
    }

    #[test]
    fn entries_outside_the_declared_space_or_refused_by_a_validator_are_dropped() {
        let space = (0x20001, 0x2ffff);
        let no_k: Validator = Arc::new(|_, key: &str| {
            if key.starts_with('k') {
                Err(format!("key {key:?} starts with k"))
            } else {
                Ok(())
            }
        });
        assert!(validate_entry(space, &[], 0x20005, "a").is_ok());
        assert!(validate_entry(space, &[], 0x10005, "a").expect_err("prefix").contains("0x10005"));
        assert!(validate_entry(space, &[], 0x30000, "a").is_err());
        assert!(validate_entry(space, &[], 0x20005, "").is_err());
        assert!(validate_entry(space, std::slice::from_ref(&no_k), 0x20005, "kk").is_err());

        let listing = vec![
            kv(0x20001, IdRecord::Bound("a".into())),
            kv(0x10001, IdRecord::Bound("b".into())),
            kv(0x20002, IdRecord::Bound("kk".into())),
            kv(0x10002, IdRecord::Tombstone("t".into())),
        ];
        let check = |id, key: &str| validate_entry(space, std::slice::from_ref(&no_k), id, key);
        let (kept, dropped) = screen_listing(&listing, parse, check);
        assert_eq!(kept, vec![listing[0].clone(), listing[3].clone()]);
        assert_eq!(dropped.len(), 2);

        // A put that fails turns into a delete of its ID; a valid one passes untouched.
        let bad = WatchEvent::Put(kv(0x20003, IdRecord::Bound("kx".into())));
        let (ev, why) = screen_event(&bad, parse, check);
        assert!(matches!(ev, WatchEvent::Delete(ref d) if d.key == b"131075".to_vec()));
        assert!(why.is_some());
        let good = WatchEvent::Put(kv(0x20003, IdRecord::Bound("x".into())));
        assert_eq!(screen_event(&good, parse, check), (good.clone(), None));
    }

    #[test]
    fn remote_names() {
        assert!(validate_remote_name("cluster-b").is_ok());
        assert!(validate_remote_name("local").is_err());
        assert!(validate_remote_name("B").is_err());
        assert!(validate_remote_name("").is_err());
    }

    #[test]
    fn replay_is_the_bindings_then_one_synced() {
        let mut c = PoolCache::new(PoolSpec::new("p", 1, 10));
        assert!(replay(&c, false).is_empty());
        c.replace_all(
            &[kv(3, IdRecord::Bound("c".into())), kv(1, IdRecord::Bound("a".into()))],
            5,
            parse,
        );
        assert_eq!(
            replay(&c, true),
            VecDeque::from(vec![
                Event::Upsert { id: 1, key: "a".into() },
                Event::Upsert { id: 3, key: "c".into() },
                Event::Synced
            ])
        );
    }
}
