//! A compact two-way index of bindings (ID ↔ key) for the cache.
//!
//! Every node caches every binding of the pools it uses, so the bytes per binding are what a large
//! deployment pays on every node (DESIGN §6; target ≤ 150 bytes beyond the key itself), and the
//! lookups are what every caller of `get`/`key_of` pays (issue 14: `get` within 2× of `key_of`).
//!
//! Two open-addressing tables (linear probing, power-of-two sizes, at most 7/8 full, deletion by
//! backward shift so there are no tombstones and no entry ever sits behind a stale one):
//!
//! - `keys`: the bindings themselves, `(id, key)` (24 bytes a slot), placed by the key's hash, with
//!   a parallel array of one-byte hash tags. `get` loads the tag and the slot of the key's home
//!   position (independent loads, issued together), then the key bytes to confirm: two dependent
//!   cache misses. A probe passes over other keys by their tag without reading their bytes.
//! - `ids`: for each binding, its slot in `keys` with 24 bits of the ID's hash as a tag (8 bytes a
//!   slot), placed by the ID's hash. `key_of` loads that slot, then the `keys` slot it names (whose
//!   fat pointer is the answer; the key bytes are not read): two dependent misses, as with a
//!   SwissTable's control byte and bucket.
//!
//! 25 + 8 = 33 bytes a slot, where the previous layout (a hashbrown map `id → Arc<str>` and a
//! hashbrown table of IDs hashed by key) had 25 + 9, and needed five dependent loads for a `get`
//! (control byte, ID, the ID map's control byte and bucket, key bytes). Both tables have the same
//! size and grow together, at the same 7/8 as hashbrown, so the slot count per binding is the same
//! as before at every size. Keys are `Box<str>`: the cache never shares them (events carry their
//! own `String`), and an `Arc`'s 16-byte header per key was memory for nothing.
//!
//! If the store binds one key to two IDs (only after data loss, DESIGN §7), `get` answers the
//! newest binding; the older one moves to a side map (`shadowed`), empty in normal operation.

use std::collections::HashMap;
use std::hash::BuildHasher;

/// foldhash (hashbrown's default, per-process random seed): hashing the key is a large part of a
/// cached `get`, and SipHash was several times slower (docs/benchmarks-findings.md).
type Hasher = foldhash::fast::RandomState;

/// `ids` slot: the `keys` position + 1 in the low bits (0: empty), an ID-hash tag above.
const POS_BITS: u32 = 40;
const POS_MASK: u64 = (1 << POS_BITS) - 1;
const TAG_MASK: u64 = !POS_MASK;

/// Bindings `id ↔ key`. `get` answers the newest binding of a key if the store (transiently, after
/// data loss) binds one key to two IDs.
pub struct Bindings<S = Hasher> {
    /// Bindings by key hash; `None` is an empty slot. Same length as `tags` and `ids`.
    keys: Vec<Option<(u64, Box<str>)>>,
    /// One byte of each `keys` slot's key hash, never 0; 0 marks an empty slot.
    tags: Vec<u8>,
    /// `keys` positions by ID hash (see [`POS_BITS`]).
    ids: Vec<u64>,
    /// Number of bindings in `keys` (= used slots in `ids`).
    len: usize,
    /// Older bindings of a key that a newer ID took over (data loss only): `id → key`.
    shadowed: HashMap<u64, Box<str>, Hasher>,
    hasher: S,
}

impl<S: Default> Default for Bindings<S> {
    fn default() -> Self {
        Bindings {
            keys: Vec::new(),
            tags: Vec::new(),
            ids: Vec::new(),
            len: 0,
            shadowed: HashMap::default(),
            hasher: S::default(),
        }
    }
}

impl<S> std::fmt::Debug for Bindings<S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Bindings").field("len", &self.len).finish()
    }
}

/// The tag byte of a key hash (the top byte, 0 mapped to 1: 0 means empty).
fn key_tag(h: u64) -> u8 {
    ((h >> 56) as u8).max(1)
}

impl<S: BuildHasher> Bindings<S> {
    fn mask(&self) -> usize {
        self.keys.len().wrapping_sub(1)
    }

    fn hash_key(&self, key: &str) -> u64 {
        self.hasher.hash_one(key)
    }

    fn hash_id(&self, id: u64) -> u64 {
        self.hasher.hash_one(id)
    }

    /// Position in `keys` of `key`'s binding.
    fn find_key(&self, key: &str) -> Option<usize> {
        if self.len == 0 {
            return None;
        }
        let h = self.hash_key(key);
        let (tag, mask) = (key_tag(h), self.mask());
        let mut p = h as usize & mask;
        loop {
            match self.tags[p] {
                0 => return None,
                t if t == tag => {
                    if let Some((_, k)) = &self.keys[p] {
                        if **k == *key {
                            return Some(p);
                        }
                    }
                }
                _ => {}
            }
            p = (p + 1) & mask;
        }
    }

    /// Position in `ids` of `id`'s slot, and the `keys` position it names.
    fn find_id(&self, id: u64) -> Option<(usize, usize)> {
        if self.len == 0 {
            return None;
        }
        let h = self.hash_id(id);
        let (tag, mask) = (h & TAG_MASK, self.mask());
        let mut q = h as usize & mask;
        loop {
            let s = self.ids[q];
            if s == 0 {
                return None;
            }
            if s & TAG_MASK == tag {
                let p = (s & POS_MASK) as usize - 1;
                if matches!(&self.keys[p], Some((i, _)) if *i == id) {
                    return Some((q, p));
                }
            }
            q = (q + 1) & mask;
        }
    }

    /// The ID bound to `key`.
    pub fn get(&self, key: &str) -> Option<u64> {
        let p = self.find_key(key)?;
        self.keys[p].as_ref().map(|(id, _)| *id)
    }

    /// The key bound to `id`.
    pub fn key_of(&self, id: u64) -> Option<&str> {
        match self.find_id(id) {
            Some((_, p)) => self.keys[p].as_ref().map(|(_, k)| &**k),
            None if self.shadowed.is_empty() => None,
            None => self.shadowed.get(&id).map(|k| &**k),
        }
    }

    pub fn contains_id(&self, id: u64) -> bool {
        self.key_of(id).is_some()
    }

    /// Number of keys with a binding.
    pub fn len(&self) -> usize {
        self.len
    }

    #[cfg(any(test, feature = "bench"))]
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Every binding, in no particular order.
    pub fn iter(&self) -> impl Iterator<Item = (u64, &str)> {
        self.keys
            .iter()
            .flatten()
            .map(|(id, k)| (*id, &**k))
            .chain(self.shadowed.iter().map(|(id, k)| (*id, &**k)))
    }

    /// Records in `ids` that `id`'s binding is at `keys` position `p`.
    fn put_id(&mut self, id: u64, p: usize) {
        let h = self.hash_id(id);
        let mask = self.mask();
        let mut q = h as usize & mask;
        while self.ids[q] != 0 {
            q = (q + 1) & mask;
        }
        self.ids[q] = (h & TAG_MASK) | (p as u64 + 1);
    }

    /// Position in `ids` of the slot recording that `id`'s binding is at `keys` position `p`
    /// (found by position: it also works while `keys[p]` already holds another binding).
    fn id_slot_at(&self, id: u64, p: usize) -> Option<usize> {
        let h = self.hash_id(id);
        let (want, mask) = ((h & TAG_MASK) | (p as u64 + 1), self.mask());
        let mut q = h as usize & mask;
        loop {
            match self.ids[q] {
                0 => return None,
                s if s == want => return Some(q),
                _ => q = (q + 1) & mask,
            }
        }
    }

    /// Points `id`'s slot in `ids` from `keys` position `from` to `to`.
    fn move_id(&mut self, id: u64, from: usize, to: usize) {
        debug_assert!(self.id_slot_at(id, from).is_some(), "every binding has its slot in `ids`");
        if let Some(q) = self.id_slot_at(id, from) {
            self.ids[q] = (self.ids[q] & TAG_MASK) | (to as u64 + 1);
        }
    }

    /// Empties `ids` slot `q` and shifts the rest of its probe run back (no tombstones).
    fn clear_id_slot(&mut self, mut q: usize) {
        let mask = self.mask();
        self.ids[q] = 0;
        let mut j = (q + 1) & mask;
        loop {
            let s = self.ids[j];
            if s == 0 {
                return;
            }
            let p = (s & POS_MASK) as usize - 1;
            let home = self.keys[p].as_ref().map_or(j, |(id, _)| self.hash_id(*id) as usize & mask);
            // The entry at `j` may move to the hole at `q` if its home is not in (q, j].
            if (j.wrapping_sub(home) & mask) >= (j.wrapping_sub(q) & mask) {
                self.ids[q] = s;
                self.ids[j] = 0;
                q = j;
            }
            j = (j + 1) & mask;
        }
    }

    /// Empties `keys` slot `p` (its `ids` slot already gone) and shifts the rest of its probe run
    /// back, repointing the moved bindings' `ids` slots.
    fn clear_key_slot(&mut self, mut p: usize) {
        let mask = self.mask();
        self.keys[p] = None;
        self.tags[p] = 0;
        let mut j = (p + 1) & mask;
        while self.tags[j] != 0 {
            let home = self.keys[j].as_ref().map_or(j, |(_, k)| self.hash_key(k) as usize & mask);
            if (j.wrapping_sub(home) & mask) >= (j.wrapping_sub(p) & mask) {
                self.keys[p] = self.keys[j].take();
                self.tags[p] = std::mem::take(&mut self.tags[j]);
                if let Some((id, _)) = &self.keys[p] {
                    let id = *id;
                    self.move_id(id, j, p);
                }
                p = j;
            }
            j = (j + 1) & mask;
        }
    }

    /// Doubles both tables (at least 8 slots) and places every binding again.
    fn grow(&mut self) {
        let cap = (self.keys.len() * 2).max(8);
        assert!((cap as u64) < POS_MASK, "more bindings than a cache can index");
        let old = std::mem::replace(&mut self.keys, (0..cap).map(|_| None).collect());
        self.tags = vec![0; cap];
        self.ids = vec![0; cap];
        let mask = cap - 1;
        for (id, key) in old.into_iter().flatten() {
            let h = self.hash_key(&key);
            let mut p = h as usize & mask;
            while self.tags[p] != 0 {
                p = (p + 1) & mask;
            }
            self.tags[p] = key_tag(h);
            self.keys[p] = Some((id, key));
        }
        for p in 0..cap {
            if let Some((id, _)) = &self.keys[p] {
                let id = *id;
                self.put_id(id, p);
            }
        }
    }

    /// Binds `id` to `key`. `id` must not be bound (remove it first); `key`'s index moves to this
    /// binding if it had another one.
    pub fn insert(&mut self, id: u64, key: Box<str>) {
        debug_assert!(!self.contains_id(id), "insert of a bound ID");
        if let Some(p) = self.find_key(&key) {
            // The key's older binding keeps its ID → key direction only.
            let Some((old_id, old_key)) = self.keys[p].replace((id, key)) else { return };
            if let Some(q) = self.id_slot_at(old_id, p) {
                self.clear_id_slot(q);
            }
            self.put_id(id, p);
            self.shadowed.insert(old_id, old_key);
            return;
        }
        if (self.len + 1) * 8 > self.keys.len() * 7 {
            self.grow();
        }
        let h = self.hash_key(&key);
        let mask = self.mask();
        let mut p = h as usize & mask;
        while self.tags[p] != 0 {
            p = (p + 1) & mask;
        }
        self.tags[p] = key_tag(h);
        self.keys[p] = Some((id, key));
        self.put_id(id, p);
        self.len += 1;
    }

    /// Unbinds `id`; returns its key.
    pub fn remove(&mut self, id: u64) -> Option<Box<str>> {
        let Some((q, p)) = self.find_id(id) else {
            return self.shadowed.remove(&id);
        };
        self.clear_id_slot(q);
        let key = self.keys[p].take().map(|(_, k)| k);
        self.clear_key_slot(p);
        self.len -= 1;
        key
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
                b.insert(id, key.as_str().into());
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
        b.insert(1, "k".into());
        b.insert(2, "k".into());
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
            b.insert(id, format!("key-{id}").into());
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

    /// The bytes per binding (DESIGN §6) rest on a `keys` slot being an ID and a key's fat pointer,
    /// with no word for the `Option` (the pointer's niche holds it).
    #[test]
    fn slots_stay_compact() {
        assert_eq!(std::mem::size_of::<Option<(u64, Box<str>)>>(), 24);
    }
}
