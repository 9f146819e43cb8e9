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
    /// The longest a request body may take to arrive, whole, from the request's head
    /// ([`crate::deadline`]).
    pub body_timeout: Duration,
    /// Requests in flight at once, in total.
    pub max_requests: usize,
    /// Requests in flight at once per client (its token's name, or its IP address without
    /// tokens), HTTP/2 streams included; also each HTTP/2 connection's stream limit.
    pub max_requests_per_client: usize,
    /// Connections one client (its token's name, or its IP address without tokens) may hold;
    /// a request on a connection over it is refused 429 and the connection closed. `None`: a
    /// quarter of `max_connections`, at least 16 ([`Limits::connections_per_client`]).
    pub max_connections_per_client: Option<usize>,
    /// Watch streams one client may hold open at once (HTTP/1 and HTTP/2 alike); a further one
    /// is refused 429.
    pub max_watches_per_client: usize,
    /// Probes for peers that vanished without closing (`crate::keepalive`): TCP keepalive on
    /// accepted sockets and HTTP/2 PINGs after this long without traffic. `None`: no probes.
    pub keepalive: Option<Duration>,
}

/// The routes every client may always reach, whatever others hold: liveness, readiness and
/// metrics are never refused for lack of a request slot, and never count for a client's
/// connections (a probe must not be locked out by the clients it watches over).
pub const PROBES: [&str; 3] = ["/healthz", "/readyz", "/metrics"];

/// Whom a request counts for in the per-client limits: `client "NAME"` with tokens, else
/// `address IP`. Put in the request's extensions by [`limit_concurrency`].
#[derive(Clone, Debug)]
pub struct Who(pub Arc<str>);

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
            max_connections_per_client: None,
            max_watches_per_client: 1000,
            keepalive: Some(Duration::from_secs(30)),
        }
    }
}

impl Limits {
    /// The per-client connection cap: as set, else a quarter of the connection cap, at least 16
    /// (all of them under 16): one client cannot hold all of a large cap, and the eviction at
    /// the cap ([`crate::conn::at_the_cap`]) covers the rest.
    pub fn connections_per_client(&self) -> usize {
        let default = (self.max_connections / 4).max(self.max_connections.min(16));
        self.max_connections_per_client.unwrap_or(default).max(1)
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

/// The middleware (inside authentication, so it knows the client): counts the request's
/// connection for its client and refuses it over the client's connection cap, then takes a total
/// slot and the client's slot for the time the request is handled. The [`PROBES`] are not
/// limited (liveness, readiness and metrics must answer under load).
pub async fn limit_concurrency(
    State(st): State<Arc<AppState>>,
    mut req: Request,
    next: Next,
) -> Response {
    if req.extensions().get::<MatchedPath>().is_some_and(|m| PROBES.contains(&m.as_str())) {
        return next.run(req).await;
    }
    let limits = &st.config.limits;
    let who =
        match (req.extensions().get::<Client>(), req.extensions().get::<ConnectInfo<SocketAddr>>())
        {
            (Some(c), _) => Some(format!("client {:?}", &*c.name)),
            (None, Some(ConnectInfo(addr))) => Some(crate::conn::address_owner(addr)),
            (None, None) => None,
        };
    if let (Some(who), Some(tag)) = (&who, req.extensions().get::<crate::conn::ConnTag>()) {
        let held = tag.claim(who);
        // A client's own `connections=` (tokens file) replaces the flag's default.
        let own = req.extensions().get::<Client>().and_then(|c| c.policy.connections);
        let cap = own.unwrap_or_else(|| limits.connections_per_client());
        let setting = match own {
            Some(_) => format!("connections={cap} in the tokens file"),
            None => "--max-connections-per-client".to_string(),
        };
        if held > cap {
            let mut resp = crate::quota::with_retry_after(
                ApiError::new(
                    StatusCode::TOO_MANY_REQUESTS,
                    "rate_limited",
                    format!(
                        "{who} has {held} connections open, over its limit of {cap} \
                         ({setting}); send requests on the connections it \
                         has, or close some"
                    ),
                ),
                Duration::from_secs(1),
            );
            // This connection goes (HTTP/2 has no such header: its requests are refused alike
            // while the client holds too many).
            if req.version() < axum::http::Version::HTTP_2 {
                resp.headers_mut().insert(
                    axum::http::header::CONNECTION,
                    axum::http::HeaderValue::from_static("close"),
                );
            }
            return resp;
        }
    }
    if let Some(w) = &who {
        req.extensions_mut().insert(Who(w.as_str().into()));
    }
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
    let _mine = match &who {
        Some(who) => match st.concurrency.client_slot(who, limits.max_requests_per_client) {
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
    // The request's bulk store work takes turns with other clients' (the library's fair bulk
    // admission, docs/design/bulk-admission.md).
    match &who {
        Some(who) => idalloc::allocator::as_client(who, next.run(req)).await,
        None => next.run(req).await,
    }
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
        let per_client = |max, set| {
            Limits { max_connections: max, max_connections_per_client: set, ..Limits::default() }
                .connections_per_client()
        };
        assert_eq!((per_client(10_000, None), per_client(100, None)), (2_500, 25));
        assert_eq!((per_client(20, None), per_client(2, None), per_client(9, Some(3))), (16, 2, 3));
        assert_eq!(parse_open_files("Max open files unlimited unlimited files"), Some(u64::MAX));
        assert_eq!(parse_open_files("nothing"), None);
        let own = open_files_limit().expect("a Linux /proc");
        assert!((default_max_connections(Some(own)) as u64) < own || own <= FD_RESERVE + 16);
    }
}
