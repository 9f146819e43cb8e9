//! Unit tests of the driver's parts that the public API cannot observe.
//! DESIGN §5 (one request per key and process: the per-key single-flight lock).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use super::{Allocator, AllocatorOptions};
use crate::hooked::{Hook, HookedStore, Request};
use crate::pool::PoolSpec;
use crate::store::embedded::EmbeddedStore;
use crate::store::StoreResult;

/// Makes txns never answer while set (a request lost in flight).
struct Hang(AtomicBool);

#[async_trait::async_trait]
impl Hook<EmbeddedStore> for Hang {
    async fn before(&self, _: &Arc<EmbeddedStore>, req: Request) -> StoreResult<Request> {
        if matches!(req, Request::Txn(_)) && self.0.load(Ordering::SeqCst) {
            std::future::pending::<()>().await;
        }
        Ok(req)
    }
}

/// Issue 10: an acquire cancelled mid-flight (its future dropped by a `timeout`) used to skip the
/// removal of its key's entry from the per-key lock map. Both places a cancel can hit — during the
/// round trip and while waiting for the lock — must leave the map clean and the key usable.
#[tokio::test]
async fn cancelled_acquire_cleans_its_key_lock_and_the_key_still_works() {
    let gate =
        Arc::new(HookedStore::with_hook(EmbeddedStore::memory(), Hang(AtomicBool::new(false))));
    let opts = AllocatorOptions {
        request_timeout: Duration::from_secs(30),
        seed: Some(1),
        ..AllocatorOptions::default()
    };
    let alloc = Allocator::from_arc(gate.clone(), opts).unwrap();
    let pool = alloc.ensure_pool(&PoolSpec::new("p", 1, 100)).await.unwrap();
    pool.wait_synced().await.unwrap();
    let state = pool.state.clone();

    // Cancelled during the bind's round trip (the txn never answers).
    gate.hook().0.store(true, Ordering::SeqCst);
    let cancelled = tokio::time::timeout(Duration::from_millis(50), pool.acquire("k")).await;
    assert!(cancelled.is_err(), "the acquire should have been cancelled: {cancelled:?}");
    assert_eq!(state.key_locks_len(), 0, "a cancelled acquire left its key lock behind");
    gate.hook().0.store(false, Ordering::SeqCst);

    // Cancelled while waiting for the key's lock, which someone else holds.
    let other = state.lock_key("k").await;
    assert_eq!(state.key_locks_len(), 1);
    let cancelled = tokio::time::timeout(Duration::from_millis(50), pool.acquire("k")).await;
    assert!(cancelled.is_err(), "the acquire should have waited for the lock: {cancelled:?}");
    assert_eq!(state.key_locks_len(), 1, "the holder's entry must stay while it holds the lock");
    drop(other);
    assert_eq!(state.key_locks_len(), 0, "the last user's drop removes the entry");

    // The key still works, and a finished acquire and release leave nothing behind either.
    let a = pool.acquire("k").await.unwrap();
    assert_eq!(pool.get("k"), Some(a.id));
    assert_eq!(pool.get_consistent("k").await.unwrap(), Some(a.id));
    assert_eq!(state.key_locks_len(), 0);
    let r = pool.release("k").await.unwrap();
    assert!(r.held && r.reclaimed);
    assert_eq!(state.key_locks_len(), 0);
    alloc.close().await.unwrap();
}
