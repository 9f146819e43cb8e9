//! Issue 14's figures: the batched etcd ceiling (what many-keys-per-txn can reach on this etcd)
//! and restart restoration of held keys. The coalesced figure is the idalloc contender of the new
//! keys scenario at concurrency 64 (concurrent single-key acquires of one process are coalesced);
//! `acquire --from` / `release --from` are the CLI scenarios.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::stream::{self, StreamExt};
use idalloc::bench_api::{assemble, BindPlan, Fences, Frame, RefTarget};
use idalloc::layout::Layout;
use idalloc::store::{Store, TxnOp};
use idalloc::{Allocator, AllocatorOptions, PoolSpec};
use idalloc_testkit::etcd::EtcdServer;

use crate::contender::{err, POOL, RANGE, SESSION_TTL};
use crate::scenarios::{counted, key};
use crate::stats::{CpuSample, CpuSplit};

/// Keys per batch, as the CLI's `--from` sends them.
pub const KEYS_PER_BATCH: usize = 100;

/// The batched etcd ceiling: `n` new keys on a fresh etcd, in txns of [`KEYS_PER_BATCH`] nested
/// per-key txns built by idalloc's own plan (`If key/k absent ∧ id/C absent ∧ spec unchanged ∧
/// holder fence unchanged Then put id/C, key/k, ref/k/h Else get …`), `inflight` txns at a time,
/// with a perfect free-ID oracle (ID = i) and no cache, session or per-key bookkeeping. Keys per
/// second, and where the CPU went (this process is the client); every nested txn must have
/// succeeded.
pub async fn batched_ceiling(n: usize, inflight: usize) -> Result<(f64, CpuSplit), String> {
    let etcd = EtcdServer::start().await?;
    let store = counted(&etcd).await?;
    let layout = Layout::new("ceiling").map_err(|e| err("ceiling layout", e))?;
    // A spec record to compare, as every idalloc write does.
    let spec_key = layout.pool_spec_key(POOL);
    let put = store
        .txn(idalloc::store::TxnRequest::new().and_then([TxnOp::put(spec_key, "{}")]))
        .await
        .map_err(|e| err("ceiling spec", e))?;
    let spec_rev = put.revision;
    let lease = store
        .lease_grant(SESSION_TTL.as_secs() as i64)
        .await
        .map_err(|e| err("ceiling lease", e))?
        .id;
    let fences = Fences { spec_rev: Some(spec_rev), seen: Some(spec_rev) };
    let keys: Vec<String> = (0..n).map(|i| key("bceil", 0, 0, i)).collect();
    let cpu0 = CpuSample::now(false, etcd.pid());
    let t0 = Instant::now();
    let results: Vec<Result<usize, String>> =
        stream::iter(keys.chunks(KEYS_PER_BATCH).enumerate().map(|(b, chunk)| {
            let (store, layout) = (store.clone(), layout.clone());
            async move {
                let txns = chunk.iter().enumerate().map(|(j, k)| {
                    let id = RANGE.0 + (b * KEYS_PER_BATCH + j) as u64;
                    let plan = BindPlan { expect_key: None, id, expect_id: None, moved_from: None };
                    let target = RefTarget { holder: "node0", lease };
                    plan.txn_fenced(&layout, POOL, k, Some(target), fences)
                });
                let req = assemble(&Frame::default(), txns);
                let resp = store.txn(req).await.map_err(|e| err("batched ceiling txn", e))?;
                let won = resp
                    .responses
                    .iter()
                    .filter(|r| matches!(r, idalloc::store::OpResponse::Txn(t) if t.succeeded))
                    .count();
                Ok(won)
            }
        }))
        .buffer_unordered(inflight.max(1))
        .collect()
        .await;
    let secs = t0.elapsed().as_secs_f64();
    let cpu = cpu0.split_to(CpuSample::now(false, etcd.pid()), n, secs);
    let mut won = 0;
    for r in results {
        won += r?;
    }
    if won != n {
        return Err(format!("batched ceiling: {won} of {n} keys bound"));
    }
    Ok((n as f64 / secs, cpu))
}

/// Restart restoration (docs/batching.md) of `n` held keys on a fresh etcd: process A acquires
/// them (leased), checkpoints `held()`, closes (its references go with its lease); process B opens
/// the pool (timed separately: the initial sync) and re-acquires every key with its old ID as the
/// hint in one `acquire_many_with_hints` call. Returns (restore seconds, sync seconds); every key
/// must get its old ID back.
pub async fn restore(n: usize) -> Result<(f64, f64), String> {
    let etcd = EtcdServer::start().await?;
    let opts = |holder: &str| AllocatorOptions {
        prefix: "idalloc".into(),
        holder: Some(holder.to_string()),
        session_ttl: SESSION_TTL,
        request_timeout: Duration::from_secs(30),
        ..AllocatorOptions::default()
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
