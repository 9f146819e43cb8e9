//! Keeps one pool's cache in step with the store (DESIGN §6): list `id/` at one revision, watch
//! from the next, resume from the last seen revision when the stream breaks, re-list when the
//! revision was compacted away. The only writer of the cache's ID↔key maps.

use std::sync::{Arc, Weak};
use std::time::Duration;

use futures::StreamExt;
use tracing::{debug, warn};

use crate::allocator::{Inner, PoolState};
use crate::store::{list_all_with_progress, KeyRange, StoreError, WatchEvent, WatchMessage};

/// Back-off between reconnect attempts (doubles up to the maximum).
const RECONNECT_MIN: Duration = Duration::from_millis(50);
const RECONNECT_MAX: Duration = Duration::from_secs(2);

/// Runs until the allocator is gone. Holds only weak references while it waits, so dropping the
/// allocator ends it.
pub(crate) async fn run(inner: Weak<Inner>, pool: Arc<PoolState>) {
    let mut backoff = RECONNECT_MIN;
    let mut need_list = true;
    loop {
        let Some(strong) = inner.upgrade() else {
            return;
        };
        let store = strong.store.clone();
        let page = strong.opts.list_page;
        let id_prefix = strong.layout.id_prefix(pool.spec.name());
        drop(strong);

        let forced = pool.force_relist.swap(false, std::sync::atomic::Ordering::AcqRel);
        if need_list || forced {
            let range = KeyRange::prefix(id_prefix.clone());
            // Counts pages, never resets: a failing retry must not look like progress.
            let listed = list_all_with_progress(&*store, &range, page, |_| {
                pool.list_progress.send_modify(|pages| *pages += 1);
            })
            .await;
            match listed {
                Ok((kvs, rev)) => {
                    let Some(strong) = inner.upgrade() else {
                        return;
                    };
                    let events = {
                        let mut cache = pool.lock_cache();
                        cache.replace_all(&kvs, rev, |k| {
                            strong.layout.parse_id_key(pool.spec.name(), k)
                        })
                    };
                    for e in events {
                        pool.emit(e);
                    }
                    pool.note_applied(rev);
                    strong.publish_gauges(&pool);
                    pool.mark_synced();
                    // A re-list may reveal that a held key's binding changed while we were away.
                    strong.check_held(&pool);
                    need_list = false;
                    backoff = RECONNECT_MIN;
                }
                Err(e) => {
                    warn!(pool = %pool.spec.name(), error = %e, "listing the pool failed; retrying");
                    tokio::time::sleep(backoff).await;
                    backoff = (backoff * 2).min(RECONNECT_MAX);
                    continue;
                }
            }
        }

        let from = pool.lock_cache().revision() + 1;
        let mut stream = match store.watch(KeyRange::prefix(id_prefix), from).await {
            Ok(s) => s,
            Err(StoreError::Compacted { .. }) => {
                need_list = true;
                continue;
            }
            Err(e) => {
                warn!(pool = %pool.spec.name(), error = %e, "watch failed; retrying");
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(RECONNECT_MAX);
                continue;
            }
        };
        backoff = RECONNECT_MIN;
        loop {
            // `biased`: a fixed polling order keeps simulation runs reproducible from their seed.
            let msg = tokio::select! {
                biased;
                m = stream.next() => m,
                _ = pool.relist_requested.notified() => { need_list = true; break; }
            };
            match msg {
                Some(Ok(WatchMessage::Events(events))) => {
                    let Some(strong) = inner.upgrade() else {
                        return;
                    };
                    for ev in &events {
                        apply_event(&strong, &pool, ev);
                    }
                    let applied = pool.lock_cache().revision();
                    pool.note_applied(applied);
                    strong.publish_gauges(&pool);
                }
                Some(Ok(WatchMessage::Compacted { compact_revision })) => {
                    debug!(pool = %pool.spec.name(), compact_revision, "watch compacted; re-listing");
                    need_list = true;
                    break;
                }
                Some(Err(e)) => {
                    debug!(pool = %pool.spec.name(), error = %e, "watch stream broke; resuming");
                    break;
                }
                None => break,
            }
        }
    }
}

fn apply_event(inner: &Arc<Inner>, pool: &Arc<PoolState>, ev: &WatchEvent) {
    let (event, before) = {
        let mut cache = pool.lock_cache();
        let id = inner.layout.parse_id_key(pool.spec.name(), &ev.kv().key);
        let before = id.and_then(|id| cache.key_of(id).map(|k| (id, k.to_string())));
        let event = cache.apply(ev, |k| inner.layout.parse_id_key(pool.spec.name(), k));
        (event, before)
    };
    if let Some(e) = event {
        inner.after_cache_event(pool, &e, before);
        pool.emit(e);
    }
}
