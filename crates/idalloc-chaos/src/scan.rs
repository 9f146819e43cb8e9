//! A raw scan of one pool's records, read independently of any allocator's cache: the testkit's
//! one record checker (`idalloc_testkit::g1`: G1, half-written bindings, references naming their
//! key's ID) on the library's one record parser, plus the per-key state (binding and holders) the
//! linearizability check compares with.

use std::collections::{BTreeMap, BTreeSet};

use idalloc::layout::IdRecord;
use idalloc::records::PoolSnapshot;
use idalloc_testkit::g1::{check, check_references};

/// What one scan found.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Scan {
    /// key -> ID, from readable key records.
    pub bindings: BTreeMap<String, u64>,
    /// key -> holders with a reference.
    pub holders: BTreeMap<String, BTreeSet<String>>,
    /// Tombstoned IDs (reuse delay running).
    pub tombstones: usize,
    /// Broken guarantees, in words. Empty if all is well.
    pub problems: Vec<String>,
}

/// Analyses every record of the pool, as read at one revision.
pub fn analyze(snap: &PoolSnapshot) -> Scan {
    let problems = check(snap).into_iter().chain(check_references(snap));
    Scan {
        bindings: snap.keys.iter().filter_map(|(k, e)| Some((k.clone(), e.id?))).collect(),
        holders: snap
            .refs
            .iter()
            .map(|(k, hs)| (k.clone(), hs.keys().cloned().collect()))
            .collect(),
        tombstones: snap
            .ids
            .values()
            .filter(|e| matches!(e.record, Some(IdRecord::Tombstone(_))))
            .count(),
        problems: problems.map(|p| p.to_string()).collect(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use idalloc::layout::Layout;
    use idalloc::store::KeyValue;

    fn analyze(l: &Layout, pool: &str, kvs: &[KeyValue]) -> Scan {
        super::analyze(&PoolSnapshot::parse(l, pool, kvs, 1))
    }

    fn kv(k: Vec<u8>, v: &[u8]) -> KeyValue {
        KeyValue {
            key: k,
            value: v.to_vec(),
            create_revision: 1,
            mod_revision: 1,
            version: 1,
            lease: 0,
        }
    }

    #[test]
    fn a_consistent_pool_passes_and_breaks_are_named() {
        let l = Layout::new("p").unwrap();
        let good = vec![
            kv(l.id_key("x", 3), &IdRecord::Bound("a".into()).encode()),
            kv(l.key_key("x", "a"), b"3"),
            kv(l.ref_key("x", "a", "h1"), b"3"),
            kv(l.id_key("x", 4), &IdRecord::Tombstone("b".into()).encode()),
        ];
        let s = analyze(&l, "x", &good);
        assert!(s.problems.is_empty(), "{:?}", s.problems);
        assert_eq!(s.bindings.get("a"), Some(&3));
        assert_eq!(s.holders["a"], ["h1".to_string()].into());
        assert_eq!(s.tombstones, 1);

        // Two keys on one ID.
        let mut bad = good.clone();
        bad.push(kv(l.key_key("x", "b"), b"3"));
        assert!(analyze(&l, "x", &bad).problems.iter().any(|p| p.starts_with("G1")));
        // A reference without a binding.
        let stray = vec![kv(l.ref_key("x", "c", "h1"), b"9")];
        assert_eq!(analyze(&l, "x", &stray).problems.len(), 1);
    }
}
