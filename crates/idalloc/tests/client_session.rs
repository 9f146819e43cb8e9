//! Client sessions (`Allocator::client_session`): references on a lease the caller renews, gone
//! when the session ends or its lease runs out, and the session then refuses further acquires.

use std::time::Duration;

use idalloc::store::embedded::EmbeddedStore;
use idalloc::{Allocator, AllocatorOptions, Error, Input, PoolSpec};

fn alloc() -> Allocator {
    Allocator::new(EmbeddedStore::memory(), AllocatorOptions::default()).expect("allocator")
}

fn holders(list: &[idalloc::Binding], key: &str) -> Option<Vec<String>> {
    list.iter().find(|b| b.key == key).map(|b| b.holders.clone())
}

#[tokio::test]
async fn session_references_are_idempotent_and_end_with_the_session() {
    let a = alloc();
    let pool = a.ensure_pool(&PoolSpec::new("p", 1, 100)).await.unwrap();
    let s = a.client_session(Duration::from_secs(30)).await.unwrap();
    assert_ne!(s.holder(), a.holder());
    let first = s.acquire(&pool, "k").await.unwrap();
    assert!(first.new);
    // Idempotent: a retried acquire does not add a count that a single release would leave.
    assert_eq!(s.acquire(&pool, "k").await.unwrap().id, first.id);
    assert_eq!(holders(&pool.list().await.unwrap(), "k"), Some(vec![s.holder().to_string()]));
    assert!(s.keep_alive().await.unwrap());
    let r = s.release(&pool, "k").await.unwrap();
    assert!(r.held && r.reclaimed, "{r:?}");

    s.acquire(&pool, "j").await.unwrap();
    assert!(s.end().await.unwrap());
    assert!(s.is_lost());
    // The lease took the reference with it; the binding waits for the sweeper.
    assert_eq!(holders(&pool.list().await.unwrap(), "j"), Some(vec![]));
    assert_eq!(pool.sweep().await.unwrap().reclaimed.len(), 1);
    match s.acquire(&pool, "x").await {
        Err(Error::InvalidInput { input, .. }) => assert_eq!(input, Input::SessionGone),
        other => panic!("expected the session to refuse, got {other:?}"),
    }
    assert!(!s.keep_alive().await.unwrap());
}

#[tokio::test]
async fn a_session_whose_lease_expired_is_lost_on_its_next_use() {
    let a = alloc();
    let pool = a.ensure_pool(&PoolSpec::new("p", 1, 100)).await.unwrap();
    let s = a.client_session(Duration::from_secs(1)).await.unwrap();
    s.acquire(&pool, "k").await.unwrap();
    // Nobody renews: the store expires the lease and the reference after about a second.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while holders(&pool.list().await.unwrap(), "k") != Some(vec![]) {
        assert!(tokio::time::Instant::now() < deadline, "the reference outlived its lease");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(!s.is_lost(), "nothing told the session yet");
    assert!(matches!(
        s.acquire(&pool, "k2").await,
        Err(Error::InvalidInput { input: Input::SessionGone, .. })
    ));
    assert!(s.is_lost(), "an acquire that found the lease gone marks the session lost");
    assert!(!s.keep_alive().await.unwrap());
}

/// The batched form (a restarted agent's list of keys in one request): the
/// keys of one call bind on the session's lease, a second session referencing them gets the same
/// IDs, and once the lease is gone every key of a batch fails with `SessionGone` and the session
/// is lost, as with the lone acquire.
#[tokio::test]
async fn a_sessions_batch_binds_on_its_lease_and_fails_whole_once_the_lease_is_gone() {
    let a = alloc();
    let pool = a.ensure_pool(&PoolSpec::new("p", 1, 1000)).await.unwrap();
    let keys: Vec<String> = (0..50).map(|i| format!("k{i}")).collect();
    let s = a.client_session(Duration::from_secs(1)).await.unwrap();
    let first: Vec<u64> =
        s.acquire_many(&pool, &keys).await.into_iter().map(|r| r.unwrap().id).collect();
    let other = a.client_session(Duration::from_secs(60)).await.unwrap();
    let again: Vec<u64> =
        other.acquire_many(&pool, &keys).await.into_iter().map(|r| r.unwrap().id).collect();
    assert_eq!(again, first, "a second session's references join the same bindings");
    let list = pool.list().await.unwrap();
    let mut both = vec![s.holder().to_string(), other.holder().to_string()];
    both.sort();
    let mut h = holders(&list, "k7").expect("k7 bound");
    h.sort();
    assert_eq!(h, both);
    // Nobody renews the first: the store expires its lease and its references.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while holders(&pool.list().await.unwrap(), "k7") != Some(vec![other.holder().to_string()]) {
        assert!(tokio::time::Instant::now() < deadline, "the references outlived their lease");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let more: Vec<String> = (50..60).map(|i| format!("k{i}")).collect();
    let r = s.acquire_many(&pool, &more).await;
    assert_eq!(r.len(), 10);
    for x in &r {
        assert!(matches!(x, Err(Error::InvalidInput { input: Input::SessionGone, .. })), "{x:?}");
    }
    assert!(s.is_lost(), "a batch that found the lease gone marks the session lost");
}

#[tokio::test]
async fn session_ttls_out_of_range_are_refused() {
    let a = alloc();
    for ttl in [Duration::ZERO, Duration::from_millis(500), Duration::from_secs(86_401)] {
        match a.client_session(ttl).await {
            Err(Error::InvalidInput { input, what, .. }) => {
                assert_eq!(input, Input::Options);
                assert_eq!(what, "session TTL");
            }
            other => panic!("{ttl:?}: expected InvalidInput, got {other:?}"),
        }
    }
}

/// A shared session: another allocator on the same store adopts it by its lease
/// and acts as the same holder: its acquire joins the session's reference (idempotent), its
/// release removes it, its renewal renews the same lease; the record vanishes with the lease.
#[tokio::test]
async fn a_shared_session_is_adopted_by_another_allocator_as_the_same_holder() {
    let store = std::sync::Arc::new(EmbeddedStore::memory());
    let opts = AllocatorOptions::default;
    let a = Allocator::from_arc(store.clone(), opts()).expect("allocator a");
    let b = Allocator::from_arc(store, opts()).expect("allocator b");
    let pa = a.ensure_pool(&PoolSpec::new("p", 1, 100)).await.unwrap();
    let pb = b.pool("p").await.unwrap();
    let s = a.shared_client_session(Duration::from_secs(30), "session:t-", b"rec").await.unwrap();
    assert_eq!(s.holder(), format!("session:t-{:x}", s.lease()));
    let first = s.acquire(&pa, "k").await.unwrap();
    assert_eq!(b.client_session_record(s.lease()).await.unwrap().as_deref(), Some(&b"rec"[..]));
    assert_eq!(b.client_session_record(s.lease() + 1).await.unwrap(), None);

    let t = b.adopt_client_session(s.lease(), s.ttl(), "session:t-").unwrap();
    assert_eq!((t.holder(), t.lease(), t.ttl()), (s.holder(), s.lease(), s.ttl()));
    let again = t.acquire(&pb, "k").await.unwrap();
    assert_eq!((again.id, again.new), (first.id, false));
    assert_eq!(holders(&pa.list().await.unwrap(), "k"), Some(vec![s.holder().to_string()]));
    assert!(t.keep_alive().await.unwrap());
    let r = t.release(&pb, "k").await.unwrap();
    assert!(r.held && r.reclaimed, "{r:?}");

    t.acquire(&pb, "j").await.unwrap();
    assert!(s.end().await.unwrap());
    assert_eq!(b.client_session_record(s.lease()).await.unwrap(), None);
    assert!(!t.keep_alive().await.unwrap(), "the adopted handle sees the lease gone");
    assert_eq!(holders(&pb.list().await.unwrap(), "j"), Some(vec![]));
}
