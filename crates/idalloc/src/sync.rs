//! Keeps one pool's cache in step with the store (DESIGN §6): the local pool's [`Sink`] for the
//! follower of `feed.rs`, which lists `id/`, watches, resumes and re-lists. This is the only writer
//! of the cache's ID↔key maps; after a listing it also checks that every held key still has its ID.

use std::sync::atomic::Ordering;
use std::sync::{Arc, Weak};

use crate::allocator::{Inner, PoolState};
use crate::cache::Event;
use crate::feed::{self, FeedConfig, Gone, Sink};
use crate::store::{KeyRange, KeyValue, Revision, WatchEvent};

/// Runs until the allocator is gone. Holds only weak references while it waits, so dropping the
/// allocator ends it.
pub(crate) async fn run(inner: Weak<Inner>, pool: Arc<PoolState>) {
    let Some(strong) = inner.upgrade() else {
        return;
    };
    let cfg = FeedConfig {
        store: strong.store.clone(),
        range: KeyRange::prefix(strong.layout.id_prefix(pool.spec.name())),
        page: strong.opts.list_page,
        relist_after_outage: false,
        probe: None,
        request_timeout: None,
    };
    drop(strong);
    let relist = pool.relist.clone();
    feed::follow(cfg, relist, LocalSink { inner, pool }).await;
}

/// Feeds the local pool's cache.
struct LocalSink {
    inner: Weak<Inner>,
    pool: Arc<PoolState>,
}

impl LocalSink {
    fn inner(&self) -> Result<Arc<Inner>, Gone> {
        self.inner.upgrade().ok_or(Gone)
    }
}

impl Sink for LocalSink {
    fn revision(&self) -> Result<Revision, Gone> {
        self.inner()?;
        Ok(self.pool.lock_cache().revision())
    }

    fn list_page(&self) {
        self.pool.list_progress.send_modify(|pages| *pages += 1);
    }

    fn listed(&self, kvs: &[KeyValue], rev: Revision) -> Result<(), Gone> {
        let strong = self.inner()?;
        let pool = &self.pool;
        {
            let mut cache = pool.lock_cache();
            let events =
                cache.replace_all(kvs, rev, |k| strong.layout.parse_id_key(pool.spec.name(), k));
            // Emitted under the cache lock (see `PoolState::emit`), with exactly one `Synced`
            // per listing, after its changes.
            for e in events {
                if e != Event::Synced {
                    pool.emit(e);
                }
            }
            pool.emit(Event::Synced);
            pool.listed.store(true, Ordering::Release);
        }
        pool.note_applied(rev);
        strong.publish_gauges(pool);
        pool.mark_synced();
        // A re-list may reveal that a held key's binding changed while we were away.
        strong.check_held(pool);
        Ok(())
    }

    fn watched(&self, events: &[WatchEvent]) -> Result<(), Gone> {
        let strong = self.inner()?;
        for ev in events {
            apply_event(&strong, &self.pool, ev);
        }
        let applied = self.pool.lock_cache().revision();
        self.pool.note_applied(applied);
        strong.publish_gauges(&self.pool);
        Ok(())
    }
}

fn apply_event(inner: &Arc<Inner>, pool: &Arc<PoolState>, ev: &WatchEvent) {
    let (event, before) = {
        let mut cache = pool.lock_cache();
        let id = inner.layout.parse_id_key(pool.spec.name(), &ev.kv().key);
        let before = id.and_then(|id| cache.key_of(id).map(|k| (id, k.to_string())));
        let event = cache.apply(ev, |k| inner.layout.parse_id_key(pool.spec.name(), k));
        if let Some(e) = &event {
            pool.emit(e.clone());
        }
        (event, before)
    };
    if let Some(e) = event {
        inner.after_cache_event(pool, &e, before);
    }
}
