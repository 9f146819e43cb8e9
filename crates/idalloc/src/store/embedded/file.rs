//! Persistence of the embedded store in a `redb` file, read on demand.
//!
//! The file holds the state machine's state, not a snapshot to load: each key's history is one
//! row, read when an operation touches the key ([`Reader`], the state machine's
//! [`Backing`]), so opening a file and a one-key operation cost O(1) in the size of the store. A
//! commit writes what the state machine's overlay changed
//! ([`Flush`]) in one redb write transaction. redb commits with `Durability::Immediate` (its
//! default): the commit has reached the disk when `commit()` returns, and a commit is atomic,
//! so after a crash the file holds exactly the acknowledged txns, none torn.
//!
//! Tables (format version 2):
//! - `meta` (`&str -> i64`): `format_version`, `revision`, `compact_revision`, `next_lease`;
//! - `kv` (`key -> bytes`): the key's whole history since the compaction point (its newest
//!   change before it, if a put, and every later one), encoded by [`encode_history`];
//! - `log` (`(main, sub) -> key`): which key changed at each revision `>=` the compaction point,
//!   for watch replay and compaction;
//! - `leases` (`id -> (ttl, deadline as unix ms)`): deadlines are wall-clock so that time spent
//!   closed counts; at open they are mapped back onto tokio's clock (leases are few: one per
//!   session; they are read at open);
//! - `lease_keys` (`(lease, key) -> ()`): the keys attached to each lease, for revocation.
//!
//! Format version 1 (the older layout) had one `entries` table (`(main, sub) -> key and record`)
//! that was loaded whole at open. A writable open of such a file migrates it to version 2 in one
//! write transaction (O(file), once); a read-only open cannot write, so it loads the old table
//! into memory as version 1 did.
//!
//! redb's O(file) integrity check runs only when the file was not closed cleanly (redb then
//! repairs it at open, which we learn from its repair callback) or when asked
//! ([`super::EmbeddedOptions::check_integrity`], `idalloc check`).
//!
//! Everything read from the file is checked; anything unexpected is `StoreError::Corrupt`, never
//! a panic and never a silent reset. That includes damage redb itself trips over: see
//! [`guarded`]. Damage in a row met after open (a row is read when first needed) fails that
//! operation with `Corrupt` naming the file and stops the store.
//!
//! A file this process may not write (file mode, a read-only filesystem), or one opened with
//! [`super::EmbeddedOptions::read_only`], is opened read-only: it serves reads, and the store
//! refuses every write with [`StoreError::ReadOnly`] naming the file and the reason, before
//! anything changes.

use std::cell::Cell;
use std::collections::{BTreeMap, BTreeSet};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, Once};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use redb::{
    Database, ReadOnlyDatabase, ReadOnlyTable, ReadableDatabase, ReadableTable, TableDefinition,
};
use tokio::time::Instant;

use super::mvcc::{Backing, Delta, Entry, Flush, Meta, Record, INITIAL_REVISION, NEVER_COMPACTED};
use crate::store::{LeaseId, Revision, StoreError, StoreResult};

/// The file format this build writes. A file with a larger number was written by a newer
/// idalloc and is refused; version 1 is migrated (see the module docs).
pub(crate) const FORMAT_VERSION: i64 = 2;

/// redb's page cache. redb's default is 1 GiB, which a scan of a large store fills: bounded
/// here so that a process's memory does not grow with the store. The OS page cache
/// still holds the file for the next read.
const CACHE_BYTES: usize = 16 << 20;

const META: TableDefinition<&str, i64> = TableDefinition::new("meta");
/// Format version 1 only.
const ENTRIES: TableDefinition<(i64, u32), &[u8]> = TableDefinition::new("entries");
const KV: TableDefinition<&[u8], &[u8]> = TableDefinition::new("kv");
const LOG: TableDefinition<(i64, u32), &[u8]> = TableDefinition::new("log");
const LEASES: TableDefinition<i64, (i64, i64)> = TableDefinition::new("leases");
const LEASE_KEYS: TableDefinition<(i64, &[u8]), ()> = TableDefinition::new("lease_keys");

const K_FORMAT: &str = "format_version";
const K_REV: &str = "revision";
const K_COMPACT: &str = "compact_revision";
const K_NEXT_LEASE: &str = "next_lease";

/// What is read from a file at open: scalars and leases, never the keys.
pub(crate) struct Loaded {
    pub meta: Meta,
    /// `(id, ttl, deadline as unix ms)`.
    pub leases: Vec<(LeaseId, i64, i64)>,
    /// A version-1 file opened read-only (it cannot be migrated without writing): its key
    /// changes in `(main, sub)` order, to be held in memory as version 1 did.
    pub legacy_entries: Option<Vec<(Vec<u8>, Entry)>>,
}

/// Why an open attempt failed.
pub(crate) enum OpenError {
    /// Another handle holds the file: worth waiting for.
    Locked,
    Store(StoreError),
}

/// An open store file.
pub(crate) struct FileStore {
    /// Always `Some` until [`Drop`] takes it out to close it under [`guarded`].
    db: Option<Db>,
    path: PathBuf,
    written: Meta,
    /// The state machine's view of the file (a snapshot renewed after each commit).
    reader: Arc<Reader>,
    /// Whether redb's integrity check ran at open (tests check when it runs).
    #[cfg_attr(not(test), allow(dead_code))]
    checked: bool,
    /// redb write transactions committed since open (tests check group commit with it).
    commits: u64,
}

/// The file, writable or not.
enum Db {
    Write(Database),
    /// Opened read-only, for this reason (shown in every refused write).
    Read(ReadOnlyDatabase, String),
    /// A read-only file that was not closed cleanly (its writer was killed, or exited without
    /// closing it): redb cannot open it read-only, because opening it means a recovery, which
    /// writes. So a private copy in a temporary directory was recovered and read instead; the
    /// file itself is untouched. (Fields drop in order: the copy closes before its directory
    /// goes.)
    Copy {
        db: Database,
        _dir: tempfile::TempDir,
        why: String,
    },
}

/// Closing is a redb call like any other: a writable database commits and trims its allocator
/// state when dropped, reading the file's freed-page tree, and on a damaged file whose open went
/// through (the damage was in pages open never reads) that panicked inside redb
/// (`btree_cursor.rs:167`, "entered unreachable code"; found by the `damaged_file` fuzz target,
/// docs/fuzzing.md). So the close runs under [`guarded`] too; a drop cannot return an error,
/// so a failed close is logged, naming the file. The acknowledged txns are durable already:
/// what is lost is only redb's bookkeeping of free pages, which its next open rebuilds.
impl Drop for FileStore {
    fn drop(&mut self) {
        // The reader's snapshot (a read transaction) ends before the database closes.
        let reader = Arc::clone(&self.reader);
        let db = self.db.take();
        if let Err(e) = guarded(&self.path, move || {
            drop(reader.snap().take());
            drop(db)
        }) {
            tracing::warn!("closing the store file failed: {e}");
        }
    }
}

impl std::fmt::Debug for FileStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FileStore").field("path", &self.path).finish()
    }
}

fn path_str(path: &Path) -> String {
    path.display().to_string()
}

fn corrupt(path: &Path, reason: impl Into<String>) -> StoreError {
    StoreError::Corrupt { path: path_str(path), reason: reason.into() }
}

thread_local! {
    /// Set while this thread runs redb calls under [`guarded`]: a panic raised inside redb then
    /// becomes an error, so the panic hook must not report it as a crash.
    static IN_REDB: Cell<bool> = const { Cell::new(false) };
    /// Where the last such panic was raised (`redb-…/src/types.rs:109`), for the error message.
    static REDB_PANIC_AT: Cell<Option<String>> = const { Cell::new(None) };
}

/// Runs redb calls on the file at `path`, turning a panic inside them into
/// `StoreError::Corrupt` naming the file.
///
/// Why catch panics: redb checks many things in a damaged file and returns errors for them, but
/// not everything. Random 8-byte writes into a store file make it panic in about 5% of files
/// (`page_manager.rs` "Malformed allocator state", `types.rs:109` on a table
/// type name that is not UTF-8, slice indexes out of range in `table_tree_base.rs` and
/// `btree_base.rs`). Those bytes are redb's own page structures, read inside `Database::create`
/// and `open_table`, before any value of ours: there is nothing this file could validate first.
/// G6 says bad input never panics, and `docs/cli.md` promises exit 4 naming the file, so the
/// boundary to redb is where the panic stops. A redb that panicked half-way may hold state
/// nobody should trust: the caller drops it (the open fails; a write marks the store broken).
///
/// The panic hook is wrapped once per process so that a panic raised in redb's code on a thread
/// inside this function prints nothing (it is reported as the error instead); every other panic
/// goes to the hook that was installed before (the default one prints as usual). A program that
/// installs its own hook later only gets the panic message printed again; the error is the same.
fn guarded<T>(path: &Path, f: impl FnOnce() -> T) -> Result<T, StoreError> {
    static HOOK: Once = Once::new();
    HOOK.call_once(|| {
        let previous = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            let at = info.location().map(|l| format!("{}:{}", l.file(), l.line()));
            let in_redb = at.as_deref().is_some_and(|f| f.contains("redb-"));
            if IN_REDB.with(Cell::get) && in_redb {
                REDB_PANIC_AT.with(|c| c.set(at));
            } else {
                previous(info);
            }
        }));
    });
    let outer = IN_REDB.with(|c| c.replace(true));
    let result = catch_unwind(AssertUnwindSafe(f));
    IN_REDB.with(|c| c.set(outer));
    result.map_err(|payload| {
        let msg = payload
            .downcast_ref::<&str>()
            .map(|s| s.to_string())
            .or_else(|| payload.downcast_ref::<String>().cloned())
            .unwrap_or_else(|| "no message".into());
        let at = REDB_PANIC_AT
            .with(Cell::take)
            .map(|a| format!(" at {}", a.rsplit("/src/").next().unwrap_or(&a)))
            .unwrap_or_default();
        corrupt(path, format!("the file is damaged: redb failed reading it ({msg}{at})"))
    })
}

/// Maps a redb error met while opening or reading. Lock conflicts are told apart; I/O errors that
/// are not "this is not a redb file" are `Unavailable` (a missing directory, permissions); the
/// rest means the file cannot be trusted. A read past the end of the file ("failed to fill whole
/// buffer") is damage too: a page pointer leads outside the file.
fn open_error(path: &Path, err: redb::Error) -> OpenError {
    match err {
        redb::Error::DatabaseAlreadyOpen | redb::Error::LockProtocolMismatch => OpenError::Locked,
        redb::Error::Io(e)
            if !matches!(
                e.kind(),
                std::io::ErrorKind::InvalidData | std::io::ErrorKind::UnexpectedEof
            ) =>
        {
            OpenError::Store(StoreError::Unavailable(format!(
                "cannot open store file {}: {e}",
                path.display()
            )))
        }
        other => OpenError::Store(corrupt(path, other.to_string())),
    }
}

fn read_error(path: &Path) -> impl Fn(redb::Error) -> OpenError + '_ {
    move |e| open_error(path, e)
}

/// Whether a failed read-write open means "this process may not write here" (the file's mode, a
/// read-only filesystem), so that a read-only open is worth trying.
fn write_denied(err: &redb::DatabaseError) -> Option<String> {
    match err {
        redb::DatabaseError::Storage(redb::StorageError::Io(e))
            if matches!(
                e.kind(),
                std::io::ErrorKind::PermissionDenied | std::io::ErrorKind::ReadOnlyFilesystem
            ) =>
        {
            Some(e.to_string())
        }
        _ => None,
    }
}

/// Opens `path` read-only, `why` being the reason to tell on refused writes.
fn open_read_only(path: &Path, why: String) -> Result<Db, OpenError> {
    match ReadOnlyDatabase::open(path) {
        Ok(db) => Ok(Db::Read(db, why)),
        Err(redb::DatabaseError::RepairAborted) => recover_copy(path, why),
        Err(e) => Err(open_error(path, e.into())),
    }
}

/// See [`Db::Copy`].
fn recover_copy(path: &Path, why: String) -> Result<Db, OpenError> {
    let unavailable = |what: &str, e: std::io::Error| {
        OpenError::Store(StoreError::Unavailable(format!(
            "store file {} is read-only and was not closed cleanly; {what} for reading it \
             failed: {e}",
            path.display()
        )))
    };
    let dir = tempfile::tempdir().map_err(|e| unavailable("making a temporary copy", e))?;
    let copy = dir.path().join("recovered.redb");
    std::fs::copy(path, &copy).map_err(|e| unavailable("copying it", e))?;
    // The copy inherits the read-only mode; it is ours to recover.
    let mut perms =
        std::fs::metadata(&copy).map_err(|e| unavailable("copying it", e))?.permissions();
    #[allow(clippy::permissions_set_readonly_false)] // a private file in our own temp dir
    perms.set_readonly(false);
    std::fs::set_permissions(&copy, perms).map_err(|e| unavailable("copying it", e))?;
    let db = create_db(&copy).map(|(db, _)| db).map_err(|e| match open_error(path, e.into()) {
        OpenError::Store(StoreError::Corrupt { path, reason }) => {
            OpenError::Store(StoreError::Corrupt {
                path,
                reason: format!("recovering a copy: {reason}"),
            })
        }
        other => other,
    })?;
    let why = format!("{why}; it was not closed cleanly, a private copy was recovered");
    Ok(Db::Copy { db, _dir: dir, why })
}

/// Opens (creating if missing) a writable database with this module's settings. Returns whether
/// redb had to repair it (it was not closed cleanly).
fn create_db(path: &Path) -> Result<(Database, bool), redb::DatabaseError> {
    let repaired = Arc::new(AtomicBool::new(false));
    let flag = Arc::clone(&repaired);
    let db = Database::builder()
        .set_cache_size(CACHE_BYTES)
        .set_repair_callback(move |_| flag.store(true, Ordering::Relaxed))
        .create(path)?;
    Ok((db, repaired.load(Ordering::Relaxed)))
}

fn begin_read(db: &Db) -> Result<redb::ReadTransaction, redb::TransactionError> {
    match db {
        Db::Write(d) | Db::Copy { db: d, .. } => d.begin_read(),
        Db::Read(d, _) => d.begin_read(),
    }
}

impl FileStore {
    /// Opens (creating if missing) the file and reads its scalars and leases. Blocking: call it
    /// off the async workers. One attempt; the caller retries on [`OpenError::Locked`].
    ///
    /// `read_only` opens it read-only; so does a read-write open refused for want of write
    /// permission when the file exists (reads then work, writes are refused). `check` runs
    /// redb's integrity check (O(file)) even if the file was closed cleanly.
    pub fn open_blocking(
        path: &Path,
        read_only: bool,
        check: bool,
    ) -> Result<(FileStore, Loaded), OpenError> {
        // Everything that touches redb, including dropping a database that failed to load.
        guarded(path, || Self::open_unguarded(path, read_only, check)).map_err(OpenError::Store)?
    }

    fn open_unguarded(
        path: &Path,
        read_only: bool,
        check: bool,
    ) -> Result<(FileStore, Loaded), OpenError> {
        let mut repaired = false;
        let mut db = if read_only {
            open_read_only(path, "opened read-only on request".into())?
        } else {
            match create_db(path) {
                Ok((db, r)) => {
                    repaired = r;
                    Db::Write(db)
                }
                Err(e) => match write_denied(&e) {
                    Some(why) if path.exists() => open_read_only(
                        path,
                        format!("this process may not write it ({why}); opened read-only"),
                    )?,
                    _ => return Err(open_error(path, e.into())),
                },
            }
        };
        let err = read_error(path);
        // redb's own check of every page's checksum, O(file): only when the file was not closed
        // cleanly (redb repaired it: the repair read it all anyway) or when asked. A writable
        // database commits its allocator state when closed, reading its freed-page tree; on a
        // file damaged there that panicked inside redb, twice over in one case (a panic while
        // unwinding from a panic aborts the process). Found by the `damaged_file` fuzz target
        // (docs/fuzzing.md); the check made such a file `Corrupt` at open. Without the check, a
        // cleanly closed file with that damage is met at close, under `guarded` (see
        // `docs/design-notes.md`). A read-only database writes nothing at close
        // and is not checked.
        let mut checked = false;
        if check || repaired || matches!(db, Db::Copy { .. }) {
            if let Db::Write(d) | Db::Copy { db: d, .. } = &mut db {
                checked = true;
                if let Err(e) = d.check_integrity() {
                    // After a failed check redb's close no longer commits (the fuzz corpus's
                    // `crash-close-double-panic` closes cleanly here); it is dropped under
                    // `guarded`.
                    return Err(OpenError::Store(corrupt(
                        path,
                        format!("the file is damaged: redb's integrity check failed ({e})"),
                    )));
                }
            }
        }
        let fresh = {
            let rtx = begin_read(&db).map_err(|e| err(e.into()))?;
            let n = rtx.list_tables().map_err(|e| err(e.into()))?.count();
            n == 0
        };
        if let (true, Db::Write(db)) = (fresh, &db) {
            let meta = Meta {
                revision: INITIAL_REVISION,
                compact_revision: NEVER_COMPACTED,
                next_lease: 1,
            };
            let wtx = db.begin_write().map_err(|e| err(e.into()))?;
            {
                let mut t = wtx.open_table(META).map_err(|e| err(e.into()))?;
                t.insert(K_FORMAT, FORMAT_VERSION).map_err(|e| err(e.into()))?;
                write_meta(&mut t, meta).map_err(|e| err(e.into()))?;
                wtx.open_table(KV).map_err(|e| err(e.into()))?;
                wtx.open_table(LOG).map_err(|e| err(e.into()))?;
                wtx.open_table(LEASES).map_err(|e| err(e.into()))?;
                wtx.open_table(LEASE_KEYS).map_err(|e| err(e.into()))?;
            }
            wtx.commit().map_err(|e| err(e.into()))?;
        }
        let (meta, version) = read_meta(&db, path)?;
        let mut legacy_entries = None;
        if version == 1 {
            match &db {
                Db::Write(d) | Db::Copy { db: d, .. } => migrate_v1(d, path, meta)?,
                Db::Read(d, _) => {
                    let rtx = d.begin_read().map_err(|e| err(e.into()))?;
                    let t = rtx.open_table(ENTRIES).map_err(|e| err(e.into()))?;
                    legacy_entries = Some(load_entries_v1(&t, path, meta)?);
                }
            }
        }
        let leases = {
            let rtx = begin_read(&db).map_err(|e| err(e.into()))?;
            let leases_t = rtx.open_table(LEASES).map_err(|e| err(e.into()))?;
            let mut leases = Vec::new();
            for row in leases_t.iter().map_err(|e| err(e.into()))? {
                let (k, v) = row.map_err(|e| err(e.into()))?;
                let (ttl, deadline_ms) = v.value();
                leases.push((k.value(), ttl, deadline_ms));
            }
            leases
        };
        let reader = Arc::new(Reader {
            path: path.to_path_buf(),
            snap: Mutex::default(),
            error: Mutex::default(),
        });
        if legacy_entries.is_none() {
            reader.refresh(&db).map_err(OpenError::Store)?;
        }
        let file = FileStore {
            db: Some(db),
            path: path.to_path_buf(),
            written: meta,
            reader,
            checked,
            commits: 0,
        };
        Ok((file, Loaded { meta, leases, legacy_entries }))
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The state machine's backing: the file's rows, read on demand.
    pub fn reader(&self) -> Arc<dyn Backing> {
        Arc::clone(&self.reader) as Arc<dyn Backing>
    }

    /// The first error a read of the file met since the last call, if any (see [`Backing`]).
    pub fn take_read_error(&self) -> Option<StoreError> {
        self.reader.error().take()
    }

    /// Whether redb's integrity check ran at open.
    #[cfg(test)]
    pub fn checked(&self) -> bool {
        self.checked
    }

    /// Why the file is read-only, if it is.
    pub fn read_only(&self) -> Option<&str> {
        match &self.db {
            Some(Db::Write(_)) | None => None,
            Some(Db::Read(_, why) | Db::Copy { why, .. }) => Some(why),
        }
    }

    /// The error for a write attempted on a read-only file, if it is one.
    pub fn refuse_write(&self) -> StoreResult<()> {
        match self.read_only() {
            None => Ok(()),
            Some(why) => {
                Err(StoreError::ReadOnly { path: path_str(&self.path), reason: why.to_string() })
            }
        }
    }

    /// Writes one operation's changes (`flush`, the state machine's overlay) and the new scalars
    /// in one durable redb transaction, then renews the reader's snapshot. Nothing to write (a
    /// read, a txn that changed nothing) costs nothing.
    pub fn persist(
        &mut self,
        delta: &Delta,
        flush: &Flush,
        meta: Meta,
        now: Instant,
    ) -> Result<(), StoreError> {
        if delta.is_empty() && meta == self.written {
            return Ok(());
        }
        // A panic inside redb (under `guarded`) or a page redb finds corrupted means the file is
        // damaged: `Corrupt`, naming it. Anything else (a full disk) is `Unavailable`.
        guarded(&self.path, || self.write(delta, flush, meta, now))?.map_err(|e| match e {
            redb::Error::Corrupted(reason) => {
                corrupt(&self.path, format!("the file is damaged: {reason}"))
            }
            e => StoreError::Unavailable(e.to_string()),
        })??;
        self.written = meta;
        self.commits += 1;
        Ok(())
    }

    /// redb write transactions committed since open.
    #[cfg(test)]
    pub fn commits(&self) -> u64 {
        self.commits
    }

    fn write(
        &self,
        delta: &Delta,
        flush: &Flush,
        meta: Meta,
        now: Instant,
    ) -> Result<Result<(), StoreError>, redb::Error> {
        let Some(db @ Db::Write(wdb)) = &self.db else {
            // The store never gets here: it refuses writes up front and keeps what a read-only
            // file's state machine changes by itself (lease expiry) in memory.
            return Err(redb::Error::Io(std::io::Error::other("the file is open read-only")));
        };
        let wtx = wdb.begin_write()?;
        {
            let mut kv = wtx.open_table(KV)?;
            for (key, history) in &flush.keys {
                if history.is_empty() {
                    kv.remove(key.as_slice())?;
                } else {
                    kv.insert(key.as_slice(), encode_history(history).as_slice())?;
                }
            }
            let mut log = wtx.open_table(LOG)?;
            for (&main, changes) in &flush.log {
                for (sub, key) in changes {
                    log.insert((main, *sub), key.as_slice())?;
                }
            }
            if meta.compact_revision > self.written.compact_revision {
                // The log keeps the compaction point itself: a watch may start there.
                log.retain_in(
                    (self.written.compact_revision, 0)..(meta.compact_revision, 0),
                    |_, _| false,
                )?;
            }
            let mut lease_keys = wtx.open_table(LEASE_KEYS)?;
            for ((lease, key), attached) in &flush.lease_keys {
                if *attached {
                    lease_keys.insert((*lease, key.as_slice()), ())?;
                } else {
                    lease_keys.remove((*lease, key.as_slice()))?;
                }
            }
            let mut leases = wtx.open_table(LEASES)?;
            let now_ms = unix_ms_now();
            for &(id, ttl, deadline) in &delta.leases_put {
                let left = deadline.saturating_duration_since(now);
                let ms = now_ms.saturating_add(i64::try_from(left.as_millis()).unwrap_or(i64::MAX));
                leases.insert(id, (ttl, ms))?;
            }
            for &id in &delta.leases_removed {
                leases.remove(id)?;
                let none: &[u8] = &[];
                lease_keys.retain_in((id, none)..(id.saturating_add(1), none), |_, _| false)?;
            }
            let mut m = wtx.open_table(META)?;
            write_meta(&mut m, meta)?;
        }
        wtx.commit()?;
        Ok(self.reader.refresh(db))
    }
}

fn write_meta(t: &mut redb::Table<&str, i64>, meta: Meta) -> Result<(), redb::StorageError> {
    t.insert(K_REV, meta.revision)?;
    t.insert(K_COMPACT, meta.compact_revision)?;
    t.insert(K_NEXT_LEASE, meta.next_lease)?;
    Ok(())
}

/// The scalars and the format version, checked.
fn read_meta(db: &Db, path: &Path) -> Result<(Meta, i64), OpenError> {
    let err = read_error(path);
    let rtx = begin_read(db).map_err(|e| err(e.into()))?;
    let meta_t = match rtx.open_table(META) {
        Ok(t) => t,
        Err(redb::TableError::TableDoesNotExist(_)) => {
            return Err(OpenError::Store(corrupt(path, "not an idalloc store (no meta table)")))
        }
        Err(e) => return Err(err(e.into())),
    };
    let get = |k: &str| -> Result<Option<i64>, OpenError> {
        Ok(meta_t.get(k).map_err(|e| err(e.into()))?.map(|v| v.value()))
    };
    let version = get(K_FORMAT)?.ok_or_else(|| {
        OpenError::Store(corrupt(path, "not an idalloc store (no format version)"))
    })?;
    if version > FORMAT_VERSION {
        return Err(OpenError::Store(corrupt(
            path,
            format!(
                "format version {version} was written by a newer idalloc; this build reads \
                 versions up to {FORMAT_VERSION}"
            ),
        )));
    }
    if version < 1 {
        return Err(OpenError::Store(corrupt(path, format!("invalid format version {version}"))));
    }
    let need = |k: &str| -> Result<i64, OpenError> {
        get(k)?.ok_or_else(|| OpenError::Store(corrupt(path, format!("meta table lacks {k:?}"))))
    };
    let meta = Meta {
        revision: need(K_REV)?,
        compact_revision: need(K_COMPACT)?,
        next_lease: need(K_NEXT_LEASE)?,
    };
    if meta.revision < INITIAL_REVISION
        || meta.compact_revision < NEVER_COMPACTED
        || meta.compact_revision > meta.revision
        || meta.next_lease < 1
    {
        return Err(OpenError::Store(corrupt(path, format!("inconsistent meta values {meta:?}"))));
    }
    Ok((meta, version))
}

/// Reads a version-1 `entries` table, in `(main, sub)` order, checked.
fn load_entries_v1(
    table: &impl ReadableTable<(i64, u32), &'static [u8]>,
    path: &Path,
    meta: Meta,
) -> Result<Vec<(Vec<u8>, Entry)>, OpenError> {
    let err = read_error(path);
    let mut entries = Vec::new();
    for row in table.iter().map_err(|e| err(e.into()))? {
        let (k, v) = row.map_err(|e| err(e.into()))?;
        let (main, sub) = k.value();
        if main <= INITIAL_REVISION || main > meta.revision {
            return Err(OpenError::Store(corrupt(
                path,
                format!("entry at revision {main} outside 2..={}", meta.revision),
            )));
        }
        let (key, rec) = decode_entry(v.value()).map_err(|reason| {
            OpenError::Store(corrupt(path, format!("entry ({main}, {sub}): {reason}")))
        })?;
        entries.push((key, Entry { main, sub, rec }));
    }
    Ok(entries)
}

/// Migrates a version-1 file to version 2 in one write transaction (O(file), once): each key's
/// changes become its `kv` row, the changes since the compaction point the `log`, live keys on
/// an existing lease its `lease_keys` (a key naming a missing lease stays without one, as
/// version 1 did at each open), and `entries` goes.
fn migrate_v1(db: &Database, path: &Path, meta: Meta) -> Result<(), OpenError> {
    let err = read_error(path);
    let wtx = db.begin_write().map_err(|e| err(e.into()))?;
    let entries = {
        let t = wtx.open_table(ENTRIES).map_err(|e| err(e.into()))?;
        load_entries_v1(&t, path, meta)?
    };
    {
        let leases: BTreeSet<i64> = {
            let t = wtx.open_table(LEASES).map_err(|e| err(e.into()))?;
            let mut ids = BTreeSet::new();
            for row in t.iter().map_err(|e| err(e.into()))? {
                ids.insert(row.map_err(|e| err(e.into()))?.0.value());
            }
            ids
        };
        let mut log = wtx.open_table(LOG).map_err(|e| err(e.into()))?;
        let mut histories: BTreeMap<Vec<u8>, Vec<Entry>> = BTreeMap::new();
        for (key, entry) in entries {
            if entry.main >= meta.compact_revision {
                log.insert((entry.main, entry.sub), key.as_slice()).map_err(|e| err(e.into()))?;
            }
            histories.entry(key).or_default().push(entry);
        }
        let mut kv = wtx.open_table(KV).map_err(|e| err(e.into()))?;
        let mut lease_keys = wtx.open_table(LEASE_KEYS).map_err(|e| err(e.into()))?;
        for (key, history) in &histories {
            kv.insert(key.as_slice(), encode_history(history).as_slice())
                .map_err(|e| err(e.into()))?;
            if let Some(Entry { rec: Some(rec), .. }) = history.last() {
                if rec.lease == 0 {
                    continue;
                }
                if leases.contains(&rec.lease) {
                    lease_keys
                        .insert((rec.lease, key.as_slice()), ())
                        .map_err(|e| err(e.into()))?;
                } else {
                    tracing::warn!(
                        key = %String::from_utf8_lossy(key),
                        file = %path.display(),
                        "key names a lease that does not exist; it stays without a lease"
                    );
                }
            }
        }
        let mut m = wtx.open_table(META).map_err(|e| err(e.into()))?;
        m.insert(K_FORMAT, FORMAT_VERSION).map_err(|e| err(e.into()))?;
    }
    wtx.delete_table(ENTRIES).map_err(|e| err(e.into()))?;
    wtx.commit().map_err(|e| err(e.into()))?;
    tracing::info!(file = %path.display(), "store file migrated from format 1 to 2");
    Ok(())
}

/// The tables the state machine reads, as of one read transaction.
struct Snapshot {
    kv: ReadOnlyTable<&'static [u8], &'static [u8]>,
    log: ReadOnlyTable<(i64, u32), &'static [u8]>,
    lease_keys: ReadOnlyTable<(i64, &'static [u8]), ()>,
}

/// The file as the state machine's [`Backing`]: reads one snapshot (renewed after each commit)
/// under [`guarded`]; the first error met is kept for [`FileStore::take_read_error`].
pub(crate) struct Reader {
    path: PathBuf,
    snap: Mutex<Option<Snapshot>>,
    error: Mutex<Option<StoreError>>,
}

impl std::fmt::Debug for Reader {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Reader").field("path", &self.path).finish()
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // Nothing a panic could leave half-done: the values are replaced whole.
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl Reader {
    fn snap(&self) -> MutexGuard<'_, Option<Snapshot>> {
        lock(&self.snap)
    }

    fn error(&self) -> MutexGuard<'_, Option<StoreError>> {
        lock(&self.error)
    }

    /// Reads from the file's latest commit from now on.
    fn refresh(&self, db: &Db) -> StoreResult<()> {
        let to_store = |e: redb::Error| match open_error(&self.path, e) {
            OpenError::Store(e) => e,
            OpenError::Locked => StoreError::Unavailable(format!(
                "store file {} is locked by another process",
                self.path.display()
            )),
        };
        let table_err = |e: redb::TableError| match e {
            redb::TableError::TableDoesNotExist(t) => {
                corrupt(&self.path, format!("not an idalloc store (no {t} table)"))
            }
            e => to_store(e.into()),
        };
        let rtx = begin_read(db).map_err(|e| to_store(e.into()))?;
        let snap = Snapshot {
            kv: rtx.open_table(KV).map_err(table_err)?,
            log: rtx.open_table(LOG).map_err(table_err)?,
            lease_keys: rtx.open_table(LEASE_KEYS).map_err(table_err)?,
        };
        *self.snap() = Some(snap);
        Ok(())
    }

    fn fail(&self, e: StoreError) {
        let mut slot = self.error();
        if slot.is_none() {
            *slot = Some(e);
        }
    }

    fn redb_error(&self, e: redb::Error) -> StoreError {
        match open_error(&self.path, e) {
            OpenError::Store(e) => e,
            OpenError::Locked => StoreError::Unavailable(format!(
                "store file {} is locked by another process",
                self.path.display()
            )),
        }
    }

    /// Runs `f` on the snapshot under [`guarded`]; on any error keeps it and returns `default`.
    fn read<T>(&self, default: T, f: impl FnOnce(&Snapshot) -> Result<T, StoreError>) -> T {
        let snap = self.snap();
        let Some(s) = snap.as_ref() else {
            return default;
        };
        match guarded(&self.path, || f(s)) {
            Ok(Ok(v)) => v,
            Ok(Err(e)) | Err(e) => {
                drop(snap);
                self.fail(e);
                default
            }
        }
    }

    fn decode(&self, key: &[u8], bytes: &[u8]) -> Result<Vec<Entry>, StoreError> {
        decode_history(bytes).map_err(|reason| {
            corrupt(
                &self.path,
                format!("the record of key {:?}: {reason}", String::from_utf8_lossy(key)),
            )
        })
    }

    /// Turns a redb row iterator into one that stops (keeping the error) at the first error.
    fn rows<'a, I, T>(
        &'a self,
        mut it: I,
        mut f: impl FnMut(I::Item) -> Result<T, StoreError> + 'a,
    ) -> Box<dyn Iterator<Item = T> + 'a>
    where
        I: Iterator + 'a,
    {
        let mut done = false;
        Box::new(std::iter::from_fn(move || {
            if done {
                return None;
            }
            let next = guarded(&self.path, || it.next().map(&mut f)).and_then(|r| r.transpose());
            match next {
                Ok(Some(v)) => Some(v),
                Ok(None) => None,
                Err(e) => {
                    done = true;
                    self.fail(e);
                    None
                }
            }
        }))
    }
}

impl Backing for Reader {
    fn history(&self, key: &[u8]) -> Vec<Entry> {
        self.read(Vec::new(), |s| match s.kv.get(key).map_err(|e| self.redb_error(e.into()))? {
            None => Ok(Vec::new()),
            Some(v) => self.decode(key, v.value()),
        })
    }

    fn histories(
        &self,
        start: &[u8],
        end: Option<&[u8]>,
    ) -> Box<dyn Iterator<Item = (Vec<u8>, Vec<Entry>)> + '_> {
        let range = self.read(None, |s| {
            let r = match end {
                None => s.kv.range::<&[u8]>(start..),
                Some(end) => s.kv.range::<&[u8]>(start..end),
            };
            r.map(Some).map_err(|e| self.redb_error(e.into()))
        });
        let Some(range) = range else {
            return Box::new(std::iter::empty());
        };
        self.rows(range, move |row| {
            let (k, v) = row.map_err(|e| self.redb_error(e.into()))?;
            let key = k.value().to_vec();
            let history = self.decode(&key, v.value())?;
            Ok((key, history))
        })
    }

    fn log(
        &self,
        from: Revision,
        to: Revision,
    ) -> Box<dyn Iterator<Item = (Revision, u32, Vec<u8>)> + '_> {
        if to < from {
            return Box::new(std::iter::empty());
        }
        let range = self.read(None, |s| {
            s.log.range((from, 0)..=(to, u32::MAX)).map(Some).map_err(|e| self.redb_error(e.into()))
        });
        let Some(range) = range else {
            return Box::new(std::iter::empty());
        };
        self.rows(range, move |row| {
            let (k, v) = row.map_err(|e| self.redb_error(e.into()))?;
            let (main, sub) = k.value();
            Ok((main, sub, v.value().to_vec()))
        })
    }

    fn lease_keys(&self, id: LeaseId) -> Vec<Vec<u8>> {
        self.read(Vec::new(), |s| {
            let none: &[u8] = &[];
            let range = s
                .lease_keys
                .range((id, none)..(id.saturating_add(1), none))
                .map_err(|e| self.redb_error(e.into()))?;
            let mut keys = Vec::new();
            for row in range {
                let (k, _) = row.map_err(|e| self.redb_error(e.into()))?;
                keys.push(k.value().1.to_vec());
            }
            Ok(keys)
        })
    }
}

/// Milliseconds since the unix epoch, now (0 if the clock is before 1970).
pub(crate) fn unix_ms_now() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
        .unwrap_or(0)
}

/// Maps a stored wall-clock deadline onto tokio's clock: the time left is counted from `now`.
pub(crate) fn deadline_from_unix_ms(deadline_ms: i64, now_ms: i64, now: Instant) -> Instant {
    let left = u64::try_from(deadline_ms.saturating_sub(now_ms)).unwrap_or(0);
    now.checked_add(Duration::from_millis(left)).unwrap_or(now)
}

const TAG_DELETE: u8 = 0;
const TAG_PUT: u8 = 1;

/// `key_len: u32 LE | key | tag | (put only) create: i64 LE | version: i64 LE | lease: i64 LE |
/// value`.
#[cfg(test)]
pub(crate) fn encode_entry(key: &[u8], rec: Option<&Record>) -> Vec<u8> {
    let mut out = Vec::with_capacity(4 + key.len() + 1 + rec.map_or(0, |r| 24 + r.value.len()));
    // Keys are far below 4 GiB (the request limit is 1.5 MiB).
    out.extend_from_slice(&(key.len() as u32).to_le_bytes());
    out.extend_from_slice(key);
    match rec {
        None => out.push(TAG_DELETE),
        Some(r) => {
            out.push(TAG_PUT);
            out.extend_from_slice(&r.create_revision.to_le_bytes());
            out.extend_from_slice(&r.version.to_le_bytes());
            out.extend_from_slice(&r.lease.to_le_bytes());
            out.extend_from_slice(&r.value);
        }
    }
    out
}

pub(crate) fn decode_entry(bytes: &[u8]) -> Result<(Vec<u8>, Option<Record>), String> {
    let mut b = bytes;
    let mut len = [0u8; 4];
    len.copy_from_slice(take(&mut b, 4, "key length")?);
    let key = take(&mut b, u32::from_le_bytes(len) as usize, "key")?.to_vec();
    if key.is_empty() {
        return Err("empty key".into());
    }
    match take(&mut b, 1, "tag")?[0] {
        TAG_DELETE if b.is_empty() => Ok((key, None)),
        TAG_DELETE => Err("trailing bytes after a delete".into()),
        TAG_PUT => {
            let create_revision = i64_of(&mut b, "create revision")?;
            let version = i64_of(&mut b, "version")?;
            let lease = i64_of(&mut b, "lease")?;
            if create_revision < 2 || version < 1 {
                return Err(format!(
                    "invalid record (create {create_revision}, version {version})"
                ));
            }
            Ok((key, Some(Record { value: b.to_vec(), create_revision, version, lease })))
        }
        t => Err(format!("unknown tag {t}")),
    }
}

/// One change in a `kv` row: `main: i64 LE | sub: u32 LE | tag | (put only) create: i64 LE |
/// version: i64 LE | lease: i64 LE | value_len: u32 LE | value`; a row is its changes in order.
pub(crate) fn encode_history(history: &[Entry]) -> Vec<u8> {
    let size: usize =
        history.iter().map(|e| 13 + e.rec.as_ref().map_or(0, |r| 28 + r.value.len())).sum();
    let mut out = Vec::with_capacity(size);
    for e in history {
        out.extend_from_slice(&e.main.to_le_bytes());
        out.extend_from_slice(&e.sub.to_le_bytes());
        match &e.rec {
            None => out.push(TAG_DELETE),
            Some(r) => {
                out.push(TAG_PUT);
                out.extend_from_slice(&r.create_revision.to_le_bytes());
                out.extend_from_slice(&r.version.to_le_bytes());
                out.extend_from_slice(&r.lease.to_le_bytes());
                // Values are far below 4 GiB (the request limit is 1.5 MiB).
                out.extend_from_slice(&(r.value.len() as u32).to_le_bytes());
                out.extend_from_slice(&r.value);
            }
        }
    }
    out
}

/// Decodes a `kv` row, checking that it is a non-empty history in increasing `(main, sub)`
/// order at revisions after the initial one, with valid records.
pub(crate) fn decode_history(bytes: &[u8]) -> Result<Vec<Entry>, String> {
    let mut b = bytes;
    let mut out: Vec<Entry> = Vec::new();
    while !b.is_empty() {
        let main = i64_of(&mut b, "revision")?;
        let mut sub = [0u8; 4];
        sub.copy_from_slice(take(&mut b, 4, "sub-revision")?);
        let sub = u32::from_le_bytes(sub);
        if main <= INITIAL_REVISION {
            return Err(format!("change at revision {main} (revisions start at 2)"));
        }
        if out.last().is_some_and(|p| (p.main, p.sub) >= (main, sub)) {
            return Err(format!("changes out of order at revision ({main}, {sub})"));
        }
        let rec = match take(&mut b, 1, "tag")?[0] {
            TAG_DELETE => None,
            TAG_PUT => {
                let create_revision = i64_of(&mut b, "create revision")?;
                let version = i64_of(&mut b, "version")?;
                let lease = i64_of(&mut b, "lease")?;
                if create_revision < 2 || version < 1 {
                    return Err(format!(
                        "invalid record (create {create_revision}, version {version})"
                    ));
                }
                let mut len = [0u8; 4];
                len.copy_from_slice(take(&mut b, 4, "value length")?);
                let value = take(&mut b, u32::from_le_bytes(len) as usize, "value")?.to_vec();
                Some(Record { value, create_revision, version, lease })
            }
            t => return Err(format!("unknown tag {t}")),
        };
        out.push(Entry { main, sub, rec });
    }
    if out.is_empty() {
        return Err("empty history".into());
    }
    Ok(out)
}

fn take<'a>(b: &mut &'a [u8], n: usize, what: &str) -> Result<&'a [u8], String> {
    if b.len() < n {
        return Err(format!("truncated {what}"));
    }
    let (head, rest) = b.split_at(n);
    *b = rest;
    Ok(head)
}

fn i64_of(b: &mut &[u8], what: &str) -> Result<i64, String> {
    let raw = take(b, 8, what)?;
    let mut a = [0u8; 8];
    a.copy_from_slice(raw);
    Ok(i64::from_le_bytes(a))
}

/// Test hook: rewrites the format version, as a newer build would.
#[cfg(test)]
pub(crate) fn set_format_version(path: &Path, version: i64) -> Result<(), redb::Error> {
    let db = Database::create(path)?;
    let wtx = db.begin_write()?;
    {
        let mut t = wtx.open_table(META)?;
        t.insert(K_FORMAT, version)?;
    }
    wtx.commit()?;
    Ok(())
}

/// Test hook: stores a malformed `kv` row for `key`.
#[cfg(test)]
pub(crate) fn put_raw_history(path: &Path, key: &[u8], bytes: &[u8]) -> Result<(), redb::Error> {
    let db = Database::create(path)?;
    let wtx = db.begin_write()?;
    {
        let mut t = wtx.open_table(KV)?;
        t.insert(key, bytes)?;
    }
    wtx.commit()?;
    Ok(())
}

/// Test hook: writes a format-1 file (the older layout): `entries` rows as given
/// (`(key, main, sub, record)`), the scalars and the leases `(id, ttl, deadline ms)`.
#[cfg(test)]
pub(crate) fn write_v1_file(
    path: &Path,
    meta: Meta,
    entries: &[(&str, i64, u32, Option<Record>)],
    leases: &[(LeaseId, i64, i64)],
) -> Result<(), redb::Error> {
    let db = Database::create(path)?;
    let wtx = db.begin_write()?;
    {
        let mut t = wtx.open_table(META)?;
        t.insert(K_FORMAT, 1)?;
        write_meta(&mut t, meta)?;
        let mut e = wtx.open_table(ENTRIES)?;
        for (key, main, sub, rec) in entries {
            e.insert((*main, *sub), encode_entry(key.as_bytes(), rec.as_ref()).as_slice())?;
        }
        let mut l = wtx.open_table(LEASES)?;
        for &(id, ttl, ms) in leases {
            l.insert(id, (ttl, ms))?;
        }
    }
    wtx.commit()?;
    Ok(())
}

/// Test hook: the names of the file's tables.
#[cfg(test)]
pub(crate) fn table_names(path: &Path) -> Result<Vec<String>, redb::Error> {
    use redb::TableHandle;
    let db = Database::create(path)?;
    let rtx = db.begin_read()?;
    let names = rtx.list_tables()?.map(|t| t.name().to_string()).collect();
    Ok(names)
}

/// Test hook: moves a stored lease deadline, as if time had passed while the file was closed.
#[cfg(test)]
pub(crate) fn set_lease_deadline(
    path: &Path,
    id: LeaseId,
    deadline_ms: i64,
) -> Result<(), redb::Error> {
    let db = Database::create(path)?;
    let wtx = db.begin_write()?;
    {
        let mut t = wtx.open_table(LEASES)?;
        let ttl = t.get(id)?.map(|v| v.value().0).unwrap_or(1);
        t.insert(id, (ttl, deadline_ms))?;
    }
    wtx.commit()?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entry_codec_round_trips_and_rejects_garbage() {
        let rec = Record { value: b"v".to_vec(), create_revision: 2, version: 3, lease: 9 };
        let enc = encode_entry(b"key", Some(&rec));
        assert_eq!(decode_entry(&enc), Ok((b"key".to_vec(), Some(rec))));
        assert_eq!(decode_entry(&encode_entry(b"k", None)), Ok((b"k".to_vec(), None)));
        assert!(decode_entry(&enc[..10]).is_err());
        assert!(decode_entry(&[]).is_err());
        assert!(decode_entry(&[1, 0, 0, 0, b'k', 7]).is_err());
        assert!(decode_entry(&[0xff, 0xff, 0xff, 0xff]).is_err());
    }

    #[test]
    fn history_codec_round_trips_and_rejects_garbage() {
        let rec = Record { value: b"v".to_vec(), create_revision: 2, version: 3, lease: 9 };
        let history = vec![
            Entry { main: 2, sub: 0, rec: Some(rec.clone()) },
            Entry { main: 5, sub: 1, rec: None },
            Entry { main: 7, sub: 0, rec: Some(Record { value: Vec::new(), ..rec }) },
        ];
        let enc = encode_history(&history);
        assert_eq!(decode_history(&enc), Ok(history.clone()));
        assert!(decode_history(&[]).is_err(), "an empty row is not a history");
        assert!(decode_history(&enc[..enc.len() - 1]).is_err());
        let backwards = encode_history(&[history[1].clone(), history[0].clone()]);
        assert!(decode_history(&backwards).unwrap_err().contains("out of order"));
        let early = encode_history(&[Entry { main: 1, sub: 0, rec: None }]);
        assert!(decode_history(&early).is_err());
    }
}
