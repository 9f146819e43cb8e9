//! A process of cluster protocol 1 beside this build (docs/design/cluster-version.md). Protocol 1
//! binds compare the key record, the ID record, the spec and the holder's fence record, but
//! neither the pool's fence floor nor the holder's own reference. Their txns are built here by
//! hand, byte for byte as such a process sends them, and applied late, as a slow link delivers
//! them; until the cluster version is finalized, and during the grace after it, this build must
//! stay safe beside them.

mod common;

use std::sync::Arc;
use std::time::Duration;

use idalloc::cluster_version::{self, Finalized, DEFAULT_GRACE, PROTOCOL_VERSION};
use idalloc::layout::{IdRecord, Layout};
use idalloc::store::embedded::EmbeddedStore;
use idalloc::store::{
    Compare, CompareOp, CompareTarget, GetRequest, KeyRange, Store, TxnOp, TxnRequest,
};
use idalloc::{Error, Input, PoolSpec};

use common::{count_refs, raw_binding};

/// `mod_revision(key) <= seen`, as protocol 1 writes it.
fn unchanged_since(key: Vec<u8>, seen: i64) -> Compare {
    Compare::new(KeyRange::key(key), CompareOp::Less, CompareTarget::ModRevision(seen + 1))
}

/// A protocol-1 bind of `key` to `id` for `holder` on `lease`, decided having seen `seen`
/// (the arguments are the fields of the txn, one each).
#[allow(clippy::too_many_arguments)]
fn protocol_1_bind(
    l: &Layout,
    key: &str,
    id: u64,
    holder: &str,
    lease: i64,
    existing: bool,
    spec_rev: i64,
    seen: i64,
) -> TxnRequest {
    let mut compare = Vec::new();
    let mut then = Vec::new();
    if existing {
        compare.push(Compare::value_is(l.key_key("p", key), id.to_string()));
        compare.push(Compare::value_is(l.id_key("p", id), IdRecord::Bound(key.into()).encode()));
        compare.push(unchanged_since(l.key_key("p", key), seen));
    } else {
        compare.push(Compare::absent(l.key_key("p", key)));
        compare.push(Compare::absent(l.id_key("p", id)));
        then.push(TxnOp::put(l.id_key("p", id), IdRecord::Bound(key.into()).encode()));
        then.push(TxnOp::put(l.key_key("p", key), id.to_string()));
    }
    compare.push(Compare::new(
        KeyRange::key(l.pool_spec_key("p")),
        CompareOp::Equal,
        CompareTarget::CreateRevision(spec_rev),
    ));
    compare.push(unchanged_since(l.holder_key("p", holder), seen));
    then.push(TxnOp::put_on_lease(l.ref_key("p", key, holder), id.to_string(), lease));
    TxnRequest::new().when(compare).and_then(then)
}

async fn spec_rev(store: &EmbeddedStore) -> i64 {
    let l = common::layout();
    store.get(GetRequest::key(l.pool_spec_key("p"))).await.unwrap().kvs[0].create_revision
}

async fn revision(store: &EmbeddedStore) -> i64 {
    store.get(GetRequest::key(b"x".to_vec())).await.unwrap().revision
}

/// The leak: `alice` (protocol 1) sends a create of `k` that is held back; she releases `k`,
/// which writes her fence record; a sweep of this build runs with folding on. Before, it folded
/// her record into the floor, which protocol 1 does not compare, so the late create committed a
/// binding and a reference nobody holds, for good. Until finalized, this build does not fold.
#[tokio::test(start_paused = true)]
async fn a_late_protocol_1_create_finds_the_fence_record_unfolded_until_finalized() {
    let store = EmbeddedStore::memory();
    let l = common::layout();
    let janitor = common::allocator_with(Arc::new(store.clone()), "janitor", |o| {
        o.fold_fences_above = 0;
    });
    let pool = janitor.ensure_pool(&PoolSpec::new("p", 1, 10)).await.unwrap();
    pool.wait_synced().await.unwrap();
    let late = protocol_1_bind(
        &l,
        "k",
        1,
        "alice",
        0,
        false,
        spec_rev(&store).await,
        revision(&store).await,
    );
    // Her release, as this build writes it: a durable acquire and release of `alice`.
    pool.acquire_durable("k", "alice").await.unwrap();
    assert!(pool.release_durable("k", "alice").await.unwrap().reclaimed);
    let report = pool.sweep().await.unwrap();
    assert!(!store.txn(late.clone()).await.unwrap().succeeded, "the late create must fail");
    assert_eq!(raw_binding(&store, "p", "k").await, None);
    assert_eq!(count_refs(&store, "p").await, 0);
    assert_eq!((report.fence_records, report.folded), (1, 0), "no fold before finalize");

    // Finalized without a grace: the fold runs at once (every process now compares the floor).
    assert_eq!(
        cluster_version::finalize(&store, &l, Duration::ZERO).await.unwrap(),
        Finalized::Moved { from: 1, revision: revision(&store).await }
    );
    assert_eq!(
        cluster_version::finalize(&store, &l, Duration::ZERO).await.unwrap(),
        Finalized::Already
    );
    assert_eq!(pool.sweep().await.unwrap().folded, 1);
    assert_eq!(cluster_version::read(&store, &l).await.unwrap().version, PROTOCOL_VERSION);
}

/// The leak with the finalize in between: `alice`'s create is sent before the finalize (its
/// sender then stops, as the operator promised) and delivered after it. During the grace no
/// sweep folds, so the late create still fails on her fence record; once the grace is over the
/// fold runs.
#[tokio::test(start_paused = true)]
async fn a_late_protocol_1_create_within_the_grace_after_finalize_finds_no_fold() {
    let store = EmbeddedStore::memory();
    let l = common::layout();
    let janitor = common::allocator_with(Arc::new(store.clone()), "janitor", |o| {
        o.fold_fences_above = 0;
    });
    let pool = janitor.ensure_pool(&PoolSpec::new("p", 1, 10)).await.unwrap();
    pool.wait_synced().await.unwrap();
    let late = protocol_1_bind(
        &l,
        "k",
        1,
        "alice",
        0,
        false,
        spec_rev(&store).await,
        revision(&store).await,
    );
    pool.acquire_durable("k", "alice").await.unwrap();
    assert!(pool.release_durable("k", "alice").await.unwrap().reclaimed);
    assert!(matches!(
        cluster_version::finalize(&store, &l, DEFAULT_GRACE).await.unwrap(),
        Finalized::Moved { from: 1, .. }
    ));
    let now = cluster_version::read(&store, &l).await.unwrap();
    assert_eq!((now.version, now.grace, now.in_force()), (2, Some(DEFAULT_GRACE), 1));

    tokio::time::sleep(DEFAULT_GRACE - Duration::from_secs(5)).await;
    let report = pool.sweep().await.unwrap();
    assert_eq!((report.fence_records, report.folded), (1, 0), "no fold during the grace");
    assert!(!store.txn(late).await.unwrap().succeeded, "the late create must fail");
    assert_eq!(raw_binding(&store, "p", "k").await, None);
    assert_eq!(count_refs(&store, "p").await, 0);

    // The store ends the grace (its lease expires); the next sweep folds.
    tokio::time::sleep(Duration::from_secs(10)).await;
    let now = cluster_version::read(&store, &l).await.unwrap();
    assert_eq!((now.grace, now.in_force()), (None, 2));
    assert_eq!(pool.sweep().await.unwrap().folded, 1);
}

/// Narrowing a pool waits for the finalize and its grace, because a protocol-1 process does not
/// see it: its binds compare only the spec record's create revision, which a resize keeps, and it
/// never rereads a spec of the same incarnation. Shown at the end: once shrinking is allowed, a
/// protocol-1 create of an ID the shrink excluded, decided before it, still commits.
#[tokio::test(start_paused = true)]
async fn narrowing_a_pool_waits_for_finalize_and_its_grace_and_growing_does_not() {
    let store = EmbeddedStore::memory();
    let l = common::layout();
    let admin = common::allocator(Arc::new(store.clone()), "admin");
    admin.ensure_pool(&PoolSpec::new("p", 1, 10)).await.unwrap();
    let late = protocol_1_bind(
        &l,
        "k",
        9,
        "alice",
        0,
        false,
        spec_rev(&store).await,
        revision(&store).await,
    );
    let refused = |r: Result<PoolSpec, Error>, what: &str| {
        let e = r.expect_err(what);
        assert!(matches!(e, Error::InvalidInput { input: Input::PoolInUse, .. }), "{e:?}");
        let m = e.to_string();
        assert!(m.contains("idalloc upgrade finalize") && m.contains("\"p\": "), "{m}");
    };
    refused(admin.resize_pool("p", 1, 5, None).await, "a shrink at cluster version 1");
    refused(admin.resize_pool("p", 2, 10, None).await, "a higher min at cluster version 1");
    refused(admin.resize_pool("p", 1, 10, Some(&[(9, 9)])).await, "a new reserved ID");
    let spec = store.get(GetRequest::key(l.pool_spec_key("p"))).await.unwrap().kvs[0].clone();
    assert_eq!(spec.mod_revision, spec.create_revision, "the spec is unchanged");
    assert_eq!(admin.resize_pool("p", 1, 20, None).await.unwrap().max(), 20, "growing is allowed");

    cluster_version::finalize(&store, &l, DEFAULT_GRACE).await.unwrap();
    refused(admin.resize_pool("p", 1, 5, None).await, "a shrink during the grace");
    tokio::time::sleep(DEFAULT_GRACE + Duration::from_secs(1)).await;
    assert_eq!(admin.resize_pool("p", 1, 5, None).await.unwrap().max(), 5);

    // What the gate prevents: the protocol-1 create of ID 9, decided against the old range.
    assert!(store.txn(late).await.unwrap().succeeded, "protocol 1 ignores the shrink");
    assert_eq!(raw_binding(&store, "p", "k").await, Some(9));
}

/// G2: holder `svc-7` (a pinned name, leased) joins `k` in its first life on protocol 1; that
/// bind is held back and the process dies. Its second life, on this build, acquires `k`. The
/// first life's bind then arrives: before, it re-put `ref/k/svc-7` on the first life's lease,
/// whose end took the second life's reference (and `k`'s ID went to another key). Until
/// finalized, this build bumps its holder record before its first bind, so the late bind fails.
#[tokio::test(start_paused = true)]
async fn a_late_protocol_1_join_of_an_earlier_life_cannot_take_the_reference() {
    late_protocol_1_join_of_an_earlier_life(Between::Nothing).await;
}

/// G2 as above, on a pool resized before the second life opens it: the spec record's mod
/// revision is no longer its create revision, and the holder record is still bumped (before,
/// the bump compared the create revision, failed unnoticed, and the late join succeeded).
#[tokio::test(start_paused = true)]
async fn a_late_protocol_1_join_cannot_take_the_reference_of_a_resized_pool() {
    late_protocol_1_join_of_an_earlier_life(Between::Resize).await;
}

/// G2 as above, with the cluster finalized after the first life's bind was sent: the second life
/// opens the pool during the grace, so it still bumps its holder record (before, a finalized
/// cluster stopped the bump at once, and the late join succeeded).
#[tokio::test(start_paused = true)]
async fn a_late_protocol_1_join_within_the_grace_after_finalize_cannot_take_the_reference() {
    late_protocol_1_join_of_an_earlier_life(Between::Finalize).await;
}

/// What happens between the first life's held-back bind and the second life's open.
#[derive(PartialEq)]
enum Between {
    Nothing,
    /// The pool grows.
    Resize,
    /// The cluster is finalized (with the default grace).
    Finalize,
}

/// The G2 schedule of the tests above.
async fn late_protocol_1_join_of_an_earlier_life(between: Between) {
    let store = EmbeddedStore::memory();
    let l = common::layout();
    let other = common::allocator(Arc::new(store.clone()), "other");
    let pool = other.ensure_pool(&PoolSpec::new("p", 1, 10)).await.unwrap();
    let id = pool.acquire_durable("k", "owner").await.unwrap().id;
    let first_life = store.lease_grant(6).await.unwrap().id;
    let late = protocol_1_bind(
        &l,
        "k",
        id,
        "svc-7",
        first_life,
        true,
        spec_rev(&store).await,
        revision(&store).await,
    );
    match between {
        Between::Nothing => {}
        Between::Resize => {
            other.resize_pool("p", 1, 20, None).await.unwrap();
        }
        Between::Finalize => {
            cluster_version::finalize(&store, &l, DEFAULT_GRACE).await.unwrap();
            tokio::time::sleep(Duration::from_secs(60)).await;
        }
    }

    let second = common::allocator(Arc::new(store.clone()), "svc-7");
    let p2 = second.pool("p").await.unwrap();
    assert_eq!(p2.acquire("k").await.unwrap().id, id);
    assert!(!store.txn(late).await.unwrap().succeeded, "the first life's late join must fail");
    let r = store.get(GetRequest::key(l.ref_key("p", "k", "svc-7"))).await.unwrap();
    assert_eq!(
        r.kvs[0].lease,
        second.session_lease().await.unwrap(),
        "the reference is the second life's"
    );
}

/// A store whose cluster version is newer than this build is refused with one line naming both.
#[tokio::test(start_paused = true)]
async fn a_newer_cluster_version_is_refused() {
    let store = EmbeddedStore::memory();
    let l = common::layout();
    let a = common::allocator(Arc::new(store.clone()), "a");
    a.ensure_pool(&PoolSpec::new("p", 1, 10)).await.unwrap();
    let newer = (PROTOCOL_VERSION + 1).to_string();
    store
        .txn(TxnRequest::new().and_then([TxnOp::put(l.cluster_version_key(), newer)]))
        .await
        .unwrap();
    let b = common::allocator(Arc::new(store.clone()), "b");
    let e = b.pool("p").await.unwrap_err().to_string();
    assert!(e.contains("cluster version 3") && e.contains("protocol 2"), "{e}");
    assert!(cluster_version::finalize(&store, &l, Duration::ZERO).await.is_err(), "no downgrade");
}
