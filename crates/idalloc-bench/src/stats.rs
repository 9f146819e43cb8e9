//! Measurement helpers: latency summaries, round-trip accounting, resident memory, machine facts.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use idalloc_testkit::counting::RoundTrips;

/// What one contender did in one measured run.
#[derive(Clone, Debug, Default)]
pub struct Run {
    /// Operations that succeeded.
    pub ops: u64,
    /// Operations that gave up (e.g. Contiv's 10 compare-and-swap attempts all lost).
    pub failures: u64,
    /// Wall time of the measured part, seconds.
    pub secs: f64,
    /// Latency of every successful operation, sorted once [`Run::finish`] ran.
    pub lat: Vec<Duration>,
    /// Store requests issued during the measured part (see [`per_op_requests`]).
    pub requests: u64,
    /// Protocol-level retries (a lost compare, a failed attempt) during the measured part.
    pub retries: u64,
}

impl Run {
    /// Sorts latencies so percentiles can be read.
    pub fn finish(mut self) -> Self {
        self.lat.sort_unstable();
        self
    }

    pub fn throughput(&self) -> f64 {
        if self.secs > 0.0 {
            self.ops as f64 / self.secs
        } else {
            0.0
        }
    }

    pub fn percentile(&self, p: f64) -> Duration {
        if self.lat.is_empty() {
            return Duration::ZERO;
        }
        let idx = ((self.lat.len() as f64 - 1.0) * p).round() as usize;
        self.lat[idx.min(self.lat.len() - 1)]
    }

    /// Round trips per successful operation.
    pub fn rt_per_op(&self) -> f64 {
        if self.ops == 0 {
            0.0
        } else {
            self.requests as f64 / self.ops as f64
        }
    }

    pub fn retries_per_op(&self) -> f64 {
        if self.ops == 0 {
            0.0
        } else {
            self.retries as f64 / self.ops as f64
        }
    }
}

/// Requests that belong to operations: everything but lease keep-alives, which a process sends in
/// the background once per TTL/3 whatever it does (not per operation). The benchmark's sessions use
/// a 60 s TTL, so none fall inside a measured run anyway; excluding them keeps the figure exact.
pub fn per_op_requests(rt: &RoundTrips) -> u64 {
    rt.excluding_keep_alives()
}

/// Resident set size of this process in bytes (from `/proc/self/statm`), or `None` off Linux.
pub fn resident_bytes() -> Option<u64> {
    let statm = std::fs::read_to_string("/proc/self/statm").ok()?;
    let pages: u64 = statm.split_whitespace().nth(1)?.parse().ok()?;
    Some(pages * page_size())
}

/// The memory page size; 4096 unless `getconf` says otherwise.
fn page_size() -> u64 {
    std::process::Command::new("getconf")
        .arg("PAGESIZE")
        .output()
        .ok()
        .and_then(|o| String::from_utf8(o.stdout).ok())
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(4096)
}

/// Logical CPUs available to this process.
pub fn cores() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get())
}

/// The 1/5/15-minute load averages as `/proc/loadavg` shows them.
pub fn load_average() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .ok()
        .map(|s| s.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_else(|| "unknown".into())
}

/// CPU model name from `/proc/cpuinfo`.
pub fn cpu_model() -> String {
    std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("model name"))
                .and_then(|l| l.split(':').nth(1))
                .map(|m| m.trim().to_string())
        })
        .unwrap_or_else(|| "unknown CPU".into())
}

/// `etcd --version`'s first line, e.g. `etcd Version: 3.4.23`.
pub fn etcd_version() -> String {
    std::process::Command::new("etcd")
        .arg("--version")
        .output()
        .ok()
        .and_then(|o| String::from_utf8(o.stdout).ok())
        .and_then(|s| s.lines().next().map(str::to_string))
        .unwrap_or_else(|| "etcd (version unknown)".into())
}

/// Current UTC date and time as `YYYY-MM-DD HH:MM UTC` (no date crate needed).
pub fn utc_now() -> String {
    let secs = SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs());
    let (days, rem) = (secs / 86_400, secs % 86_400);
    let (y, m, d) = civil_from_days(days as i64);
    format!("{y:04}-{m:02}-{d:02} {:02}:{:02} UTC", rem / 3600, (rem % 3600) / 60)
}

/// Days since 1970-01-01 to a proleptic Gregorian date (Howard Hinnant's algorithm).
fn civil_from_days(z: i64) -> (i64, u32, u32) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    let y = yoe + era * 400 + i64::from(m <= 2);
    (y, m, d)
}

pub fn ms(d: Duration) -> String {
    format!("{:.2}", d.as_secs_f64() * 1000.0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn civil_dates() {
        assert_eq!(civil_from_days(0), (1970, 1, 1));
        assert_eq!(civil_from_days(19_723), (2024, 1, 1));
        assert_eq!(civil_from_days(20_513), (2026, 3, 1));
    }

    #[test]
    fn percentiles_and_rates() {
        let run = Run {
            ops: 4,
            secs: 2.0,
            lat: vec![4, 1, 3, 2].into_iter().map(Duration::from_millis).collect(),
            requests: 28,
            retries: 2,
            failures: 0,
        }
        .finish();
        assert_eq!(run.percentile(0.0), Duration::from_millis(1));
        assert_eq!(run.percentile(1.0), Duration::from_millis(4));
        assert_eq!(run.throughput(), 2.0);
        assert_eq!(run.rt_per_op(), 7.0);
        assert_eq!(run.retries_per_op(), 0.5);
    }
}

/// Where the CPU of one bulk run went: the client process and the etcd server, in seconds, over
/// `wall` seconds for `keys` keys. The batching targets are ratios against etcd ceilings, and on a
/// 2-core machine the client and etcd share the cores, so the client's CPU per key is what a
/// missed ratio is made of (docs/benchmarks/batching.md).
#[derive(Clone, Debug, Default)]
pub struct CpuSplit {
    pub keys: usize,
    pub wall: f64,
    pub client: f64,
    pub etcd: f64,
}

impl CpuSplit {
    /// Microseconds of CPU per key: (client, etcd).
    pub fn per_key_us(&self) -> (f64, f64) {
        let k = self.keys.max(1) as f64;
        (self.client * 1e6 / k, self.etcd * 1e6 / k)
    }
}

/// The CPU counters of a client and of an etcd server at one moment (`None` where `/proc` could
/// not be read); two of them make a [`CpuSplit`].
#[derive(Clone, Copy, Debug)]
pub struct CpuSample {
    client: Option<f64>,
    etcd: Option<f64>,
}

impl CpuSample {
    /// Reads both counters now. The client is this process, or with `children` the children it
    /// has waited for (a CLI run: the only child that ends during it); `etcd` is the server's PID.
    pub fn now(children: bool, etcd: Option<u32>) -> CpuSample {
        CpuSample {
            client: cpu_secs("self", children),
            etcd: etcd.and_then(|pid| cpu_secs(&pid.to_string(), false)),
        }
    }

    /// What was spent between `self` and `later` on `keys` keys in `wall` seconds (NaN for a
    /// counter that could not be read).
    pub fn split_to(&self, later: CpuSample, keys: usize, wall: f64) -> CpuSplit {
        let delta = |a: Option<f64>, b: Option<f64>| b.zip(a).map_or(f64::NAN, |(b, a)| b - a);
        CpuSplit {
            keys,
            wall,
            client: delta(self.client, later.client),
            etcd: delta(self.etcd, later.etcd),
        }
    }
}

/// CPU seconds (user + system) used by process `pid` (`"self"` for this one), or with `children`
/// those of its children it has waited for (`cutime + cstime`), from `/proc/PID/stat`. `None` where
/// there is no procfs. The unit is USER_HZ, which Linux fixes at 100 ticks per second for
/// user space whatever the kernel's own tick rate.
pub fn cpu_secs(pid: &str, children: bool) -> Option<f64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name (field 2) may contain spaces and parentheses: fields resume after the last ')'.
    let rest = &stat[stat.rfind(')')? + 1..];
    let f: Vec<&str> = rest.split_whitespace().collect();
    // f[0] is field 3 (state): utime is field 14, stime 15, cutime 16, cstime 17.
    let (a, b) = if children { (13, 14) } else { (11, 12) };
    let ticks: u64 = f.get(a)?.parse::<u64>().ok()? + f.get(b)?.parse::<u64>().ok()?;
    Some(ticks as f64 / 100.0)
}
