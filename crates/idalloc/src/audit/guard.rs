//! The rule every `check --repair` txn must pass, whatever finding planned it:
//! no repair takes an ID from a key the pool's reclaim rules still protect (DESIGN §8, G5).

use crate::layout::{parse_id_value, IdRecord, Layout};
use crate::pool::PoolSpec;
use crate::protocol::id_is_allocatable;
use crate::records::PoolSnapshot;
use crate::store::{KeyRange, PutRequest, Revision, TxnOp, TxnRequest};

/// What a repair may rely on besides the snapshot: the layout, and the spec record's mod revision
/// at the snapshot (every repair compares it, so a pool deleted or re-created meanwhile is left
/// alone). Defined here, beside the rule that uses it, so that this file needs nothing of its
/// parent (the import check's one-node-per-file graph stays a tree).
#[derive(Clone, Copy, Debug)]
pub struct RepairContext<'a> {
    pub layout: &'a Layout,
    pub spec: &'a PoolSpec,
    pub spec_revision: Revision,
}

/// True if `txn` deletes (or gives to another key or ID) a record that keeps an ID for a key
/// (DESIGN §8):
/// - a tombstone: the ID's reuse delay (G5). It lives on its quarantine lease and goes by itself;
/// - either record of a binding whose key record and ID record name each other with an ID the
///   pool hands out: held, or idle and maybe inside its idle grace. That grace is counted by each
///   allocator's own clock from the last release, which no record shows, so `check` cannot tell
///   an idle binding in its grace from an expired one and leaves both to the sweepers.
///
/// [`super::plan`] drops any repair that would, whatever finding it came from: a rule on the txn
/// rather than on each finding, so a finding computed wrongly (as the prefix-blind range check
/// once was) still cannot cost a key its ID.
pub fn removes_protected(cx: RepairContext<'_>, snap: &PoolSnapshot, txn: &TxnRequest) -> bool {
    let (l, p) = (cx.layout, snap.pool.as_str());
    let healthy = |id: u64, key: &str| {
        id_is_allocatable(cx.spec, id)
            && snap.keys.get(key).and_then(|e| e.id) == Some(id)
            && matches!(snap.ids.get(&id).and_then(|e| e.record.as_ref()),
                        Some(IdRecord::Bound(k)) if k == key)
    };
    let protected = |range: &KeyRange| {
        if !range.range_end.is_empty() {
            return true; // a range delete could take anything: never planned, never allowed
        }
        if let Some(id) = l.parse_id_key(p, &range.key) {
            return match snap.ids.get(&id).and_then(|e| e.record.as_ref()) {
                Some(IdRecord::Tombstone(_)) => true,
                Some(IdRecord::Bound(k)) => healthy(id, k),
                None => false,
            };
        }
        if let Some(key) = l.parse_key_key(p, &range.key) {
            return snap.keys.get(&key).and_then(|e| e.id).is_some_and(|id| healthy(id, &key));
        }
        false
    };
    // A put may restore the binding of the same key, never give its ID or key to another, nor
    // turn a binding into a tombstone or a tombstone into one off its lease.
    let overwritten = |put: &PutRequest| {
        if let Some(id) = l.parse_id_key(p, &put.key) {
            let new = IdRecord::decode(&put.value);
            return match snap.ids.get(&id).and_then(|e| e.record.as_ref()) {
                // A tombstone may also go to the key whose key record and every reference
                // name the ID: that hands the ID to nobody new (the holders have it).
                Some(IdRecord::Tombstone(k)) => match new {
                    Some(IdRecord::Bound(j)) if &j == k => false,
                    Some(IdRecord::Bound(j)) => {
                        !(held_id(snap, &j) == Some(id)
                            && snap.keys.get(&j).and_then(|e| e.id) == Some(id))
                    }
                    _ => true,
                },
                Some(IdRecord::Bound(k)) => {
                    healthy(id, k) && new != Some(IdRecord::Bound(k.clone()))
                }
                None => false,
            };
        }
        if let Some(key) = l.parse_key_key(p, &put.key) {
            let new_id = parse_id_value(&put.value);
            return snap
                .keys
                .get(&key)
                .and_then(|e| e.id)
                .is_some_and(|id| healthy(id, &key) && new_id != Some(id));
        }
        false
    };
    fn walk(
        ops: &[TxnOp],
        deleted: &dyn Fn(&KeyRange) -> bool,
        overwritten: &dyn Fn(&PutRequest) -> bool,
    ) -> bool {
        ops.iter().any(|op| match op {
            TxnOp::Delete(r) => deleted(r),
            TxnOp::Put(put) => overwritten(put),
            TxnOp::Txn(t) => {
                walk(&t.success, deleted, overwritten) || walk(&t.failure, deleted, overwritten)
            }
            TxnOp::Get(_) => false,
        })
    }
    walk(&txn.success, &protected, &overwritten) || walk(&txn.failure, &protected, &overwritten)
}

/// The ID every holder of `key` was given: `Some` when the key has references and all of them
/// name the same readable ID. What holders were told is the evidence a repair follows first.
pub fn held_id(snap: &PoolSnapshot, key: &str) -> Option<u64> {
    let mut ids = snap.holders(key).map(|(_, r)| r.id);
    let first = ids.next()??;
    ids.all(|id| id == Some(first)).then_some(first)
}

/// True if `txn` would go against what a holder was told or free an ID something still names:
/// - it deletes, or gives to a key other than the one the references name, an ID record whose
///   ID a key record or reference names, or one on a lease;
/// - it points a key record at an ID other than the one every reference of that key names, or at
///   an ID another key's references name;
/// - it deletes a key record that has references, or touches a reference at all.
///
/// [`super::plan`] drops any repair that would, whatever finding it came from: the references
/// are what holders were given, so a repair either agrees with them or leaves the case to a
/// person, and an ID is never freed while anything still names it.
pub fn contradicts_holders(cx: RepairContext<'_>, snap: &PoolSnapshot, txn: &TxnRequest) -> bool {
    let (l, p) = (cx.layout, snap.pool.as_str());
    // Key records as the txn leaves them: a key record it deletes or re-points names nothing
    // (or its new ID) once it is applied.
    let mut key_ids: std::collections::BTreeMap<String, Option<u64>> =
        snap.keys.iter().map(|(k, e)| (k.clone(), e.id)).collect();
    for op in txn.success.iter() {
        match op {
            TxnOp::Delete(r) if r.range_end.is_empty() => {
                if let Some(k) = l.parse_key_key(p, &r.key) {
                    key_ids.remove(&k);
                }
            }
            TxnOp::Put(put) => {
                if let Some(k) = l.parse_key_key(p, &put.key) {
                    key_ids.insert(k, parse_id_value(&put.value));
                }
            }
            _ => {}
        }
    }
    let key_names = |id: u64, except: Option<&str>| {
        key_ids.iter().any(|(k, e)| *e == Some(id) && Some(k.as_str()) != except)
    };
    let ref_names = |id: u64, except: Option<&str>| {
        snap.refs
            .iter()
            .filter(|(k, _)| Some(k.as_str()) != except)
            .any(|(_, hs)| hs.values().any(|r| r.id == Some(id)))
    };
    // `key` may be bound to `id`: its references (if any) all name `id`, no other key's do.
    let may_bind = |key: &str, id: u64| {
        (!snap.is_referenced(key) || held_id(snap, key) == Some(id)) && !ref_names(id, Some(key))
    };
    let deleted = |range: &KeyRange| {
        if !range.range_end.is_empty() || l.parse_ref_key(p, &range.key).is_some() {
            return true;
        }
        if let Some(id) = l.parse_id_key(p, &range.key) {
            let leased = snap.ids.get(&id).is_some_and(|e| e.lease != 0);
            return leased || key_names(id, None) || ref_names(id, None);
        }
        if let Some(key) = l.parse_key_key(p, &range.key) {
            return snap.is_referenced(&key);
        }
        false
    };
    let overwritten = |put: &PutRequest| {
        if l.parse_ref_key(p, &put.key).is_some() {
            return true;
        }
        if let Some(id) = l.parse_id_key(p, &put.key) {
            return match IdRecord::decode(&put.value) {
                Some(IdRecord::Bound(k)) => !may_bind(&k, id) || key_names(id, Some(&k)),
                _ => key_names(id, None) || ref_names(id, None),
            };
        }
        if let Some(key) = l.parse_key_key(p, &put.key) {
            return match parse_id_value(&put.value) {
                Some(id) => !may_bind(&key, id),
                None => true,
            };
        }
        false
    };
    fn walk(
        ops: &[TxnOp],
        deleted: &dyn Fn(&KeyRange) -> bool,
        overwritten: &dyn Fn(&PutRequest) -> bool,
    ) -> bool {
        ops.iter().any(|op| match op {
            TxnOp::Delete(r) => deleted(r),
            TxnOp::Put(put) => overwritten(put),
            TxnOp::Txn(t) => {
                walk(&t.success, deleted, overwritten) || walk(&t.failure, deleted, overwritten)
            }
            TxnOp::Get(_) => false,
        })
    }
    walk(&txn.success, &deleted, &overwritten) || walk(&txn.failure, &deleted, &overwritten)
}
