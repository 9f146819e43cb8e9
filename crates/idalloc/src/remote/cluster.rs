//! The vocabulary of a pool's clusters: which cluster an event or binding comes from, and how far
//! a remote view can be trusted.

use std::fmt;
use std::sync::Arc;
use std::time::SystemTime;

use crate::cache::Event;

/// Which cluster a binding or an event comes from.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Cluster {
    /// This allocator's own store.
    Local,
    /// The remote view of that name.
    Remote(Arc<str>),
}

impl Cluster {
    /// `"local"` or the remote's name (the name `local` is refused for remotes).
    pub fn name(&self) -> &str {
        match self {
            Cluster::Local => "local",
            Cluster::Remote(n) => n,
        }
    }
}

impl fmt::Display for Cluster {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// An event of one cluster of a pool ([`crate::Pool::cluster_events`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ClusterEvent {
    pub cluster: Cluster,
    pub event: Event,
}

/// How far a remote view can be trusted.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RemoteState {
    /// The first listing is not done yet: the view may be incomplete.
    Syncing,
    /// The view follows the remote store.
    Synced,
    /// The remote has been unreachable since `since`; the view shows what it last knew.
    Stale { since: SystemTime },
    /// The remote pool was re-created with a spec this pool must refuse (its ID space overlaps
    /// another cluster's, or it is unreadable): the view dropped its entries and shows nothing
    /// until the remote's spec is acceptable again. [`RemotePool::refusal`](crate::remote::RemotePool::refusal) says why.
    Refused,
}

impl RemoteState {
    /// The state's name, as in the `idalloc_remote_view_state` metric.
    pub fn label(&self) -> &'static str {
        match self {
            RemoteState::Syncing => "syncing",
            RemoteState::Synced => "synced",
            RemoteState::Stale { .. } => "stale",
            RemoteState::Refused => "refused",
        }
    }
}
