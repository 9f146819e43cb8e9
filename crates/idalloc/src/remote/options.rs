//! How a remote view (or reader) is set up.

use std::fmt;
use std::time::Duration;

use super::validate::Validator;
use crate::error::{Error, Input, Result};

/// How a remote view is set up: [`RemoteOptions::builder`], or [`RemoteOptions::default`] and
/// field assignments.
#[derive(Clone)]
#[non_exhaustive]
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

impl RemoteOptions {
    /// A builder starting from [`RemoteOptions::default`].
    pub fn builder() -> RemoteOptionsBuilder {
        RemoteOptionsBuilder { opts: RemoteOptions::default() }
    }

    /// Checks the values: a valid store prefix, at least 1 key per page and 1 buffered event,
    /// non-zero probe interval, request timeout and stale TTL.
    pub fn validate(&self) -> Result<()> {
        crate::layout::Layout::new(&self.prefix)?;
        let bad = |what: &str, value: String, rule: &str| {
            Err(Error::invalid(Input::Options, what, value, rule))
        };
        if self.list_page < 1 {
            return bad("remote list page", self.list_page.to_string(), "at least 1");
        }
        if self.event_buffer == 0 {
            return bad("remote event buffer", "0".into(), "at least 1 event");
        }
        for (what, d) in [
            ("remote probe interval", Some(self.probe_interval)),
            ("remote request timeout", Some(self.request_timeout)),
            ("remote stale TTL", self.stale_ttl),
        ] {
            if d.is_some_and(|d| d.is_zero()) {
                return bad(what, "0s".into(), "a duration above zero");
            }
        }
        Ok(())
    }
}

/// Builds [`RemoteOptions`]; every setter sets the field of the same name.
#[derive(Clone, Debug)]
#[must_use]
pub struct RemoteOptionsBuilder {
    opts: RemoteOptions,
}

impl RemoteOptionsBuilder {
    /// [`RemoteOptions::prefix`].
    pub fn prefix(mut self, prefix: impl Into<String>) -> Self {
        self.opts.prefix = prefix.into();
        self
    }
    /// [`RemoteOptions::validators`].
    pub fn validators(mut self, validators: Vec<Validator>) -> Self {
        self.opts.validators = validators;
        self
    }
    /// Adds one of [`RemoteOptions::validators`].
    pub fn validator(mut self, validator: Validator) -> Self {
        self.opts.validators.push(validator);
        self
    }
    /// [`RemoteOptions::stale_ttl`].
    pub fn stale_ttl(mut self, ttl: Option<Duration>) -> Self {
        self.opts.stale_ttl = ttl;
        self
    }
    /// [`RemoteOptions::probe_interval`].
    pub fn probe_interval(mut self, interval: Duration) -> Self {
        self.opts.probe_interval = interval;
        self
    }
    /// [`RemoteOptions::request_timeout`].
    pub fn request_timeout(mut self, timeout: Duration) -> Self {
        self.opts.request_timeout = timeout;
        self
    }
    /// [`RemoteOptions::list_page`].
    pub fn list_page(mut self, keys: i64) -> Self {
        self.opts.list_page = keys;
        self
    }
    /// [`RemoteOptions::event_buffer`].
    pub fn event_buffer(mut self, events: usize) -> Self {
        self.opts.event_buffer = events;
        self
    }
    /// The options, checked by [`RemoteOptions::validate`].
    pub fn build(self) -> Result<RemoteOptions> {
        self.opts.validate()?;
        Ok(self.opts)
    }
}
