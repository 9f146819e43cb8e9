//! Bulk txns take turns at the store: a bounded number at once, handed out fairly between
//! clients; one per client while several have bulk work; one in all, and smaller, while a
//! single-key call is about, a client resting after each txn while another client's is
//! (docs/design/bulk-admission.md).
//!
//! Why per txn and per client: etcd applies txns one at a time, in order, so what another call
//! waits for is the txns ahead of its own at etcd. One client's queue of 1,000-key calls is
//! ~40 txns a call; admitted in arrival order, another client's 100-key call waited behind all
//! of them. Here, when a slot frees, the client served the longest ago goes next, so the other
//! client's txns alternate with the flood's: its call takes about twice its quiet time, whatever
//! the flood's queue. Who the client is comes from [`as_client`] (the service names each
//! request's client); calls outside it are one client together.

use std::collections::{HashMap, VecDeque};
use std::future::Future;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::oneshot;
use tokio::time::Instant;

tokio::task_local! {
    static CLIENT: Arc<str>;
}

/// Runs `work` as `client`'s: the bulk txns it sends take turns with other clients' rather than
/// queue behind them. The service wraps each request in it; a process serving one caller has no
/// need to.
///
/// ```
/// # async fn demo(pool: &idalloc::Pool) -> idalloc::Result<()> {
/// let keys = ["a", "b", "c"];
/// let got = idalloc::allocator::as_client("tenant-a", pool.acquire_many(&keys)).await;
/// # let _ = got;
/// # Ok(())
/// # }
/// ```
pub async fn as_client<F: Future>(client: &str, work: F) -> F::Output {
    CLIENT.scope(Arc::from(client), work).await
}

/// The client the current task works for ("" outside [`as_client`]).
fn current() -> Arc<str> {
    CLIENT.try_with(Arc::clone).unwrap_or_else(|_| Arc::from(""))
}

/// Bulk txns at the store at once while a single-key call is about ([`Turns::contended`]). Why: etcd
/// applies one txn at a time, in order, and a ~100-key txn takes it a few milliseconds, so a
/// one-key txn sent behind 8 of them waited 10–20 times its own time; behind one small one,
/// about its own time again.
pub(crate) const CONTENDED_IN_FLIGHT: usize = 1;

/// Keys a bulk txn holds at most while a single-key call is about (else
/// [`MAX_BATCH_KEYS`](crate::batch::MAX_BATCH_KEYS)): what another call waits for at the store
/// is one such txn.
pub(crate) const CONTENDED_BATCH_KEYS: usize = 25;

/// How long a client counts as about after its last call or turn: far longer than the gap
/// between one caller's calls (its own work and a round trip), so a sequential caller is never
/// forgotten between two calls.
pub(crate) const WINDOW: Duration = Duration::from_millis(200);

/// The longest a client rests after a bulk txn while another client's single-key call is about
/// (it rests as long as the txn took, so one client's bulk work has at most half of the store's
/// time; other clients' txns go in its rests). Why: however small, bulk txns sent back to back keep etcd
/// busy (and its periodic backend commits large), and a one-key call waits behind one most of
/// the time; resting as long as each txn took halved the one-key median and p90 under a flood
/// of 1,000-key calls (docs/benchmarks/serve.md). The bound keeps a slow txn (a large page, a
/// retry) from parking a client's bulk work long.
pub(crate) const MAX_REST: Duration = WINDOW;

/// The gate: turns out, waiters queued per client, and who is about.
pub(crate) struct Turns {
    /// Turns out at once when one client's bulk work is alone (`bulk_in_flight`).
    wide: usize,
    st: Mutex<State>,
    /// Single-key calls under way.
    interactive: AtomicUsize,
    /// When the last one ended, in milliseconds since `epoch` (0: never).
    interactive_ended: AtomicU64,
    epoch: Instant,
}

#[derive(Default)]
struct State {
    in_flight: usize,
    /// Each client's waiters, oldest first.
    waiting: HashMap<Arc<str>, VecDeque<oneshot::Sender<Turn>>>,
    /// When each client was last admitted (a tick of `clock`); absent: never, or forgotten
    /// once nothing was in flight.
    served: HashMap<Arc<str>, u64>,
    clock: u64,
    /// Each client's turns out and when it was last seen (admitted, or a turn of it ended), in
    /// milliseconds since `epoch`; forgotten [`WINDOW`] after, with none out.
    about: HashMap<Arc<str>, (usize, u64)>,
    /// Clients resting after a txn ([`MAX_REST`]), until when; dropped once past.
    resting: HashMap<Arc<str>, Instant>,
    /// Each client's single-key calls under way and when its last ended (milliseconds since
    /// `epoch`); forgotten [`WINDOW`] after, with none under way.
    singles: HashMap<Arc<str>, (usize, u64)>,
}

/// A turn at the store, held while a bulk txn is there (retries included).
pub(crate) struct Turn {
    gate: Option<Arc<Turns>>,
    who: Arc<str>,
    /// When it was handed out.
    since: Instant,
}

impl Turn {
    fn new(gate: Option<Arc<Turns>>, who: Arc<str>) -> Turn {
        Turn { gate, who, since: Instant::now() }
    }
}

impl Drop for Turn {
    fn drop(&mut self) {
        let Some(gate) = self.gate.take() else { return };
        // Without a runtime to wake its waiters after a rest, the client does not rest.
        let rt = tokio::runtime::Handle::try_current().ok();
        let rest = rt.as_ref().map(|_| self.since.elapsed().min(MAX_REST));
        let (Some(until), Some(rt)) = (gate.release(&self.who, rest), rt) else { return };
        // Its own waiters go when the rest is over. (Should this task never run, its runtime
        // ending, they go at the next turn that ends or is asked for here: `admit` hands on.)
        rt.spawn(async move {
            tokio::time::sleep_until(until).await;
            let mut st = gate.lock();
            gate.hand_on(&mut st);
        });
    }
}

/// A single-key call under way ([`Turns::interactive`]); its end is noted when dropped.
pub(crate) struct Interactive<'a> {
    gate: &'a Turns,
    who: Arc<str>,
}

impl Drop for Interactive<'_> {
    fn drop(&mut self) {
        let t = self.gate;
        let now = t.millis().max(1);
        t.interactive_ended.store(now, Ordering::Release);
        t.interactive.fetch_sub(1, Ordering::AcqRel);
        let mut st = t.lock();
        if let Some(e) = st.singles.get_mut(&self.who) {
            e.0 = e.0.saturating_sub(1);
            e.1 = now;
        }
    }
}

impl Turns {
    /// A gate of `wide` turns at once (at least 1) when nothing else is about.
    pub(crate) fn new(wide: usize) -> Arc<Turns> {
        Arc::new(Turns {
            wide: wide.max(1),
            st: Mutex::default(),
            interactive: AtomicUsize::new(0),
            interactive_ended: AtomicU64::new(0),
            epoch: Instant::now(),
        })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.st.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn millis(&self) -> u64 {
        u64::try_from(self.epoch.elapsed().as_millis()).unwrap_or(u64::MAX)
    }

    fn recent(&self, at: u64, now: u64) -> bool {
        at != 0 && now.saturating_sub(at) < WINDOW.as_millis() as u64
    }

    /// Notes a single-key call (acquire or release of one key, or a coalesced flight of them)
    /// for as long as the guard lives: while it does and for [`WINDOW`] after, bulk txns yield.
    pub(crate) fn interactive(&self) -> Interactive<'_> {
        self.interactive.fetch_add(1, Ordering::AcqRel);
        let who = current();
        self.lock().singles.entry(who.clone()).or_insert((0, 0)).0 += 1;
        Interactive { gate: self, who }
    }

    /// Whether a single-key call of a client other than `who` is about (under way, or ended
    /// within [`WINDOW`]): `who` then rests after its bulk txns ([`MAX_REST`]). A client's own
    /// single-key calls do not make it rest: what it waits for is its own business.
    fn others_single(&self, st: &mut State, who: &Arc<str>) -> bool {
        let now = self.millis();
        st.singles.retain(|_, (n, at)| *n > 0 || self.recent(*at, now));
        st.singles.keys().any(|w| w != who)
    }

    /// Whether a single-key call is about: under way, or ended within [`WINDOW`].
    pub(crate) fn contended(&self) -> bool {
        self.interactive.load(Ordering::Acquire) > 0
            || self.recent(self.interactive_ended.load(Ordering::Acquire), self.millis())
    }

    /// Clients with bulk work about: turns out, waiting, or seen within [`WINDOW`] (the
    /// others are forgotten).
    fn clients_about(&self, st: &mut State) -> usize {
        let now = self.millis();
        let State { about, waiting, .. } = st;
        about.retain(|w, (out, at)| *out > 0 || waiting.contains_key(w) || self.recent(*at, now));
        about.len()
    }

    /// Turns out at once now, in all and per client: one in all while a single-key call is
    /// about; one per client while two or more clients have bulk work (so each waits for at most
    /// one txn of each other client); else `wide`.
    fn limits(&self, st: &mut State) -> (usize, usize) {
        let clients = self.clients_about(st);
        match (self.contended(), clients > 1) {
            (true, _) => (CONTENDED_IN_FLIGHT.min(self.wide), 1),
            (false, true) => (self.wide, 1),
            (false, false) => (self.wide, self.wide),
        }
    }

    /// Keys a bulk txn packed now may hold: fewer while a single-key call is about.
    pub(crate) fn batch_keys(&self) -> usize {
        match self.contended() {
            true => CONTENDED_BATCH_KEYS,
            false => crate::batch::MAX_BATCH_KEYS,
        }
    }

    /// Whether `who` rests now (rests that are over are forgotten by [`Turns::next_waiter`]).
    fn rests(st: &State, who: &Arc<str>) -> bool {
        st.resting.get(who).is_some_and(|until| *until > Instant::now())
    }

    /// The waiting client to hand a turn to: among those below `per_client` turns out and not
    /// resting, the one served the longest ago.
    fn next_waiter(st: &mut State, per_client: usize) -> Option<Arc<str>> {
        let now = Instant::now();
        st.resting.retain(|_, until| *until > now);
        st.waiting
            .iter()
            .filter(|(w, q)| {
                !q.is_empty()
                    && st.about.get(*w).map_or(0, |a| a.0) < per_client
                    && !st.resting.contains_key(*w)
            })
            .min_by_key(|(w, _)| (st.served.get(*w).copied().unwrap_or(0), w.to_string()))
            .map(|(w, _)| w.clone())
    }

    /// Waits for a turn for the current client ([`as_client`]).
    pub(crate) async fn admit(self: &Arc<Self>) -> Turn {
        let who = current();
        let rx = {
            let mut st = self.lock();
            let now = self.millis();
            let mine = {
                let e = st.about.entry(who.clone()).or_insert((0, now));
                e.1 = now;
                e.0
            };
            let (all, per_client) = self.limits(&mut st);
            if st.in_flight < all
                && mine < per_client
                && !Self::rests(&st, &who)
                && Self::next_waiter(&mut st, per_client).is_none()
            {
                self.hand_out(&mut st, &who);
                return Turn::new(Some(self.clone()), who);
            }
            let (tx, rx) = oneshot::channel();
            st.waiting.entry(who.clone()).or_default().push_back(tx);
            // A waiter whose rest is over goes now if room is left (its wake-up may never have
            // run); otherwise nothing changes.
            self.hand_on(&mut st);
            rx
        };
        match rx.await {
            Ok(turn) => turn,
            // The gate is gone (never while a waiter holds it): go without waiting.
            Err(_) => Turn::new(None, who),
        }
    }

    /// Counts a turn out for `who`.
    fn hand_out(&self, st: &mut State, who: &Arc<str>) {
        st.in_flight += 1;
        st.clock += 1;
        let tick = st.clock;
        st.served.insert(who.clone(), tick);
        let now = self.millis();
        let e = st.about.entry(who.clone()).or_insert((0, now));
        e.0 += 1;
        e.1 = now;
    }

    /// Uncounts a turn of `who` (ended, or never taken by its waiter); `who` was seen now.
    fn give_back(&self, st: &mut State, who: &Arc<str>) {
        st.in_flight = st.in_flight.saturating_sub(1);
        let now = self.millis();
        if let Some(e) = st.about.get_mut(who) {
            e.0 = e.0.saturating_sub(1);
            e.1 = now;
        }
    }

    /// Waiting txns (tests).
    #[cfg(test)]
    fn waiting(&self) -> usize {
        self.lock().waiting.values().map(VecDeque::len).sum()
    }

    /// Turns out (tests).
    #[cfg(test)]
    fn in_flight(&self) -> usize {
        self.lock().in_flight
    }

    /// A turn of `who` ended, held for `rest` (None: no rest is possible): `who` rests that
    /// long if another client's single-key call is about; hands turns on. Returns when the
    /// rest ends, if `who` rests.
    fn release(self: &Arc<Self>, who: &Arc<str>, rest: Option<Duration>) -> Option<Instant> {
        let mut st = self.lock();
        self.give_back(&mut st, who);
        let until = match rest {
            Some(d) if self.others_single(&mut st, who) => Some(Instant::now() + d),
            _ => None,
        };
        if let Some(until) = until {
            st.resting.insert(who.clone(), until);
        }
        self.hand_on(&mut st);
        until
    }

    /// Hands turns to the waiting clients served the longest ago while fewer than the limits
    /// are out (more than one when they have risen since).
    fn hand_on(self: &Arc<Self>, st: &mut State) {
        loop {
            let (all, per_client) = self.limits(st);
            if st.in_flight >= all {
                break;
            }
            let Some(next) = Self::next_waiter(st, per_client) else { break };
            let tx = st.waiting.get_mut(&next).and_then(VecDeque::pop_front);
            if st.waiting.get(&next).is_some_and(VecDeque::is_empty) {
                st.waiting.remove(&next);
            }
            let Some(tx) = tx else { continue };
            self.hand_out(st, &next);
            let turn = Turn::new(Some(self.clone()), next.clone());
            if let Err(mut turn) = tx.send(turn) {
                // That waiter went away: its turn is not out after all.
                turn.gate = None;
                self.give_back(st, &next);
            }
        }
        if st.in_flight == 0 && st.waiting.is_empty() {
            st.served.clear();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Lets spawned tasks run (an ended turn's rest of no time).
    async fn settle() {
        for _ in 0..10 {
            tokio::task::yield_now().await;
        }
    }

    /// Waits (yielding) until `n` txns wait at `gate`.
    async fn until_waiting(gate: &Turns, n: usize) {
        while gate.waiting() < n {
            tokio::task::yield_now().await;
        }
    }

    /// With one turn at a time, a client's 5 queued txns and another's 2: the other's go in
    /// alternation with the first client's, not after all of them.
    #[tokio::test]
    async fn another_clients_txns_alternate_with_a_flooding_clients_queue() {
        let gate = Turns::new(1);
        let first = as_client("flood", gate.admit()).await;
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
        let mut tasks = Vec::new();
        let queue = |who: &'static str, i: usize, tasks: &mut Vec<_>| {
            let (g, tx) = (gate.clone(), tx.clone());
            tasks.push(tokio::spawn(as_client(who, async move {
                let _t = g.admit().await;
                let _ = tx.send(format!("{who}-{i}"));
            })));
        };
        for i in 0..5 {
            queue("flood", i, &mut tasks);
            until_waiting(&gate, i + 1).await;
        }
        for i in 0..2 {
            queue("other", i, &mut tasks);
            until_waiting(&gate, 6 + i).await;
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
        assert_eq!(
            order,
            ["other-0", "flood-0", "other-1", "flood-1", "flood-2", "flood-3", "flood-4"]
        );
        assert_eq!(gate.waiting(), 0);
        assert_eq!(gate.in_flight(), 0, "every turn came back");
    }

    /// A waiter that gives up does not take its turn with it.
    #[tokio::test]
    async fn a_waiter_that_goes_away_frees_its_turn() {
        let gate = Turns::new(1);
        let held = gate.admit().await;
        let g = gate.clone();
        let gone = tokio::spawn(as_client("b", async move {
            let _t = g.admit().await;
        }));
        until_waiting(&gate, 1).await;
        gone.abort();
        let _ = gone.await;
        drop(held);
        let t = tokio::time::timeout(Duration::from_secs(5), gate.admit()).await;
        assert!(t.is_ok(), "the turn came back");
        assert_eq!(gate.in_flight(), 1, "only the new turn is out");
    }

    /// One client alone has every turn; while a single-key call is under way, and for the
    /// window after it, ending turns hand on none until one is out; past the window, one ending
    /// turn lets the wide bound's worth go at once.
    #[tokio::test(start_paused = true)]
    async fn a_single_key_call_narrows_the_turns_for_the_window_after_it() {
        let gate = Turns::new(3);
        let mut out = Vec::new();
        for _ in 0..3 {
            out.push(gate.admit().await);
        }
        assert!(!gate.contended(), "one client alone");
        assert_eq!(gate.batch_keys(), crate::batch::MAX_BATCH_KEYS);
        let mut waiters = Vec::new();
        for i in 0..4 {
            let g = gate.clone();
            waiters.push(tokio::spawn(async move { g.admit().await }));
            until_waiting(&gate, i + 1).await;
        }
        let call = gate.interactive();
        assert!(gate.contended());
        assert_eq!(gate.batch_keys(), CONTENDED_BATCH_KEYS);
        out.pop();
        out.pop();
        settle().await;
        assert_eq!(gate.in_flight(), 1, "two turns ended, none handed on");
        drop(call);
        tokio::time::advance(WINDOW / 2).await;
        out.pop();
        settle().await;
        assert_eq!(gate.in_flight(), 1, "within the window: one turn at a time");
        assert_eq!(gate.waiting(), 3);
        tokio::time::advance(WINDOW).await;
        assert!(!gate.contended());
        drop(waiters.remove(0).await.expect("waiter"));
        assert_eq!(gate.in_flight(), 3, "past the window: three at once again");
        assert_eq!(gate.waiting(), 0);
        for w in waiters {
            drop(w.await.expect("waiter"));
        }
        assert_eq!(gate.in_flight(), 0);
    }

    /// While two clients have bulk work, each has at most one turn out: the second's first
    /// txn goes at once, the first's next waits until it has none out; once the second has been
    /// gone a window, the first has the wide bound again.
    #[tokio::test(start_paused = true)]
    async fn two_clients_with_bulk_work_have_one_turn_out_each() {
        let gate = Turns::new(8);
        let a1 = as_client("a", gate.admit()).await;
        let a2 = as_client("a", gate.admit()).await;
        assert_eq!(gate.in_flight(), 2, "one client alone: wide");
        let b = as_client("b", gate.admit()).await;
        assert_eq!(gate.in_flight(), 3, "b's first went at once");
        let g = gate.clone();
        let a3 = tokio::spawn(as_client("a", async move { g.admit().await }));
        until_waiting(&gate, 1).await;
        drop(a1);
        assert_eq!((gate.in_flight(), gate.waiting()), (2, 1), "a still has one out");
        drop(a2);
        assert_eq!((gate.in_flight(), gate.waiting()), (2, 0), "a's next went");
        drop(b);
        let a3 = a3.await.expect("a3");
        tokio::time::advance(WINDOW * 2).await;
        let more: Vec<Turn> =
            futures::future::join_all((0..3).map(|_| as_client("a", gate.admit()))).await;
        assert_eq!(gate.in_flight(), 4, "b gone a window: a has the wide bound again");
        drop((a3, more));
        assert_eq!(gate.in_flight(), 0);
    }

    /// While another client's single-key call is about, a client whose turn ended rests as
    /// long as it was held (at most `MAX_REST`): its next txn waits, another client's goes at
    /// once; with its own single-key call about, or none, its next goes as the turn ends.
    #[tokio::test(start_paused = true)]
    async fn while_another_clients_single_key_call_is_about_a_client_rests_as_long_as_its_txn_took()
    {
        let gate = Turns::new(1);
        let queue = |gate: &Arc<Turns>, who: &'static str| {
            let g = gate.clone();
            tokio::spawn(as_client(who, async move { g.admit().await }))
        };
        let call = gate.interactive();
        let held = as_client("flood", gate.admit()).await;
        let next = queue(&gate, "flood");
        until_waiting(&gate, 1).await;
        tokio::time::advance(Duration::from_millis(30)).await;
        drop(held);
        tokio::time::advance(Duration::from_millis(29)).await;
        settle().await;
        assert_eq!((gate.in_flight(), gate.waiting()), (0, 1), "resting: its next waits");
        let other = as_client("other", gate.admit()).await;
        assert_eq!(gate.in_flight(), 1, "another client's txn went in the rest");
        drop(other);
        tokio::time::advance(Duration::from_millis(2)).await;
        let held = next.await.expect("next");
        assert_eq!((gate.in_flight(), gate.waiting()), (1, 0), "rested: its next went");

        // A turn held far longer rests MAX_REST only; a new call of the resting client waits too.
        tokio::time::advance(Duration::from_secs(10)).await;
        drop(held);
        let next = queue(&gate, "flood");
        until_waiting(&gate, 1).await;
        tokio::time::advance(MAX_REST - Duration::from_millis(1)).await;
        settle().await;
        assert_eq!(gate.waiting(), 1, "resting");
        tokio::time::advance(Duration::from_millis(2)).await;
        let held = next.await.expect("next");

        // Only its own single-key call about: the next goes as the turn ends.
        drop(call);
        tokio::time::advance(WINDOW * 2).await;
        let own = as_client("flood", async { gate.interactive() }).await;
        assert!(gate.contended(), "its own call narrows the turns");
        let next = queue(&gate, "flood");
        until_waiting(&gate, 1).await;
        tokio::time::advance(Duration::from_millis(30)).await;
        drop(held);
        settle().await;
        assert_eq!((gate.in_flight(), gate.waiting()), (1, 0), "no rest for its own call");
        let held = next.await.expect("next");

        // No single-key call about: the next goes as the turn ends.
        drop(own);
        tokio::time::advance(WINDOW * 2).await;
        assert!(!gate.contended());
        let next = queue(&gate, "flood");
        until_waiting(&gate, 1).await;
        tokio::time::advance(Duration::from_millis(30)).await;
        drop(held);
        settle().await;
        assert_eq!((gate.in_flight(), gate.waiting()), (1, 0), "handed on at once");
        drop(next.await.expect("next"));
        assert_eq!(gate.in_flight(), 0);
    }
}
