//! CLI workers of this build and of the previous build on one pool of a 3-member etcd, with
//! client kills, member kills and member pauses (docs/design/cluster-version.md). The cluster
//! stays at version 1, as during a rolling upgrade. Each worker's steps use either build, so a
//! reference one build wrote is read and released by the other, in both directions (an upgrade
//! and a rollback mid-hold). Checked: G1 on raw scans during and after the run; every key's ID
//! unchanged while a worker holds it (its `get` between acquire and release answers the ID its
//! acquire printed); today's `idalloc check` finds nothing.
//!
//! The previous build is a binary named by `IDALLOC_PREV_BIN` (`scripts/test.sh` builds it from
//! the commit before the fence floor); without it the test prints why and passes. This build's
//! binary is `IDALLOC_BIN`, else `idalloc` beside the test's directory (`target/debug/idalloc`).
//! `MIXED_SECS` sets the run's length (default 30).

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use idalloc::layout::Layout;
use idalloc::store::etcd::{EtcdOptions, EtcdStore};
use idalloc_chaos::scan::analyze;
use idalloc_testkit::etcd::{etcd_or_skip, EtcdCluster};
use idalloc_testkit::g1::read_pool;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

const POOL: &str = "mixed";
const PREFIX: &str = "mixed-builds";
const KEYS: usize = 8;
const WORKERS: usize = 6;

/// This build's `idalloc`.
fn this_bin() -> Option<PathBuf> {
    if let Some(p) = std::env::var_os("IDALLOC_BIN") {
        return Some(PathBuf::from(p));
    }
    let exe = std::env::current_exe().ok()?;
    let p = exe.parent()?.parent()?.join("idalloc");
    p.exists().then_some(p)
}

/// The previous build's binary and this build's, or `None` (having said why) if either is
/// missing.
fn both_builds() -> Option<(PathBuf, PathBuf)> {
    let Some(prev) = std::env::var_os("IDALLOC_PREV_BIN").map(PathBuf::from) else {
        println!(
            "skipped: IDALLOC_PREV_BIN is not set (scripts/test.sh builds the previous build and \
             sets it)"
        );
        return None;
    };
    assert!(prev.exists(), "IDALLOC_PREV_BIN names no file: {}", prev.display());
    let Some(this) = this_bin() else {
        println!("skipped: no idalloc binary of this build (set IDALLOC_BIN or build the CLI)");
        return None;
    };
    Some((prev, this))
}

/// Runs `bin` on `store` with `args` to the end: (exit code, stdout, stderr).
fn run(bin: &Path, store: &str, args: &[&str]) -> (Option<i32>, String, String) {
    let out = Command::new(bin)
        .args(["--store", store])
        .args(args)
        .env_remove("IDALLOC_STORE")
        .output()
        .expect("run");
    let text = |b: &[u8]| String::from_utf8_lossy(b).trim().to_string();
    (out.status.code(), text(&out.stdout), text(&out.stderr))
}

/// The previous build reads file format 1 only; a file this build wrote is format 2. Every
/// command of the previous build refuses it before reading or writing a record, naming both
/// versions, and this build reads it unchanged afterwards (docs/design/compatibility.md).
#[test]
fn the_previous_build_refuses_a_file_this_build_wrote() {
    let Some((prev, this)) = both_builds() else { return };
    let dir = tempfile::tempdir().expect("tempdir");
    let store = format!("file:{}", dir.path().join("ids.redb").display());
    let (code, _, err) = run(&this, &store, &["pool", "create", "p", "--range", "1-9"]);
    assert_eq!(code, Some(0), "{err}");
    let (code, id, err) = run(&this, &store, &["acquire", "p", "k", "--holder", "h"]);
    assert_eq!(code, Some(0), "{err}");
    for args in [&["status"][..], &["list", "p"], &["acquire", "p", "k2"], &["check"]] {
        let (code, out, err) = run(&prev, &store, args);
        assert!(code.is_some_and(|c| c != 0), "{args:?} of the previous build: {out}");
        assert!(
            err.contains(
                "format version 2 was written by a newer idalloc; this build reads versions up to 1"
            ),
            "{args:?}: {err}"
        );
    }
    let (code, now, err) = run(&this, &store, &["get", "p", "k"]);
    assert_eq!((code, now), (Some(0), id), "{err}");
    let (code, out, err) = run(&this, &store, &["get", "p", "k2"]);
    assert_ne!(code, Some(0), "k2 was never bound: {out} {err}");
    let (code, out, err) = run(&this, &store, &["check"]);
    assert_eq!(code, Some(0), "{out} {err}");
}

/// What one worker saw.
#[derive(Default)]
struct Tally {
    /// Acquires that answered, per build (this, previous).
    acquired: [AtomicUsize; 2],
    /// Releases that answered of a key the other build acquired: (acquired by the previous build,
    /// released by this one: an upgrade), (the other way: a rollback).
    crossed: [AtomicUsize; 2],
    kills: AtomicUsize,
    violations: Mutex<Vec<String>>,
}

/// Runs `bin` with the store flags and `args`; kills it after `kill_after` if given. `None` if
/// killed, else (exit code, stdout, stderr).
fn cli(
    bin: &Path,
    endpoints: &str,
    args: &[&str],
    kill_after: Option<Duration>,
) -> Option<(i32, String, String)> {
    let mut child = Command::new(bin)
        .args(["--endpoints", endpoints, "--prefix", PREFIX, "--timeout", "2s"])
        .args(args)
        .env_remove("IDALLOC_STORE")
        .env_remove("IDALLOC_SERVER")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn idalloc");
    if let Some(after) = kill_after {
        let start = Instant::now();
        while start.elapsed() < after {
            if child.try_wait().expect("try_wait").is_some() {
                break;
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        if child.try_wait().expect("try_wait").is_none() {
            let _ = child.kill();
            let _ = child.wait();
            return None;
        }
    }
    let out = child.wait_with_output().expect("wait");
    let text = |b: &[u8]| String::from_utf8_lossy(b).trim().to_string();
    Some((out.status.code().unwrap_or(-1), text(&out.stdout), text(&out.stderr)))
}

/// One worker: acquire a key, check it with `get`, release it, each step with either build (the
/// acquire alternates between them; `get` and the release pick one at random, so a holder's
/// reference written by one build is read and released by the other, in both directions); a kill
/// or failure moves it to a new holder name, so a late request of an earlier attempt never
/// touches what it checks next. `bins`: this build's binary, then the previous build's.
fn worker(i: usize, bins: [PathBuf; 2], endpoints: String, stop: Arc<AtomicBool>, t: Arc<Tally>) {
    let mut rng = StdRng::seed_from_u64(i as u64 * 7919 + 1);
    let mut generation = 0;
    let name = |b: usize| if b == 1 { "previous" } else { "this" };
    while !stop.load(Ordering::Relaxed) {
        let old = (i + generation) % 2;
        let bin = &bins[old];
        let build = name(old);
        let key = format!("k{}", rng.random_range(0..KEYS));
        let holder = format!("w{i}-{generation}");
        let kill = |rng: &mut StdRng| {
            rng.random_bool(0.2).then(|| Duration::from_millis(rng.random_range(0..400)))
        };
        let acquired =
            cli(bin, &endpoints, &["acquire", POOL, &key, "--holder", &holder], kill(&mut rng));
        let Some((0, id, _)) = acquired else {
            if acquired.is_none() {
                t.kills.fetch_add(1, Ordering::Relaxed);
            }
            generation += 1;
            continue;
        };
        t.acquired[old].fetch_add(1, Ordering::Relaxed);
        // Held: nothing may move the key's ID. `get` reads only; an unanswered one proves nothing.
        let reader = usize::from(rng.random_bool(0.5));
        match cli(&bins[reader], &endpoints, &["get", POOL, &key], None) {
            Some((0, now, _)) if now != id => t.violations.lock().unwrap().push(format!(
                "{holder} holds {key} with ID {id} (acquired by the {build} build), but get of \
                 the {} build answers {now}",
                name(reader)
            )),
            Some((3, _, err)) => t.violations.lock().unwrap().push(format!(
                "{holder} holds {key} with ID {id} (acquired by the {build} build), but get of \
                 the {} build finds no binding: {err}",
                name(reader)
            )),
            _ => {}
        }
        let releaser = usize::from(rng.random_bool(0.5));
        let released = cli(
            &bins[releaser],
            &endpoints,
            &["release", POOL, &key, "--holder", &holder],
            kill(&mut rng),
        );
        if matches!(released, Some((0, _, _))) && releaser != old {
            t.crossed[old].fetch_add(1, Ordering::Relaxed);
        }
        if !matches!(released, Some((0, _, _))) {
            if released.is_none() {
                t.kills.fetch_add(1, Ordering::Relaxed);
            }
            generation += 1;
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cli_workers_of_two_builds_on_one_pool_keep_g1_through_kills_and_pauses() {
    if !etcd_or_skip("the mixed-build run") {
        return;
    }
    let Some((prev, this)) = both_builds() else { return };
    let secs: u64 = std::env::var("MIXED_SECS").ok().and_then(|s| s.parse().ok()).unwrap_or(30);
    let mut cluster = EtcdCluster::start_fast(3).await.expect("3-member etcd cluster");
    let endpoints = cluster.endpoints().join(",");
    // The pool is created by the previous build, as it would be before the upgrade.
    let made = cli(&prev, &endpoints, &["pool", "create", POOL, "--range", "1-12"], None);
    assert!(matches!(made, Some((0, _, _))), "{made:?}");

    let stop = Arc::new(AtomicBool::new(false));
    let tally = Arc::new(Tally::default());
    let workers: Vec<_> = (0..WORKERS)
        .map(|i| {
            let bins = [this.clone(), prev.clone()];
            let (endpoints, stop, tally) = (endpoints.clone(), stop.clone(), tally.clone());
            std::thread::spawn(move || worker(i, bins, endpoints, stop, tally))
        })
        .collect();

    let mut eo = EtcdOptions::new(cluster.endpoints());
    eo.request_timeout = Duration::from_secs(3);
    eo.connect_timeout = Duration::from_secs(1);
    let observer = EtcdStore::connect(eo).await.expect("observer");
    let layout = Layout::new(PREFIX).expect("layout");
    let mut problems: Vec<String> = Vec::new();
    let mut scans = 0;
    let mut faults = 0;
    let mut rng = StdRng::seed_from_u64(secs);
    let end = Instant::now() + Duration::from_secs(secs);
    while Instant::now() < end {
        // One fault of a member (kill and restart, or a pause shorter or longer than the
        // clients' 2 s timeout), then a scan.
        let m = rng.random_range(0..3);
        if rng.random_bool(0.5) {
            cluster.pause_member(m).expect("pause");
            tokio::time::sleep(Duration::from_millis(rng.random_range(300..3500))).await;
            cluster.resume_member(m).expect("resume");
        } else {
            cluster.kill_member(m).expect("kill");
            tokio::time::sleep(Duration::from_millis(rng.random_range(200..1500))).await;
            cluster.restart_member(m).await.expect("restart");
        }
        faults += 1;
        tokio::time::sleep(Duration::from_millis(500)).await;
        if let Ok(snap) = read_pool(&observer, &layout, POOL).await {
            scans += 1;
            problems.extend(analyze(&snap).problems);
        }
    }
    stop.store(true, Ordering::Relaxed);
    for w in workers {
        w.join().expect("worker");
    }
    let snap = read_pool(&observer, &layout, POOL).await.expect("final scan");
    problems.extend(analyze(&snap).problems);
    let check = cli(&this, &endpoints, &["check"], None);

    let violations = tally.violations.lock().unwrap().clone();
    let acquired = [0, 1].map(|b| tally.acquired[b].load(Ordering::Relaxed));
    let crossed = [0, 1].map(|b| tally.crossed[b].load(Ordering::Relaxed));
    println!(
        "mixed builds: {secs}s, {faults} member faults, {} client kills, {scans} scans, acquires \
         answered: {} by this build, {} by the previous; released by the other build: {} \
         acquired by this one, {} by the previous",
        tally.kills.load(Ordering::Relaxed),
        acquired[0],
        acquired[1],
        crossed[0],
        crossed[1]
    );
    assert!(problems.is_empty(), "raw scans: {problems:?}");
    assert!(violations.is_empty(), "{violations:?}");
    assert!(matches!(check, Some((0, _, _))), "today's check: {check:?}");
    assert!(acquired[0] > 0 && acquired[1] > 0, "both builds worked: {acquired:?}");
    assert!(crossed[0] > 0 && crossed[1] > 0, "releases across builds, both ways: {crossed:?}");
}
