//! Read-your-writes on one handle (`Pool::get` used to answer `None` right after an
//! `acquire_durable` on the same handle, under paused time): whether the handle's cache reflects
//! the write it just made, before the store's watch brings it back.

use std::time::Duration;

use idalloc::store::embedded::EmbeddedStore;
use idalloc::{Allocator, AllocatorOptions, PoolSpec};

#[tokio::test(start_paused = true)]
async fn a_handle_reads_its_own_durable_writes_at_once() {
    let alloc = Allocator::new(EmbeddedStore::memory(), AllocatorOptions::default()).unwrap();
    let pool = alloc.ensure_pool(&PoolSpec::new("p", 1, 100)).await.unwrap();
    pool.wait_synced().await.unwrap();
    let a = pool.acquire_durable("k", "cfg").await.unwrap();
    let seen = (pool.get("k"), pool.key_of(a.id));
    // What the watch brings a moment later.
    tokio::time::sleep(Duration::from_millis(100)).await;
    let later = (pool.get("k"), pool.key_of(a.id));
    assert_eq!(later, (Some(a.id), Some("k".to_string())), "the watch brings it");
    assert_eq!(seen, later, "right after the acquire");
}

#[tokio::test(start_paused = true)]
async fn a_handle_reads_its_own_durable_release_at_once() {
    let alloc = Allocator::new(EmbeddedStore::memory(), AllocatorOptions::default()).unwrap();
    let pool = alloc.ensure_pool(&PoolSpec::new("p", 1, 100)).await.unwrap();
    let a = pool.acquire_durable("k", "cfg").await.unwrap();
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(pool.get("k"), Some(a.id));
    let r = pool.release_durable("k", "cfg").await.unwrap();
    assert!(r.held && r.reclaimed, "{r:?}");
    assert_eq!((pool.get("k"), pool.key_of(a.id)), (None, None), "right after the release");
}

/// The batched durable forms read their own writes as the single ones do: every key of an
/// `acquire_many_durable` is in the cache when it returns, and gone after `release_many_durable`.
#[tokio::test(start_paused = true)]
async fn a_handle_reads_its_own_batched_durable_writes_at_once() {
    let alloc = Allocator::new(EmbeddedStore::memory(), AllocatorOptions::default()).unwrap();
    let pool = alloc.ensure_pool(&PoolSpec::new("p", 1, 1000)).await.unwrap();
    pool.wait_synced().await.unwrap();
    let keys: Vec<String> = (0..250).map(|i| format!("k{i}")).collect();
    let got: Vec<u64> = pool
        .acquire_many_durable(&keys, "cfg")
        .await
        .into_iter()
        .map(|r| r.expect("acquired").id)
        .collect();
    let seen: Vec<Option<u64>> = keys.iter().map(|k| pool.get(k)).collect();
    let want: Vec<Option<u64>> = got.iter().map(|id| Some(*id)).collect();
    assert_eq!(seen, want, "right after acquire_many_durable");
    tokio::time::sleep(Duration::from_millis(100)).await;
    let later: Vec<Option<u64>> = keys.iter().map(|k| pool.get(k)).collect();
    assert_eq!(later, want, "the watch brings the same");

    let rel = pool.release_many_durable(&keys, "cfg").await;
    assert!(rel.iter().all(|r| r.as_ref().is_ok_and(|r| r.held && r.reclaimed)), "{rel:?}");
    let seen: Vec<Option<u64>> = keys.iter().map(|k| pool.get(k)).collect();
    assert!(seen.iter().all(Option::is_none), "right after release_many_durable: {seen:?}");
    assert!(got.iter().all(|id| pool.key_of(*id).is_none()));
}

/// A client session's references (the service's sessions) are not in the handle's own holds:
/// its acquires, one key or many, are in the cache when they return.
#[tokio::test(start_paused = true)]
async fn a_handle_reads_a_client_sessions_writes_at_once() {
    let alloc = Allocator::new(EmbeddedStore::memory(), AllocatorOptions::default()).unwrap();
    let pool = alloc.ensure_pool(&PoolSpec::new("p", 1, 1000)).await.unwrap();
    pool.wait_synced().await.unwrap();
    let s = alloc.client_session(Duration::from_secs(30)).await.unwrap();
    let one = s.acquire(&pool, "one").await.unwrap();
    assert_eq!((pool.get("one"), pool.key_of(one.id)), (Some(one.id), Some("one".into())));
    let keys: Vec<String> = (0..150).map(|i| format!("s{i}")).collect();
    let got: Vec<u64> =
        s.acquire_many(&pool, &keys).await.into_iter().map(|r| r.expect("acquired").id).collect();
    let seen: Vec<Option<u64>> = keys.iter().map(|k| pool.get(k)).collect();
    assert_eq!(seen, got.iter().map(|id| Some(*id)).collect::<Vec<_>>(), "right after");
    let r = s.release(&pool, "one").await.unwrap();
    assert!(r.held && r.reclaimed, "{r:?}");
    assert_eq!(pool.get("one"), None, "right after the session's release");
}
