//! The repair queue (DESIGN §7): what the sync task, the session and the pool handles ask the
//! repair task to do. The narrow interface between them and the driver: pushing a repair needs
//! only the queue and the pool's state, never the allocator itself.

use std::sync::Arc;

use tokio::sync::mpsc;
use tracing::warn;

use super::pool_state::{lock, PoolState};
use crate::cache::Event;

/// What a repair task should do.
pub(crate) enum Repair {
    /// Re-reference every held key on the current session lease (after the lease was lost).
    All,
    /// Re-create the binding of one held key (its ID record vanished or went to another key).
    Key(Arc<PoolState>, String),
    /// Complete a release whose outcome was unknown.
    Release(Arc<PoolState>, String, u64),
    /// An acquire failed with its outcome unknown: remove whatever reference it may have left
    /// (and bump the holder's fence, so an attempt still in flight fails when it lands).
    Abandon(Arc<PoolState>, String),
}

/// The sending side of the repair queue. Cheap to clone.
#[derive(Clone)]
pub(crate) struct RepairQueue {
    tx: mpsc::UnboundedSender<Repair>,
}

impl RepairQueue {
    /// A queue and the receiver the repair task runs from.
    pub(crate) fn new() -> (RepairQueue, mpsc::UnboundedReceiver<Repair>) {
        let (tx, rx) = mpsc::unbounded_channel();
        (RepairQueue { tx }, rx)
    }

    /// Queues `r`. A queue whose task is gone (the allocator is closing) drops it.
    pub(crate) fn push(&self, r: Repair) {
        let _ = self.tx.send(r);
    }

    /// Called by the sync task for every cache event: a held key whose ID record vanished or went
    /// to another key gets repaired (Cilium's master-key protection, DESIGN §7).
    pub(crate) fn after_cache_event(
        &self,
        pool: &Arc<PoolState>,
        event: &Event,
        before: Option<(u64, String)>,
    ) {
        let affected = match event {
            Event::Delete { id, key } => Some((*id, key.clone())),
            Event::Upsert { id, key } => before.filter(|(_, k)| k != key).map(|(_, k)| (*id, k)),
            _ => None,
        };
        if let Some((id, key)) = affected {
            let held = lock(&pool.held).get(&key).map(|h| h.id);
            if held == Some(id) {
                warn!(pool = %pool.spec.name(), key, id, "the ID record of a held key vanished; re-creating it");
                self.push(Repair::Key(pool.clone(), key));
            }
        }
    }

    /// After a re-list: repairs every held key the cache no longer shows with its ID.
    pub(crate) fn check_held(&self, pool: &Arc<PoolState>) {
        let mut held: Vec<(String, u64)> =
            lock(&pool.held).iter().map(|(k, h)| (k.clone(), h.id)).collect();
        held.sort(); // fixed repair order (reproducible simulations)
        let cache = pool.lock_cache();
        for (key, id) in held {
            if cache.get(&key) != Some(id) {
                self.push(Repair::Key(pool.clone(), key));
            }
        }
    }
}
