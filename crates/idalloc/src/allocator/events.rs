//! Subscriptions to a pool's events: a replay of the cache, then live events (DESIGN §6).

use std::collections::VecDeque;

use tokio::sync::broadcast;

use crate::cache::Event;
use crate::remote::{Cluster, ClusterEvent};

/// A subscription to one pool's (or one remote view's) events: a replay, then live events.
pub struct Events {
    replay: VecDeque<Event>,
    rx: broadcast::Receiver<Event>,
}

impl Events {
    pub(crate) fn new(replay: VecDeque<Event>, rx: broadcast::Receiver<Event>) -> Events {
        Events { replay, rx }
    }

    /// The next event; `None` once the allocator is gone or the pool was deleted (after a
    /// `Delete` for every binding the subscriber was shown), by this process or another.
    pub async fn recv(&mut self) -> Option<Event> {
        if let Some(e) = self.replay.pop_front() {
            return Some(e);
        }
        match self.rx.recv().await {
            Ok(e) => Some(e),
            Err(broadcast::error::RecvError::Lagged(n)) => Some(Event::Lagged { missed: n }),
            Err(broadcast::error::RecvError::Closed) => None,
        }
    }

    /// The next event if one is ready.
    pub fn try_recv(&mut self) -> Option<Event> {
        if let Some(e) = self.replay.pop_front() {
            return Some(e);
        }
        match self.rx.try_recv() {
            Ok(e) => Some(e),
            Err(broadcast::error::TryRecvError::Lagged(n)) => Some(Event::Lagged { missed: n }),
            Err(_) => None,
        }
    }

    /// As a `Stream`.
    pub fn into_stream(self) -> futures::stream::BoxStream<'static, Event> {
        Box::pin(futures::stream::unfold(
            self,
            |mut ev| async move { ev.recv().await.map(|e| (e, ev)) },
        ))
    }
}

/// A subscription to the events of every cluster of a pool ([`Pool::cluster_events`](super::Pool::cluster_events)).
pub struct ClusterEvents {
    replay: VecDeque<ClusterEvent>,
    rx: broadcast::Receiver<ClusterEvent>,
}

impl ClusterEvents {
    pub(crate) fn new(
        replay: VecDeque<ClusterEvent>,
        rx: broadcast::Receiver<ClusterEvent>,
    ) -> Self {
        ClusterEvents { replay, rx }
    }

    pub(super) fn lagged(missed: u64) -> ClusterEvent {
        ClusterEvent { cluster: Cluster::Local, event: Event::Lagged { missed } }
    }

    /// The next event; `None` once the allocator is gone.
    pub async fn recv(&mut self) -> Option<ClusterEvent> {
        if let Some(e) = self.replay.pop_front() {
            return Some(e);
        }
        match self.rx.recv().await {
            Ok(e) => Some(e),
            Err(broadcast::error::RecvError::Lagged(n)) => Some(Self::lagged(n)),
            Err(broadcast::error::RecvError::Closed) => None,
        }
    }

    /// The next event if one is ready.
    pub fn try_recv(&mut self) -> Option<ClusterEvent> {
        if let Some(e) = self.replay.pop_front() {
            return Some(e);
        }
        match self.rx.try_recv() {
            Ok(e) => Some(e),
            Err(broadcast::error::TryRecvError::Lagged(n)) => Some(Self::lagged(n)),
            Err(_) => None,
        }
    }
}
