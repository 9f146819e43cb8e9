//! A compact two-way index of bindings (ID ↔ key) for the cache.
//!
//! Every node caches every binding of the pools it uses, so the bytes per binding are what a large
//! deployment pays on every node (≤ 100 resident bytes per binding at 1M bindings with
//! 40-byte keys, key bytes included), and the lookups are what every caller of `get`/`key_of` pays.
//!
//! Layout: one arena of records and two hash tables of arena positions.
//!
//! - `arena`: every binding as one record, `id` and key length as ASCII varints (6 bits a byte, so
//!   the arena stays a valid `String` and `key_of` can hand out `&str` slices of it without
//!   re-checking UTF-8 and without `unsafe`), then the key's bytes, unpadded. A 40-byte key with
//!   a 24-bit ID takes 45 bytes, where a `Box<str>` took 48 bytes of allocator chunk plus its
//!   16-byte fat pointer. (Records used to be padded to an even length so that 32-bit positions
//!   could count 2-byte units; that was the byte that kept the worst case at 100.1 bytes a binding
//!   at 1M, over the 100.)
//! - `by_key` and `by_id`: `hashbrown::HashTable<u32>` of record positions (byte offsets), hashed
//!   by key and by ID: 5 bytes a bucket (4 + hashbrown's control byte), 10.5 bytes a binding per
//!   table right after a doubling. The previous layout (open addressing of `(id, Box<str>)` slots
//!   with a tag array and an ID table) took 33 bytes a slot, 69 a binding at 1M, before the key.
//!
//! Removing a binding leaves its record dead in the arena; once dead bytes pass a quarter of the
//! arena, live records are copied to a new arena and both tables rebuilt (O(live), at most once
//! per live/3 removals: amortized O(1), so listings and `replace_all` stay linear). Positions are
//! 32-bit byte offsets: an arena holds at most 4 GiB of records, as much as an etcd database can
//! hold (8 GiB quota, every key stored there at least twice: in its key record's name and its ID
//! record's value).
//!
//! The price is one more dependent load per lookup than before: `get` reads a control byte, a
//! position, then the record; `key_of` the same. Measured in docs/scale.md ("Cache memory").
//!
//! If the store binds one key to two IDs (only after data loss, DESIGN §7), `get` answers the
//! newest binding; the older one moves to a side map (`shadowed`), empty in normal operation.

use std::collections::HashMap;
use std::hash::BuildHasher;

use hashbrown::HashTable;

/// foldhash (hashbrown's default, per-process random seed): hashing the key is a large part of a
/// cached `get`, and SipHash was several times slower (docs/benchmarks-findings.md).
type Hasher = foldhash::fast::RandomState;

/// Dead bytes below this never trigger a compaction (small caches do not churn their arena).
const COMPACT_MIN: usize = 4096;

/// Appends `v` as an ASCII varint: 6 bits a byte, low bits first, `0x40` on every byte but the
/// last. Every byte is below `0x80`, so the arena stays valid UTF-8.
fn push_varint(s: &mut String, mut v: u64) {
    loop {
        let low = (v & 0x3F) as u8;
        v >>= 6;
        if v == 0 {
            s.push(char::from(low));
            return;
        }
        s.push(char::from(low | 0x40));
    }
}

/// Reads a varint written by [`push_varint`] at `*pos`, advancing `*pos` past it.
fn read_varint(b: &[u8], pos: &mut usize) -> u64 {
    let (mut v, mut shift) = (0u64, 0u32);
    loop {
        let byte = b[*pos];
        *pos += 1;
        v |= u64::from(byte & 0x3F) << shift;
        if byte & 0x40 == 0 {
            return v;
        }
        shift += 6;
    }
}

/// The record at table entry `slot`: its ID, its key, and its length in the arena.
fn record(arena: &str, slot: u32) -> (u64, &str, usize) {
    let start = slot as usize;
    let b = arena.as_bytes();
    let mut pos = start;
    let id = read_varint(b, &mut pos);
    let len = read_varint(b, &mut pos) as usize;
    // Both ends are char boundaries: the header before the key and the next header (or the
    // arena's end) after it are ASCII.
    let key = &arena[pos..pos + len];
    (id, key, pos + len - start)
}

/// Appends a record for `(id, key)` to `arena`; returns its table entry.
fn append(arena: &mut String, id: u64, key: &str) -> u32 {
    let start = arena.len();
    let slot = u32::try_from(start).unwrap_or_else(|_| {
        panic!("a pool cache holds at most 4 GiB of keys (see the module docs)")
    });
    push_varint(arena, id);
    push_varint(arena, key.len() as u64);
    arena.push_str(key);
    slot
}

/// Bindings `id ↔ key`. `get` answers the newest binding of a key if the store (transiently, after
/// data loss) binds one key to two IDs.
pub struct Bindings<S = Hasher> {
    /// Records of the bindings (live and dead), see the module docs.
    arena: String,
    /// Live records by key hash.
    by_key: HashTable<u32>,
    /// The same records by ID hash.
    by_id: HashTable<u32>,
    /// Bytes of `arena` that no table points to any more.
    dead: usize,
    /// Older bindings of a key that a newer ID took over (data loss only): `id → key`.
    shadowed: HashMap<u64, Box<str>, Hasher>,
    hasher: S,
}

impl<S: Default> Default for Bindings<S> {
    fn default() -> Self {
        Bindings {
            arena: String::new(),
            by_key: HashTable::new(),
            by_id: HashTable::new(),
            dead: 0,
            shadowed: HashMap::default(),
            hasher: S::default(),
        }
    }
}

impl<S> std::fmt::Debug for Bindings<S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Bindings").field("len", &self.by_key.len()).finish()
    }
}

impl<S: BuildHasher> Bindings<S> {
    /// The ID bound to `key`.
    pub fn get(&self, key: &str) -> Option<u64> {
        if self.by_key.is_empty() {
            return None;
        }
        let arena = &self.arena;
        let slot = self.by_key.find(self.hasher.hash_one(key), |&s| record(arena, s).1 == key)?;
        Some(record(arena, *slot).0)
    }

    /// The key bound to `id`.
    pub fn key_of(&self, id: u64) -> Option<&str> {
        let arena = &self.arena;
        match self.by_id.find(self.hasher.hash_one(id), |&s| record(arena, s).0 == id) {
            Some(&s) => Some(record(arena, s).1),
            None if self.shadowed.is_empty() => None,
            None => self.shadowed.get(&id).map(|k| &**k),
        }
    }

    pub fn contains_id(&self, id: u64) -> bool {
        self.key_of(id).is_some()
    }

    /// Number of keys with a binding.
    pub fn len(&self) -> usize {
        self.by_key.len()
    }

    #[cfg(any(test, feature = "bench"))]
    pub fn is_empty(&self) -> bool {
        self.by_key.is_empty()
    }

    /// Every binding, in no particular order.
    pub fn iter(&self) -> impl Iterator<Item = (u64, &str)> {
        let arena = &self.arena;
        self.by_id
            .iter()
            .map(move |&s| {
                let (id, key, _) = record(arena, s);
                (id, key)
            })
            .chain(self.shadowed.iter().map(|(id, k)| (*id, &**k)))
    }

    /// Makes room for `additional` more bindings without rehashing (a listing knows its size).
    pub fn reserve(&mut self, additional: usize) {
        let Bindings { arena, by_key, by_id, hasher, .. } = self;
        by_key.reserve(additional, |&s| hasher.hash_one(record(arena, s).1));
        by_id.reserve(additional, |&s| hasher.hash_one(record(arena, s).0));
    }

    /// Binds `id` to `key`. `id` must not be bound (remove it first); `key`'s index moves to this
    /// binding if it had another one.
    pub fn insert(&mut self, id: u64, key: &str) {
        debug_assert!(!self.contains_id(id), "insert of a bound ID");
        let Bindings { arena, by_key, by_id, dead, shadowed, hasher } = self;
        let hk = hasher.hash_one(key);
        if let Ok(entry) = by_key.find_entry(hk, |&s| record(arena, s).1 == key) {
            // The key's older binding keeps its ID → key direction only.
            let (old, _) = entry.remove();
            let (old_id, _, len) = record(arena, old);
            if let Ok(e) = by_id.find_entry(hasher.hash_one(old_id), |&s| s == old) {
                e.remove();
            }
            *dead += len;
            shadowed.insert(old_id, key.into());
        }
        let slot = append(arena, id, key);
        by_key.insert_unique(hk, slot, |&s| hasher.hash_one(record(arena, s).1));
        by_id.insert_unique(hasher.hash_one(id), slot, |&s| hasher.hash_one(record(arena, s).0));
        self.maybe_compact();
    }

    /// Unbinds `id`; returns its key.
    pub fn remove(&mut self, id: u64) -> Option<Box<str>> {
        let Bindings { arena, by_key, by_id, dead, shadowed, hasher } = self;
        let Ok(entry) = by_id.find_entry(hasher.hash_one(id), |&s| record(arena, s).0 == id) else {
            return shadowed.remove(&id);
        };
        let (slot, _) = entry.remove();
        let (_, key, len) = record(arena, slot);
        if let Ok(e) = by_key.find_entry(hasher.hash_one(key), |&s| s == slot) {
            e.remove();
        }
        let key: Box<str> = key.into();
        *dead += len;
        self.maybe_compact();
        Some(key)
    }

    /// Copies the live records to a new arena and rebuilds both tables once dead bytes pass a
    /// quarter of the arena (see the module docs for why that keeps every operation amortized
    /// O(1)).
    fn maybe_compact(&mut self) {
        if self.by_id.is_empty() {
            self.arena = String::new();
            self.dead = 0;
            return;
        }
        if self.dead < COMPACT_MIN || self.dead * 4 <= self.arena.len() {
            return;
        }
        let mut slots: Vec<u32> = self.by_id.iter().copied().collect();
        // In arena order: the copy keeps the records' order, so the compaction is reproducible.
        slots.sort_unstable();
        let mut arena = String::with_capacity(self.arena.len() - self.dead);
        let mut by_key = HashTable::with_capacity(slots.len());
        let mut by_id = HashTable::with_capacity(slots.len());
        let hasher = &self.hasher;
        for s in slots {
            let (id, key, _) = record(&self.arena, s);
            let n = append(&mut arena, id, key);
            by_key
                .insert_unique(hasher.hash_one(key), n, |&s| hasher.hash_one(record(&arena, s).1));
            by_id.insert_unique(hasher.hash_one(id), n, |&s| hasher.hash_one(record(&arena, s).0));
        }
        (self.arena, self.by_key, self.by_id, self.dead) = (arena, by_key, by_id, 0);
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;
    use std::hash::BuildHasher;

    use rand::rngs::StdRng;
    use rand::{Rng, SeedableRng};

    use super::*;

    /// A hasher with only five distinct outputs (same top byte too): every key and every ID
    /// collides with a fifth of the others, so the probe runs are long, wrap around the table's
    /// end, and tags match keys that are not the one sought.
    #[derive(Default)]
    struct Clumpy;

    struct ClumpyHasher(std::collections::hash_map::DefaultHasher);

    impl BuildHasher for Clumpy {
        type Hasher = ClumpyHasher;
        fn build_hasher(&self) -> ClumpyHasher {
            ClumpyHasher(Default::default())
        }
    }

    impl std::hash::Hasher for ClumpyHasher {
        fn finish(&self) -> u64 {
            // Five values spread over the bits (so over the homes of every table size), all with
            // the top byte that is the key tag.
            (self.0.finish() % 5 + 1).wrapping_mul(u64::MAX / 6) | 0xFF00_0000_0000_0000
        }
        fn write(&mut self, bytes: &[u8]) {
            self.0.write(bytes);
        }
    }

    /// Random inserts and removes against two plain maps, checking every lookup after each step.
    fn matches_a_pair_of_maps<S: BuildHasher + Default>(steps: usize) {
        let mut rng = StdRng::seed_from_u64(7);
        let mut b: Bindings<S> = Bindings::default();
        let mut by_id: HashMap<u64, String> = HashMap::new();
        let mut by_key: HashMap<String, u64> = HashMap::new();
        for step in 0..steps {
            let id = rng.random_range(0..300u64);
            if rng.random_bool(0.55) && !by_id.contains_key(&id) {
                let key = format!("k{}", rng.random_range(0..400u32));
                b.insert(id, &key);
                by_id.insert(id, key.clone());
                by_key.insert(key, id);
            } else {
                let got = b.remove(id).map(|k| k.to_string());
                let want = by_id.remove(&id);
                assert_eq!(got, want, "remove({id}) at step {step}");
                if let Some(k) = want {
                    if by_key.get(&k) == Some(&id) {
                        by_key.remove(&k);
                    }
                }
            }
            if step % 97 == 0 {
                for id in 0..300 {
                    assert_eq!(b.key_of(id), by_id.get(&id).map(String::as_str), "key_of({id})");
                    assert_eq!(b.contains_id(id), by_id.contains_key(&id), "contains_id({id})");
                }
                for k in 0..400 {
                    let k = format!("k{k}");
                    assert_eq!(b.get(&k), by_key.get(&k).copied(), "get({k})");
                }
                assert_eq!(b.len(), by_key.len());
                let mut all: Vec<(u64, String)> = b.iter().map(|(i, k)| (i, k.into())).collect();
                all.sort();
                let mut want: Vec<(u64, String)> = by_id.clone().into_iter().collect();
                want.sort();
                assert_eq!(all, want, "iter at step {step}");
            }
        }
    }

    #[test]
    fn matches_a_pair_of_maps_under_random_changes() {
        matches_a_pair_of_maps::<Hasher>(20_000);
    }

    #[test]
    fn matches_a_pair_of_maps_when_every_hash_collides() {
        matches_a_pair_of_maps::<Clumpy>(6_000);
    }

    #[test]
    fn a_key_bound_twice_answers_the_newest_and_survives_either_removal() {
        let mut b: Bindings = Bindings::default();
        b.insert(1, "k");
        b.insert(2, "k");
        assert_eq!(b.get("k"), Some(2));
        assert_eq!(b.key_of(1), Some("k"), "the older binding keeps its ID → key direction");
        assert_eq!(b.remove(1).as_deref(), Some("k"));
        assert_eq!(b.get("k"), Some(2), "removing the older binding keeps the newer index");
        assert_eq!(b.remove(2).as_deref(), Some("k"));
        assert_eq!(b.get("k"), None);
        assert!(b.is_empty());
    }

    #[test]
    fn lookups_survive_growth_and_removal_of_most_bindings() {
        let mut b: Bindings = Bindings::default();
        for id in 0..10_000u64 {
            b.insert(id, &format!("key-{id}"));
        }
        assert_eq!(b.len(), 10_000);
        for id in (0..10_000u64).filter(|id| id % 10 != 0) {
            assert_eq!(b.remove(id).as_deref(), Some(format!("key-{id}").as_str()));
        }
        assert_eq!(b.len(), 1_000);
        for id in 0..10_000u64 {
            let key = format!("key-{id}");
            let bound = id % 10 == 0;
            assert_eq!(b.get(&key), bound.then_some(id), "get({key})");
            assert_eq!(b.key_of(id), bound.then_some(key.as_str()), "key_of({id})");
        }
    }

    #[test]
    fn varints_round_trip_and_stay_ascii() {
        for v in [0, 1, 63, 64, 4095, 4096, 1 << 24, u64::MAX / 3, u64::MAX] {
            let mut s = String::new();
            push_varint(&mut s, v);
            assert!(s.bytes().all(|b| b < 0x80), "{v} wrote a non-ASCII byte");
            let mut pos = 0;
            assert_eq!(read_varint(s.as_bytes(), &mut pos), v);
            assert_eq!(pos, s.len());
        }
    }

    /// A 40-byte key with a 24-bit ID is 45 bytes of arena: the bytes per binding of the module
    /// docs rest on it.
    #[test]
    fn a_record_is_its_key_and_a_few_bytes() {
        let mut arena = String::new();
        let key = "k".repeat(40);
        let slot = append(&mut arena, (1 << 24) - 1, &key);
        assert_eq!(arena.len(), 45);
        assert_eq!(record(&arena, slot), ((1 << 24) - 1, key.as_str(), 45));
        // The next record starts right after it: no padding.
        let next = append(&mut arena, 7, "k7");
        assert_eq!(next, 45);
        assert_eq!(record(&arena, next), (7, "k7", 4));
    }

    #[test]
    fn churn_compacts_the_arena_and_keeps_every_binding() {
        let mut b: Bindings = Bindings::default();
        for id in 0..1_000u64 {
            b.insert(id, &format!("key-{id:04}-{}", "x".repeat(30)));
        }
        let full = b.arena.len();
        // Replace every binding many times over: without compaction the arena would grow 20×.
        for round in 1..20u64 {
            for id in 0..1_000u64 {
                let _ = b.remove(id);
                b.insert(id, &format!("key-{id:04}-{}", "y".repeat(30 - (round as usize % 3))));
            }
        }
        assert!(b.arena.len() <= full * 3 / 2, "arena {} after churn, {full} full", b.arena.len());
        for id in 0..1_000u64 {
            let key = b.key_of(id).map(str::to_string);
            assert_eq!(key.as_deref().and_then(|k| b.get(k)), Some(id), "binding {id}");
        }
        for id in 0..1_000u64 {
            assert!(b.remove(id).is_some());
        }
        assert!(b.is_empty());
        assert_eq!(b.arena.len(), 0, "an empty index keeps no arena");
    }

    mod model {
        use std::collections::BTreeMap;

        use proptest::prelude::*;

        use super::super::Bindings;
        use super::Clumpy;

        #[derive(Clone, Debug)]
        enum Op {
            /// Binds an ID (if unbound) to one of a few keys, some long.
            Insert(u64, u8, usize),
            Remove(u64),
        }

        fn op() -> impl Strategy<Value = Op> {
            prop_oneof![
                3 => (0..64u64, 0..48u8, 0..3usize).prop_map(|(i, k, l)| Op::Insert(i, k, l)),
                2 => (0..64u64).prop_map(Op::Remove),
            ]
        }

        fn key(k: u8, l: usize) -> String {
            // Lengths around the 6-bit varint boundary (63/64) and a multi-byte character.
            format!("{k}-{}é", "z".repeat([0, 60, 200][l]))
        }

        /// The index against two `BTreeMap`s (ID → key, and key → newest ID), after every step.
        fn check<S: std::hash::BuildHasher + Default>(ops: &[Op]) -> Result<(), TestCaseError> {
            let mut b: Bindings<S> = Bindings::default();
            let mut by_id: BTreeMap<u64, String> = BTreeMap::new();
            let mut by_key: BTreeMap<String, u64> = BTreeMap::new();
            for op in ops {
                match *op {
                    Op::Insert(id, k, l) if !by_id.contains_key(&id) => {
                        let k = key(k, l);
                        b.insert(id, &k);
                        by_id.insert(id, k.clone());
                        by_key.insert(k, id);
                    }
                    Op::Insert(..) => {}
                    Op::Remove(id) => {
                        let want = by_id.remove(&id);
                        prop_assert_eq!(b.remove(id).map(String::from), want.clone());
                        if let Some(k) = want {
                            if by_key.get(&k) == Some(&id) {
                                by_key.remove(&k);
                            }
                        }
                    }
                }
                prop_assert_eq!(b.len(), by_key.len());
                for id in 0..64 {
                    prop_assert_eq!(b.key_of(id), by_id.get(&id).map(String::as_str));
                }
                for (k, id) in &by_key {
                    prop_assert_eq!(b.get(k), Some(*id));
                }
                let all: BTreeMap<u64, String> =
                    b.iter().map(|(i, k)| (i, k.to_string())).collect();
                prop_assert_eq!(&all, &by_id);
            }
            Ok(())
        }

        proptest! {
            #![proptest_config(ProptestConfig {
                // A fixed seed: a run is repeatable, so a failure in CI is one a rerun shows again
                // (the fuzz crate's properties explore further, also from fixed seeds).
                rng_seed: proptest::test_runner::RngSeed::Fixed(496),
                failure_persistence: None,
                ..ProptestConfig::default()
            })]

            #[test]
            fn matches_a_btreemap_model(ops in proptest::collection::vec(op(), 1..400)) {
                // A fixed hasher too, so that the buckets are the same in every run.
                check::<foldhash::fast::FixedState>(&ops)?;
            }

            #[test]
            fn matches_a_btreemap_model_when_every_hash_collides(ops in proptest::collection::vec(op(), 1..200)) {
                check::<Clumpy>(&ops)?;
            }
        }
    }
}
