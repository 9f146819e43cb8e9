//! Remote views (issue 13): initial sync of a remote pool from etcd, memory per remote binding,
//! and zero-round-trip lookups across one local pool and eight remote views.
//!
//! Run alone with `cargo run --release -p idalloc-bench -- --remote-only [--out FILE.md]`; the
//! full run includes it.

use std::fmt::Write as _;
use std::hint::black_box;
use std::sync::Arc;
use std::time::Instant;

use idalloc::layout::{encode_id, IdRecord, Layout};
use idalloc::store::embedded::EmbeddedStore;
use idalloc::store::{Store, TxnOp, TxnRequest};
use idalloc::{Allocator, AllocatorOptions, Pool, PoolSpec, RemoteOptions};
use idalloc_testkit::etcd::EtcdServer;

use crate::contender::{err, POOL, RANGE};
use crate::micro::ns_per;
use crate::stats::resident_bytes;

/// What the remote-view benchmarks measured.
#[derive(Clone, Debug, Default)]
pub struct RemoteFigures {
    /// Bindings in the remote pool, seconds from `watch_remote` to `Synced`.
    pub sync: Option<(usize, f64)>,
    /// Resident bytes per binding added by the synced view (includes what the allocator kept of
    /// the listing's buffers).
    pub bytes_per_binding: Option<f64>,
    /// Bindings per cluster in the lookup benchmark.
    pub lookup_bindings: usize,
    /// ns per lookup: local `key_of`, `key_of_any` over 1 local + 8 remotes, local `get`,
    /// `ids_of` over 1 + 8.
    pub key_of_local_ns: f64,
    pub key_of_any_ns: f64,
    pub get_local_ns: f64,
    pub ids_of_ns: f64,
    pub errors: Vec<String>,
}

fn key(cluster: usize, i: usize) -> String {
    format!("k8s:app=web-{i:07};io.kubernetes.pod.namespace=c{cluster}")
}

/// Writes `n` bindings of pool `POOL` with `prefix` bits into `store` (records as the allocator
/// writes them, without references).
async fn fill(store: &dyn Store, spec: &PoolSpec, cluster: usize, n: usize) -> Result<(), String> {
    let layout = Layout::new("idalloc").map_err(|e| err("layout", e))?;
    store
        .txn(TxnRequest::new().and_then([TxnOp::put(layout.pool_spec_key(POOL), spec.to_json())]))
        .await
        .map_err(|e| err("spec", e))?;
    let mut ops = Vec::new();
    for i in 0..n {
        let id = spec.apply_prefix(spec.min() + i as u64);
        let k = key(cluster, i);
        ops.push(TxnOp::put(layout.id_key(POOL, id), IdRecord::Bound(k.clone()).encode()));
        ops.push(TxnOp::put(layout.key_key(POOL, &k), encode_id(id)));
        if ops.len() >= 120 || i + 1 == n {
            store
                .txn(TxnRequest::new().and_then(std::mem::take(&mut ops)))
                .await
                .map_err(|e| err("fill", e))?;
        }
    }
    Ok(())
}

/// A local pool (memory store) with cluster ID 1 and no bindings.
async fn local_pool() -> Result<(Allocator, Pool), String> {
    let alloc = Allocator::new(EmbeddedStore::memory(), AllocatorOptions::default())
        .map_err(|e| err("allocator", e))?;
    let pool = alloc
        .ensure_pool(&PoolSpec::new(POOL, 1, (1 << 24) - 1).prefix(1 << 32))
        .await
        .map_err(|e| err("local pool", e))?;
    pool.wait_synced().await.map_err(|e| err("local sync", e))?;
    Ok((alloc, pool))
}

/// Initial sync of a remote pool of `n` bindings on etcd, and the memory the view adds.
async fn sync(n: usize, out: &mut RemoteFigures) -> Result<(), String> {
    let etcd = EtcdServer::start().await?;
    let remote_store = etcd.store().await?;
    let spec = PoolSpec::new(POOL, RANGE.0, RANGE.1);
    fill(&remote_store, &spec, 2, n).await?;
    let (_alloc, pool) = local_pool().await?;
    let store: Arc<dyn Store> = Arc::new(etcd.store().await?);
    let before = resident_bytes();
    let t0 = Instant::now();
    let view = pool
        .watch_remote("b", store, RemoteOptions::default())
        .await
        .map_err(|e| err("watch_remote", e))?;
    view.wait_synced().await;
    let secs = t0.elapsed().as_secs_f64();
    let after = resident_bytes();
    if view.len() != n {
        return Err(format!("remote view has {} bindings, expected {n}", view.len()));
    }
    out.sync = Some((n, secs));
    out.bytes_per_binding = match (before, after) {
        (Some(b), Some(a)) => Some(a.saturating_sub(b) as f64 / n.max(1) as f64),
        _ => None,
    };
    Ok(())
}

/// Lookups across one local pool and eight remote views of `n` bindings each.
async fn lookups(n: usize, iters: u64, out: &mut RemoteFigures) -> Result<(), String> {
    let (_alloc, pool) = local_pool().await?;
    // Local bindings through the allocator's own path: written to its store and watched.
    let mut ids: Vec<u64> = Vec::new();
    let mut keys: Vec<String> = Vec::new();
    for i in 0..n {
        let k = key(1, i);
        let id = pool.acquire_durable(&k, "bench").await.map_err(|e| err("acquire", e))?.id;
        ids.push(id);
        keys.push(k);
    }
    for c in 2..10usize {
        let store = Arc::new(EmbeddedStore::memory());
        let spec = PoolSpec::new(POOL, 1, (1 << 24) - 1).prefix((c as u64) << 32);
        fill(&*store, &spec, c, n).await?;
        let view = pool
            .watch_remote(&format!("c{c}"), store, RemoteOptions::default())
            .await
            .map_err(|e| err("watch_remote", e))?;
        view.wait_synced().await;
        ids.extend((0..n).map(|i| spec.apply_prefix(1 + i as u64)));
        keys.extend((0..n).map(|i| key(c, i)));
    }
    // Wait until the local cache shows its own bindings.
    for _ in 0..1000 {
        if pool.snapshot().len() == n {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
    out.lookup_bindings = n;
    let scatter = |i: u64, m: usize| (i.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 17) as usize % m;
    let local_ids: Vec<u64> = (0..iters).map(|i| ids[scatter(i, n)]).collect();
    let all_ids: Vec<u64> = (0..iters).map(|i| ids[scatter(i, ids.len())]).collect();
    let local_keys: Vec<String> =
        (0..iters.min(1 << 20)).map(|i| keys[scatter(i, n)].clone()).collect();
    let lk = local_keys.len();
    let all_keys: Vec<String> =
        (0..iters.min(1 << 20)).map(|i| keys[scatter(i, keys.len())].clone()).collect();
    let ak = all_keys.len();
    let p = pool.clone();
    let (a, b, c, d) = tokio::task::spawn_blocking(move || {
        let a = ns_per(iters, |i| {
            black_box(p.key_of(black_box(local_ids[i as usize])));
        });
        let b = ns_per(iters, |i| {
            black_box(p.key_of_any(black_box(all_ids[i as usize])));
        });
        let c = ns_per(iters, |i| {
            black_box(p.get(black_box(&local_keys[i as usize % lk])));
        });
        let d = ns_per(iters, |i| {
            black_box(p.ids_of(black_box(&all_keys[i as usize % ak])));
        });
        (a, b, c, d)
    })
    .await
    .map_err(|e| format!("lookup thread: {e}"))?;
    out.key_of_local_ns = a;
    out.key_of_any_ns = b;
    out.get_local_ns = c;
    out.ids_of_ns = d;
    Ok(())
}

/// Runs the remote-view benchmarks: sync of `sync_n` bindings, lookups over 9 x `lookup_n`.
pub async fn run(sync_n: usize, lookup_n: usize, iters: u64) -> RemoteFigures {
    let mut out = RemoteFigures::default();
    if let Err(e) = sync(sync_n, &mut out).await {
        out.errors.push(format!("sync: {e}"));
    }
    if let Err(e) = lookups(lookup_n, iters, &mut out).await {
        out.errors.push(format!("lookups: {e}"));
    }
    out
}

impl RemoteFigures {
    /// The report's section.
    pub fn markdown(&self) -> String {
        let mut s = String::new();
        let _ = writeln!(s, "\n## Remote views (multi-cluster, issue 13)\n");
        match self.sync {
            Some((n, secs)) => {
                let _ = writeln!(s, "- Initial sync of a remote pool of {n} bindings from etcd (`Pool::watch_remote` until `Synced`: spec read, paginated list of `id/` at one revision, validation, view build, watch start): **{secs:.2} s** (target ≤ 3 s).");
            }
            None => {
                let _ = writeln!(s, "- Initial sync: not measured.");
            }
        }
        if let Some(b) = self.bytes_per_binding {
            let _ = writeln!(s, "- Resident memory added by that synced view: **{b:.0} bytes per remote binding** (keys of ~60 bytes; the process's RSS delta, so it includes what the allocator kept of the listing's buffers; the view is the same `PoolCache` as the local cache, whose figure is in the micro-benchmarks).");
        }
        if self.lookup_bindings > 0 {
            let n = self.lookup_bindings;
            let _ = writeln!(s, "- Lookups with 1 local pool + 8 remote views of {n} bindings each (on-CPU ns per call, random IDs/keys over all clusters):\n\n| lookup | ns |\n|---|---:|\n| local `Pool::key_of(id)` | {:.0} |\n| `Pool::key_of_any(id)` across 9 clusters (the ID's prefix bits pick the one view to ask) | {:.0} |\n| local `Pool::get(key)` | {:.0} |\n| `Pool::ids_of(key)` across 9 clusters (asks every view) | {:.0} |\n",
                self.key_of_local_ns, self.key_of_any_ns, self.get_local_ns, self.ids_of_ns);
            let _ = writeln!(s, "  `key_of_any` is {:.2}× a local `key_of` (target ≤ 2×); `ids_of` is {:.2}× a local `get` (it must look in all 9 views).",
                self.key_of_any_ns / self.key_of_local_ns.max(1e-9), self.ids_of_ns / self.get_local_ns.max(1e-9));
        }
        for e in &self.errors {
            let _ = writeln!(s, "- failed: {e}");
        }
        s
    }
}
