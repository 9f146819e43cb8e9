//! Read-only views of the same pool in other clusters' stores (DESIGN §12; Cilium's remote caches):
//! a process in cluster A resolves IDs that cluster B allocated, with zero round trips, by
//! following B's `id/` records with the same follower as its own pool (`feed.rs`).
//!
//! A view never writes to its store. It keeps serving its last known picture when the remote
//! becomes unreachable (state [`RemoteState::Stale`]), and on reconnect it re-lists and emits the
//! exact difference, so a binding that vanished while it was away shows up as a `Delete` instead of
//! lingering (the stale identities Cilium users reported). Every entry passes validation first:
//! the ID must lie in the remote pool's declared ID space (its prefix bits and range), the key must
//! be a valid key, and optional user validators must accept it; rejected entries are dropped and
//! counted, never shown. A remote whose ID space overlaps the local pool's (or another remote's) is
//! refused outright: two clusters with the same cluster ID hand out the same IDs for different
//! keys, and no lookup could tell which one is meant.
//!
//! One file per job: [`cluster`] (the vocabulary: clusters, their events, a view's state),
//! [`space`] (ID spaces and overlap refusal), [`validate`] (what a remote sends is checked before
//! it is shown), [`options`], `view` (the guarded state machine and its transitions), `follow`
//! (the list+watch sinks and background tasks that feed a view), [`reader`] (direct one-shot
//! reads) and [`handle`] (the public [`RemotePool`]). The files form a tree: `view` uses the pure
//! files and `reader`, `follow` and `handle` use `view`, and nothing uses them back; this file only
//! re-exports.

pub mod cluster;
mod follow;
pub mod handle;
pub mod options;
pub mod reader;
pub mod space;
pub mod validate;
mod view;

pub use cluster::{Cluster, ClusterEvent, RemoteState};
pub use handle::RemotePool;
pub use options::RemoteOptions;
pub use reader::RemoteReader;
pub use space::{check_overlap, id_space, Spaces};
pub use validate::{
    upserts_only, validate_delete, validate_entry, validate_remote_name, ChangeKind, Validator,
};

pub(crate) use view::{open, replay, Neighbours, RemoteView};
