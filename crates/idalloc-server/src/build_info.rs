//! What this build is (version, git commit, the API and record layout it speaks) and the
//! process-level metrics: `GET /v1/version`, `idalloc version`, `idalloc_build_info` and the
//! standard `process_*` series, read from `/proc` at each scrape.
//!
//! Every metric family the service exports gets its HELP text here (or in the library's
//! `idalloc::metrics::describe`), so `promtool check metrics` has nothing to warn about.

use idalloc_wire::Version;

/// The crate version (`Cargo.toml`), the same for every crate of the workspace.
pub const VERSION: &str = env!("CARGO_PKG_VERSION");
/// The git commit the binary was built from (12 hex digits), or "unknown" (`build.rs`).
pub const GIT_SHA: &str = env!("IDALLOC_GIT_SHA");
/// The HTTP API's version (its path prefix).
pub const API_VERSION: &str = "v1";

/// `idalloc_build_info{version,git_sha}`: always 1; the labels say what runs.
pub const BUILD_INFO: &str = "idalloc_build_info";
/// Resident memory of this process, in bytes.
pub const RESIDENT_MEMORY: &str = "process_resident_memory_bytes";
/// Virtual memory of this process, in bytes.
pub const VIRTUAL_MEMORY: &str = "process_virtual_memory_bytes";
/// User and system CPU time of this process, in seconds.
pub const CPU_SECONDS: &str = "process_cpu_seconds_total";
/// Open file descriptors.
pub const OPEN_FDS: &str = "process_open_fds";
/// The soft limit on open file descriptors.
pub const MAX_FDS: &str = "process_max_fds";
/// When the process started, in seconds since the Unix epoch.
pub const START_TIME: &str = "process_start_time_seconds";

/// This build's version, without the store's (filled in by the caller that asked it).
pub fn version(store: Option<String>) -> Version {
    Version {
        version: VERSION.to_string(),
        git_sha: GIT_SHA.to_string(),
        api: API_VERSION.to_string(),
        layout: idalloc::layout::LAYOUT_VERSION,
        store,
    }
}

/// Describes the service's metric families (HELP and unit) and sets the build info. Called once
/// the recorder is installed, before anything records.
pub fn describe() {
    use metrics::{describe_counter, describe_gauge, describe_histogram, Unit};
    idalloc::metrics::describe();
    describe_gauge!(BUILD_INFO, "Always 1; labels: the version and git commit of this build");
    metrics::gauge!(BUILD_INFO, "version" => VERSION, "git_sha" => GIT_SHA).set(1.0);
    describe_counter!(
        crate::HTTP_REQUESTS,
        "HTTP requests served, by route template, method and status"
    );
    describe_histogram!(
        crate::HTTP_DURATION,
        Unit::Seconds,
        "Duration of HTTP requests, by route template and method"
    );
    describe_gauge!(crate::conn::HTTP_CONNECTIONS, "HTTP connections open now");
    describe_gauge!(crate::conn::HTTP_MAX_CONNECTIONS, "The connection cap (--max-connections)");
    describe_counter!(
        crate::conn::HTTP_CONNECTIONS_CLOSED,
        "Connections the service closed or refused to stay under its cap, by reason"
    );
    describe_gauge!(crate::watch::WATCH_SUBSCRIBERS, "Open watch streams, by pool");
    describe_counter!(
        crate::watch::WATCH_LAGGED,
        "Watch streams ended because their client fell behind the kept history, by pool"
    );
    describe_gauge!(RESIDENT_MEMORY, Unit::Bytes, "Resident memory size in bytes");
    describe_gauge!(VIRTUAL_MEMORY, Unit::Bytes, "Virtual memory size in bytes");
    describe_counter!(CPU_SECONDS, Unit::Seconds, "Total user and system CPU time in seconds");
    describe_gauge!(OPEN_FDS, "Number of open file descriptors");
    describe_gauge!(MAX_FDS, "Maximum number of open file descriptors");
    describe_gauge!(START_TIME, Unit::Seconds, "Start time of the process since the Unix epoch");
    record_process();
}

/// Sets the `process_*` series from `/proc/self` (Linux; elsewhere they are not exported).
pub fn record_process() {
    #[cfg(target_os = "linux")]
    {
        use procfs::process::{LimitValue, Process};
        use procfs::WithCurrentSystemInfo;
        let Ok(me) = Process::myself() else { return };
        if let Ok(stat) = me.stat() {
            metrics::gauge!(RESIDENT_MEMORY).set(stat.rss_bytes().get() as f64);
            metrics::gauge!(VIRTUAL_MEMORY).set(stat.vsize as f64);
            let ticks = procfs::ticks_per_second();
            // Whole seconds: the exporter's counters hold integers.
            if let Some(cpu) = (stat.utime + stat.stime).checked_div(ticks) {
                metrics::counter!(CPU_SECONDS).absolute(cpu);
                if let Ok(boot) = procfs::boot_time_secs() {
                    let start = boot as f64 + stat.starttime as f64 / ticks as f64;
                    metrics::gauge!(START_TIME).set(start);
                }
            }
        }
        if let Ok(n) = me.fd_count() {
            metrics::gauge!(OPEN_FDS).set(n as f64);
        }
        if let Ok(limits) = me.limits() {
            if let LimitValue::Value(v) = limits.max_open_files.soft_limit {
                metrics::gauge!(MAX_FDS).set(v as f64);
            }
        }
    }
}
