//! Acquire, release, lookups and the bindings list of one pool.

use serde::{Deserialize, Serialize};

/// Most keys one acquire or release request may carry (bounds the work of one request).
pub const MAX_KEYS_PER_REQUEST: usize = 1000;

/// `POST /v1/pools/{pool}/acquire` and `…/release`: `key` or `keys`, and `session` or `holder`
/// (the service answers 400 unless exactly one of each pair is given). Absent fields are left
/// out of the JSON, as the OpenAPI document's `oneOf` expects.
#[derive(Serialize, Deserialize, Debug, Clone, Default, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct AcquireBody {
    /// One key...
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub key: Option<String>,
    /// ...or several, handled in order, each with its own result.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub keys: Option<Vec<String>>,
    /// The session id from `POST /v1/sessions` (references vanish with the session).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub session: Option<String>,
    /// A durable holder name (references stay until released by that holder).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub holder: Option<String>,
    /// Acquire only, with one `key` and a `holder`: the ID to give the key if it is free (not
    /// bound, not reserved, not in its reuse delay) or already the key's; otherwise the key gets
    /// its usual ID. What a caller that still uses an ID it lost the record of asks.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hint: Option<u64>,
}

/// Result of acquiring one key.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Eq)]
pub struct Acquired {
    pub key: String,
    pub id: u64,
    pub new: bool,
    /// Only when the request gave a `hint`: whether the key got that ID.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hint_granted: Option<bool>,
}

/// Result of releasing one key.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Eq)]
pub struct Released {
    pub key: String,
    pub held: bool,
    pub reclaimed: bool,
}

/// The answer to a request with `keys`: one result per key, in order.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Eq)]
pub struct Results<T> {
    pub results: Vec<T>,
}

/// `GET /v1/pools/{pool}/keys/{key}`.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Eq)]
pub struct KeyAnswer {
    pub id: u64,
    pub key: String,
    pub pool: String,
}

/// `GET /v1/pools/{pool}/ids/{id}`.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Eq)]
pub struct IdAnswer {
    pub id: u64,
    pub key: String,
    pub pool: String,
}

/// One binding of `GET /v1/pools/{pool}/bindings`.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Eq)]
pub struct BindingBody {
    pub id: u64,
    pub key: String,
    pub holders: Vec<String>,
}

/// A page of `GET /v1/pools/{pool}/bindings`: `next_after` is `null` on the last page, else the
/// `after` of the next one.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Eq)]
pub struct BindingsPage {
    pub bindings: Vec<BindingBody>,
    pub next_after: Option<u64>,
    pub pool: String,
}
