//! Group commit for the file store: concurrent txns share one redb write transaction and one
//! fsync.
//!
//! With one fsync per txn under one lock, 64 concurrent callers waited for each other's fsyncs in
//! whatever order the mutex let them in (p99 1.2 s against a p50 of 0.5 ms, docs/benchmarks/protocol.md).
//! Here every txn of a file store is a [`Job`] on one FIFO queue, served by one writer at a time:
//! it takes the first job, locks the state, adds every job that queued meanwhile (up to
//! [`MAX_GROUP_JOBS`] / [`MAX_GROUP_BYTES`]), applies them **one by one, in queue order**, to the
//! state machine (`Core::apply_group`), writes everything they changed in one durable redb
//! commit, publishes the watch events, unlocks, and only then answers each caller. So:
//!
//! - each txn keeps its own semantics: its compares see every earlier txn of the group, it gets
//!   its own revision and response, leases expire and auto-compaction runs between txns exactly
//!   as if they had come one by one (the MVCC core does not know about groups);
//! - no caller hears back, and no reader or watcher sees a txn, before the commit holding it is
//!   on disk (the state lock is held from the first apply until the commit returned); a crash
//!   mid-group loses only unacknowledged txns, and redb's commit is atomic, so none is torn;
//! - the queue is served in arrival order, so no caller waits behind more than the group being
//!   written and its own;
//! - while one group is being written, the next one gathers: no added latency when idle.
//!
//! The writer is not a task of its own: the caller that finds the queue idle starts a blocking
//! task (`spawn_blocking`: the commit blocks on fsync, off the async workers) that serves groups
//! until the queue is empty. A blocking task also keeps a paused test clock from jumping ahead
//! while callers wait for the disk, which a thread unknown to tokio would not.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex, MutexGuard, Weak};

use tokio::sync::oneshot;
use tokio::time::Instant;

use super::mvcc::txn_size;
use crate::store::{StoreError, StoreResult, TxnRequest, TxnResponse};

/// At most this many txns share one commit: bounds the time the state stays locked.
pub(crate) const MAX_GROUP_JOBS: usize = 512;
/// And at most about this many request bytes (a group always takes at least one txn).
pub(crate) const MAX_GROUP_BYTES: usize = 8 << 20;

/// What a writer applies its groups to: the store's state (`Shared` in `mod.rs`). A trait so
/// that this file never names the store that uses it (`mod.rs` queues its txns here; importing
/// it back would make the two files a cycle).
pub(crate) trait Target: Send + Sync + 'static {
    /// Locks the state, takes the group (`take`: called once, under the lock, so that everything
    /// that queued while the lock was busy joins), applies it and commits it durably
    /// (`Core::apply_group`), wakes the expiry task if a lease deadline moved, and unlocks.
    /// Returns the group and each txn's result, for the writer to answer after the unlock.
    fn apply_group(
        &self,
        take: &mut dyn FnMut() -> Vec<Job>,
        keep: i64,
    ) -> (Vec<Job>, Vec<StoreResult<TxnResponse>>);
}

/// One caller's txn, waiting for its group.
pub(crate) struct Job {
    pub req: TxnRequest,
    /// The caller's clock reading (tokio's, so paused-time tests drive lease expiry).
    pub now: Instant,
    reply: oneshot::Sender<StoreResult<TxnResponse>>,
}

impl Job {
    /// A job as if queued by a caller, and the receiver of its answer.
    #[cfg(test)]
    pub fn for_test(
        req: TxnRequest,
        now: Instant,
    ) -> (Job, oneshot::Receiver<StoreResult<TxnResponse>>) {
        let (reply, answer) = oneshot::channel();
        (Job { req, now, reply }, answer)
    }
}

/// The txn queue of a file store.
#[derive(Default)]
pub(crate) struct Writer {
    queue: Arc<Mutex<Queue>>,
}

#[derive(Default)]
struct Queue {
    jobs: VecDeque<Job>,
    /// A blocking task is serving the queue (it clears this when it finds the queue empty).
    writing: bool,
}

fn lock(queue: &Mutex<Queue>) -> MutexGuard<'_, Queue> {
    // Nothing in the queue can be left half-changed by a panic: push and drain are single steps.
    queue.lock().unwrap_or_else(|e| e.into_inner())
}

fn stopped() -> StoreError {
    StoreError::Unavailable("the embedded store's writer stopped before answering".into())
}

impl Writer {
    /// Queues `req` and waits until the group holding it is durable (or failed). `keep` is the
    /// auto-compaction setting.
    pub async fn txn<T: Target>(
        &self,
        shared: &Arc<T>,
        keep: i64,
        req: TxnRequest,
        now: Instant,
    ) -> StoreResult<TxnResponse> {
        let (reply, answer) = oneshot::channel();
        let start = {
            let mut q = lock(&self.queue);
            q.jobs.push_back(Job { req, now, reply });
            !std::mem::replace(&mut q.writing, true)
        };
        if start {
            let shared: Weak<T> = Arc::downgrade(shared);
            let task = Serve { shared, queue: self.queue.clone(), keep, done: false };
            match tokio::runtime::Handle::try_current() {
                // Detached: it answers through the oneshots.
                Ok(rt) => drop(rt.spawn_blocking(move || task.run())),
                Err(_) => task.run(),
            }
        }
        answer.await.map_err(|_| stopped())?
    }
}

/// A writer about to start. If it is dropped without having served the queue empty (its runtime
/// shut down before the blocking task started, or the task panicked), it fails what is queued
/// and lets the next caller start a writer, so no caller waits forever.
///
/// It holds the store's state weakly and lets go of it before it answers a group: once the last
/// caller has its answer and drops the store, the file is closed at once, not whenever this
/// blocking task gets round to ending (a reopen right after a drop found the file still locked).
struct Serve {
    shared: Weak<dyn Target>,
    queue: Arc<Mutex<Queue>>,
    keep: i64,
    done: bool,
}

impl Serve {
    fn run(mut self) {
        // True: the queue was empty and `writing` cleared; a caller may since have started
        // another writer, which `drop` must leave alone.
        self.done = serve(&self.shared, self.keep, &self.queue);
    }
}

impl Drop for Serve {
    fn drop(&mut self) {
        if self.done {
            return;
        }
        let mut q = lock(&self.queue);
        q.writing = false;
        // Dropping the jobs drops their reply senders: their callers get "writer stopped".
        q.jobs.clear();
    }
}

/// True, with `writing` cleared, if nothing is queued: the writer is done.
fn queue_is_done(queue: &Mutex<Queue>) -> bool {
    let mut q = lock(queue);
    let done = q.jobs.is_empty();
    if done {
        q.writing = false;
    }
    done
}

/// Serves groups until the queue is empty (true), or until the store is gone (false: then
/// `Serve::drop` fails what queued, which only callers that stopped waiting can have left).
fn serve(shared: &Weak<dyn Target>, keep: i64, queue: &Mutex<Queue>) -> bool {
    loop {
        // The queue is looked at before the state is taken: a writer that took the state only to
        // find nothing to do could be the last holder of a store its callers just dropped, and
        // keep the file open after them. Only this writer removes jobs, so a job seen here is
        // still there below.
        if queue_is_done(queue) {
            return true;
        }
        let Some(shared) = shared.upgrade() else { return false };
        // Taken under the state lock: everything that queued while the previous group was being
        // written (or while a reader held the lock) joins this group.
        let mut take = || {
            let mut q = lock(queue);
            let mut bytes = 0;
            let mut n = 0;
            while n < q.jobs.len() && n < MAX_GROUP_JOBS && bytes < MAX_GROUP_BYTES {
                bytes += txn_size(&q.jobs[n].req);
                n += 1;
            }
            q.jobs.drain(..n).collect()
        };
        let (jobs, results) = shared.apply_group(&mut take, keep);
        drop(shared);
        for (job, result) in jobs.into_iter().zip(results) {
            // The caller may have given up waiting; its txn is committed all the same (as on
            // etcd, where a request whose response is lost may have taken effect).
            let _ = job.reply.send(result);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::mvcc::Mvcc;
    use super::super::Shared;
    use super::*;
    use crate::store::TxnOp;

    /// A writer whose blocking task never ran (its runtime shut down first) must not leave its
    /// callers waiting forever nor the queue marked busy.
    #[test]
    fn a_writer_dropped_before_it_ran_fails_queued_txns_and_frees_the_queue() {
        let writer = Writer::default();
        let (job, answer) =
            Job::for_test(TxnRequest::new().and_then([TxnOp::put("k", "v")]), Instant::now());
        {
            let mut q = lock(&writer.queue);
            q.jobs.push_back(job);
            q.writing = true;
        }
        let shared = Shared::new(Mvcc::new(), None);
        let weak: Weak<Shared> = Arc::downgrade(&shared);
        let task = Serve { shared: weak, queue: writer.queue.clone(), keep: 0, done: false };
        drop(task);
        assert!(answer.blocking_recv().is_err(), "the caller hears that the writer stopped");
        let q = lock(&writer.queue);
        assert!(!q.writing && q.jobs.is_empty(), "the next caller starts a writer");
    }
}
