//! Subscriptions to a pool's events: a replay of the cache, then live events (DESIGN §6).

use std::collections::VecDeque;

use tokio::sync::broadcast;

use crate::cache::{Batch, Event};

/// A subscription to one pool's (or one remote view's) events: a replay, then live events.
pub struct Events {
    /// The replay, then the rest of the batch being read.
    replay: VecDeque<Event>,
    rx: broadcast::Receiver<Batch<Event>>,
}

impl Events {
    pub(crate) fn new(replay: VecDeque<Event>, rx: broadcast::Receiver<Batch<Event>>) -> Events {
        Events { replay, rx }
    }

    /// The next event; `None` once the allocator is gone or the pool was deleted (after a
    /// `Delete` for every binding the subscriber was shown), by this process or another.
    pub async fn recv(&mut self) -> Option<Event> {
        loop {
            if let Some(e) = self.replay.pop_front() {
                return Some(e);
            }
            match self.rx.recv().await {
                Ok(b) => self.replay.extend(b.iter().cloned()),
                Err(broadcast::error::RecvError::Lagged(n)) => {
                    return Some(Event::Lagged { missed: n })
                }
                Err(broadcast::error::RecvError::Closed) => return None,
            }
        }
    }

    /// The next event if one is ready.
    pub fn try_recv(&mut self) -> Option<Event> {
        loop {
            if let Some(e) = self.replay.pop_front() {
                return Some(e);
            }
            match self.rx.try_recv() {
                Ok(b) => self.replay.extend(b.iter().cloned()),
                Err(broadcast::error::TryRecvError::Lagged(n)) => {
                    return Some(Event::Lagged { missed: n })
                }
                Err(_) => return None,
            }
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
