//! Pools: their specs, how full they are, deleting and sweeping them.

use serde::{Deserialize, Serialize};

/// A pool spec as `POST /v1/pools` takes it and every answer shows it: the CLI's `pool create`
/// flags as JSON (the stored spec's field names). Only `name`, `min` and `max` are required.
///
/// `strategy` is a string, not the library's enum, so that each side answers a value it does not
/// know with its own error (the service: 400 naming the allowed values).
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Eq)]
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

/// `PATCH /v1/pools/{pool}`: a new range and, if given, new reserved IDs (else the pool's reserved
/// IDs inside the new range stay). The answer is the spec now in force ([`PoolSpecBody`]).
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct ResizeBody {
    pub min: u64,
    pub max: u64,
    /// Inclusive raw ID ranges never handed out; absent: keep the pool's (clipped to the range).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reserved: Option<Vec<(u64, u64)>>,
}

/// `GET /v1/pools`.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Eq)]
pub struct Pools {
    pub pools: Vec<PoolSpecBody>,
}

/// `GET /v1/pools/{pool}`: the spec and how full the pool is.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Eq)]
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

/// `DELETE /v1/pools/{pool}`.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Eq)]
pub struct Deleted {
    pub deleted: bool,
    pub pool: String,
}

/// One binding a sweep reclaimed.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Eq)]
pub struct Reclaimed {
    pub id: u64,
    pub key: String,
}

/// `POST /v1/pools/{pool}/sweep`.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Eq)]
pub struct Swept {
    /// Holder fence records found.
    pub fence_records: u64,
    /// Holder fence records folded into the pool's floor.
    pub folded: u64,
    /// Bindings nobody references that wait out their idle grace.
    pub idle: u64,
    pub pool: String,
    pub reclaimed: Vec<Reclaimed>,
}
