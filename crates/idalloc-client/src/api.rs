//! The service's request and answer bodies (docs/api.md), as this client sends and reads them.

use std::time::Duration;

use idalloc::{PoolSpec, Strategy};
use serde::{Deserialize, Serialize};

/// A pool spec as `POST /v1/pools` takes it and `GET /v1/pools/{pool}` answers it.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Eq)]
pub(crate) struct SpecBody {
    pub name: String,
    pub min: u64,
    pub max: u64,
    #[serde(default)]
    pub reserved: Vec<(u64, u64)>,
    #[serde(default)]
    pub prefix: u64,
    #[serde(default)]
    pub strategy: Option<Strategy>,
    #[serde(default)]
    pub idle_grace_ms: u64,
    #[serde(default)]
    pub reuse_delay_ms: u64,
}

impl SpecBody {
    pub fn from_spec(s: &PoolSpec) -> SpecBody {
        let ms = |d: Duration| u64::try_from(d.as_millis()).unwrap_or(u64::MAX);
        SpecBody {
            name: s.name().to_string(),
            min: s.min(),
            max: s.max(),
            reserved: s.reserved().to_vec(),
            prefix: s.prefix_bits(),
            strategy: Some(s.strategy_kind()),
            idle_grace_ms: ms(s.idle_grace_duration()),
            reuse_delay_ms: ms(s.reuse_delay_duration()),
        }
    }

    /// The spec, validated as the library validates it.
    pub fn to_spec(&self) -> idalloc::Result<PoolSpec> {
        let spec = PoolSpec::new(self.name.clone(), self.min, self.max)
            .reserve_all(&self.reserved)
            .prefix(self.prefix)
            .strategy(self.strategy.unwrap_or_default())
            .idle_grace(Duration::from_millis(self.idle_grace_ms))
            .reuse_delay(Duration::from_millis(self.reuse_delay_ms));
        spec.validate()?;
        Ok(spec)
    }
}

#[derive(Deserialize, Debug)]
pub(crate) struct PoolInfo {
    pub spec: SpecBody,
}

#[derive(Deserialize, Debug)]
pub(crate) struct Pools {
    pub pools: Vec<SpecBody>,
}

#[derive(Deserialize, Debug, Clone)]
pub(crate) struct Acquired {
    pub id: u64,
    pub new: bool,
}

#[derive(Deserialize, Debug, Clone)]
pub(crate) struct Released {
    pub held: bool,
    pub reclaimed: bool,
}

#[derive(Deserialize, Debug)]
pub(crate) struct Results<T> {
    pub results: Vec<T>,
}

#[derive(Deserialize, Debug)]
pub(crate) struct SessionInfo {
    pub session: String,
    pub holder: String,
    pub ttl: u64,
}

#[derive(Deserialize, Debug)]
pub(crate) struct KeyAnswer {
    pub id: u64,
}

#[derive(Deserialize, Debug)]
pub(crate) struct IdAnswer {
    pub key: String,
}

#[derive(Deserialize, Debug)]
pub(crate) struct BindingsPage {
    pub bindings: Vec<BindingBody>,
    pub next_after: Option<u64>,
}

#[derive(Deserialize, Debug)]
pub(crate) struct BindingBody {
    pub id: u64,
    pub key: String,
    pub holders: Vec<String>,
}

/// Most keys one acquire or release request may carry.
pub(crate) const MAX_KEYS_PER_REQUEST: usize = 1000;
