//! The embedded store: etcd 3.4 semantics in-process, in memory or on a `redb` file.
//!
//! This is the store for one machine and the engine of the deterministic simulation. The
//! semantics live in `mvcc.rs` (a pure state machine, unit-tested without files or runtimes); the
//! file in `file.rs` is a durable mirror of it; this module wires them to the [`Store`] trait,
//! to watchers and to tokio's clock.
//!
//! # Choices
//!
//! - **One lock, no awaits inside.** Every operation runs under one `std::sync::Mutex`, start to
//!   end, including the redb commit of a write. That makes each operation atomic for readers and
//!   watchers and means no one can see a write before it is durable. Reads, lease operations and
//!   every operation of the memory store run on the caller's thread (a write blocks it for its
//!   fsync).
//! - **Group commit for the file's txns** (`group.rs`). Txns on a file store queue (FIFO) for one
//!   writer (a blocking task), which applies everything queued one txn after another and commits them with
//!   one redb write transaction and one fsync, then answers each caller. Each txn keeps its own
//!   compares, revision and response, and returns only once durable; concurrent writers share
//!   fsyncs instead of queueing for them one by one (docs/benchmarks/store.md).
//! - **Time is tokio's clock.** Lease deadlines are `tokio::time::Instant`s. Expiry runs in a
//!   background task (it holds only a `Weak` reference, so dropping the store stops it) *and*
//!   lazily at the start of every operation, so a `start_paused` test that advances time sees the
//!   expiry on its next call, deterministically. Outside a runtime no task is spawned until the
//!   first operation.
//! - **Watchers never block writers.** Each watcher has an unbounded channel; a slow watcher
//!   buffers in memory. Events of one revision go out as one message. A dropped stream is
//!   forgotten at the next write.
//! - **History is bounded.** [`EmbeddedOptions::auto_compact_keep`] revisions are kept (at least
//!   that many, compacting in batches of an eighth more), in memory and in the file alike. Reads
//!   and watches older than that get `Compacted`, as on an etcd with auto-compaction.
//! - **A failed file write stops the store.** The in-memory state is then ahead of the file, so
//!   every later call fails with `Unavailable` naming the cause; reopening the file restores the
//!   last durable state. Never a silent divergence. So does a failed read of the file (the
//!   file store reads keys on demand): the call that met it gets `Corrupt` naming the file.
//! - **The file is the state.** A file store holds in memory only its scalars, its leases and
//!   what the operations in flight changed (`mvcc.rs`'s overlay, written back at each commit):
//!   open and one-key operations cost O(1) in the size of the store.
//! - **Leases across restarts.** Deadlines are stored as wall-clock time, so a lease whose
//!   deadline passed while the file was closed is expired (its keys deleted) at open; the others
//!   resume with the time they had left. (etcd instead renews every lease at a restart.)
//! - **History across restarts.** The file keeps the same history as memory (everything since
//!   the compaction point), so reads at old revisions and watches from old revisions work after a
//!   reopen as before it.

#[cfg(feature = "bench")]
pub(crate) mod bench_core;
mod file;
mod group;
mod mvcc;

use std::panic::AssertUnwindSafe;
use std::path::Path;
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::time::Duration;

use futures::StreamExt;
use tokio::sync::{mpsc, watch};
use tokio::task::JoinHandle;
use tokio::time::Instant;

use self::file::{FileStore, OpenError};
use self::group::{Job, Target, Writer};
use self::mvcc::{check_range_key, validate_txn, Mvcc};
use crate::store::{
    GetRequest, GetResponse, KeyRange, Lease, LeaseId, Revision, Store, StoreError, StoreResult,
    TxnRequest, TxnResponse, WatchEvent, WatchMessage, WatchStream,
};

/// Settings of an [`EmbeddedStore`]: [`EmbeddedOptions::builder`], or
/// [`EmbeddedOptions::default`] and field assignments.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct EmbeddedOptions {
    /// How many revisions of history to keep for reads at past revisions and watches from past
    /// revisions. Older history is compacted automatically (in batches of an eighth of this, so
    /// between `n` and `n + n/8` revisions are kept). `0` disables automatic compaction: history
    /// then grows until [`Store::compact`] is called. Default 10 000.
    pub auto_compact_keep: i64,
    /// How long [`EmbeddedStore::open`] waits for another process (or handle) to release the
    /// file before it fails with [`StoreError::Locked`]. Default 10 s.
    pub lock_timeout: Duration,
    /// The smallest lease TTL in seconds: a grant below it is raised to it, as etcd raises
    /// grants to its minimum (2 s with etcd's default election timeout). Default 2.
    pub min_lease_ttl: i64,
    /// Open the file read-only: reads work, every write is refused with
    /// [`StoreError::ReadOnly`]. A file this process may not write (its mode, a read-only
    /// filesystem) is opened read-only without asking. Default false.
    pub read_only: bool,
    /// Run redb's integrity check of every page (O(file)) when opening the file, even if it was
    /// closed cleanly (`idalloc check` asks for it). A file that was not closed cleanly is
    /// always checked. Default false.
    pub check_integrity: bool,
}

impl Default for EmbeddedOptions {
    fn default() -> Self {
        EmbeddedOptions {
            auto_compact_keep: 10_000,
            lock_timeout: Duration::from_secs(10),
            min_lease_ttl: 2,
            read_only: false,
            check_integrity: false,
        }
    }
}

impl EmbeddedOptions {
    /// A builder starting from [`EmbeddedOptions::default`].
    ///
    /// ```
    /// use std::time::Duration;
    /// use idalloc::store::embedded::EmbeddedOptions;
    /// let opts = EmbeddedOptions::builder().lock_timeout(Duration::from_secs(1)).build()?;
    /// assert_eq!(opts.lock_timeout, Duration::from_secs(1));
    /// assert!(EmbeddedOptions::builder().min_lease_ttl(0).build().is_err());
    /// # Ok::<(), idalloc::store::StoreError>(())
    /// ```
    pub fn builder() -> EmbeddedOptionsBuilder {
        EmbeddedOptionsBuilder { opts: EmbeddedOptions::default() }
    }

    /// Checks the values: `auto_compact_keep` not negative, `min_lease_ttl` at least 1 s.
    pub fn validate(&self) -> StoreResult<()> {
        if self.auto_compact_keep < 0 {
            return Err(StoreError::InvalidRequest(format!(
                "embedded store option auto_compact_keep is {}: it is 0 (never compact) or more \
                 revisions",
                self.auto_compact_keep
            )));
        }
        if self.min_lease_ttl < 1 {
            return Err(StoreError::InvalidRequest(format!(
                "embedded store option min_lease_ttl is {}: it is at least 1 (second)",
                self.min_lease_ttl
            )));
        }
        Ok(())
    }
}

/// Builds [`EmbeddedOptions`]; every setter sets the field of the same name.
#[derive(Clone, Debug)]
#[must_use]
pub struct EmbeddedOptionsBuilder {
    opts: EmbeddedOptions,
}

impl EmbeddedOptionsBuilder {
    /// [`EmbeddedOptions::auto_compact_keep`].
    pub fn auto_compact_keep(mut self, revisions: i64) -> Self {
        self.opts.auto_compact_keep = revisions;
        self
    }
    /// [`EmbeddedOptions::lock_timeout`].
    pub fn lock_timeout(mut self, timeout: Duration) -> Self {
        self.opts.lock_timeout = timeout;
        self
    }
    /// [`EmbeddedOptions::min_lease_ttl`].
    pub fn min_lease_ttl(mut self, seconds: i64) -> Self {
        self.opts.min_lease_ttl = seconds;
        self
    }
    /// [`EmbeddedOptions::read_only`].
    pub fn read_only(mut self, read_only: bool) -> Self {
        self.opts.read_only = read_only;
        self
    }
    /// [`EmbeddedOptions::check_integrity`].
    pub fn check_integrity(mut self, check: bool) -> Self {
        self.opts.check_integrity = check;
        self
    }
    /// The options, checked by [`EmbeddedOptions::validate`].
    pub fn build(self) -> StoreResult<EmbeddedOptions> {
        self.opts.validate()?;
        Ok(self.opts)
    }
}

/// A [`Store`] in this process: in memory ([`EmbeddedStore::memory`]) or durable in a `redb`
/// file ([`EmbeddedStore::open`]). Clones share one store. See the module docs for the design.
#[derive(Clone)]
pub struct EmbeddedStore {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for EmbeddedStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let core = self.inner.lock();
        f.debug_struct("EmbeddedStore")
            .field("file", &core.file.as_ref().map(|f| f.path().to_path_buf()))
            .field("revision", &core.mvcc.revision())
            .finish()
    }
}

struct Inner {
    shared: Arc<Shared>,
    options: EmbeddedOptions,
    reaper: Mutex<Option<JoinHandle<()>>>,
    /// File stores: the group-commit queue every txn goes through (`group.rs`).
    writer: Option<Writer>,
}

/// The part of the store that a group commit in progress holds (`group.rs`): the file closes
/// when the last handle is gone and no group is being written.
pub(crate) struct Shared {
    core: Mutex<Core>,
    /// Tells the expiry task that lease deadlines changed; dropping it (with the store) stops
    /// the task.
    wake: watch::Sender<()>,
}

struct Core {
    mvcc: Mvcc,
    file: Option<FileStore>,
    watchers: Vec<Watcher>,
    /// Set when a file write failed: the store refuses all further work.
    /// Set when a file write or read failed: the store refuses all further work with this error
    /// (`Corrupt` if the file is damaged, else `Unavailable`).
    broken: Option<StoreError>,
}

struct Watcher {
    range: KeyRange,
    /// First revision this watcher wants.
    from: Revision,
    tx: mpsc::UnboundedSender<StoreResult<WatchMessage>>,
}

/// Replayed history goes out in messages of about this many events (a revision is never split).
const REPLAY_BATCH: usize = 1000;

impl Inner {
    fn lock(&self) -> MutexGuard<'_, Core> {
        self.shared.lock()
    }
}

impl Shared {
    fn new(mvcc: Mvcc, file: Option<FileStore>) -> Arc<Shared> {
        let (wake, _) = watch::channel(());
        Arc::new(Shared {
            core: Mutex::new(Core { mvcc, file, watchers: Vec::new(), broken: None }),
            wake,
        })
    }

    fn lock(&self) -> MutexGuard<'_, Core> {
        // A panic while holding the lock cannot leave the state half-changed in a way later
        // calls could trust less than a fresh start: every mutation is validated first. Keep
        // serving rather than cascading the panic.
        self.core.lock().unwrap_or_else(|e| e.into_inner())
    }
}

impl Target for Shared {
    fn apply_group(
        &self,
        take: &mut dyn FnMut() -> Vec<Job>,
        keep: i64,
    ) -> (Vec<Job>, Vec<StoreResult<TxnResponse>>) {
        let mut core = self.lock();
        let jobs = take();
        let (results, moved) = core.apply_group(&jobs, keep);
        drop(core);
        if moved {
            self.wake.send_replace(());
        }
        (jobs, results)
    }
}

impl Core {
    fn check_usable(&self) -> StoreResult<()> {
        match &self.broken {
            None => Ok(()),
            Some(e) => Err(e.clone()),
        }
    }

    /// Refuses a write on a read-only file (before anything changes).
    fn refuse_write(&self) -> StoreResult<()> {
        self.file.as_ref().map_or(Ok(()), FileStore::refuse_write)
    }

    /// One txn; on a read-only file, refused if it would write.
    fn txn(&mut self, req: &TxnRequest) -> StoreResult<TxnResponse> {
        if self.file.as_ref().is_some_and(|f| f.read_only().is_some()) {
            validate_txn(req)?;
            if self.mvcc.txn_writes(req) {
                self.refuse_write()?;
            }
        }
        self.mvcc.txn(req)
    }

    /// Applies a group of queued txns one by one, in order, then commits all they changed at
    /// once (see `group.rs`). Returns each txn's result (all failed if the commit failed: none
    /// of them is durable) and whether the next lease deadline moved.
    fn apply_group(&mut self, jobs: &[Job], keep: i64) -> (Vec<StoreResult<TxnResponse>>, bool) {
        if let Err(e) = self.check_usable() {
            return (vec![Err(e); jobs.len()], false);
        }
        let before = self.mvcc.next_deadline();
        let mut results = Vec::with_capacity(jobs.len());
        let mut now = None;
        for job in jobs {
            // Exactly what `EmbeddedStore::op` does around one txn, minus the commit.
            self.mvcc.expire_leases(job.now);
            self.mvcc.auto_compact(keep);
            results.push(self.txn(&job.req));
            self.mvcc.auto_compact(keep);
            now = Some(job.now);
        }
        let moved = self.mvcc.next_deadline() != before;
        let Some(now) = now else {
            return (results, moved);
        };
        match self.commit(keep, now) {
            Ok(()) => (results, moved),
            Err(e) => (vec![Err(e); jobs.len()], moved),
        }
    }

    /// Persists what the last step changed, then tells the watchers. On a write failure, or a
    /// read of the file that failed during the step, the store stops (see the module docs).
    fn commit(&mut self, keep: i64, now: Instant) -> StoreResult<()> {
        self.mvcc.auto_compact(keep);
        if let Some(e) = self.file.as_ref().and_then(FileStore::take_read_error) {
            // What the step computed may rest on rows it could not read: nothing of it is
            // written or answered.
            return Err(self.stop(e, "could not be read"));
        }
        let delta = self.mvcc.take_delta();
        if delta.is_empty() {
            return Ok(());
        }
        // A read-only file keeps what changed by itself (lease expiry) in memory only: writes
        // were refused before they changed anything.
        if let Some(file) = self.file.as_mut().filter(|f| f.read_only().is_none()) {
            let meta = self.mvcc.meta();
            let flush = self.mvcc.take_flush();
            let res = std::panic::catch_unwind(AssertUnwindSafe(|| {
                file.persist(&delta, &flush, meta, now)
            }))
            .unwrap_or_else(|_| Err(StoreError::Unavailable("the file layer panicked".into())));
            if let Err(e) = res {
                return Err(self.stop(e, "could not be written"));
            }
        }
        self.publish(&delta.event_batches());
        Ok(())
    }

    /// Stops the store after a file failure `e` (the file `what`): every watcher and every later
    /// call gets the returned error. A damaged file stays `Corrupt` naming the file (a person
    /// must look); anything else is `Unavailable`, saying how to continue.
    fn stop(&mut self, e: StoreError, what: &str) -> StoreError {
        let err = match e {
            e @ StoreError::Corrupt { .. } => e,
            e => {
                let e = match e {
                    StoreError::Unavailable(m) => m,
                    e => e.to_string(),
                };
                let path =
                    self.file.as_ref().map(|f| f.path().display().to_string()).unwrap_or_default();
                StoreError::Unavailable(format!(
                    "embedded store file {path} {what} ({e}); the store stopped, reopen the file \
                     to continue from its last durable state"
                ))
            }
        };
        tracing::error!("the store stopped: {err}");
        for w in self.watchers.drain(..) {
            let _ = w.tx.send(Err(err.clone()));
        }
        self.broken = Some(err.clone());
        err
    }

    fn publish(&mut self, batches: &[(Revision, Vec<WatchEvent>)]) {
        if batches.is_empty() {
            return;
        }
        self.watchers.retain(|w| {
            for (rev, events) in batches {
                if *rev < w.from {
                    continue;
                }
                let mine: Vec<WatchEvent> =
                    events.iter().filter(|e| w.range.contains(&e.kv().key)).cloned().collect();
                if !mine.is_empty() && w.tx.send(Ok(WatchMessage::Events(mine))).is_err() {
                    return false;
                }
            }
            !w.tx.is_closed()
        });
    }

    fn watch(&mut self, range: KeyRange, start: Revision) -> WatchStream {
        let (tx, rx) = mpsc::unbounded_channel();
        let compact = self.mvcc.compact_revision();
        if start > 0 && start < compact {
            // Sent before the receiver exists to the caller, so this cannot fail.
            let _ = tx.send(Ok(WatchMessage::Compacted { compact_revision: compact }));
        } else {
            let from = if start <= 0 { self.mvcc.revision() + 1 } else { start };
            let mut batch: Vec<WatchEvent> = Vec::new();
            for (_, events) in self.mvcc.history(&range, from) {
                if !batch.is_empty() && batch.len() + events.len() > REPLAY_BATCH {
                    let _ = tx.send(Ok(WatchMessage::Events(std::mem::take(&mut batch))));
                }
                batch.extend(events);
            }
            if !batch.is_empty() {
                let _ = tx.send(Ok(WatchMessage::Events(batch)));
            }
            self.watchers.push(Watcher { range, from, tx });
        }
        futures::stream::unfold(rx, |mut rx| async move { rx.recv().await.map(|m| (m, rx)) })
            .boxed()
    }
}

impl EmbeddedStore {
    /// A fresh in-memory store with default options. Nothing survives the process.
    pub fn memory() -> Self {
        Self::memory_with(EmbeddedOptions::default())
    }

    /// A fresh in-memory store.
    pub fn memory_with(options: EmbeddedOptions) -> Self {
        // Only a file has fsyncs to share: the memory store (and with it the deterministic
        // simulation) runs every operation on the caller's thread.
        Self::build(Shared::new(Mvcc::new(), None), options, None)
    }

    /// Opens the store file at `path`, creating it if missing: revision, compaction point and
    /// leases are read now (leases whose deadline passed while the file was closed are expired
    /// now, their keys deleted); keys and history are read from the file when an operation needs
    /// them, so opening costs the same for any size of store. Every write is durable before it
    /// returns.
    ///
    /// One process owns a file at a time: if it is in use, this retries with backoff for up to
    /// `options.lock_timeout`, then fails with [`StoreError::Locked`]. A file that is not a
    /// store, was written by a newer format, or is damaged where the open reads (or anywhere,
    /// if it was not closed cleanly or [`EmbeddedOptions::check_integrity`] is set) fails with
    /// [`StoreError::Corrupt`]; damage met by a later read fails that call with
    /// [`StoreError::Corrupt`] and stops the store. An I/O failure (missing directory,
    /// permissions) is [`StoreError::Unavailable`].
    pub async fn open(path: impl AsRef<Path>, options: EmbeddedOptions) -> StoreResult<Self> {
        let path = path.as_ref().to_path_buf();
        let started = Instant::now();
        let mut backoff = Duration::from_millis(10);
        let (file, loaded) = loop {
            let p = path.clone();
            let (read_only, check) = (options.read_only, options.check_integrity);
            match tokio::task::spawn_blocking(move || {
                FileStore::open_blocking(&p, read_only, check)
            })
            .await
            {
                Ok(Ok(opened)) => break opened,
                Ok(Err(OpenError::Store(e))) => return Err(e),
                Ok(Err(OpenError::Locked)) => {
                    let waited = started.elapsed();
                    if waited >= options.lock_timeout {
                        return Err(StoreError::Locked {
                            path: path.display().to_string(),
                            waited,
                        });
                    }
                    tokio::time::sleep(backoff.min(options.lock_timeout - waited)).await;
                    backoff = (backoff * 2).min(Duration::from_millis(500));
                }
                Err(join) => {
                    return Err(StoreError::Corrupt {
                        path: path.display().to_string(),
                        reason: format!("reading the file failed: {join}"),
                    })
                }
            }
        };
        let now = Instant::now();
        let now_ms = file::unix_ms_now();
        let mut mvcc = match loaded.legacy_entries {
            None => Mvcc::backed(loaded.meta, file.reader()),
            Some(entries) => {
                // A format-1 file opened read-only: held in memory, as format 1 was.
                let mut mvcc = Mvcc::restore(loaded.meta);
                for (key, entry) in entries {
                    mvcc.load_entry(key, entry);
                }
                mvcc
            }
        };
        for (id, ttl, deadline_ms) in loaded.leases {
            mvcc.load_lease(id, ttl, file::deadline_from_unix_ms(deadline_ms, now_ms, now));
        }
        for key in mvcc.finish_load() {
            tracing::warn!(
                key = %String::from_utf8_lossy(&key),
                file = %path.display(),
                "key names a lease that does not exist; it stays without a lease"
            );
        }
        let shared = Shared::new(mvcc, Some(file));
        let store = Self::build(shared, options, Some(Writer::default()));
        // Expires (and persists the expiry of) leases that ran out while the file was closed.
        store.op(|_, _| Ok(()))?;
        Ok(store)
    }

    fn build(shared: Arc<Shared>, options: EmbeddedOptions, writer: Option<Writer>) -> Self {
        let inner = Inner { shared, options, reaper: Mutex::new(None), writer };
        let store = EmbeddedStore { inner: Arc::new(inner) };
        store.ensure_reaper();
        store
    }

    /// Starts the lease expiry task on the current runtime if it is not running (first use, or
    /// the runtime it ran on is gone).
    fn ensure_reaper(&self) {
        let Ok(handle) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let mut slot = self.inner.reaper.lock().unwrap_or_else(|e| e.into_inner());
        if slot.as_ref().is_some_and(|h| !h.is_finished()) {
            return;
        }
        let weak = Arc::downgrade(&self.inner);
        let rx = self.inner.shared.wake.subscribe();
        *slot = Some(handle.spawn(reap(weak, rx)));
    }

    /// Runs one operation: expire due leases (and persist that on its own), run `f`, persist and
    /// publish what it changed, and wake the expiry task if the next deadline moved.
    fn op<R>(&self, f: impl FnOnce(&mut Core, Instant) -> StoreResult<R>) -> StoreResult<R> {
        self.ensure_reaper();
        let now = Instant::now();
        let keep = self.inner.options.auto_compact_keep;
        let (result, moved) = {
            let mut core = self.inner.lock();
            core.check_usable()?;
            let before = core.mvcc.next_deadline();
            core.mvcc.expire_leases(now);
            core.commit(keep, now)?;
            let result = f(&mut core, now);
            core.commit(keep, now)?;
            (result, core.mvcc.next_deadline() != before)
        };
        if moved {
            self.inner.shared.wake.send_replace(());
        }
        result
    }

    fn next_deadline(&self) -> Option<Instant> {
        self.inner.lock().mvcc.next_deadline()
    }
}

/// The lease expiry task: sleeps until the earliest deadline (or until deadlines change), then
/// expires what is due. Holds the store only while working, so dropping the store ends it.
async fn reap(weak: Weak<Inner>, mut wake: watch::Receiver<()>) {
    loop {
        wake.borrow_and_update();
        let next = {
            let Some(inner) = weak.upgrade() else { return };
            let store = EmbeddedStore { inner };
            if store.op(|_, _| Ok(())).is_err() {
                return; // the store stopped after a write failure
            }
            store.next_deadline()
        };
        match next {
            Some(deadline) => {
                tokio::select! {
                    biased; // fixed polling order: reproducible simulation runs
                    _ = tokio::time::sleep_until(deadline) => {}
                    changed = wake.changed() => if changed.is_err() { return },
                }
            }
            None => {
                if wake.changed().await.is_err() {
                    return;
                }
            }
        }
    }
}

#[async_trait::async_trait]
impl Store for EmbeddedStore {
    /// "idalloc file store, format N" for a file, "idalloc memory store" in memory.
    async fn server_version(&self) -> StoreResult<Option<String>> {
        let file = self.inner.lock().file.is_some();
        Ok(Some(if file {
            format!("idalloc file store, format {}", file::FORMAT_VERSION)
        } else {
            "idalloc memory store".to_string()
        }))
    }
    async fn txn(&self, req: TxnRequest) -> StoreResult<TxnResponse> {
        match &self.inner.writer {
            Some(writer) => {
                self.ensure_reaper();
                let keep = self.inner.options.auto_compact_keep;
                writer.txn(&self.inner.shared, keep, req, Instant::now()).await
            }
            None => self.op(|core, _| core.txn(&req)),
        }
    }

    async fn get(&self, req: GetRequest) -> StoreResult<GetResponse> {
        self.op(|core, _| core.mvcc.get(&req))
    }

    async fn lease_grant(&self, ttl: i64) -> StoreResult<Lease> {
        let min = self.inner.options.min_lease_ttl;
        self.op(|core, now| {
            core.refuse_write()?;
            core.mvcc.lease_grant(ttl, min, now)
        })
    }

    async fn lease_keep_alive(&self, id: LeaseId) -> StoreResult<Option<i64>> {
        self.op(|core, now| {
            core.refuse_write()?;
            Ok(core.mvcc.lease_keep_alive(id, now))
        })
    }

    async fn lease_revoke(&self, id: LeaseId) -> StoreResult<bool> {
        self.op(|core, _| {
            core.refuse_write()?;
            Ok(core.mvcc.lease_revoke(id))
        })
    }

    async fn watch(&self, range: KeyRange, start_revision: Revision) -> StoreResult<WatchStream> {
        check_range_key(&range, "watch")?;
        self.op(|core, _| Ok(core.watch(range, start_revision)))
    }

    async fn compact(&self, revision: Revision) -> StoreResult<()> {
        self.op(|core, _| {
            core.refuse_write()?;
            core.mvcc.compact(revision)
        })
    }
}

#[cfg(test)]
mod tests;
