//! The soak run's verdict on resource growth (`tests/soak.rs`, docs/chaos.md
//! "Soak"): pure functions over the sampled series, kept apart from the sampling so the rule can
//! be tested on made-up series.
//!
//! The rule compares the *last* quarter of the checked span with its *first* quarter, on the
//! median of each: a leak is growth that keeps going, so the end of the run stands above its
//! beginning by more than noise. Medians, not means or maxima, so one sample taken while a member
//! was being restarted (a client's reconnect holding a few extra sockets, a Go GC cycle not yet
//! run) does not decide. The first part of the run is warm-up and not checked at all: allocator
//! arenas, connection pools, etcd's caches and the key set's bindings fill up to their steady
//! level there. A least-squares slope would also work, but it is pulled by the saw-tooth of
//! garbage-collected heaps (etcd's RSS) far more than a median of a window is.
//!
//! Only series that cover the whole checked span are judged (a process restarted during it
//! starts a new series; so does a fault that hides a value, such as a member frozen while its
//! metrics were read).

/// One sampled quantity of one process (or of the cluster), in sample order.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Series {
    /// What it is: `"rss_kib chaos-client h1.1 (pid 123)"`, `"etcd watchers (sum)"`...
    pub name: String,
    /// `(seconds since the soak started, value)`.
    pub points: Vec<(f64, f64)>,
}

/// How much a quantity may grow from the first to the last window: `abs + rel × first`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Tolerance {
    pub abs: f64,
    pub rel: f64,
}

/// The verdict on one series.
#[derive(Clone, Debug, PartialEq)]
pub enum Verdict {
    /// It does not cover the checked span (started late or ended early): not judged.
    NotCovering,
    /// First and last window medians; `ok` if the growth is within the tolerance.
    Judged { first: f64, last: f64, allowed: f64, ok: bool },
}

/// Judges `s` over the checked span `[warmup, end]` (seconds): the span is cut in quarters, and
/// the series must have points in the first and the last quarter.
pub fn judge(s: &Series, warmup: f64, end: f64, tol: Tolerance) -> Verdict {
    let q = (end - warmup) / 4.0;
    if q <= 0.0 {
        return Verdict::NotCovering;
    }
    let window = |lo: f64, hi: f64| -> Vec<f64> {
        s.points.iter().filter(|(t, _)| *t >= lo && *t <= hi).map(|(_, v)| *v).collect()
    };
    let (first, last) = (window(warmup, warmup + q), window(end - q, end));
    let (Some(first), Some(last)) = (median(first), median(last)) else {
        return Verdict::NotCovering;
    };
    let allowed = tol.abs + tol.rel * first;
    Verdict::Judged { first, last, allowed, ok: last - first <= allowed }
}

/// The median (the mean of the two middle values for an even count); `None` if empty.
pub fn median(mut v: Vec<f64>) -> Option<f64> {
    if v.is_empty() {
        return None;
    }
    v.sort_by(f64::total_cmp);
    let n = v.len();
    Some(if n % 2 == 1 { v[n / 2] } else { (v[n / 2 - 1] + v[n / 2]) / 2.0 })
}

/// The value of the metric `name` (without labels) in a Prometheus text exposition (etcd's
/// `/metrics`): the sum over its label sets, or `None` if it is absent.
pub fn metric(text: &str, name: &str) -> Option<f64> {
    let mut found = None;
    for line in text.lines() {
        let Some(rest) = line.strip_prefix(name) else { continue };
        // The name must end here: `name 3` or `name{...} 3`, not `name_other 3`.
        let value = if let Some(r) = rest.strip_prefix(' ') {
            r
        } else if rest.starts_with('{') {
            match rest.rsplit_once("} ") {
                Some((_, v)) => v,
                None => continue,
            }
        } else {
            continue;
        };
        if let Ok(v) = value.split_whitespace().next().unwrap_or("").parse::<f64>() {
            *found.get_or_insert(0.0) += v;
        }
    }
    found
}

/// The lease count in `etcdctl lease list`'s answer (`found N leases` and one line per lease).
pub fn lease_count(text: &str) -> Option<u64> {
    text.lines().find_map(|l| l.strip_prefix("found ")?.split_whitespace().next()?.parse().ok())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn series(f: impl Fn(f64) -> f64) -> Series {
        Series { name: "s".into(), points: (0..=100).map(|i| (i as f64, f(i as f64))).collect() }
    }
    const TOL: Tolerance = Tolerance { abs: 2.0, rel: 0.1 };

    #[test]
    fn flat_and_noisy_series_pass_growing_ones_fail() {
        // Flat after a warm-up ramp, with a spike in the last window.
        let flat = series(|t| {
            if t < 20.0 {
                t
            } else if t == 95.0 {
                500.0
            } else {
                40.0
            }
        });
        assert!(matches!(judge(&flat, 20.0, 100.0, TOL), Verdict::Judged { ok: true, .. }));
        // Saw-tooth (a GC'd heap) around a level.
        let saw = series(|t| 100.0 + (t % 10.0));
        assert!(matches!(judge(&saw, 20.0, 100.0, TOL), Verdict::Judged { ok: true, .. }));
        // A steady leak: +0.5 per second over 80 s is +30 between the windows' medians.
        let leak = series(|t| 100.0 + t / 2.0);
        match judge(&leak, 20.0, 100.0, TOL) {
            Verdict::Judged { first, last, ok, .. } => {
                assert!(!ok);
                assert!(last - first > 20.0, "{first} {last}");
            }
            v => panic!("{v:?}"),
        }
    }

    #[test]
    fn a_series_not_covering_the_span_is_not_judged() {
        let mut late = series(|_| 1.0);
        late.points.retain(|(t, _)| *t > 50.0);
        assert_eq!(judge(&late, 20.0, 100.0, TOL), Verdict::NotCovering);
        let mut early = series(|_| 1.0);
        early.points.retain(|(t, _)| *t < 70.0);
        assert_eq!(judge(&early, 20.0, 100.0, TOL), Verdict::NotCovering);
        assert_eq!(judge(&series(|_| 1.0), 50.0, 50.0, TOL), Verdict::NotCovering);
    }

    #[test]
    fn metrics_and_lease_lists_are_read() {
        let text = "# HELP etcd_debugging_mvcc_watcher_total Total number of watchers.\n\
                    # TYPE etcd_debugging_mvcc_watcher_total gauge\n\
                    etcd_debugging_mvcc_watcher_total 7\n\
                    etcd_debugging_mvcc_watcher_total_other 99\n\
                    etcd_x{a=\"1\"} 2\netcd_x{a=\"2\"} 3.5\n";
        assert_eq!(metric(text, "etcd_debugging_mvcc_watcher_total"), Some(7.0));
        assert_eq!(metric(text, "etcd_x"), Some(5.5));
        assert_eq!(metric(text, "etcd_missing"), None);
        assert_eq!(lease_count("found 3 leases\n694d7a1b2c3d4e5f\n"), Some(3));
        assert_eq!(lease_count("found 0 leases\n"), Some(0));
        assert_eq!(lease_count("Error: context deadline exceeded"), None);
    }
}
