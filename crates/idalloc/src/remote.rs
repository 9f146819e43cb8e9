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
//!
//! One file (about 1,000 lines of code) because a remote view is one state machine: the validators,
//! the view's state and its transitions, the two feed sinks (records and spec) and the public
//! handle all read and write the same guarded state, and splitting them would make that state
//! crate-visible. The pure parts (`id_space`, `check_overlap`, `validate_entry`) are free functions
//! at the top, tested on their own.

use std::collections::VecDeque;
use std::fmt;
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::time::{Duration, SystemTime};

use tokio::sync::broadcast;
use tokio::task::AbortHandle;
use tracing::{info, warn};

use crate::cache::{Event, PoolCache};
use crate::error::{Error, Input, Result};
use crate::feed::{self, FeedConfig, Gone, Relist, Sink};
use crate::layout::{IdRecord, Layout};
use crate::metrics;
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
    /// The remote pool was re-created with a spec this pool must refuse (its ID space overlaps
    /// another cluster's, or it is unreadable): the view dropped its entries and shows nothing
    /// until the remote's spec is acceptable again. [`RemotePool::refusal`] says why.
    Refused,
}

impl RemoteState {
    /// The state's name, as in the `idalloc_remote_view_state` metric.
    pub fn label(&self) -> &'static str {
        match self {
            RemoteState::Syncing => "syncing",
            RemoteState::Synced => "synced",
            RemoteState::Stale { .. } => "stale",
            RemoteState::Refused => "refused",
        }
    }
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
    /// The remote pool's spec the view validates against, and its ID space.
    spec: PoolSpec,
    space: (u64, u64),
    /// The spec record as last seen (its create revision tells a re-created pool, DESIGN §12).
    spec_created: Revision,
    spec_value: Vec<u8>,
    /// Why the remote's current spec is refused; the view shows nothing meanwhile.
    refused: Option<String>,
}

/// An ID space no ID is in (a refused view's): `lo > hi`, so it meets no other space.
const NO_SPACE: (u64, u64) = (u64::MAX, 0);

/// The ID spaces of some clusters of a pool.
pub type Spaces = [(Cluster, (u64, u64))];

/// The pool a view belongs to, as the view needs it when the remote's spec changes.
pub(crate) trait Neighbours: Send + Sync {
    /// Runs `f` with the ID spaces of the pool's other clusters (the local pool and every remote
    /// but `me`), while no remote of the pool can be added or change its space.
    fn with_others(&self, me: &str, f: &mut dyn FnMut(&Spaces));
}

/// One remote view, shared by its handles, its follower and the pool.
pub(crate) struct RemoteView {
    pub(crate) cluster: Cluster,
    name: Arc<str>,
    /// The pool's name (the same in every cluster).
    pool: Arc<str>,
    /// The view's ID space as the pool routes lookups by it (`key_of_any`): a copy of
    /// `Guarded::space`, written only while the pool's registry of remotes is locked for writing
    /// (which then rebuilds its routes), and re-checked under the view's lock.
    space_lo: AtomicU64,
    space_hi: AtomicU64,
    layout: Layout,
    validators: Vec<Validator>,
    guarded: Mutex<Guarded>,
    events: broadcast::Sender<Event>,
    /// The pool's all-clusters channel.
    mesh: broadcast::Sender<ClusterEvent>,
    state: tokio::sync::watch::Sender<RemoteState>,
    /// When the current outage began (tokio time, for `stale_ttl`).
    stale_at: Mutex<Option<tokio::time::Instant>>,
    /// Since when the view has not been known to follow its remote (opened, or went stale);
    /// `None` while synced. For the sync-age metric.
    unsynced_since: Mutex<Option<tokio::time::Instant>>,
    /// The remote was reported unreachable since the last listing: the next one is a reconnect.
    lost: AtomicBool,
    dropped: AtomicU64,
    tasks: Mutex<Vec<AbortHandle>>,
    closing: AtomicBool,
    /// The remote store (read only) and how to follow it.
    store: Arc<dyn Store>,
    opts: RemoteOptions,
    /// Asks the follower of `id/` records to re-list.
    relist: Arc<Relist>,
    neighbours: std::sync::OnceLock<Box<dyn Neighbours>>,
}

impl RemoteView {
    pub(crate) fn lock(&self) -> MutexGuard<'_, Guarded> {
        lock(&self.guarded)
    }

    /// The view's ID space (see `space_lo`).
    pub(crate) fn space(&self) -> (u64, u64) {
        (self.space_lo.load(Ordering::Relaxed), self.space_hi.load(Ordering::Relaxed))
    }

    fn set_space(&self, g: &mut Guarded, space: (u64, u64)) {
        g.space = space;
        self.space_lo.store(space.0, Ordering::Relaxed);
        self.space_hi.store(space.1, Ordering::Relaxed);
    }

    /// The key bound to `id` in the view (no round trip).
    pub(crate) fn key_of(&self, id: u64) -> Option<String> {
        let g = self.lock();
        if id < g.space.0 || id > g.space.1 {
            return None;
        }
        g.cache.key_of(id).map(str::to_string)
    }

    fn publish_state(&self, s: RemoteState) {
        self.state.send_replace(s);
        metrics::remote_state(&self.pool, &self.name, Some(s.label()));
    }

    /// Sends `e` to the view's subscribers and the pool's all-clusters subscribers. Call with the
    /// lock held.
    fn emit(&self, e: Event) {
        let _ = self.events.send(e.clone());
        let _ = self.mesh.send(ClusterEvent { cluster: self.cluster.clone(), event: e });
    }

    fn parse_id(&self, k: &[u8]) -> Option<u64> {
        self.layout.parse_id_key(&self.pool, k)
    }

    fn check(&self, space: (u64, u64), id: u64, key: &str) -> std::result::Result<(), String> {
        validate_entry(space, &self.validators, id, key)
    }

    fn count_dropped(&self, why: &[String]) {
        if let Some(first) = why.first() {
            self.dropped.fetch_add(why.len() as u64, Ordering::Relaxed);
            metrics::remote_drops(&self.pool, &self.name, why.len());
            warn!(remote = %self.name, pool = %&self.pool, dropped = why.len(), reason = %first, "remote entries failed validation and were dropped");
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
        metrics::remote_bindings(&self.pool, &self.name, g.cache.len());
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
        metrics::remote_state(&self.pool, &self.name, None);
        metrics::remote_sync_age(&self.pool, &self.name, 0.0);
    }

    /// Publishes the seconds since the view last followed its remote (0 while synced).
    ///
    /// The gauge is set while `unsynced_since` is locked: the once-a-second ticker could otherwise
    /// read the old `unsynced_since`, lose the CPU while a listing clears it and publishes 0, and
    /// then overwrite that 0 with its stale age (seen once in a whole-suite loop under load).
    fn report_sync_age(&self) {
        let since = lock(&self.unsynced_since);
        let age = since.map_or(0.0, |t| t.elapsed().as_secs_f64());
        metrics::remote_sync_age(&self.pool, &self.name, age);
    }

    /// Starts following the remote. Called once the view is registered with its pool, so that
    /// what the follower publishes (events, metrics) belongs to a view the pool shows.
    pub(crate) fn start(self: &Arc<Self>, neighbours: Box<dyn Neighbours>) {
        let _ = self.neighbours.set(neighbours);
        let cfg = FeedConfig {
            store: self.store.clone(),
            range: KeyRange::prefix(self.layout.id_prefix(&self.pool)),
            page: self.opts.list_page,
            relist_after_outage: true,
            probe: Some(self.opts.probe_interval),
            request_timeout: Some(self.opts.request_timeout),
        };
        metrics::remote_state(&self.pool, &self.name, Some("syncing"));
        metrics::remote_bindings(&self.pool, &self.name, 0);
        metrics::remote_opened(&self.pool, &self.name);
        // The spec record, followed apart: a pool deleted and re-created with another spec must
        // be noticed (its create revision changes), re-validated and re-listed. No probe: the
        // follower of `id/` records tells outages.
        let spec_cfg = FeedConfig {
            range: KeyRange::key(self.layout.pool_spec_key(&self.pool)),
            probe: None,
            ..cfg.clone()
        };
        let mut tasks = lock(&self.tasks);
        let sink = RemoteSink(Arc::downgrade(self));
        tasks.push(tokio::spawn(feed::follow(cfg, self.relist.clone(), sink)).abort_handle());
        let spec_sink = SpecSink { view: Arc::downgrade(self), rev: AtomicI64::new(0) };
        tasks.push(
            tokio::spawn(feed::follow(spec_cfg, Arc::new(Relist::default()), spec_sink))
                .abort_handle(),
        );
        tasks.push(tokio::spawn(report_sync_age(Arc::downgrade(self))).abort_handle());
        if let Some(ttl) = self.opts.stale_ttl {
            tasks.push(tokio::spawn(expire_stale(Arc::downgrade(self), ttl)).abort_handle());
        }
    }

    fn went_unreachable(&self, error: &StoreError) {
        self.lost.store(true, Ordering::Release);
        // State changes happen under the view's lock, so that they keep the order of the
        // changes that cause them (a spec refusal is never overwritten by an older outage).
        let _g = self.lock();
        if *self.state.borrow() == RemoteState::Synced {
            let now = tokio::time::Instant::now();
            *lock(&self.stale_at) = Some(now);
            *lock(&self.unsynced_since) = Some(now);
            self.publish_state(RemoteState::Stale { since: SystemTime::now() });
            warn!(remote = %self.name, pool = %&self.pool, error = %error, "remote unreachable; serving its last known view");
        }
    }

    /// The spec record of the remote pool as its follower read it. A record other than the one
    /// the view validates against (another create revision: the pool was deleted and re-created;
    /// or another value) is re-validated against the pool's other clusters: accepted, the view
    /// drops its entries (with `Delete` events), takes the new spec and re-lists; refused, it
    /// drops its entries and shows nothing, in state `Refused`, until the spec changes again.
    fn spec_seen(&self, kv: &KeyValue) {
        {
            let g = self.lock();
            if g.removed || (kv.create_revision == g.spec_created && kv.value == g.spec_value) {
                return;
            }
        }
        let Some(neighbours) = self.neighbours.get() else { return };
        let parsed = PoolSpec::from_json(&kv.value);
        neighbours.with_others(&self.name, &mut |others| {
            let mut g = self.lock();
            if g.removed {
                return;
            }
            g.spec_created = kv.create_revision;
            g.spec_value = kv.value.clone();
            let verdict = match &parsed {
                Err(e) => Err(format!("its spec of pool {:?} is unreadable: {e}", &*self.pool)),
                Ok(spec) if spec.name() != &*self.pool => Err(format!(
                    "its spec record of pool {:?} names pool {:?}",
                    &*self.pool,
                    spec.name()
                )),
                Ok(spec) => check_overlap(&self.name, spec, others).map_err(|e| e.to_string()),
            };
            self.clear(&mut g);
            *lock(&self.unsynced_since) = Some(tokio::time::Instant::now());
            match verdict.and_then(|()| parsed.as_ref().map_err(|e| e.to_string())) {
                Ok(spec) => {
                    info!(remote = %self.name, pool = %&*self.pool, spec = ?spec, "remote pool re-created with another spec; re-listing");
                    g.cache = PoolCache::read_only(spec.clone());
                    g.spec = spec.clone();
                    self.set_space(&mut g, id_space(spec));
                    g.refused = None;
                    self.publish_state(RemoteState::Syncing);
                }
                Err(why) => {
                    warn!(remote = %self.name, pool = %&*self.pool, reason = %why, "remote pool re-created with a spec this pool refuses; its entries are dropped");
                    self.set_space(&mut g, NO_SPACE);
                    g.refused = Some(why);
                    self.publish_state(RemoteState::Refused);
                }
            }
        });
        self.relist.request();
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
        {
            let mut g = v.lock();
            if g.removed {
                return Err(Gone);
            }
            if g.refused.is_some() {
                // The remote's spec is refused: the view shows nothing, whatever the listing.
                return Ok(());
            }
            // Screened under the lock: the space cannot change between screening and applying.
            let space = g.space;
            let (kept, why) =
                screen_listing(kvs, |k| v.parse_id(k), |id, key| v.check(space, id, key));
            let dropped = why;
            let events = g.cache.replace_all(&kept, revision, |k| v.parse_id(k));
            for e in events {
                if e != Event::Synced {
                    v.emit(e);
                }
            }
            // Exactly one `Synced` per listing.
            v.emit(Event::Synced);
            g.listed = true;
            metrics::remote_bindings(&v.pool, &v.name, g.cache.len());
            if *v.state.borrow() != RemoteState::Synced {
                info!(remote = %v.name, pool = %&v.pool, bindings = g.cache.len(), "remote view synced");
            }
            *lock(&v.stale_at) = None;
            *lock(&v.unsynced_since) = None;
            // The age says 0 before the state says synced, for the same reason as the drops below.
            v.report_sync_age();
            // Counted before the state says synced: a caller that waited for `Synced` reads a
            // drop count that covers this listing (the loop saw `dropped() == 0` right after
            // `wait_synced` in 2 of 14 runs under load when this came after the lock).
            v.count_dropped(&dropped);
            // The reconnect, too, is counted before the state says synced (a caller that waited
            // for the resync read 0 reconnects once in a whole-suite loop when this came after).
            if v.lost.swap(false, Ordering::AcqRel) {
                metrics::remote_reconnect(&v.pool, &v.name);
            }
            v.publish_state(RemoteState::Synced);
        }
        v.report_sync_age();
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
            if g.refused.is_some() {
                return Ok(());
            }
            let space = g.space;
            for ev in events {
                let (ev, why) =
                    screen_event(ev, |k| v.parse_id(k), |id, key| v.check(space, id, key));
                dropped.extend(why);
                if let Some(e) = g.cache.apply(&ev, |k| v.parse_id(k)) {
                    v.emit(e);
                }
            }
            metrics::remote_bindings(&v.pool, &v.name, g.cache.len());
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

/// Follows a remote pool's spec record (`RemoteView::spec_seen`).
struct SpecSink {
    view: Weak<RemoteView>,
    /// The store revision the follower has seen of the record.
    rev: AtomicI64,
}

impl SpecSink {
    fn view(&self) -> std::result::Result<Arc<RemoteView>, Gone> {
        match self.view.upgrade() {
            Some(v) if !v.closing.load(Ordering::Acquire) => Ok(v),
            _ => Err(Gone),
        }
    }
}

impl Sink for SpecSink {
    fn revision(&self) -> std::result::Result<Revision, Gone> {
        self.view()?;
        Ok(self.rev.load(Ordering::Acquire))
    }

    fn listed(&self, kvs: &[KeyValue], revision: Revision) -> std::result::Result<(), Gone> {
        let v = self.view()?;
        // No record: the pool was deleted; its `id/` records go with it (the other follower
        // drops them). A re-created pool shows up as a put.
        if let Some(kv) = kvs.first() {
            v.spec_seen(kv);
        }
        self.rev.store(revision, Ordering::Release);
        Ok(())
    }

    fn watched(&self, events: &[WatchEvent]) -> std::result::Result<(), Gone> {
        let v = self.view()?;
        for ev in events {
            if let WatchEvent::Put(kv) = ev {
                v.spec_seen(kv);
            }
            self.rev.fetch_max(ev.kv().mod_revision, Ordering::AcqRel);
        }
        Ok(())
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
                            warn!(remote = %v.name, pool = %&v.pool, ?ttl, "remote unreachable longer than its stale TTL; dropping its entries");
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

/// Publishes a view's sync age every second while it lives (the other remote metrics change
/// with the view; an age grows on its own).
async fn report_sync_age(view: Weak<RemoteView>) {
    let mut tick = tokio::time::interval(Duration::from_secs(1));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        match view.upgrade() {
            Some(v) if !v.closing.load(Ordering::Acquire) => v.report_sync_age(),
            _ => return,
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
    let (spec, kv) = read_spec(name, pool, &*store, &layout, opts.request_timeout).await?;
    check_overlap(name, &spec, others)?;
    let (events, _) = broadcast::channel(opts.event_buffer.max(1));
    let (state, _) = tokio::sync::watch::channel(RemoteState::Syncing);
    let name: Arc<str> = Arc::from(name);
    let space = id_space(&spec);
    let view = Arc::new(RemoteView {
        cluster: Cluster::Remote(name.clone()),
        name,
        pool: Arc::from(pool),
        space_lo: AtomicU64::new(space.0),
        space_hi: AtomicU64::new(space.1),
        guarded: Mutex::new(Guarded {
            cache: PoolCache::read_only(spec.clone()),
            listed: false,
            removed: false,
            spec,
            space,
            spec_created: kv.create_revision,
            spec_value: kv.value.clone(),
            refused: None,
        }),
        layout,
        validators: opts.validators.clone(),
        events,
        mesh,
        state,
        stale_at: Mutex::new(None),
        unsynced_since: Mutex::new(Some(tokio::time::Instant::now())),
        lost: AtomicBool::new(false),
        dropped: AtomicU64::new(0),
        tasks: Mutex::new(Vec::new()),
        closing: AtomicBool::new(false),
        store,
        opts,
        relist: Arc::new(Relist::default()),
        neighbours: std::sync::OnceLock::new(),
    });
    Ok(view)
}

/// One bounded read of a remote store.
async fn read_remote(
    name: &str,
    what: &str,
    store: &dyn Store,
    req: GetRequest,
    t: Duration,
) -> Result<Vec<KeyValue>> {
    match tokio::time::timeout(t, store.get(req)).await {
        Ok(Ok(r)) => Ok(r.kvs),
        Ok(Err(e)) => Err(match Error::from(e) {
            Error::Unavailable { reason, retryable, source } => Error::Unavailable {
                reason: format!("remote {name:?}: {what}: {reason}"),
                retryable,
                source,
            },
            other => other,
        }),
        Err(_) => {
            Err(Error::unavailable(format!("remote {name:?}: {what}: no answer within {t:?}")))
        }
    }
}

/// Reads the spec record of pool `pool` in remote `name` (one round trip).
async fn read_spec(
    name: &str,
    pool: &str,
    store: &dyn Store,
    layout: &Layout,
    t: Duration,
) -> Result<(PoolSpec, KeyValue)> {
    let req = GetRequest::key(layout.pool_spec_key(pool));
    let kvs = read_remote(name, &format!("reading pool {pool:?}"), store, req, t).await?;
    let Some(kv) = kvs.into_iter().next() else {
        return Err(Error::PoolNotFound { pool: format!("{pool}\" in remote \"{name}") });
    };
    let spec = PoolSpec::from_json(&kv.value).map_err(|e| {
        Error::corrupt(
            format!("remote {name:?}: {}", String::from_utf8_lossy(&kv.key)),
            format!("the spec of pool {pool:?} is unreadable: {e}"),
        )
    })?;
    Ok((spec, kv))
}

/// Direct reads of a remote pool, for a process that answers one lookup and exits (the CLI's
/// `get`/`lookup --remote`): the spec is read and checked as by [`crate::Pool::watch_remote`]
/// (overlap refused), then each question reads only the records it needs (1 or 2 round trips),
/// instead of listing the whole remote pool into a view. The same validation applies: an answer
/// outside the remote's ID space, or refused by a validator, is no answer.
pub struct RemoteReader {
    name: Arc<str>,
    store: Arc<dyn Store>,
    layout: Layout,
    spec: PoolSpec,
    validators: Vec<Validator>,
    timeout: Duration,
}

impl RemoteReader {
    /// Reads remote `name`'s spec of `local`'s pool (one round trip) and refuses it if its ID
    /// space meets any of `others` (the local pool's and other remotes').
    pub async fn open(
        name: &str,
        local: &PoolSpec,
        store: Arc<dyn Store>,
        opts: &RemoteOptions,
        others: &Spaces,
    ) -> Result<RemoteReader> {
        validate_remote_name(name)?;
        let layout = Layout::new(&opts.prefix)?;
        let (spec, _) =
            read_spec(name, local.name(), &*store, &layout, opts.request_timeout).await?;
        check_overlap(name, &spec, others)?;
        Ok(RemoteReader {
            name: Arc::from(name),
            store,
            layout,
            spec,
            validators: opts.validators.clone(),
            timeout: opts.request_timeout,
        })
    }

    /// As a [`Cluster`].
    pub fn cluster(&self) -> Cluster {
        Cluster::Remote(self.name.clone())
    }

    /// The remote pool's ID space.
    pub fn space(&self) -> (u64, u64) {
        id_space(&self.spec)
    }

    /// The key bound to `id` in the remote pool (one round trip).
    pub async fn key_of(&self, id: u64) -> Result<Option<String>> {
        let space = self.space();
        if id < space.0 || id > space.1 {
            return Ok(None);
        }
        let req = GetRequest::key(self.layout.id_key(self.spec.name(), id));
        let kvs = read_remote(&self.name, "reading an ID", &*self.store, req, self.timeout).await?;
        Ok(kvs.first().and_then(|kv| match IdRecord::decode(&kv.value) {
            Some(IdRecord::Bound(k)) if validate_entry(space, &self.validators, id, &k).is_ok() => {
                Some(k)
            }
            _ => None,
        }))
    }

    /// The ID bound to `key` in the remote pool: its key record names the ID, and the ID record
    /// must say `key` (two round trips; the ID record is what a view would show).
    pub async fn get(&self, key: &str) -> Result<Option<u64>> {
        validate_key(key)?;
        let req = GetRequest::key(self.layout.key_key(self.spec.name(), key));
        let kvs = read_remote(&self.name, "reading a key", &*self.store, req, self.timeout).await?;
        let Some(id) = kvs.first().and_then(|kv| crate::layout::parse_id_value(&kv.value)) else {
            return Ok(None);
        };
        Ok(self.key_of(id).await?.filter(|k| k == key).map(|_| id))
    }
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
            .field("spec", &self.spec())
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

    /// The remote pool's spec the view validates against: as read when the view was opened, or
    /// the newer one of a re-created pool (see [`RemoteState::Refused`]).
    pub fn spec(&self) -> PoolSpec {
        self.view.lock().spec.clone()
    }

    /// Why the remote's current spec is refused ([`RemoteState::Refused`]); `None` otherwise.
    pub fn refusal(&self) -> Option<String> {
        self.view.lock().refused.clone()
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
        self.view.key_of(id)
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
