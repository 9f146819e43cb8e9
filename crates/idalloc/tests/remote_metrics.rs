//! The remote-view metrics move with the view (DESIGN §12): state, bindings, validation
//! drops, reconnects and the age of the last sync, recorded through the `metrics` facade into the
//! test kit's in-memory recorder. The remote is a real store (the embedded store in memory) behind
//! the test kit's fault wrapper, which cuts it off on demand.

use std::sync::Arc;
use std::time::Duration;

use idalloc::layout::{IdRecord, Layout};
use idalloc::metrics::{
    REMOTE_BINDINGS, REMOTE_DROPS, REMOTE_RECONNECTS, REMOTE_STATE, REMOTE_SYNC_AGE,
};
use idalloc::store::embedded::EmbeddedStore;
use idalloc::store::{Store, TxnOp, TxnRequest};
use idalloc::{Allocator, AllocatorOptions, PoolSpec, RemoteOptions};
use idalloc_testkit::fault::{FaultConfig, FaultStore};
use idalloc_testkit::recorder::TestRecorder;

const POOL: &str = "metered";

async fn eventually(what: &str, mut cond: impl FnMut() -> bool) {
    for _ in 0..200 {
        if cond() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    panic!("timed out waiting for {what}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn remote_view_metrics_follow_state_bindings_drops_reconnects_and_sync_age() {
    let rec = TestRecorder::global();
    let labels: &[(&str, &str)] = &[("pool", POOL), ("remote", "b")];
    let state = |s: &str| rec.gauge(REMOTE_STATE, &[("pool", POOL), ("remote", "b"), ("state", s)]);

    let local = Allocator::new(EmbeddedStore::memory(), AllocatorOptions::default()).unwrap();
    let pool = local.ensure_pool(&PoolSpec::new(POOL, 1, 0xffff).prefix(1 << 16)).await.unwrap();
    pool.wait_synced().await.unwrap();

    // Cluster b: its own store and allocator, three bindings, and one record with an ID outside
    // its declared space (written by hand), which the view must drop and count.
    let raw = Arc::new(EmbeddedStore::memory());
    let remote = Allocator::from_arc(raw.clone(), AllocatorOptions::default()).unwrap();
    let rpool = remote.ensure_pool(&PoolSpec::new(POOL, 1, 0xffff).prefix(2 << 16)).await.unwrap();
    for k in ["a", "b", "c"] {
        rpool.acquire_durable(k, "h").await.unwrap();
    }
    let layout = Layout::new("idalloc").unwrap();
    let bad = TxnOp::put(layout.id_key(POOL, (3 << 16) | 5), IdRecord::Bound("x".into()).encode());
    raw.txn(TxnRequest::new().and_then([bad])).await.unwrap();

    let faulty = Arc::new(FaultStore::new(raw.clone(), 1, FaultConfig::default()).unwrap());
    let opts = RemoteOptions::builder()
        .probe_interval(Duration::from_millis(100))
        .request_timeout(Duration::from_millis(500))
        .build()
        .unwrap();
    let view = pool.watch_remote("b", faulty.clone() as Arc<dyn Store>, opts).await.unwrap();
    tokio::time::timeout(Duration::from_secs(5), view.wait_synced()).await.expect("synced");

    eventually("state synced", || state("synced") == Some(1.0)).await;
    assert_eq!(state("syncing"), Some(0.0));
    assert_eq!(state("stale"), Some(0.0));
    assert_eq!(rec.gauge(REMOTE_BINDINGS, labels), Some(3.0));
    assert_eq!(rec.counter(REMOTE_DROPS, labels), Some(1), "the record outside b's space");
    assert_eq!(rec.counter(REMOTE_RECONNECTS, labels), Some(0), "exists at zero from the start");
    assert_eq!(rec.gauge(REMOTE_SYNC_AGE, labels), Some(0.0));

    // Cut b off: the view goes stale and the age of its last sync grows.
    faulty.partition(true);
    tokio::time::timeout(Duration::from_secs(5), view.wait_stale()).await.expect("stale");
    eventually("state stale", || state("stale") == Some(1.0)).await;
    assert_eq!(state("synced"), Some(0.0));
    eventually("sync age above 1 s", || rec.gauge(REMOTE_SYNC_AGE, labels).unwrap_or(0.0) >= 1.0)
        .await;
    // b changes while away; the view comes back with it, counting one reconnect.
    rpool.acquire_durable("d", "h").await.unwrap();
    faulty.partition(false);
    tokio::time::timeout(Duration::from_secs(5), view.wait_synced()).await.expect("resynced");
    eventually("state synced again", || state("synced") == Some(1.0)).await;
    assert_eq!(state("stale"), Some(0.0));
    assert_eq!(rec.gauge(REMOTE_BINDINGS, labels), Some(4.0));
    assert_eq!(rec.counter(REMOTE_RECONNECTS, labels), Some(1));
    assert_eq!(rec.gauge(REMOTE_SYNC_AGE, labels), Some(0.0));
    // The bad record is seen again by the re-listing: counted again.
    assert_eq!(rec.counter(REMOTE_DROPS, labels), Some(2));

    // Removed: every state 0, no bindings.
    assert!(pool.remove_remote("b"));
    for s in ["syncing", "synced", "stale", "refused"] {
        assert_eq!(state(s).unwrap_or(0.0), 0.0, "state {s} after removal");
    }
    assert_eq!(rec.gauge(REMOTE_BINDINGS, labels), Some(0.0));
}
