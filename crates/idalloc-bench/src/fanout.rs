//! The service's watch fan-out: many SSE subscribers on one pool while a
//! writer changes it at a fixed rate.
//!
//! The service is the release `idalloc serve` binary as its own process on a private etcd (as
//! [`crate::serve`]). A writer does acquires and releases of fresh keys over HTTP at a fixed rate
//! (each is one change: an `upsert`, then a `delete` when the last release reclaims the binding)
//! and notes when each answer arrived (the commit as the writer saw it). Subscribers are raw TCP
//! connections from this process, each sending one `GET /v1/pools/bench/watch` and reading the
//! stream with a minimal line parser (no HTTP client per subscriber, so 5,000 of them are cheap
//! here), on a runtime of their own (`readers_runtime`): every subscriber counts its `data:`
//! lines; a sample of them also notes when each event arrived, so the delivery latency is
//! receipt minus the writer's commit time of the same change.
//!
//! Subscribers are added level by level (1, 100, 1,000, 5,000) without closing earlier ones, so
//! the service's resident memory only grows and the figure per subscriber is the growth over the
//! baseline (the hub warm, its ring full, no subscriber) divided by the subscribers. Then the
//! subscribers go and acquires per second at 64 clients are measured without any, and again with
//! 1,000 attached (which then receive every one of those changes).

use std::collections::HashMap;
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use hyper::Method;
use idalloc_testkit::etcd::EtcdServer;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::task::JoinHandle;

use crate::serve::{http_run, start_service, Conn};
use crate::stats::{cpu_secs, ms, Run};

const POOL: &str = "bench";
const HOLDER: &str = "bench";
/// Changes per second the writer aims at.
pub const RATE: u64 = 1000;
/// Writer connections sharing [`RATE`] (each one request at a time).
const WRITERS: u64 = 16;
/// Subscriber counts, in the order they are reached.
pub const LEVELS: [usize; 4] = [1, 100, 1000, 5000];
/// Subscribers attached during the acquire comparison.
pub const ATTACHED: usize = 1000;
/// Acquire/release loops in the acquire comparison.
const CLIENTS: usize = 64;
/// Idle connections opened to measure a connection's own memory.
const IDLE: usize = 1000;
/// A subscriber's read buffer.
const READ_BUF: usize = 64 * 1024;
/// Subscribers being set up at once.
const OPENING: usize = 64;
/// The service's default watch history (`--watch-history`): the writer runs this many changes
/// before the baseline so that the ring is full at every measurement.
const HISTORY: u64 = 10_000;

/// One subscriber count.
#[derive(Debug, Default)]
pub struct Level {
    pub subscribers: usize,
    /// Changes the writer made per second during the window.
    pub changes_per_sec: f64,
    /// `data:` lines all subscribers received per second during the window.
    pub delivered_per_sec: f64,
    /// Receipt minus commit, over the sampled subscribers' events in the window.
    pub latency: Run,
    pub rss: u64,
    pub etcd_watchers: Option<f64>,
    /// Subscribers ended by the service (a `lagged` or other `error` event) so far.
    pub ended: usize,
    /// Cores busy during the window: (harness, service, etcd).
    pub cpu: Cores,
}

/// Cores busy over a window (CPU seconds per second): the harness (writer and subscribers), the
/// service and etcd. They share the machine's cores, so a missed rate is explained by these.
#[derive(Clone, Copy, Debug, Default)]
pub struct Cores {
    pub harness: f64,
    pub service: f64,
    pub etcd: f64,
}

impl Cores {
    fn sample(service: u32, etcd: Option<u32>) -> [Option<f64>; 3] {
        let f = |p: Option<String>| p.and_then(|p| cpu_secs(&p, false));
        [f(Some("self".into())), f(Some(service.to_string())), f(etcd.map(|p| p.to_string()))]
    }

    fn between(a: [Option<f64>; 3], b: [Option<f64>; 3], secs: f64) -> Cores {
        let d = |i: usize| b[i].zip(a[i]).map_or(f64::NAN, |(b, a)| (b - a) / secs);
        Cores { harness: d(0), service: d(1), etcd: d(2) }
    }

    fn cell(&self) -> String {
        format!("{:.2} / {:.2} / {:.2}", self.harness, self.service, self.etcd)
    }
}

#[derive(Debug, Default)]
pub struct FanoutFigures {
    pub baseline_rss: u64,
    pub baseline_watchers: Option<f64>,
    pub levels: Vec<Level>,
    pub without: Option<(Run, Cores)>,
    pub with: Option<(Run, Cores)>,
    /// Without subscribers again, after `with`: the same service and etcd later on (etcd's
    /// keyspace only grows during the run), so a ratio that owes something to the order of the
    /// rows shows as a difference between `without` and this.
    pub again: Option<(Run, Cores)>,
    /// RSS growth per idle keep-alive HTTP/1.1 connection (one `GET /healthz` each) on a fresh
    /// service: what a connection costs before any watch stream.
    pub idle_connection: Option<f64>,
    pub window: f64,
    pub errors: Vec<String>,
}

impl FanoutFigures {
    fn per_subscriber(&self, l: &Level) -> f64 {
        (l.rss as f64 - self.baseline_rss as f64) / l.subscribers as f64
    }

    /// Acquires per second with [`ATTACHED`] subscribers over without.
    pub fn ratio(&self) -> Option<f64> {
        let (w, wo) = (&self.with.as_ref()?.0, &self.without.as_ref()?.0);
        (wo.throughput() > 0.0).then(|| w.throughput() / wo.throughput())
    }

    pub fn targets(&self) -> Vec<String> {
        let mut t = Vec::new();
        if let Some(l) = self.levels.iter().find(|l| l.subscribers == 1000) {
            let kb = self.per_subscriber(l) / 1000.0;
            let met = if kb <= 20.0 { "met" } else { "MISSED" };
            t.push(format!("memory per subscriber at 1,000: {kb:.1} KB (target <= 20 KB): {met}"));
        }
        if let (Some(l), Some(b)) = (self.levels.last(), self.baseline_watchers) {
            if let Some(w) = l.etcd_watchers {
                // The baseline already has the pool's own watch (its hub is running).
                let met = if w <= b { "met" } else { "MISSED" };
                t.push(format!(
                    "etcd watchers with {} subscribers: {w:.0}, {b:.0} with none (target: one for the pool, none per subscriber): {met}",
                    l.subscribers
                ));
            }
        }
        if let Some(x) = self.ratio() {
            let met = if x >= 0.8 { "met" } else { "MISSED" };
            t.push(format!(
                "acquires at {CLIENTS} clients with {ATTACHED} subscribers vs without: {x:.2}x (target >= 0.8x): {met}"
            ));
        }
        if let (Some((w, _)), Some((a, _))) = (&self.with, &self.again) {
            if a.throughput() > 0.0 {
                t.push(format!(
                    "the same against the run without subscribers after it: {:.2}x",
                    w.throughput() / a.throughput()
                ));
            }
        }
        t
    }

    pub fn markdown(&self) -> String {
        use std::fmt::Write as _;
        let mut s = String::new();
        let _ = writeln!(s, "\n## Watch fan-out\n");
        let _ = writeln!(s, "Subscribers are raw TCP connections from the harness, each one `GET /v1/pools/{POOL}/watch` read with a minimal SSE line parser on a tokio runtime (one thread) of their own, apart from the writer and the acquire loops; they are added level by level without closing earlier ones. Meanwhile a writer ({WRITERS} keep-alive connections) acquires and releases fresh keys at a fixed rate of {RATE} changes/s (each acquire is an `upsert`, each release that reclaims a `delete`). Windows of {:.1} s. *Delivered*: `data:` lines received by all subscribers per second (ideal: changes/s × subscribers). *Latency*: receipt by a subscriber minus the moment the writer got the answer of the same change, over a sample of the subscribers (the first 20 and every 100th); an event that arrives before the writer's answer counts as 0. *Memory per subscriber*: growth of the `serve` process's VmRSS (`/proc/PID/status`) over the baseline ({:.1} MB: hub warm, its {HISTORY}-change ring full, no subscriber) divided by the subscribers. *etcd watchers*: etcd's own `etcd_debugging_mvcc_watcher_total` (all the service's watches; {} before any subscriber).\n",
            self.window,
            self.baseline_rss as f64 / 1e6,
            self.baseline_watchers.map_or("unknown".into(), |w| format!("{w:.0}")));
        let _ = writeln!(s, "| subscribers | changes/s | delivered events/s | delivered / ideal | p50 ms | p99 ms | latency samples | RSS MB | memory per subscriber | etcd watchers | ended by the service | cores: harness / serve / etcd |");
        let _ = writeln!(s, "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|");
        for l in &self.levels {
            let ideal = l.changes_per_sec * l.subscribers as f64;
            let share = if ideal > 0.0 {
                format!("{:.2}", l.delivered_per_sec / ideal)
            } else {
                "-".into()
            };
            let _ = writeln!(
                s,
                "| {} | {:.0} | {:.0} | {share} | {} | {} | {} | {:.1} | {:.1} KB | {} | {} | {} |",
                l.subscribers,
                l.changes_per_sec,
                l.delivered_per_sec,
                ms(l.latency.percentile(0.5)),
                ms(l.latency.percentile(0.99)),
                l.latency.lat.len(),
                l.rss as f64 / 1e6,
                self.per_subscriber(l) / 1000.0,
                l.etcd_watchers.map_or("-".into(), |w| format!("{w:.0}")),
                l.ended,
                l.cpu.cell(),
            );
        }
        let _ = writeln!(s, "\n### Acquires with subscribers attached\n\nAcquire then release of fresh keys over HTTP (as in the table above), {CLIENTS} clients, the same service: with no subscriber, then with {ATTACHED} subscribers on the pool (each receives every change those acquires and releases make; they count every event, none times it), then with none again (once they are closed).\n");
        let _ = writeln!(s, "| subscribers | ops/s | p50 ms | p99 ms | failed | cores: harness / serve / etcd |\n|---:|---:|---:|---:|---:|---:|");
        let rows = [
            ("0".to_string(), &self.without),
            (ATTACHED.to_string(), &self.with),
            ("0 (again, after)".to_string(), &self.again),
        ];
        for (n, r) in rows {
            if let Some((r, cpu)) = r {
                let _ = writeln!(
                    s,
                    "| {n} | {:.0} | {} | {} | {} | {} |",
                    r.throughput(),
                    ms(r.percentile(0.5)),
                    ms(r.percentile(0.99)),
                    r.failures,
                    cpu.cell()
                );
            }
        }
        if let Some(b) = self.idle_connection {
            let _ = writeln!(s, "\nFor comparison, an idle keep-alive HTTP/1.1 connection (one `GET /healthz`, then nothing) grows a fresh service's VmRSS by {:.1} KB ({IDLE} connections).", b / 1000.0);
        }
        let _ = writeln!(s);
        for t in self.targets() {
            let _ = writeln!(s, "- {t}");
        }
        for e in &self.errors {
            let _ = writeln!(s, "\nError: {e}");
        }
        s
    }
}

/// The resident set of process `pid` in bytes (`VmRSS` of `/proc/PID/status`).
pub fn vm_rss(pid: u32) -> Option<u64> {
    status_bytes(&pid.to_string(), "VmRSS:")
}

/// A `kB` field of `/proc/<pid>/status` (`pid` may be `self`), in bytes: the resident size
/// (`VmRSS:`) or its peak (`VmHWM:`).
pub fn status_bytes(pid: &str, field: &str) -> Option<u64> {
    use idalloc_testkit::procs::{memory, Proc};
    let p = if pid == "self" { Proc::Myself } else { Proc::Pid(pid.parse().ok()?) };
    let m = memory(p)?;
    match field {
        "VmRSS:" => Some(m.rss),
        "VmHWM:" => Some(m.peak),
        _ => None,
    }
}

/// This process's soft open-files limit (Linux), to refuse a run that would run out of them.
fn open_files_limit() -> Option<u64> {
    let text = std::fs::read_to_string("/proc/self/limits").ok()?;
    let line = text.lines().find(|l| l.starts_with("Max open files"))?;
    line.split_whitespace().nth(3)?.parse().ok()
}

/// etcd's count of its watchers, from its own `/metrics`.
async fn etcd_watchers(endpoint: &str) -> Option<f64> {
    let host = endpoint.strip_prefix("http://")?;
    let mut c = Conn::open(host).await.ok()?;
    let body = c.call(Method::GET, "/metrics", String::new()).await.ok()?;
    let text = String::from_utf8_lossy(&body);
    ["etcd_debugging_mvcc_watcher_total ", "etcd_mvcc_watcher_total "]
        .iter()
        .find_map(|name| text.lines().find_map(|l| l.strip_prefix(name)))
        .and_then(|v| v.trim().parse().ok())
}

/// A change as both ends name it: (`true` for an upsert, the key).
type Change = (bool, String);

/// What the writer saw: when each change's answer arrived, and how many changes it made.
#[derive(Default)]
struct Commits {
    at: Mutex<HashMap<Change, Instant>>,
    count: AtomicU64,
}

/// The writer: [`WRITERS`] loops, each one request per tick, together [`RATE`] changes/s.
fn writer(addr: Arc<String>, commits: Arc<Commits>, stop: Arc<AtomicBool>) -> Vec<JoinHandle<()>> {
    (0..WRITERS)
        .map(|w| {
            let (addr, commits, stop) = (addr.clone(), commits.clone(), stop.clone());
            tokio::spawn(async move {
                let Ok(mut c) = Conn::open(&addr).await else { return };
                let mut tick =
                    tokio::time::interval(Duration::from_micros(1_000_000 * WRITERS / RATE));
                tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
                let mut i = 0u64;
                while !stop.load(Ordering::Relaxed) {
                    let key = format!("fan-{w}-{}", i / 2);
                    let upsert = i % 2 == 0;
                    i += 1;
                    tick.tick().await;
                    let path = if upsert { "acquire" } else { "release" };
                    let body = serde_json::json!({"key": key, "holder": HOLDER}).to_string();
                    let path = format!("/v1/pools/{POOL}/{path}");
                    if c.call(Method::POST, &path, body).await.is_ok() {
                        let now = Instant::now();
                        commits.count.fetch_add(1, Ordering::Relaxed);
                        if let Ok(mut at) = commits.at.lock() {
                            at.insert((upsert, key), now);
                        }
                    }
                }
            })
        })
        .collect()
}

/// One subscriber's counters, shared with the harness.
#[derive(Default)]
struct Tally {
    /// `data:` lines received.
    events: AtomicU64,
    /// Set once the stream's `synced` arrived (or it failed: see `ended`).
    ready: AtomicBool,
    /// Set when the service ended the stream (an `error` event) or the connection closed.
    ended: AtomicBool,
    /// Receipts, for a sampled subscriber.
    receipts: Mutex<Vec<(Change, Instant)>>,
}

/// One subscriber: a raw HTTP/1.1 request and a line parser over the chunked SSE body (chunk
/// sizes come on lines of their own, which the parser ignores, as it does the response head).
async fn subscribe(
    addr: Arc<String>,
    tally: Arc<Tally>,
    sampled: bool,
    gate: Arc<tokio::sync::Semaphore>,
) {
    let permit = gate.acquire_owned().await.ok();
    let done = |t: &Tally| {
        t.ended.store(true, Ordering::Relaxed);
        t.ready.store(true, Ordering::Relaxed);
    };
    let Ok(mut tcp) = tokio::net::TcpStream::connect(addr.as_str()).await else {
        return done(&tally);
    };
    let req = format!(
        "GET /v1/pools/{POOL}/watch HTTP/1.1\r\nHost: {addr}\r\nAccept: text/event-stream\r\n\r\n"
    );
    if tcp.write_all(req.as_bytes()).await.is_err() {
        return done(&tally);
    }
    let mut permit = permit;
    // One read takes a whole wake-up's frame (tens of KB at 1,000 subscribers of a busy pool),
    // not a few 8 KiB reads of it: each read is a system call on the cores the service uses.
    let mut buf = vec![0u8; READ_BUF];
    let mut counter = LineCounter::new();
    let mut line: Vec<u8> = Vec::with_capacity(256);
    // The last `event:` line's kind: an upsert (`true`) or not.
    let mut upsert = false;
    let mut head = true;
    loop {
        let n = match tcp.read(&mut buf).await {
            Ok(0) | Err(_) => return done(&tally),
            Ok(n) => n,
        };
        let now = Instant::now();
        if head {
            head = false;
            if !buf[..n].starts_with(b"HTTP/1.1 200") {
                return done(&tally);
            }
        }
        if !sampled {
            let seen = counter.feed(&buf[..n]);
            tally.events.fetch_add(seen.events, Ordering::Relaxed);
            if seen.synced && permit.is_some() {
                tally.ready.store(true, Ordering::Relaxed);
                drop(permit.take());
            }
            if seen.error {
                tally.ended.store(true, Ordering::Relaxed);
            }
            continue;
        }
        let mut events = 0;
        for &b in &buf[..n] {
            if b != b'\n' {
                line.push(b);
                continue;
            }
            if let Some(data) = line.strip_prefix(b"data: ") {
                events += 1;
                if let Some(key) = key_of(data) {
                    if let Ok(mut r) = tally.receipts.lock() {
                        r.push(((upsert, key), now));
                    }
                }
            } else if line.starts_with(b"event: ") {
                upsert = line == b"event: upsert";
                if line.starts_with(b"event: synced") {
                    tally.ready.store(true, Ordering::Relaxed);
                    drop(permit.take());
                } else if line.starts_with(b"event: error") {
                    tally.ended.store(true, Ordering::Relaxed);
                }
            }
            line.clear();
        }
        tally.events.fetch_add(events, Ordering::Relaxed);
    }
}

/// What a read's whole lines held.
#[derive(Debug, Default, PartialEq, Eq)]
struct Seen {
    /// `data: ` lines.
    events: u64,
    synced: bool,
    error: bool,
}

/// Counts an unsampled subscriber's `data: ` lines over reads cut anywhere, with a SIMD search
/// (cheap enough for 5,000 subscribers on the cores the service uses too) where the bytes were
/// read: only a partial last line is kept (`carry`), to be completed by the next read.
struct LineCounter {
    carry: Vec<u8>,
    data: memchr::memmem::Finder<'static>,
    synced: memchr::memmem::Finder<'static>,
    error: memchr::memmem::Finder<'static>,
}

impl LineCounter {
    fn new() -> Self {
        LineCounter {
            carry: Vec::new(),
            data: memchr::memmem::Finder::new(b"data: "),
            synced: memchr::memmem::Finder::new(b"event: synced"),
            error: memchr::memmem::Finder::new(b"event: error"),
        }
    }

    /// The whole lines `chunk` completes (a partial last one waits for the next chunk).
    fn feed(&mut self, chunk: &[u8]) -> Seen {
        let mut seen = Seen::default();
        let end = memchr::memrchr(b'\n', chunk).map_or(0, |i| i + 1);
        let mut whole = &chunk[..end];
        if end > 0 && !self.carry.is_empty() {
            // The carried partial line ends with this chunk's first line.
            let first = memchr::memchr(b'\n', whole).map_or(0, |i| i + 1);
            self.carry.extend_from_slice(&whole[..first]);
            let carry = std::mem::take(&mut self.carry);
            self.scan(&carry, &mut seen);
            self.carry = carry;
            self.carry.clear();
            whole = &whole[first..];
        }
        self.scan(whole, &mut seen);
        self.carry.extend_from_slice(&chunk[end..]);
        seen
    }

    fn scan(&self, lines: &[u8], seen: &mut Seen) {
        seen.events += self.data.find_iter(lines).count() as u64;
        seen.synced |= self.synced.find(lines).is_some();
        seen.error |= self.error.find(lines).is_some();
    }
}

/// The key of `{"id":N,"key":"K","revision":R}`: the text between `"key":"` and the next quote
/// (the service writes compact JSON), parsed as JSON only if it holds an escape.
fn key_of(data: &[u8]) -> Option<String> {
    const FIELD: &[u8] = b"\"key\":\"";
    let at = memchr::memmem::find(data, FIELD)? + FIELD.len();
    let len = memchr::memchr(b'"', &data[at..])?;
    let raw = &data[at..at + len];
    if !raw.contains(&b'\\') {
        return String::from_utf8(raw.to_vec()).ok();
    }
    let v: serde_json::Value = serde_json::from_slice(data).ok()?;
    Some(v.get("key")?.as_str()?.to_string())
}

struct Subscribers {
    handles: Vec<JoinHandle<()>>,
    tallies: Vec<(bool, Arc<Tally>)>,
    /// The runtime their readers run on (see [`readers_runtime`]).
    rt: tokio::runtime::Handle,
    /// Whether some of them note when each event arrives (for the latency); all of them count
    /// every event either way.
    sample: bool,
}

/// The subscribers' readers get a runtime (one thread) of their own, apart from the writer and
/// the acquire loops: on one runtime, a socket of an acquire loop turning readable waited in the
/// run queue behind every subscriber woken before it (1,000 after each of the service's
/// wake-ups), which slowed the acquires the comparison measures by the harness's own queue, not
/// the service. Subscribers on other machines, as they would be, share no queue with those
/// clients; here they still share the cores, and still read and count every event.
fn readers_runtime() -> Result<tokio::runtime::Runtime, String> {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .thread_name("subscribers")
        .enable_all()
        .build()
        .map_err(|e| format!("cannot start the subscribers' runtime: {e}"))
}

impl Subscribers {
    fn new(rt: &tokio::runtime::Runtime, sample: bool) -> Self {
        Subscribers { handles: Vec::new(), tallies: Vec::new(), rt: rt.handle().clone(), sample }
    }

    /// Opens subscribers until there are `n`, and waits (at most `wait`) until all are ready.
    async fn grow(&mut self, addr: &Arc<String>, n: usize, wait: Duration) -> Result<(), String> {
        let gate = Arc::new(tokio::sync::Semaphore::new(OPENING));
        while self.tallies.len() < n {
            let i = self.tallies.len();
            let sampled = self.sample && (i < 20 || i % 100 == 0);
            let t = Arc::new(Tally::default());
            self.handles.push(self.rt.spawn(subscribe(
                addr.clone(),
                t.clone(),
                sampled,
                gate.clone(),
            )));
            self.tallies.push((sampled, t));
        }
        let deadline = Instant::now() + wait;
        while !self.tallies.iter().all(|(_, t)| t.ready.load(Ordering::Relaxed)) {
            if Instant::now() > deadline {
                let ready =
                    self.tallies.iter().filter(|(_, t)| t.ready.load(Ordering::Relaxed)).count();
                return Err(format!("only {ready} of {n} subscribers synced within {wait:?}"));
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        Ok(())
    }

    fn events(&self) -> u64 {
        self.tallies.iter().map(|(_, t)| t.events.load(Ordering::Relaxed)).sum()
    }

    fn ended(&self) -> usize {
        self.tallies.iter().filter(|(_, t)| t.ended.load(Ordering::Relaxed)).count()
    }

    /// Sampled receipts in `[from, to)`.
    fn receipts(&self, from: Instant, to: Instant) -> Vec<(Change, Instant)> {
        let mut out = Vec::new();
        for (_, t) in self.tallies.iter().filter(|(s, _)| *s) {
            if let Ok(r) = t.receipts.lock() {
                out.extend(r.iter().filter(|(_, at)| *at >= from && *at < to).cloned());
            }
        }
        out
    }

    fn close(self) {
        for h in self.handles {
            h.abort();
        }
    }
}

/// Receipt minus the writer's commit time of the same change, for each receipt the writer
/// recorded.
fn latencies(receipts: &[(Change, Instant)], commits: &Commits) -> Run {
    let mut run = Run::default();
    let Ok(at) = commits.at.lock() else { return run };
    for (change, got) in receipts {
        if let Some(c) = at.get(change) {
            run.lat.push(got.saturating_duration_since(*c));
            run.ops += 1;
        }
    }
    run.finish()
}

/// The whole fan-out measurement: `bin` is the `idalloc` binary (a release build for figures).
pub async fn run(bin: &Path, window: Duration) -> FanoutFigures {
    let mut f = FanoutFigures { window: window.as_secs_f64(), ..FanoutFigures::default() };
    if let Err(e) = run_into(bin, window, &mut f).await {
        f.errors.push(e);
    }
    f
}

async fn run_into(bin: &Path, window: Duration, f: &mut FanoutFigures) -> Result<(), String> {
    let most = LEVELS.iter().copied().max().unwrap_or(0) as u64;
    if let Some(n) = open_files_limit() {
        if n < most + 1024 {
            return Err(format!(
                "the open-files limit is {n}: {most} subscribers need at least {} (ulimit -n)",
                most + 1024
            ));
        }
    }
    let readers = readers_runtime()?;
    let result = measure(bin, window, f, &readers).await;
    // Not dropped here: dropping a runtime inside another one's task is refused.
    readers.shutdown_background();
    result
}

async fn measure(
    bin: &Path,
    window: Duration,
    f: &mut FanoutFigures,
    readers: &tokio::runtime::Runtime,
) -> Result<(), String> {
    let most = LEVELS.iter().copied().max().unwrap_or(0) as u64;
    let etcd = EtcdServer::start().await?;
    let cap = (most + 2000).to_string();
    let service = start_service(
        bin,
        &etcd.endpoint(),
        &[
            "--max-connections",
            cap.as_str(),
            "--max-requests",
            "100000",
            "--max-requests-per-client",
            "100000",
        ],
    )
    .await?;
    let pid = service.child.id();
    let addr = Arc::new(service.addr.clone());
    let mut admin = Conn::open(&addr).await?;
    let spec = serde_json::json!({"name": POOL, "min": 1, "max": 1_000_000}).to_string();
    admin.call(Method::POST, "/v1/pools", spec).await?;

    // One stream starts the pool's hub (it stays while the pool is served); then it goes.
    let mut subs = Subscribers::new(readers, true);
    subs.grow(&addr, 1, Duration::from_secs(30)).await?;
    subs.close();

    let commits = Arc::new(Commits::default());
    let stop = Arc::new(AtomicBool::new(false));
    let writers = writer(addr.clone(), commits.clone(), stop.clone());
    // Fill the ring before the baseline (its size is then constant).
    let t0 = Instant::now();
    while commits.count.load(Ordering::Relaxed) < HISTORY + 500 {
        if t0.elapsed() > Duration::from_secs(120) {
            return Err("the writer did not fill the watch history within 120 s".into());
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    f.baseline_watchers = etcd_watchers(&etcd.endpoint()).await;
    f.baseline_rss = rss_now(pid).await?;
    println!(
        "fanout: baseline RSS {:.1} MB, etcd watchers {:?}",
        f.baseline_rss as f64 / 1e6,
        f.baseline_watchers
    );

    let mut subs = Subscribers::new(readers, true);
    for n in LEVELS {
        subs.grow(&addr, n, Duration::from_secs(180)).await?;
        tokio::time::sleep(Duration::from_secs(1)).await;
        let (e0, c0, from) = (subs.events(), commits.count.load(Ordering::Relaxed), Instant::now());
        let cpu0 = Cores::sample(pid, etcd.pid());
        tokio::time::sleep(window).await;
        let (e1, c1, to) = (subs.events(), commits.count.load(Ordering::Relaxed), Instant::now());
        let cpu = Cores::between(cpu0, Cores::sample(pid, etcd.pid()), (to - from).as_secs_f64());
        let secs = (to - from).as_secs_f64();
        let rss = rss_now(pid).await?;
        let level = Level {
            subscribers: n,
            changes_per_sec: (c1 - c0) as f64 / secs,
            delivered_per_sec: (e1 - e0) as f64 / secs,
            latency: latencies(&subs.receipts(from, to), &commits),
            rss,
            etcd_watchers: etcd_watchers(&etcd.endpoint()).await,
            ended: subs.ended(),
            cpu,
        };
        println!(
            "fanout: {n} subscribers: {:.0} changes/s, {:.0} events/s delivered, p99 {}, RSS {:.1} MB ({:.1} KB/subscriber), etcd watchers {:?}, ended {}",
            level.changes_per_sec,
            level.delivered_per_sec,
            ms(level.latency.percentile(0.99)),
            rss as f64 / 1e6,
            (rss as f64 - f.baseline_rss as f64) / n as f64 / 1000.0,
            level.etcd_watchers,
            level.ended
        );
        f.levels.push(level);
    }
    subs.close();
    stop.store(true, Ordering::Relaxed);
    for w in writers {
        let _ = w.await;
    }

    // Acquires at 64 clients, without subscribers and with 1,000.
    tokio::time::sleep(Duration::from_secs(1)).await;
    let timed = |tag: &'static str| {
        let addr = addr.clone();
        let etcd_pid = etcd.pid();
        async move {
            let (cpu0, t0) = (Cores::sample(pid, etcd_pid), Instant::now());
            let r = http_run(addr, CLIENTS, window, tag.into()).await;
            let cpu =
                Cores::between(cpu0, Cores::sample(pid, etcd_pid), t0.elapsed().as_secs_f64());
            (r, cpu)
        }
    };
    let without = timed("fan-without").await;
    println!(
        "fanout: {CLIENTS} clients, no subscriber: {:.0} ops/s, cores {}",
        without.0.throughput(),
        without.1.cell()
    );
    // No latency is taken here: the subscribers count every event, none notes when it came.
    let mut subs = Subscribers::new(readers, false);
    subs.grow(&addr, ATTACHED, Duration::from_secs(180)).await?;
    let with = timed("fan-with").await;
    println!(
        "fanout: {CLIENTS} clients, {ATTACHED} subscribers: {:.0} ops/s, cores {} ({} subscribers ended)",
        with.0.throughput(),
        with.1.cell(),
        subs.ended()
    );
    subs.close();
    tokio::time::sleep(Duration::from_secs(1)).await;
    let again = timed("fan-again").await;
    println!(
        "fanout: {CLIENTS} clients, no subscriber again: {:.0} ops/s, cores {}",
        again.0.throughput(),
        again.1.cell()
    );
    f.without = Some(without);
    f.with = Some(with);
    f.again = Some(again);
    drop(service);

    // What an idle connection costs on its own, on a fresh service.
    let service =
        start_service(bin, &etcd.endpoint(), &["--max-connections", cap.as_str()]).await?;
    let pid = service.child.id();
    tokio::time::sleep(Duration::from_secs(1)).await;
    let before = rss_now(pid).await?;
    let mut idle = Vec::with_capacity(IDLE);
    for _ in 0..IDLE {
        let mut c = Conn::open(&service.addr).await?;
        c.call(Method::GET, "/healthz", String::new()).await?;
        idle.push(c);
    }
    let after = rss_now(pid).await?;
    f.idle_connection = Some((after as f64 - before as f64) / IDLE as f64);
    println!(
        "fanout: idle connection: {:.1} KB each",
        (after as f64 - before as f64) / IDLE as f64 / 1000.0
    );
    drop(idle);
    drop(service);
    Ok(())
}

/// The service's RSS, the median of five readings 200 ms apart (the writer keeps it moving a
/// little).
async fn rss_now(pid: u32) -> Result<u64, String> {
    let mut v = Vec::new();
    for _ in 0..5 {
        v.push(vm_rss(pid).ok_or("cannot read the service's VmRSS")?);
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    v.sort_unstable();
    Ok(v[2])
}

#[cfg(test)]
mod tests {
    use super::{key_of, status_bytes, LineCounter, Seen};

    #[test]
    fn every_data_line_is_counted_wherever_the_reads_cut_the_stream() {
        let stream = "HTTP/1.1 200 OK\r\n\r\n3a\r\nevent: upsert\ndata: {\"id\":1,\"key\":\"a\",\"revision\":5}\n\n\
                      id: 5\nevent: synced\ndata: {\"revision\":5,\"bindings\":1}\n\n\
                      event: delete\ndata: {\"id\":1,\"key\":\"a\",\"revision\":6}\n\n\
                      event: error\ndata: {\"kind\":\"lagged\"}\n\n";
        let bytes = stream.as_bytes();
        let whole = LineCounter::new().feed(bytes);
        assert_eq!(whole, Seen { events: 4, synced: true, error: true });
        for size in 1..=bytes.len() {
            let mut c = LineCounter::new();
            let mut total = Seen::default();
            for chunk in bytes.chunks(size) {
                let s = c.feed(chunk);
                total.events += s.events;
                total.synced |= s.synced;
                total.error |= s.error;
            }
            assert_eq!(total, whole, "reads of {size} bytes");
        }
    }

    #[test]
    fn the_key_is_read_as_is_and_through_json_when_escaped() {
        assert_eq!(
            key_of(br#"{"id":1,"key":"fan-3-17","revision":9}"#).as_deref(),
            Some("fan-3-17")
        );
        assert_eq!(key_of(br#"{"id":1,"key":"a\"b","revision":9}"#).as_deref(), Some("a\"b"));
        assert_eq!(key_of(br#"{"revision":9,"bindings":3}"#), None);
    }

    #[test]
    fn status_fields_are_read_in_bytes_and_a_missing_one_is_none() {
        let rss = status_bytes("self", "VmRSS:").expect("this process's VmRSS");
        let peak = status_bytes("self", "VmHWM:").expect("this process's VmHWM");
        assert!(rss > 0 && rss % 1024 == 0 && peak >= rss, "rss {rss}, peak {peak}");
        assert_eq!(status_bytes("self", "NoSuchField:"), None);
    }
}
