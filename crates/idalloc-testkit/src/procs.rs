//! Memory and open files of a process, from Linux's `/proc` (the `procfs` crate): the figures
//! of the memory tests, the benchmarks, the examples and the soak. One reader instead of the
//! five hand-written ones the crates had (`VmRSS`/`VmHWM` parsed from `/proc/<pid>/status`, each
//! a little differently: bytes or KiB, 0 or `None` when missing).
//!
//! Sizes are in bytes. `None` when the process is gone (or is a zombie, which has no memory
//! left to measure) or `/proc` cannot be read (not Linux).

use procfs::process::Process;

/// Which process: this one, or another by PID.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Proc {
    Myself,
    Pid(u32),
}

/// A process's resident memory at one moment.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Memory {
    /// Resident set now (`VmRSS`), in bytes.
    pub rss: u64,
    /// Peak resident set so far (`VmHWM`), in bytes: a high-water mark, so any sample after
    /// the peak shows it.
    pub peak: u64,
}

fn open(p: Proc) -> Option<Process> {
    match p {
        Proc::Myself => Process::myself().ok(),
        Proc::Pid(pid) => Process::new(i32::try_from(pid).ok()?).ok(),
    }
}

/// `VmRSS` and `VmHWM` of `/proc/<pid>/status`.
pub fn memory(p: Proc) -> Option<Memory> {
    let status = open(p)?.status().ok()?;
    // procfs gives these two in kB (KiB, as the kernel writes them).
    Some(Memory { rss: status.vmrss? * 1024, peak: status.vmhwm? * 1024 })
}

/// Entries of `/proc/<pid>/fd`: the process's open files, sockets and pipes.
pub fn open_fds(p: Proc) -> Option<u64> {
    u64::try_from(open(p)?.fd_count().ok()?).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn memory_and_fds_of_this_process_and_of_a_child() {
        let me = memory(Proc::Myself).expect("this process's memory");
        assert!(me.rss > 0 && me.rss % 1024 == 0 && me.peak >= me.rss, "{me:?}");
        let own = memory(Proc::Pid(std::process::id())).expect("by PID");
        assert!(own.peak >= me.peak, "the peak never falls: {own:?} after {me:?}");

        // A file opened here is one more fd.
        let before = open_fds(Proc::Myself).expect("this process's fds");
        let f = std::fs::File::open("/proc/self/status").expect("open a file");
        let with = open_fds(Proc::Myself).expect("fds");
        drop(f);
        assert!(with > before, "{with} fds with one more file open, {before} before");

        let mut child = std::process::Command::new("sleep").arg("30").spawn().expect("sleep");
        let pid = child.id();
        let m = memory(Proc::Pid(pid)).expect("a live child's memory");
        assert!(m.rss > 0, "{m:?}");
        assert!(open_fds(Proc::Pid(pid)).expect("a live child's fds") >= 3);
        child.kill().expect("kill");
        child.wait().expect("reap");
        // No process 0 in /proc; a PID past i32 is none of Linux's.
        for p in [Proc::Pid(0), Proc::Pid(u32::MAX)] {
            assert_eq!((memory(p), open_fds(p)), (None, None), "{p:?}");
        }
    }
}
