//! A fleet of N agents on one pool on one etcd, each an independent instance of
//! the library as a node agent would run it: its own etcd connection (its own `etcd-client`
//! channel), its own [`Allocator`] (own session lease, holder `agent-<i>`), its own watched pool
//! cache. All agents run as tasks of this one process (one tokio runtime): what that does to the
//! figures is that the agents' CPU is this process's CPU, measured apart from etcd's, and that the
//! agents' caches add up in one address space (the resident memory per agent is reported, and is
//! what bounds N here, not etcd).
//!
//! Phases, on a fresh etcd with a pool of `bindings` bindings written straight into the store:
//! - **cold start**: every agent opens the pool at once; time until the last one is synced;
//! - **hold**: every agent acquires its `keys` keys (leased), then the time until every agent's
//!   cache has seen every other agent's keys (the watch fan-out of N·keys new bindings to N
//!   watchers);
//! - **restart storm**: every agent goes at once (a crash: its handles are dropped, no close, so
//!   its leased references stay until its lease runs out; or with `close`, a clean close that
//!   deletes them, after which a sweep reclaims the unreferenced bindings) and a new instance with
//!   the same holder restores its keys with their previous IDs as hints
//!   (`acquire_many_with_hints`); time until all are restored, IDs changed and
//!   failed calls (both must be 0);
//! - **churn**: every agent acquires and releases one new key per second, each agent at its own
//!   phase within the second.
//!
//! A probe (one more allocator on its own connection) acquires and releases a fresh key every
//! [`PROBE_EVERY`] through every phase; its p99 during the storm is one of the targets.
//! Each phase reports etcd's request counters (deltas of its `/metrics`), etcd's CPU and this
//! process's CPU from `/proc/<pid>/stat`, and the load average, since the machine is shared.

use std::collections::HashMap;
use std::io::{Read, Write};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use idalloc::store::etcd::{EtcdOptions, EtcdStore};
use idalloc::{Allocator, AllocatorOptions, Pool, PoolSpec};
use idalloc_testkit::etcd::EtcdServer;
use rand::Rng;
use tokio::task::JoinSet;

use crate::contender::{err, POOL, RANGE};
use crate::stats::{cpu_secs, load_average, resident_bytes};

/// How often the probe acquires a fresh key.
pub const PROBE_EVERY: Duration = Duration::from_millis(50);

/// One fleet run's shape.
#[derive(Clone, Debug)]
pub struct FleetOptions {
    /// Agents (independent library instances).
    pub agents: usize,
    /// Bindings in the pool before the agents start.
    pub bindings: usize,
    /// Keys each agent holds and restores in the storm.
    pub keys: usize,
    /// How long the churn phase runs.
    pub churn: Duration,
    /// Storm by clean close instead of by crash.
    pub close: bool,
    /// Each agent waits a uniform random time in `[0, jitter)` before it (re)starts, as a
    /// roll-out or a restart policy with jitter would spread them.
    pub jitter: Duration,
    /// The agents' session lease TTL (the storm restarts well within it).
    pub session_ttl: Duration,
    /// `None`: direct agents (each its own etcd client). `Some`: agents as `idalloc-client`
    /// instances against `idalloc serve` replicas ([`crate::fleet_serve`]).
    pub serve: Option<crate::fleet_serve::ServeMode>,
}

impl FleetOptions {
    /// The documented shape for `agents` on a pool of `bindings`.
    pub fn new(agents: usize, bindings: usize) -> FleetOptions {
        FleetOptions {
            agents,
            bindings,
            keys: 100,
            churn: Duration::from_secs(10),
            close: false,
            jitter: Duration::ZERO,
            session_ttl: Duration::from_secs(60),
            serve: None,
        }
    }
}

/// One sample of etcd's counters (from its `/metrics`), with the CPU of etcd, of this process and
/// of the `serve` replicas (through-serve mode), and the replicas' resident memory.
#[derive(Clone, Copy, Debug, Default)]
pub struct Counters {
    /// `grpc_server_handled_total`, all methods: requests etcd completed (a watch or keep-alive
    /// stream counts once, when it ends).
    pub grpc: f64,
    /// `etcd_debugging_mvcc_range_total`, `_txn_total`, `_put_total`, `_delete_total`.
    pub range: f64,
    pub txn: f64,
    pub put: f64,
    pub delete: f64,
    /// `etcd_network_client_grpc_sent_bytes_total`: bytes etcd sent to clients (listings and
    /// watch events are most of it).
    pub sent_bytes: f64,
    /// `etcd_debugging_mvcc_watcher_total` (a gauge).
    pub watchers: f64,
    /// CPU seconds of etcd and of this process.
    pub etcd_cpu: f64,
    pub self_cpu: f64,
    /// CPU seconds of every `serve` replica still running, summed (0 in direct mode; a replica
    /// killed in the phase drops out, so a phase with a kill under-counts by its CPU before).
    pub serve_cpu: f64,
    /// Resident bytes of the `serve` replicas, summed.
    pub serve_rss: f64,
    pub at: Option<Instant>,
    /// etcd's `/metrics` did not answer this sample: its counters above are NaN, so every figure
    /// of a phase that starts or ends here is missing ("–" in the table), not a false 0. The
    /// CPU figures come from `/proc` and stay.
    pub metrics_failed: bool,
}

/// The processes a phase is measured on: etcd's client URL and PID, and the replicas' PIDs.
#[derive(Clone, Debug, Default)]
pub struct Meter {
    pub endpoint: String,
    pub etcd_pid: Option<u32>,
    pub serve_pids: Vec<u32>,
    /// CPU seconds of replicas killed during the run, up to their kill (added to every later
    /// sample, so a phase's delta stays whole).
    pub retired_cpu: f64,
}

impl Counters {
    /// Reads etcd's `/metrics` and every CPU and memory counter of `m`'s processes.
    ///
    /// A `/metrics` read that fails (etcd busy past the read timeout under a storm) does not
    /// fail the sample: the sample says so ([`Counters::metrics_failed`]), the reason goes to
    /// the log, and the run goes on. It used to end the whole run, losing every phase measured
    /// so far (a through-serve run at 100 agents, docs/benchmarks/scale.md). `Err` only if the sampling
    /// task itself died.
    pub async fn read(m: &Meter) -> Result<Counters, String> {
        let host = m.endpoint.trim_start_matches("http://").trim_end_matches('/').to_string();
        let text = tokio::task::spawn_blocking(move || metrics_text(&host))
            .await
            .map_err(|e| err("metrics task", e))?;
        let mut c = match text {
            Ok(text) => parse_metrics(&text),
            Err(e) => {
                log(&format!(
                    "etcd's /metrics failed ({e}): this phase's etcd figures are missing"
                ));
                Counters::unread()
            }
        };
        c.etcd_cpu = m.etcd_pid.and_then(|p| cpu_secs(&p.to_string(), false)).unwrap_or(f64::NAN);
        c.self_cpu = cpu_secs("self", false).unwrap_or(f64::NAN);
        c.serve_cpu = m.retired_cpu;
        for pid in &m.serve_pids {
            c.serve_cpu += cpu_secs(&pid.to_string(), false).unwrap_or(0.0);
            let rss = crate::fanout::status_bytes(&pid.to_string(), "VmRSS:").unwrap_or(0);
            c.serve_rss += rss as f64;
        }
        c.at = Some(Instant::now());
        Ok(c)
    }

    /// A sample without etcd's counters: every figure NaN (and so every delta from or to it).
    pub fn unread() -> Counters {
        let nan = f64::NAN;
        Counters {
            grpc: nan,
            range: nan,
            txn: nan,
            put: nan,
            delete: nan,
            sent_bytes: nan,
            watchers: nan,
            etcd_cpu: nan,
            self_cpu: nan,
            serve_cpu: nan,
            serve_rss: nan,
            at: None,
            metrics_failed: true,
        }
    }

    /// [`Counters::read`], or [`Counters::unread`] if even the sampling task failed (logged):
    /// a phase boundary always has a sample, so a run is never ended by its measurement.
    pub async fn sample(m: &Meter) -> Counters {
        Counters::read(m).await.unwrap_or_else(|e| {
            log(&format!("sample of the counters failed (phase figures missing): {e}"));
            Counters::unread()
        })
    }

    /// What was spent from `self` to `later`.
    pub fn to(&self, later: &Counters) -> Load {
        Load { from: *self, to: *later }
    }
}

/// One plain HTTP/1.0 GET of `/metrics` (etcd serves it on its client URL).
fn metrics_text(host: &str) -> Result<String, String> {
    let mut s = std::net::TcpStream::connect(host).map_err(|e| err("metrics connect", e))?;
    s.set_read_timeout(Some(Duration::from_secs(10))).map_err(|e| err("metrics timeout", e))?;
    s.write_all(format!("GET /metrics HTTP/1.0\r\nHost: {host}\r\n\r\n").as_bytes())
        .map_err(|e| err("metrics request", e))?;
    let mut body = String::new();
    s.read_to_string(&mut body).map_err(|e| err("metrics read", e))?;
    Ok(body)
}

/// Sums the counters this benchmark reads out of Prometheus text (labels ignored: every series
/// of a name is added up).
pub fn parse_metrics(text: &str) -> Counters {
    let mut c = Counters::default();
    for line in text.lines().filter(|l| !l.starts_with('#')) {
        let name = line.split(['{', ' ']).next().unwrap_or("");
        let Some(v) = line.rsplit(' ').next().and_then(|v| v.parse::<f64>().ok()) else {
            continue;
        };
        let slot = match name {
            "grpc_server_handled_total" => &mut c.grpc,
            "etcd_debugging_mvcc_range_total" => &mut c.range,
            "etcd_debugging_mvcc_txn_total" => &mut c.txn,
            "etcd_debugging_mvcc_put_total" => &mut c.put,
            "etcd_debugging_mvcc_delete_total" => &mut c.delete,
            "etcd_network_client_grpc_sent_bytes_total" => &mut c.sent_bytes,
            "etcd_debugging_mvcc_watcher_total" => &mut c.watchers,
            _ => continue,
        };
        *slot += v;
    }
    c
}

/// What etcd, the agents and the replicas spent over one phase: the two samples around it, each
/// figure their difference (so nothing is restated field by field).
#[derive(Clone, Copy, Debug, Default)]
pub struct Load {
    pub from: Counters,
    pub to: Counters,
}

impl Load {
    /// The phase's length in seconds (NaN when a sample is missing).
    pub fn secs(&self) -> f64 {
        match (self.from.at, self.to.at) {
            (Some(a), Some(b)) => b.duration_since(a).as_secs_f64(),
            _ => f64::NAN,
        }
    }
    fn delta(&self, f: impl Fn(&Counters) -> f64) -> f64 {
        f(&self.to) - f(&self.from)
    }
    /// Completed gRPC requests.
    pub fn grpc(&self) -> f64 {
        self.delta(|c| c.grpc)
    }
    /// Completed gRPC requests per second.
    pub fn grpc_per_sec(&self) -> f64 {
        self.grpc() / self.secs()
    }
    /// MVCC operations (range + txn + put + delete) per second.
    pub fn mvcc_per_sec(&self) -> f64 {
        self.delta(|c| c.range + c.txn + c.put + c.delete) / self.secs()
    }
    /// Bytes etcd sent to its clients.
    pub fn sent_bytes(&self) -> f64 {
        self.delta(|c| c.sent_bytes)
    }
    /// etcd's watchers at the phase's end (a gauge).
    pub fn watchers(&self) -> f64 {
        self.to.watchers
    }
    /// etcd's CPU seconds.
    pub fn etcd_cpu(&self) -> f64 {
        self.delta(|c| c.etcd_cpu)
    }
    /// This process's (the agents' and the probe's) CPU seconds.
    pub fn agents_cpu(&self) -> f64 {
        self.delta(|c| c.self_cpu)
    }
    /// The replicas' CPU seconds.
    pub fn serve_cpu(&self) -> f64 {
        self.delta(|c| c.serve_cpu)
    }
    /// etcd's `/metrics` failed at the phase's start or end: its etcd counters are missing.
    pub fn metrics_missing(&self) -> bool {
        self.from.metrics_failed || self.to.metrics_failed
    }
}

/// Latencies of the probe's acquires.
#[derive(Clone, Debug, Default)]
pub struct ProbeStats {
    pub ok: usize,
    pub failed: usize,
    pub p50: Duration,
    pub p99: Duration,
    pub max: Duration,
}

impl ProbeStats {
    fn of(mut lat: Vec<Duration>, failed: usize) -> ProbeStats {
        lat.sort_unstable();
        let at = |p: f64| {
            let i = ((lat.len() as f64 - 1.0) * p).round() as usize;
            lat.get(i.min(lat.len().saturating_sub(1))).copied().unwrap_or_default()
        };
        ProbeStats {
            ok: lat.len(),
            failed,
            p50: at(0.5),
            p99: at(0.99),
            max: lat.last().copied().unwrap_or_default(),
        }
    }
}

/// One phase's figures.
#[derive(Clone, Debug, Default)]
pub struct Phase {
    pub name: &'static str,
    /// Time until the last agent finished the phase's work (for churn: the phase's length).
    pub secs: f64,
    /// Median agent's time.
    pub median_secs: f64,
    /// Successful calls (agents synced, keys restored, churn acquire+release pairs).
    pub ok: u64,
    /// Failed calls (any error of connect, open, sync, acquire or release).
    pub failed: u64,
    /// Keys restored with an ID other than their previous one.
    pub changed: u64,
    /// p99 of one agent call (churn: acquire; storm: the whole restart of one agent).
    pub call_p99: Duration,
    pub load: Load,
    pub probe: ProbeStats,
    /// Load average at the phase's end.
    pub load_avg: String,
    /// This process's resident memory at the phase's end, bytes.
    pub rss: u64,
    /// Storm with `close`: bindings a sweep reclaimed between the close and the restart (the
    /// agents' keys, unreferenced once their leases went), so that only the hints bring their
    /// IDs back.
    pub swept: usize,
    /// The first few errors, for the report.
    pub errors: Vec<String>,
}

/// A whole fleet run.
#[derive(Clone, Debug)]
pub struct FleetRun {
    pub opts: FleetOptions,
    pub prefill_secs: f64,
    pub phases: Vec<Phase>,
}

impl FleetRun {
    pub fn phase(&self, name: &str) -> Option<&Phase> {
        self.phases.iter().find(|p| p.name == name)
    }
}

/// An agent: its allocator (own connection, session, holder) and its pool handle.
struct Agent {
    alloc: Allocator,
    pool: Pool,
}

fn holder(i: usize) -> String {
    format!("agent-{i}")
}

pub(crate) fn agent_key(i: usize, k: usize) -> String {
    format!("agent-{i}/key-{k}")
}

/// Connects a new etcd client (its own channel), builds an allocator as holder `holder`, opens
/// the pool and waits until its cache is synced.
async fn open_agent(endpoint: &str, holder: String, ttl: Duration) -> Result<Agent, String> {
    let store = EtcdStore::connect(EtcdOptions::new([endpoint.to_string()]))
        .await
        .map_err(|e| err("agent connect", e))?;
    let opts = AllocatorOptions::builder()
        .holder(holder)
        .session_ttl(ttl)
        .build()
        .map_err(|e| err("agent options", e))?;
    let alloc = Allocator::new(store, opts).map_err(|e| err("agent allocator", e))?;
    let pool = alloc.pool(POOL).await.map_err(|e| err("agent open pool", e))?;
    pool.wait_synced().await.map_err(|e| err("agent sync", e))?;
    Ok(Agent { alloc, pool })
}

/// A uniform random wait in `[0, max)`.
pub(crate) fn jitter(max: Duration) -> Duration {
    if max.is_zero() {
        return Duration::ZERO;
    }
    Duration::from_nanos(rand::rng().random_range(0..max.as_nanos().min(u64::MAX as u128) as u64))
}

/// The probe: acquires and releases a fresh key every [`PROBE_EVERY`] until stopped, keeping the
/// acquire latencies of the current window (taken and reset by [`Probe::take`]). Direct mode
/// probes through its own allocator, through-serve mode through its own client and session.
pub(crate) struct Probe {
    lat: Arc<std::sync::Mutex<(Vec<Duration>, usize)>>,
    stop: Arc<AtomicBool>,
    task: tokio::task::JoinHandle<()>,
    alloc: Option<Allocator>,
}

/// One probe step on key `key`: the acquire's latency if it succeeded, and whether the key was
/// then released.
pub(crate) type ProbeStep = futures::future::BoxFuture<'static, (Option<Duration>, bool)>;

impl Probe {
    async fn start(endpoint: &str) -> Result<Probe, String> {
        let agent = open_agent(endpoint, "probe".into(), Duration::from_secs(60)).await?;
        let pool = agent.pool.clone();
        let mut probe = Probe::spawn(move |key| {
            let pool = pool.clone();
            Box::pin(async move {
                let t = Instant::now();
                match pool.acquire(&key).await {
                    Ok(_) => {
                        let d = t.elapsed();
                        (Some(d), pool.release(&key).await.is_ok())
                    }
                    Err(_) => (None, false),
                }
            })
        });
        probe.alloc = Some(agent.alloc);
        Ok(probe)
    }

    /// Runs `step` on `probe/1`, `probe/2`, ... every [`PROBE_EVERY`].
    pub(crate) fn spawn(step: impl Fn(String) -> ProbeStep + Send + 'static) -> Probe {
        let lat = Arc::new(std::sync::Mutex::new((Vec::new(), 0usize)));
        let stop = Arc::new(AtomicBool::new(false));
        let (l, s) = (lat.clone(), stop.clone());
        let task = tokio::spawn(async move {
            let mut tick = tokio::time::interval(PROBE_EVERY);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            let mut n = 0u64;
            while !s.load(Ordering::Relaxed) {
                tick.tick().await;
                n += 1;
                let (acquired, released) = step(format!("probe/{n}")).await;
                let mut g = l.lock().unwrap_or_else(|p| p.into_inner());
                if let Some(d) = acquired {
                    g.0.push(d);
                }
                if !released {
                    g.1 += 1;
                }
            }
        });
        Probe { lat, stop, task, alloc: None }
    }

    /// The window's latencies since the last call.
    pub(crate) fn take(&self) -> ProbeStats {
        let mut g = self.lat.lock().unwrap_or_else(|p| p.into_inner());
        let (lat, failed) = std::mem::take(&mut *g);
        ProbeStats::of(lat, failed)
    }

    /// One sweep of the pool through the probe's allocator: bindings reclaimed.
    async fn sweep(&self) -> Result<usize, String> {
        let alloc = self.alloc.as_ref().ok_or("sweep: the probe has no allocator")?;
        let pool = alloc.pool(POOL).await.map_err(|e| err("sweep: open pool", e))?;
        let report = pool.sweep().await.map_err(|e| err("sweep", e))?;
        Ok(report.reclaimed.len())
    }

    pub(crate) async fn stop(self) {
        self.stop.store(true, Ordering::Relaxed);
        let _ = self.task.await;
        if let Some(a) = self.alloc {
            let _ = a.close().await;
        }
    }
}

pub(crate) fn log(msg: &str) {
    eprintln!("[fleet] {msg}");
}

/// Per-agent results of one phase, folded into a [`Phase`].
pub(crate) struct Tally {
    pub(crate) times: Vec<Duration>,
    pub(crate) ok: u64,
    pub(crate) failed: u64,
    pub(crate) changed: u64,
    pub(crate) errors: Vec<String>,
}

impl Tally {
    pub(crate) fn new() -> Tally {
        Tally { times: Vec::new(), ok: 0, failed: 0, changed: 0, errors: Vec::new() }
    }

    pub(crate) fn fail(&mut self, e: String) {
        self.failed += 1;
        if self.errors.len() < 5 {
            self.errors.push(e);
        }
    }

    pub(crate) async fn finish(
        mut self,
        name: &'static str,
        before: &Counters,
        meter: &Meter,
        probe: &Probe,
    ) -> Phase {
        self.times.sort_unstable();
        let q = |p: f64| {
            let i = ((self.times.len() as f64 - 1.0) * p).round() as usize;
            self.times.get(i.min(self.times.len().saturating_sub(1))).copied().unwrap_or_default()
        };
        let load = match Counters::read(meter).await {
            Ok(after) => before.to(&after),
            Err(e) => {
                self.errors.push(e);
                before.to(&Counters::unread())
            }
        };
        Phase {
            name,
            secs: self.times.last().copied().unwrap_or_default().as_secs_f64(),
            median_secs: q(0.5).as_secs_f64(),
            ok: self.ok,
            failed: self.failed,
            changed: self.changed,
            call_p99: q(0.99),
            load,
            probe: probe.take(),
            load_avg: load_average(),
            rss: resident_bytes().unwrap_or(0),
            swept: 0,
            errors: self.errors,
        }
    }
}

/// A private etcd holding the fleet's pool with `bindings` bindings, and the seconds the prefill
/// took: the setup of both modes (direct and through `serve`).
pub(crate) async fn prefilled_etcd(bindings: usize) -> Result<(EtcdServer, f64), String> {
    let etcd = EtcdServer::start().await?;
    let setup = Allocator::new(etcd.store().await?, AllocatorOptions::default())
        .map_err(|e| err("fleet setup", e))?;
    setup
        .init_pool(&PoolSpec::new(POOL, RANGE.0, RANGE.1))
        .await
        .map_err(|e| err("fleet init_pool", e))?;
    log(&format!("prefilling {bindings} bindings"));
    let t = Instant::now();
    crate::scenarios::prefill_idalloc(&etcd.store().await?, "idalloc", bindings).await?;
    let prefill_secs = t.elapsed().as_secs_f64();
    let _ = setup.close().await;
    Ok((etcd, prefill_secs))
}

/// Runs one fleet of `o.agents` agents on a pool of `o.bindings` bindings, on a private etcd
/// (its data under `$TMPDIR`, which the documented command points at `target/tmp-bench/`).
pub async fn run(o: &FleetOptions) -> Result<FleetRun, String> {
    if let Some(mode) = &o.serve {
        return crate::fleet_serve::run(o, mode).await;
    }
    let (etcd, prefill_secs) = prefilled_etcd(o.bindings).await?;
    let endpoint = etcd.endpoint();
    let probe = Probe::start(&endpoint).await?;
    probe.take();
    let meter = Meter { endpoint: endpoint.clone(), etcd_pid: etcd.pid(), ..Meter::default() };
    let mut phases = Vec::new();

    // Cold start.
    log(&format!("cold start of {} agents on {} bindings", o.agents, o.bindings));
    let before = Counters::sample(&meter).await;
    let (agents, tally) = start_all(o, &endpoint, |_| Vec::new()).await;
    phases.push(tally.finish("cold start", &before, &meter, &probe).await);

    // Hold: each agent acquires its keys; then until every agent has seen every agent's keys.
    log(&format!("hold: {} keys per agent", o.keys));
    let before = Counters::sample(&meter).await;
    let t0 = Instant::now();
    let mut set = JoinSet::new();
    for (i, a) in agents.iter().enumerate() {
        let (pool, n) = (a.pool.clone(), o.keys);
        set.spawn(async move {
            let keys: Vec<String> = (0..n).map(|k| agent_key(i, k)).collect();
            let got = pool.acquire_many(&keys).await;
            let mut held = Vec::with_capacity(n);
            let mut errors = Vec::new();
            for (k, r) in keys.into_iter().zip(got) {
                match r {
                    Ok(a) => held.push((k, a.id)),
                    Err(e) => errors.push(format!("hold {k}: {e}")),
                }
            }
            (i, held, errors, t0.elapsed())
        });
    }
    let mut tally = Tally::new();
    let mut checkpoint: HashMap<usize, Vec<(String, u64)>> = HashMap::new();
    while let Some(r) = set.join_next().await {
        match r {
            Ok((i, held, errors, d)) => {
                tally.ok += held.len() as u64;
                for e in errors {
                    tally.fail(e);
                }
                tally.times.push(d);
                checkpoint.insert(i, held);
            }
            Err(e) => tally.fail(err("hold task", e)),
        }
    }
    let acquired = t0.elapsed();
    // Fan-out: every agent's cache has every agent's first and last key.
    let probes: Vec<(String, u64)> =
        checkpoint.values().flat_map(|h| h.first().into_iter().chain(h.last()).cloned()).collect();
    loop {
        let behind = agents
            .iter()
            .filter(|a| probes.iter().any(|(k, id)| a.pool.get(k) != Some(*id)))
            .count();
        if behind == 0 {
            break;
        }
        if t0.elapsed() > Duration::from_secs(600) {
            tally.fail(format!("hold: {behind} agents had not seen every key after 600 s"));
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    tally.times.push(t0.elapsed());
    log(&format!(
        "hold: acquired in {:.2} s, seen everywhere in {:.2} s",
        acquired.as_secs_f64(),
        t0.elapsed().as_secs_f64()
    ));
    phases.push(tally.finish("hold (acquire + fan-out)", &before, &meter, &probe).await);

    // Restart storm.
    log(&format!("restart storm ({})", if o.close { "close" } else { "crash" }));
    let before = Counters::sample(&meter).await;
    if o.close {
        let mut set = JoinSet::new();
        for a in agents {
            drop(a.pool);
            set.spawn(a.alloc.close());
        }
        while set.join_next().await.is_some() {}
    } else {
        drop(agents);
    }
    // After a clean close the agents' bindings have no reference left: a sweep (any process may
    // run one) reclaims them, and only the restarted agents' hints give them their IDs back.
    let swept = if o.close { probe.sweep().await? } else { 0 };
    let checkpoint = Arc::new(checkpoint);
    let (agents, tally) =
        start_all(o, &endpoint, |i| checkpoint.get(&i).cloned().unwrap_or_default()).await;
    let mut storm = tally.finish("restart storm", &before, &meter, &probe).await;
    storm.swept = swept;
    phases.push(storm);

    // Churn.
    log(&format!("churn for {:?}", o.churn));
    let before = Counters::sample(&meter).await;
    let mut set = JoinSet::new();
    let end = Instant::now() + o.churn;
    for (i, a) in agents.iter().enumerate() {
        let pool = a.pool.clone();
        set.spawn(async move {
            let mut lat = Vec::new();
            let mut errors = Vec::new();
            tokio::time::sleep(jitter(Duration::from_secs(1))).await;
            let mut tick = tokio::time::interval(Duration::from_secs(1));
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            let mut n = 0;
            loop {
                tick.tick().await;
                if Instant::now() >= end {
                    break;
                }
                n += 1;
                let key = format!("agent-{i}/churn-{n}");
                let t = Instant::now();
                match pool.acquire(&key).await {
                    Ok(_) => {
                        lat.push(t.elapsed());
                        if let Err(e) = pool.release(&key).await {
                            errors.push(format!("churn release {key}: {e}"));
                        }
                    }
                    Err(e) => errors.push(format!("churn acquire {key}: {e}")),
                }
            }
            (lat, errors)
        });
    }
    let mut tally = Tally::new();
    let t0 = Instant::now();
    while let Some(r) = set.join_next().await {
        match r {
            Ok((lat, errors)) => {
                tally.ok += lat.len() as u64;
                tally.times.extend(lat);
                for e in errors {
                    tally.fail(e);
                }
            }
            Err(e) => tally.fail(err("churn task", e)),
        }
    }
    let churn_secs = t0.elapsed().as_secs_f64();
    let mut churn = tally.finish("churn", &before, &meter, &probe).await;
    // For churn the times folded were acquire latencies (`median_secs` and `call_p99` are theirs);
    // the phase's time is its length.
    churn.secs = churn_secs;
    phases.push(churn);

    probe.stop().await;
    let mut set = JoinSet::new();
    for a in agents {
        drop(a.pool);
        set.spawn(a.alloc.close());
    }
    while set.join_next().await.is_some() {}
    Ok(FleetRun { opts: o.clone(), prefill_secs, phases })
}

/// Starts every agent at once (each after its jitter), each restoring `restore(i)` with those IDs
/// as hints once synced. Times count from the moment all were launched.
async fn start_all(
    o: &FleetOptions,
    endpoint: &str,
    restore: impl Fn(usize) -> Vec<(String, u64)>,
) -> (Vec<Agent>, Tally) {
    let t0 = Instant::now();
    let mut set = JoinSet::new();
    for i in 0..o.agents {
        let (endpoint, ttl, wait, keys) =
            (endpoint.to_string(), o.session_ttl, jitter(o.jitter), restore(i));
        set.spawn(async move {
            tokio::time::sleep(wait).await;
            let agent = open_agent(&endpoint, holder(i), ttl).await?;
            let hints: Vec<(&str, Option<u64>)> =
                keys.iter().map(|(k, id)| (k.as_str(), Some(*id))).collect();
            let got = agent.pool.acquire_many_with_hints(&hints).await;
            let (mut changed, mut errors) = (0u64, Vec::new());
            for ((k, old), r) in keys.iter().zip(got) {
                match r {
                    Ok(a) if a.id != *old => changed += 1,
                    Ok(_) => {}
                    Err(e) => errors.push(format!("restore {k}: {e}")),
                }
            }
            Ok::<_, String>((agent, keys.len() as u64, changed, errors, t0.elapsed()))
        });
    }
    let mut agents = Vec::with_capacity(o.agents);
    let mut tally = Tally::new();
    while let Some(r) = set.join_next().await {
        match r {
            Ok(Ok((agent, n, changed, errors, d))) => {
                agents.push(agent);
                tally.ok += n.max(1) - errors.len().min(n.max(1) as usize) as u64;
                tally.changed += changed;
                for e in errors {
                    tally.fail(e);
                }
                tally.times.push(d);
            }
            Ok(Err(e)) => tally.fail(e),
            Err(e) => tally.fail(err("agent task", e)),
        }
    }
    (agents, tally)
}

/// The usage line of `--fleet`.
pub const USAGE: &str = "idalloc-bench --fleet [--agents N,N,...] [--bindings B,B,...] [--keys K] \
     [--churn-secs S] [--jitter-ms MS] [--close] [--through-serve [--replicas R,R,...] \
     [--kill-replica] [--no-views] [--cli PATH]] [--out FILE.md]";

fn list(v: Option<String>, what: &str) -> Result<Vec<usize>, String> {
    let v = v.ok_or_else(|| format!("{what} needs a value\nusage: {USAGE}"))?;
    v.split(',')
        .map(|x| {
            x.trim().replace('_', "").parse::<usize>().ok().filter(|n| *n > 0).ok_or_else(|| {
                format!("{what}: {x:?} is not a positive whole number\nusage: {USAGE}")
            })
        })
        .collect()
}

/// `idalloc-bench --fleet ...`: runs every (agents, bindings) pair of the arguments, prints each
/// run's table as it finishes, and with `--out` writes the whole section there and its chart
/// next to it (`.svg`).
pub async fn main(args: Vec<String>) -> Result<(), String> {
    let mut agents = vec![100, 300, 1000];
    let mut bindings = vec![10_000, 100_000];
    let mut shape = FleetOptions::new(0, 0);
    let mut out: Option<std::path::PathBuf> = None;
    let (mut through_serve, mut replicas, mut kill_replica, mut views) =
        (false, vec![1, 2], false, true);
    let mut cli: std::path::PathBuf = std::env::var_os("IDALLOC_CLI")
        .map(Into::into)
        .unwrap_or_else(|| "target/release/idalloc".into());
    let mut it = args.into_iter();
    while let Some(a) = it.next() {
        match a.as_str() {
            "--agents" => agents = list(it.next(), "--agents")?,
            "--bindings" => bindings = list(it.next(), "--bindings")?,
            "--keys" => shape.keys = list(it.next(), "--keys")?[0],
            "--churn-secs" => {
                shape.churn = Duration::from_secs(list(it.next(), "--churn-secs")?[0] as u64)
            }
            "--jitter-ms" => {
                let v = it.next().ok_or_else(|| format!("--jitter-ms needs a value\n{USAGE}"))?;
                let ms: u64 = v.parse().map_err(|_| {
                    format!("--jitter-ms: {v:?} is not a whole number of milliseconds\n{USAGE}")
                })?;
                shape.jitter = Duration::from_millis(ms);
            }
            "--close" => shape.close = true,
            "--through-serve" => through_serve = true,
            "--replicas" => replicas = list(it.next(), "--replicas")?,
            "--kill-replica" => kill_replica = true,
            "--no-views" => views = false,
            "--cli" => {
                cli = it.next().ok_or_else(|| format!("--cli needs a path\n{USAGE}"))?.into()
            }
            "--out" => {
                out = Some(it.next().ok_or_else(|| format!("--out needs a file\n{USAGE}"))?.into())
            }
            other => return Err(format!("unknown --fleet argument {other:?}\nusage: {USAGE}")),
        }
    }
    if !idalloc_testkit::etcd::etcd_on_path() {
        return Err("etcd is not on PATH: the fleet benchmark starts its own etcd".into());
    }
    let started = crate::stats::utc_now();
    let load0 = load_average();
    let mut runs = Vec::new();
    let mut failures = Vec::new();
    if through_serve && !cli.is_file() {
        return Err(format!(
            "--through-serve runs `{} serve`, which is not a file: build it (`cargo build \
             --release -p idalloc-cli`), or name it with --cli or IDALLOC_CLI",
            cli.display()
        ));
    }
    let modes: Vec<Option<crate::fleet_serve::ServeMode>> = if through_serve {
        replicas
            .iter()
            .map(|&r| {
                Some(crate::fleet_serve::ServeMode {
                    bin: cli.clone(),
                    replicas: r,
                    kill_replica: kill_replica && r >= 2,
                    views,
                })
            })
            .collect()
    } else {
        vec![None]
    };
    for &b in &bindings {
        for (&n, serve) in agents.iter().flat_map(|n| modes.iter().map(move |m| (n, m))) {
            let o = FleetOptions { agents: n, bindings: b, serve: serve.clone(), ..shape.clone() };
            match run(&o).await {
                Ok(r) => {
                    println!("{}", table(std::slice::from_ref(&r)));
                    runs.push(r);
                }
                Err(e) => {
                    eprintln!("[fleet] {n} agents on {b} bindings: {e}");
                    failures.push(format!("{n} agents on {b} bindings: {e}"));
                }
            }
        }
    }
    if let Some(out) = out {
        let svg = out.with_extension("svg");
        let name = svg.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
        let text = format!(
            "Generated by `idalloc-bench --fleet` on {started} ({} logical cores, {}; {}; load \
             average {load0} at the start, {} at the end). Storm by {}, agent start jitter \
             {} ms, {} keys per agent, churn for {} s.\n\n{}\n![fleet times]({name})\n{}",
            crate::stats::cores(),
            crate::stats::cpu_model(),
            crate::stats::etcd_version(),
            load_average(),
            if shape.close { "clean close" } else { "crash (no close)" },
            shape.jitter.as_millis(),
            shape.keys,
            shape.churn.as_secs(),
            table(&runs),
            failures.iter().map(|f| format!("\n- not run: {f}")).collect::<String>()
        );
        std::fs::write(&out, text).map_err(|e| format!("writing {}: {e}", out.display()))?;
        std::fs::write(&svg, chart(&runs))
            .map_err(|e| format!("writing {}: {e}", svg.display()))?;
        println!("wrote {} and {}", out.display(), svg.display());
    }
    if failures.is_empty() {
        Ok(())
    } else {
        Err(failures.join("; "))
    }
}

fn ms(d: Duration) -> String {
    format!("{:.0}", d.as_secs_f64() * 1000.0)
}

/// A figure with no decimals, or "–" where it is missing (a failed sample's NaN).
fn whole(v: f64) -> String {
    if v.is_finite() {
        format!("{v:.0}")
    } else {
        "–".into()
    }
}

/// A CPU figure as "seconds (cores)", or "–" where nothing was measured.
fn cpu_cell(secs: f64, phase: f64) -> String {
    if secs.is_finite() {
        format!("{secs:.1} ({:.2})", secs / phase)
    } else {
        "–".into()
    }
}

/// The table's note on a phase whose etcd figures are missing.
const METRICS_MISSING: &str =
    "etcd's /metrics did not answer at the phase's start or end (the log \
     says why): its etcd gRPC, MVCC, bytes and watcher figures are missing (–)";

/// One row per phase of every run.
pub fn table(runs: &[FleetRun]) -> String {
    let mut s = String::from(
        "| agents | bindings | replicas | phase | all done s | median s | ok | failed | IDs changed | \
         call p99 ms | etcd gRPC req/s | etcd MVCC ops/s | etcd sent MB | etcd CPU s (cores) | \
         agents CPU s (cores) | serve CPU s (cores) | serve RSS MB | probe p99 ms (n, failed) | \
         RSS MB | load avg |\n\
         |---:|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|---:|---|\n",
    );
    for r in runs {
        let replicas = r.opts.serve.as_ref().map_or("direct".to_string(), |s| {
            format!("{}{}", s.replicas, if s.kill_replica { " (1 killed)" } else { "" })
        });
        for p in &r.phases {
            let l = &p.load;
            let direct = r.opts.serve.is_none();
            let secs = l.secs();
            s.push_str(&format!(
                "| {} | {} | {} | {} | {:.2} | {:.2} | {} | {} | {} | {} | {} | {} | {} | \
                 {} | {} | {} | {} | {} ({}, {}) | {:.0} | {} |\n",
                r.opts.agents,
                r.opts.bindings,
                replicas,
                p.name,
                p.secs,
                p.median_secs,
                p.ok,
                p.failed,
                p.changed,
                ms(p.call_p99),
                whole(l.grpc_per_sec()),
                whole(l.mvcc_per_sec()),
                whole(l.sent_bytes() / 1e6),
                cpu_cell(l.etcd_cpu(), secs),
                cpu_cell(l.agents_cpu(), secs),
                if direct { "–".into() } else { cpu_cell(l.serve_cpu(), secs) },
                if direct { "–".into() } else { whole(l.to.serve_rss / 1e6) },
                ms(p.probe.p99),
                p.probe.ok,
                p.probe.failed,
                p.rss as f64 / 1e6,
                p.load_avg
            ));
        }
        for p in &r.phases {
            for e in &p.errors {
                s.push_str(&format!("\n{} agents, {}: {e}\n", r.opts.agents, p.name));
            }
            if p.load.metrics_missing() {
                s.push_str(&format!("\n{} agents, {}: {METRICS_MISSING}\n", r.opts.agents, p.name));
            }
        }
    }
    s
}

/// Cold-start and storm times of every run against the 30 s targets.
pub fn chart(runs: &[FleetRun]) -> String {
    let mut bars = Vec::new();
    for r in runs {
        for (name, colour, target) in [
            ("cold start", "#4a7ebb", r.opts.agents == 1000 && r.opts.bindings == 10_000),
            ("restart storm", "#d9822b", r.opts.agents * r.opts.keys >= 100_000),
        ] {
            if let Some(p) = r.phase(name) {
                bars.push(crate::plot::Bar {
                    label: format!(
                        "{name}: {} agents, {} bindings, {}",
                        r.opts.agents,
                        r.opts.bindings,
                        r.opts.serve.as_ref().map_or("direct".to_string(), |s| format!(
                            "{} serve replica{}",
                            s.replicas,
                            if s.replicas == 1 { "" } else { "s" }
                        ))
                    ),
                    value: p.secs,
                    colour,
                    targets: if target { vec![("30 s".into(), 30.0)] } else { Vec::new() },
                });
            }
        }
    }
    crate::plot::bars_svg("Fleet: time until all agents are synced / restored", "seconds", &bars)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn metrics_are_summed_over_labels_and_comments_skipped() {
        let text = "# HELP grpc_server_handled_total x\n\
            grpc_server_handled_total{grpc_code=\"OK\",grpc_method=\"Range\"} 12\n\
            grpc_server_handled_total{grpc_code=\"OK\",grpc_method=\"Txn\"} 3e+00\n\
            etcd_debugging_mvcc_range_total 7\n\
            etcd_debugging_mvcc_txn_total 2\n\
            etcd_debugging_mvcc_range_total_other 100\n\
            etcd_debugging_mvcc_watcher_total 5\n";
        let c = parse_metrics(text);
        assert_eq!(c.grpc, 15.0);
        assert_eq!(c.range, 7.0);
        assert_eq!(c.txn, 2.0);
        assert_eq!(c.watchers, 5.0);
        assert_eq!(c.put, 0.0);
    }

    /// A `/metrics` read that fails (here: nothing listens on the port) marks the sample and
    /// the phase's etcd figures missing ("–" and a note), instead of failing the sample, which
    /// ended the whole run.
    #[tokio::test]
    async fn a_failed_metrics_sample_marks_the_phase_instead_of_ending_the_run() {
        let port = {
            let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
            l.local_addr().expect("addr").port()
        };
        let meter = Meter { endpoint: format!("http://127.0.0.1:{port}"), ..Meter::default() };
        let failed = Counters::read(&meter).await.expect("a failed /metrics is still a sample");
        assert!(failed.metrics_failed && failed.grpc.is_nan() && failed.sent_bytes.is_nan());
        assert!(failed.self_cpu.is_finite() && failed.at.is_some(), "the /proc figures stay");

        let mut ok = parse_metrics("grpc_server_handled_total 10\n");
        ok.at = failed.at.map(|t| t - Duration::from_secs(2));
        let load = ok.to(&failed);
        assert!(load.metrics_missing() && !ok.to(&ok).metrics_missing());
        let run = FleetRun {
            opts: FleetOptions::new(3, 60),
            prefill_secs: 0.0,
            phases: vec![Phase { name: "cold start", load, ..Phase::default() }],
        };
        let t = table(&[run]);
        let row = t.lines().find(|l| l.contains("cold start")).expect("the phase's row");
        let cells: Vec<&str> = row.split('|').map(str::trim).collect();
        // agents, bindings, replicas, phase, then … gRPC req/s (11), MVCC ops/s (12), sent MB (13).
        assert_eq!(cells[11..14], ["–", "–", "–"], "{row}");
        assert!(!row.contains("NaN"), "{row}");
        assert!(t.contains(&format!("3 agents, cold start: {METRICS_MISSING}")), "{t}");
    }

    #[test]
    fn probe_percentiles() {
        let lat: Vec<Duration> = (1..=100).rev().map(Duration::from_millis).collect();
        let p = ProbeStats::of(lat, 2);
        assert_eq!((p.ok, p.failed), (100, 2));
        assert_eq!(p.p50, Duration::from_millis(51));
        assert_eq!(p.p99, Duration::from_millis(99));
        assert_eq!(p.max, Duration::from_millis(100));
        assert_eq!(ProbeStats::of(Vec::new(), 0).p99, Duration::ZERO);
    }
}
