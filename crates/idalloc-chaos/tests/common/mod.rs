//! The chaos run shared by the chaos tests (docs/design/chaos.md): client processes, a fault cycle
//! against a [`Target`] etcd, the checks of G1 (scans), linearizability per key, G3 and G6 on
//! what the clients recorded, and the report. `chaos_etcd.rs` runs it on loopback clusters,
//! `chaos_netns.rs` on a cluster in network namespaces with network nemeses.
#![allow(dead_code)]

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::Duration;

use idalloc::layout::Layout;
use idalloc::store::etcd::{EtcdOptions, EtcdStore};
use idalloc_chaos::history::{now_ns, read_histories, OpKind, Outcome, Record};
use idalloc_chaos::linearize::{check, CheckError, KeyOp};
use idalloc_chaos::model::{Call, KeyState, Ret};
use idalloc_chaos::scan::{analyze, Scan};
use idalloc_chaos::sessions::{lease_ends, parse_timetolive, FinalLease};
use idalloc_testkit::etcd::EtcdCluster;
use idalloc_testkit::g1::read_pool;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

const CLIENTS: usize = 5;
const KEYS: usize = 6;
const POOL: &str = "chaos";
const MAX_ID: u64 = 64;
const REUSE_DELAY_MS: u64 = 1500;
/// Holder numbers of client sessions start here (durable holders are `h0`..`h4`: 0..4).
const SESSION_BASE: u32 = 1000;
/// An answerless call (killed mid-call, or an error after retries) may still commit for this long
/// after its process stopped waiting: bounds a request lingering in etcd's raft pipeline through
/// an election, with a wide margin.
const INDETERMINATE_WINDOW: Duration = Duration::from_secs(10);
/// After a leader fault ends, errors are still allowed this long (election, client back-off).
const ELECTION_GRACE: Duration = Duration::from_secs(3);
/// Member pauses shorter than the clients' request timeout (2 s, `chaos_client.rs`)...
const SHORT_PAUSE_MS: std::ops::RangeInclusive<u64> = 300..=1500;
/// ...and longer than it, so a frozen request is retried elsewhere and applied late (DESIGN §11).
/// `CHAOS_PAUSE_MAX_MS` raises the upper end.
const LONG_PAUSE_MS: std::ops::Range<u64> = 2500..3500;

fn secs(d: Duration) -> u64 {
    d.as_nanos() as u64
}

/// One client process, killed by PID (SIGKILL) and reaped on drop.
struct ClientProc {
    child: Child,
    tag: String,
}

impl Drop for ClientProc {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

struct Slot {
    holder: String,
    runs: usize,
    proc_: Option<ClientProc>,
}

struct Setup {
    bin: PathBuf,
    endpoints: String,
    prefix: String,
    until_ns: u64,
    dir: PathBuf,
    /// The clients' TLS and user flags (none on the plain cluster).
    client_args: Vec<String>,
}

impl Setup {
    fn history(&self, holder: &str) -> PathBuf {
        self.dir.join(format!("{holder}.jsonl"))
    }
    fn stderr(&self, holder: &str) -> PathBuf {
        self.dir.join(format!("{holder}.stderr"))
    }

    /// Starts the client of `slot` with `cmd` (the binary, or a wrapper that runs it, such as
    /// `ip netns exec`).
    fn spawn(&self, slot: &mut Slot, seed: u64, mut cmd: Command) -> ClientProc {
        slot.runs += 1;
        let tag = format!("{}.{}", slot.holder, slot.runs);
        let err = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.stderr(&slot.holder))
            .expect("client stderr file");
        let child = cmd
            .args(["--endpoints", &self.endpoints])
            .args(["--prefix", &self.prefix])
            .args(["--pool", POOL])
            .args(["--holder", &slot.holder])
            .args(["--proc", &tag])
            .args(["--keys", &KEYS.to_string()])
            .args(["--until-ns", &self.until_ns.to_string()])
            .arg("--history")
            .arg(self.history(&slot.holder))
            .args(["--seed", &seed.to_string()])
            .args(["--pause-ms", "100"])
            .args(["--max-id", &MAX_ID.to_string()])
            .args(["--reuse-delay-ms", &REUSE_DELAY_MS.to_string()])
            .args(&self.client_args)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(err)
            .spawn()
            .expect("start chaos-client");
        ClientProc { child, tag }
    }
}

/// A fault and when it was in force.
#[derive(Debug, Clone)]
struct Fault {
    what: &'static str,
    target: usize,
    /// It hit the leader (so the cluster was without a usable leader for a while).
    leader: bool,
    start: u64,
    end: u64,
}

#[derive(Default)]
struct Report {
    faults: Vec<Fault>,
    client_kills: Vec<(String, u64)>,
    scans: usize,
    /// Member pauses longer than the request timeout.
    long_pauses: usize,
    violations: Vec<String>,
}

async fn scan(store: &EtcdStore, layout: &Layout) -> Result<Scan, String> {
    let snap = read_pool(store, layout, POOL).await.map_err(|e| e.to_string())?;
    let mut s = analyze(&snap);
    for p in &mut s.problems {
        *p = format!("scan at revision {}: {p}", snap.revision);
    }
    Ok(s)
}

/// The etcd a chaos run injects faults into: members by index, as the clients reach them.
pub trait Target {
    fn members(&self) -> usize;
    fn endpoints(&self) -> Vec<String>;
    /// Where the run's keys go: the restricted user of a secured etcd can reach only its prefix.
    fn prefix_root(&self) -> &'static str;
    /// The chaos clients' TLS and user flags.
    fn client_args(&self, dir: &Path) -> Vec<String>;
    /// The observer's client (it scans the pool during and after the run).
    fn observer_options(&self) -> EtcdOptions;
    async fn leader(&self) -> Option<usize>;
    fn kill_member(&mut self, i: usize) -> Result<(), String>;
    async fn restart_member(&mut self, i: usize) -> Result<(), String>;
    fn pause_member(&mut self, i: usize) -> Result<(), String>;
    fn resume_member(&mut self, i: usize) -> Result<(), String>;
    fn dir(&self) -> &Path;
    /// `etcdctl`'s flags to reach the cluster from this process, if it can (plain loopback
    /// endpoints): the run asks it whether leases never seen gone are still alive.
    fn etcdctl_args(&self) -> Option<Vec<String>> {
        let eps = self.endpoints();
        eps.iter()
            .all(|e| e.starts_with("http://127.0.0.1:"))
            .then(|| vec!["--endpoints".to_string(), eps.join(",")])
    }
    /// The command that runs the client binary `bin` for client `i` (a wrapper may place it in
    /// a network namespace).
    fn client_command(&self, bin: &Path, _i: usize) -> Command {
        Command::new(bin)
    }
    /// Injects the fault `what` (a kind of the cycle this run does not know itself), holds it,
    /// heals it, and answers the member it targeted and whether it disrupted the cluster's
    /// service (then `Unavailable` errors are allowed during it, as during a leader fault).
    async fn nemesis(
        &mut self,
        what: &'static str,
        _leader: Option<usize>,
        _rng: &mut StdRng,
    ) -> Result<(usize, bool), String> {
        Err(format!("fault kind {what:?} is not known to this target"))
    }
}

/// A loopback cluster of the testkit (the chaos test's and the soak's).
impl Target for EtcdCluster {
    fn members(&self) -> usize {
        3
    }
    fn endpoints(&self) -> Vec<String> {
        EtcdCluster::endpoints(self)
    }
    fn prefix_root(&self) -> &'static str {
        ""
    }
    fn client_args(&self, _dir: &Path) -> Vec<String> {
        Vec::new()
    }
    fn observer_options(&self) -> EtcdOptions {
        let mut eo = EtcdOptions::new(EtcdCluster::endpoints(self));
        eo.request_timeout = Duration::from_secs(3);
        eo.connect_timeout = Duration::from_secs(1);
        eo
    }
    async fn leader(&self) -> Option<usize> {
        EtcdCluster::leader(self).await
    }
    fn kill_member(&mut self, i: usize) -> Result<(), String> {
        EtcdCluster::kill_member(self, i)
    }
    async fn restart_member(&mut self, i: usize) -> Result<(), String> {
        EtcdCluster::restart_member(self, i).await
    }
    fn pause_member(&mut self, i: usize) -> Result<(), String> {
        EtcdCluster::pause_member(self, i)
    }
    fn resume_member(&mut self, i: usize) -> Result<(), String> {
        EtcdCluster::resume_member(self, i)
    }
    fn dir(&self) -> &Path {
        EtcdCluster::dir(self)
    }
}

/// A lease seen gone by `etcdctl lease timetolive`: the (asked, answered) times of each answer
/// "expired".
pub struct LeaseSighting {
    lease: i64,
    seen: Vec<(u64, u64)>,
}

/// After a client run `tag` was killed: the lease of its last client session (from its history
/// file), polled until etcd says it expired (at most a minute), and then a few more times over
/// 8 s: an answer during a leader fault does not count (a stale leader may give it), and a later
/// one outside the fault still closes the window early.
fn watch_lease_end(etcdctl: &[String], history: &Path, tag: &str) -> Option<LeaseSighting> {
    let text = std::fs::read_to_string(history).ok()?;
    let lease = text
        .lines()
        .rev()
        .filter_map(|l| serde_json::from_str::<Record>(l).ok())
        .filter_map(|r| match r {
            Record::Session { proc, lease, .. } if proc == tag => Some(lease),
            _ => None,
        })
        .next()?;
    let mut until = now_ns() + secs(Duration::from_secs(60));
    let mut seen = Vec::new();
    while now_ns() < until {
        let asked = now_ns();
        let out = Command::new("etcdctl")
            .args(etcdctl)
            .args(["--command-timeout=2s", "lease", "timetolive", &format!("{lease:x}")])
            .env("ETCDCTL_API", "3")
            .output()
            .ok()?;
        let answered = now_ns();
        if parse_timetolive(&String::from_utf8_lossy(&out.stdout)) == Some(false) {
            if seen.is_empty() {
                until = answered + secs(Duration::from_secs(8));
            }
            seen.push((asked, answered));
            std::thread::sleep(Duration::from_millis(1000));
        } else {
            std::thread::sleep(Duration::from_millis(300));
        }
    }
    (!seen.is_empty()).then_some(LeaseSighting { lease, seen })
}

/// How a run differs from the chaos tests' default.
#[derive(Clone, Debug)]
pub struct RunOptions {
    /// `kill-client` kills only clients `0..killable` (the soak keeps the others alive all run
    /// long, so their memory and descriptors make one series each).
    pub killable: usize,
}

impl Default for RunOptions {
    fn default() -> RunOptions {
        RunOptions { killable: CLIENTS }
    }
}

/// What a run did (it passed: a violation panics).
#[derive(Clone, Debug, Default)]
pub struct RunSummary {
    pub invoked: usize,
    pub returned: usize,
    pub coalesced: u64,
    pub faults: BTreeMap<String, usize>,
    pub client_kills: usize,
}

/// Runs the chaos of `cycle` on `cluster` for `chaos_secs` and checks it (panics on a violation).
pub async fn run_chaos<T: Target>(cluster: &mut T, chaos_secs: u64, cycle: &[&'static str]) {
    run_chaos_with(cluster, chaos_secs, cycle, &RunOptions::default()).await;
}

/// [`run_chaos`] with `opts`; answers what the run did.
pub async fn run_chaos_with<T: Target>(
    cluster: &mut T,
    chaos_secs: u64,
    cycle: &[&'static str],
    opts: &RunOptions,
) -> RunSummary {
    let seed: u64 =
        std::env::var("CHAOS_SEED").ok().and_then(|s| s.parse().ok()).unwrap_or_else(now_ns);
    // Pauses alternate between short ones (below the clients' 2 s request timeout: the frozen
    // request is answered late but in time) and long ones (above it: the client gives up on the
    // frozen request, retries it on another member and goes on, and the frozen copy is forwarded
    // when the member resumes, after the retry and after later operations of the same holder).
    // The long ones are DESIGN §11's adversary: every write must be harmless when applied late.
    let pause_max_ms: u64 = std::env::var("CHAOS_PAUSE_MAX_MS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(LONG_PAUSE_MS.end)
        .max(LONG_PAUSE_MS.start);
    eprintln!("chaos: {chaos_secs} s, seed {seed}, pauses up to {pause_max_ms} ms");
    let mut rng = StdRng::seed_from_u64(seed);

    let work = tempfile::Builder::new().prefix("idalloc-chaos-").tempdir().expect("temp dir");
    let prefix = format!("{}chaos-{}-{}", cluster.prefix_root(), std::process::id(), now_ns());
    let layout = Layout::new(prefix.clone()).expect("prefix");
    let endpoints = cluster.endpoints();
    let observer =
        Arc::new(EtcdStore::connect(cluster.observer_options()).await.expect("observer client"));

    let started = now_ns();
    let setup = Setup {
        // `IDALLOC_CHAOS_CLIENT_BIN`: a copy of the client, so a long run (the hour-long soak)
        // is not switched to a binary rebuilt meanwhile when it restarts a client.
        bin: std::env::var_os("IDALLOC_CHAOS_CLIENT_BIN")
            .map(PathBuf::from)
            .unwrap_or_else(|| PathBuf::from(env!("CARGO_BIN_EXE_chaos-client"))),
        endpoints: endpoints.join(","),
        prefix,
        until_ns: started + secs(Duration::from_secs(chaos_secs)),
        dir: work.path().to_path_buf(),
        client_args: cluster.client_args(work.path()),
    };
    let mut slots: Vec<Slot> =
        (0..CLIENTS).map(|i| Slot { holder: format!("h{i}"), runs: 0, proc_: None }).collect();
    for (i, s) in slots.iter_mut().enumerate() {
        let p = setup.spawn(s, rng.random(), cluster.client_command(&setup.bin, i));
        s.proc_ = Some(p);
    }

    let mut report = Report::default();
    let mut lease_watches: Vec<tokio::task::JoinHandle<Option<LeaseSighting>>> = Vec::new();
    let members = cluster.members();
    let quiet_tail = secs(Duration::from_secs(4));
    let mut step = 0usize;
    while now_ns() + quiet_tail < setup.until_ns {
        tokio::time::sleep(Duration::from_millis(rng.random_range(800..2000))).await;
        match scan(&observer, &layout).await {
            Ok(s) => {
                report.scans += 1;
                report.violations.extend(s.problems);
            }
            Err(e) => {
                eprintln!("chaos: scan failed (not a violation: a fault may be in force): {e}")
            }
        }
        let what = cycle[step % cycle.len()];
        step += 1;
        let leader = cluster.leader().await;
        match what {
            "kill-client" => {
                let i = rng.random_range(0..opts.killable.clamp(1, CLIENTS));
                let slot = &mut slots[i];
                if let Some(mut p) = slot.proc_.take() {
                    // Kill at a random moment of its run of calls.
                    tokio::time::sleep(Duration::from_millis(rng.random_range(0..300))).await;
                    let _ = p.child.kill();
                    let _ = p.child.wait();
                    report.client_kills.push((p.tag.clone(), now_ns()));
                    // Watch its session's lease run out, for a tight end of its window.
                    if let Some(args) = cluster.etcdctl_args() {
                        let (path, tag) = (setup.history(&slot.holder), p.tag.clone());
                        lease_watches.push(tokio::task::spawn_blocking(move || {
                            watch_lease_end(&args, &path, &tag)
                        }));
                    }
                    let t = now_ns();
                    report.faults.push(Fault { what, target: i, leader: false, start: t, end: t });
                }
                tokio::time::sleep(Duration::from_millis(rng.random_range(100..600))).await;
                let p = setup.spawn(slot, rng.random(), cluster.client_command(&setup.bin, i));
                slot.proc_ = Some(p);
            }
            "kill-leader" | "kill-follower" | "pause-leader" | "pause-follower" => {
                let want_leader = what.ends_with("leader");
                let target = match (want_leader, leader) {
                    (true, Some(l)) => l,
                    (false, Some(l)) => {
                        (l + 1 + rng.random_range(0..members.saturating_sub(1).max(1))) % members
                    }
                    (_, None) => rng.random_range(0..members),
                };
                let is_leader = leader == Some(target) || leader.is_none();
                let start = now_ns();
                let hold = if what.starts_with("kill") {
                    Duration::from_millis(rng.random_range(1000..3000))
                } else {
                    // Pauses alternate between short and long, shifted by one every pass of
                    // the cycle: a cycle with one follower and one leader pause pauses each of
                    // them long every other pass, and a short run (one pass) has a long one too.
                    // (A cycle with one pause pauses long every other pass.)
                    let (pass, pos) = ((step - 1) / cycle.len(), (step - 1) % cycle.len());
                    let earlier = cycle[..pos].iter().filter(|k| k.starts_with("pause")).count();
                    let long = (earlier + pass) % 2 == 1;
                    if long {
                        report.long_pauses += 1;
                        Duration::from_millis(rng.random_range(LONG_PAUSE_MS.start..=pause_max_ms))
                    } else {
                        Duration::from_millis(rng.random_range(SHORT_PAUSE_MS))
                    }
                };
                if what.starts_with("kill") {
                    cluster.kill_member(target).expect("kill member");
                    tokio::time::sleep(hold).await;
                    cluster.restart_member(target).await.expect("restart member");
                } else {
                    cluster.pause_member(target).expect("pause member");
                    tokio::time::sleep(hold).await;
                    cluster.resume_member(target).expect("resume member");
                }
                report.faults.push(Fault { what, target, leader: is_leader, start, end: now_ns() });
            }
            other => {
                let start = now_ns();
                let (target, disrupts) = cluster
                    .nemesis(other, leader, &mut rng)
                    .await
                    .unwrap_or_else(|e| panic!("nemesis {other}: {e}"));
                report.faults.push(Fault {
                    what: other,
                    target,
                    leader: disrupts,
                    start,
                    end: now_ns(),
                });
            }
        }
    }

    // Let every client finish its run (each stops at the deadline by itself).
    for s in &mut slots {
        if let Some(mut p) = s.proc_.take() {
            let deadline = setup.until_ns + secs(Duration::from_secs(90));
            let status = loop {
                if let Some(st) = p.child.try_wait().expect("wait client") {
                    break Some(st);
                }
                if now_ns() > deadline {
                    break None;
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            };
            match status {
                Some(st) if st.success() => {}
                Some(st) => report.violations.push(format!("client {} exited with {st}", p.tag)),
                None => report
                    .violations
                    .push(format!("client {} did not stop 90 s after its deadline", p.tag)),
            }
        }
    }
    let ended = now_ns();
    // Every fault is over; give requests of killed clients still in etcd's pipeline time to land.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let scan_start = now_ns();
    let final_scan = scan(&observer, &layout).await.expect("final scan");
    let scan_end = now_ns();
    report.scans += 1;
    report.violations.extend(final_scan.problems.iter().cloned());

    // --- histories ---------------------------------------------------------------------------
    let paths: Vec<PathBuf> = slots.iter().map(|s| setup.history(&s.holder)).collect();
    let history = read_histories(&paths).expect("read histories");
    // Coalesced session calls (the clients' bursts): each client run that ended on its
    // own prints how many were answered; they must have run, or the run proves nothing of them.
    let mut coalesced = 0u64;
    for s in &slots {
        let err = std::fs::read_to_string(setup.stderr(&s.holder)).unwrap_or_default();
        if err.contains("panicked") {
            report.violations.push(format!("client {} panicked:\n{err}", s.holder));
        }
        coalesced += err
            .lines()
            .filter_map(|l| {
                l.split_once("coalesced: ")?.1.split_once(" answered")?.0.parse::<u64>().ok()
            })
            .sum::<u64>();
    }
    if coalesced == 0 {
        report.violations.push("no coalesced session call was answered".into());
    }
    let kill_time: HashMap<&str, u64> =
        report.client_kills.iter().map(|(t, at)| (t.as_str(), *at)).collect();
    let leader_windows: Vec<(u64, u64)> = report
        .faults
        .iter()
        .filter(|f| f.leader)
        .map(|f| (f.start, f.end + secs(ELECTION_GRACE)))
        .collect();

    let mut per_kind: BTreeMap<String, usize> = BTreeMap::new();
    let mut errors: BTreeMap<String, usize> = BTreeMap::new();
    let mut by_key: BTreeMap<String, Vec<KeyOp>> = BTreeMap::new();
    // Holders: the durable `hN` are N; client sessions' holders (`hN-c<lease>`) are numbered
    // from SESSION_BASE in the order they opened.
    let sessions: HashMap<&str, u32> = history
        .sessions
        .iter()
        .enumerate()
        .map(|(i, s)| (s.holder.as_str(), SESSION_BASE + i as u32))
        .collect();
    let holder_index = |h: &str| -> Option<u32> {
        sessions.get(h).copied().or_else(|| h.strip_prefix('h')?.parse().ok())
    };
    // When each session's lease ended: from the history, and for those never seen gone, from
    // etcd after the run (`etcdctl lease timetolive`, where the target allows it).
    let mut finals: BTreeMap<i64, FinalLease> = BTreeMap::new();
    // Sightings of killed clients' leases gone, unless a leader fault was in force (a stale
    // leader can answer for a lease it does not know).
    for w in lease_watches {
        if let Ok(Some(LeaseSighting { lease, seen })) = w.await {
            let reliable = seen
                .iter()
                .filter(|(a, b)| !leader_windows.iter().any(|(s, e)| a <= e && b >= s))
                .map(|(_, b)| *b)
                .min();
            if let Some(t) = reliable {
                finals.insert(lease, FinalLease::Gone(t));
            }
        }
    }
    let (unseen, _) = lease_ends(&history, &finals, &leader_windows);
    if let Some(args) = cluster.etcdctl_args() {
        for l in unseen.iter().filter(|l| l.hi.is_none()) {
            let out = Command::new("etcdctl")
                .args(&args)
                .args(["--command-timeout=3s", "lease", "timetolive", &format!("{:x}", l.lease)])
                .env("ETCDCTL_API", "3")
                .output();
            let t = now_ns();
            let text = out.map(|o| String::from_utf8_lossy(&o.stdout).into_owned());
            match text.as_deref().ok().and_then(parse_timetolive) {
                Some(true) => finals.insert(l.lease, FinalLease::Alive),
                Some(false) => finals.insert(l.lease, FinalLease::Gone(t)),
                None => None,
            };
        }
    }
    let (lease_ends, lease_problems) = lease_ends(&history, &finals, &leader_windows);
    report.violations.extend(lease_problems);
    for op in &history.ops {
        let Some(holder) = holder_index(&op.holder) else {
            report
                .violations
                .push(format!("{}#{}: unknown holder {:?}", op.proc, op.seq, op.holder));
            continue;
        };
        let call = match op.kind {
            OpKind::Acquire => Call::Acquire { holder },
            OpKind::Release => Call::Release { holder },
            // Lease calls are not calls on a key: they place the lease ends below.
            OpKind::Renew | OpKind::Revoke => Call::LeaseEnd { holder },
            OpKind::Get => Call::Get,
        };
        let (ret, end, label) = match &op.ret {
            Some((t, Outcome::Acquired { id, new })) => {
                if !(1..=MAX_ID).contains(id) {
                    report.violations.push(format!(
                        "G3: {}#{} got ID {id} outside [1, {MAX_ID}]",
                        op.proc, op.seq
                    ));
                }
                (
                    Ret::Acquired { id: *id, new: *new },
                    *t,
                    if *new { "acquire ok new" } else { "acquire ok" },
                )
            }
            Some((t, Outcome::Released { held, reclaimed })) => (
                Ret::Released { held: *held, reclaimed: *reclaimed },
                *t,
                match (held, reclaimed) {
                    (true, true) => "release ok reclaimed",
                    (true, false) => "release ok",
                    _ => "release ok not-held",
                },
            ),
            Some((t, Outcome::Got { id })) => (Ret::Got { id: *id }, *t, "get ok"),
            Some((t, Outcome::SessionGone)) => (Ret::Gone, *t, "refused: session gone"),
            Some((t, Outcome::Lease { alive })) => {
                (Ret::Unknown, *t, if *alive { "ok" } else { "ok: lease gone" })
            }
            Some((t, Outcome::Error { kind, msg })) => {
                *errors.entry(kind.clone()).or_default() += 1;
                let in_window = leader_windows.iter().any(|(s, e)| op.invoke <= *e && *t >= *s);
                if kind != "Unavailable" || !in_window {
                    report.violations.push(format!(
                        "G6: {}#{} {:?} {} failed with {kind} {}: {msg}",
                        op.proc,
                        op.seq,
                        op.kind,
                        op.key,
                        if in_window {
                            "during a leader fault"
                        } else {
                            "outside any leader fault"
                        }
                    ));
                }
                (Ret::Unknown, t + secs(INDETERMINATE_WINDOW), "error")
            }
            None => {
                let killed = kill_time.get(op.proc.as_str()).copied().unwrap_or(ended);
                (Ret::Unknown, killed + secs(INDETERMINATE_WINDOW), "no return (killed)")
            }
        };
        let kind = match op.kind {
            OpKind::Acquire => "acquire",
            OpKind::Release => "release",
            OpKind::Renew => "renew",
            OpKind::Revoke => "revoke",
            OpKind::Get => "get",
        };
        *per_kind
            .entry(if label.starts_with(kind) {
                label.to_string()
            } else {
                format!("{kind} {label}")
            })
            .or_default() += 1;
        // A read without an answer changed nothing: it has nothing to place.
        if matches!(op.kind, OpKind::Acquire | OpKind::Release) || matches!(ret, Ret::Got { .. }) {
            let ko = KeyOp { call, ret, invoke: op.invoke, end };
            by_key.entry(op.key.clone()).or_default().push(ko);
        }
    }
    // Each session's lease end, on every key the session called: its references vanish at one
    // point of [lo, hi] (must, if seen gone by hi; may, by the final scan, if never seen gone).
    let mut session_keys: HashMap<u32, BTreeSet<String>> = HashMap::new();
    for op in &history.ops {
        if let (Some(&h), OpKind::Acquire | OpKind::Release) =
            (sessions.get(op.holder.as_str()), op.kind)
        {
            session_keys.entry(h).or_default().insert(op.key.clone());
        }
    }
    let (mut ends_seen, mut ends_open) = (0usize, 0usize);
    for l in &lease_ends {
        let holder = sessions[l.holder.as_str()];
        let (ret, end) = match l.hi {
            Some(hi) => {
                ends_seen += 1;
                (Ret::Ended, hi)
            }
            // Could not have ended by the final scan, the last event: nothing to place.
            None if l.lo > scan_end => continue,
            None => {
                ends_open += 1;
                (Ret::Unknown, scan_end)
            }
        };
        for key in session_keys.get(&holder).into_iter().flatten() {
            let ko = KeyOp {
                call: Call::LeaseEnd { holder },
                ret: ret.clone(),
                invoke: l.lo.min(end),
                end,
            };
            by_key.entry(key.clone()).or_default().push(ko);
        }
    }
    // The final scan is the last call of every key.
    for k in 0..KEYS {
        let key = format!("k{k}");
        let mut holders = BTreeSet::new();
        for h in final_scan.holders.get(&key).into_iter().flatten() {
            match holder_index(h) {
                Some(i) => {
                    holders.insert(i);
                }
                None => report.violations.push(format!("{key}: unknown holder {h:?} in the scan")),
            }
        }
        let bound = final_scan.bindings.get(&key).copied();
        by_key.entry(key).or_default().push(KeyOp {
            call: Call::Observe { bound, holders },
            ret: Ret::Observed,
            invoke: scan_start,
            end: scan_end,
        });
    }
    let mut max_configs = 0;
    for (key, ops) in &by_key {
        match check(KeyState::default(), ops) {
            Ok(c) => max_configs = max_configs.max(c.max_configs),
            Err(CheckError::Violation(v)) => report.violations.push(format!(
                "linearizability of {key}: no linearization explains {:?} -> {:?} (invoked +{:.3} s, ended +{:.3} s); states before: {:?}",
                ops[v.op].call,
                ops[v.op].ret,
                ops[v.op].invoke.saturating_sub(started) as f64 / 1e9,
                ops[v.op].end.saturating_sub(started) as f64 / 1e9,
                v.states_before
            )),
            Err(CheckError::TooWide { op }) => report.violations.push(format!(
                "linearizability of {key}: search too wide at {:?}: inconclusive",
                ops[op]
            )),
        }
    }

    // --- report --------------------------------------------------------------------------------
    let mut faults: BTreeMap<String, usize> = BTreeMap::new();
    for f in &report.faults {
        *faults.entry(f.what.to_string()).or_default() += 1;
    }
    let completed = history.ops.iter().filter(|o| o.ret.is_some()).count();
    println!("=== chaos report ===");
    println!(
        "seed {seed}; chaos {:.1} s (wall {:.1} s)",
        (ended - started) as f64 / 1e9,
        (now_ns() - started) as f64 / 1e9
    );
    println!(
        "client runs started {} (clean ends {}), clients killed {}",
        history.starts,
        history.dones,
        report.client_kills.len()
    );
    println!(
        "operations: {} invoked, {} returned; by kind: {per_kind:?}",
        history.ops.len(),
        completed
    );
    println!(
        "faults: {faults:?} ({} hit the leader)",
        report.faults.iter().filter(|f| f.leader && f.what != "kill-client").count()
    );
    for f in &report.faults {
        println!(
            "  fault at +{:.1} s: {} {} for {:.1} s{}",
            (f.start - started) as f64 / 1e9,
            f.what,
            if f.what == "kill-client" {
                format!("h{}", f.target)
            } else {
                format!("member m{}", f.target)
            },
            (f.end - f.start) as f64 / 1e9,
            if f.leader && f.what != "kill-client" { " (leader)" } else { "" }
        );
    }
    println!("errors: {errors:?}");
    println!("member pauses longer than the request timeout: {}", report.long_pauses);
    println!(
        "scans (G1): {}; final: {} bindings, {} tombstones",
        report.scans,
        final_scan.bindings.len(),
        final_scan.tombstones
    );
    println!("linearizability: {} keys, widest search {max_configs} configurations", by_key.len());
    println!(
        "client sessions: {} (lease ends seen: {ends_seen}, never seen: {ends_open}, alive at the \
         final scan: {})",
        history.sessions.len(),
        history.sessions.len() - ends_seen - ends_open
    );
    println!("coalesced session calls answered (bursts, not in the histories): {coalesced}");
    println!("violations: {}", report.violations.len());
    for v in &report.violations {
        println!("  - {v}");
    }
    if !report.violations.is_empty() {
        // Keep the evidence: histories, client stderr and member logs.
        let keep = std::env::temp_dir().join(format!("idalloc-chaos-failed-{seed}"));
        let _ = copy_dir(work.path(), &keep);
        let _ = copy_dir(cluster.dir(), &keep.join("etcd"));
        println!("evidence kept in {}", keep.display());
    }

    assert!(
        report.violations.is_empty(),
        "{} violations (see the report above)",
        report.violations.len()
    );
    // The run did what it claims: calls of every kind returned, every fault kind was injected.
    assert!(per_kind.keys().any(|k| k.starts_with("acquire ok")), "no acquire succeeded");
    assert!(per_kind.contains_key("release ok reclaimed"), "no release reclaimed");
    // Batched calls ran and answered (their keys are checked like single calls).
    let batched = |kind: OpKind| {
        history.ops.iter().any(|o| {
            o.batch > 1
                && o.kind == kind
                && matches!(o.ret, Some((_, Outcome::Acquired { .. } | Outcome::Released { .. })))
        })
    };
    assert!(batched(OpKind::Acquire), "no batched acquire succeeded");
    assert!(batched(OpKind::Release), "no batched release succeeded");
    // Session references were checked: acquired under a session, and leases seen ending.
    let session_acquired = history.ops.iter().any(|o| {
        sessions.contains_key(o.holder.as_str())
            && matches!(o.ret, Some((_, Outcome::Acquired { .. })))
    });
    assert!(session_acquired, "no acquire under a client session succeeded");
    assert!(ends_seen > 0, "no client session's lease was seen ending");
    if chaos_secs >= 40 {
        for kind in cycle {
            assert!(faults.contains_key(*kind), "fault {kind} was never injected");
        }
        assert!(report.long_pauses > 0, "no member was paused longer than the request timeout");
    }
    assert_eq!(history.starts, CLIENTS + report.client_kills.len(), "every client run started");
    RunSummary {
        invoked: history.ops.len(),
        returned: completed,
        coalesced,
        faults,
        client_kills: report.client_kills.len(),
    }
}

fn copy_dir(from: &Path, to: &Path) -> std::io::Result<()> {
    std::fs::create_dir_all(to)?;
    for e in std::fs::read_dir(from)? {
        let e = e?;
        let p = e.path();
        if p.is_file() {
            std::fs::copy(&p, to.join(e.file_name()))?;
        }
    }
    Ok(())
}
