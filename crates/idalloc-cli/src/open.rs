//! Opening the store a command runs against, and the allocator on it, with every timeout derived
//! from `--timeout`.
//!
//! Timeouts: `--timeout T` is the budget of one store operation as the user sees it. The allocator
//! makes up to 3 attempts of T/3 each (so one blip of etcd is ridden out, and an unreachable etcd
//! still fails after about T); the etcd client's connect and request timeouts are T/3 too. The
//! file store is different: it is owned by one process at a time, so a command first waits for
//! other `idalloc` processes to finish with the file, up to `--lock-timeout` (default 6 x T = 30 s),
//! which is long enough for dozens of queued one-shot commands.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use idalloc::store::embedded::EmbeddedStore;
use idalloc::store::url::{open_parsed, OpenOptions};
use idalloc::store::{Store, StoreError};
use idalloc::{Allocator, AllocatorOptions};

use crate::connect::EtcdSecurity;
use crate::fail::Failure;
use crate::parse::StoreUrl;

/// Attempts per store request (see the module docs).
const ATTEMPTS: u32 = 3;

/// How a command wants the store opened.
#[derive(Clone, Debug)]
pub struct Settings {
    pub url: StoreUrl,
    /// TLS and user for an etcd store (see `connect`).
    pub etcd: EtcdSecurity,
    pub prefix: String,
    pub timeout: Duration,
    pub lock_timeout: Duration,
    /// Run redb's whole-file integrity check when opening a file store (`check` asks for it;
    /// other commands check only a file that was not closed cleanly).
    pub check_file: bool,
}

impl Settings {
    /// One attempt's share of the timeout (at least 50 ms, so `--timeout 0` still means "try").
    pub fn attempt_timeout(&self) -> Duration {
        (self.timeout / ATTEMPTS).max(Duration::from_millis(50))
    }
}

/// An opened store and what it is.
pub struct Opened {
    pub store: Arc<dyn Store>,
    /// True when a read-only command found no store file: it runs on an empty in-memory store
    /// instead of creating the file as a side effect of looking.
    pub file_missing: bool,
}

/// Opens the store. `writes` says whether the command may write: read-only commands do not create
/// a missing store file.
pub async fn open_store(s: &Settings, writes: bool) -> Result<Opened, Failure> {
    open_store_bounded(s, writes, s.attempt_timeout()).await
}

/// [`open_store`] with etcd's connect and request timeouts set to `etcd_timeout` (a remote's
/// whole budget, `remotes::Budget`, instead of one attempt's share of `--timeout`).
pub async fn open_store_bounded(
    s: &Settings,
    writes: bool,
    etcd_timeout: Duration,
) -> Result<Opened, Failure> {
    if let StoreUrl::File(path) = &s.url {
        missing_directory(path).map_or(Ok(()), Err)?;
        if !writes && !Path::new(path).exists() {
            return Ok(Opened { store: Arc::new(EmbeddedStore::memory()), file_missing: true });
        }
    }
    // The URL's credentials were moved into `s.etcd` by `connect`, and its endpoints given
    // their scheme there.
    // At least 50 ms, as one attempt's share: `--timeout 0` still means "try".
    let opts = OpenOptions::builder()
        .etcd_timeout(etcd_timeout.max(Duration::from_millis(50)))
        .etcd_tls(s.etcd.tls.clone())
        .etcd_auth(s.etcd.auth.clone())
        .lock_timeout(s.lock_timeout)
        .check_integrity(s.check_file)
        .build()
        .map_err(|e| Failure::usage(format!("--timeout: {e}")))?;
    match (open_parsed(&s.url, &opts).await, &s.url) {
        (Ok(store), _) => Ok(Opened { store, file_missing: false }),
        // Busy, not broken: the other process may finish (exit 5, retry may succeed).
        (Err(StoreError::Locked { path, waited }), _) => Err(Failure::unavailable(format!(
            "store file {path} is still in use by another process after waiting {:.1}s \
             (--lock-timeout); retry, or raise --lock-timeout",
            waited.as_secs_f64()
        ))),
        // A damaged file, not a store, or a newer format: exit 4 (docs/guide/cli.md), like
        // corrupt records, since a person must look at it; the message names the file.
        (Err(e @ StoreError::Corrupt { .. }), StoreUrl::File(path)) => Err(Failure {
            code: crate::fail::CORRUPT,
            kind: "corrupt",
            message: format!("cannot open store file {path:?}: {e}"),
        }),
        (Err(e), StoreUrl::File(path)) => {
            Err(Failure::runtime(format!("cannot open store file {path:?}: {e}")))
        }
        // Bad endpoints, unreadable certificate files: the command line is wrong.
        (Err(StoreError::InvalidRequest(m)), _) => Err(Failure::usage(m)),
        // Outages: exit 5 (retry may succeed); refusals (TLS, credentials): exit 1. The
        // message names the cause.
        (Err(e), _) if e.is_retryable() => Err(Failure::unavailable(e.to_string())),
        (Err(e), _) => Err(Failure::runtime(e.to_string())),
    }
}

/// The error for a store file whose directory does not exist (a typo in the path must not look
/// like an empty store, and no command creates directories), or `None`.
pub fn missing_directory(path: &str) -> Option<Failure> {
    let dir = match Path::new(path).parent() {
        // `file:ids.redb`: the current directory, which exists.
        None => return None,
        Some(d) if d.as_os_str().is_empty() => return None,
        Some(d) => d,
    };
    if dir.is_dir() {
        return None;
    }
    Some(Failure::usage(format!(
        "store file {path:?}: its directory {:?} does not exist (or is not a directory); \
         create it first, or fix --store",
        dir.display().to_string()
    )))
}

/// The allocator on `store`: no session lease is ever granted (the CLI only makes durable
/// references), requests bounded as the module docs say. `lazy`: pools are opened without
/// listing them (`AllocatorOptions::lazy_view`), for commands that touch one key or ID: their
/// cost must not grow with the pool. `bulk_in_flight`: the batches of
/// `acquire/release --from` in flight at once (`--concurrency`), so that the library's bound on
/// bulk txns (`AllocatorOptions::bulk_in_flight`) is the flag's, not a second, hidden one.
pub fn allocator(
    s: &Settings,
    store: Arc<dyn Store>,
    lazy: bool,
    bulk_in_flight: usize,
) -> Result<Allocator, Failure> {
    let opts = {
        let mut o = AllocatorOptions::default();
        o.prefix = s.prefix.clone();
        o.request_timeout = s.attempt_timeout();
        o.retry.max_attempts = ATTEMPTS;
        o.retry.initial_backoff = Duration::from_millis(50);
        o.retry.max_backoff = Duration::from_millis(500);
        o.lazy_view = lazy;
        o.bulk_in_flight = bulk_in_flight;
        o
    };
    Allocator::from_arc(store, opts).map_err(|e| match e {
        // The only input here is --prefix.
        idalloc::Error::InvalidInput { .. } => Failure::usage(format!("--prefix: {e}")),
        other => other.into(),
    })
}
