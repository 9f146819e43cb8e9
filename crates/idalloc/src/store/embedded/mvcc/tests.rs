//! Unit tests of the embedded store's state machine.

use super::*;
use crate::store::{PutRequest, MAX_REQUEST_BYTES};

fn put(m: &mut Mvcc, k: &str, v: &str) -> TxnResponse {
    m.txn(&TxnRequest::new().and_then([TxnOp::put(k, v)])).expect("put")
}

fn get(m: &Mvcc, k: &str) -> Option<KeyValue> {
    m.get(&GetRequest::key(k)).expect("get").kvs.into_iter().next()
}

fn ok(m: &mut Mvcc, compare: Compare) -> bool {
    m.txn(&TxnRequest::new().when([compare])).expect("txn").succeeded
}

#[test]
fn revisions_start_at_one_and_bump_once_per_writing_txn() {
    let mut m = Mvcc::new();
    assert_eq!(m.revision(), 1);
    assert_eq!(m.get(&GetRequest::key("a")).unwrap().revision, 1);
    let r =
        m.txn(&TxnRequest::new().and_then([TxnOp::put("a", "1"), TxnOp::put("b", "1")])).unwrap();
    assert_eq!(r.revision, 2);
    let a = get(&m, "a").unwrap();
    assert_eq!((a.create_revision, a.mod_revision, a.version), (2, 2, 1));
    // Reads only: no bump.
    let r = m.txn(&TxnRequest::new().and_then([TxnOp::get_key("a")])).unwrap();
    assert_eq!(r.revision, 2);
    // A delete of nothing: no bump.
    let r = m.txn(&TxnRequest::new().and_then([TxnOp::delete("zzz")])).unwrap();
    assert_eq!(r.revision, 2);
    assert_eq!(r.responses, vec![OpResponse::Delete { deleted: 0 }]);
    // A put of the same value still bumps and raises the version.
    put(&mut m, "a", "1");
    let a = get(&m, "a").unwrap();
    assert_eq!((a.create_revision, a.mod_revision, a.version), (2, 3, 2));
    assert_eq!(m.revision(), 3);
}

#[test]
fn version_and_create_revision_reset_after_delete() {
    let mut m = Mvcc::new();
    put(&mut m, "a", "1");
    put(&mut m, "a", "2");
    let r = m.txn(&TxnRequest::new().and_then([TxnOp::delete("a")])).unwrap();
    assert_eq!(r.revision, 4);
    assert_eq!(get(&m, "a"), None);
    put(&mut m, "a", "3");
    let a = get(&m, "a").unwrap();
    assert_eq!((a.create_revision, a.mod_revision, a.version), (5, 5, 1));
}

#[test]
fn single_key_compares_treat_missing_key_as_zero_record() {
    let mut m = Mvcc::new();
    assert!(ok(&mut m, Compare::absent("a")));
    assert!(ok(&mut m, Compare::mod_revision_is("a", 0)));
    // A value compare on a missing key is false, even "not equal".
    assert!(!ok(&mut m, Compare::value_is("a", "")));
    assert!(!ok(
        &mut m,
        Compare::new(KeyRange::key("a"), CompareOp::NotEqual, CompareTarget::Value(b"x".to_vec()))
    ));
    put(&mut m, "a", "5");
    assert!(ok(&mut m, Compare::value_is("a", "5")));
    assert!(ok(
        &mut m,
        Compare::new(KeyRange::key("a"), CompareOp::Greater, CompareTarget::Value(b"4".to_vec()))
    ));
    assert!(ok(
        &mut m,
        Compare::new(KeyRange::key("a"), CompareOp::Less, CompareTarget::Version(2))
    ));
    assert!(ok(
        &mut m,
        Compare::new(KeyRange::key("a"), CompareOp::Equal, CompareTarget::Lease(0))
    ));
    assert!(!ok(&mut m, Compare::absent("a")));
}

#[test]
fn range_compares_hold_for_every_key_and_empty_range_is_zero_record() {
    let mut m = Mvcc::new();
    let p = KeyRange::prefix("p/");
    assert!(ok(&mut m, Compare::range_empty(p.clone())));
    assert!(!ok(
        &mut m,
        Compare::new(p.clone(), CompareOp::NotEqual, CompareTarget::Value(b"x".to_vec()))
    ));
    put(&mut m, "p/a", "1"); // rev 2
    put(&mut m, "p/b", "2"); // rev 3
    put(&mut m, "p0", "outside"); // rev 4, outside the prefix
    assert!(!ok(&mut m, Compare::range_empty(p.clone())));
    // Every key: both have mod revision > 1, only one has > 2.
    assert!(ok(&mut m, Compare::new(p.clone(), CompareOp::Greater, CompareTarget::ModRevision(1))));
    assert!(!ok(
        &mut m,
        Compare::new(p.clone(), CompareOp::Greater, CompareTarget::ModRevision(2))
    ));
    // The half-open range [p/a, p/b) holds only p/a.
    let r = KeyRange::range("p/a", "p/b");
    assert!(ok(&mut m, Compare::new(r, CompareOp::Equal, CompareTarget::Value(b"1".to_vec()))));
    // Deleted keys do not count.
    m.txn(&TxnRequest::new().and_then([TxnOp::delete_range(p.clone())])).unwrap();
    assert!(ok(&mut m, Compare::range_empty(p)));
}

#[test]
fn nested_txn_compares_see_state_before_outer_txn() {
    let mut m = Mvcc::new();
    let req = TxnRequest::new().when([Compare::absent("a")]).and_then([
        TxnOp::put("a", "1"),
        TxnOp::Txn(
            TxnRequest::new()
                .when([Compare::absent("a")])
                .and_then([TxnOp::put("saw-absent", "yes")])
                .or_else([TxnOp::put("saw-present", "yes")]),
        ),
        TxnOp::get_key("a"),
    ]);
    let r = m.txn(&req).unwrap();
    assert!(r.succeeded);
    assert!(get(&m, "saw-absent").is_some());
    assert!(get(&m, "saw-present").is_none());
    match &r.responses[1] {
        OpResponse::Txn(t) => {
            assert!(t.succeeded);
            assert_eq!(t.revision, r.revision, "a nested txn reports the outer revision");
        }
        other => panic!("expected nested txn response, got {other:?}"),
    }
    // A get after a put in the same txn sees the put, at the txn's revision.
    match &r.responses[2] {
        OpResponse::Get(g) => {
            assert_eq!(g.revision, 2);
            assert_eq!(g.kvs[0].value, b"1");
        }
        other => panic!("expected get response, got {other:?}"),
    }
    assert_eq!(r.revision, 2);
}

#[test]
fn duplicate_keys_in_one_txn_are_rejected() {
    let mut m = Mvcc::new();
    let cases = vec![
        TxnRequest::new().and_then([TxnOp::put("a", "1"), TxnOp::put("a", "2")]),
        TxnRequest::new().and_then([TxnOp::put("a", "1"), TxnOp::delete("a")]),
        TxnRequest::new()
            .and_then([TxnOp::delete_range(KeyRange::prefix("a")), TxnOp::put("ab", "1")]),
        TxnRequest::new().and_then([
            TxnOp::put("a", "1"),
            TxnOp::Txn(TxnRequest::new().and_then([TxnOp::put("a", "2")])),
        ]),
        TxnRequest::new().and_then([
            TxnOp::delete("a"),
            TxnOp::Txn(TxnRequest::new().or_else([TxnOp::put("a", "2")])),
        ]),
        TxnRequest::new()
            .or_else([TxnOp::delete_range(KeyRange::from_key("a")), TxnOp::put("z", "1")]),
    ];
    for req in cases {
        match m.txn(&req) {
            Err(StoreError::InvalidRequest(msg)) => {
                assert!(msg.contains("duplicate key"), "{msg}")
            }
            other => panic!("{req:?} should be rejected, got {other:?}"),
        }
    }
    assert_eq!(m.revision(), 1, "nothing applied");
    // Allowed: the same key in both branches of one nested txn; overlapping deletes.
    let fine = TxnRequest::new().and_then([
        TxnOp::Txn(
            TxnRequest::new().and_then([TxnOp::put("a", "1")]).or_else([TxnOp::put("a", "2")]),
        ),
        TxnOp::delete("b"),
        TxnOp::delete_range(KeyRange::prefix("b")),
    ]);
    assert!(m.txn(&fine).is_ok());
    // etcd's quirk: a put in one nested txn and a delete in a later sibling both apply.
    let quirk = TxnRequest::new().and_then([
        TxnOp::Txn(TxnRequest::new().and_then([TxnOp::put("z", "1")])),
        TxnOp::Txn(TxnRequest::new().and_then([TxnOp::delete("z")])),
    ]);
    let before = m.revision();
    let r = m.txn(&quirk).unwrap();
    assert_eq!(r.revision, before + 1);
    assert_eq!(get(&m, "z"), None);
    let hist = m.history(&KeyRange::key("z"), before + 1);
    assert_eq!(hist.len(), 1);
    assert_eq!(hist[0].1.len(), 2, "put then delete, one revision");
}

#[test]
fn too_many_ops_too_large_and_empty_keys_are_rejected() {
    let mut m = Mvcc::new();
    let ops: Vec<TxnOp> = (0..129).map(|i| TxnOp::put(format!("k{i}"), "v")).collect();
    assert!(matches!(m.txn(&TxnRequest::new().and_then(ops)), Err(StoreError::InvalidRequest(_))));
    let ops: Vec<TxnOp> = (0..128).map(|i| TxnOp::put(format!("k{i}"), "v")).collect();
    assert!(m.txn(&TxnRequest::new().and_then(ops)).is_ok());
    let compares: Vec<Compare> = (0..129).map(|i| Compare::absent(format!("c{i}"))).collect();
    assert!(matches!(m.txn(&TxnRequest::new().when(compares)), Err(StoreError::InvalidRequest(_))));
    let nested = TxnRequest::new().and_then([TxnOp::Txn(
        TxnRequest::new().or_else((0..129).map(|i| TxnOp::get_key(format!("g{i}")))),
    )]);
    assert!(matches!(m.txn(&nested), Err(StoreError::InvalidRequest(_))));
    let big = TxnRequest::new().and_then([TxnOp::put("big", vec![0u8; MAX_REQUEST_BYTES + 1])]);
    assert!(matches!(m.txn(&big), Err(StoreError::InvalidRequest(m)) if m.contains("too large")));
    assert!(matches!(
        m.txn(&TxnRequest::new().and_then([TxnOp::put("", "v")])),
        Err(StoreError::InvalidRequest(_))
    ));
    assert!(matches!(m.get(&GetRequest::key("")), Err(StoreError::InvalidRequest(_))));
    // An empty start with an end is "from the first key".
    assert_eq!(m.get(&GetRequest::new(KeyRange::from_key(""))).unwrap().count, 128);
    assert_eq!(m.revision(), 2);
}

#[test]
fn put_on_missing_lease_fails_whole_txn_only_on_taken_branch() {
    let mut m = Mvcc::new();
    let req = TxnRequest::new().and_then([
        TxnOp::put("a", "1"),
        TxnOp::Put(PutRequest { key: b"b".to_vec(), value: b"1".to_vec(), lease: 77 }),
    ]);
    assert_eq!(m.txn(&req), Err(StoreError::LeaseNotFound(77)));
    assert_eq!(get(&m, "a"), None);
    assert_eq!(m.revision(), 1);
    // On the branch not taken, a bad lease does not matter.
    let req = TxnRequest::new()
        .when([Compare::absent("a")])
        .and_then([TxnOp::put("a", "1")])
        .or_else([TxnOp::put_on_lease("b", "1", 77)]);
    assert!(m.txn(&req).unwrap().succeeded);
}

#[test]
fn get_limit_count_keys_only_and_revisions() {
    let mut m = Mvcc::new();
    for k in ["p/a", "p/b", "p/c"] {
        put(&mut m, k, "v"); // revs 2, 3, 4
    }
    let r = m.get(&GetRequest::prefix("p/").with_limit(2)).unwrap();
    assert_eq!((r.kvs.len(), r.count, r.more, r.revision), (2, 3, true, 4));
    // A loose count stops one key past the limit (the rest of the range is not walked).
    let r = m.get(&GetRequest::prefix("p/").with_limit(1).loose_count()).unwrap();
    assert_eq!((r.kvs.len(), r.count, r.more), (1, 2, true));
    let r = m.get(&GetRequest::prefix("p/").with_limit(5).loose_count()).unwrap();
    assert_eq!((r.kvs.len(), r.count, r.more), (3, 3, false), "exact when all fit");
    let r = m.get(&GetRequest::prefix("p/").count_only()).unwrap();
    assert_eq!((r.kvs.len(), r.count, r.more), (0, 3, false));
    let r = m.get(&GetRequest::prefix("p/").keys_only()).unwrap();
    assert!(r.kvs.iter().all(|kv| kv.value.is_empty()) && r.kvs.len() == 3);
    let r = m.get(&GetRequest::prefix("p/").at_revision(3)).unwrap();
    assert_eq!(r.count, 2);
    assert_eq!(r.revision, 4, "header revision is the current one");
    assert_eq!(
        m.get(&GetRequest::prefix("p/").at_revision(5)),
        Err(StoreError::FutureRevision { requested: 5, current: 4 })
    );
    m.compact(3).unwrap();
    assert_eq!(
        m.get(&GetRequest::prefix("p/").at_revision(2)),
        Err(StoreError::Compacted { requested: 2, compact_revision: 3 })
    );
    assert_eq!(m.get(&GetRequest::prefix("p/").at_revision(3)).unwrap().count, 2);
    // Inside a txn the checks fail the whole txn.
    let req = TxnRequest::new()
        .and_then([TxnOp::put("x", "1"), TxnOp::get(GetRequest::key("x").at_revision(2))]);
    assert!(matches!(m.txn(&req), Err(StoreError::Compacted { .. })));
    assert_eq!(get(&m, "x"), None);
}

#[test]
fn compaction_follows_etcd_rules_and_keeps_reads_exact() {
    let mut m = Mvcc::new();
    assert_eq!(m.compact(2), Err(StoreError::FutureRevision { requested: 2, current: 1 }));
    m.compact(0).unwrap(); // as on a fresh etcd
    assert_eq!(m.compact(0), Err(StoreError::Compacted { requested: 0, compact_revision: 0 }));
    put(&mut m, "a", "1"); // 2
    put(&mut m, "a", "2"); // 3
    put(&mut m, "b", "1"); // 4
    m.txn(&TxnRequest::new().and_then([TxnOp::delete("b")])).unwrap(); // 5
    put(&mut m, "c", "1"); // 6
    m.take_delta();
    m.compact(5).unwrap();
    let removed = m.take_delta().removed;
    // a@2 superseded, b@4 superseded, b's delete@5 is the newest and a delete: all dropped.
    assert_eq!(removed.len(), 3, "{removed:?}");
    assert_eq!(m.history_len(), 2); // a@3, c@6
    let r = m.get(&GetRequest::new(KeyRange::from_key("a")).at_revision(5)).unwrap();
    assert_eq!(r.kvs.iter().map(|kv| kv.key.clone()).collect::<Vec<_>>(), vec![b"a".to_vec()]);
    assert_eq!(m.compact(5), Err(StoreError::Compacted { requested: 5, compact_revision: 5 }));
    // Watch history from the compaction point still sees later events.
    let h = m.history(&KeyRange::from_key("a"), 5);
    assert_eq!(h.iter().map(|(r, _)| *r).collect::<Vec<_>>(), vec![6]);
}

#[test]
fn auto_compaction_bounds_history() {
    let mut m = Mvcc::new();
    for i in 0..1000 {
        put(&mut m, "k", &i.to_string());
        m.auto_compact(100);
    }
    let rev = m.revision();
    assert!(m.compact_revision() <= rev - 100, "keeps at least 100 revisions");
    assert!(m.compact_revision() >= rev - 100 - 13, "compacts in batches of keep/8");
    assert!(m.history_len() <= 114, "history is bounded: {}", m.history_len());
    assert!(m.get(&GetRequest::key("k").at_revision(rev - 100)).is_ok());
    m.auto_compact(0); // disabled: no change
}

#[test]
fn leases_attach_expire_and_revoke_in_one_revision() {
    let mut m = Mvcc::new();
    let t0 = Instant::now();
    let l = m.lease_grant(1, 2, t0).unwrap();
    assert_eq!(l.ttl, 2, "raised to the minimum TTL as etcd does");
    assert_ne!(l.id, 0);
    let l2 = m.lease_grant(10, 2, t0).unwrap();
    assert_ne!(l.id, l2.id);
    m.txn(&TxnRequest::new().and_then([
        TxnOp::put_on_lease("a", "1", l.id),
        TxnOp::put_on_lease("b", "1", l.id),
        TxnOp::put_on_lease("c", "1", l2.id),
    ]))
    .unwrap(); // rev 2
               // Moving a key to another lease detaches it from the first.
    m.txn(&TxnRequest::new().and_then([TxnOp::put_on_lease("b", "2", l2.id)])).unwrap(); // 3
    assert_eq!(get(&m, "a").unwrap().lease, l.id);
    assert_eq!(m.expire_leases(t0 + Duration::from_millis(1999)), 0);
    assert_eq!(m.lease_keep_alive(l.id, t0 + Duration::from_secs(1)), Some(2));
    assert_eq!(m.expire_leases(t0 + Duration::from_millis(2999)), 0);
    assert_eq!(m.expire_leases(t0 + Duration::from_secs(3)), 1);
    assert_eq!(m.revision(), 4, "one revision for the expiry");
    assert_eq!(get(&m, "a"), None);
    assert!(get(&m, "b").is_some(), "b moved to l2");
    assert_eq!(m.lease_keep_alive(l.id, t0 + Duration::from_secs(3)), None);
    assert!(m.lease_revoke(l2.id));
    assert_eq!(m.revision(), 5);
    assert_eq!(get(&m, "b"), None);
    assert_eq!(get(&m, "c"), None);
    assert!(!m.lease_revoke(l2.id));
    // A lease without keys revokes without a revision.
    let l3 = m.lease_grant(5, 2, t0).unwrap();
    assert!(m.lease_revoke(l3.id));
    assert_eq!(m.revision(), 5);
    assert!(matches!(m.lease_grant(MAX_LEASE_TTL + 1, 2, t0), Err(StoreError::InvalidRequest(_))));
    let hist = m.history(&KeyRange::from_key("a"), 4);
    assert_eq!(hist[0].1.len(), 1);
    assert!(
        matches!(&hist[0].1[0], WatchEvent::Delete(kv) if kv.key == b"a" && kv.mod_revision == 4)
    );
}

#[test]
fn delta_batches_events_per_revision() {
    let mut m = Mvcc::new();
    m.txn(&TxnRequest::new().and_then([TxnOp::put("a", "1"), TxnOp::put("b", "1")])).unwrap();
    m.txn(&TxnRequest::new().and_then([TxnOp::delete("a")])).unwrap();
    let batches = m.take_delta().event_batches();
    assert_eq!(batches.len(), 2);
    assert_eq!(batches[0].0, 2);
    assert_eq!(batches[0].1.len(), 2);
    assert!(
        matches!(&batches[1].1[0], WatchEvent::Delete(kv) if kv.mod_revision == 3 && kv.version == 0)
    );
    assert!(m.take_delta().is_empty());
}
