//! Every path that lists a pool pages through the store in reads that each cost
//! about what they return, so a listing is linear in the records.
//!
//! A limited range read is not O(limit): etcd and the embedded store count every key from the
//! read's start to the range's end to answer `count`. Paging `[last, end)` made `list` and
//! `check` quadratic (28 s for `check` at 100k bindings on the file store, over 5 min for `list`
//! at 200k). The counting store sums the `count` of every read: a listing made of several
//! bounded reads counts a few times the records it returns, whatever the pool's size; the old
//! one counted about `records / (2 × page)` times as many (75 times here).
//!
//! The embedded stores count only what a read walks: with the listings' loose counts, one key
//! past the limit (`GetRequest::loose_count`); etcd always counts the whole window.
//!
//! On the in-memory store, the file store and a real etcd (started by `scripts/test.sh`, or
//! privately).

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::backends::{env, on_backends, Backend, Env};
use idalloc::layout::Layout;
use idalloc::store::{list_all, KeyRange, Store};
use idalloc::{Allocator, AllocatorOptions, Pool, PoolSpec};
use idalloc_testkit::counting::CountingStore;

on_backends!(
    [Memory, File, Etcd],
    [
        list_all_reads_bounded_windows,
        pool_list_pages,
        check_pages,
        sweep_pages,
        opening_a_pool_pages,
        counted_per_returned_does_not_grow_with_the_pool
    ]
);

/// Bindings in the test pool (three records each: ID, key, reference).
const BINDINGS: usize = 5_000;
/// Records per page: small, so the pool is many pages.
const PAGE: i64 = 100;
/// At most this many records counted per record returned. The quadratic listing counts
/// `records / (2 × PAGE)`, 75 times here; windows sized from the keys read keep it under 3 at any
/// size (`store/window.rs` simulates 10k and 300k bindings).
const MAX_COUNTED_PER_RECORD: u64 = 4;

fn allocator(store: Arc<dyn Store>, l: &Layout) -> Allocator {
    let opts = AllocatorOptions::builder()
        .prefix(l.prefix().to_string())
        .holder("h".to_string())
        .session_ttl(Duration::from_secs(30))
        .list_page(PAGE)
        .build()
        .unwrap();
    Allocator::from_arc(store, opts).expect("allocator")
}

/// A store counting its reads, with pool `p` of [`BINDINGS`] durable bindings.
async fn filled(backend: Backend) -> Option<(Arc<CountingStore<Arc<dyn Store>>>, Env, Pool)> {
    let e = env(backend).await?;
    let counted = Arc::new(CountingStore::new(e.store.clone()));
    let a = allocator(counted.clone(), &e.layout);
    let p = fill(&a, "p", BINDINGS).await;
    Some((counted, e, p))
}

/// Pool `name` with `n` durable bindings of holder `h`, IDs picked at random from a million.
async fn fill(a: &Allocator, name: &str, n: usize) -> Pool {
    let p = a.ensure_pool(&PoolSpec::new(name, 1, 1_000_000)).await.expect("pool");
    let keys: Vec<String> = (0..n).map(|i| format!("key-{i:06}")).collect();
    for chunk in keys.chunks(100) {
        for r in p.acquire_many_durable(chunk, "h").await {
            r.expect("acquired");
        }
    }
    p
}

/// The reads since the last reset returned at least `records` records in at least
/// `records / PAGE` reads, and counted at most [`MAX_COUNTED_PER_RECORD`] per record returned.
fn assert_linear(what: &str, s: &CountingStore<Arc<dyn Store>>, records: u64) {
    let reads = s.reads();
    let gets = s.counts().get;
    eprintln!("{what}: {gets} reads, {reads:?}");
    assert!(reads.returned >= records, "{what}: returned {reads:?}, expected {records} records");
    assert!(gets >= records / PAGE as u64, "{what}: {gets} reads for {records} records");
    assert!(
        reads.counted <= MAX_COUNTED_PER_RECORD * reads.returned,
        "{what}: the reads counted {} records to return {} ({gets} reads): the listing is \
         quadratic",
        reads.counted,
        reads.returned
    );
}

async fn list_all_reads_bounded_windows(backend: Backend) {
    let Some((s, e, _p)) = filled(backend).await else { return };
    s.reset();
    let range = KeyRange::prefix(e.layout.pool_data_prefix("p"));
    let (kvs, _) = list_all(&*s, &range, PAGE).await.expect("list");
    assert!(kvs.len() >= 3 * BINDINGS, "{} records", kvs.len());
    assert!(kvs.windows(2).all(|w| w[0].key < w[1].key), "in key order, each once");
    assert_linear("list_all", &s, 3 * BINDINGS as u64);
}

async fn pool_list_pages(backend: Backend) {
    let Some((s, _e, p)) = filled(backend).await else { return };
    s.reset();
    let bindings = p.list().await.expect("list");
    assert_eq!(bindings.len(), BINDINGS);
    assert!(bindings.iter().all(|b| b.holders == ["h"]));
    assert_linear("Pool::list", &s, 3 * BINDINGS as u64);
}

async fn check_pages(backend: Backend) {
    let Some((s, e, _p)) = filled(backend).await else { return };
    s.reset();
    let scan = idalloc::check::scan(&*s, &e.layout, Some("p"), PAGE).await.expect("scan");
    assert_eq!(scan.report.breaches(), 0, "{:?}", scan.report);
    assert_linear("check POOL", &s, 3 * BINDINGS as u64);
    s.reset();
    let scan = idalloc::check::scan(&*s, &e.layout, None, PAGE).await.expect("scan");
    assert_eq!(scan.report.breaches(), 0, "{:?}", scan.report);
    assert_linear("check", &s, 3 * BINDINGS as u64);
}

async fn sweep_pages(backend: Backend) {
    let Some((s, _e, p)) = filled(backend).await else { return };
    s.reset();
    let r = p.sweep_dry_run().await.expect("sweep");
    assert_eq!((r.bindings, r.reclaimed.len()), (BINDINGS, 0));
    assert_linear("sweep", &s, 2 * BINDINGS as u64);
}

async fn opening_a_pool_pages(backend: Backend) {
    let Some((s, e, _p)) = filled(backend).await else { return };
    s.reset();
    let fresh = allocator(s.clone(), &e.layout);
    let p = fresh.pool("p").await.expect("pool");
    p.wait_synced().await.expect("synced");
    assert_eq!(p.snapshot().len(), BINDINGS);
    assert_linear("opening a pool", &s, BINDINGS as u64);
    fresh.close().await.expect("close");
}

/// Records counted per record returned by listing pool `name` whole (`list_all`, what `list`,
/// `check` and the sweeper read) and by a fresh process's sync of it (the `id/` range).
async fn ratios(s: &Arc<CountingStore<Arc<dyn Store>>>, e: &Env, name: &str) -> (f64, f64) {
    let ratio = |s: &CountingStore<Arc<dyn Store>>| {
        let r = s.reads();
        r.counted as f64 / r.returned.max(1) as f64
    };
    s.reset();
    let range = KeyRange::prefix(e.layout.pool_data_prefix(name));
    list_all(&**s, &range, PAGE).await.expect("list");
    let listing = ratio(s);
    s.reset();
    let fresh = allocator(s.clone(), &e.layout);
    let p = fresh.pool(name).await.expect("pool");
    p.wait_synced().await.expect("synced");
    let sync = ratio(s);
    fresh.close().await.expect("close");
    (listing, sync)
}

/// The cost per record of a listing does not grow with the pool. The records a
/// listing's reads counted per record returned, at 1,000 and at 8,000 bindings: the larger pool's
/// ratio is within 15 % of the smaller's (the windows of the last session let it grow from 3.6 at
/// 10k to 7.7 at 200k bindings).
async fn counted_per_returned_does_not_grow_with_the_pool(backend: Backend) {
    let Some(e) = env(backend).await else { return };
    let s = Arc::new(CountingStore::new(e.store.clone()));
    let a = allocator(s.clone(), &e.layout);
    fill(&a, "small", 1_000).await;
    fill(&a, "big", 8_000).await;
    let small = ratios(&s, &e, "small").await;
    let big = ratios(&s, &e, "big").await;
    eprintln!("{backend:?}: counted per returned (listing, sync) at 1k {small:?}, at 8k {big:?}");
    for (what, sm, bg) in [("listing", small.0, big.0), ("sync", small.1, big.1)] {
        assert!(bg <= sm * 1.15 + 0.05, "{what}: {bg:.2} at 8k vs {sm:.2} at 1k: it grows");
        assert!(bg <= MAX_COUNTED_PER_RECORD as f64, "{what}: {bg:.2} counted per returned");
    }
}
