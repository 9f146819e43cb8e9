//! Subscriptions to the events of every cluster of a pool: the local cache's and each remote
//! view's, tagged with their cluster. Apart from `events.rs` because it names the remote views'
//! types, while the remote views hand out plain [`Events`](super::Events): one file importing
//! the other both ways would be a cycle.

use std::collections::VecDeque;

use tokio::sync::broadcast;

use crate::cache::{Batch, Event};
use crate::remote::{Cluster, ClusterEvent};

/// A subscription to the events of every cluster of a pool ([`Pool::cluster_events`](super::Pool::cluster_events)).
pub struct ClusterEvents {
    replay: VecDeque<ClusterEvent>,
    rx: broadcast::Receiver<Batch<ClusterEvent>>,
}

impl ClusterEvents {
    pub(crate) fn new(
        replay: VecDeque<ClusterEvent>,
        rx: broadcast::Receiver<Batch<ClusterEvent>>,
    ) -> Self {
        ClusterEvents { replay, rx }
    }

    pub(super) fn lagged(missed: u64) -> ClusterEvent {
        ClusterEvent { cluster: Cluster::Local, event: Event::Lagged { missed } }
    }

    /// The next event; `None` once the allocator is gone.
    pub async fn recv(&mut self) -> Option<ClusterEvent> {
        loop {
            if let Some(e) = self.replay.pop_front() {
                return Some(e);
            }
            match self.rx.recv().await {
                Ok(b) => self.replay.extend(b.iter().cloned()),
                Err(broadcast::error::RecvError::Lagged(n)) => return Some(Self::lagged(n)),
                Err(broadcast::error::RecvError::Closed) => return None,
            }
        }
    }

    /// The next event if one is ready.
    pub fn try_recv(&mut self) -> Option<ClusterEvent> {
        loop {
            if let Some(e) = self.replay.pop_front() {
                return Some(e);
            }
            match self.rx.try_recv() {
                Ok(b) => self.replay.extend(b.iter().cloned()),
                Err(broadcast::error::TryRecvError::Lagged(n)) => return Some(Self::lagged(n)),
                Err(_) => return None,
            }
        }
    }
}
