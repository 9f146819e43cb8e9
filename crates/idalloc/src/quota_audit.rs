//! The decision half of `check` for `idalloc serve`'s quota records (docs/design/quotas.md,
//! "What `check` repairs"): which records count nothing or count wrongly, and the guarded txn that
//! makes them true. Pure; `check.rs` reads the records and sends the txns.
//!
//! The rule for reference slots: a reference of the store that a client's mirror or slot names
//! is counted by exactly one slot and a mirror naming it, on the reference's lease; a slot or
//! mirror whose reference is absent counts nothing and goes. Every repair compares each record it
//! read unchanged, and the reference absent (a delete) or unchanged (a put), so that a bind or a
//! release racing the repair leaves it undone; the service's acquire confirms its mirror after
//! the bind, so a bind applied after a repair freed its slot takes one again.

use std::collections::{BTreeMap, BTreeSet};

use crate::audit::{Finding, Repair};
use crate::layout::Layout;
use crate::quota_names::{
    mirror_value, parse_creator_value, parse_mirror_value, parse_slot_value, slot_value,
};
use crate::records::RefEntry;
use crate::store::{Compare, LeaseId, Revision, TxnOp, TxnRequest};

/// A quota record as read.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct QuotaRecord {
    pub value: Vec<u8>,
    pub mod_revision: Revision,
    pub lease: LeaseId,
}

/// One client's reference slots and mirrors in one pool.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ClientQuota {
    pub client: String,
    pub slots: BTreeMap<u64, QuotaRecord>,
    /// (key, holder) -> mirror.
    pub mirrors: BTreeMap<(String, String), QuotaRecord>,
}

impl ClientQuota {
    /// Every (key, holder) a mirror or a readable slot names: the references to read.
    pub fn references(&self) -> BTreeSet<(String, String)> {
        let mut out: BTreeSet<(String, String)> = self.mirrors.keys().cloned().collect();
        out.extend(self.slots.values().filter_map(|s| parse_slot_value(&s.value)));
        out
    }
}

/// A finding and its repair (`None`: a person decides).
pub type Planned = (Finding, Option<Repair>);

fn put(key: Vec<u8>, value: Vec<u8>, lease: LeaseId) -> TxnOp {
    if lease == 0 {
        TxnOp::put(key, value)
    } else {
        TxnOp::put_on_lease(key, value, lease)
    }
}

/// The findings of one client's reference slots in `pool`, with their repairs. `refs` holds the
/// references of [`ClientQuota::references`] that exist ((key, holder) -> record).
pub fn audit_client(
    l: &Layout,
    pool: &str,
    q: &ClientQuota,
    refs: &BTreeMap<(String, String), RefEntry>,
) -> Vec<Planned> {
    let client = q.client.as_str();
    let mut out = Vec::new();
    let mut slots_of: BTreeMap<(String, String), Vec<u64>> = BTreeMap::new();
    for (n, s) in &q.slots {
        match parse_slot_value(&s.value) {
            Some(r) => slots_of.entry(r).or_default().push(*n),
            None => {
                // It names no reference, so nothing counts by it (a mirror naming it is the
                // mirror's reference's finding).
                let record = l.quota_slot_key(pool, client, *n);
                out.push((
                    Finding::UnreadableQuotaValue {
                        record: String::from_utf8_lossy(&record).into_owned(),
                    },
                    Some(Repair {
                        action: format!(
                            "delete slot {n} of client {client:?}, which names no reference"
                        ),
                        txn: TxnRequest::new()
                            .when([Compare::mod_revision_is(record.clone(), s.mod_revision)])
                            .and_then([TxnOp::delete(record)]),
                    }),
                ));
            }
        }
    }
    // Slot numbers in use, and those repairs below take, so that no two repairs pick one.
    let mut used: BTreeSet<u64> = q.slots.keys().copied().collect();
    for (key, holder) in q.references() {
        let id = (key.clone(), holder.clone());
        let mirror = q.mirrors.get(&id);
        let named = mirror.and_then(|m| parse_mirror_value(&m.value));
        let slots = slots_of.get(&id).cloned().unwrap_or_default();
        let mirror_key = l.quota_mirror_key(pool, client, &holder, &key);
        let ref_key = l.ref_key(pool, &key, &holder);
        let slot_rev = |n: u64| q.slots.get(&n).map_or(0, |s| s.mod_revision);
        let guard_read = |c: &mut Vec<Compare>| {
            c.push(Compare::mod_revision_is(
                mirror_key.clone(),
                mirror.map_or(0, |m| m.mod_revision),
            ));
            for n in &slots {
                c.push(Compare::mod_revision_is(l.quota_slot_key(pool, client, *n), slot_rev(*n)));
            }
        };
        let Some(r) = refs.get(&id) else {
            // Counts a reference that is not there: a crash between the slot and the bind, or
            // between the release and the free.
            let mut c = Vec::new();
            guard_read(&mut c);
            c.push(Compare::absent(ref_key));
            let mut ops: Vec<TxnOp> = Vec::new();
            if mirror.is_some() {
                ops.push(TxnOp::delete(mirror_key.clone()));
            }
            ops.extend(slots.iter().map(|n| TxnOp::delete(l.quota_slot_key(pool, client, *n))));
            let what = if slots.is_empty() {
                "its mirror".to_string()
            } else {
                format!("slots {slots:?}{}", if mirror.is_some() { " and the mirror" } else { "" })
            };
            out.push((
                Finding::QuotaWithoutReference {
                    client: client.to_string(),
                    key: key.clone(),
                    holder: holder.clone(),
                    slots: slots.clone(),
                    mirror: mirror.is_some(),
                },
                Some(Repair {
                    action: format!(
                        "free {what} of client {client:?} for the absent reference of {holder:?} \
                         on {key:?}"
                    ),
                    txn: TxnRequest::new().when(c).and_then(ops),
                }),
            ));
            continue;
        };
        let healthy = match (mirror, named, &slots[..]) {
            (Some(m), Some(n), [s]) if *s == n => {
                let slot_lease = q.slots.get(&n).map_or(r.lease, |s| s.lease);
                m.lease == r.lease && slot_lease == r.lease
            }
            _ => false,
        };
        if healthy {
            continue;
        }
        // The slot that stays: the one the mirror names if it counts this reference, else one
        // that counts it, else the mirror's number if free, else the lowest free number.
        let target = match named {
            Some(n) if slots.contains(&n) => n,
            _ => match (slots.first(), named) {
                (Some(s), _) => *s,
                (None, Some(n)) if !used.contains(&n) => n,
                _ => (0..).find(|n| !used.contains(n)).unwrap_or(0),
            },
        };
        used.insert(target);
        let mut c = Vec::new();
        guard_read(&mut c);
        if !slots.contains(&target) {
            c.push(Compare::absent(l.quota_slot_key(pool, client, target)));
        }
        c.push(Compare::mod_revision_is(ref_key, r.mod_revision));
        let mut ops = vec![
            put(mirror_key.clone(), mirror_value(target), r.lease),
            put(l.quota_slot_key(pool, client, target), slot_value(&key, &holder), r.lease),
        ];
        ops.extend(
            slots
                .iter()
                .filter(|n| **n != target)
                .map(|n| TxnOp::delete(l.quota_slot_key(pool, client, *n))),
        );
        out.push((
            Finding::QuotaMiscounted {
                client: client.to_string(),
                key: key.clone(),
                holder: holder.clone(),
                slots: slots.clone(),
                mirror: named,
            },
            Some(Repair {
                action: format!(
                    "count the reference of {holder:?} on {key:?} by slot {target} of client \
                     {client:?} alone, with its mirror, on the reference's lease"
                ),
                txn: TxnRequest::new().when(c).and_then(ops),
            }),
        ));
    }
    out
}

/// The finding of pool `pool`'s creator record (`creator`), if any. `spec_revision`: the pool's
/// spec record's mod revision, `None` if it has none; `slot`: the pool slot the creator record
/// names, as read. A creator record in a pool without a spec is left to the pool's own
/// finding (`DataWithoutSpec`): a create may be in flight, and only a person can tell.
pub fn audit_creator(
    l: &Layout,
    pool: &str,
    creator: &QuotaRecord,
    spec_revision: Option<Revision>,
    slot: Option<&QuotaRecord>,
) -> Option<Planned> {
    let spec_revision = spec_revision?;
    let creator_key = l.quota_creator_key(pool);
    let Some((client, n)) = parse_creator_value(&creator.value) else {
        let record = String::from_utf8_lossy(&creator_key).into_owned();
        return Some((Finding::UnreadableQuotaValue { record }, None));
    };
    let counts = slot.map(|s| String::from_utf8_lossy(&s.value).into_owned());
    if counts.as_deref() == Some(pool) {
        return None;
    }
    let finding = Finding::PoolCreatorWithoutSlot {
        pool: pool.to_string(),
        client: client.clone(),
        slot: n,
        counts: counts.clone(),
    };
    if counts.is_some() {
        // The slot counts another pool: which of the two the client created, a person decides.
        return Some((finding, None));
    }
    let slot_key = l.pool_slot_key(&client, n);
    Some((
        finding,
        Some(Repair {
            action: format!("re-create pool slot {n} of client {client:?}, which counts {pool:?}"),
            txn: TxnRequest::new()
                .when([
                    Compare::absent(slot_key.clone()),
                    Compare::mod_revision_is(creator_key, creator.mod_revision),
                    Compare::mod_revision_is(l.pool_spec_key(pool), spec_revision),
                ])
                .and_then([TxnOp::put(slot_key, pool.as_bytes().to_vec())]),
        }),
    ))
}

/// The finding of pool slot `n` of `client` (`slot`, whose value names a pool), if any.
/// `creator`: the creator record of the pool it names, as read (`None` if absent).
pub fn audit_pool_slot(
    l: &Layout,
    client: &str,
    n: u64,
    slot: &QuotaRecord,
    creator: Option<&QuotaRecord>,
) -> Option<Planned> {
    let slot_key = l.pool_slot_key(client, n);
    let pool = match std::str::from_utf8(&slot.value) {
        Ok(p) if crate::pool::validate_pool_name(p).is_ok() => p,
        _ => {
            let record = String::from_utf8_lossy(&slot_key).into_owned();
            return Some((Finding::UnreadableQuotaValue { record }, None));
        }
    };
    let names_it = |c: &QuotaRecord| parse_creator_value(&c.value) == Some((client.into(), n));
    if creator.is_some_and(names_it) {
        return None;
    }
    let creator_key = l.quota_creator_key(pool);
    Some((
        Finding::PoolSlotWithoutPool { client: client.to_string(), slot: n, pool: pool.into() },
        Some(Repair {
            action: format!("free pool slot {n} of client {client:?}: it counts no pool"),
            txn: TxnRequest::new()
                .when([
                    Compare::mod_revision_is(slot_key.clone(), slot.mod_revision),
                    Compare::mod_revision_is(creator_key, creator.map_or(0, |c| c.mod_revision)),
                ])
                .and_then([TxnOp::delete(slot_key)]),
        }),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::{CompareOp, CompareTarget};

    const P: &str = "p";

    fn rec(value: impl Into<Vec<u8>>, rev: Revision, lease: LeaseId) -> QuotaRecord {
        QuotaRecord { value: value.into(), mod_revision: rev, lease }
    }

    fn reference(rev: Revision, lease: LeaseId) -> RefEntry {
        RefEntry { id: Some(1), mod_revision: rev, lease }
    }

    fn quota(slots: &[(u64, &str, &str)], mirrors: &[(&str, &str, u64)]) -> ClientQuota {
        ClientQuota {
            client: "c".into(),
            slots: slots.iter().map(|(n, k, h)| (*n, rec(slot_value(k, h), 5, 0))).collect(),
            mirrors: mirrors
                .iter()
                .map(|(k, h, n)| ((k.to_string(), h.to_string()), rec(mirror_value(*n), 5, 0)))
                .collect(),
        }
    }

    fn refs(present: &[(&str, &str)]) -> BTreeMap<(String, String), RefEntry> {
        present.iter().map(|(k, h)| ((k.to_string(), h.to_string()), reference(4, 0))).collect()
    }

    /// Every txn compares each record it writes or deletes (and the reference).
    fn assert_guarded(l: &Layout, r: &Repair) {
        let compared: BTreeSet<Vec<u8>> =
            r.txn.compare.iter().map(|c| c.range.key.clone()).collect();
        for op in &r.txn.success {
            let key = match op {
                TxnOp::Put(p) => p.key.clone(),
                TxnOp::Delete(r) => r.key.clone(),
                other => panic!("{other:?}"),
            };
            assert!(compared.contains(&key), "{key:?} written unguarded: {r:?}");
        }
        assert!(
            r.txn.compare.iter().any(|c| c.range.key.starts_with(&l.refs_prefix(P))
                || c.range.key.starts_with(&l.pool_slots_root())),
            "{r:?}"
        );
        assert!(r.txn.compare.iter().all(|c| c.op == CompareOp::Equal
            && matches!(
                c.target,
                CompareTarget::ModRevision(_) | CompareTarget::CreateRevision(0)
            )));
    }

    #[test]
    fn a_counted_reference_is_healthy() {
        let l = Layout::default();
        let q = quota(&[(0, "a", "h"), (3, "b", "h")], &[("a", "h", 0), ("b", "h", 3)]);
        assert_eq!(audit_client(&l, P, &q, &refs(&[("a", "h"), ("b", "h")])), vec![]);
    }

    #[test]
    fn a_slot_without_its_reference_is_freed_with_the_reference_compared_absent() {
        let l = Layout::default();
        let q = quota(&[(0, "a", "h"), (2, "b", "h")], &[("a", "h", 0)]);
        let found = audit_client(&l, P, &q, &refs(&[]));
        assert_eq!(found.len(), 2, "{found:?}");
        let (f, r) = &found[0];
        assert_eq!(
            f,
            &Finding::QuotaWithoutReference {
                client: "c".into(),
                key: "a".into(),
                holder: "h".into(),
                slots: vec![0],
                mirror: true
            }
        );
        let r = r.as_ref().expect("a repair");
        assert_guarded(&l, r);
        assert!(r.txn.compare.contains(&Compare::absent(l.ref_key(P, "a", "h"))));
        assert_eq!(
            r.txn.success,
            vec![
                TxnOp::delete(l.quota_mirror_key(P, "c", "h", "a")),
                TxnOp::delete(l.quota_slot_key(P, "c", 0))
            ]
        );
        // A slot without a mirror and without a reference: the slot alone.
        let r = found[1].1.as_ref().expect("a repair");
        assert_eq!(r.txn.success, vec![TxnOp::delete(l.quota_slot_key(P, "c", 2))]);
    }

    #[test]
    fn a_present_reference_ends_counted_by_one_slot_and_its_mirror() {
        let l = Layout::default();
        let present = refs(&[("a", "h")]);
        let slot_of = |r: &Repair| -> Option<u64> {
            r.txn.success.iter().find_map(|op| match op {
                TxnOp::Put(p) if p.key == l.quota_mirror_key(P, "c", "h", "a") => {
                    parse_mirror_value(&p.value)
                }
                _ => None,
            })
        };
        // (slots, mirror, the slot that stays, slots deleted)
        let cases: Vec<(ClientQuota, u64, Vec<u64>)> = vec![
            // Mirror without its slot: the slot is put back under the mirror's number.
            (quota(&[], &[("a", "h", 4)]), 4, vec![]),
            // Mirror naming a slot that counts another reference: the lowest free number.
            (quota(&[(0, "b", "g"), (1, "x", "y")], &[("a", "h", 0)]), 2, vec![]),
            // Slot without a mirror: the mirror is put back naming it.
            (quota(&[(3, "a", "h")], &[]), 3, vec![]),
            // Two slots for one reference: the one the mirror names stays.
            (quota(&[(1, "a", "h"), (5, "a", "h")], &[("a", "h", 5)]), 5, vec![1]),
        ];
        for (q, stays, deleted) in cases {
            let found = audit_client(&l, P, &q, &present);
            let mine: Vec<&Planned> = found
                .iter()
                .filter(|(f, _)| matches!(f, Finding::QuotaMiscounted { key, .. } if key == "a"))
                .collect();
            assert_eq!(mine.len(), 1, "{q:?}: {found:?}");
            let r = mine[0].1.as_ref().expect("a repair");
            assert_guarded(&l, r);
            assert!(r.txn.compare.contains(&Compare::mod_revision_is(l.ref_key(P, "a", "h"), 4)));
            assert_eq!(slot_of(r), Some(stays), "{q:?}");
            let dels: Vec<TxnOp> =
                deleted.iter().map(|n| TxnOp::delete(l.quota_slot_key(P, "c", *n))).collect();
            assert!(dels.iter().all(|d| r.txn.success.contains(d)), "{r:?}");
        }
        // A session's reference whose slot is not on its lease: both move onto it.
        let mut q = quota(&[(0, "a", "h")], &[("a", "h", 0)]);
        let mut on_lease = refs(&[("a", "h")]);
        on_lease.values_mut().for_each(|r| r.lease = 77);
        q.mirrors.values_mut().for_each(|m| m.lease = 77);
        let found = audit_client(&l, P, &q, &on_lease);
        let r = found[0].1.as_ref().expect("a repair");
        assert!(r.txn.success.contains(&TxnOp::put_on_lease(
            l.quota_slot_key(P, "c", 0),
            slot_value("a", "h"),
            77
        )));
        q.slots.values_mut().for_each(|s| s.lease = 77);
        assert_eq!(audit_client(&l, P, &q, &on_lease), vec![]);
    }

    #[test]
    fn an_unreadable_slot_goes_and_its_mirror_moves() {
        let l = Layout::default();
        let mut q = quota(&[], &[("a", "h", 0)]);
        q.slots.insert(0, rec("garbage", 5, 0));
        let found = audit_client(&l, P, &q, &refs(&[("a", "h")]));
        assert_eq!(found.len(), 2, "{found:?}");
        assert!(matches!(found[0].0, Finding::UnreadableQuotaValue { .. }));
        let r = found[1].1.as_ref().expect("a repair");
        assert!(r.txn.success.contains(&TxnOp::put(l.quota_mirror_key(P, "c", "h", "a"), "1")));
    }

    #[test]
    fn creator_records_and_pool_slots() {
        let l = Layout::default();
        let creator = rec(crate::quota_names::creator_value("c", 2), 5, 0);
        let slot = rec("p", 6, 0);
        assert_eq!(audit_creator(&l, P, &creator, Some(3), Some(&slot)), None);
        // No spec: the pool's own finding.
        assert_eq!(audit_creator(&l, P, &creator, None, None), None);
        let (f, r) = audit_creator(&l, P, &creator, Some(3), None).expect("a finding");
        assert_eq!(
            f,
            Finding::PoolCreatorWithoutSlot {
                pool: P.into(),
                client: "c".into(),
                slot: 2,
                counts: None
            }
        );
        let r = r.expect("a repair");
        assert_guarded(&l, &r);
        assert_eq!(r.txn.success, vec![TxnOp::put(l.pool_slot_key("c", 2), "p")]);
        let other = rec("q", 6, 0);
        let (_, r) = audit_creator(&l, P, &creator, Some(3), Some(&other)).expect("a finding");
        assert_eq!(r, None, "a person decides");

        assert_eq!(audit_pool_slot(&l, "c", 2, &slot, Some(&creator)), None);
        for c in [None, Some(&rec("c/3", 7, 0)), Some(&rec("d/2", 7, 0))] {
            let (f, r) = audit_pool_slot(&l, "c", 2, &slot, c).expect("a finding");
            assert_eq!(
                f,
                Finding::PoolSlotWithoutPool { client: "c".into(), slot: 2, pool: "p".into() }
            );
            let r = r.expect("a repair");
            assert_guarded(&l, &r);
            let rev = c.map_or(0, |c| c.mod_revision);
            assert!(r.txn.compare.contains(&Compare::mod_revision_is(l.quota_creator_key(P), rev)));
        }
    }
}
