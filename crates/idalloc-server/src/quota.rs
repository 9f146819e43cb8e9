//! Enforcing the per-client quotas of the tokens file (the grammar is in
//! [`crate::grants`]). Every quota is checked before anything is written, so a refused request
//! writes nothing.
//!
//! - **Rate** (`rate=N burst=M`): a token bucket per client (GCRA, the `governor` crate), taken
//!   by every authenticated request; over it, 429 `rate_limited` with `Retry-After`.
//!   The bucket is per instance: with N instances a client may send up to N × `rate=`.
//! - **Sessions** (`sessions=N`): slot records in the store, on each session's lease, for every
//!   instance together ([`crate::slots`]).
//! - **References per pool** (`refs=N`): slot records in the store, taken before the bind, for
//!   every instance together ([`crate::ref_slots`]). Over it, 429 `quota_exceeded`.

use std::num::NonZeroU32;
use std::time::Duration;

use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use governor::clock::{Clock, DefaultClock};
use governor::{DefaultDirectRateLimiter, Quota, RateLimiter};

use crate::auth::Client;
use crate::error::ApiError;

/// A client's request-rate bucket.
pub struct Rate {
    limiter: DefaultDirectRateLimiter,
    per_second: NonZeroU32,
}

impl std::fmt::Debug for Rate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Rate({}/s)", self.per_second)
    }
}

impl Rate {
    pub fn new(per_second: NonZeroU32, burst: NonZeroU32) -> Rate {
        Rate {
            limiter: RateLimiter::direct(Quota::per_second(per_second).allow_burst(burst)),
            per_second,
        }
    }

    /// Takes one request from the bucket; `Err` is how long until one is available.
    pub fn take(&self) -> Result<(), Duration> {
        self.limiter.check().map_err(|n| n.wait_time_from(DefaultClock::default().now()))
    }
}

/// A response carrying `Retry-After` (whole seconds, rounded up, at least 1).
pub fn with_retry_after(err: ApiError, after: Duration) -> Response {
    let secs = after.as_secs() + u64::from(after.subsec_nanos() > 0);
    let mut resp = err.into_response();
    if let Ok(v) = HeaderValue::from_str(&secs.max(1).to_string()) {
        resp.headers_mut().insert(header::RETRY_AFTER, v);
    }
    resp
}

/// 429 `rate_limited` for `client`, retry after `after`.
pub fn rate_limited(client: &str, per_second: u32, after: Duration) -> Response {
    with_retry_after(
        ApiError::new(
            StatusCode::TOO_MANY_REQUESTS,
            "rate_limited",
            format!(
                "client {client:?} is over its request rate (rate={per_second} per second in the \
                 tokens file); retry after {} ms",
                after.as_millis()
            ),
        ),
        after,
    )
}

/// The rate check of the auth middleware: `Some(429)` if `client` is over its rate.
pub fn check_rate(client: &Client) -> Option<Response> {
    let rate = client.rate.as_ref()?;
    rate.take().err().map(|after| rate_limited(&client.name, rate.per_second.get(), after))
}

/// 429 `quota_exceeded`, naming the limit.
pub fn quota_exceeded(message: String) -> ApiError {
    ApiError::new(StatusCode::TOO_MANY_REQUESTS, "quota_exceeded", message)
}
