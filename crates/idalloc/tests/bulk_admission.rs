//! Bulk admission (docs/design/bulk-admission.md, "Bulk admission"): the txns of many-key calls
//! (`acquire_many`, `release_many` and their forms) of one allocator go to the store at most
//! `AllocatorOptions::bulk_in_flight` at a time and the rest wait in the process, while a
//! single-key call never waits for them. Why it matters: the store applies txns in arrival order,
//! so without the bound a key's acquire sent during a bulk restore waits behind every txn of it.
//!
//! On the embedded store in real time (a hook holds txns at the store; the paused clock would fire
//! the request timeout of a held txn), through `HookedStore`, which watches every txn the
//! allocator sends.

mod common;

use std::collections::HashSet;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use common::*;
use idalloc::allocator::as_client;
use idalloc::store::embedded::EmbeddedStore;
use idalloc::store::{Store, TxnOp, TxnRequest};
use idalloc::{Allocator, AllocatorOptions, Error, Input, PoolSpec};
use idalloc_testkit::hooked::{send, Answer, Hook, HookedStore, Request};
use tokio::sync::watch;

/// True if any key `txn` compares, reads or writes (nested txns included) contains `needle`.
fn touches(txn: &TxnRequest, needle: &[u8]) -> bool {
    let has = |k: &[u8]| k.windows(needle.len()).any(|w| w == needle);
    txn.compare.iter().any(|c| has(&c.range.key))
        || txn.success.iter().chain(&txn.failure).any(|op| match op {
            TxnOp::Get(g) => has(&g.range.key),
            TxnOp::Put(p) => has(&p.key),
            TxnOp::Delete(r) => has(&r.key),
            TxnOp::Txn(t) => touches(t, needle),
        })
}

/// Counts txns that touch `needle` while at the store (the most at once, every one seen, and the
/// most keys one held: its nested txns); each waits until `open` is true, then `hold` more,
/// before it is sent.
struct Gauge {
    needle: &'static [u8],
    now: AtomicUsize,
    most: AtomicUsize,
    seen: AtomicUsize,
    /// Txns seen that touch keys starting `bulk-b-` (a second client's).
    seen_b: AtomicUsize,
    widest: AtomicUsize,
    open: watch::Receiver<bool>,
    hold: Duration,
}

impl Gauge {
    fn new(needle: &'static [u8], hold: Duration) -> (Gauge, watch::Sender<bool>) {
        let (tx, rx) = watch::channel(true);
        let g = Gauge {
            needle,
            now: AtomicUsize::new(0),
            most: AtomicUsize::new(0),
            seen: AtomicUsize::new(0),
            seen_b: AtomicUsize::new(0),
            widest: AtomicUsize::new(0),
            open: rx,
            hold,
        };
        (g, tx)
    }
}

#[async_trait::async_trait]
impl<S: Store> Hook<S> for Gauge {
    async fn call(&self, inner: &Arc<S>, req: Request) -> Answer {
        let mine = matches!(&req, Request::Txn(t) if touches(t, self.needle));
        if !mine {
            return send(&**inner, req).await;
        }
        self.seen.fetch_add(1, Ordering::SeqCst);
        if let Request::Txn(t) = &req {
            if touches(t, b"/bulk-b-") {
                self.seen_b.fetch_add(1, Ordering::SeqCst);
            }
            let nested = t.success.iter().filter(|op| matches!(op, TxnOp::Txn(_))).count();
            self.widest.fetch_max(nested, Ordering::SeqCst);
        }
        let now = self.now.fetch_add(1, Ordering::SeqCst) + 1;
        self.most.fetch_max(now, Ordering::SeqCst);
        let mut open = self.open.clone();
        let _ = open.wait_for(|o| *o).await;
        tokio::time::sleep(self.hold).await;
        let r = send(&**inner, req).await;
        self.now.fetch_sub(1, Ordering::SeqCst);
        r
    }
}

fn allocator(store: Arc<dyn Store>, bulk_in_flight: usize) -> Result<Allocator, Error> {
    let opts = AllocatorOptions::builder()
        .prefix(layout().prefix().to_string())
        .holder("a")
        .session_ttl(Duration::from_secs(60))
        // Far above the holds below: no attempt times out and is sent twice.
        .request_timeout(Duration::from_secs(60))
        .bulk_in_flight(bulk_in_flight)
        .build()?;
    Allocator::from_arc(store, opts)
}

/// A pool `p` of an allocator with bulk bound `bound` on the embedded store, every txn touching
/// `/bulk` counted and held `hold` by a [`Gauge`] (and until `open`).
struct Setup {
    hooked: Arc<HookedStore<EmbeddedStore, Gauge>>,
    raw: Arc<dyn Store>,
    a: Allocator,
    p: idalloc::Pool,
    open: watch::Sender<bool>,
}

async fn setup(hold: Duration, bound: usize) -> Setup {
    let (gauge, open) = Gauge::new(b"/bulk", hold);
    let hooked = Arc::new(HookedStore::with_hook(EmbeddedStore::memory(), gauge));
    let raw: Arc<dyn Store> = hooked.clone();
    let a = allocator(raw.clone(), bound).expect("allocator");
    let p = a.ensure_pool(&PoolSpec::new("p", 1, 100_000)).await.expect("pool");
    Setup { hooked, raw, a, p, open }
}

fn keys(prefix: &str, n: usize) -> Vec<String> {
    (0..n).map(|i| format!("{prefix}{i}")).collect()
}

/// 1,000 keys are about ten txns of ~100 keys, sent together without the bound: with a bound of
/// 2, never more than 2 of them are at the store, and 2 are (the bound is used, not 1).
#[tokio::test]
async fn a_bulk_call_keeps_at_most_its_bound_of_txns_at_the_store() {
    let Setup { hooked, raw, a, p, open: _open } = setup(Duration::from_millis(20), 2).await;
    p.acquire("warm").await.expect("warm"); // the session lease exists from here on

    let ks = keys("bulk", 1000);
    let got = p.acquire_many(&ks).await;
    let ids: Vec<u64> = got.iter().map(|r| r.as_ref().expect("acquired").id).collect();
    assert_eq!(ids.iter().collect::<HashSet<_>>().len(), 1000, "distinct IDs");
    let g = hooked.hook();
    assert!(g.seen.load(Ordering::SeqCst) >= 10, "1,000 keys went in ~10 txns");
    assert_eq!(g.most.load(Ordering::SeqCst), 2, "acquire_many: bulk txns at the store at once");

    g.most.store(0, Ordering::SeqCst);
    let rel = p.release_many(&ks).await;
    assert!(rel.iter().all(|r| r.as_ref().is_ok_and(|r| r.held && r.reclaimed)), "released");
    assert_eq!(g.most.load(Ordering::SeqCst), 2, "release_many: bulk txns at the store at once");
    for k in ks.iter().step_by(97) {
        assert_eq!(raw_binding_in(&*raw, &layout(), "p", k).await, None, "{k} reclaimed");
    }
    check_g1_in(&*raw, &layout(), "p").await;
    a.close().await.expect("close");
}

/// While a bulk call's txns are held at the store (one, the bound) and queued in the process
/// (the rest), a single-key acquire and release of another key go through: they are not queued
/// behind the bulk work. The bulk call then completes whole.
#[tokio::test]
async fn a_single_key_call_passes_the_queued_bulk_txns() {
    let Setup { hooked, raw, a, p, open } = setup(Duration::ZERO, 1).await;
    p.acquire("warm").await.expect("warm");

    open.send_replace(false);
    let bulk = tokio::spawn({
        let p = p.clone();
        async move { p.acquire_many(&keys("bulk", 500)).await }
    });
    let g = hooked.hook();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    while g.seen.load(Ordering::SeqCst) == 0 {
        assert!(tokio::time::Instant::now() < deadline, "the bulk call sent nothing in 30 s");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let single = tokio::time::timeout(Duration::from_secs(30), async {
        let got = p.acquire("single").await.expect("single acquire");
        p.release("single").await.expect("single release");
        got
    })
    .await
    .expect("a single-key acquire waited for the held bulk txns");
    assert!(single.new);
    assert_eq!(
        g.seen.load(Ordering::SeqCst),
        1,
        "500 keys are 5 txns: 1 at the store, the other 4 wait in the process"
    );
    assert!(!bulk.is_finished(), "the bulk call is still held");

    open.send_replace(true);
    let got = bulk.await.expect("bulk task");
    assert!(got.iter().all(|r| r.as_ref().is_ok_and(|a| a.new)), "every bulk key acquired");
    assert!(g.seen.load(Ordering::SeqCst) >= 5);
    assert_eq!(g.most.load(Ordering::SeqCst), 1);
    check_g1_in(&*raw, &layout(), "p").await;
    a.close().await.expect("close");
}

/// A sweep's reclaims are bulk store work too: 1,000 idle keys are 25 reclaim txns, sent 8 at
/// once without admission; with a bound of 2, at most 2 are at the store, and every key is
/// reclaimed.
#[tokio::test]
async fn a_sweep_keeps_at_most_the_bound_of_reclaim_txns_at_the_store() {
    let (gauge, _open) = Gauge::new(b"/bulk", Duration::from_millis(20));
    let hooked = Arc::new(HookedStore::with_hook(EmbeddedStore::memory(), gauge));
    let raw: Arc<dyn Store> = hooked.clone();
    let a = allocator(raw.clone(), 2).expect("allocator");
    let spec = PoolSpec::new("p", 1, 100_000).idle_grace(Duration::from_millis(50));
    let p = a.ensure_pool(&spec).await.expect("pool");
    let ks = keys("bulk", 1000);
    assert!(p.acquire_many(&ks).await.iter().all(|r| r.is_ok()), "acquired");
    let rel = p.release_many(&ks).await;
    assert!(rel.iter().all(|r| r.as_ref().is_ok_and(|r| r.held && !r.reclaimed)), "left idle");
    // The first sweep sees the keys idle; the grace runs from there.
    assert_eq!(p.sweep().await.expect("sweep").reclaimed.len(), 0, "within the grace");
    tokio::time::sleep(Duration::from_millis(60)).await;

    let g = hooked.hook();
    g.most.store(0, Ordering::SeqCst);
    let report = p.sweep().await.expect("sweep");
    assert_eq!(report.reclaimed.len(), 1000, "every idle key reclaimed");
    assert_eq!(g.most.load(Ordering::SeqCst), 2, "reclaim txns at the store at once");
    for k in ks.iter().step_by(97) {
        assert_eq!(raw_binding_in(&*raw, &layout(), "p", k).await, None, "{k} reclaimed");
    }
    check_g1_in(&*raw, &layout(), "p").await;
    a.close().await.expect("close");
}

/// A sweep's page reads are bulk store work too (a page of a thousand records costs etcd about
/// as much as a bulk txn): with a bound of 1 and a bulk txn held at the store, the sweep reads
/// no page until that txn's turn ends, and so counts the bulk call's keys.
#[tokio::test]
async fn a_sweeps_page_reads_wait_for_a_bulk_turn() {
    let Setup { hooked, raw, a, p, open } = setup(Duration::ZERO, 1).await;
    p.acquire("warm").await.expect("warm");
    let g = hooked.hook();
    open.send_replace(false);
    let bulk = tokio::spawn({
        let p = p.clone();
        async move { p.acquire_many(&keys("bulk", 10)).await }
    });
    let at_store = async {
        while g.now.load(Ordering::SeqCst) == 0 {
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
    };
    tokio::time::timeout(Duration::from_secs(10), at_store).await.expect("bulk txn at the store");
    let sweep = tokio::spawn({
        let p = p.clone();
        async move { p.sweep().await }
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(!sweep.is_finished(), "the sweep read its pages beside the held bulk txn");
    open.send_replace(true);
    assert!(bulk.await.expect("bulk task").iter().all(Result::is_ok), "acquired");
    let report = sweep.await.expect("sweep task").expect("sweep");
    assert_eq!(report.bindings, 11, "the sweep read after the bulk txn: warm and 10 keys");
    check_g1_in(&*raw, &layout(), "p").await;
    a.close().await.expect("close");
}

/// Single-key calls going on beside a bulk call (one after another, as a caller's do): the bulk
/// call's txns go one at a time and hold at most 25 keys each, so a single key waits at the store
/// for one small txn at most; alone, the same call has 4 txns of ~100 keys at the store at once.
#[tokio::test]
async fn bulk_txns_go_one_at_a_time_and_smaller_while_single_key_calls_go_on() {
    let Setup { hooked, raw, a, p, open: _open } = setup(Duration::from_millis(5), 4).await;
    p.acquire("warm").await.expect("warm");
    // Past the window of the warm-up call: the bulk call is alone.
    tokio::time::sleep(Duration::from_millis(400)).await;
    let g = hooked.hook();
    let alone = p.acquire_many(&keys("bulk-alone-", 1000)).await;
    assert!(alone.iter().all(Result::is_ok), "acquired alone");
    assert_eq!(g.most.load(Ordering::SeqCst), 4, "alone: the bound of 4 at the store at once");
    assert!(g.widest.load(Ordering::SeqCst) > 25, "alone: txns of more than 25 keys");

    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let singles = tokio::spawn({
        let (p, stop) = (p.clone(), stop.clone());
        async move {
            let mut n = 0u32;
            while !stop.load(Ordering::SeqCst) {
                let k = format!("single-{n}");
                p.acquire(&k).await.expect("single acquire");
                p.release(&k).await.expect("single release");
                n += 1;
            }
            n
        }
    });
    while !singles.is_finished() && g.seen.load(Ordering::SeqCst) == 0 {
        tokio::task::yield_now().await;
    }
    // A single-key call has been made: from here the bulk call yields.
    tokio::time::sleep(Duration::from_millis(20)).await;
    g.most.store(0, Ordering::SeqCst);
    g.widest.store(0, Ordering::SeqCst);
    let seen = g.seen.load(Ordering::SeqCst);
    let beside = p.acquire_many(&keys("bulk-beside-", 1000)).await;
    stop.store(true, Ordering::SeqCst);
    let n = singles.await.expect("single-key task");
    assert!(beside.iter().all(Result::is_ok), "acquired beside single-key calls");
    assert!(n > 0, "single-key calls went on");
    assert!(g.seen.load(Ordering::SeqCst) - seen >= 40, "1,000 keys in txns of at most 25");
    assert_eq!(g.most.load(Ordering::SeqCst), 1, "one bulk txn at the store at once");
    assert!(
        g.widest.load(Ordering::SeqCst) <= 25,
        "{} keys in one txn",
        g.widest.load(Ordering::SeqCst)
    );
    check_g1_in(&*raw, &layout(), "p").await;
    a.close().await.expect("close");
}

/// Two clients' bulk calls at once ([`as_client`]): they take turns at the store, so while the
/// second client's small call runs, the first client's big one (3,000 keys: ~30 txns, queued
/// ahead of it) sends about as many txns as the second's, not all of its own; alone, the first
/// client has the whole bound at the store.
#[tokio::test]
async fn two_clients_bulk_calls_take_turns_at_the_store() {
    let Setup { hooked, raw, a, p, open: _open } = setup(Duration::from_millis(5), 4).await;
    let g = hooked.hook();
    let big = tokio::spawn({
        let p = p.clone();
        as_client("a", async move { p.acquire_many(&keys("bulk-a-", 3000)).await })
    });
    while g.most.load(Ordering::SeqCst) < 4 {
        assert!(!big.is_finished(), "the first client never had 4 txns at the store");
        tokio::task::yield_now().await;
    }
    let before = g.seen.load(Ordering::SeqCst);
    let small = as_client("b", p.acquire_many(&keys("bulk-b-", 200))).await;
    let (all, b) = (g.seen.load(Ordering::SeqCst) - before, g.seen_b.load(Ordering::SeqCst));
    assert!(small.iter().all(Result::is_ok), "the second client's keys acquired");
    assert!(b >= 2, "200 keys are 2 txns or more: {b}");
    assert!(!big.is_finished(), "the second client's call ended before the first's");
    // The first client's 4 already at the store, then one of its txns per turn of the second.
    assert!(all - b <= b + 4, "the first client sent {} txns while the second sent {b}", all - b);
    let got = big.await.expect("first client");
    assert!(got.iter().all(Result::is_ok), "the first client's keys acquired");
    check_g1_in(&*raw, &layout(), "p").await;
    a.close().await.expect("close");
}

#[tokio::test]
async fn zero_bulk_txns_in_flight_is_refused_with_what_is_allowed() {
    let raw: Arc<dyn Store> = Arc::new(EmbeddedStore::memory());
    let Err(e) = allocator(raw, 0) else { panic!("bulk_in_flight 0 was accepted") };
    assert!(matches!(e, Error::InvalidInput { input: Input::Options, .. }), "{e:?}");
    let msg = e.to_string();
    assert!(msg.contains("bulk") && msg.contains("at least 1"), "{msg}");
}
