//! A private network of hosts in Linux network namespaces, for the network-namespace chaos test
//! (`tests/chaos_netns.rs`, docs/design/chaos.md "Network nemeses").
//!
//! Every host is a namespace of its own with one veth interface on `10.231.0.0/24`; the other
//! ends of the veth pairs sit on a bridge in one more namespace (the switch). Nothing is created
//! in the caller's namespace, so the machine's own network is never touched, and the addresses
//! exist only inside these namespaces. Faults are rules inside the hosts' namespaces: nftables
//! drops (partitions, loss) with counters, iptables `TEE` (duplication) and `NFQUEUE` to a queue
//! that [`crate::delay`] serves (delay, jitter, reordering). `tc netem` is not in this kernel.
//!
//! Namespace names are `idalloc-nc<pid>-<role>`: unique per run, and [`reap_stale`] removes those
//! of runs whose process is gone (a crashed run). [`Lab`]'s drop kills what still runs inside
//! its namespaces (by PID) and deletes them, also when a test panics.

use std::io::Write;
use std::process::{Command, Stdio};

/// The prefix of every namespace this module creates.
pub const NS_PREFIX: &str = "idalloc-nc";

/// The nftables table every fault rule of a host goes into (flushed to heal).
const TABLE: &str = "inet idalloc_chaos";

/// Why the network tests cannot run here, or `None` if they can: they need root (to create
/// namespaces), `ip`, `nft` and `iptables`.
pub fn unavailable() -> Option<String> {
    if !is_root() {
        return Some("not root: creating network namespaces needs CAP_SYS_ADMIN".into());
    }
    for tool in ["ip", "nft", "iptables"] {
        let ok = Command::new(tool)
            .arg(if tool == "ip" { "-V" } else { "--version" })
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success());
        if !ok {
            return Some(format!("`{tool}` is not on PATH (Debian: iproute2, nftables, iptables)"));
        }
    }
    None
}

fn is_root() -> bool {
    // The effective UID from /proc (no libc call, no unsafe).
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("Uid:"))
                .and_then(|l| l.split_whitespace().nth(1).map(str::to_string))
        })
        .is_some_and(|euid| euid == "0")
}

/// Runs a command; its stdout, or an error with its stderr.
pub fn run(cmd: &mut Command) -> Result<String, String> {
    let out = cmd.stdin(Stdio::null()).output().map_err(|e| format!("cannot run {cmd:?}: {e}"))?;
    if out.status.success() {
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    } else {
        Err(format!(
            "{cmd:?} failed ({}): {}",
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        ))
    }
}

fn ip(args: &[&str]) -> Result<String, String> {
    run(Command::new("ip").args(args))
}

/// Every namespace name on this machine (`ip netns list`, first word of each line).
pub fn namespaces() -> Vec<String> {
    ip(&["netns", "list"])
        .unwrap_or_default()
        .lines()
        .filter_map(|l| l.split_whitespace().next().map(str::to_string))
        .collect()
}

/// The PID in a name of this module's pattern, `idalloc-nc<pid>-<role>`.
pub fn owner_pid(ns: &str) -> Option<u32> {
    ns.strip_prefix(NS_PREFIX)?.split_once('-')?.0.parse().ok()
}

/// Removes the namespaces of earlier runs whose process is gone (a run killed before its drop
/// could clean up), killing what still runs in them. Namespaces of live runs are left alone.
/// Returns the names removed.
pub fn reap_stale() -> Vec<String> {
    let mut removed = Vec::new();
    for ns in namespaces() {
        let Some(pid) = owner_pid(&ns) else { continue };
        if process_alive(pid) {
            continue;
        }
        kill_inside(&ns);
        if ip(&["netns", "del", &ns]).is_ok() {
            removed.push(ns);
        }
    }
    removed
}

/// True if process `pid` runs (a zombie, whose test was killed and not yet reaped, does not).
fn process_alive(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/status")).is_ok_and(|s| {
        s.lines()
            .find_map(|l| l.strip_prefix("State:"))
            .is_some_and(|st| !st.trim_start().starts_with('Z'))
    })
}

/// Kills (SIGKILL, by PID) every process still running in namespace `ns`: only this module's
/// namespaces are passed here, and everything in them was started by the test that made them.
fn kill_inside(ns: &str) {
    let pids = ip(&["netns", "pids", ns]).unwrap_or_default();
    for pid in pids.split_whitespace() {
        let _ = Command::new("kill").args(["-CONT", pid]).stderr(Stdio::null()).status();
        let _ = Command::new("kill").args(["-KILL", pid]).stderr(Stdio::null()).status();
    }
}

/// One host: a namespace with an address on the lab's network.
#[derive(Debug, Clone)]
pub struct Host {
    /// The role it was created for (`m0`, `c1`, ...).
    pub role: String,
    /// The namespace name.
    pub ns: String,
    /// Its address on `10.231.0.0/24`.
    pub addr: String,
}

/// The lab: a switch namespace and one namespace per host. Deleted on drop.
#[derive(Debug)]
pub struct Lab {
    switch: String,
    hosts: Vec<Host>,
}

impl Lab {
    /// Creates one host per role (addresses `10.231.0.10`, `.11`, ... in that order) on a bridge.
    /// `tag` keeps apart the labs of one process (tests of one binary run at once); namespaces
    /// are named `idalloc-nc<pid>-<tag><role>`.
    pub fn create(tag: &str, roles: &[&str]) -> Result<Lab, String> {
        let pid = std::process::id();
        let switch = format!("{NS_PREFIX}{pid}-{tag}sw");
        // This process makes each tag's lab once, so any namespace of this name pattern already
        // there is a crashed earlier process's that had the same PID (reused): remove it.
        let mine = format!("{NS_PREFIX}{pid}-{tag}");
        for ns in namespaces().into_iter().filter(|n| n.starts_with(&mine)) {
            kill_inside(&ns);
            let _ = ip(&["netns", "del", &ns]);
        }
        ip(&["netns", "add", &switch])?;
        // From here on, a failure drops `lab`, which deletes what was made.
        let mut lab = Lab { switch: switch.clone(), hosts: Vec::new() };
        ip(&["-n", &switch, "link", "add", "br0", "type", "bridge"])?;
        ip(&["-n", &switch, "link", "set", "br0", "up"])?;
        for (i, role) in roles.iter().enumerate() {
            let ns = format!("{NS_PREFIX}{pid}-{tag}{role}");
            ip(&["netns", "add", &ns])?;
            let addr = format!("10.231.0.{}", 10 + i);
            lab.hosts.push(Host { role: role.to_string(), ns: ns.clone(), addr: addr.clone() });
            let port = format!("p-{role}");
            ip(&[
                "-n", &switch, "link", "add", &port, "type", "veth", "peer", "name", "eth0",
                "netns", &ns,
            ])?;
            ip(&["-n", &switch, "link", "set", &port, "master", "br0", "up"])?;
            ip(&["-n", &ns, "addr", "add", &format!("{addr}/24"), "dev", "eth0"])?;
            ip(&["-n", &ns, "link", "set", "eth0", "up"])?;
            ip(&["-n", &ns, "link", "set", "lo", "up"])?;
            lab.nft(
                role,
                &format!(
                    "add table {TABLE}\n\
                 add chain {TABLE} input {{ type filter hook input priority 0; }}\n\
                 add chain {TABLE} output {{ type filter hook output priority 0; }}\n"
                ),
            )?;
        }
        Ok(lab)
    }

    /// The host of `role`.
    pub fn host(&self, role: &str) -> Result<&Host, String> {
        self.hosts
            .iter()
            .find(|h| h.role == role)
            .ok_or_else(|| format!("no host {role:?} in the lab"))
    }

    /// Every host.
    pub fn hosts(&self) -> &[Host] {
        &self.hosts
    }

    /// Every namespace of the lab (the switch included).
    pub fn namespaces(&self) -> Vec<String> {
        let mut v: Vec<String> = self.hosts.iter().map(|h| h.ns.clone()).collect();
        v.push(self.switch.clone());
        v
    }

    /// A command run inside the namespace of `role` (`ip netns exec`, which execs it in place:
    /// the child's PID is the command's).
    pub fn command(&self, role: &str, program: &str) -> Result<Command, String> {
        let mut c = Command::new("ip");
        c.args(["netns", "exec", &self.host(role)?.ns, program]);
        Ok(c)
    }

    /// Runs an nftables script inside the namespace of `role`.
    pub fn nft(&self, role: &str, script: &str) -> Result<(), String> {
        let mut child = self
            .command(role, "nft")?
            .args(["-f", "-"])
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(|e| format!("cannot run nft: {e}"))?;
        child
            .stdin
            .take()
            .ok_or("nft has no stdin")?
            .write_all(script.as_bytes())
            .map_err(|e| format!("writing to nft: {e}"))?;
        let out = child.wait_with_output().map_err(|e| format!("waiting for nft: {e}"))?;
        if out.status.success() {
            Ok(())
        } else {
            Err(format!(
                "nft in {role} failed on {script:?}: {}",
                String::from_utf8_lossy(&out.stderr).trim()
            ))
        }
    }

    /// Adds one rule to the `input` or `output` chain of `role`'s fault table, with a counter.
    pub fn rule(&self, role: &str, chain: &str, rule: &str) -> Result<(), String> {
        self.nft(role, &format!("add rule {TABLE} {chain} {rule} counter drop\n"))
    }

    /// Runs `iptables` with `args` inside the namespace of `role`.
    pub fn iptables(&self, role: &str, args: &[&str]) -> Result<String, String> {
        run(self.command(role, "iptables")?.args(args))
    }

    /// Heals every fault rule of `role` (nftables and iptables) and answers how many packets
    /// they acted on (dropped, duplicated or queued).
    pub fn heal(&self, role: &str) -> Result<u64, String> {
        let listing =
            run(self.command(role, "nft")?.args(["list", "table", "inet", "idalloc_chaos"]))?;
        let mut packets = count_after(&listing, "packets ");
        for table in ["filter", "mangle"] {
            let listing = self.iptables(role, &["-t", table, "-L", "-v", "-x", "-n"])?;
            packets += listing
                .lines()
                .filter(|l| l.contains("NFQUEUE") || l.contains("TEE"))
                .filter_map(|l| l.split_whitespace().next()?.parse::<u64>().ok())
                .sum::<u64>();
            self.iptables(role, &["-t", table, "-F"])?;
        }
        self.nft(role, &format!("flush chain {TABLE} input\nflush chain {TABLE} output\n"))?;
        Ok(packets)
    }
}

/// Sums the numbers that follow `marker` in nft's listing (`counter packets N bytes M`).
fn count_after(listing: &str, marker: &str) -> u64 {
    listing
        .split(marker)
        .skip(1)
        .filter_map(|rest| rest.split_whitespace().next()?.parse::<u64>().ok())
        .sum()
}

impl Drop for Lab {
    fn drop(&mut self) {
        for ns in self.namespaces() {
            kill_inside(&ns);
            let _ = ip(&["netns", "del", &ns]);
        }
    }
}

/// Moves the calling thread into namespace `ns` (only this thread: sockets it opens afterwards,
/// threads and processes it starts, live on that network).
pub fn enter(ns: &str) -> Result<(), String> {
    let path = format!("/var/run/netns/{ns}");
    let f = std::fs::File::open(&path).map_err(|e| format!("cannot open {path}: {e}"))?;
    rustix::thread::move_into_link_name_space(
        std::os::fd::AsFd::as_fd(&f),
        Some(rustix::thread::LinkNameSpaceType::Network),
    )
    .map_err(|e| format!("cannot enter network namespace {ns}: {e}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn owner_pid_reads_only_this_modules_names() {
        assert_eq!(owner_pid("idalloc-nc1234-m0"), Some(1234));
        assert_eq!(owner_pid("idalloc-nc1234-sw"), Some(1234));
        assert_eq!(owner_pid("other-1234-m0"), None);
        assert_eq!(owner_pid("idalloc-ncx-m0"), None);
        assert_eq!(owner_pid("idalloc-nc1234"), None);
    }

    #[test]
    fn counters_are_summed_from_an_nft_listing() {
        let listing = "table inet idalloc_chaos {\n chain input {\n ip saddr 10.231.0.11 counter packets 12 bytes 900 drop\n numgen random mod 100 < 20 counter packets 3 bytes 1 drop\n }\n}";
        assert_eq!(count_after(listing, "packets "), 15);
        assert_eq!(count_after("table inet idalloc_chaos {}", "packets "), 0);
    }
}
