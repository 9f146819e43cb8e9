//! The data of the watch stream's Server-Sent Events (`GET /v1/pools/{pool}/watch`,
//! docs/guide/api.md "Watch"). The event's name says which type its data is: `upsert` and `delete`
//! carry a [`Change`], `synced` a [`Synced`], `spec` a [`SpecChange`], `error` an [`ErrorEvent`].

use serde::{Deserialize, Serialize};

/// `upsert` / `delete`: a binding began or ended at `revision`.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Eq)]
pub struct Change {
    pub id: u64,
    pub key: String,
    pub revision: i64,
}

/// `synced`: the events before it are the whole pool as of `revision` (`bindings` of them).
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Eq)]
pub struct Synced {
    pub bindings: u64,
    pub revision: i64,
}

/// `spec`: the pool was resized at store revision `revision`; `spec` is the spec now in force,
/// as `GET /v1/pools/{pool}` shows it. Sent without an SSE id.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Eq)]
pub struct SpecChange {
    pub revision: i64,
    pub spec: crate::PoolSpecBody,
}

/// `error`, the last event of a stream: `lagged` (resume from `from_revision`) or `gone` (the
/// pool was deleted or re-created: watch it again from scratch).
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Eq)]
pub struct ErrorEvent {
    /// With `lagged`: `revision + 1`, for `?from_revision=`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub from_revision: Option<i64>,
    pub kind: String,
    #[serde(default)]
    pub message: String,
    /// With `lagged`: the last revision the stream sent all of.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub revision: Option<i64>,
}
