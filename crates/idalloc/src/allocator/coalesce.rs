//! Coalescing: concurrent single-key [`Pool::acquire`](super::Pool::acquire) and
//! [`Pool::release`](super::Pool::release) calls of one pool share batched txns — client-side
//! group commit.
//!
//! Each pool has one lane for acquires and one for releases. A call that finds its lane idle
//! *leads*: it sends its own txn at once, exactly as an uncoalesced call would (an idle call pays
//! no added latency and keeps its round-trip budget of DESIGN §5). A call that arrives while a txn
//! of the lane is in flight queues up, and if fewer than [`MAX_FLIGHTS`](lanes::MAX_FLIGHTS) flights of the lane are
//! in the air it starts another at once: a background task that takes everything queued by the
//! time it runs and sends it as one batch ([`Inner::bind_many`] / [`Inner::release_ref_many`]:
//! per-key nested txns with the same compares and fences as single calls). Calls arriving while
//! that task has not yet taken the queue join it; calls arriving when [`MAX_FLIGHTS`](lanes::MAX_FLIGHTS) are in the
//! air wait for the next flight, which starts when one of them ends. Several flights in the air
//! matter under load (docs/benchmarks/findings.md, the 3× target): with one, a call that
//! arrives during a flight waits for it to end and then for its own, about 1.5 commits per call.
//!
//! Flights in the air at once never share a key, with each other or with any other call of this
//! process: a caller takes the key's single-flight lock before it enters a lane, and a queued
//! caller hands the lock to its job, which keeps it until its txn is done and gives it back with
//! the answer. So a caller cancelled while its job waits or flies leaves its key locked until the
//! store has answered, and the next call of the same key comes after it, as the same call
//! uncancelled would (a release cancelled in the queue could otherwise go out after a later
//! acquire of its key and delete the reference that acquire had just confirmed). Free IDs are
//! claimed in the pool's cache when picked, so concurrent batches never pick the same candidate.
//!
//! The batch runs in its own task, so cancelling one caller never stops the others' request. A
//! cancelled caller's result is not lost either: whoever finds it unclaimed (the batch task when
//! the caller is already gone, or the caller's drop when the answer arrived but was never read)
//! undoes what it did for nobody, through the repair queue: an acquired reference is abandoned
//! (released unless the process holds the key again), a failed release is completed.

use std::sync::Arc;

use tokio::sync::oneshot;

use super::bind::Hints;
use super::lanes::{self, Entry};
use super::pool_state::{lock, OwnedKeyGuard, PoolState};
use super::registry::Inner;
use super::repair_queue::Repair;
use super::request::Class;
use super::types::{Acquired, Released};
use super::RefLease;
use crate::error::{Error, Result};

/// The jobs of this pool's lanes, holding the driver's key guard.
type AcquireJob = lanes::AcquireJob<OwnedKeyGuard>;
type ReleaseJob = lanes::ReleaseJob<OwnedKeyGuard>;

#[derive(Clone, Copy)]
enum Kind {
    Acquire,
    Release,
}

/// A flight of a lane: a leader's txn, or a batch task. Dropping it (when the txn is done, or
/// when the caller leading it was cancelled) starts the next batch task if anyone queued
/// meanwhile and no started task is about to take them.
pub(super) struct Flight {
    inner: Arc<Inner>,
    pool: Arc<PoolState>,
    kind: Kind,
    /// A batch task that has not taken its jobs yet: dropped in that state, it never ran (the
    /// runtime refused or dropped it), and nor will the next one.
    untaken: bool,
}

impl Drop for Flight {
    fn drop(&mut self) {
        let lanes = &self.pool.lanes;
        if self.untaken {
            // Dropped without running: starting another task would be dropped the same way (and
            // recurse); let the queued callers go instead. Their jobs drop here, after the lane
            // lock, unlocking their keys.
            match self.kind {
                Kind::Acquire => drop(lanes.acquire.abandon()),
                Kind::Release => drop(lanes.release.abandon()),
            }
            return;
        }
        let more = match self.kind {
            Kind::Acquire => lanes.acquire.done(),
            Kind::Release => lanes.release.done(),
        };
        if more {
            start(&self.inner, &self.pool, self.kind);
        }
    }
}

/// Starts a batch task of `kind`'s lane (already counted in the lane).
fn start(inner: &Arc<Inner>, pool: &Arc<PoolState>, kind: Kind) {
    let next = Flight { inner: inner.clone(), pool: pool.clone(), kind, untaken: true };
    match tokio::runtime::Handle::try_current() {
        Ok(rt) => {
            rt.spawn(next.run());
        }
        // No runtime: nothing can be sent; `next`'s drop lets the waiters go (`Unavailable`).
        Err(_) => drop(next),
    }
}

impl Flight {
    /// Sends everything queued as one batch and answers each waiter; dropping `self` at the end
    /// starts the next flight if callers wait. The jobs are taken when the task runs, after a
    /// yield, not when it was started, so callers woken together by the previous flight (or
    /// arriving together) join this one instead of each starting a flight of one.
    async fn run(mut self) {
        tokio::task::yield_now().await;
        let (inner, pool) = (self.inner.clone(), self.pool.clone());
        let holder = inner.holder.clone();
        match self.kind {
            Kind::Acquire => {
                let taken = pool.lanes.acquire.take();
                self.untaken = false;
                // A caller already gone is not bound at all (its job drops here, unlocking).
                let jobs: Vec<AcquireJob> =
                    taken.into_iter().filter(|j| !j.reply.is_closed()).collect();
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
                        inner
                            .bind_many(
                                &pool,
                                &keys,
                                &holder,
                                RefLease::Session,
                                Hints::Lenient,
                                Class::Interactive,
                            )
                            .await
                    }
                };
                for (job, r) in jobs.into_iter().zip(results) {
                    if let Err((r, guard)) = job.reply.send((r, job.guard)) {
                        unclaimed_acquire(&inner, &pool, &job.key, &r);
                        drop(guard);
                    }
                }
            }
            Kind::Release => {
                let jobs: Vec<ReleaseJob> = pool.lanes.release.take();
                self.untaken = false;
                let results = match jobs.as_slice() {
                    [] => Vec::new(),
                    [one] => vec![inner.release_ref(&pool, &one.key, one.id, &holder, false).await],
                    _ => {
                        let items: Vec<(&str, u64)> =
                            jobs.iter().map(|j| (j.key.as_str(), j.id)).collect();
                        inner
                            .release_ref_many(&pool, &items, &holder, false, Class::Interactive)
                            .await
                    }
                };
                for (job, r) in jobs.into_iter().zip(results) {
                    if let Err((r, guard)) = job.reply.send((r, job.guard)) {
                        unclaimed_release(&inner, &pool, &job.key, job.id, &r);
                        drop(guard);
                    }
                }
            }
        }
    }
}

/// A caller's place in a lane.
pub(super) enum Turn<T> {
    /// The lane was idle: send alone now, keep the flight until the answer is in (and the key's
    /// lock, given back).
    Lead(Flight, OwnedKeyGuard),
    /// A flight is in progress: the answer comes from a later batch.
    Wait(Waiter<T>),
}

/// What to do with an answer nobody will read.
type Orphan<T> = Box<dyn FnOnce(&Result<T>) + Send>;

/// The answer of a queued call, to await. Dropped before it is read (the caller was cancelled),
/// it hands an answer that arrived meanwhile to the orphan handler; one that arrives later finds
/// the channel closed and the batch task handles it.
pub(super) struct Waiter<T> {
    rx: Option<oneshot::Receiver<(Result<T>, OwnedKeyGuard)>>,
    orphan: Option<Orphan<T>>,
}

impl<T> Waiter<T> {
    /// The answer and the key's lock back (`None` if the job was dropped unanswered: the runtime
    /// is shutting down; the lock was released with it).
    pub(super) async fn wait(mut self) -> (Result<T>, Option<OwnedKeyGuard>) {
        let Some(rx) = self.rx.as_mut() else {
            return (Err(dropped()), None);
        };
        let r = rx.await;
        self.rx = None;
        match r {
            Ok((r, guard)) => (r, Some(guard)),
            Err(_) => (Err(dropped()), None),
        }
    }
}

impl<T> Drop for Waiter<T> {
    fn drop(&mut self) {
        if let Some(mut rx) = self.rx.take() {
            rx.close();
            if let (Ok((r, _guard)), Some(orphan)) = (rx.try_recv(), self.orphan.take()) {
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

/// The turn of an acquire of `key`; `guard` is the key's single-flight lock, which the caller
/// gets back with its answer.
pub(super) fn acquire_turn(
    inner: &Arc<Inner>,
    pool: &Arc<PoolState>,
    key: &str,
    guard: OwnedKeyGuard,
) -> Turn<Acquired> {
    let (tx, rx) = oneshot::channel();
    let job = AcquireJob { key: key.to_string(), guard, reply: tx };
    match pool.lanes.acquire.enter(job) {
        Entry::Lead(job) => return Turn::Lead(lead(inner, pool, Kind::Acquire), job.guard),
        Entry::Start => start(inner, pool, Kind::Acquire),
        Entry::Queued => {}
    }
    let (i, p, k) = (inner.clone(), pool.clone(), key.to_string());
    Turn::Wait(Waiter {
        rx: Some(rx),
        orphan: Some(Box::new(move |r| unclaimed_acquire(&i, &p, &k, r))),
    })
}

/// The turn of the release of this process's reference to `key` (bound to `id`; the caller has
/// already dropped its local hold); `guard` as for [`acquire_turn`].
pub(super) fn release_turn(
    inner: &Arc<Inner>,
    pool: &Arc<PoolState>,
    key: &str,
    id: u64,
    guard: OwnedKeyGuard,
) -> Turn<Released> {
    let (tx, rx) = oneshot::channel();
    let job = ReleaseJob { key: key.to_string(), id, guard, reply: tx };
    match pool.lanes.release.enter(job) {
        Entry::Lead(job) => return Turn::Lead(lead(inner, pool, Kind::Release), job.guard),
        Entry::Start => start(inner, pool, Kind::Release),
        Entry::Queued => {}
    }
    let (i, p, k) = (inner.clone(), pool.clone(), key.to_string());
    Turn::Wait(Waiter {
        rx: Some(rx),
        orphan: Some(Box::new(move |r| unclaimed_release(&i, &p, &k, id, r))),
    })
}

/// The flight of a caller that leads (already counted in its lane).
fn lead(inner: &Arc<Inner>, pool: &Arc<PoolState>, kind: Kind) -> Flight {
    Flight { inner: inner.clone(), pool: pool.clone(), kind, untaken: false }
}
