//! Slow links without `tc netem`: an NFQUEUE server that holds every packet the kernel hands it
//! and releases it after a random delay, so packets leave late and, with jitter, out of order.
//!
//! The kernel side is an iptables rule in a host's namespace (`-j NFQUEUE --queue-num N
//! --queue-bypass`: with nobody listening, packets pass). This side is a thread that moved into
//! that namespace ([`crate::netlab::enter`]) and reads the queue over netlink (the `nfq` crate).
//! While the delay is off ([`DelayControl::set`] with `None`) it releases everything at once, so
//! healing is removing the rule: held packets drain on their own schedule.

use std::collections::BinaryHeap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

/// The shared knobs and counters of one delay server.
#[derive(Debug, Default)]
pub struct DelayControl {
    /// The delay range in milliseconds (low, high), or none: pass at once.
    range: Mutex<Option<(u64, u64)>>,
    stop: AtomicBool,
    /// Packets held and released late.
    pub delayed: AtomicU64,
    /// Packets released before an earlier-received one (reordered).
    pub reordered: AtomicU64,
    /// The longest delay given to a packet, in milliseconds.
    pub max_hold_ms: AtomicU64,
}

impl DelayControl {
    /// Sets the delay of every packet from now on: uniform in `low..=high` ms, or none.
    pub fn set(&self, range: Option<(u64, u64)>) {
        if let Ok(mut r) = self.range.lock() {
            *r = range.map(|(lo, hi)| (lo.min(hi), hi.max(lo)));
        }
    }
    fn range(&self) -> Option<(u64, u64)> {
        self.range.lock().ok().and_then(|r| *r)
    }
}

/// A running delay server; stopped (every held packet released) and joined on drop.
pub struct DelayServer {
    pub control: Arc<DelayControl>,
    thread: Option<JoinHandle<Result<(), String>>>,
}

impl DelayServer {
    /// Starts serving queue `queue` inside namespace `ns`. Answers once the queue is bound, so a
    /// rule added afterwards is served.
    pub fn start(ns: &str, queue: u16, seed: u64) -> Result<DelayServer, String> {
        let control = Arc::new(DelayControl::default());
        let (ready_tx, ready_rx) = std::sync::mpsc::channel::<Result<(), String>>();
        let (ns, c) = (ns.to_string(), control.clone());
        let thread = std::thread::Builder::new()
            .name(format!("delay-{ns}"))
            .spawn(move || serve(&ns, queue, seed, &c, ready_tx))
            .map_err(|e| format!("cannot start the delay thread: {e}"))?;
        let mut server = DelayServer { control, thread: Some(thread) };
        match ready_rx.recv() {
            Ok(Ok(())) => Ok(server),
            Ok(Err(e)) => Err(e),
            Err(_) => Err(server.join_err()),
        }
    }

    fn join_err(&mut self) -> String {
        match self.thread.take().map(JoinHandle::join) {
            Some(Ok(Err(e))) => e,
            Some(Err(_)) => "the delay thread panicked".into(),
            _ => "the delay thread ended".into(),
        }
    }
}

impl Drop for DelayServer {
    fn drop(&mut self) {
        self.control.stop.store(true, Ordering::SeqCst);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// A held packet, ordered by release time (earliest first in the max-heap via `Reverse` order).
struct Held {
    due: Instant,
    arrival: u64,
    msg: nfq::Message,
}

impl PartialEq for Held {
    fn eq(&self, o: &Self) -> bool {
        self.due == o.due && self.arrival == o.arrival
    }
}
impl Eq for Held {}
impl PartialOrd for Held {
    fn partial_cmp(&self, o: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(o))
    }
}
impl Ord for Held {
    fn cmp(&self, o: &Self) -> std::cmp::Ordering {
        // Reversed: the heap's top is the packet due first.
        o.due.cmp(&self.due).then(o.arrival.cmp(&self.arrival))
    }
}

fn serve(
    ns: &str,
    queue: u16,
    seed: u64,
    c: &DelayControl,
    ready: std::sync::mpsc::Sender<Result<(), String>>,
) -> Result<(), String> {
    let setup = || -> Result<nfq::Queue, String> {
        crate::netlab::enter(ns)?;
        let mut q = nfq::Queue::open().map_err(|e| format!("NFQUEUE socket in {ns}: {e}"))?;
        q.bind(queue).map_err(|e| format!("binding NFQUEUE {queue} in {ns}: {e}"))?;
        // A full queue lets packets through rather than dropping them (loss is another nemesis).
        q.set_fail_open(queue, true).map_err(|e| format!("NFQUEUE fail-open: {e}"))?;
        q.set_queue_max_len(queue, 8192).map_err(|e| format!("NFQUEUE length: {e}"))?;
        q.set_nonblocking(true);
        Ok(q)
    };
    let mut q = match setup() {
        Ok(q) => {
            let _ = ready.send(Ok(()));
            q
        }
        Err(e) => {
            let _ = ready.send(Err(e.clone()));
            return Err(e);
        }
    };
    let mut rng = StdRng::seed_from_u64(seed);
    let mut held: BinaryHeap<Held> = BinaryHeap::new();
    let mut arrivals = 0u64;
    let mut last_released = 0u64;
    loop {
        let stopping = c.stop.load(Ordering::SeqCst);
        let mut idle = true;
        // Take what the kernel queued.
        loop {
            match q.recv() {
                Ok(mut msg) => {
                    idle = false;
                    arrivals += 1;
                    msg.set_verdict(nfq::Verdict::Accept);
                    let delay = match c.range() {
                        Some((lo, hi)) if !stopping => {
                            Duration::from_millis(rng.random_range(lo..=hi))
                        }
                        _ => Duration::ZERO,
                    };
                    c.max_hold_ms.fetch_max(delay.as_millis() as u64, Ordering::Relaxed);
                    held.push(Held { due: Instant::now() + delay, arrival: arrivals, msg });
                }
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => break,
                Err(e) => return Err(format!("NFQUEUE {queue} in {ns}: {e}")),
            }
        }
        // Release what is due (everything when the delay is off or the server stops).
        let now = Instant::now();
        let release_all = stopping || c.range().is_none();
        while held.peek().is_some_and(|h| release_all || h.due <= now) {
            let Some(h) = held.pop() else { break };
            idle = false;
            if h.arrival < last_released {
                c.reordered.fetch_add(1, Ordering::Relaxed);
            }
            last_released = last_released.max(h.arrival);
            c.delayed.fetch_add(1, Ordering::Relaxed);
            if let Err(e) = q.verdict(h.msg) {
                return Err(format!("NFQUEUE {queue} verdict in {ns}: {e}"));
            }
        }
        if stopping && held.is_empty() {
            return Ok(());
        }
        if idle {
            std::thread::sleep(Duration::from_millis(1));
        }
    }
}
