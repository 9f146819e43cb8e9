//! One key costs O(1), not O(pool). A process that opens its pools lazily
//! (`AllocatorOptions::lazy_view`, what the CLI's one-key commands do) acquires, releases and
//! reads one key without listing the pool: the same requests in a pool of 200 bindings as in one
//! of 2,000. And lazy binders, which guess candidates instead of picking from a view, keep G1
//! against each other and against a process with the full view. Runs on the memory store and a
//! real etcd (started by the testkit when `IDALLOC_TEST_ETCD` is unset).

mod common;

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use common::backends::{allocator_on, env, on_backends, Backend};
use common::*;
use idalloc::layout::Layout;
use idalloc::store::Store;
use idalloc::{Allocator, AllocatorOptions, Error, PoolSpec, Strategy};
use idalloc_testkit::counting::{CountingStore, RoundTrips};

on_backends!(
    [Memory, Etcd],
    [
        one_key_costs_the_same_in_a_small_and_a_large_pool,
        lazy_binders_racing_agree,
        lowest_pool_bound_key_costs_the_same_in_a_small_and_a_large_pool,
        lowest_pool_new_key_takes_the_lowest_free_id,
        lazy_lowest_binders_racing_agree
    ]
);

/// An allocator that opens its pools lazily, with a fixed seed (reproducible guesses).
fn lazy(store: Arc<dyn Store>, l: &Layout, holder: &str, seed: u64) -> Allocator {
    lazy_paged(store, l, holder, seed, AllocatorOptions::default().list_page)
}

/// [`lazy`] with listing pages of `list_page` records.
fn lazy_paged(
    store: Arc<dyn Store>,
    l: &Layout,
    holder: &str,
    seed: u64,
    list_page: i64,
) -> Allocator {
    let opts = AllocatorOptions::builder()
        .prefix(l.prefix().to_string())
        .holder(holder.to_string())
        .seed(seed)
        .lazy_view(true)
        .list_page(list_page)
        .build()
        .unwrap();
    Allocator::from_arc(store, opts).expect("allocator")
}

/// What one-key operations on a lazily opened pool cost and saw.
struct OneKey {
    /// Requests of each operation, in order.
    requests: Vec<RoundTrips>,
    /// `get` of another holder's key from the cache, before and after `wait_synced`.
    cached_before: Option<u64>,
    cached_after: Option<u64>,
}

/// Runs each one-key operation on a lazily opened pool `pool`, counting its requests.
async fn one_key_requests(store: Arc<dyn Store>, l: &Layout, pool: &str) -> OneKey {
    let counted = Arc::new(CountingStore::new(store));
    let a = lazy(counted.clone(), l, "cli", 7);
    let mut seen = Vec::new();
    let mut step = |c: &CountingStore<Arc<dyn Store>>| {
        seen.push(c.counts());
        c.reset();
    };
    counted.reset();
    let p = a.pool(pool).await.expect("pool");
    step(&counted);
    let got = p.acquire_durable("new-key", "cli").await.expect("acquire a new key");
    assert!(got.new);
    step(&counted);
    // A key another holder bound (the fill's): the create finds it, the join takes it.
    let old = p.acquire_durable("fill-7", "cli").await.expect("acquire a bound key");
    assert!(!old.new);
    step(&counted);
    assert_eq!(p.get_consistent("fill-7").await.expect("get"), Some(old.id));
    step(&counted);
    assert_eq!(p.key_of_consistent(old.id).await.expect("lookup").as_deref(), Some("fill-7"));
    step(&counted);
    let r = p.release_durable("fill-7", "cli").await.expect("release");
    assert!(r.held && !r.reclaimed, "the fill still holds it: {r:?}");
    step(&counted);
    let r = p.release_durable("new-key", "cli").await.expect("release");
    assert!(r.held && r.reclaimed, "{r:?}");
    step(&counted);
    let cached_before = p.get("fill-8");
    p.wait_synced().await.expect("the view loads on demand");
    let cached_after = p.get("fill-8");
    a.close().await.expect("close");
    OneKey { requests: seen, cached_before, cached_after }
}

async fn one_key_costs_the_same_in_a_small_and_a_large_pool(backend: Backend) {
    let Some(env) = env(backend).await else { return };
    let (store, l) = (env.store.clone(), &env.layout);
    let filler = allocator_on(store.clone(), l, "filler", Duration::from_secs(10));
    // A 2^32 range: a guess hits one of 2,000 bindings with probability 5e-7.
    for (pool, n) in [("small", 200), ("large", 2_000)] {
        filler.init_pool(&PoolSpec::new(pool, 1, 1 << 32)).await.expect("init");
        let p = filler.pool(pool).await.expect("pool");
        let keys: Vec<String> = (0..n).map(|i| format!("fill-{i}")).collect();
        for chunk in keys.chunks(500) {
            for r in p.acquire_many_durable(chunk, "filler").await {
                r.expect("fill");
            }
        }
    }
    let small = one_key_requests(store.clone(), l, "small").await;
    let large = one_key_requests(store.clone(), l, "large").await;
    assert_eq!(small.requests, large.requests, "one key's requests must not grow with the pool");
    let rt = |txn, get| RoundTrips { txn, get, ..RoundTrips::default() };
    // The budget of DESIGN §5 for a process without a view: open reads the spec and the cluster
    // version in one read-only txn; a new key is one txn; a key bound elsewhere one more; reads one each; a release reads the key record
    // and sends one txn.
    assert_eq!(
        small.requests,
        vec![rt(1, 0), rt(1, 0), rt(2, 0), rt(0, 1), rt(0, 1), rt(1, 1), rt(1, 1)],
        "open, acquire new, acquire bound, get, lookup, release, release+reclaim"
    );
    // Nothing listed the pool: the cache knew no other process's binding, until something
    // needed the whole view, which then loaded on demand.
    for o in [&small, &large] {
        assert_eq!(o.cached_before, None);
        assert!(o.cached_after.is_some());
    }
    check_g1_in(&*store, l, "large").await;
}

async fn lazy_binders_racing_agree(backend: Backend) {
    let Some(env) = env(backend).await else { return };
    let (store, l) = (env.store.clone(), &env.layout);
    // 40 IDs for 30 keys: lazy guesses collide often, some loops lose enough to load the view.
    let spec = PoolSpec::new("p", 1, 40);
    let synced = allocator_on(store.clone(), l, "synced", Duration::from_secs(10));
    synced.init_pool(&spec).await.expect("init");
    let keys: Vec<String> = (0..30).map(|i| format!("k{i}")).collect();
    let mut tasks = Vec::new();
    for b in 0..6u64 {
        let a = lazy(store.clone(), l, &format!("lazy-{b}"), b);
        let mut mine = keys.clone();
        mine.rotate_left((b as usize) * 5);
        tasks.push(tokio::spawn(async move {
            let p = a.pool("p").await.expect("pool");
            let mut got = Vec::new();
            for k in mine {
                let id = p.acquire_durable(&k, &format!("lazy-{b}")).await.expect("acquire").id;
                got.push((k, id));
            }
            got
        }));
    }
    let ps = synced.pool("p").await.expect("pool");
    let mut mine = keys.clone();
    mine.reverse();
    let mut all: Vec<(String, u64)> = Vec::new();
    for k in mine {
        all.push((k.clone(), ps.acquire_durable(&k, "synced").await.expect("acquire").id));
    }
    for t in tasks {
        all.extend(t.await.expect("task"));
    }
    // The same ID for the same key in every process, and no ID for two keys (G1).
    let mut by_key: HashMap<String, u64> = HashMap::new();
    for (k, id) in &all {
        assert_eq!(*by_key.entry(k.clone()).or_insert(*id), *id, "key {k} got two IDs");
    }
    let ids: HashSet<u64> = by_key.values().copied().collect();
    assert_eq!((by_key.len(), ids.len()), (30, 30), "{by_key:?}");
    check_g1_in(&*store, l, "p").await;

    // G6 from a partial view: a tiny pool is `Exhausted` only while the store is full, even
    // after the lazy process learned every ID taken.
    synced.init_pool(&PoolSpec::new("tiny", 1, 3)).await.expect("init");
    let a = lazy(store.clone(), l, "lazy-tiny", 1);
    let b = lazy(store.clone(), l, "lazy-other", 2);
    let pa = a.pool("tiny").await.expect("pool");
    let pb = b.pool("tiny").await.expect("pool");
    for k in ["t0", "t1", "t2"] {
        pb.acquire_durable(k, "other").await.expect("fill");
    }
    assert!(matches!(pa.acquire_durable("t3", "a").await, Err(Error::Exhausted { .. })));
    assert!(pb.release_durable("t1", "other").await.expect("release").reclaimed);
    let t3 = pa.acquire_durable("t3", "a").await.expect("a freed ID is found");
    assert!(t3.new && (1..=3).contains(&t3.id));
    check_g1_in(&*store, l, "tiny").await;
}

/// Fills `pool` (a `lowest` pool of `spec`) with `n` durable bindings `fill-<i>` of holder
/// `filler`, through an allocator with the full view (so they take the lowest IDs in order).
async fn fill_lowest(filler: &Allocator, spec: PoolSpec, n: usize) {
    let name = spec.name().to_string();
    filler.init_pool(&spec.strategy(Strategy::Lowest)).await.expect("init");
    let p = filler.pool(&name).await.expect("pool");
    let keys: Vec<String> = (0..n).map(|i| format!("fill-{i}")).collect();
    for chunk in keys.chunks(500) {
        for r in p.acquire_many_durable(chunk, "filler").await {
            r.expect("fill");
        }
    }
}

/// The requests of one-key operations on a key already bound, in a lazily opened `lowest` pool.
async fn lowest_bound_key_requests(
    store: Arc<dyn Store>,
    l: &Layout,
    pool: &str,
) -> Vec<RoundTrips> {
    let counted = Arc::new(CountingStore::new(store));
    let a = lazy(counted.clone(), l, "cli", 7);
    let mut seen = Vec::new();
    let mut step = |c: &CountingStore<Arc<dyn Store>>| {
        seen.push(c.counts());
        c.reset();
    };
    counted.reset();
    let p = a.pool(pool).await.expect("pool");
    step(&counted);
    // Another holder's key: its record says where it is; the pool is not read.
    let old = p.acquire_durable("fill-7", "cli").await.expect("acquire a bound key");
    assert!(!old.new);
    assert_eq!(old.id, 8, "fill-7 took the 8th lowest ID");
    step(&counted);
    // This holder's own key, again (a second CLI call holding it already).
    let again = p.acquire_durable("fill-7", "cli").await.expect("acquire it again");
    assert_eq!(again.id, old.id);
    step(&counted);
    assert_eq!(p.get_consistent("fill-7").await.expect("get"), Some(old.id));
    step(&counted);
    assert_eq!(p.key_of_consistent(old.id).await.expect("lookup").as_deref(), Some("fill-7"));
    step(&counted);
    let r = p.release_durable("fill-7", "cli").await.expect("release");
    assert!(r.held && !r.reclaimed, "the fill still holds it: {r:?}");
    step(&counted);
    // Nothing listed the pool: the cache knows no other process's binding.
    assert_eq!(p.get("fill-8"), None);
    a.close().await.expect("close");
    seen
}

/// Lazily opened `lowest` pools: a key bound already costs the same in a pool of 200 bindings
/// as in one of 2,000 (before, every lazy bind of a `lowest` pool loaded the whole view).
async fn lowest_pool_bound_key_costs_the_same_in_a_small_and_a_large_pool(backend: Backend) {
    let Some(env) = env(backend).await else { return };
    let (store, l) = (env.store.clone(), &env.layout);
    let filler = allocator_on(store.clone(), l, "filler", Duration::from_secs(10));
    for (pool, n) in [("small", 200), ("large", 2_000)] {
        fill_lowest(&filler, PoolSpec::new(pool, 1, 1 << 32), n).await;
    }
    let small = lowest_bound_key_requests(store.clone(), l, "small").await;
    let large = lowest_bound_key_requests(store.clone(), l, "large").await;
    assert_eq!(small, large, "a bound key's requests must not grow with the pool");
    let rt = |txn, get| RoundTrips { txn, get, ..RoundTrips::default() };
    // Open reads the spec and the cluster version (one txn); a bound key is one read of its record and the join's txn (the
    // second time too: a one-shot process does not know it holds it); get, lookup one read
    // each; a release reads the key record and sends one txn.
    assert_eq!(
        small,
        vec![rt(1, 0), rt(1, 1), rt(1, 1), rt(0, 1), rt(0, 1), rt(1, 1)],
        "open, acquire bound, acquire held, get, lookup, release"
    );
    check_g1_in(&*store, l, "large").await;
}

/// Lazily opened `lowest` pools: a new key in a lazily opened pool still takes the lowest free
/// ID, counting `min`, reserved ranges and gaps left by releases, and reads the used IDs without
/// loading the view (no key of another process in its cache afterwards).
async fn lowest_pool_new_key_takes_the_lowest_free_id(backend: Backend) {
    let Some(env) = env(backend).await else { return };
    let (store, l) = (env.store.clone(), &env.layout);
    let filler = allocator_on(store.clone(), l, "filler", Duration::from_secs(10));
    // Raw IDs from 10, 10–12 and 100–109 reserved: 1,200 bindings take 13–99 and 110–1,222.
    let spec = PoolSpec::new("low", 10, 1 << 32).reserve(10..=12).reserve(100..=109);
    fill_lowest(&filler, spec, 1_200).await;
    let pf = filler.pool("low").await.expect("pool");
    // Gaps: the first ID (13), one below a reserved range (99), one far up (1,000: fill-977).
    for (k, id) in [("fill-0", 13), ("fill-86", 99), ("fill-977", 1_000)] {
        assert_eq!(pf.get(k), Some(id), "the fill packs from the bottom");
        assert!(pf.release_durable(k, "filler").await.expect("release").reclaimed);
    }
    // Pages of 5 records (50 names in the used-ID pass): 1,200 names are read in windows sized
    // from the names read so far (`allocator/used_ids.rs`, `store/window.rs`); a window missed or
    // read twice would show as a wrong lowest ID.
    let a = lazy_paged(store.clone(), l, "cli", 3, 5);
    let p = a.pool("low").await.expect("pool");
    let mut got = Vec::new();
    for k in ["new-0", "new-1", "new-2", "new-3"] {
        let r = p.acquire_durable(k, "cli").await.expect("acquire a new key");
        assert!(r.new, "{k}");
        got.push(r.id);
    }
    assert_eq!(got, vec![13, 99, 1_000, 1_223], "the lowest free IDs, in order");
    assert_eq!(p.get("fill-5"), None, "the used IDs were read, not the view");
    // A full pool is still `Exhausted` (G6), from the used IDs and the store's count.
    filler
        .init_pool(&PoolSpec::new("lowfull", 5, 7).strategy(Strategy::Lowest))
        .await
        .expect("init");
    let pff = filler.pool("lowfull").await.expect("pool");
    for k in ["f0", "f1", "f2"] {
        pff.acquire_durable(k, "filler").await.expect("fill");
    }
    let pl = a.pool("lowfull").await.expect("pool");
    assert!(matches!(pl.acquire_durable("x", "cli").await, Err(Error::Exhausted { .. })));
    assert!(pff.release_durable("f1", "filler").await.expect("release").reclaimed);
    assert_eq!(pl.acquire_durable("x", "cli").await.expect("the freed ID").id, 6);
    a.close().await.expect("close");
    check_g1_in(&*store, l, "low").await;
    check_g1_in(&*store, l, "lowfull").await;
}

/// Lazy binders of a `lowest` pool, each reading the same used IDs and so aiming at the same
/// lowest free ID, race each other and a process with the full view: G1 holds, and the pool
/// stays packed (30 keys, 40 IDs: every ID they took is among the lowest 40).
async fn lazy_lowest_binders_racing_agree(backend: Backend) {
    let Some(env) = env(backend).await else { return };
    let (store, l) = (env.store.clone(), &env.layout);
    let spec = PoolSpec::new("p", 1, 40).strategy(Strategy::Lowest);
    let synced = allocator_on(store.clone(), l, "synced", Duration::from_secs(10));
    synced.init_pool(&spec).await.expect("init");
    let keys: Vec<String> = (0..30).map(|i| format!("k{i}")).collect();
    let mut tasks = Vec::new();
    for b in 0..6u64 {
        let a = lazy(store.clone(), l, &format!("lazy-{b}"), b);
        let mut mine = keys.clone();
        mine.rotate_left((b as usize) * 5);
        tasks.push(tokio::spawn(async move {
            let p = a.pool("p").await.expect("pool");
            let mut got = Vec::new();
            for k in mine {
                let id = p.acquire_durable(&k, &format!("lazy-{b}")).await.expect("acquire").id;
                got.push((k, id));
            }
            got
        }));
    }
    let ps = synced.pool("p").await.expect("pool");
    let mut mine = keys.clone();
    mine.reverse();
    let mut all: Vec<(String, u64)> = Vec::new();
    for k in mine {
        all.push((k.clone(), ps.acquire_durable(&k, "synced").await.expect("acquire").id));
    }
    for t in tasks {
        all.extend(t.await.expect("task"));
    }
    let mut by_key: HashMap<String, u64> = HashMap::new();
    for (k, id) in &all {
        assert_eq!(*by_key.entry(k.clone()).or_insert(*id), *id, "key {k} got two IDs");
    }
    let ids: HashSet<u64> = by_key.values().copied().collect();
    assert_eq!((by_key.len(), ids.len()), (30, 30), "{by_key:?}");
    check_g1_in(&*store, l, "p").await;
}
