//! Every whole listing is bounded page by page, never as a whole.
//!
//! `Pool::list`, the sweeper (`gc`), a full pool's usage check (a bind's full load) and `check`
//! used to read their whole listing inside ONE request attempt: at 1M bindings on a loaded
//! machine `list` and `gc` ran out of that attempt's time while pages kept coming. Here a store
//! wrapper makes every page of a listing slow but well under the request timeout, with the
//! listing as a whole many timeouts long: each path must finish. A page that never comes must
//! fail the listing with an error naming the pool and the page.
//!
//! On the in-memory store, in paused tokio time (the delays cost no real time).

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use idalloc::store::embedded::EmbeddedStore;
use idalloc::store::listing::{BoundedPages, PageBound};
use idalloc::store::{KeyRange, Store, StoreError, StoreResult};
use idalloc::{Allocator, AllocatorOptions, Error, Pool, PoolSpec, RetryPolicy};
use idalloc_testkit::hooked::{Hook, HookedStore, Request};

/// Bindings in the test pool, which holds exactly this many IDs (a full pool: a new key pays the
/// usage check's listing).
const BINDINGS: u64 = 300;
/// Records per page.
const PAGE: i64 = 50;
/// Bound on one request attempt (and so on one page).
const TIMEOUT: Duration = Duration::from_secs(1);
/// How long each page of a listing takes once the hook is armed: under [`TIMEOUT`], while a
/// listing of the pool (900 records: 18 pages and more) takes several [`TIMEOUT`]s.
const SLOW: Duration = Duration::from_millis(300);

/// Slows down (or stalls) the limited reads of listings, once armed.
#[derive(Default)]
struct SlowPages {
    armed: AtomicBool,
    /// The listing read (1-based, counted from arming) that never answers; 0: none.
    stall_at: AtomicUsize,
    /// Every read from `stall_at` on never answers, not only that one.
    stall_on: AtomicBool,
    reads: AtomicUsize,
}

#[async_trait::async_trait]
impl Hook<EmbeddedStore> for SlowPages {
    async fn before(&self, _: &Arc<EmbeddedStore>, req: Request) -> StoreResult<Request> {
        if let Request::Get(g) = &req {
            if g.limit > 0 && self.armed.load(Ordering::SeqCst) {
                let n = self.reads.fetch_add(1, Ordering::SeqCst) + 1;
                let at = self.stall_at.load(Ordering::SeqCst);
                if at != 0 && (n == at || (n > at && self.stall_on.load(Ordering::SeqCst))) {
                    std::future::pending::<()>().await;
                }
                tokio::time::sleep(SLOW).await;
            }
        }
        Ok(req)
    }
}

type Slow = HookedStore<EmbeddedStore, SlowPages>;

fn options() -> AllocatorOptions {
    AllocatorOptions::builder()
        .prefix("pb".to_string())
        .holder("h".to_string())
        .session_ttl(Duration::from_secs(600))
        .request_timeout(TIMEOUT)
        .retry(
            RetryPolicy::builder()
                .max_attempts(2)
                .initial_backoff(Duration::from_millis(10))
                .max_backoff(Duration::from_millis(10))
                .build()
                .unwrap(),
        )
        .list_page(PAGE)
        .build()
        .unwrap()
}

/// A store behind [`SlowPages`] (not armed yet), and pool `p` of [`BINDINGS`] IDs, every one
/// bound durably to holder `h`, synced.
async fn full_pool() -> (Arc<Slow>, Allocator, Pool) {
    let store = Arc::new(HookedStore::with_hook(EmbeddedStore::memory(), SlowPages::default()));
    let a = Allocator::from_arc(store.clone(), options()).expect("allocator");
    let p = a.ensure_pool(&PoolSpec::new("p", 1, BINDINGS)).await.expect("pool");
    let keys: Vec<String> = (0..BINDINGS).map(|i| format!("key-{i:04}")).collect();
    for chunk in keys.chunks(100) {
        for r in p.acquire_many_durable(chunk, "h").await {
            r.expect("acquired");
        }
    }
    p.wait_synced().await.expect("synced");
    (store, a, p)
}

/// Every listing path finishes although it takes many request timeouts, page by page.
#[tokio::test(start_paused = true)]
async fn slow_pages_under_the_bound_never_cut_a_listing_off() {
    let (store, a, p) = full_pool().await;
    store.hook().armed.store(true, Ordering::SeqCst);
    let started = tokio::time::Instant::now();

    let bindings = p.list().await.expect("Pool::list finishes");
    assert_eq!(bindings.len() as u64, BINDINGS);
    let listed_in = started.elapsed();
    assert!(listed_in > 4 * TIMEOUT, "the listing is longer than a whole attempt: {listed_in:?}");

    let swept = p.sweep_dry_run().await.expect("the sweep's read finishes");
    assert_eq!((swept.bindings as u64, swept.reclaimed.len()), (BINDINGS, 0));

    // A new key in the full pool: the usage check lists `id/` (keys only) and finds it full.
    let reads = store.hook().reads.load(Ordering::SeqCst);
    match p.acquire_durable("one-more", "h").await {
        Err(Error::Exhausted { .. }) => {}
        other => panic!("a full pool is exhausted after its usage listing, got {other:?}"),
    }
    let usage_reads = store.hook().reads.load(Ordering::SeqCst) - reads;
    assert!(usage_reads as u32 * SLOW > 2 * TIMEOUT, "{usage_reads} slow reads");

    // `check`, bounded per page as the CLI bounds it.
    let layout = idalloc::layout::Layout::new("pb").expect("layout");
    let bound = PageBound { timeout: Some(TIMEOUT), ..PageBound::default() };
    let scan = idalloc::check::scan_bounded(&*store, &layout, Some("p"), PAGE, &bound)
        .await
        .expect("check finishes");
    assert_eq!(scan.report.breaches(), 0, "{:?}", scan.report);
    a.close().await.expect("close");
}

/// A page that never comes fails the listing after its attempts, with an error naming the pool
/// and the page; a page that comes on its retry lets the listing go on from that page (each page
/// before it read once: a retry resumes, never starts over).
#[tokio::test(start_paused = true)]
async fn a_page_that_never_comes_is_named_and_a_retry_resumes() {
    let (store, a, p) = full_pool().await;
    let hook = store.hook();
    hook.stall_at.store(3, Ordering::SeqCst);
    hook.stall_on.store(true, Ordering::SeqCst);
    hook.armed.store(true, Ordering::SeqCst);
    let e = p.list().await.expect_err("a stalled page fails the listing");
    let msg = e.to_string();
    assert!(matches!(e, Error::Unavailable { .. }), "{e:?}");
    assert!(msg.contains("pool \"p\"") && msg.contains("page 3"), "{msg}");
    assert!(msg.contains("failed 2 time(s)") && msg.contains("2 pages before it"), "{msg}");
    assert!(msg.contains("no answer within"), "{msg}");
    // Reads 1 and 2 answered; 3 and its retry (4) never did.
    assert_eq!(hook.reads.load(Ordering::SeqCst), 4);

    // A clean listing takes `clean` reads; with read 3 lost once, one more: the retry.
    hook.stall_at.store(0, Ordering::SeqCst);
    hook.reads.store(0, Ordering::SeqCst);
    assert_eq!(p.list().await.expect("clean").len() as u64, BINDINGS);
    let clean = hook.reads.swap(0, Ordering::SeqCst);
    hook.stall_on.store(false, Ordering::SeqCst);
    hook.stall_at.store(3, Ordering::SeqCst);
    assert_eq!(p.list().await.expect("resumed").len() as u64, BINDINGS);
    assert_eq!(hook.reads.load(Ordering::SeqCst), clean + 1, "only the lost page read again");
    a.close().await.expect("close");
}

/// The store compacts a listing's revision away mid-listing: the collecting form starts over
/// at a new revision and returns every record once.
#[tokio::test]
async fn a_compacted_listing_starts_over_at_a_new_revision() {
    use idalloc::store::{TxnOp, TxnRequest};
    let inner = EmbeddedStore::memory();
    for i in 0..200 {
        let put = TxnRequest::new().and_then([TxnOp::put(format!("c/{i:03}"), "v")]);
        inner.txn(put).await.expect("put");
    }
    /// After the second page, a write and a compaction at its revision.
    struct CompactOnce(AtomicUsize);
    #[async_trait::async_trait]
    impl Hook<EmbeddedStore> for CompactOnce {
        async fn before(&self, inner: &Arc<EmbeddedStore>, req: Request) -> StoreResult<Request> {
            if matches!(req, Request::Get(_)) && self.0.fetch_add(1, Ordering::SeqCst) == 2 {
                let put = TxnRequest::new().and_then([TxnOp::put("c/new", "v")]);
                let r = inner.txn(put).await?;
                inner.compact(r.revision).await?;
            }
            Ok(req)
        }
    }
    let store = HookedStore::with_hook(inner, CompactOnce(AtomicUsize::new(0)));
    let range = KeyRange::prefix("c/");
    let pages = BoundedPages::new(&store, &range, 20, PageBound::default()).named("test range");
    let (kvs, _) = pages.collect().await.expect("starts over");
    assert_eq!(kvs.len(), 201, "every record once, the new one included");
    assert!(kvs.windows(2).all(|w| w[0].key < w[1].key));
    assert!(kvs.iter().any(|kv| kv.key == b"c/new"), "read at the new revision");

    // Page by page, the caller is told (it may have handed pages on already).
    let store = HookedStore::with_hook(store.inner().clone(), CompactOnce(AtomicUsize::new(0)));
    let mut pages = BoundedPages::new(&store, &range, 20, PageBound::default());
    let mut outcome = Ok(None);
    for _ in 0..20 {
        outcome = pages.next_page().await;
        if !matches!(outcome, Ok(Some(_))) {
            break;
        }
    }
    assert!(matches!(outcome, Err(StoreError::Compacted { .. })), "{outcome:?}");
}
