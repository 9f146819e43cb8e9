//! Helpers shared by the service's in-process tests (the router driven with `tower::oneshot`,
//! no socket).

use axum::body::Body;
use axum::http::Request;
use serde_json::Value;
use tower::ServiceExt;

/// `method uri` with a JSON `body` (empty for none) through `app`: the status and the answer's
/// JSON (`Null` if it has none).
pub async fn call(app: &axum::Router, method: &str, uri: &str, body: &str) -> (u16, Value) {
    let req = Request::builder()
        .method(method)
        .uri(uri)
        .header("content-type", "application/json")
        .body(Body::from(body.to_string()))
        .expect("request");
    let resp = app.clone().oneshot(req).await.expect("response");
    let status = resp.status().as_u16();
    let bytes = axum::body::to_bytes(resp.into_body(), 1 << 24).await.expect("body");
    (status, serde_json::from_slice(&bytes).unwrap_or(Value::Null))
}
