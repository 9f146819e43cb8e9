//! The soak run (docs/chaos.md "Soak"): steady load with faults for
//! `IDALLOC_SOAK_SECS` (default 120, CI's version; the hour-long run's figures are in
//! docs/chaos.md), sampling every `IDALLOC_SOAK_SAMPLE_SECS` (default: a 60th of the run, 2–60 s)
//! what every process it started holds, and failing on growth and on any violation.
//!
//! Load and faults: the chaos test's run (`common::run_chaos_with`) on a 3-member loopback etcd
//! cluster — five `chaos-client` processes (durable calls, recorded and checked for
//! linearizability per key, G1 scans, G3, G6; bursts of coalesced session calls), member kills
//! and pauses (leader and follower, pauses shorter and longer than the request timeout) and
//! kills of client `h0` (the other four live the whole run, so each is one series) — plus
//! `idalloc serve` on the same cluster with an HTTP client thread that opens short sessions,
//! acquires and releases through them, renews them, and either ends them or abandons them to
//! expire (a lease the server must let go).
//!
//! Sampled: resident memory and open descriptors of every descendant process (`/proc`), etcd's
//! watchers (`etcd_debugging_mvcc_watcher_total`, summed over the members, when all answer) and
//! leases (`etcdctl lease list`). Judged by `idalloc_chaos::soak::judge`: the median of the last
//! quarter of the span after warm-up (the first quarter of the run) against the median of its
//! first quarter, with the tolerances of [`TOLERANCES`]. Every process the run started is
//! stopped by its PID at the end, on failure too (the handles kill on drop).

mod common;

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::{run_chaos_with, RunOptions};
use idalloc_chaos::procs::{descendants, sample};
use idalloc_chaos::soak::{judge, lease_count, metric, Series, Tolerance, Verdict};
use idalloc_testkit::etcd::{etcd_or_skip, EtcdCluster};
use idalloc_testkit::serve::Serve;

/// The fault cycle: every kind of the chaos test, with fewer client kills (only `h0`).
const CYCLE: [&str; 6] = [
    "pause-leader",
    "kill-client",
    "pause-follower",
    "kill-follower",
    "pause-leader",
    "kill-leader",
];

/// Growth allowed from the first to the last window, per quantity (`abs + rel × first`).
/// - Resident memory of our processes (chaos clients, serve): 8 MiB + 25 %. After warm-up their
///   heaps hold a fixed key set; what moves is allocator arenas and fragmentation (a few MiB
///   with glibc's per-thread arenas). A leak of even 100 bytes per call (~90,000 calls an hour
///   per client) is 9 MiB, over it in the hour-long run.
/// - Resident memory of etcd: 32 MiB + 50 %. Go's collector lets the heap grow to twice the live
///   data before collecting, and etcd keeps every revision (no compaction here), so its RSS
///   follows the history's length; a leak of watchers or leases is caught by their own counts.
/// - Descriptors: 4 (a client reconnecting to a restarted member holds the old and the new
///   socket for a moment); etcd: 16 (one per client connection; clients move between members).
/// - Watchers (sum over members): 6, one extra per watching process (5 clients and serve): a
///   watch re-established after a member restart may linger on the old member until it notices.
/// - Leases: 10 + 25 %, for the sessions the HTTP load abandons, alive until their TTL expires.
const TOLERANCES: [(&str, Tolerance); 6] = [
    ("rss_kib etcd", Tolerance { abs: 32.0 * 1024.0, rel: 0.5 }),
    ("rss_kib", Tolerance { abs: 8.0 * 1024.0, rel: 0.25 }),
    ("fds etcd", Tolerance { abs: 16.0, rel: 0.0 }),
    ("fds", Tolerance { abs: 4.0, rel: 0.0 }),
    ("etcd watchers", Tolerance { abs: 6.0, rel: 0.0 }),
    ("etcd leases", Tolerance { abs: 10.0, rel: 0.25 }),
];

fn tolerance(name: &str) -> Tolerance {
    TOLERANCES
        .iter()
        .find(|(prefix, _)| name.starts_with(prefix))
        .map(|(_, t)| *t)
        .unwrap_or(Tolerance { abs: 0.0, rel: 0.0 })
}

fn env_secs(name: &str, default: u64) -> u64 {
    match std::env::var(name) {
        Ok(v) => v.parse().unwrap_or_else(|e| panic!("{name}={v:?} is not whole seconds: {e}")),
        Err(_) => default,
    }
}

/// The processes this soak measures, by command name (not the short-lived `kill` and `etcdctl`).
fn measured(label: &str) -> bool {
    ["etcd ", "chaos-client ", "idalloc"].iter().any(|p| label.starts_with(p))
}

/// One HTTP/1.1 request (`Connection: close`), answering the status and body.
fn http(addr: &str, method: &str, path: &str, body: Option<&str>) -> Result<(u16, String), String> {
    let mut s = TcpStream::connect(addr).map_err(|e| format!("connect {addr}: {e}"))?;
    s.set_read_timeout(Some(Duration::from_secs(30))).map_err(|e| e.to_string())?;
    let body = body.unwrap_or("");
    let req = format!(
        "{method} {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\
         Content-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    );
    s.write_all(req.as_bytes()).map_err(|e| format!("send {path}: {e}"))?;
    let mut out = String::new();
    s.read_to_string(&mut out).map_err(|e| format!("read {path}: {e}"))?;
    let status = out
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .ok_or_else(|| format!("{path}: no status in {out:?}"))?;
    let body = out.split_once("\r\n\r\n").map(|(_, b)| b.to_string()).unwrap_or_default();
    Ok((status, body))
}

/// What the HTTP load saw.
#[derive(Debug, Default)]
struct HttpLoad {
    /// status -> count, per operation.
    statuses: BTreeMap<String, usize>,
    sessions: usize,
    abandoned: usize,
    violations: Vec<String>,
}

/// Sessions through `serve` until `until`: open (TTL 2 s), acquire two keys, renew, release one,
/// then end the session or (one in three) abandon it for its lease to expire.
fn http_load(addr: &str, until: Instant, stop: &AtomicBool) -> HttpLoad {
    let mut out = HttpLoad::default();
    let mut n = 0u64;
    let count = |out: &mut HttpLoad, op: &str, r: &Result<(u16, String), String>| -> bool {
        let key = match r {
            Ok((s, _)) => format!("{op} {s}"),
            Err(_) => format!("{op} no answer"),
        };
        *out.statuses.entry(key).or_default() += 1;
        match r {
            // 503: the store is unavailable (a fault); 404 on a session: it expired meanwhile.
            Ok((s, _)) if *s < 300 || *s == 503 || *s == 404 => {}
            Ok((s, b)) => out.violations.push(format!("{op}: HTTP {s}: {b}")),
            Err(e) => out.violations.push(format!("{op}: {e}")),
        }
        matches!(r, Ok((s, _)) if *s < 300)
    };
    let pool = r#"{"name":"soak","min":1,"max":4096}"#;
    while Instant::now() < until && !stop.load(Ordering::Relaxed) {
        let r = http(addr, "POST", "/v1/pools", Some(pool));
        if count(&mut out, "pool", &r) {
            break;
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    while Instant::now() < until && !stop.load(Ordering::Relaxed) {
        n += 1;
        let r = http(addr, "POST", "/v1/sessions", Some(r#"{"ttl":2}"#));
        if !count(&mut out, "session open", &r) {
            std::thread::sleep(Duration::from_millis(200));
            continue;
        }
        out.sessions += 1;
        let body = r.map(|(_, b)| b).unwrap_or_default();
        let Some(session) = serde_json::from_str::<serde_json::Value>(&body)
            .ok()
            .and_then(|v| v["session"].as_str().map(str::to_string))
        else {
            out.violations.push(format!("session open answered {body:?}"));
            continue;
        };
        let keys = [format!("s{}", n % 8), format!("s{}", (n + 3) % 8)];
        for k in &keys {
            let b = format!(r#"{{"key":"{k}","session":"{session}"}}"#);
            let r = http(addr, "POST", "/v1/pools/soak/acquire", Some(&b));
            count(&mut out, "acquire", &r);
        }
        let r = http(addr, "PUT", &format!("/v1/sessions/{session}/keepalive"), None);
        count(&mut out, "keepalive", &r);
        let b = format!(r#"{{"key":"{}","session":"{session}"}}"#, keys[0]);
        let r = http(addr, "POST", "/v1/pools/soak/release", Some(&b));
        count(&mut out, "release", &r);
        if n % 3 == 0 {
            out.abandoned += 1;
        } else {
            let r = http(addr, "DELETE", &format!("/v1/sessions/{session}"), None);
            count(&mut out, "session end", &r);
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    out
}

/// etcd's `/metrics` from a client URL (`http://127.0.0.1:PORT`), or `None` if it does not
/// answer within 2 s (killed or frozen by the fault cycle).
fn etcd_metrics(endpoint: &str) -> Option<String> {
    let addr = endpoint.strip_prefix("http://")?;
    let mut s = TcpStream::connect_timeout(&addr.parse().ok()?, Duration::from_secs(2)).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(2))).ok()?;
    let req = format!("GET /metrics HTTP/1.0\r\nHost: {addr}\r\n\r\n");
    s.write_all(req.as_bytes()).ok()?;
    let mut out = String::new();
    s.read_to_string(&mut out).ok()?;
    Some(out)
}

fn etcd_leases(endpoints: &str) -> Option<f64> {
    let out = Command::new("etcdctl")
        .args(["--endpoints", endpoints, "--command-timeout=3s", "lease", "list"])
        .env("ETCDCTL_API", "3")
        .output()
        .ok()?;
    lease_count(&String::from_utf8_lossy(&out.stdout)).map(|n| n as f64)
}

/// Samples until `stop`, every `every`, into series keyed by name.
fn sampler(
    endpoints: Vec<String>,
    every: Duration,
    start: Instant,
    stop: &AtomicBool,
    series: &Mutex<BTreeMap<String, Series>>,
) {
    let me = std::process::id();
    let joined = endpoints.join(",");
    while !stop.load(Ordering::Relaxed) {
        let t = start.elapsed().as_secs_f64();
        let mut points: Vec<(String, f64)> = Vec::new();
        for pid in descendants(me) {
            let Some(s) = sample(pid) else { continue };
            if !measured(&s.label) {
                continue;
            }
            points.push((format!("rss_kib {} (pid {pid})", s.label), s.rss_kib as f64));
            points.push((format!("fds {} (pid {pid})", s.label), s.fds as f64));
        }
        let watchers: Option<Vec<f64>> = endpoints
            .iter()
            .map(|e| metric(&etcd_metrics(e)?, "etcd_debugging_mvcc_watcher_total"))
            .collect();
        if let Some(w) = watchers {
            points.push(("etcd watchers (sum over members)".into(), w.iter().sum()));
        }
        if let Some(n) = etcd_leases(&joined) {
            points.push(("etcd leases".into(), n));
        }
        {
            let mut map = series.lock().unwrap_or_else(|e| e.into_inner());
            for (name, v) in points {
                map.entry(name.clone())
                    .or_insert_with(|| Series { name, points: Vec::new() })
                    .points
                    .push((t, v));
            }
        }
        let next = Instant::now() + every;
        while Instant::now() < next && !stop.load(Ordering::Relaxed) {
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

/// Stops the sampler and the HTTP load when dropped: on a panic of the chaos run too, so their
/// threads end and the test's handles (serve, the cluster) are dropped and kill their processes.
struct StopOnDrop(Arc<AtomicBool>);

impl Drop for StopOnDrop {
    fn drop(&mut self) {
        self.0.store(true, Ordering::Relaxed);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn soak_with_faults_holds_every_resource_flat() {
    if !etcd_or_skip("the soak") {
        return;
    }
    let secs = env_secs("IDALLOC_SOAK_SECS", 120);
    let every = env_secs("IDALLOC_SOAK_SAMPLE_SECS", (secs / 60).clamp(2, 60));
    assert!(secs >= 60, "IDALLOC_SOAK_SECS={secs}: a soak of under 60 s cannot show a trend");
    eprintln!("soak: {secs} s, a sample every {every} s");
    let bin = idalloc_testkit::serve::workspace_bin();
    let mut cluster = EtcdCluster::start_fast(3).await.expect("3-member etcd cluster");
    let endpoints = cluster.endpoints();
    let serve = Serve::start(
        bin.to_str().expect("utf-8 path"),
        &["--endpoints", &endpoints.join(","), "--prefix", "soak-serve", "--timeout", "3s"],
        &[],
    );

    let start = Instant::now();
    let stop = Arc::new(AtomicBool::new(false));
    let guard = StopOnDrop(stop.clone());
    let series: Arc<Mutex<BTreeMap<String, Series>>> = Arc::default();
    let sampling = {
        let (stop, series, endpoints) = (stop.clone(), series.clone(), endpoints.clone());
        std::thread::spawn(move || {
            sampler(endpoints, Duration::from_secs(every), start, &stop, &series)
        })
    };
    let loading = {
        let (stop, addr) = (stop.clone(), serve.addr().to_string());
        let until = start + Duration::from_secs(secs);
        std::thread::spawn(move || http_load(&addr, until, &stop))
    };

    let opts = RunOptions { killable: 1 };
    let summary = run_chaos_with(&mut cluster, secs, &CYCLE, &opts).await;
    let end = start.elapsed().as_secs_f64().min(secs as f64);
    drop(guard);
    let load = loading.join().expect("HTTP load thread");
    sampling.join().expect("sampler thread");
    drop(serve);
    drop(cluster);

    // --- verdict -----------------------------------------------------------------------------
    let series = series.lock().unwrap_or_else(|e| e.into_inner());
    let warmup = end / 4.0;
    let mut violations: Vec<String> =
        load.violations.iter().map(|v| format!("HTTP: {v}")).collect();
    let mut judged = Vec::new();
    println!("=== soak report ===");
    println!(
        "{end:.0} s; recorded calls (durable, client sessions) {} invoked, {} answered; \
         coalesced session calls {}; \
         faults {:?}; client kills {}",
        summary.invoked, summary.returned, summary.coalesced, summary.faults, summary.client_kills
    );
    println!(
        "HTTP: {} sessions ({} abandoned to expire); {:?}",
        load.sessions, load.abandoned, load.statuses
    );
    println!("series (first sample -> last; window medians after {warmup:.0} s warm-up):");
    for s in series.values() {
        let (Some(a), Some(z)) = (s.points.first(), s.points.last()) else { continue };
        let v = judge(s, warmup, end, tolerance(&s.name));
        let verdict = match &v {
            Verdict::NotCovering => "not judged (did not live the whole span)".to_string(),
            Verdict::Judged { first, last, allowed, ok } => {
                judged.push(s.name.clone());
                if !ok {
                    violations.push(format!(
                        "growth: {}: {first:.0} -> {last:.0}, more than the {allowed:.0} allowed",
                        s.name
                    ));
                }
                format!(
                    "{first:.0} -> {last:.0} (allowed +{allowed:.0}){}",
                    if *ok { "" } else { " GROWTH" }
                )
            }
        };
        println!("  {}: {:.0} @{:.0}s -> {:.0} @{:.0}s; {verdict}", s.name, a.1, a.0, z.1, z.0);
    }
    println!("violations: {}", violations.len());
    for v in &violations {
        println!("  - {v}");
    }
    assert!(violations.is_empty(), "{} violations (see the report above)", violations.len());
    // The run measured what it claims: the steady clients, serve, and the cluster-wide counts.
    for want in
        ["chaos-client h1.1", "chaos-client h4.1", "idalloc (pid", "etcd watchers", "etcd leases"]
    {
        assert!(
            judged
                .iter()
                .any(|n| n.starts_with("rss_kib ") && n.contains(want) || n.starts_with(want)),
            "{want} was never judged: {judged:?}"
        );
    }
    assert!(load.sessions > 0 && load.abandoned > 0, "the HTTP load opened no session: {load:?}");
}
