//! Client sessions, and the health and readiness answers.

use serde::{Deserialize, Serialize};

/// `POST /v1/sessions`.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct SessionBody {
    /// Lease TTL in whole seconds (1..=86400).
    pub ttl: u64,
}

/// A session as handed out (201 to `POST /v1/sessions`).
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Eq)]
pub struct SessionInfo {
    /// The capability: keep it secret, send it with every acquire/release of the session.
    pub session: String,
    /// The holder name of its references (as `bindings` shows them).
    pub holder: String,
    pub ttl: u64,
}

/// `PUT /v1/sessions/{id}/keepalive`.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Eq)]
pub struct Keepalive {
    pub ttl: u64,
}

/// `DELETE /v1/sessions/{id}`.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Eq)]
pub struct Ended {
    pub ended: bool,
}

/// One live session of `GET /v1/sessions` (never its id).
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Eq)]
pub struct SessionSummary {
    /// Seconds since it was opened or adopted.
    pub age: u64,
    /// The client that opened it (`null` without tokens).
    pub client: Option<String>,
    pub holder: String,
    /// References it holds, counted from the store.
    pub references: u64,
    pub ttl: u64,
}

/// `GET /v1/sessions`.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Eq)]
pub struct Sessions {
    pub sessions: Vec<SessionSummary>,
}

/// `GET /healthz`.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Eq)]
pub struct Health {
    pub status: String,
}

/// `GET /v1/version`: what the service is and what its store is.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Eq)]
pub struct Version {
    /// The service's version ("0.1.0").
    pub version: String,
    /// The git commit it was built from (12 hex digits), or "unknown".
    pub git_sha: String,
    /// The HTTP API version ("v1").
    pub api: String,
    /// The version of the record layout in the store.
    pub layout: u32,
    /// What serves the store and its version ("etcd 3.4.27"), if the store said.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub store: Option<String>,
}

/// `GET /readyz` when ready.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Eq)]
pub struct Ready {
    /// Pools this instance serves (each synced).
    pub pools: u64,
    pub revision: i64,
    pub status: String,
}
