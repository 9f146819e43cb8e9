//! One request path for every call: the endpoints, failover between them, retries with backoff,
//! the bearer token, the per-request timeout.
//!
//! **What is retried** (on the next endpoint, the list taken round-robin from the one that last
//! answered): no answer at all (connection refused or reset, a timeout, a body cut off), 503
//! (`unavailable`, `overloaded`, or a proxy's 502/503/504), 429 `rate_limited` (not before its
//! `Retry-After`) and 409 `pool_replaced` (the service re-opens the pool). Every call the client
//! makes is safe to repeat: acquire is idempotent per holder and per session, a repeated release
//! answers `held: false`, pool create is idempotent for an equal spec (docs/api.md, "A write
//! answered 503 may have been applied"). Nothing else is retried: `quota_exceeded`,
//! `access_denied`, 4xx input errors, `exhausted`, `corrupt`, `internal`.
//!
//! **Backoff** ([`delay`]): each endpoint is tried once without waiting (a dead replica costs one
//! refused connection, not a sleep); after a full round, exponential backoff from `base` to `max`
//! with full jitter (anywhere from 0 to the step: `idalloc::backoff`), never shorter than the
//! service's `Retry-After`. Full rather than "equal" jitter (half the step plus a random half, as
//! this crate used before): clients that failed together keep no common floor to arrive at.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use idalloc::backoff::FullJitter;
use idalloc::Error;
use reqwest::Method;
use serde::de::DeserializeOwned;
use serde_json::Value;
use tracing::debug;

use crate::errors::{self, ApiError, Context};
use crate::options::ClientOptions;

/// The answer of a call after retries: the body of a success, or the error answer (status and
/// body) the caller may want to look at (a 404 `not_found` of a lookup is `None`, not an error).
pub(crate) enum Answer<T> {
    Ok(T),
    Refused { status: u16, body: Option<ApiError> },
}

/// Whether a failed attempt is worth another, and the least wait the service asked for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Retry {
    pub retry: bool,
    pub after: Option<Duration>,
}

/// The retry decision for an error answer (see the module docs).
pub(crate) fn retry_answer(
    status: u16,
    body: Option<&ApiError>,
    retry_after: Option<Duration>,
) -> Retry {
    let retry = match body.map(|b| b.kind.as_str()) {
        Some("unavailable" | "overloaded" | "rate_limited" | "pool_replaced") => true,
        Some(_) => false,
        None => matches!(status, 502..=504),
    };
    Retry { retry, after: retry_after }
}

/// How long to wait before attempt `attempt` (0 is the first, never delayed) over `endpoints`
/// endpoints; `jitter` in `[0, 1)`. Pure, so the schedule is tested without sleeping.
pub(crate) fn delay(
    opts: &ClientOptions,
    attempt: u32,
    endpoints: usize,
    after: Option<Duration>,
    jitter: f64,
) -> Duration {
    let endpoints = u32::try_from(endpoints.max(1)).unwrap_or(u32::MAX);
    let backoff = if attempt < endpoints {
        Duration::ZERO
    } else {
        let round = (attempt / endpoints).saturating_sub(1);
        steps(opts).wait(round, jitter)
    };
    backoff.max(after.unwrap_or(Duration::ZERO))
}

/// The client's backoff steps: from `backoff_base`, doubling to `backoff_max`, full jitter.
pub(crate) fn steps(opts: &ClientOptions) -> FullJitter {
    FullJitter { base: opts.backoff_base, cap: opts.backoff_max }
}

/// The endpoints and the HTTP client.
pub(crate) struct Transport {
    pub http: reqwest::Client,
    /// Base URLs, without a trailing `/`.
    pub endpoints: Vec<String>,
    /// The endpoint that answered last: every call starts there.
    current: AtomicUsize,
    pub opts: ClientOptions,
}

impl Transport {
    pub fn new(http: reqwest::Client, endpoints: Vec<String>, opts: ClientOptions) -> Transport {
        Transport { http, endpoints, current: AtomicUsize::new(0), opts }
    }

    /// The endpoint to start with, and its index.
    pub fn current(&self) -> usize {
        self.current.load(Ordering::Relaxed) % self.endpoints.len()
    }

    /// Moves on from endpoint `from` (if nobody moved already).
    pub fn advance(&self, from: usize) -> usize {
        let next = (from + 1) % self.endpoints.len();
        let _ = self.current.compare_exchange(from, next, Ordering::Relaxed, Ordering::Relaxed);
        next
    }

    /// A request to `path` on endpoint `i`, with the token.
    pub fn request(&self, i: usize, method: Method, path: &str) -> reqwest::RequestBuilder {
        let rb = self.http.request(method, format!("{}{path}", self.endpoints[i]));
        match &self.opts.token {
            Some(t) => rb.bearer_auth(t),
            None => rb,
        }
    }

    /// Sleeps before attempt `attempt` (see [`delay`]).
    pub async fn pause(&self, attempt: u32, after: Option<Duration>) {
        let d = delay(&self.opts, attempt, self.endpoints.len(), after, rand::random::<f64>());
        if !d.is_zero() {
            tokio::time::sleep(d).await;
        }
    }

    /// `method path` with a JSON body, retried and failed over as the module docs say. `what`
    /// names the call in errors.
    pub async fn call<T: DeserializeOwned>(
        &self,
        method: Method,
        path: &str,
        body: Option<&Value>,
        what: &str,
    ) -> Result<Answer<T>, Error> {
        let mut last = String::new();
        for attempt in 0..self.opts.attempts {
            let i = self.current();
            let mut rb = self.request(i, method.clone(), path).timeout(self.opts.request_timeout);
            if let Some(b) = body {
                rb = rb.json(b);
            }
            let outcome = match rb.send().await {
                Ok(resp) => {
                    let status = resp.status();
                    let retry_after = retry_after(&resp);
                    match resp.bytes().await {
                        Ok(bytes) => Ok((status, bytes, retry_after)),
                        Err(e) => Err(e),
                    }
                }
                Err(e) => Err(e),
            };
            let (status, bytes, after) = match outcome {
                Ok(o) => o,
                Err(e) => {
                    // No answer: this endpoint is down or unreachable, or the answer was lost.
                    last = format!("{} ({})", self.endpoints[i], describe(&e));
                    debug!(endpoint = %self.endpoints[i], error = %describe(&e), what, "no answer, failing over");
                    self.advance(i);
                    self.pause(attempt + 1, None).await;
                    continue;
                }
            };
            if status.is_success() {
                return serde_json::from_slice(&bytes)
                    .map(Answer::Ok)
                    .map_err(|e| errors::bad_answer(what, e));
            }
            let api: Option<ApiError> = serde_json::from_slice(&bytes).ok();
            let decision = retry_answer(status.as_u16(), api.as_ref(), after);
            if !decision.retry || attempt + 1 == self.opts.attempts {
                return Ok(Answer::Refused { status: status.as_u16(), body: api });
            }
            last = format!("{} answered {}", self.endpoints[i], status);
            debug!(endpoint = %self.endpoints[i], %status, what, "retryable answer, failing over");
            self.advance(i);
            self.pause(attempt + 1, decision.after).await;
        }
        Err(errors::transport(what, &last))
    }

    /// [`Transport::call`], with every error answer mapped to the library's error.
    pub async fn expect<T: DeserializeOwned>(
        &self,
        method: Method,
        path: &str,
        body: Option<&Value>,
        what: &str,
        cx: &Context<'_>,
    ) -> Result<T, Error> {
        match self.call(method, path, body, what).await? {
            Answer::Ok(t) => Ok(t),
            Answer::Refused { status, body } => Err(errors::from_answer(status, body, cx)),
        }
    }
}

/// `Retry-After` in seconds, if the answer has one.
pub(crate) fn retry_after(resp: &reqwest::Response) -> Option<Duration> {
    let v = resp.headers().get(reqwest::header::RETRY_AFTER)?.to_str().ok()?;
    v.trim().parse::<u64>().ok().map(Duration::from_secs)
}

/// A transport error with its causes (reqwest's own message says little: "error sending request").
pub(crate) fn describe(e: &reqwest::Error) -> String {
    let mut s = e.to_string();
    let mut src = std::error::Error::source(e);
    while let Some(c) = src {
        s.push_str(": ");
        s.push_str(&c.to_string());
        src = c.source();
    }
    s
}

/// Percent-encodes a path segment: everything but RFC 3986's unreserved characters (and `/`
/// when `keep_slash`: the key route takes the rest of the path, slashes included).
pub(crate) fn encode_segment(s: &str, keep_slash: bool) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        let plain = b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~');
        if plain || (keep_slash && b == b'/') {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_endpoint_is_tried_once_without_waiting_then_backoff_grows_to_its_cap() {
        let opts = ClientOptions {
            backoff_base: Duration::from_millis(100),
            backoff_max: Duration::from_secs(1),
            ..ClientOptions::default()
        };
        let d = |attempt, jitter| delay(&opts, attempt, 2, None, jitter);
        assert_eq!((d(0, 0.0), d(1, 0.99)), (Duration::ZERO, Duration::ZERO));
        // Full jitter: anywhere from 0 to the step (the old equal jitter waited at least half).
        assert_eq!(d(2, 0.0), Duration::ZERO);
        assert_eq!(d(2, 0.25), Duration::from_millis(25));
        assert_eq!(d(2, 1.0), Duration::from_millis(100));
        assert_eq!(d(4, 1.0), Duration::from_millis(200));
        assert_eq!(d(40, 1.0), Duration::from_secs(1), "capped");
        assert_eq!(d(u32::MAX, 1.0), Duration::from_secs(1), "capped, no overflow");
        // The service's Retry-After is a floor, also on a first failover.
        assert_eq!(delay(&opts, 1, 2, Some(Duration::from_secs(2)), 0.0), Duration::from_secs(2));
    }

    #[test]
    fn only_answers_said_to_be_retryable_are_retried() {
        let api = |k: &str| ApiError { kind: k.into(), message: String::new(), revision: None };
        for k in ["unavailable", "overloaded", "rate_limited", "pool_replaced"] {
            assert!(retry_answer(503, Some(&api(k)), None).retry, "{k}");
        }
        for k in ["access_denied", "quota_exceeded", "exhausted", "invalid_input", "internal"] {
            assert!(!retry_answer(409, Some(&api(k)), None).retry, "{k}");
        }
        assert!(retry_answer(502, None, None).retry && !retry_answer(404, None, None).retry);
    }

    #[test]
    fn path_segments_are_percent_encoded() {
        assert_eq!(encode_segment("a b/c?d#e%f", true), "a%20b/c%3Fd%23e%25f");
        assert_eq!(encode_segment("a/b", false), "a%2Fb");
        assert_eq!(encode_segment("é", false), "%C3%A9");
    }
}
