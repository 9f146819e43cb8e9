//! The library's metrics: every name, label and recording helper in one place.
//!
//! Recorded through the [`metrics`](https://docs.rs/metrics) facade, so an application that embeds
//! the library and installs a recorder (Prometheus, StatsD, ...) gets them without doing anything;
//! without a recorder each call is a no-op. `idalloc serve` installs the Prometheus exporter.
//!
//! Names follow Prometheus conventions (`idalloc_…_total` for counters, base units: seconds).
//! Labels are bounded: pool names, operation and request kinds, outcome classes. Never a key, a
//! holder, a lease or a session id: those are unbounded (one time series each) and some of them
//! are secrets (a client session's id is its capability).
//!
//! Only the driver (allocator, sync, sweeper) calls these helpers; the pure decision code records
//! nothing.

use std::future::Future;
use std::sync::Once;
use std::time::Instant;

use metrics::{counter, describe_counter, describe_gauge, describe_histogram, gauge, histogram};

use crate::error::Error;
use crate::store::{
    GetRequest, GetResponse, KeyRange, Lease, LeaseId, Revision, Store, StoreError, StoreResult,
    TxnRequest, TxnResponse, WatchStream,
};

/// Duration of an allocator operation, by `pool`, `operation` and `outcome`.
pub const OPERATION_DURATION: &str = "idalloc_operation_duration_seconds";
/// Store requests (round trips), by `kind` (`txn`, `get`, `lease_grant`, ...) and `result`.
pub const STORE_REQUESTS: &str = "idalloc_store_requests_total";
/// Duration of one store request attempt, by `kind`.
pub const STORE_REQUEST_DURATION: &str = "idalloc_store_request_duration_seconds";
/// Bindings in a pool as this process's cache sees them, by `pool`.
pub const POOL_BINDINGS: &str = "idalloc_pool_bindings";
/// IDs of a pool a new key could get now (not bound, reserved or in their reuse delay), by `pool`.
pub const POOL_FREE_IDS: &str = "idalloc_pool_free_ids";
/// Allocatable IDs of a pool (range size minus reserved IDs), by `pool`.
pub const POOL_CAPACITY: &str = "idalloc_pool_capacity";
/// Store revisions the pool's cache is behind the newest revision this process has seen.
pub const CACHE_LAG: &str = "idalloc_cache_lag_revisions";
/// Bindings reclaimed, by `pool` and `by` (`release`: the last release; `sweep`: the sweeper).
pub const RECLAIMS: &str = "idalloc_reclaims_total";
/// Sweeps run, by `pool` and `outcome`.
pub const SWEEPS: &str = "idalloc_sweeps_total";
/// Held keys that lost their ID to another key and were rebound (DESIGN G2), by `pool`.
pub const CONFLICTS: &str = "idalloc_conflicts_total";
/// Lease renewals, by `session` (`process` or `client`) and `result` (`ok`, `lost`, `error`).
pub const SESSION_RENEWALS: &str = "idalloc_session_renewals_total";
/// Session leases found lost (expired or revoked by the store), by `session`.
pub const SESSIONS_LOST: &str = "idalloc_sessions_lost_total";
/// Client sessions open in this process (see `ClientSession`).
pub const CLIENT_SESSIONS: &str = "idalloc_client_sessions";
/// State of a remote view (DESIGN §12), by `pool`, `remote` and `state` (`syncing`, `synced`,
/// `stale`, `refused`): 1 for the view's current state, 0 for the others (all 0 once the view is removed).
/// `remote` is the operator-configured remote name: bounded like pool names.
pub const REMOTE_STATE: &str = "idalloc_remote_view_state";
/// Bindings a remote view shows, by `pool` and `remote`.
pub const REMOTE_BINDINGS: &str = "idalloc_remote_view_bindings";
/// Remote entries dropped because they failed validation, by `pool` and `remote`.
pub const REMOTE_DROPS: &str = "idalloc_remote_validation_drops_total";
/// Times a remote view re-established its remote after losing it (a listing that follows a
/// failed request, probe or broken watch), by `pool` and `remote`.
pub const REMOTE_RECONNECTS: &str = "idalloc_remote_reconnects_total";
/// Seconds since a remote view was last known to follow its remote: 0 while `synced`, growing
/// while `syncing` or `stale`, by `pool` and `remote`.
pub const REMOTE_SYNC_AGE: &str = "idalloc_remote_last_sync_age_seconds";

/// Every metric name above, for tests and dashboards that check what is exported.
pub const ALL: &[&str] = &[
    OPERATION_DURATION,
    STORE_REQUESTS,
    STORE_REQUEST_DURATION,
    POOL_BINDINGS,
    POOL_FREE_IDS,
    POOL_CAPACITY,
    CACHE_LAG,
    RECLAIMS,
    SWEEPS,
    CONFLICTS,
    SESSION_RENEWALS,
    SESSIONS_LOST,
    CLIENT_SESSIONS,
    REMOTE_STATE,
    REMOTE_BINDINGS,
    REMOTE_DROPS,
    REMOTE_RECONNECTS,
    REMOTE_SYNC_AGE,
];

static DESCRIBE: Once = Once::new();

/// Registers help texts and units with the installed recorder. Called when an allocator is built;
/// harmless to call again. A recorder installed later still records everything, without help text.
pub fn describe() {
    DESCRIBE.call_once(|| {
        describe_histogram!(
            OPERATION_DURATION,
            metrics::Unit::Seconds,
            "Duration of allocator operations by pool, operation and outcome"
        );
        describe_counter!(STORE_REQUESTS, "Store requests (round trips) by kind and result");
        describe_histogram!(
            STORE_REQUEST_DURATION,
            metrics::Unit::Seconds,
            "Duration of one store request attempt by kind"
        );
        describe_gauge!(POOL_BINDINGS, "Bindings in the pool (this process's cache)");
        describe_gauge!(POOL_FREE_IDS, "IDs a new key could get now");
        describe_gauge!(POOL_CAPACITY, "Allocatable IDs of the pool");
        describe_gauge!(CACHE_LAG, "Revisions the pool cache is behind the newest seen");
        describe_counter!(RECLAIMS, "Bindings reclaimed, by the last release or the sweeper");
        describe_counter!(SWEEPS, "Sweeps run by outcome");
        describe_counter!(CONFLICTS, "Held keys rebound to a new ID after losing theirs");
        describe_counter!(SESSION_RENEWALS, "Session lease renewals by session kind and result");
        describe_counter!(SESSIONS_LOST, "Session leases lost (expired or revoked)");
        describe_gauge!(CLIENT_SESSIONS, "Client sessions open in this process");
        describe_gauge!(
            REMOTE_STATE,
            "Remote view state (1 for the current one) by pool and remote"
        );
        describe_gauge!(REMOTE_BINDINGS, "Bindings a remote view shows");
        describe_counter!(REMOTE_DROPS, "Remote entries dropped by validation");
        describe_counter!(
            REMOTE_RECONNECTS,
            "Remote views re-established after losing their remote"
        );
        describe_gauge!(
            REMOTE_SYNC_AGE,
            metrics::Unit::Seconds,
            "Seconds since the remote view was last known to follow its remote (0 while synced)"
        );
        // Counters of rare events exist at zero from the start (see `pool_opened`).
        for kind in [SessionKind::Process, SessionKind::Client] {
            counter!(SESSIONS_LOST, "session" => kind.label()).increment(0);
            for result in ["ok", "lost", "error"] {
                counter!(SESSION_RENEWALS, "session" => kind.label(), "result" => result)
                    .increment(0);
            }
        }
    });
}

/// Creates a newly opened pool's counters of rare events at zero.
///
/// Why: Prometheus' `increase()` and `rate()` need two samples of a series, so a counter that
/// first appears at 1 (the first conflict, the first reclaim) shows no increase and an alert on
/// it never fires for that event. A series that exists at 0 from the pool's first use makes the
/// first event count, and lets dashboards and alert rules name series that are always exported.
pub(crate) fn pool_opened(pool: &str) {
    counter!(CONFLICTS, "pool" => pool.to_string()).increment(0);
    for by in ["release", "sweep"] {
        counter!(RECLAIMS, "pool" => pool.to_string(), "by" => by).increment(0);
    }
    counter!(SWEEPS, "pool" => pool.to_string(), "outcome" => "ok").increment(0);
}

/// The outcome label of a result: `ok` or the error's kind.
pub fn outcome<T>(r: &Result<T, Error>) -> &'static str {
    match r {
        Ok(_) => "ok",
        Err(e) => e.kind(),
    }
}

/// Runs an allocator operation and records its duration and outcome.
pub(crate) async fn timed<T>(
    pool: &str,
    operation: &'static str,
    f: impl Future<Output = Result<T, Error>>,
) -> Result<T, Error> {
    let start = Instant::now();
    let r = f.await;
    histogram!(OPERATION_DURATION, "pool" => pool.to_string(), "operation" => operation, "outcome" => outcome(&r))
        .record(start.elapsed().as_secs_f64());
    r
}

/// Publishes a pool's gauges from its cache: bindings, free IDs, capacity and cache lag.
pub(crate) fn pool_gauges(pool: &str, bindings: usize, free: u64, capacity: u64, lag: i64) {
    let p = pool.to_string();
    gauge!(POOL_BINDINGS, "pool" => p.clone()).set(bindings as f64);
    gauge!(POOL_FREE_IDS, "pool" => p.clone()).set(free as f64);
    gauge!(POOL_CAPACITY, "pool" => p.clone()).set(capacity as f64);
    gauge!(CACHE_LAG, "pool" => p).set(lag.max(0) as f64);
}

/// Counts `n` reclaimed bindings.
pub(crate) fn reclaimed(pool: &str, by: &'static str, n: usize) {
    if n > 0 {
        counter!(RECLAIMS, "pool" => pool.to_string(), "by" => by).increment(n as u64);
    }
}

/// Counts a sweep (a dry run is not counted: it changes nothing).
pub(crate) fn swept<T>(pool: &str, r: &Result<T, Error>) {
    counter!(SWEEPS, "pool" => pool.to_string(), "outcome" => outcome(r)).increment(1);
}

/// Counts a held key rebound to a new ID.
pub(crate) fn conflict(pool: &str) {
    counter!(CONFLICTS, "pool" => pool.to_string()).increment(1);
}

/// Session kinds for the session metrics.
#[derive(Clone, Copy, Debug)]
pub(crate) enum SessionKind {
    /// The allocator's own session lease (kept alive by the library).
    Process,
    /// A client session (kept alive by its client, see `ClientSession`).
    Client,
}

impl SessionKind {
    fn label(self) -> &'static str {
        match self {
            SessionKind::Process => "process",
            SessionKind::Client => "client",
        }
    }
}

/// Counts one renewal attempt: `Some(true)` renewed, `Some(false)` the lease was gone, `None` the
/// store did not answer.
pub(crate) fn renewal(kind: SessionKind, renewed: Option<bool>) {
    let result = match renewed {
        Some(true) => "ok",
        Some(false) => "lost",
        None => "error",
    };
    counter!(SESSION_RENEWALS, "session" => kind.label(), "result" => result).increment(1);
}

/// Counts a lost session lease.
pub(crate) fn session_lost(kind: SessionKind) {
    counter!(SESSIONS_LOST, "session" => kind.label()).increment(1);
}

/// Tracks the number of open client sessions.
pub(crate) fn client_sessions(delta: f64) {
    gauge!(CLIENT_SESSIONS).increment(delta);
}

/// The states of a remote view, as `REMOTE_STATE` labels.
pub(crate) const REMOTE_STATES: [&str; 4] = ["syncing", "synced", "stale", "refused"];

/// Publishes a remote view's state: 1 for `state`, 0 for the others; `None` (the view was
/// removed): all 0.
pub(crate) fn remote_state(pool: &str, remote: &str, state: Option<&'static str>) {
    for s in REMOTE_STATES {
        let v = if Some(s) == state { 1.0 } else { 0.0 };
        gauge!(REMOTE_STATE, "pool" => pool.to_string(), "remote" => remote.to_string(), "state" => s)
            .set(v);
    }
}

/// Publishes the number of bindings a remote view shows.
pub(crate) fn remote_bindings(pool: &str, remote: &str, n: usize) {
    gauge!(REMOTE_BINDINGS, "pool" => pool.to_string(), "remote" => remote.to_string())
        .set(n as f64);
}

/// Creates a new remote view's counters at zero (as `pool_opened` does for a pool: a series
/// that first appears at 1 shows no `increase()`).
pub(crate) fn remote_opened(pool: &str, remote: &str) {
    counter!(REMOTE_DROPS, "pool" => pool.to_string(), "remote" => remote.to_string()).increment(0);
    counter!(REMOTE_RECONNECTS, "pool" => pool.to_string(), "remote" => remote.to_string())
        .increment(0);
}

/// Counts remote entries dropped by validation.
pub(crate) fn remote_drops(pool: &str, remote: &str, n: usize) {
    counter!(REMOTE_DROPS, "pool" => pool.to_string(), "remote" => remote.to_string())
        .increment(n as u64);
}

/// Counts a remote view re-established after losing its remote.
pub(crate) fn remote_reconnect(pool: &str, remote: &str) {
    counter!(REMOTE_RECONNECTS, "pool" => pool.to_string(), "remote" => remote.to_string())
        .increment(1);
}

/// Publishes the seconds since a remote view was last known to follow its remote.
pub(crate) fn remote_sync_age(pool: &str, remote: &str, secs: f64) {
    gauge!(REMOTE_SYNC_AGE, "pool" => pool.to_string(), "remote" => remote.to_string()).set(secs);
}

/// The `result` label of a store request.
fn store_result<T>(r: &StoreResult<T>) -> &'static str {
    match r {
        Ok(_) => "ok",
        Err(StoreError::Unavailable(_)) => "unavailable",
        Err(StoreError::InvalidRequest(_)) => "invalid_request",
        Err(StoreError::Compacted { .. }) => "compacted",
        Err(StoreError::FutureRevision { .. }) => "future_revision",
        Err(StoreError::LeaseNotFound(_)) => "lease_not_found",
        Err(StoreError::Locked { .. }) => "locked",
        Err(StoreError::Corrupt { .. }) => "corrupt",
        Err(StoreError::Access { .. }) => "access_denied",
        Err(StoreError::ResponseTooLarge(_)) => "response_too_large",
        Err(StoreError::ReadOnly { .. }) => "read_only",
    }
}

/// Wraps the allocator's store and records every request (round trip) by kind and result, so the
/// count holds whichever part of the driver sends it (operations, cache sync, keep-alive, sweeps).
pub(crate) struct MeteredStore {
    inner: std::sync::Arc<dyn Store>,
}

impl MeteredStore {
    pub(crate) fn new(inner: std::sync::Arc<dyn Store>) -> Self {
        MeteredStore { inner }
    }

    async fn record<T>(
        kind: &'static str,
        f: impl Future<Output = StoreResult<T>>,
    ) -> StoreResult<T> {
        let start = Instant::now();
        let r = f.await;
        histogram!(STORE_REQUEST_DURATION, "kind" => kind).record(start.elapsed().as_secs_f64());
        counter!(STORE_REQUESTS, "kind" => kind, "result" => store_result(&r)).increment(1);
        r
    }
}

#[async_trait::async_trait]
impl Store for MeteredStore {
    async fn txn(&self, req: TxnRequest) -> StoreResult<TxnResponse> {
        Self::record("txn", self.inner.txn(req)).await
    }
    async fn get(&self, req: GetRequest) -> StoreResult<GetResponse> {
        Self::record("get", self.inner.get(req)).await
    }
    async fn lease_grant(&self, ttl: i64) -> StoreResult<Lease> {
        Self::record("lease_grant", self.inner.lease_grant(ttl)).await
    }
    async fn lease_keep_alive(&self, id: LeaseId) -> StoreResult<Option<i64>> {
        Self::record("lease_keep_alive", self.inner.lease_keep_alive(id)).await
    }
    async fn lease_revoke(&self, id: LeaseId) -> StoreResult<bool> {
        Self::record("lease_revoke", self.inner.lease_revoke(id)).await
    }
    async fn watch(&self, range: KeyRange, start_revision: Revision) -> StoreResult<WatchStream> {
        Self::record("watch", self.inner.watch(range, start_revision)).await
    }
    async fn compact(&self, revision: Revision) -> StoreResult<()> {
        Self::record("compact", self.inner.compact(revision)).await
    }
    async fn server_version(&self) -> StoreResult<Option<String>> {
        self.inner.server_version().await
    }
}
