//! The repair task (DESIGN §7): runs the [`Repair`]s of the queue one at a time, retrying failed
//! ones with back-off; re-creates held keys' bindings (G2: a held key keeps its ID, or the
//! application gets a `Conflict` event), completes releases and cleans up after acquires whose
//! outcome was unknown (G4).

use std::sync::{Arc, Weak};
use std::time::Duration;

use tokio::sync::mpsc;
use tracing::{info, warn};

use super::bind::Hints;
use super::pool_state::{lock, PoolState};
use super::registry::Inner;
use super::repair_queue::Repair;
use super::request::Class;
use crate::cache::Event;
use crate::error::{Error, Result};

/// Held keys one batched re-referencing pass locks and binds at a time.
const REBIND_CHUNK: usize = 2048;

impl Inner {
    /// Finishes a release whose outcome was unknown (the store did not answer): sends it again
    /// unless the process holds the key again meanwhile. The release txn is idempotent: if the
    /// first one took effect, this one only finds nothing to do.
    pub(super) async fn finish_release(
        self: &Arc<Self>,
        pool: &Arc<PoolState>,
        key: &str,
        id: u64,
    ) -> Result<()> {
        let _key = pool.lock_key(key).await;
        {
            if lock(&pool.held).contains_key(key) {
                Ok(())
            } else {
                let holder = self.holder.clone();
                self.release_ref(pool, key, id, &holder, false).await.map(|_| ())
            }
        }
    }

    /// Cleans up after a leased acquire of `key` that failed with attempts in doubt: unless the
    /// process holds the key again, releases whatever reference those attempts may have left
    /// (fenced, bumping the holder record so that an attempt still in flight fails when it lands).
    pub(super) async fn abandon(self: &Arc<Self>, pool: &Arc<PoolState>, key: &str) -> Result<()> {
        let _key = pool.lock_key(key).await;
        async {
            if lock(&pool.held).contains_key(key) {
                return Ok(());
            }
            let holder = self.holder.clone();
            match self.read_key_record(pool, key).await? {
                Some(id) => self.release_ref(pool, key, id, &holder, false).await.map(|_| ()),
                None => self.release_stray_ref(pool, key, &holder, false).await.map(|_| ()),
            }
        }
        .await
    }

    /// Re-references (and if needed re-creates) one held key with its ID; emits `Conflict` if the
    /// ID had to change.
    pub(super) async fn repair_key(
        self: &Arc<Self>,
        pool: &Arc<PoolState>,
        key: &str,
    ) -> Result<()> {
        let _key = pool.lock_key(key).await;
        {
            let old = lock(&pool.held).get(key).map(|h| h.id);
            match old {
                None => Ok(()),
                Some(old) => self.rebind_held(pool, key, old).await,
            }
        }
    }

    /// Re-references every key this process holds in `pool` with its ID (after a lost session
    /// lease, DESIGN §7) in batched passes: one round trip per batch of keys instead of one per
    /// key. Same decisions as [`Inner::rebind_held`] per key (strict about preferred IDs: only a
    /// record read from the store moves a held key, with a `Conflict`). Returns the keys whose
    /// repair failed, to be retried one by one.
    pub(super) async fn rebind_all_held(self: &Arc<Self>, pool: &Arc<PoolState>) -> Vec<String> {
        let mut keys: Vec<String> = lock(&pool.held).keys().cloned().collect();
        keys.sort(); // a fixed order: a simulation seed replays the same history
        let holder = self.holder.clone();
        let mut failed = Vec::new();
        let mut kept = 0usize;
        for chunk in keys.chunks(REBIND_CHUNK) {
            // The single-flight locks in sorted order (as batched calls take them): no deadlock
            // with concurrent acquires and releases, and none of the keys changes meanwhile.
            let mut guards = Vec::with_capacity(chunk.len());
            for k in chunk {
                guards.push(pool.lock_key(k).await);
            }
            let items: Vec<(&str, Option<u64>)> = {
                let held = lock(&pool.held);
                chunk.iter().filter_map(|k| held.get(k).map(|h| (k.as_str(), Some(h.id)))).collect()
            };
            let results = self
                .bind_many(
                    pool,
                    &items,
                    &holder,
                    super::RefLease::Session,
                    Hints::Strict,
                    Class::Bulk,
                )
                .await;
            for (&(key, old), r) in items.iter().zip(results) {
                let old = old.unwrap_or_default();
                match r {
                    Ok(a) => {
                        if let Some(h) = lock(&pool.held).get_mut(key) {
                            h.id = a.id;
                        }
                        if a.id == old {
                            kept += 1;
                        } else {
                            warn!(pool = %pool.spec.name(), key, old_id = old, new_id = a.id, "held key lost its ID to another key; rebound");
                            crate::metrics::conflict(pool.spec.name());
                            pool.emit(Event::Conflict {
                                key: key.to_string(),
                                old_id: old,
                                new_id: a.id,
                            });
                        }
                    }
                    Err(e) => {
                        warn!(pool = %pool.spec.name(), key, error = %e, "re-referencing a held key failed; will retry");
                        failed.push(key.to_string());
                    }
                }
            }
        }
        info!(pool = %pool.spec.name(), kept, failed = failed.len(), "held keys re-referenced with their IDs");
        failed
    }

    pub(super) async fn rebind_held(
        self: &Arc<Self>,
        pool: &Arc<PoolState>,
        key: &str,
        old: u64,
    ) -> Result<()> {
        let holder = self.holder.clone();
        let a = self.bind(pool, key, Some(&holder), super::RefLease::Session, Some(old)).await?;
        if let Some(h) = lock(&pool.held).get_mut(key) {
            h.id = a.id;
        }
        if a.id != old {
            warn!(pool = %pool.spec.name(), key, old_id = old, new_id = a.id, "held key lost its ID to another key; rebound");
            crate::metrics::conflict(pool.spec.name());
            pool.emit(Event::Conflict { key: key.to_string(), old_id: old, new_id: a.id });
        } else {
            info!(pool = %pool.spec.name(), key, id = old, "held key re-referenced with its ID");
        }
        Ok(())
    }
}

/// Runs repairs one at a time; a repair that fails (store unreachable) is retried with back-off.
pub(super) async fn repair_loop(inner: Weak<Inner>, mut rx: mpsc::UnboundedReceiver<Repair>) {
    let mut backoff = Duration::from_millis(100);
    while let Some(job) = rx.recv().await {
        let Some(strong) = inner.upgrade() else {
            return;
        };
        if let Repair::Release(p, k, id) = job {
            if let Err(e) = strong.finish_release(&p, &k, id).await {
                if matches!(e, Error::PoolNotFound { .. } | Error::RangeMismatch { .. }) {
                    continue;
                }
                warn!(pool = %p.spec.name(), key = %k, error = %e, "completing a release failed; will retry");
                strong.repairs.push(Repair::Release(p, k, id));
                drop(strong);
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(Duration::from_secs(5));
            }
            continue;
        }
        if let Repair::Abandon(p, k) = job {
            match strong.abandon(&p, &k).await {
                Ok(()) | Err(Error::PoolNotFound { .. }) | Err(Error::RangeMismatch { .. }) => {}
                Err(e) => {
                    warn!(pool = %p.spec.name(), key = %k, error = %e, "cleaning up after a failed acquire failed; will retry");
                    strong.repairs.push(Repair::Abandon(p, k));
                    drop(strong);
                    tokio::time::sleep(backoff).await;
                    backoff = (backoff * 2).min(Duration::from_secs(5));
                }
            }
            continue;
        }
        let mut failed = false;
        let jobs: Vec<(Arc<PoolState>, String)> = match job {
            Repair::Release(..) | Repair::Abandon(..) => Vec::new(),
            Repair::Key(p, k) => vec![(p, k)],
            Repair::All => {
                // Every held key of every pool, batched per pool; a key that fails is retried on
                // its own after the back-off, as a failed single repair is.
                let mut pools: Vec<Arc<PoolState>> =
                    lock(&strong.pools).values().cloned().collect();
                // Hash maps iterate in a per-process random order; repairs run in a fixed one so
                // that a simulation seed replays the same history.
                pools.sort_by(|a, b| a.spec.name().cmp(b.spec.name()));
                for p in pools {
                    for k in strong.rebind_all_held(&p).await {
                        strong.repairs.push(Repair::Key(p.clone(), k));
                        failed = true;
                    }
                }
                Vec::new()
            }
        };
        for (p, k) in &jobs {
            if let Err(e) = strong.repair_key(p, k).await {
                warn!(pool = %p.spec.name(), key = %k, error = %e, "repair failed; will retry");
                strong.repairs.push(Repair::Key(p.clone(), k.clone()));
                failed = true;
            }
        }
        drop(strong);
        if failed {
            tokio::time::sleep(backoff).await;
            backoff = (backoff * 2).min(Duration::from_secs(5));
        } else {
            backoff = Duration::from_millis(100);
        }
    }
}
