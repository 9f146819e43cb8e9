//! Keeps one pool's cache in step with the store (DESIGN §6): the local pool's [`Sink`] for the
//! follower of `feed.rs`, which lists `id/`, watches, resumes and re-lists. This is the only writer
//! of the cache's ID↔key maps; after a listing it also checks that every held key still has its ID.

use std::sync::atomic::Ordering;
use std::sync::{Arc, Weak};

use crate::allocator::pool_state::{lock, PoolState};
use crate::allocator::repair_queue::RepairQueue;
use crate::allocator::request::Requester;
use crate::cache::Listing;
use crate::error::Error;
use crate::feed::{self, FeedConfig, Gone, Sink};
use crate::layout::Layout;
use crate::store::{KeyRange, KeyValue, Revision, StoreError, WatchEvent};

/// Runs until the allocator is gone (its requester, held only weakly here, is dropped with it).
/// Needs only the request path, the key layout and the repair queue: never the allocator itself.
pub(crate) async fn run(
    req: Weak<Requester>,
    layout: Layout,
    repairs: RepairQueue,
    pool: Arc<PoolState>,
    jitter_seed: u64,
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
        // Each page of the listing bounded like one request, the listing as long as pages come, as
        // every whole listing of the allocator (`Requester::pages`).
        request_timeout: Some(strong.request_timeout),
        jitter_seed,
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

    fn unreachable(&self, error: &StoreError) {
        if let Some(e) = ends_waits(error) {
            *lock(&self.pool.list_failure) = Some(e);
            // Wake the waiters (without counting a page): they find the failure and return it.
            self.pool.list_progress.send_modify(|_| {});
        }
    }

    type Listing = Listing;

    fn begin_listing(&self, records: usize) -> Listing {
        self.pool.lock_cache().begin_listing(records)
    }

    /// Applies the page to the listing in the cache's compact form and frees it: a synced
    /// process holds its cache, not the listing's records as well.
    fn listing_page(&self, listing: &mut Listing, kvs: Vec<KeyValue>) {
        listing.add(&kvs, |k| self.layout.parse_id_key(self.pool.spec.name(), k));
    }

    fn applying(&self) {
        self.pool.applying.store(true, Ordering::Release);
        // Wake the waiters, as a page does: they see the flag and wait for the apply.
        self.pool.list_progress.send_modify(|pages| *pages += 1);
    }

    fn listed(&self, listing: Listing, rev: Revision) -> Result<(), Gone> {
        let pool = &self.pool;
        if self.alive().is_err() {
            pool.applying.store(false, Ordering::Release);
            return Err(Gone);
        }
        lock(&pool.list_failure).take();
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
        pool.applying.store(false, Ordering::Release);
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

/// The error a failed listing (or watch) gives the pool's waiters at once, if waiting for the
/// follower's next attempt is pointless: a damaged store file (`StoreError::Corrupt`) stays
/// damaged, and waiting out `wait_synced`'s no-progress budget only turned it into
/// `Unavailable` ("could not be listed", exit 1 instead of the CLI's 4 for damaged data). The
/// same for a store that refuses this client (`StoreError::Access`: a role without read on the
/// pool, credentials rejected): only a configuration change cures it, and the waiter should say
/// so (`AccessDenied`, naming the endpoint and the cause) at once, not after its budget. The
/// follower still retries in the background (with its back-off): a listing that succeeds clears
/// the failure. Everything else (an outage, a timeout, a compaction) may pass, so waiters keep
/// waiting for progress as before.
fn ends_waits(error: &StoreError) -> Option<Error> {
    match error {
        StoreError::Corrupt { .. } | StoreError::Access { .. } => Some(Error::from(error.clone())),
        _ => None,
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_damaged_data_ends_the_wait_for_a_listing() {
        let corrupt = StoreError::Corrupt { path: "/x/ids.redb".into(), reason: "bad page".into() };
        match ends_waits(&corrupt) {
            Some(Error::Corrupt { what, .. }) => assert_eq!(what, "/x/ids.redb"),
            other => panic!("a damaged file ends the wait as Corrupt, got {other:?}"),
        }
        let passing = [
            StoreError::Unavailable("timed out".into()),
            StoreError::Compacted { requested: 3, compact_revision: 9 },
            StoreError::ResponseTooLarge("5 MiB".into()),
        ];
        for e in passing {
            assert!(ends_waits(&e).is_none(), "{e}");
        }
    }
}
