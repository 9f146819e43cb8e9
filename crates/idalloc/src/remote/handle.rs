//! The public handle on one remote view.

use std::fmt;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use crate::pool::PoolSpec;
use crate::store::Revision;

use super::cluster::{Cluster, RemoteState};
use super::view::{replay, RemoteView};

/// A handle on one remote view ([`crate::Pool::watch_remote`]). Cheap to clone.
#[derive(Clone)]
pub struct RemotePool {
    pub(crate) view: Arc<RemoteView>,
}

impl fmt::Debug for RemotePool {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RemotePool")
            .field("name", &self.view.name)
            .field("spec", &self.spec())
            .field("state", &self.state())
            .finish()
    }
}

impl RemotePool {
    /// The remote's name.
    pub fn name(&self) -> &str {
        &self.view.name
    }

    /// As a [`Cluster`].
    pub fn cluster(&self) -> Cluster {
        self.view.cluster.clone()
    }

    /// The remote pool's spec the view validates against: as read when the view was opened, or
    /// the newer one of a re-created pool (see [`RemoteState::Refused`]).
    pub fn spec(&self) -> PoolSpec {
        self.view.lock().spec.clone()
    }

    /// Why the remote's current spec is refused ([`RemoteState::Refused`]); `None` otherwise.
    pub fn refusal(&self) -> Option<String> {
        self.view.lock().refused.clone()
    }

    /// How far the view can be trusted now.
    pub fn state(&self) -> RemoteState {
        *self.view.state.borrow()
    }

    /// Waits until the view's state is `Synced` (use a timeout: a remote may never answer).
    pub async fn wait_synced(&self) {
        let mut rx = self.view.state.subscribe();
        let _ = rx.wait_for(|s| *s == RemoteState::Synced).await;
    }

    /// Waits until the view's state is `Stale`.
    pub async fn wait_stale(&self) {
        let mut rx = self.view.state.subscribe();
        let _ = rx.wait_for(|s| matches!(s, RemoteState::Stale { .. })).await;
    }

    /// The ID bound to `key` in the remote pool, as the view knows it (no round trip).
    pub fn get(&self, key: &str) -> Option<u64> {
        self.view.lock().cache.get(key)
    }

    /// The key bound to `id` in the remote pool, as the view knows it (no round trip).
    pub fn key_of(&self, id: u64) -> Option<String> {
        self.view.key_of(id)
    }

    /// Every binding of the view, sorted by ID.
    pub fn snapshot(&self) -> Vec<(u64, String)> {
        self.view.lock().cache.snapshot()
    }

    /// The remote store revision the view reflects (0 before the first listing).
    pub fn revision(&self) -> Revision {
        self.view.lock().cache.revision()
    }

    /// Number of bindings in the view.
    pub fn len(&self) -> usize {
        self.view.lock().cache.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Changes refused by validation so far: entries dropped and deletes refused (each listing or
    /// event that carried one counts).
    pub fn dropped(&self) -> u64 {
        self.view.dropped.load(Ordering::Relaxed)
    }

    /// Subscribes to the view's events: first the current bindings as `Upsert`s and, if a listing
    /// was applied, one `Synced`; then every change, in order.
    pub fn events(&self) -> crate::Events {
        let g = self.view.lock();
        let replay = replay(&g.cache, g.listed);
        let rx = self.view.events.subscribe();
        drop(g);
        crate::Events::new(replay, rx)
    }
}
