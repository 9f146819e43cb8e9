//! `idalloc serve` over HTTP against the library, on one etcd, in one run.
//!
//! The service is the real release binary (`idalloc serve`, its own process, as deployed) on a
//! private etcd on loopback; the library is an [`Allocator`] in this process on the same etcd
//! (another prefix, so neither sees the other's keys). Both do the same work: for a fresh key,
//! acquire it for a durable holder, then release it (the last release reclaims the binding), in
//! `clients` concurrent loops. Over HTTP each loop is one client with its own keep-alive
//! connection (HTTP/1.1, `TCP_NODELAY`), sending one request at a time, as an agent would.
//!
//! Then cached lookups (`GET /v1/pools/{pool}/keys/{key}`, served from the watch-fed cache with
//! no store round trip) of keys bound beforehand: requests per second and latency percentiles.

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::header::{CONTENT_TYPE, HOST};
use hyper::{Method, Request};
use hyper_util::rt::TokioIo;
use idalloc::{Allocator, AllocatorOptions, Pool, PoolSpec};
use idalloc_testkit::etcd::EtcdServer;

use crate::contender::RANGE;
use crate::scenarios::key;
use crate::stats::{ms, Run};

const POOL: &str = "bench";
const HOLDER: &str = "bench";
/// Keys bound before the lookup runs (at most one HTTP request's worth).
const LOOKUP_KEYS: usize = 1000;

/// One concurrency level: the library and the service doing the same work.
#[derive(Debug)]
pub struct Row {
    pub clients: usize,
    pub library: Run,
    pub http: Run,
}

/// Everything measured.
#[derive(Debug, Default)]
pub struct ServeFigures {
    pub rows: Vec<Row>,
    /// Cached lookups over HTTP by number of clients.
    pub lookups: Vec<(usize, Run)>,
    pub errors: Vec<String>,
}

impl ServeFigures {
    /// HTTP throughput over the library's at `clients`.
    pub fn ratio(&self, clients: usize) -> Option<f64> {
        let r = self.rows.iter().find(|r| r.clients == clients)?;
        (r.library.throughput() > 0.0).then(|| r.http.throughput() / r.library.throughput())
    }

    pub fn target(&self) -> String {
        match self.ratio(64) {
            Some(x) => format!(
                "HTTP vs library acquire+release at 64 clients: {x:.2}x (target >= 0.8x): {}",
                if x >= 0.8 { "met" } else { "MISSED" }
            ),
            None => "HTTP vs library at 64 clients: not measured".into(),
        }
    }

    pub fn markdown(&self) -> String {
        use std::fmt::Write as _;
        let mut s = String::new();
        let _ = writeln!(s, "\n## HTTP service against the library (`idalloc serve`)\n");
        let _ = writeln!(s, "For a fresh key: acquire for a durable holder, then release (the last release reclaims the binding); each counts as one operation. The library: `Pool::acquire_durable` / `release_durable` in the harness's process. HTTP: the release `idalloc serve` binary as its own process, `POST /v1/pools/bench/acquire` and `/release` with `{{\"key\", \"holder\"}}`, one keep-alive HTTP/1.1 connection per client, one request at a time. Same etcd (one member on loopback, started by the harness), different prefixes; the client, the service and etcd share the machine's cores.\n");
        let _ = writeln!(s, "| clients | library ops/s | library p50 ms | library p99 ms | HTTP ops/s | HTTP p50 ms | HTTP p99 ms | HTTP / library |");
        let _ = writeln!(s, "|---:|---:|---:|---:|---:|---:|---:|---:|");
        for r in &self.rows {
            let ratio = if r.library.throughput() > 0.0 {
                format!("{:.2}x", r.http.throughput() / r.library.throughput())
            } else {
                "-".into()
            };
            let _ = writeln!(
                s,
                "| {} | {:.0} | {} | {} | {:.0} | {} | {} | {ratio} |",
                r.clients,
                r.library.throughput(),
                ms(r.library.percentile(0.5)),
                ms(r.library.percentile(0.99)),
                r.http.throughput(),
                ms(r.http.percentile(0.5)),
                ms(r.http.percentile(0.99)),
            );
        }
        let failures: u64 = self.rows.iter().map(|r| r.library.failures + r.http.failures).sum();
        let _ = writeln!(s, "\nFailed operations: {failures}. {}\n", self.target());
        let _ = writeln!(s, "### Cached lookups over HTTP\n\n`GET /v1/pools/bench/keys/{{key}}` of {LOOKUP_KEYS} keys bound beforehand, answered from the service's watch-fed cache (no store round trip).\n");
        let _ = writeln!(s, "| clients | requests/s | p50 ms | p99 ms |\n|---:|---:|---:|---:|");
        for (c, r) in &self.lookups {
            let _ = writeln!(
                s,
                "| {c} | {:.0} | {} | {} |",
                r.throughput(),
                ms(r.percentile(0.5)),
                ms(r.percentile(0.99))
            );
        }
        for e in &self.errors {
            let _ = writeln!(s, "\nError: {e}");
        }
        s
    }
}

/// A running `idalloc serve`, killed (by PID) on drop.
pub(crate) struct Service {
    pub(crate) child: Child,
    pub(crate) addr: String,
}

impl Drop for Service {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Starts the service on a free loopback port; `extra`: more `serve` flags.
pub(crate) async fn start_service(
    bin: &Path,
    etcd: &str,
    extra: &[&str],
) -> Result<Service, String> {
    let child = Command::new(bin)
        .args(["--endpoints", etcd, "--prefix", "bench-http", "--timeout", "10s", "serve"])
        .args(["--listen", "127.0.0.1:0", "--sweep-interval", "1h"])
        .args(extra)
        .env("RUST_LOG", "warn")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .map_err(|e| format!("cannot start {}: {e}", bin.display()))?;
    let mut service = Service { child, addr: String::new() };
    let stdout = service.child.stdout.take().ok_or("no stdout")?;
    // The first line says where it listens; a serve that fails exits, which ends the read.
    let mut line = String::new();
    let _ = std::io::BufRead::read_line(&mut std::io::BufReader::new(stdout), &mut line);
    service.addr = line
        .trim()
        .strip_prefix("listening on ")
        .ok_or_else(|| format!("serve did not print its address (got {line:?})"))?
        .to_string();
    Ok(service)
}

/// One keep-alive HTTP/1.1 connection, one request at a time.
pub(crate) struct Conn {
    sender: hyper::client::conn::http1::SendRequest<Full<Bytes>>,
    host: String,
}

impl Conn {
    pub(crate) async fn open(addr: &str) -> Result<Conn, String> {
        let tcp =
            tokio::net::TcpStream::connect(addr).await.map_err(|e| format!("connect: {e}"))?;
        tcp.set_nodelay(true).map_err(|e| e.to_string())?;
        let (sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(tcp))
            .await
            .map_err(|e| format!("handshake: {e}"))?;
        tokio::spawn(async move {
            let _ = conn.await;
        });
        Ok(Conn { sender, host: addr.to_string() })
    }

    pub(crate) async fn call(
        &mut self,
        method: Method,
        path: &str,
        body: String,
    ) -> Result<Bytes, String> {
        self.sender.ready().await.map_err(|e| e.to_string())?;
        let req = Request::builder()
            .method(method)
            .uri(path)
            .header(HOST, &self.host)
            .header(CONTENT_TYPE, "application/json")
            .body(Full::new(Bytes::from(body)))
            .map_err(|e| e.to_string())?;
        let resp = self.sender.send_request(req).await.map_err(|e| e.to_string())?;
        let status = resp.status();
        let body = resp.into_body().collect().await.map_err(|e| e.to_string())?.to_bytes();
        if !status.is_success() {
            return Err(format!("{path}: {status}: {}", String::from_utf8_lossy(&body)));
        }
        Ok(body)
    }
}

fn body(k: &str) -> String {
    serde_json::json!({ "key": k, "holder": HOLDER }).to_string()
}

/// Runs `clients` loops until `dur` has passed; each loop gets its index and returns its
/// latencies and failures.
async fn loops<F, Fut>(clients: usize, dur: Duration, f: F) -> Run
where
    F: Fn(usize, Instant) -> Fut,
    Fut: std::future::Future<Output = (Vec<Duration>, u64)> + Send + 'static,
{
    let start = Instant::now();
    let deadline = start + dur;
    let handles: Vec<_> = (0..clients).map(|t| tokio::spawn(f(t, deadline))).collect();
    let mut run = Run::default();
    for h in handles {
        if let Ok((lat, failures)) = h.await {
            run.ops += lat.len() as u64;
            run.lat.extend(lat);
            run.failures += failures;
        }
    }
    run.secs = start.elapsed().as_secs_f64();
    run.finish()
}

async fn library_run(pool: Arc<Pool>, clients: usize, dur: Duration, tag: String) -> Run {
    loops(clients, dur, move |t, deadline| {
        let pool = pool.clone();
        let tag = tag.clone();
        async move {
            let (mut lat, mut failures, mut i) = (Vec::new(), 0u64, 0);
            while Instant::now() < deadline {
                let k = key(&tag, 0, t, i);
                i += 1;
                let t0 = Instant::now();
                if pool.acquire_durable(&k, HOLDER).await.is_err() {
                    failures += 1;
                    continue;
                }
                lat.push(t0.elapsed());
                let t1 = Instant::now();
                match pool.release_durable(&k, HOLDER).await {
                    Ok(_) => lat.push(t1.elapsed()),
                    Err(_) => failures += 1,
                }
            }
            (lat, failures)
        }
    })
    .await
}

pub(crate) async fn http_run(addr: Arc<String>, clients: usize, dur: Duration, tag: String) -> Run {
    loops(clients, dur, move |t, deadline| {
        let addr = addr.clone();
        let tag = tag.clone();
        async move {
            let (mut lat, mut failures, mut i) = (Vec::new(), 0u64, 0);
            let Ok(mut c) = Conn::open(&addr).await else { return (lat, 1) };
            let acquire = format!("/v1/pools/{POOL}/acquire");
            let release = format!("/v1/pools/{POOL}/release");
            while Instant::now() < deadline {
                let k = key(&tag, 0, t, i);
                i += 1;
                let t0 = Instant::now();
                if c.call(Method::POST, &acquire, body(&k)).await.is_err() {
                    failures += 1;
                    match Conn::open(&addr).await {
                        Ok(n) => c = n,
                        Err(_) => return (lat, failures),
                    }
                    continue;
                }
                lat.push(t0.elapsed());
                let t1 = Instant::now();
                match c.call(Method::POST, &release, body(&k)).await {
                    Ok(_) => lat.push(t1.elapsed()),
                    Err(_) => failures += 1,
                }
            }
            (lat, failures)
        }
    })
    .await
}

async fn lookup_run(
    addr: Arc<String>,
    keys: Arc<Vec<String>>,
    clients: usize,
    dur: Duration,
) -> Run {
    loops(clients, dur, move |t, deadline| {
        let addr = addr.clone();
        let keys = keys.clone();
        async move {
            let (mut lat, mut failures, mut i) = (Vec::new(), 0u64, t * 7919);
            let Ok(mut c) = Conn::open(&addr).await else { return (lat, 1) };
            while Instant::now() < deadline {
                let path = format!("/v1/pools/{POOL}/keys/{}", keys[i % keys.len()]);
                i += 1;
                let t0 = Instant::now();
                match c.call(Method::GET, &path, String::new()).await {
                    Ok(_) => lat.push(t0.elapsed()),
                    Err(_) => failures += 1,
                }
            }
            (lat, failures)
        }
    })
    .await
}

/// The whole comparison: `bin` is the `idalloc` binary (a release build for figures).
pub async fn run(bin: &Path, dur: Duration, clients: &[usize]) -> ServeFigures {
    let mut f = ServeFigures::default();
    if let Err(e) = run_into(bin, dur, clients, &mut f).await {
        f.errors.push(e);
    }
    f
}

async fn run_into(
    bin: &Path,
    dur: Duration,
    clients: &[usize],
    f: &mut ServeFigures,
) -> Result<(), String> {
    let etcd = EtcdServer::start().await?;
    let service = start_service(bin, &etcd.endpoint(), &[]).await?;
    let addr = Arc::new(service.addr.clone());

    let store = etcd.store().await?;
    let opts =
        AllocatorOptions::builder().prefix("bench-lib").build().map_err(|e| e.to_string())?;
    let alloc = Allocator::new(store, opts).map_err(|e| e.to_string())?;
    let pool = Arc::new(
        alloc
            .ensure_pool(&PoolSpec::new(POOL, RANGE.0, RANGE.1))
            .await
            .map_err(|e| e.to_string())?,
    );
    let mut admin = Conn::open(&addr).await?;
    let spec = serde_json::json!({"name": POOL, "min": RANGE.0, "max": RANGE.1}).to_string();
    admin.call(Method::POST, "/v1/pools", spec).await?;
    // Warm both paths (pool caches, connections, etcd's first writes).
    library_run(pool.clone(), 1, Duration::from_millis(300), "warm-lib".into()).await;
    http_run(addr.clone(), 1, Duration::from_millis(300), "warm-http".into()).await;

    for &c in clients {
        let library = library_run(pool.clone(), c, dur, format!("lib{c}")).await;
        let http = http_run(addr.clone(), c, dur, format!("http{c}")).await;
        println!(
            "serve: {c} clients: library {:.0} ops/s (p99 {}), HTTP {:.0} ops/s (p99 {})",
            library.throughput(),
            ms(library.percentile(0.99)),
            http.throughput(),
            ms(http.percentile(0.99))
        );
        f.rows.push(Row { clients: c, library, http });
    }

    // A new connection: the service closes one idle longer than its --idle-timeout (60 s), which
    // `admin` may have been during the runs above.
    let mut admin = Conn::open(&addr).await?;
    let keys: Vec<String> = (0..LOOKUP_KEYS).map(|i| format!("lookup-{i}")).collect();
    let all = serde_json::json!({ "keys": keys, "holder": HOLDER }).to_string();
    admin.call(Method::POST, &format!("/v1/pools/{POOL}/acquire"), all).await?;
    // A durable acquire reaches the cache through the watch: wait until the last key is there.
    let last = format!("/v1/pools/{POOL}/keys/{}", keys[LOOKUP_KEYS - 1]);
    let deadline = Instant::now() + Duration::from_secs(10);
    while admin.call(Method::GET, &last, String::new()).await.is_err() {
        if Instant::now() > deadline {
            return Err("the bound keys never showed in the service's cache".into());
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let keys = Arc::new(keys);
    for &c in clients {
        let r = lookup_run(addr.clone(), keys.clone(), c, dur).await;
        println!(
            "serve: {c} clients: cached GET {:.0} req/s (p99 {}), {} failed",
            r.throughput(),
            ms(r.percentile(0.99)),
            r.failures
        );
        f.lookups.push((c, r));
    }
    let _ = alloc.close().await;
    drop(service);
    Ok(())
}
