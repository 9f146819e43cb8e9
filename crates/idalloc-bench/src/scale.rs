//! Issue 21, items 2 and 5: the cache's memory per binding, and pools of 1M and 10M bindings on
//! etcd (fill time, database size per binding, sync time and memory of a new process, acquire
//! latency against a 10k pool).
//!
//! Every memory figure comes from a fresh child process (this binary again, with a hidden
//! `--scale-child-*` flag), so that what the parent allocated (the fill's buffers, earlier runs)
//! does not move it: resident memory is the process's RSS from `/proc/self/statm`, before and
//! after, and heap bytes are counted by the bench binary's allocator (`heap.rs`).
//!
//! `cargo run --release -p idalloc-bench -- --scale 10000,1000000 [--scale-dir DIR] [--out FILE]`
//! (default directory `target/tmp-bench`, removed per run; needs `etcd` and `etcdctl` on `PATH`).
//! `--scale-cache 1000000` runs the cache-memory part alone.

use std::fmt::Write as _;
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use idalloc::bench_api::PoolCache;
use idalloc::layout::{encode_id, IdRecord, Layout};
use idalloc::store::{KeyValue, Store, TxnOp, TxnRequest, WatchEvent};
use idalloc::{Allocator, AllocatorOptions, PoolSpec};

use crate::stats::resident_bytes;

/// The pool every scale run uses: 24 bits, as a VXLAN VNI space (Contiv's use).
pub const POOL: &str = "scale";
const MAX_ID: u64 = (1 << 24) - 1;
/// Holder of the filled bindings (a durable reference, as `acquire_durable` writes).
const HOLDER: &str = "scale-fill";
/// Key length of every binding (issue 21: "40-byte keys").
pub const KEY_LEN: usize = 40;
/// Multiplier that spreads the i-th binding over the 24-bit range (coprime with 2^24 - 1, so
/// distinct for every i below it): IDs as a random pick would place them, no two adjacent at 1M.
const SPREAD: u64 = 10_368_889;
/// etcd's default `--max-txn-ops` is 128; three records per binding.
const BINDINGS_PER_TXN: usize = 42;
const TXNS_IN_FLIGHT: usize = 8;
/// Acquires timed per latency figure.
const PROBES: usize = 300;

/// The i-th binding's key: exactly [`KEY_LEN`] bytes.
pub fn key(i: u64) -> String {
    let mut k = format!("k8s:app=web-{i:09};ns=default");
    while k.len() < KEY_LEN {
        k.push('x');
    }
    k
}

/// The i-th binding's ID: spread over the range, or consecutive (`dense`).
pub fn id(i: u64, dense: bool) -> u64 {
    if dense {
        1 + i
    } else {
        1 + (i * SPREAD) % MAX_ID
    }
}

fn spec() -> PoolSpec {
    PoolSpec::new(POOL, 1, MAX_ID)
}

/// Resident and heap bytes per binding of a cache of `n` bindings, measured by a child process.
#[derive(Clone, Debug, Default)]
pub struct CacheMemory {
    pub n: u64,
    pub dense: bool,
    pub rss_per_binding: f64,
    pub heap_per_binding: Option<f64>,
}

/// Child side of [`cache_memory`]: builds a `PoolCache` of `n` bindings fed as the sync task feeds
/// it (one watch event each, the event's buffers dropped after each), prints
/// `rss_delta heap_delta` in bytes.
pub async fn cache_memory_child(n: u64, dense: bool) -> Result<(), String> {
    let layout = Layout::new("idalloc").map_err(|e| e.to_string())?;
    let parse = |k: &[u8]| layout.parse_id_key(POOL, k);
    let before = resident_bytes().ok_or("no /proc/self/statm")?;
    let (cache, heap) = crate::heap::measure(async {
        let mut c = PoolCache::new(spec());
        for i in 0..n {
            let ev = WatchEvent::Put(KeyValue {
                key: layout.id_key(POOL, id(i, dense)),
                value: IdRecord::Bound(key(i)).encode(),
                create_revision: i as i64 + 2,
                mod_revision: i as i64 + 2,
                version: 1,
                lease: 0,
            });
            std::hint::black_box(c.apply(&ev, parse));
        }
        c
    })
    .await;
    let after = resident_bytes().ok_or("no /proc/self/statm")?;
    if cache.len() as u64 != n {
        return Err(format!("cache holds {} bindings, {n} fed", cache.len()));
    }
    println!("{} {}", after.saturating_sub(before), heap.unwrap_or(-1));
    Ok(())
}

/// Runs [`cache_memory_child`] in a fresh process.
pub fn cache_memory(n: u64, dense: bool) -> Result<CacheMemory, String> {
    let exe = std::env::current_exe().map_err(|e| format!("own path: {e}"))?;
    let out = Command::new(exe)
        .args(["--scale-child-cache", &n.to_string(), if dense { "dense" } else { "spread" }])
        .output()
        .map_err(|e| format!("child: {e}"))?;
    let text = String::from_utf8_lossy(&out.stdout);
    let f: Vec<i64> = text.split_whitespace().filter_map(|w| w.parse().ok()).collect();
    match (out.status.success(), f.as_slice()) {
        (true, [rss, heap]) => Ok(CacheMemory {
            n,
            dense,
            rss_per_binding: *rss as f64 / n.max(1) as f64,
            heap_per_binding: (*heap >= 0).then(|| *heap as f64 / n.max(1) as f64),
        }),
        _ => Err(format!("cache child failed: {}{}", text, String::from_utf8_lossy(&out.stderr))),
    }
}

/// One etcd member for a scale run, its data directory under the bench directory. Killed by PID
/// and its directory removed on drop.
struct Etcd {
    child: Child,
    url: String,
    dir: PathBuf,
}

fn free_port() -> Result<u16, String> {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .map_err(|e| format!("free port: {e}"))
}

impl Etcd {
    async fn start(dir: &Path) -> Result<Etcd, String> {
        let _ = std::fs::remove_dir_all(dir);
        std::fs::create_dir_all(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
        let (c, p) = (free_port()?, free_port()?);
        let url = format!("http://127.0.0.1:{c}");
        let peer = format!("http://127.0.0.1:{p}");
        let log = std::fs::File::create(dir.join("etcd.log")).map_err(|e| e.to_string())?;
        let child = Command::new("etcd")
            .arg("--name=scale")
            .arg(format!("--data-dir={}", dir.join("data").display()))
            .arg(format!("--listen-client-urls={url}"))
            .arg(format!("--advertise-client-urls={url}"))
            .arg(format!("--listen-peer-urls={peer}"))
            .arg(format!("--initial-advertise-peer-urls={peer}"))
            .arg(format!("--initial-cluster=scale={peer}"))
            // 8 GiB, etcd's largest advised quota: 10M bindings do not fit the default 2 GiB.
            .arg("--quota-backend-bytes=8589934592")
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .map_err(|e| format!("etcd: {e}"))?;
        let etcd = Etcd { child, url, dir: dir.to_path_buf() };
        for _ in 0..300 {
            if etcd.status().is_ok() {
                return Ok(etcd);
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        Err("etcd did not answer within 30 s".into())
    }

    fn etcdctl(&self, args: &[&str]) -> Result<String, String> {
        let out = Command::new("etcdctl")
            .env("ETCDCTL_API", "3")
            .arg(format!("--endpoints={}", self.url))
            .arg("--command-timeout=600s")
            .args(args)
            .output()
            .map_err(|e| format!("etcdctl: {e}"))?;
        if !out.status.success() {
            return Err(format!("etcdctl {args:?}: {}", String::from_utf8_lossy(&out.stderr)));
        }
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    }

    /// (database size in bytes as etcd reports it, its current revision).
    fn status(&self) -> Result<(u64, i64), String> {
        let s = self.etcdctl(&["endpoint", "status", "--write-out=json"])?;
        let v: serde_json::Value = serde_json::from_str(&s).map_err(|e| e.to_string())?;
        let st = &v[0]["Status"];
        let db = st["dbSize"].as_u64().ok_or_else(|| format!("no dbSize in {s}"))?;
        let rev = st["header"]["revision"].as_i64().ok_or_else(|| format!("no revision in {s}"))?;
        Ok((db, rev))
    }
}

impl Drop for Etcd {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// Writes `n` bindings of [`POOL`] exactly as `acquire_durable` with holder [`HOLDER`] writes them
/// (ID record, key record, durable reference; the holder record once), spread over the range.
async fn fill(store: Arc<dyn Store>, n: u64) -> Result<(), String> {
    let layout = Layout::new("idalloc").map_err(|e| e.to_string())?;
    store
        .txn(TxnRequest::new().and_then([
            TxnOp::put(layout.pool_spec_key(POOL), spec().to_json()),
            TxnOp::put(layout.holder_key(POOL, HOLDER), Vec::new()),
        ]))
        .await
        .map_err(|e| format!("spec: {e}"))?;
    let chunks: Vec<(u64, u64)> = (0..n)
        .step_by(BINDINGS_PER_TXN)
        .map(|lo| (lo, (lo + BINDINGS_PER_TXN as u64).min(n)))
        .collect();
    let t0 = Instant::now();
    let mut done = 0u64;
    let mut last = Instant::now();
    let mut it = chunks.into_iter();
    let mut inflight = futures::stream::FuturesUnordered::new();
    loop {
        while inflight.len() < TXNS_IN_FLIGHT {
            let Some((lo, hi)) = it.next() else { break };
            let (store, layout) = (store.clone(), layout.clone());
            inflight.push(async move {
                let mut ops = Vec::with_capacity(3 * (hi - lo) as usize);
                for i in lo..hi {
                    let (k, id) = (key(i), id(i, false));
                    ops.push(TxnOp::put(
                        layout.id_key(POOL, id),
                        IdRecord::Bound(k.clone()).encode(),
                    ));
                    ops.push(TxnOp::put(layout.key_key(POOL, &k), encode_id(id)));
                    ops.push(TxnOp::put(layout.ref_key(POOL, &k, HOLDER), encode_id(id)));
                }
                store.txn(TxnRequest::new().and_then(ops)).await.map(|_| hi - lo)
            });
        }
        use futures::StreamExt;
        match inflight.next().await {
            Some(r) => done += r.map_err(|e| format!("fill: {e}"))?,
            None => break,
        }
        if last.elapsed() > Duration::from_secs(30) {
            last = Instant::now();
            eprintln!("  filled {done}/{n} in {:.0} s", t0.elapsed().as_secs_f64());
        }
    }
    Ok(())
}

/// What a fresh process measured (the child of [`sync_child`]).
#[derive(Clone, Debug, Default)]
pub struct SyncFigures {
    pub bindings: u64,
    /// `Allocator::pool` + `wait_synced`, seconds.
    pub sync_secs: f64,
    /// Resident bytes after the sync (steady), and the peak during it (`VmHWM`).
    pub rss_after: u64,
    pub rss_peak: u64,
    /// Acquire of a new key (one durable txn each, sequential), ms.
    pub acquire_p50_ms: f64,
    pub acquire_p99_ms: f64,
}

fn vm_hwm() -> Option<u64> {
    crate::fanout::status_bytes("self", "VmHWM:")
}

/// Child side of `sync_new_process`: opens the pool on `url`, waits for the sync, times
/// `PROBES` acquires of new keys (released afterwards), prints the figures as JSON.
pub async fn sync_child(url: &str, page: i64) -> Result<(), String> {
    let store = idalloc_testkit::etcd::connect_test_store(url).await?;
    // `wait_synced` gives up after one request budget without listing progress; applying a
    // 1M-binding listing takes longer than the default budget (10 s × 2) on a loaded machine,
    // so the budget is raised here (docs/scale.md says how long the apply took).
    let opts = AllocatorOptions {
        list_page: page,
        request_timeout: Duration::from_secs(120),
        ..AllocatorOptions::default()
    };
    let alloc = Allocator::new(store, opts).map_err(|e| e.to_string())?;
    let t0 = Instant::now();
    let pool = alloc.pool(POOL).await.map_err(|e| e.to_string())?;
    pool.wait_synced().await.map_err(|e| e.to_string())?;
    let sync_secs = t0.elapsed().as_secs_f64();
    let bindings = pool.snapshot().len() as u64;
    tokio::time::sleep(Duration::from_millis(500)).await;
    let rss_after = resident_bytes().unwrap_or(0);
    let rss_peak = vm_hwm().unwrap_or(0);
    let mut lat = Vec::with_capacity(PROBES);
    for i in 0..PROBES {
        let k = format!("probe-{i:06}-{}", "p".repeat(KEY_LEN - 13));
        let t = Instant::now();
        pool.acquire(&k).await.map_err(|e| format!("acquire {k}: {e}"))?;
        lat.push(t.elapsed().as_secs_f64() * 1e3);
    }
    for i in 0..PROBES {
        let k = format!("probe-{i:06}-{}", "p".repeat(KEY_LEN - 13));
        pool.release(&k).await.map_err(|e| format!("release {k}: {e}"))?;
    }
    lat.sort_by(f64::total_cmp);
    let pct = |p: f64| lat[((lat.len() as f64 * p) as usize).min(lat.len() - 1)];
    println!(
        "{}",
        serde_json::json!({
            "bindings": bindings, "sync_secs": sync_secs, "rss_after": rss_after,
            "rss_peak": rss_peak, "p50": pct(0.5), "p99": pct(0.99),
        })
    );
    let _ = alloc.close().await;
    Ok(())
}

fn sync_new_process(url: &str, page: i64) -> Result<SyncFigures, String> {
    let exe = std::env::current_exe().map_err(|e| format!("own path: {e}"))?;
    let out = Command::new(exe)
        .args(["--scale-child-sync", url, &page.to_string()])
        .stderr(Stdio::inherit())
        .output()
        .map_err(|e| format!("child: {e}"))?;
    let text = String::from_utf8_lossy(&out.stdout);
    let v: serde_json::Value = text
        .lines()
        .rev()
        .find_map(|l| serde_json::from_str(l).ok())
        .ok_or_else(|| format!("sync child printed no figures: {text}"))?;
    Ok(SyncFigures {
        bindings: v["bindings"].as_u64().unwrap_or(0),
        sync_secs: v["sync_secs"].as_f64().unwrap_or(f64::NAN),
        rss_after: v["rss_after"].as_u64().unwrap_or(0),
        rss_peak: v["rss_peak"].as_u64().unwrap_or(0),
        acquire_p50_ms: v["p50"].as_f64().unwrap_or(f64::NAN),
        acquire_p99_ms: v["p99"].as_f64().unwrap_or(f64::NAN),
    })
}

/// One pool size on etcd.
#[derive(Clone, Debug, Default)]
pub struct EtcdScale {
    pub n: u64,
    pub fill_secs: f64,
    pub db_bytes: u64,
    pub db_bytes_defrag: u64,
    pub sync: Vec<(i64, SyncFigures)>,
}

/// Fills a fresh etcd under `dir` with `n` bindings, measures its database before and after
/// compaction + defrag, then a new process's sync at each listing page size of `pages`.
pub async fn etcd_scale(n: u64, dir: &Path, pages: &[i64]) -> Result<EtcdScale, String> {
    let etcd = Etcd::start(&dir.join(format!("etcd-{n}"))).await?;
    let store: Arc<dyn Store> =
        Arc::new(idalloc_testkit::etcd::connect_test_store(&etcd.url).await?);
    let t0 = Instant::now();
    fill(store.clone(), n).await?;
    let fill_secs = t0.elapsed().as_secs_f64();
    let (db_bytes, rev) = etcd.status()?;
    store.compact(rev).await.map_err(|e| format!("compact: {e}"))?;
    etcd.etcdctl(&["defrag"])?;
    let (db_bytes_defrag, _) = etcd.status()?;
    let mut out = EtcdScale { n, fill_secs, db_bytes, db_bytes_defrag, sync: Vec::new() };
    eprintln!(
        "  {n}: filled in {fill_secs:.1} s, db {} MB, {} MB after compaction + defrag",
        db_bytes >> 20,
        db_bytes_defrag >> 20
    );
    for &page in pages {
        let s = sync_new_process(&etcd.url, page)?;
        eprintln!(
            "  {n}: page {page}: synced {} in {:.2} s, RSS {} MB (peak {} MB), acquire p50 {:.2} ms p99 {:.2} ms",
            s.bindings,
            s.sync_secs,
            s.rss_after >> 20,
            s.rss_peak >> 20,
            s.acquire_p50_ms,
            s.acquire_p99_ms
        );
        out.sync.push((page, s));
    }
    Ok(out)
}

fn load_average() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|s| s.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_else(|_| "unknown".into())
}

/// The Markdown of a scale run (sections of docs/scale.md).
pub fn markdown(
    cache: &[CacheMemory],
    etcd: &[EtcdScale],
    cmd: &str,
    load: (&str, &str),
) -> String {
    let mut s = String::new();
    let _ = writeln!(
        s,
        "Generated by `{cmd}` (2 logical cores shared with other engineers compiling and testing: not a quiet machine; load average {} at the start, {} at the end).\n",
        load.0, load.1
    );
    if !cache.is_empty() {
        let _ = writeln!(s, "### Cache memory\n\nA `PoolCache` of N bindings with {KEY_LEN}-byte keys, fed one watch event per binding, in a fresh process: resident bytes added (RSS), and heap bytes retained (counted by the bench binary's allocator; includes unused capacity that was never touched, which RSS does not). \"spread\": IDs spread over the 24-bit range (no two adjacent, as random picks leave them: one free-set run per binding); \"dense\": consecutive IDs.\n\n| bindings | IDs | RSS bytes / binding (key bytes included) | heap bytes / binding |\n|---:|---|---:|---:|");
        for c in cache {
            let _ = writeln!(
                s,
                "| {} | {} | {:.1} | {} |",
                c.n,
                if c.dense { "dense" } else { "spread" },
                c.rss_per_binding,
                c.heap_per_binding.map_or("—".into(), |h| format!("{h:.1}"))
            );
        }
        s.push('\n');
    }
    if !etcd.is_empty() {
        let _ = writeln!(s, "### 1M and 10M on etcd\n\nOne etcd 3.4 member (data under `target/tmp-bench/`, `--quota-backend-bytes` 8 GiB). Fill: bindings written as `acquire_durable` writes them (ID record, key record, durable reference: 3 records), {BINDINGS_PER_TXN} bindings a txn, {TXNS_IN_FLIGHT} txns in flight, IDs spread over a 24-bit pool. Database size as `etcdctl endpoint status` reports it, after the fill and after compaction + defrag. Sync: a new process runs `Allocator::pool` + `wait_synced` (list page size given), then {PROBES} sequential `acquire`s of new keys (p50/p99).\n\n| bindings | fill s | fill bindings/s | db bytes / binding | after compact + defrag | page | sync s | RSS after sync MB | RSS / binding | peak RSS MB | acquire p50 ms | acquire p99 ms |\n|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|");
        for e in etcd {
            for (page, f) in &e.sync {
                let _ = writeln!(
                    s,
                    "| {} | {:.0} | {:.0} | {:.0} | {:.0} | {page} | {:.2} | {:.0} | {:.0} | {:.0} | {:.2} | {:.2} |",
                    e.n,
                    e.fill_secs,
                    e.n as f64 / e.fill_secs.max(1e-9),
                    e.db_bytes as f64 / e.n.max(1) as f64,
                    e.db_bytes_defrag as f64 / e.n.max(1) as f64,
                    f.sync_secs,
                    f.rss_after as f64 / 1048576.0,
                    f.rss_after as f64 / e.n.max(1) as f64,
                    f.rss_peak as f64 / 1048576.0,
                    f.acquire_p50_ms,
                    f.acquire_p99_ms
                );
            }
        }
        s.push('\n');
    }
    s
}

/// `--scale` / `--scale-cache`: runs the parts asked for, prints the Markdown, writes it to `out`.
pub async fn run(
    etcd_sizes: &[u64],
    cache_sizes: &[u64],
    dir: &Path,
    pages: &[i64],
    out: Option<&Path>,
    cmd: &str,
) -> Result<(), String> {
    let load0 = load_average();
    let mut cache = Vec::new();
    for &n in cache_sizes {
        for dense in [false, true] {
            let c = cache_memory(n, dense)?;
            eprintln!(
                "  cache {n} {}: {:.1} B/binding RSS",
                if dense { "dense" } else { "spread" },
                c.rss_per_binding
            );
            cache.push(c);
        }
    }
    let mut etcd = Vec::new();
    for &n in etcd_sizes {
        etcd.push(etcd_scale(n, dir, pages).await?);
    }
    let md = markdown(&cache, &etcd, cmd, (&load0, &load_average()));
    println!("{md}");
    if let Some(p) = out {
        std::fs::write(p, &md).map_err(|e| format!("{}: {e}", p.display()))?;
    }
    Ok(())
}
