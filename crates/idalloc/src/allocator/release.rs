//! Release (DESIGN §5, §8): removes a holder's reference and, with the last one, reclaims the
//! binding (G4) behind a tombstone on the quarantine lease (G5); fenced against this holder's own
//! binds applied late (docs/design/fences.md, "Late commits").

use tracing::debug;

use super::bind::MAX_BIND_ATTEMPTS;
use super::pool_state::{lock, PoolState};
use super::registry::{protocol_error, Inner};
use super::types::Released;
use crate::error::{Error, Result};
use crate::protocol::{self, LastRelease, ReleaseOutcome, ReleasePlan};
use crate::store::LeaseId;

impl Inner {
    /// Sends a release txn for `holder`'s reference, retrying with a new quarantine lease if the
    /// old one has run out. `durable`: a durable holder (always bumps its fence record, since
    /// other processes sharing the name may have binds in flight); a leased holder bumps it only
    /// when one of its binds of `key` is in doubt.
    pub(super) async fn release_ref(
        &self,
        pool: &PoolState,
        key: &str,
        id: u64,
        holder: &str,
        durable: bool,
    ) -> Result<Released> {
        let _interactive = self.req.interactive();
        pool.live()?;
        let reclaim = pool.spec.idle_grace_duration().is_zero();
        let (mut id, mut require_own_ref) = (id, durable);
        let mut held: Option<bool> = None;
        let mut fenced_out = 0;
        loop {
            let bump = self.bump_lease(pool, key, durable).await;
            let fences = self.fences(pool);
            let plan = |tombstone_lease| ReleasePlan {
                key,
                id,
                holder,
                last: if reclaim {
                    LastRelease::Reclaim { tombstone_lease }
                } else {
                    LastRelease::Touch
                },
                require_own_ref,
                fences,
                bump,
            };
            let session = bump.filter(|l| *l != 0);
            let sent = self
                .req
                .txn_with_leases(pool, reclaim, session, |lease| {
                    plan(lease).txn(&self.layout, pool.spec.name())
                })
                .await?;
            let Some(resp) = sent else {
                // The session lease carrying the bump is gone, and with it every reference and
                // every in-flight bind on it: nothing is left to fence.
                if let Some(l) = session {
                    self.session_lost(l).await;
                }
                lock(&pool.doubt).remove(key);
                continue;
            };
            let out: ReleaseOutcome = plan(None).outcome(&resp).map_err(protocol_error)?;
            if let Some(spec_now) = out.pool_gone {
                return Err(self.pool_gone(pool, spec_now));
            }
            if out.fenced_out {
                // Our reference was written after the revision we had seen: a bind of ours applied
                // late, before this release. Decide again with what this response taught us.
                fenced_out += 1;
                if fenced_out > MAX_BIND_ATTEMPTS {
                    return Err(Error::unavailable(format!(
                        "release of key {key:?} in pool {:?} kept finding its reference rewritten",
                        pool.spec.name()
                    )));
                }
                debug!(pool = %pool.spec.name(), key, "release fenced out by a newer reference; again");
                continue;
            }
            if bump.is_some() && !durable {
                lock(&pool.doubt).remove(key);
            }
            let first = held.is_none();
            let had_ref = *held.get_or_insert(out.had_ref);
            if out.reclaimed {
                debug!(pool = %pool.spec.name(), key, id, "last reference released; binding reclaimed");
                if pool.spec.reuse_delay_duration().is_zero() {
                    // Our own committed write: the ID is free in the local view at once.
                    pool.lock_cache().freed_by_own_write(id, out.revision);
                }
            }
            match out.key_now {
                // The ID came from a cache that had not seen the key rebound: the reference is
                // gone, but the last-holder check ran against the wrong ID. Finish on the real one
                // (found by the chaos test's review: a durable release could leak the binding).
                Some(now) if first && had_ref && !resp.succeeded && now != id => {
                    debug!(pool = %pool.spec.name(), key, stale_id = id, id = now, "released with a stale ID; finishing on the key's real ID");
                    id = now;
                    require_own_ref = false;
                }
                _ => return Ok(Released { held: had_ref, reclaimed: out.reclaimed }),
            }
        }
    }

    /// The lease to bump the holder's fence record on in a release of `key` (see
    /// [`ReleasePlan::bump`]): always for durable holders (lease 0); for this process's leased
    /// holder only while a bind of `key` is in doubt, on the current session lease.
    pub(super) async fn bump_lease(
        &self,
        pool: &PoolState,
        key: &str,
        durable: bool,
    ) -> Option<LeaseId> {
        if durable {
            return Some(0);
        }
        if !lock(&pool.doubt).contains(key) {
            return None;
        }
        let lease = self.session.lock().await.lease;
        if lease.is_none() {
            // No session lease: the one the doubtful attempt used is gone, so it cannot apply.
            lock(&pool.doubt).remove(key);
        }
        lease
    }

    /// Removes `holder`'s reference to `key` when the key has no binding (a stray reference).
    pub(super) async fn release_stray_ref(
        &self,
        pool: &PoolState,
        key: &str,
        holder: &str,
        durable: bool,
    ) -> Result<Released> {
        for _ in 0..MAX_BIND_ATTEMPTS {
            let bump = self.bump_lease(pool, key, durable).await;
            let fences = self.fences(pool);
            let req = protocol::stray_ref_release_txn(
                &self.layout,
                pool.spec.name(),
                key,
                holder,
                fences,
                bump,
            );
            let resp = self.req.txn(req).await?;
            let out = protocol::stray_ref_release_outcome(&resp, fences).map_err(protocol_error)?;
            if let Some(spec_now) = out.pool_gone {
                return Err(self.pool_gone(pool, spec_now));
            }
            if !out.fenced_out {
                if bump.is_some() && !durable {
                    lock(&pool.doubt).remove(key);
                }
                return Ok(Released { held: out.had_ref, reclaimed: false });
            }
        }
        Err(Error::unavailable(format!(
            "release of key {key:?} in pool {:?} kept finding its reference rewritten",
            pool.spec.name()
        )))
    }
}
