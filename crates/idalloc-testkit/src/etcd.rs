//! A real etcd process launcher and the choice of which etcd a test uses.
//!
//! Tests that need etcd call [`test_etcd_endpoint`]: under `scripts/test.sh` (and in CI) one
//! shared etcd is named by `IDALLOC_TEST_ETCD`, and tests keep apart by key prefix
//! ([`unique_prefix`]); on a developer machine without that variable, each test starts a private
//! [`EtcdServer`] if `etcd` is on `PATH`, and is skipped (with a printed notice) otherwise. Tests
//! that compact (compaction is global on etcd) always get a private server.
//!
//! Every process started here is killed by its own PID when its handle is dropped (including on
//! a panic unwinding through the test), and its data directory is removed.

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use idalloc::store::etcd::{EtcdOptions, EtcdStore};
use idalloc::store::{GetRequest, Store};

/// The environment variable naming a shared test etcd (a client URL).
pub const TEST_ETCD_ENV: &str = "IDALLOC_TEST_ETCD";

/// How long a freshly started etcd may take to answer before we give up.
const START_TIMEOUT: Duration = Duration::from_secs(30);

/// Attempts at starting a member; a retry picks new ports (another process may have taken a
/// port between our probe and etcd's bind).
const START_ATTEMPTS: usize = 3;

/// Attempts at restarting a killed member on its old ports, [`RESTART_PAUSE`] apart: while it was
/// down, another process's outgoing connection may have been given its port as an ephemeral
/// one, which is free again once that connection closes.
pub(crate) const RESTART_ATTEMPTS: usize = 20;
pub(crate) const RESTART_PAUSE: Duration = Duration::from_millis(500);

/// True if an etcd start failed (its log tail in `err`) because a port was taken.
pub(crate) fn port_was_taken(err: &str) -> bool {
    err.contains("address already in use")
}

/// Where a member runs: on loopback with free ports, or inside a network namespace on an address
/// of its own (the network-namespace chaos test, `idalloc-chaos/tests/chaos_netns.rs`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MemberHost {
    /// The network namespace (`ip netns` name) the member runs in; `None`: the caller's.
    pub netns: Option<String>,
    /// The address it listens on (client port 2379, peer port 2380 in a namespace).
    pub addr: String,
}

/// Raft timings of a test cluster's members.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RaftTimings {
    /// 50 ms heartbeats, 500 ms election timeout: etcd's minimum lease TTL (1.5 election
    /// timeouts rounded up to whole seconds) drops from 2 s to 1 s, for faster lease tests, and a
    /// lost leader is replaced quickly. But on a busy machine (members inherit a niced test's
    /// priority) a follower that misses heartbeats for 500 ms starts an election nobody caused.
    /// For single members (which hold no elections) and the chaos tests, which cause leader
    /// faults themselves and allow for elections.
    Fast,
    /// etcd's defaults, 100 ms heartbeats and a 1,000 ms election timeout: for multi-member
    /// clusters of tests that expect the leader they saw to stay leader.
    Steady,
}

impl RaftTimings {
    fn args(self) -> [&'static str; 4] {
        match self {
            RaftTimings::Fast => ["--heartbeat-interval", "50", "--election-timeout", "500"],
            RaftTimings::Steady => ["--heartbeat-interval", "100", "--election-timeout", "1000"],
        }
    }
}

/// One etcd member process, on loopback or in a network namespace.
#[derive(Debug)]
struct Member {
    name: String,
    raft: RaftTimings,
    host: MemberHost,
    client_port: u16,
    peer_port: u16,
    child: Option<Child>,
    data_dir: PathBuf,
    log: PathBuf,
}

impl Member {
    fn client_url(&self) -> String {
        format!("http://{}:{}", self.host.addr, self.client_port)
    }
    fn peer_url(&self) -> String {
        format!("http://{}:{}", self.host.addr, self.peer_port)
    }

    fn spawn(&mut self, initial_cluster: &str, token: &str) -> std::io::Result<()> {
        std::fs::create_dir_all(&self.data_dir)?;
        // Append: a restarted member keeps the log of its earlier runs.
        let log = std::fs::OpenOptions::new().create(true).append(true).open(&self.log)?;
        // In a namespace, `ip netns exec` execs etcd in place: the child's PID is etcd's, so
        // kills and pauses by PID reach etcd itself.
        let mut cmd = match &self.host.netns {
            Some(ns) => {
                let mut c = Command::new("ip");
                c.args(["netns", "exec", ns, "etcd"]);
                c
            }
            None => Command::new("etcd"),
        };
        let child = cmd
            .arg("--name")
            .arg(&self.name)
            .arg("--data-dir")
            .arg(&self.data_dir)
            .arg("--listen-client-urls")
            .arg(self.client_url())
            .arg("--advertise-client-urls")
            .arg(self.client_url())
            .arg("--listen-peer-urls")
            .arg(self.peer_url())
            .arg("--initial-advertise-peer-urls")
            .arg(self.peer_url())
            .arg("--initial-cluster")
            .arg(initial_cluster)
            .arg("--initial-cluster-token")
            .arg(token)
            .arg("--initial-cluster-state")
            .arg("new")
            .args(self.raft.args())
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log)
            .spawn()?;
        self.child = Some(child);
        Ok(())
    }

    /// True if the process has exited (or was never started).
    fn exited(&mut self) -> bool {
        match self.child.as_mut() {
            Some(c) => !matches!(c.try_wait(), Ok(None)),
            None => true,
        }
    }

    fn log_tail(&self) -> String {
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(20)..].join("\n")
    }

    fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// Sends `signal` (a `kill(1)` name such as `STOP`) to this member's process, by PID.
    fn signal(&self, signal: &str) -> Result<(), String> {
        let pid = self.pid().ok_or_else(|| format!("member {} is not running", self.name))?;
        let status = Command::new("kill")
            .arg(format!("-{signal}"))
            .arg(pid.to_string())
            .status()
            .map_err(|e| format!("cannot run kill -{signal} {pid}: {e}"))?;
        if status.success() {
            Ok(())
        } else {
            Err(format!("kill -{signal} {pid} failed: {status}"))
        }
    }

    fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            // A stopped process dies of SIGKILL too; CONT first anyway so nothing lingers stopped
            // if the kill raced with a stop.
            let _ = Command::new("kill")
                .arg("-CONT")
                .arg(child.id().to_string())
                .stderr(Stdio::null())
                .status();
            // Kill by PID (the Child handle), then reap it so no zombie is left.
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

impl Drop for Member {
    fn drop(&mut self) {
        self.kill();
    }
}

/// A free TCP port on 127.0.0.1 (bound and released; see [`START_ATTEMPTS`] for the race).
fn free_port() -> std::io::Result<u16> {
    Ok(TcpListener::bind("127.0.0.1:0")?.local_addr()?.port())
}

/// For tests that start their own etcd: true if `etcd` is on `PATH`; otherwise false with a
/// printed notice (the caller returns: skipped), except under `CI=true`, where a missing etcd
/// fails the test instead of hiding it. `what` names the tests in that failure.
pub fn etcd_or_skip(what: &str) -> bool {
    if etcd_on_path() {
        return true;
    }
    assert!(
        std::env::var("CI").map_or(true, |v| v != "true"),
        "etcd is not on PATH under CI: {what} cannot run"
    );
    eprintln!("SKIPPED: etcd is not on PATH");
    false
}

/// True if `etcd` can be run from `PATH`.
pub fn etcd_on_path() -> bool {
    Command::new("etcd")
        .arg("--version")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .map(|s| s.success())
        .unwrap_or(false)
}

/// An etcd cluster of one or more members on loopback, each with a temporary data directory.
/// Killed (every member, by PID) and removed on drop.
#[derive(Debug)]
pub struct EtcdCluster {
    members: Vec<Member>,
    initial_cluster: String,
    token: String,
    // Dropped after `members` (field order), so processes die before their files go.
    _dir: tempfile::TempDir,
}

impl EtcdCluster {
    /// Starts `size` members forming one cluster and waits until every member answers a read.
    /// One member runs with [`RaftTimings::Fast`], several with [`RaftTimings::Steady`].
    pub async fn start(size: usize) -> Result<EtcdCluster, String> {
        let raft = if size > 1 { RaftTimings::Steady } else { RaftTimings::Fast };
        Self::start_with(size, raft).await
    }

    /// [`EtcdCluster::start`] with [`RaftTimings::Fast`] whatever the size: for tests that
    /// cause leader faults and allow for the elections.
    pub async fn start_fast(size: usize) -> Result<EtcdCluster, String> {
        Self::start_with(size, RaftTimings::Fast).await
    }

    async fn start_with(size: usize, raft: RaftTimings) -> Result<EtcdCluster, String> {
        if size == 0 {
            return Err("an etcd cluster needs at least one member, got size 0".into());
        }
        let mut last_err = String::new();
        for _ in 0..START_ATTEMPTS {
            match Self::try_start(size, raft).await {
                Ok(c) => return Ok(c),
                Err(e) => last_err = e,
            }
        }
        Err(format!("etcd did not start after {START_ATTEMPTS} attempts: {last_err}"))
    }

    /// Starts one member per host, each inside its network namespace on its address (ports 2379
    /// and 2380: a namespace has ports of its own), and waits until every member answers a read.
    /// [`RaftTimings::Fast`]: the network-namespace chaos test causes the leader faults.
    /// The caller's thread must reach those addresses (it runs in a namespace on the same
    /// network), and so must every later call that talks to the members.
    pub async fn start_on(hosts: Vec<MemberHost>) -> Result<EtcdCluster, String> {
        if hosts.is_empty() {
            return Err("an etcd cluster needs at least one member, got no hosts".into());
        }
        let mut last_err = String::new();
        for _ in 0..START_ATTEMPTS {
            match Self::try_start_on(hosts.clone(), RaftTimings::Fast).await {
                Ok(c) => return Ok(c),
                Err(e) => last_err = e,
            }
        }
        Err(format!("etcd did not start after {START_ATTEMPTS} attempts: {last_err}"))
    }

    async fn try_start(size: usize, raft: RaftTimings) -> Result<EtcdCluster, String> {
        let loopback = MemberHost { netns: None, addr: "127.0.0.1".into() };
        Self::try_start_on(vec![loopback; size], raft).await
    }

    async fn try_start_on(
        hosts: Vec<MemberHost>,
        raft: RaftTimings,
    ) -> Result<EtcdCluster, String> {
        let dir = tempfile::Builder::new()
            .prefix("idalloc-etcd-")
            .tempdir()
            .map_err(|e| format!("cannot create a temp dir for etcd: {e}"))?;
        let mut members = Vec::with_capacity(hosts.len());
        for (i, host) in hosts.into_iter().enumerate() {
            let name = format!("m{i}");
            let (client_port, peer_port) = if host.netns.is_some() {
                (2379, 2380)
            } else {
                (
                    free_port().map_err(|e| format!("no free port: {e}"))?,
                    free_port().map_err(|e| format!("no free port: {e}"))?,
                )
            };
            members.push(Member {
                raft,
                host,
                client_port,
                peer_port,
                data_dir: dir.path().join(format!("{name}.etcd")),
                log: dir.path().join(format!("{name}.log")),
                name,
                child: None,
            });
        }
        let initial_cluster = members
            .iter()
            .map(|m| format!("{}={}", m.name, m.peer_url()))
            .collect::<Vec<_>>()
            .join(",");
        let token = format!("idalloc-test-{}", unique_suffix());
        for m in &mut members {
            m.spawn(&initial_cluster, &token)
                .map_err(|e| format!("cannot run etcd (is it on PATH?): {e}"))?;
        }
        let mut cluster = EtcdCluster { members, initial_cluster, token, _dir: dir };
        cluster.wait_ready().await?;
        Ok(cluster)
    }

    /// Waits until every member answers a read; fails early if a member process exits.
    async fn wait_ready(&mut self) -> Result<(), String> {
        for i in 0..self.members.len() {
            self.wait_member_ready(i).await?;
        }
        Ok(())
    }

    /// Waits until member `i` answers a read (a linearizable read, so it needs a quorum with a
    /// leader); fails early if its process exits.
    async fn wait_member_ready(&mut self, i: usize) -> Result<(), String> {
        let deadline = Instant::now() + START_TIMEOUT;
        {
            let m = &mut self.members[i];
            let url = m.client_url();
            let mut opts = EtcdOptions::new([url.clone()]);
            opts.connect_timeout = Duration::from_millis(500);
            opts.request_timeout = Duration::from_secs(1);
            let store = EtcdStore::connect(opts)
                .await
                .map_err(|e| format!("etcd client for {url}: {e}"))?;
            while store.get(GetRequest::key("idalloc-ready-probe")).await.is_err() {
                if m.exited() {
                    return Err(format!("etcd member {url} exited; log tail:\n{}", m.log_tail()));
                }
                if Instant::now() > deadline {
                    return Err(format!(
                        "etcd member {url} did not answer within {START_TIMEOUT:?}; log tail:\n{}",
                        m.log_tail()
                    ));
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
        Ok(())
    }

    /// Client URLs of all members.
    pub fn endpoints(&self) -> Vec<String> {
        self.members.iter().map(Member::client_url).collect()
    }

    /// The data directory root (member directories and logs live below it).
    pub fn dir(&self) -> &Path {
        self._dir.path()
    }

    /// Kills member `i` (by PID). Its data stays, for tests of a member going away.
    pub fn kill_member(&mut self, i: usize) -> Result<(), String> {
        let n = self.members.len();
        let m = self
            .members
            .get_mut(i)
            .ok_or_else(|| format!("member index {i} out of range: the cluster has {n}"))?;
        m.kill();
        Ok(())
    }

    /// True if member `i` is not running.
    pub fn member_exited(&mut self, i: usize) -> bool {
        self.members.get_mut(i).is_none_or(Member::exited)
    }

    fn member_mut(&mut self, i: usize) -> Result<&mut Member, String> {
        let n = self.members.len();
        self.members
            .get_mut(i)
            .ok_or_else(|| format!("member index {i} out of range: the cluster has {n}"))
    }

    /// Number of members.
    pub fn size(&self) -> usize {
        self.members.len()
    }

    /// The PID of member `i`'s process, if it runs.
    pub fn member_pid(&self, i: usize) -> Option<u32> {
        self.members.get(i).and_then(Member::pid)
    }

    /// Restarts a killed member `i` on its old data directory and ports (it rejoins the cluster
    /// as the same member), and waits until it answers a read. A running member is left alone.
    pub async fn restart_member(&mut self, i: usize) -> Result<(), String> {
        let (initial_cluster, token) = (self.initial_cluster.clone(), self.token.clone());
        let m = self.member_mut(i)?;
        if !m.exited() {
            return Ok(());
        }
        let mut attempt = 1;
        loop {
            let m = self.member_mut(i)?;
            m.kill(); // reap a process that exited on its own (or the last attempt)
            m.spawn(&initial_cluster, &token)
                .map_err(|e| format!("cannot restart etcd member {i}: {e}"))?;
            match self.wait_member_ready(i).await {
                Err(e) if port_was_taken(&e) && attempt < RESTART_ATTEMPTS => {
                    attempt += 1;
                    tokio::time::sleep(RESTART_PAUSE).await
                }
                done => return done,
            }
        }
    }

    /// Freezes member `i` with SIGSTOP: its connections stay open but it answers nothing, like a
    /// long GC pause or a hung VM. [`EtcdCluster::resume_member`] undoes it; a drop kills it anyway.
    pub fn pause_member(&mut self, i: usize) -> Result<(), String> {
        self.member_mut(i)?.signal("STOP")
    }

    /// Lets a paused member run again (SIGCONT).
    pub fn resume_member(&mut self, i: usize) -> Result<(), String> {
        self.member_mut(i)?.signal("CONT")
    }

    /// The index of the member the running members agree is the leader, from etcd's maintenance
    /// status API; `None` if no running member answers or none names a leader.
    pub async fn leader(&self) -> Option<usize> {
        let mut ids: Vec<Option<u64>> = vec![None; self.members.len()];
        let mut leader = None;
        for (i, m) in self.members.iter().enumerate() {
            if m.child.is_none() {
                continue;
            }
            let opts = etcd_client::ConnectOptions::new()
                .with_connect_timeout(Duration::from_millis(500))
                .with_timeout(Duration::from_secs(1));
            let status = tokio::time::timeout(Duration::from_secs(2), async {
                let mut c = etcd_client::Client::connect([m.client_url()], Some(opts)).await?;
                c.status().await
            })
            .await;
            if let Ok(Ok(s)) = status {
                ids[i] = s.header().map(|h| h.member_id());
                if s.leader() != 0 {
                    leader = Some(s.leader());
                }
            }
        }
        let leader = leader?;
        ids.iter().position(|id| *id == Some(leader))
    }
}

/// A single-member etcd on loopback: an [`EtcdCluster`] of size 1.
#[derive(Debug)]
pub struct EtcdServer {
    cluster: EtcdCluster,
}

impl EtcdServer {
    /// Starts etcd (from `PATH`) on free loopback ports and waits until it answers.
    pub async fn start() -> Result<EtcdServer, String> {
        Ok(EtcdServer { cluster: EtcdCluster::start(1).await? })
    }

    /// The client URL, e.g. `http://127.0.0.1:40123`.
    pub fn endpoint(&self) -> String {
        self.cluster.members[0].client_url()
    }

    /// The etcd process's PID while it runs (benchmarks read its CPU time from `/proc`).
    pub fn pid(&self) -> Option<u32> {
        self.cluster.member_pid(0)
    }

    /// Kills the etcd process (by PID) now, e.g. to test how clients see a dead store.
    pub fn kill(&mut self) {
        self.cluster.members[0].kill();
    }

    /// Connects an [`EtcdStore`] with test-friendly timeouts.
    pub async fn store(&self) -> Result<EtcdStore, String> {
        connect_test_store(&self.endpoint()).await
    }
}

/// Connects to `endpoint` with timeouts suited to loopback tests (generous, so a loaded machine
/// does not produce spurious `Unavailable`s).
pub async fn connect_test_store(endpoint: &str) -> Result<EtcdStore, String> {
    let mut opts = EtcdOptions::new([endpoint.to_string()]);
    opts.request_timeout = Duration::from_secs(10);
    EtcdStore::connect(opts).await.map_err(|e| format!("connecting to test etcd {endpoint}: {e}"))
}

/// An etcd a test may use: either the shared one named by `IDALLOC_TEST_ETCD`, or a private
/// server that lives as long as this value.
#[derive(Debug)]
pub enum TestEtcd {
    Shared(String),
    Private(EtcdServer),
}

impl TestEtcd {
    pub fn endpoint(&self) -> String {
        match self {
            TestEtcd::Shared(url) => url.clone(),
            TestEtcd::Private(server) => server.endpoint(),
        }
    }
}

/// The etcd for a test, or `None` (with a printed notice) if none is available and the test
/// should be skipped.
///
/// - `IDALLOC_TEST_ETCD` set: that endpoint (shared; use [`unique_prefix`] to keep apart).
/// - else under `CI=true`: panics, because a CI run that silently skips every etcd test would
///   report success without testing anything.
/// - else if `etcd` is on `PATH`: a private server.
/// - else `None`.
pub async fn test_etcd_endpoint() -> Option<TestEtcd> {
    if let Ok(url) = std::env::var(TEST_ETCD_ENV) {
        if !url.trim().is_empty() {
            return Some(TestEtcd::Shared(url));
        }
    }
    if std::env::var("CI").is_ok_and(|v| v == "true") {
        panic!(
            "tests needing etcd must get {TEST_ETCD_ENV} under CI (run scripts/test.sh, which \
             starts one etcd and exports it)"
        );
    }
    private_etcd().await.map(TestEtcd::Private)
}

/// A private etcd server (for tests that compact, or restart etcd), or `None` with a notice if
/// `etcd` is not on `PATH`. Under `CI=true` a missing etcd is a panic, not a skip.
pub async fn private_etcd() -> Option<EtcdServer> {
    if !etcd_on_path() {
        if std::env::var("CI").is_ok_and(|v| v == "true") {
            panic!("etcd is not on PATH under CI: tests needing a private etcd cannot run");
        }
        eprintln!("SKIPPED: etcd is not on PATH and {TEST_ETCD_ENV} is not set");
        return None;
    }
    match EtcdServer::start().await {
        Ok(s) => Some(s),
        // etcd is there but does not start: that is a failure to report, not a skip.
        Err(e) => panic!("starting a private etcd failed: {e}"),
    }
}

fn unique_suffix() -> String {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let n = COUNTER.fetch_add(1, Ordering::Relaxed);
    let nanos = SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_nanos());
    format!("{}-{nanos}-{n}", std::process::id())
}

/// A key prefix no other test (in this or another process) uses: `/idalloc-test/<pid>-<ns>-<n>/`.
pub fn unique_prefix() -> Vec<u8> {
    format!("/idalloc-test/{}/", unique_suffix()).into_bytes()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// While a member was down, another socket took its port (as an outgoing connection's
    /// ephemeral port can): its restart fails to bind, and is retried until the port is free.
    /// The port is freed only once a failed attempt is in the member's log, so the retry is
    /// exercised on every run, whatever the machine's speed.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_restart_waits_until_its_port_is_free_again() {
        if !etcd_or_skip("the restart test") {
            return;
        }
        let mut cluster = EtcdCluster::start(1).await.expect("etcd");
        cluster.kill_member(0).expect("kill");
        let (port, log) = (cluster.members[0].client_port, cluster.members[0].log.clone());
        let squatter = TcpListener::bind(("127.0.0.1", port)).expect("take the member's port");
        let freed = std::thread::spawn(move || {
            let deadline = Instant::now() + Duration::from_secs(60);
            while !port_was_taken(&std::fs::read_to_string(&log).unwrap_or_default()) {
                assert!(Instant::now() < deadline, "no failed restart in the log within 60 s");
                std::thread::sleep(Duration::from_millis(50));
            }
            drop(squatter);
        });
        let restarted = cluster.restart_member(0).await;
        freed.join().expect("the squatter thread");
        restarted.expect("restarted once the port was free");
        let store = connect_test_store(&cluster.endpoints()[0]).await.expect("connect");
        store.get(GetRequest::key("k")).await.expect("the restarted member answers");
    }
}
