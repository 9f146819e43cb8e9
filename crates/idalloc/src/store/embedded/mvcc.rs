//! The embedded store's state machine: a revisioned key-value map with etcd 3.4 semantics, free
//! of I/O and clocks.
//!
//! Everything time-related takes `now` as an argument (a [`tokio::time::Instant`], so paused-time
//! tests drive it), and every mutation is recorded in a [`Delta`] that the caller takes with
//! [`Mvcc::take_delta`] to persist and to publish to watchers. That split lets the file layer stay a
//! dumb mirror and lets unit tests drive the semantics without files or runtimes.
//!
//! Where the state lives: the maps below (`keys`, `log`, `lease_keys`) are an overlay on a
//! [`Backing`]. The memory store has none, so the maps are the whole state, exactly as before the
//! file store read on demand. The file store's backing is its redb file: the
//! maps then hold only what changed since the last commit (a key is read from the file on first
//! touch, changed in memory, and written back by [`Mvcc::take_flush`]), so opening a file and a
//! one-key operation cost O(1) in the size of the store, not O(file). The semantics stay in this
//! one module either way: every read merges the overlay over the backing, key by key.
//!
//! Where etcd has a quirk that a client can observe, this module copies it and says so; the
//! references are to etcd 3.4's `etcdserver/apply.go`, `etcdserver/api/v3rpc/key.go` and
//! `mvcc/kvstore_txn.go`.
//!
//! Split by job: this file holds the state, reads and txns; `lease.rs` the leases (grant,
//! keep-alive, revoke, expiry), `compaction.rs` compaction, `validate.rs` the checks etcd makes
//! before a request reaches its state machine, and `tests.rs` the unit tests. The leases and
//! compaction are further `impl Mvcc` blocks over the same maps (a child module sees its
//! parent's fields), so the invariants that tie them to revisions stay stated once, here.

use std::borrow::Cow;
use std::cmp::Reverse;
use std::collections::{BTreeMap, BTreeSet, BinaryHeap, HashMap};
use std::iter::Peekable;
use std::ops::Bound;
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use crate::store::{
    Compare, CompareOp, CompareTarget, GetRequest, GetResponse, KeyRange, KeyValue, Lease, LeaseId,
    OpResponse, Revision, StoreError, StoreResult, TxnOp, TxnRequest, TxnResponse, WatchEvent,
};

mod compaction;
mod lease;
mod validate;

pub(crate) use validate::{check_range_key, txn_size, validate_txn};

/// etcd's `MaxLeaseTTL`: a grant above this is refused.
pub(crate) const MAX_LEASE_TTL: i64 = 9_000_000_000;

/// The revision of an empty store (etcd reports 1 before the first write, which gets 2).
pub(crate) const INITIAL_REVISION: Revision = 1;

/// "Never compacted" (etcd's initial `compactMainRev`): `compact(0)` on a fresh store succeeds,
/// exactly as on etcd.
pub(crate) const NEVER_COMPACTED: Revision = -1;

/// A live key's record, without the key and the mod revision (which the [`Entry`] holds).
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Record {
    pub value: Vec<u8>,
    pub create_revision: Revision,
    pub version: i64,
    pub lease: LeaseId,
}

/// One change of one key: a put (`rec` is the new record) or a delete (`rec` is `None`) at
/// revision `(main, sub)`; `sub` orders the changes of one revision as etcd's sub-revisions do.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Entry {
    pub main: Revision,
    pub sub: u32,
    pub rec: Option<Record>,
}

impl Entry {
    /// The watch event this change produces (etcd's shape: a delete carries only the key and the
    /// revision of the delete).
    pub fn event(&self, key: &[u8]) -> WatchEvent {
        match &self.rec {
            Some(rec) => WatchEvent::Put(kv_of(key, self.main, rec, false)),
            None => WatchEvent::Delete(KeyValue {
                key: key.to_vec(),
                value: Vec::new(),
                create_revision: 0,
                mod_revision: self.main,
                version: 0,
                lease: 0,
            }),
        }
    }
}

fn kv_of(key: &[u8], mod_revision: Revision, rec: &Record, keys_only: bool) -> KeyValue {
    KeyValue {
        key: key.to_vec(),
        value: if keys_only { Vec::new() } else { rec.value.clone() },
        create_revision: rec.create_revision,
        mod_revision,
        version: rec.version,
        lease: rec.lease,
    }
}

/// A granted lease. Its keys are in [`Mvcc`]'s `lease_keys` (and the backing), not here: a lease
/// may hold many keys, which a file store must not keep in memory.
#[derive(Clone, Debug)]
pub(crate) struct LeaseState {
    pub ttl: i64,
    pub deadline: Instant,
}

/// The state of a backed [`Mvcc`] that is not in memory (the file store's redb file). Reads
/// only: the state machine changes its overlay, and the owner of the backing writes the overlay
/// back ([`Mvcc::take_flush`]) and makes the backing show it.
///
/// Reads cannot fail here: a backing that meets an error (a damaged page, an I/O error) answers
/// as if the data were absent and keeps the error for its owner, which fails the operation and
/// stops the store before anything built on the missing data is written or answered (see
/// `Core::commit`). That keeps the error paths out of the semantics.
pub(crate) trait Backing: Send + Sync + std::fmt::Debug {
    /// The whole history of `key`, in `(main, sub)` order; empty if it has none.
    fn history(&self, key: &[u8]) -> Vec<Entry>;
    /// Keys `>= start` (and `< end` if given) that have history, in key order, with it.
    fn histories(
        &self,
        start: &[u8],
        end: Option<&[u8]>,
    ) -> Box<dyn Iterator<Item = (Vec<u8>, Vec<Entry>)> + '_>;
    /// The changes at revisions `from..=to`, in `(main, sub)` order, naming their key.
    fn log(
        &self,
        from: Revision,
        to: Revision,
    ) -> Box<dyn Iterator<Item = (Revision, u32, Vec<u8>)> + '_>;
    /// The keys attached to lease `id`, in key order.
    fn lease_keys(&self, id: LeaseId) -> Vec<Vec<u8>>;
}

/// What a backed [`Mvcc`] changed since the last flush, for its owner to write back.
#[derive(Debug, Default)]
pub(crate) struct Flush {
    /// Each touched key's whole new history; empty: the key has none left (remove it).
    pub keys: BTreeMap<Vec<u8>, Vec<Entry>>,
    /// New changes by revision (the index of watch replay and compaction).
    pub log: BTreeMap<Revision, Vec<(u32, Vec<u8>)>>,
    /// Lease attachments: `true` attached, `false` detached. Leases revoked since are absent
    /// (the owner drops every attachment of a lease in `Delta::leases_removed`).
    pub lease_keys: BTreeMap<(LeaseId, Vec<u8>), bool>,
}

/// Everything one operation changed, in order: what the file layer must write and what watchers
/// must be told.
#[derive(Clone, Debug, Default)]
pub(crate) struct Delta {
    /// New key changes, in revision order.
    pub entries: Vec<(Vec<u8>, Entry)>,
    /// Changes dropped by compaction, by `(main, sub)`.
    pub removed: Vec<(Revision, u32)>,
    /// Leases granted or renewed: `(id, ttl, deadline)`.
    pub leases_put: Vec<(LeaseId, i64, Instant)>,
    /// Leases revoked or expired.
    pub leases_removed: Vec<LeaseId>,
}

impl Delta {
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
            && self.removed.is_empty()
            && self.leases_put.is_empty()
            && self.leases_removed.is_empty()
    }

    /// The new changes as watch batches: one `(revision, events)` per revision, in order.
    pub fn event_batches(&self) -> Vec<(Revision, Vec<WatchEvent>)> {
        let mut out: Vec<(Revision, Vec<WatchEvent>)> = Vec::new();
        for (key, entry) in &self.entries {
            match out.last_mut() {
                Some((rev, events)) if *rev == entry.main => events.push(entry.event(key)),
                _ => out.push((entry.main, vec![entry.event(key)])),
            }
        }
        out
    }
}

/// The scalar state the file layer stores in its meta table.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Meta {
    pub revision: Revision,
    pub compact_revision: Revision,
    pub next_lease: LeaseId,
}

/// Which branch each txn of a txn tree takes, decided before any op runs (etcd's
/// `compareToPath`): `children` follow the nested txns of the taken branch, in order.
struct Path {
    ok: bool,
    children: Vec<Path>,
}

/// The state machine. See the module docs. `Clone` so that the model checker (`bench` feature,
/// `idalloc-model`) can branch a store state into its successors (a memory state: a clone of a
/// backed one shares the backing).
#[derive(Clone, Debug)]
pub(crate) struct Mvcc {
    rev: Revision,
    compact_rev: Revision,
    next_lease: LeaseId,
    /// Every key with any history left, with its changes in `(main, sub)` order. After
    /// compaction at `R`, a key keeps its newest change `<= R` (unless that is a delete) and all
    /// later ones, so reads at any revision `>= R` are exact. Backed: only the keys touched since
    /// the last flush, each with its whole history (an empty one: the key has none left).
    keys: BTreeMap<Vec<u8>, Vec<Entry>>,
    /// Which keys changed at each revision `>=` the compaction point, in sub-revision order: the
    /// index that makes watch replay cost proportional to the changes replayed. Backed: only
    /// the revisions written since the last flush (all later than the backing's).
    log: BTreeMap<Revision, Vec<(u32, Vec<u8>)>>,
    leases: BTreeMap<LeaseId, LeaseState>,
    /// Keys attached to each lease, by `(lease, key)`. Unbacked: only attachments (`true`).
    /// Backed: changes since the last flush, `false` marking a detachment.
    lease_keys: BTreeMap<(LeaseId, Vec<u8>), bool>,
    /// Leases by deadline, for expiry.
    expiry: BTreeSet<(Instant, LeaseId)>,
    delta: Delta,
    backing: Option<Arc<dyn Backing>>,
}

impl Default for Mvcc {
    fn default() -> Self {
        Mvcc::new()
    }
}

/// Changes made so far by the txn being applied.
struct WriteCtx {
    new_rev: Revision,
    sub: u32,
}

impl WriteCtx {
    /// The revision reads inside the txn see: the txn's own revision once it has written
    /// (etcd's `storeTxnWrite.Range`).
    fn read_rev(&self) -> Revision {
        if self.sub > 0 {
            self.new_rev
        } else {
            self.new_rev - 1
        }
    }
}

/// A key with its history, borrowed from the overlay or read from the backing.
type History<'a> = (Cow<'a, [u8]>, Cow<'a, [Entry]>);

/// The overlay's keys merged over the backing's, in key order: where both have a key the
/// overlay's history wins; a key whose history is empty (removed since the last flush) is
/// skipped.
struct Merge<'a, A: Iterator<Item = History<'a>>, B: Iterator<Item = History<'a>>> {
    overlay: Peekable<A>,
    backing: Peekable<B>,
}

impl<'a, A: Iterator<Item = History<'a>>, B: Iterator<Item = History<'a>>> Iterator
    for Merge<'a, A, B>
{
    type Item = History<'a>;

    fn next(&mut self) -> Option<History<'a>> {
        use std::cmp::Ordering;
        loop {
            let order = match (self.overlay.peek(), self.backing.peek()) {
                (None, None) => return None,
                (Some(_), None) => Ordering::Less,
                (None, Some(_)) => Ordering::Greater,
                (Some((a, _)), Some((b, _))) => a.as_ref().cmp(b.as_ref()),
            };
            let item = match order {
                Ordering::Less => self.overlay.next(),
                Ordering::Greater => self.backing.next(),
                Ordering::Equal => {
                    self.backing.next();
                    self.overlay.next()
                }
            }?;
            if !item.1.is_empty() {
                return Some(item);
            }
        }
    }
}

/// The history of `key` in the overlay `keys`, read from `backing` first if it is not there (a
/// free function so that callers can borrow the state machine's other fields meanwhile).
fn history_in<'a>(
    keys: &'a mut BTreeMap<Vec<u8>, Vec<Entry>>,
    backing: &Option<Arc<dyn Backing>>,
    key: &[u8],
) -> &'a mut Vec<Entry> {
    match keys.entry(key.to_vec()) {
        std::collections::btree_map::Entry::Occupied(o) => o.into_mut(),
        std::collections::btree_map::Entry::Vacant(v) => {
            v.insert(backing.as_ref().map(|b| b.history(key)).unwrap_or_default())
        }
    }
}

/// The entry live at revision `at` of one history, as `(mod revision, record)`.
fn live_in(entries: Cow<'_, [Entry]>, at: Revision) -> Option<(Revision, Cow<'_, Record>)> {
    let n = entries.partition_point(|e| e.main <= at).checked_sub(1)?;
    match entries {
        Cow::Borrowed(es) => {
            let e = es.get(n)?;
            e.rec.as_ref().map(|r| (e.main, Cow::Borrowed(r)))
        }
        Cow::Owned(mut es) => {
            if n >= es.len() {
                return None;
            }
            let e = es.swap_remove(n);
            e.rec.map(|r| (e.main, Cow::Owned(r)))
        }
    }
}

impl Mvcc {
    /// An empty store at revision 1, all in memory.
    pub fn new() -> Self {
        Mvcc::restore(Meta {
            revision: INITIAL_REVISION,
            compact_revision: NEVER_COMPACTED,
            next_lease: 1,
        })
    }

    /// An empty in-memory state machine with the given scalars, to be filled with
    /// [`Mvcc::load_entry`] and [`Mvcc::load_lease`] and finished with [`Mvcc::finish_load`].
    pub fn restore(meta: Meta) -> Self {
        Mvcc {
            rev: meta.revision,
            compact_rev: meta.compact_revision,
            next_lease: meta.next_lease,
            keys: BTreeMap::new(),
            log: BTreeMap::new(),
            leases: BTreeMap::new(),
            lease_keys: BTreeMap::new(),
            expiry: BTreeSet::new(),
            delta: Delta::default(),
            backing: None,
        }
    }

    /// A state machine whose keys, history and lease attachments are in `backing`, with the
    /// given scalars; its leases are added with [`Mvcc::load_lease`].
    pub fn backed(meta: Meta, backing: Arc<dyn Backing>) -> Self {
        Mvcc { backing: Some(backing), ..Mvcc::restore(meta) }
    }

    /// Adds one stored change (unbacked only). Changes must come in `(main, sub)` order.
    pub fn load_entry(&mut self, key: Vec<u8>, entry: Entry) {
        if entry.main >= self.compact_rev {
            self.log.entry(entry.main).or_default().push((entry.sub, key.clone()));
        }
        self.keys.entry(key).or_default().push(entry);
    }

    /// Adds one stored lease.
    pub fn load_lease(&mut self, id: LeaseId, ttl: i64, deadline: Instant) {
        self.leases.insert(id, LeaseState { ttl, deadline });
        self.expiry.insert((deadline, id));
    }

    /// Attaches live keys to their leases once everything is loaded (unbacked only). Returns the
    /// keys whose lease is missing (they stay, unattached; etcd only warns in that case too).
    pub fn finish_load(&mut self) -> Vec<Vec<u8>> {
        let mut orphans = Vec::new();
        for (key, entries) in &self.keys {
            if let Some(Entry { rec: Some(rec), .. }) = entries.last() {
                if rec.lease != 0 {
                    if self.leases.contains_key(&rec.lease) {
                        self.lease_keys.insert((rec.lease, key.clone()), true);
                    } else {
                        orphans.push(key.clone());
                    }
                }
            }
        }
        orphans
    }

    pub fn revision(&self) -> Revision {
        self.rev
    }

    pub fn compact_revision(&self) -> Revision {
        self.compact_rev
    }

    pub fn meta(&self) -> Meta {
        Meta { revision: self.rev, compact_revision: self.compact_rev, next_lease: self.next_lease }
    }

    /// Hands over the changes made since the last call.
    pub fn take_delta(&mut self) -> Delta {
        std::mem::take(&mut self.delta)
    }

    /// Hands over the overlay of a backed state machine, to be written to the backing: from now
    /// on reads see the backing for everything (the caller writes the flush there first).
    pub fn take_flush(&mut self) -> Flush {
        Flush {
            keys: std::mem::take(&mut self.keys),
            log: std::mem::take(&mut self.log),
            lease_keys: std::mem::take(&mut self.lease_keys),
        }
    }

    // ----- reads -----

    /// Live keys of `range` as of revision `at`, in key order, with their mod revision.
    fn live_at<'a>(
        &'a self,
        range: &'a KeyRange,
        at: Revision,
    ) -> impl Iterator<Item = (Cow<'a, [u8]>, Revision, Cow<'a, Record>)> + 'a {
        self.histories(range).filter_map(move |(key, entries)| {
            let (mod_rev, rec) = live_in(entries, at)?;
            Some((key, mod_rev, rec))
        })
    }

    /// Keys of `range` that have any history, in key order.
    fn histories<'a>(&'a self, range: &'a KeyRange) -> Box<dyn Iterator<Item = History<'a>> + 'a> {
        if range.is_single() {
            let h = self.history_of(&range.key);
            if h.is_empty() {
                return Box::new(std::iter::empty());
            }
            return Box::new(std::iter::once((Cow::Borrowed(range.key.as_slice()), h)));
        }
        let start = Bound::Included(range.key.clone());
        let end = if range.range_end == [0] {
            None
        } else if range.range_end <= range.key {
            // An inverted or empty range matches nothing (and BTreeMap::range would panic).
            return Box::new(std::iter::empty());
        } else {
            Some(range.range_end.as_slice())
        };
        let upper = end.map_or(Bound::Unbounded, |e| Bound::Excluded(e.to_vec()));
        let overlay = self
            .keys
            .range((start, upper))
            .map(|(k, es)| (Cow::Borrowed(k.as_slice()), Cow::Borrowed(es.as_slice())));
        match &self.backing {
            None => Box::new(overlay),
            Some(b) => Box::new(Merge {
                overlay: overlay.peekable(),
                backing: b
                    .histories(&range.key, end)
                    .map(|(k, es)| (Cow::Owned(k), Cow::Owned(es)))
                    .peekable(),
            }),
        }
    }

    /// The whole history of `key` (empty if none).
    fn history_of(&self, key: &[u8]) -> Cow<'_, [Entry]> {
        match (self.keys.get(key), &self.backing) {
            (Some(es), _) => Cow::Borrowed(es.as_slice()),
            (None, Some(b)) => Cow::Owned(b.history(key)),
            (None, None) => Cow::Borrowed(&[]),
        }
    }

    /// `(create revision, version, lease)` of the newest record of `key`, if it is live.
    fn current(&self, key: &[u8]) -> Option<(Revision, i64, LeaseId)> {
        let h = self.history_of(key);
        let rec = h.last()?.rec.as_ref()?;
        Some((rec.create_revision, rec.version, rec.lease))
    }

    /// The history of `key` in the overlay, read from the backing first if it is not there.
    fn history_mut(&mut self, key: &[u8]) -> &mut Vec<Entry> {
        history_in(&mut self.keys, &self.backing, key)
    }

    /// A read of `req` where the latest revision is `cur_rev` (etcd's `rangeKeys` + `Range`).
    fn range(&self, req: &GetRequest, cur_rev: Revision) -> StoreResult<GetResponse> {
        if req.revision > cur_rev {
            return Err(StoreError::FutureRevision { requested: req.revision, current: cur_rev });
        }
        let at = if req.revision <= 0 { cur_rev } else { req.revision };
        if at < self.compact_rev {
            return Err(StoreError::Compacted {
                requested: at,
                compact_revision: self.compact_rev,
            });
        }
        let mut resp = GetResponse { revision: cur_rev, ..Default::default() };
        let limit = usize::try_from(req.limit).unwrap_or(0);
        if req.newest_first && !req.count_only {
            return Ok(self.newest_first(req, at, limit, resp));
        }
        for (key, mod_rev, rec) in self.live_at(&req.range, at) {
            resp.count += 1;
            if req.count_only {
                continue;
            }
            if limit > 0 && resp.kvs.len() == limit {
                resp.more = true;
                if req.loose_count {
                    // The caller needs only `more`: the rest of the range is not walked.
                    break;
                }
                continue;
            }
            resp.kvs.push(kv_of(&key, mod_rev, &rec, req.keys_only));
        }
        Ok(resp)
    }

    /// A read ordered by mod revision, newest first (ties by key, as etcd's sort is stable over
    /// a key-ordered range): the `limit` newest records are kept as the range is walked, so a
    /// limit of 1 holds one record, not the range.
    fn newest_first(
        &self,
        req: &GetRequest,
        at: Revision,
        limit: usize,
        mut resp: GetResponse,
    ) -> GetResponse {
        // Min-heap on (mod revision, reversed walk order): its top is the record to drop first.
        let mut kept: BinaryHeap<Reverse<(Revision, Reverse<u64>)>> = BinaryHeap::new();
        let mut records: HashMap<u64, KeyValue> = HashMap::new();
        for (n, (key, mod_rev, rec)) in (0u64..).zip(self.live_at(&req.range, at)) {
            resp.count += 1;
            let entry = Reverse((mod_rev, Reverse(n)));
            if limit > 0 && kept.len() == limit {
                match kept.peek() {
                    Some(top) if entry < *top => {
                        if let Some(Reverse((_, Reverse(gone)))) = kept.pop() {
                            records.remove(&gone);
                        }
                    }
                    _ => continue,
                }
            }
            kept.push(entry);
            records.insert(n, kv_of(&key, mod_rev, &rec, req.keys_only));
        }
        resp.more = limit > 0 && resp.count > limit as i64;
        let mut order: Vec<(Revision, Reverse<u64>)> =
            kept.into_iter().map(|Reverse(e)| e).collect();
        order.sort_unstable_by(|a, b| b.cmp(a));
        resp.kvs = order.into_iter().filter_map(|(_, Reverse(n))| records.remove(&n)).collect();
        resp
    }

    /// A standalone read.
    pub fn get(&self, req: &GetRequest) -> StoreResult<GetResponse> {
        check_range_key(&req.range, "get")?;
        self.range(req, self.rev)
    }

    /// The events of `range` at revisions `>= start`, one batch per revision.
    pub fn history(&self, range: &KeyRange, start: Revision) -> Vec<(Revision, Vec<WatchEvent>)> {
        let mut out: Vec<(Revision, Vec<WatchEvent>)> = Vec::new();
        let mut add = |main: Revision, sub: u32, key: &[u8]| {
            if !range.contains(key) {
                return;
            }
            let entries = self.history_of(key);
            let Ok(i) = entries.binary_search_by(|e| (e.main, e.sub).cmp(&(main, sub))) else {
                return;
            };
            let event = entries[i].event(key);
            match out.last_mut() {
                Some((rev, events)) if *rev == main => events.push(event),
                _ => out.push((main, vec![event])),
            }
        };
        if let Some(b) = &self.backing {
            // The backing's log holds the revisions before the overlay's first.
            let to = self.log.keys().next().map_or(self.rev, |r| r - 1);
            for (main, sub, key) in b.log(start.max(self.compact_rev), to) {
                add(main, sub, &key);
            }
        }
        for (&main, changes) in self.log.range(start..) {
            for (sub, key) in changes {
                add(main, *sub, key);
            }
        }
        out
    }

    // ----- txn -----

    /// Applies a txn atomically (etcd's `applierV3backend.Txn`): validate, decide every branch
    /// against the pre-txn state, check the leases and read revisions of the taken path, then
    /// apply. All writes share one new revision; a txn that changes nothing keeps the revision.
    pub fn txn(&mut self, req: &TxnRequest) -> StoreResult<TxnResponse> {
        validate_txn(req)?;
        let path = self.compare_to_path(req);
        self.check_puts(req, &path)?;
        self.check_ranges(req, &path)?;
        let mut w = WriteCtx { new_rev: self.rev + 1, sub: 0 };
        let mut resp = self.apply_txn(req, &path, &mut w);
        if w.sub > 0 {
            self.rev = w.new_rev;
        }
        set_revision(&mut resp, self.rev);
        Ok(resp)
    }

    /// Whether `req` would write (a put or delete on the branches its compares take now): what a
    /// read-only store refuses. A txn that only reads is served.
    pub fn txn_writes(&self, req: &TxnRequest) -> bool {
        fn writes(req: &TxnRequest, path: &Path) -> bool {
            let mut children = path.children.iter();
            Mvcc::taken(req, path).iter().any(|op| match op {
                TxnOp::Put(_) | TxnOp::Delete(_) => true,
                TxnOp::Get(_) => false,
                TxnOp::Txn(t) => children.next().is_some_and(|child| writes(t, child)),
            })
        }
        writes(req, &self.compare_to_path(req))
    }

    fn compare_to_path(&self, req: &TxnRequest) -> Path {
        let ok = req.compare.iter().all(|c| self.compare(c));
        let ops = if ok { &req.success } else { &req.failure };
        let children = ops
            .iter()
            .filter_map(|op| match op {
                TxnOp::Txn(t) => Some(self.compare_to_path(t)),
                _ => None,
            })
            .collect();
        Path { ok, children }
    }

    /// etcd's `applyCompare`: every live key of the range must satisfy the compare; an empty range
    /// compares as one zero record, except that a value compare on it is false.
    fn compare(&self, c: &Compare) -> bool {
        let mut any = false;
        for (_, mod_rev, rec) in self.live_at(&c.range, self.rev) {
            any = true;
            if !compare_record(c, Some((mod_rev, &rec))) {
                return false;
            }
        }
        any || compare_record(c, None)
    }

    fn taken<'a>(req: &'a TxnRequest, path: &Path) -> &'a [TxnOp] {
        if path.ok {
            &req.success
        } else {
            &req.failure
        }
    }

    /// Every put on the taken path must name an existing lease (etcd's `checkRequestPut`).
    fn check_puts(&self, req: &TxnRequest, path: &Path) -> StoreResult<()> {
        let mut children = path.children.iter();
        for op in Self::taken(req, path) {
            match op {
                TxnOp::Put(p) if p.lease != 0 && !self.leases.contains_key(&p.lease) => {
                    return Err(StoreError::LeaseNotFound(p.lease));
                }
                TxnOp::Txn(t) => {
                    if let Some(child) = children.next() {
                        self.check_puts(t, child)?;
                    }
                }
                _ => {}
            }
        }
        Ok(())
    }

    /// Every read on the taken path must name an available revision (etcd's
    /// `checkRequestRange`, against the pre-txn revision).
    fn check_ranges(&self, req: &TxnRequest, path: &Path) -> StoreResult<()> {
        let mut children = path.children.iter();
        for op in Self::taken(req, path) {
            match op {
                TxnOp::Get(g) if g.revision != 0 => {
                    if g.revision > self.rev {
                        return Err(StoreError::FutureRevision {
                            requested: g.revision,
                            current: self.rev,
                        });
                    }
                    if g.revision < self.compact_rev {
                        return Err(StoreError::Compacted {
                            requested: g.revision,
                            compact_revision: self.compact_rev,
                        });
                    }
                }
                TxnOp::Txn(t) => {
                    if let Some(child) = children.next() {
                        self.check_ranges(t, child)?;
                    }
                }
                _ => {}
            }
        }
        Ok(())
    }

    fn apply_txn(&mut self, req: &TxnRequest, path: &Path, w: &mut WriteCtx) -> TxnResponse {
        let mut children = path.children.iter();
        let mut responses = Vec::new();
        for op in Self::taken(req, path) {
            let resp = match op {
                TxnOp::Get(g) => {
                    // Cannot fail: the revision was checked and nothing compacts mid-txn.
                    OpResponse::Get(self.range(g, w.read_rev()).unwrap_or_default())
                }
                TxnOp::Put(p) => {
                    self.put(&p.key, &p.value, p.lease, w);
                    OpResponse::Put
                }
                TxnOp::Delete(range) => OpResponse::Delete { deleted: self.delete(range, w) },
                TxnOp::Txn(t) => match children.next() {
                    Some(child) => OpResponse::Txn(self.apply_txn(t, child, w)),
                    None => OpResponse::Txn(TxnResponse::default()),
                },
            };
            responses.push(resp);
        }
        TxnResponse { succeeded: path.ok, responses, revision: 0 }
    }

    fn record_change(&mut self, key: &[u8], rec: Option<Record>, w: &mut WriteCtx) {
        let entry = Entry { main: w.new_rev, sub: w.sub, rec };
        w.sub += 1;
        self.log.entry(entry.main).or_default().push((entry.sub, key.to_vec()));
        self.history_mut(key).push(entry.clone());
        self.delta.entries.push((key.to_vec(), entry));
    }

    fn attach(&mut self, key: &[u8], lease: LeaseId) {
        if lease != 0 && self.leases.contains_key(&lease) {
            self.lease_keys.insert((lease, key.to_vec()), true);
        }
    }

    fn detach(&mut self, key: &[u8], lease: LeaseId) {
        if lease != 0 && self.leases.contains_key(&lease) {
            if self.backing.is_some() {
                self.lease_keys.insert((lease, key.to_vec()), false);
            } else {
                self.lease_keys.remove(&(lease, key.to_vec()));
            }
        }
    }

    /// The keys attached to lease `id`, in key order.
    fn keys_of(&self, id: LeaseId) -> Vec<Vec<u8>> {
        let overlay = self
            .lease_keys
            .range((id, Vec::new())..)
            .take_while(|((l, _), _)| *l == id)
            .map(|((_, k), attached)| (k.clone(), *attached));
        match &self.backing {
            None => overlay.map(|(k, _)| k).collect(),
            Some(b) => {
                let mut all: BTreeMap<Vec<u8>, bool> =
                    b.lease_keys(id).into_iter().map(|k| (k, true)).collect();
                all.extend(overlay);
                all.into_iter().filter_map(|(k, attached)| attached.then_some(k)).collect()
            }
        }
    }

    fn put(&mut self, key: &[u8], value: &[u8], lease: LeaseId, w: &mut WriteCtx) {
        let (create_revision, version, old_lease) = match self.current(key) {
            Some((create, version, lease)) => (create, version + 1, lease),
            None => (w.new_rev, 1, 0),
        };
        self.detach(key, old_lease);
        self.attach(key, lease);
        let rec = Record { value: value.to_vec(), create_revision, version, lease };
        self.record_change(key, Some(rec), w);
    }

    fn delete(&mut self, range: &KeyRange, w: &mut WriteCtx) -> i64 {
        let doomed: Vec<(Vec<u8>, LeaseId)> = self
            .live_at(range, w.read_rev())
            .map(|(key, _, rec)| (key.into_owned(), rec.lease))
            .collect();
        for (key, lease) in &doomed {
            self.detach(key, *lease);
            self.record_change(key, None, w);
        }
        doomed.len() as i64
    }

    /// Keys, log revisions and lease attachments held in memory (tests of what a file store
    /// keeps between operations).
    #[cfg(test)]
    pub fn overlay_len(&self) -> usize {
        self.keys.len() + self.log.len() + self.lease_keys.len()
    }

    /// Number of changes held (for tests of the compaction policy; unbacked).
    #[cfg(test)]
    pub fn history_len(&self) -> usize {
        self.keys.values().map(Vec::len).sum()
    }
}

/// etcd's `compareKV` on one record (`None`: the zero record of an empty range or missing key).
fn compare_record(c: &Compare, rec: Option<(Revision, &Record)>) -> bool {
    use std::cmp::Ordering;
    let ord: Ordering = match (&c.target, rec) {
        // A value compare never holds on a missing key or an empty range.
        (CompareTarget::Value(_), None) => return false,
        (CompareTarget::Value(v), Some((_, r))) => r.value.as_slice().cmp(v.as_slice()),
        (CompareTarget::CreateRevision(t), r) => r.map_or(0, |(_, r)| r.create_revision).cmp(t),
        (CompareTarget::ModRevision(t), r) => r.map_or(0, |(m, _)| m).cmp(t),
        (CompareTarget::Version(t), r) => r.map_or(0, |(_, r)| r.version).cmp(t),
        (CompareTarget::Lease(t), r) => r.map_or(0, |(_, r)| r.lease).cmp(t),
    };
    match c.op {
        CompareOp::Equal => ord == Ordering::Equal,
        CompareOp::NotEqual => ord != Ordering::Equal,
        CompareOp::Less => ord == Ordering::Less,
        CompareOp::Greater => ord == Ordering::Greater,
    }
}

/// Sets a txn response's revision and, as the trait documents, every nested txn response's too
/// (etcd leaves nested headers empty; the etcd store fills them the same way).
fn set_revision(resp: &mut TxnResponse, rev: Revision) {
    resp.revision = rev;
    for r in &mut resp.responses {
        if let OpResponse::Txn(t) = r {
            set_revision(t, rev);
        }
    }
}

#[cfg(test)]
mod tests;
