//! idalloc: small numeric IDs for string keys, the same on every node of a cluster.
//!
//! See `DESIGN.md` for the guarantees (G1–G6), the store layout and the protocol.

#![forbid(unsafe_code)]

pub mod store;

#[cfg(feature = "testing")]
pub mod testing;
