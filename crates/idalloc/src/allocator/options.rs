//! Builders of [`AllocatorOptions`] and [`RetryPolicy`], and the one check of an options value.
//!
//! The option structs are `#[non_exhaustive]`: code outside this crate builds them with
//! `X::builder()…build()` (or starts from `X::default()` and assigns fields), so adding an option
//! breaks no caller. `build()` checks the values and names the offending one, so a bad setting
//! fails where it is written rather than at [`Allocator::new`](super::Allocator::new), which runs
//! the same check.

use std::time::Duration;

use super::types::{AllocatorOptions, RetryPolicy};
use crate::error::{Error, Input, Result};
use crate::layout::Layout;
use crate::pool::validate_holder;

impl AllocatorOptions {
    /// A builder starting from [`AllocatorOptions::default`].
    ///
    /// ```
    /// use std::time::Duration;
    /// let opts = idalloc::AllocatorOptions::builder()
    ///     .prefix("my-app")
    ///     .session_ttl(Duration::from_secs(30))
    ///     .build()?;
    /// assert_eq!(opts.prefix, "my-app");
    /// assert!(idalloc::AllocatorOptions::builder().bulk_in_flight(0).build().is_err());
    /// # Ok::<(), idalloc::Error>(())
    /// ```
    pub fn builder() -> AllocatorOptionsBuilder {
        AllocatorOptionsBuilder { opts: AllocatorOptions::default() }
    }

    /// Checks every value: the store prefix ([`Layout::new`]), the holder name, a session TTL
    /// of at least 1 s, a non-zero request timeout and sweep interval, at least one retry
    /// attempt, list page, event buffer slot and bulk txn in flight.
    pub fn validate(&self) -> Result<()> {
        Layout::new(&self.prefix)?;
        if let Some(h) = &self.holder {
            validate_holder(h)?;
        }
        let bad = |what: &str, value: String, rule: &str| {
            Err(Error::invalid(Input::Options, what, value, rule))
        };
        if self.session_ttl < Duration::from_secs(1) {
            return bad(
                "session TTL",
                format!("{:?}", self.session_ttl),
                "the session lease TTL is at least 1 s",
            );
        }
        if self.request_timeout.is_zero() {
            return bad("request timeout", "0s".into(), "a request timeout above zero");
        }
        if self.sweep_interval.is_some_and(|d| d.is_zero()) {
            return bad("sweep interval", "0s".into(), "a sweep interval above zero, or none");
        }
        self.retry.validate()?;
        if self.list_page < 1 {
            return bad("list page", self.list_page.to_string(), "at least 1 key per page");
        }
        if self.event_buffer == 0 {
            return bad("event buffer", "0".into(), "at least 1 event buffered per subscriber");
        }
        if self.bulk_in_flight == 0 {
            return bad(
                "bulk txns in flight",
                "0".into(),
                "at least 1 txn of many-key calls in flight",
            );
        }
        Ok(())
    }
}

/// Builds [`AllocatorOptions`]; every setter sets the field of the same name.
#[derive(Clone, Debug)]
#[must_use]
pub struct AllocatorOptionsBuilder {
    opts: AllocatorOptions,
}

impl AllocatorOptionsBuilder {
    /// [`AllocatorOptions::prefix`].
    pub fn prefix(mut self, prefix: impl Into<String>) -> Self {
        self.opts.prefix = prefix.into();
        self
    }
    /// [`AllocatorOptions::holder`].
    pub fn holder(mut self, holder: impl Into<String>) -> Self {
        self.opts.holder = Some(holder.into());
        self
    }
    /// [`AllocatorOptions::session_ttl`].
    pub fn session_ttl(mut self, ttl: Duration) -> Self {
        self.opts.session_ttl = ttl;
        self
    }
    /// [`AllocatorOptions::request_timeout`].
    pub fn request_timeout(mut self, timeout: Duration) -> Self {
        self.opts.request_timeout = timeout;
        self
    }
    /// [`AllocatorOptions::retry`].
    pub fn retry(mut self, retry: RetryPolicy) -> Self {
        self.opts.retry = retry;
        self
    }
    /// [`AllocatorOptions::seed`].
    pub fn seed(mut self, seed: u64) -> Self {
        self.opts.seed = Some(seed);
        self
    }
    /// [`AllocatorOptions::list_page`].
    pub fn list_page(mut self, keys: i64) -> Self {
        self.opts.list_page = keys;
        self
    }
    /// [`AllocatorOptions::event_buffer`].
    pub fn event_buffer(mut self, events: usize) -> Self {
        self.opts.event_buffer = events;
        self
    }
    /// [`AllocatorOptions::sweep_interval`].
    pub fn sweep_interval(mut self, interval: Option<Duration>) -> Self {
        self.opts.sweep_interval = interval;
        self
    }
    /// [`AllocatorOptions::fold_fences_above`].
    pub fn fold_fences_above(mut self, records: usize) -> Self {
        self.opts.fold_fences_above = records;
        self
    }
    /// [`AllocatorOptions::lazy_view`].
    pub fn lazy_view(mut self, lazy: bool) -> Self {
        self.opts.lazy_view = lazy;
        self
    }
    /// [`AllocatorOptions::bulk_in_flight`].
    pub fn bulk_in_flight(mut self, txns: usize) -> Self {
        self.opts.bulk_in_flight = txns;
        self
    }
    /// The options, checked by [`AllocatorOptions::validate`].
    pub fn build(self) -> Result<AllocatorOptions> {
        self.opts.validate()?;
        Ok(self.opts)
    }
}

impl RetryPolicy {
    /// A builder starting from [`RetryPolicy::default`].
    pub fn builder() -> RetryPolicyBuilder {
        RetryPolicyBuilder { retry: RetryPolicy::default() }
    }

    /// Checks the policy: at least one attempt, a first backoff no longer than the largest.
    pub fn validate(&self) -> Result<()> {
        if self.max_attempts == 0 {
            return Err(Error::invalid(
                Input::Options,
                "retry attempts",
                "0",
                "at least 1 attempt",
            ));
        }
        if self.initial_backoff > self.max_backoff {
            return Err(Error::invalid(
                Input::Options,
                "initial retry backoff",
                format!("{:?}", self.initial_backoff),
                format!("at most the largest backoff ({:?})", self.max_backoff),
            ));
        }
        Ok(())
    }
}

/// Builds a [`RetryPolicy`]; every setter sets the field of the same name.
#[derive(Clone, Debug)]
#[must_use]
pub struct RetryPolicyBuilder {
    retry: RetryPolicy,
}

impl RetryPolicyBuilder {
    /// [`RetryPolicy::max_attempts`].
    pub fn max_attempts(mut self, attempts: u32) -> Self {
        self.retry.max_attempts = attempts;
        self
    }
    /// [`RetryPolicy::initial_backoff`].
    pub fn initial_backoff(mut self, backoff: Duration) -> Self {
        self.retry.initial_backoff = backoff;
        self
    }
    /// [`RetryPolicy::max_backoff`].
    pub fn max_backoff(mut self, backoff: Duration) -> Self {
        self.retry.max_backoff = backoff;
        self
    }
    /// The policy, checked by [`RetryPolicy::validate`].
    pub fn build(self) -> Result<RetryPolicy> {
        self.retry.validate()?;
        Ok(self.retry)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn builders_refuse_bad_values_naming_them() {
        let e = AllocatorOptions::builder().prefix("a/").build().unwrap_err().to_string();
        assert!(e.contains("\"a/\""), "{e}");
        let e = AllocatorOptions::builder()
            .session_ttl(Duration::from_millis(500))
            .build()
            .unwrap_err()
            .to_string();
        assert!(e.contains("500ms") && e.contains("at least 1 s"), "{e}");
        for b in [
            AllocatorOptions::builder().list_page(0),
            AllocatorOptions::builder().event_buffer(0),
            AllocatorOptions::builder().bulk_in_flight(0),
            AllocatorOptions::builder().request_timeout(Duration::ZERO),
            AllocatorOptions::builder().sweep_interval(Some(Duration::ZERO)),
            AllocatorOptions::builder().holder(""),
        ] {
            assert!(matches!(b.build(), Err(Error::InvalidInput { .. })));
        }
        let e = RetryPolicy::builder()
            .initial_backoff(Duration::from_secs(3))
            .max_backoff(Duration::from_secs(1))
            .build()
            .unwrap_err()
            .to_string();
        assert!(e.contains("3s") && e.contains("1s"), "{e}");
        let o = AllocatorOptions::builder()
            .holder("lease:me")
            .seed(7)
            .retry(RetryPolicy::builder().max_attempts(2).build().unwrap())
            .build()
            .unwrap();
        assert_eq!(
            (o.holder.as_deref(), o.seed, o.retry.max_attempts),
            (Some("lease:me"), Some(7), 2)
        );
    }
}
