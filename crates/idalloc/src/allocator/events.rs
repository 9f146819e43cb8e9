//! Subscriptions to a pool's events: a replay of the cache, then live events (DESIGN §6).

use std::collections::VecDeque;

use tokio::sync::broadcast;

use crate::cache::{Batch, Event};
use crate::store::Revision;

/// A change of a pool's bindings with the store revision it happened at, as the pool's cache
/// applied it ([`Pool::stamped_events`](super::Pool::stamped_events)): for a service that
/// re-serves the pool's history with revisions (idalloc serve's watch) from the one
/// watch the cache already has, instead of a store watch per client.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Stamped {
    /// `Upsert` or `Delete` at `revision`, from the store's watch.
    Event { revision: Revision, event: Event },
    /// A (re-)listing at `revision`: its differences (`Upsert`, `Delete`), then `Synced`, as one
    /// message. One message whatever the pool's size: a re-listing of a big pool (a watch that
    /// fell behind a compaction) would otherwise be more messages than the subscriber's buffer
    /// (`event_buffer`) and make every subscriber lag, which is what the listing repairs.
    Listing { revision: Revision, events: std::sync::Arc<[Event]> },
    /// Every change at or before `revision` has been sent: the changes of one revision are
    /// complete (the end of one watch response or listing).
    Through { revision: Revision },
}

/// A subscription to [`Stamped`] changes. It starts at the cache's revision `revision`;
/// `complete` says whether every change at `revision` was applied before it started (if not, the
/// rest of that revision's changes follow, then a `Through`).
pub struct StampedEvents {
    pub revision: Revision,
    pub complete: bool,
    rx: broadcast::Receiver<Stamped>,
}

impl StampedEvents {
    pub(crate) fn new(
        revision: Revision,
        complete: bool,
        rx: broadcast::Receiver<Stamped>,
    ) -> StampedEvents {
        StampedEvents { revision, complete, rx }
    }

    /// The next change; `Err(n)`: `n` changes were dropped because this subscriber fell more
    /// than the pool's event buffer behind (subscribe again); `None` once the pool's state is
    /// gone.
    pub async fn recv(&mut self) -> Option<Result<Stamped, u64>> {
        match self.rx.recv().await {
            Ok(e) => Some(Ok(e)),
            Err(broadcast::error::RecvError::Lagged(n)) => Some(Err(n)),
            Err(broadcast::error::RecvError::Closed) => None,
        }
    }
}

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
