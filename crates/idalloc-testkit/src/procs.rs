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

/// A child process killed and reaped however the test that started it ends (a failed assertion
/// too), so that no test leaves a process behind.
pub struct KillOnDrop(pub std::process::Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
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

        assert!(open_fds(Proc::Myself).expect("this process's fds") >= 3);

        // Files opened are counted: two children alike but for three more open files (fds 7-9,
        // closed in the twin in case this process passed them on, as `flock` does). Compared
        // on children, not on this process, whose count the other tests of this binary change
        // (a runtime opens and closes its epoll and event fds) between any two reads. The count
        // is waited for (bounded): while a child starts, its shell or `sleep`'s locale setup may
        // hold a file for a moment.
        let sleep = |script: &str| {
            std::process::Command::new("sh")
                .args(["-c", script])
                .stdin(std::process::Stdio::null())
                .spawn()
                .map(KillOnDrop)
                .expect("sh")
        };
        let plain = sleep("exec 7<&- 8<&- 9<&-; exec sleep 300");
        let more = sleep("exec 7</dev/null 8</dev/null 9</dev/null; exec sleep 300");
        let fds = |c: &KillOnDrop| open_fds(Proc::Pid(c.0.id())).expect("a live child's fds");
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
        let (mut a, mut b) = (fds(&plain), fds(&more));
        while b != a + 3 && std::time::Instant::now() < deadline {
            std::thread::sleep(std::time::Duration::from_millis(20));
            (a, b) = (fds(&plain), fds(&more));
        }
        assert_eq!(b, a + 3, "a child with 3 more files open has {b} fds, its twin {a}");
        assert!(a >= 3, "stdin, stdout and stderr at least: {a}");
        let m = memory(Proc::Pid(plain.0.id())).expect("a live child's memory");
        assert!(m.rss > 0, "{m:?}");
        drop((plain, more));
        // No process 0 in /proc; a PID past i32 is none of Linux's.
        for p in [Proc::Pid(0), Proc::Pid(u32::MAX)] {
            assert_eq!((memory(p), open_fds(p)), (None, None), "{p:?}");
        }
    }
}
