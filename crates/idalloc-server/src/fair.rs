//! Fair admission of many-key requests between clients.
//!
//! The allocator admits the store txns of many-key calls in arrival order (one FIFO,
//! `--bulk-in-flight`), which is fair between calls but not between clients: one client with 64
//! queued 1,000-key acquires put another's 100-key acquire behind all of them (14 ms → 8.7 s).
//! [`FairGate`] sits in front of it, in the service: at most `max` many-key requests in flight,
//! and when a slot frees, the waiting client served the longest ago goes next (a client never
//! served first), whatever the number of requests each has queued. One client's queue thus
//! delays another's request by at most the requests in flight at once, not by its length.
//! Single-key requests do not pass through it.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};

use tokio::sync::oneshot;

/// The gate: `max` slots, waiters queued per client.
pub struct FairGate {
    max: usize,
    st: Mutex<State>,
}

#[derive(Default)]
struct State {
    in_flight: usize,
    /// Each client's waiters, oldest first.
    waiting: HashMap<Arc<str>, VecDeque<oneshot::Sender<Slot>>>,
    /// When each client was last admitted (a tick of `clock`); absent: never (or forgotten once
    /// it had nothing in flight or queued).
    served: HashMap<Arc<str>, u64>,
    clock: u64,
}

/// A slot of the gate, held for the time a request's many-key work runs.
pub struct Slot {
    gate: Option<Arc<FairGate>>,
}

impl Drop for Slot {
    fn drop(&mut self) {
        if let Some(g) = self.gate.take() {
            g.release();
        }
    }
}

impl FairGate {
    pub fn new(max: usize) -> Arc<FairGate> {
        Arc::new(FairGate { max: max.max(1), st: Mutex::default() })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.st.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Waits for a slot for client `who`.
    pub async fn admit(self: &Arc<Self>, who: &str) -> Slot {
        let rx = {
            let mut st = self.lock();
            let queued = st.waiting.values().any(|q| !q.is_empty());
            if st.in_flight < self.max && !queued {
                st.in_flight += 1;
                st.clock += 1;
                let tick = st.clock;
                st.served.insert(who.into(), tick);
                return Slot { gate: Some(self.clone()) };
            }
            let (tx, rx) = oneshot::channel();
            st.waiting.entry(who.into()).or_default().push_back(tx);
            rx
        };
        match rx.await {
            Ok(slot) => slot,
            // The gate is gone (never while a waiter holds it): admit without waiting.
            Err(_) => Slot { gate: None },
        }
    }

    /// Requests waiting for a slot (tests).
    pub fn waiting(&self) -> usize {
        self.lock().waiting.values().map(VecDeque::len).sum()
    }

    /// Hands a freed slot to the next waiter (the client served the longest ago), or frees it.
    fn release(self: Arc<Self>) {
        loop {
            let next = {
                let mut st = self.lock();
                let who = st
                    .waiting
                    .iter()
                    .filter(|(_, q)| !q.is_empty())
                    .min_by_key(|(w, _)| (st.served.get(*w).copied().unwrap_or(0), w.to_string()))
                    .map(|(w, _)| w.clone());
                let Some(who) = who else {
                    st.in_flight -= 1;
                    st.waiting.clear();
                    if st.in_flight == 0 {
                        st.served.clear();
                    }
                    return;
                };
                let tx = st.waiting.get_mut(&who).and_then(VecDeque::pop_front);
                if st.waiting.get(&who).is_some_and(VecDeque::is_empty) {
                    st.waiting.remove(&who);
                }
                st.clock += 1;
                let tick = st.clock;
                st.served.insert(who, tick);
                tx
            };
            let Some(tx) = next else { continue };
            match tx.send(Slot { gate: Some(self.clone()) }) {
                Ok(()) => return,
                // That waiter went away: disarm its slot (it stays counted) and try the next.
                Err(mut slot) => {
                    slot.gate = None;
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// With one slot, a client's 5 queued calls and another's one: the other's is admitted next,
    /// before the first client's queued ones; then the first's, in their order.
    #[tokio::test]
    async fn another_clients_call_goes_before_a_flooding_clients_queue() {
        let gate = FairGate::new(1);
        let first = gate.admit("flood").await;
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
        let mut tasks = Vec::new();
        for i in 0..5 {
            let (g, tx) = (gate.clone(), tx.clone());
            tasks.push(tokio::spawn(async move {
                let _s = g.admit("flood").await;
                let _ = tx.send(format!("flood-{i}"));
            }));
            while gate.waiting() < i + 1 {
                tokio::task::yield_now().await;
            }
        }
        let (g, t) = (gate.clone(), tx.clone());
        tasks.push(tokio::spawn(async move {
            let _s = g.admit("other").await;
            let _ = t.send("other".to_string());
        }));
        while gate.waiting() < 6 {
            tokio::task::yield_now().await;
        }
        drop(first);
        for t in tasks {
            t.await.expect("task");
        }
        drop(tx);
        let mut order = Vec::new();
        while let Some(x) = rx.recv().await {
            order.push(x);
        }
        assert_eq!(order, ["other", "flood-0", "flood-1", "flood-2", "flood-3", "flood-4"]);
        assert_eq!(gate.waiting(), 0);
        // The slot is free again.
        let again = gate.admit("x").await;
        drop(again);
        assert_eq!(gate.lock().in_flight, 0);
    }

    /// A waiter that gives up does not take its slot with it.
    #[tokio::test]
    async fn a_waiter_that_goes_away_frees_its_turn() {
        let gate = FairGate::new(1);
        let held = gate.admit("a").await;
        let g = gate.clone();
        let gone = tokio::spawn(async move {
            let _s = g.admit("b").await;
        });
        while gate.waiting() < 1 {
            tokio::task::yield_now().await;
        }
        gone.abort();
        let _ = gone.await;
        drop(held);
        let s = tokio::time::timeout(std::time::Duration::from_secs(5), gate.admit("c")).await;
        assert!(s.is_ok(), "the slot came back");
    }
}
