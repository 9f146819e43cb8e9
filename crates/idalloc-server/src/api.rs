//! Request and response bodies of the `/v1` API. Requests reject unknown fields, so a misspelt
//! field is an error rather than silently ignored.

use idalloc::{PoolSpec, Strategy};
use serde::{Deserialize, Serialize};

use crate::error::ApiError;

/// `POST /v1/pools`: the CLI's `pool create` flags as JSON (the stored spec's field names).
#[derive(Deserialize, Serialize, Debug, Clone)]
#[serde(deny_unknown_fields)]
pub struct PoolSpecBody {
    pub name: String,
    pub min: u64,
    pub max: u64,
    /// Inclusive raw ID ranges never handed out.
    #[serde(default)]
    pub reserved: Vec<(u64, u64)>,
    /// Bits ORed into every ID handed out.
    #[serde(default)]
    pub prefix: u64,
    /// `random` (default) or `lowest`.
    #[serde(default)]
    pub strategy: Option<String>,
    #[serde(default)]
    pub idle_grace_ms: u64,
    #[serde(default)]
    pub reuse_delay_ms: u64,
}

impl PoolSpecBody {
    pub fn from_spec(s: &PoolSpec) -> Self {
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

    /// The spec, validated by the library when it is used.
    pub fn to_spec(&self) -> Result<PoolSpec, ApiError> {
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

/// `GET /v1/pools/{pool}`: the spec and how full the pool is.
#[derive(Serialize, Deserialize, Debug)]
pub struct PoolInfo {
    pub spec: PoolSpecBody,
    /// Allocatable IDs (range minus reserved).
    pub capacity: u64,
    /// Keys with an ID.
    pub bound: u64,
    /// IDs waiting out their reuse delay.
    pub quarantined: u64,
    /// `bound + quarantined`: IDs no new key can get now.
    pub used: u64,
    /// `capacity - used`.
    pub free: u64,
}

/// Who a reference belongs to: a client session (leased) or a named durable holder.
#[derive(Deserialize, Debug, Default)]
#[serde(deny_unknown_fields)]
pub struct AcquireBody {
    /// One key...
    #[serde(default)]
    pub key: Option<String>,
    /// ...or several, handled in order, each with its own result.
    #[serde(default)]
    pub keys: Option<Vec<String>>,
    /// The session id from `POST /v1/sessions` (references vanish with the session).
    #[serde(default)]
    pub session: Option<String>,
    /// A durable holder name (references stay until released by that holder).
    #[serde(default)]
    pub holder: Option<String>,
}

/// Result of acquiring one key.
#[derive(Serialize, Deserialize, Debug)]
pub struct Acquired {
    pub key: String,
    pub id: u64,
    pub new: bool,
}

/// Result of releasing one key.
#[derive(Serialize, Deserialize, Debug)]
pub struct Released {
    pub key: String,
    pub held: bool,
    pub reclaimed: bool,
}

/// `POST /v1/sessions`.
#[derive(Deserialize, Debug)]
#[serde(deny_unknown_fields)]
pub struct SessionBody {
    /// Lease TTL in whole seconds (1..=86400).
    pub ttl: u64,
}

/// A session as handed out.
#[derive(Serialize, Deserialize, Debug)]
pub struct SessionInfo {
    /// The capability: keep it secret, send it with every acquire/release of the session.
    pub session: String,
    /// The holder name of its references (as `list` shows them).
    pub holder: String,
    pub ttl: u64,
}

/// One binding of `GET /v1/pools/{pool}/bindings`.
#[derive(Serialize, Deserialize, Debug)]
pub struct BindingBody {
    pub id: u64,
    pub key: String,
    pub holders: Vec<String>,
}
