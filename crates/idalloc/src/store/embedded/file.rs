//! Persistence of the embedded store in a `redb` file: a durable mirror of the state machine.
//!
//! The file holds the state machine's history, not a snapshot: every key change is one row, so a
//! txn is one redb write transaction that inserts its rows (and, when compaction ran, removes the
//! rows it dropped). redb commits with `Durability::Immediate` (its default): the commit has
//! reached the disk when `commit()` returns, and a commit is atomic, so after a crash the file
//! holds exactly the acknowledged txns, none torn.
//!
//! Tables:
//! - `meta` (`&str -> i64`): `format_version`, `revision`, `compact_revision`, `next_lease`;
//! - `entries` (`(main, sub) -> bytes`): one key change, encoded by [`encode_entry`];
//! - `leases` (`id -> (ttl, deadline as unix ms)`): deadlines are wall-clock so that time spent
//!   closed counts; at open they are mapped back onto tokio's clock.
//!
//! Everything read from the file is checked; anything unexpected is `StoreError::Corrupt`, never
//! a panic and never a silent reset. That includes damage redb itself trips over: see
//! [`guarded`].
//!
//! A file this process may not write (file mode, a read-only filesystem), or one opened with
//! [`super::EmbeddedOptions::read_only`], is opened read-only: it serves reads, and the store
//! refuses every write with [`StoreError::ReadOnly`] naming the file and the reason, before
//! anything changes.

use std::cell::Cell;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::{Path, PathBuf};
use std::sync::Once;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use redb::{Database, ReadOnlyDatabase, ReadableDatabase, ReadableTable, TableDefinition};
use tokio::time::Instant;

use super::mvcc::{Delta, Entry, Meta, Record, INITIAL_REVISION, NEVER_COMPACTED};
use crate::store::{LeaseId, StoreError, StoreResult};

/// The file format this build writes and reads. A file with a larger number was written by a
/// newer idalloc and is refused.
pub(crate) const FORMAT_VERSION: i64 = 1;

const META: TableDefinition<&str, i64> = TableDefinition::new("meta");
const ENTRIES: TableDefinition<(i64, u32), &[u8]> = TableDefinition::new("entries");
const LEASES: TableDefinition<i64, (i64, i64)> = TableDefinition::new("leases");

const K_FORMAT: &str = "format_version";
const K_REV: &str = "revision";
const K_COMPACT: &str = "compact_revision";
const K_NEXT_LEASE: &str = "next_lease";

/// Everything read from a file at open.
pub(crate) struct Loaded {
    pub meta: Meta,
    /// Key changes in `(main, sub)` order.
    pub entries: Vec<(Vec<u8>, Entry)>,
    /// `(id, ttl, deadline as unix ms)`.
    pub leases: Vec<(LeaseId, i64, i64)>,
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
        let Some(db) = self.db.take() else { return };
        if let Err(e) = guarded(&self.path, move || drop(db)) {
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
/// (issue 19 item 3; `page_manager.rs` "Malformed allocator state", `types.rs:109` on a table
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
    let db = Database::create(&copy).map_err(|e| match open_error(path, e.into()) {
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

impl FileStore {
    /// Opens (creating if missing) and reads the whole file. Blocking: call it off the async
    /// workers. One attempt; the caller retries on [`OpenError::Locked`].
    ///
    /// `read_only` opens it read-only; so does a read-write open refused for want of write
    /// permission when the file exists (reads then work, writes are refused).
    pub fn open_blocking(path: &Path, read_only: bool) -> Result<(FileStore, Loaded), OpenError> {
        // Everything that touches redb, including dropping a database that failed to load.
        guarded(path, || Self::open_unguarded(path, read_only)).map_err(OpenError::Store)?
    }

    fn open_unguarded(path: &Path, read_only: bool) -> Result<(FileStore, Loaded), OpenError> {
        let db = if read_only {
            open_read_only(path, "opened read-only on request".into())?
        } else {
            match Database::create(path) {
                Ok(db) => Db::Write(db),
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
        // redb's own check of every page's checksum. A writable database commits its allocator
        // state when closed, reading its freed-page tree; on a file damaged there (which a load
        // never reads) that panicked inside redb, twice over in one case (a panic while unwinding
        // from a panic aborts the process: no `guarded` can catch it). Found by the
        // `damaged_file` fuzz target (docs/fuzzing.md). Checking first makes such a file
        // `Corrupt` at open, naming it, before anything can close it. A read-only database writes
        // nothing at close and is not checked.
        let mut db = db;
        if let Db::Write(d) | Db::Copy { db: d, .. } = &mut db {
            if let Err(e) = d.check_integrity() {
                // After a failed check redb's close no longer commits (the fuzz corpus's
                // `crash-close-double-panic` closes cleanly here); it is dropped under `guarded`.
                return Err(OpenError::Store(corrupt(
                    path,
                    format!("the file is damaged: redb's integrity check failed ({e})"),
                )));
            }
        }
        let fresh = {
            let rtx = match &db {
                Db::Write(d) | Db::Copy { db: d, .. } => d.begin_read(),
                Db::Read(d, _) => d.begin_read(),
            }
            .map_err(|e| err(e.into()))?;
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
                wtx.open_table(ENTRIES).map_err(|e| err(e.into()))?;
                wtx.open_table(LEASES).map_err(|e| err(e.into()))?;
            }
            wtx.commit().map_err(|e| err(e.into()))?;
        }
        let loaded = match &db {
            Db::Write(d) | Db::Copy { db: d, .. } => load(d, path)?,
            Db::Read(d, _) => load(d, path)?,
        };
        let written = loaded.meta;
        Ok((FileStore { db: Some(db), path: path.to_path_buf(), written, commits: 0 }, loaded))
    }

    pub fn path(&self) -> &Path {
        &self.path
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

    /// Writes one operation's changes and the new scalars in one durable redb transaction.
    /// Nothing to write (a read, a txn that changed nothing) costs nothing.
    pub fn persist(&mut self, delta: &Delta, meta: Meta, now: Instant) -> Result<(), String> {
        if delta.is_empty() && meta == self.written {
            return Ok(());
        }
        guarded(&self.path, || self.write(delta, meta, now))
            .map_err(|e| e.to_string())?
            .map_err(|e| e.to_string())?;
        self.written = meta;
        self.commits += 1;
        Ok(())
    }

    /// redb write transactions committed since open.
    #[cfg(test)]
    pub fn commits(&self) -> u64 {
        self.commits
    }

    fn write(&self, delta: &Delta, meta: Meta, now: Instant) -> Result<(), redb::Error> {
        let Some(Db::Write(db)) = &self.db else {
            // The store never gets here: it refuses writes up front and keeps what a read-only
            // file's state machine changes by itself (lease expiry) in memory.
            return Err(redb::Error::Io(std::io::Error::other("the file is open read-only")));
        };
        let wtx = db.begin_write()?;
        {
            let mut entries = wtx.open_table(ENTRIES)?;
            for (key, entry) in &delta.entries {
                entries.insert(
                    (entry.main, entry.sub),
                    encode_entry(key, entry.rec.as_ref()).as_slice(),
                )?;
            }
            for &(main, sub) in &delta.removed {
                entries.remove((main, sub))?;
            }
            let mut leases = wtx.open_table(LEASES)?;
            let now_ms = unix_ms_now();
            for &(id, ttl, deadline) in &delta.leases_put {
                let left = deadline.saturating_duration_since(now);
                let ms = now_ms.saturating_add(i64::try_from(left.as_millis()).unwrap_or(i64::MAX));
                leases.insert(id, (ttl, ms))?;
            }
            for id in &delta.leases_removed {
                leases.remove(id)?;
            }
            let mut m = wtx.open_table(META)?;
            write_meta(&mut m, meta)?;
        }
        wtx.commit()?;
        Ok(())
    }
}

fn write_meta(t: &mut redb::Table<&str, i64>, meta: Meta) -> Result<(), redb::StorageError> {
    t.insert(K_REV, meta.revision)?;
    t.insert(K_COMPACT, meta.compact_revision)?;
    t.insert(K_NEXT_LEASE, meta.next_lease)?;
    Ok(())
}

fn load(db: &impl ReadableDatabase, path: &Path) -> Result<Loaded, OpenError> {
    let err = read_error(path);
    let rtx = db.begin_read().map_err(|e| err(e.into()))?;
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
    let entries_t = rtx.open_table(ENTRIES).map_err(|e| err(e.into()))?;
    let mut entries = Vec::new();
    for row in entries_t.iter().map_err(|e| err(e.into()))? {
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
    let leases_t = rtx.open_table(LEASES).map_err(|e| err(e.into()))?;
    let mut leases = Vec::new();
    for row in leases_t.iter().map_err(|e| err(e.into()))? {
        let (k, v) = row.map_err(|e| err(e.into()))?;
        let (ttl, deadline_ms) = v.value();
        leases.push((k.value(), ttl, deadline_ms));
    }
    Ok(Loaded { meta, entries, leases })
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

/// Test hook: stores a malformed entry row.
#[cfg(test)]
pub(crate) fn put_raw_entry(path: &Path, main: i64, bytes: &[u8]) -> Result<(), redb::Error> {
    let db = Database::create(path)?;
    let wtx = db.begin_write()?;
    {
        let mut t = wtx.open_table(ENTRIES)?;
        t.insert((main, 0u32), bytes)?;
        let mut m = wtx.open_table(META)?;
        m.insert(K_REV, main)?;
    }
    wtx.commit()?;
    Ok(())
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
}
