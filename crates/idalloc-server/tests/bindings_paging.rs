//! `GET /v1/pools/{pool}/bindings` reads O(page) per page, whatever the pool's size. It used to
//! call `Pool::list` for every page: a whole listing of the pool per page,
//! B²/limit records to page through B bindings. Counted in store requests and records, never in
//! time: the same page costs the same requests at 1,000 and at 8,000 bindings.

use std::sync::Arc;

use axum::body::Body;
use axum::http::Request;
use idalloc::store::embedded::EmbeddedStore;
use idalloc::store::Store;
use idalloc::{Allocator, PoolSpec};
use idalloc_server::{router, AppState, Config};
use idalloc_testkit::counting::CountingStore;
use tower::ServiceExt;

const PAGE: usize = 100;

/// What one page cost the store.
#[derive(Debug, PartialEq, Eq)]
struct PageCost {
    gets: u64,
    txns: u64,
    records_counted: u64,
}

/// A pool of `bindings` bindings (three of them held by a second holder too, two released to
/// leave tombstones in the free set) behind a router on a counted memory store; pages through it
/// all, checks the pages against `Pool::list`, and returns the cost of the middle page.
async fn page_through(bindings: usize) -> PageCost {
    let counted = Arc::new(CountingStore::new(EmbeddedStore::memory()));
    let store: Arc<dyn Store> = counted.clone();
    let alloc = Allocator::from_arc(store.clone(), Default::default()).expect("allocator");
    let spec = PoolSpec::new("p", 1, 1 << 24).reuse_delay(std::time::Duration::from_secs(3600));
    alloc.init_pool(&spec).await.expect("init");
    let pool = alloc.pool("p").await.expect("pool");
    let keys: Vec<String> = (0..bindings).map(|i| format!("node-{i:05}")).collect();
    for r in pool.acquire_many_durable(&keys, "h").await {
        r.expect("prefill");
    }
    pool.acquire_durable("node-00001", "other").await.expect("second holder");
    for k in ["node-00002", "node-00003"] {
        pool.release_durable(k, "h").await.expect("release");
    }
    pool.wait_synced().await.expect("synced");
    let want = pool.list().await.expect("list");
    assert_eq!(want.len(), bindings - 2);

    let st = AppState::new(alloc, store, "idalloc", Config::default(), None).expect("state");
    let app = router(st);
    let mut got = Vec::new();
    let mut after: Option<u64> = None;
    let mut costs = Vec::new();
    loop {
        let path = match after {
            Some(a) => format!("/v1/pools/p/bindings?limit={PAGE}&after={a}"),
            None => format!("/v1/pools/p/bindings?limit={PAGE}"),
        };
        counted.reset();
        let req = Request::get(&path).body(Body::empty()).expect("request");
        let resp = app.clone().oneshot(req).await.expect("response");
        assert_eq!(resp.status(), 200, "{path}");
        let body = axum::body::to_bytes(resp.into_body(), 1 << 24).await.expect("body");
        let c = counted.counts();
        costs.push(PageCost { gets: c.get, txns: c.txn, records_counted: counted.reads().counted });
        let v: serde_json::Value = serde_json::from_slice(&body).expect("JSON");
        for b in v["bindings"].as_array().expect("bindings") {
            let holders: Vec<String> = b["holders"]
                .as_array()
                .expect("holders")
                .iter()
                .map(|h| h.as_str().expect("holder").to_string())
                .collect();
            got.push((
                b["id"].as_u64().expect("id"),
                b["key"].as_str().expect("key").to_string(),
                holders,
            ));
        }
        match v["next_after"].as_u64() {
            Some(n) => after = Some(n),
            None => break,
        }
    }
    let want: Vec<(u64, String, Vec<String>)> =
        want.into_iter().map(|b| (b.id, b.key, b.holders)).collect();
    assert_eq!(got, want, "the pages together are the pool's bindings with their holders");
    assert_eq!(costs.len(), (bindings - 2).div_ceil(PAGE), "pages");
    costs.swap_remove(costs.len() / 2)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bindings_page_costs_the_same_store_requests_at_any_pool_size() {
    let small = page_through(1_000).await;
    let large = page_through(8_000).await;
    // No listing (a `get` is a page of one); the holders of 100 bindings in 2 txns of 64.
    assert_eq!(small, large, "a page's cost grew with the pool");
    assert_eq!(small.gets, 0, "a page listed the pool: {small:?}");
    assert_eq!(small.txns, PAGE.div_ceil(64) as u64, "{small:?}");
}
