//! Read-your-writes on one handle (session 5 noticed `Pool::get` answer `None` right after an
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
