//! Protocol comparison harness: idalloc against the etcd ceiling and replicas of
//! Cilium v1.6's and Contiv's allocator protocols, on the same etcd, in one run, plus in-process
//! micro-benchmarks and scale figures. `main.rs` runs it and writes `docs/benchmarks.md` and
//! `docs/benchmarks.svg`; `tests/quick.rs` runs the quick mode so the harness never rots.
//!
//! Every store scenario starts its own single-member etcd on 127.0.0.1 (fresh data dir per
//! contender and scenario, so no contender inherits another's database), and every node counts
//! its requests with [`idalloc_testkit::counting::CountingStore`].

pub mod batched;
pub mod cilium;
pub mod contender;
pub mod contiv;
pub mod costplot;
pub mod fanout;
pub mod fleet;
pub mod fleet_serve;
pub mod fleetplot;
pub mod heap;
pub mod micro;
pub mod plot;
pub mod remote;
pub mod report;
pub mod scale;
pub mod scale_chart;
pub mod scale_phases;
pub mod scenarios;
pub mod serve;
pub mod stats;

use std::path::PathBuf;
use std::time::{Duration, Instant};

use contender::Kind;
use micro::Micro;
use stats::Run;

/// How big and how long each scenario is.
#[derive(Clone, Debug)]
pub struct Config {
    pub quick: bool,
    /// Length of each time-based run.
    pub run: Duration,
    pub concurrency: Vec<usize>,
    /// Keys bound by node A and acquired by node B; keys released.
    pub bound_keys: usize,
    pub release_keys: usize,
    /// Tasks for the bound-elsewhere and release scenarios.
    pub list_tasks: usize,
    pub existing: Vec<usize>,
    pub overlap_nodes: usize,
    pub overlap_keys: usize,
    pub micro_bindings: usize,
    pub micro_iters: u64,
    pub sync_bindings: usize,
    pub cli_keys: usize,
    /// Held keys restored after a restart.
    pub restore_keys: usize,
    /// Bindings per cluster in the remote-view lookup benchmark (1 local + 8 remotes).
    pub remote_lookup_bindings: usize,
    /// The `idalloc` CLI binary, if it exists.
    pub cli: Option<PathBuf>,
}

impl Config {
    /// The documented run (well under 15 minutes on a busy 2-core machine).
    pub fn full() -> Self {
        Config {
            quick: false,
            run: Duration::from_secs(5),
            concurrency: vec![1, 8, 64],
            bound_keys: 2000,
            release_keys: 2000,
            list_tasks: 8,
            existing: vec![1000, 10_000, 20_000],
            overlap_nodes: 16,
            overlap_keys: 200,
            micro_bindings: 1_000_000,
            micro_iters: 2_000_000,
            sync_bindings: 100_000,
            cli_keys: 100_000,
            restore_keys: 10_000,
            remote_lookup_bindings: 10_000,
            cli: None,
        }
    }

    /// Seconds, for CI: every scenario and contender, tiny sizes.
    pub fn quick() -> Self {
        Config {
            quick: true,
            run: Duration::from_millis(300),
            concurrency: vec![1, 8, 64],
            bound_keys: 40,
            release_keys: 40,
            list_tasks: 8,
            existing: vec![200, 1000],
            overlap_nodes: 16,
            overlap_keys: 8,
            micro_bindings: 10_000,
            micro_iters: 20_000,
            sync_bindings: 1000,
            cli_keys: 200,
            restore_keys: 200,
            remote_lookup_bindings: 200,
            cli: None,
        }
    }
}

/// A scenario's result for one contender; `Err` says why it could not run.
pub type Outcome<T> = Result<T, String>;

/// Everything one run measured.
#[derive(Debug)]
pub struct Report {
    pub quick: bool,
    pub date: String,
    pub cores: usize,
    pub cpu: String,
    pub etcd: String,
    pub load_before: String,
    pub load_after: String,
    pub wall_secs: f64,
    /// (concurrency, contender, run).
    pub new_keys: Vec<(usize, Kind, Outcome<Run>)>,
    pub bound: Vec<(Kind, Outcome<Run>)>,
    pub release: Vec<(Kind, Outcome<Run>)>,
    /// (bindings already in the pool, contender, run).
    pub existing: Vec<(usize, Kind, Outcome<Run>)>,
    /// (contender, run, consistent).
    pub overlap: Vec<(Kind, Outcome<(Run, bool)>)>,
    pub micro: Micro,
    /// (bindings, seconds, requests).
    pub sync: Outcome<(usize, f64, u64)>,
    /// (label, concurrency, run).
    pub embedded: Vec<(String, usize, Outcome<Run>)>,
    /// (store label, keys, seconds), or why not run.
    pub cli: Vec<(String, usize, Outcome<f64>)>,
    /// `release --from` of the same keys: (store label, keys, seconds).
    pub cli_release: Vec<(String, usize, Outcome<f64>)>,
    /// Batched etcd ceiling: (keys, keys/s).
    pub batched_ceiling: Option<(usize, Outcome<f64>)>,
    /// Where the CPU went in the etcd runs (batched ceiling, `acquire --from`, `release --from`,
    /// and on the batching page the coalesced and one-key runs at 64): what a missed batching
    /// ratio is made of on a 2-core machine.
    pub cpu_split: Vec<(String, stats::CpuSplit)>,
    /// Restart restoration: (keys, (restore seconds, sync seconds)).
    pub restore: Option<(usize, Outcome<(f64, f64)>)>,
    /// Remote views.
    pub remote: Option<remote::RemoteFigures>,
    pub config: Option<Config>,
}

fn log(msg: &str) {
    eprintln!("[bench] {msg}");
}

/// Runs every scenario of `cfg`; failures of one contender are recorded, not fatal.
pub async fn run(cfg: &Config) -> Report {
    let t0 = Instant::now();
    let mut r = run_nothing(cfg);

    for &c in &cfg.concurrency {
        for kind in Kind::ALL {
            log(&format!("new keys, concurrency {c}: {}", kind.name()));
            r.new_keys.push((c, kind, scenarios::new_keys(kind, c, cfg.run).await));
        }
    }
    for kind in Kind::ALL {
        log(&format!("bound elsewhere: {}", kind.name()));
        r.bound
            .push((kind, scenarios::bound_elsewhere(kind, cfg.bound_keys, cfg.list_tasks).await));
        log(&format!("release: {}", kind.name()));
        r.release.push((kind, scenarios::release(kind, cfg.release_keys, cfg.list_tasks).await));
    }
    for &n in &cfg.existing {
        for kind in [Kind::Idalloc, Kind::Contiv] {
            log(&format!("{n} existing bindings: {}", kind.name()));
            r.existing.push((n, kind, scenarios::with_existing(kind, n, cfg.run).await));
        }
    }
    for kind in [Kind::Idalloc, Kind::Cilium, Kind::Contiv] {
        log(&format!("{} nodes, overlapping keys: {}", cfg.overlap_nodes, kind.name()));
        r.overlap.push((kind, scenarios::overlap(kind, cfg.overlap_nodes, cfg.overlap_keys).await));
    }

    log("initial sync");
    r.sync = scenarios::initial_sync(cfg.sync_bindings)
        .await
        .map(|(s, req)| (cfg.sync_bindings, s, req));

    log("remote views");
    r.remote =
        Some(remote::run(cfg.sync_bindings, cfg.remote_lookup_bindings, cfg.micro_iters).await);

    log("embedded stores");
    bulk(cfg, &mut r, true).await;

    log("micro-benchmarks");
    let (n, iters) = (cfg.micro_bindings, cfg.micro_iters);
    r.micro = tokio::task::spawn_blocking(move || {
        let mut m = Micro::default();
        micro::cache(n, iters, &mut m);
        micro::picks(iters, &mut m);
        micro::escaping(iters, &mut m);
        m
    })
    .await
    .unwrap_or_default();

    r.load_after = stats::load_average();
    r.wall_secs = t0.elapsed().as_secs_f64();
    r
}

/// The batching scenarios alone, in one run: new keys at concurrency 64 (idalloc, whose concurrent
/// single-key acquires are coalesced, and the one-key-per-txn etcd ceiling), the file store at 1
/// and 64 tasks, `acquire --from` / `release --from` on the file store and etcd, the batched etcd
/// ceiling and restart restoration. [`Report::batching_markdown`] writes it up.
pub async fn run_batching(cfg: &Config) -> Report {
    let t0 = Instant::now();
    let mut r = run_nothing(cfg);
    // With where the CPU went: on 2 cores shared with etcd, CPU per call bounds the coalesced
    // ratio (the page's "why" for that target).
    for (kind, label) in [
        (Kind::Idalloc, "coalesced single-key acquires at 64"),
        (Kind::Ceiling, "one-key-per-txn ceiling at 64"),
    ] {
        log(&format!("new keys, concurrency 64: {}", kind.name()));
        let run = scenarios::new_keys_cpu(kind, 64, cfg.run).await;
        if let Ok((_, cpu)) = &run {
            r.cpu_split.push((label.to_string(), cpu.clone()));
        }
        r.new_keys.push((64, kind, run.map(|(run, _)| run)));
    }
    bulk(cfg, &mut r, false).await;
    r.load_after = stats::load_average();
    r.wall_secs = t0.elapsed().as_secs_f64();
    r
}

/// The parts the full run and [`run_batching`] share: the file store at 1 and 64 tasks (and the
/// memory store at 64 with `memory`), the CLI's bulk commands, the batched etcd ceiling with where
/// its CPU went, and restart restoration.
async fn bulk(cfg: &Config, r: &mut Report, memory: bool) {
    match tempfile::tempdir() {
        Ok(dir) => {
            for c in [1, 64] {
                log(&format!("file store, {c} tasks"));
                r.embedded.push((
                    "file (redb, fsync per commit)".into(),
                    c,
                    scenarios::embedded(Some(dir.path()), c, cfg.run).await,
                ));
            }
            if memory {
                r.embedded.push((
                    "memory".into(),
                    64,
                    scenarios::embedded(None, 64, cfg.run).await,
                ));
            }
            log("CLI");
            let cpu;
            (r.cli, r.cli_release, cpu) = cli(cfg, dir.path()).await;
            r.cpu_split.extend(cpu);
        }
        Err(e) => r.embedded.push(("file".into(), 1, Err(format!("no temp dir: {e}")))),
    }
    log("batched etcd ceiling");
    let ceiling = batched::batched_ceiling(cfg.cli_keys, batched::CEILING).await;
    if let Ok((_, cpu)) = &ceiling {
        r.cpu_split.push(("batched etcd ceiling (bench process)".into(), cpu.clone()));
    }
    r.batched_ceiling = Some((cfg.cli_keys, ceiling.map(|(rate, _)| rate)));
    log("restart restoration");
    r.restore = Some((cfg.restore_keys, batched::restore(cfg.restore_keys).await));
}

/// An empty report of `cfg`'s machine and moment.
fn run_nothing(cfg: &Config) -> Report {
    Report {
        quick: cfg.quick,
        date: stats::utc_now(),
        cores: stats::cores(),
        cpu: stats::cpu_model(),
        etcd: stats::etcd_version(),
        load_before: stats::load_average(),
        load_after: String::new(),
        wall_secs: 0.0,
        new_keys: Vec::new(),
        bound: Vec::new(),
        release: Vec::new(),
        existing: Vec::new(),
        overlap: Vec::new(),
        micro: Micro::default(),
        sync: Err("not run".into()),
        embedded: Vec::new(),
        cli: Vec::new(),
        cli_release: Vec::new(),
        batched_ceiling: None,
        cpu_split: Vec::new(),
        restore: None,
        remote: None,
        config: Some(cfg.clone()),
    }
}

/// Bound on one CLI run.
fn cli_limit(cfg: &Config) -> Duration {
    if cfg.quick {
        Duration::from_secs(60)
    } else {
        Duration::from_secs(240)
    }
}

type CliRuns = Vec<(String, usize, Outcome<f64>)>;

/// `acquire --from` then `release --from` of the same keys, on the file store and on etcd, and
/// where the CPU went in the etcd runs.
async fn cli(
    cfg: &Config,
    dir: &std::path::Path,
) -> (CliRuns, CliRuns, Vec<(String, stats::CpuSplit)>) {
    let n = cfg.cli_keys;
    let Some(bin) = cfg.cli.clone().filter(|b| b.is_file()) else {
        let why = "not run: the `idalloc` CLI binary was not found".to_string();
        let none = vec![("file".into(), n, Err(why.clone())), ("etcd".into(), n, Err(why))];
        return (none.clone(), none, Vec::new());
    };
    let limit = cli_limit(cfg);
    let file = format!("file:{}", dir.join("cli.redb").display());
    let mut acq =
        vec![("file".to_string(), n, scenarios::cli_acquire(&bin, &file, dir, n, limit).await)];
    let mut rel =
        vec![("file".to_string(), n, scenarios::cli_release(&bin, &file, dir, n, limit).await)];
    let etcd = match idalloc_testkit::etcd::EtcdServer::start().await {
        Ok(e) => e,
        Err(e) => {
            acq.push(("etcd".into(), n, Err(e.clone())));
            rel.push(("etcd".into(), n, Err(e)));
            return (acq, rel, Vec::new());
        }
    };
    let url = etcd.endpoint().replacen("http://", "etcd://", 1);
    // The CLI is this process's only child that ends during a run, so the growth of the reaped
    // children's CPU is the CLI's.
    let split = |before: stats::CpuSample, secs: &Outcome<f64>| {
        let wall = secs.as_ref().copied().unwrap_or(f64::NAN);
        before.split_to(stats::CpuSample::now(true, etcd.pid()), n, wall)
    };
    let mut cpu = Vec::new();
    let before = stats::CpuSample::now(true, etcd.pid());
    let r = scenarios::cli_acquire(&bin, &url, dir, n, limit).await;
    cpu.push(("`acquire --from` (CLI process)".to_string(), split(before, &r)));
    acq.push(("etcd".into(), n, r));
    let before = stats::CpuSample::now(true, etcd.pid());
    let r = scenarios::cli_release(&bin, &url, dir, n, limit).await;
    cpu.push(("`release --from` (CLI process)".to_string(), split(before, &r)));
    rel.push(("etcd".into(), n, r));
    (acq, rel, cpu)
}
