//! CLI workers of this build and of the previous build on one pool of a 3-member etcd, with
//! client kills, member kills and member pauses (docs/design/cluster-version.md). The cluster
//! stays at version 1, as during a rolling upgrade. Each worker's steps use either build, so a
//! reference one build wrote is read and released by the other, in both directions (an upgrade
//! and a rollback mid-hold). Checked: G1 on raw scans during and after the run; every key's ID
//! unchanged while a worker holds it (its `get` between acquire and release answers the ID its
//! acquire printed); today's `idalloc check` finds nothing; and the history of every acquire and
//! release (invoke and return times, the JSON answer; a killed or failed call as one that may or
//! may not have taken effect), with the scans as observations, linearizable per key against the
//! chaos tests' model and checker (`idalloc_chaos::linearize`), plus G1 and G3 on the answers.
//! After every fault, a process of this build that would fold holder fence records above 1
//! sweeps the pool: at cluster version 1 no fold happens and no floor record appears.
//!
//! The previous build is a binary named by `IDALLOC_PREV_BIN` (`scripts/test.sh` builds it from
//! the commit before the fence floor); without it the test prints why and passes. This build's
//! binary is `IDALLOC_BIN`, else `idalloc` beside the test's directory (`target/debug/idalloc`).
//! `MIXED_SECS` sets the run's length (default 30), `MIXED_SEED` its random choices (default: the
//! clock; printed). On a violation the histories are kept in `$TMPDIR/idalloc-mixed-failed-<seed>/`.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use idalloc::layout::Layout;
use idalloc::store::etcd::{EtcdOptions, EtcdStore};
use idalloc_chaos::history::{now_ns, read_histories, History, Op, OpKind, Outcome, Record};
use idalloc_chaos::linearize::{check, CheckError, KeyOp};
use idalloc_chaos::model::{Call, KeyState, Ret};
use idalloc_chaos::scan::{analyze, Scan};
use idalloc_testkit::etcd::{etcd_or_skip, EtcdCluster};
use idalloc_testkit::g1::read_pool;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

const POOL: &str = "mixed";
const PREFIX: &str = "mixed-builds";
const KEYS: usize = 8;
const WORKERS: usize = 6;
/// The pool's IDs (G3: every answer lies within).
const MAX_ID: u64 = 12;
/// A call without an answer (killed, or failed after the CLI's own retries) may still commit this
/// long after its process ended: the chaos tests' bound for a request held up in a paused or
/// restarting member.
const INDETERMINATE_WINDOW: Duration = Duration::from_secs(10);
/// Names of the builds, indexed as `bins` (this one, then the previous one).
const BUILD: [&str; 2] = ["this", "previous"];

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

/// What the workers saw.
#[derive(Default)]
struct Tally {
    /// Acquires that answered, per build (this, previous).
    acquired: [AtomicUsize; 2],
    /// Releases that answered of a key the other build acquired: (acquired by the previous build,
    /// released by this one: an upgrade), (the other way: a rollback).
    crossed: [AtomicUsize; 2],
    /// When the process of each killed call was reaped, by (proc, seq): its history has no return.
    killed: Mutex<HashMap<(String, u64), u64>>,
    violations: Mutex<Vec<String>>,
}

impl Tally {
    fn violation(&self, v: String) {
        self.violations.lock().expect("violations").push(v);
    }
}

/// Runs `bin` with the store flags, `--json` and `args`; kills it after `kill_after` if given.
/// `None` if killed, else (exit code, stdout, stderr).
fn cli(
    bin: &Path,
    endpoints: &str,
    args: &[&str],
    kill_after: Option<Duration>,
) -> Option<(i32, String, String)> {
    let mut child = Command::new(bin)
        .args(["--endpoints", endpoints, "--prefix", PREFIX, "--timeout", "2s", "--json"])
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

/// The outcome an acquire's, release's or get's JSON answer states (both builds print the same
/// fields).
fn answer(op: OpKind, out: &str) -> Option<Outcome> {
    let v: serde_json::Value = serde_json::from_str(out).ok()?;
    match op {
        OpKind::Acquire => {
            Some(Outcome::Acquired { id: v["id"].as_u64()?, new: v["new"].as_bool()? })
        }
        OpKind::Release => Some(Outcome::Released {
            held: v["released"].as_bool()?,
            reclaimed: v["reclaimed"].as_bool()?,
        }),
        OpKind::Get => Some(Outcome::Got { id: Some(v["id"].as_u64()?) }),
        OpKind::Renew | OpKind::Revoke => None,
    }
}

/// One worker's binaries, store and history file.
struct Worker {
    /// This build's binary, then the previous build's.
    bins: [PathBuf; 2],
    endpoints: String,
    history: std::fs::File,
    seq: u64,
    tally: Arc<Tally>,
}

impl Worker {
    fn record(&mut self, rec: &Record) {
        let mut line = serde_json::to_string(rec).expect("history record");
        line.push('\n');
        self.history.write_all(line.as_bytes()).expect("write the history");
    }

    /// Runs `op` (acquire, release or get) of `key` for `holder` with build `b`, killed after
    /// `kill_after` if given, and records it: the invoke before the process starts, the return
    /// when it exits (a failure as an error: it may have taken effect; a `get`'s exit 3 as "no
    /// ID"), or for a killed one, no return and the kill's time in the tally. Answers the
    /// outcome, `None` if killed.
    fn call(
        &mut self,
        b: usize,
        op: OpKind,
        key: &str,
        holder: &str,
        kill_after: Option<Duration>,
    ) -> Option<Outcome> {
        self.seq += 1;
        let seq = self.seq;
        let proc_ = format!("{holder}.{}", BUILD[b]);
        let verb = match op {
            OpKind::Acquire => "acquire",
            OpKind::Release => "release",
            OpKind::Get => "get",
            OpKind::Renew | OpKind::Revoke => panic!("{op:?} is no command of the CLI"),
        };
        self.record(&Record::Invoke {
            proc: proc_.clone(),
            holder: holder.to_string(),
            seq,
            op,
            key: key.to_string(),
            t: now_ns(),
            batch: 0,
        });
        let args = [verb, POOL, key, "--holder", holder];
        let args = if op == OpKind::Get { &args[..3] } else { &args[..] };
        let ran = cli(&self.bins[b], &self.endpoints, args, kill_after);
        let t = now_ns();
        let outcome = match ran {
            None => {
                self.tally.killed.lock().expect("kills").insert((proc_, seq), t);
                return None;
            }
            Some((0, out, _)) => answer(op, &out).unwrap_or_else(|| {
                self.tally.violation(format!(
                    "{proc_}#{seq}: {verb} of {key} exited 0 with an answer that is not its JSON: \
                     {out:?}"
                ));
                Outcome::Error { kind: "unreadable answer".into(), msg: out }
            }),
            Some((3, _, _)) if op == OpKind::Get => Outcome::Got { id: None },
            Some((code, _, err)) => Outcome::Error { kind: format!("exit {code}"), msg: err },
        };
        self.record(&Record::Return { proc: proc_, seq, t, outcome: outcome.clone() });
        Some(outcome)
    }
}

/// One worker: acquire a key, check it with `get`, release it, each step with either build (the
/// acquire alternates between them; `get` and the release pick one at random, so a holder's
/// reference written by one build is read and released by the other, in both directions); a kill
/// or failure moves it to a new holder name, so a late request of an earlier attempt never
/// touches what it checks next.
fn worker(i: usize, mut w: Worker, seed: u64, stop: Arc<AtomicBool>) {
    let mut rng = StdRng::seed_from_u64(seed.wrapping_add(i as u64 * 7919 + 1));
    let mut generation = 0;
    let t = w.tally.clone();
    while !stop.load(Ordering::Relaxed) {
        let old = (i + generation) % 2;
        let key = format!("k{}", rng.random_range(0..KEYS));
        let holder = format!("w{i}-{generation}");
        let kill = |rng: &mut StdRng| {
            rng.random_bool(0.2).then(|| Duration::from_millis(rng.random_range(0..400)))
        };
        let Some(Outcome::Acquired { id, .. }) =
            w.call(old, OpKind::Acquire, &key, &holder, kill(&mut rng))
        else {
            generation += 1;
            continue;
        };
        t.acquired[old].fetch_add(1, Ordering::Relaxed);
        // Held: nothing may move the key's ID. `get` reads only; an unanswered one proves nothing.
        let reader = usize::from(rng.random_bool(0.5));
        let held =
            format!("{holder} holds {key} with ID {id} (acquired by the {} build)", BUILD[old]);
        if let Some(Outcome::Got { id: now }) = w.call(reader, OpKind::Get, &key, &holder, None) {
            if now != Some(id) {
                t.violation(format!(
                    "{held}, but get of the {} build answers {now:?}",
                    BUILD[reader]
                ));
            }
        }
        let releaser = usize::from(rng.random_bool(0.5));
        let released = w.call(releaser, OpKind::Release, &key, &holder, kill(&mut rng));
        if matches!(released, Some(Outcome::Released { .. })) {
            if releaser != old {
                t.crossed[old].fetch_add(1, Ordering::Relaxed);
            }
        } else {
            generation += 1;
        }
    }
}

/// A scan of the pool and when it was asked for and answered: one read at one revision, so an
/// observation of every key at a moment within that span.
struct Observed {
    invoke: u64,
    end: u64,
    scan: Scan,
}

/// What the history check found.
#[derive(Debug, Default)]
struct Verdict {
    calls: usize,
    /// Answered `get`s.
    gets: usize,
    /// Acquires and releases killed or failed: they may or may not have taken effect.
    unknown: usize,
    keys: usize,
    /// Largest number of configurations the checker kept at once.
    widest: usize,
    violations: Vec<String>,
}

/// Checks the workers' history `h` with the `scans`: each key's calls (a `get` without an answer
/// left out), and every scan as an observation of it, linearizable against the chaos tests' model; every ID within the pool
/// (G3); and no two keys answered the same ID while both were held (G1 on the answers: a
/// cross-key property the per-key check cannot see). A call with no return is taken to end when
/// `killed` says it was killed; it and a failed call may take effect for `INDETERMINATE_WINDOW`.
fn check_history(h: &History, killed: &HashMap<(String, u64), u64>, scans: &[Observed]) -> Verdict {
    let mut v = Verdict { calls: h.ops.len(), ..Verdict::default() };
    let t0 = h.ops.iter().map(|o| o.invoke).min().unwrap_or(0);
    let at = |t: u64| t.saturating_sub(t0) as f64 / 1e9;
    let window = INDETERMINATE_WINDOW.as_nanos() as u64;
    let mut holders: HashMap<&str, u32> = HashMap::new();
    for op in &h.ops {
        let n = holders.len() as u32;
        holders.entry(op.holder.as_str()).or_insert(n);
    }
    // Per key: the checker's calls and a line on each for the report.
    let mut by_key: BTreeMap<&str, Vec<(KeyOp, String)>> = BTreeMap::new();
    for op in &h.ops {
        let holder = holders[op.holder.as_str()];
        let call = match op.kind {
            OpKind::Acquire => Call::Acquire { holder },
            OpKind::Release => Call::Release { holder },
            // A read without an answer changed nothing: it has nothing to place.
            OpKind::Get if !matches!(op.ret, Some((_, Outcome::Got { .. }))) => continue,
            OpKind::Get => Call::Get,
            other => {
                v.violations
                    .push(format!("{}#{}: {other:?} is not a call of this test", op.proc, op.seq));
                continue;
            }
        };
        let (ret, end) = match &op.ret {
            Some((t, Outcome::Acquired { id, new })) => {
                if !(1..=MAX_ID).contains(id) {
                    v.violations.push(format!(
                        "G3: {}#{} was told ID {id} for {}, outside [1, {MAX_ID}]",
                        op.proc, op.seq, op.key
                    ));
                }
                (Ret::Acquired { id: *id, new: *new }, *t)
            }
            Some((t, Outcome::Released { held, reclaimed })) => {
                (Ret::Released { held: *held, reclaimed: *reclaimed }, *t)
            }
            Some((t, Outcome::Got { id })) => {
                v.gets += 1;
                (Ret::Got { id: *id }, *t)
            }
            Some((t, _)) => {
                v.unknown += 1;
                (Ret::Unknown, t.saturating_add(window))
            }
            None => {
                v.unknown += 1;
                let end = killed.get(&(op.proc.clone(), op.seq)).copied().unwrap_or(u64::MAX);
                (Ret::Unknown, end.saturating_add(window))
            }
        };
        let line = format!(
            "+{:.3}..{} {}#{} {:?} -> {}",
            at(op.invoke),
            op.ret.as_ref().map_or("killed".to_string(), |(t, _)| format!("+{:.3}", at(*t))),
            op.proc,
            op.seq,
            op.kind,
            op.ret.as_ref().map_or("no answer".to_string(), |(_, o)| format!("{o:?}")),
        );
        by_key
            .entry(&op.key)
            .or_default()
            .push((KeyOp { call, ret, invoke: op.invoke, end }, line));
    }
    // Every scan observes every key it or a call names.
    let mut keys: BTreeSet<&str> = by_key.keys().copied().collect();
    for s in scans {
        keys.extend(s.scan.bindings.keys().map(String::as_str));
        keys.extend(s.scan.holders.keys().map(String::as_str));
    }
    for s in scans {
        for &key in &keys {
            let mut seen = BTreeSet::new();
            for name in s.scan.holders.get(key).into_iter().flatten() {
                match holders.get(name.as_str()) {
                    Some(i) => {
                        seen.insert(*i);
                    }
                    None => v.violations.push(format!(
                        "scan at +{:.3}: {key} is held by {name:?}, which made no call",
                        at(s.invoke)
                    )),
                }
            }
            let bound = s.scan.bindings.get(key).copied();
            let line = format!(
                "+{:.3}..+{:.3} scan: bound to {bound:?}, holders {:?}",
                at(s.invoke),
                at(s.end),
                s.scan.holders.get(key).cloned().unwrap_or_default()
            );
            let ko = KeyOp {
                call: Call::Observe { bound, holders: seen },
                ret: Ret::Observed,
                invoke: s.invoke,
                end: s.end,
            };
            by_key.entry(key).or_default().push((ko, line));
        }
    }
    v.keys = by_key.len();
    for (key, ops) in &by_key {
        let calls: Vec<KeyOp> = ops.iter().map(|(o, _)| o.clone()).collect();
        let bad = match check(KeyState::default(), &calls) {
            Ok(c) => {
                v.widest = v.widest.max(c.max_configs);
                continue;
            }
            Err(CheckError::Violation(e)) => (
                e.op,
                format!("no linearization explains it; states before: {:?}", e.states_before),
            ),
            Err(CheckError::TooWide { op }) => (op, "search too wide: inconclusive".to_string()),
        };
        let (i, why) = bad;
        // The key's calls invoked in the 10 s before it, up to it.
        let from = calls[i].invoke.saturating_sub(window);
        let mut before: Vec<&(KeyOp, String)> =
            ops.iter().filter(|(o, _)| o.invoke >= from && o.invoke <= calls[i].end).collect();
        before.sort_by_key(|(o, _)| o.invoke);
        let excerpt: Vec<&str> =
            before.iter().rev().take(40).rev().map(|(_, l)| l.as_str()).collect();
        v.violations.push(format!(
            "linearizability of {key}: {} ({why}); its calls from 10 s before:\n    {}",
            ops[i].1,
            excerpt.join("\n    ")
        ));
    }
    v.violations.extend(overlapping_answers(h, &at));
    v
}

/// G1 on the answers: an acquire answered ID X for key A holds X for A from its return until its
/// holder invokes a release of A (to the end if it never does: a durable reference stays); two
/// such holds of different keys with one ID overlapping in time are two keys bound to one ID.
fn overlapping_answers(h: &History, at: &dyn Fn(u64) -> f64) -> Vec<String> {
    let mut releases: HashMap<(&str, &str), Vec<u64>> = HashMap::new();
    for op in h.ops.iter().filter(|o| o.kind == OpKind::Release) {
        releases.entry((&op.holder, &op.key)).or_default().push(op.invoke);
    }
    let mut holds: BTreeMap<u64, Vec<(u64, u64, &Op)>> = BTreeMap::new();
    for op in &h.ops {
        let Some((from, Outcome::Acquired { id, .. })) = &op.ret else { continue };
        let to = releases
            .get(&(op.holder.as_str(), op.key.as_str()))
            .into_iter()
            .flatten()
            .copied()
            .filter(|t| t > from)
            .min()
            .unwrap_or(u64::MAX);
        holds.entry(*id).or_default().push((*from, to, op));
    }
    let mut out = Vec::new();
    for (id, hs) in &holds {
        for (n, (fa, ta, a)) in hs.iter().enumerate() {
            for (fb, tb, b) in &hs[n + 1..] {
                if a.key != b.key && fa < tb && fb < ta {
                    out.push(format!(
                        "G1 on the answers: {}#{} was told ID {id} for {} (held +{:.3}..+{:.3}) and \
                         {}#{} the same ID for {} (held +{:.3}..+{:.3})",
                        a.proc,
                        a.seq,
                        a.key,
                        at(*fa),
                        at(*ta),
                        b.proc,
                        b.seq,
                        b.key,
                        at(*fb),
                        at(*tb)
                    ));
                }
            }
        }
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cli_workers_of_two_builds_on_one_pool_keep_g1_through_kills_and_pauses() {
    if !etcd_or_skip("the mixed-build run") {
        return;
    }
    let Some((prev, this)) = both_builds() else { return };
    let secs: u64 = std::env::var("MIXED_SECS").ok().and_then(|s| s.parse().ok()).unwrap_or(30);
    let seed: u64 =
        std::env::var("MIXED_SEED").ok().and_then(|s| s.parse().ok()).unwrap_or_else(now_ns);
    println!("mixed builds: {secs} s, seed {seed}");
    let mut cluster = EtcdCluster::start_fast(3).await.expect("3-member etcd cluster");
    let endpoints = cluster.endpoints().join(",");
    // The pool is created by the previous build, as it would be before the upgrade.
    let range = format!("1-{MAX_ID}");
    let made = cli(&prev, &endpoints, &["pool", "create", POOL, "--range", &range], None);
    assert!(matches!(made, Some((0, _, _))), "{made:?}");

    let work = tempfile::Builder::new().prefix("idalloc-mixed-").tempdir().expect("temp dir");
    let paths: Vec<PathBuf> =
        (0..WORKERS).map(|i| work.path().join(format!("w{i}.jsonl"))).collect();
    let stop = Arc::new(AtomicBool::new(false));
    let tally = Arc::new(Tally::default());
    let workers: Vec<_> = paths
        .iter()
        .enumerate()
        .map(|(i, path)| {
            let w = Worker {
                bins: [this.clone(), prev.clone()],
                endpoints: endpoints.clone(),
                history: std::fs::File::create(path).expect("history file"),
                seq: 0,
                tally: tally.clone(),
            };
            let stop = stop.clone();
            std::thread::spawn(move || worker(i, w, seed, stop))
        })
        .collect();

    let mut eo = EtcdOptions::new(cluster.endpoints());
    eo.request_timeout = Duration::from_secs(3);
    eo.connect_timeout = Duration::from_secs(1);
    let observer = EtcdStore::connect(eo.clone()).await.expect("observer");
    let layout = Layout::new(PREFIX).expect("layout");
    // An upgraded process that would fold the holder fence records into the floor at the first
    // chance (above 1 record) sweeps after every fault: at cluster version 1 the fold must never
    // happen, since the previous build does not compare the floor.
    let folder = idalloc::Allocator::from_arc(
        Arc::new(EtcdStore::connect(eo).await.expect("folder's store")),
        idalloc::AllocatorOptions::builder()
            .prefix(PREFIX)
            .holder("folder")
            .request_timeout(Duration::from_secs(2))
            .fold_fences_above(1)
            .build()
            .expect("folder's options"),
    )
    .expect("folder");
    let folder_pool = folder.pool(POOL).await.expect("folder opens the pool");
    let (mut sweeps, mut most_fences, mut folded) = (0, 0, 0);
    let mut problems: Vec<String> = Vec::new();
    let mut scans: Vec<Observed> = Vec::new();
    let mut faults = 0;
    let mut rng = StdRng::seed_from_u64(seed);
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
        if let Ok(Ok(r)) = tokio::time::timeout(Duration::from_secs(5), folder_pool.sweep()).await {
            sweeps += 1;
            most_fences = most_fences.max(r.fence_records);
            folded += r.folded;
        }
        let invoke = now_ns();
        if let Ok(snap) = read_pool(&observer, &layout, POOL).await {
            let scan = analyze(&snap);
            problems.extend(scan.problems.iter().cloned());
            scans.push(Observed { invoke, end: now_ns(), scan });
        }
    }
    stop.store(true, Ordering::Relaxed);
    for w in workers {
        w.join().expect("worker");
    }
    let invoke = now_ns();
    let snap = read_pool(&observer, &layout, POOL).await.expect("final scan");
    let scan = analyze(&snap);
    problems.extend(scan.problems.iter().cloned());
    scans.push(Observed { invoke, end: now_ns(), scan });
    let check = cli(&this, &endpoints, &["check"], None);
    let floor = idalloc::store::GetRequest::key(layout.fence_floor_key(POOL));
    let floor = idalloc::store::Store::get(&observer, floor).await.expect("read the floor");
    drop(folder_pool);
    let _ = folder.close().await;

    let history = read_histories(&paths).expect("read the histories");
    let killed = tally.killed.lock().expect("kills").clone();
    let verdict = check_history(&history, &killed, &scans);
    let violations = tally.violations.lock().expect("violations").clone();
    let acquired = [0, 1].map(|b| tally.acquired[b].load(Ordering::Relaxed));
    let crossed = [0, 1].map(|b| tally.crossed[b].load(Ordering::Relaxed));
    println!(
        "mixed builds: {secs}s, {faults} member faults, {} client kills, {} scans, acquires \
         answered: {} by this build, {} by the previous; released by the other build: {} \
         acquired by this one, {} by the previous",
        killed.len(),
        scans.len(),
        acquired[0],
        acquired[1],
        crossed[0],
        crossed[1]
    );
    println!(
        "history: {} calls ({} of them answered gets), {} acquires and releases killed or failed; \
         linearizability of {} keys with {} scans each, widest search {} configurations; \
         violations: {}",
        verdict.calls,
        verdict.gets,
        verdict.unknown,
        verdict.keys,
        scans.len(),
        verdict.widest,
        verdict.violations.len()
    );
    println!("folder: {sweeps} sweeps, up to {most_fences} holder fence records, {folded} folded");
    for v in &verdict.violations {
        println!("  - {v}");
    }
    if !verdict.violations.is_empty() {
        let keep = std::env::temp_dir().join(format!("idalloc-mixed-failed-{seed}"));
        let _ = std::fs::create_dir_all(&keep);
        for p in &paths {
            if let Some(name) = p.file_name() {
                let _ = std::fs::copy(p, keep.join(name));
            }
        }
        println!("histories kept in {}", keep.display());
    }
    assert!(problems.is_empty(), "raw scans: {problems:?}");
    assert!(violations.is_empty(), "{violations:?}");
    assert!(
        verdict.violations.is_empty(),
        "history: {} violations (above)",
        verdict.violations.len()
    );
    assert!(matches!(check, Some((0, _, _))), "today's check: {check:?}");
    assert!(sweeps > 0 && most_fences > 1, "the folder had records to fold: {most_fences}");
    assert_eq!(folded, 0, "a fold at cluster version 1");
    assert!(floor.kvs.is_empty(), "a fence floor record at cluster version 1");
    assert!(acquired[0] > 0 && acquired[1] > 0, "both builds worked: {acquired:?}");
    assert!(crossed[0] > 0 && crossed[1] > 0, "releases across builds, both ways: {crossed:?}");
    assert!(
        verdict.unknown > 0,
        "no call was killed or failed: the history checked no unknown outcome"
    );
}

/// Histories of the shape the run records, checked by [`check_history`] without etcd: each
/// planted break must be reported, and its unbroken twin must pass.
mod the_history_check {
    use super::*;

    const S: u64 = 1_000_000_000;

    /// A call of the process `proc_` (`holder.build`) from `invoke` to its return, if any.
    fn op(
        proc_: &str,
        seq: u64,
        kind: OpKind,
        key: &str,
        invoke: u64,
        ret: Option<(u64, Outcome)>,
    ) -> Op {
        let holder = proc_.split('.').next().unwrap_or_default().to_string();
        Op { proc: proc_.into(), holder, seq, kind, key: key.into(), invoke, ret, batch: 0 }
    }
    fn acq(proc_: &str, seq: u64, key: &str, t: u64, id: u64, new: bool) -> Op {
        op(proc_, seq, OpKind::Acquire, key, t, Some((t + S, Outcome::Acquired { id, new })))
    }
    fn rel(proc_: &str, seq: u64, key: &str, t: u64, reclaimed: bool) -> Op {
        let ret = Outcome::Released { held: true, reclaimed };
        op(proc_, seq, OpKind::Release, key, t, Some((t + S, ret)))
    }
    /// A scan at `t` finding `key` bound to `id` (if given) and held by `holders`.
    fn scan(t: u64, key: &str, id: Option<u64>, holders: &[&str]) -> Observed {
        let mut scan = Scan::default();
        if let Some(id) = id {
            scan.bindings.insert(key.into(), id);
        }
        if !holders.is_empty() {
            scan.holders.insert(key.into(), holders.iter().map(|h| h.to_string()).collect());
        }
        Observed { invoke: t, end: t + S / 10, scan }
    }
    fn verdict(ops: Vec<Op>, killed: &[(&str, u64, u64)], scans: &[Observed]) -> Verdict {
        let killed = killed.iter().map(|(p, s, t)| ((p.to_string(), *s), *t)).collect();
        check_history(&History { ops, ..History::default() }, &killed, scans)
    }

    #[test]
    fn rejects_a_key_whose_id_changes_while_held() {
        // w0 binds k with this build and holds it; w1 joins with the previous build, and both
        // release with the other build.
        let run = |joined: u64| {
            verdict(
                vec![
                    acq("w0-0.this", 1, "k", 0, 5, true),
                    acq("w1-0.previous", 1, "k", 2 * S, joined, false),
                    rel("w0-0.previous", 2, "k", 4 * S, false),
                    rel("w1-0.this", 2, "k", 6 * S, true),
                ],
                &[],
                &[scan(8 * S, "k", None, &[])],
            )
        };
        let ok = run(5);
        assert!(ok.violations.is_empty(), "{:?}", ok.violations);
        assert_eq!((ok.calls, ok.unknown, ok.keys), (4, 0, 1));
        let moved = run(6);
        assert_eq!(moved.violations.len(), 1, "{:?}", moved.violations);
        assert!(
            moved.violations[0].starts_with("linearizability of k: +2.000..+3.000 w1-0.previous#1")
        );
    }

    #[test]
    fn rejects_a_get_that_contradicts_the_holders_answer() {
        // w0 binds k anew and nobody else ever looks: only its own get can contradict it.
        let run = |read: Option<u64>| {
            let got = Some((3 * S, Outcome::Got { id: read }));
            verdict(
                vec![
                    acq("w0-0.previous", 1, "k", 0, 5, true),
                    op("w0-0.this", 2, OpKind::Get, "k", 2 * S, got),
                    rel("w0-0.this", 3, "k", 4 * S, true),
                ],
                &[],
                &[],
            )
        };
        let ok = run(Some(5));
        assert!(ok.violations.is_empty(), "{:?}", ok.violations);
        assert_eq!(ok.gets, 1);
        for read in [Some(6), None] {
            let v = run(read);
            assert_eq!(v.violations.len(), 1, "{read:?}: {:?}", v.violations);
            assert!(v.violations[0].starts_with("linearizability of k: +2.000..+3.000 w0-0.this#2"));
        }
        // A get that failed proves nothing and is left out.
        let failed = Outcome::Error { kind: "exit 5".into(), msg: "unavailable".into() };
        let v = verdict(
            vec![
                acq("w0-0.previous", 1, "k", 0, 5, true),
                op("w0-0.this", 2, OpKind::Get, "k", 2 * S, Some((3 * S, failed))),
            ],
            &[],
            &[],
        );
        assert!(v.violations.is_empty() && v.gets == 0 && v.unknown == 0, "{v:?}");
    }

    #[test]
    fn rejects_two_keys_told_one_id_while_both_held() {
        // w1 is told w0's ID for another key: while w0 still holds it, or after w0 released it.
        let run = |b_at: u64| {
            verdict(
                vec![
                    acq("w0-0.this", 1, "a", 0, 5, true),
                    acq("w1-0.previous", 1, "b", b_at, 5, true),
                    rel("w0-0.previous", 2, "a", 4 * S, true),
                    rel("w1-0.this", 2, "b", 10 * S, true),
                ],
                &[],
                &[],
            )
        };
        let after = run(6 * S);
        assert!(after.violations.is_empty(), "{:?}", after.violations);
        let both = run(2 * S);
        assert_eq!(both.violations.len(), 1, "{:?}", both.violations);
        assert!(both.violations[0].starts_with("G1 on the answers: w0-0.this#1 was told ID 5"));
    }

    #[test]
    fn rejects_an_id_outside_the_pool() {
        let v = verdict(vec![acq("w0-0.this", 1, "k", 0, MAX_ID + 1, true)], &[], &[]);
        assert!(v.violations.iter().any(|v| v.starts_with("G3:")), "{:?}", v.violations);
    }

    #[test]
    fn a_killed_or_failed_call_may_take_effect_within_its_window_only() {
        // w0's acquire is killed at +1 s; w1's release fails at +3 s.
        let killed = [("w0-0.this", 1, S)];
        let failed = Outcome::Error { kind: "exit 5".into(), msg: "unavailable".into() };
        let calls = |w2_new: bool| {
            vec![
                op("w0-0.this", 1, OpKind::Acquire, "k", 0, None),
                acq("w1-0.previous", 1, "k", S / 2, 5, true),
                op("w1-0.previous", 2, OpKind::Release, "k", 2 * S, Some((3 * S, failed.clone()))),
                acq("w2-0.this", 1, "k", 20 * S, 5, w2_new),
            ]
        };
        // Each took effect or not: the scan decides, and any of the four is explained.
        for held in [&["w0-0", "w1-0", "w2-0"][..], &["w0-0", "w2-0"], &["w1-0", "w2-0"]] {
            let v = verdict(calls(false), &killed, &[scan(30 * S, "k", Some(5), held)]);
            assert!(v.violations.is_empty(), "{held:?}: {:?}", v.violations);
            assert_eq!(v.unknown, 2);
        }
        // Neither took effect, so w2 bound k anew.
        let v = verdict(calls(true), &killed, &[scan(30 * S, "k", Some(5), &["w2-0"])]);
        assert!(v.violations.is_empty(), "{:?}", v.violations);
        // But w2's reference cannot vanish, nor can a holder appear that made no call...
        for held in [&["w0-0"][..], &["w2-0", "w9-0"]] {
            let v = verdict(calls(false), &killed, &[scan(30 * S, "k", Some(5), held)]);
            assert!(!v.violations.is_empty(), "{held:?} passed");
        }
        // ...nor w0's killed acquire take effect after its window (killed + 10 s): w2 finds the
        // key unbound at +20 s, so w0 cannot hold it at +30 s.
        let v = verdict(calls(true), &killed, &[scan(30 * S, "k", Some(5), &["w0-0", "w2-0"])]);
        assert!(!v.violations.is_empty(), "a commit after the window passed");
    }
}
