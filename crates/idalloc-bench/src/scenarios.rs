//! The store-backed scenarios: every contender on a fresh single-member etcd, same keys, same
//! concurrency, requests counted.

use std::collections::{BTreeMap, HashMap};
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use idalloc::layout::{encode_id, IdRecord, Layout};
use idalloc::store::embedded::{EmbeddedOptions, EmbeddedStore};
use idalloc::store::{Store, TxnOp, TxnRequest};
use idalloc::{Allocator, AllocatorOptions, PoolSpec};
use idalloc_testkit::counting::CountingStore;
use idalloc_testkit::etcd::EtcdServer;
use rand::seq::SliceRandom;
use rand::SeedableRng;

use crate::contender::{err, start_node, Counted, IdallocNode, Kind, Node, Shared, POOL, RANGE};
use crate::contiv;
use crate::stats::{per_op_requests, CpuSample, CpuSplit, Run};

/// A realistic key: a label set, about 50 bytes, the same for every contender.
pub fn key(tag: &str, node: usize, task: usize, i: usize) -> String {
    format!("k8s:app={tag}-{node}-{task}-{i};io.kubernetes.pod.namespace=default")
}

/// A counted store on its own client connection to `etcd`.
pub async fn counted(etcd: &EtcdServer) -> Result<Counted, String> {
    let s: Arc<dyn Store> = Arc::new(etcd.store().await?);
    Ok(Arc::new(CountingStore::new(s)))
}

fn reset(nodes: &[Arc<dyn Node>]) -> Vec<u64> {
    nodes
        .iter()
        .map(|n| {
            n.store().reset();
            n.retries()
        })
        .collect()
}

fn collect(nodes: &[Arc<dyn Node>], retries_before: &[u64], run: &mut Run) {
    for (n, before) in nodes.iter().zip(retries_before) {
        run.requests += per_op_requests(&n.counts());
        run.retries += n.retries().saturating_sub(*before);
    }
}

/// `tasks` concurrent loops on `node`, each acquiring fresh keys until `dur` has passed.
pub async fn run_fresh(node: Arc<dyn Node>, tasks: usize, dur: Duration, tag: &str) -> Run {
    let before = reset(std::slice::from_ref(&node));
    let start = Instant::now();
    let deadline = start + dur;
    let mut handles = Vec::new();
    for t in 0..tasks {
        let node = node.clone();
        let tag = tag.to_string();
        handles.push(tokio::spawn(async move {
            let (mut lat, mut failures, mut i) = (Vec::new(), 0u64, 0usize);
            while Instant::now() < deadline {
                let k = key(&tag, 0, t, i);
                let t0 = Instant::now();
                match node.acquire(&k).await {
                    Ok(_) => lat.push(t0.elapsed()),
                    Err(_) => failures += 1,
                }
                i += 1;
            }
            (lat, failures)
        }));
    }
    let mut run = Run::default();
    for h in handles {
        if let Ok((lat, f)) = h.await {
            run.ops += lat.len() as u64;
            run.lat.extend(lat);
            run.failures += f;
        }
    }
    run.secs = start.elapsed().as_secs_f64();
    collect(std::slice::from_ref(&node), &before, &mut run);
    run.finish()
}

/// Every `(node, key lists)` pair runs one task per list, all at once; `release` picks the
/// operation. Returns the run and, per node, what each key got.
/// A node and the key lists its tasks work through (one task per list).
pub type Work = Vec<(Arc<dyn Node>, Vec<Vec<String>>)>;

pub async fn run_lists(work: Work, release: bool) -> (Run, Vec<HashMap<String, u64>>) {
    let nodes: Vec<Arc<dyn Node>> = work.iter().map(|(n, _)| n.clone()).collect();
    let before = reset(&nodes);
    let start = Instant::now();
    let mut per_node = Vec::new();
    for (node, lists) in work {
        let mut handles = Vec::new();
        for list in lists {
            let node = node.clone();
            handles.push(tokio::spawn(async move {
                let (mut lat, mut failures, mut got) = (Vec::new(), 0u64, HashMap::new());
                for k in list {
                    let t0 = Instant::now();
                    let r = if release {
                        node.release(&k).await.map(|_| 0)
                    } else {
                        node.acquire(&k).await
                    };
                    match r {
                        Ok(id) => {
                            lat.push(t0.elapsed());
                            got.insert(k, id);
                        }
                        Err(_) => failures += 1,
                    }
                }
                (lat, failures, got)
            }));
        }
        per_node.push(handles);
    }
    let mut run = Run::default();
    let mut results = Vec::new();
    for handles in per_node {
        let mut got_all = HashMap::new();
        for h in handles {
            if let Ok((lat, f, got)) = h.await {
                run.ops += lat.len() as u64;
                run.lat.extend(lat);
                run.failures += f;
                got_all.extend(got);
            }
        }
        results.push(got_all);
    }
    run.secs = start.elapsed().as_secs_f64();
    collect(&nodes, &before, &mut run);
    (run.finish(), results)
}

/// Splits `keys` into `n` interleaved lists.
pub fn split(keys: &[String], n: usize) -> Vec<Vec<String>> {
    let mut out = vec![Vec::new(); n.max(1)];
    for (i, k) in keys.iter().enumerate() {
        out[i % n.max(1)].push(k.clone());
    }
    out
}

async fn close_all(nodes: &[Arc<dyn Node>]) {
    for n in nodes {
        n.close().await;
    }
}

/// New keys at concurrency `c`: one node, `c` tasks, fresh etcd.
pub async fn new_keys(kind: Kind, c: usize, dur: Duration) -> Result<Run, String> {
    new_keys_cpu(kind, c, dur).await.map(|(run, _)| run)
}

/// [`new_keys`] and where the CPU of the measured run went (this process and the etcd server):
/// on a shared 2-core machine CPU per op moves much less with the load than wall-clock figures.
pub async fn new_keys_cpu(kind: Kind, c: usize, dur: Duration) -> Result<(Run, CpuSplit), String> {
    let etcd = EtcdServer::start().await?;
    let node = start_node(kind, counted(&etcd).await?, 0, Arc::new(Shared::default())).await?;
    // Warm-up outside the measurement, the same for every contender: a fresh etcd is still
    // preallocating its WAL and settling, and connections are new. A fifth of the run, at the
    // run's concurrency.
    run_fresh(node.clone(), c, dur / 5, "warm").await;
    let cpu0 = CpuSample::now(false, etcd.pid());
    let run = run_fresh(node.clone(), c, dur, "new").await;
    let cpu = cpu0.split_to(CpuSample::now(false, etcd.pid()), run.ops as usize, run.secs);
    node.close().await;
    Ok((run, cpu))
}

/// Node A binds `n` keys; node B acquires them (measured, `c` tasks) once its view knows them.
pub async fn bound_elsewhere(kind: Kind, n: usize, c: usize) -> Result<Run, String> {
    let etcd = EtcdServer::start().await?;
    let shared = Arc::new(Shared::default());
    let a = start_node(kind, counted(&etcd).await?, 0, shared.clone()).await?;
    let b = start_node(kind, counted(&etcd).await?, 1, shared).await?;
    let keys: Vec<String> = (0..n).map(|i| key("bound", 0, 0, i)).collect();
    let (setup, _) = run_lists(vec![(a.clone(), split(&keys, 8))], false).await;
    if setup.failures > 0 {
        return Err(format!("{}: {} setup acquires failed", kind.name(), setup.failures));
    }
    wait_known(&*b, &keys).await?;
    let (run, _) = run_lists(vec![(b.clone(), split(&keys, c))], false).await;
    close_all(&[a, b]).await;
    Ok(run)
}

async fn wait_known(node: &dyn Node, keys: &[String]) -> Result<(), String> {
    let deadline = Instant::now() + Duration::from_secs(30);
    while !node.knows(keys).await {
        if Instant::now() > deadline {
            return Err("node B's view did not learn node A's bindings within 30 s".into());
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    Ok(())
}

/// One node acquires `n` keys, then releases them all (measured, `c` tasks): the last holder.
pub async fn release(kind: Kind, n: usize, c: usize) -> Result<Run, String> {
    let etcd = EtcdServer::start().await?;
    let node = start_node(kind, counted(&etcd).await?, 0, Arc::new(Shared::default())).await?;
    let keys: Vec<String> = (0..n).map(|i| key("rel", 0, 0, i)).collect();
    let (setup, _) = run_lists(vec![(node.clone(), split(&keys, 8))], false).await;
    if setup.failures > 0 {
        return Err(format!("{}: {} setup acquires failed", kind.name(), setup.failures));
    }
    let (run, _) = run_lists(vec![(node.clone(), split(&keys, c))], true).await;
    node.close().await;
    Ok(run)
}

/// Writes `n` idalloc bindings straight into the store (ID, key and a durable reference record
/// each, 40 bindings per txn), with IDs spread over the range so the free set holds `n` runs.
pub async fn prefill_idalloc(store: &dyn Store, prefix: &str, n: usize) -> Result<(), String> {
    let layout = Layout::new(prefix).map_err(|e| err("layout", e))?;
    let stride = ((RANGE.1 - RANGE.0) / (n as u64 + 1)).max(1);
    let mut ops = Vec::new();
    for i in 0..n {
        let id = RANGE.0 + i as u64 * stride;
        let k = key("prefill", 0, 0, i);
        ops.push(TxnOp::put(layout.id_key(POOL, id), IdRecord::Bound(k.clone()).encode()));
        ops.push(TxnOp::put(layout.key_key(POOL, &k), encode_id(id)));
        ops.push(TxnOp::put(layout.ref_key(POOL, &k, "prefill"), encode_id(id)));
        if ops.len() >= 120 || i + 1 == n {
            store
                .txn(TxnRequest::new().and_then(std::mem::take(&mut ops)))
                .await
                .map_err(|e| err("prefill txn", e))?;
        }
    }
    Ok(())
}

/// Allocation throughput (one task) with `n` bindings already in the pool: idalloc and Contiv.
pub async fn with_existing(kind: Kind, n: usize, dur: Duration) -> Result<Run, String> {
    let etcd = EtcdServer::start().await?;
    let store = counted(&etcd).await?;
    match kind {
        Kind::Idalloc => prefill_idalloc(&*store, "idalloc", n).await?,
        Kind::Contiv => {
            let allocs: BTreeMap<String, u64> =
                (0..n).map(|i| (key("prefill", 0, 0, i), RANGE.0 + i as u64)).collect();
            store
                .txn(
                    TxnRequest::new()
                        .and_then([TxnOp::put(contiv::POOL_KEY, contiv::pool_value(&allocs))]),
                )
                .await
                .map_err(|e| err("contiv prefill", e))?;
        }
        other => return Err(format!("{}: not part of this scenario", other.name())),
    }
    let node = start_node(kind, store, 0, Arc::new(Shared::default())).await?;
    let run = run_fresh(node.clone(), 1, dur, "deg").await;
    node.close().await;
    Ok(run)
}

/// `nodes` nodes acquire the same `k` keys at once, each in its own order. Returns the run and
/// whether every node got the same ID for every key and no two keys share an ID (G1).
pub async fn overlap(kind: Kind, nodes: usize, k: usize) -> Result<(Run, bool), String> {
    let etcd = EtcdServer::start().await?;
    let shared = Arc::new(Shared::default());
    let keys: Vec<String> = (0..k).map(|i| key("overlap", 0, 0, i)).collect();
    let mut work = Vec::new();
    for n in 0..nodes {
        let node = start_node(kind, counted(&etcd).await?, n, shared.clone()).await?;
        let mut mine = keys.clone();
        mine.shuffle(&mut rand::rngs::StdRng::seed_from_u64(n as u64));
        work.push((node, vec![mine]));
    }
    let all: Vec<Arc<dyn Node>> = work.iter().map(|(n, _)| n.clone()).collect();
    let (run, results) = run_lists(work, false).await;
    close_all(&all).await;
    let mut agreed: HashMap<&String, u64> = HashMap::new();
    let mut consistent = true;
    for got in &results {
        for (k, id) in got {
            consistent &= *agreed.entry(k).or_insert(*id) == *id;
        }
    }
    let mut ids: Vec<u64> = agreed.values().copied().collect();
    ids.sort_unstable();
    ids.dedup();
    consistent &= ids.len() == agreed.len();
    Ok((run, consistent))
}

/// Initial sync: `n` bindings in etcd, then a new process opens the pool and waits for the first
/// listing (paginated list + cache build + watch start). Returns (seconds, requests).
pub async fn initial_sync(n: usize) -> Result<(f64, u64), String> {
    let etcd = EtcdServer::start().await?;
    let setup = Allocator::new(etcd.store().await?, AllocatorOptions::default())
        .map_err(|e| err("sync setup", e))?;
    setup
        .init_pool(&PoolSpec::new(POOL, RANGE.0, RANGE.1))
        .await
        .map_err(|e| err("sync init_pool", e))?;
    prefill_idalloc(&etcd.store().await?, "idalloc", n).await?;
    let store = counted(&etcd).await?;
    let alloc =
        Allocator::new(store.clone(), AllocatorOptions::default()).map_err(|e| err("sync", e))?;
    let t0 = Instant::now();
    let pool = alloc.pool(POOL).await.map_err(|e| err("sync pool", e))?;
    pool.wait_synced().await.map_err(|e| err("sync wait", e))?;
    let secs = t0.elapsed().as_secs_f64();
    if pool.snapshot().len() != n {
        return Err(format!("sync: cache has {} bindings, expected {n}", pool.snapshot().len()));
    }
    let requests = per_op_requests(&store.counts());
    let _ = alloc.close().await;
    let _ = setup.close().await;
    Ok((secs, requests))
}

/// idalloc on the embedded store (`file` in `dir`, or memory): fresh keys at concurrency `c`.
pub async fn embedded(dir: Option<&Path>, c: usize, dur: Duration) -> Result<Run, String> {
    let store: Arc<dyn Store> = match dir {
        Some(d) => Arc::new(
            EmbeddedStore::open(d.join(format!("bench-{c}.redb")), EmbeddedOptions::default())
                .await
                .map_err(|e| err("open file store", e))?,
        ),
        None => Arc::new(EmbeddedStore::memory()),
    };
    let node: Arc<dyn Node> =
        Arc::new(IdallocNode::start(Arc::new(CountingStore::new(store)), 0).await?);
    let run = run_fresh(node.clone(), c, dur, "emb").await;
    node.close().await;
    Ok(run)
}

/// `idalloc acquire POOL --from FILE` of `n` keys with the CLI binary `cli`, on `store_url`.
/// Gives up (killing the child it started) after `limit`, so the full run stays bounded.
pub async fn cli_acquire(
    cli: &Path,
    store_url: &str,
    dir: &Path,
    n: usize,
    limit: Duration,
) -> Result<f64, String> {
    cli_from(cli, store_url, dir, n, limit, true).await
}

/// `idalloc release POOL --from FILE` of the `n` keys [`cli_acquire`] acquired.
pub async fn cli_release(
    cli: &Path,
    store_url: &str,
    dir: &Path,
    n: usize,
    limit: Duration,
) -> Result<f64, String> {
    cli_from(cli, store_url, dir, n, limit, false).await
}

async fn cli_from(
    cli: &Path,
    store_url: &str,
    dir: &Path,
    n: usize,
    limit: Duration,
    acquire: bool,
) -> Result<f64, String> {
    let keys: String = (0..n).map(|i| key("cli", 0, 0, i) + "\n").collect();
    let file = dir.join(format!("keys-{n}.txt"));
    std::fs::write(&file, keys).map_err(|e| err("writing CLI key file", e))?;
    let range = format!("{}-{}", RANGE.0, RANGE.1);
    let verb: Vec<&str> =
        if acquire { vec!["acquire", POOL, "--range", &range] } else { vec!["release", POOL] };
    let verb: Vec<String> = verb.into_iter().map(str::to_string).collect();
    let errors = dir.join("cli-stderr.txt");
    let stderr = std::fs::File::create(&errors).map_err(|e| err("CLI stderr file", e))?;
    let (cli, store_url) = (cli.to_path_buf(), store_url.to_string());
    let t0 = Instant::now();
    let status =
        tokio::task::spawn_blocking(move || -> Result<std::process::ExitStatus, String> {
            let mut child = std::process::Command::new(cli)
                .args(["--store", &store_url])
                .args(&verb)
                .arg("--from")
                .arg(&file)
                .stdout(std::process::Stdio::null())
                .stderr(stderr)
                .spawn()
                .map_err(|e| err("running the CLI", e))?;
            let deadline = Instant::now() + limit;
            loop {
                if let Some(st) = child.try_wait().map_err(|e| err("waiting for the CLI", e))? {
                    return Ok(st);
                }
                if Instant::now() > deadline {
                    let _ = child.kill();
                    let _ = child.wait();
                    return Err(format!("did not finish within {} s (stopped)", limit.as_secs()));
                }
                std::thread::sleep(Duration::from_millis(50));
            }
        })
        .await
        .map_err(|e| err("CLI task", e))??;
    let secs = t0.elapsed().as_secs_f64();
    if !status.success() {
        let msg = std::fs::read_to_string(&errors).unwrap_or_default();
        return Err(format!("CLI exited with {status}: {}", msg.trim()));
    }
    Ok(secs)
}
