//! How a [`crate::Client`] talks to the service.

use std::time::Duration;

/// Options of a [`crate::Client`]. `Default` suits an agent on a LAN.
#[derive(Clone, Debug)]
pub struct ClientOptions {
    /// `Authorization: Bearer` token, when the service runs with `--auth-tokens`.
    pub token: Option<String>,
    /// Limit of one HTTP request (not of the watch stream, which never ends).
    pub request_timeout: Duration,
    /// Attempts of one call, over all endpoints (at least 1). See `transport.rs` for what is
    /// retried.
    pub attempts: u32,
    /// First backoff step, once every endpoint was tried.
    pub backoff_base: Duration,
    /// Largest backoff step.
    pub backoff_max: Duration,
    /// TTL of the client's own session (the one [`crate::Pool::acquire`] uses), opened on the
    /// first leased acquire and kept alive every third of it.
    pub session_ttl: Duration,
    /// A watch stream that brings nothing for this long (the service sends a comment every
    /// 15 s) is taken as dead and re-opened, on the next endpoint.
    pub watch_idle_timeout: Duration,
    /// Messages kept for a slow [`crate::Events`] subscriber before it is told it lagged.
    pub event_buffer: usize,
    /// Start a pool's watch (and fill its local view) only when the view is first asked for
    /// ([`crate::Pool::get`], `key_of`, `snapshot`, `events`, `wait_synced`), not when the
    /// handle is opened, as the library's `AllocatorOptions::lazy_view`. For an agent that
    /// restarts into a storm: it re-references its keys first (writes need no view; the service
    /// decides) and lists the pool afterwards, off the restoration's critical path.
    pub lazy_view: bool,
    /// An HTTP client to share between many [`crate::Client`]s (one connection pool for many
    /// agents in one process); by default each client builds its own.
    pub http: Option<reqwest::Client>,
}

impl Default for ClientOptions {
    fn default() -> Self {
        ClientOptions {
            token: None,
            request_timeout: Duration::from_secs(10),
            attempts: 8,
            backoff_base: Duration::from_millis(100),
            backoff_max: Duration::from_secs(2),
            session_ttl: Duration::from_secs(15),
            watch_idle_timeout: Duration::from_secs(45),
            event_buffer: 1024,
            lazy_view: false,
            http: None,
        }
    }
}
