//! The invariants of a pool's records (DESIGN §4, §11) as pure checks, and the repairs that are
//! safe to make while allocators keep running: the decision half of `idalloc check`.
//!
//! [`audit`] turns a [`PoolSnapshot`] into [`Finding`]s; [`plan`] turns one finding into a
//! [`Repair`] (one txn) or `None` when no fix is safe without a person's judgement. Every repair
//! txn compares the mod revision of each record it read (and of the pool's spec) against the
//! snapshot, and where it relies on "nobody holds this key" it compares the key's reference range
//! empty. So a repair applied after any allocator touched those records simply fails and changes
//! nothing: a concurrent allocator is never harmed. The I/O (reading at one revision, sending
//! the txns) is in `check.rs`. Every planned txn also passes [`removes_protected`] (`guard.rs`):
//! no repair deletes a tombstone or a binding an idle key may come back to (DESIGN §8).
//!
//! Over 600 lines only with its tests: the audit and the repair planning (`audit`, `plan`) are
//! about 560 lines of pure code, the rest checks each kind of finding and its repair.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;

use serde::Serialize;

mod guard;
mod suspects;

pub use guard::{contradicts_holders, held_id, removes_protected, RepairContext};
pub use suspects::Suspects;

use crate::layout::{encode_id, IdRecord};
use crate::pool::PoolSpec;
use crate::protocol::id_is_allocatable;
use crate::records::{PoolSnapshot, SpecProblem, SpecProblemKind};
use crate::store::{Compare, KeyRange, TxnOp, TxnRequest};

/// One breach of the layout's invariants. Keys and holders are the decoded strings; `record` is a
/// full record name (lossy UTF-8).
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Finding {
    /// The pool's spec record cannot be read (not JSON, a broken rule, a bad record name).
    SpecUnreadable { record: String, pool: Option<String>, reason: String },
    /// The pool's spec record holds another pool's spec.
    SpecNameMismatch { record: String, pool: String, spec_name: String },
    /// This deployment's prefix lies inside another deployment's, or contains one.
    NestedPrefix { message: String },
    /// Records under a pool's data prefix with no spec for that pool.
    DataWithoutSpec { pool: String, records: usize },
    /// A record whose name no allocator writes; `nested` when it looks like another idalloc
    /// deployment's record (a deployment whose prefix lies inside this one's).
    UnreadableRecord { record: String, nested: bool },
    /// An ID record whose value is not a key or tombstone (the ID counts as used).
    UnreadableIdValue { id: u64 },
    /// A key record whose value is not a decimal ID.
    UnreadableKeyValue { key: String },
    /// A reference record whose value is not a decimal ID.
    UnreadableRefValue { key: String, holder: String },
    /// Several key records name the same ID (G1 broken).
    IdBoundToTwoKeys { id: u64, keys: Vec<String> },
    /// Several ID records bind the same key.
    KeyBoundToTwoIds { key: String, ids: Vec<u64> },
    /// A key record whose ID record is missing, a tombstone, or names another key (`id_record`
    /// says which).
    KeyWithoutIdRecord { key: String, id: u64, id_record: String },
    /// An ID record binding a key whose key record is missing or names another ID.
    IdWithoutKeyRecord { id: u64, key: String, key_record: Option<u64> },
    /// References on a key that has no key record, or whose key record names another ID than the
    /// references do.
    RefWithoutBinding {
        key: String,
        holders: Vec<String>,
        ref_ids: Vec<u64>,
        key_record: Option<u64>,
    },
    /// An ID the pool never hands out (outside its range, without its prefix bits, or reserved),
    /// in a key or ID record.
    IdOutOfRange { id: u64, key: Option<String>, reserved: bool },
    /// A quota record of `idalloc serve` whose value it would not have written.
    UnreadableQuotaValue { record: String },
    /// Reference slots (`slots`) or a mirror (`mirror`) of `client` counting holder `holder`'s
    /// reference on `key`, which is absent: they count nothing.
    QuotaWithoutReference {
        client: String,
        key: String,
        holder: String,
        slots: Vec<u64>,
        mirror: bool,
    },
    /// A reference that `client`'s quota records name but that is not counted by exactly one
    /// slot and a mirror naming it (`mirror`: the slot the mirror names), all on its lease.
    QuotaMiscounted {
        client: String,
        key: String,
        holder: String,
        slots: Vec<u64>,
        mirror: Option<u64>,
    },
    /// A pool whose creator record names pool slot `slot` of `client`, which is absent or
    /// counts another pool (`counts`): the pool counts against nobody's `pools=`.
    PoolCreatorWithoutSlot { pool: String, client: String, slot: u64, counts: Option<String> },
    /// Pool slot `slot` of `client` naming `pool`, whose creator record does not name it (the
    /// pool is gone, or counted by another slot): it counts no pool.
    PoolSlotWithoutPool { client: String, slot: u64, pool: String },
}

impl fmt::Display for Finding {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        use crate::error::show_value as v;
        match self {
            Finding::SpecUnreadable { record, reason, .. } => {
                write!(f, "spec record {record:?} is unreadable: {reason}")
            }
            Finding::SpecNameMismatch { record, spec_name, .. } => {
                write!(f, "spec record {record:?} holds the spec of pool {spec_name:?}")
            }
            Finding::NestedPrefix { message } => write!(f, "{message}"),
            Finding::DataWithoutSpec { pool, records } => {
                write!(f, "{records} records under the data of pool {pool:?}, which has no spec")
            }
            Finding::UnreadableRecord { record, nested: true } => write!(
                f,
                "record {record:?} belongs to another idalloc deployment whose prefix lies inside \
                 this one's (nested prefixes)"
            ),
            Finding::UnreadableRecord { record, nested: false } => {
                write!(f, "record {record:?} is not an ID, key or reference record")
            }
            Finding::UnreadableIdValue { id } => {
                write!(f, "ID record {id} holds neither a key nor a tombstone")
            }
            Finding::UnreadableKeyValue { key } => {
                write!(f, "key record of {} does not hold a decimal ID", v(key))
            }
            Finding::UnreadableRefValue { key, holder } => {
                write!(f, "reference of {} on key {} does not hold a decimal ID", v(holder), v(key))
            }
            Finding::IdBoundToTwoKeys { id, keys } => {
                let ks: Vec<String> = keys.iter().map(|k| v(k)).collect();
                write!(f, "ID {id} is named by the key records of {}", ks.join(", "))
            }
            Finding::KeyBoundToTwoIds { key, ids } => {
                write!(f, "key {} is bound by ID records {ids:?}", v(key))
            }
            Finding::KeyWithoutIdRecord { key, id, id_record } => {
                write!(f, "key {} names ID {id}, whose ID record is {id_record}", v(key))
            }
            Finding::IdWithoutKeyRecord { id, key, key_record: None } => {
                write!(f, "ID {id} binds key {}, which has no key record", v(key))
            }
            Finding::IdWithoutKeyRecord { id, key, key_record: Some(other) } => {
                write!(f, "ID {id} binds key {}, whose key record names ID {other}", v(key))
            }
            Finding::RefWithoutBinding { key, holders, ref_ids, key_record } => {
                let hs: Vec<String> = holders.iter().map(|h| v(h)).collect();
                match key_record {
                    None => write!(
                        f,
                        "key {} is held by {} (IDs {ref_ids:?}) but has no key record",
                        v(key),
                        hs.join(", ")
                    ),
                    Some(n) => write!(
                        f,
                        "key {} is held by {} with IDs {ref_ids:?} but its key record names ID {n}",
                        v(key),
                        hs.join(", ")
                    ),
                }
            }
            Finding::IdOutOfRange { id, key, reserved } => {
                let why = if *reserved {
                    "reserved"
                } else {
                    "outside the pool's range or without its prefix bits"
                };
                match key {
                    Some(k) => write!(f, "ID {id} of key {} is {why}", v(k)),
                    None => write!(f, "ID {id} is {why}"),
                }
            }
            Finding::UnreadableQuotaValue { record } => {
                write!(f, "quota record {record:?} holds a value the service does not write")
            }
            Finding::QuotaWithoutReference { client, key, holder, slots, mirror } => {
                let m = if *mirror { " and a mirror" } else { "" };
                write!(
                    f,
                    "client {client:?} has slots {slots:?}{m} counting the reference of {} on \
                     key {}, which is absent",
                    v(holder),
                    v(key)
                )
            }
            Finding::QuotaMiscounted { client, key, holder, slots, mirror } => {
                let m = match mirror {
                    Some(n) => format!("a mirror naming slot {n}"),
                    None => "no readable mirror".to_string(),
                };
                write!(
                    f,
                    "the reference of {} on key {} has slots {slots:?} and {m} of client \
                     {client:?}: it needs one slot and a mirror naming it, on its lease",
                    v(holder),
                    v(key)
                )
            }
            Finding::PoolCreatorWithoutSlot { client, slot, counts, .. } => match counts {
                None => write!(
                    f,
                    "the pool's creator record names pool slot {slot} of client {client:?}, \
                     which is absent"
                ),
                Some(p) => write!(
                    f,
                    "the pool's creator record names pool slot {slot} of client {client:?}, \
                     which counts pool {}",
                    v(p)
                ),
            },
            Finding::PoolSlotWithoutPool { client, slot, pool } => write!(
                f,
                "pool slot {slot} of client {client:?} names pool {}, whose creator record does \
                 not name it",
                v(pool)
            ),
        }
    }
}

/// A spec problem as a finding.
pub fn spec_finding(p: &SpecProblem) -> Finding {
    match &p.kind {
        SpecProblemKind::NameMismatch { spec_name } => Finding::SpecNameMismatch {
            record: p.record.clone(),
            pool: p.pool.clone().unwrap_or_default(),
            spec_name: spec_name.clone(),
        },
        SpecProblemKind::Unreadable(reason) => Finding::SpecUnreadable {
            record: p.record.clone(),
            pool: p.pool.clone(),
            reason: reason.clone(),
        },
        SpecProblemKind::BadRecordName => Finding::SpecUnreadable {
            record: p.record.clone(),
            pool: None,
            reason: "not named after a valid pool (another deployment's records, or by hand)"
                .into(),
        },
    }
}

/// Every breach in one pool's records. `spec` is `None` when the pool's spec is missing or
/// unusable: the range checks are then skipped (the spec's own finding is reported elsewhere).
pub fn audit(spec: Option<&PoolSpec>, snap: &PoolSnapshot) -> Vec<Finding> {
    let mut out = Vec::new();
    for u in &snap.unreadable {
        out.push(Finding::UnreadableRecord {
            record: String::from_utf8_lossy(&u.name).into_owned(),
            nested: u.nested,
        });
    }
    for (id, e) in &snap.ids {
        if e.record.is_none() {
            out.push(Finding::UnreadableIdValue { id: *id });
        }
    }
    for (k, e) in &snap.keys {
        if e.id.is_none() {
            out.push(Finding::UnreadableKeyValue { key: k.clone() });
        }
    }
    for (k, hs) in &snap.refs {
        for (h, r) in hs {
            if r.id.is_none() {
                out.push(Finding::UnreadableRefValue { key: k.clone(), holder: h.clone() });
            }
        }
    }

    // One ID, several key records.
    let mut keys_of_id: BTreeMap<u64, Vec<&str>> = BTreeMap::new();
    for (k, e) in &snap.keys {
        if let Some(id) = e.id {
            keys_of_id.entry(id).or_default().push(k);
        }
    }
    let mut shared_ids = BTreeSet::new();
    for (id, ks) in &keys_of_id {
        if ks.len() > 1 {
            shared_ids.insert(*id);
            out.push(Finding::IdBoundToTwoKeys {
                id: *id,
                keys: ks.iter().map(|k| k.to_string()).collect(),
            });
        }
    }
    // One key, several ID records.
    let mut ids_of_key: BTreeMap<&str, Vec<u64>> = BTreeMap::new();
    for (id, k) in snap.bound() {
        ids_of_key.entry(k).or_default().push(id);
    }
    let mut split_keys = BTreeSet::new();
    for (k, ids) in &ids_of_key {
        if ids.len() > 1 {
            split_keys.insert(*k);
            out.push(Finding::KeyBoundToTwoIds { key: k.to_string(), ids: ids.clone() });
        }
    }

    // Key records whose ID record does not agree.
    for (k, e) in &snap.keys {
        let Some(id) = e.id else { continue };
        if shared_ids.contains(&id) {
            continue;
        }
        let id_record = match snap.ids.get(&id).map(|e| &e.record) {
            None => "absent".to_string(),
            Some(None) => continue, // unreadable: reported above
            Some(Some(IdRecord::Bound(j))) if j == k => continue,
            Some(Some(IdRecord::Bound(j))) => {
                format!("bound to key {}", crate::error::show_value(j))
            }
            Some(Some(IdRecord::Tombstone(j))) => {
                format!("a tombstone of key {}", crate::error::show_value(j))
            }
        };
        out.push(Finding::KeyWithoutIdRecord { key: k.clone(), id, id_record });
    }
    // ID records whose key record does not agree.
    for (id, k) in snap.bound() {
        if split_keys.contains(k) {
            continue;
        }
        match snap.keys.get(k).map(|e| e.id) {
            Some(Some(n)) if n == id => {}
            Some(None) => {} // unreadable: reported above
            Some(Some(n)) => out.push(Finding::IdWithoutKeyRecord {
                id,
                key: k.to_string(),
                key_record: Some(n),
            }),
            None => {
                out.push(Finding::IdWithoutKeyRecord { id, key: k.to_string(), key_record: None })
            }
        }
    }
    // References without the binding they name.
    for (k, hs) in &snap.refs {
        let key_record = snap.keys.get(k).map(|e| e.id);
        if matches!(key_record, Some(None)) {
            continue; // unreadable key record: reported above
        }
        let key_record = key_record.flatten();
        if key_record.is_none() && snap.bound().any(|(_, b)| b == k) {
            continue; // an ID record binds the key: IdWithoutKeyRecord says it (and fixes it)
        }
        let mut holders = Vec::new();
        let mut ref_ids = BTreeSet::new();
        for (h, r) in hs {
            if let Some(v) = r.id {
                if key_record != Some(v) {
                    holders.push(h.clone());
                    ref_ids.insert(v);
                }
            }
        }
        if !holders.is_empty() {
            out.push(Finding::RefWithoutBinding {
                key: k.clone(),
                holders,
                ref_ids: ref_ids.into_iter().collect(),
                key_record,
            });
        }
    }
    // IDs the spec does not allow. Records hold IDs as handed out, prefix bits included, so
    // they are compared as the allocator compares them (`id_is_allocatable`), never as raw IDs.
    if let Some(spec) = spec {
        let mut seen = BTreeSet::new();
        for (k, e) in &snap.keys {
            if let Some(id) = e.id {
                if !id_is_allocatable(spec, id) && seen.insert(id) {
                    out.push(Finding::IdOutOfRange {
                        id,
                        key: Some(k.clone()),
                        reserved: is_reserved_id(spec, id),
                    });
                }
            }
        }
        for (id, e) in &snap.ids {
            if !id_is_allocatable(spec, *id) && seen.insert(*id) {
                out.push(Finding::IdOutOfRange {
                    id: *id,
                    key: e.record.as_ref().map(|r| r.key().to_string()),
                    reserved: is_reserved_id(spec, *id),
                });
            }
        }
    }
    out
}

/// A safe fix for one finding: one txn, guarded as the module docs say.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Repair {
    /// What the txn does, for people.
    pub action: String,
    pub txn: TxnRequest,
}

/// True if handed-out ID `id` carries `spec`'s prefix and its raw part is reserved.
fn is_reserved_id(spec: &PoolSpec, id: u64) -> bool {
    spec.strip_prefix(id).is_some_and(|raw| spec.is_reserved(raw))
}

/// The safe repair of `finding`, or `None` when it needs a person: anything about specs, foreign
/// or unreadable record names, references whose holders believe in an ID other than the one the
/// key's records agree on, every fix that would change the ID a holder was given or free an ID
/// something still names ([`contradicts_holders`]), and every fix that would delete a record the
/// pool's reclaim rules still protect ([`removes_protected`]).
///
/// Where a key's records disagree, the evidence is weighed in this order: the references (what
/// holders were told), then a key record and ID record that name each other, then whichever of
/// the two records is left. A lone reference against a binding whose records agree is left to a
/// person: one of them was edited, and nothing shows which.
pub fn plan(cx: RepairContext<'_>, snap: &PoolSnapshot, finding: &Finding) -> Option<Repair> {
    plan_fix(cx, snap, finding)
        .filter(|r| !removes_protected(cx, snap, &r.txn) && !contradicts_holders(cx, snap, &r.txn))
}

/// The compares and writes that make held `key`'s records agree with its references: the key
/// record and the ID record of the ID every reference names ([`held_id`]), each re-written where
/// it says otherwise, with the ID. `None` when the references disagree or name an ID the pool
/// never hands out, another key's references or key record name that ID, another key's
/// records bind it to that key, or neither of the key's own records backs the references.
fn restore_held(
    cx: RepairContext<'_>,
    snap: &PoolSnapshot,
    key: &str,
) -> Option<(Vec<Compare>, Vec<TxnOp>, u64)> {
    let (l, p) = (cx.layout, snap.pool.as_str());
    let x = held_id(snap, key)?;
    if !id_is_allocatable(cx.spec, x) {
        return None;
    }
    let others_ref =
        snap.refs.iter().any(|(k, hs)| k != key && hs.values().any(|r| r.id == Some(x)));
    let others_key = snap.keys.iter().any(|(k, e)| k != key && e.id == Some(x));
    if others_ref || others_key {
        return None;
    }
    let key_rec = snap.keys.get(key).and_then(|e| e.id);
    let id_entry = snap.ids.get(&x);
    let id_rec = id_entry.and_then(|e| e.record.as_ref());
    let id_ours = matches!(id_rec, Some(IdRecord::Bound(k)) if k == key);
    if key_rec != Some(x) && !id_ours {
        return None;
    }
    if let Some(y) = key_rec.filter(|y| *y != x) {
        // The key record names another ID whose record binds the key back: two bindings of
        // the key, one backed by the references. A person decides.
        if matches!(snap.ids.get(&y).and_then(|e| e.record.as_ref()),
                    Some(IdRecord::Bound(k)) if k == key)
        {
            return None;
        }
    }
    let mut c = vec![
        Compare::mod_revision_is(
            l.key_key(p, key),
            snap.keys.get(key).map_or(0, |e| e.mod_revision),
        ),
        Compare::mod_revision_is(l.id_key(p, x), id_entry.map_or(0, |e| e.mod_revision)),
    ];
    c.extend(
        snap.holders(key)
            .map(|(h, r)| Compare::mod_revision_is(l.ref_key(p, key, h), r.mod_revision)),
    );
    let mut ops = Vec::new();
    if key_rec != Some(x) {
        ops.push(TxnOp::put(l.key_key(p, key), encode_id(x)));
    }
    if !id_ours {
        ops.push(TxnOp::put(l.id_key(p, x), IdRecord::Bound(key.to_string()).encode()));
    }
    (!ops.is_empty()).then_some((c, ops, x))
}

fn plan_fix(cx: RepairContext<'_>, snap: &PoolSnapshot, finding: &Finding) -> Option<Repair> {
    let l = cx.layout;
    let p = snap.pool.as_str();
    let spec_guard = Compare::mod_revision_is(l.pool_spec_key(p), cx.spec_revision);
    let id_rev = |id: u64| snap.ids.get(&id).map_or(0, |e| e.mod_revision);
    let key_rev = |k: &str| snap.keys.get(k).map_or(0, |e| e.mod_revision);
    let unheld = |k: &str| Compare::range_empty(KeyRange::prefix(l.ref_prefix(p, k)));
    let referenced = |k: &str| snap.is_referenced(k);
    let txn = |compares: Vec<Compare>, ops: Vec<TxnOp>| {
        let mut c = vec![spec_guard.clone()];
        c.extend(compares);
        TxnRequest::new().when(c).and_then(ops)
    };
    // The held key's records re-written from its references.
    let restore = |key: &str| {
        restore_held(cx, snap, key).map(|(c, ops, x)| Repair {
            action: format!("restore the binding of {key:?} to ID {x}, which its holders hold"),
            txn: txn(c, ops),
        })
    };
    // The ID records binding `k`.
    let ids_of =
        |k: &str| -> Vec<u64> { snap.bound().filter(|(_, b)| *b == k).map(|(i, _)| i).collect() };
    // Unheld `key`'s ID record for `id`, which its key record names, re-written to bind it.
    let rebind = |key: &str, id: u64, other: Option<&str>| {
        let mut c = vec![
            Compare::mod_revision_is(l.id_key(p, id), id_rev(id)),
            Compare::mod_revision_is(l.key_key(p, key), key_rev(key)),
            unheld(key),
        ];
        if let Some(o) = other {
            c.push(Compare::mod_revision_is(l.key_key(p, o), key_rev(o)));
        }
        Repair {
            action: format!("re-bind ID record {id} to key {key:?}, whose key record names it"),
            txn: txn(
                c,
                vec![TxnOp::put(l.id_key(p, id), IdRecord::Bound(key.to_string()).encode())],
            ),
        }
    };
    match finding {
        Finding::UnreadableIdValue { id } => {
            // Free the ID only if no key record and no reference claims it.
            let claimed = snap.keys.values().any(|e| e.id == Some(*id))
                || snap.refs.values().flat_map(|m| m.values()).any(|r| r.id == Some(*id));
            if claimed {
                // Claimed by exactly one key record: the ID record is re-written to bind it.
                let claimers: Vec<&String> =
                    snap.keys.iter().filter(|(_, e)| e.id == Some(*id)).map(|(k, _)| k).collect();
                let [k] = claimers[..] else { return None };
                if referenced(k) {
                    return restore(k);
                }
                return (ids_of(k).is_empty() && id_is_allocatable(cx.spec, *id))
                    .then(|| rebind(k, *id, None));
            }
            (!claimed).then(|| Repair {
                action: format!("delete unreadable ID record {id}"),
                txn: txn(
                    vec![Compare::mod_revision_is(l.id_key(p, *id), id_rev(*id))],
                    vec![TxnOp::delete(l.id_key(p, *id))],
                ),
            })
        }
        Finding::UnreadableKeyValue { key } => {
            // Rewrite it from the one ID record that binds the key, if that ID is allowed.
            let ids: Vec<u64> = snap.bound().filter(|(_, k)| k == key).map(|(i, _)| i).collect();
            let [id] = ids[..] else { return None };
            id_is_allocatable(cx.spec, id).then(|| Repair {
                action: format!("rewrite the key record of {key:?} as ID {id}"),
                txn: txn(
                    vec![
                        Compare::mod_revision_is(l.key_key(p, key), key_rev(key)),
                        Compare::mod_revision_is(l.id_key(p, id), id_rev(id)),
                    ],
                    vec![TxnOp::put(l.key_key(p, key), encode_id(id))],
                ),
            })
        }
        Finding::IdBoundToTwoKeys { id, keys } => {
            // The ID record says whose the ID is; the other keys' records go if nobody holds them.
            let owner = match snap.ids.get(id).and_then(|e| e.record.as_ref()) {
                Some(IdRecord::Bound(k)) if keys.contains(k) => k,
                _ => return None,
            };
            let others: Vec<&String> = keys.iter().filter(|k| *k != owner).collect();
            let [other] = others[..] else {
                // Several keys beside the owner: each record alone, unheld ones only.
                if others.iter().any(|k| referenced(k)) {
                    return None;
                }
                let mut c = vec![Compare::mod_revision_is(l.id_key(p, *id), id_rev(*id))];
                let mut ops = Vec::new();
                for k in &others {
                    c.push(Compare::mod_revision_is(l.key_key(p, k), key_rev(k)));
                    c.push(unheld(k));
                    ops.push(TxnOp::delete(l.key_key(p, k)));
                }
                return Some(Repair {
                    action: format!(
                        "delete the key records of {others:?}, which nobody holds (ID {id} is \
                         {owner:?}'s)"
                    ),
                    txn: txn(c, ops),
                });
            };
            if referenced(other) {
                // Its holders were given another ID: the key record goes back to it.
                return restore(other);
            }
            let mut c = vec![
                Compare::mod_revision_is(l.id_key(p, *id), id_rev(*id)),
                Compare::mod_revision_is(l.key_key(p, other), key_rev(other)),
                unheld(other),
            ];
            if let [y] = ids_of(other)[..] {
                if id_is_allocatable(cx.spec, y) {
                    // Its own ID record binds it elsewhere: the key record goes back there.
                    c.push(Compare::mod_revision_is(l.id_key(p, y), id_rev(y)));
                    return Some(Repair {
                        action: format!(
                            "point the key record of {other:?} back at ID {y}, whose record binds \
                             it (ID {id} is {owner:?}'s)"
                        ),
                        txn: txn(c, vec![TxnOp::put(l.key_key(p, other), encode_id(y))]),
                    });
                }
            }
            Some(Repair {
                action: format!(
                    "delete the key records of {others:?}, which nobody holds (ID {id} is \
                     {owner:?}'s)"
                ),
                txn: txn(c, vec![TxnOp::delete(l.key_key(p, other))]),
            })
        }
        Finding::KeyBoundToTwoIds { key, ids } => {
            // The key record says which ID is the key's; the other ID records are freed.
            let current = snap.keys.get(key).and_then(|e| e.id)?;
            if !ids.contains(&current) {
                return None;
            }
            if held_id(snap, key).is_some_and(|x| x != current) {
                // The holders were given one of the others: they decide.
                return restore(key);
            }
            // An ID another record names is left for that record's finding.
            let named = |id: u64| {
                snap.keys.values().any(|e| e.id == Some(id))
                    || snap.refs.values().flat_map(|m| m.values()).any(|r| r.id == Some(id))
            };
            let strays: Vec<u64> =
                ids.iter().copied().filter(|i| *i != current && !named(*i)).collect();
            if strays.is_empty() {
                return None;
            }
            let mut c = vec![Compare::mod_revision_is(l.key_key(p, key), key_rev(key))];
            let mut ops = Vec::new();
            for id in &strays {
                c.push(Compare::mod_revision_is(l.id_key(p, *id), id_rev(*id)));
                ops.push(TxnOp::delete(l.id_key(p, *id)));
            }
            Some(Repair {
                action: format!("free the stray ID records of {key:?} (it keeps ID {current})"),
                txn: txn(c, ops),
            })
        }
        Finding::KeyWithoutIdRecord { key, id, .. } => {
            if referenced(key) {
                // The holders decide: the key record is re-pointed at their ID, or the ID
                // record re-written for the key, or (references alone) a person decides.
                return restore(key);
            }
            let id_rec = snap.ids.get(id).and_then(|e| e.record.as_ref());
            // Another ID record binding the key outweighs a key record naming a free ID: that
            // case is the other record's finding (the key record goes back to it).
            let restorable = match id_rec {
                None => !snap.ids.contains_key(id) && ids_of(key).is_empty(),
                Some(IdRecord::Tombstone(k)) => k == key,
                Some(IdRecord::Bound(_)) => false,
            };
            if restorable && id_is_allocatable(cx.spec, *id) {
                // Re-create the ID record the key record names: the holders keep their ID.
                return Some(Repair {
                    action: format!("re-create ID record {id} for key {key:?}"),
                    txn: txn(
                        vec![
                            Compare::mod_revision_is(l.id_key(p, *id), id_rev(*id)),
                            Compare::mod_revision_is(l.key_key(p, key), key_rev(key)),
                        ],
                        vec![TxnOp::put(l.id_key(p, *id), IdRecord::Bound(key.clone()).encode())],
                    ),
                });
            }
            if let Some(IdRecord::Bound(j)) = id_rec {
                // The ID record binds a key that lives elsewhere (or nowhere): the ID is this
                // key's, whose key record names it.
                let j_lives_here = snap.keys.get(j).and_then(|e| e.id) == Some(*id);
                if !j_lives_here && ids_of(key).is_empty() && id_is_allocatable(cx.spec, *id) {
                    return Some(rebind(key, *id, Some(j)));
                }
            }
            if matches!(id_rec, Some(IdRecord::Bound(_))) && !referenced(key) {
                // The ID is another key's; nobody holds this one: drop its stale key record.
                return Some(Repair {
                    action: format!("delete the stale key record of {key:?}, which nobody holds"),
                    txn: txn(
                        vec![
                            Compare::mod_revision_is(l.key_key(p, key), key_rev(key)),
                            Compare::mod_revision_is(l.id_key(p, *id), id_rev(*id)),
                            unheld(key),
                        ],
                        vec![TxnOp::delete(l.key_key(p, key))],
                    ),
                });
            }
            None
        }
        Finding::IdWithoutKeyRecord { id, key, key_record } => {
            let id_guard = Compare::mod_revision_is(l.id_key(p, *id), id_rev(*id));
            let key_guard = Compare::mod_revision_is(l.key_key(p, key), key_rev(key));
            match key_record {
                Some(n)
                    if matches!(snap.ids.get(n).and_then(|e| e.record.as_ref()),
                                Some(IdRecord::Bound(k)) if k == key) =>
                {
                    // The key lives at another ID, whose record binds it back: this record is a
                    // leftover (freed only if nothing else names it).
                    let n_guard = Compare::mod_revision_is(l.id_key(p, *n), id_rev(*n));
                    Some(Repair {
                        action: format!("free ID {id}: key {key:?} lives at ID {n}"),
                        txn: txn(
                            vec![id_guard, key_guard, n_guard],
                            vec![TxnOp::delete(l.id_key(p, *id))],
                        ),
                    })
                }
                Some(_) if referenced(key) => restore(key),
                Some(n) => {
                    // Nobody holds the key and its key record names an ID that does not bind it
                    // back: the ID record that does is the evidence.
                    (id_is_allocatable(cx.spec, *id) && ids_of(key).len() == 1).then(|| {
                        let n_guard = Compare::mod_revision_is(l.id_key(p, *n), id_rev(*n));
                        Repair {
                            action: format!(
                                "point the key record of {key:?} back at ID {id}, whose record \
                                 binds it"
                            ),
                            txn: txn(
                                vec![id_guard, key_guard, n_guard, unheld(key)],
                                vec![TxnOp::put(l.key_key(p, key), encode_id(*id))],
                            ),
                        }
                    })
                }
                None if !referenced(key) => Some(Repair {
                    action: format!("free ID {id}: key {key:?} has no key record and no holder"),
                    txn: txn(
                        vec![id_guard, key_guard, unheld(key)],
                        vec![TxnOp::delete(l.id_key(p, *id))],
                    ),
                }),
                None => {
                    // Held: re-create the key record if every holder was given this ID.
                    let all_here = snap.holders(key).all(|(_, r)| r.id == Some(*id));
                    (all_here && id_is_allocatable(cx.spec, *id)).then(|| {
                        let mut c = vec![id_guard, key_guard];
                        c.extend(snap.holders(key).map(|(h, r)| {
                            Compare::mod_revision_is(l.ref_key(p, key, h), r.mod_revision)
                        }));
                        Repair {
                            action: format!("re-create the key record of {key:?} as ID {id}"),
                            txn: txn(c, vec![TxnOp::put(l.key_key(p, key), encode_id(*id))]),
                        }
                    })
                }
            }
        }
        Finding::RefWithoutBinding { key, ref_ids, key_record: None, .. } => {
            // Re-create the binding the holders were given, if that ID is free and allowed, and
            // the key has no other ID record (that case is IdWithoutKeyRecord's).
            let [id] = ref_ids[..] else { return None };
            let free = !snap.ids.contains_key(&id);
            let other_ids = snap.bound().any(|(_, k)| k == key);
            let all_same = snap.holders(key).all(|(_, r)| r.id == Some(id));
            (free && !other_ids && all_same && id_is_allocatable(cx.spec, id)).then(|| {
                let mut c = vec![
                    Compare::mod_revision_is(l.id_key(p, id), 0),
                    Compare::mod_revision_is(l.key_key(p, key), 0),
                ];
                c.extend(
                    snap.holders(key).map(|(h, r)| {
                        Compare::mod_revision_is(l.ref_key(p, key, h), r.mod_revision)
                    }),
                );
                Repair {
                    action: format!("re-create the binding of {key:?} to ID {id} its holders hold"),
                    txn: txn(
                        c,
                        vec![
                            TxnOp::put(l.id_key(p, id), IdRecord::Bound(key.clone()).encode()),
                            TxnOp::put(l.key_key(p, key), encode_id(id)),
                        ],
                    ),
                }
            })
        }
        Finding::RefWithoutBinding { key, key_record: Some(_), .. } => restore(key),
        Finding::IdOutOfRange { id, key: Some(key), .. } if !referenced(key) => {
            // Nobody holds the key: remove its binding to the forbidden ID (both records, as
            // far as they name each other).
            let mut c = vec![unheld(key)];
            let mut ops = Vec::new();
            if snap.keys.get(key).and_then(|e| e.id) == Some(*id) {
                c.push(Compare::mod_revision_is(l.key_key(p, key), key_rev(key)));
                ops.push(TxnOp::delete(l.key_key(p, key)));
            }
            if let Some(e) = snap.ids.get(id) {
                // A tombstone of the key is left alone: it holds the ID's reuse delay and goes
                // with its lease (`removes_protected`).
                if matches!(&e.record, Some(IdRecord::Bound(k)) if k == key) {
                    c.push(Compare::mod_revision_is(l.id_key(p, *id), e.mod_revision));
                    ops.push(TxnOp::delete(l.id_key(p, *id)));
                }
            }
            (!ops.is_empty()).then(|| Repair {
                action: format!("remove the binding of {key:?} to forbidden ID {id} (no holder)"),
                txn: txn(c, ops),
            })
        }
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::layout::Layout;
    use crate::store::{CompareOp, CompareTarget, KeyValue, Revision};

    const P: &str = "p";

    fn kv(key: Vec<u8>, value: impl Into<Vec<u8>>, rev: Revision) -> KeyValue {
        KeyValue {
            key,
            value: value.into(),
            create_revision: rev,
            mod_revision: rev,
            version: 1,
            lease: 0,
        }
    }

    /// A healthy binding `k -> id` held by `h`, at revision `rev`.
    fn binding(l: &Layout, k: &str, id: u64, h: &str, rev: Revision) -> Vec<KeyValue> {
        vec![
            kv(l.id_key(P, id), k, rev),
            kv(l.key_key(P, k), encode_id(id), rev),
            kv(l.ref_key(P, k, h), encode_id(id), rev),
        ]
    }

    fn spec() -> PoolSpec {
        PoolSpec::new(P, 1, 100).reserve(50..=50)
    }

    fn snap(kvs: &[KeyValue]) -> PoolSnapshot {
        PoolSnapshot::parse(&Layout::default(), P, kvs, 99)
    }

    fn cx<'a>(l: &'a Layout, s: &'a PoolSpec) -> RepairContext<'a> {
        RepairContext { layout: l, spec: s, spec_revision: 1 }
    }

    /// Every compare of a repair pins a record at its snapshot revision (or the spec, or an empty
    /// reference range): none is unconditional.
    fn assert_guarded(r: &Repair) {
        assert!(!r.txn.compare.is_empty() && r.txn.failure.is_empty(), "{r:?}");
        assert_eq!(
            r.txn.compare[0],
            Compare::mod_revision_is(Layout::default().pool_spec_key(P), 1),
            "{r:?}"
        );
        for c in &r.txn.compare {
            assert!(
                c.op == CompareOp::Equal
                    && matches!(
                        c.target,
                        CompareTarget::ModRevision(_) | CompareTarget::CreateRevision(0)
                    ),
                "{c:?}"
            );
        }
    }

    #[test]
    fn a_healthy_pool_has_no_findings() {
        let l = Layout::default();
        let mut kvs = binding(&l, "a", 1, "h", 5);
        kvs.extend(binding(&l, "b/c", 2, "h", 6));
        kvs.push(kv(l.ref_key(P, "a", "g"), encode_id(1), 7));
        // A tombstone is a healthy record too.
        kvs.push(kv(l.id_key(P, 3), IdRecord::Tombstone("old".into()).encode(), 8));
        assert_eq!(audit(Some(&spec()), &snap(&kvs)), vec![]);
    }

    #[test]
    fn each_tampering_is_found_and_planned() {
        let l = Layout::default();
        let s = spec();
        let cases: Vec<(&str, Vec<KeyValue>, Finding, bool)> = vec![
            (
                "two keys name one ID",
                [binding(&l, "a", 1, "h", 5), vec![kv(l.key_key(P, "b"), "1", 6)]].concat(),
                Finding::IdBoundToTwoKeys { id: 1, keys: vec!["a".into(), "b".into()] },
                true,
            ),
            (
                "one key, two ID records",
                [binding(&l, "a", 1, "h", 5), vec![kv(l.id_key(P, 2), "a", 6)]].concat(),
                Finding::KeyBoundToTwoIds { key: "a".into(), ids: vec![1, 2] },
                true,
            ),
            (
                "key record without ID record",
                vec![kv(l.key_key(P, "a"), "1", 5), kv(l.ref_key(P, "a", "h"), "1", 5)],
                Finding::KeyWithoutIdRecord { key: "a".into(), id: 1, id_record: "absent".into() },
                true,
            ),
            (
                "ID record without key record, unheld",
                vec![kv(l.id_key(P, 1), "a", 5)],
                Finding::IdWithoutKeyRecord { id: 1, key: "a".into(), key_record: None },
                true,
            ),
            (
                "ID record without key record, held",
                vec![kv(l.id_key(P, 1), "a", 5), kv(l.ref_key(P, "a", "h"), "1", 5)],
                Finding::IdWithoutKeyRecord { id: 1, key: "a".into(), key_record: None },
                true,
            ),
            (
                "reference without binding",
                vec![kv(l.ref_key(P, "a", "h"), "7", 5)],
                Finding::RefWithoutBinding {
                    key: "a".into(),
                    holders: vec!["h".into()],
                    ref_ids: vec![7],
                    key_record: None,
                },
                true,
            ),
            (
                "unheld binding out of range",
                vec![kv(l.id_key(P, 500), "a", 5), kv(l.key_key(P, "a"), "500", 5)],
                Finding::IdOutOfRange { id: 500, key: Some("a".into()), reserved: false },
                true,
            ),
            (
                "held binding on a reserved ID",
                binding(&l, "a", 50, "h", 5),
                Finding::IdOutOfRange { id: 50, key: Some("a".into()), reserved: true },
                false,
            ),
            (
                "unreadable ID value",
                vec![kv(l.id_key(P, 1), "", 5)],
                Finding::UnreadableIdValue { id: 1 },
                true,
            ),
            (
                "unreadable key value",
                vec![kv(l.id_key(P, 1), "a", 5), kv(l.key_key(P, "a"), "01", 5)],
                Finding::UnreadableKeyValue { key: "a".into() },
                true,
            ),
            (
                "nested deployment's record",
                vec![kv(b"idalloc/data/p/pools/x".to_vec(), "{}", 5)],
                Finding::UnreadableRecord { record: "idalloc/data/p/pools/x".into(), nested: true },
                false,
            ),
        ];
        for (name, kvs, want, fixable) in cases {
            let sn = snap(&kvs);
            let found = audit(Some(&s), &sn);
            assert_eq!(found, vec![want.clone()], "{name}");
            let repair = plan(cx(&l, &s), &sn, &want);
            assert_eq!(repair.is_some(), fixable, "{name}: {repair:?}");
            if let Some(r) = repair {
                assert_guarded(&r);
            }
        }
    }

    #[test]
    fn repairs_never_touch_what_a_holder_relies_on() {
        let l = Layout::default();
        let s = spec();
        // b's key record names a's ID, and b is held: deleting it would take b's ID away.
        let kvs = [
            binding(&l, "a", 1, "h", 5),
            vec![kv(l.key_key(P, "b"), "1", 6), kv(l.ref_key(P, "b", "g"), "1", 6)],
        ]
        .concat();
        let sn = snap(&kvs);
        let f = audit(Some(&s), &sn);
        assert_eq!(f.len(), 1, "{f:?}");
        assert_eq!(plan(cx(&l, &s), &sn, &f[0]), None);
        // A reference that believes in another ID than the key record: left for a person.
        let kvs = [binding(&l, "a", 1, "h", 5), vec![kv(l.ref_key(P, "a", "g"), "2", 6)]].concat();
        let sn = snap(&kvs);
        let f = audit(Some(&s), &sn);
        assert!(
            matches!(&f[..], [Finding::RefWithoutBinding { key_record: Some(1), .. }]),
            "{f:?}"
        );
        assert_eq!(plan(cx(&l, &s), &sn, &f[0]), None);
    }

    #[test]
    fn unreadable_id_claimed_by_a_key_is_kept() {
        let l = Layout::default();
        let s = spec();
        let kvs = vec![kv(l.id_key(P, 1), b"\xff".to_vec(), 5), kv(l.key_key(P, "a"), "1", 5)];
        let sn = snap(&kvs);
        let f = audit(Some(&s), &sn);
        assert!(f.contains(&Finding::UnreadableIdValue { id: 1 }), "{f:?}");
        // Kept, and re-written to bind the key whose key record names it.
        let r = plan(cx(&l, &s), &sn, &Finding::UnreadableIdValue { id: 1 }).expect("a repair");
        assert_eq!(r.txn.success, vec![TxnOp::put(l.id_key(P, 1), b"a".to_vec())]);
        // Held by a holder given another ID: a person decides.
        let mut kvs = kvs;
        kvs.push(kv(l.ref_key(P, "a", "h"), "2", 5));
        let sn = snap(&kvs);
        assert_eq!(plan(cx(&l, &s), &sn, &Finding::UnreadableIdValue { id: 1 }), None);
    }

    /// The setup docs/guide/multi-cluster.md recommends: prefix bits, idle grace, reuse delay.
    fn prefixed() -> PoolSpec {
        PoolSpec::new(P, 1, 65535)
            .reserve(50..=50)
            .prefix(0x10000)
            .idle_grace(std::time::Duration::from_secs(3600))
            .reuse_delay(std::time::Duration::from_secs(3600))
    }

    /// Records hold IDs with their prefix bits; a held binding, an idle one
    /// (no reference, inside its idle grace) and a tombstone (inside its reuse delay) are all
    /// healthy, not "outside the pool's range".
    #[test]
    fn a_prefixed_pool_is_audited_without_its_prefix() {
        let l = Layout::default();
        let s = prefixed();
        let mut kvs = binding(&l, "held", 0x10007, "h", 5);
        kvs.push(kv(l.id_key(P, 0x10008), "idle", 6));
        kvs.push(kv(l.key_key(P, "idle"), encode_id(0x10008), 6));
        kvs.push(kv(l.id_key(P, 0x10009), IdRecord::Tombstone("gone".into()).encode(), 7));
        assert_eq!(audit(Some(&s), &snap(&kvs)), vec![]);
        // Without the prefix, or with its raw part reserved or out of range, it is a breach.
        for (id, reserved) in [(7, false), (0x10000 | 50, true), (0x10000, false), (0x30007, false)]
        {
            let sn = snap(&[kv(l.id_key(P, id), "x", 5), kv(l.key_key(P, "x"), encode_id(id), 5)]);
            assert_eq!(
                audit(Some(&s), &sn),
                vec![Finding::IdOutOfRange { id, key: Some("x".into()), reserved }],
                "{id:#x}"
            );
        }
        // The repairs that re-create records accept prefixed IDs too.
        let sn = snap(&[kv(l.ref_key(P, "a", "h"), encode_id(0x10007), 5)]);
        let f = audit(Some(&s), &sn);
        assert!(matches!(&f[..], [Finding::RefWithoutBinding { .. }]), "{f:?}");
        assert!(plan(cx(&l, &s), &sn, &f[0]).is_some(), "{f:?}");
    }

    /// No repair deletes a tombstone (the ID's reuse delay) or a healthy binding (held, or idle
    /// inside a grace `check` cannot measure), nor gives their ID to another key.
    #[test]
    fn no_repair_removes_a_binding_in_its_grace_or_a_tombstone() {
        let l = Layout::default();
        let s = spec();
        // A tombstone of a forbidden ID: reported, but left to expire with its lease.
        let kvs = vec![kv(l.id_key(P, 500), IdRecord::Tombstone("a".into()).encode(), 5)];
        let sn = snap(&kvs);
        let f = audit(Some(&s), &sn);
        assert_eq!(
            f,
            vec![Finding::IdOutOfRange { id: 500, key: Some("a".into()), reserved: false }]
        );
        assert_eq!(plan(cx(&l, &s), &sn, &f[0]), None);
        // The same with a stale key record naming it: the key record goes, the tombstone stays.
        let kvs = [kvs, vec![kv(l.key_key(P, "a"), "500", 6)]].concat();
        let sn = snap(&kvs);
        let f = audit(Some(&s), &sn);
        let out_of_range = f.iter().find(|f| matches!(f, Finding::IdOutOfRange { .. }));
        let r = plan(cx(&l, &s), &sn, out_of_range.expect("found")).expect("a repair");
        assert_eq!(r.txn.success, vec![TxnOp::delete(l.key_key(P, "a"))]);

        // The rule on the txn itself, whatever finding planned it.
        let mut kvs = binding(&l, "held", 1, "h", 5);
        kvs.push(kv(l.id_key(P, 2), "idle", 6));
        kvs.push(kv(l.key_key(P, "idle"), encode_id(2), 6));
        kvs.push(kv(l.id_key(P, 3), IdRecord::Tombstone("gone".into()).encode(), 7));
        kvs.push(kv(l.id_key(P, 4), "stray", 8));
        let sn = snap(&kvs);
        let c = cx(&l, &s);
        let guarded = |op: TxnOp| removes_protected(c, &sn, &TxnRequest::new().and_then([op]));
        assert!(guarded(TxnOp::delete(l.key_key(P, "idle"))));
        assert!(guarded(TxnOp::delete(l.id_key(P, 2))));
        assert!(guarded(TxnOp::delete(l.id_key(P, 1))));
        assert!(guarded(TxnOp::delete(l.id_key(P, 3))), "a tombstone");
        assert!(guarded(TxnOp::put(l.id_key(P, 3), "other")), "a tombstoned ID to another key");
        assert!(guarded(TxnOp::put(l.id_key(P, 2), "other")), "an idle ID to another key");
        let tomb = |k: &str| IdRecord::Tombstone(k.into()).encode();
        assert!(guarded(TxnOp::put(l.id_key(P, 2), tomb("idle"))), "an idle binding retired");
        assert!(guarded(TxnOp::put(l.id_key(P, 3), tomb("gone"))), "a tombstone off its lease");
        assert!(guarded(TxnOp::put(l.key_key(P, "idle"), encode_id(9))), "an idle key moved");
        assert!(guarded(TxnOp::delete_range(KeyRange::prefix(l.id_prefix(P)))));
        assert!(!guarded(TxnOp::delete(l.id_key(P, 4))), "a stray ID record may go");
        assert!(!guarded(TxnOp::put(l.id_key(P, 3), "gone")), "its own key may come back");
        assert!(!guarded(TxnOp::put(l.key_key(P, "new"), encode_id(5))));
    }

    #[test]
    fn findings_serialize_with_a_kind_tag() {
        let j = serde_json::to_value(Finding::IdBoundToTwoKeys { id: 1, keys: vec!["a".into()] })
            .unwrap();
        assert_eq!(j, serde_json::json!({"kind": "id_bound_to_two_keys", "id": 1, "keys": ["a"]}));
        let msg = Finding::IdOutOfRange { id: 5, key: None, reserved: true }.to_string();
        assert_eq!(msg, "ID 5 is reserved");
        let msg = Finding::IdOutOfRange { id: 7, key: Some("k".into()), reserved: false };
        assert_eq!(
            msg.to_string(),
            "ID 7 of key \"k\" is outside the pool's range or without its prefix bits"
        );
    }
}
