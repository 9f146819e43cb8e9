//! Coalescing (issue 14): concurrent single-key [`Pool::acquire`](super::Pool::acquire) and
//! [`Pool::release`](super::Pool::release) calls of one pool share batched txns — client-side
//! group commit.
//!
//! Each pool has one lane for acquires and one for releases. A call that finds its lane idle
//! *leads*: it sends its own txn at once, exactly as an uncoalesced call would (an idle call pays
//! no added latency and keeps its round-trip budget of DESIGN §5). Calls that arrive while a txn of
//! the lane is in flight queue up; when the flight ends, one background task takes everything
//! queued by the time it runs and sends it as one batch ([`Inner::bind_many`] /
//! [`Inner::release_ref_many`]: per-key nested txns with the same compares and fences as single
//! calls), and so on until the queue is empty. Each caller keeps its per-key single-flight lock
//! while it waits, so a batch never holds a key twice.
//!
//! The batch runs in its own task, so cancelling one caller never stops the others' request. A
//! cancelled caller's result is not lost either: whoever finds it unclaimed (the batch task when
//! the caller is already gone, or the caller's drop when the answer arrived but was never read)
//! undoes what it did for nobody, through the repair queue: an acquired reference is abandoned
//! (released unless the process holds the key again), a failed release is completed.

use std::sync::{Arc, Mutex};

use tokio::sync::oneshot;

use super::bind::Hints;
use super::pool_state::{lock, PoolState};
use super::registry::Inner;
use super::repair_queue::Repair;
use super::types::{Acquired, Released};
use super::RefLease;
use crate::error::{Error, Result};

/// Keys one coalesced flight takes from the queue at most (the rest go in the next flight);
/// [`Inner::bind_many`] splits them into requests of etcd's size and sends those together.
const MAX_FLIGHT_KEYS: usize = 1024;

/// A queued acquire.
pub(super) struct AcquireJob {
    key: String,
    reply: oneshot::Sender<Result<Acquired>>,
}

/// A queued release of this process's reference to `key`, bound to `id`.
pub(super) struct ReleaseJob {
    key: String,
    id: u64,
    reply: oneshot::Sender<Result<Released>>,
}

/// One lane: whether a txn is in flight, and who waits for the next one.
struct Lane<J> {
    state: Mutex<LaneState<J>>,
}

struct LaneState<J> {
    busy: bool,
    queue: Vec<J>,
}

impl<J> Default for Lane<J> {
    fn default() -> Self {
        Lane { state: Mutex::new(LaneState { busy: false, queue: Vec::new() }) }
    }
}

impl<J> Lane<J> {
    /// True if the caller leads (the lane was idle and is now busy); else `job()` was queued.
    fn enter(&self, job: impl FnOnce() -> J) -> bool {
        let mut s = lock(&self.state);
        if s.busy {
            s.queue.push(job());
            false
        } else {
            s.busy = true;
            true
        }
    }

    /// After a flight: true if jobs wait (the lane stays busy for the next flight), else the lane
    /// goes idle.
    fn more(&self) -> bool {
        let mut s = lock(&self.state);
        s.busy = !s.queue.is_empty();
        s.busy
    }

    /// The jobs of the next flight.
    fn take(&self) -> Vec<J> {
        let mut s = lock(&self.state);
        let n = s.queue.len().min(MAX_FLIGHT_KEYS);
        s.queue.drain(..n).collect()
    }

    /// Forgets every queued job (their callers get "dropped") and goes idle: no runtime to run a
    /// flight on.
    fn abandon(&self) {
        let mut s = lock(&self.state);
        s.queue.clear();
        s.busy = false;
    }
}

/// The two lanes of a pool.
#[derive(Default)]
pub(crate) struct Lanes {
    acquire: Lane<AcquireJob>,
    release: Lane<ReleaseJob>,
}

#[derive(Clone, Copy)]
enum Kind {
    Acquire,
    Release,
}

/// A flight of a lane in progress. Dropping it (when the txn is done, or when the caller leading
/// it was cancelled) starts the next flight if anyone queued meanwhile.
pub(super) struct Flight {
    inner: Arc<Inner>,
    pool: Arc<PoolState>,
    kind: Kind,
}

impl Drop for Flight {
    fn drop(&mut self) {
        let lanes = &self.pool.lanes;
        let more = match self.kind {
            Kind::Acquire => lanes.acquire.more(),
            Kind::Release => lanes.release.more(),
        };
        if !more {
            return;
        }
        let next = Flight { inner: self.inner.clone(), pool: self.pool.clone(), kind: self.kind };
        match tokio::runtime::Handle::try_current() {
            Ok(rt) => {
                rt.spawn(next.run());
            }
            Err(_) => {
                // No runtime (it is shutting down): nothing can be sent; the waiters get
                // `Unavailable`. The lane is idle and empty before `next` drops, so its drop
                // starts nothing.
                match self.kind {
                    Kind::Acquire => lanes.acquire.abandon(),
                    Kind::Release => lanes.release.abandon(),
                }
                drop(next);
            }
        }
    }
}

impl Flight {
    /// Sends everything queued as one batch and answers each waiter; dropping `self` at the end
    /// starts the next flight. The jobs are taken when the task runs, not when it was spawned, so
    /// callers woken by the previous flight who came straight back join this one.
    async fn run(self) {
        let (inner, pool) = (self.inner.clone(), self.pool.clone());
        let holder = inner.holder.clone();
        match self.kind {
            Kind::Acquire => {
                let jobs: Vec<AcquireJob> = pool
                    .lanes
                    .acquire
                    .take()
                    .into_iter()
                    .filter(|j| !j.reply.is_closed())
                    .collect();
                let results = match jobs.as_slice() {
                    [] => Vec::new(),
                    // One key: the single-key path (with its exhaustion check), same round trip.
                    [one] => {
                        vec![
                            inner
                                .bind(&pool, &one.key, Some(&holder), RefLease::Session, None)
                                .await,
                        ]
                    }
                    _ => {
                        let keys: Vec<(&str, Option<u64>)> =
                            jobs.iter().map(|j| (j.key.as_str(), None)).collect();
                        inner.bind_many(&pool, &keys, &holder, true, Hints::Lenient).await
                    }
                };
                for (job, r) in jobs.into_iter().zip(results) {
                    if let Err(r) = job.reply.send(r) {
                        unclaimed_acquire(&inner, &pool, &job.key, &r);
                    }
                }
            }
            Kind::Release => {
                let jobs: Vec<ReleaseJob> = pool.lanes.release.take();
                let results = match jobs.as_slice() {
                    [] => Vec::new(),
                    [one] => vec![inner.release_ref(&pool, &one.key, one.id, &holder, false).await],
                    _ => {
                        let items: Vec<(&str, u64)> =
                            jobs.iter().map(|j| (j.key.as_str(), j.id)).collect();
                        inner.release_ref_many(&pool, &items, &holder, false).await
                    }
                };
                for (job, r) in jobs.into_iter().zip(results) {
                    if let Err(r) = job.reply.send(r) {
                        unclaimed_release(&inner, &pool, &job.key, job.id, &r);
                    }
                }
            }
        }
    }
}

/// A caller's place in a lane.
pub(super) enum Turn<T> {
    /// The lane was idle: send alone now, keep the flight until the answer is in.
    Lead(Flight),
    /// A flight is in progress: the answer comes from a later batch.
    Wait(Waiter<T>),
}

/// What to do with an answer nobody will read.
type Orphan<T> = Box<dyn FnOnce(&Result<T>) + Send>;

/// The answer of a queued call, to await. Dropped before it is read (the caller was cancelled),
/// it hands an answer that arrived meanwhile to the orphan handler; one that arrives later finds
/// the channel closed and the batch task handles it.
pub(super) struct Waiter<T> {
    rx: Option<oneshot::Receiver<Result<T>>>,
    orphan: Option<Orphan<T>>,
}

impl<T> Waiter<T> {
    pub(super) async fn wait(mut self) -> Result<T> {
        let Some(rx) = self.rx.as_mut() else {
            return Err(dropped());
        };
        let r = rx.await;
        self.rx = None;
        r.unwrap_or_else(|_| Err(dropped()))
    }
}

impl<T> Drop for Waiter<T> {
    fn drop(&mut self) {
        if let Some(mut rx) = self.rx.take() {
            rx.close();
            if let (Ok(r), Some(orphan)) = (rx.try_recv(), self.orphan.take()) {
                orphan(&r);
            }
        }
    }
}

fn dropped() -> Error {
    Error::unavailable_for_good("the coalesced request was dropped (the runtime is shutting down)")
}

/// An acquire of `key` finished for a caller that is gone: release what it may have left.
fn unclaimed_acquire(inner: &Inner, pool: &Arc<PoolState>, key: &str, r: &Result<Acquired>) {
    let undo = match r {
        Ok(_) => true,
        Err(Error::Unavailable { .. }) => lock(&pool.doubt).contains(key),
        Err(_) => false,
    };
    if undo {
        inner.repairs.push(Repair::Abandon(pool.clone(), key.to_string()));
    }
}

/// A release of `key` finished for a caller that is gone: complete it if it did not take.
fn unclaimed_release(
    inner: &Inner,
    pool: &Arc<PoolState>,
    key: &str,
    id: u64,
    r: &Result<Released>,
) {
    match r {
        Ok(_) | Err(Error::PoolNotFound { .. } | Error::RangeMismatch { .. }) => {}
        Err(_) => inner.repairs.push(Repair::Release(pool.clone(), key.to_string(), id)),
    }
}

/// The turn of an acquire of `key` (the caller holds the key's single-flight lock).
pub(super) fn acquire_turn(inner: &Arc<Inner>, pool: &Arc<PoolState>, key: &str) -> Turn<Acquired> {
    let (tx, rx) = oneshot::channel();
    if pool.lanes.acquire.enter(|| AcquireJob { key: key.to_string(), reply: tx }) {
        return Turn::Lead(Flight {
            inner: inner.clone(),
            pool: pool.clone(),
            kind: Kind::Acquire,
        });
    }
    let (i, p, k) = (inner.clone(), pool.clone(), key.to_string());
    Turn::Wait(Waiter {
        rx: Some(rx),
        orphan: Some(Box::new(move |r| unclaimed_acquire(&i, &p, &k, r))),
    })
}

/// The turn of the release of this process's reference to `key` (bound to `id`; the caller holds
/// the key's single-flight lock and has already dropped its local hold).
pub(super) fn release_turn(
    inner: &Arc<Inner>,
    pool: &Arc<PoolState>,
    key: &str,
    id: u64,
) -> Turn<Released> {
    let (tx, rx) = oneshot::channel();
    if pool.lanes.release.enter(|| ReleaseJob { key: key.to_string(), id, reply: tx }) {
        return Turn::Lead(Flight {
            inner: inner.clone(),
            pool: pool.clone(),
            kind: Kind::Release,
        });
    }
    let (i, p, k) = (inner.clone(), pool.clone(), key.to_string());
    Turn::Wait(Waiter {
        rx: Some(rx),
        orphan: Some(Box::new(move |r| unclaimed_release(&i, &p, &k, id, r))),
    })
}
