//! The storage seam: one trait with etcd v3 semantics, and its implementations.
//!
//! The allocator never talks to etcd or to a file directly; it builds [`TxnRequest`]s and reads
//! [`TxnResponse`]s through [`Store`]. Every implementation must behave exactly like etcd 3.4 for the
//! subset defined here; the conformance suite (in the `idalloc-testkit` crate) checks that, with a
//! real etcd as the reference. Where an embedded store and etcd differ, the embedded store is wrong.
//!
//! Types mirror etcd's protobuf messages closely (revisions are `i64`, a lease ID of `0` means "no
//! lease", a range is `key` plus `range_end`) so that the etcd implementation is a thin mapping and so
//! that readers who know etcd know this module.
//!
//! About 680 lines of code because the trait's request and response types mirror etcd's protobuf
//! messages one to one (so readers who know etcd know this module), and the byte-bounded paging
//! (`list_all`) belongs beside the trait every store implements.

use std::fmt;
use std::time::Duration;

use futures::stream::BoxStream;

// Each store is a cargo feature (both default): `idalloc-client`, which speaks HTTP only, builds
// without them, so without etcd-client, tonic and the `protoc` their build needs.
#[cfg(feature = "embedded")]
pub mod embedded;
#[cfg(feature = "etcd")]
pub mod etcd;
pub mod listing;
// Opening a store from a URL needs both stores.
#[cfg(all(feature = "embedded", feature = "etcd"))]
pub mod env;
#[cfg(all(feature = "embedded", feature = "etcd"))]
pub mod url;
mod window;

pub use window::prefix_end;

/// etcd's default limit on the number of operations in one txn (`--max-txn-ops`), counted over the
/// compares and each branch separately, as etcd does. Every store rejects more with
/// [`StoreError::InvalidRequest`].
pub const MAX_TXN_OPS: usize = 128;

/// etcd's default limit on the size of one request (`--max-request-bytes`, 1.5 MiB).
pub const MAX_REQUEST_BYTES: usize = 1536 * 1024;

/// How many bytes of records [`list_all`] aims to read per page. A page is also at most `page`
/// records, but a count alone is not enough: a record name holds an escaped key (up to 3 × 4096
/// bytes, since escaping triples `/`), so 1,000 records can weigh 12 MB, over the 4 MiB a gRPC
/// client accepts by default. Half that limit leaves room for framing and for one page of records
/// bigger than the ones seen so far.
pub const LIST_PAGE_BYTES: usize = 2 * 1024 * 1024;

/// A store revision. Every write (a txn with at least one mutation that succeeded in changing
/// something, or a lease expiry that deleted keys) bumps the global revision by one.
pub type Revision = i64;

/// A lease ID. `0` means "no lease".
pub type LeaseId = i64;

/// A set of keys: one key, a half-open range `[key, range_end)`, or everything from `key` on.
///
/// Encoded as etcd does: an empty `range_end` is the single key `key`; `range_end == [0]` means "every
/// key `>= key`"; otherwise the range is `[key, range_end)`.
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct KeyRange {
    /// First key (inclusive).
    pub key: Vec<u8>,
    /// End of the range (exclusive); empty for a single key; `[0]` for "to the end of the keyspace".
    pub range_end: Vec<u8>,
}

impl KeyRange {
    /// The single key `key`.
    pub fn key(key: impl Into<Vec<u8>>) -> Self {
        KeyRange { key: key.into(), range_end: Vec::new() }
    }

    /// Every key that starts with `prefix`.
    pub fn prefix(prefix: impl Into<Vec<u8>>) -> Self {
        let key = prefix.into();
        let range_end = prefix_end(&key);
        KeyRange { key, range_end }
    }

    /// The half-open range `[start, end)`.
    pub fn range(start: impl Into<Vec<u8>>, end: impl Into<Vec<u8>>) -> Self {
        KeyRange { key: start.into(), range_end: end.into() }
    }

    /// Every key `>= start`.
    pub fn from_key(start: impl Into<Vec<u8>>) -> Self {
        KeyRange { key: start.into(), range_end: vec![0] }
    }

    /// True if this range names exactly one key.
    pub fn is_single(&self) -> bool {
        self.range_end.is_empty()
    }

    /// True if `k` lies in this range (etcd's rules, including the `[0]` "to the end" marker).
    pub fn contains(&self, k: &[u8]) -> bool {
        if self.range_end.is_empty() {
            k == self.key.as_slice()
        } else if self.range_end == [0] {
            k >= self.key.as_slice()
        } else {
            k >= self.key.as_slice() && k < self.range_end.as_slice()
        }
    }
}

impl fmt::Debug for KeyRange {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.range_end.is_empty() {
            write!(f, "{:?}", String::from_utf8_lossy(&self.key))
        } else {
            write!(
                f,
                "[{:?}, {:?})",
                String::from_utf8_lossy(&self.key),
                String::from_utf8_lossy(&self.range_end)
            )
        }
    }
}

/// One key's record, as etcd returns it.
#[derive(Clone, PartialEq, Eq)]
pub struct KeyValue {
    pub key: Vec<u8>,
    /// Empty when the read asked for keys only, and in delete events.
    pub value: Vec<u8>,
    /// Revision of the put that created the key (since its last deletion).
    pub create_revision: Revision,
    /// Revision of the last write to the key; for a delete event, the revision of the delete.
    pub mod_revision: Revision,
    /// Number of puts since creation (1 after the first put); 0 in delete events.
    pub version: i64,
    /// The lease the key is attached to, or 0.
    pub lease: LeaseId,
}

impl fmt::Debug for KeyValue {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("KeyValue")
            .field("key", &String::from_utf8_lossy(&self.key))
            .field("value", &String::from_utf8_lossy(&self.value))
            .field("create_revision", &self.create_revision)
            .field("mod_revision", &self.mod_revision)
            .field("version", &self.version)
            .field("lease", &self.lease)
            .finish()
    }
}

/// What a compare looks at.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum CompareTarget {
    Value(Vec<u8>),
    CreateRevision(Revision),
    ModRevision(Revision),
    Version(i64),
    Lease(LeaseId),
}

/// How a compare compares: `record <op> target`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CompareOp {
    Equal,
    NotEqual,
    Less,
    Greater,
}

/// One guard of a txn. On a single key, a missing key compares as a zero record (create, mod
/// revision, version and lease 0); a value compare against a missing key is false. On a range, the
/// compare must hold for every key in the range; an empty range compares as one zero record, so
/// `CreateRevision == 0` on a range means "the range is empty" (etcd 3.4 behaviour).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Compare {
    pub range: KeyRange,
    pub op: CompareOp,
    pub target: CompareTarget,
}

impl Compare {
    pub fn new(range: KeyRange, op: CompareOp, target: CompareTarget) -> Self {
        Compare { range, op, target }
    }

    /// `key` does not exist (`create_revision == 0`).
    pub fn absent(key: impl Into<Vec<u8>>) -> Self {
        Compare::new(KeyRange::key(key), CompareOp::Equal, CompareTarget::CreateRevision(0))
    }

    /// No key in `range` exists.
    pub fn range_empty(range: KeyRange) -> Self {
        Compare::new(range, CompareOp::Equal, CompareTarget::CreateRevision(0))
    }

    /// `key` exists and holds `value`.
    pub fn value_is(key: impl Into<Vec<u8>>, value: impl Into<Vec<u8>>) -> Self {
        Compare::new(KeyRange::key(key), CompareOp::Equal, CompareTarget::Value(value.into()))
    }

    /// `key`'s mod revision equals `rev` (`0`: the key does not exist).
    pub fn mod_revision_is(key: impl Into<Vec<u8>>, rev: Revision) -> Self {
        Compare::new(KeyRange::key(key), CompareOp::Equal, CompareTarget::ModRevision(rev))
    }
}

/// A read of one key or a range.
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub struct GetRequest {
    pub range: KeyRange,
    /// At most this many keys (0: no limit). `more` in the response says whether there were more.
    pub limit: i64,
    /// Read as of this revision (0: the current one). A compacted revision gives
    /// [`StoreError::Compacted`]; a future one gives [`StoreError::FutureRevision`].
    pub revision: Revision,
    /// Omit values.
    pub keys_only: bool,
    /// Return only the count, no key-values.
    pub count_only: bool,
    /// With a `limit`, `count` may stop short: the store may stop walking the range once it has
    /// found one key past the limit, so `count` is then anywhere from the keys returned (plus one
    /// if `more`) to the exact count. etcd always counts exactly (it has no way to skip it); the
    /// embedded store stops, so a limited read costs what it returns. Paged
    /// listings ([`Pages`]) need only `more`.
    pub loose_count: bool,
    /// Order the answer by mod revision, newest first (etcd's `SortTarget::Mod`, descending), not
    /// by key. With `limit` 1 and `keys_only` this is the range's newest change in one record,
    /// however big the range: what `idalloc serve` needs to give a new watch stream
    /// read-your-writes without sending the pool over the network. The store
    /// still walks the range to sort it (etcd 3.4 reads every record of a range it sorts), but
    /// answers `limit` records.
    pub newest_first: bool,
}

impl Default for KeyRange {
    fn default() -> Self {
        KeyRange::key(Vec::new())
    }
}

impl GetRequest {
    pub fn new(range: KeyRange) -> Self {
        GetRequest { range, ..Default::default() }
    }
    pub fn key(key: impl Into<Vec<u8>>) -> Self {
        GetRequest::new(KeyRange::key(key))
    }
    pub fn prefix(prefix: impl Into<Vec<u8>>) -> Self {
        GetRequest::new(KeyRange::prefix(prefix))
    }
    pub fn with_limit(mut self, limit: i64) -> Self {
        self.limit = limit;
        self
    }
    pub fn at_revision(mut self, revision: Revision) -> Self {
        self.revision = revision;
        self
    }
    pub fn keys_only(mut self) -> Self {
        self.keys_only = true;
        self
    }
    pub fn count_only(mut self) -> Self {
        self.count_only = true;
        self
    }
    /// See [`GetRequest::loose_count`].
    pub fn loose_count(mut self) -> Self {
        self.loose_count = true;
        self
    }
    /// See [`GetRequest::newest_first`].
    pub fn newest_first(mut self) -> Self {
        self.newest_first = true;
        self
    }
}

/// A write of one key.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PutRequest {
    pub key: Vec<u8>,
    pub value: Vec<u8>,
    /// Attach the key to this lease (0: no lease). A lease that does not exist fails the whole txn
    /// with [`StoreError::LeaseNotFound`].
    pub lease: LeaseId,
}

/// One operation in a txn branch.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum TxnOp {
    Get(GetRequest),
    Put(PutRequest),
    Delete(KeyRange),
    /// A nested txn: its compares see the state before the outer txn (etcd evaluates every compare
    /// of a txn tree against the pre-txn state).
    Txn(TxnRequest),
}

impl TxnOp {
    pub fn get(req: GetRequest) -> Self {
        TxnOp::Get(req)
    }
    pub fn get_key(key: impl Into<Vec<u8>>) -> Self {
        TxnOp::Get(GetRequest::key(key))
    }
    pub fn put(key: impl Into<Vec<u8>>, value: impl Into<Vec<u8>>) -> Self {
        TxnOp::Put(PutRequest { key: key.into(), value: value.into(), lease: 0 })
    }
    pub fn put_on_lease(
        key: impl Into<Vec<u8>>,
        value: impl Into<Vec<u8>>,
        lease: LeaseId,
    ) -> Self {
        TxnOp::Put(PutRequest { key: key.into(), value: value.into(), lease })
    }
    pub fn delete(key: impl Into<Vec<u8>>) -> Self {
        TxnOp::Delete(KeyRange::key(key))
    }
    pub fn delete_range(range: KeyRange) -> Self {
        TxnOp::Delete(range)
    }
}

/// `If compares Then success Else failure`, applied atomically at one revision.
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub struct TxnRequest {
    pub compare: Vec<Compare>,
    pub success: Vec<TxnOp>,
    pub failure: Vec<TxnOp>,
}

impl TxnRequest {
    pub fn new() -> Self {
        Self::default()
    }
    pub fn when(mut self, compare: impl IntoIterator<Item = Compare>) -> Self {
        self.compare.extend(compare);
        self
    }
    pub fn and_then(mut self, ops: impl IntoIterator<Item = TxnOp>) -> Self {
        self.success.extend(ops);
        self
    }
    pub fn or_else(mut self, ops: impl IntoIterator<Item = TxnOp>) -> Self {
        self.failure.extend(ops);
        self
    }
}

/// Result of a read.
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub struct GetResponse {
    /// Matching keys in key order (at most `limit`; none if `count_only`).
    pub kvs: Vec<KeyValue>,
    /// Number of keys in the range (ignoring `limit`; at least the keys returned, plus one if
    /// `more`, when the request allowed a [`GetRequest::loose_count`]).
    pub count: i64,
    /// True if `limit` cut the result short.
    pub more: bool,
    /// The store revision the read was served at (the response header's revision; for a read at a
    /// past revision, etcd still reports the current revision here).
    pub revision: Revision,
}

/// Result of one op in the branch that ran.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum OpResponse {
    Get(GetResponse),
    Put,
    /// How many keys the delete removed.
    Delete {
        deleted: i64,
    },
    /// A nested txn's result; its `revision` is the outer txn's.
    Txn(TxnResponse),
}

/// Result of a txn.
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub struct TxnResponse {
    /// True if every compare held and the success branch ran.
    pub succeeded: bool,
    /// One response per op of the branch that ran, in order.
    pub responses: Vec<OpResponse>,
    /// The store revision after the txn (the header revision).
    pub revision: Revision,
}

/// A granted lease.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Lease {
    pub id: LeaseId,
    /// TTL in seconds as granted (etcd may raise a small request to its minimum).
    pub ttl: i64,
}

/// One change seen by a watch.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum WatchEvent {
    /// The key was created or changed; `kv` is its new record.
    Put(KeyValue),
    /// The key was deleted; `kv.key` is the key, `kv.mod_revision` the revision of the delete, the
    /// other fields are zero/empty (as etcd sends without `prev_kv`).
    Delete(KeyValue),
}

impl WatchEvent {
    pub fn kv(&self) -> &KeyValue {
        match self {
            WatchEvent::Put(kv) | WatchEvent::Delete(kv) => kv,
        }
    }
}

/// What a watch stream yields.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum WatchMessage {
    /// Events of one or more revisions, in revision order. Events of one revision are never split
    /// over two batches.
    Events(Vec<WatchEvent>),
    /// The requested start revision is compacted away. The stream ends after this; the caller must
    /// re-list (at a current revision) and watch again. `compact_revision` is the oldest revision
    /// still available.
    Compacted { compact_revision: Revision },
}

/// A watch: messages until the stream ends. An `Err` item (typically [`StoreError::Unavailable`])
/// means the stream broke; the caller resumes from the revision after the last event it saw.
pub type WatchStream = BoxStream<'static, Result<WatchMessage, StoreError>>;

/// Everything a store can fail with. [`StoreError::is_retryable`] tells which failures are worth
/// another attempt.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum StoreError {
    /// The store could not be reached or did not answer in time. The request may or may not have
    /// taken effect (a lost response after commit looks the same): callers must be idempotent or
    /// re-read before retrying.
    #[error("store unavailable: {0}")]
    Unavailable(String),
    /// The request is malformed or over a limit (too many ops, duplicate key in one txn, too large).
    /// Retrying the same request cannot help.
    #[error("invalid store request: {0}")]
    InvalidRequest(String),
    /// A read or watch asked for a revision older than the compaction point.
    #[error("revision {requested} is compacted (oldest available: {compact_revision})")]
    Compacted { requested: Revision, compact_revision: Revision },
    /// A read asked for a revision newer than the store's current one.
    #[error("revision {requested} is in the future (current: {current})")]
    FutureRevision { requested: Revision, current: Revision },
    /// A put named a lease that does not exist (never granted, revoked or expired).
    #[error("lease {0:x} not found")]
    LeaseNotFound(LeaseId),
    /// The answer to a read was larger than the client accepts (gRPC's 4 MiB message limit on
    /// etcd). Not the request's fault and not an outage: the same data read in smaller pages works,
    /// which [`list_all`] does by itself. Retrying the same request cannot help.
    #[error("the store's answer is too large for one response ({0}); read it in smaller pages")]
    ResponseTooLarge(String),
    /// The embedded store's file is in use by another process and did not become free in time.
    #[error("store file {path} is in use by another process (waited {waited:?})")]
    Locked { path: String, waited: Duration },
    /// The embedded store's file is damaged or of a format this version cannot read. Never reset
    /// silently.
    #[error("store file {path} cannot be used: {reason}")]
    Corrupt { path: String, reason: String },
    /// A write was attempted on an embedded store whose file is open read-only (its mode, a
    /// read-only filesystem, or on request). Reads work; nothing was changed.
    #[error("store file {path} is read-only, so this write was refused ({reason})")]
    ReadOnly { path: String, reason: String },
    /// The store refused this client, or this client refused the store: a TLS handshake that
    /// failed, credentials that were rejected, a key outside the user's permissions. Waiting
    /// will not help; the configuration must change. `endpoint` is the one that refused (or the
    /// list, when etcd's answer does not say which member gave it). Never holds a secret.
    #[error("etcd at {endpoint}: {cause}: {detail}")]
    Access { endpoint: String, cause: AccessCause, detail: String },
}

/// What kind of refusal a [`StoreError::Access`] is, for callers that react differently (a CLI
/// pointing at the right flag, a service reporting "not ready" with the reason).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum AccessCause {
    /// The TLS handshake failed: untrusted or wrong server certificate, a client certificate the
    /// server rejected or did not get, TLS on one side only.
    Tls,
    /// The user or password was rejected, or etcd requires a user and none was given.
    Authentication,
    /// The user is authenticated but its roles do not cover the key.
    Permission,
}

impl std::fmt::Display for AccessCause {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            AccessCause::Tls => "TLS failed",
            AccessCause::Authentication => "authentication failed",
            AccessCause::Permission => "permission denied",
        })
    }
}

impl StoreError {
    /// True for failures where the same request may succeed later ([`StoreError::Unavailable`]).
    pub fn is_retryable(&self) -> bool {
        matches!(self, StoreError::Unavailable(_))
    }
}

pub type StoreResult<T> = Result<T, StoreError>;

/// A key-value store with etcd v3 semantics: the only way the allocator reaches storage.
///
/// Implementations: [`embedded::EmbeddedStore`] (memory or a `redb` file, one machine),
/// [`etcd::EtcdStore`] (a cluster). Test wrappers (fault injection, round-trip counting, request
/// hooks) live in the `idalloc-testkit` crate. Each method call is one round trip to the store.
#[async_trait::async_trait]
pub trait Store: Send + Sync + 'static {
    /// Applies `If compare Then success Else failure` atomically.
    async fn txn(&self, req: TxnRequest) -> StoreResult<TxnResponse>;

    /// Reads a key or a range (optionally at a past revision, optionally limited: see
    /// [`list_all`] for a consistent paginated read).
    async fn get(&self, req: GetRequest) -> StoreResult<GetResponse>;

    /// Grants a lease of `ttl` seconds.
    async fn lease_grant(&self, ttl: i64) -> StoreResult<Lease>;

    /// Renews a lease once. Returns the remaining TTL in seconds, or `None` if the lease no longer
    /// exists (expired or revoked). Running this in a loop is the caller's job.
    async fn lease_keep_alive(&self, id: LeaseId) -> StoreResult<Option<i64>>;

    /// Revokes a lease and deletes its keys. Returns false if the lease did not exist.
    async fn lease_revoke(&self, id: LeaseId) -> StoreResult<bool>;

    /// Watches `range` from `start_revision` (0: from now on). Events at revisions
    /// `>= start_revision` are replayed first, in order, then live events follow.
    async fn watch(&self, range: KeyRange, start_revision: Revision) -> StoreResult<WatchStream>;

    /// Discards history before `revision`. Reads and watches at older revisions then fail with
    /// `Compacted`.
    async fn compact(&self, revision: Revision) -> StoreResult<()>;

    /// What serves the data and its version, for `idalloc version` and `GET /v1/version`
    /// ("etcd 3.4.27", "idalloc file store, format 2"); `None` when there is nothing to name (a
    /// wrapper that does not say).
    async fn server_version(&self) -> StoreResult<Option<String>> {
        Ok(None)
    }
}

#[async_trait::async_trait]
impl<S: Store + ?Sized> Store for std::sync::Arc<S> {
    async fn txn(&self, req: TxnRequest) -> StoreResult<TxnResponse> {
        (**self).txn(req).await
    }
    async fn get(&self, req: GetRequest) -> StoreResult<GetResponse> {
        (**self).get(req).await
    }
    async fn lease_grant(&self, ttl: i64) -> StoreResult<Lease> {
        (**self).lease_grant(ttl).await
    }
    async fn lease_keep_alive(&self, id: LeaseId) -> StoreResult<Option<i64>> {
        (**self).lease_keep_alive(id).await
    }
    async fn lease_revoke(&self, id: LeaseId) -> StoreResult<bool> {
        (**self).lease_revoke(id).await
    }
    async fn watch(&self, range: KeyRange, start_revision: Revision) -> StoreResult<WatchStream> {
        (**self).watch(range, start_revision).await
    }
    async fn compact(&self, revision: Revision) -> StoreResult<()> {
        (**self).compact(revision).await
    }
    async fn server_version(&self) -> StoreResult<Option<String>> {
        (**self).server_version().await
    }
}

/// Reads all of `range` as of one revision, in pages of at most `page` keys and about
/// [`LIST_PAGE_BYTES`] bytes, so that a large range is listed consistently without one huge
/// response. Returns the key-values and the revision they are valid at. Later writes are not seen.
/// (One round trip per page.)
pub async fn list_all<S: Store + ?Sized>(
    store: &S,
    range: &KeyRange,
    page: i64,
) -> StoreResult<(Vec<KeyValue>, Revision)> {
    list_all_with_progress(store, range, page, |_| {}).await
}

/// Bytes one record takes in a read's answer: its name and value plus a little framing (revisions,
/// version, lease and protobuf tags).
fn record_bytes(kv: &KeyValue) -> usize {
    kv.key.len() + kv.value.len() + 48
}

/// How many records the next page asks for: as many of the largest record seen so far as fit in
/// [`LIST_PAGE_BYTES`], at least 1 and at most `page`.
fn next_page_limit(page: i64, largest: usize) -> i64 {
    let fit = (LIST_PAGE_BYTES / largest.max(1)) as i64;
    fit.clamp(1, page.max(1))
}

/// After a page of `limit` records came back too large (`message` is the client's error, which
/// names the size it found when it comes from gRPC), the limit to try instead: scaled down to fit
/// [`LIST_PAGE_BYTES`] when the size is known, else a quarter. `None` when a single record is
/// already too large (nothing smaller to ask for).
fn shrink_page_limit(limit: i64, message: &str) -> Option<i64> {
    if limit <= 1 {
        return None;
    }
    let found = message
        .split("found ")
        .nth(1)
        .and_then(|r| r.split(|c: char| !c.is_ascii_digit()).next())
        .and_then(|n| n.parse::<u64>().ok())
        .filter(|&n| n > 0);
    let next = match found {
        Some(n) => ((limit as u128 * LIST_PAGE_BYTES as u128) / n as u128) as i64,
        None => limit / 4,
    };
    Some(next.clamp(1, limit - 1))
}

/// [`list_all`], calling `on_page` with the number of keys read so far after every page, so a
/// caller waiting for a long listing can tell progress from a hang.
pub async fn list_all_with_progress<S: Store + ?Sized>(
    store: &S,
    range: &KeyRange,
    page: i64,
    on_page: impl FnMut(usize),
) -> StoreResult<(Vec<KeyValue>, Revision)> {
    list_pages(store, range, page, 0, on_page).await
}

/// [`list_all`] as of `revision` (0: the current one), so several ranges can be read at the
/// same revision (the `check` audit).
pub async fn list_all_at<S: Store + ?Sized>(
    store: &S,
    range: &KeyRange,
    page: i64,
    revision: Revision,
) -> StoreResult<(Vec<KeyValue>, Revision)> {
    list_pages(store, range, page, revision, |_| {}).await
}

async fn list_pages<S: Store + ?Sized>(
    store: &S,
    range: &KeyRange,
    page: i64,
    revision: Revision,
    mut on_page: impl FnMut(usize),
) -> StoreResult<(Vec<KeyValue>, Revision)> {
    let mut pages = Pages::at(store, range, page, revision);
    let mut out = Vec::new();
    while let Some(kvs) = pages.next_page().await? {
        out.extend(kvs);
        on_page(out.len());
    }
    let rev = pages.revision();
    Ok((out, rev))
}

/// A listing of one range as of one revision, read page by page: what [`list_all`] collects,
/// for callers that can handle each page and drop it, keeping one page in memory, not the range.
///
/// Each read is limited to a *window* of the range (`store/window.rs`), sized from the keys read
/// so far to hold about one page, so that it costs what the page holds, not what is left of the
/// range: the whole listing is linear in the records.
pub struct Pages<'a, S: Store + ?Sized> {
    store: &'a S,
    page: i64,
    /// The revision every page is read at; 0 until the first read fixes it.
    revision: Revision,
    cursor: window::Cursor,
    limit: i64,
    largest: usize,
    /// Read names only (no values): [`Pages::keys_only`].
    keys_only: bool,
}

impl<'a, S: Store + ?Sized> Pages<'a, S> {
    /// Pages of at most `page` records (and about [`LIST_PAGE_BYTES`]) of `range`, as of
    /// `revision` (0: the revision of the first read).
    pub fn at(store: &'a S, range: &KeyRange, page: i64, revision: Revision) -> Self {
        let page = page.max(1);
        let cursor = window::Cursor::new(&range.key, &range.range_end);
        Pages { store, page, revision, cursor, limit: page, largest: 0, keys_only: false }
    }

    /// The same listing reading record names only (values come back empty): for callers that
    /// need which records exist, not what they hold (a lazy `lowest` bind's used IDs). Pages then
    /// hold as many records as fit by their names' size.
    pub fn keys_only(mut self) -> Self {
        self.keys_only = true;
        self
    }

    /// The revision the pages are read at (0 before the first read).
    pub fn revision(&self) -> Revision {
        self.revision
    }

    /// The key the next read starts at (`None` once the range is exhausted): where a listing
    /// that failed stood, for its error message.
    pub fn next_key(&self) -> Option<&[u8]> {
        self.cursor.start()
    }

    /// The next non-empty page, in key order; `None` when the range is exhausted: as many
    /// [`Pages::next_read`]s as it takes to find records (empty windows read nothing).
    pub async fn next_page(&mut self) -> StoreResult<Option<Vec<KeyValue>>> {
        while let Some(kvs) = self.next_read().await? {
            if !kvs.is_empty() {
                return Ok(Some(kvs));
            }
        }
        Ok(None)
    }

    /// One read of the listing: the records of the next window, in key order (none when the
    /// window was empty); `None` when the range is exhausted. What a caller bounding each round
    /// trip (`store/listing.rs`) waits on: a page may take several reads.
    ///
    /// Cancel-safe: the listing moves on only once a read has returned, so a call dropped
    /// mid-read (a timeout) leaves it where it was, and the next call reads the same window.
    pub async fn next_read(&mut self) -> StoreResult<Option<Vec<KeyValue>>> {
        while let Some((key, window_end)) = self.cursor.next_read() {
            // The window bounds what the store walks; it needs no exact count past the limit.
            let read = KeyRange { key, range_end: window_end.clone() };
            let mut req = GetRequest::new(read).with_limit(self.limit).loose_count();
            if self.keys_only {
                req = req.keys_only();
            }
            if self.revision != 0 {
                req = req.at_revision(self.revision);
            }
            let resp = match self.store.get(req).await {
                Ok(r) => r,
                Err(StoreError::ResponseTooLarge(m)) => match shrink_page_limit(self.limit, &m) {
                    Some(smaller) => {
                        self.limit = smaller;
                        continue;
                    }
                    None => return Err(StoreError::ResponseTooLarge(m)),
                },
                Err(e) => return Err(e),
            };
            if self.revision == 0 {
                self.revision = resp.revision;
            }
            self.largest = resp.kvs.iter().map(record_bytes).fold(self.largest, usize::max);
            let keys: Vec<&[u8]> = resp.kvs.iter().map(|kv| kv.key.as_slice()).collect();
            self.cursor.advance(&window_end, &keys, resp.more, self.limit);
            self.limit = next_page_limit(self.page, self.largest);
            return Ok(Some(resp.kvs));
        }
        Ok(None)
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::hooked::{Answer, Hook, HookedStore, Kind, Response};

    #[test]
    fn prefix_end_increments_last_byte_that_can_be() {
        assert_eq!(prefix_end(b"a/b"), b"a/c".to_vec());
        assert_eq!(prefix_end(b"a\xff"), b"b".to_vec());
        assert_eq!(prefix_end(b"\xff\xff"), vec![0]);
        assert_eq!(prefix_end(b""), vec![0]);
    }

    /// etcd's client refuses answers over 4 MiB; this hook does the same over a real embedded
    /// store, and records the size of every answer it let through.
    struct ResponseLimit {
        limit: usize,
        sizes: std::sync::Mutex<Vec<usize>>,
    }

    #[async_trait::async_trait]
    impl Hook<embedded::EmbeddedStore> for ResponseLimit {
        async fn after(&self, _: &Arc<embedded::EmbeddedStore>, _: Kind, result: Answer) -> Answer {
            let Ok(Response::Get(resp)) = &result else { return result };
            let size: usize = resp.kvs.iter().map(|kv| kv.key.len() + kv.value.len() + 20).sum();
            if size > self.limit {
                return Err(StoreError::ResponseTooLarge(format!(
                    "decoded message length too large: found {size} bytes, the limit is: {} bytes",
                    self.limit
                )));
            }
            self.sizes.lock().unwrap().push(size);
            result
        }
    }

    /// 1,000 records per page whatever their size made listings of long keys
    /// fail forever. Records of 12 KB names (a 4,096-byte key of `/`, escaped) and 4 KB values:
    /// the listing completes, every answer under the limit, every record exactly once.
    #[tokio::test]
    async fn list_all_pages_by_bytes_under_a_response_limit() {
        let inner = embedded::EmbeddedStore::memory();
        let name = |i: usize| format!("big/{}{i:06}", "%2F".repeat(4090));
        for chunk in (0..400).collect::<Vec<_>>().chunks(40) {
            let ops = chunk.iter().map(|&i| TxnOp::put(name(i), vec![b'v'; 4096]));
            assert!(inner.txn(TxnRequest::new().and_then(ops)).await.unwrap().succeeded);
        }
        let limit = 4 * 1024 * 1024;
        let s = HookedStore::with_hook(inner, ResponseLimit { limit, sizes: Default::default() });
        let (kvs, _) = list_all(&s, &KeyRange::prefix("big/"), 1000).await.unwrap();
        let names: Vec<String> =
            kvs.iter().map(|kv| String::from_utf8_lossy(&kv.key).into_owned()).collect();
        assert_eq!(names, (0..400).map(name).collect::<Vec<_>>());
        let sizes = s.hook().sizes.lock().unwrap().clone();
        assert!(sizes.len() > 1 && sizes.iter().all(|&n| n <= limit), "{sizes:?}");
        // A single record over the limit cannot be paged around: the error says so.
        let tiny = ResponseLimit { limit: 100, sizes: Default::default() };
        let tiny = HookedStore::with_hook(s.inner().clone(), tiny);
        match list_all(&tiny, &KeyRange::prefix("big/"), 1000).await {
            Err(StoreError::ResponseTooLarge(m)) => assert!(m.contains("found"), "{m}"),
            other => panic!("expected ResponseTooLarge, got {other:?}"),
        }
    }

    #[test]
    fn page_limits_follow_record_sizes() {
        // Small records: the count limit rules.
        assert_eq!(next_page_limit(1000, 100), 1000);
        // Keys of 4096 '/' escape to 12,288 bytes: far fewer per page.
        let big = 3 * 4096 + 200;
        let n = next_page_limit(1000, big);
        assert!(n > 1 && (n as usize) * big <= LIST_PAGE_BYTES, "{n}");
        // A record bigger than the whole budget still makes progress, one at a time.
        assert_eq!(next_page_limit(1000, LIST_PAGE_BYTES * 2), 1);
        assert_eq!(next_page_limit(0, 10), 1);
    }

    #[test]
    fn shrinking_after_a_too_large_answer() {
        let m = "Error, decoded message length too large: found 11489866 bytes, the limit is: 4194304 bytes";
        let n = shrink_page_limit(1000, m).unwrap();
        assert!(n < 1000 && n as u64 * 11489866 / 1000 <= LIST_PAGE_BYTES as u64, "{n}");
        assert_eq!(shrink_page_limit(100, "too large, size unknown"), Some(25));
        assert_eq!(shrink_page_limit(2, "found 999999999999 bytes"), Some(1));
        assert_eq!(shrink_page_limit(1, m), None, "one record is as small as a page gets");
    }

    #[test]
    fn range_contains_follows_etcd_rules() {
        let single = KeyRange::key("k");
        assert!(single.contains(b"k"));
        assert!(!single.contains(b"k0"));
        let prefix = KeyRange::prefix("p/");
        assert!(prefix.contains(b"p/"));
        assert!(prefix.contains(b"p/x"));
        assert!(!prefix.contains(b"p0"));
        assert!(!prefix.contains(b"p"));
        let all = KeyRange::from_key("m");
        assert!(all.contains(b"m"));
        assert!(all.contains(b"\xff\xff"));
        assert!(!all.contains(b"l"));
    }
}
