//! The service's errors (`{"kind","message"}` with a status, docs/guide/api.md) as the library's
//! [`idalloc::Error`], so that code written against the library ports over: the same variants
//! where the service's kind has one, and retryable exactly when the library's would be.
//!
//! Pure: a status, a body and what the call was about in; an error out. The I/O is in
//! `transport.rs`.

use idalloc::{Error, Input, PoolSpec};
use idalloc_wire::errors::kind;

/// The body of every error answer.
pub use idalloc_wire::ErrorBody as ApiError;

/// What a failed call was about, for the error variants that name it.
#[derive(Debug, Clone, Default)]
pub struct Context<'a> {
    /// The pool the call named.
    pub pool: Option<&'a str>,
    /// The pool's spec, if the caller knows it (fills `Exhausted`'s range and capacity).
    pub spec: Option<&'a PoolSpec>,
}

/// An error answer of the service as a library error. `status` is the HTTP status; `body` its
/// parsed body, or `None` if it was not the service's error JSON (a proxy's page, say).
pub fn from_answer(status: u16, body: Option<ApiError>, cx: &Context<'_>) -> Error {
    let Some(ApiError { kind, message, .. }) = body else {
        // Not the service's answer: a proxy or a load balancer in between. 502/503/504 from one
        // are worth retrying (another replica may be up); anything else is not.
        return Error::Unavailable {
            reason: format!(
                "idalloc serve (or a proxy before it) answered HTTP {status} without an error body"
            ),
            retryable: matches!(status, 502..=504),
            source: None,
        };
    };
    let pool = || cx.pool.unwrap_or("?").to_string();
    let unavailable = |retryable: bool| Error::Unavailable {
        reason: format!("idalloc serve answered {status} {kind}: {message}"),
        retryable,
        source: None,
    };
    match kind.as_str() {
        kind::POOL_NOT_FOUND => Error::PoolNotFound { pool: pool() },
        kind::POOL_REPLACED => Error::PoolReplaced { pool: pool() },
        kind::EXHAUSTED => match cx.spec {
            Some(s) => Error::Exhausted {
                pool: pool(),
                min: s.min(),
                max: s.max(),
                capacity: s.capacity(),
            },
            None => unavailable(false),
        },
        // The library's own words for a session whose lease is gone.
        kind::SESSION_NOT_FOUND => Error::invalid(
            Input::SessionGone,
            "client session",
            "(its id is a secret)",
            format!("{message}; open a new session"),
        ),
        kind::HOLDER_RESERVED => Error::invalid(Input::Holder, "holder", "", message),
        // 409 invalid_input is the library's `PoolInUse` (docs/guide/api.md); 400 is the request.
        kind::INVALID_INPUT if status == 409 => {
            Error::invalid(Input::PoolInUse, "pool to delete", pool(), message)
        }
        kind::INVALID_INPUT => {
            Error::invalid(Input::Options, "request to idalloc serve", "", message)
        }
        kind::UNAUTHENTICATED | kind::FORBIDDEN | kind::ACCESS_DENIED => Error::AccessDenied {
            reason: format!("idalloc serve answered {status} {kind}: {message}"),
        },
        kind::CORRUPT => {
            Error::Corrupt { what: "the store behind idalloc serve".into(), reason: message }
        }
        // Answered before anything was written, and meant to be retried.
        kind::UNAVAILABLE | kind::OVERLOADED | kind::RATE_LIMITED => unavailable(true),
        // A limit of this client: waiting will not lift it.
        kind::QUOTA_EXCEEDED => unavailable(false),
        // The rest are bugs of the client or the service (a route or method it does not have,
        // a body it refused, `internal`), or kinds newer than this client.
        _ => unavailable(false),
    }
}

/// A transport failure (no answer: refused, reset, timed out, a broken body) after the last
/// attempt, on every endpoint tried.
pub fn transport(what: &str, last: &str) -> Error {
    Error::Unavailable {
        reason: format!("no idalloc serve endpoint answered {what}: {last}"),
        retryable: true,
        source: None,
    }
}

/// A `2xx` answer whose body is not what the API documents.
pub fn bad_answer(what: &str, detail: impl std::fmt::Display) -> Error {
    Error::Unavailable {
        reason: format!("idalloc serve's answer to {what} is not what its API documents: {detail}"),
        retryable: false,
        source: None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn answer(status: u16, kind: &str) -> Error {
        let spec = PoolSpec::new("vni", 10, 19);
        let cx = Context { pool: Some("vni"), spec: Some(&spec) };
        let body = ApiError { kind: kind.into(), message: "m".into(), revision: None };
        from_answer(status, Some(body), &cx)
    }

    #[test]
    fn kinds_map_to_the_library_variants_and_keep_retryable() {
        assert_eq!(answer(404, "pool_not_found"), Error::PoolNotFound { pool: "vni".into() });
        assert!(matches!(
            answer(409, "exhausted"),
            Error::Exhausted { min: 10, max: 19, capacity: 10, .. }
        ));
        assert!(matches!(
            answer(404, "session_not_found"),
            Error::InvalidInput { input: Input::SessionGone, .. }
        ));
        assert!(matches!(
            answer(409, "invalid_input"),
            Error::InvalidInput { input: Input::PoolInUse, .. }
        ));
        assert!(matches!(
            answer(400, "invalid_input"),
            Error::InvalidInput { input: Input::Options, .. }
        ));
        assert!(matches!(
            answer(409, "holder_reserved"),
            Error::InvalidInput { input: Input::Holder, .. }
        ));
        assert!(matches!(answer(403, "forbidden"), Error::AccessDenied { .. }));
        assert!(matches!(answer(503, "access_denied"), Error::AccessDenied { .. }));
        assert!(matches!(answer(500, "corrupt"), Error::Corrupt { .. }));
        for kind in ["unavailable", "overloaded", "rate_limited"] {
            assert!(answer(503, kind).is_retryable(), "{kind}");
        }
        for kind in ["quota_exceeded", "internal", "too_large", "what_is_this"] {
            let e = answer(500, kind);
            assert!(!e.is_retryable() && e.kind() == "unavailable", "{kind}: {e:?}");
        }
        let proxy = from_answer(502, None, &Context::default());
        assert!(proxy.is_retryable());
        assert!(!from_answer(418, None, &Context::default()).is_retryable());
    }
}
