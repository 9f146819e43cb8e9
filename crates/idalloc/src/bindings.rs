//! A compact two-way index of bindings (ID ↔ key) for the cache.
//!
//! Every node caches every binding of the pools it uses, so the bytes per binding are what a large
//! deployment pays on every node (DESIGN §6; target ≤ 150 bytes beyond the key itself). Two maps
//! `id → key` and `key → id` cost a 24-byte bucket each (at a load of 50–87 %). Here only
//! `id → key` is a full map; the key direction is a hash table of bare IDs (8 bytes a bucket), whose
//! equality check looks the key up through the first map. `key_of` stays one probe; `get` costs one
//! more probe than with two full maps, and each binding about 35 bytes less
//! (docs/benchmarks-findings.md).
//!
//! Keys are `Arc<str>`, shared with the cache's events and tombstones instead of copied.

use std::hash::BuildHasher;
use std::sync::Arc;

use hashbrown::{HashMap, HashTable};

/// foldhash (hashbrown's default, per-process random seed): hashing the key is most of a cached
/// `get`, and SipHash was several times slower (docs/benchmarks-findings.md).
type Hasher = foldhash::fast::RandomState;

/// Bindings `id ↔ key`. `get` answers the newest binding of a key if the store (transiently, after
/// data loss) binds one key to two IDs.
#[derive(Default)]
pub struct Bindings {
    by_id: HashMap<u64, Arc<str>, Hasher>,
    /// IDs, hashed by their key.
    by_key: HashTable<u64>,
    hasher: Hasher,
}

impl std::fmt::Debug for Bindings {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Bindings").field("len", &self.by_id.len()).finish()
    }
}

impl Bindings {
    /// The ID bound to `key`.
    pub fn get(&self, key: &str) -> Option<u64> {
        let by_id = &self.by_id;
        self.by_key
            .find(self.hasher.hash_one(key), |id| by_id.get(id).is_some_and(|k| &**k == key))
            .copied()
    }

    /// The key bound to `id`.
    pub fn key_of(&self, id: u64) -> Option<&Arc<str>> {
        self.by_id.get(&id)
    }

    pub fn contains_id(&self, id: u64) -> bool {
        self.by_id.contains_key(&id)
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
    pub fn iter(&self) -> impl Iterator<Item = (u64, &Arc<str>)> {
        self.by_id.iter().map(|(id, k)| (*id, k))
    }

    /// Binds `id` to `key`. `id` must not be bound (remove it first); `key`'s index moves to this
    /// binding if it had another one.
    pub fn insert(&mut self, id: u64, key: Arc<str>) {
        let h = self.hasher.hash_one(&*key);
        self.by_id.insert(id, key);
        let (by_id, hasher) = (&self.by_id, &self.hasher);
        let key = &by_id[&id];
        match self.by_key.find_mut(h, |other| by_id.get(other).is_some_and(|k| k == key)) {
            Some(slot) => *slot = id,
            None => {
                // Every ID in `by_key` is in `by_id`, so rehashing on growth finds its key.
                self.by_key
                    .insert_unique(h, id, |i| by_id.get(i).map_or(0, |k| hasher.hash_one(&**k)));
            }
        }
    }

    /// Unbinds `id`; returns its key.
    pub fn remove(&mut self, id: u64) -> Option<Arc<str>> {
        let key = self.by_id.remove(&id)?;
        if let Ok(slot) = self.by_key.find_entry(self.hasher.hash_one(&*key), |other| *other == id)
        {
            slot.remove();
        }
        Some(key)
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use rand::rngs::StdRng;
    use rand::{Rng, SeedableRng};

    use super::*;

    /// Random inserts and removes against two plain maps, checking every lookup after each step.
    #[test]
    fn matches_a_pair_of_maps_under_random_changes() {
        let mut rng = StdRng::seed_from_u64(7);
        let mut b = Bindings::default();
        let mut by_id: HashMap<u64, String> = HashMap::new();
        let mut by_key: HashMap<String, u64> = HashMap::new();
        for step in 0..20_000 {
            let id = rng.random_range(0..300u64);
            if rng.random_bool(0.55) && !by_id.contains_key(&id) {
                let key = format!("k{}", rng.random_range(0..400u32));
                b.insert(id, Arc::from(key.as_str()));
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
                    assert_eq!(
                        b.key_of(id).map(|k| k.to_string()),
                        by_id.get(&id).cloned(),
                        "key_of({id})"
                    );
                }
                for k in 0..400 {
                    let k = format!("k{k}");
                    assert_eq!(b.get(&k), by_key.get(&k).copied(), "get({k})");
                }
                assert_eq!(b.len(), by_key.len());
                assert_eq!(b.iter().count(), by_id.len());
            }
        }
    }

    #[test]
    fn a_key_bound_twice_answers_the_newest_and_survives_either_removal() {
        let mut b = Bindings::default();
        b.insert(1, Arc::from("k"));
        b.insert(2, Arc::from("k"));
        assert_eq!(b.get("k"), Some(2));
        assert_eq!(b.remove(1).as_deref(), Some("k"));
        assert_eq!(b.get("k"), Some(2), "removing the older binding keeps the newer index");
        assert_eq!(b.remove(2).as_deref(), Some("k"));
        assert_eq!(b.get("k"), None);
        assert!(b.is_empty());
    }
}
