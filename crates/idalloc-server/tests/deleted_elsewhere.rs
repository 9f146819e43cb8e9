//! A pool deleted by another process (another replica, the CLI) leaves nothing behind in this
//! service: its handle (and with it the pool's cache, which holds every binding) is forgotten,
//! and `/readyz` stops counting it. Before, the handle stayed for the life of the process: a
//! deleted 1M-binding pool kept about 100 MB of cache in every replica that had served it.

use std::sync::Arc;
use std::time::Duration;

use idalloc::store::embedded::EmbeddedStore;
use idalloc::store::Store;
use idalloc::{Allocator, AllocatorOptions};
use idalloc_server::{router, AppState, Config};

mod common;
use common::call;

#[tokio::test]
async fn a_pool_deleted_elsewhere_is_forgotten_and_not_counted_ready() {
    let store: Arc<dyn Store> = Arc::new(EmbeddedStore::memory());
    let alloc = Allocator::from_arc(store.clone(), AllocatorOptions::default()).expect("allocator");
    let st =
        AppState::new(alloc, store.clone(), "idalloc", Config::default(), None).expect("state");
    let app = router(st.clone());

    for pool in ["gone", "kept"] {
        let body = format!(r#"{{"name":"{pool}","min":1,"max":1000}}"#);
        let (status, v) = call(&app, "POST", "/v1/pools", &body).await;
        assert!(status == 200 || status == 201, "create {pool}: {status} {v}");
        let (status, v) =
            call(&app, "POST", &format!("/v1/pools/{pool}/acquire"), r#"{"key":"k","holder":"h"}"#)
                .await;
        assert_eq!(status, 200, "acquire in {pool}: {v}");
    }
    let (status, v) = call(&app, "GET", "/readyz", "").await;
    assert_eq!((status, v["pools"].as_u64()), (200, Some(2)), "{v}");

    // Another process deletes "gone" (force: it still has a binding).
    let other = Allocator::from_arc(store.clone(), AllocatorOptions::default()).expect("other");
    assert!(other.delete_pool("gone", true).await.expect("delete elsewhere"));

    // This service learns it from its watch of the pool; bounded wait, counted in tries.
    let mut seen = None;
    for _ in 0..500 {
        let (status, v) = call(&app, "GET", "/readyz", "").await;
        seen = Some((status, v.clone()));
        if status == 200 && v["pools"].as_u64() == Some(1) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let (status, v) = seen.expect("asked");
    assert_eq!(
        (status, v["pools"].as_u64()),
        (200, Some(1)),
        "the deleted pool still counted: {v}"
    );
    assert_eq!(st.pools_opened(), vec!["kept".to_string()], "handles kept");

    // The kept pool still works, and the deleted one answers as deleted.
    let (status, v) =
        call(&app, "POST", "/v1/pools/kept/acquire", r#"{"key":"k2","holder":"h"}"#).await;
    assert_eq!(status, 200, "{v}");
    let (status, v) = call(&app, "GET", "/v1/pools/gone/bindings", "").await;
    assert_eq!((status, v["kind"].as_str()), (404, Some("pool_not_found")), "{v}");
    assert_eq!(st.pools_opened(), vec!["kept".to_string()], "a failed open keeps nothing");
}
