//! The API's errors: one JSON body `{"kind","message"}` for every failure, and the mapping of the
//! library's G6 errors to HTTP statuses.
//!
//! | kind | status | meaning |
//! |---|---|---|
//! | `invalid_input` | 400 | bad key, pool name, spec, TTL, malformed JSON, unknown field |
//! | `pool_not_found`, `not_found`, `session_not_found` | 404 | no such pool / key / ID / route / session |
//! | `range_mismatch`, `conflict` | 409 | the pool exists with another spec; a held key changed ID |
//! | `invalid_input` ([`idalloc::Input::PoolInUse`]) | 409 | deleting a pool that still has records, without `force` |
//! | `pool_replaced` | 409 | the pool was deleted and re-created under a handle (the service re-opens it: retry) |
//! | `exhausted` | 409 | the pool has no free ID: retrying does not help until IDs are released |
//! | `too_large` | 413 | request body over the limit |
//! | `method_not_allowed` | 405 | |
//! | `unavailable` | 503 | the store did not answer in time, or the service is shutting down |
//! | `access_denied` | 503 | the store refused the service's credentials (fix its configuration) |
//! | `corrupt` | 500 | the store holds a record idalloc cannot use (named in the message; see `idalloc check`) |
//!
//! Exhausted is 409, not 507: a 5xx tells proxies and client libraries to retry, and retrying a
//! full pool only adds load; 409 says "the state of the resource forbids this now".

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{FromRequest, Request};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde::de::DeserializeOwned;
use serde::Serialize;

/// An API failure: status, kind, message.
#[derive(Debug, Clone)]
pub struct ApiError {
    pub status: StatusCode,
    pub kind: &'static str,
    pub message: String,
}

#[derive(Serialize)]
struct Body<'a> {
    kind: &'a str,
    message: &'a str,
}

impl ApiError {
    pub fn new(status: StatusCode, kind: &'static str, message: impl Into<String>) -> Self {
        ApiError { status, kind, message: message.into() }
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
            "no such session: it was never opened here, has ended, or its lease expired (its \
             references are gone); open a new session",
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
        ApiError { status, kind: e.kind(), message: e.to_string() }
    }
}

impl From<idalloc::store::StoreError> for ApiError {
    fn from(e: idalloc::store::StoreError) -> Self {
        idalloc::Error::from(e).into()
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let body = serde_json::to_vec(&Body { kind: self.kind, message: &self.message })
            .unwrap_or_default();
        (self.status, [(axum::http::header::CONTENT_TYPE, "application/json")], body)
            .into_response()
    }
}

/// A JSON request body, parsed strictly: any content type (clients in any language can send it
/// without ceremony), the body limit enforced (413), malformed JSON and unknown fields (the types
/// use `deny_unknown_fields`) rejected with a 400 JSON error naming the problem.
pub struct ApiJson<T>(pub T);

impl<S: Send + Sync, T: DeserializeOwned> FromRequest<S> for ApiJson<T> {
    type Rejection = ApiError;

    async fn from_request(req: Request, state: &S) -> Result<Self, Self::Rejection> {
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

#[cfg(test)]
mod tests {
    use super::*;
    use idalloc::Input;

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
