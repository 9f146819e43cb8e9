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
//! One file (about 1000 lines of code, the rest its tests) because etcd's MVCC semantics are one
//! invariant set: revisions, versions, compaction, leases and txn validation all update the same
//! maps together, as in etcd's `mvcc/kvstore_txn.go`; split, each part would need the others'
//! internals.

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
    MAX_REQUEST_BYTES, MAX_TXN_OPS,
};

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

    // ----- leases -----

    /// Grants a lease. As etcd, a TTL below `min_ttl` (etcd's minimum, from its election timeout)
    /// is raised to it; above [`MAX_LEASE_TTL`] is refused.
    pub fn lease_grant(&mut self, ttl: i64, min_ttl: i64, now: Instant) -> StoreResult<Lease> {
        if ttl > MAX_LEASE_TTL {
            return Err(StoreError::InvalidRequest(format!(
                "lease TTL {ttl} s is too large (at most {MAX_LEASE_TTL} s)"
            )));
        }
        let ttl = ttl.max(min_ttl).max(1);
        let id = self.next_lease;
        self.next_lease += 1;
        let deadline = deadline_after(now, ttl);
        self.leases.insert(id, LeaseState { ttl, deadline });
        self.expiry.insert((deadline, id));
        self.delta.leases_put.push((id, ttl, deadline));
        Ok(Lease { id, ttl })
    }

    /// Renews a lease for its full TTL; `None` if it does not exist.
    pub fn lease_keep_alive(&mut self, id: LeaseId, now: Instant) -> Option<i64> {
        let lease = self.leases.get_mut(&id)?;
        self.expiry.remove(&(lease.deadline, id));
        lease.deadline = deadline_after(now, lease.ttl);
        self.expiry.insert((lease.deadline, id));
        self.delta.leases_put.push((id, lease.ttl, lease.deadline));
        Some(lease.ttl)
    }

    /// Revokes a lease, deleting its keys (sorted, as etcd's lessor does) in one revision. False
    /// if the lease does not exist.
    pub fn lease_revoke(&mut self, id: LeaseId) -> bool {
        if !self.leases.contains_key(&id) {
            return false;
        }
        let keys = self.keys_of(id);
        let Some(lease) = self.leases.remove(&id) else {
            return false;
        };
        self.expiry.remove(&(lease.deadline, id));
        self.delta.leases_removed.push(id);
        // Its attachments go from the overlay; backed, the owner drops the lease's rows.
        let attached: Vec<(LeaseId, Vec<u8>)> = self
            .lease_keys
            .range((id, Vec::new())..)
            .take_while(|((l, _), _)| *l == id)
            .map(|(k, _)| k.clone())
            .collect();
        for k in attached {
            self.lease_keys.remove(&k);
        }
        let mut w = WriteCtx { new_rev: self.rev + 1, sub: 0 };
        for key in &keys {
            if self.current(key).is_some() {
                self.record_change(key, None, &mut w);
            }
        }
        if w.sub > 0 {
            self.rev = w.new_rev;
        }
        true
    }

    /// Revokes every lease whose deadline is `<= now`, each in its own revision (as etcd revokes
    /// each expired lease with its own request). Returns how many expired.
    pub fn expire_leases(&mut self, now: Instant) -> usize {
        let mut n = 0;
        while let Some(&(deadline, id)) = self.expiry.first() {
            if deadline > now {
                break;
            }
            self.lease_revoke(id);
            n += 1;
        }
        n
    }

    /// The earliest lease deadline, if any lease exists.
    pub fn next_deadline(&self) -> Option<Instant> {
        self.expiry.first().map(|(d, _)| *d)
    }

    // ----- compaction -----

    /// etcd's `Compact`: a revision at or below the compaction point is `Compacted`, one above
    /// the current revision is `FutureRevision`.
    pub fn compact(&mut self, rev: Revision) -> StoreResult<()> {
        if rev <= self.compact_rev {
            return Err(StoreError::Compacted {
                requested: rev,
                compact_revision: self.compact_rev,
            });
        }
        if rev > self.rev {
            return Err(StoreError::FutureRevision { requested: rev, current: self.rev });
        }
        self.compact_to(rev);
        Ok(())
    }

    /// Automatic compaction: keeps at least the last `keep` revisions and compacts in batches
    /// of `keep / 8` (at least 1) so that the cost is amortised. `keep <= 0` disables it.
    pub fn auto_compact(&mut self, keep: i64) {
        if keep <= 0 {
            return;
        }
        let target = self.rev - keep;
        let batch = (keep / 8).max(1);
        if target >= 1 && target - self.compact_rev.max(0) >= batch {
            self.compact_to(target);
        }
    }

    /// Drops history before `rev`: per key, every change `<= rev` except the newest one, and that
    /// one too if it is a delete (etcd's `keyIndex.compact`). Only keys that changed since the
    /// previous compaction can have anything to drop, and the log names them. Backed, the log
    /// rows before `rev` are dropped from the backing by its owner (they are below the new
    /// compaction point it writes).
    fn compact_to(&mut self, rev: Revision) {
        let mut touched: BTreeSet<Vec<u8>> = self
            .log
            .range(..=rev)
            .flat_map(|(_, changes)| changes.iter().map(|(_, k)| k.clone()))
            .collect();
        if let Some(b) = &self.backing {
            touched.extend(b.log(self.compact_rev, rev).map(|(_, _, k)| k));
        }
        let backed = self.backing.is_some();
        for key in touched {
            let entries = if backed {
                history_in(&mut self.keys, &self.backing, &key)
            } else {
                match self.keys.get_mut(&key) {
                    Some(entries) => entries,
                    None => continue,
                }
            };
            let n = entries.partition_point(|e| e.main <= rev);
            let drop = match entries.get(n.wrapping_sub(1)) {
                Some(e) if e.rec.is_some() => n - 1,
                Some(_) => n,
                None => 0,
            };
            self.delta.removed.extend(entries.drain(..drop).map(|e| (e.main, e.sub)));
            // Backed, an emptied history stays as the mark that tells the owner to remove it.
            if entries.is_empty() && !backed {
                self.keys.remove(&key);
            }
        }
        // Keep the log at `rev` itself: a watch may start exactly at the compaction point.
        self.log = self.log.split_off(&rev);
        self.compact_rev = rev;
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

/// `now + ttl` seconds, saturating far in the future instead of overflowing the clock.
pub(crate) fn deadline_after(now: Instant, ttl_secs: i64) -> Instant {
    let secs = u64::try_from(ttl_secs).unwrap_or(0);
    now.checked_add(Duration::from_secs(secs))
        .or_else(|| now.checked_add(Duration::from_secs(100 * 365 * 24 * 3600)))
        .unwrap_or(now)
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

// ----- validation (etcd's v3rpc checks, before the request reaches the state machine) -----

fn show(key: &[u8]) -> String {
    format!("{:?}", String::from_utf8_lossy(key))
}

/// An empty key is refused (etcd: "key is not provided"). As an exception, a range with an empty
/// start and a non-empty end is accepted and means "from the first key": etcd clients send that
/// as `"\0"`, and no key is empty, so the meaning is the same.
pub(crate) fn check_range_key(range: &KeyRange, what: &str) -> StoreResult<()> {
    if range.key.is_empty() && range.range_end.is_empty() {
        return Err(StoreError::InvalidRequest(format!(
            "{what}: key is empty (keys must be non-empty)"
        )));
    }
    Ok(())
}

/// etcd's `checkTxnRequest` + `checkIntervals` + the request size limit.
pub(crate) fn validate_txn(req: &TxnRequest) -> StoreResult<()> {
    check_txn_request(req)?;
    check_intervals(&req.success)?;
    check_intervals(&req.failure)?;
    let size = txn_size(req);
    if size > MAX_REQUEST_BYTES {
        return Err(StoreError::InvalidRequest(format!(
            "txn request is too large: about {size} bytes (at most {MAX_REQUEST_BYTES})"
        )));
    }
    Ok(())
}

fn check_txn_request(req: &TxnRequest) -> StoreResult<()> {
    let opc = req.compare.len().max(req.success.len()).max(req.failure.len());
    if opc > MAX_TXN_OPS {
        return Err(StoreError::InvalidRequest(format!(
            "too many operations in txn request: {opc} (at most {MAX_TXN_OPS} compares and \
             {MAX_TXN_OPS} ops per branch)"
        )));
    }
    for op in req.success.iter().chain(&req.failure) {
        match op {
            TxnOp::Get(g) => check_range_key(&g.range, "get")?,
            TxnOp::Put(p) => {
                if p.key.is_empty() {
                    return Err(StoreError::InvalidRequest(
                        "put: key is empty (keys must be non-empty)".into(),
                    ));
                }
            }
            TxnOp::Delete(r) => check_range_key(r, "delete")?,
            TxnOp::Txn(t) => check_txn_request(t)?,
        }
    }
    Ok(())
}

fn duplicate(key: &[u8]) -> StoreError {
    StoreError::InvalidRequest(format!(
        "duplicate key given in txn request: {} is written twice (put twice, or put and deleted)",
        show(key)
    ))
}

/// etcd's `checkIntervals`, rule for rule (including its quirk that a put in one nested txn and a
/// delete of the same key in a *later* sibling nested txn pass). One difference: etcd builds a
/// broken interval for a delete "to the end of the keyspace" (`range_end == [0]`) and so misses
/// puts it covers; here such a delete covers every key `>= key`, so the overlap is refused.
fn check_intervals(ops: &[TxnOp]) -> StoreResult<(BTreeSet<Vec<u8>>, Vec<KeyRange>)> {
    let mut dels: Vec<KeyRange> = ops
        .iter()
        .filter_map(|op| if let TxnOp::Delete(r) = op { Some(r.clone()) } else { None })
        .collect();
    let covered = |dels: &[KeyRange], k: &[u8]| dels.iter().any(|r| r.contains(k));
    let mut puts: BTreeSet<Vec<u8>> = BTreeSet::new();
    for op in ops {
        let TxnOp::Txn(t) = op else { continue };
        let (puts_then, dels_then) = check_intervals(&t.success)?;
        let (puts_else, dels_else) = check_intervals(&t.failure)?;
        for k in &puts_then {
            if puts.contains(k) || covered(&dels, k) {
                return Err(duplicate(k));
            }
            puts.insert(k.clone());
        }
        for k in &puts_else {
            // A key in both branches of one nested txn is fine: only one branch runs.
            if (puts.contains(k) && !puts_then.contains(k)) || covered(&dels, k) {
                return Err(duplicate(k));
            }
            puts.insert(k.clone());
        }
        dels.extend(dels_then);
        dels.extend(dels_else);
    }
    for op in ops {
        let TxnOp::Put(p) = op else { continue };
        if puts.contains(&p.key) || covered(&dels, &p.key) {
            return Err(duplicate(&p.key));
        }
        puts.insert(p.key.clone());
    }
    Ok((puts, dels))
}

/// An estimate of the protobuf size of a txn request (bytes plus a little framing per field), to
/// enforce etcd's `--max-request-bytes`.
pub(crate) fn txn_size(req: &TxnRequest) -> usize {
    let compares: usize = req
        .compare
        .iter()
        .map(|c| {
            let target = match &c.target {
                CompareTarget::Value(v) => v.len(),
                _ => 8,
            };
            c.range.key.len() + c.range.range_end.len() + target + 12
        })
        .sum();
    let ops: usize = req
        .success
        .iter()
        .chain(&req.failure)
        .map(|op| match op {
            TxnOp::Get(g) => g.range.key.len() + g.range.range_end.len() + 24,
            TxnOp::Put(p) => p.key.len() + p.value.len() + 16,
            TxnOp::Delete(r) => r.key.len() + r.range_end.len() + 8,
            TxnOp::Txn(t) => txn_size(t) + 4,
        })
        .sum();
    compares + ops
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
mod tests {
    use super::*;
    use crate::store::PutRequest;

    fn put(m: &mut Mvcc, k: &str, v: &str) -> TxnResponse {
        m.txn(&TxnRequest::new().and_then([TxnOp::put(k, v)])).expect("put")
    }

    fn get(m: &Mvcc, k: &str) -> Option<KeyValue> {
        m.get(&GetRequest::key(k)).expect("get").kvs.into_iter().next()
    }

    fn ok(m: &mut Mvcc, compare: Compare) -> bool {
        m.txn(&TxnRequest::new().when([compare])).expect("txn").succeeded
    }

    #[test]
    fn revisions_start_at_one_and_bump_once_per_writing_txn() {
        let mut m = Mvcc::new();
        assert_eq!(m.revision(), 1);
        assert_eq!(m.get(&GetRequest::key("a")).unwrap().revision, 1);
        let r = m
            .txn(&TxnRequest::new().and_then([TxnOp::put("a", "1"), TxnOp::put("b", "1")]))
            .unwrap();
        assert_eq!(r.revision, 2);
        let a = get(&m, "a").unwrap();
        assert_eq!((a.create_revision, a.mod_revision, a.version), (2, 2, 1));
        // Reads only: no bump.
        let r = m.txn(&TxnRequest::new().and_then([TxnOp::get_key("a")])).unwrap();
        assert_eq!(r.revision, 2);
        // A delete of nothing: no bump.
        let r = m.txn(&TxnRequest::new().and_then([TxnOp::delete("zzz")])).unwrap();
        assert_eq!(r.revision, 2);
        assert_eq!(r.responses, vec![OpResponse::Delete { deleted: 0 }]);
        // A put of the same value still bumps and raises the version.
        put(&mut m, "a", "1");
        let a = get(&m, "a").unwrap();
        assert_eq!((a.create_revision, a.mod_revision, a.version), (2, 3, 2));
        assert_eq!(m.revision(), 3);
    }

    #[test]
    fn version_and_create_revision_reset_after_delete() {
        let mut m = Mvcc::new();
        put(&mut m, "a", "1");
        put(&mut m, "a", "2");
        let r = m.txn(&TxnRequest::new().and_then([TxnOp::delete("a")])).unwrap();
        assert_eq!(r.revision, 4);
        assert_eq!(get(&m, "a"), None);
        put(&mut m, "a", "3");
        let a = get(&m, "a").unwrap();
        assert_eq!((a.create_revision, a.mod_revision, a.version), (5, 5, 1));
    }

    #[test]
    fn single_key_compares_treat_missing_key_as_zero_record() {
        let mut m = Mvcc::new();
        assert!(ok(&mut m, Compare::absent("a")));
        assert!(ok(&mut m, Compare::mod_revision_is("a", 0)));
        // A value compare on a missing key is false, even "not equal".
        assert!(!ok(&mut m, Compare::value_is("a", "")));
        assert!(!ok(
            &mut m,
            Compare::new(
                KeyRange::key("a"),
                CompareOp::NotEqual,
                CompareTarget::Value(b"x".to_vec())
            )
        ));
        put(&mut m, "a", "5");
        assert!(ok(&mut m, Compare::value_is("a", "5")));
        assert!(ok(
            &mut m,
            Compare::new(
                KeyRange::key("a"),
                CompareOp::Greater,
                CompareTarget::Value(b"4".to_vec())
            )
        ));
        assert!(ok(
            &mut m,
            Compare::new(KeyRange::key("a"), CompareOp::Less, CompareTarget::Version(2))
        ));
        assert!(ok(
            &mut m,
            Compare::new(KeyRange::key("a"), CompareOp::Equal, CompareTarget::Lease(0))
        ));
        assert!(!ok(&mut m, Compare::absent("a")));
    }

    #[test]
    fn range_compares_hold_for_every_key_and_empty_range_is_zero_record() {
        let mut m = Mvcc::new();
        let p = KeyRange::prefix("p/");
        assert!(ok(&mut m, Compare::range_empty(p.clone())));
        assert!(!ok(
            &mut m,
            Compare::new(p.clone(), CompareOp::NotEqual, CompareTarget::Value(b"x".to_vec()))
        ));
        put(&mut m, "p/a", "1"); // rev 2
        put(&mut m, "p/b", "2"); // rev 3
        put(&mut m, "p0", "outside"); // rev 4, outside the prefix
        assert!(!ok(&mut m, Compare::range_empty(p.clone())));
        // Every key: both have mod revision > 1, only one has > 2.
        assert!(ok(
            &mut m,
            Compare::new(p.clone(), CompareOp::Greater, CompareTarget::ModRevision(1))
        ));
        assert!(!ok(
            &mut m,
            Compare::new(p.clone(), CompareOp::Greater, CompareTarget::ModRevision(2))
        ));
        // The half-open range [p/a, p/b) holds only p/a.
        let r = KeyRange::range("p/a", "p/b");
        assert!(ok(&mut m, Compare::new(r, CompareOp::Equal, CompareTarget::Value(b"1".to_vec()))));
        // Deleted keys do not count.
        m.txn(&TxnRequest::new().and_then([TxnOp::delete_range(p.clone())])).unwrap();
        assert!(ok(&mut m, Compare::range_empty(p)));
    }

    #[test]
    fn nested_txn_compares_see_state_before_outer_txn() {
        let mut m = Mvcc::new();
        let req = TxnRequest::new().when([Compare::absent("a")]).and_then([
            TxnOp::put("a", "1"),
            TxnOp::Txn(
                TxnRequest::new()
                    .when([Compare::absent("a")])
                    .and_then([TxnOp::put("saw-absent", "yes")])
                    .or_else([TxnOp::put("saw-present", "yes")]),
            ),
            TxnOp::get_key("a"),
        ]);
        let r = m.txn(&req).unwrap();
        assert!(r.succeeded);
        assert!(get(&m, "saw-absent").is_some());
        assert!(get(&m, "saw-present").is_none());
        match &r.responses[1] {
            OpResponse::Txn(t) => {
                assert!(t.succeeded);
                assert_eq!(t.revision, r.revision, "a nested txn reports the outer revision");
            }
            other => panic!("expected nested txn response, got {other:?}"),
        }
        // A get after a put in the same txn sees the put, at the txn's revision.
        match &r.responses[2] {
            OpResponse::Get(g) => {
                assert_eq!(g.revision, 2);
                assert_eq!(g.kvs[0].value, b"1");
            }
            other => panic!("expected get response, got {other:?}"),
        }
        assert_eq!(r.revision, 2);
    }

    #[test]
    fn duplicate_keys_in_one_txn_are_rejected() {
        let mut m = Mvcc::new();
        let cases = vec![
            TxnRequest::new().and_then([TxnOp::put("a", "1"), TxnOp::put("a", "2")]),
            TxnRequest::new().and_then([TxnOp::put("a", "1"), TxnOp::delete("a")]),
            TxnRequest::new()
                .and_then([TxnOp::delete_range(KeyRange::prefix("a")), TxnOp::put("ab", "1")]),
            TxnRequest::new().and_then([
                TxnOp::put("a", "1"),
                TxnOp::Txn(TxnRequest::new().and_then([TxnOp::put("a", "2")])),
            ]),
            TxnRequest::new().and_then([
                TxnOp::delete("a"),
                TxnOp::Txn(TxnRequest::new().or_else([TxnOp::put("a", "2")])),
            ]),
            TxnRequest::new()
                .or_else([TxnOp::delete_range(KeyRange::from_key("a")), TxnOp::put("z", "1")]),
        ];
        for req in cases {
            match m.txn(&req) {
                Err(StoreError::InvalidRequest(msg)) => {
                    assert!(msg.contains("duplicate key"), "{msg}")
                }
                other => panic!("{req:?} should be rejected, got {other:?}"),
            }
        }
        assert_eq!(m.revision(), 1, "nothing applied");
        // Allowed: the same key in both branches of one nested txn; overlapping deletes.
        let fine = TxnRequest::new().and_then([
            TxnOp::Txn(
                TxnRequest::new().and_then([TxnOp::put("a", "1")]).or_else([TxnOp::put("a", "2")]),
            ),
            TxnOp::delete("b"),
            TxnOp::delete_range(KeyRange::prefix("b")),
        ]);
        assert!(m.txn(&fine).is_ok());
        // etcd's quirk: a put in one nested txn and a delete in a later sibling both apply.
        let quirk = TxnRequest::new().and_then([
            TxnOp::Txn(TxnRequest::new().and_then([TxnOp::put("z", "1")])),
            TxnOp::Txn(TxnRequest::new().and_then([TxnOp::delete("z")])),
        ]);
        let before = m.revision();
        let r = m.txn(&quirk).unwrap();
        assert_eq!(r.revision, before + 1);
        assert_eq!(get(&m, "z"), None);
        let hist = m.history(&KeyRange::key("z"), before + 1);
        assert_eq!(hist.len(), 1);
        assert_eq!(hist[0].1.len(), 2, "put then delete, one revision");
    }

    #[test]
    fn too_many_ops_too_large_and_empty_keys_are_rejected() {
        let mut m = Mvcc::new();
        let ops: Vec<TxnOp> = (0..129).map(|i| TxnOp::put(format!("k{i}"), "v")).collect();
        assert!(matches!(
            m.txn(&TxnRequest::new().and_then(ops)),
            Err(StoreError::InvalidRequest(_))
        ));
        let ops: Vec<TxnOp> = (0..128).map(|i| TxnOp::put(format!("k{i}"), "v")).collect();
        assert!(m.txn(&TxnRequest::new().and_then(ops)).is_ok());
        let compares: Vec<Compare> = (0..129).map(|i| Compare::absent(format!("c{i}"))).collect();
        assert!(matches!(
            m.txn(&TxnRequest::new().when(compares)),
            Err(StoreError::InvalidRequest(_))
        ));
        let nested = TxnRequest::new().and_then([TxnOp::Txn(
            TxnRequest::new().or_else((0..129).map(|i| TxnOp::get_key(format!("g{i}")))),
        )]);
        assert!(matches!(m.txn(&nested), Err(StoreError::InvalidRequest(_))));
        let big = TxnRequest::new().and_then([TxnOp::put("big", vec![0u8; MAX_REQUEST_BYTES + 1])]);
        assert!(
            matches!(m.txn(&big), Err(StoreError::InvalidRequest(m)) if m.contains("too large"))
        );
        assert!(matches!(
            m.txn(&TxnRequest::new().and_then([TxnOp::put("", "v")])),
            Err(StoreError::InvalidRequest(_))
        ));
        assert!(matches!(m.get(&GetRequest::key("")), Err(StoreError::InvalidRequest(_))));
        // An empty start with an end is "from the first key".
        assert_eq!(m.get(&GetRequest::new(KeyRange::from_key(""))).unwrap().count, 128);
        assert_eq!(m.revision(), 2);
    }

    #[test]
    fn put_on_missing_lease_fails_whole_txn_only_on_taken_branch() {
        let mut m = Mvcc::new();
        let req = TxnRequest::new().and_then([
            TxnOp::put("a", "1"),
            TxnOp::Put(PutRequest { key: b"b".to_vec(), value: b"1".to_vec(), lease: 77 }),
        ]);
        assert_eq!(m.txn(&req), Err(StoreError::LeaseNotFound(77)));
        assert_eq!(get(&m, "a"), None);
        assert_eq!(m.revision(), 1);
        // On the branch not taken, a bad lease does not matter.
        let req = TxnRequest::new()
            .when([Compare::absent("a")])
            .and_then([TxnOp::put("a", "1")])
            .or_else([TxnOp::put_on_lease("b", "1", 77)]);
        assert!(m.txn(&req).unwrap().succeeded);
    }

    #[test]
    fn get_limit_count_keys_only_and_revisions() {
        let mut m = Mvcc::new();
        for k in ["p/a", "p/b", "p/c"] {
            put(&mut m, k, "v"); // revs 2, 3, 4
        }
        let r = m.get(&GetRequest::prefix("p/").with_limit(2)).unwrap();
        assert_eq!((r.kvs.len(), r.count, r.more, r.revision), (2, 3, true, 4));
        // A loose count stops one key past the limit (the rest of the range is not walked).
        let r = m.get(&GetRequest::prefix("p/").with_limit(1).loose_count()).unwrap();
        assert_eq!((r.kvs.len(), r.count, r.more), (1, 2, true));
        let r = m.get(&GetRequest::prefix("p/").with_limit(5).loose_count()).unwrap();
        assert_eq!((r.kvs.len(), r.count, r.more), (3, 3, false), "exact when all fit");
        let r = m.get(&GetRequest::prefix("p/").count_only()).unwrap();
        assert_eq!((r.kvs.len(), r.count, r.more), (0, 3, false));
        let r = m.get(&GetRequest::prefix("p/").keys_only()).unwrap();
        assert!(r.kvs.iter().all(|kv| kv.value.is_empty()) && r.kvs.len() == 3);
        let r = m.get(&GetRequest::prefix("p/").at_revision(3)).unwrap();
        assert_eq!(r.count, 2);
        assert_eq!(r.revision, 4, "header revision is the current one");
        assert_eq!(
            m.get(&GetRequest::prefix("p/").at_revision(5)),
            Err(StoreError::FutureRevision { requested: 5, current: 4 })
        );
        m.compact(3).unwrap();
        assert_eq!(
            m.get(&GetRequest::prefix("p/").at_revision(2)),
            Err(StoreError::Compacted { requested: 2, compact_revision: 3 })
        );
        assert_eq!(m.get(&GetRequest::prefix("p/").at_revision(3)).unwrap().count, 2);
        // Inside a txn the checks fail the whole txn.
        let req = TxnRequest::new()
            .and_then([TxnOp::put("x", "1"), TxnOp::get(GetRequest::key("x").at_revision(2))]);
        assert!(matches!(m.txn(&req), Err(StoreError::Compacted { .. })));
        assert_eq!(get(&m, "x"), None);
    }

    #[test]
    fn compaction_follows_etcd_rules_and_keeps_reads_exact() {
        let mut m = Mvcc::new();
        assert_eq!(m.compact(2), Err(StoreError::FutureRevision { requested: 2, current: 1 }));
        m.compact(0).unwrap(); // as on a fresh etcd
        assert_eq!(m.compact(0), Err(StoreError::Compacted { requested: 0, compact_revision: 0 }));
        put(&mut m, "a", "1"); // 2
        put(&mut m, "a", "2"); // 3
        put(&mut m, "b", "1"); // 4
        m.txn(&TxnRequest::new().and_then([TxnOp::delete("b")])).unwrap(); // 5
        put(&mut m, "c", "1"); // 6
        m.take_delta();
        m.compact(5).unwrap();
        let removed = m.take_delta().removed;
        // a@2 superseded, b@4 superseded, b's delete@5 is the newest and a delete: all dropped.
        assert_eq!(removed.len(), 3, "{removed:?}");
        assert_eq!(m.history_len(), 2); // a@3, c@6
        let r = m.get(&GetRequest::new(KeyRange::from_key("a")).at_revision(5)).unwrap();
        assert_eq!(r.kvs.iter().map(|kv| kv.key.clone()).collect::<Vec<_>>(), vec![b"a".to_vec()]);
        assert_eq!(m.compact(5), Err(StoreError::Compacted { requested: 5, compact_revision: 5 }));
        // Watch history from the compaction point still sees later events.
        let h = m.history(&KeyRange::from_key("a"), 5);
        assert_eq!(h.iter().map(|(r, _)| *r).collect::<Vec<_>>(), vec![6]);
    }

    #[test]
    fn auto_compaction_bounds_history() {
        let mut m = Mvcc::new();
        for i in 0..1000 {
            put(&mut m, "k", &i.to_string());
            m.auto_compact(100);
        }
        let rev = m.revision();
        assert!(m.compact_revision() <= rev - 100, "keeps at least 100 revisions");
        assert!(m.compact_revision() >= rev - 100 - 13, "compacts in batches of keep/8");
        assert!(m.history_len() <= 114, "history is bounded: {}", m.history_len());
        assert!(m.get(&GetRequest::key("k").at_revision(rev - 100)).is_ok());
        m.auto_compact(0); // disabled: no change
    }

    #[test]
    fn leases_attach_expire_and_revoke_in_one_revision() {
        let mut m = Mvcc::new();
        let t0 = Instant::now();
        let l = m.lease_grant(1, 2, t0).unwrap();
        assert_eq!(l.ttl, 2, "raised to the minimum TTL as etcd does");
        assert_ne!(l.id, 0);
        let l2 = m.lease_grant(10, 2, t0).unwrap();
        assert_ne!(l.id, l2.id);
        m.txn(&TxnRequest::new().and_then([
            TxnOp::put_on_lease("a", "1", l.id),
            TxnOp::put_on_lease("b", "1", l.id),
            TxnOp::put_on_lease("c", "1", l2.id),
        ]))
        .unwrap(); // rev 2
                   // Moving a key to another lease detaches it from the first.
        m.txn(&TxnRequest::new().and_then([TxnOp::put_on_lease("b", "2", l2.id)])).unwrap(); // 3
        assert_eq!(get(&m, "a").unwrap().lease, l.id);
        assert_eq!(m.expire_leases(t0 + Duration::from_millis(1999)), 0);
        assert_eq!(m.lease_keep_alive(l.id, t0 + Duration::from_secs(1)), Some(2));
        assert_eq!(m.expire_leases(t0 + Duration::from_millis(2999)), 0);
        assert_eq!(m.expire_leases(t0 + Duration::from_secs(3)), 1);
        assert_eq!(m.revision(), 4, "one revision for the expiry");
        assert_eq!(get(&m, "a"), None);
        assert!(get(&m, "b").is_some(), "b moved to l2");
        assert_eq!(m.lease_keep_alive(l.id, t0 + Duration::from_secs(3)), None);
        assert!(m.lease_revoke(l2.id));
        assert_eq!(m.revision(), 5);
        assert_eq!(get(&m, "b"), None);
        assert_eq!(get(&m, "c"), None);
        assert!(!m.lease_revoke(l2.id));
        // A lease without keys revokes without a revision.
        let l3 = m.lease_grant(5, 2, t0).unwrap();
        assert!(m.lease_revoke(l3.id));
        assert_eq!(m.revision(), 5);
        assert!(matches!(
            m.lease_grant(MAX_LEASE_TTL + 1, 2, t0),
            Err(StoreError::InvalidRequest(_))
        ));
        let hist = m.history(&KeyRange::from_key("a"), 4);
        assert_eq!(hist[0].1.len(), 1);
        assert!(
            matches!(&hist[0].1[0], WatchEvent::Delete(kv) if kv.key == b"a" && kv.mod_revision == 4)
        );
    }

    #[test]
    fn delta_batches_events_per_revision() {
        let mut m = Mvcc::new();
        m.txn(&TxnRequest::new().and_then([TxnOp::put("a", "1"), TxnOp::put("b", "1")])).unwrap();
        m.txn(&TxnRequest::new().and_then([TxnOp::delete("a")])).unwrap();
        let batches = m.take_delta().event_batches();
        assert_eq!(batches.len(), 2);
        assert_eq!(batches[0].0, 2);
        assert_eq!(batches[0].1.len(), 2);
        assert!(
            matches!(&batches[1].1[0], WatchEvent::Delete(kv) if kv.mod_revision == 3 && kv.version == 0)
        );
        assert!(m.take_delta().is_empty());
    }
}
