//! The queues of coalescing (`coalesce.rs`): a pool's two lanes, their flights in the air and
//! the calls waiting for the next one. Generic over the key guard a queued job holds
//! (`pool_state::OwnedKeyGuard` in the driver), so that the pool's state can own its lanes while
//! this file never names the pool's state: `pool_state.rs` imports this file and nothing here
//! imports it back.

use std::sync::{Mutex, MutexGuard};

use tokio::sync::oneshot;

use super::types::{Acquired, Released};
use crate::error::Result;

/// Keys one coalesced flight takes from the queue at most (the rest go in the next flight);
/// `Inner::bind_many` splits them into requests of etcd's size and sends those together.
const MAX_FLIGHT_KEYS: usize = 1024;

/// Flights of one lane in the air at once at most (a leader's own txn counts as one). Two are
/// enough for a steady stream of callers: while one flight is in the air, the callers the other
/// one answered come back and go out together at once instead of waiting for it. More would
/// split the same callers into more, smaller txns (more round trips for the same keys).
pub(super) const MAX_FLIGHTS: usize = 2;

/// The answer a queued call gets: its result and its key's single-flight lock back.
type Reply<T, G> = oneshot::Sender<(Result<T>, G)>;

/// A queued acquire, holding its key's single-flight lock.
pub(super) struct AcquireJob<G> {
    pub(super) key: String,
    pub(super) guard: G,
    pub(super) reply: Reply<Acquired, G>,
}

/// A queued release of this process's reference to `key`, bound to `id`, holding the key's
/// single-flight lock.
pub(super) struct ReleaseJob<G> {
    pub(super) key: String,
    pub(super) id: u64,
    pub(super) guard: G,
    pub(super) reply: Reply<Released, G>,
}

/// One lane: its flights in the air, and who waits for the next one.
pub(super) struct Lane<J> {
    state: Mutex<LaneState<J>>,
}

struct LaneState<J> {
    /// Flights in the air or started (a leader's txn, or a batch task), at most [`MAX_FLIGHTS`].
    flights: usize,
    /// A started batch task has not taken the queue yet: later callers join it.
    gathering: bool,
    queue: Vec<J>,
}

impl<J> Default for Lane<J> {
    fn default() -> Self {
        Lane { state: Mutex::new(LaneState { flights: 0, gathering: false, queue: Vec::new() }) }
    }
}

/// What a call entering a lane does.
pub(super) enum Entry<J> {
    /// The lane was idle: send alone now (the job was not queued; here it is back).
    Lead(J),
    /// Queued, and a batch task must be started for it (the lane counts it already).
    Start,
    /// Queued for a batch task already started, or for the next flight.
    Queued,
}

impl<J> Lane<J> {
    pub(super) fn enter(&self, job: J) -> Entry<J> {
        let mut s = lock(&self.state);
        if s.flights == 0 {
            s.flights = 1;
            return Entry::Lead(job);
        }
        s.queue.push(job);
        if !s.gathering && s.flights < MAX_FLIGHTS {
            s.gathering = true;
            s.flights += 1;
            return Entry::Start;
        }
        Entry::Queued
    }

    /// The jobs of a batch task that starts now.
    pub(super) fn take(&self) -> Vec<J> {
        let mut s = lock(&self.state);
        s.gathering = false;
        let n = s.queue.len().min(MAX_FLIGHT_KEYS);
        s.queue.drain(..n).collect()
    }

    /// A flight ended: true if jobs wait and nobody is about to take them (the lane counts the
    /// batch task the caller must start for them).
    pub(super) fn done(&self) -> bool {
        let mut s = lock(&self.state);
        s.flights -= 1;
        if s.queue.is_empty() || s.gathering {
            return false;
        }
        s.gathering = true;
        s.flights += 1;
        true
    }

    /// A started batch task that will never run (no runtime, or it is shutting down): forgets
    /// every queued job (their callers get "dropped"), since no later task can be relied on to
    /// run either.
    pub(super) fn abandon(&self) -> Vec<J> {
        let mut s = lock(&self.state);
        s.flights -= 1;
        s.gathering = false;
        std::mem::take(&mut s.queue)
    }
}

/// The two lanes of a pool.
pub(crate) struct Lanes<G> {
    pub(super) acquire: Lane<AcquireJob<G>>,
    pub(super) release: Lane<ReleaseJob<G>>,
}

impl<G> Default for Lanes<G> {
    fn default() -> Self {
        Lanes { acquire: Lane::default(), release: Lane::default() }
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // As `pool_state::lock`: the critical sections are short and await-free, their data
    // consistent at every step, so a poisoned lock is still usable.
    m.lock().unwrap_or_else(|p| p.into_inner())
}
