//! A raw scan of one pool's records, read independently of any allocator's cache: checks G1 (the
//! ID records and key records form a bijection) and that every reference names its key's ID, and
//! gives the per-key state (binding and holders) the linearizability check compares with.

use std::collections::{BTreeMap, BTreeSet};

use idalloc::layout::{IdRecord, Layout};
use idalloc::store::KeyValue;

/// What one scan found.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Scan {
    /// key -> ID, from key records that passed every check.
    pub bindings: BTreeMap<String, u64>,
    /// key -> holders with a reference.
    pub holders: BTreeMap<String, BTreeSet<String>>,
    /// Tombstoned IDs (reuse delay running).
    pub tombstones: usize,
    /// Broken guarantees, in words. Empty if all is well.
    pub problems: Vec<String>,
}

/// Analyses every record under the pool's data prefix, as read at one revision.
pub fn analyze(layout: &Layout, pool: &str, kvs: &[KeyValue]) -> Scan {
    let mut scan = Scan::default();
    let mut id_to_key: BTreeMap<u64, String> = BTreeMap::new();
    let mut key_to_id: BTreeMap<String, u64> = BTreeMap::new();
    let mut refs: Vec<(String, String, Vec<u8>)> = Vec::new();
    for kv in kvs {
        let name = String::from_utf8_lossy(&kv.key);
        if let Some(id) = layout.parse_id_key(pool, &kv.key) {
            match IdRecord::decode(&kv.value) {
                Some(IdRecord::Bound(k)) => {
                    id_to_key.insert(id, k);
                }
                Some(IdRecord::Tombstone(_)) => scan.tombstones += 1,
                None => scan.problems.push(format!("unreadable ID record {name}")),
            }
        } else if let Some(k) = layout.parse_key_key(pool, &kv.key) {
            match idalloc::layout::parse_id_value(&kv.value) {
                Some(id) => {
                    key_to_id.insert(k, id);
                }
                None => scan.problems.push(format!("unreadable key record {name}")),
            }
        } else if let Some((k, h)) = layout.parse_ref_key(pool, &kv.key) {
            refs.push((k, h, kv.value.clone()));
        } else if layout.parse_holder_key(pool, &kv.key).is_some() {
            // A holder's fence record (docs/design-notes.md, "Late commits"): no binding state.
        } else {
            scan.problems.push(format!("unexpected record {name}"));
        }
    }
    for (k, id) in &key_to_id {
        if id_to_key.get(id) != Some(k) {
            scan.problems
                .push(format!("G1: key {k:?} -> {id}, but ID {id} -> {:?}", id_to_key.get(id)));
        }
    }
    for (id, k) in &id_to_key {
        if key_to_id.get(k) != Some(id) {
            scan.problems
                .push(format!("G1: ID {id} -> {k:?}, but key {k:?} -> {:?}", key_to_id.get(k)));
        }
    }
    for (k, h, value) in refs {
        match key_to_id.get(&k) {
            Some(id) if idalloc::layout::parse_id_value(&value) == Some(*id) => {}
            other => scan.problems.push(format!(
                "reference of {h:?} to {k:?} holds {:?} but the key's ID is {other:?}",
                String::from_utf8_lossy(&value)
            )),
        }
        scan.holders.entry(k).or_default().insert(h);
    }
    scan.bindings = key_to_id;
    scan
}

#[cfg(test)]
mod tests {
    use super::*;

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
