//! Which records `check` must look at closely, found while streaming a pool one record family at
//! a time: the decision half of the streaming audit. Pure.
//!
//! The audit ([`super::audit`]) compares records across families: a key record with the ID
//! record it names, an ID record with its key's key record, references with their key's record.
//! Held whole, those families cost the pool's records in memory. Streamed, the families come in
//! different orders (IDs by decimal name, keys and references by escaped key), so they cannot be
//! merged. What is kept instead is one compact entry per *bound* ID: the ID (8 bytes), a 32-bit
//! hash of the key its record binds, and one bit, set when a key record names that ID with a key
//! of that hash. Three passes, in this order:
//! 1. `id/`: every readable, allowed ID record binding a key gets its entry; an unreadable or
//!    forbidden one is a suspect ID.
//! 2. `key/`: a key record naming an ID whose entry has its key's hash sets the bit (the pair is
//!    healthy); any other key record (unreadable, forbidden ID, an ID not bound, or bound to
//!    another key, or named twice) makes its key a suspect.
//! 3. `ref/`: a reference naming an ID bound to its key whose bit is set is healthy; any other
//!    makes its key a suspect.
//!
//! Then every entry whose bit is unset (an ID record no key record agrees with) is a suspect ID.
//!
//! A healthy pool has no suspects. `check.rs` then reads the suspects' records and, until nothing
//! new is named, the records they name (an ID record's key, a key record's ID, a reference's ID)
//! and runs the unchanged audit on that closure: every record the audit consults about a suspect
//! is in it (the proof is in docs/design/listings.md, "Streaming `check`"),
//! and a record outside it is half of a healthy pair, about which the audit says nothing. Being
//! a suspect only costs reads, so anything in doubt (a hash met twice, IDs out of order) is one.
//!
//! The hash is keyed per process (`RandomState`), so no key can be chosen to collide with
//! another. A breach is missed only when a stale record names a key whose hash equals the right
//! key's: about one chance in 4·10⁹ per breaching record, which `check` finds again the next run.

use std::collections::hash_map::RandomState;
use std::collections::BTreeSet;
use std::hash::BuildHasher;

use crate::decimal_ids::digits;
use crate::layout::IdRecord;
use crate::pool::PoolSpec;
use crate::protocol::id_is_allocatable;
use crate::records::{PoolSnapshot, Unreadable};

/// The bound IDs of one digit count, in ID order, with their key's hash and the bit.
#[derive(Default)]
struct Run {
    ids: Vec<u64>,
    hashes: Vec<u32>,
    confirmed: Vec<u64>,
}

impl Run {
    fn is_confirmed(&self, i: usize) -> bool {
        self.confirmed.get(i / 64).is_some_and(|w| w & (1 << (i % 64)) != 0)
    }
    fn confirm(&mut self, i: usize) {
        if self.confirmed.len() <= i / 64 {
            self.confirmed.resize(i / 64 + 1, 0);
        }
        self.confirmed[i / 64] |= 1 << (i % 64);
    }
}

/// The records a streamed pool needs looked at closely (see the module docs).
pub struct Suspects {
    spec: Option<PoolSpec>,
    hasher: RandomState,
    /// Entries by digit count: within one, ID record names sort as their IDs do.
    runs: Vec<Run>,
    /// Keys whose key record or references are in doubt.
    pub keys: BTreeSet<String>,
    /// IDs whose ID record is in doubt.
    pub ids: BTreeSet<u64>,
    /// Records whose names no allocator writes: findings as they are.
    pub unreadable: Vec<Unreadable>,
}

impl Suspects {
    /// For a pool with `spec` (`None`: its spec is missing or unusable, and IDs are not checked
    /// against a range, as [`super::audit`] does not).
    pub fn new(spec: Option<PoolSpec>) -> Self {
        Suspects {
            spec,
            hasher: RandomState::new(),
            runs: (0..=20).map(|_| Run::default()).collect(),
            keys: BTreeSet::new(),
            ids: BTreeSet::new(),
            unreadable: Vec::new(),
        }
    }

    fn hash(&self, key: &str) -> u32 {
        self.hasher.hash_one(key) as u32
    }

    fn allowed(&self, id: u64) -> bool {
        self.spec.as_ref().is_none_or(|s| id_is_allocatable(s, id))
    }

    /// Where bound `id`'s entry is, if it has one.
    fn find(&self, id: u64) -> Option<(usize, usize)> {
        let len = digits(id);
        let i = self.runs.get(len)?.ids.binary_search(&id).ok()?;
        Some((len, i))
    }

    /// Any page's records whose names no allocator writes (every pass calls this).
    pub fn unreadable_page(&mut self, page: &mut PoolSnapshot) {
        self.unreadable.append(&mut page.unreadable);
    }

    /// Pass 1: a page of `id/`, listed in key order.
    pub fn id_page(&mut self, page: &PoolSnapshot) {
        for (id, e) in &page.ids {
            let key = match &e.record {
                _ if !self.allowed(*id) => None,
                Some(IdRecord::Bound(k)) => Some(k),
                // A tombstone is healthy on its own; a key record naming it is the suspect.
                Some(IdRecord::Tombstone(_)) => continue,
                None => None,
            };
            let Some(key) = key else {
                self.ids.insert(*id);
                continue;
            };
            let hash = self.hash(key);
            let len = digits(*id);
            let Some(run) = self.runs.get_mut(len) else { continue };
            if run.ids.last().is_some_and(|last| last >= id) {
                // Not in key order: no entry (a search would miss it); looked at closely.
                self.ids.insert(*id);
                continue;
            }
            run.ids.push(*id);
            run.hashes.push(hash);
        }
    }

    /// Pass 2: a page of `key/`.
    pub fn key_page(&mut self, page: &PoolSnapshot) {
        for (k, e) in &page.keys {
            let healthy = e.id.filter(|id| self.allowed(*id)).and_then(|id| {
                let (len, i) = self.find(id)?;
                let run = &self.runs[len];
                (run.hashes[i] == self.hash(k) && !run.is_confirmed(i)).then_some((len, i))
            });
            match healthy {
                Some((len, i)) => self.runs[len].confirm(i),
                None => {
                    self.keys.insert(k.clone());
                }
            }
        }
    }

    /// Pass 3: a page of `ref/` (after every page of `key/`).
    pub fn ref_page(&mut self, page: &PoolSnapshot) {
        for (k, hs) in &page.refs {
            let hash = self.hash(k);
            let healthy = hs.values().all(|r| {
                r.id.and_then(|id| self.find(id)).is_some_and(|(len, i)| {
                    let run = &self.runs[len];
                    run.hashes[i] == hash && run.is_confirmed(i)
                })
            });
            if !healthy {
                self.keys.insert(k.clone());
            }
        }
    }

    /// After the three passes: every ID record no key record agreed with is a suspect too.
    /// Returns the suspect keys, the suspect IDs and the unreadable records (sorted by name, the
    /// order of a listing).
    pub fn finish(mut self) -> (BTreeSet<String>, BTreeSet<u64>, Vec<Unreadable>) {
        for run in &self.runs {
            for (i, id) in run.ids.iter().enumerate() {
                if !run.is_confirmed(i) {
                    self.ids.insert(*id);
                }
            }
        }
        self.unreadable.sort_by(|a, b| a.name.cmp(&b.name));
        (self.keys, self.ids, self.unreadable)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::layout::{encode_id, Layout};
    use crate::store::KeyValue;

    fn kv(key: Vec<u8>, value: impl Into<Vec<u8>>) -> KeyValue {
        KeyValue {
            key,
            value: value.into(),
            create_revision: 1,
            mod_revision: 1,
            version: 1,
            lease: 0,
        }
    }

    fn passes(kvs: &[KeyValue]) -> (BTreeSet<String>, BTreeSet<u64>) {
        let l = Layout::default();
        let page = PoolSnapshot::parse(&l, "p", kvs, 9);
        let mut s = Suspects::new(Some(PoolSpec::new("p", 1, 100)));
        s.id_page(&page);
        s.key_page(&page);
        s.ref_page(&page);
        let (keys, ids, _) = s.finish();
        (keys, ids)
    }

    #[test]
    fn a_healthy_pool_has_no_suspects_and_each_breach_has_some() {
        let l = Layout::default();
        let healthy = |k: &str, id: u64| {
            vec![
                kv(l.id_key("p", id), k),
                kv(l.key_key("p", k), encode_id(id)),
                kv(l.ref_key("p", k, "h"), encode_id(id)),
            ]
        };
        let mut kvs = healthy("a", 1);
        kvs.extend(healthy("b", 2));
        kvs.push(kv(l.id_key("p", 3), IdRecord::Tombstone("c".into()).encode()));
        assert_eq!(passes(&kvs), (BTreeSet::new(), BTreeSet::new()));
        // The key record of b names a's ID: b is a suspect, and 2 (no key record names it).
        let mut broken = kvs.clone();
        broken[4] = kv(l.key_key("p", "b"), encode_id(1));
        let (keys, ids) = passes(&broken);
        assert_eq!(
            (keys.into_iter().collect::<Vec<_>>(), ids.into_iter().collect::<Vec<_>>()),
            (vec!["b".to_string()], vec![2])
        );
        // A reference naming another ID than its key's.
        let mut broken = kvs.clone();
        broken.push(kv(l.ref_key("p", "a", "g"), encode_id(2)));
        assert_eq!(passes(&broken).0.into_iter().collect::<Vec<_>>(), ["a"]);
        // An ID out of the range, bound and agreed on by its key record.
        let out = healthy("z", 500);
        assert_eq!(passes(&out).1.into_iter().collect::<Vec<_>>(), [500]);
        // A key record naming a tombstone.
        let mut broken = kvs;
        broken.push(kv(l.key_key("p", "c"), encode_id(3)));
        assert_eq!(passes(&broken).0.into_iter().collect::<Vec<_>>(), ["c"]);
    }
}
