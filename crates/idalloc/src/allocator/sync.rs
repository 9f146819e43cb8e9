//! Keeps one pool's cache in step with the store (DESIGN §6): the local pool's [`Sink`] for the
//! follower of `feed.rs`, which lists `id/`, watches, resumes and re-lists. This is the only writer
//! of the cache's ID↔key maps; after a listing it also checks that every held key still has its ID.

use std::sync::atomic::Ordering;
use std::sync::{Arc, Weak};

use crate::allocator::pool_state::PoolState;
use crate::allocator::repair_queue::RepairQueue;
use crate::allocator::request::Requester;
use crate::cache::Listing;
use crate::feed::{self, FeedConfig, Gone, Sink};
use crate::layout::Layout;
use crate::store::{KeyRange, KeyValue, Revision, WatchEvent};

/// Runs until the allocator is gone (its requester, held only weakly here, is dropped with it).
/// Needs only the request path, the key layout and the repair queue: never the allocator itself.
pub(crate) async fn run(
    req: Weak<Requester>,
    layout: Layout,
    repairs: RepairQueue,
    pool: Arc<PoolState>,
) {
    let Some(strong) = req.upgrade() else {
        return;
    };
    let cfg = FeedConfig {
        store: strong.store.clone(),
        range: KeyRange::prefix(layout.id_prefix(pool.spec.name())),
        page: strong.list_page,
        relist_after_outage: false,
        probe: None,
        request_timeout: None,
    };
    drop(strong);
    let relist = pool.relist.clone();
    feed::follow(cfg, relist, LocalSink { req, layout, repairs, pool }).await;
}

/// Feeds the local pool's cache.
struct LocalSink {
    req: Weak<Requester>,
    layout: Layout,
    repairs: RepairQueue,
    pool: Arc<PoolState>,
}

impl LocalSink {
    /// `Gone` once the allocator is.
    fn alive(&self) -> Result<(), Gone> {
        self.req.upgrade().map(|_| ()).ok_or(Gone)
    }
}

impl Sink for LocalSink {
    fn revision(&self) -> Result<Revision, Gone> {
        self.alive()?;
        Ok(self.pool.lock_cache().revision())
    }

    fn list_page(&self) {
        self.pool.list_progress.send_modify(|pages| *pages += 1);
    }

    type Listing = Listing;

    fn begin_listing(&self, records: usize) -> Listing {
        self.pool.lock_cache().begin_listing(records)
    }

    /// Applies the page to the listing in the cache's compact form and frees it: a synced
    /// process holds its cache, not the listing's records as well (issue 21 item 2).
    fn listing_page(&self, listing: &mut Listing, kvs: Vec<KeyValue>) {
        listing.add(&kvs, |k| self.layout.parse_id_key(self.pool.spec.name(), k));
    }

    fn listed(&self, listing: Listing, rev: Revision) -> Result<(), Gone> {
        self.alive()?;
        let pool = &self.pool;
        {
            let mut cache = pool.lock_cache();
            let events = cache.replace_with(listing, rev, pool.listening());
            // Emitted under the cache lock (see `PoolState::emit`): the listing's changes, then
            // its one `Synced` (as `replace_all` returns them), all as one message
            // (`PoolState::emit_all_at`).
            pool.emit_all_at(rev, events);
            pool.emitted_through(rev);
            pool.listed.store(true, Ordering::Release);
        }
        pool.note_applied(rev);
        if let Some(req) = self.req.upgrade() {
            pool.publish_gauges(req.seen());
        }
        pool.mark_synced();
        // A re-list may reveal that a held key's binding changed while we were away.
        self.repairs.check_held(pool);
        Ok(())
    }

    fn watched(&self, events: &[WatchEvent]) -> Result<(), Gone> {
        self.alive()?;
        for ev in events {
            apply_event(&self.layout, &self.repairs, &self.pool, ev);
        }
        let applied = {
            let cache = self.pool.lock_cache();
            // Under the lock, as every stamped change: a subscriber starting now sees the
            // boundary either before or after it, never half of it.
            self.pool.emitted_through(cache.revision());
            cache.revision()
        };
        self.pool.note_applied(applied);
        if let Some(req) = self.req.upgrade() {
            self.pool.publish_gauges(req.seen());
        }
        Ok(())
    }
}

fn apply_event(layout: &Layout, repairs: &RepairQueue, pool: &Arc<PoolState>, ev: &WatchEvent) {
    let (event, before) = {
        let mut cache = pool.lock_cache();
        let id = layout.parse_id_key(pool.spec.name(), &ev.kv().key);
        let before = id.and_then(|id| cache.key_of(id).map(|k| (id, k.to_string())));
        let event = cache.apply(ev, |k| layout.parse_id_key(pool.spec.name(), k));
        if let Some(e) = &event {
            pool.emit_at(ev.kv().mod_revision, e.clone());
        }
        (event, before)
    };
    if let Some(e) = event {
        repairs.after_cache_event(pool, &e, before);
    }
}
