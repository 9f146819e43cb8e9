//! The API's errors: one JSON body `{"kind","message"}` for every failure, and the mapping of the
//! library's G6 errors to HTTP statuses.
//!
//! | kind | status | meaning |
//! |---|---|---|
//! | `invalid_input` | 400 | bad key, pool name, spec, TTL, malformed JSON, unknown field, bad query parameter or path segment |
//! | `unauthenticated`, `forbidden` | 401, 403 | no or unknown token; a scope that does not cover the route (`auth.rs`) |
//! | `pool_not_found`, `not_found`, `session_not_found` | 404 | no such pool / key / ID / route / session |
//! | `method_not_allowed` | 405 | the route exists, the method is not one of it (`Allow` lists them) |
//! | `range_mismatch`, `conflict` | 409 | the pool exists with another spec; a held key changed ID |
//! | `invalid_input` ([`idalloc::Input::PoolInUse`]) | 409 | deleting a pool that still has records, without `force` |
//! | `pool_replaced` | 409 | the pool was deleted and re-created under a handle (the service re-opens it: retry) |
//! | `exhausted` | 409 | the pool has no free ID: retrying does not help until IDs are released |
//! | `holder_reserved` | 409 | a durable acquire or release named a session's holder (`sessions.rs`) |
//! | `gone` | 410 | a watch resumed from a revision the service no longer holds (the answer has the current one) |
//! | `too_large` | 413 | request body over the limit |
//! | `unsupported_media_type` | 415 | a request body with a `Content-Type` that is not JSON |
//! | `rate_limited`, `quota_exceeded` | 429 | over the client's request rate or requests in flight (`Retry-After`); at its `sessions=` or `refs=` quota (`limits.rs`, `quota.rs`) |
//! | `overloaded` | 503 | the service is at its request or connection limit (`limits.rs`, `conn.rs`) |
//! | `unavailable` | 503 | the store did not answer in time, or the service is shutting down |
//! | `access_denied` | 503 | the store refused the service's credentials (fix its configuration) |
//! | `corrupt` | 500 | the store holds a record idalloc cannot use (named in the message; see `idalloc check`) |
//!
//! Errors the handlers do not make (a rejection of one of axum's extractors, a response of a layer)
//! are turned into this body too by [`json_errors`], with the kind of their status
//! ([`kind_of_status`]), so no error answer is ever plain text.
//!
//! Exhausted is 409, not 507: a 5xx tells proxies and client libraries to retry, and retrying a
//! full pool only adds load; 409 says "the state of the resource forbids this now".

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{FromRequest, Request};
use axum::http::{header, HeaderMap, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use serde::de::DeserializeOwned;

/// An API failure: status, kind, message.
#[derive(Debug, Clone)]
pub struct ApiError {
    pub status: StatusCode,
    pub kind: &'static str,
    pub message: String,
    /// A store revision the client should use next (`gone`: the current one, to re-list from).
    pub revision: Option<i64>,
}

impl ApiError {
    pub fn new(status: StatusCode, kind: &'static str, message: impl Into<String>) -> Self {
        ApiError { status, kind, message: message.into(), revision: None }
    }

    pub fn invalid(message: impl Into<String>) -> Self {
        Self::new(StatusCode::BAD_REQUEST, "invalid_input", message)
    }

    pub fn not_found(message: impl Into<String>) -> Self {
        Self::new(StatusCode::NOT_FOUND, "not_found", message)
    }

    pub fn session_not_found() -> Self {
        Self::new(
            StatusCode::NOT_FOUND,
            "session_not_found",
            "no such session: no replica knows the id, the session ended, or its lease expired \
             (its references are gone); open a new session",
        )
    }

    pub fn unavailable(message: impl Into<String>) -> Self {
        Self::new(StatusCode::SERVICE_UNAVAILABLE, "unavailable", message)
    }
}

/// G6 → HTTP (see the module docs).
impl From<idalloc::Error> for ApiError {
    fn from(e: idalloc::Error) -> Self {
        use idalloc::{Error as E, Input};
        let status = match &e {
            // The pool's records stand in the way, not the request: 409, like `exhausted`.
            E::InvalidInput { input: Input::PoolInUse, .. } => StatusCode::CONFLICT,
            // The session's lease expired or was ended: the session is gone.
            E::InvalidInput { input: Input::SessionGone, .. } => {
                return ApiError::session_not_found();
            }
            E::InvalidInput { .. } => StatusCode::BAD_REQUEST,
            E::PoolNotFound { .. } => StatusCode::NOT_FOUND,
            E::RangeMismatch { .. }
            | E::PoolReplaced { .. }
            | E::Conflict { .. }
            | E::Exhausted { .. } => StatusCode::CONFLICT,
            // The store refused this service's credentials: the service cannot serve (503), and
            // the kind tells an operator that waiting will not help.
            E::Unavailable { .. } | E::AccessDenied { .. } => StatusCode::SERVICE_UNAVAILABLE,
            // The store holds data idalloc cannot use: a fault on the server's side that retrying
            // will not cure (a 503 would invite retries), so 500, with the record named.
            E::Corrupt { .. } => StatusCode::INTERNAL_SERVER_ERROR,
        };
        ApiError { status, kind: e.kind(), message: e.to_string(), revision: None }
    }
}

impl From<crate::flight::Abandoned> for ApiError {
    /// A shared store read went away unanswered: like a store that did not answer, retry.
    fn from(a: crate::flight::Abandoned) -> Self {
        ApiError::unavailable(a.to_string())
    }
}

impl From<idalloc::store::StoreError> for ApiError {
    fn from(e: idalloc::store::StoreError) -> Self {
        idalloc::Error::from(e).into()
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let body = serde_json::to_vec(&idalloc_wire::ErrorBody {
            kind: self.kind.to_string(),
            message: self.message,
            revision: self.revision,
        })
        .unwrap_or_default();
        (self.status, [(axum::http::header::CONTENT_TYPE, "application/json")], body)
            .into_response()
    }
}

/// Whether a `Content-Type` names JSON: `application/json` or `application/*+json`, with any
/// parameters (`; charset=utf-8`), case-insensitive.
pub fn is_json(content_type: &str) -> bool {
    let essence = content_type.split(';').next().unwrap_or("").trim().to_ascii_lowercase();
    match essence.strip_prefix("application/") {
        Some(sub) => sub == "json" || sub.ends_with("+json"),
        None => false,
    }
}

/// A JSON request body, parsed strictly: a `Content-Type` other than JSON is refused (415; none
/// at all is taken as JSON), the body limit enforced (413), malformed JSON and unknown fields (the
/// types use `deny_unknown_fields`) rejected with a 400 JSON error naming the problem.
pub struct ApiJson<T>(pub T);

impl<S: Send + Sync, T: DeserializeOwned> FromRequest<S> for ApiJson<T> {
    type Rejection = ApiError;

    async fn from_request(req: Request, state: &S) -> Result<Self, Self::Rejection> {
        check_content_type(req.headers())?;
        let bytes = Bytes::from_request(req, state).await.map_err(|e: BytesRejection| {
            if e.status() == StatusCode::PAYLOAD_TOO_LARGE {
                ApiError::new(
                    StatusCode::PAYLOAD_TOO_LARGE,
                    "too_large",
                    format!("request body is over the limit: {}", e.body_text()),
                )
            } else {
                ApiError::invalid(format!("cannot read the request body: {}", e.body_text()))
            }
        })?;
        serde_json::from_slice(&bytes)
            .map(ApiJson)
            .map_err(|e| ApiError::invalid(format!("invalid JSON body: {e}")))
    }
}

fn check_content_type(headers: &HeaderMap) -> Result<(), ApiError> {
    let Some(v) = headers.get(header::CONTENT_TYPE) else { return Ok(()) };
    match v.to_str() {
        Ok(ct) if is_json(ct) => Ok(()),
        other => Err(ApiError::new(
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            "unsupported_media_type",
            format!(
                "Content-Type {} is not JSON: send the body as `Content-Type: application/json` \
                 (curl: --json)",
                crate::error::show(other.unwrap_or("(not text)"))
            ),
        )),
    }
}

/// A client's value in a message: quoted, cut at 100 characters.
pub fn show(v: &str) -> String {
    idalloc::error::show_value(v)
}

/// Parses query parameter `name` (`raw`, as sent) as a `T`; the error names the parameter, the
/// value and what is allowed.
pub fn param<T: std::str::FromStr>(name: &str, raw: &str, allowed: &str) -> Result<T, ApiError> {
    raw.parse().map_err(|_| ApiError::invalid(format!("invalid {name} {}: {allowed}", show(raw))))
}

/// A query string's parameters, parsed strictly (unknown parameters are refused): 400
/// `invalid_input` with the reason, never axum's plain-text rejection. Values are strings; the
/// handlers parse them with [`param`], so the error names the value and what is allowed.
pub struct ApiQuery<T>(pub T);

impl<S: Send + Sync, T: DeserializeOwned> axum::extract::FromRequestParts<S> for ApiQuery<T> {
    type Rejection = ApiError;

    async fn from_request_parts(
        parts: &mut axum::http::request::Parts,
        state: &S,
    ) -> Result<Self, Self::Rejection> {
        match axum::extract::Query::<T>::from_request_parts(parts, state).await {
            Ok(axum::extract::Query(q)) => Ok(ApiQuery(q)),
            Err(e) => Err(ApiError::invalid(format!(
                "invalid query string {}: {}",
                show(parts.uri.query().unwrap_or("")),
                e.body_text().trim_start_matches("Failed to deserialize query string: ")
            ))),
        }
    }
}

/// The status's kind for an error answer that has no JSON body of ours (see [`json_errors`]).
pub fn kind_of_status(status: StatusCode) -> &'static str {
    match status.as_u16() {
        400 | 422 => "invalid_input",
        404 => "not_found",
        405 => "method_not_allowed",
        408 => "timeout",
        410 => "gone",
        413 => "too_large",
        415 => "unsupported_media_type",
        429 => "rate_limited",
        503 => "unavailable",
        s if s >= 500 => "internal",
        _ => "invalid_input",
    }
}

/// Largest plain-text error body turned into a message (axum's rejections are one line).
const MAX_REWRITTEN: usize = 4096;

/// The middleware that makes every error answer JSON: an error (4xx, 5xx) whose body is not
/// already JSON becomes `{"kind","message"}` with the kind of its status and its text as the
/// message. Headers (`Allow`, `WWW-Authenticate`, `Retry-After`, `Connection`) are kept.
pub async fn json_errors(req: Request, next: Next) -> Response {
    let resp = next.run(req).await;
    let status = resp.status();
    if !(status.is_client_error() || status.is_server_error()) {
        return resp;
    }
    let json =
        resp.headers().get(header::CONTENT_TYPE).and_then(|v| v.to_str().ok()).is_some_and(is_json);
    if json {
        return resp;
    }
    let (mut parts, body) = resp.into_parts();
    let text = match axum::body::to_bytes(body, MAX_REWRITTEN).await {
        Ok(b) => String::from_utf8_lossy(&b).trim().to_string(),
        Err(_) => String::new(),
    };
    let message = if text.is_empty() {
        status.canonical_reason().unwrap_or("error").to_string()
    } else {
        text
    };
    let mut out = ApiError::new(status, kind_of_status(status), message).into_response();
    parts.headers.remove(header::CONTENT_TYPE);
    parts.headers.remove(header::CONTENT_LENGTH);
    for (k, v) in out.headers() {
        parts.headers.insert(k.clone(), v.clone());
    }
    *out.headers_mut() = parts.headers;
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use idalloc::Input;

    #[test]
    fn json_content_types_and_status_kinds() {
        for ct in ["application/json", "Application/JSON; charset=utf-8", "application/merge+json"]
        {
            assert!(is_json(ct), "{ct}");
        }
        for ct in
            ["text/plain", "application/jsonx", "json", "", "application/x-www-form-urlencoded"]
        {
            assert!(!is_json(ct), "{ct}");
        }
        let doc: serde_json::Value = serde_json::from_str(crate::OPENAPI).expect("openapi.json");
        let listed = doc["components"]["schemas"]["Error"]["properties"]["kind"]["enum"]
            .as_array()
            .expect("kind enum")
            .clone();
        for s in [400, 404, 405, 410, 413, 415, 500, 502, 503] {
            let kind = kind_of_status(StatusCode::from_u16(s).expect("status"));
            assert!(listed.iter().any(|k| k == kind), "{s} → {kind} missing from openapi.json");
        }
    }

    #[test]
    fn g6_errors_map_to_documented_statuses() {
        let cases = [
            (idalloc::Error::invalid(Input::Key, "key", "\"\"", "non-empty"), 400, "invalid_input"),
            (idalloc::Error::PoolNotFound { pool: "p".into() }, 404, "pool_not_found"),
            (
                idalloc::Error::Exhausted { pool: "p".into(), min: 1, max: 2, capacity: 2 },
                409,
                "exhausted",
            ),
            (idalloc::Error::unavailable("down"), 503, "unavailable"),
            (idalloc::Error::unavailable_for_good("closed"), 503, "unavailable"),
            (
                idalloc::Error::invalid(Input::PoolInUse, "pool to delete", "p", "has records"),
                409,
                "invalid_input",
            ),
            (
                idalloc::Error::invalid(Input::SessionGone, "client session", "lease 1", "gone"),
                404,
                "session_not_found",
            ),
            (idalloc::Error::corrupt("P/pools/p", "unreadable"), 500, "corrupt"),
            (idalloc::Error::AccessDenied { reason: "no".into() }, 503, "access_denied"),
            (idalloc::Error::PoolReplaced { pool: "p".into() }, 409, "pool_replaced"),
            (
                idalloc::Error::Conflict {
                    pool: "p".into(),
                    key: "k".into(),
                    old_id: 1,
                    new_id: 2,
                },
                409,
                "conflict",
            ),
        ];
        let doc: serde_json::Value = serde_json::from_str(crate::OPENAPI).expect("openapi.json");
        let listed = &doc["components"]["schemas"]["Error"]["properties"]["kind"]["enum"];
        for (e, status, kind) in cases {
            let a = ApiError::from(e);
            assert_eq!(a.status.as_u16(), status, "{a:?}");
            assert_eq!(a.kind, kind);
            let listed = listed.as_array().expect("kind enum");
            assert!(listed.iter().any(|k| k == kind), "{kind} missing from openapi.json");
        }
    }
}
