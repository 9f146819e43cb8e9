//! The per-pool view of `id/` records that every node keeps (DESIGN §6), as plain state: the sync
//! task (`sync.rs`) feeds it store listings and watch events, and it answers `get`/`key_of` and
//! candidate picks without a round trip.
//!
//! Only the store's history (listings and watch events) changes the ID↔key maps, so the events
//! subscribers see are exactly the store's changes, once each. What a txn response teaches early
//! (an ID another node just took) only goes into the free-ID set, which is a hint: a wrong hint
//! costs one more round trip, never correctness, because every bind is guarded by its compares.

use std::collections::HashMap;

/// Tombstones are few; a plain map (foldhash, as in `Bindings`) holds them.
type FastMap<K, V> = HashMap<K, V, foldhash::fast::RandomState>;

use crate::bindings::Bindings;
use crate::idset::IdSet;
use crate::layout::IdRecord;
use crate::pool::PoolSpec;
use crate::store::{KeyValue, Revision, WatchEvent};

/// What subscribers of a pool see (DESIGN §6). More kinds may be added: a `match` needs a
/// wildcard arm.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Event {
    /// `key` is bound to `id` (new, or seen for the first time after a re-list).
    Upsert { id: u64, key: String },
    /// The binding of `key` to `id` is gone (reclaimed, tombstoned or deleted).
    Delete { id: u64, key: String },
    /// The cache holds the whole pool as of a store revision (after the first listing and after
    /// every re-list).
    Synced,
    /// A key this process held lost its ID (only after store data loss, DESIGN §7): it is now
    /// bound to `new_id`.
    Conflict { key: String, old_id: u64, new_id: u64 },
    /// This subscriber fell behind and `missed` messages were dropped for it (a message is one
    /// change, the changes of one watch response, or all the changes of one listing); re-read
    /// `Pool::snapshot()` to catch up. Allocation never waits for a slow subscriber.
    Lagged { missed: u64 },
    /// The pool's spec changed (a resize: new range or reserved IDs; docs/design/resize.md):
    /// this is the spec now in force. Only changes are sent, not the spec a subscription starts
    /// with (`Pool::spec`).
    Spec(PoolSpec),
}

/// What the event channels carry: the events of one change, or all the events of one listing, in
/// order. A listing goes as one message, so a subscriber's buffer (`event_buffer` messages) counts
/// changes and listings, not bindings: a subscriber that arrives before a listing of 100,000
/// bindings receives every one of them and is never told it lagged because of the listing
/// (`watch --remote` of a 10,000-binding remote printed `lagged` twice).
pub(crate) type Batch<T> = std::sync::Arc<[T]>;

/// One ID's record as the cache knows it. The key is the cache's own (`Box<str>`: nothing shares
/// it, events carry their own `String`).
#[derive(Clone, Debug, PartialEq, Eq)]
struct Entry {
    key: Box<str>,
    tombstone: bool,
}

/// The watch-fed view of one pool.
#[derive(Debug)]
pub struct PoolCache {
    spec: PoolSpec,
    /// Bound IDs and their keys, both ways, in a compact index (`bindings.rs`). Tombstones live
    /// apart: they are few, and keeping them out keeps the index to bindings only.
    bound: Bindings,
    tombstones: FastMap<u64, Box<str>>,
    /// ID records the cache cannot use (DESIGN §11): unreadable values, or IDs this pool never
    /// hands out (outside its range, reserved, without its prefix bits). Never bindings, never
    /// candidates; reported by [`PoolCache::foreign`].
    foreign: std::collections::BTreeMap<u64, Foreign>,
    /// Free IDs, for picking candidates. A read-only view (a remote view never allocates) keeps
    /// it empty (`track_free` false): it would cost a tree node per isolated binding for nothing.
    free: IdSet,
    track_free: bool,
    revision: Revision,
}

/// Why an ID record is not used as a binding.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Foreign {
    /// The value is not one idalloc writes (empty, not UTF-8): the ID counts as used.
    Unreadable,
    /// A readable record for an ID the pool never hands out: ignored (the ID is not a candidate
    /// anyway), never returned as a key's ID (G3).
    NotAllocatable,
}

/// A listing of a pool's `id/` records, applied page by page as it is read and kept in the
/// cache's own compact form: a synced process then holds the cache and one page,
/// not the listing's `KeyValue`s as well (about 270 bytes a binding at 1M where the cache holds
/// 100). It does not touch the view, which stays whole until [`PoolCache::replace_with`] swaps it
/// in: readers never see half a listing, and a listing that fails half-way is simply dropped.
#[derive(Debug)]
pub struct Listing {
    spec: PoolSpec,
    bound: Bindings,
    tombstones: FastMap<u64, Box<str>>,
    foreign: std::collections::BTreeMap<u64, Foreign>,
}

impl Listing {
    /// Adds a page of the listing (records in the store's key order, each ID once).
    pub fn add(&mut self, kvs: &[KeyValue], parse_id: impl Fn(&[u8]) -> Option<u64>) {
        for kv in kvs {
            let Some(id) = parse_id(&kv.key) else { continue };
            match classify(&self.spec, id, slot_of(&kv.value)) {
                Class::Absent => {}
                Class::Foreign(f) => {
                    self.foreign.insert(id, f);
                }
                Class::Tombstone(key) => {
                    self.tombstones.insert(id, key.into_boxed_str());
                }
                Class::Bound(key) => self.bind(id, &key),
            }
        }
    }

    /// Binds `id` to `key` so that, if the store binds `key` to several IDs (data loss only),
    /// `get` answers the highest, as it does when the IDs are applied in numeric order. The
    /// store lists them in decimal string order (`10` before `9`).
    fn bind(&mut self, id: u64, key: &str) {
        match self.bound.get(key) {
            Some(newer) if newer > id => {
                self.bound.insert(id, key);
                self.bound.remove(newer);
                self.bound.insert(newer, key);
            }
            _ => self.bound.insert(id, key),
        }
    }
}

/// What one ID record means for the view.
enum Class {
    Absent,
    Bound(String),
    Tombstone(String),
    Foreign(Foreign),
}

/// Classifies `id`'s record for a pool of `spec`, logging what `idalloc check` should look at.
fn classify(spec: &PoolSpec, id: u64, slot: Slot) -> Class {
    let allocatable = spec.strip_prefix(id).is_some_and(|r| spec.is_allocatable(r));
    match slot {
        Slot::Absent => Class::Absent,
        Slot::Record(_) if !allocatable => {
            tracing::warn!(pool = %spec.name(), id, "ID record for an ID the pool never hands out; ignored (run `idalloc check`)");
            Class::Foreign(Foreign::NotAllocatable)
        }
        Slot::Unreadable => {
            tracing::warn!(pool = %spec.name(), id, "unreadable ID record; the ID counts as used (run `idalloc check`)");
            Class::Foreign(Foreign::Unreadable)
        }
        Slot::Record(IdRecord::Bound(k)) => Class::Bound(k),
        Slot::Record(IdRecord::Tombstone(k)) => Class::Tombstone(k),
    }
}

/// What a store record says about an ID slot.
enum Slot {
    Absent,
    Record(IdRecord),
    Unreadable,
}

fn slot_of(value: &[u8]) -> Slot {
    match IdRecord::decode(value) {
        Some(rec) => Slot::Record(rec),
        None => Slot::Unreadable,
    }
}

impl PoolCache {
    pub fn new(spec: PoolSpec) -> Self {
        let free = IdSet::new(spec.min(), spec.max(), spec.reserved());
        PoolCache { free, track_free: true, ..Self::read_only(spec) }
    }

    /// A cache that only answers lookups (a remote view): no free-ID set.
    pub fn read_only(spec: PoolSpec) -> Self {
        PoolCache {
            spec,
            bound: Bindings::default(),
            tombstones: FastMap::default(),
            foreign: Default::default(),
            // An empty range: nothing free, nothing stored.
            free: IdSet::new(1, 0, &[]),
            track_free: false,
            revision: 0,
        }
    }

    /// Marks raw ID `raw` used in the free set, if the cache keeps one.
    fn use_raw(&mut self, raw: u64) {
        if self.track_free {
            self.free.insert(raw);
        }
    }

    /// Marks raw ID `raw` free in the free set, if the cache keeps one.
    fn free_raw(&mut self, raw: u64) {
        if self.track_free {
            self.free.remove(raw);
        }
    }

    /// Removes and returns `id`'s record, bound or tombstone.
    fn take(&mut self, id: u64) -> Option<Entry> {
        match self.bound.remove(id) {
            Some(key) => Some(Entry { key, tombstone: false }),
            None => self.tombstones.remove(&id).map(|key| Entry { key, tombstone: true }),
        }
    }

    /// The store revision the maps reflect.
    pub fn revision(&self) -> Revision {
        self.revision
    }

    /// The ID bound to `key`, if any.
    pub fn get(&self, key: &str) -> Option<u64> {
        self.bound.get(key)
    }

    /// The key bound to `id`, if any (not a tombstone's former key).
    pub fn key_of(&self, id: u64) -> Option<&str> {
        self.bound.key_of(id)
    }

    /// What the cache knows of `id`'s record: `None` if it has none.
    pub fn record(&self, id: u64) -> Option<IdRecord> {
        match self.bound.key_of(id) {
            Some(k) => Some(IdRecord::Bound(k.to_string())),
            None => self.tombstones.get(&id).map(|k| IdRecord::Tombstone(k.to_string())),
        }
    }

    /// Every binding, sorted by ID.
    pub fn snapshot(&self) -> Vec<(u64, String)> {
        let mut v: Vec<(u64, String)> =
            self.bound.iter().map(|(id, k)| (id, k.to_string())).collect();
        v.sort_unstable_by_key(|(id, _)| *id);
        v
    }

    /// Number of bindings (tombstones excluded).
    pub fn len(&self) -> usize {
        self.bound.len()
    }

    /// Only where `bench_api` exports the type (a public `len` wants its `is_empty`); the crate
    /// itself never asks.
    #[cfg(feature = "bench")]
    pub fn is_empty(&self) -> bool {
        self.bound.is_empty()
    }

    /// The free-ID set (bound, tombstoned, reserved and locally claimed IDs are used). Empty
    /// for a [`PoolCache::read_only`] cache.
    pub fn free_ids(&mut self) -> &mut IdSet {
        &mut self.free
    }

    /// Applies one watch event from the store's history; returns what subscribers should see.
    pub fn apply(
        &mut self,
        ev: &WatchEvent,
        parse_id: impl Fn(&[u8]) -> Option<u64>,
    ) -> Option<Event> {
        let kv = ev.kv();
        self.revision = self.revision.max(kv.mod_revision);
        let id = parse_id(&kv.key)?;
        match ev {
            WatchEvent::Put(kv) => self.set(id, slot_of(&kv.value)),
            WatchEvent::Delete(_) => self.set(id, Slot::Absent),
        }
    }

    /// ID records the cache does not use as bindings, and why (sorted by ID).
    pub fn foreign(&self) -> Vec<(u64, Foreign)> {
        self.foreign.iter().map(|(id, f)| (*id, f.clone())).collect()
    }

    /// Applies this process's own committed reclaim of `id` (its ID record deleted at
    /// `revision`) before the watch delivers it: the ID is free in the local view at once, so an
    /// acquire right after the release can use it. Only the free set changes (the maps and the
    /// events follow the watch); if the watch already applied `revision` or later, nothing changes.
    pub fn freed_by_own_write(&mut self, id: u64, revision: Revision) {
        if revision <= self.revision || self.foreign.contains_key(&id) {
            return;
        }
        if let Some(raw) = self.spec.strip_prefix(id) {
            self.free_raw(raw);
        }
    }

    /// Replaces the whole view with a listing at `revision` (first sync, or re-list after
    /// compaction) and returns the difference as events, then `Synced`. For callers that hold
    /// the whole listing anyway (remote views, tests); the local pool's sync applies it page by
    /// page through [`PoolCache::begin_listing`] and [`PoolCache::replace_with`].
    pub fn replace_all(
        &mut self,
        kvs: &[KeyValue],
        revision: Revision,
        parse_id: impl Fn(&[u8]) -> Option<u64>,
    ) -> Vec<Event> {
        let mut listing = self.begin_listing(kvs.len());
        listing.add(kvs, parse_id);
        self.replace_with(listing, revision, true)
    }

    /// An empty listing of this pool, to fill page by page (`Listing::add`) while the view
    /// stays as it is, sized for about `records` records.
    pub fn begin_listing(&self, records: usize) -> Listing {
        let mut bound = Bindings::default();
        bound.reserve(records);
        Listing {
            spec: self.spec.clone(),
            bound,
            tombstones: FastMap::default(),
            foreign: Default::default(),
        }
    }

    /// Replaces the whole view with a complete `listing` at `revision` and returns the difference
    /// as events, then `Synced`; with `events` false (nobody subscribes) only `Synced`, so that a
    /// first listing of 1M bindings builds no 1M events for nobody.
    ///
    /// The listing's maps become the view's (no copy); the free set is kept and only told what
    /// changed, so IDs this process learned are used (`learn`) stay used unless the listing
    /// shows them gone, exactly as applying the listing record by record would. Events come in
    /// the same order on every run (reproducible simulations): the IDs gone, by ID, then the
    /// listed IDs that changed, by ID.
    pub fn replace_with(
        &mut self,
        listing: Listing,
        revision: Revision,
        events: bool,
    ) -> Vec<Event> {
        let Listing { bound, tombstones, foreign, .. } = listing;
        let listed = |id: u64| {
            bound.contains_id(id) || tombstones.contains_key(&id) || foreign.contains_key(&id)
        };
        let mut gone: Vec<u64> = self
            .bound
            .iter()
            .map(|(id, _)| id)
            .chain(self.tombstones.keys().copied())
            .chain(self.foreign.keys().copied())
            .filter(|&id| !listed(id))
            .collect();
        gone.sort_unstable();
        let mut out = Vec::new();
        for id in gone {
            if let Some(raw) = self.spec.strip_prefix(id) {
                self.free_raw(raw);
            }
            if let (true, Some(key)) = (events, self.bound.key_of(id)) {
                out.push(Event::Delete { id, key: key.to_string() });
            }
        }
        if events {
            let mut changed: Vec<(u64, Event)> = Vec::new();
            for (id, key) in bound.iter() {
                if self.bound.key_of(id) != Some(key) {
                    changed.push((id, Event::Upsert { id, key: key.to_string() }));
                }
            }
            for id in tombstones.keys().chain(foreign.keys()) {
                if let Some(was) = self.bound.key_of(*id) {
                    changed.push((*id, Event::Delete { id: *id, key: was.to_string() }));
                }
            }
            changed.sort_unstable_by_key(|(id, _)| *id);
            out.extend(changed.into_iter().map(|(_, e)| e));
        }
        if self.track_free {
            let unreadable =
                foreign.iter().filter(|(_, f)| **f == Foreign::Unreadable).map(|(id, _)| *id);
            let used =
                bound.iter().map(|(id, _)| id).chain(tombstones.keys().copied()).chain(unreadable);
            // In bulk: the listing's IDs come in decimal name order (`IdSet::insert_many`).
            let spec = &self.spec;
            self.free.insert_many(used.filter_map(|id| spec.strip_prefix(id)));
        }
        (self.bound, self.tombstones, self.foreign) = (bound, tombstones, foreign);
        self.revision = revision;
        out.push(Event::Synced);
        out
    }

    /// Sets `id`'s record and keeps both maps, the foreign records and the free set in step.
    fn set(&mut self, id: u64, slot: Slot) -> Option<Event> {
        let old = self.take(id);
        self.foreign.remove(&id);
        let raw = self.spec.strip_prefix(id);
        let new = match classify(&self.spec, id, slot) {
            Class::Foreign(f) => {
                if f == Foreign::Unreadable {
                    if let Some(raw) = raw {
                        self.use_raw(raw);
                    }
                }
                self.foreign.insert(id, f);
                None
            }
            Class::Absent => {
                if let Some(raw) = raw {
                    self.free_raw(raw);
                }
                None
            }
            Class::Bound(k) => Some((k, false)),
            Class::Tombstone(k) => Some((k, true)),
        };
        if new.is_some() {
            if let Some(raw) = raw {
                self.use_raw(raw);
            }
        }
        let was = old.as_ref().filter(|e| !e.tombstone).map(|e| &*e.key);
        match new {
            Some((key, true)) => {
                self.tombstones.insert(id, key.into_boxed_str());
                was.map(|w| Event::Delete { id, key: w.to_string() })
            }
            Some((key, false)) => {
                self.bound.insert(id, &key);
                // The listing's or event's own `String` becomes the event's: no copy per binding.
                (was != Some(key.as_str())).then_some(Event::Upsert { id, key })
            }
            None => was.map(|w| Event::Delete { id, key: w.to_string() }),
        }
    }

    /// Takes `spec` (the same pool resized) as the pool's spec: the free set is rebuilt over its
    /// range from the IDs known used. Bindings stay; a record the new range does not hand out stays
    /// known (a resize is refused while one exists, so that only happens with foreign records).
    pub fn set_spec(&mut self, spec: PoolSpec) {
        self.spec = spec;
        if self.track_free {
            self.rebuild_free();
        }
    }

    /// Rebuilds the free set from the spec's range and the IDs known used.
    fn rebuild_free(&mut self) {
        self.free = IdSet::new(self.spec.min(), self.spec.max(), self.spec.reserved());
        let unreadable =
            self.foreign.iter().filter(|(_, f)| **f == Foreign::Unreadable).map(|(id, _)| *id);
        let used: Vec<u64> = self
            .bound
            .iter()
            .map(|(id, _)| id)
            .chain(self.tombstones.keys().copied())
            .chain(unreadable)
            .collect();
        let spec = &self.spec;
        self.free.insert_many(used.into_iter().filter_map(|id| spec.strip_prefix(id)));
    }

    /// Forgets what [`PoolCache::learn`] taught the free set once it holds more than `runs` runs
    /// of used IDs: for a pool opened lazily (no listing, no watch), whose free set is only
    /// hints that grow with every ID a batch learns taken. The IDs the maps hold stay used.
    pub fn forget_learned_above(&mut self, runs: usize) {
        if !self.track_free || self.free.run_count() <= runs {
            return;
        }
        self.rebuild_free();
    }

    /// Learns from a txn response that `id` is in use (or free) before the watch says so; only the
    /// free set changes (see the module docs).
    pub fn learn(&mut self, id: u64, used: bool) {
        if let Some(raw) = self.spec.strip_prefix(id) {
            if used {
                self.use_raw(raw);
            } else if !self.bound.contains_id(id)
                && !self.tombstones.contains_key(&id)
                && !self.foreign.contains_key(&id)
            {
                self.free_raw(raw);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec() -> PoolSpec {
        PoolSpec::new("p", 1, 10)
    }

    fn parse(k: &[u8]) -> Option<u64> {
        std::str::from_utf8(k).ok()?.parse().ok()
    }

    fn put(id: u64, rec: IdRecord, rev: Revision) -> WatchEvent {
        WatchEvent::Put(KeyValue {
            key: id.to_string().into_bytes(),
            value: rec.encode(),
            create_revision: rev,
            mod_revision: rev,
            version: 1,
            lease: 0,
        })
    }

    fn del(id: u64, rev: Revision) -> WatchEvent {
        WatchEvent::Delete(KeyValue {
            key: id.to_string().into_bytes(),
            value: vec![],
            create_revision: 0,
            mod_revision: rev,
            version: 0,
            lease: 0,
        })
    }

    #[test]
    fn events_follow_bindings_and_tombstones() {
        let mut c = PoolCache::new(spec());
        assert_eq!(
            c.apply(&put(3, IdRecord::Bound("a".into()), 2), parse),
            Some(Event::Upsert { id: 3, key: "a".into() })
        );
        assert_eq!(c.get("a"), Some(3));
        assert_eq!(c.key_of(3), Some("a"));
        assert_eq!(c.free_ids().free_count(), 9);
        // Tombstoning ends the binding for subscribers, but the ID stays unusable.
        assert_eq!(
            c.apply(&put(3, IdRecord::Tombstone("a".into()), 3), parse),
            Some(Event::Delete { id: 3, key: "a".into() })
        );
        assert_eq!(c.get("a"), None);
        assert_eq!(c.key_of(3), None);
        assert_eq!(c.record(3), Some(IdRecord::Tombstone("a".into())));
        assert_eq!(c.free_ids().free_count(), 9);
        // The tombstone's expiry frees the ID without another event.
        assert_eq!(c.apply(&del(3, 4), parse), None);
        assert_eq!(c.free_ids().free_count(), 10);
        assert_eq!(c.revision(), 4);
    }

    #[test]
    fn relist_emits_the_difference_then_synced() {
        let mut c = PoolCache::new(spec());
        c.apply(&put(1, IdRecord::Bound("a".into()), 2), parse);
        c.apply(&put(2, IdRecord::Bound("b".into()), 3), parse);
        let listed = vec![
            match put(2, IdRecord::Bound("b".into()), 3) {
                WatchEvent::Put(kv) => kv,
                _ => unreachable!(),
            },
            match put(5, IdRecord::Bound("e".into()), 9) {
                WatchEvent::Put(kv) => kv,
                _ => unreachable!(),
            },
        ];
        let events = c.replace_all(&listed, 9, parse);
        assert_eq!(
            events,
            vec![
                Event::Delete { id: 1, key: "a".into() },
                Event::Upsert { id: 5, key: "e".into() },
                Event::Synced
            ]
        );
        assert_eq!(c.snapshot(), vec![(2, "b".to_string()), (5, "e".to_string())]);
        assert_eq!(c.revision(), 9);
    }

    fn kv(id: u64, rec: IdRecord) -> KeyValue {
        match put(id, rec, 2) {
            WatchEvent::Put(kv) => kv,
            WatchEvent::Delete(_) => unreachable!(),
        }
    }

    /// A listing applied page by page, in the store's decimal key order, ends where the same
    /// records applied one by one end: same bindings, same free set, same events.
    #[test]
    fn a_listing_built_page_by_page_matches_applying_its_records() {
        let records: Vec<KeyValue> = vec![
            kv(1, IdRecord::Bound("a".into())),
            kv(10, IdRecord::Bound("dup".into())),
            kv(2, IdRecord::Tombstone("b".into())),
            kv(7, IdRecord::Bound("dup".into())),
            kv(9, IdRecord::Bound("dup".into())),
        ];
        let mut paged = PoolCache::new(spec());
        paged.apply(&put(3, IdRecord::Bound("gone".into()), 1), parse);
        paged.apply(&put(1, IdRecord::Bound("old-a".into()), 1), parse);
        paged.learn(5, true);
        let mut listing = paged.begin_listing(5);
        for page in records.chunks(2) {
            listing.add(page, parse);
        }
        let events = paged.replace_with(listing, 9, true);
        assert_eq!(
            events,
            vec![
                Event::Delete { id: 3, key: "gone".into() },
                Event::Upsert { id: 1, key: "a".into() },
                Event::Upsert { id: 7, key: "dup".into() },
                Event::Upsert { id: 9, key: "dup".into() },
                Event::Upsert { id: 10, key: "dup".into() },
                Event::Synced
            ]
        );
        // A key bound to several IDs (data loss) answers the highest, as in numeric order.
        assert_eq!(paged.get("dup"), Some(10));
        assert_eq!(paged.get("a"), Some(1));
        assert_eq!(paged.key_of(3), None);
        assert_eq!(paged.record(2), Some(IdRecord::Tombstone("b".into())));
        // Used: 1, 2, 7, 9, 10 and the learned 5; 3 is free again.
        assert_eq!(paged.free_ids().free_count(), 4);
        assert!(!paged.free_ids().contains(3));
        assert!(paged.free_ids().contains(5));

        // Without subscribers the same state, and only `Synced`.
        let mut quiet = PoolCache::new(spec());
        quiet.apply(&put(3, IdRecord::Bound("gone".into()), 1), parse);
        let mut listing = quiet.begin_listing(0);
        listing.add(&records, parse);
        assert_eq!(quiet.replace_with(listing, 9, false), vec![Event::Synced]);
        assert_eq!(quiet.snapshot(), paged.snapshot());
        assert_eq!(quiet.get("dup"), Some(10));
        assert_eq!(quiet.free_ids().free_count(), 5);
    }

    /// A lazily opened pool's learned IDs are forgotten past the bound; what the maps hold stays.
    #[test]
    fn learned_ids_are_forgotten_past_the_bound_but_bindings_stay_used() {
        let mut c = PoolCache::new(spec());
        c.apply(&put(2, IdRecord::Bound("b".into()), 2), parse);
        for id in [4, 6, 8] {
            c.learn(id, true);
        }
        assert_eq!(c.free_ids().free_count(), 6);
        c.forget_learned_above(4);
        assert_eq!(c.free_ids().free_count(), 6, "4 runs: within the bound, kept");
        c.forget_learned_above(3);
        assert_eq!(c.free_ids().free_count(), 9, "only the binding's ID stays used");
        assert!(c.free_ids().contains(2));
        assert_eq!(c.get("b"), Some(2));
    }

    #[test]
    fn learned_use_only_touches_the_free_set() {
        let mut c = PoolCache::new(spec());
        c.learn(4, true);
        assert_eq!(c.free_ids().free_count(), 9);
        assert_eq!(c.key_of(4), None);
        c.learn(4, false);
        assert_eq!(c.free_ids().free_count(), 10);
        // An ID the watch knows as bound is not freed by a stale lesson.
        c.apply(&put(6, IdRecord::Bound("f".into()), 2), parse);
        c.learn(6, false);
        assert_eq!(c.free_ids().free_count(), 9);
    }

    #[test]
    fn unreadable_and_out_of_range_records_are_never_candidates_nor_bindings() {
        let mut c = PoolCache::new(spec().reserve(9..=9));
        let raw = |id: u64, value: &[u8], rev: Revision| {
            WatchEvent::Put(KeyValue {
                key: id.to_string().into_bytes(),
                value: value.to_vec(),
                create_revision: rev,
                mod_revision: rev,
                version: 1,
                lease: 0,
            })
        };
        // 9 free IDs (1..=10 without reserved 9).
        assert_eq!(c.free_ids().free_count(), 9);
        assert_eq!(c.apply(&raw(1, b"", 2), parse), None);
        assert_eq!(c.apply(&raw(2, &[0xFF], 3), parse), None);
        assert_eq!(c.apply(&raw(3, &[0xC3, 0x28], 4), parse), None);
        assert_eq!(c.free_ids().free_count(), 6, "unreadable records count as used");
        // Readable records for IDs the pool never hands out: not bindings, no events.
        assert_eq!(c.apply(&raw(9, b"k9", 5), parse), None);
        assert_eq!(c.apply(&raw(78, b"k78", 6), parse), None);
        assert_eq!(c.get("k9"), None);
        assert_eq!(c.get("k78"), None);
        assert_eq!(c.free_ids().free_count(), 6);
        assert_eq!(
            c.foreign(),
            vec![
                (1, Foreign::Unreadable),
                (2, Foreign::Unreadable),
                (3, Foreign::Unreadable),
                (9, Foreign::NotAllocatable),
                (78, Foreign::NotAllocatable)
            ]
        );
        // A learned "free" does not free an unreadable ID; deleting the record does.
        c.learn(1, false);
        assert_eq!(c.free_ids().free_count(), 6);
        assert_eq!(c.apply(&del(1, 7), parse), None);
        assert_eq!(c.free_ids().free_count(), 7);
        // Deleting the reserved ID's record never frees the reserved ID.
        assert_eq!(c.apply(&del(9, 8), parse), None);
        assert_eq!(c.free_ids().free_count(), 7);
        // A re-list forgets records that are gone.
        c.replace_all(&[], 9, parse);
        assert!(c.foreign().is_empty());
        assert_eq!(c.free_ids().free_count(), 9);
    }

    #[test]
    fn own_reclaim_frees_the_id_before_the_watch_says_so() {
        let mut c = PoolCache::new(spec());
        for id in 1..=10 {
            c.apply(&put(id, IdRecord::Bound(format!("k{id}")), id as Revision + 1), parse);
        }
        assert_eq!(c.free_ids().free_count(), 0);
        c.freed_by_own_write(4, 20);
        assert_eq!(c.free_ids().free_count(), 1);
        // The watch event of that delete later changes nothing in the free set.
        assert_eq!(c.apply(&del(4, 20), parse), Some(Event::Delete { id: 4, key: "k4".into() }));
        assert_eq!(c.free_ids().free_count(), 1);
        // A reclaim the watch already applied (or an older one) is ignored.
        c.freed_by_own_write(5, 15);
        assert_eq!(c.free_ids().free_count(), 1);
    }

    #[test]
    fn rebinding_an_id_to_another_key_moves_the_key_index() {
        let mut c = PoolCache::new(spec());
        c.apply(&put(1, IdRecord::Bound("a".into()), 2), parse);
        assert_eq!(
            c.apply(&put(1, IdRecord::Bound("b".into()), 3), parse),
            Some(Event::Upsert { id: 1, key: "b".into() })
        );
        assert_eq!(c.get("a"), None);
        assert_eq!(c.get("b"), Some(1));
    }
}
