//! The cache's memory per binding, and pools of 1M and 10M bindings on
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
use idalloc_testkit::counting::CountingStore;

use crate::stats::resident_bytes;

/// The pool every scale run uses: 24 bits, as a VXLAN VNI space (Contiv's use).
pub const POOL: &str = "scale";
const MAX_ID: u64 = (1 << 24) - 1;
/// Holder of the filled bindings (a durable reference, as `acquire_durable` writes).
const HOLDER: &str = "scale-fill";
/// Key length of every binding ("40-byte keys").
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

/// The scale pool's spec: IDs 1 to 2^24 - 1.
pub fn spec() -> PoolSpec {
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

/// How a scale run starts etcd: extra flags and environment variables. The question is why etcd's
/// resident memory is ~3 KB a binding and which setting bounds it, so one run compares several
/// (`--scale-etcd "default;--snapshot-count=10000;--snapshot-count=1000 GOGC=50"`).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct EtcdSetting {
    /// As written on the command line ("default" for none).
    pub label: String,
    pub args: Vec<String>,
    pub env: Vec<(String, String)>,
}

impl EtcdSetting {
    /// One setting: words separated by spaces, each an etcd flag (`--name=value`) or an
    /// environment variable (`NAME=value`, e.g. Go's `GOGC` or `GOMEMLIMIT`); empty or
    /// `default` for etcd's defaults.
    pub fn parse(text: &str) -> Result<EtcdSetting, String> {
        let text = text.trim();
        let mut s = EtcdSetting {
            label: if text.is_empty() { "default".into() } else { text.into() },
            ..EtcdSetting::default()
        };
        for word in text.split_whitespace().filter(|w| *w != "default") {
            if word.starts_with("--") && word.len() > 2 {
                s.args.push(word.to_string());
                continue;
            }
            let env = word.split_once('=').filter(|(name, _)| {
                name.starts_with(|c: char| c.is_ascii_uppercase())
                    && name
                        .chars()
                        .all(|c| c.is_ascii_uppercase() || c.is_ascii_digit() || c == '_')
            });
            match env {
                Some((name, value)) => s.env.push((name.to_string(), value.to_string())),
                None => {
                    return Err(format!(
                        "etcd setting {text:?}: {word:?} is neither an etcd flag (--name=value) nor an environment variable (NAME=value)"
                    ))
                }
            }
        }
        Ok(s)
    }

    /// Settings separated by `;`.
    pub fn parse_list(text: &str) -> Result<Vec<EtcdSetting>, String> {
        text.split(';').map(EtcdSetting::parse).collect()
    }
}

/// etcd's memory at one moment: resident bytes, split into anonymous (Go heap, stacks, runtime)
/// and file-backed (bbolt's mmapped database), and the Go heap in use as etcd's own metrics
/// report it (`go_memstats_heap_inuse_bytes`: live objects plus fragmentation, not the garbage
/// the next GC frees), and the heap size at which its next GC starts
/// (`go_memstats_next_gc_bytes`: the live heap after the last GC × (1 + GOGC/100), so half of it
/// is the live heap under the default GOGC of 100).
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct EtcdMemory {
    pub rss: u64,
    pub anon: u64,
    pub file: u64,
    pub heap_inuse: u64,
    pub next_gc: u64,
}

/// The value of a Prometheus text-format sample `name` (no labels) in `text`.
pub fn metric(text: &str, name: &str) -> Option<f64> {
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.trim().parse().ok())
}

/// CPU seconds (user + system) process `pid` ("self" for this one) has used, from
/// `/proc/<pid>/stat` (fields 14 and 15, in clock ticks of 1/100 s, Linux's `USER_HZ`).
pub fn cpu_secs(pid: &str) -> Option<f64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name (field 2) may hold spaces; fields after it follow its closing parenthesis.
    let rest = &stat[stat.rfind(')')? + 1..];
    let f: Vec<&str> = rest.split_whitespace().collect();
    let ticks: u64 = f.get(11)?.parse::<u64>().ok()? + f.get(12)?.parse::<u64>().ok()?;
    Some(ticks as f64 / 100.0)
}

/// Free bytes on the file system of `dir` and whether it is a `tmpfs` (`df`), to stop a fill
/// before it fills the shared disk.
fn disk_free(dir: &Path) -> Option<(u64, bool)> {
    let out = Command::new("df").args(["-B1", "--output=avail,fstype"]).arg(dir).output().ok()?;
    let text = String::from_utf8_lossy(&out.stdout);
    let mut f = text.lines().nth(1)?.split_whitespace();
    Some((f.next()?.parse().ok()?, f.next()? == "tmpfs"))
}

/// The machine's available memory (`MemAvailable`), to stop a fill before it starves the others.
fn mem_available() -> Option<u64> {
    let text = std::fs::read_to_string("/proc/meminfo").ok()?;
    let kb: u64 = text
        .lines()
        .find_map(|l| l.strip_prefix("MemAvailable:"))?
        .split_whitespace()
        .next()?
        .parse()
        .ok()?;
    Some(kb * 1024)
}

/// A fill stops (and the run measures what it wrote) when the machine's available memory falls
/// below this: the machine is shared, and etcd's heap grows with the records.
const MIN_MEM_AVAILABLE: u64 = 6 << 30;
/// ... or the disk's free space below this (the disk is shared too).
const MIN_DISK_FREE: u64 = 15_000_000_000;
/// A data directory on a `tmpfs` (memory, already bounded by [`MIN_MEM_AVAILABLE`] and by the
/// mount's size) only needs room for the next writes: etcd fails on a full file system.
const MIN_TMPFS_FREE: u64 = 256 << 20;

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
    async fn start(dir: &Path, setting: &EtcdSetting) -> Result<Etcd, String> {
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
            .args(&setting.args)
            .envs(setting.env.iter().map(|(k, v)| (k, v)))
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

    fn pid(&self) -> String {
        self.child.id().to_string()
    }

    /// etcd's memory now (see [`EtcdMemory`]); the heap figure is 0 if the metrics did not answer.
    async fn memory(&self) -> EtcdMemory {
        let pid = self.pid();
        let field = |f: &str| crate::fanout::status_bytes(&pid, f).unwrap_or(0);
        let metrics = async {
            let addr = self.url.trim_start_matches("http://");
            let mut conn = crate::serve::Conn::open(addr).await.ok()?;
            let body = conn.call(hyper::Method::GET, "/metrics", String::new()).await.ok()?;
            Some(String::from_utf8_lossy(&body).into_owned())
        }
        .await
        .unwrap_or_default();
        let m = |name: &str| metric(&metrics, name).unwrap_or(0.0) as u64;
        EtcdMemory {
            rss: field("VmRSS:"),
            anon: field("RssAnon:"),
            file: field("RssFile:"),
            heap_inuse: m("go_memstats_heap_inuse_bytes"),
            next_gc: m("go_memstats_next_gc_bytes"),
        }
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
/// Stops early when the machine's available memory or `dir`'s free disk falls below
/// [`MIN_MEM_AVAILABLE`] / [`MIN_DISK_FREE`]: returns the bindings written and, if it stopped,
/// why (the run then measures the pool it got: "as far as the machine allows").
async fn fill(store: Arc<dyn Store>, n: u64, dir: &Path) -> Result<(u64, Option<String>), String> {
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
    let mut checked = Instant::now();
    let mut stopped: Option<String> = None;
    let mut it = chunks.into_iter();
    let mut inflight = futures::stream::FuturesUnordered::new();
    loop {
        if stopped.is_none() && checked.elapsed() > Duration::from_secs(2) {
            checked = Instant::now();
            let mem = mem_available().unwrap_or(u64::MAX);
            let (disk, tmpfs) = disk_free(dir).unwrap_or((u64::MAX, false));
            let floor = if tmpfs { MIN_TMPFS_FREE } else { MIN_DISK_FREE };
            if mem < MIN_MEM_AVAILABLE {
                stopped = Some(format!(
                    "the machine's available memory fell to {:.1} GB (floor {:.0} GB)",
                    mem as f64 / 1e9,
                    MIN_MEM_AVAILABLE as f64 / 1e9
                ));
            } else if disk < floor {
                stopped = Some(format!(
                    "free space of {} fell to {:.1} GB (floor {:.1} GB{})",
                    dir.display(),
                    disk as f64 / 1e9,
                    floor as f64 / 1e9,
                    if tmpfs { ", tmpfs" } else { "" }
                ));
            }
            if let Some(why) = &stopped {
                eprintln!("  fill stopped at about {done} bindings: {why}");
            }
        }
        while stopped.is_none() && inflight.len() < TXNS_IN_FLIGHT {
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
    Ok((done, stopped))
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
    /// CPU seconds the new process and etcd spent during the sync: which side is busy.
    pub cpu_self: f64,
    pub cpu_etcd: f64,
    /// The sync's reads: how many, the records they returned and the records etcd walked to
    /// answer them (the sum of their `count`s; far more than returned means quadratic paging).
    pub gets: u64,
    pub returned: u64,
    pub counted: u64,
}

fn vm_hwm() -> Option<u64> {
    crate::fanout::status_bytes("self", "VmHWM:")
}

/// Child side of `sync_new_process`: opens the pool on `url`, waits for the sync, times
/// `PROBES` acquires of new keys (released afterwards), prints the figures as JSON. `etcd_pid`
/// is the member's process, whose CPU during the sync is read from `/proc`.
pub async fn sync_child(url: &str, page: i64, etcd_pid: &str) -> Result<(), String> {
    let counting =
        Arc::new(CountingStore::new(idalloc_testkit::etcd::connect_test_store(url).await?));
    let store: Arc<dyn Store> = counting.clone();
    // `wait_synced` gives up after one request budget without listing progress; applying a
    // 1M-binding listing takes longer than the default budget (10 s × 2) on a loaded machine,
    // so the budget is raised here (docs/benchmarks/scale.md says how long the apply took).
    let opts = AllocatorOptions::builder()
        .list_page(page)
        .request_timeout(Duration::from_secs(120))
        .build()
        .map_err(|e| e.to_string())?;
    let alloc = Allocator::from_arc(store, opts).map_err(|e| e.to_string())?;
    let (cpu0, etcd0) = (cpu_secs("self"), cpu_secs(etcd_pid));
    let t0 = Instant::now();
    let pool = alloc.pool(POOL).await.map_err(|e| e.to_string())?;
    pool.wait_synced().await.map_err(|e| e.to_string())?;
    let sync_secs = t0.elapsed().as_secs_f64();
    let cpu = |a: Option<f64>, b: Option<f64>| b.zip(a).map_or(f64::NAN, |(b, a)| b - a);
    let (cpu_self, cpu_etcd) = (cpu(cpu0, cpu_secs("self")), cpu(etcd0, cpu_secs(etcd_pid)));
    let reads = counting.reads();
    let gets = counting.counts().get;
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
            "cpu_self": cpu_self, "cpu_etcd": cpu_etcd, "gets": gets,
            "returned": reads.returned, "counted": reads.counted,
        })
    );
    let _ = alloc.close().await;
    Ok(())
}

/// Runs this binary with `flag url page etcd_pid` (a measuring child: a fresh process, so its
/// memory is its own) and returns the figures it printed as its last JSON line.
pub(crate) fn child_figures(
    flag: &str,
    url: &str,
    page: i64,
    etcd_pid: &str,
) -> Result<serde_json::Value, String> {
    let exe = std::env::current_exe().map_err(|e| format!("own path: {e}"))?;
    let out = Command::new(exe)
        .args([flag, url, &page.to_string(), etcd_pid])
        .stderr(Stdio::inherit())
        .output()
        .map_err(|e| format!("child: {e}"))?;
    let text = String::from_utf8_lossy(&out.stdout);
    text.lines()
        .rev()
        .find_map(|l| serde_json::from_str(l).ok())
        .ok_or_else(|| format!("{flag} child printed no figures: {text}"))
}

fn sync_new_process(url: &str, page: i64, etcd_pid: &str) -> Result<SyncFigures, String> {
    let v = child_figures("--scale-child-sync", url, page, etcd_pid)?;
    Ok(SyncFigures {
        bindings: v["bindings"].as_u64().unwrap_or(0),
        sync_secs: v["sync_secs"].as_f64().unwrap_or(f64::NAN),
        rss_after: v["rss_after"].as_u64().unwrap_or(0),
        rss_peak: v["rss_peak"].as_u64().unwrap_or(0),
        acquire_p50_ms: v["p50"].as_f64().unwrap_or(f64::NAN),
        acquire_p99_ms: v["p99"].as_f64().unwrap_or(f64::NAN),
        cpu_self: v["cpu_self"].as_f64().unwrap_or(f64::NAN),
        cpu_etcd: v["cpu_etcd"].as_f64().unwrap_or(f64::NAN),
        gets: v["gets"].as_u64().unwrap_or(0),
        returned: v["returned"].as_u64().unwrap_or(0),
        counted: v["counted"].as_u64().unwrap_or(0),
    })
}

/// One pool size on etcd.
#[derive(Clone, Debug, Default)]
pub struct EtcdScale {
    /// The etcd setting (`EtcdSetting::label`).
    pub setting: String,
    /// Bindings asked for, and written (fewer if the fill stopped: `stopped` says why).
    pub asked: u64,
    pub n: u64,
    pub stopped: Option<String>,
    pub fill_secs: f64,
    pub db_bytes: u64,
    /// After compaction + defrag; `None` when the defrag was skipped (it copies the whole
    /// database, and the disk is shared: only below 1 GiB).
    pub db_bytes_defrag: Option<u64>,
    /// etcd's memory after the fill, after the compaction (+ defrag) and after the syncs.
    pub etcd_fill: EtcdMemory,
    pub etcd_compacted: EtcdMemory,
    pub etcd_synced: EtcdMemory,
    /// etcd's peak resident memory over its whole life (`VmHWM`).
    pub etcd_peak: u64,
    pub sync: Vec<(i64, SyncFigures)>,
    /// Where a new process's sync went, at the first page size (`--scale-phases`).
    pub phases: Option<crate::scale_phases::Phases>,
}

/// Databases at or above this size are not defragmented (the copy would need as much disk again).
const DEFRAG_MAX: u64 = 1 << 30;

/// Fills a fresh etcd (started with `setting`) under `dir` with `n` bindings, measures its
/// database and its memory before and after compaction (+ defrag), then a new process's sync at
/// each listing page size of `pages`, and with `phases` where that sync's time went.
pub async fn etcd_scale(
    n: u64,
    dir: &Path,
    pages: &[i64],
    setting: &EtcdSetting,
    phases: bool,
) -> Result<EtcdScale, String> {
    let etcd = Etcd::start(&dir.join(format!("etcd-{n}")), setting).await?;
    let store: Arc<dyn Store> =
        Arc::new(idalloc_testkit::etcd::connect_test_store(&etcd.url).await?);
    let t0 = Instant::now();
    let (filled, stopped) = fill(store.clone(), n, dir).await?;
    let fill_secs = t0.elapsed().as_secs_f64();
    let etcd_fill = etcd.memory().await;
    let (db_bytes, rev) = etcd.status()?;
    // `--physical`: wait until etcd has applied the compaction. etcd 3.4 answers a compaction
    // at once and then walks every revision in the background (batches of 1,000, a commit and a
    // 10 ms pause each: 1 min 46 s at 1M bindings on the loaded machine); a sync measured during
    // that walk paid for it (etcd's CPU during the sync 24.2 s against 9.4 s for the same listing
    // after it, docs/benchmarks/scale.md).
    etcd.etcdctl(&["compaction", &rev.to_string(), "--physical"])?;
    let db_bytes_defrag = if db_bytes < DEFRAG_MAX {
        etcd.etcdctl(&["defrag"])?;
        Some(etcd.status()?.0)
    } else {
        None
    };
    let etcd_compacted = etcd.memory().await;
    let mut out = EtcdScale {
        setting: setting.label.clone(),
        asked: n,
        n: filled,
        stopped,
        fill_secs,
        db_bytes,
        db_bytes_defrag,
        etcd_fill,
        etcd_compacted,
        ..EtcdScale::default()
    };
    eprintln!(
        "  {filled} [{}]: filled in {fill_secs:.1} s, db {} MB ({} after compaction + defrag); etcd RSS {} MB (heap {} MB, file {} MB), {} MB after compaction",
        setting.label,
        db_bytes >> 20,
        db_bytes_defrag.map_or("not defragmented".into(), |b| format!("{} MB", b >> 20)),
        etcd_fill.rss >> 20,
        etcd_fill.heap_inuse >> 20,
        etcd_fill.file >> 20,
        etcd_compacted.rss >> 20,
    );
    for &page in pages {
        let s = sync_new_process(&etcd.url, page, &etcd.pid())?;
        eprintln!(
            "  {filled}: page {page}: synced {} in {:.2} s (CPU: process {:.2} s, etcd {:.2} s; {} reads walked {} records for {}), RSS {} MB (peak {} MB), acquire p50 {:.2} ms p99 {:.2} ms",
            s.bindings,
            s.sync_secs,
            s.cpu_self,
            s.cpu_etcd,
            s.gets,
            s.counted,
            s.returned,
            s.rss_after >> 20,
            s.rss_peak >> 20,
            s.acquire_p50_ms,
            s.acquire_p99_ms
        );
        out.sync.push((page, s));
    }
    if let (true, Some(&page)) = (phases, pages.first()) {
        let p = crate::scale_phases::measure(&etcd.url, page, &etcd.pid())?;
        eprintln!("  {filled}: phases: {p:?}");
        out.phases = Some(p);
    }
    out.etcd_synced = etcd.memory().await;
    out.etcd_peak = crate::fanout::status_bytes(&etcd.pid(), "VmHWM:").unwrap_or(0);
    Ok(out)
}

fn load_average() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|s| s.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_else(|_| "unknown".into())
}

/// The Markdown of a scale run (sections of docs/benchmarks/scale.md).
pub fn markdown(
    cache: &[CacheMemory],
    etcd: &[EtcdScale],
    cmd: &str,
    load: (&str, &str),
) -> String {
    let mut s = String::new();
    let _ = writeln!(
        s,
        "Generated by `{cmd}` (2 logical cores shared with other workloads: not a quiet machine; load average {} at the start, {} at the end).\n",
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
        etcd_markdown(&mut s, etcd);
    }
    s
}

fn mb(b: u64) -> f64 {
    b as f64 / 1048576.0
}

/// The etcd part of [`markdown`]: etcd's side (database, its memory), the new process's sync,
/// and where the sync's time went.
fn etcd_markdown(s: &mut String, etcd: &[EtcdScale]) {
    let per = |b: u64, n: u64| b as f64 / n.max(1) as f64;
    let _ = writeln!(s, "### 1M and 10M on etcd\n\nOne etcd 3.4 member (data under `target/tmp-bench/`, `--quota-backend-bytes` 8 GiB, plus the setting named). Fill: bindings written as `acquire_durable` writes them (ID record, key record, durable reference: 3 records), {BINDINGS_PER_TXN} bindings a txn, {TXNS_IN_FLIGHT} txns in flight, IDs spread over a 24-bit pool; it stops early if the machine's available memory falls below {} GB or the disk's free space below {} GB. Database size as `etcdctl endpoint status` reports it, after the fill and after compaction + defrag (defrag skipped from {} MB: it copies the database). etcd's memory: resident (`VmRSS`), of which file-backed (`RssFile`: bbolt's mmapped database), and its Go heap in use (`go_memstats_heap_inuse_bytes`), after the fill, after the compaction, after the syncs; peak is `VmHWM` over etcd's life.\n", MIN_MEM_AVAILABLE >> 30, MIN_DISK_FREE / 1_000_000_000, DEFRAG_MAX >> 20);
    let _ = writeln!(s, "| etcd setting | bindings | fill s | fill bindings/s | db B / binding | after compact + defrag | etcd RSS after fill MB | of which file MB | Go heap in use MB | next GC at MB | etcd RSS B / binding | after compaction MB | after syncs MB | etcd peak MB |\n|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|");
    for e in etcd {
        let _ = writeln!(
            s,
            "| `{}` | {}{} | {:.0} | {:.0} | {:.0} | {} | {:.0} | {:.0} | {:.0} | {:.0} | {:.0} | {:.0} | {:.0} | {:.0} |",
            e.setting,
            e.n,
            if e.stopped.is_some() { " (stopped)" } else { "" },
            e.fill_secs,
            e.n as f64 / e.fill_secs.max(1e-9),
            per(e.db_bytes, e.n),
            e.db_bytes_defrag.map_or("—".into(), |b| format!("{:.0}", per(b, e.n))),
            mb(e.etcd_fill.rss),
            mb(e.etcd_fill.file),
            mb(e.etcd_fill.heap_inuse),
            mb(e.etcd_fill.next_gc),
            per(e.etcd_fill.rss, e.n),
            mb(e.etcd_compacted.rss),
            mb(e.etcd_synced.rss),
            mb(e.etcd_peak),
        );
    }
    for e in etcd.iter().filter(|e| e.stopped.is_some()) {
        let _ = writeln!(
            s,
            "\nThe fill of {} stopped at {}: {}.",
            e.asked,
            e.n,
            e.stopped.as_deref().unwrap_or("")
        );
    }
    let _ = writeln!(s, "\nSync: a new process runs `Allocator::pool` + `wait_synced` (list page size given); its CPU and etcd's during the sync; its reads, and the records etcd walked to answer them (the sum of their `count`s) per record returned; its resident memory after the sync and its peak (`VmHWM`); then {PROBES} sequential `acquire`s of new keys (p50/p99).\n\n| etcd setting | bindings | page | sync s | CPU process s | CPU etcd s | CPU (both) µs / binding | reads | walked / returned | RSS after sync MB | RSS B / binding | peak RSS MB | acquire p50 ms | acquire p99 ms |\n|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|");
    for e in etcd {
        for (page, f) in &e.sync {
            let _ = writeln!(
                s,
                "| `{}` | {} | {page} | {:.2} | {:.2} | {:.2} | {:.2} | {} | {:.2} | {:.0} | {:.0} | {:.0} | {:.2} | {:.2} |",
                e.setting,
                e.n,
                f.sync_secs,
                f.cpu_self,
                f.cpu_etcd,
                (f.cpu_self + f.cpu_etcd) * 1e6 / e.n.max(1) as f64,
                f.gets,
                f.counted as f64 / f.returned.max(1) as f64,
                mb(f.rss_after),
                per(f.rss_after, e.n),
                mb(f.rss_peak),
                f.acquire_p50_ms,
                f.acquire_p99_ms
            );
        }
    }
    if etcd.iter().any(|e| e.phases.is_some()) {
        let _ = writeln!(s, "\nWhere a sync's time goes (`--scale-phases`, another new process, first page size): the listing alone (the follower's sub-ranges, read with `list_all_at`, records collected), then the listing applied to an empty `PoolCache` (`replace_all`).\n\n| bindings | listing s | listing CPU process s | listing CPU etcd s | apply s | apply CPU s | listing CPU (both) µs / binding | apply CPU µs / binding |\n|---:|---:|---:|---:|---:|---:|---:|---:|");
        for e in etcd {
            if let Some(p) = &e.phases {
                let us = |secs: f64| secs * 1e6 / e.n.max(1) as f64;
                let _ = writeln!(
                    s,
                    "| {} | {:.2} | {:.2} | {:.2} | {:.2} | {:.2} | {:.2} | {:.2} |",
                    e.n,
                    p.list_secs,
                    p.list_cpu_self,
                    p.list_cpu_etcd,
                    p.apply_secs,
                    p.apply_cpu,
                    us(p.list_cpu_self + p.list_cpu_etcd),
                    us(p.apply_cpu)
                );
            }
        }
    }
    s.push('\n');
}

/// What a `--scale` run does besides its sizes.
#[derive(Clone, Debug, Default)]
pub struct ScaleRun {
    /// Bindings per etcd run, in order; a run whose fill stopped ends the list.
    pub etcd_sizes: Vec<u64>,
    pub cache_sizes: Vec<u64>,
    pub dir: PathBuf,
    pub pages: Vec<i64>,
    /// etcd settings: every size runs under each.
    pub settings: Vec<EtcdSetting>,
    /// Also measure where the sync's time goes (`scale_phases`).
    pub phases: bool,
    /// Markdown page, written after every size (a long run keeps what it measured).
    pub out: Option<PathBuf>,
    /// Chart of the first setting's figures against bindings (`scale_chart`).
    pub svg: Option<PathBuf>,
}

/// `--scale` / `--scale-cache`: runs the parts asked for, prints the Markdown, writes it to
/// `out` (after every size) and the chart to `svg`.
pub async fn run(r: &ScaleRun, cmd: &str) -> Result<(), String> {
    let load0 = load_average();
    let mut cache = Vec::new();
    for &n in &r.cache_sizes {
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
    let default = [EtcdSetting::parse("")?];
    let settings = if r.settings.is_empty() { &default[..] } else { &r.settings[..] };
    let mut etcd = Vec::new();
    let mut md = markdown(&cache, &etcd, cmd, (&load0, &load_average()));
    for setting in settings {
        for &n in &r.etcd_sizes {
            eprintln!("  {n} [{}] (load average {})", setting.label, load_average());
            let e = etcd_scale(n, &r.dir, &r.pages, setting, r.phases).await?;
            let stopped = e.stopped.is_some();
            etcd.push(e);
            md = markdown(&cache, &etcd, cmd, (&load0, &load_average()));
            if let Some(p) = &r.out {
                std::fs::write(p, &md).map_err(|e| format!("{}: {e}", p.display()))?;
            }
            if stopped {
                break;
            }
        }
    }
    println!("{md}");
    if let Some(p) = &r.svg {
        let first: Vec<EtcdScale> =
            etcd.iter().filter(|e| e.setting == settings[0].label).cloned().collect();
        std::fs::write(p, crate::scale_chart::svg(&first))
            .map_err(|e| format!("{}: {e}", p.display()))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_etcd_setting_is_flags_and_environment_and_refuses_anything_else() {
        let s = EtcdSetting::parse("--snapshot-count=1000 GOGC=50").expect("valid");
        assert_eq!(s.label, "--snapshot-count=1000 GOGC=50");
        assert_eq!(s.args, vec!["--snapshot-count=1000".to_string()]);
        assert_eq!(s.env, vec![("GOGC".to_string(), "50".to_string())]);
        for default in ["", "default", "  "] {
            let d = EtcdSetting::parse(default).expect("default");
            assert_eq!((d.label.as_str(), d.args.len(), d.env.len()), ("default", 0, 0));
        }
        let list = EtcdSetting::parse_list("default;--snapshot-count=10000").expect("two");
        assert_eq!(list.len(), 2);
        let err = EtcdSetting::parse("--snapshot-count=1 snapshot").expect_err("a bare word");
        assert!(err.contains("\"snapshot\"") && err.contains("NAME=value"), "{err}");
        assert!(EtcdSetting::parse("gogc=50").is_err(), "lower-case is not an environment name");
        assert!(EtcdSetting::parse("--").is_err());
    }

    #[test]
    fn a_metric_is_read_by_its_exact_name() {
        let text = "# HELP go_memstats_heap_inuse_bytes x\ngo_memstats_heap_inuse_bytes_total 1\ngo_memstats_heap_inuse_bytes 1.2345e+09\n";
        assert_eq!(metric(text, "go_memstats_heap_inuse_bytes"), Some(1.2345e9));
        assert_eq!(metric(text, "go_memstats_next_gc_bytes"), None);
    }

    #[test]
    fn this_process_has_a_cpu_time_and_a_missing_one_has_none() {
        let t = cpu_secs("self").expect("own /proc/self/stat");
        assert!(t >= 0.0);
        assert_eq!(cpu_secs("999999999"), None);
    }
}
