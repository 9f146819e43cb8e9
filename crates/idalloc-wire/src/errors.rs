//! The body of every error answer, and the error kinds the service sends (docs/guide/api.md, the
//! table under "Conventions"; `kind` in the OpenAPI document's `Error` schema).

use serde::{Deserialize, Serialize};

/// `{"kind","message"}`, plus `revision` with `gone` (the current revision, to re-list from).
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Eq)]
pub struct ErrorBody {
    pub kind: String,
    pub message: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub revision: Option<i64>,
}

/// The kinds of [`ErrorBody::kind`](super::ErrorBody::kind). A client must treat a kind it does
/// not know as a failure it cannot act on: the service may add kinds.
pub mod kind {
    pub const INVALID_INPUT: &str = "invalid_input";
    pub const UNAUTHENTICATED: &str = "unauthenticated";
    pub const FORBIDDEN: &str = "forbidden";
    pub const POOL_NOT_FOUND: &str = "pool_not_found";
    pub const NOT_FOUND: &str = "not_found";
    pub const SESSION_NOT_FOUND: &str = "session_not_found";
    pub const METHOD_NOT_ALLOWED: &str = "method_not_allowed";
    pub const RANGE_MISMATCH: &str = "range_mismatch";
    pub const CONFLICT: &str = "conflict";
    pub const POOL_REPLACED: &str = "pool_replaced";
    pub const EXHAUSTED: &str = "exhausted";
    pub const HOLDER_RESERVED: &str = "holder_reserved";
    pub const GONE: &str = "gone";
    pub const TOO_LARGE: &str = "too_large";
    pub const UNSUPPORTED_MEDIA_TYPE: &str = "unsupported_media_type";
    pub const RATE_LIMITED: &str = "rate_limited";
    pub const QUOTA_EXCEEDED: &str = "quota_exceeded";
    pub const OVERLOADED: &str = "overloaded";
    pub const UNAVAILABLE: &str = "unavailable";
    pub const ACCESS_DENIED: &str = "access_denied";
    pub const CORRUPT: &str = "corrupt";
    pub const INTERNAL: &str = "internal";
    /// A request the service gave up on (the status of a layer's timeout).
    pub const TIMEOUT: &str = "timeout";
    /// Only in a watch stream's last `error` event: the stream fell behind (docs/guide/api.md, Watch).
    pub const LAGGED: &str = "lagged";

    /// Every kind an error answer may carry (not [`LAGGED`], which is only an event's).
    pub const ALL: &[&str] = &[
        INVALID_INPUT,
        UNAUTHENTICATED,
        FORBIDDEN,
        POOL_NOT_FOUND,
        NOT_FOUND,
        SESSION_NOT_FOUND,
        METHOD_NOT_ALLOWED,
        RANGE_MISMATCH,
        CONFLICT,
        POOL_REPLACED,
        EXHAUSTED,
        HOLDER_RESERVED,
        GONE,
        TOO_LARGE,
        UNSUPPORTED_MEDIA_TYPE,
        RATE_LIMITED,
        QUOTA_EXCEEDED,
        OVERLOADED,
        UNAVAILABLE,
        ACCESS_DENIED,
        CORRUPT,
        INTERNAL,
        TIMEOUT,
    ];
}
