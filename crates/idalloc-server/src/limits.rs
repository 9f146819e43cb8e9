//! Connection and request limits: the settings, their defaults, and the
//! middleware that bounds concurrent requests in total and per client. The accept loop that
//! applies the connection settings is [`crate::conn`].
//!
//! Refusals are JSON: 503 `overloaded` when the whole service is at its request limit (another
//! instance may have room), 429 `rate_limited` with `Retry-After` when one client is at its own
//! (the others are still served). A request holds its slot until its answer's head is sent: a
//! watch stream counts while it is being set up, not for its whole life (streams are bounded by
//! the connection cap and, on HTTP/2, by the streams per connection).

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::extract::{ConnectInfo, MatchedPath, Request, State};
use axum::http::StatusCode;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use crate::auth::Client;
use crate::error::ApiError;
use crate::AppState;

/// The connection and request limits. Every value is a `serve` flag (and environment variable).
#[derive(Clone, Debug)]
pub struct Limits {
    /// Connections open at once (TCP, after TLS for HTTPS). At the cap a new connection closes the
    /// connection idle the longest (no request in flight); if none is idle, it is answered 503
    /// `overloaded` and closed.
    pub max_connections: usize,
    /// A new connection must say its protocol within this (its first bytes: `crate::sniff`), and
    /// an HTTP/1 client must send a request's whole header within this, also the first one
    /// (slowloris).
    pub header_timeout: Duration,
    /// A connection with no request in flight for this long is closed (HTTP/1 keep-alive and
    /// HTTP/2 alike).
    pub idle_timeout: Duration,
    /// The longest wait for the next piece of a request body.
    pub body_timeout: Duration,
    /// Requests in flight at once, in total.
    pub max_requests: usize,
    /// Requests in flight at once per client (its token's name, or its IP address without
    /// tokens), HTTP/2 streams included; also each HTTP/2 connection's stream limit.
    pub max_requests_per_client: usize,
}

/// Descriptors the process keeps for itself beyond its connections (store, log, listener, etcd).
pub const FD_RESERVE: u64 = 128;
/// The largest default connection cap.
pub const DEFAULT_MAX_CONNECTIONS: u64 = 10_000;

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_connections: default_max_connections(open_files_limit()),
            header_timeout: Duration::from_secs(10),
            idle_timeout: Duration::from_secs(60),
            body_timeout: Duration::from_secs(30),
            max_requests: 1024,
            max_requests_per_client: 128,
        }
    }
}

/// The default connection cap for a soft open-files limit `nofile` (`None`: unknown): below the
/// limit by [`FD_RESERVE`], so that connections alone never run the process out of descriptors,
/// and at most [`DEFAULT_MAX_CONNECTIONS`].
pub fn default_max_connections(nofile: Option<u64>) -> usize {
    let cap = match nofile {
        Some(n) => n.saturating_sub(FD_RESERVE).clamp(16, DEFAULT_MAX_CONNECTIONS),
        None => 1024 - FD_RESERVE,
    };
    cap as usize
}

/// The soft open-files limit of this process, from `/proc/self/limits` (Linux).
pub fn open_files_limit() -> Option<u64> {
    parse_open_files(&std::fs::read_to_string("/proc/self/limits").ok()?)
}

/// The soft limit of the `Max open files` line of a `/proc/PID/limits` text.
pub fn parse_open_files(limits: &str) -> Option<u64> {
    let line = limits.lines().find(|l| l.starts_with("Max open files"))?;
    let soft = line.trim_start_matches("Max open files").split_whitespace().next()?;
    match soft {
        "unlimited" => Some(u64::MAX),
        n => n.parse().ok(),
    }
}

/// The request slots: total and per client.
pub struct Concurrency {
    total: Arc<Semaphore>,
    per_client: Mutex<HashMap<String, Arc<Semaphore>>>,
}

impl Concurrency {
    pub fn new(limits: &Limits) -> Concurrency {
        Concurrency {
            total: Arc::new(Semaphore::new(limits.max_requests)),
            per_client: Mutex::new(HashMap::new()),
        }
    }

    fn client_slot(&self, who: &str, max: usize) -> Option<OwnedSemaphorePermit> {
        let sem = {
            let mut map = self.per_client.lock().unwrap_or_else(|p| p.into_inner());
            // Forget idle clients (all slots free, nobody else holding the semaphore).
            map.retain(|_, s| Arc::strong_count(s) > 1 || s.available_permits() < max);
            map.entry(who.to_string()).or_insert_with(|| Arc::new(Semaphore::new(max))).clone()
        };
        sem.try_acquire_owned().ok()
    }
}

/// The middleware (inside authentication, so it knows the client): takes a total slot and the
/// client's slot for the time the request is handled. `/healthz` is not limited (liveness must
/// answer under load).
pub async fn limit_concurrency(
    State(st): State<Arc<AppState>>,
    req: Request,
    next: Next,
) -> Response {
    if req.extensions().get::<MatchedPath>().is_some_and(|m| m.as_str() == "/healthz") {
        return next.run(req).await;
    }
    let limits = &st.config.limits;
    let Ok(_total) = st.concurrency.total.clone().try_acquire_owned() else {
        return ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "overloaded",
            format!(
                "the service has {} requests in flight, its limit (--max-requests); retry later \
                 or on another instance",
                limits.max_requests
            ),
        )
        .into_response();
    };
    let who =
        match (req.extensions().get::<Client>(), req.extensions().get::<ConnectInfo<SocketAddr>>())
        {
            (Some(c), _) => Some(format!("client {:?}", &*c.name)),
            (None, Some(ConnectInfo(addr))) => Some(format!("address {}", addr.ip())),
            (None, None) => None,
        };
    let _mine = match who {
        Some(who) => match st.concurrency.client_slot(&who, limits.max_requests_per_client) {
            Some(p) => Some(p),
            None => {
                return crate::quota::with_retry_after(
                    ApiError::new(
                        StatusCode::TOO_MANY_REQUESTS,
                        "rate_limited",
                        format!(
                            "{who} has {} requests in flight, its limit \
                             (--max-requests-per-client); wait for answers before sending more",
                            limits.max_requests_per_client
                        ),
                    ),
                    Duration::from_secs(1),
                );
            }
        },
        None => None,
    };
    next.run(req).await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_default_connection_cap_stays_below_the_open_files_limit() {
        let text = "Limit                     Soft Limit           Hard Limit           Units\n\
                    Max cpu time              unlimited            unlimited            seconds\n\
                    Max open files            1024                 524288               files\n";
        assert_eq!(parse_open_files(text), Some(1024));
        assert_eq!(default_max_connections(Some(1024)), 1024 - FD_RESERVE as usize);
        assert_eq!(default_max_connections(Some(100)), 16);
        assert_eq!(default_max_connections(Some(1 << 20)), DEFAULT_MAX_CONNECTIONS as usize);
        assert_eq!(default_max_connections(None), 1024 - FD_RESERVE as usize);
        assert_eq!(parse_open_files("Max open files unlimited unlimited files"), Some(u64::MAX));
        assert_eq!(parse_open_files("nothing"), None);
        let own = open_files_limit().expect("a Linux /proc");
        assert!((default_max_connections(Some(own)) as u64) < own || own <= FD_RESERVE + 16);
    }
}
