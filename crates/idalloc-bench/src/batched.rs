//! The batching figures: the batched etcd ceiling (what many-keys-per-txn can reach on this etcd)
//! and restart restoration of held keys. The coalesced figure is the idalloc contender of the new
//! keys scenario at concurrency 64 (concurrent single-key acquires of one process are coalesced);
//! `acquire --from` / `release --from` are the CLI scenarios.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::stream::{self, StreamExt};
use idalloc::bench_api::{assemble, BindPlan, Fences, Frame, RefTarget};
use idalloc::layout::Layout;
use idalloc::store::{
    Compare, CompareOp, CompareTarget, KeyRange, OpResponse, Store, TxnOp, TxnRequest,
};
use idalloc::{Allocator, AllocatorOptions, PoolSpec};
use idalloc_testkit::etcd::EtcdServer;

use crate::contender::{err, POOL, RANGE, SESSION_TTL};
use crate::scenarios::{counted, key};
use crate::stats::{CpuSample, CpuSplit};

/// Keys per batch, as the CLI's `--from` sends them.
pub const KEYS_PER_BATCH: usize = 100;

/// How the batched ceiling packs and sends its keys.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Shape {
    /// Per-key txns in one nested group.
    pub keys_per_txn: usize,
    /// Groups per request: 1 is a flat batch (`If … Then txn(key 1), txn(key 2), …`), more nest
    /// each group one level deeper (`Then txn(txn(key 1), …), txn(…), …`), as etcd's op budget
    /// allows (each level gets `128 − its parent's ops`).
    pub groups: usize,
    /// Requests in flight.
    pub inflight: usize,
    /// The compares every key of a batch shares (the pool's spec, the holder's fence record) in
    /// the batch's guard once instead of in every key's txn.
    pub hoist: bool,
    /// The reference on a lease (as a leased `acquire`) rather than durable (as `acquire --from`).
    pub leased: bool,
    /// A watch on the pool's ID records, drained (as idalloc's cache feed): what etcd spends
    /// streaming every write back.
    pub watch: bool,
}

/// The shape the harness measures the ceiling at: flat batches of the CLI's size, references
/// durable as `acquire --from` writes them, 8 requests in flight. A sweep over keys per txn (25 to
/// 124, the most etcd's 128-op level budget allows with 4 compares per key), nesting (up to 800
/// keys per request), hoisted shared compares and 1 to 64 requests in flight
/// (`--ceiling-sweep`, docs/benchmarks/findings.md, the 8× target) found no shape faster
/// than this one beyond the run-to-run noise: past 2 to 8 requests in flight etcd's serial apply is
/// the queue, and more keys per request save only its per-request cost (a few µs of etcd CPU per key).
pub const CEILING: Shape = Shape {
    keys_per_txn: KEYS_PER_BATCH,
    groups: 1,
    inflight: 8,
    hoist: false,
    leased: false,
    watch: false,
};

/// The batched etcd ceiling: `n` new keys on a fresh etcd, in requests of `shape` holding nested
/// per-key txns built by idalloc's own plan (`If key/k absent ∧ id/C absent ∧ spec unchanged ∧
/// holder fence unchanged Then put id/C, key/k, ref/k/h Else get …`), with a perfect free-ID oracle
/// (ID = i) and no cache, session or per-key bookkeeping. Keys per second, and where the CPU went
/// (this process is the client); every nested txn must have succeeded.
pub async fn batched_ceiling(n: usize, shape: Shape) -> Result<(f64, CpuSplit), String> {
    let etcd = EtcdServer::start().await?;
    let store = counted(&etcd).await?;
    let layout = Layout::new("ceiling").map_err(|e| err("ceiling layout", e))?;
    // A spec record to compare, as every idalloc write does.
    let spec_key = layout.pool_spec_key(POOL);
    let put = store
        .txn(idalloc::store::TxnRequest::new().and_then([TxnOp::put(spec_key.clone(), "{}")]))
        .await
        .map_err(|e| err("ceiling spec", e))?;
    let spec_rev = put.revision;
    let lease = if shape.leased {
        store
            .lease_grant(SESSION_TTL.as_secs() as i64)
            .await
            .map_err(|e| err("ceiling lease", e))?
            .id
    } else {
        0
    };
    let holder = "node0";
    let fences = Fences { spec_rev: Some(spec_rev), seen: Some(spec_rev) };
    // Hoisted: the same two compares, once per request, and read back when they fail.
    let frame = if shape.hoist {
        let holder_key = layout.holder_key(POOL, holder);
        Frame {
            guard: vec![
                Compare::new(
                    KeyRange::key(spec_key.clone()),
                    CompareOp::Equal,
                    CompareTarget::CreateRevision(spec_rev),
                ),
                Compare::new(
                    KeyRange::key(holder_key.clone()),
                    CompareOp::Less,
                    CompareTarget::ModRevision(spec_rev + 1),
                ),
            ],
            ops: Vec::new(),
            otherwise: vec![TxnOp::get_key(spec_key), TxnOp::get_key(holder_key)],
        }
    } else {
        Frame::default()
    };
    let key_fences = if shape.hoist { Fences::default() } else { fences };
    let watcher = if shape.watch {
        let mut w = store
            .watch(KeyRange::prefix(layout.id_prefix(POOL)), spec_rev + 1)
            .await
            .map_err(|e| err("ceiling watch", e))?;
        Some(tokio::spawn(async move { while let Some(Ok(_)) = w.next().await {} }))
    } else {
        None
    };
    let per = shape.keys_per_txn.max(1);
    let groups = shape.groups.max(1);
    let keys: Vec<String> = (0..n).map(|i| key("bceil", 0, 0, i)).collect();
    let cpu0 = CpuSample::now(false, etcd.pid());
    let t0 = Instant::now();
    let results: Vec<Result<usize, String>> =
        stream::iter(keys.chunks(per * groups).enumerate().map(|(b, chunk)| {
            let (store, layout, frame) = (store.clone(), layout.clone(), frame.clone());
            async move {
                let one = |j: usize, k: &String| {
                    let id = RANGE.0 + (b * per * groups + j) as u64;
                    let plan = BindPlan { expect_key: None, id, expect_id: None, moved_from: None };
                    let target = RefTarget { holder, lease };
                    plan.txn_fenced(&layout, POOL, k, Some(target), key_fences)
                };
                let req = if groups == 1 {
                    assemble(&frame, chunk.iter().enumerate().map(|(j, k)| one(j, k)))
                } else {
                    let nested = chunk.chunks(per).enumerate().map(|(g, part)| {
                        TxnRequest::new().and_then(
                            part.iter().enumerate().map(|(j, k)| TxnOp::Txn(one(g * per + j, k))),
                        )
                    });
                    assemble(&frame, nested)
                };
                let resp = store.txn(req).await.map_err(|e| err("batched ceiling txn", e))?;
                if !resp.succeeded {
                    return Err("batched ceiling: a batch guard failed".to_string());
                }
                Ok(won(&resp.responses, groups > 1))
            }
        }))
        .buffer_unordered(shape.inflight.max(1))
        .collect()
        .await;
    let secs = t0.elapsed().as_secs_f64();
    let cpu = cpu0.split_to(CpuSample::now(false, etcd.pid()), n, secs);
    if let Some(w) = watcher {
        w.abort();
    }
    let mut bound = 0;
    for r in results {
        bound += r?;
    }
    if bound != n {
        return Err(format!("batched ceiling: {bound} of {n} keys bound"));
    }
    Ok((n as f64 / secs, cpu))
}

/// Nested per-key txns that succeeded (one level down, or two with `grouped`).
fn won(responses: &[OpResponse], grouped: bool) -> usize {
    responses
        .iter()
        .map(|r| match r {
            OpResponse::Txn(t) if grouped => won(&t.responses, false),
            OpResponse::Txn(t) => usize::from(t.succeeded),
            _ => 0,
        })
        .sum()
}

/// Restart restoration (docs/design/batching.md) of `n` held keys on a fresh etcd: process A acquires
/// them (leased), checkpoints `held()`, closes (its references go with its lease); process B opens
/// the pool (timed separately: the initial sync) and re-acquires every key with its old ID as the
/// hint in one `acquire_many_with_hints` call. Returns (restore seconds, sync seconds); every key
/// must get its old ID back.
pub async fn restore(n: usize) -> Result<(f64, f64), String> {
    let etcd = EtcdServer::start().await?;
    let opts = |holder: &str| {
        AllocatorOptions::builder()
            .prefix("idalloc")
            .holder(holder)
            .session_ttl(SESSION_TTL)
            .request_timeout(Duration::from_secs(30))
            .build()
            .expect("valid allocator options")
    };
    let spec = PoolSpec::new(POOL, RANGE.0, RANGE.1);
    let a = Allocator::new(counted(&etcd).await?, opts("node")).map_err(|e| err("restore A", e))?;
    let pa = a.ensure_pool(&spec).await.map_err(|e| err("restore pool", e))?;
    let keys: Vec<String> = (0..n).map(|i| key("restore", 0, 0, i)).collect();
    for r in pa.acquire_many(&keys).await {
        r.map_err(|e| err("restore: first acquire", e))?;
    }
    let checkpoint: HashMap<String, u64> =
        pa.held().into_iter().map(|(k, id, _)| (k, id)).collect();
    a.close().await.map_err(|e| err("restore: close A", e))?;

    let store: Arc<dyn Store> = counted(&etcd).await?;
    let b = Allocator::from_arc(store, opts("node")).map_err(|e| err("restore B", e))?;
    let t0 = Instant::now();
    let pb = b.pool(POOL).await.map_err(|e| err("restore: open pool", e))?;
    pb.wait_synced().await.map_err(|e| err("restore: sync", e))?;
    let sync = t0.elapsed().as_secs_f64();
    let hints: Vec<(&str, Option<u64>)> =
        keys.iter().map(|k| (k.as_str(), checkpoint.get(k).copied())).collect();
    let t1 = Instant::now();
    let got = pb.acquire_many_with_hints(&hints).await;
    let secs = t1.elapsed().as_secs_f64();
    for ((k, hint), r) in hints.iter().zip(got) {
        let a = r.map_err(|e| err("restore", e))?;
        if Some(a.id) != *hint {
            return Err(format!("restore: {k:?} got {} instead of its old ID {hint:?}", a.id));
        }
    }
    let _ = b.close().await;
    Ok((secs, sync))
}
