//! The audit log and request ids.
//!
//! Every mutating request (any method but GET, HEAD and OPTIONS), answered or refused, gives one
//! `tracing` event of target [`TARGET`] at `info` with the fields `request_id`, `client` (the
//! token's client name, `-` without tokens or before authentication), `operation` (a fixed set:
//! [`operation`]), `pool` (`-` if none), `keys` (the keys of an acquire or release, else 0),
//! `status` (the HTTP status), `outcome` (`ok`, `refused` for 4xx, `failed` for 5xx) and `quota`
//! (the numbers of the quota that refused the request, e.g. `pools=2 held=2`, else `-`). With
//! `--log-format json` each is one JSON line. Never a token, a session id or a key: the token is
//! only read by the auth middleware, and the session id is a capability.
//!
//! `X-Request-Id`: taken from the request when it is 1–128 visible ASCII characters, else a fresh
//! random one; echoed on every answer, so a client can find its request in the audit log.

use std::sync::{Arc, Mutex};

use axum::extract::{MatchedPath, RawPathParams, Request};
use axum::http::{HeaderName, HeaderValue, Method};
use axum::middleware::Next;
use axum::response::Response;
use axum::RequestExt;

/// The `tracing` target of audit events.
pub const TARGET: &str = "idalloc::audit";

/// The request-id header.
pub static REQUEST_ID: HeaderName = HeaderName::from_static("x-request-id");

/// What a handler learned that the audit line reports (the keys of a request, the pool a body
/// names). Put in the request's extensions by [`audit`].
#[derive(Clone, Default)]
pub struct Note(Arc<Mutex<Noted>>);

#[derive(Default)]
struct Noted {
    keys: usize,
    pool: Option<String>,
    quota: Option<String>,
}

impl Note {
    fn lock(&self) -> std::sync::MutexGuard<'_, Noted> {
        self.0.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The request names `n` keys.
    pub fn keys(&self, n: usize) {
        self.lock().keys = n;
    }

    /// The numbers of a quota that refused the request (the `quota` field; `-` otherwise).
    pub fn quota(&self, numbers: String) {
        self.lock().quota = Some(numbers);
    }

    /// The request's pool, when the path does not name it (pool create).
    pub fn pool(&self, name: &str) {
        self.lock().pool = Some(name.to_string());
    }
}

/// Who made a request (set on the answer by the auth middleware once it knows).
#[derive(Clone, Debug)]
pub struct AuditClient(pub Arc<str>);

/// The operation of a mutating `method` on `route` (`None`: no route matched): a fixed set, so
/// the field is bounded whatever requests arrive.
pub fn operation(method: &Method, route: Option<&str>) -> &'static str {
    match (method.as_str(), route.unwrap_or("")) {
        ("POST", "/v1/pools") => "pool_create",
        ("DELETE", "/v1/pools/{pool}") => "pool_delete",
        ("POST", "/v1/pools/{pool}/acquire") => "acquire",
        ("POST", "/v1/pools/{pool}/release") => "release",
        ("POST", "/v1/pools/{pool}/sweep") => "sweep",
        ("POST", "/v1/sessions") => "session_open",
        ("DELETE", "/v1/sessions/{id}") => "session_end",
        ("PUT", "/v1/sessions/{id}/keepalive") => "session_keepalive",
        _ => "other",
    }
}

/// The operation and pool of a mutating `method` on the concrete `path` (as [`operation`] for a
/// matched route), for requests refused before any route was matched.
pub fn operation_of_path(method: &str, path: &str) -> (&'static str, Option<String>) {
    let path = path.split('?').next().unwrap_or("");
    let segs: Vec<&str> = path.trim_start_matches('/').split('/').collect();
    // As sent (pool names need no escaping); cut so that a long path cannot make a long line.
    let pool = |s: &str| Some(s.chars().take(128).collect::<String>());
    match (method, segs.as_slice()) {
        ("POST", ["v1", "pools"]) => ("pool_create", None),
        ("DELETE", ["v1", "pools", p]) => ("pool_delete", pool(p)),
        ("POST", ["v1", "pools", p, "acquire"]) => ("acquire", pool(p)),
        ("POST", ["v1", "pools", p, "release"]) => ("release", pool(p)),
        ("POST", ["v1", "pools", p, "sweep"]) => ("sweep", pool(p)),
        ("POST", ["v1", "sessions"]) => ("session_open", None),
        ("DELETE", ["v1", "sessions", _]) => ("session_end", None),
        ("PUT", ["v1", "sessions", _, "keepalive"]) => ("session_keepalive", None),
        _ => ("other", None),
    }
}

/// The audit line of a connection refused at the connection cap (503 `overloaded`), from the
/// request head it had sent (`head`, possibly partial or empty): written when that names a
/// mutating request, as for any other refusal, with the client `-` (its token was not read) and
/// its address. An HTTP/2 connection refused there sent no request yet and leaves no line.
pub fn refused_at_connection_cap(head: &[u8], addr: &std::net::SocketAddr) {
    let text = String::from_utf8_lossy(&head[..head.len().min(8192)]);
    let mut first = text.lines().next().unwrap_or("").split(' ');
    let (Some(method), Some(path)) = (first.next(), first.next()) else { return };
    if matches!(method, "GET" | "HEAD" | "OPTIONS" | "PRI") || method.is_empty() {
        return;
    }
    let id = text
        .lines()
        .skip(1)
        .take_while(|l| !l.is_empty())
        .filter_map(|l| l.split_once(':'))
        .find(|(k, _)| k.trim().eq_ignore_ascii_case(REQUEST_ID.as_str()))
        .and_then(|(_, v)| HeaderValue::from_str(v.trim()).ok())
        .and_then(|v| given_id(&v))
        .unwrap_or_else(fresh_id);
    let (operation, pool) = operation_of_path(method, path);
    tracing::info!(
        target: TARGET,
        request_id = %String::from_utf8_lossy(id.as_bytes()),
        client = "-",
        address = %addr.ip(),
        operation,
        pool = pool.as_deref().unwrap_or("-"),
        keys = 0,
        status = 503,
        outcome = "failed",
        reason = "connection_cap",
        "audit"
    );
}

/// A request id the client sent, if usable: 1–128 visible ASCII characters.
fn given_id(v: &HeaderValue) -> Option<HeaderValue> {
    let b = v.as_bytes();
    let ok = !b.is_empty() && b.len() <= 128 && b.iter().all(|c| c.is_ascii_graphic());
    ok.then(|| v.clone())
}

fn fresh_id() -> HeaderValue {
    let n: u128 = rand::random();
    HeaderValue::from_str(&format!("{n:032x}")).unwrap_or(HeaderValue::from_static("unknown"))
}

/// The middleware: request id in and out, and the audit line of mutating requests.
pub async fn audit(mut req: Request, next: Next) -> Response {
    let id = req.headers().get(&REQUEST_ID).and_then(given_id).unwrap_or_else(fresh_id);
    req.headers_mut().insert(REQUEST_ID.clone(), id.clone());
    let method = req.method().clone();
    let mutating = !matches!(method, Method::GET | Method::HEAD | Method::OPTIONS);
    let route = req.extensions().get::<MatchedPath>().map(|m| m.as_str().to_string());
    let note = Note::default();
    req.extensions_mut().insert(note.clone());
    let path_pool = match mutating {
        true => req
            .extract_parts::<RawPathParams>()
            .await
            .ok()
            .and_then(|p| p.iter().find(|(k, _)| *k == "pool").map(|(_, v)| v.to_string())),
        false => None,
    };
    let mut resp = next.run(req).await;
    if mutating {
        let status = resp.status();
        let outcome = match status.as_u16() {
            200..=399 => "ok",
            400..=499 => "refused",
            _ => "failed",
        };
        let client = resp.extensions().get::<AuditClient>().map(|c| c.0.clone());
        let noted = note.lock();
        let pool = path_pool.as_deref().or(noted.pool.as_deref()).unwrap_or("-");
        tracing::info!(
            target: TARGET,
            request_id = %String::from_utf8_lossy(id.as_bytes()),
            client = client.as_deref().unwrap_or("-"),
            operation = operation(&method, route.as_deref()),
            pool,
            keys = noted.keys,
            status = status.as_u16(),
            outcome,
            quota = noted.quota.as_deref().unwrap_or("-"),
            "audit"
        );
    }
    resp.headers_mut().insert(REQUEST_ID.clone(), id);
    resp
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn request_ids_are_kept_when_sane_and_operations_are_a_fixed_set() {
        assert!(given_id(&HeaderValue::from_static("abc-123")).is_some());
        assert!(given_id(&HeaderValue::from_static("has space")).is_none());
        assert!(given_id(&HeaderValue::from_static("")).is_none());
        assert!(given_id(&HeaderValue::from_str(&"x".repeat(129)).expect("value")).is_none());
        assert_eq!(fresh_id().len(), 32);
        assert_eq!(operation(&Method::POST, Some("/v1/pools/{pool}/acquire")), "acquire");
        assert_eq!(operation(&Method::from_bytes(b"BREW").expect("method"), None), "other");
        assert_eq!(
            operation_of_path("POST", "/v1/pools/ab/acquire?x=1"),
            ("acquire", Some("ab".to_string()))
        );
        assert_eq!(operation_of_path("POST", "/v1/pools"), ("pool_create", None));
        assert_eq!(operation_of_path("DELETE", "/v1/sessions/s"), ("session_end", None));
        assert_eq!(operation_of_path("POST", "/nope"), ("other", None));
    }
}
