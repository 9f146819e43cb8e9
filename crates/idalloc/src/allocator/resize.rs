//! Resizing a pool: a new range and reserved IDs for an existing pool, everything else unchanged
//! (docs/design/resize.md).
//!
//! Growing is always allowed. Narrowing (a higher min, a lower max, more reserved IDs) is refused
//! while any ID record the new spec would not hand out exists (a binding, or a tombstone still in
//! its reuse delay), or any key record names such an ID (its ID record lost with store data: a
//! repair would re-create it there). The check and the write are made atomic by compares: the
//! spec record is rewritten only if no ID or key record was created or changed since the
//! revision the check read, and
//! only if the spec is still the version the new one was derived from. Every bind compares the
//! spec record's mod revision, so a bind decided against the old range and sent before the resize
//! commits either commits first (and then fails the resize's compare) or fails its own.
//!
//! Narrowing also waits for the cluster version to be finalized and its grace to pass, compared
//! in the same txn: a process of protocol 1 compares only the spec record's create revision,
//! which a resize keeps, and never rereads a spec of the same create revision, so beside it a
//! narrowed range would not keep it from binding the excluded IDs (docs/design/cluster-version.md).

use crate::cluster_version;
use crate::error::{Error, Input, Result};
use crate::layout::{IdRecord, Layout};
use crate::pool::{validate_pool_name, PoolSpec};
use crate::store::{Compare, CompareOp, CompareTarget, KeyRange, Revision, TxnOp, TxnRequest};

use super::pool_state::lock;
use super::Allocator;

/// Attempts before a resize that keeps losing its compare to concurrent writes gives up.
const MAX_RESIZE_ATTEMPTS: usize = 8;

/// True if `new` hands out every raw ID `old` hands out: a resize that only grows.
pub fn only_grows(old: &PoolSpec, new: &PoolSpec) -> bool {
    new.min() <= old.min()
        && new.max() >= old.max()
        && new.reserved().iter().all(|&(lo, hi)| {
            // Every newly reserved ID must have been reserved already (or outside the old range).
            let outside = hi < old.min() || lo > old.max();
            outside
                || old
                    .reserved()
                    .iter()
                    .any(|&(a, b)| a <= lo.max(old.min()) && hi.min(old.max()) <= b)
        })
}

/// The resize txn: `If mod_revision(pools/name) == spec_rev [∧ every ID and key record of the
/// pool has mod_revision ≤ listed_at] Then put new`. `spec_rev` is the version `new` was derived
/// from; `listed_at` (narrowing only) the revision from which listings found no ID record and no
/// key record outside `new`: a bind committed after it makes the txn fail, so the listings'
/// verdict still holds when the new spec is written.
pub fn resize_txn(
    l: &Layout,
    name: &str,
    spec_rev: Revision,
    listed_at: Option<Revision>,
    new: &PoolSpec,
) -> TxnRequest {
    let mut when = vec![Compare::mod_revision_is(l.pool_spec_key(name), spec_rev)];
    if let Some(at) = listed_at {
        for prefix in [l.id_prefix(name), l.key_prefix(name)] {
            when.push(Compare::new(
                KeyRange::prefix(prefix),
                CompareOp::Less,
                CompareTarget::ModRevision(at.saturating_add(1)),
            ));
        }
    }
    TxnRequest::new().when(when).and_then([TxnOp::put(l.pool_spec_key(name), new.to_json())])
}

impl Allocator {
    /// Gives pool `name` the range `[min, max]` and, if `reserved` is given, those reserved IDs
    /// (else the pool's reserved IDs inside the new range stay reserved). Name, prefix, strategy
    /// and reclaim settings never change. Returns the spec now in force.
    ///
    /// Growing always succeeds. Narrowing is refused (`InvalidInput` with [`Input::PoolInUse`])
    /// while an ID the new spec would not hand out is bound or quarantined (the error names one
    /// such ID and its key), and until the cluster version is finalized and its grace is over
    /// (`idalloc upgrade finalize`: processes of protocol 1 do not see a narrowed range). Prefix
    /// pools resize their raw range (the prefix stays; the new max must leave the prefix bits
    /// free). One read of the spec, one listing of the pool's ID
    /// records when narrowing, and one txn; retried while concurrent writes keep changing the
    /// pool (`Unavailable` after a few attempts).
    pub async fn resize_pool(
        &self,
        name: &str,
        min: u64,
        max: u64,
        reserved: Option<&[(u64, u64)]>,
    ) -> Result<PoolSpec> {
        validate_pool_name(name)?;
        let inner = &self.inner;
        let l = &inner.layout;
        for _ in 0..MAX_RESIZE_ATTEMPTS {
            let read = inner
                .read_spec(name)
                .await?
                .ok_or_else(|| Error::PoolNotFound { pool: name.to_string() })?;
            let old = &read.spec;
            let kept: Vec<(u64, u64)>;
            let reserved = match reserved {
                Some(r) => r,
                None => {
                    kept = old
                        .reserved()
                        .iter()
                        .filter(|&&(lo, hi)| lo <= max && hi >= min)
                        .map(|&(lo, hi)| (lo.max(min), hi.min(max)))
                        .collect();
                    &kept
                }
            };
            let new = old.resized(min, max, reserved);
            new.validate()?;
            if new == *old {
                return Ok(new);
            }
            let narrows = !only_grows(old, &new);
            let listed_at = if narrows {
                let at = self.check_narrowing(name, &new).await?;
                if !cluster_version::narrows_pools(inner.cluster_version()) {
                    return Err(not_finalized(name, &new));
                }
                Some(at)
            } else {
                None
            };
            let mut txn = resize_txn(l, name, read.rev, listed_at, &new);
            if narrows {
                // In the txn too, so the version read above cannot be stale.
                txn = txn
                    .when(cluster_version::in_force_compares(l))
                    .or_else([cluster_version::read_op(l)]);
            }
            let resp = inner.req.txn(txn).await?;
            if !resp.succeeded && narrows {
                let now = cluster_version::from_response(l, resp.responses.first())?;
                if !cluster_version::narrows_pools(now.in_force()) {
                    return Err(not_finalized(name, &new));
                }
            }
            if resp.succeeded {
                tracing::info!(pool = %name, from = %old, to = %new, "pool resized");
                if let Some(p) = lock(&inner.pools).get(name).cloned() {
                    if p.spec_rev == read.created {
                        p.adopt(new.clone(), resp.revision);
                    }
                }
                return Ok(new);
            }
            // The spec changed, or an ID record was written since the check: look again.
        }
        Err(Error::unavailable(format!(
            "pool {name:?} kept changing during {MAX_RESIZE_ATTEMPTS} resize attempts; retry"
        )))
    }

    /// Lists pool `name`'s ID records, then its key records, each at one revision, and refuses
    /// if one of them names an ID `new` would not hand out; returns the first listing's revision.
    /// Pages through the records, so memory stays bounded by a page whatever the pool's size.
    async fn check_narrowing(&self, name: &str, new: &PoolSpec) -> Result<i64> {
        let inner = &self.inner;
        let l = &inner.layout;
        let refused = |why: String| {
            Error::invalid(Input::PoolInUse, "new range of pool", format!("{name:?}: {new}"), why)
        };
        let range = KeyRange::prefix(l.id_prefix(name));
        let mut pages = inner.req.pages(&range, format!("pool {name:?}"));
        while let Some(page) = pages.next_page().await.map_err(Error::from)? {
            for kv in page {
                let Some(id) = l.parse_id_key(name, &kv.key) else {
                    continue;
                };
                if crate::protocol::id_is_allocatable(new, id) {
                    continue;
                }
                let (what, key) = match IdRecord::decode(&kv.value) {
                    Some(IdRecord::Bound(k)) => ("is bound to key", k),
                    Some(IdRecord::Tombstone(k)) => {
                        ("is quarantined (in its reuse delay) after key", k)
                    }
                    None => ("has an unreadable record", String::new()),
                };
                return Err(refused(format!(
                    "ID {id} {what} {key:?}, outside the new range or reserved by it: release it \
                     (and wait out the reuse delay) or choose a range that keeps it"
                )));
            }
        }
        let ids_at = pages.revision();
        // Then key records: a key record whose ID record was lost (store data loss) still holds
        // its ID (a repair re-creates the binding there). The ID listing's revision, the
        // earlier, is the one the txn compares both prefixes against.
        let keys = KeyRange::prefix(l.key_prefix(name));
        let mut pages = inner.req.pages(&keys, format!("pool {name:?}"));
        while let Some(page) = pages.next_page().await.map_err(Error::from)? {
            for kv in page {
                let Some(key) = l.parse_key_key(name, &kv.key) else { continue };
                match crate::layout::parse_id_value(&kv.value) {
                    Some(id) if crate::protocol::id_is_allocatable(new, id) => {}
                    Some(id) => {
                        return Err(refused(format!(
                            "key {key:?} is bound to ID {id}, outside the new range or reserved \
                             by it: release it or choose a range that keeps it"
                        )))
                    }
                    None => {}
                }
            }
        }
        Ok(ids_at)
    }
}

/// The refusal of a narrowing resize before version 2 is in force.
fn not_finalized(name: &str, new: &PoolSpec) -> Error {
    Error::invalid(
        Input::PoolInUse,
        "new range of pool",
        format!("{name:?}: {new}"),
        "it narrows the pool (a higher min, a lower max or newly reserved IDs), which waits until \
         the cluster version is finalized and its grace is over: processes of protocol 1 do not \
         see a narrowed range and could still hand out the IDs it excludes. Once every process \
         runs this build, run `idalloc upgrade finalize` (and wait out its grace); growing is \
         allowed meanwhile",
    )
}
