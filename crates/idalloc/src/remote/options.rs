//! How a remote view (or reader) is set up.

use std::fmt;
use std::time::Duration;

use super::validate::Validator;

/// How a remote view is set up.
#[derive(Clone)]
pub struct RemoteOptions {
    /// Root of the remote's store keys (its `AllocatorOptions::prefix`).
    pub prefix: String,
    /// Checks beyond the built-in ones (ID in the remote's declared space, valid key), of upserts
    /// and of deletes of shown bindings (a refused delete keeps the binding: [`Validator`]).
    pub validators: Vec<Validator>,
    /// After the remote has been unreachable this long, drop its entries (with `Delete` events)
    /// rather than keep serving them. `None`: serve the stale view until it reconnects.
    pub stale_ttl: Option<Duration>,
    /// How often a watching view checks that the remote still answers (a paused server sends
    /// nothing and breaks no connection).
    pub probe_interval: Duration,
    /// Bound on each request to the remote (spec read, each page of a listing, watch creation,
    /// probe).
    pub request_timeout: Duration,
    /// Keys per page when listing.
    pub list_page: i64,
    /// Events buffered per subscriber of the view before it is told it lagged.
    pub event_buffer: usize,
}

impl Default for RemoteOptions {
    fn default() -> Self {
        RemoteOptions {
            prefix: "idalloc".into(),
            validators: Vec::new(),
            stale_ttl: None,
            probe_interval: Duration::from_secs(5),
            request_timeout: Duration::from_secs(5),
            list_page: 1000,
            event_buffer: 4096,
        }
    }
}

impl fmt::Debug for RemoteOptions {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RemoteOptions")
            .field("prefix", &self.prefix)
            .field("validators", &self.validators.len())
            .field("stale_ttl", &self.stale_ttl)
            .field("probe_interval", &self.probe_interval)
            .field("request_timeout", &self.request_timeout)
            .finish()
    }
}
