//! Exhaustive model checking of idalloc's protocol (docs/model-checking.md).
//!
//! A breadth-first search over every interleaving of a small explicit state machine: a few
//! processes acquiring and releasing a few keys in one pool of a few IDs, a network that loses
//! responses and applies txns late or twice, crashes, lease expiry, sweeps, fence folds, and the
//! pool deleted and re-created. What runs at every step is the library's own code, not a model
//! of it: the bind loop (`BindLoop`, the state machine `allocator/bind.rs` executes), the bind,
//! release, sweep and fold txns and the readers of their responses, batch packing (`assemble`,
//! `split`), all applied to the memory store's own MVCC state machine (`MemoryCore`, the `Mvcc`
//! every memory and file store request goes through). The search visits each distinct state once
//! (a 128-bit hash of a canonical encoding), checks G1–G3 in every state and G4 in every
//! quiescent one, and, being breadth-first, reports the shortest trace to the first violation.
//!
//! What is the driver's rather than the library's (when to sync the view, what to retry) is
//! written here, following `allocator/bind.rs`, `release.rs` and `sweeper.rs`; the docs list
//! each such choice and why it is sound to abstract.

mod explore;
mod world;

pub use explore::{explore, Report, Violation};
pub use world::{Event, Scope};
