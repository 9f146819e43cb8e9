//! Remote views: initial sync of a remote pool from etcd, memory per remote binding,
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

/// What the remote-view benchmarks measured.
#[derive(Clone, Debug, Default)]
pub struct RemoteFigures {
    /// Bindings in the remote pool, seconds from `watch_remote` to `Synced`.
    pub sync: Option<(usize, f64)>,
    /// Heap bytes per binding the synced remote view retains, and the same for the local cache
    /// of the same pool (same bindings, same store), counted by the bench binary's allocator.
    pub remote_heap_per_binding: Option<f64>,
    pub local_heap_per_binding: Option<f64>,
    /// Bindings per cluster in the lookup benchmark.
    pub lookup_bindings: usize,
    /// ns per lookup: local `key_of`, `key_of_any` over 1 local + 8 remotes, local `get`,
    /// `ids_of` over 1 + 8.
    pub key_of_local_ns: f64,
    /// Local `key_of` on a pool as big as all nine clusters together (the same working set as
    /// `key_of_any`, so cache misses weigh the same).
    pub key_of_local_big_ns: f64,
    pub key_of_any_ns: f64,
    pub get_local_ns: f64,
    pub ids_of_ns: f64,
    pub errors: Vec<String>,
}

fn key(cluster: usize, i: usize) -> String {
    format!("k8s:app=web-{i:07};io.kubernetes.pod.namespace=c{cluster}")
}

/// Writes `n` bindings of pool `POOL` with `prefix` bits into `store` (records as the allocator
/// writes them, without references), on consecutive IDs.
async fn fill(store: &dyn Store, spec: &PoolSpec, cluster: usize, n: usize) -> Result<(), String> {
    fill_spaced(store, spec, cluster, n, 1).await
}

/// [`fill`] on every `stride`-th ID: with a stride of 2 no two bindings are adjacent, as in a
/// sparse pool allocated at random.
async fn fill_spaced(
    store: &dyn Store,
    spec: &PoolSpec,
    cluster: usize,
    n: usize,
    stride: u64,
) -> Result<(), String> {
    let layout = Layout::new("idalloc").map_err(|e| err("layout", e))?;
    store
        .txn(TxnRequest::new().and_then([TxnOp::put(layout.pool_spec_key(POOL), spec.to_json())]))
        .await
        .map_err(|e| err("spec", e))?;
    let mut ops = Vec::new();
    for i in 0..n {
        let id = spec.apply_prefix(spec.min() + i as u64 * stride);
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

/// Lets background tasks finish what a sync left them (channel sends, watch start).
async fn settle() {
    tokio::time::sleep(std::time::Duration::from_millis(300)).await;
}

/// Initial sync of a remote pool of `n` bindings on etcd, the heap bytes the view retains, and
/// the heap bytes the local cache of the same pool retains (an allocator on that etcd).
async fn sync(n: usize, out: &mut RemoteFigures) -> Result<(), String> {
    let etcd = EtcdServer::start().await?;
    let remote_store = etcd.store().await?;
    let spec = PoolSpec::new(POOL, RANGE.0, RANGE.1);
    fill_spaced(&remote_store, &spec, 2, n, 2).await?;
    let (_alloc, pool) = local_pool().await?;
    let store: Arc<dyn Store> = Arc::new(etcd.store().await?);
    settle().await;
    let (view, remote_bytes) = crate::heap::measure(async {
        let t0 = Instant::now();
        let view = pool.watch_remote("b", store, RemoteOptions::default()).await;
        if let Ok(v) = &view {
            v.wait_synced().await;
        }
        let secs = t0.elapsed().as_secs_f64();
        settle().await;
        view.map(|v| (v, secs))
    })
    .await;
    let (view, secs) = view.map_err(|e| err("watch_remote", e))?;
    if view.len() != n {
        return Err(format!("remote view has {} bindings, expected {n}", view.len()));
    }
    out.sync = Some((n, secs));
    out.remote_heap_per_binding = remote_bytes.map(|b| b as f64 / n.max(1) as f64);

    // The local cache of the same pool, measured the same way.
    let local_store = etcd.store().await?;
    let (local, local_bytes) = crate::heap::measure(async {
        let alloc = Allocator::new(local_store, AllocatorOptions::default())?;
        let pool = alloc.pool(POOL).await?;
        pool.wait_synced().await?;
        settle().await;
        Ok::<_, idalloc::Error>((alloc, pool))
    })
    .await;
    let (_local_alloc, local_pool) = local.map_err(|e| err("local pool", e))?;
    let local_len = local_pool.snapshot().len();
    if local_len != n {
        return Err(format!("local cache has {local_len} bindings, expected {n}"));
    }
    out.local_heap_per_binding = local_bytes.map(|b| b as f64 / n.max(1) as f64);
    Ok(())
}

/// One local pool and eight remote views (memory stores) of `n` bindings each, synced: what the
/// lookup benchmarks (and `examples/lookup_profile.rs`) read.
pub struct LookupFixture {
    pub alloc: Allocator,
    pub pool: Pool,
    /// Every bound ID, local ones first (`n` per cluster).
    pub ids: Vec<u64>,
    /// Every bound key, in the order of `ids`.
    pub keys: Vec<String>,
}

/// Builds a [`LookupFixture`].
pub async fn lookup_fixture(n: usize) -> Result<LookupFixture, String> {
    let (alloc, pool) = local_pool().await?;
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
    Ok(LookupFixture { alloc, pool, ids, keys })
}

/// Lookups across one local pool and eight remote views of `n` bindings each.
async fn lookups(n: usize, iters: u64, out: &mut RemoteFigures) -> Result<(), String> {
    let LookupFixture { alloc: _alloc, pool, ids, keys } = lookup_fixture(n).await?;
    // A local pool of 9 x n bindings (written to its store, then listed by the allocator).
    let big_store = EmbeddedStore::memory();
    let big_spec = PoolSpec::new(POOL, 1, (1 << 24) - 1).prefix(1 << 32);
    fill(&big_store, &big_spec, 1, 9 * n).await?;
    let big_alloc =
        Allocator::new(big_store, AllocatorOptions::default()).map_err(|e| err("allocator", e))?;
    let big = big_alloc.pool(POOL).await.map_err(|e| err("big pool", e))?;
    big.wait_synced().await.map_err(|e| err("big pool sync", e))?;
    let big_ids: Vec<u64> =
        (0..iters).map(|i| big_spec.apply_prefix(1 + scatter_of(i, 9 * n) as u64)).collect();
    out.lookup_bindings = n;
    let scatter = scatter_of;
    let local_ids: Vec<u64> = (0..iters).map(|i| ids[scatter(i, n)]).collect();
    let all_ids: Vec<u64> = (0..iters).map(|i| ids[scatter(i, ids.len())]).collect();
    let local_keys: Vec<String> =
        (0..iters.min(1 << 20)).map(|i| keys[scatter(i, n)].clone()).collect();
    let lk = local_keys.len();
    let all_keys: Vec<String> =
        (0..iters.min(1 << 20)).map(|i| keys[scatter(i, keys.len())].clone()).collect();
    let ak = all_keys.len();
    let p = pool.clone();
    let (a, big_ns, b, c, d) = tokio::task::spawn_blocking(move || {
        let a = ns_per(iters, |i| {
            black_box(p.key_of(black_box(local_ids[i as usize])));
        });
        let big_ns = ns_per(iters, |i| {
            black_box(big.key_of(black_box(big_ids[i as usize])));
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
        (a, big_ns, b, c, d)
    })
    .await
    .map_err(|e| format!("lookup thread: {e}"))?;
    out.key_of_local_ns = a;
    out.key_of_local_big_ns = big_ns;
    out.key_of_any_ns = b;
    out.get_local_ns = c;
    out.ids_of_ns = d;
    Ok(())
}

/// A cheap index sequence over `m` that visits memory at random (a multiplicative hash).
fn scatter_of(i: u64, m: usize) -> usize {
    (i.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 17) as usize % m
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
        let _ = writeln!(s, "\n## Remote views (multi-cluster)\n");
        match self.sync {
            Some((n, secs)) => {
                let _ = writeln!(s, "- Initial sync of a remote pool of {n} bindings from etcd (`Pool::watch_remote` until `Synced`: spec read, paginated list of `id/` at one revision, validation, view build, watch start): **{secs:.2} s** (target ≤ 3 s).");
            }
            None => {
                let _ = writeln!(s, "- Initial sync: not measured.");
            }
        }
        match (self.remote_heap_per_binding, self.local_heap_per_binding) {
            (Some(r), Some(l)) => {
                let _ = writeln!(s, "- Heap bytes retained per binding (keys of 50 bytes, on every other ID; counted by the bench binary's global allocator from before `watch_remote` / `Allocator::pool` until after `Synced`, so listing buffers freed after the sync do not count): remote view **{r:.0} B**, local cache of the same pool on the same etcd **{l:.0} B**; remote / local = **{:.2}** (target ≤ 1).", r / l.max(1e-9));
            }
            _ => {
                let _ = writeln!(s, "- Heap bytes per binding: not measured (the counting allocator is installed only by the bench binary).");
            }
        }
        if self.lookup_bindings > 0 {
            let n = self.lookup_bindings;
            let _ = writeln!(s, "- Lookups with 1 local pool + 8 remote views of {n} bindings each (on-CPU ns per call, random IDs/keys over all clusters):\n\n| lookup | ns |\n|---|---:|\n| local `Pool::key_of(id)` | {:.0} |\n| local `Pool::key_of(id)` on a pool of {} bindings (the working set of all 9 clusters) | {:.0} |\n| `Pool::key_of_any(id)` across 9 clusters (the ID's prefix bits pick the one view to ask) | {:.0} |\n| local `Pool::get(key)` | {:.0} |\n| `Pool::ids_of(key)` across 9 clusters (asks every view) | {:.0} |\n",
                self.key_of_local_ns, 9 * n, self.key_of_local_big_ns, self.key_of_any_ns, self.get_local_ns, self.ids_of_ns);
            let _ = writeln!(s, "  `key_of_any` is **{:.2}×** a local `key_of` on a pool as big as the 9 clusters together (target ≤ 2×), and {:.2}× a local `key_of` on one cluster's {n} bindings (that pool's working set is 9 times smaller, so more of it stays in the CPU caches); `ids_of` is {:.2}× a local `get` (it must look in all 9 views).",
                self.key_of_any_ns / self.key_of_local_big_ns.max(1e-9), self.key_of_any_ns / self.key_of_local_ns.max(1e-9), self.ids_of_ns / self.get_local_ns.max(1e-9));
        }
        for e in &self.errors {
            let _ = writeln!(s, "- failed: {e}");
        }
        s
    }
}
