//! The store conformance suite: one set of cases, run against every [`Store`]
//! implementation, with a real etcd as the reference. A case that passes on etcd and fails on
//! another store is a bug in that store.
//!
//! # Using it
//!
//! Each case is an `async fn(TestStore)`. [`conformance_tests!`](crate::conformance_tests) turns
//! the whole list into one `#[tokio::test]` per case, given a *factory*: an expression callable as
//! `factory(Need) -> impl Future<Output = Option<TestStore>>` (`None` skips the test, e.g. when no
//! etcd is available).
//!
//! ```text
//! idalloc_testkit::conformance_tests!(etcd, idalloc_testkit::conformance::etcd_factory, paused_time = false);
//! idalloc_testkit::conformance_tests!(memory, |_need| async {
//!     Some(TestStore::new(Arc::new(EmbeddedStore::memory()), b"t/".to_vec()))
//! }, paused_time = true);
//! ```
//!
//! # Sharing one etcd
//!
//! Cases only touch keys under [`TestStore::prefix`], so many can share one etcd. Two things are
//! global on etcd and need a store of their own ([`Need::Exclusive`]): compaction, and exact
//! revision arithmetic ("a write bumps the revision by exactly one" cannot be checked while other
//! tests write). Cases on a shared store only assert revision *order* and equalities between
//! revisions the case itself observed.
//!
//! # Time
//!
//! Lease expiry cases wait with `tokio::time::sleep`. Embedded stores run them under tokio's
//! paused clock (`paused_time = true`: instant and deterministic); etcd runs them in real time,
//! so they are few and use the shortest TTL etcd grants.

use std::any::Any;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use idalloc::store::{
    list_all, Compare, CompareOp, CompareTarget, GetRequest, GetResponse, KeyRange, KeyValue,
    Lease, LeaseId, OpResponse, PutRequest, Revision, Store, StoreError, TxnOp, TxnRequest,
    TxnResponse, WatchEvent, WatchMessage, WatchStream, MAX_REQUEST_BYTES, MAX_TXN_OPS,
};

use crate::hooked::{Answer, Hook, HookedStore, Kind};

/// What a case needs from the factory.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Need {
    /// Any store; other tests may use it at the same time (under other prefixes).
    Shared,
    /// A store nobody else uses: the case compacts or checks exact revision numbers.
    Exclusive,
}

/// A store handed to one case: the store, the key prefix the case must stay under, and whatever
/// must live as long as the store (an etcd process, a temp dir).
pub struct TestStore {
    pub store: Arc<dyn Store>,
    pub prefix: Vec<u8>,
    /// True when the test runs on tokio's paused clock (set by the macro).
    pub paused_time: bool,
    _guard: Option<Box<dyn Any + Send + Sync>>,
}

impl TestStore {
    pub fn new(store: Arc<dyn Store>, prefix: impl Into<Vec<u8>>) -> Self {
        TestStore { store, prefix: prefix.into(), paused_time: false, _guard: None }
    }

    /// Keeps `guard` alive as long as this value (e.g. the etcd server or temp dir behind it).
    pub fn with_guard(mut self, guard: impl Any + Send + Sync) -> Self {
        self._guard = Some(Box::new(guard));
        self
    }

    /// `prefix + name`.
    pub fn key(&self, name: &str) -> Vec<u8> {
        let mut k = self.prefix.clone();
        k.extend_from_slice(name.as_bytes());
        k
    }
}

/// The factory for etcd: the shared test etcd (or a private one) for [`Need::Shared`], always a
/// private server for [`Need::Exclusive`]; `None` (skip) if there is no etcd. See
/// [`crate::etcd::test_etcd_endpoint`].
pub async fn etcd_factory(need: Need) -> Option<TestStore> {
    use crate::etcd::{connect_test_store, private_etcd, test_etcd_endpoint, unique_prefix};
    match need {
        Need::Shared => {
            let etcd = test_etcd_endpoint().await?;
            let store =
                connect_test_store(&etcd.endpoint()).await.unwrap_or_else(|e| panic!("{e}"));
            Some(TestStore::new(Arc::new(store), unique_prefix()).with_guard(etcd))
        }
        Need::Exclusive => {
            let server = private_etcd().await?;
            let store = server.store().await.unwrap_or_else(|e| panic!("{e}"));
            Some(TestStore::new(Arc::new(store), unique_prefix()).with_guard(server))
        }
    }
}

/// Expands to one `#[tokio::test]` per conformance case, in a module `$mod_name`.
///
/// `$factory` is called as `($factory)(Need::Shared | Need::Exclusive).await` and yields
/// `Option<TestStore>`; it is evaluated inside the generated module, which imports the caller's
/// module (`use super::*`). With `paused_time = true` every test runs on tokio's paused clock.
#[macro_export]
macro_rules! conformance_tests {
    ($mod_name:ident, $factory:expr, paused_time = true) => {
        $crate::conformance_tests!(@module $mod_name, $factory, true,
            #[tokio::test(flavor = "current_thread", start_paused = true)]);
    };
    ($mod_name:ident, $factory:expr, paused_time = false) => {
        $crate::conformance_tests!(@module $mod_name, $factory, false,
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]);
    };
    (@module $mod_name:ident, $factory:expr, $paused:expr, #[$attr:meta]) => {
        mod $mod_name {
            #[allow(unused_imports)]
            use super::*;
            $crate::conformance_tests!(@cases $factory, $paused, #[$attr],
                shared: [
                    txn_then_else_and_responses_per_op,
                    txn_reads_see_earlier_writes_of_the_same_txn,
                    compare_ops_on_each_target,
                    compare_on_missing_key,
                    range_compare_holds_for_every_key,
                    nested_txn_compares_see_state_before_outer_txn,
                    duplicate_key_in_one_txn_is_rejected,
                    txn_op_limit,
                    request_size_limit,
                    put_on_unknown_lease_fails_whole_txn,
                    get_limit_more_count_keys_only_count_only,
                    get_newest_first,
                    get_at_old_revision,
                    get_future_revision,
                    delete_range_counts,
                    lease_expiry_deletes_keys_and_watch_sees_deletes,
                    lease_revoke_deletes_keys,
                    lease_keep_alive_extends,
                    watch_replays_history_then_live_events,
                    watch_from_now_sees_only_later_events,
                    list_all_is_pinned_to_one_revision,
                ],
                exclusive: [
                    revisions_and_versions,
                    get_at_compacted_revision,
                    watch_from_compacted_revision,
                    watch_from_the_compaction_revision_of_a_delete,
                ]);
        }
    };
    (@cases $factory:expr, $paused:expr, #[$attr:meta],
        shared: [$($shared:ident),* $(,)?], exclusive: [$($excl:ident),* $(,)?]) => {
        $(
            #[$attr]
            async fn $shared() {
                let factory = $factory;
                let Some(mut ts) = factory($crate::conformance::Need::Shared).await else {
                    return;
                };
                ts.paused_time = $paused;
                $crate::conformance::$shared(ts).await;
            }
        )*
        $(
            #[$attr]
            async fn $excl() {
                let factory = $factory;
                let Some(mut ts) = factory($crate::conformance::Need::Exclusive).await else {
                    return;
                };
                ts.paused_time = $paused;
                $crate::conformance::$excl(ts).await;
            }
        )*
    };
}

// ---------------------------------------------------------------------------------------------
// Helpers

/// Upper bound on waiting for something that must happen (a watch event, a lease expiry). A
/// liveness bound that only a broken store reaches, not a speed assertion.
const PATIENCE: Duration = Duration::from_secs(30);

async fn txn(s: &dyn Store, req: TxnRequest) -> TxnResponse {
    let dbg = format!("{req:?}");
    s.txn(req).await.unwrap_or_else(|e| panic!("txn {dbg} failed: {e}"))
}

async fn put(s: &dyn Store, key: &[u8], value: &str) -> Revision {
    let resp = txn(s, TxnRequest::new().and_then([TxnOp::put(key, value)])).await;
    assert!(resp.succeeded);
    resp.revision
}

async fn put_on_lease(s: &dyn Store, key: &[u8], value: &str, lease: LeaseId) -> Revision {
    txn(s, TxnRequest::new().and_then([TxnOp::put_on_lease(key, value, lease)])).await.revision
}

async fn delete(s: &dyn Store, range: KeyRange) -> (i64, Revision) {
    let resp = txn(s, TxnRequest::new().and_then([TxnOp::delete_range(range)])).await;
    match resp.responses.as_slice() {
        [OpResponse::Delete { deleted }] => (*deleted, resp.revision),
        other => panic!("expected one delete response, got {other:?}"),
    }
}

async fn get(s: &dyn Store, req: GetRequest) -> GetResponse {
    let dbg = format!("{req:?}");
    s.get(req).await.unwrap_or_else(|e| panic!("get {dbg} failed: {e}"))
}

async fn get1(s: &dyn Store, key: &[u8]) -> Option<KeyValue> {
    let resp = get(s, GetRequest::key(key)).await;
    assert!(resp.kvs.len() <= 1, "a single-key get returned {:?}", resp.kvs);
    resp.kvs.into_iter().next()
}

async fn current_revision(s: &dyn Store, ts: &TestStore) -> Revision {
    get(s, GetRequest::key(ts.key("no-such-key")).count_only()).await.revision
}

fn keys(kvs: &[KeyValue]) -> Vec<Vec<u8>> {
    kvs.iter().map(|kv| kv.key.clone()).collect()
}

/// Runs a txn whose only success op is `put(key)` under one compare, and says whether it
/// succeeded (and so whether the compare held).
async fn holds(s: &dyn Store, ts: &TestStore, cmp: Compare) -> bool {
    let dbg = format!("{cmp:?}");
    let marker = ts.key("compare-marker");
    let resp = s
        .txn(TxnRequest::new().when([cmp]).and_then([TxnOp::get_key(marker)]))
        .await
        .unwrap_or_else(|e| panic!("txn with compare {dbg} failed: {e}"));
    resp.succeeded
}

async fn next_message(stream: &mut WatchStream) -> WatchMessage {
    match tokio::time::timeout(PATIENCE, stream.next()).await {
        Ok(Some(Ok(m))) => m,
        Ok(Some(Err(e))) => panic!("watch failed: {e}"),
        Ok(None) => panic!("watch ended unexpectedly"),
        Err(_) => panic!("no watch message within {PATIENCE:?}"),
    }
}

/// Reads watch batches until `n` events arrived; checks that no batch splits a revision from
/// the next batch (the last revision of one batch is below the first of the next).
async fn next_events(stream: &mut WatchStream, n: usize) -> Vec<WatchEvent> {
    let mut out: Vec<WatchEvent> = Vec::new();
    while out.len() < n {
        match next_message(stream).await {
            WatchMessage::Events(evs) => {
                assert!(!evs.is_empty(), "a watch batch must not be empty");
                if let (Some(last), Some(first)) = (out.last(), evs.first()) {
                    assert!(
                        last.kv().mod_revision < first.kv().mod_revision,
                        "events of revision {} split over two batches",
                        first.kv().mod_revision
                    );
                }
                out.extend(evs);
            }
            other => panic!("expected events, got {other:?}"),
        }
    }
    assert_eq!(out.len(), n, "more events than expected: {out:?}");
    out
}

/// Polls until `key` is gone, sleeping on tokio's clock (instant under paused time).
async fn wait_until_gone(s: &dyn Store, key: &[u8]) {
    let waited = tokio::time::timeout(PATIENCE, async {
        while get1(s, key).await.is_some() {
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    })
    .await;
    assert!(
        waited.is_ok(),
        "key {:?} still exists after {PATIENCE:?}",
        String::from_utf8_lossy(key)
    );
}

fn assert_delete_event(ev: &WatchEvent, key: &[u8], min_rev: Revision) -> Revision {
    match ev {
        WatchEvent::Delete(kv) => {
            assert_eq!(kv.key, key);
            assert!(kv.mod_revision > min_rev, "delete at {} not after {min_rev}", kv.mod_revision);
            assert!(kv.value.is_empty(), "delete event carries a value: {kv:?}");
            assert_eq!((kv.create_revision, kv.version, kv.lease), (0, 0, 0), "{kv:?}");
            kv.mod_revision
        }
        other => panic!("expected a delete of {:?}, got {other:?}", String::from_utf8_lossy(key)),
    }
}

fn assert_put_event(ev: &WatchEvent, key: &[u8], value: &str, rev: Revision) {
    match ev {
        WatchEvent::Put(kv) => {
            assert_eq!(kv.key, key);
            assert_eq!(kv.value, value.as_bytes());
            assert_eq!(kv.mod_revision, rev, "{kv:?}");
        }
        other => panic!("expected a put of {:?}, got {other:?}", String::from_utf8_lossy(key)),
    }
}

// ---------------------------------------------------------------------------------------------
// Cases

/// create/mod revision and version after puts and deletes, with exact revision arithmetic: each
/// write bumps the global revision by one; a txn that changes nothing does not.
pub async fn revisions_and_versions(ts: TestStore) {
    let s = &*ts.store;
    let a = ts.key("a");
    let r0 = current_revision(s, &ts).await;

    let r1 = put(s, &a, "1").await;
    assert_eq!(r1, r0 + 1, "a put bumps the revision by one");
    let kv = get1(s, &a).await.expect("a after put");
    assert_eq!((kv.create_revision, kv.mod_revision, kv.version), (r1, r1, 1));
    assert_eq!((kv.value.as_slice(), kv.lease), (b"1".as_slice(), 0));

    let r2 = put(s, &a, "2").await;
    assert_eq!(r2, r1 + 1);
    let kv = get1(s, &a).await.expect("a after second put");
    assert_eq!((kv.create_revision, kv.mod_revision, kv.version), (r1, r2, 2));

    // Two puts in one txn share one revision.
    let b = ts.key("b");
    let c = ts.key("c");
    let r3 = txn(
        s,
        TxnRequest::new().and_then([TxnOp::put(b.clone(), "x"), TxnOp::put(c.clone(), "y")]),
    )
    .await
    .revision;
    assert_eq!(r3, r2 + 1, "one txn is one revision");
    assert_eq!(get1(s, &b).await.map(|kv| kv.mod_revision), Some(r3));
    assert_eq!(get1(s, &c).await.map(|kv| kv.mod_revision), Some(r3));

    let (deleted, r4) = delete(s, KeyRange::key(a.clone())).await;
    assert_eq!((deleted, r4), (1, r3 + 1));
    assert_eq!(get1(s, &a).await, None);

    // Deleting a missing key and a read-only txn change nothing: no new revision.
    let (deleted, r) = delete(s, KeyRange::key(a.clone())).await;
    assert_eq!((deleted, r), (0, r4));
    let r = txn(s, TxnRequest::new().and_then([TxnOp::get_key(b.clone())])).await.revision;
    assert_eq!(r, r4);
    // A txn whose compare fails and has no else ops changes nothing either.
    let resp = txn(
        s,
        TxnRequest::new().when([Compare::absent(b.clone())]).and_then([TxnOp::put(a.clone(), "z")]),
    )
    .await;
    assert!(!resp.succeeded);
    assert_eq!(resp.revision, r4);

    // Re-created after delete: version restarts at 1, create revision is the new one.
    let r5 = put(s, &a, "3").await;
    assert_eq!(r5, r4 + 1);
    let kv = get1(s, &a).await.expect("a after re-create");
    assert_eq!((kv.create_revision, kv.mod_revision, kv.version), (r5, r5, 1));
    assert_eq!(current_revision(s, &ts).await, r5);
}

/// The success branch runs when every compare holds, else the failure branch; one response per
/// op of the branch that ran, in order.
pub async fn txn_then_else_and_responses_per_op(ts: TestStore) {
    let s = &*ts.store;
    let (a, b, c) = (ts.key("a"), ts.key("b"), ts.key("c"));
    let r_c = put(s, &c, "old").await;
    let request = || {
        TxnRequest::new()
            .when([Compare::value_is(a.clone(), "x")])
            .and_then([
                TxnOp::get_key(a.clone()),
                TxnOp::put(b.clone(), "then"),
                TxnOp::delete(c.clone()),
            ])
            .or_else([TxnOp::put(b.clone(), "else"), TxnOp::get_key(c.clone())])
    };

    // a is missing: else branch.
    let resp = txn(s, request()).await;
    assert!(!resp.succeeded);
    match resp.responses.as_slice() {
        [OpResponse::Put, OpResponse::Get(g)] => {
            assert_eq!(g.kvs.len(), 1);
            assert_eq!(g.kvs[0].value, b"old");
            assert_eq!(g.kvs[0].mod_revision, r_c);
            assert_eq!(g.count, 1);
        }
        other => panic!("else branch responses: {other:?}"),
    }
    let kv = get1(s, &b).await.expect("b written by the else branch");
    assert_eq!(kv.value, b"else");
    assert_eq!(kv.mod_revision, resp.revision, "the txn's revision is the revision of its writes");

    // a = x: then branch.
    let r_a = put(s, &a, "x").await;
    let resp = txn(s, request()).await;
    assert!(resp.succeeded);
    match resp.responses.as_slice() {
        [OpResponse::Get(g), OpResponse::Put, OpResponse::Delete { deleted: 1 }] => {
            assert_eq!(keys(&g.kvs), vec![a.clone()]);
            assert_eq!(g.kvs[0].mod_revision, r_a);
        }
        other => panic!("then branch responses: {other:?}"),
    }
    assert!(resp.revision > r_a);
    assert_eq!(get1(s, &b).await.map(|kv| kv.value), Some(b"then".to_vec()));
    assert_eq!(get1(s, &c).await, None);

    // An empty txn (no compares, no ops) succeeds and changes nothing.
    let before = get1(s, &b).await;
    let resp = txn(s, TxnRequest::new()).await;
    assert!(resp.succeeded);
    assert!(resp.responses.is_empty());
    assert_eq!(get1(s, &b).await, before);
}

/// Inside one txn, a read after a write sees the write (etcd applies the ops in order); a read
/// before it does not.
pub async fn txn_reads_see_earlier_writes_of_the_same_txn(ts: TestStore) {
    let s = &*ts.store;
    let a = ts.key("a");
    put(s, &a, "old").await;
    let resp = txn(
        s,
        TxnRequest::new().and_then([
            TxnOp::get_key(a.clone()),
            TxnOp::put(a.clone(), "new"),
            TxnOp::get_key(a.clone()),
        ]),
    )
    .await;
    match resp.responses.as_slice() {
        [OpResponse::Get(before), OpResponse::Put, OpResponse::Get(after)] => {
            assert_eq!(before.kvs[0].value, b"old");
            assert_eq!(after.kvs[0].value, b"new");
            // A read's revision inside a txn is that of the state it saw (etcd): before this
            // txn's first write the previous revision, after it the txn's own.
            assert_eq!(before.revision, resp.revision - 1);
            assert_eq!(after.revision, resp.revision);
            assert_eq!(after.kvs[0].mod_revision, resp.revision);
            assert_eq!(after.kvs[0].version, 2);
        }
        other => panic!("responses: {other:?}"),
    }
}

/// `=`, `!=`, `<`, `>` on value, create revision, mod revision, version and lease of one key.
pub async fn compare_ops_on_each_target(ts: TestStore) {
    let s = &*ts.store;
    let a = ts.key("a");
    let r1 = put(s, &a, "m").await;
    let r2 = put(s, &a, "m").await; // version 2, create r1, mod r2
    use CompareOp::*;
    use CompareTarget::*;
    let v = |x: &str| Value(x.as_bytes().to_vec());
    let cases: Vec<(CompareTarget, CompareOp, bool)> = vec![
        (v("m"), Equal, true),
        (v("n"), Equal, false),
        (v("m"), NotEqual, false),
        (v("n"), NotEqual, true),
        (v("n"), Less, true),
        (v("m"), Less, false),
        (v("l"), Greater, true),
        (v("m"), Greater, false),
        (v("mm"), Less, true), // byte-wise: "m" < "mm"
        (CreateRevision(r1), Equal, true),
        (CreateRevision(r2), Equal, false),
        (CreateRevision(r1), NotEqual, false),
        (CreateRevision(r1 + 1), Less, true),
        (CreateRevision(r1), Less, false),
        (CreateRevision(r1 - 1), Greater, true),
        (CreateRevision(r1), Greater, false),
        (ModRevision(r2), Equal, true),
        (ModRevision(r1), Equal, false),
        (ModRevision(r1), NotEqual, true),
        (ModRevision(r2 + 1), Less, true),
        (ModRevision(r2), Less, false),
        (ModRevision(r1), Greater, true),
        (ModRevision(r2), Greater, false),
        (Version(2), Equal, true),
        (Version(1), Equal, false),
        (Version(1), NotEqual, true),
        (Version(3), Less, true),
        (Version(2), Less, false),
        (Version(1), Greater, true),
        (Version(2), Greater, false),
        (Lease(0), Equal, true),
        (Lease(0), NotEqual, false),
    ];
    for (target, op, expected) in cases {
        let cmp = Compare::new(KeyRange::key(a.clone()), op, target);
        assert_eq!(
            holds(s, &ts, cmp.clone()).await,
            expected,
            "{cmp:?} on a key at create {r1}, mod {r2}, version 2"
        );
    }
    // Several compares: all must hold.
    let both = [
        Compare::value_is(a.clone(), "m"),
        Compare::new(KeyRange::key(a.clone()), Equal, Version(2)),
    ];
    let resp = txn(s, TxnRequest::new().when(both.clone())).await;
    assert!(resp.succeeded);
    let one_false = [both[0].clone(), Compare::new(KeyRange::key(a.clone()), Equal, Version(9))];
    assert!(!txn(s, TxnRequest::new().when(one_false)).await.succeeded);

    // Lease compare on a key attached to a lease.
    let lease = s.lease_grant(60).await.expect("grant");
    let b = ts.key("b");
    put_on_lease(s, &b, "v", lease.id).await;
    assert!(holds(s, &ts, Compare::new(KeyRange::key(b.clone()), Equal, Lease(lease.id))).await);
    assert!(!holds(s, &ts, Compare::new(KeyRange::key(b.clone()), Equal, Lease(0))).await);
    assert_eq!(get1(s, &b).await.map(|kv| kv.lease), Some(lease.id));
    assert_eq!(s.lease_revoke(lease.id).await, Ok(true));
}

/// A missing key compares as a zero record, except that any value compare on it is false.
pub async fn compare_on_missing_key(ts: TestStore) {
    let s = &*ts.store;
    let m = || KeyRange::key(ts.key("missing"));
    use CompareOp::*;
    use CompareTarget::*;
    let cases = [
        (CreateRevision(0), Equal, true),
        (ModRevision(0), Equal, true),
        (Version(0), Equal, true),
        (Lease(0), Equal, true),
        (Version(1), Less, true),
        (CreateRevision(0), Greater, false),
        (Value(b"".to_vec()), Equal, false),
        (Value(b"x".to_vec()), NotEqual, false),
        (Value(b"x".to_vec()), Less, false),
        (Value(b"".to_vec()), Greater, false),
    ];
    for (target, op, expected) in cases {
        let cmp = Compare::new(m(), op, target);
        assert_eq!(holds(s, &ts, cmp.clone()).await, expected, "{cmp:?} on a missing key");
    }
}

/// A compare over a range must hold for every key in it; over an empty range it is evaluated
/// against a zero record (so `create_revision == 0` means "empty"), except value compares.
pub async fn range_compare_holds_for_every_key(ts: TestStore) {
    let s = &*ts.store;
    let range = || KeyRange::prefix(ts.key("r/"));
    use CompareOp::*;
    use CompareTarget::*;
    assert!(
        holds(s, &ts, Compare::range_empty(range())).await,
        "empty range: create_revision == 0"
    );
    assert!(holds(s, &ts, Compare::new(range(), Equal, Version(0))).await);
    assert!(
        !holds(s, &ts, Compare::new(range(), Equal, Value(b"".to_vec()))).await,
        "value compare on an empty range is false"
    );
    // A key right outside the range does not count.
    put(s, &ts.key("r"), "outside").await;
    put(s, &ts.key("r0"), "outside").await;
    assert!(holds(s, &ts, Compare::range_empty(range())).await);

    put(s, &ts.key("r/1"), "v").await;
    assert!(!holds(s, &ts, Compare::range_empty(range())).await, "non-empty range");
    put(s, &ts.key("r/2"), "v").await;
    put(s, &ts.key("r/2"), "v").await; // r/1 version 1, r/2 version 2
    assert!(holds(s, &ts, Compare::new(range(), Greater, Version(0))).await);
    assert!(holds(s, &ts, Compare::new(range(), Less, Version(3))).await);
    assert!(
        !holds(s, &ts, Compare::new(range(), Equal, Version(1))).await,
        "must hold for every key"
    );
    assert!(
        !holds(s, &ts, Compare::new(range(), Equal, Version(2))).await,
        "must hold for every key"
    );
    assert!(holds(s, &ts, Compare::new(range(), Equal, Value(b"v".to_vec()))).await);
    put(s, &ts.key("r/3"), "w").await;
    assert!(!holds(s, &ts, Compare::new(range(), Equal, Value(b"v".to_vec()))).await);
    assert!(holds(s, &ts, Compare::new(range(), NotEqual, Value(b"x".to_vec()))).await);
    // Explicit [start, end) and from-key ranges.
    let half = KeyRange::range(ts.key("r/1"), ts.key("r/2"));
    assert!(holds(s, &ts, Compare::new(half, Equal, Version(1))).await);
    let upper = KeyRange::range(ts.key("r/4"), ts.key("r/9"));
    assert!(holds(s, &ts, Compare::range_empty(upper)).await);
    let from = KeyRange::from_key(ts.key("r/2"));
    assert!(!holds(s, &ts, Compare::range_empty(from)).await);
}

/// Compares of a nested txn are evaluated against the state before the outer txn.
pub async fn nested_txn_compares_see_state_before_outer_txn(ts: TestStore) {
    let s = &*ts.store;
    let (a, b, c) = (ts.key("a"), ts.key("b"), ts.key("c"));
    let inner = TxnRequest::new()
        .when([Compare::absent(a.clone())])
        .and_then([TxnOp::put(b.clone(), "inner-then"), TxnOp::get_key(a.clone())])
        .or_else([TxnOp::put(c.clone(), "inner-else")]);
    let outer = TxnRequest::new()
        .when([Compare::absent(a.clone())])
        .and_then([TxnOp::put(a.clone(), "outer"), TxnOp::Txn(inner)]);
    let resp = txn(s, outer).await;
    assert!(resp.succeeded);
    match resp.responses.as_slice() {
        [OpResponse::Put, OpResponse::Txn(inner)] => {
            assert!(inner.succeeded, "the nested compare must see a as absent (pre-txn state)");
            assert_eq!(inner.revision, resp.revision, "a nested txn reports the outer revision");
            match inner.responses.as_slice() {
                // The nested read runs after the outer put: it sees a.
                [OpResponse::Put, OpResponse::Get(g)] => {
                    assert_eq!(g.kvs.len(), 1);
                    assert_eq!(g.kvs[0].value, b"outer");
                }
                other => panic!("nested responses: {other:?}"),
            }
        }
        other => panic!("outer responses: {other:?}"),
    }
    assert_eq!(get1(s, &b).await.map(|kv| kv.value), Some(b"inner-then".to_vec()));
    assert_eq!(get1(s, &c).await, None);
    let kv_a = get1(s, &a).await.expect("a");
    assert_eq!(
        get1(s, &b).await.map(|kv| kv.mod_revision),
        Some(kv_a.mod_revision),
        "one revision"
    );
}

/// Two writes to one key in one txn branch are rejected as a whole.
pub async fn duplicate_key_in_one_txn_is_rejected(ts: TestStore) {
    let s = &*ts.store;
    let (a, b) = (ts.key("a"), ts.key("b"));
    let rejected = [
        vec![TxnOp::put(b.clone(), "1"), TxnOp::put(a.clone(), "1"), TxnOp::put(a.clone(), "2")],
        vec![TxnOp::put(b.clone(), "1"), TxnOp::put(a.clone(), "1"), TxnOp::delete(a.clone())],
        vec![
            TxnOp::put(b.clone(), "1"),
            TxnOp::delete_range(KeyRange::prefix(ts.key(""))),
            TxnOp::put(a.clone(), "1"),
        ],
    ];
    for ops in rejected {
        let dbg = format!("{ops:?}");
        let res = s.txn(TxnRequest::new().and_then(ops)).await;
        assert!(matches!(res, Err(StoreError::InvalidRequest(_))), "{dbg}: got {res:?}");
        assert_eq!(get1(s, &a).await, None, "{dbg}: nothing applied");
        assert_eq!(get1(s, &b).await, None, "{dbg}: nothing applied");
    }
    // A read and a write of the same key, or the same key in the two branches, are fine.
    let ok = TxnRequest::new()
        .and_then([TxnOp::get_key(a.clone()), TxnOp::put(a.clone(), "1")])
        .or_else([TxnOp::put(a.clone(), "2")]);
    assert!(txn(s, ok).await.succeeded);
    assert_eq!(get1(s, &a).await.map(|kv| kv.value), Some(b"1".to_vec()));
}

/// At most [`MAX_TXN_OPS`] compares and ops per branch; one more is rejected, nothing applied.
pub async fn txn_op_limit(ts: TestStore) {
    let s = &*ts.store;
    let puts = |n: usize, tag: &str| -> Vec<TxnOp> {
        (0..n).map(|i| TxnOp::put(ts.key(&format!("{tag}/{i:03}")), "v")).collect()
    };
    let resp = txn(s, TxnRequest::new().and_then(puts(MAX_TXN_OPS, "ok"))).await;
    assert_eq!(resp.responses.len(), MAX_TXN_OPS);
    assert_eq!(
        get(s, GetRequest::prefix(ts.key("ok/")).count_only()).await.count,
        MAX_TXN_OPS as i64
    );

    let res = s.txn(TxnRequest::new().and_then(puts(MAX_TXN_OPS + 1, "big"))).await;
    assert!(matches!(res, Err(StoreError::InvalidRequest(_))), "{} ops: {res:?}", MAX_TXN_OPS + 1);
    assert_eq!(get(s, GetRequest::prefix(ts.key("big/")).count_only()).await.count, 0);

    let res = s
        .txn(TxnRequest::new().and_then(puts(1, "else")).or_else(puts(MAX_TXN_OPS + 1, "else2")))
        .await;
    assert!(matches!(res, Err(StoreError::InvalidRequest(_))), "too many else ops: {res:?}");
    assert_eq!(get(s, GetRequest::prefix(ts.key("else")).count_only()).await.count, 0);

    let compares =
        |n: usize| (0..n).map(|i| Compare::absent(ts.key(&format!("c/{i}")))).collect::<Vec<_>>();
    let ok = TxnRequest::new().when(compares(MAX_TXN_OPS)).and_then(puts(MAX_TXN_OPS, "both"));
    assert!(txn(s, ok).await.succeeded, "limits count compares and each branch separately");
    let res =
        s.txn(TxnRequest::new().when(compares(MAX_TXN_OPS + 1)).and_then(puts(1, "cmp"))).await;
    assert!(matches!(res, Err(StoreError::InvalidRequest(_))), "too many compares: {res:?}");
    assert_eq!(get1(s, &ts.key("cmp/000")).await, None);
}

/// A request over [`MAX_REQUEST_BYTES`] is rejected; one well under it is accepted.
pub async fn request_size_limit(ts: TestStore) {
    let s = &*ts.store;
    let ok = "x".repeat(MAX_REQUEST_BYTES / 2);
    put(s, &ts.key("half"), &ok).await;
    assert_eq!(get1(s, &ts.key("half")).await.map(|kv| kv.value.len()), Some(ok.len()));
    for size in [MAX_REQUEST_BYTES + 64 * 1024, 3 * MAX_REQUEST_BYTES] {
        let big = "x".repeat(size);
        let key = ts.key(&format!("big{size}"));
        let res = s.txn(TxnRequest::new().and_then([TxnOp::put(key.clone(), big)])).await;
        assert!(matches!(res, Err(StoreError::InvalidRequest(_))), "{size} bytes: {res:?}");
        assert_eq!(get1(s, &key).await, None);
    }
}

/// A put on a lease that does not exist fails the whole txn with `LeaseNotFound`.
pub async fn put_on_unknown_lease_fails_whole_txn(ts: TestStore) {
    let s = &*ts.store;
    let (a, b) = (ts.key("a"), ts.key("b"));
    let unknown: LeaseId = 0x5eed_0000_1234_5678;
    let res = s
        .txn(
            TxnRequest::new().and_then([
                TxnOp::put(a.clone(), "1"),
                TxnOp::put_on_lease(b.clone(), "2", unknown),
            ]),
        )
        .await;
    assert_eq!(res, Err(StoreError::LeaseNotFound(unknown)));
    assert_eq!(get1(s, &a).await, None);
    assert_eq!(get1(s, &b).await, None);
    // Also for a revoked lease.
    let lease = s.lease_grant(60).await.expect("grant");
    assert_eq!(s.lease_revoke(lease.id).await, Ok(true));
    let res =
        s.txn(TxnRequest::new().and_then([TxnOp::put_on_lease(b.clone(), "2", lease.id)])).await;
    assert_eq!(res, Err(StoreError::LeaseNotFound(lease.id)));
}

/// `limit`, `more`, `count`, `keys_only`, `count_only` and range forms of a read.
pub async fn get_limit_more_count_keys_only_count_only(ts: TestStore) {
    let s = &*ts.store;
    for name in ["p/a", "p/b", "p/c", "p/d", "p/e"] {
        put(s, &ts.key(name), &format!("value-{name}")).await;
    }
    put(s, &ts.key("q"), "outside").await;
    let p = || ts.key("p/");
    let all = get(s, GetRequest::prefix(p())).await;
    assert_eq!(keys(&all.kvs), ["p/a", "p/b", "p/c", "p/d", "p/e"].map(|n| ts.key(n)).to_vec());
    assert_eq!((all.count, all.more), (5, false));
    assert_eq!(all.kvs[2].value, b"value-p/c");

    let two = get(s, GetRequest::prefix(p()).with_limit(2)).await;
    assert_eq!(keys(&two.kvs), vec![ts.key("p/a"), ts.key("p/b")]);
    assert_eq!((two.count, two.more), (5, true), "count ignores the limit");
    let five = get(s, GetRequest::prefix(p()).with_limit(5)).await;
    assert_eq!((five.kvs.len(), five.more), (5, false));

    let ko = get(s, GetRequest::prefix(p()).keys_only()).await;
    assert_eq!(keys(&ko.kvs), keys(&all.kvs));
    assert!(ko.kvs.iter().all(|kv| kv.value.is_empty()), "keys_only: no values");
    assert_eq!(ko.kvs[0].mod_revision, all.kvs[0].mod_revision, "keys_only keeps the metadata");
    assert_eq!(ko.kvs[0].version, 1);

    let co = get(s, GetRequest::prefix(p()).count_only()).await;
    assert!(co.kvs.is_empty());
    assert_eq!(co.count, 5);

    let half = get(s, GetRequest::new(KeyRange::range(ts.key("p/b"), ts.key("p/d")))).await;
    assert_eq!(keys(&half.kvs), vec![ts.key("p/b"), ts.key("p/c")]);
    assert_eq!(half.count, 2);
    let from = get(s, GetRequest::new(KeyRange::from_key(ts.key("p/d"))).with_limit(3)).await;
    assert_eq!(keys(&from.kvs), vec![ts.key("p/d"), ts.key("p/e"), ts.key("q")]);

    let none = get(s, GetRequest::key(ts.key("p/zz"))).await;
    assert!(none.kvs.is_empty());
    assert_eq!((none.count, none.more), (0, false));
    assert!(none.revision >= all.revision, "header revision never goes back");
    assert!(all.revision >= all.kvs.iter().map(|kv| kv.mod_revision).max().unwrap_or(0));
}

/// `newest_first` orders by mod revision, newest first, and with a limit answers only the newest
/// records (with the whole range's count): one record for the newest change of a range, the read
/// `idalloc serve` makes for a new watch stream. Keys written by one txn share a revision; their
/// order among themselves is not promised.
pub async fn get_newest_first(ts: TestStore) {
    let s = &*ts.store;
    for name in ["p/c", "p/a", "p/e"] {
        put(s, &ts.key(name), "1").await;
    }
    let put_two = TxnRequest {
        compare: vec![],
        success: vec![
            TxnOp::Put(PutRequest { key: ts.key("p/d"), value: b"2".to_vec(), lease: 0 }),
            TxnOp::Put(PutRequest { key: ts.key("p/b"), value: b"2".to_vec(), lease: 0 }),
        ],
        failure: vec![],
    };
    txn(s, put_two).await;
    let newest = put(s, &ts.key("p/a"), "3").await;
    put(s, &ts.key("q"), "outside").await;
    let p = || ts.key("p/");
    // Keys of one revision in key order (etcd does not promise an order among them).
    let newest_first_keys = |kvs: &[KeyValue]| {
        let revs: Vec<Revision> = kvs.iter().map(|kv| kv.mod_revision).collect();
        assert!(revs.windows(2).all(|w| w[0] >= w[1]), "newest first: {revs:?}");
        let mut v: Vec<(Revision, Vec<u8>)> =
            kvs.iter().map(|kv| (kv.mod_revision, kv.key.clone())).collect();
        v.sort_by(|a, b| b.0.cmp(&a.0).then(a.1.cmp(&b.1)));
        v.into_iter().map(|(_, k)| k).collect::<Vec<_>>()
    };
    let all = get(s, GetRequest::prefix(p()).newest_first()).await;
    let want = ["p/a", "p/b", "p/d", "p/e", "p/c"].map(|n| ts.key(n)).to_vec();
    assert_eq!(newest_first_keys(&all.kvs), want);
    assert_eq!((all.count, all.more), (5, false));
    let one = get(s, GetRequest::prefix(p()).newest_first().keys_only().with_limit(1)).await;
    assert_eq!(keys(&one.kvs), vec![ts.key("p/a")]);
    assert_eq!(one.kvs[0].mod_revision, newest, "the range's newest change");
    assert!(one.kvs[0].value.is_empty());
    assert_eq!((one.count, one.more), (5, true), "count is the range's");
    let three = get(s, GetRequest::prefix(p()).newest_first().with_limit(3)).await;
    assert_eq!(newest_first_keys(&three.kvs), want[..3].to_vec());
    assert_eq!(three.kvs[1].value, b"2");
    let empty = get(s, GetRequest::prefix(ts.key("r/")).newest_first().with_limit(1)).await;
    assert!(empty.kvs.is_empty() && !empty.more);
}

/// A read at a past revision sees the state as of that revision; the header still reports the
/// current revision.
pub async fn get_at_old_revision(ts: TestStore) {
    let s = &*ts.store;
    let a = ts.key("a");
    let r1 = put(s, &a, "1").await;
    let r2 = put(s, &a, "2").await;
    let (_, r3) = delete(s, KeyRange::key(a.clone())).await;
    let at = |rev| get(s, GetRequest::key(a.clone()).at_revision(rev));
    let g1 = at(r1).await;
    assert_eq!(g1.kvs.iter().map(|kv| kv.value.clone()).collect::<Vec<_>>(), vec![b"1".to_vec()]);
    assert_eq!((g1.kvs[0].mod_revision, g1.kvs[0].version), (r1, 1));
    assert!(g1.revision >= r3, "header revision is the current one, got {}", g1.revision);
    let g2 = at(r2).await;
    assert_eq!((g2.kvs[0].value.as_slice(), g2.kvs[0].version), (b"2".as_slice(), 2));
    assert!(at(r3).await.kvs.is_empty());
    assert!(at(r1 - 1).await.kvs.is_empty(), "before the first put");
    let prefix_at = get(s, GetRequest::prefix(ts.key("")).at_revision(r2).count_only()).await;
    assert_eq!(prefix_at.count, 1);
}

/// A read at a revision after the current one fails with `FutureRevision`.
pub async fn get_future_revision(ts: TestStore) {
    let s = &*ts.store;
    let now = current_revision(s, &ts).await;
    let requested = now + 1_000_000;
    match s.get(GetRequest::key(ts.key("a")).at_revision(requested)).await {
        Err(StoreError::FutureRevision { requested: r, current }) => {
            assert_eq!(r, requested);
            assert!(current >= now && current < requested, "current {current}");
        }
        other => panic!("expected FutureRevision, got {other:?}"),
    }
}

/// Deletes report how many keys they removed.
pub async fn delete_range_counts(ts: TestStore) {
    let s = &*ts.store;
    for name in ["d/a", "d/b", "d/c", "d/d"] {
        put(s, &ts.key(name), "v").await;
    }
    assert_eq!(delete(s, KeyRange::range(ts.key("d/a"), ts.key("d/c"))).await.0, 2);
    assert_eq!(
        keys(&get(s, GetRequest::prefix(ts.key("d/"))).await.kvs),
        vec![ts.key("d/c"), ts.key("d/d")]
    );
    assert_eq!(delete(s, KeyRange::key(ts.key("d/c"))).await.0, 1);
    assert_eq!(delete(s, KeyRange::key(ts.key("d/c"))).await.0, 0);
    assert_eq!(delete(s, KeyRange::prefix(ts.key("d/"))).await.0, 1);
    assert_eq!(delete(s, KeyRange::prefix(ts.key("d/"))).await.0, 0);
}

/// When a lease expires its keys are deleted (each seen by a watch as a delete), and the lease is
/// gone: keep-alive says `None`, revoke says `false`, a put on it fails.
pub async fn lease_expiry_deletes_keys_and_watch_sees_deletes(ts: TestStore) {
    let s = &*ts.store;
    let lease = s.lease_grant(1).await.expect("grant");
    assert!(lease.ttl >= 1, "granted {lease:?}");
    let mut watch = s.watch(KeyRange::prefix(ts.key("")), 0).await.expect("watch");
    let (a, b, c) = (ts.key("a"), ts.key("b"), ts.key("c"));
    let r1 = put_on_lease(s, &a, "1", lease.id).await;
    let r2 = put_on_lease(s, &b, "2", lease.id).await;
    put(s, &c, "no lease").await;
    assert_eq!(get1(s, &a).await.map(|kv| kv.lease), Some(lease.id));
    if ts.paused_time {
        // On the paused clock the expiry instant is exact: half the TTL later, all is still there.
        tokio::time::sleep(Duration::from_millis(lease.ttl as u64 * 500)).await;
        assert!(get1(s, &a).await.is_some(), "expired before its TTL");
    }
    wait_until_gone(s, &a).await;
    wait_until_gone(s, &b).await;
    assert!(get1(s, &c).await.is_some(), "a key without the lease stays");

    let evs = next_events(&mut watch, 5).await;
    assert_put_event(&evs[0], &a, "1", r1);
    assert_put_event(&evs[1], &b, "2", r2);
    assert!(matches!(&evs[2], WatchEvent::Put(kv) if kv.key == c));
    let mut deleted: Vec<_> = evs[3..].iter().map(|e| e.kv().key.clone()).collect();
    deleted.sort();
    assert_eq!(deleted, vec![a.clone(), b.clone()]);
    let d1 = assert_delete_event(&evs[3], &evs[3].kv().key, evs[2].kv().mod_revision);
    let d2 = assert_delete_event(&evs[4], &evs[4].kv().key, evs[2].kv().mod_revision);
    assert!(d2 >= d1);

    assert_eq!(s.lease_keep_alive(lease.id).await, Ok(None));
    assert_eq!(s.lease_revoke(lease.id).await, Ok(false));
    let res =
        s.txn(TxnRequest::new().and_then([TxnOp::put_on_lease(a.clone(), "x", lease.id)])).await;
    assert_eq!(res, Err(StoreError::LeaseNotFound(lease.id)));
}

/// Revoking deletes the lease's keys in one revision and returns true; a second revoke and a
/// keep-alive find nothing.
pub async fn lease_revoke_deletes_keys(ts: TestStore) {
    let s = &*ts.store;
    let lease: Lease = s.lease_grant(60).await.expect("grant");
    assert!(lease.id != 0);
    assert!(lease.ttl >= 60, "granted {lease:?}");
    let other = s.lease_grant(60).await.expect("grant");
    assert_ne!(other.id, lease.id);
    let (a, b, c) = (ts.key("a"), ts.key("b"), ts.key("c"));
    put_on_lease(s, &a, "1", lease.id).await;
    put_on_lease(s, &b, "2", lease.id).await;
    let r = put_on_lease(s, &c, "3", other.id).await;
    let mut watch = s.watch(KeyRange::prefix(ts.key("")), r + 1).await.expect("watch");
    assert_eq!(s.lease_revoke(lease.id).await, Ok(true));
    assert_eq!(get1(s, &a).await, None);
    assert_eq!(get1(s, &b).await, None);
    assert!(get1(s, &c).await.is_some(), "another lease's key stays");
    let evs = next_events(&mut watch, 2).await;
    let d1 = assert_delete_event(&evs[0], &a, r);
    let d2 = assert_delete_event(&evs[1], &b, r);
    assert_eq!(d1, d2, "a revoke deletes its keys in one revision");
    assert_eq!(s.lease_revoke(lease.id).await, Ok(false));
    assert_eq!(s.lease_keep_alive(lease.id).await, Ok(None));
    assert_eq!(s.lease_revoke(other.id).await, Ok(true));
}

/// A keep-alive renews the lease to its full TTL (which it returns), so its keys outlive the
/// original deadline.
pub async fn lease_keep_alive_extends(ts: TestStore) {
    let s = &*ts.store;
    let lease = s.lease_grant(3).await.expect("grant");
    let ttl = lease.ttl;
    assert!(ttl >= 3, "granted {lease:?}");
    let a = ts.key("a");
    put_on_lease(s, &a, "v", lease.id).await;
    let two_thirds = Duration::from_millis(ttl as u64 * 2000 / 3);
    tokio::time::sleep(two_thirds).await;
    assert_eq!(
        s.lease_keep_alive(lease.id).await,
        Ok(Some(ttl)),
        "keep-alive returns the full TTL"
    );
    tokio::time::sleep(two_thirds).await;
    // 4/3 of the TTL after the grant: only the keep-alive explains the key being there.
    assert!(get1(s, &a).await.is_some(), "keep-alive did not extend the lease");
    assert_eq!(s.lease_revoke(lease.id).await, Ok(true));
    assert_eq!(s.lease_keep_alive(lease.id).await, Ok(None));
}

/// A watch from an old revision replays the history of the range in order, then live events;
/// events of one txn arrive in one batch; keys outside the range are not seen.
pub async fn watch_replays_history_then_live_events(ts: TestStore) {
    let s = &*ts.store;
    let (a, b, c, x, y) =
        (ts.key("w/a"), ts.key("w/b"), ts.key("w/c"), ts.key("w/x"), ts.key("w/y"));
    let r1 = put(s, &a, "1").await;
    put(s, &ts.key("outside"), "o").await;
    let r2 = put(s, &b, "1").await;
    let (_, r3) = delete(s, KeyRange::key(a.clone())).await;
    let r4 = put(s, &b, "2").await;

    let mut watch = s.watch(KeyRange::prefix(ts.key("w/")), r1).await.expect("watch");
    let evs = next_events(&mut watch, 4).await;
    assert_put_event(&evs[0], &a, "1", r1);
    assert_put_event(&evs[1], &b, "1", r2);
    assert_eq!(assert_delete_event(&evs[2], &a, r2), r3);
    assert_put_event(&evs[3], &b, "2", r4);
    if let WatchEvent::Put(kv) = &evs[3] {
        assert_eq!((kv.create_revision, kv.version), (r2, 2));
    }

    // Live: a txn with two puts arrives as one batch.
    let r5 = txn(
        s,
        TxnRequest::new().and_then([TxnOp::put(x.clone(), "x"), TxnOp::put(y.clone(), "y")]),
    )
    .await
    .revision;
    match next_message(&mut watch).await {
        WatchMessage::Events(evs) => {
            assert_eq!(evs.len(), 2, "both events of revision {r5} in one batch: {evs:?}");
            assert_put_event(&evs[0], &x, "x", r5);
            assert_put_event(&evs[1], &y, "y", r5);
        }
        other => panic!("expected events, got {other:?}"),
    }
    let r6 = put(s, &c, "c").await;
    let evs = next_events(&mut watch, 1).await;
    assert_put_event(&evs[0], &c, "c", r6);

    // A second watcher from a middle revision sees the suffix only.
    let mut w2 = s.watch(KeyRange::prefix(ts.key("w/")), r3).await.expect("watch");
    let evs = next_events(&mut w2, 5).await;
    assert_eq!(evs[0].kv().mod_revision, r3);
    assert_eq!(evs[4].kv().mod_revision, r6);
}

/// A watch from revision 0 starts after the call returned: earlier writes are not replayed, later
/// ones are seen. A single-key watch ignores other keys.
pub async fn watch_from_now_sees_only_later_events(ts: TestStore) {
    let s = &*ts.store;
    let (a, b) = (ts.key("a"), ts.key("b"));
    put(s, &a, "before").await;
    let mut watch = s.watch(KeyRange::key(a.clone()), 0).await.expect("watch");
    put(s, &b, "other key").await;
    let r = put(s, &a, "after").await;
    let evs = next_events(&mut watch, 1).await;
    assert_put_event(&evs[0], &a, "after", r);
}

/// [`list_all`] reads every page at the revision of the first page: writes between pages are not
/// seen.
pub async fn list_all_is_pinned_to_one_revision(ts: TestStore) {
    let names: Vec<String> = (0..7).map(|i| format!("l/{i}")).collect();
    for n in &names {
        put(&*ts.store, &ts.key(n), n).await;
    }
    // After answering each page, deletes a listed key and adds a new one.
    struct WriteBetweenPages {
        prefix: Vec<u8>,
        pages: AtomicUsize,
    }
    #[async_trait::async_trait]
    impl Hook<Arc<dyn Store>> for WriteBetweenPages {
        async fn after(&self, inner: &Arc<Arc<dyn Store>>, kind: Kind, result: Answer) -> Answer {
            if kind == Kind::Get && result.is_ok() {
                let n = self.pages.fetch_add(1, Ordering::SeqCst);
                let key = |name: String| [self.prefix.as_slice(), name.as_bytes()].concat();
                inner
                    .txn(TxnRequest::new().and_then([
                        TxnOp::delete(key(format!("l/{}", 6 - n))),
                        TxnOp::put(key(format!("l/{n}a")), "new"),
                    ]))
                    .await?;
            }
            result
        }
    }
    let wrapped = HookedStore::with_hook(
        ts.store.clone(),
        WriteBetweenPages { prefix: ts.prefix.clone(), pages: AtomicUsize::new(0) },
    );
    let (kvs, rev) =
        list_all(&wrapped, &KeyRange::prefix(ts.key("l/")), 2).await.expect("list_all");
    let expected: Vec<Vec<u8>> = names.iter().map(|n| ts.key(n)).collect();
    assert_eq!(keys(&kvs), expected, "pages after the first must not see later writes");
    assert!(kvs.iter().all(|kv| kv.mod_revision <= rev));
    // At least 4 reads for 7 keys in pages of 2 (a window sized from the keys read may hold
    // fewer than a page, so there can be more reads; every one was followed by writes).
    let reads = wrapped.hook().pages.load(Ordering::SeqCst);
    assert!(reads >= 4, "7 keys in pages of 2 took {reads} reads");
    // The writes did happen.
    assert_eq!(get1(&*ts.store, &ts.key("l/6")).await, None);
    assert!(get1(&*ts.store, &ts.key("l/3a")).await.is_some());
    // Page size 1 and a page size larger than the range give the same listing.
    let (kvs1, _) =
        list_all(&*ts.store, &KeyRange::prefix(ts.key("l/")), 1).await.expect("list_all");
    let (kvs100, _) =
        list_all(&*ts.store, &KeyRange::prefix(ts.key("l/")), 100).await.expect("list_all");
    assert_eq!(keys(&kvs1), keys(&kvs100));
    assert_eq!(kvs1.len(), 7, "4 of the 7 deleted, 4 added");
}

/// After a compaction, reads at older revisions fail with `Compacted` (naming the oldest
/// available revision); reads at the compaction revision still work.
pub async fn get_at_compacted_revision(ts: TestStore) {
    let s = &*ts.store;
    let a = ts.key("a");
    let r1 = put(s, &a, "1").await;
    let r2 = put(s, &a, "2").await;
    let r3 = put(s, &a, "3").await;
    s.compact(r2).await.expect("compact");
    match s.get(GetRequest::key(a.clone()).at_revision(r1)).await {
        Err(StoreError::Compacted { requested, compact_revision }) => {
            assert_eq!((requested, compact_revision), (r1, r2));
        }
        other => panic!("expected Compacted, got {other:?}"),
    }
    let g = get(s, GetRequest::key(a.clone()).at_revision(r2)).await;
    assert_eq!(g.kvs[0].value, b"2");
    assert_eq!(get(s, GetRequest::key(a.clone()).at_revision(r3)).await.kvs[0].value, b"3");
    // Compacting again at or below the compaction point is an error too.
    assert!(matches!(s.compact(r1).await, Err(StoreError::Compacted { .. })));
    assert!(matches!(s.compact(r3 + 1_000).await, Err(StoreError::FutureRevision { .. })));
}

/// A watch from a compacted revision yields `Compacted` and ends.
pub async fn watch_from_compacted_revision(ts: TestStore) {
    let s = &*ts.store;
    let a = ts.key("a");
    let r1 = put(s, &a, "1").await;
    let r2 = put(s, &a, "2").await;
    s.compact(r2).await.expect("compact");
    let mut watch = s.watch(KeyRange::prefix(ts.key("")), r1).await.expect("watch");
    assert_eq!(next_message(&mut watch).await, WatchMessage::Compacted { compact_revision: r2 });
    let end = tokio::time::timeout(PATIENCE, watch.next()).await.expect("stream must end");
    assert!(end.is_none(), "nothing after Compacted, got {end:?}");
    // From the compaction revision itself the history is still there.
    let mut watch = s.watch(KeyRange::prefix(ts.key("")), r2).await.expect("watch");
    let evs = next_events(&mut watch, 1).await;
    assert_put_event(&evs[0], &a, "2", r2);
}

/// A watch from the compaction revision `R` where `R` deleted a key: accepted (not `Compacted`),
/// nothing below `R`, everything after `R` in order. The delete made at `R` itself may or may not
/// come: etcd 3.4.23 drops a key's tombstone at exactly the compaction revision once the
/// compaction has run (etcd's `keyIndex.compact`; checked with `etcdctl compact --physical`, then
/// `watch --rev R`); newer etcd releases keep it (etcd PR #18274); the embedded store drops it
/// like 3.4.23. A follower must therefore never need that delete: it watches from the revision
/// its view reflects and skips what it already has (`feed.rs`), right under both behaviours.
pub async fn watch_from_the_compaction_revision_of_a_delete(ts: TestStore) {
    let s = &*ts.store;
    let (a, b, c) = (ts.key("a"), ts.key("b"), ts.key("c"));
    put(s, &a, "1").await;
    put(s, &b, "1").await;
    let (deleted, r) = delete(s, KeyRange::key(b.clone())).await;
    assert_eq!(deleted, 1);
    s.compact(r).await.expect("compact");
    let r_c = put(s, &c, "1").await;
    let r_a = put(s, &a, "2").await;
    let mut watch = s.watch(KeyRange::prefix(ts.key("")), r).await.expect("watch from R");
    // Read until the last write shows up (the store may batch the replay as it likes).
    let mut evs: Vec<WatchEvent> = Vec::new();
    while evs.last().is_none_or(|e| e.kv().mod_revision < r_a) {
        match next_message(&mut watch).await {
            WatchMessage::Events(batch) => evs.extend(batch),
            other => panic!("expected events, got {other:?}"),
        }
    }
    if let Some(first) = evs.first().filter(|e| e.kv().mod_revision == r) {
        assert_eq!(assert_delete_event(first, &b, r - 1), r);
        evs.remove(0);
    }
    assert!(evs.iter().all(|e| e.kv().mod_revision > r), "nothing below R: {evs:?}");
    assert_put_event(&evs[0], &c, "1", r_c);
    assert_put_event(&evs[1], &a, "2", r_a);
    assert_eq!(evs.len(), 2, "{evs:?}");
}
