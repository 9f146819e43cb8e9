//! A remote view's subscribers get a snapshot, then changes (issue 19 item 4): a subscriber that
//! is there before the view's first listing receives every binding of the listing and one
//! `Synced`, and is never told it lagged because of the listing, however small its buffer. The
//! remote is a real store (the embedded store in memory) with its own allocator.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use idalloc::store::embedded::EmbeddedStore;
use idalloc::store::Store;
use idalloc::{Allocator, AllocatorOptions, Cluster, Event, Pool, PoolSpec, RemoteOptions};

const POOL: &str = "ids";

/// The local pool (one binding) and cluster b's store with `remote_keys` bindings.
async fn clusters(
    buffer: usize,
    remote_keys: usize,
) -> (Allocator, Pool, Arc<dyn Store>, Allocator, Pool) {
    let opts = AllocatorOptions { event_buffer: buffer, ..AllocatorOptions::default() };
    let local = Allocator::new(EmbeddedStore::memory(), opts).unwrap();
    let pool = local.ensure_pool(&PoolSpec::new(POOL, 1, 0xffff).prefix(1 << 16)).await.unwrap();
    pool.wait_synced().await.unwrap();
    pool.acquire_durable("local-key", "h").await.unwrap();
    let raw: Arc<dyn Store> = Arc::new(EmbeddedStore::memory());
    let remote = Allocator::from_arc(raw.clone(), AllocatorOptions::default()).unwrap();
    let rpool = remote.ensure_pool(&PoolSpec::new(POOL, 1, 0xffff).prefix(2 << 16)).await.unwrap();
    let keys: Vec<String> = (0..remote_keys).map(|i| format!("k{i}")).collect();
    for r in rpool.acquire_many_durable(&keys, "h").await {
        r.unwrap();
    }
    (local, pool, raw, remote, rpool)
}

#[tokio::test]
async fn subscribers_before_the_first_listing_get_every_binding_then_synced_without_lagging() {
    // 200 remote bindings, buffers of 8 messages: the old per-binding events overflowed both.
    let (_local, pool, raw, _remote, rpool) = clusters(8, 200).await;
    let mut all = pool.cluster_events();
    let opts = RemoteOptions { event_buffer: 8, ..RemoteOptions::default() };
    let view = pool.watch_remote("b", raw, opts).await.unwrap();
    // On this current-thread runtime the view's follower has not run yet: this subscriber is
    // there before the listing.
    assert!(view.is_empty());
    let mut one = view.events();

    let mut got = BTreeMap::new();
    loop {
        let e = tokio::time::timeout(Duration::from_secs(10), one.recv()).await.unwrap().unwrap();
        match e {
            Event::Upsert { id, key } => assert!(got.insert(id, key).is_none()),
            Event::Synced => break,
            other => panic!("before Synced: {other:?}"),
        }
    }
    let want: BTreeMap<u64, String> = rpool.snapshot().into_iter().collect();
    assert_eq!(want.len(), 200);
    assert_eq!(got, want);

    // The all-clusters subscription: local replay, then b's listing, each ending in one Synced.
    let mut per: BTreeMap<Cluster, (usize, usize)> = BTreeMap::new();
    while per.values().filter(|(_, synced)| *synced > 0).count() < 2 {
        let e = tokio::time::timeout(Duration::from_secs(10), all.recv()).await.unwrap().unwrap();
        let slot = per.entry(e.cluster.clone()).or_default();
        match e.event {
            Event::Upsert { .. } => slot.0 += 1,
            Event::Synced => slot.1 += 1,
            other => panic!("{}: {other:?}", e.cluster),
        }
    }
    assert_eq!(per[&Cluster::Local], (1, 1));
    assert_eq!(per[&view.cluster()], (200, 1));

    // Then changes, in order.
    let id = rpool.acquire_durable("late", "h").await.unwrap().id;
    let e = tokio::time::timeout(Duration::from_secs(10), one.recv()).await.unwrap().unwrap();
    assert_eq!(e, Event::Upsert { id, key: "late".into() });
}
