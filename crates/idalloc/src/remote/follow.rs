//! Following a remote: the list+watch sinks that feed a view (its `id/` records and its pool's
//! spec record, each through `feed::follow`), and the view's background tasks (stale TTL, sync
//! age ticker).

use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::{Arc, Weak};
use std::time::Duration;

use tracing::{info, warn};

use crate::feed::{self, FeedConfig, Gone, Relist, Sink};
use crate::metrics;
use crate::store::{KeyRange, KeyValue, Revision, StoreError, WatchEvent};

use super::cluster::RemoteState;
use super::validate::{
    keep_refused_deletes, screen_delete, screen_event, screen_listing, validate_delete,
};
use super::view::{lock, Neighbours, RemoteView};

impl RemoteView {
    /// Starts following the remote. Called once the view is registered with its pool, so that
    /// what the follower publishes (events, metrics) belongs to a view the pool shows.
    /// `jitter_seed` seeds the followers' retry jitter (`backoff.rs`).
    pub(crate) fn start(self: &Arc<Self>, neighbours: Box<dyn Neighbours>, jitter_seed: u64) {
        let _ = self.neighbours.set(neighbours);
        let cfg = FeedConfig {
            store: self.store.clone(),
            range: KeyRange::prefix(self.layout.id_prefix(&self.pool)),
            page: self.opts.list_page,
            relist_after_outage: true,
            probe: Some(self.opts.probe_interval),
            request_timeout: Some(self.opts.request_timeout),
            jitter_seed,
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
            jitter_seed: jitter_seed.wrapping_add(1),
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

    type Listing = Vec<KeyValue>;

    fn begin_listing(&self, _records: usize) -> Vec<KeyValue> {
        Vec::new()
    }

    fn listing_page(&self, listing: &mut Vec<KeyValue>, kvs: Vec<KeyValue>) {
        listing.extend(kvs);
    }

    fn listed(&self, kvs: Vec<KeyValue>, revision: Revision) -> std::result::Result<(), Gone> {
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
            let (mut kept, mut dropped) =
                screen_listing(&kvs, |k| v.parse_id(k), |id, key| v.check(space, id, key));
            // Bindings the listing would remove are put to the validators (none: nothing to ask).
            if !v.validators.is_empty() {
                dropped.extend(keep_refused_deletes(
                    &mut kept,
                    &g.cache.snapshot(),
                    |k| v.parse_id(k),
                    |id| v.layout.id_key(&v.pool, id),
                    |id, key| validate_delete(&v.validators, id, key),
                ));
            }
            let events = g.cache.replace_all(&kept, revision, |k| v.parse_id(k));
            // The listing's changes, then its one `Synced` (as `replace_all` returns them), all
            // as one message.
            v.emit_all(events);
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
            // The changes of one watch response go as one message (`RemoteView::emit_all`).
            let mut changes = Vec::new();
            for ev in events {
                let (ev, why) =
                    screen_event(ev, |k| v.parse_id(k), |id, key| v.check(space, id, key));
                dropped.extend(why);
                // An event that would remove a shown binding is put to the validators.
                let (ev, why) = if v.validators.is_empty() {
                    (ev, None)
                } else {
                    let id = v.parse_id(&ev.kv().key);
                    let shown = id.and_then(|id| g.cache.key_of(id).map(str::to_string));
                    screen_delete(ev, id, shown.as_deref(), |id, key| {
                        validate_delete(&v.validators, id, key)
                    })
                };
                dropped.extend(why);
                changes.extend(g.cache.apply(&ev, |k| v.parse_id(k)));
            }
            v.emit_all(changes);
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

    type Listing = Vec<KeyValue>;

    fn begin_listing(&self, _records: usize) -> Vec<KeyValue> {
        Vec::new()
    }

    fn listing_page(&self, listing: &mut Vec<KeyValue>, kvs: Vec<KeyValue>) {
        listing.extend(kvs);
    }

    fn listed(&self, kvs: Vec<KeyValue>, revision: Revision) -> std::result::Result<(), Gone> {
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
