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
                Some(IdRecord::Tombstone(k)) => new != Some(IdRecord::Bound(k.clone())),
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
