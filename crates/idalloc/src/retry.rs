//! The one retry schedule of the crate's store requests: how many attempts, and how long to wait
//! between them. Its own module so that the allocator's request path (`allocator/request.rs`) and
//! the bounded listings of the store module (`store/listing.rs`) share it without either
//! depending on the other.

use std::time::Duration;

use tracing::warn;

use crate::allocator::RetryPolicy;
use crate::store::StoreError;

/// The retry schedule of one request: at most `max_attempts` attempts, waiting `initial_backoff`
/// before the second and doubling up to `max_backoff`. The only backoff of the
/// crate's requests: single requests (`allocator/request.rs`) and each page of a whole listing
/// (`store/listing.rs`) both retry by it.
pub(crate) struct Backoff {
    next: Duration,
    max: Duration,
    attempt: u32,
    max_attempts: u32,
}

impl Backoff {
    pub(crate) fn new(policy: &RetryPolicy) -> Backoff {
        Backoff {
            next: policy.initial_backoff,
            max: policy.max_backoff,
            attempt: 1,
            max_attempts: policy.max_attempts,
        }
    }

    /// The attempt about to be made or just made (1-based).
    pub(crate) fn attempt(&self) -> u32 {
        self.attempt
    }

    /// After a failed attempt with retryable error `e`: waits and returns true if another attempt
    /// is allowed, else false (without waiting).
    pub(crate) async fn retry(&mut self, e: &StoreError) -> bool {
        if !e.is_retryable() || self.attempt >= self.max_attempts {
            return false;
        }
        warn!(attempt = self.attempt, error = %e, "store request failed; retrying");
        tokio::time::sleep(self.next).await;
        self.next = (self.next * 2).min(self.max);
        self.attempt += 1;
        true
    }

    /// Counts an attempt that is repeated without waiting (a vanished quarantine lease).
    pub(crate) fn again(&mut self) {
        self.attempt += 1;
    }
}
