//! A broadcast channel allocated at its first subscriber.
//!
//! tokio's `broadcast::channel(n)` allocates its `n` slots at once. A pool has three such
//! channels of `event_buffer` (default 4,096) slots each, about 0.5 MB together, and a service
//! opens every pool of the store (its sweeper covers each): 10,000 idle pools cost gigabytes
//! for channels nobody listens to. Here the channel exists from its first `subscribe` on; until
//! then a send is a no-op, which is what a send without receivers is anyway (a receiver sees only
//! what is sent after it subscribed), so subscribers see exactly what they saw before.

use std::sync::OnceLock;

use tokio::sync::broadcast;

/// A broadcast sender of `capacity` slots, made by the first [`LazyBroadcast::subscribe`] (or
/// [`LazyBroadcast::sender`]).
pub(crate) struct LazyBroadcast<T> {
    capacity: usize,
    tx: OnceLock<broadcast::Sender<T>>,
}

impl<T: Clone> LazyBroadcast<T> {
    /// A channel of `capacity` slots (at least 1), not allocated yet.
    pub(crate) fn new(capacity: usize) -> Self {
        LazyBroadcast { capacity: capacity.max(1), tx: OnceLock::new() }
    }

    /// The sender, made now if it was not yet.
    pub(crate) fn sender(&self) -> &broadcast::Sender<T> {
        self.tx.get_or_init(|| broadcast::channel(self.capacity).0)
    }

    /// A receiver of every value sent from now on.
    pub(crate) fn subscribe(&self) -> broadcast::Receiver<T> {
        self.sender().subscribe()
    }

    /// Receivers there are now (0 before the first subscription).
    pub(crate) fn receiver_count(&self) -> usize {
        self.tx.get().map_or(0, |tx| tx.receiver_count())
    }

    /// Sends `value` to the receivers there are (none before the first subscription).
    pub(crate) fn send(&self, value: T) {
        if let Some(tx) = self.tx.get() {
            let _ = tx.send(value);
        }
    }

    /// Whether the channel has been allocated (tests check that an unwatched pool has none).
    #[cfg(test)]
    pub(crate) fn is_allocated(&self) -> bool {
        self.tx.get().is_some()
    }
}

#[cfg(test)]
mod tests {
    use super::LazyBroadcast;

    #[test]
    fn nothing_is_allocated_until_the_first_subscriber_who_sees_every_later_send() {
        let ch = LazyBroadcast::<u32>::new(4096);
        ch.send(1);
        assert!(!ch.is_allocated());
        assert_eq!(ch.receiver_count(), 0);
        let mut rx = ch.subscribe();
        assert!(ch.is_allocated());
        assert_eq!(ch.receiver_count(), 1);
        ch.send(2);
        ch.send(3);
        assert_eq!(rx.try_recv().ok(), Some(2));
        assert_eq!(rx.try_recv().ok(), Some(3));
        assert!(rx.try_recv().is_err());
    }
}
