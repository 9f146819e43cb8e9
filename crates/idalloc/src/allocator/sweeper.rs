//! Reclaim of bindings nobody references any more (DESIGN §8): the garbage collector behind G4.
//!
//! A sweep reads the pool's whole data range (`id/`, `key/`, `ref/`) at one revision, finds keys
//! without references, and reclaims them in batches, each orphan guarded by compares on exactly the
//! records the snapshot saw. An acquire that slips in between changes a record or adds a reference,
//! so its orphan's compare fails and the binding stays: sweepers in many processes and acquires race
//! safely, whoever commits first wins.
//!
//! Idle grace: a key becomes a candidate only after it has been seen unreferenced, with the same key
//! record, for `idle_grace` (by this process's clock). A release that leaves a key idle rewrites its
//! key record, so the clock restarts whenever the key was used in between.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Weak};
use std::time::Duration;

use tokio::time::Instant;
use tracing::{debug, warn};

use crate::allocator::pool_state::PoolState;
use crate::allocator::request::{Class, Requester};
use crate::cluster_version;
use crate::error::{Error, Result};
use crate::layout::{IdRecord, Layout};
use crate::protocol::{
    fold_fences_txn, fold_outcome, parse_id_value, sweep_outcome, sweep_txn, Orphan, SWEEP_BATCH,
};
use crate::store::{KeyRange, KeyValue, Revision};

/// Sweep batches in flight at once.
const SWEEP_IN_FLIGHT: usize = 8;

/// What a sweep found and did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SweepReport {
    /// Bindings reclaimed (or, in a dry run, that would be), as `(id, key)`.
    pub reclaimed: Vec<(u64, String)>,
    /// Unreferenced bindings still inside their idle grace.
    pub idle: usize,
    /// Bindings looked at.
    pub bindings: usize,
    /// The revision the sweep's snapshot was taken at.
    pub revision: Revision,
    /// Holder fence records in the snapshot.
    pub fence_records: usize,
    /// Holder fence records this sweep folded into the pool's fence floor (0 unless the snapshot
    /// held more than [`AllocatorOptions::fold_fences_above`](crate::AllocatorOptions)).
    pub folded: usize,
}

/// What a sweep needs of the pool's records, folded in page by page.
#[derive(Default)]
struct Snapshot {
    ids: HashMap<u64, (IdRecord, Revision)>,
    keys: HashMap<String, (u64, Revision)>,
    referenced: HashSet<String>,
    fence_records: usize,
}

impl Snapshot {
    fn add(&mut self, layout: &Layout, name: &str, kvs: &[KeyValue]) {
        for kv in kvs {
            if let Some(id) = layout.parse_id_key(name, &kv.key) {
                if let Some(rec) = IdRecord::decode(&kv.value) {
                    self.ids.insert(id, (rec, kv.mod_revision));
                }
            } else if let Some(key) = layout.parse_key_key(name, &kv.key) {
                if let Some(id) = parse_id_value(&kv.value) {
                    self.keys.insert(key, (id, kv.mod_revision));
                }
            } else if let Some((key, _holder)) = layout.parse_ref_key(name, &kv.key) {
                self.referenced.insert(key);
            } else if layout.parse_holder_key(name, &kv.key).is_some() {
                self.fence_records += 1;
            }
        }
    }
}

pub(crate) async fn sweep(
    req: &Requester,
    layout: &Layout,
    pool: &PoolState,
    dry_run: bool,
) -> Result<SweepReport> {
    pool.live()?;
    let name = pool.spec.name();
    let range = KeyRange::prefix(layout.pool_data_prefix(name));
    // Each page bounded, not the sweep's whole read (`gc` at 1M bindings ran
    // out of one request's time while pages kept coming). Each page is folded into the maps and
    // dropped: the records of the whole pool were held as well before (1.1 GB at 1M bindings).
    let (snap, revision) = req
        .pages(&range, format!("pool {name:?}"))
        .fold(Snapshot::default, |snap, kvs| snap.add(layout, name, &kvs))
        .await?;
    let Snapshot { ids, keys, referenced, fence_records } = snap;

    let now = Instant::now();
    let grace = pool.spec.idle_grace_duration();
    let mut report =
        SweepReport { bindings: keys.len(), revision, fence_records, ..Default::default() };
    let mut orphans = Vec::new();
    let mut still_idle = HashSet::new();
    {
        let mut idle_since = pool.idle_since.lock().unwrap_or_else(|p| p.into_inner());
        for (key, (id, key_rev)) in &keys {
            if referenced.contains(key) {
                continue;
            }
            let mark = (key.clone(), *key_rev);
            let since = *idle_since.entry(mark.clone()).or_insert(now);
            if grace.is_zero() || now.duration_since(since) >= grace {
                // Only an ID record that names this key goes with it.
                let id_rec = match ids.get(id) {
                    Some((IdRecord::Bound(k), rev)) if k == key => Some((*id, *rev)),
                    _ => None,
                };
                orphans.push(Orphan { key: key.clone(), key_rec: Some((*id, *key_rev)), id_rec });
            } else {
                report.idle += 1;
            }
            still_idle.insert(mark);
        }
        idle_since.retain(|m, _| still_idle.contains(m));
    }
    // ID records with no key record and no reference are left over from lost data: free them.
    for (id, (rec, rev)) in &ids {
        if let IdRecord::Bound(k) = rec {
            if !keys.contains_key(k) && !referenced.contains(k) {
                orphans.push(Orphan { key: k.clone(), key_rec: None, id_rec: Some((*id, *rev)) });
            }
        }
    }
    // A total order (two stray ID records may name one key): the same batches on every run.
    orphans.sort_by(|a, b| (&a.key, orphan_id(a)).cmp(&(&b.key, orphan_id(b))));

    if dry_run {
        report.reclaimed = orphans.iter().map(|o| (orphan_id(o), o.key.clone())).collect();
        return Ok(report);
    }
    // The batches are independent (each orphan guarded by its own nested compares), so several
    // are in flight at once: a large sweep costs a few round-trip times, not one per batch. Each
    // takes a bulk turn: a sweep of thousands of released keys is bulk store work, and sent 8 at
    // once beside single-key calls it kept them waiting at etcd (docs/design/bulk-admission.md).
    let batches: Vec<&[Orphan]> = orphans.chunks(SWEEP_BATCH).collect();
    let mut answers = Vec::with_capacity(batches.len());
    for wave in batches.chunks(SWEEP_IN_FLIGHT) {
        let mut sends = Vec::with_capacity(wave.len());
        for &batch in wave {
            let build = move |lease| sweep_txn(layout, name, batch, lease, Some(pool.spec_fence()));
            sends.push(Box::pin(async move {
                let _turn = req.admit(Class::Bulk).await;
                req.txn_with_quarantine(pool, true, build).await
            }));
        }
        answers.extend(futures::future::join_all(sends).await);
    }
    for (batch, resp) in batches.into_iter().zip(answers) {
        let resp = resp?;
        let Some(done) = sweep_outcome(&resp, batch.len()).map_err(Error::from)? else {
            // The spec is not the one the sweep was decided for: the pool was deleted or
            // re-created. The else branch read the spec back; retire the pool's state as a
            // failed bind would (docs/design/protocol.md, "Pool incarnations").
            let spec_now = match resp.responses.first() {
                Some(crate::store::OpResponse::Get(g)) => g.kvs.first().cloned(),
                _ => None,
            };
            return Err(pool.spec_moved(spec_now));
        };
        for (o, ok) in batch.iter().zip(done) {
            if ok {
                if let (Some((id, _)), true) =
                    (o.id_rec, pool.spec.reuse_delay_duration().is_zero())
                {
                    // Our own committed reclaim: free in the local view at once.
                    pool.lock_cache().freed_by_own_write(id, resp.revision);
                }
                report.reclaimed.push((orphan_id(o), o.key.clone()));
            }
        }
    }
    if fence_records > req.fold_fences_above {
        report.folded = match fold_fences(req, layout, pool).await {
            Ok(n) => n,
            // The reclaims above stand; the next sweep folds (an unanswered fold may have
            // committed: folding twice is harmless).
            Err(e) if pool.live().is_ok() => {
                warn!(pool = %name, error = %e, "folding fence records failed");
                0
            }
            Err(e) => return Err(e),
        };
    }
    if !report.reclaimed.is_empty() {
        debug!(pool = %name, reclaimed = report.reclaimed.len(), "sweep reclaimed idle bindings");
    }
    Ok(report)
}

/// Folds the pool's holder fence records into its fence floor (one txn; `protocol::fold_fences_txn`
/// says why no late bind survives it): the number of records deleted. Only once the cluster
/// version is finalized and its grace is over (compared in the same txn): a bind of a build
/// before it does not compare the floor, and a fold would let one applied late commit
/// (`cluster_version.rs`).
async fn fold_fences(req: &Requester, layout: &Layout, pool: &PoolState) -> Result<usize> {
    let fold = fold_fences_txn(layout, pool.spec.name(), pool.spec_fence());
    let resp = req.txn(cluster_version::when_finalized(layout, fold)).await?;
    let resp = match cluster_version::when_finalized_outcome(layout, &resp)? {
        Ok(inner) => inner,
        Err(version) => {
            debug!(pool = %pool.spec.name(), cluster_version = version, "fence records not folded before the cluster version is finalized");
            return Ok(0);
        }
    };
    match fold_outcome(resp).map_err(Error::from)? {
        Ok(deleted) => {
            debug!(pool = %pool.spec.name(), deleted, "folded holder fence records");
            Ok(usize::try_from(deleted).unwrap_or(0))
        }
        Err(spec_now) => Err(pool.spec_moved(spec_now)),
    }
}

fn orphan_id(o: &Orphan) -> u64 {
    o.key_rec.map(|(id, _)| id).or(o.id_rec.map(|(id, _)| id)).unwrap_or_default()
}

/// The background sweeper: one sweep per `interval` until the allocator is gone.
pub(crate) async fn run(
    req: Weak<Requester>,
    layout: Layout,
    pool: Arc<PoolState>,
    interval: Duration,
) {
    loop {
        tokio::time::sleep(interval).await;
        let Some(strong) = req.upgrade() else {
            return;
        };
        let r = sweep(&strong, &layout, &pool, false).await;
        crate::metrics::swept(pool.spec.name(), &r);
        match r {
            Ok(report) => {
                crate::metrics::reclaimed(pool.spec.name(), "sweep", report.reclaimed.len())
            }
            Err(e) => warn!(pool = %pool.spec.name(), error = %e, "background sweep failed"),
        }
    }
}
