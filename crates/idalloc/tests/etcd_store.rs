//! etcd-specific behaviour that the conformance suite cannot cover: a dead etcd, a 3-member
//! cluster. Each test starts its own etcd (skipped with a notice if `etcd` is not on `PATH`).

use std::time::Duration;

use futures::StreamExt;
use idalloc::store::etcd::{EtcdOptions, EtcdStore};
use idalloc::store::{GetRequest, KeyRange, Store, StoreError, TxnOp, TxnRequest, WatchMessage};
use idalloc_testkit::etcd::{private_etcd, EtcdCluster};

/// Liveness bound for things that must happen; only a broken implementation reaches it.
const PATIENCE: Duration = Duration::from_secs(30);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killed_etcd_breaks_the_watch_and_requests_are_unavailable() {
    let Some(mut server) = private_etcd().await else { return };
    let mut opts = EtcdOptions::new([server.endpoint()]);
    opts.request_timeout = Duration::from_secs(2);
    opts.connect_timeout = Duration::from_millis(500);
    let store = EtcdStore::connect(opts).await.expect("connect");
    let mut watch = store.watch(KeyRange::prefix("w/"), 0).await.expect("watch");
    store.txn(TxnRequest::new().and_then([TxnOp::put("w/a", "1")])).await.expect("put");
    match tokio::time::timeout(PATIENCE, watch.next()).await {
        Ok(Some(Ok(WatchMessage::Events(evs)))) => assert_eq!(evs.len(), 1),
        other => panic!("expected the put event, got {other:?}"),
    }

    server.kill();
    match tokio::time::timeout(PATIENCE, watch.next()).await {
        Ok(Some(Err(StoreError::Unavailable(_)))) => {}
        other => panic!("expected Unavailable from a broken watch, got {other:?}"),
    }
    let end = tokio::time::timeout(PATIENCE, watch.next()).await.expect("stream must end");
    assert!(end.is_none(), "the watch ends after reporting the break");

    let res = tokio::time::timeout(PATIENCE, store.get(GetRequest::key("w/a"))).await;
    assert!(matches!(res, Ok(Err(StoreError::Unavailable(_)))), "got {res:?}");
    let res = tokio::time::timeout(PATIENCE, store.lease_grant(10)).await;
    assert!(matches!(res, Ok(Err(StoreError::Unavailable(_)))), "got {res:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_member_cluster_serves_one_history_on_every_member() {
    if !idalloc_testkit::etcd::etcd_on_path() {
        if std::env::var("CI").is_ok_and(|v| v == "true") {
            panic!("etcd is not on PATH under CI");
        }
        eprintln!("SKIPPED: etcd is not on PATH");
        return;
    }
    let cluster = EtcdCluster::start(3).await.expect("3-member cluster");
    let endpoints = cluster.endpoints();
    assert_eq!(endpoints.len(), 3);
    let first = idalloc_testkit::etcd::connect_test_store(&endpoints[0]).await.expect("connect");
    let rev = first
        .txn(TxnRequest::new().and_then([TxnOp::put("k", "v")]))
        .await
        .expect("put via member 0")
        .revision;
    for ep in &endpoints {
        let store = idalloc_testkit::etcd::connect_test_store(ep).await.expect("connect");
        let resp = store.get(GetRequest::key("k")).await.expect("linearizable read");
        assert_eq!(resp.kvs.len(), 1, "member {ep} sees the write");
        assert_eq!(resp.kvs[0].mod_revision, rev);
    }
    // A client given all endpoints works too.
    let all = EtcdStore::connect(EtcdOptions::new(endpoints.clone())).await.expect("connect");
    assert_eq!(all.get(GetRequest::key("k")).await.expect("read").kvs[0].value, b"v");
}
