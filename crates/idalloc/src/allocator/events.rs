//! Subscriptions to a pool's events: a replay of the cache, then live events (DESIGN §6).

use std::collections::VecDeque;

use tokio::sync::broadcast;

use crate::cache::Event;

/// A subscription to one pool's (or one remote view's) events: a replay, then live events.
pub struct Events {
    replay: VecDeque<Event>,
    rx: broadcast::Receiver<Event>,
}

impl Events {
    pub(crate) fn new(replay: VecDeque<Event>, rx: broadcast::Receiver<Event>) -> Events {
        Events { replay, rx }
    }

    /// The next event; `None` once the allocator is gone.
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
