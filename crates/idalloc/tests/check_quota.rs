//! `check` on `idalloc serve`'s quota records (docs/design/quotas.md, "What `check` repairs"),
//! written as the service writes them (`idalloc::quota_names`) beside references a real
//! allocator made: a session's slot whose reference never came, a slot on the wrong lease, pool
//! slots of deleted pools and creator records without their slot. `--repair` fixes each with
//! a guarded txn, a second check finds nothing, and the session's records go with its lease.

mod common;

use std::sync::Arc;
use std::time::Duration;

use idalloc::audit::Finding;
use idalloc::check;
use idalloc::quota_names::{creator_value, mirror_value, slot_value};
use idalloc::store::embedded::EmbeddedStore;
use idalloc::store::{GetRequest, KeyRange, LeaseId, Store, TxnOp, TxnRequest};
use idalloc::PoolSpec;

use common::{allocator, layout};

async fn put(store: &EmbeddedStore, key: Vec<u8>, value: Vec<u8>, lease: LeaseId) {
    let op =
        if lease == 0 { TxnOp::put(key, value) } else { TxnOp::put_on_lease(key, value, lease) };
    store.txn(TxnRequest::new().and_then([op])).await.expect("raw put");
}

/// The records (and their leases) under `prefix`.
async fn under(store: &EmbeddedStore, prefix: Vec<u8>) -> Vec<(String, LeaseId)> {
    let got = store.get(GetRequest::new(KeyRange::prefix(prefix))).await.expect("read");
    got.kvs.iter().map(|kv| (String::from_utf8_lossy(&kv.key).into_owned(), kv.lease)).collect()
}

/// A slot and its mirror as the service takes them for `holder`'s reference on `key`.
async fn counted(
    store: &EmbeddedStore,
    client: &str,
    n: u64,
    key: &str,
    holder: &str,
    lease: LeaseId,
) {
    let l = layout();
    put(store, l.quota_slot_key("a", client, n), slot_value(key, holder), lease).await;
    put(store, l.quota_mirror_key("a", client, holder, key), mirror_value(n), lease).await;
}

#[tokio::test]
async fn check_repairs_quota_records_and_leaves_healthy_ones() {
    let store = Arc::new(EmbeddedStore::memory());
    let l = layout();
    let alloc = allocator(store.clone(), "h");
    let pool = alloc.ensure_pool(&PoolSpec::new("a", 1, 100)).await.expect("pool");
    alloc.ensure_pool(&PoolSpec::new("b", 1, 100)).await.expect("pool b");
    let session = alloc.client_session(Duration::from_secs(60)).await.expect("session");
    let (s, lease) = (session.holder().to_string(), session.lease());

    // Healthy: a session reference and a durable one, each counted on its lease.
    session.acquire(&pool, "k1").await.expect("acquire");
    counted(&store, "t1", 0, "k1", &s, lease).await;
    pool.acquire_durable("k2", "t1/d").await.expect("acquire");
    counted(&store, "t1", 1, "k2", "t1/d", 0).await;
    let scan = check::scan(&*store, &l, None, 100).await.expect("scan");
    assert_eq!(scan.report.breaches(), 0, "{:?}", scan.report);

    // A session's slot whose bind never came (the instance died in between).
    counted(&store, "t1", 2, "k3", &s, lease).await;
    // A durable reference whose slot and mirror are on a session's lease.
    pool.acquire_durable("k4", "t2/d").await.expect("acquire");
    counted(&store, "t2", 0, "k4", "t2/d", lease).await;
    // A mirror whose slot is gone, its reference present.
    pool.acquire_durable("k5", "t2/d").await.expect("acquire");
    put(&store, l.quota_mirror_key("a", "t2", "t2/d", "k5"), mirror_value(4), 0).await;
    // Pool "b" counts for t3 by a creator record whose slot is gone; t3's slot 1 names pool
    // "gone", which has no creator record.
    put(&store, l.quota_creator_key("b"), creator_value("t3", 0), 0).await;
    put(&store, l.pool_slot_key("t3", 1), b"gone".to_vec(), 0).await;

    let scan = check::scan(&*store, &l, None, 100).await.expect("scan");
    let found: Vec<&Finding> =
        scan.report.pools.iter().flat_map(|p| &p.findings).chain(&scan.report.other).collect();
    assert_eq!(found.len(), 5, "{found:#?}");
    assert!(found.contains(&&Finding::QuotaWithoutReference {
        client: "t1".into(),
        key: "k3".into(),
        holder: s.clone(),
        slots: vec![2],
        mirror: true
    }));
    assert!(found.contains(&&Finding::QuotaMiscounted {
        client: "t2".into(),
        key: "k4".into(),
        holder: "t2/d".into(),
        slots: vec![0],
        mirror: Some(0)
    }));
    assert!(found.contains(&&Finding::QuotaMiscounted {
        client: "t2".into(),
        key: "k5".into(),
        holder: "t2/d".into(),
        slots: vec![],
        mirror: Some(4)
    }));
    assert!(found.contains(&&Finding::PoolCreatorWithoutSlot {
        pool: "b".into(),
        client: "t3".into(),
        slot: 0,
        counts: None
    }));
    assert!(found.contains(&&Finding::PoolSlotWithoutPool {
        client: "t3".into(),
        slot: 1,
        pool: "gone".into()
    }));

    let outcomes = check::repair(&*store, &l, &scan).await.expect("repair");
    assert!(outcomes.iter().all(|o| o.applied), "{outcomes:#?}");
    let again = check::scan(&*store, &l, None, 100).await.expect("scan");
    assert_eq!(again.report.breaches(), 0, "{:?}", again.report);

    let q = |c: &str| l.quota_client_prefix("a", c);
    let t1 = under(&store, q("t1")).await;
    assert_eq!(t1.len(), 4, "k1 and k2 stay counted, k3's records are gone: {t1:?}");
    assert!(t1.iter().all(|(k, _)| !k.contains("k3") && !k.ends_with("slot/2")), "{t1:?}");
    let t2 = under(&store, q("t2")).await;
    assert_eq!(t2.len(), 4, "{t2:?}");
    assert!(t2.iter().all(|(_, lease)| *lease == 0), "durable references, durable slots: {t2:?}");
    assert!(t2.iter().any(|(k, _)| k.ends_with("/slot/4")), "k5's slot under its mirror's number");
    let t3 = under(&store, l.pool_slots_prefix("t3")).await;
    assert_eq!(t3, vec![(String::from_utf8_lossy(&l.pool_slot_key("t3", 0)).into_owned(), 0)]);

    // A repair whose records changed since the scan does nothing: the stale slot of a reference
    // that an acquire binds meanwhile stays and counts it.
    counted(&store, "t1", 3, "k6", &s, lease).await;
    let scan = check::scan(&*store, &l, Some("a"), 100).await.expect("scan");
    assert_eq!(scan.report.breaches(), 1, "{:?}", scan.report);
    session.acquire(&pool, "k6").await.expect("the bind lands first");
    let outcomes = check::repair(&*store, &l, &scan).await.expect("repair");
    assert!(outcomes.iter().all(|o| o.action.is_some() && !o.applied), "{outcomes:#?}");
    let again = check::scan(&*store, &l, Some("a"), 100).await.expect("scan");
    assert_eq!(again.report.breaches(), 0, "{:?}", again.report);

    // The session's records go with its lease, references and slots together.
    assert!(session.end().await.expect("end"));
    let t1 = under(&store, q("t1")).await;
    assert_eq!(t1.len(), 2, "only the durable k2's slot and mirror: {t1:?}");
    let again = check::scan(&*store, &l, None, 100).await.expect("scan");
    assert_eq!(again.report.breaches(), 0, "{:?}", again.report);
}
