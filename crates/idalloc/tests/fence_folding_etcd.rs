//! Fence folding, chaos-style on a real 3-member etcd: 1,000 distinct durable holder names come
//! and go on one pool (each acquires a key and releases it once) while members are paused longer
//! than the clients' request timeout (so attempts are retried elsewhere and applied late, DESIGN
//! §11) and a sweeper folds fence records above a small threshold. Afterwards: nothing leaked (no
//! reference, no binding: every late create failed its fences, the fold's floor included), G1 holds,
//! and the fence records left are at most the threshold, plus the one floor, instead of one per
//! name (docs/design/fences.md).
//!
//! Why here and not in `idalloc-chaos`: that crate's run drives separate client processes whose
//! histories a linearizability checker replays per key; this property is about record counts, not
//! histories, and needs only one process's allocators against the same kind of cluster and the
//! same member pauses.

mod common;

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use idalloc::layout::Layout;
use idalloc::store::etcd::{EtcdOptions, EtcdStore};
use idalloc::{Allocator, AllocatorOptions, PoolSpec};
use idalloc_testkit::etcd::{etcd_or_skip, EtcdCluster};
use idalloc_testkit::g1::{assert_g1, read_pool};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

const NAMES: usize = 1000;
const WORKERS: usize = 8;
const KEYS: usize = 12;
/// The sweeper folds when it finds more fence records than this.
const FOLD_ABOVE: usize = 16;

async fn connect(endpoints: Vec<String>) -> EtcdStore {
    let mut o = EtcdOptions::new(endpoints);
    o.connect_timeout = Duration::from_secs(1);
    o.request_timeout = Duration::from_secs(1);
    EtcdStore::connect(o).await.expect("connect")
}

fn alloc(store: Arc<EtcdStore>, layout: &Layout, holder: &str, fold_above: usize) -> Allocator {
    let opts = AllocatorOptions::builder()
        .prefix(layout.prefix().to_string())
        .holder(holder.to_string())
        .request_timeout(Duration::from_secs(1))
        .fold_fences_above(fold_above)
        .build()
        .unwrap();
    Allocator::from_arc(store, opts).expect("allocator")
}

/// Retries `f` until it succeeds (errors are expected while a member is paused).
async fn until_ok<T, F, Fut>(what: &str, mut f: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = idalloc::Result<T>>,
{
    for _ in 0..200 {
        match f().await {
            Ok(t) => return t,
            Err(e) => {
                assert!(matches!(e, idalloc::Error::Unavailable { .. }), "{what}: {e:?}");
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    }
    panic!("{what}: no success in 200 attempts");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_thousand_holder_names_leave_a_bounded_number_of_fence_records() {
    if !etcd_or_skip("the fence-folding run") {
        return;
    }
    let mut cluster = EtcdCluster::start(3).await.expect("start a 3-member etcd");
    let store = Arc::new(connect(cluster.endpoints()).await);
    let layout = Layout::new("fold").expect("layout");
    let admin = alloc(store.clone(), &layout, "admin", FOLD_ABOVE);
    admin.init_pool(&PoolSpec::new("p", 1, 1000)).await.expect("pool");
    idalloc::cluster_version::finalize(&*store, &layout, std::time::Duration::ZERO)
        .await
        .expect("finalize");

    let next = Arc::new(AtomicUsize::new(0));
    let failed_acquires = Arc::new(AtomicUsize::new(0));
    let done = Arc::new(AtomicBool::new(false));
    let mut workers = Vec::new();
    for w in 0..WORKERS {
        let a = alloc(store.clone(), &layout, &format!("worker-{w}"), FOLD_ABOVE);
        let next = next.clone();
        let failed_acquires = failed_acquires.clone();
        workers.push(tokio::spawn(async move {
            let pool = until_ok("open", || a.pool("p")).await;
            loop {
                let i = next.fetch_add(1, Ordering::SeqCst);
                if i >= NAMES {
                    break;
                }
                let holder = format!("run-{i:04}");
                let key = format!("k{}", i % KEYS);
                // An acquire that failed may still commit late: the release below (which bumps
                // the holder's fence) must make it fail, across folds too.
                if pool.acquire_durable(&key, &holder).await.is_err() {
                    failed_acquires.fetch_add(1, Ordering::SeqCst);
                }
                until_ok("release", || pool.release_durable(&key, &holder)).await;
            }
            a.close().await.ok();
        }));
    }
    // The sweeper: folds above FOLD_ABOVE, and counts what it folded.
    let sweeper = {
        let a = alloc(store.clone(), &layout, "sweeper", FOLD_ABOVE);
        let done = done.clone();
        tokio::spawn(async move {
            let pool = until_ok("open", || a.pool("p")).await;
            let (mut folded, mut folds) = (0, 0);
            while !done.load(Ordering::SeqCst) {
                if let Ok(r) = pool.sweep().await {
                    folded += r.folded;
                    folds += usize::from(r.folded > 0);
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            (pool, folded, folds)
        })
    };
    // Faults: pause a member longer than the request timeout, again and again.
    let mut rng = StdRng::seed_from_u64(19);
    let mut pauses = 0;
    while next.load(Ordering::SeqCst) < NAMES {
        let m = rng.random_range(0..3);
        cluster.pause_member(m).expect("pause");
        tokio::time::sleep(Duration::from_millis(rng.random_range(1200..2000))).await;
        cluster.resume_member(m).expect("resume");
        pauses += 1;
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    for w in workers {
        w.await.expect("worker");
    }
    // Late commits land within a few seconds of the last pause.
    tokio::time::sleep(Duration::from_secs(5)).await;
    done.store(true, Ordering::SeqCst);
    let (pool, mut folded, folds) = sweeper.await.expect("sweeper");
    let last = until_ok("final sweep", || pool.sweep()).await;
    folded += last.folded;

    let snap = read_pool(&*store, &layout, "p").await.expect("read the pool");
    assert_g1(&*store, &layout, "p").await;
    let refs: usize = snap.refs.values().map(|h| h.len()).sum();
    assert_eq!((refs, snap.keys.len()), (0, 0), "a late create leaked: {:?}", snap.refs);
    // Every name's release wrote its record; each was folded or is still there. A fold whose
    // answer was lost in a pause (its sweep failed, or its retry found the records gone) is not
    // counted, so `folded` is a lower bound: most, not all, of the names must show up in it.
    assert!(folded + snap.fences.len() > NAMES / 2, "{folded} folded, {} left", snap.fences.len());
    assert!(folds >= 2, "the run must fold more than once (folded {folds} times)");
    // The documented bound: after a sweep with nothing running, at most the fold threshold.
    assert!(
        snap.fences.len() <= FOLD_ABOVE,
        "{} fence records left, the bound is {FOLD_ABOVE}",
        snap.fences.len()
    );
    assert!(snap.fence_floor.is_some(), "the folds left the floor");
    eprintln!(
        "fence folding: {NAMES} holder names, {pauses} member pauses, {} acquires failed (may \
         have committed late), {folds} folds of {folded} records, {} fence records and 1 floor \
         left (bound {FOLD_ABOVE})",
        failed_acquires.load(Ordering::SeqCst),
        snap.fences.len()
    );
    admin.close().await.ok();
}
