//! Enforcing the per-client quotas of the tokens file (the grammar is in
//! [`crate::grants`]). Every quota is checked before anything is written, so a refused request
//! writes nothing.
//!
//! - **Rate** (`rate=N burst=M`): a token bucket per client (GCRA, the `governor` crate), taken
//!   by every authenticated request; over it, 429 `rate_limited` with `Retry-After`.
//! - **Sessions** (`sessions=N`): counted in this instance's registry, with a slot reserved
//!   before the lease is granted, so concurrent opens cannot pass the limit together.
//! - **References per pool** (`refs=N`): counted from the store (the pool's `ref/` records whose
//!   holder is one of the client's durable holders `NAME/…` or one of its live sessions) under a
//!   per-(client, pool) lock held until the write is done, so one instance never lets the same
//!   client pass the limit; two instances serving the same client can each pass a check before
//!   the other's write lands (the limit can then be exceeded by the keys of the requests in
//!   flight at once). Over it, 429 `quota_exceeded`.

use std::collections::{HashMap, HashSet};
use std::num::NonZeroU32;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use governor::clock::{Clock, DefaultClock};
use governor::{DefaultDirectRateLimiter, Quota, RateLimiter};
use idalloc::store::{GetRequest, KeyRange};
use tokio::sync::OwnedMutexGuard;

use crate::auth::Client;
use crate::error::ApiError;
use crate::AppState;

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

/// A (client, pool) pair's lock.
type PairLock = Arc<tokio::sync::Mutex<()>>;

/// Per-(client, pool) locks of the reference quota.
#[derive(Default)]
pub struct RefLocks {
    locks: Mutex<HashMap<(Arc<str>, String), PairLock>>,
}

impl RefLocks {
    async fn lock(&self, client: &Arc<str>, pool: &str) -> OwnedMutexGuard<()> {
        let m = {
            let mut map = self.locks.lock().unwrap_or_else(|p| p.into_inner());
            // Forget locks nobody holds or waits for, so the map stays as small as the traffic.
            map.retain(|_, m| Arc::strong_count(m) > 1);
            map.entry((client.clone(), pool.to_string())).or_default().clone()
        };
        m.lock_owned().await
    }
}

/// The reference quota of an acquire: with `refs=N` for `client`, takes the (client, pool) lock,
/// counts the client's references in `pool` and those `keys` would add for `holder`, and refuses
/// if the sum is over N. The guard must be held until the write is done. `None`: no quota.
pub async fn check_refs(
    st: &AppState,
    client: Option<&Client>,
    pool: &str,
    keys: &[String],
    holder: &str,
) -> Result<Option<OwnedMutexGuard<()>>, ApiError> {
    let Some(c) = client else { return Ok(None) };
    let Some(limit) = c.policy.refs else { return Ok(None) };
    let guard = st.ref_locks.lock(&c.name, pool).await;
    let sessions: HashSet<String> = st.sessions.holders_of(&c.name).into_iter().collect();
    let own = format!("{}{}", c.name, crate::auth::HOLDER_SEPARATOR);
    let prefix = st.layout.refs_prefix(pool);
    let resp = st.store.get(GetRequest::new(KeyRange::prefix(prefix)).keys_only()).await?;
    let mut held = 0u64;
    let mut by_holder = HashSet::new();
    for kv in &resp.kvs {
        let Some((key, h)) = st.layout.parse_ref_key(pool, &kv.key) else { continue };
        if h.starts_with(&own) || sessions.contains(&h) {
            held += 1;
            if h == holder {
                by_holder.insert(key);
            }
        }
    }
    let adds = keys.iter().collect::<HashSet<_>>().into_iter().filter(|k| !by_holder.contains(*k));
    let adds = adds.count() as u64;
    if adds > 0 && held + adds > limit {
        return Err(quota_exceeded(format!(
            "client {:?} holds {held} references in pool {pool:?} and this request would add \
             {adds}: over its limit of {limit} (refs={limit} in the tokens file); release some \
             first",
            &*c.name
        )));
    }
    Ok(Some(guard))
}
