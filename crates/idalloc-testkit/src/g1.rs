//! The ONE checker of a pool's raw records, shared by the allocator tests, the regression tests,
//! the simulation and the chaos scan: G1 (ID records and key records form a bijection between
//! bound IDs and keys, DESIGN.md §2), no half-written binding and no unreadable record (G6), and
//! (separately, [`check_references`]) every holder's reference naming its key's ID.
//!
//! It reads records only through [`PoolSnapshot`], the library's one parser of a pool's records
//! (`idalloc::records`, also behind `idalloc check`), so tests and the audit cannot disagree on
//! what a record means. The checker reports every problem it finds, as values: each caller
//! decides what is excused (the simulation excuses G1 in a pool that lost data until repair).

use std::collections::BTreeMap;
use std::fmt;

use idalloc::layout::{IdRecord, Layout};
use idalloc::records::PoolSnapshot;
use idalloc::store::{list_all, KeyRange, Store, StoreResult};

/// One broken rule in a pool's records. `Display` starts with the guarantee it breaks.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Problem {
    /// An ID record no allocator writes (not a key, not a tombstone).
    UnreadableId { id: u64 },
    /// A key record whose value is not a canonical decimal ID.
    UnreadableKey { key: String },
    /// A record under the pool's data prefix that is no ID, key or reference record.
    Unexpected { name: String },
    /// Two ID records are bound to one key.
    KeyBoundTwice { key: String, ids: (u64, u64) },
    /// Two key records name one ID.
    IdNamedTwice { id: u64, keys: (String, String) },
    /// The key record names an ID whose record is bound to another key.
    KeyIdMismatch { key: String, id: u64, id_names: String },
    /// The key record names an ID with no bound record (absent or a tombstone): half written.
    KeyWithoutId { key: String, id: u64 },
    /// An ID record is bound to a key whose key record names another ID, or is missing.
    IdWithoutKey { id: u64, key: String, key_names: Option<u64> },
    /// A holder's reference does not hold its key's ID (or the key is not bound).
    Reference { key: String, holder: String, holds: Option<u64>, key_names: Option<u64> },
}

impl Problem {
    /// True for records that cannot be read at all (as opposed to readable records that
    /// contradict each other).
    pub fn is_unreadable(&self) -> bool {
        matches!(
            self,
            Problem::UnreadableId { .. }
                | Problem::UnreadableKey { .. }
                | Problem::Unexpected { .. }
        )
    }
}

impl fmt::Display for Problem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Problem::UnreadableId { id } => write!(f, "G6: unreadable ID record {id}"),
            Problem::UnreadableKey { key } => write!(f, "G6: unreadable key record {key:?}"),
            Problem::Unexpected { name } => write!(f, "G6: unexpected record {name:?}"),
            Problem::KeyBoundTwice { key, ids: (a, b) } => {
                write!(f, "G1: key {key:?} is bound by ID records {a} and {b}")
            }
            Problem::IdNamedTwice { id, keys: (a, b) } => {
                write!(f, "G1: ID {id} is named by key records {a:?} and {b:?}")
            }
            Problem::KeyIdMismatch { key, id, id_names } => {
                write!(f, "G1: key {key:?} -> {id}, but ID {id} -> {id_names:?}")
            }
            Problem::KeyWithoutId { key, id } => {
                write!(f, "G6: half-written binding {key:?} -> {id} (no bound ID record)")
            }
            Problem::IdWithoutKey { id, key, key_names } => {
                write!(f, "G1: ID {id} -> {key:?}, but key record {key:?} -> {key_names:?}")
            }
            Problem::Reference { key, holder, holds, key_names } => write!(
                f,
                "G2: reference of {holder:?} to {key:?} holds {holds:?} but the key's ID is \
                 {key_names:?}"
            ),
        }
    }
}

/// Reads every record of `pool` at one revision into the library's [`PoolSnapshot`].
pub async fn read_pool<S: Store + ?Sized>(
    store: &S,
    layout: &Layout,
    pool: &str,
) -> StoreResult<PoolSnapshot> {
    let (kvs, rev) =
        list_all(store, &KeyRange::prefix(layout.pool_data_prefix(pool)), 1000).await?;
    Ok(PoolSnapshot::parse(layout, pool, &kvs, rev))
}

/// Every G1 and G6 problem of the ID and key records of `snap` (references are not looked at:
/// see [`check_references`]). Empty if all is well.
pub fn check(snap: &PoolSnapshot) -> Vec<Problem> {
    let mut out = Vec::new();
    for u in &snap.unreadable {
        out.push(Problem::Unexpected { name: String::from_utf8_lossy(&u.name).into_owned() });
    }
    let mut id_of_key: BTreeMap<&str, u64> = BTreeMap::new();
    for (id, e) in &snap.ids {
        match &e.record {
            None => out.push(Problem::UnreadableId { id: *id }),
            Some(IdRecord::Tombstone(_)) => {}
            Some(IdRecord::Bound(k)) => {
                if let Some(first) = id_of_key.insert(k, *id) {
                    out.push(Problem::KeyBoundTwice { key: k.clone(), ids: (first, *id) });
                }
            }
        }
    }
    let mut key_of_id: BTreeMap<u64, &str> = BTreeMap::new();
    for (k, e) in &snap.keys {
        let Some(id) = e.id else {
            out.push(Problem::UnreadableKey { key: k.clone() });
            continue;
        };
        if let Some(first) = key_of_id.insert(id, k) {
            out.push(Problem::IdNamedTwice { id, keys: (first.to_string(), k.clone()) });
        }
        match snap.ids.get(&id).and_then(|e| e.record.as_ref()) {
            Some(IdRecord::Bound(named)) if named == k => {}
            Some(IdRecord::Bound(named)) => {
                out.push(Problem::KeyIdMismatch { key: k.clone(), id, id_names: named.clone() })
            }
            _ => out.push(Problem::KeyWithoutId { key: k.clone(), id }),
        }
    }
    for (id, k) in snap.bound() {
        let key_names = snap.keys.get(k).and_then(|e| e.id);
        if key_names != Some(id) {
            out.push(Problem::IdWithoutKey { id, key: k.to_string(), key_names });
        }
    }
    out
}

/// Every reference of `snap` that does not hold its key's ID.
pub fn check_references(snap: &PoolSnapshot) -> Vec<Problem> {
    let mut out = Vec::new();
    for (key, holders) in &snap.refs {
        let key_names = snap.keys.get(key).and_then(|e| e.id);
        for (holder, r) in holders {
            if key_names.is_none() || r.id != key_names {
                out.push(Problem::Reference {
                    key: key.clone(),
                    holder: holder.clone(),
                    holds: r.id,
                    key_names,
                });
            }
        }
    }
    out
}

/// Panics with every problem [`check`] finds in `pool`, and the revision it read at: the
/// assertion the allocator and regression tests make.
pub async fn assert_g1<S: Store + ?Sized>(store: &S, layout: &Layout, pool: &str) {
    let snap = read_pool(store, layout, pool).await.expect("read the pool's records");
    let problems = check(&snap);
    assert!(
        problems.is_empty(),
        "pool {pool:?} at revision {}: {}",
        snap.revision,
        problems.iter().map(ToString::to_string).collect::<Vec<_>>().join("; ")
    );
}

#[cfg(test)]
mod tests {
    use super::*;
    use idalloc::layout::encode_id;
    use idalloc::store::KeyValue;

    fn kv(k: Vec<u8>, v: impl Into<Vec<u8>>) -> KeyValue {
        KeyValue {
            key: k,
            value: v.into(),
            create_revision: 1,
            mod_revision: 1,
            version: 1,
            lease: 0,
        }
    }

    fn bound(l: &Layout, id: u64, key: &str) -> Vec<KeyValue> {
        vec![
            kv(l.id_key("p", id), IdRecord::Bound(key.into()).encode()),
            kv(l.key_key("p", key), encode_id(id)),
        ]
    }

    fn problems(l: &Layout, kvs: &[KeyValue]) -> Vec<Problem> {
        let snap = PoolSnapshot::parse(l, "p", kvs, 9);
        let mut all = check(&snap);
        all.extend(check_references(&snap));
        all
    }

    #[test]
    fn a_consistent_pool_has_no_problem() {
        let l = Layout::default();
        let mut kvs = bound(&l, 3, "a");
        kvs.extend(bound(&l, 4, "b/c"));
        kvs.push(kv(l.ref_key("p", "a", "h"), encode_id(3)));
        kvs.push(kv(l.id_key("p", 5), IdRecord::Tombstone("old".into()).encode()));
        assert_eq!(problems(&l, &kvs), []);
    }

    #[test]
    fn each_break_is_named() {
        let l = Layout::default();
        let p = |kvs: Vec<KeyValue>| problems(&l, &kvs);
        // Two ID records for one key: the key record can name only one of them.
        let mut kvs = bound(&l, 3, "a");
        kvs.push(kv(l.id_key("p", 4), IdRecord::Bound("a".into()).encode()));
        assert_eq!(
            p(kvs),
            [
                Problem::KeyBoundTwice { key: "a".into(), ids: (3, 4) },
                Problem::IdWithoutKey { id: 4, key: "a".into(), key_names: Some(3) },
            ]
        );
        // Two key records on one ID.
        let mut kvs = bound(&l, 3, "a");
        kvs.push(kv(l.key_key("p", "b"), encode_id(3)));
        assert_eq!(
            p(kvs),
            [
                Problem::IdNamedTwice { id: 3, keys: ("a".into(), "b".into()) },
                Problem::KeyIdMismatch { key: "b".into(), id: 3, id_names: "a".into() },
            ]
        );
        // Half written, both ways; a tombstone is no binding.
        assert_eq!(
            p(vec![kv(l.key_key("p", "a"), encode_id(3))]),
            [Problem::KeyWithoutId { key: "a".into(), id: 3 }]
        );
        assert_eq!(
            p(vec![
                kv(l.key_key("p", "a"), encode_id(3)),
                kv(l.id_key("p", 3), IdRecord::Tombstone("a".into()).encode()),
            ]),
            [Problem::KeyWithoutId { key: "a".into(), id: 3 }]
        );
        assert_eq!(
            p(vec![kv(l.id_key("p", 3), IdRecord::Bound("a".into()).encode())]),
            [Problem::IdWithoutKey { id: 3, key: "a".into(), key_names: None }]
        );
        // Unreadable records.
        let bad = p(vec![
            kv(l.id_key("p", 3), ""),
            kv(l.key_key("p", "a"), "03"),
            kv(b"idalloc/data/p/zzz".to_vec(), "x"),
        ]);
        assert_eq!(bad.len(), 3);
        assert!(bad.iter().all(Problem::is_unreadable), "{bad:?}");
        // References: to the wrong ID, and to an unbound key.
        let mut kvs = bound(&l, 3, "a");
        kvs.push(kv(l.ref_key("p", "a", "h"), encode_id(4)));
        kvs.push(kv(l.ref_key("p", "z", "h"), encode_id(4)));
        let refs = p(kvs);
        assert_eq!(refs.len(), 2);
        assert!(
            refs.iter().all(|r| r.to_string().starts_with("G2: reference of \"h\"")),
            "{refs:?}"
        );
    }

    #[tokio::test]
    async fn assert_g1_reads_the_store() {
        use idalloc::store::embedded::EmbeddedStore;
        use idalloc::store::{TxnOp, TxnRequest};
        let l = Layout::default();
        let s = EmbeddedStore::memory();
        let put = |kvs: Vec<KeyValue>| {
            TxnRequest::new().and_then(kvs.into_iter().map(|kv| TxnOp::put(kv.key, kv.value)))
        };
        s.txn(put(bound(&l, 3, "a"))).await.unwrap();
        assert_g1(&s, &l, "p").await;
        s.txn(put(vec![kv(l.key_key("p", "b"), encode_id(3))])).await.unwrap();
        let broken = tokio::spawn(async move { assert_g1(&s, &Layout::default(), "p").await });
        let panic = broken.await.unwrap_err().into_panic();
        let msg = panic.downcast_ref::<String>().cloned().unwrap_or_default();
        assert!(msg.contains("G1: ID 3 is named by key records \"a\" and \"b\""), "{msg}");
    }
}
