//! One store read shared by every caller that needs a read made *after* it asked (issue 21
//! item 4): the read a new watch stream makes for read-your-writes.
//!
//! A new stream must include every write that returned before the stream was opened, so the
//! service reads the pool's newest change from the store and waits for its feed to reach it.
//! Each stream used to make that read itself: 1,000 agents opening at once were 1,000 reads. A
//! read that started *before* a caller arrived may miss a write that returned just before the
//! caller arrived, so a caller cannot take the answer of the read in flight; it takes the answer
//! of the next one, and every caller that arrives meanwhile takes that same one. So however many
//! streams open at once, the store sees at most one read in flight and one more queued, and a
//! caller waits at most two reads.
//!
//! [`Flights`] is the pure bookkeeping (which read a caller needs, when to start the next one);
//! [`SingleFlight`] runs the reads, each in a task of its own so that a caller that goes away (its
//! client disconnected) never strands the others.

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use tokio::sync::watch;

/// Which reads have started and which are wanted. Reads are numbered from 1 in the order they
/// start; at most one runs at a time.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Flights {
    /// The number of the last read started (0: none yet).
    started: u64,
    /// The highest read number some caller waits for.
    wanted: u64,
    running: bool,
}

impl Flights {
    /// A caller arrives: the read it needs (the first to start from now on), and `Some` of that
    /// number if the caller must start it now (none is running).
    pub fn arrive(&mut self) -> (u64, Option<u64>) {
        let want = self.started + 1;
        self.wanted = self.wanted.max(want);
        if self.running {
            return (want, None);
        }
        self.running = true;
        self.started = want;
        (want, Some(want))
    }

    /// Read `n` has answered: `Some` of the next read to start at once (callers arrived while it
    /// ran), or `None` and nothing runs.
    pub fn landed(&mut self, n: u64) -> Option<u64> {
        debug_assert_eq!(n, self.started);
        if self.wanted > n {
            self.started += 1;
            Some(self.started)
        } else {
            self.running = false;
            None
        }
    }
}

type Read<T, E> = dyn Fn() -> Pin<Box<dyn Future<Output = Result<T, E>> + Send>> + Send + Sync;

/// Shares each answer of `read` among the callers that arrived before it started (see the
/// module docs).
pub struct SingleFlight<T, E> {
    flights: Mutex<Flights>,
    /// The last answer, with its read's number.
    answers: watch::Sender<Option<(u64, Result<T, E>)>>,
    read: Box<Read<T, E>>,
    /// Callers waiting for an answer.
    waiting: AtomicUsize,
}

/// Counts a caller out when it returns or goes away.
struct Waiting<'a>(&'a AtomicUsize);

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

impl<T, E> SingleFlight<T, E>
where
    T: Clone + Send + Sync + 'static,
    E: Clone + Send + Sync + 'static,
{
    pub fn new<F, Fut>(read: F) -> Arc<Self>
    where
        F: Fn() -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<T, E>> + Send + 'static,
    {
        Arc::new(SingleFlight {
            flights: Mutex::new(Flights::default()),
            answers: watch::channel(None).0,
            read: Box::new(move || Box::pin(read())),
            waiting: AtomicUsize::new(0),
        })
    }

    /// Callers waiting for an answer now.
    pub fn waiting(&self) -> usize {
        self.waiting.load(Ordering::Relaxed)
    }

    /// The answer of a read that started after this call began.
    pub async fn get(self: &Arc<Self>) -> Result<T, E> {
        self.waiting.fetch_add(1, Ordering::Relaxed);
        let _waiting = Waiting(&self.waiting);
        let mut answers = self.answers.subscribe();
        let (want, start) = self.lock().arrive();
        if let Some(n) = start {
            tokio::spawn(self.clone().fly(n));
        }
        loop {
            if let Some((n, answer)) = answers.borrow_and_update().as_ref() {
                if *n >= want {
                    return answer.clone();
                }
            }
            // The sender lives in `self`, which this call holds: never closed while we wait.
            if answers.changed().await.is_err() {
                std::future::pending::<()>().await;
            }
        }
    }

    /// Reads `n`, and the reads wanted after it, one after the other.
    async fn fly(self: Arc<Self>, mut n: u64) {
        loop {
            let answer = (self.read)().await;
            self.answers.send_replace(Some((n, answer)));
            match self.lock().landed(n) {
                Some(next) => n = next,
                None => return,
            }
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Flights> {
        self.flights.lock().unwrap_or_else(|p| p.into_inner())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicU64, Ordering};
    use tokio::sync::Semaphore;

    #[test]
    fn callers_during_a_read_wait_for_the_next_one_and_share_it() {
        let mut f = Flights::default();
        assert_eq!(f.arrive(), (1, Some(1)), "nothing runs: the first caller starts read 1");
        assert_eq!(f.arrive(), (2, None), "read 1 started before it came: it needs read 2");
        assert_eq!(f.arrive(), (2, None), "and shares read 2 with the one before");
        assert_eq!(f.landed(1), Some(2), "callers wait: read 2 starts at once");
        assert_eq!(f.arrive(), (3, None));
        assert_eq!(f.landed(2), Some(3));
        assert_eq!(f.landed(3), None, "nobody waits: nothing runs");
        assert_eq!(f.arrive(), (4, Some(4)), "the next caller starts a read again");
        assert_eq!(f.landed(4), None);
    }

    #[tokio::test(flavor = "current_thread")]
    async fn many_callers_cost_two_reads_and_each_gets_a_read_that_started_after_it() {
        // Each read answers the number of reads started so far; reads wait for a permit.
        let started = Arc::new(AtomicU64::new(0));
        let gate = Arc::new(Semaphore::new(0));
        let (s, g) = (started.clone(), gate.clone());
        let flight = SingleFlight::new(move || {
            let (s, g) = (s.clone(), g.clone());
            async move {
                let n = s.fetch_add(1, Ordering::SeqCst) + 1;
                g.acquire().await.map_err(|_| "closed".to_string())?.forget();
                Ok::<u64, String>(n)
            }
        });
        let first = tokio::spawn({
            let f = flight.clone();
            async move { f.get().await }
        });
        while started.load(Ordering::SeqCst) == 0 {
            tokio::task::yield_now().await;
        }
        // 50 callers arrive while read 1 is in flight.
        let later: Vec<_> = (0..50)
            .map(|_| {
                let f = flight.clone();
                tokio::spawn(async move { f.get().await })
            })
            .collect();
        for _ in 0..10 {
            tokio::task::yield_now().await;
        }
        assert_eq!(started.load(Ordering::SeqCst), 1, "one read in flight, however many wait");
        gate.add_permits(1);
        assert_eq!(first.await.expect("task"), Ok(1));
        while started.load(Ordering::SeqCst) < 2 {
            tokio::task::yield_now().await;
        }
        for t in &later {
            assert!(!t.is_finished(), "read 1 started before them: it cannot answer them");
        }
        gate.add_permits(1);
        for t in later {
            assert_eq!(t.await.expect("task"), Ok(2), "a read that started after the caller");
        }
        assert_eq!(started.load(Ordering::SeqCst), 2, "51 callers, 2 reads");
    }
}
