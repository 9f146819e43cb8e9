//! One store read shared by every caller that needs a read made *after* it asked: the read a new
//! watch stream makes for read-your-writes.
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
//! client disconnected) never strands the others. If that task itself goes (the read panicked, or
//! the runtime dropped the task), every caller waiting then gets [`Abandoned`] as its answer and
//! the next caller starts a fresh read: the callers hold the answer channel's sender themselves
//! (through the flight), so without that they would wait forever for an answer nobody sends.

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

    /// The task running the reads went away before read `started` answered: every read wanted so
    /// far counts as answered (with an error), and nothing runs. Returns the number of the last
    /// read so answered: every caller waiting for it or an earlier one takes that error, and the
    /// next caller to arrive starts a new read.
    pub fn abandon(&mut self) -> u64 {
        self.started = self.started.max(self.wanted);
        self.running = false;
        self.started
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

/// The task doing the shared read went away before it answered (the read panicked, or the
/// runtime dropped the task): what the callers that waited for it get instead of an answer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Abandoned;

impl std::fmt::Display for Abandoned {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(
            "the shared store read this request waited for was abandoned (its task panicked or \
             was stopped); retry",
        )
    }
}

impl From<Abandoned> for String {
    fn from(a: Abandoned) -> String {
        a.to_string()
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
    E: Clone + Send + Sync + From<Abandoned> + 'static,
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

    /// Reads `n`, and the reads wanted after it, one after the other. If this future is dropped
    /// before it is done (a panicking read unwinds through it, or its task is dropped), the
    /// callers waiting are answered [`Abandoned`] ([`Landing`]).
    async fn fly(self: Arc<Self>, mut n: u64) {
        let mut landing = Landing { flight: self, done: false };
        loop {
            let answer = (landing.flight.read)().await;
            landing.flight.answers.send_replace(Some((n, answer)));
            let next = landing.flight.lock().landed(n);
            match next {
                Some(next) => n = next,
                None => {
                    landing.done = true;
                    return;
                }
            }
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Flights> {
        self.flights.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// Held by the task running the reads: dropped before `done` (unwinding from a panicking read,
/// or the task dropped), it answers every waiting caller [`Abandoned`] and lets the next caller
/// start a read, so that nobody waits for an answer that will never come.
struct Landing<T, E>
where
    T: Clone + Send + Sync + 'static,
    E: Clone + Send + Sync + From<Abandoned> + 'static,
{
    flight: Arc<SingleFlight<T, E>>,
    done: bool,
}

impl<T, E> Drop for Landing<T, E>
where
    T: Clone + Send + Sync + 'static,
    E: Clone + Send + Sync + From<Abandoned> + 'static,
{
    fn drop(&mut self) {
        if self.done {
            return;
        }
        let last = self.flight.lock().abandon();
        self.flight.answers.send_replace(Some((last, Err(E::from(Abandoned)))));
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

    #[test]
    fn an_abandoned_read_answers_every_read_wanted_so_far_and_the_next_caller_starts_anew() {
        let mut f = Flights::default();
        assert_eq!(f.arrive(), (1, Some(1)));
        assert_eq!(f.arrive(), (2, None));
        assert_eq!(f.abandon(), 2, "callers waiting for reads 1 and 2 are answered");
        assert_eq!(f.arrive(), (3, Some(3)), "nothing runs: the next caller starts a read");
        assert_eq!(f.landed(3), None);
    }

    /// A read that panics on its first call and answers 7 afterwards.
    fn panics_once() -> (Arc<SingleFlight<u64, String>>, Arc<AtomicU64>) {
        let calls = Arc::new(AtomicU64::new(0));
        let c = calls.clone();
        let flight = SingleFlight::new(move || {
            let n = c.fetch_add(1, Ordering::SeqCst);
            async move {
                if n == 0 {
                    panic!("the store client panicked (as a test)");
                }
                Ok::<u64, String>(7)
            }
        });
        (flight, calls)
    }

    #[tokio::test(flavor = "current_thread")]
    async fn a_read_that_panics_answers_its_callers_with_an_error_instead_of_stranding_them() {
        let (flight, calls) = panics_once();
        // The timeout only turns the old code's hang into a failure; nothing here is timed.
        let first = tokio::time::timeout(std::time::Duration::from_secs(30), flight.get()).await;
        assert_eq!(first, Ok(Err(Abandoned.to_string())), "the caller must not wait forever");
        assert_eq!(flight.get().await, Ok(7), "the next caller starts a fresh read");
        assert_eq!(calls.load(Ordering::SeqCst), 2);
        assert_eq!(flight.waiting(), 0);
    }

    #[test]
    fn callers_get_an_error_when_the_task_doing_the_read_is_dropped() {
        let started = Arc::new(AtomicU64::new(0));
        let s = started.clone();
        let flight = SingleFlight::new(move || {
            let s = s.clone();
            async move {
                s.fetch_add(1, Ordering::SeqCst);
                std::future::pending::<Result<u64, String>>().await
            }
        });
        let rt = |what| {
            tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap_or_else(|e| panic!("{what} runtime: {e}"))
        };
        // The first caller, on a runtime of its own, starts the read there.
        let doomed = rt("first");
        let f = flight.clone();
        doomed.spawn(async move { f.get().await });
        doomed.block_on(async {
            while started.load(Ordering::SeqCst) == 0 {
                tokio::task::yield_now().await;
            }
        });
        // A second caller waits on another runtime; then the reading task's runtime goes away.
        let main = rt("second");
        let f = flight.clone();
        let waiter = main.spawn(async move { f.get().await });
        main.block_on(async {
            while flight.waiting() < 2 {
                tokio::task::yield_now().await;
            }
        });
        drop(doomed);
        let got = main.block_on(async {
            tokio::time::timeout(std::time::Duration::from_secs(30), waiter).await
        });
        let got = got.expect("the waiter must not wait forever").expect("task");
        assert_eq!(got, Err(Abandoned.to_string()));
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
