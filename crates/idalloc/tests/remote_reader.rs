//! `RemoteReader`: one-shot lookups in a remote pool (the CLI's `get`/`lookup --remote`) read only
//! the records they need, never list the pool, and validate like a view. The remote is a real
//! store (the embedded store in memory) with a round-trip counter around it.

use std::sync::Arc;

use idalloc::layout::{IdRecord, Layout};
use idalloc::remote::{id_space, RemoteReader};
use idalloc::store::embedded::EmbeddedStore;
use idalloc::store::{Store, TxnOp, TxnRequest};
use idalloc::{Allocator, AllocatorOptions, Cluster, PoolSpec, RemoteOptions};
use idalloc_testkit::counting::CountingStore;

const POOL: &str = "read";

#[tokio::test]
async fn direct_reads_answer_in_two_round_trips_at_most_and_validate() {
    let local = PoolSpec::new(POOL, 1, 0xffff).prefix(1 << 16);
    let raw = Arc::new(EmbeddedStore::memory());
    let remote = Allocator::from_arc(raw.clone(), AllocatorOptions::default()).unwrap();
    let rpool = remote.ensure_pool(&PoolSpec::new(POOL, 1, 0xffff).prefix(2 << 16)).await.unwrap();
    let mut ids = Vec::new();
    for i in 0..300 {
        ids.push(rpool.acquire_durable(&format!("k{i}"), "h").await.unwrap().id);
    }
    // A record outside the remote's space, and a key record pointing at it.
    let l = Layout::new("idalloc").unwrap();
    let stray = (3 << 16) | 7;
    raw.txn(TxnRequest::new().and_then([
        TxnOp::put(l.id_key(POOL, stray), IdRecord::Bound("stray".into()).encode()),
        TxnOp::put(l.key_key(POOL, "stray"), stray.to_string()),
    ]))
    .await
    .unwrap();

    let counted = Arc::new(CountingStore::new(raw.clone()));
    let others = [(Cluster::Local, id_space(&local))];
    let opts = RemoteOptions::default();
    let r = RemoteReader::open("b", &local, counted.clone() as Arc<dyn Store>, &opts, &others)
        .await
        .unwrap();
    assert_eq!(counted.counts().get, 1, "the spec");
    counted.reset();
    assert_eq!(r.key_of(ids[123]).await.unwrap(), Some("k123".to_string()));
    assert_eq!(r.get("k42").await.unwrap(), Some(ids[42]));
    assert_eq!(r.get("nowhere").await.unwrap(), None);
    let c = counted.counts();
    assert_eq!((c.get, c.total()), (4, 4), "1 + 2 + 1 reads, no listing, no watch: {c:?}");
    // Outside the remote's space: not asked, or not answered.
    assert_eq!(r.key_of(stray).await.unwrap(), None);
    assert_eq!(r.get("stray").await.unwrap(), None);
    assert_eq!(r.key_of(ids[0] ^ (3 << 16)).await.unwrap(), None);

    // The same overlap refusal as a view.
    let twin = PoolSpec::new(POOL, 1, 0xffff).prefix(2 << 16);
    let err = RemoteReader::open(
        "b",
        &twin,
        counted as Arc<dyn Store>,
        &opts,
        &[(Cluster::Local, id_space(&twin))],
    )
    .await
    .err()
    .expect("overlap refused");
    assert!(err.to_string().contains("overlap"), "{err}");
}
