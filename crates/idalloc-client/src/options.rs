//! How a [`crate::Client`] talks to the service.

use std::time::Duration;

use idalloc::{Error, Input, Result};

/// Options of a [`crate::Client`]. `Default` suits an agent on a LAN. Build them with
/// [`ClientOptions::builder`], or start from `Default` and assign fields.
#[derive(Clone, Debug)]
#[non_exhaustive]
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

impl ClientOptions {
    /// A builder starting from [`ClientOptions::default`].
    ///
    /// ```
    /// use std::time::Duration;
    /// use idalloc_client::ClientOptions;
    /// let opts = ClientOptions::builder().token("s3cret").attempts(3).build()?;
    /// assert_eq!((opts.token.as_deref(), opts.attempts), (Some("s3cret"), 3));
    /// assert!(ClientOptions::builder().request_timeout(Duration::ZERO).build().is_err());
    /// # Ok::<(), idalloc::Error>(())
    /// ```
    pub fn builder() -> ClientOptionsBuilder {
        ClientOptionsBuilder { opts: ClientOptions::default() }
    }

    /// Checks the values: at least 1 attempt and 1 buffered event, a session TTL of at least
    /// 1 s, non-zero timeouts, a first backoff step no longer than the largest.
    /// [`crate::Client::new`] runs the same check.
    pub fn validate(&self) -> Result<()> {
        let bad = |what: &str, value: String, rule: &str| {
            Err(Error::invalid(Input::Options, what, value, rule))
        };
        if self.attempts == 0 {
            return bad("attempts", "0".into(), "at least 1");
        }
        for (what, d) in [
            ("request timeout", self.request_timeout),
            ("watch idle timeout", self.watch_idle_timeout),
        ] {
            if d.is_zero() {
                return bad(what, "0s".into(), "timeouts are longer than zero");
            }
        }
        if self.session_ttl < Duration::from_secs(1) {
            return bad("session TTL", format!("{:?}", self.session_ttl), "at least 1 s");
        }
        if self.backoff_base > self.backoff_max {
            return bad(
                "backoff base",
                format!("{:?}", self.backoff_base),
                &format!("at most the largest backoff step ({:?})", self.backoff_max),
            );
        }
        if self.event_buffer == 0 {
            return bad("event buffer", "0".into(), "at least 1 event");
        }
        Ok(())
    }
}

/// Builds [`ClientOptions`]; every setter sets the field of the same name.
#[derive(Clone, Debug)]
#[must_use]
pub struct ClientOptionsBuilder {
    opts: ClientOptions,
}

impl ClientOptionsBuilder {
    /// [`ClientOptions::token`].
    pub fn token(mut self, token: impl Into<String>) -> Self {
        self.opts.token = Some(token.into());
        self
    }
    /// [`ClientOptions::request_timeout`].
    pub fn request_timeout(mut self, timeout: Duration) -> Self {
        self.opts.request_timeout = timeout;
        self
    }
    /// [`ClientOptions::attempts`].
    pub fn attempts(mut self, attempts: u32) -> Self {
        self.opts.attempts = attempts;
        self
    }
    /// [`ClientOptions::backoff_base`].
    pub fn backoff_base(mut self, step: Duration) -> Self {
        self.opts.backoff_base = step;
        self
    }
    /// [`ClientOptions::backoff_max`].
    pub fn backoff_max(mut self, step: Duration) -> Self {
        self.opts.backoff_max = step;
        self
    }
    /// [`ClientOptions::session_ttl`].
    pub fn session_ttl(mut self, ttl: Duration) -> Self {
        self.opts.session_ttl = ttl;
        self
    }
    /// [`ClientOptions::watch_idle_timeout`].
    pub fn watch_idle_timeout(mut self, timeout: Duration) -> Self {
        self.opts.watch_idle_timeout = timeout;
        self
    }
    /// [`ClientOptions::event_buffer`].
    pub fn event_buffer(mut self, events: usize) -> Self {
        self.opts.event_buffer = events;
        self
    }
    /// [`ClientOptions::lazy_view`].
    pub fn lazy_view(mut self, lazy: bool) -> Self {
        self.opts.lazy_view = lazy;
        self
    }
    /// [`ClientOptions::http`].
    pub fn http(mut self, http: reqwest::Client) -> Self {
        self.opts.http = Some(http);
        self
    }
    /// The options, checked by [`ClientOptions::validate`].
    pub fn build(self) -> Result<ClientOptions> {
        self.opts.validate()?;
        Ok(self.opts)
    }
}
