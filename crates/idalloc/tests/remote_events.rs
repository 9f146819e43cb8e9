//! A remote view's subscribers get a snapshot, then changes: a subscriber that
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
    let opts = AllocatorOptions::builder().event_buffer(buffer).build().unwrap();
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
    let opts = RemoteOptions::builder().event_buffer(8).build().unwrap();
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

/// Validators are told the kind of change, deletes reach them, and a rejected
/// delete keeps the binding shown (as Cilium's cache validators skip a rejected event) — through
/// a watch event and through a re-listing after an outage; an accepted delete removes it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deletes_reach_the_validators_and_a_refused_delete_keeps_the_binding() {
    use idalloc::remote::{ChangeKind, Validator};
    use idalloc_testkit::fault::{FaultConfig, FaultStore};
    use std::sync::Mutex;

    let (_local, pool, raw, _remote, rpool) = clusters(4096, 0).await;
    let keep = rpool.acquire_durable("keep-me", "h").await.unwrap().id;
    let gone = rpool.acquire_durable("let-go", "h").await.unwrap().id;
    let asked: Arc<Mutex<Vec<(ChangeKind, u64, String)>>> = Arc::default();
    let log = asked.clone();
    let guard: Validator = Arc::new(move |kind, id, key: &str| {
        log.lock().unwrap().push((kind, id, key.to_string()));
        match kind {
            ChangeKind::Delete if key.starts_with("keep") => Err(format!("{key} is vouched for")),
            _ => Ok(()),
        }
    });
    let faulty = Arc::new(FaultStore::new(raw, 1, FaultConfig::default()).unwrap());
    let opts = RemoteOptions::builder()
        .validators(vec![guard])
        .probe_interval(Duration::from_millis(100))
        .request_timeout(Duration::from_millis(500))
        .build()
        .unwrap();
    let view = pool.watch_remote("b", faulty.clone() as Arc<dyn Store>, opts).await.unwrap();
    tokio::time::timeout(Duration::from_secs(10), view.wait_synced()).await.expect("synced");
    assert_eq!(view.len(), 2);
    assert!(asked.lock().unwrap().contains(&(ChangeKind::Upsert, keep, "keep-me".into())));

    // Both bindings deleted in b: the view asks about each; one delete is refused.
    let mut events = view.events();
    for _ in 0..3 {
        events.recv().await.unwrap(); // the replay: two upserts and Synced
    }
    rpool.release_durable("keep-me", "h").await.unwrap();
    rpool.release_durable("let-go", "h").await.unwrap();
    let e = tokio::time::timeout(Duration::from_secs(10), events.recv()).await.unwrap().unwrap();
    assert_eq!(e, Event::Delete { id: gone, key: "let-go".into() });
    assert!(rpool.key_of(keep).is_none() && rpool.key_of(gone).is_none(), "both gone in b");
    let deletes = |a: &Mutex<Vec<(ChangeKind, u64, String)>>| {
        a.lock()
            .unwrap()
            .iter()
            .filter(|(k, ..)| *k == ChangeKind::Delete)
            .cloned()
            .collect::<Vec<_>>()
    };
    let seen = deletes(&asked);
    assert!(seen.contains(&(ChangeKind::Delete, gone, "let-go".into())), "{seen:?}");
    assert!(seen.contains(&(ChangeKind::Delete, keep, "keep-me".into())), "{seen:?}");
    assert_eq!(view.key_of(keep).as_deref(), Some("keep-me"), "a refused delete keeps the binding");
    assert_eq!(view.key_of(gone), None);
    assert!(view.dropped() >= 1);

    // A re-listing after an outage lacks the binding too: asked again, kept again.
    asked.lock().unwrap().clear();
    faulty.partition(true);
    tokio::time::timeout(Duration::from_secs(10), view.wait_stale()).await.expect("stale");
    faulty.partition(false);
    tokio::time::timeout(Duration::from_secs(10), view.wait_synced()).await.expect("resynced");
    assert_eq!(deletes(&asked), vec![(ChangeKind::Delete, keep, "keep-me".into())]);
    assert_eq!(view.snapshot(), vec![(keep, "keep-me".to_string())]);
}
