//! The remote view: its guarded state (cache, spec, refusal), its transitions (listing applied,
//! outage, re-created spec, removal) and the events and metrics they publish. Opened by
//! [`open`]; followed by `follow.rs`; read through `handle.rs`.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::SystemTime;

use tokio::sync::broadcast;
use tokio::task::AbortHandle;
use tracing::{info, warn};

use crate::cache::{Batch, Event, PoolCache};
use crate::error::{Error, Input, Result};
use crate::feed::Relist;
use crate::layout::Layout;
use crate::metrics;
use crate::pool::PoolSpec;
use crate::store::{KeyValue, Revision, Store, StoreError};

use super::cluster::{Cluster, ClusterEvent, RemoteState};
use super::options::RemoteOptions;
use super::reader::read_spec;
use super::space::{check_overlap, id_space, Spaces, NO_SPACE};
use super::validate::{validate_entry, validate_remote_name, Validator};

pub(super) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
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
    pub(super) removed: bool,
    /// The remote pool's spec the view validates against, and its ID space.
    pub(super) spec: PoolSpec,
    pub(super) space: (u64, u64),
    /// The spec record as last seen (its create revision tells a re-created pool, DESIGN §12).
    pub(super) spec_created: Revision,
    pub(super) spec_value: Vec<u8>,
    /// Why the remote's current spec is refused; the view shows nothing meanwhile.
    pub(super) refused: Option<String>,
}

/// The pool a view belongs to, as the view needs it when the remote's spec changes.
pub(crate) trait Neighbours: Send + Sync {
    /// Runs `f` with the ID spaces of the pool's other clusters (the local pool and every remote
    /// but `me`), while no remote of the pool can be added or change its space.
    fn with_others(&self, me: &str, f: &mut dyn FnMut(&Spaces));
}

/// One remote view, shared by its handles, its follower and the pool.
pub(crate) struct RemoteView {
    pub(crate) cluster: Cluster,
    pub(super) name: Arc<str>,
    /// The pool's name (the same in every cluster).
    pub(super) pool: Arc<str>,
    /// The view's ID space as the pool routes lookups by it (`key_of_any`): a copy of
    /// `Guarded::space`, written only while the pool's registry of remotes is locked for writing
    /// (which then rebuilds its routes), and re-checked under the view's lock.
    pub(super) space_lo: AtomicU64,
    pub(super) space_hi: AtomicU64,
    pub(super) layout: Layout,
    pub(super) validators: Vec<Validator>,
    pub(super) guarded: Mutex<Guarded>,
    pub(super) events: broadcast::Sender<Batch<Event>>,
    /// The pool's all-clusters channel.
    pub(super) mesh: broadcast::Sender<Batch<ClusterEvent>>,
    pub(super) state: tokio::sync::watch::Sender<RemoteState>,
    /// When the current outage began (tokio time, for `stale_ttl`).
    pub(super) stale_at: Mutex<Option<tokio::time::Instant>>,
    /// Since when the view has not been known to follow its remote (opened, or went stale);
    /// `None` while synced. For the sync-age metric.
    pub(super) unsynced_since: Mutex<Option<tokio::time::Instant>>,
    /// The remote was reported unreachable since the last listing: the next one is a reconnect.
    pub(super) lost: AtomicBool,
    pub(super) dropped: AtomicU64,
    pub(super) tasks: Mutex<Vec<AbortHandle>>,
    pub(super) closing: AtomicBool,
    /// The remote store (read only) and how to follow it.
    pub(super) store: Arc<dyn Store>,
    pub(super) opts: RemoteOptions,
    /// Asks the follower of `id/` records to re-list.
    pub(super) relist: Arc<Relist>,
    pub(super) neighbours: std::sync::OnceLock<Box<dyn Neighbours>>,
}

impl RemoteView {
    pub(crate) fn lock(&self) -> MutexGuard<'_, Guarded> {
        lock(&self.guarded)
    }

    /// The view's ID space (see `space_lo`).
    pub(crate) fn space(&self) -> (u64, u64) {
        (self.space_lo.load(Ordering::Relaxed), self.space_hi.load(Ordering::Relaxed))
    }

    pub(super) fn set_space(&self, g: &mut Guarded, space: (u64, u64)) {
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

    pub(super) fn publish_state(&self, s: RemoteState) {
        self.state.send_replace(s);
        metrics::remote_state(&self.pool, &self.name, Some(s.label()));
    }

    /// Sends `events` (one change, or all the changes of one listing) to the view's subscribers
    /// and the pool's all-clusters subscribers, as one message: a listing never makes a
    /// subscriber lag (`cache::Batch`). Call with the lock held.
    pub(super) fn emit_all(&self, events: Vec<Event>) {
        if events.is_empty() {
            return;
        }
        let tagged: Batch<ClusterEvent> = events
            .iter()
            .map(|e| ClusterEvent { cluster: self.cluster.clone(), event: e.clone() })
            .collect();
        let _ = self.events.send(Batch::from(events));
        let _ = self.mesh.send(tagged);
    }

    pub(super) fn parse_id(&self, k: &[u8]) -> Option<u64> {
        self.layout.parse_id_key(&self.pool, k)
    }

    pub(super) fn check(
        &self,
        space: (u64, u64),
        id: u64,
        key: &str,
    ) -> std::result::Result<(), String> {
        validate_entry(space, &self.validators, id, key)
    }

    pub(super) fn count_dropped(&self, why: &[String]) {
        if let Some(first) = why.first() {
            self.dropped.fetch_add(why.len() as u64, Ordering::Relaxed);
            metrics::remote_drops(&self.pool, &self.name, why.len());
            warn!(remote = %self.name, pool = %&self.pool, dropped = why.len(), reason = %first, "remote entries failed validation and were dropped");
        }
    }

    /// Drops every entry, with `Delete` events (remove_remote, stale_ttl). Not a listing: no
    /// `Synced`.
    pub(super) fn clear(&self, g: &mut Guarded) {
        let rev = g.cache.revision();
        let events = g.cache.replace_all(&[], rev, |k| self.parse_id(k));
        self.emit_all(events.into_iter().filter(|e| *e != Event::Synced).collect());
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
    pub(super) fn report_sync_age(&self) {
        let since = lock(&self.unsynced_since);
        let age = since.map_or(0.0, |t| t.elapsed().as_secs_f64());
        metrics::remote_sync_age(&self.pool, &self.name, age);
    }

    pub(super) fn went_unreachable(&self, error: &StoreError) {
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
    pub(super) fn spec_seen(&self, kv: &KeyValue) {
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

/// Reads the remote's spec of pool `pool`, refuses overlaps with `others`, and starts the view.
pub(crate) async fn open(
    name: &str,
    local: &PoolSpec,
    store: Arc<dyn Store>,
    opts: RemoteOptions,
    others: &[(Cluster, (u64, u64))],
    mesh: broadcast::Sender<Batch<ClusterEvent>>,
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
    use crate::layout::IdRecord;

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
