//! Request and response bodies of the `/v1` API: the shared wire types of `idalloc-wire` (one
//! declaration for the service and the Rust client), and the service's conversion of a spec body
//! to the library's spec. Requests reject unknown fields, so a misspelt field is an error rather
//! than silently ignored.

use idalloc::{PoolSpec, Strategy};

pub use idalloc_wire::{
    AcquireBody, Acquired, BindingBody, BindingsPage, Deleted, Ended, ErrorBody, Health, IdAnswer,
    Keepalive, KeyAnswer, PoolInfo, PoolSpecBody, Pools, Ready, Reclaimed, Released, ResizeBody,
    Results, SessionBody, SessionInfo, SessionSummary, Sessions, Swept,
};

use crate::error::ApiError;

/// The service's side of [`PoolSpecBody`]: from the library's spec, and back with the service's
/// errors (400 naming the value). A trait because the body is declared in `idalloc-wire`.
pub trait SpecBody: Sized {
    fn from_spec(s: &PoolSpec) -> Self;
    /// The spec, validated by the library when it is used.
    fn to_spec(&self) -> Result<PoolSpec, ApiError>;
}

impl SpecBody for PoolSpecBody {
    fn from_spec(s: &PoolSpec) -> Self {
        PoolSpecBody {
            name: s.name().to_string(),
            min: s.min(),
            max: s.max(),
            reserved: s.reserved().to_vec(),
            prefix: s.prefix_bits(),
            strategy: Some(s.strategy_kind().to_string()),
            idle_grace_ms: u64::try_from(s.idle_grace_duration().as_millis()).unwrap_or(u64::MAX),
            reuse_delay_ms: u64::try_from(s.reuse_delay_duration().as_millis()).unwrap_or(u64::MAX),
        }
    }

    fn to_spec(&self) -> Result<PoolSpec, ApiError> {
        let strategy = match self.strategy.as_deref() {
            None | Some("random") => Strategy::Random,
            Some("lowest") => Strategy::Lowest,
            Some(other) => {
                return Err(ApiError::invalid(format!(
                    "invalid strategy {other:?}: one of \"random\", \"lowest\""
                )))
            }
        };
        if let Some(&(lo, hi)) = self.reserved.iter().find(|(lo, hi)| lo > hi) {
            return Err(ApiError::invalid(format!(
                "invalid reserved range [{lo}, {hi}]: start must not exceed end"
            )));
        }
        Ok(PoolSpec::new(self.name.clone(), self.min, self.max)
            .reserve_all(&self.reserved)
            .prefix(self.prefix)
            .strategy(strategy)
            .idle_grace(std::time::Duration::from_millis(self.idle_grace_ms))
            .reuse_delay(std::time::Duration::from_millis(self.reuse_delay_ms)))
    }
}

/// A count of the library's (`usize`) as the API writes it.
pub fn count(n: usize) -> u64 {
    u64::try_from(n).unwrap_or(u64::MAX)
}
