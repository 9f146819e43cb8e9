//! A session's list of keys is acquired in batched txns, not one txn per key.
//!
//! The fleet benchmark's restart storm through `serve` (100 agents each re-acquiring 100 keys on
//! a new session) made etcd complete about one request per key and spend about 0.5 ms of CPU on
//! each: the handler called the session's lone acquire once per key, each a txn of its own (a
//! raft proposal and a WAL write on etcd), while a durable holder's list already went ~100 keys a
//! txn. Counted in store txns, never in time.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use idalloc::store::embedded::EmbeddedStore;
use idalloc::store::{Store, StoreResult};
use idalloc::{Allocator, PoolSpec};
use idalloc_server::{router, AppState, Config};
use idalloc_testkit::hooked::{Hook, HookedStore, Request};
use serde_json::{json, Value};

mod common;
use common::call;

/// Counts the store's txns.
#[derive(Default)]
struct Txns(AtomicU64);

#[async_trait::async_trait]
impl<S: Store> Hook<S> for Txns {
    async fn before(&self, _inner: &Arc<S>, req: Request) -> StoreResult<Request> {
        if matches!(req, Request::Txn(_)) {
            self.0.fetch_add(1, Ordering::SeqCst);
        }
        Ok(req)
    }
}

/// The IDs of an acquire answer's results, in order.
fn ids(answer: &Value) -> Vec<u64> {
    let results = answer["results"].as_array().unwrap_or_else(|| panic!("no results: {answer}"));
    results.iter().map(|r| r["id"].as_u64().unwrap_or_else(|| panic!("no id: {r}"))).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sessions_keys_go_many_per_txn_and_a_new_session_gets_the_same_ids() {
    const KEYS: usize = 100;
    let store =
        Arc::new(HookedStore::with_hook(Arc::new(EmbeddedStore::memory()), Txns::default()));
    let dyn_store: Arc<dyn Store> = store.clone();
    let alloc = Allocator::from_arc(dyn_store.clone(), Default::default()).expect("allocator");
    alloc.init_pool(&PoolSpec::new("p", 1, 1 << 20)).await.expect("init");
    let st = AppState::new(alloc, dyn_store, "idalloc", Config::default(), None).expect("state");
    let app = router(st);
    let keys: Vec<String> = (0..KEYS).map(|i| format!("agent-7/key-{i}")).collect();

    let acquire_on_new_session = || async {
        let (s, sess) = call(&app, "POST", "/v1/sessions", &json!({"ttl": 60}).to_string()).await;
        assert_eq!(s, 201, "{sess}");
        let id = sess["session"].as_str().expect("session id").to_string();
        let before = store.hook().0.load(Ordering::SeqCst);
        let body = json!({"keys": keys, "session": id});
        let (s, answer) = call(&app, "POST", "/v1/pools/p/acquire", &body.to_string()).await;
        assert_eq!(s, 200, "{answer}");
        (ids(&answer), store.hook().0.load(Ordering::SeqCst) - before)
    };

    // New bindings: one txn per key was 100 txns; batched, a round or two of packed txns.
    let (first, txns) = acquire_on_new_session().await;
    assert_eq!(first.len(), KEYS);
    assert!(txns <= 4, "{txns} store txns to acquire {KEYS} keys in one session request");

    // A restarted agent's new session re-references live bindings: the same IDs, batched too.
    let (again, txns) = acquire_on_new_session().await;
    assert_eq!(again, first, "a key's ID changed when a second session referenced it");
    assert!(txns <= 4, "{txns} store txns to re-reference {KEYS} keys in one session request");
}
