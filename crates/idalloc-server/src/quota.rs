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
    burst: NonZeroU32,
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
            burst,
        }
    }

    /// Takes `n` more tokens (at most the burst, so that any request can pass once the bucket is
    /// full); `Err` is how long until they are available.
    pub fn take_n(&self, n: u32) -> Result<(), Duration> {
        let Some(n) = NonZeroU32::new(n.min(self.burst.get())) else { return Ok(()) };
        match self.limiter.check_n(n) {
            Ok(Ok(())) => Ok(()),
            Ok(Err(not_until)) => Err(not_until.wait_time_from(DefaultClock::default().now())),
            Err(_) => Err(Duration::from_secs(1)),
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

/// What a request costs in `rate=` tokens: one, plus its work beyond a cached read.
pub mod cost {
    /// Keys of a many-key acquire or release per further token (a 1,000-key acquire costs 11).
    pub const KEYS_PER_TOKEN: usize = 100;
    /// Bindings of a page per further token (a 10,000-binding page costs 11, the default
    /// 1,000-binding page 2).
    pub const BINDINGS_PER_TOKEN: usize = 1000;
    /// A consistent read (a store round trip instead of the cache) costs this many.
    pub const CONSISTENT_READ: u32 = 2;

    /// The cost of an acquire or release of `keys` keys.
    pub fn keys(keys: usize) -> u32 {
        u32::try_from(1 + keys / KEYS_PER_TOKEN).unwrap_or(u32::MAX)
    }

    /// The cost of a page of at most `limit` bindings.
    pub fn page(limit: usize) -> u32 {
        u32::try_from(1 + limit / BINDINGS_PER_TOKEN).unwrap_or(u32::MAX)
    }
}

/// Charges the work of a request of `client` that costs `cost` tokens ([`cost`]) beyond the
/// one the auth middleware took for every request: `Some(429)` (with the numbers that decided
/// it) if the client's bucket lacks them. Nothing is charged without a `rate=`.
pub fn charge(client: Option<&Client>, cost: u32, what: &str) -> Option<Response> {
    let c = client?;
    let rate = c.rate.as_ref()?;
    let after = rate.take_n(cost.saturating_sub(1)).err()?;
    Some(with_retry_after(
        ApiError::new(
            StatusCode::TOO_MANY_REQUESTS,
            "rate_limited",
            format!(
                "client {:?} is over its request rate: {what} costs {cost} (rate={} per second, \
                 burst={} in the tokens file); retry after {} ms",
                &*c.name,
                rate.per_second,
                rate.burst,
                after.as_millis()
            ),
        ),
        after,
    ))
}

/// 429 `quota_exceeded`, naming the limit.
pub fn quota_exceeded(message: String) -> ApiError {
    ApiError::new(StatusCode::TOO_MANY_REQUESTS, "quota_exceeded", message)
}
