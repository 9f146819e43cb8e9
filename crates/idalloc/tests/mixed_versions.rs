//! A process of cluster protocol 1 beside this build (docs/design/cluster-version.md). Protocol 1
//! binds compare the key record, the ID record, the spec and the holder's fence record, but
//! neither the pool's fence floor nor the holder's own reference. Their txns are built here by
//! hand, byte for byte as such a process sends them, and applied late, as a slow link delivers
//! them; until the cluster version is finalized this build must stay safe beside them.

mod common;

use std::sync::Arc;

use idalloc::cluster_version::{self, Finalized, PROTOCOL_VERSION};
use idalloc::layout::{IdRecord, Layout};
use idalloc::store::embedded::EmbeddedStore;
use idalloc::store::{
    Compare, CompareOp, CompareTarget, GetRequest, KeyRange, Store, TxnOp, TxnRequest,
};
use idalloc::PoolSpec;

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

    // Finalized: the fold runs (every process now compares the floor).
    assert_eq!(
        cluster_version::finalize(&store, &l).await.unwrap(),
        Finalized::Moved { from: 1, revision: revision(&store).await }
    );
    assert_eq!(cluster_version::finalize(&store, &l).await.unwrap(), Finalized::Already);
    assert_eq!(pool.sweep().await.unwrap().folded, 1);
    assert_eq!(cluster_version::read(&store, &l).await.unwrap().version, PROTOCOL_VERSION);
}

/// G2: holder `svc-7` (a pinned name, leased) joins `k` in its first life on protocol 1; that
/// bind is held back and the process dies. Its second life, on this build, acquires `k`. The
/// first life's bind then arrives: before, it re-put `ref/k/svc-7` on the first life's lease,
/// whose end took the second life's reference (and `k`'s ID went to another key). Until
/// finalized, this build bumps its holder record before its first bind, so the late bind fails.
#[tokio::test(start_paused = true)]
async fn a_late_protocol_1_join_of_an_earlier_life_cannot_take_the_reference() {
    late_protocol_1_join_of_an_earlier_life(false).await;
}

/// G2 as above, on a pool resized before the second life opens it: the spec record's mod
/// revision is no longer its create revision, and the holder record is still bumped (before,
/// the bump compared the create revision, failed unnoticed, and the late join succeeded).
#[tokio::test(start_paused = true)]
async fn a_late_protocol_1_join_cannot_take_the_reference_of_a_resized_pool() {
    late_protocol_1_join_of_an_earlier_life(true).await;
}

/// The G2 schedule of the two tests above; `resize_first` grows the pool between the first
/// life's held-back bind and the second life's open.
async fn late_protocol_1_join_of_an_earlier_life(resize_first: bool) {
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
    if resize_first {
        other.resize_pool("p", 1, 20, None).await.unwrap();
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
    assert!(cluster_version::finalize(&store, &l).await.is_err(), "no downgrade");
}
