//! The JSON bodies of `idalloc serve`'s `/v1` API (docs/guide/api.md), as one set of types for both
//! sides: the service (`idalloc-server`) writes and reads them, the Rust client
//! (`idalloc-client`) reads and writes them. Before this crate the client re-declared them, and
//! nothing but the end-to-end tests noticed when the two drifted apart.
//!
//! Serde only, on purpose: the client must not depend on the server crate (that would pull
//! axum, hyper and a TLS acceptor into every agent), and these types must not depend on the
//! library either, so converting to and from [`idalloc`'s `PoolSpec`] stays with each side (the
//! service answers a bad strategy with its own error, the client validates with the library's).
//!
//! Requests (`PoolSpecBody`, [`AcquireBody`], [`SessionBody`]) reject unknown fields: a misspelt
//! field is an error, never silently ignored.
//!
//! Field order is part of "the JSON exactly as the service sends it": the answers the service
//! used to build with `serde_json::json!` came out with their keys sorted (serde_json's map is
//! ordered by key), so those types declare their fields in alphabetical order; the ones it always
//! serialized from structs keep their order. The JSON of every type is pinned by `tests/golden.rs`
//! against the strings docs/guide/api.md shows.
//!
//! [`idalloc`'s `PoolSpec`]: https://docs.rs/idalloc

pub mod errors;
pub mod events;
pub mod keys;
pub mod pools;
pub mod sessions;

pub use errors::ErrorBody;
pub use events::{Change, ErrorEvent, SpecChange, Synced};
pub use keys::{
    AcquireBody, Acquired, BindingBody, BindingsPage, IdAnswer, KeyAnswer, Released, Results,
    MAX_KEYS_PER_REQUEST,
};
pub use pools::{Deleted, PoolInfo, PoolSpecBody, Pools, Reclaimed, ResizeBody, Swept};
pub use sessions::{
    Ended, Health, Keepalive, Ready, SessionBody, SessionInfo, SessionSummary, Sessions, Version,
};
