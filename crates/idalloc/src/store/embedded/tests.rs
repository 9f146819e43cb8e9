//! Tests of the embedded store through the [`Store`] trait: leases on tokio's paused clock,
//! watches, and the file mode (reopen, corruption, locking). The semantics of single
//! operations are unit-tested in `mvcc`; the generic conformance suite (pagination at a pinned
//! revision included) runs from `tests/conformance_embedded.rs`.
//!
//! One file of tests (about 600 lines) because the cases share one set of helpers for a store on a
//! temporary file and on the paused clock; it has no library code.

use futures::StreamExt;

use super::*;
use crate::store::{Compare, OpResponse, TxnOp};

fn put(k: &str, v: &str) -> TxnRequest {
    TxnRequest::new().and_then([TxnOp::put(k, v)])
}

async fn value(s: &impl Store, k: &str) -> Option<Vec<u8>> {
    s.get(GetRequest::key(k)).await.unwrap().kvs.into_iter().next().map(|kv| kv.value)
}

/// The next message, failing the test instead of hanging if there is none in (virtual) time.
async fn next_msg(w: &mut WatchStream) -> WatchMessage {
    tokio::time::timeout(Duration::from_secs(3600), w.next())
        .await
        .expect("watch message expected")
        .expect("stream ended")
        .expect("stream error")
}

fn events(msg: WatchMessage) -> Vec<WatchEvent> {
    match msg {
        WatchMessage::Events(e) => e,
        other => panic!("expected events, got {other:?}"),
    }
}

#[tokio::test(start_paused = true)]
async fn expired_lease_keys_vanish_on_next_operation() {
    let s = EmbeddedStore::memory();
    let lease = s.lease_grant(10).await.unwrap();
    assert_eq!(lease.ttl, 10);
    s.txn(
        TxnRequest::new().and_then([TxnOp::put_on_lease("a", "1", lease.id), TxnOp::put("b", "1")]),
    )
    .await
    .unwrap();
    tokio::time::advance(Duration::from_secs(9)).await;
    assert_eq!(s.lease_keep_alive(lease.id).await.unwrap(), Some(10));
    tokio::time::advance(Duration::from_secs(9)).await;
    assert!(value(&s, "a").await.is_some(), "renewed at 9 s, alive at 18 s");
    tokio::time::advance(Duration::from_secs(2)).await;
    assert_eq!(value(&s, "a").await, None, "expired at 19 s");
    assert!(value(&s, "b").await.is_some());
    assert_eq!(
        s.get(GetRequest::key("b")).await.unwrap().revision,
        3,
        "one revision for the expiry"
    );
    assert_eq!(s.lease_keep_alive(lease.id).await.unwrap(), None);
    assert!(!s.lease_revoke(lease.id).await.unwrap());
    assert_eq!(
        s.txn(TxnRequest::new().and_then([TxnOp::put_on_lease("c", "1", lease.id)])).await,
        Err(StoreError::LeaseNotFound(lease.id))
    );
}

#[tokio::test(start_paused = true)]
async fn background_expiry_emits_watch_deletes_without_other_calls() {
    let s = EmbeddedStore::memory();
    let lease = s.lease_grant(5).await.unwrap();
    s.txn(TxnRequest::new().and_then([
        TxnOp::put_on_lease("p/a", "1", lease.id),
        TxnOp::put_on_lease("p/b", "1", lease.id),
    ]))
    .await
    .unwrap();
    let mut w = s.watch(KeyRange::prefix("p/"), 0).await.unwrap();
    // Nothing else runs: paused time jumps to the lease deadline and the expiry task fires.
    let start = Instant::now();
    let evs = events(next_msg(&mut w).await);
    assert!(Instant::now() - start >= Duration::from_secs(5));
    assert_eq!(evs.len(), 2, "both deletes in one batch");
    for (e, k) in evs.iter().zip(["p/a", "p/b"]) {
        match e {
            WatchEvent::Delete(kv) => {
                assert_eq!(kv.key, k.as_bytes());
                assert_eq!(kv.mod_revision, 3);
            }
            other => panic!("expected delete, got {other:?}"),
        }
    }
}

#[tokio::test(start_paused = true)]
async fn revoke_deletes_keys_in_one_revision() {
    let s = EmbeddedStore::memory();
    let lease = s.lease_grant(60).await.unwrap();
    s.txn(TxnRequest::new().and_then([
        TxnOp::put_on_lease("a", "1", lease.id),
        TxnOp::put_on_lease("b", "1", lease.id),
    ]))
    .await
    .unwrap();
    assert!(s.lease_revoke(lease.id).await.unwrap());
    let r = s.get(GetRequest::new(KeyRange::from_key("a"))).await.unwrap();
    assert_eq!((r.count, r.revision), (0, 3));
}

#[tokio::test]
async fn watch_replays_history_then_follows_live_writes() {
    let s = EmbeddedStore::memory();
    s.txn(put("w/a", "1")).await.unwrap(); // 2
    s.txn(TxnRequest::new().and_then([TxnOp::put("w/b", "1"), TxnOp::put("other", "1")]))
        .await
        .unwrap(); // 3
    s.txn(TxnRequest::new().and_then([TxnOp::delete("w/a")])).await.unwrap(); // 4
    let mut w = s.watch(KeyRange::prefix("w/"), 3).await.unwrap();
    let replay = events(next_msg(&mut w).await);
    let revs: Vec<Revision> = replay.iter().map(|e| e.kv().mod_revision).collect();
    assert_eq!(revs, vec![3, 4], "from revision 3 on, only keys in range");
    assert!(matches!(&replay[0], WatchEvent::Put(kv) if kv.key == b"w/b" && kv.version == 1));
    assert!(matches!(&replay[1], WatchEvent::Delete(kv) if kv.key == b"w/a"));
    s.txn(TxnRequest::new().and_then([TxnOp::put("w/c", "1"), TxnOp::put("w/d", "1")]))
        .await
        .unwrap(); // 5
    let live = events(next_msg(&mut w).await);
    assert_eq!(live.len(), 2, "one revision, one batch");
    assert!(live.iter().all(|e| e.kv().mod_revision == 5));
    // A watch from now sees only later writes.
    let mut now = s.watch(KeyRange::prefix("w/"), 0).await.unwrap();
    s.txn(put("w/e", "1")).await.unwrap(); // 6
    let e = events(next_msg(&mut now).await);
    assert_eq!(e[0].kv().mod_revision, 6);
    // Dropped watchers are forgotten.
    drop(w);
    drop(now);
    s.txn(put("w/f", "1")).await.unwrap();
    assert!(s.inner.lock().watchers.is_empty());
}

#[tokio::test]
async fn watch_below_compaction_point_gets_compacted_then_ends() {
    let s = EmbeddedStore::memory();
    for i in 0..5 {
        s.txn(put("k", &i.to_string())).await.unwrap(); // 2..=6
    }
    s.compact(4).await.unwrap();
    let mut w = s.watch(KeyRange::key("k"), 3).await.unwrap();
    assert_eq!(next_msg(&mut w).await, WatchMessage::Compacted { compact_revision: 4 });
    assert!(w.next().await.is_none(), "stream ends after Compacted");
    // From the compaction point itself, history is there.
    let mut w = s.watch(KeyRange::key("k"), 4).await.unwrap();
    let revs: Vec<Revision> =
        events(next_msg(&mut w).await).iter().map(|e| e.kv().mod_revision).collect();
    assert_eq!(revs, vec![4, 5, 6]);
    assert_eq!(
        s.compact(4).await,
        Err(StoreError::Compacted { requested: 4, compact_revision: 4 })
    );
    assert_eq!(s.compact(9).await, Err(StoreError::FutureRevision { requested: 9, current: 6 }));
}

#[tokio::test]
async fn dropping_the_store_stops_the_expiry_task() {
    let s = EmbeddedStore::memory();
    s.lease_grant(3600).await.unwrap();
    let handle = s.inner.reaper.lock().unwrap().take().expect("expiry task running");
    drop(s);
    tokio::time::timeout(Duration::from_secs(60), handle).await.expect("task ended").unwrap();
}

#[test]
fn memory_store_works_when_created_outside_a_runtime() {
    let s = EmbeddedStore::memory();
    let rt = tokio::runtime::Builder::new_current_thread().enable_time().build().unwrap();
    rt.block_on(async {
        s.txn(put("a", "1")).await.unwrap();
        assert_eq!(value(&s, "a").await, Some(b"1".to_vec()));
    });
}

// ----- file mode -----

fn opts() -> EmbeddedOptions {
    EmbeddedOptions { lock_timeout: Duration::from_millis(300), ..Default::default() }
}

#[tokio::test]
async fn reopen_restores_keys_revision_history_compaction_and_leases() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("store.redb");
    let lease;
    {
        let s = EmbeddedStore::open(&path, opts()).await.unwrap();
        assert_eq!(
            s.get(GetRequest::key("a")).await.unwrap().revision,
            1,
            "fresh file at revision 1"
        );
        lease = s.lease_grant(3600).await.unwrap();
        s.txn(put("a", "1")).await.unwrap(); // 2
        s.txn(put("a", "2")).await.unwrap(); // 3
        s.txn(TxnRequest::new().and_then([TxnOp::put_on_lease("l", "1", lease.id)])).await.unwrap(); // 4
        s.txn(put("b", "1")).await.unwrap(); // 5
        s.txn(TxnRequest::new().and_then([TxnOp::delete("b")])).await.unwrap(); // 6
        s.compact(3).await.unwrap();
    }
    let s = EmbeddedStore::open(&path, opts()).await.unwrap();
    let a = s.get(GetRequest::key("a")).await.unwrap();
    assert_eq!(a.revision, 6);
    assert_eq!(
        (a.kvs[0].value.as_slice(), a.kvs[0].create_revision, a.kvs[0].version),
        (&b"2"[..], 2, 2)
    );
    assert_eq!(value(&s, "b").await, None);
    assert_eq!(s.get(GetRequest::key("b").at_revision(5)).await.unwrap().count, 1, "history kept");
    assert!(matches!(
        s.get(GetRequest::key("a").at_revision(2)).await,
        Err(StoreError::Compacted { compact_revision: 3, .. })
    ));
    let mut w = s.watch(KeyRange::from_key("a"), 4).await.unwrap();
    let revs: Vec<Revision> =
        events(next_msg(&mut w).await).iter().map(|e| e.kv().mod_revision).collect();
    assert_eq!(revs, vec![4, 5, 6], "watch from before the reopen");
    let l = s.get(GetRequest::key("l")).await.unwrap();
    assert_eq!(l.kvs[0].lease, lease.id);
    assert_eq!(s.lease_keep_alive(lease.id).await.unwrap(), Some(3600));
    let next = s.lease_grant(60).await.unwrap();
    assert!(next.id > lease.id, "lease IDs are never reused across reopen");
    assert!(s.lease_revoke(lease.id).await.unwrap());
    assert_eq!(value(&s, "l").await, None);
    drop(s);
    let s = EmbeddedStore::open(&path, opts()).await.unwrap();
    assert_eq!(value(&s, "l").await, None, "revocation was durable");
    assert_eq!(s.get(GetRequest::key("a")).await.unwrap().revision, 7);
}

/// Dropping the last handle closes the file at once: another open of the file right after (here
/// redb's own, which does not wait) finds it free. The group-commit task used to hold the state
/// until it ended, after answering, and a reopen sometimes found the file still locked.
#[tokio::test]
async fn dropping_the_last_handle_frees_the_file_at_once() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("store.redb");
    for round in 0..200 {
        let s = EmbeddedStore::open(&path, opts()).await.unwrap();
        s.txn(TxnRequest::new().and_then([TxnOp::put("k", "v")])).await.unwrap();
        drop(s);
        if let Err(e) = file::set_format_version(&path, file::FORMAT_VERSION) {
            panic!("round {round}: the file was still open after the store was dropped: {e}");
        }
    }
}

#[tokio::test(start_paused = true)]
async fn leases_resume_with_remaining_time_and_expired_ones_go_at_open() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("store.redb");
    let (short, long);
    {
        let s = EmbeddedStore::open(&path, opts()).await.unwrap();
        short = s.lease_grant(100).await.unwrap();
        long = s.lease_grant(1000).await.unwrap();
        s.txn(TxnRequest::new().and_then([
            TxnOp::put_on_lease("short/a", "1", short.id),
            TxnOp::put_on_lease("short/b", "1", short.id),
            TxnOp::put_on_lease("long", "1", long.id),
        ]))
        .await
        .unwrap(); // 2
    }
    // As if the file had stayed closed past the short lease's deadline.
    file::set_lease_deadline(&path, short.id, file::unix_ms_now() - 1).unwrap();
    let s = EmbeddedStore::open(&path, opts()).await.unwrap();
    let r = s.get(GetRequest::prefix("short/")).await.unwrap();
    assert_eq!((r.count, r.revision), (0, 3), "expired at open, one revision");
    assert_eq!(s.lease_keep_alive(short.id).await.unwrap(), None);
    // The long lease resumes with the (almost 1000 s) it had left.
    tokio::time::advance(Duration::from_secs(990)).await;
    assert!(value(&s, "long").await.is_some());
    tokio::time::advance(Duration::from_secs(11)).await;
    assert_eq!(value(&s, "long").await, None);
    drop(s);
    let s = EmbeddedStore::open(&path, opts()).await.unwrap();
    assert_eq!(s.get(GetRequest::key("long")).await.unwrap().revision, 4, "expiry was persisted");
}

#[tokio::test]
async fn garbage_file_is_corrupt_not_reset() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("store.redb");
    let garbage: Vec<u8> =
        (0..64 * 1024u32).map(|i| (i.wrapping_mul(2654435761) >> 13) as u8).collect();
    std::fs::write(&path, &garbage).unwrap();
    match EmbeddedStore::open(&path, opts()).await {
        Err(StoreError::Corrupt { path: p, .. }) => assert!(p.ends_with("store.redb")),
        other => panic!("expected Corrupt, got {other:?}"),
    }
    assert_eq!(std::fs::read(&path).unwrap(), garbage, "file left untouched");
}

#[tokio::test]
async fn newer_format_and_malformed_rows_are_corrupt() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("store.redb");
    drop(EmbeddedStore::open(&path, opts()).await.unwrap());
    file::set_format_version(&path, file::FORMAT_VERSION + 1).unwrap();
    match EmbeddedStore::open(&path, opts()).await {
        Err(StoreError::Corrupt { reason, .. }) => assert!(reason.contains("newer"), "{reason}"),
        other => panic!("expected Corrupt, got {other:?}"),
    }
    // A row is read when needed: the open succeeds, the read that meets the
    // row fails naming the file and the key, and the store stops.
    let path = dir.path().join("rows.redb");
    drop(EmbeddedStore::open(&path, opts()).await.unwrap());
    file::put_raw_history(&path, b"bad", &[9, 9]).unwrap();
    let s = EmbeddedStore::open(&path, opts()).await.unwrap();
    assert!(value(&s, "other").await.is_none(), "rows not read are not checked");
    match s.get(GetRequest::key("bad")).await {
        Err(StoreError::Corrupt { path: p, reason }) => {
            assert_eq!(p, path.display().to_string());
            assert!(reason.contains("\"bad\""), "{reason}")
        }
        other => panic!("expected Corrupt, got {other:?}"),
    }
    // The store stopped: later calls fail the same way (a person must look at the file).
    let later = s.txn(put("x", "1")).await;
    assert!(
        matches!(&later, Err(StoreError::Corrupt { path: p, .. }) if *p == path.display().to_string()),
        "{later:?}"
    );
}

/// Random 8-byte writes into a store file made redb panic while opening it in
/// about 1 file in 20 (`page_manager.rs` "Malformed allocator state", `types.rs:109`, slice
/// indexes in `table_tree_base.rs` / `btree_base.rs`). The file layer must answer every damaged
/// file with `Ok` (the damage hit unused bytes) or `Corrupt` naming the file, and never let a
/// panic out. 300 fixed seeds over a store with keys, deletes and a lease; before the fix, 13
/// of them panicked here (redb 4.6).
#[tokio::test]
async fn randomly_damaged_files_are_corrupt_or_fine_never_a_panic() {
    use rand::{Rng, SeedableRng};
    let dir = tempfile::tempdir().unwrap();
    let base = dir.path().join("base.redb");
    {
        let s = EmbeddedStore::open(&base, opts()).await.unwrap();
        let lease = s.lease_grant(3600).await.unwrap();
        for i in 0..40 {
            s.txn(put(&format!("key/{i}"), &format!("value {i}"))).await.unwrap();
        }
        s.txn(TxnRequest::new().and_then([TxnOp::put_on_lease("leased", "x", lease.id)]))
            .await
            .unwrap();
        for i in 0..10 {
            s.txn(TxnRequest::new().and_then([TxnOp::delete(format!("key/{i}"))])).await.unwrap();
        }
    }
    let clean = std::fs::read(&base).unwrap();
    let path = dir.path().join("damaged.redb");
    let (mut panics, mut corrupt) = (Vec::new(), 0);
    for seed in 0..300u64 {
        let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
        let mut data = clean.clone();
        let at = rng.random_range(0..data.len() - 8);
        rng.fill(&mut data[at..at + 8]);
        std::fs::write(&path, &data).unwrap();
        let opened =
            std::panic::catch_unwind(|| file::FileStore::open_blocking(&path, false, false));
        match opened {
            Err(_) => panics.push(seed),
            Ok(Ok(_)) => {}
            Ok(Err(file::OpenError::Store(StoreError::Corrupt { path: p, .. }))) => {
                assert_eq!(p, path.display().to_string(), "seed {seed}: the error names the file");
                corrupt += 1;
            }
            Ok(Err(file::OpenError::Store(e))) => panic!("seed {seed}: expected Corrupt, got {e}"),
            Ok(Err(file::OpenError::Locked)) => panic!("seed {seed}: nothing else holds the file"),
        }
    }
    assert!(panics.is_empty(), "opening panicked for seeds {panics:?}");
    assert!(corrupt > 0, "some damage must be detected, or this test tests nothing");
}

#[tokio::test]
async fn missing_directory_is_unavailable() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("no/such/dir/store.redb");
    assert!(
        matches!(EmbeddedStore::open(&path, opts()).await, Err(StoreError::Unavailable(m)) if m.contains("no/such/dir"))
    );
}

#[tokio::test(start_paused = true)]
async fn second_open_waits_then_reports_locked_with_the_path() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("store.redb");
    let first = EmbeddedStore::open(&path, opts()).await.unwrap();
    match EmbeddedStore::open(&path, opts()).await {
        Err(StoreError::Locked { path: p, waited }) => {
            assert_eq!(p, path.display().to_string());
            assert!(waited >= Duration::from_millis(300), "waited {waited:?}");
        }
        other => panic!("expected Locked, got {other:?}"),
    }
    // A waiting open succeeds once the owner lets go.
    let releaser = tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(100)).await;
        drop(first);
    });
    let long = EmbeddedOptions { lock_timeout: Duration::from_secs(10), ..Default::default() };
    let second = EmbeddedStore::open(&path, long).await.unwrap();
    releaser.await.unwrap();
    second.txn(put("a", "1")).await.unwrap();
}

#[tokio::test]
async fn failed_compare_txn_keeps_revision_across_reopen() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("store.redb");
    let s = EmbeddedStore::open(&path, opts()).await.unwrap();
    s.txn(put("a", "1")).await.unwrap();
    let r = s
        .txn(
            TxnRequest::new()
                .when([Compare::absent("a")])
                .and_then([TxnOp::put("a", "2")])
                .or_else([TxnOp::get_key("a")]),
        )
        .await
        .unwrap();
    assert!(!r.succeeded);
    assert_eq!(r.revision, 2);
    drop(s);
    let s = EmbeddedStore::open(&path, opts()).await.unwrap();
    assert_eq!(value(&s, "a").await, Some(b"1".to_vec()));
    assert_eq!(s.get(GetRequest::key("a")).await.unwrap().revision, 2);
}

#[tokio::test]
async fn auto_compaction_bounds_the_file_too() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("store.redb");
    let small = EmbeddedOptions { auto_compact_keep: 16, ..opts() };
    {
        let s = EmbeddedStore::open(&path, small.clone()).await.unwrap();
        for i in 0..200 {
            s.txn(put("k", &i.to_string())).await.unwrap();
        }
    }
    let s = EmbeddedStore::open(&path, small).await.unwrap();
    let (compact, held) = {
        let core = s.inner.lock();
        (core.mvcc.compact_revision(), core.mvcc.history_len())
    };
    assert!((201 - 16 - 2..=201 - 16).contains(&compact), "compaction point {compact} restored");
    assert!(held <= 16 + 2 + 1, "the file held only recent history: {held} changes");
    assert!(matches!(
        s.get(GetRequest::key("k").at_revision(compact - 1)).await,
        Err(StoreError::Compacted { .. })
    ));
    assert_eq!(
        s.get(GetRequest::key("k").at_revision(201 - 16)).await.unwrap().kvs[0].value,
        b"183"
    );
}

// ----- group commit (file mode) -----

fn file_commits(s: &EmbeddedStore) -> u64 {
    s.inner.lock().file.as_ref().expect("a file store").commits()
}

/// Queues `reqs` in order while the state is locked (so they all wait for one group), then
/// releases the lock and returns each txn's result.
// On purpose: the guard spans one poll, in which file-store txns only queue (they never take the
// state lock on the caller's side), so nothing can deadlock.
#[allow(clippy::await_holding_lock)]
async fn in_one_group(s: &EmbeddedStore, reqs: Vec<TxnRequest>) -> Vec<StoreResult<TxnResponse>> {
    let guard = s.inner.lock();
    let mut all = Box::pin(futures::future::join_all(reqs.into_iter().map(|r| s.txn(r))));
    // One poll queues every txn, in order; none can be applied while the state is locked.
    assert!(futures::poll!(&mut all).is_pending());
    drop(guard);
    all.await
}

/// Concurrent txns that queued together are applied one by one, in queue order, each against
/// the state left by the ones before it, each with its own revision and response; they share one
/// commit; watchers and a reopen see exactly the sequence of single txns.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn queued_txns_share_one_commit_with_their_own_semantics() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("store.redb");
    let s = EmbeddedStore::open(&path, opts()).await.unwrap();
    s.txn(put("counter", "0")).await.unwrap(); // 2
    let mut w = s.watch(KeyRange::prefix(""), 3).await.unwrap();
    let before = file_commits(&s);

    const N: usize = 50;
    // Txn i succeeds only if it sees txn i-1's write.
    let mut reqs: Vec<TxnRequest> = (0..N)
        .map(|i| {
            TxnRequest::new().when([Compare::value_is("counter", i.to_string())]).and_then([
                TxnOp::put("counter", (i + 1).to_string()),
                TxnOp::put(format!("own/{i:02}"), "x"),
            ])
        })
        .collect();
    // Two creates of one key: the second loses to the first and reads what it wrote.
    let claim = |who: &str| {
        TxnRequest::new()
            .when([Compare::absent("claim")])
            .and_then([TxnOp::put("claim", who)])
            .or_else([TxnOp::get_key("claim")])
    };
    reqs.push(claim("a")); // 53
    reqs.push(claim("b")); // no write
                           // An invalid txn fails alone and takes no revision.
    reqs.push(TxnRequest::new().and_then([TxnOp::put_on_lease("leased", "x", 999)]));
    reqs.push(put("after", "x")); // 54
    let results = in_one_group(&s, reqs).await;

    assert_eq!(file_commits(&s) - before, 1, "one redb commit for the whole group");
    for (i, r) in results[..N].iter().enumerate() {
        let r = r.as_ref().unwrap();
        assert!(r.succeeded, "txn {i} saw the counter written by txn {}", i as i64 - 1);
        assert_eq!(r.revision, 3 + i as i64, "txn {i} has its own revision");
    }
    let won = results[N].as_ref().unwrap();
    assert!(won.succeeded);
    assert_eq!(won.revision, 53);
    let lost = results[N + 1].as_ref().unwrap();
    assert!(!lost.succeeded, "the second create sees the first");
    assert_eq!(lost.revision, 53);
    match &lost.responses[..] {
        [OpResponse::Get(g)] => {
            assert_eq!(g.kvs[0].value, b"a");
            assert_eq!(g.kvs[0].mod_revision, 53);
        }
        other => panic!("expected one get, got {other:?}"),
    }
    assert_eq!(results[N + 2], Err(StoreError::LeaseNotFound(999)));
    assert_eq!(results[N + 3].as_ref().unwrap().revision, 54);

    // Watchers get one message per revision, in order, as with single commits.
    for rev in 3..=54i64 {
        let evs = events(next_msg(&mut w).await);
        assert!(evs.iter().all(|e| e.kv().mod_revision == rev), "revision {rev}: {evs:?}");
        let want = if rev < 53 { 2 } else { 1 };
        assert_eq!(evs.len(), want, "revision {rev}");
    }
    drop(w);
    drop(s);

    // The file holds the same history.
    let s = EmbeddedStore::open(&path, EmbeddedOptions::default()).await.unwrap();
    assert_eq!(value(&s, "counter").await, Some(N.to_string().into_bytes()));
    let r = s.get(GetRequest::prefix("own/")).await.unwrap();
    assert_eq!((r.count, r.revision), (N as i64, 54));
    let at = s.get(GetRequest::key("counter").at_revision(20)).await.unwrap();
    assert_eq!(at.kvs[0].value, b"18", "history at every revision of the group");
}

/// Leases expire between the txns of one group exactly as between single txns: a txn queued
/// after the deadline finds the lease gone, one queued before it does not.
#[tokio::test(start_paused = true)]
async fn lease_expiry_falls_between_txns_of_one_group() {
    let dir = tempfile::tempdir().unwrap();
    let s = EmbeddedStore::open(dir.path().join("store.redb"), opts()).await.unwrap();
    let lease = s.lease_grant(10).await.unwrap();
    s.txn(TxnRequest::new().and_then([TxnOp::put_on_lease("k", "1", lease.id)])).await.unwrap(); // 2
    let mut w = s.watch(KeyRange::prefix(""), 3).await.unwrap();

    // Two queued txns, the second read the clock after the lease's deadline.
    let now = Instant::now();
    let (early, _) = Job::for_test(
        TxnRequest::new().and_then([TxnOp::put_on_lease("a", "1", lease.id)]),
        now + Duration::from_secs(1),
    );
    let (late, _) = Job::for_test(
        TxnRequest::new().and_then([TxnOp::put_on_lease("b", "1", lease.id)]),
        now + Duration::from_secs(11),
    );
    let before = file_commits(&s);
    let (results, moved) = s.inner.lock().apply_group(&[early, late], opts().auto_compact_keep);
    assert!(moved, "the expiry moved the next deadline");
    assert_eq!(file_commits(&s) - before, 1);
    let mut results = results.into_iter();
    assert_eq!(results.next().unwrap().unwrap().revision, 3, "queued before the deadline");
    assert_eq!(results.next().unwrap(), Err(StoreError::LeaseNotFound(lease.id)));

    let put_a = events(next_msg(&mut w).await);
    assert!(matches!(&put_a[..], [WatchEvent::Put(kv)] if kv.key == b"a" && kv.mod_revision == 3));
    let expiry = events(next_msg(&mut w).await);
    let deleted: Vec<&[u8]> = expiry.iter().map(|e| &e.kv().key[..]).collect();
    assert_eq!(deleted, vec![&b"a"[..], &b"k"[..]], "the expiry deletes both, at revision 4");
    assert!(expiry.iter().all(|e| matches!(e, WatchEvent::Delete(kv) if kv.mod_revision == 4)));
    assert_eq!(s.get(GetRequest::prefix("")).await.unwrap().revision, 4);
}

// ----- read-only file -----

/// A file opened read-only serves every read (get, list at a past revision, watch replay, a txn
/// whose taken branch only reads) and refuses every write with `ReadOnly` naming the file,
/// before anything changes.
#[tokio::test]
async fn read_only_file_serves_reads_and_refuses_writes_naming_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("store.redb");
    {
        let s = EmbeddedStore::open(&path, opts()).await.unwrap();
        s.txn(put("a", "1")).await.unwrap(); // 2
        s.txn(put("b", "2")).await.unwrap(); // 3
        s.lease_grant(3600).await.unwrap();
    }
    let ro = EmbeddedOptions { read_only: true, ..opts() };
    let s = EmbeddedStore::open(&path, ro).await.unwrap();
    assert_eq!(value(&s, "a").await, Some(b"1".to_vec()));
    let r = s.get(GetRequest::prefix("")).await.unwrap();
    assert_eq!((r.count, r.revision), (2, 3));
    let old = s.get(GetRequest::prefix("").at_revision(2)).await.unwrap();
    assert_eq!(old.count, 1, "history is readable");
    let mut w = s.watch(KeyRange::prefix(""), 2).await.unwrap();
    assert_eq!(events(next_msg(&mut w).await).len(), 2, "watch replays history");
    let only_reads = TxnRequest::new()
        .when([Compare::absent("a")])
        .and_then([TxnOp::put("a", "x")])
        .or_else([TxnOp::get_key("a")]);
    let resp = s.txn(only_reads).await.unwrap();
    assert!(!resp.succeeded, "a txn whose taken branch only reads is served");

    let refused = |r: StoreError| match r {
        StoreError::ReadOnly { path: p, reason } => {
            assert_eq!(p, path.display().to_string());
            assert!(reason.contains("read-only"), "{reason}");
            let shown = StoreError::ReadOnly { path: p, reason }.to_string();
            assert!(shown.contains(&path.display().to_string()), "{shown}");
        }
        other => panic!("expected ReadOnly, got {other:?}"),
    };
    refused(s.txn(put("c", "3")).await.unwrap_err());
    refused(s.txn(TxnRequest::new().and_then([TxnOp::delete("a")])).await.unwrap_err());
    refused(s.lease_grant(10).await.unwrap_err());
    refused(s.lease_keep_alive(1).await.unwrap_err());
    refused(s.lease_revoke(1).await.unwrap_err());
    refused(s.compact(2).await.unwrap_err());
    // Still serving after refusals, nothing changed.
    let r = s.get(GetRequest::prefix("")).await.unwrap();
    assert_eq!((r.count, r.revision), (2, 3));
    drop(w);
    drop(s);
    let s = EmbeddedStore::open(&path, opts()).await.unwrap();
    assert_eq!(s.get(GetRequest::prefix("")).await.unwrap().revision, 3, "file unchanged");
    assert_eq!(s.lease_keep_alive(1).await.unwrap(), Some(3600), "lease kept");
    s.txn(put("c", "3")).await.unwrap();
}

#[tokio::test]
async fn read_only_open_of_a_missing_file_fails_without_creating_it() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("none.redb");
    let ro = EmbeddedOptions { read_only: true, ..opts() };
    assert!(
        matches!(EmbeddedStore::open(&path, ro).await, Err(StoreError::Unavailable(m)) if m.contains("none.redb"))
    );
    assert!(!path.exists());
}

// ----- the file as the state -----

/// A file store reads keys on demand: between operations it holds no key, history or lease
/// attachment in memory, and an open reads none (with format 1 the open loaded every row, so
/// this held 2,000 keys and their log after the reopen).
#[tokio::test]
async fn file_store_holds_no_keys_in_memory_between_operations() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("store.redb");
    {
        let s = EmbeddedStore::open(&path, opts()).await.unwrap();
        let lease = s.lease_grant(3600).await.unwrap();
        for chunk in 0..20 {
            let ops = (0..100)
                .map(|i| TxnOp::put_on_lease(format!("k/{:05}", chunk * 100 + i), "v", lease.id));
            s.txn(TxnRequest::new().and_then(ops)).await.unwrap();
        }
        assert_eq!(s.inner.lock().mvcc.overlay_len(), 0, "written back at each commit");
    }
    let s = EmbeddedStore::open(&path, opts()).await.unwrap();
    assert_eq!(s.inner.lock().mvcc.overlay_len(), 0, "the open read no key");
    assert_eq!(value(&s, "k/01234").await.as_deref(), Some(&b"v"[..]));
    s.txn(put("k/00007", "w")).await.unwrap();
    let r = s.get(GetRequest::prefix("k/").count_only()).await.unwrap();
    assert_eq!(r.count, 2000);
    assert_eq!(s.inner.lock().mvcc.overlay_len(), 0);
    // The memory store is its overlay: everything stays.
    let m = EmbeddedStore::memory();
    m.txn(put("a", "1")).await.unwrap();
    assert!(m.inner.lock().mvcc.overlay_len() > 0);
}

/// Lease revocation finds the lease's keys in the file (not in memory), also after a reopen and
/// after keys moved to another lease or were deleted.
#[tokio::test]
async fn revoking_a_lease_after_reopen_deletes_exactly_its_keys() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("store.redb");
    let (l1, l2);
    {
        let s = EmbeddedStore::open(&path, opts()).await.unwrap();
        l1 = s.lease_grant(3600).await.unwrap().id;
        l2 = s.lease_grant(3600).await.unwrap().id;
        let ops = ["a", "b", "c", "d"].map(|k| TxnOp::put_on_lease(k, "1", l1));
        s.txn(TxnRequest::new().and_then(ops)).await.unwrap();
        s.txn(TxnRequest::new().and_then([TxnOp::put_on_lease("b", "2", l2)])).await.unwrap();
        s.txn(TxnRequest::new().and_then([TxnOp::put("c", "plain")])).await.unwrap();
        s.txn(TxnRequest::new().and_then([TxnOp::delete("d")])).await.unwrap();
    }
    let s = EmbeddedStore::open(&path, opts()).await.unwrap();
    let before = s.get(GetRequest::key("x")).await.unwrap().revision;
    assert!(s.lease_revoke(l1).await.unwrap());
    assert_eq!(value(&s, "a").await, None);
    assert_eq!(value(&s, "b").await.as_deref(), Some(&b"2"[..]), "moved to l2");
    assert_eq!(value(&s, "c").await.as_deref(), Some(&b"plain"[..]), "detached by a plain put");
    assert_eq!(s.get(GetRequest::key("x")).await.unwrap().revision, before + 1, "one revision");
    drop(s);
    let s = EmbeddedStore::open(&path, opts()).await.unwrap();
    assert!(s.lease_revoke(l2).await.unwrap());
    assert_eq!(value(&s, "b").await, None);
    assert_eq!(value(&s, "c").await.as_deref(), Some(&b"plain"[..]));
}

/// A file written by format 1 (one `entries` table, loaded whole at open) opens: migrated on a
/// writable open, read into memory on a read-only one, with the same keys, history and leases.
#[tokio::test]
async fn format_1_file_opens_migrated_with_keys_history_and_leases() {
    use super::mvcc::{Meta, Record, NEVER_COMPACTED as NEVER};
    let dir = tempfile::tempdir().unwrap();
    let rec = |value: &str, create, version, lease| Record {
        value: value.as_bytes().to_vec(),
        create_revision: create,
        version,
        lease,
    };
    let entries = [
        ("a", 2, 0, Some(rec("1", 2, 1, 0))),
        ("a", 3, 0, Some(rec("2", 2, 2, 0))),
        ("b", 4, 0, Some(rec("on lease", 4, 1, 1))),
        ("c", 5, 0, Some(rec("x", 5, 1, 0))),
        ("c", 6, 0, None),
        ("orphan", 6, 1, Some(rec("o", 6, 1, 9))),
    ];
    let meta = Meta { revision: 6, compact_revision: NEVER, next_lease: 2 };
    let far = file::unix_ms_now() + 3_600_000;
    let old = dir.path().join("v1.redb");
    file::write_v1_file(&old, meta, &entries, &[(1, 3600, far)]).unwrap();
    let copy = dir.path().join("v1-read-only.redb");
    std::fs::copy(&old, &copy).unwrap();

    let check = |s: EmbeddedStore| async move {
        let a = s.get(GetRequest::key("a")).await.unwrap();
        assert_eq!(a.revision, 6);
        let kv = &a.kvs[0];
        assert_eq!(
            (kv.value.as_slice(), kv.create_revision, kv.mod_revision, kv.version),
            (&b"2"[..], 2, 3, 2)
        );
        let at2 = s.get(GetRequest::key("a").at_revision(2)).await.unwrap();
        assert_eq!(at2.kvs[0].value, b"1");
        assert_eq!(value(&s, "c").await, None);
        assert_eq!(s.get(GetRequest::key("orphan")).await.unwrap().kvs[0].lease, 9);
        let mut w = s.watch(KeyRange::from_key("a"), 3).await.unwrap();
        let revs: Vec<i64> =
            events(next_msg(&mut w).await).iter().map(|e| e.kv().mod_revision).collect();
        assert_eq!(revs, vec![3, 4, 5, 6, 6]);
        s
    };
    let s = check(EmbeddedStore::open(&old, opts()).await.unwrap()).await;
    assert!(s.lease_revoke(1).await.unwrap());
    assert_eq!(value(&s, "b").await, None, "the lease's key went with it");
    assert!(value(&s, "orphan").await.is_some(), "a key on a missing lease stays");
    drop(s);
    let tables = file::table_names(&old).unwrap();
    assert!(tables.contains(&"kv".to_string()), "{tables:?}");
    assert!(!tables.contains(&"entries".to_string()), "{tables:?}");
    let s = EmbeddedStore::open(&old, opts()).await.unwrap();
    assert_eq!(value(&s, "a").await.as_deref(), Some(&b"2"[..]), "reopens as format 2");

    let ro = EmbeddedOptions { read_only: true, ..opts() };
    let s = check(EmbeddedStore::open(&copy, ro).await.unwrap()).await;
    assert!(matches!(s.txn(put("z", "1")).await, Err(StoreError::ReadOnly { .. })));
    drop(s);
    assert!(file::table_names(&copy).unwrap().contains(&"entries".to_string()), "untouched");
}

/// redb's O(file) integrity check runs at open only when the file was not closed cleanly or
/// when asked (with format 1 every writable open ran it).
#[tokio::test]
async fn integrity_check_runs_only_after_an_unclean_close_or_when_asked() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("store.redb");
    let unclean = dir.path().join("unclean.redb");
    {
        let s = EmbeddedStore::open(&path, opts()).await.unwrap();
        s.txn(put("a", "1")).await.unwrap();
        // A copy taken while the file is open is a file whose writer never closed it.
        std::fs::copy(&path, &unclean).unwrap();
    }
    let open =
        |p: &std::path::Path, check: bool| match file::FileStore::open_blocking(p, false, check) {
            Ok((f, _)) => f,
            Err(_) => panic!("{} should open", p.display()),
        };
    assert!(!open(&path, false).checked(), "closed cleanly: not checked");
    assert!(open(&path, true).checked(), "asked: checked");
    assert!(open(&unclean, false).checked(), "not closed cleanly: checked");
    let s = EmbeddedStore::open(&unclean, opts()).await.unwrap();
    assert_eq!(value(&s, "a").await.as_deref(), Some(&b"1"[..]));
}
