//! Chaos on a 3-member etcd cluster whose members and clients are hosts of their own, in network
//! namespaces, with network nemeses (docs/chaos.md "Network nemeses").
//!
//! `idalloc_chaos::netlab` builds the hosts: one namespace per etcd member (`m0`..`m2`), two for
//! the client processes (`c0`, `c1`), one for the observer (`ob`, this test's own thread that
//! scans the store and asks who leads), all on a bridge in a switch namespace, on
//! `10.231.0.0/24` (addresses that exist only inside these namespaces). The chaos run and its
//! checks are the loopback chaos test's (`common`: G1 scans, linearizability per key against the
//! final scan, G3, G6); the cycle adds network nemeses to member kills and pauses and client kills:
//! - `partition-leader`: the leader cannot reach the other members, nor they it (clients still can);
//! - `partition-follower`: a follower cut off from every host;
//! - `cut-clients-from-leader`: one direction only, at random either the leader's answers to the
//!   clients or the clients' requests to the leader are lost;
//! - `lossy-links`: every member and client host drops 5–30 % of the packets it receives;
//! - `slow-links`: the members' incoming packets are held 100–2,000 ms with jitter (so they also
//!   arrive out of order) by an NFQUEUE this test serves (`idalloc_chaos::delay`);
//! - `duplicate`: every member and client host sends 10–50 % of its packets twice (iptables TEE).
//!
//! Every nemesis's rules count the packets they acted on; the run fails if a kind acted on none.
//! `CHAOS_NETNS_SECS` sets the duration (default 60). Needs root, `ip`, `nft`, `iptables` and
//! etcd; skipped with the reason otherwise (a failure instead under CI as root).

mod common;

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream, UdpSocket};
use std::path::Path;
use std::process::Command;
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::{run_chaos, Target};
use idalloc::store::etcd::EtcdOptions;
use idalloc_chaos::delay::DelayServer;
use idalloc_chaos::netlab::{self, Lab};
use idalloc_testkit::etcd::{etcd_or_skip, EtcdCluster, MemberHost};
use rand::rngs::StdRng;
use rand::Rng;

/// The NFQUEUE number the delay servers serve (one per namespace, so one number does).
const QUEUE: u16 = 7;
const MEMBERS: [&str; 3] = ["m0", "m1", "m2"];
const CLIENT_HOSTS: [&str; 2] = ["c0", "c1"];

/// True if this machine can build the lab; otherwise prints why and the test returns (skipped).
/// Under CI as root, a missing tool is a failure: CI must run these tests.
fn lab_or_skip(what: &str) -> bool {
    if let Some(why) = netlab::unavailable() {
        let ci = std::env::var("CI").is_ok_and(|v| v == "true");
        assert!(!ci || why.starts_with("not root"), "{what} cannot run under CI: {why}");
        eprintln!("SKIPPED {what}: {why}");
        return false;
    }
    let reaped = netlab::reap_stale();
    if !reaped.is_empty() {
        eprintln!("removed namespaces of crashed earlier runs: {reaped:?}");
    }
    true
}

/// Runs `f` on a thread inside namespace `ns` and returns what it returns.
fn in_ns<T: Send + 'static>(
    ns: &str,
    f: impl FnOnce() -> Result<T, String> + Send + 'static,
) -> std::thread::JoinHandle<Result<T, String>> {
    let ns = ns.to_string();
    std::thread::spawn(move || {
        netlab::enter(&ns)?;
        f()
    })
}

fn join<T>(h: std::thread::JoinHandle<Result<T, String>>) -> T {
    match h.join() {
        Ok(r) => r.unwrap_or_else(|e| panic!("{e}")),
        Err(p) => std::panic::resume_unwind(p),
    }
}

/// Asserts that no namespace of this process's `tag` lab is left and nothing ran in them.
fn assert_no_lab_left(tag: &str) {
    let mine = format!("{}{}-{tag}", netlab::NS_PREFIX, std::process::id());
    let left: Vec<String> =
        netlab::namespaces().into_iter().filter(|n| n.starts_with(&mine)).collect();
    assert!(left.is_empty(), "namespaces left behind: {left:?}");
}

/// Each nemesis acts on a two-host lab, measured where it acts: a partition makes a connection
/// fail and counts the dropped packets, loss drops some of 200 datagrams, duplication delivers
/// more datagrams than were sent, and the delay server holds a round trip for at least the delay.
#[test]
fn each_network_nemesis_acts_on_the_packets() {
    if !lab_or_skip("the network nemesis checks") {
        return;
    }
    {
        let lab = Lab::create("u", &["a", "b"]).expect("lab");
        let (a, b) = (lab.host("a").expect("a").clone(), lab.host("b").expect("b").clone());

        // An echo server on b (TCP 7000) and a datagram counter (UDP 7001).
        let tcp = in_ns(&b.ns, {
            let addr = b.addr.clone();
            move || TcpListener::bind(format!("{addr}:7000")).map_err(|e| e.to_string())
        });
        let listener = join(tcp);
        std::thread::spawn(move || {
            for mut s in listener.incoming().flatten() {
                std::thread::spawn(move || {
                    let mut buf = [0u8; 64];
                    while let Ok(n) = s.read(&mut buf) {
                        if n == 0 || s.write_all(&buf[..n]).is_err() {
                            break;
                        }
                    }
                });
            }
        });
        let udp = join(in_ns(&b.ns, {
            let addr = b.addr.clone();
            move || UdpSocket::bind(format!("{addr}:7001")).map_err(|e| e.to_string())
        }));
        udp.set_read_timeout(Some(Duration::from_millis(500))).expect("udp timeout");
        let received = move |udp: &UdpSocket| {
            let mut n = 0;
            let mut buf = [0u8; 16];
            while udp.recv(&mut buf).is_ok() {
                n += 1;
            }
            n
        };
        // a's side: a round trip over TCP (connect timeout 1 s), and a burst of datagrams.
        let round_trip = |a: &netlab::Host, to: String| {
            join(in_ns(&a.ns, move || {
                let t = Instant::now();
                let addr = to.parse().map_err(|e| format!("{to}: {e}"))?;
                let Ok(mut s) = TcpStream::connect_timeout(&addr, Duration::from_secs(1)) else {
                    return Ok(None);
                };
                s.set_read_timeout(Some(Duration::from_secs(5))).map_err(|e| e.to_string())?;
                s.write_all(b"ping").map_err(|e| e.to_string())?;
                let mut buf = [0u8; 4];
                s.read_exact(&mut buf).map_err(|e| e.to_string())?;
                Ok(Some(t.elapsed()))
            }))
        };
        let send = |a: &netlab::Host, to: String, n: usize| {
            join(in_ns(&a.ns, move || {
                let s = UdpSocket::bind("0.0.0.0:0").map_err(|e| e.to_string())?;
                for _ in 0..n {
                    s.send_to(b"x", &to).map_err(|e| e.to_string())?;
                    std::thread::sleep(Duration::from_millis(1));
                }
                Ok(())
            }))
        };
        let echo = format!("{}:7000", b.addr);
        let dgram = format!("{}:7001", b.addr);

        // Healthy: the round trip works, every datagram arrives once.
        assert!(round_trip(&a, echo.clone()).is_some(), "no round trip on a healthy link");
        send(&a, dgram.clone(), 100);
        assert_eq!(received(&udp), 100, "datagrams lost or duplicated on a healthy link");

        // Partition: b drops everything from a.
        lab.rule("b", "input", &format!("ip saddr {}", a.addr)).expect("partition rule");
        assert!(round_trip(&a, echo.clone()).is_none(), "connected across a partition");
        assert!(lab.heal("b").expect("heal") > 0, "the partition rule counted no packet");
        assert!(round_trip(&a, echo.clone()).is_some(), "no round trip after healing");

        // Loss: 30 % of what b receives.
        // Only a's datagrams: the count below must not take in IPv6 neighbour discovery.
        let loss = format!("ip saddr {} udp dport 7001 numgen random mod 100 < 30", a.addr);
        lab.rule("b", "input", &loss).expect("loss rule");
        send(&a, dgram.clone(), 200);
        let got = received(&udp);
        let dropped = lab.heal("b").expect("heal");
        assert!(got < 200 && dropped > 0, "30 % loss let {got} of 200 through ({dropped} dropped)");
        assert_eq!(got as u64 + dropped, 200, "loss: received + dropped is what was sent");

        // Duplication: a's packets to b are also sent a second time (TEE to b as next hop).
        lab.iptables(
            "a",
            &[
                "-t",
                "mangle",
                "-A",
                "POSTROUTING",
                "-d",
                &b.addr,
                "-j",
                "TEE",
                "--gateway",
                &b.addr,
            ],
        )
        .expect("TEE rule");
        send(&a, dgram.clone(), 50);
        let got = received(&udp);
        let copied = lab.heal("a").expect("heal");
        assert!(got > 50 && copied > 0, "duplication delivered {got} of 50 sent ({copied} copied)");

        // Delay: b's incoming packets are held 300–400 ms by the delay server.
        let server = DelayServer::start(&b.ns, QUEUE, 1).expect("delay server");
        server.control.set(Some((300, 400)));
        lab.iptables("b", &["-A", "INPUT", "-j", "NFQUEUE", "--queue-num", "7", "--queue-bypass"])
            .expect("NFQUEUE rule");
        let slow = round_trip(&a, echo.clone()).expect("round trip over a delayed link");
        let queued = lab.heal("b").expect("heal");
        server.control.set(None);
        // The connect's SYN and the request are each held ≥ 300 ms: a lower bound, not a timing.
        assert!(slow >= Duration::from_millis(600), "a delayed round trip took only {slow:?}");
        assert!(queued > 0, "the NFQUEUE rule counted no packet");
        let delayed = server.control.delayed.load(std::sync::atomic::Ordering::Relaxed);
        assert!(delayed >= 2, "the delay server released {delayed} packets");
        println!("round trip over a 300-400 ms link: {slow:?}; {queued} packets queued");
        drop(server);
        drop(lab);
    }
    assert_no_lab_left("u");
}

/// What each network nemesis did over a run.
#[derive(Debug, Default, Clone)]
struct Acted {
    times: usize,
    packets: u64,
}

/// The cluster of the chaos run, its lab and delay servers, and what the nemeses did.
struct NetCluster {
    cluster: EtcdCluster,
    lab: Arc<Lab>,
    /// One per member, in member order.
    delays: Vec<DelayServer>,
    acted: BTreeMap<&'static str, Acted>,
}

impl NetCluster {
    fn member_addr(&self, i: usize) -> Result<String, String> {
        Ok(self.lab.host(MEMBERS[i])?.addr.clone())
    }
    fn addrs(&self, roles: &[&str]) -> Result<String, String> {
        let v: Result<Vec<String>, String> =
            roles.iter().map(|r| self.lab.host(r).map(|h| h.addr.clone())).collect();
        Ok(v?.join(", "))
    }
    fn others(&self, i: usize) -> Vec<&'static str> {
        MEMBERS.iter().enumerate().filter(|(j, _)| *j != i).map(|(_, r)| *r).collect()
    }
    fn heal(&self, roles: &[&str]) -> Result<u64, String> {
        let mut n = 0;
        for r in roles {
            n += self.lab.heal(r)?;
        }
        Ok(n)
    }
}

impl Target for NetCluster {
    fn members(&self) -> usize {
        MEMBERS.len()
    }
    fn endpoints(&self) -> Vec<String> {
        self.cluster.endpoints()
    }
    fn prefix_root(&self) -> &'static str {
        ""
    }
    fn client_args(&self, _dir: &Path) -> Vec<String> {
        Vec::new()
    }
    fn observer_options(&self) -> EtcdOptions {
        let mut eo = EtcdOptions::new(self.cluster.endpoints());
        eo.request_timeout = Duration::from_secs(3);
        eo.connect_timeout = Duration::from_secs(1);
        eo
    }
    async fn leader(&self) -> Option<usize> {
        self.cluster.leader().await
    }
    fn kill_member(&mut self, i: usize) -> Result<(), String> {
        self.cluster.kill_member(i)
    }
    async fn restart_member(&mut self, i: usize) -> Result<(), String> {
        self.cluster.restart_member(i).await
    }
    fn pause_member(&mut self, i: usize) -> Result<(), String> {
        self.cluster.pause_member(i)
    }
    fn resume_member(&mut self, i: usize) -> Result<(), String> {
        self.cluster.resume_member(i)
    }
    fn dir(&self) -> &Path {
        self.cluster.dir()
    }
    fn client_command(&self, bin: &Path, i: usize) -> Command {
        let mut c = Command::new("ip");
        let ns = self
            .lab
            .host(CLIENT_HOSTS[i % CLIENT_HOSTS.len()])
            .map(|h| h.ns.clone())
            .unwrap_or_default();
        c.args(["netns", "exec", &ns]).arg(bin);
        c
    }

    async fn nemesis(
        &mut self,
        what: &'static str,
        leader: Option<usize>,
        rng: &mut StdRng,
    ) -> Result<(usize, bool), String> {
        let target = match (what, leader) {
            ("partition-follower", Some(l)) => (l + rng.random_range(1..MEMBERS.len())) % 3,
            (_, Some(l)) => l,
            (_, None) => rng.random_range(0..MEMBERS.len()),
        };
        let hold = Duration::from_millis(rng.random_range(2000..4000));
        let mut touched: Vec<&str> = Vec::new();
        match what {
            "partition-leader" => {
                let others = self.addrs(&self.others(target))?;
                let m = MEMBERS[target];
                self.lab.rule(m, "input", &format!("ip saddr {{ {others} }}"))?;
                self.lab.rule(m, "output", &format!("ip daddr {{ {others} }}"))?;
                touched.push(m);
            }
            "partition-follower" => {
                let m = MEMBERS[target];
                self.lab.rule(m, "input", "ip saddr 10.231.0.0/24")?;
                self.lab.rule(m, "output", "ip daddr 10.231.0.0/24")?;
                touched.push(m);
            }
            "cut-clients-from-leader" => {
                let m = MEMBERS[target];
                if rng.random_bool(0.5) {
                    let clients = self.addrs(&CLIENT_HOSTS)?;
                    self.lab.rule(m, "output", &format!("ip daddr {{ {clients} }}"))?;
                    touched.push(m);
                } else {
                    let addr = self.member_addr(target)?;
                    for c in CLIENT_HOSTS {
                        self.lab.rule(c, "output", &format!("ip daddr {addr}"))?;
                        touched.push(c);
                    }
                }
            }
            "lossy-links" => {
                let pct = rng.random_range(5..=30);
                for h in MEMBERS.iter().chain(CLIENT_HOSTS.iter()) {
                    self.lab.rule(h, "input", &format!("numgen random mod 100 < {pct}"))?;
                    touched.push(h);
                }
            }
            "slow-links" => {
                let lo = rng.random_range(100..=1000);
                let hi = lo + rng.random_range(100..=1000);
                for (i, m) in MEMBERS.iter().enumerate() {
                    self.delays[i].control.set(Some((lo, hi)));
                    self.lab.iptables(
                        m,
                        &["-A", "INPUT", "-j", "NFQUEUE", "--queue-num", "7", "--queue-bypass"],
                    )?;
                    touched.push(m);
                }
            }
            "duplicate" => {
                let p = format!("{:.2}", rng.random_range(0.1..0.5));
                let hosts: Vec<&str> = MEMBERS.iter().chain(CLIENT_HOSTS.iter()).copied().collect();
                for h in &hosts {
                    for o in &hosts {
                        if o == h {
                            continue;
                        }
                        let to = self.lab.host(o)?.addr.clone();
                        self.lab.iptables(
                            h,
                            &[
                                "-t",
                                "mangle",
                                "-A",
                                "POSTROUTING",
                                "-d",
                                &to,
                                "-m",
                                "statistic",
                                "--mode",
                                "random",
                                "--probability",
                                &p,
                                "-j",
                                "TEE",
                                "--gateway",
                                &to,
                            ],
                        )?;
                    }
                    touched.push(h);
                }
            }
            other => return Err(format!("unknown nemesis {other:?}")),
        }
        tokio::time::sleep(hold).await;
        let packets = self.heal(&touched)?;
        if what == "slow-links" {
            for d in &self.delays {
                d.control.set(None);
            }
        }
        let a = self.acted.entry(what).or_default();
        a.times += 1;
        a.packets += packets;
        Ok((target, true))
    }
}

#[test]
fn chaos_in_network_namespaces_is_linearizable() {
    if !lab_or_skip("the network-namespace chaos test") || !etcd_or_skip("the netns chaos test") {
        return;
    }
    let chaos_secs: u64 =
        std::env::var("CHAOS_NETNS_SECS").ok().and_then(|s| s.parse().ok()).unwrap_or(60);
    let mut roles: Vec<&str> = MEMBERS.to_vec();
    roles.extend(CLIENT_HOSTS);
    roles.push("ob");
    let acted = {
        let lab = Arc::new(Lab::create("x", &roles).expect("lab"));
        let delays: Vec<DelayServer> = MEMBERS
            .iter()
            .enumerate()
            .map(|(i, m)| {
                let ns = &lab.host(m).expect("member host").ns;
                DelayServer::start(ns, QUEUE, i as u64).expect("delay server")
            })
            .collect();
        let hosts: Vec<MemberHost> = MEMBERS
            .iter()
            .map(|m| {
                let h = lab.host(m).expect("member host");
                MemberHost { netns: Some(h.ns.clone()), addr: h.addr.clone() }
            })
            .collect();
        let observer = lab.host("ob").expect("observer host").ns.clone();
        let cycle = [
            "partition-leader",
            "kill-client",
            "slow-links",
            "pause-leader",
            "cut-clients-from-leader",
            "lossy-links",
            "kill-leader",
            "partition-follower",
            "duplicate",
            "pause-follower",
        ];
        // The observer (this run's scans and leader queries) lives in namespace `ob`: a thread
        // that entered it, with a runtime whose threads it starts there too.
        let run = in_ns(&observer, {
            let lab = lab.clone();
            move || {
                let rt = tokio::runtime::Builder::new_multi_thread()
                    .worker_threads(2)
                    .enable_all()
                    .build()
                    .map_err(|e| format!("runtime: {e}"))?;
                rt.block_on(async move {
                    let cluster = EtcdCluster::start_on(hosts).await?;
                    let mut net = NetCluster { cluster, lab, delays, acted: BTreeMap::new() };
                    run_chaos(&mut net, chaos_secs, &cycle).await;
                    let reordered: u64 = net
                        .delays
                        .iter()
                        .map(|d| d.control.reordered.load(std::sync::atomic::Ordering::Relaxed))
                        .sum();
                    let max_hold = net
                        .delays
                        .iter()
                        .map(|d| d.control.max_hold_ms.load(std::sync::atomic::Ordering::Relaxed))
                        .max()
                        .unwrap_or(0);
                    Ok((net.acted.clone(), reordered, max_hold))
                })
            }
        });
        let acted = join(run);
        // Every process this run started was stopped by its guard: nothing runs in the lab.
        for ns in lab.namespaces() {
            let pids =
                netlab::run(Command::new("ip").args(["netns", "pids", &ns])).unwrap_or_default();
            assert!(pids.trim().is_empty(), "processes left running in {ns}: {pids}");
        }
        acted
    };
    assert_no_lab_left("x");
    let (acted, reordered, max_hold) = acted;
    println!("network nemeses: {acted:?}");
    println!("slow links: {reordered} packets released out of order, longest delay {max_hold} ms");
    if chaos_secs >= 60 {
        for kind in [
            "partition-leader",
            "slow-links",
            "cut-clients-from-leader",
            "lossy-links",
            "partition-follower",
            "duplicate",
        ] {
            let a = acted.get(kind).cloned().unwrap_or_default();
            assert!(a.times > 0 && a.packets > 0, "nemesis {kind} never acted: {a:?}");
        }
        assert!(reordered > 0, "the slow links reordered no packet");
    }
}

/// A crashed run's namespaces (its PID is gone) are removed, with what runs in them; a live
/// run's are left alone.
#[test]
fn namespaces_of_crashed_runs_are_reaped_and_live_ones_kept() {
    if !lab_or_skip("the namespace reaping check") {
        return;
    }
    // A PID that is surely gone: a process that ran and was reaped.
    let mut done = Command::new("true").spawn().expect("run true");
    let dead = done.id();
    done.wait().expect("reap true");
    let stale = format!("{}{dead}-rsw", netlab::NS_PREFIX);
    let live = format!("{}{}-rlive", netlab::NS_PREFIX, std::process::id());
    for ns in [&stale, &live] {
        netlab::run(Command::new("ip").args(["netns", "add", ns])).expect("add namespace");
    }
    // Something left running in the stale namespace, as a killed run leaves its etcd members.
    let mut sleeper = Command::new("ip")
        .args(["netns", "exec", &stale, "sleep", "600"])
        .spawn()
        .expect("sleep in the stale namespace");
    // Reap only once it runs inside (or has failed to get in: another test's reaper, running at
    // the same time, may have removed the namespace first); else it could enter after the reap.
    let sleeper_pid = sleeper.id().to_string();
    let deadline = Instant::now() + Duration::from_secs(10);
    while Instant::now() < deadline {
        let pids =
            netlab::run(Command::new("ip").args(["netns", "pids", &stale])).unwrap_or_default();
        if pids.split_whitespace().any(|p| p == sleeper_pid)
            || sleeper.try_wait().ok().flatten().is_some()
        {
            break;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let reaped = netlab::reap_stale();
    let left = netlab::namespaces();
    let _ = netlab::run(Command::new("ip").args(["netns", "del", &live]));
    // The reaper killed the sleeper (by PID), so it has ended or ends at once; if not, it is
    // killed here and the test fails.
    let deadline = Instant::now() + Duration::from_secs(10);
    let status = loop {
        if let Some(st) = sleeper.try_wait().expect("wait for the sleeper") {
            break Some(st);
        }
        if Instant::now() > deadline {
            let _ = sleeper.kill();
            let _ = sleeper.wait();
            break None;
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    assert!(!left.contains(&stale), "stale namespace {stale} kept (reaped {reaped:?})");
    assert!(left.contains(&live), "the live run's namespace {live} was removed");
    let status = status.expect("the process in the stale namespace still ran 10 s after the reap");
    assert!(!status.success(), "the process in the stale namespace ended by itself: {status}");
}
