//! Reading the store's raw records back into typed ones: the ONE parser of what DESIGN §4 lays out.
//!
//! Everything that looks at a pool's records as a whole (the `check` audit, the test kit's G1
//! checker, chaos scans, the simulation's invariant checks) starts from a [`PoolSnapshot`]: every
//! record under `P/data/<pool>/` read at one revision, sorted into ID, key, reference and holder
//! fence records.
//! Nothing is dropped silently: a record whose name or value no allocator writes is kept as an
//! [`Unreadable`] entry (an unreadable ID record still occupies its ID, DESIGN §11), and records that
//! look like another idalloc deployment's (its `pools/` or `data/` under this pool's prefix) are
//! marked as nested.
//!
//! Spec records (`P/pools/<name>`) are read by [`parse_spec`], which refuses a spec whose `name`
//! is not its record's name: trusting it would let `pools/lies` holding `{"name":"good"}` write
//! into pool `good`.
//!
//! Pure: no I/O. `check.rs` and the allocator feed it listings.

use std::collections::BTreeMap;
use std::fmt;

use crate::layout::{parse_id_value, IdRecord, Layout};
use crate::pool::PoolSpec;
use crate::store::{KeyValue, LeaseId, Revision};

/// Why a spec record cannot be used.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SpecProblemKind {
    /// The record's name is not `P/pools/<valid pool name>` (for example a nested deployment's
    /// `P/pools/x/pools/y`, or a name with capitals).
    BadRecordName,
    /// The value is not a valid spec (not JSON, a broken rule...).
    Unreadable(String),
    /// The spec is valid but names another pool than its record does.
    NameMismatch {
        /// The `name` field inside the spec.
        spec_name: String,
    },
}

/// A spec record that is reported instead of used.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SpecProblem {
    /// The record's name, as shown to people (lossy UTF-8).
    pub record: String,
    /// The pool the record's name stands for, when the name is valid.
    pub pool: Option<String>,
    pub kind: SpecProblemKind,
}

impl fmt::Display for SpecProblem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.kind {
            SpecProblemKind::BadRecordName => write!(
                f,
                "spec record {:?} is not named after a valid pool (another deployment's records \
                 under this prefix, or written by hand)",
                self.record
            ),
            SpecProblemKind::Unreadable(why) => {
                write!(f, "pool spec record {:?} is unreadable: {why}", self.record)
            }
            SpecProblemKind::NameMismatch { spec_name } => write!(
                f,
                "pool spec record {:?} holds the spec of pool {spec_name:?}; a spec must name its \
                 own record's pool, so it is not used (fix or delete the record; see `idalloc check`)",
                self.record
            ),
        }
    }
}

/// A spec record that cannot be used is corrupt data, named by its record.
impl From<SpecProblem> for crate::error::Error {
    fn from(p: SpecProblem) -> Self {
        let reason = match &p.kind {
            SpecProblemKind::BadRecordName => "it is not named after a valid pool (another \
                deployment's records under this prefix, or written by hand)"
                .to_string(),
            SpecProblemKind::Unreadable(why) => format!("the spec is unreadable: {why}"),
            SpecProblemKind::NameMismatch { spec_name } => format!(
                "it holds the spec of pool {spec_name:?}; a spec must name its own record's pool, \
                 so it is not used (fix or delete the record; see `idalloc check`)"
            ),
        };
        crate::error::Error::corrupt(p.record, reason)
    }
}

/// Reads one spec record (`P/pools/<name>`): the spec, or why it cannot be used.
pub fn parse_spec(layout: &Layout, kv: &KeyValue) -> Result<PoolSpec, SpecProblem> {
    let record = String::from_utf8_lossy(&kv.key).into_owned();
    let Some(pool) = layout.parse_pool_spec_key(&kv.key) else {
        return Err(SpecProblem { record, pool: None, kind: SpecProblemKind::BadRecordName });
    };
    match PoolSpec::from_json(&kv.value) {
        Err(e) => Err(SpecProblem {
            record,
            pool: Some(pool),
            kind: SpecProblemKind::Unreadable(e.to_string()),
        }),
        Ok(spec) if spec.name() != pool => Err(SpecProblem {
            record,
            kind: SpecProblemKind::NameMismatch { spec_name: spec.name().to_string() },
            pool: Some(pool),
        }),
        Ok(spec) => Ok(spec),
    }
}

/// Every spec record under `P/pools/`, sorted into usable specs (by name) and problems.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PoolListing {
    pub pools: Vec<PoolSpec>,
    pub broken: Vec<SpecProblem>,
}

/// Sorts a listing of `P/pools/` (see [`PoolListing`]).
pub fn parse_pool_listing(layout: &Layout, kvs: &[KeyValue]) -> PoolListing {
    let mut out = PoolListing::default();
    for kv in kvs {
        match parse_spec(layout, kv) {
            Ok(spec) => out.pools.push(spec),
            Err(p) => out.broken.push(p),
        }
    }
    out.pools.sort_by(|a, b| a.name().cmp(b.name()));
    out
}

/// An ID record (`id/<ID>`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct IdEntry {
    /// The decoded value; `None` when no allocator writes such a value (empty, not UTF-8...): the
    /// ID still counts as used.
    pub record: Option<IdRecord>,
    pub mod_revision: Revision,
    pub lease: LeaseId,
}

/// A key record (`key/<enc(k)>`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KeyEntry {
    /// The ID it names; `None` when the value is not a canonical decimal ID.
    pub id: Option<u64>,
    pub mod_revision: Revision,
}

/// A reference record (`ref/<enc(k)>/<enc(h)>`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RefEntry {
    /// The ID the holder was given; `None` when the value is not a canonical decimal ID.
    pub id: Option<u64>,
    pub mod_revision: Revision,
    /// The session lease it lives on (0: durable).
    pub lease: LeaseId,
}

/// A record under the pool's data prefix whose name no allocator writes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Unreadable {
    /// The full record name.
    pub name: Vec<u8>,
    pub mod_revision: Revision,
    /// True when it looks like another idalloc deployment's record (a `pools/` or `data/` segment
    /// below this pool's prefix): a deployment whose prefix lies inside this one's.
    pub nested: bool,
}

/// A pool's records at one revision, typed. Keys and holders are the decoded strings.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PoolSnapshot {
    pub pool: String,
    /// The revision the records were read at.
    pub revision: Revision,
    pub ids: BTreeMap<u64, IdEntry>,
    pub keys: BTreeMap<String, KeyEntry>,
    /// key -> holder -> reference.
    pub refs: BTreeMap<String, BTreeMap<String, RefEntry>>,
    /// Records whose names are not ID, key, reference or fence names.
    /// Durable holders' fence records (`holder/<enc(h)>`): holder -> the record's mod revision.
    pub fences: BTreeMap<String, Revision>,
    /// The pool's fence floor (`fence`, where the sweeper folds fence records): its mod revision.
    pub fence_floor: Option<Revision>,
    pub unreadable: Vec<Unreadable>,
}

impl PoolSnapshot {
    /// Sorts the records of a listing of `P/data/<pool>/` (any order; records outside it are
    /// ignored) taken at `revision`.
    pub fn parse(layout: &Layout, pool: &str, kvs: &[KeyValue], revision: Revision) -> Self {
        let data = layout.pool_data_prefix(pool);
        let mut s = PoolSnapshot { pool: pool.to_string(), revision, ..Default::default() };
        for kv in kvs {
            let Some(rest) = kv.key.strip_prefix(data.as_slice()) else {
                continue;
            };
            if let Some(id) = layout.parse_id_key(pool, &kv.key) {
                s.ids.insert(
                    id,
                    IdEntry {
                        record: IdRecord::decode(&kv.value),
                        mod_revision: kv.mod_revision,
                        lease: kv.lease,
                    },
                );
            } else if let Some(key) = layout.parse_key_key(pool, &kv.key) {
                s.keys.insert(
                    key,
                    KeyEntry { id: parse_id_value(&kv.value), mod_revision: kv.mod_revision },
                );
            } else if let Some((key, holder)) = layout.parse_ref_key(pool, &kv.key) {
                s.refs.entry(key).or_default().insert(
                    holder,
                    RefEntry {
                        id: parse_id_value(&kv.value),
                        mod_revision: kv.mod_revision,
                        lease: kv.lease,
                    },
                );
            } else if let Some(holder) = layout.parse_holder_key(pool, &kv.key) {
                s.fences.insert(holder, kv.mod_revision);
            } else if kv.key == layout.fence_floor_key(pool) {
                s.fence_floor = Some(kv.mod_revision);
            } else {
                s.unreadable.push(Unreadable {
                    name: kv.key.clone(),
                    mod_revision: kv.mod_revision,
                    nested: looks_nested(rest),
                });
            }
        }
        s
    }

    /// The keys bound by a readable ID record (not tombstones), by ID.
    pub fn bound(&self) -> impl Iterator<Item = (u64, &str)> {
        self.ids.iter().filter_map(|(id, e)| match &e.record {
            Some(IdRecord::Bound(k)) => Some((*id, k.as_str())),
            _ => None,
        })
    }

    /// The holders of `key` (empty if none).
    pub fn holders(&self, key: &str) -> impl Iterator<Item = (&str, &RefEntry)> {
        self.refs.get(key).into_iter().flat_map(|m| m.iter().map(|(h, r)| (h.as_str(), r)))
    }

    /// True if any holder references `key`.
    pub fn is_referenced(&self, key: &str) -> bool {
        self.refs.get(key).is_some_and(|m| !m.is_empty())
    }
}

/// A record name (relative to a pool's data prefix) that another deployment would write: one
/// whose prefix is `<this pool's data prefix>[.../]` has `pools/` and `data/` records there.
fn looks_nested(rest: &[u8]) -> bool {
    let s = String::from_utf8_lossy(rest);
    let segs: Vec<&str> = s.split('/').collect();
    segs.iter()
        .enumerate()
        .any(|(i, seg)| (*seg == "pools" || *seg == "data") && i + 1 < segs.len())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::layout::encode_id;

    fn kv(key: impl Into<Vec<u8>>, value: impl Into<Vec<u8>>, rev: Revision) -> KeyValue {
        KeyValue {
            key: key.into(),
            value: value.into(),
            create_revision: rev,
            mod_revision: rev,
            version: 1,
            lease: 0,
        }
    }

    #[test]
    fn specs_must_name_their_record() {
        let l = Layout::default();
        let good = PoolSpec::new("good", 1, 10);
        assert_eq!(
            parse_spec(&l, &kv(l.pool_spec_key("good"), good.to_json(), 1)),
            Ok(good.clone())
        );
        let lie = parse_spec(&l, &kv(l.pool_spec_key("lies"), good.to_json(), 1)).unwrap_err();
        assert_eq!(lie.pool.as_deref(), Some("lies"));
        assert_eq!(lie.kind, SpecProblemKind::NameMismatch { spec_name: "good".into() });
        assert!(lie.to_string().contains("\"good\""), "{lie}");
        let bad = parse_spec(&l, &kv(l.pool_spec_key("x"), "{not json", 1)).unwrap_err();
        assert!(matches!(bad.kind, SpecProblemKind::Unreadable(_)), "{bad:?}");
        let nested = parse_spec(&l, &kv("idalloc/pools/x/pools/y", good.to_json(), 1)).unwrap_err();
        assert_eq!((nested.pool, nested.kind), (None, SpecProblemKind::BadRecordName));
    }

    #[test]
    fn listing_serves_good_specs_and_reports_broken_ones() {
        let l = Layout::default();
        let kvs = vec![
            kv(l.pool_spec_key("b"), PoolSpec::new("b", 1, 10).to_json(), 1),
            kv(l.pool_spec_key("a"), PoolSpec::new("a", 1, 10).to_json(), 2),
            kv(l.pool_spec_key("broken"), "", 3),
            kv(l.pool_spec_key("lies"), PoolSpec::new("a", 1, 99).to_json(), 4),
        ];
        let listing = parse_pool_listing(&l, &kvs);
        let names: Vec<&str> = listing.pools.iter().map(|s| s.name()).collect();
        assert_eq!(names, ["a", "b"]);
        let broken: Vec<Option<&str>> = listing.broken.iter().map(|p| p.pool.as_deref()).collect();
        assert_eq!(broken, [Some("broken"), Some("lies")]);
    }

    #[test]
    fn snapshot_sorts_every_record() {
        let l = Layout::default();
        let p = "p";
        let mut tomb = vec![crate::layout::TOMBSTONE_MARK];
        tomb.extend_from_slice(b"old");
        let kvs = vec![
            kv(l.id_key(p, 7), "a/b", 10),
            kv(l.key_key(p, "a/b"), encode_id(7), 10),
            kv(l.ref_key(p, "a/b", "h/1"), encode_id(7), 11),
            kv(l.id_key(p, 8), tomb, 12),
            kv(l.id_key(p, 9), "", 13),
            kv(l.id_key(p, 10), b"\xff".to_vec(), 13),
            kv(l.key_key(p, "x"), "07", 14),
            kv(l.ref_key(p, "x", "h"), "", 15),
            kv(b"idalloc/data/p/id/007".to_vec(), "k", 16),
            kv(b"idalloc/data/p/pools/q".to_vec(), "{}", 17),
            kv(b"idalloc/data/p/data/q/id/1".to_vec(), "k", 18),
            kv(l.id_key("other", 1), "k", 19),
            kv(l.holder_key(p, "h/1"), "", 19),
            kv(l.fence_floor_key(p), "", 23),
        ];
        let s = PoolSnapshot::parse(&l, p, &kvs, 20);
        assert_eq!(s.revision, 20);
        assert_eq!(s.ids.len(), 4);
        assert_eq!(s.fences.get("h/1"), Some(&19), "a fence record is no unreadable record");
        assert_eq!(s.fence_floor, Some(23), "nor is the fence floor");
        assert_eq!(s.ids[&7].record, Some(IdRecord::Bound("a/b".into())));
        assert_eq!(s.ids[&8].record, Some(IdRecord::Tombstone("old".into())));
        assert_eq!(s.ids[&9].record, None, "empty value: unreadable but present");
        assert_eq!(s.ids[&10].record, None, "lone 0xFF: unreadable but present");
        assert_eq!(s.keys["a/b"], KeyEntry { id: Some(7), mod_revision: 10 });
        assert_eq!(s.keys["x"].id, None, "non-canonical value");
        assert_eq!(s.refs["a/b"]["h/1"].id, Some(7));
        assert_eq!(s.refs["x"]["h"].id, None);
        assert!(s.is_referenced("a/b") && !s.is_referenced("zzz"));
        assert_eq!(s.bound().collect::<Vec<_>>(), [(7, "a/b")]);
        let un: Vec<(String, bool)> = s
            .unreadable
            .iter()
            .map(|u| (String::from_utf8_lossy(&u.name).into_owned(), u.nested))
            .collect();
        assert_eq!(
            un,
            [
                ("idalloc/data/p/id/007".to_string(), false),
                ("idalloc/data/p/pools/q".to_string(), true),
                ("idalloc/data/p/data/q/id/1".to_string(), true),
            ]
        );
    }
}
