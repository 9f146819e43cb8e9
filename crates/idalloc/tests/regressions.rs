//! Regression tests for bugs the chaos test on a real etcd cluster found (docs/chaos.md). Each is
//! named after its bug and reproduces it deterministically on the embedded store.

mod common;

use std::sync::Arc;
use std::time::Duration;

use idalloc::store::embedded::EmbeddedStore;
use idalloc::{PoolSpec, Released, Strategy};
use idalloc_testkit::hooks::{freezable, late_commit};

use common::{allocator, check_g1, count_refs, raw_binding, wait_until};

/// Bug: `release_durable` takes the key's ID from the watch-fed cache. When the cache lags (the
/// watch stalls) and the key was re-bound to another ID meanwhile, the release txn's compare on the
/// key record fails, its else branch only deletes the reference, and the binding is left with no
/// reference at all: the last holder's release reports `reclaimed: false` (not linearizable) and
/// the binding leaks (G4) when the pool has no idle grace and no sweeper runs.
#[tokio::test(start_paused = true)]
async fn durable_release_with_a_stale_cache_still_reclaims() {
    let shared = EmbeddedStore::memory();
    let store = Arc::new(shared.clone());
    // Only B's watch freezes; A sees every change.
    let b_store = Arc::new(freezable(shared));
    let a = allocator(store.clone(), "node-a");
    let b = allocator(b_store.clone(), "node-b");
    let spec = PoolSpec::new("p", 1, 10).strategy(Strategy::Lowest);
    let pa = a.ensure_pool(&spec).await.unwrap();
    let pb = b.ensure_pool(&spec).await.unwrap();
    pa.wait_synced().await.unwrap();
    pb.wait_synced().await.unwrap();

    // B binds k -> 1 and its cache sees it; then B's watch stalls.
    assert_eq!(pb.acquire_durable("k", "hb").await.unwrap().id, 1);
    wait_until(|| pb.get("k") == Some(1) && pa.get("k") == Some(1)).await;
    b_store.hook().freeze(true);

    // B releases k (reclaimed), A binds another key to the freed ID 1, and B binds k again: the
    // store moves it to ID 2, but B's cache still says k -> 1.
    assert_eq!(
        pb.release_durable("k", "hb").await.unwrap(),
        Released { held: true, reclaimed: true }
    );
    wait_until(|| pa.get("k").is_none()).await;
    assert_eq!(pa.acquire_durable("f", "ha").await.unwrap().id, 1);
    assert_eq!(pb.acquire_durable("k", "hb").await.unwrap().id, 2);
    assert_eq!(pb.get("k"), Some(1), "the test needs B's cache to be stale");

    // B is the only holder of k: its release must reclaim the binding.
    let r = pb.release_durable("k", "hb").await.unwrap();
    assert_eq!(r, Released { held: true, reclaimed: true });
    assert_eq!(raw_binding(&*store, "p", "k").await, None, "k must not stay bound without holders");
    assert_eq!(count_refs(&*store, "p").await, 1, "only A's reference to f is left");
    check_g1(&*store, "p").await;

    b_store.hook().freeze(false);
    tokio::time::sleep(Duration::from_millis(50)).await;
    wait_until(|| pb.get("k").is_none()).await;
}

/// Found by simulation seed 30 (docs/simulation.md): a node whose cache still showed an ID under
/// the key it used to belong to moved a key that another node had just bound to that ID onto a
/// second ID, leaving two ID records for one key (G1) and the other holders with a `Conflict`
/// without any data loss. Bites with both defences removed (the bind trusting a cached "not ours",
/// and the move's txn not pinning the other key's ID record).
#[tokio::test(start_paused = true)]
async fn stale_cache_must_not_move_a_key_off_its_id() {
    let shared = EmbeddedStore::memory();
    let store = Arc::new(shared.clone());
    let a_store = Arc::new(freezable(shared));
    let spec = PoolSpec::new("p", 1, 10).strategy(Strategy::Lowest);
    let b = allocator(store.clone(), "b");
    let pb = b.ensure_pool(&spec).await.unwrap();
    assert_eq!(pb.acquire("other").await.unwrap().id, 1);
    let a = allocator(a_store.clone(), "a");
    let pa = a.pool("p").await.unwrap();
    wait_until(|| pa.key_of(1).as_deref() == Some("other")).await;
    a_store.hook().freeze(true);

    // ID 1 changes hands behind a's back.
    assert!(pb.release("other").await.unwrap().reclaimed);
    wait_until(|| pb.key_of(1).is_none()).await;
    assert_eq!(pb.acquire("k").await.unwrap().id, 1);
    assert_eq!(pa.key_of(1).as_deref(), Some("other"), "the test needs a's cache to be stale");

    let got = pa.acquire("k").await.unwrap();
    assert_eq!((got.id, got.new), (1, false), "a joins the binding the store has");
    assert_eq!(raw_binding(&*store, "p", "k").await, Some(1));
    check_g1(&*store, "p").await;
    a_store.hook().freeze(false);
}

/// Found by the chaos test with etcd members paused longer than the client's request timeout: a
/// bind txn that timed out on the client but was applied after its retry succeeded and after the
/// holder released the key again re-created the holder's reference. Binds that join an existing
/// binding now carry a fence (the key record unchanged since a revision seen before sending) and
/// every release rewrites the key record, so the late attempt fails.
#[tokio::test(start_paused = true)]
async fn late_commit_of_a_timed_out_acquire_does_not_resurrect_a_released_reference() {
    let shared = EmbeddedStore::memory();
    let store = Arc::new(late_commit(shared.clone(), Duration::from_secs(5)));
    let a = common::allocator_with(store.clone(), "node-a", |o| {
        o.request_timeout = Duration::from_secs(1)
    });
    let pool = a.ensure_pool(&PoolSpec::new("p", 1, 10)).await.unwrap();
    let id = pool.acquire_durable("k", "other").await.unwrap().id;
    // The cache knows the binding, so the bind is a join: `If key/k == id ∧ id/id == k`.
    wait_until(|| pool.get("k") == Some(id)).await;

    store.hook().arm();
    // The first attempt hangs and is retried after the timeout; the retry succeeds.
    assert_eq!(pool.acquire_durable("k", "h").await.unwrap().id, id);
    assert_eq!(
        pool.release_durable("k", "h").await.unwrap(),
        Released { held: true, reclaimed: false }
    );
    // The held-back first attempt lands now.
    tokio::time::sleep(Duration::from_secs(10)).await;
    assert_eq!(count_refs(&shared, "p").await, 1, "only the other holder's reference may be left");
}
