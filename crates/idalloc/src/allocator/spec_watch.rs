//! Notices that a pool this process has open was deleted (or deleted and re-created) by anyone,
//! this process or another, and retires the pool's state at once, so that its subscribers are told
//! (a `Delete` per binding, then the end of their stream: docs/design/fences.md)
//! instead of mirroring a pool that no longer exists until some write happens to fail its spec
//! compare.
//!
//! The cache follows `id/` only (DESIGN §4), and a pool deleted while empty changes nothing there,
//! so the spec record is followed too: a [`Sink`] of the one watch loop (`feed.rs`) on the single
//! key `P/pools/<p>`. The changes it sees are the delete, a re-creation (a new create revision) and a
//! resize (the same create revision, a new mod revision), which the state adopts: every process
//! with the pool open learns the new range from here (docs/design/resize.md).

use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::{Arc, Weak};

use crate::allocator::pool_state::PoolState;
use crate::allocator::request::Requester;
use crate::error::Error;
use crate::feed::{self, FeedConfig, Gone, Sink};
use crate::layout::Layout;
use crate::store::{KeyRange, KeyValue, Revision, WatchEvent};

/// What a spec record read or watched says about the incarnation `spec_rev`: still there (`None`),
/// or gone with the spec there now (`Some(None)`: deleted; `Some(Some(bytes))`: re-created).
/// A resize keeps the incarnation (same create revision).
fn spec_gone(spec_rev: Revision, now: Option<&KeyValue>) -> Option<Option<Vec<u8>>> {
    match now {
        Some(kv) if kv.create_revision == spec_rev => None,
        Some(kv) => Some(Some(kv.value.clone())),
        None => Some(None),
    }
}

/// Runs until the pool's state retires (its tasks are aborted) or the allocator is gone.
pub(crate) async fn run(
    req: Weak<Requester>,
    layout: Layout,
    pool: Arc<PoolState>,
    jitter_seed: u64,
) {
    let Some(strong) = req.upgrade() else {
        return;
    };
    let cfg = FeedConfig {
        store: strong.store.clone(),
        range: KeyRange::key(layout.pool_spec_key(pool.spec.name())),
        page: 1,
        relist_after_outage: false,
        probe: None,
        request_timeout: None,
        jitter_seed,
    };
    drop(strong);
    let sink = SpecSink { req, pool, revision: AtomicI64::new(0) };
    feed::follow(cfg, Arc::default(), sink).await;
}

struct SpecSink {
    req: Weak<Requester>,
    pool: Arc<PoolState>,
    /// The newest revision seen (where the watch resumes).
    revision: AtomicI64,
}

impl SpecSink {
    /// Retires the pool if `now` says its incarnation is gone; `Gone` then (the loop stops).
    fn check(&self, now: Option<&KeyValue>) -> Result<(), Gone> {
        self.req.upgrade().ok_or(Gone)?;
        if self.pool.live().is_err() {
            return Err(Gone);
        }
        match spec_gone(self.pool.spec_rev, now) {
            None => {
                // Still this pool; a newer version of its record is a resize, adopted here so
                // that every process learns the new range without waiting for a write to fail.
                if let Some(kv) = now.filter(|kv| kv.mod_revision > self.pool.spec_fence()) {
                    // A version that cannot be used (unreadable, or changing more than the range)
                    // retires the state as a re-creation would.
                    let _ = self.pool.spec_moved(Some(kv.clone()));
                    if self.pool.live().is_err() {
                        return Err(Gone);
                    }
                }
                Ok(())
            }
            Some(spec_now) => {
                let err: Error = self.pool.gone_error(spec_now);
                tracing::warn!(pool = %self.pool.spec.name(), error = %err, "the pool was deleted; its subscribers are told");
                self.pool.retire(err);
                Err(Gone)
            }
        }
    }
}

impl Sink for SpecSink {
    fn revision(&self) -> Result<Revision, Gone> {
        self.req.upgrade().ok_or(Gone)?;
        Ok(self.revision.load(Ordering::Acquire))
    }

    type Listing = Vec<KeyValue>;

    fn begin_listing(&self, _records: usize) -> Vec<KeyValue> {
        Vec::new()
    }

    fn listing_page(&self, listing: &mut Vec<KeyValue>, kvs: Vec<KeyValue>) {
        listing.extend(kvs);
    }

    fn listed(&self, kvs: Vec<KeyValue>, revision: Revision) -> Result<(), Gone> {
        self.revision.fetch_max(revision, Ordering::AcqRel);
        self.check(kvs.first())
    }

    fn watched(&self, events: &[WatchEvent]) -> Result<(), Gone> {
        for ev in events {
            self.revision.fetch_max(ev.kv().mod_revision, Ordering::AcqRel);
            match ev {
                WatchEvent::Put(kv) => self.check(Some(kv))?,
                WatchEvent::Delete(_) => self.check(None)?,
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn kv(create_revision: Revision) -> KeyValue {
        KeyValue {
            key: b"P/pools/p".to_vec(),
            value: b"{}".to_vec(),
            create_revision,
            mod_revision: create_revision,
            version: 1,
            lease: 0,
        }
    }

    #[test]
    fn only_the_same_incarnation_counts_as_there() {
        assert_eq!(spec_gone(5, Some(&kv(5))), None);
        assert_eq!(spec_gone(5, None), Some(None));
        assert_eq!(spec_gone(5, Some(&kv(9))), Some(Some(b"{}".to_vec())));
    }
}
