//! The service's per-pool watch state (each watched pool's hub and its shared read of the
//! newest change) is bounded by the pools being watched, not by every pool ever watched: pools
//! created, watched and deleted over time leave nothing behind, and a pool nobody watches any
//! more is forgotten after `watch_idle`, while a client that reconnects within it still resumes
//! exactly. Counted in map entries, never in time.

use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::http::Request as HttpRequest;
use futures::StreamExt;
use idalloc::store::embedded::EmbeddedStore;
use idalloc::store::Store;
use idalloc::Allocator;
use idalloc_server::{router, AppState, Config};
use tower::ServiceExt;

mod common;
use common::call;

fn service(watch_idle: Duration) -> (Arc<AppState>, axum::Router) {
    let store: Arc<dyn Store> = Arc::new(EmbeddedStore::memory());
    let alloc = Allocator::from_arc(store.clone(), Default::default()).expect("allocator");
    let config = Config { watch_idle, ..Config::default() };
    let st = AppState::new(alloc, store, "idalloc", config, None).expect("state");
    let app = router(st.clone());
    (st, app)
}

/// Opens a watch of `pool` (with `last_event_id` if given) and reads it until `until` is in it
/// (then drops it: the client goes away). Returns its status and text.
async fn watch(
    app: &axum::Router,
    pool: &str,
    last_event_id: Option<i64>,
    until: &str,
) -> (u16, String) {
    let mut req = HttpRequest::get(format!("/v1/pools/{pool}/watch"));
    if let Some(m) = last_event_id {
        req = req.header("last-event-id", m.to_string());
    }
    let resp = app.clone().oneshot(req.body(Body::empty()).expect("request")).await.expect("resp");
    let status = resp.status().as_u16();
    let mut body = resp.into_body().into_data_stream();
    let mut text = String::new();
    if status == 200 {
        while !text.contains(until) {
            let chunk = body.next().await.expect("the stream ended early").expect("chunk");
            text.push_str(std::str::from_utf8(&chunk).expect("utf-8"));
        }
    }
    (status, text)
}

/// Prunes until the watch state is `want` or 200 tries have passed (a hub's own tasks hold it
/// for a moment while they run); the state then.
async fn settle(st: &AppState, want: (usize, usize)) -> (usize, usize) {
    for _ in 0..200 {
        st.prune_watch_state();
        if st.watch_state() == want {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    st.watch_state()
}

fn synced_revision(text: &str) -> i64 {
    let data = text
        .split("event: synced\ndata: ")
        .nth(1)
        .and_then(|t| t.lines().next())
        .expect("a synced event");
    let v: serde_json::Value = serde_json::from_str(data).expect("json");
    v["revision"].as_i64().expect("revision")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pools_created_watched_and_deleted_leave_no_watch_state_behind() {
    let (st, app) = service(Duration::from_secs(3600));
    for i in 0..30 {
        let pool = format!("p{i}");
        let spec = format!(r#"{{"name":"{pool}","min":1,"max":100}}"#);
        assert_eq!(call(&app, "POST", "/v1/pools", &spec).await.0, 200, "create {pool}");
        let (status, _) = watch(&app, &pool, None, "event: synced").await;
        assert_eq!(status, 200);
        assert_eq!(call(&app, "DELETE", &format!("/v1/pools/{pool}"), "").await.0, 200);
    }
    // The grace (an hour) does not keep a deleted pool's state: nothing is left.
    assert_eq!(settle(&st, (0, 0)).await, (0, 0), "(hubs, shared reads) after 30 pools");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unwatched_pool_is_forgotten_after_the_grace_and_resumes_exactly_within_it() {
    // Within the grace: a client that went away resumes exactly from the history.
    let (st, app) = service(Duration::from_secs(3600));
    let spec = r#"{"name":"p","min":1,"max":100}"#;
    assert_eq!(call(&app, "POST", "/v1/pools", spec).await.0, 200);
    let (_, text) = watch(&app, "p", None, "event: synced").await;
    let r = synced_revision(&text);
    let acquire = r#"{"key":"k1","holder":"h"}"#;
    assert_eq!(call(&app, "POST", "/v1/pools/p/acquire", acquire).await.0, 200);
    // Every other pool's watch state goes (there is none), this one is kept.
    assert_eq!(settle(&st, (1, 0)).await, (1, 0));
    let (status, text) = watch(&app, "p", Some(r), "\"key\":\"k1\"").await;
    assert_eq!((status, text.matches("event: upsert").count()), (200, 1), "{text}");

    // Without a grace: the pool's hub (and its history) goes with its last stream.
    let (st, app) = service(Duration::ZERO);
    assert_eq!(call(&app, "POST", "/v1/pools", spec).await.0, 200);
    let (status, _) = watch(&app, "p", None, "event: synced").await;
    assert_eq!(status, 200);
    assert_eq!(settle(&st, (0, 0)).await, (0, 0), "an unwatched pool keeps no watch state");
}
