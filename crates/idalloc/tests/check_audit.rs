//! `check` (the library audit, `idalloc::check`) on pools written by a real allocator: a pool with
//! prefix bits, idle grace and reuse delay is healthy after acquires and
//! releases, and `check --repair` never takes an ID from a key inside its idle grace or an ID
//! inside its reuse delay (DESIGN §8, G5).

mod common;

use std::sync::Arc;
use std::time::Duration;

use idalloc::audit::Finding;
use idalloc::check;
use idalloc::layout::{encode_id, IdRecord};
use idalloc::store::embedded::EmbeddedStore;
use idalloc::store::{GetRequest, Store, TxnOp, TxnRequest};
use idalloc::PoolSpec;

use common::{allocator, layout, raw_binding};

const HOUR: Duration = Duration::from_secs(3600);

async fn id_record(store: &EmbeddedStore, pool: &str, id: u64) -> Option<IdRecord> {
    let r = store.get(GetRequest::key(layout().id_key(pool, id))).await.expect("read");
    r.kvs.first().and_then(|kv| IdRecord::decode(&kv.value))
}

#[tokio::test(start_paused = true)]
async fn check_of_a_prefixed_pool_finds_nothing_and_repair_keeps_idle_keys_and_tombstones() {
    let store = Arc::new(EmbeddedStore::memory());
    let l = layout();
    let a = allocator(store.clone(), "node-a");
    // The setup docs/guide/multi-cluster.md recommends, and a pool whose reclaims leave tombstones.
    let ids = PoolSpec::new("ids", 1, 65535).prefix(0x10000).idle_grace(HOUR);
    let quar = PoolSpec::new("quar", 1, 65535).prefix(0x20000).reuse_delay(HOUR);
    let pi = a.ensure_pool(&ids).await.unwrap();
    let pq = a.ensure_pool(&quar).await.unwrap();

    let idle_id = pi.acquire_durable("idle-key", "h").await.unwrap().id;
    pi.release_durable("idle-key", "h").await.unwrap();
    let held_id = pi.acquire_durable("held-key", "h").await.unwrap().id;
    let gone_id = pq.acquire_durable("gone", "h").await.unwrap().id;
    assert!(pq.release_durable("gone", "h").await.unwrap().reclaimed);
    assert_eq!(id_record(&store, "quar", gone_id).await, Some(IdRecord::Tombstone("gone".into())));

    let scan = check::scan(&*store, &l, None, 100).await.unwrap();
    assert_eq!(scan.report.breaches(), 0, "{:?}", scan.report);
    assert!(check::repair(&*store, &l, &scan).await.unwrap().is_empty());

    // A real breach in the same pool: an unheld key whose record names an ID without the
    // pool's prefix bits. Repair removes that binding and nothing else.
    let raw = 7;
    store
        .txn(TxnRequest::new().and_then([
            TxnOp::put(l.key_key("ids", "stray"), encode_id(raw)),
            TxnOp::put(l.id_key("ids", raw), b"stray".to_vec()),
        ]))
        .await
        .unwrap();
    let scan = check::scan(&*store, &l, Some("ids"), 100).await.unwrap();
    assert_eq!(
        scan.report.pools[0].findings,
        vec![Finding::IdOutOfRange { id: raw, key: Some("stray".into()), reserved: false }]
    );
    let outcomes = check::repair(&*store, &l, &scan).await.unwrap();
    assert_eq!(outcomes.len(), 1);
    assert!(outcomes[0].applied, "{outcomes:?}");
    let scan = check::scan(&*store, &l, None, 100).await.unwrap();
    assert_eq!(scan.report.breaches(), 0, "{:?}", scan.report);

    // Inside its grace the idle key gets its ID back; the held key kept its ID; the tombstone
    // still quarantines its ID.
    assert_eq!(pi.acquire_durable("idle-key", "h").await.unwrap().id, idle_id);
    assert_eq!(raw_binding(&*store, "ids", "held-key").await, Some(held_id));
    assert_eq!(id_record(&store, "quar", gone_id).await, Some(IdRecord::Tombstone("gone".into())));
    a.close().await.unwrap();
}

/// Every record kind an allocator or the service writes is known to `check` in every-pool mode:
/// a shared client session's record (`P/sessions/<lease>`), durable holders' fence records and
/// the fence floor, the service's quota records (reference slots, `sessions=` and `pools=` slots,
/// a pool's creator), the cluster version, leased references and tombstones. A healthy store
/// holding all of them has no findings.
#[tokio::test(start_paused = true)]
async fn check_knows_every_record_kind_a_healthy_store_holds() {
    let store = Arc::new(EmbeddedStore::memory());
    let l = layout();
    let a = allocator(store.clone(), "node-a");
    let p = a.ensure_pool(&PoolSpec::new("kinds", 1, 100).reuse_delay(HOUR)).await.unwrap();
    p.acquire_durable("held", "alice").await.unwrap();
    // A release leaves a tombstone and alice's fence record (`holder/alice`).
    p.acquire_durable("gone", "alice").await.unwrap();
    assert!(p.release_durable("gone", "alice").await.unwrap().reclaimed);
    let shared = a.shared_client_session(HOUR, "s-", b"opaque session record").await.unwrap();
    shared.acquire(&p, "leased").await.unwrap();
    let fence_floor = l.fence_floor_key("kinds");
    // The leased reference counted as the service counts it: a slot and its mirror, on its lease.
    let (holder, lease) = (shared.holder().to_string(), shared.lease());
    let quota = l.quota_slot_key("kinds", "client-a", 0);
    let mirror = l.quota_mirror_key("kinds", "client-a", &holder, "leased");
    let creator = [l.quota_prefix("kinds"), b"~creator".to_vec()].concat();
    let session_slot = format!("{}/sessions/quota/client-a/0", l.prefix()).into_bytes();
    let pool_slot = format!("{}/sessions/quota-pools/client-a/0", l.prefix()).into_bytes();
    store
        .txn(TxnRequest::new().and_then([
            TxnOp::put(fence_floor.clone(), b"".to_vec()),
            TxnOp::put_on_lease(quota, idalloc::quota_names::slot_value("leased", &holder), lease),
            TxnOp::put_on_lease(mirror, idalloc::quota_names::mirror_value(0), lease),
            TxnOp::put(creator, b"client-a/0".to_vec()),
            TxnOp::put(session_slot, b"x".to_vec()),
            TxnOp::put(pool_slot, b"kinds".to_vec()),
        ]))
        .await
        .unwrap();
    idalloc::cluster_version::finalize(&*store, &l, idalloc::cluster_version::DEFAULT_GRACE)
        .await
        .unwrap();
    let all = store.get(GetRequest::prefix(format!("{}/", l.prefix()))).await.unwrap();
    let names: Vec<String> =
        all.kvs.iter().map(|kv| String::from_utf8_lossy(&kv.key).into_owned()).collect();
    for kind in [
        "/sessions/",
        "/data/kinds/holder/alice",
        "/data/kinds/fence",
        "/quota/",
        "/quota/~creator",
        "/sessions/quota-pools/",
        "/cluster/version",
        "/cluster/grace",
    ] {
        assert!(names.iter().any(|n| n.contains(kind)), "no {kind} record in {names:?}");
    }

    let scan = check::scan(&*store, &l, None, 100).await.unwrap();
    assert_eq!(scan.report.breaches(), 0, "{:?}", scan.report);
    assert!(scan.report.other.is_empty(), "{:?}", scan.report.other);
    for pool in &scan.report.pools {
        assert!(pool.findings.is_empty(), "{}: {:?}", pool.pool, pool.findings);
    }
    let one = check::scan(&*store, &l, Some("kinds"), 100).await.unwrap();
    assert_eq!(one.report.breaches(), 0, "{:?}", one.report);
}
