//! What the soak run (`tests/soak.rs`) samples of the processes it started, read from Linux's
//! `/proc`: every descendant of a process (so nothing it started escapes the sample, whoever
//! started it: a chaos client restarted by the fault cycle, an etcd member restarted by the
//! testkit, `idalloc serve`), with its resident memory and its open file descriptors.

use std::collections::HashMap;

/// One process at one moment.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ProcSample {
    pub pid: u32,
    /// The command name (`comm`) and what tells processes of one kind apart: a chaos client's
    /// `--proc` tag, an etcd member's `--name` (`"etcd m1"`, `"chaos-client h2.1"`, `"idalloc"`).
    pub label: String,
    /// `VmRSS`, in KiB.
    pub rss_kib: u64,
    /// Entries of `/proc/PID/fd`.
    pub fds: u64,
}

/// The PIDs of every descendant of `root` (children, their children...), from each process's
/// parent in `/proc/PID/stat`. Processes that exit while being read are skipped.
pub fn descendants(root: u32) -> Vec<u32> {
    let mut parent: HashMap<u32, u32> = HashMap::new();
    let Ok(dir) = std::fs::read_dir("/proc") else { return Vec::new() };
    for e in dir.flatten() {
        let Some(pid) = e.file_name().to_str().and_then(|s| s.parse::<u32>().ok()) else {
            continue;
        };
        if let Some(ppid) =
            std::fs::read_to_string(format!("/proc/{pid}/stat")).ok().and_then(|s| parse_ppid(&s))
        {
            parent.insert(pid, ppid);
        }
    }
    let mut out: Vec<u32> = Vec::new();
    let mut frontier = vec![root];
    while let Some(p) = frontier.pop() {
        for (&child, &pp) in &parent {
            if pp == p && !out.contains(&child) {
                out.push(child);
                frontier.push(child);
            }
        }
    }
    out.sort_unstable();
    out
}

/// The parent PID in a `/proc/PID/stat` line: the field after the state, which follows the
/// command name in parentheses (which may itself hold spaces and parentheses, hence the last `)`).
pub fn parse_ppid(stat: &str) -> Option<u32> {
    let (_, rest) = stat.rsplit_once(')')?;
    rest.split_whitespace().nth(1)?.parse().ok()
}

/// Samples `pid`; `None` if it exited meanwhile (or is a zombie: no memory left to measure).
pub fn sample(pid: u32) -> Option<ProcSample> {
    use idalloc_testkit::procs::{memory, open_fds, Proc};
    let rss_kib = memory(Proc::Pid(pid))?.rss / 1024;
    let fds = open_fds(Proc::Pid(pid))?;
    let comm = std::fs::read_to_string(format!("/proc/{pid}/comm")).ok()?;
    let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).ok()?;
    let args: Vec<String> =
        cmdline.split(|b| *b == 0).map(|a| String::from_utf8_lossy(a).into_owned()).collect();
    Some(ProcSample { pid, label: label(comm.trim(), &args), rss_kib, fds })
}

/// `comm`, plus the value of the first flag of `args` that names the process's role.
pub fn label(comm: &str, args: &[String]) -> String {
    for flag in ["--proc", "--name"] {
        if let Some(i) = args.iter().position(|a| a == flag) {
            if let Some(v) = args.get(i + 1) {
                return format!("{comm} {v}");
            }
        }
    }
    comm.to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stat_lines_and_labels_are_read() {
        assert_eq!(parse_ppid("42 (a (b) c) S 7 42 42 0"), Some(7));
        assert_eq!(parse_ppid("garbage"), None);
        let args = |s: &str| s.split(' ').map(String::from).collect::<Vec<_>>();
        assert_eq!(label("etcd", &args("etcd --name m1 --data-dir d")), "etcd m1");
        assert_eq!(label("chaos-client", &args("x --holder h1 --proc h1.2")), "chaos-client h1.2");
        assert_eq!(label("idalloc", &args("idalloc serve")), "idalloc");
    }

    #[test]
    fn a_child_of_this_process_is_found_and_sampled() {
        let mut child = std::process::Command::new("sleep").arg("30").spawn().unwrap();
        let pid = child.id();
        let found = descendants(std::process::id());
        let s = sample(pid);
        let _ = child.kill();
        let _ = child.wait();
        assert!(found.contains(&pid), "{found:?} lacks {pid}");
        let s = s.unwrap();
        assert_eq!(s.label, "sleep");
        assert!(s.rss_kib > 0 && s.fds >= 3, "{s:?}");
    }
}
