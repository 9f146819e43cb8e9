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

/// An acquire cancelled mid-flight (its future dropped by a `timeout`) used to skip the
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

/// Once armed, holds pool state `state`'s cache lock from another thread for `hold`, starting
/// when the listing's last ID record has been read: applying the listing then takes `hold`.
struct SlowApply {
    records: usize,
    seen: std::sync::atomic::AtomicUsize,
    state: std::sync::Mutex<Option<Arc<super::pool_state::PoolState>>>,
    hold: Duration,
}

#[async_trait::async_trait]
impl Hook<EmbeddedStore> for SlowApply {
    async fn after(
        &self,
        _: &Arc<EmbeddedStore>,
        _: crate::hooked::Kind,
        result: crate::hooked::Answer,
    ) -> crate::hooked::Answer {
        let Ok(crate::hooked::Response::Get(resp)) = &result else { return result };
        let state = self.state.lock().expect("lock").clone();
        let Some(state) = state else { return result };
        let ids = resp.kvs.iter().filter(|kv| kv.key.starts_with(b"idalloc/data/p/id/")).count();
        let before = self.seen.fetch_add(ids, Ordering::SeqCst);
        if ids > 0 && before + ids == self.records {
            let (locked, held) = tokio::sync::oneshot::channel();
            let hold = self.hold;
            std::thread::spawn(move || {
                let _cache = state.lock_cache();
                let _ = locked.send(());
                std::thread::sleep(hold);
            });
            let _ = held.await;
        }
        result
    }
}

/// `wait_synced` counts apply time: a waiter gives up only when no page has
/// come for its budget (timeout × attempts, 1 s here), but the time spent applying a complete
/// listing is not a stalled store. With the apply held up for 3 s after the last page (the cache
/// lock taken by another thread, as a listing of 1M bindings on a loaded machine takes its
/// time), the old waiter reported "could not be listed: no progress within 1s"; now it waits
/// for the apply and the pool is synced.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wait_synced_waits_for_a_slow_apply() {
    const N: usize = 200;
    let hook = SlowApply {
        records: N,
        seen: Default::default(),
        state: Default::default(),
        hold: Duration::from_secs(3),
    };
    let store = Arc::new(HookedStore::with_hook(EmbeddedStore::memory(), hook));
    let writer = Allocator::from_arc(store.clone(), AllocatorOptions::default()).unwrap();
    let p = writer.ensure_pool(&PoolSpec::new("p", 1, 10_000)).await.unwrap();
    let keys: Vec<String> = (0..N).map(|i| format!("k{i}")).collect();
    for r in p.acquire_many_durable(&keys, "h").await {
        r.unwrap();
    }
    let opts = AllocatorOptions {
        lazy_view: true,
        request_timeout: Duration::from_secs(1),
        retry: super::RetryPolicy { max_attempts: 1, ..Default::default() },
        list_page: 50,
        ..AllocatorOptions::default()
    };
    let reader = Allocator::from_arc(store.clone(), opts).unwrap();
    let pool = reader.pool("p").await.unwrap();
    *store.hook().state.lock().unwrap() = Some(pool.state.clone());
    pool.wait_synced().await.expect("synced after the slow apply");
    assert_eq!(store.hook().seen.load(Ordering::SeqCst), N, "one listing");
    assert_eq!(pool.snapshot().len(), N);
    reader.close().await.unwrap();
    writer.close().await.unwrap();
}
