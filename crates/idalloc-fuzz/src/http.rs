//! Target `http_body`: request bodies of the HTTP service, sent through its real router
//! (`idalloc_server::router`, in process with `tower::ServiceExt::oneshot`) on a memory store, so
//! the JSON parsing, the handlers' validation and the library's checks all run as in `serve`.
//!
//! Properties: no body makes the service answer 5xx or panic; every refusal is a JSON error with
//! a `kind` and a `message`; a pool created from a body is shown with the same spec; an acquire
//! answered 200 gives each requested key an ID, and the key then has that ID (read with
//! `?consistent=true`: the cached read may lag a write by the watch delay, docs/guide/api.md).

use std::sync::Arc;

use axum::body::{to_bytes, Body};
use axum::http::{Method, Request, StatusCode};
use axum::Router;
use idalloc::store::embedded::EmbeddedStore;
use idalloc::store::Store;
use idalloc::Allocator;
use idalloc_server::{router, AppState, Config};
use serde_json::Value;
use tower::ServiceExt;

use crate::input::Input;

/// The requests a body can go to: every route that reads a JSON body.
const ROUTES: &[(&str, &str)] = &[
    ("POST", "/v1/pools"),
    ("POST", "/v1/pools/p/acquire"),
    ("POST", "/v1/pools/p/release"),
    ("POST", "/v1/sessions"),
    ("POST", "/v1/pools/nope/acquire"),
];

/// Input: a route selector byte, then the body.
pub fn check(data: &[u8]) {
    let mut input = Input::new(data);
    let (method, path) = ROUTES[usize::from(input.byte()) % ROUTES.len()];
    let body = input.rest().to_vec();
    let scope = crate::panics::Scope::new("http_body");
    scope.block_on(async move {
        let store: Arc<dyn Store> = Arc::new(EmbeddedStore::memory());
        let alloc = Allocator::from_arc(store.clone(), Default::default()).expect("allocator");
        let app =
            router(AppState::new(alloc, store, "idalloc", Config::default(), None).expect("state"));
        let (status, _) =
            send(&app, "POST", "/v1/pools", br#"{"name":"p","min":1,"max":1000}"#.to_vec()).await;
        assert_eq!(status, StatusCode::OK, "the fixture pool is created");

        let (status, answer) = send(&app, method, path, body.clone()).await;
        let shown = String::from_utf8_lossy(&body);
        assert!(!status.is_server_error(), "{method} {path} {shown:?} answered {status}: {answer}");
        if !status.is_success() {
            assert!(
                answer["kind"].is_string() && answer["message"].is_string(),
                "{method} {path} {shown:?}: a refusal is a JSON error, got {status} {answer}"
            );
            return;
        }
        match path {
            "/v1/pools" => {
                let name =
                    answer["name"].as_str().expect("the created spec has a name").to_string();
                let (status, shown_pool) =
                    send(&app, "GET", &format!("/v1/pools/{name}"), Vec::new()).await;
                assert_eq!(status, StatusCode::OK, "created pool {name} is shown");
                assert_eq!(shown_pool["spec"], answer, "pool {name} is shown as created");
            }
            "/v1/pools/p/acquire" => {
                // The single-key form answers the result, the list form `{"results": [...]}`.
                let results = match answer.get("results") {
                    Some(list) => list.as_array().cloned().expect("results is a list"),
                    None => vec![answer.clone()],
                };
                for r in results {
                    let key = r["key"].as_str().expect("each result names its key");
                    let id = r["id"].as_u64().expect("each result has an ID");
                    let (status, bound) = send(
                        &app,
                        "GET",
                        &format!("/v1/pools/p/keys/{}?consistent=true", escape_path(key)),
                        Vec::new(),
                    )
                    .await;
                    assert_eq!(status, StatusCode::OK, "acquired key {key:?} is found: {bound}");
                    assert_eq!(
                        bound["id"].as_u64(),
                        Some(id),
                        "key {key:?} has the ID it was given"
                    );
                }
            }
            _ => {}
        }
    });
    assert_eq!(scope.panics(), 0, "a task panicked serving {method} {path}");
}

/// Percent-encodes a key for a URL path (every byte but unreserved ASCII).
fn escape_path(key: &str) -> String {
    key.bytes()
        .map(|b| {
            if b.is_ascii_alphanumeric() || b"-._~".contains(&b) {
                (b as char).to_string()
            } else {
                format!("%{b:02X}")
            }
        })
        .collect()
}

async fn send(app: &Router, method: &str, path: &str, body: Vec<u8>) -> (StatusCode, Value) {
    let req = Request::builder()
        .method(Method::from_bytes(method.as_bytes()).expect("method"))
        .uri(path)
        .header("content-type", "application/json")
        .body(Body::from(body))
        .expect("request");
    let resp = app.clone().oneshot(req).await.expect("the router answers");
    let status = resp.status();
    let bytes = to_bytes(resp.into_body(), 1 << 22).await.expect("body");
    let value = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
    (status, value)
}
