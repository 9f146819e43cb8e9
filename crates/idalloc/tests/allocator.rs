//! The allocator against the embedded memory store, on tokio's paused clock: the tests that need
//! time to jump (reuse delays, idle grace, TTLs of minutes), faults injected by the fault store, or
//! the embedded store's own internals. Paused time works only on the embedded store (etcd expires
//! leases on its own wall clock), so these cannot run on etcd. The core set that can runs on every
//! backend (memory, file, etcd) from one source: `tests/allocator_backends.rs`.
//! Round-trip budgets (DESIGN §5) are asserted exactly with the counting store.
//! DESIGN §2 (G1–G6), §5 (round trips), §7 (recovery), §8 (reclaim): see the guarantee map in lib.rs.

mod common;

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use common::*;
use idalloc::store::embedded::EmbeddedStore;
use idalloc::store::{GetRequest, KeyRange, Store, TxnOp, TxnRequest};
use idalloc::{Error, Event, Input, PoolSpec, Strategy};
use idalloc_testkit::counting::CountingStore;
use idalloc_testkit::fault::{FaultConfig, FaultStore};

#[tokio::test(start_paused = true)]
async fn round_trip_budgets_are_exact() {
    let counted = Arc::new(CountingStore::new(EmbeddedStore::memory()));
    let a = allocator(counted.clone(), "a");
    let b = allocator(counted.clone(), "b");

    counted.reset();
    a.init_pool(&PoolSpec::new("p", 1, 1000)).await.expect("init");
    assert_eq!(counted.counts().total(), 1, "init_pool: 1 round trip");

    let pa = a.pool("p").await.expect("pool a");
    let pb = b.pool("p").await.expect("pool b");
    pa.wait_synced().await.expect("sync a");
    pb.wait_synced().await.expect("sync b");
    // Warm the sessions (the first leased acquire grants the session lease).
    pa.acquire("warm-a").await.expect("warm a");
    pb.acquire("warm-b").await.expect("warm b");

    counted.reset();
    let x = pa.acquire("x").await.expect("acquire new");
    assert!(x.new);
    assert_eq!(counted.counts().total(), 1, "acquire of a new key: 1 round trip");

    counted.reset();
    assert_eq!(pa.acquire("x").await.expect("re-acquire").id, x.id);
    assert_eq!(counted.counts().total(), 0, "re-acquire by the same process: 0 round trips");

    wait_until(|| pb.get("x") == Some(x.id)).await;
    counted.reset();
    let bx = pb.acquire("x").await.expect("acquire bound elsewhere");
    assert_eq!(bx.id, x.id);
    assert!(!bx.new);
    assert_eq!(counted.counts().total(), 1, "acquire of a key bound elsewhere: 1 round trip");

    counted.reset();
    assert_eq!(pa.get("x"), Some(x.id));
    assert_eq!(pa.key_of(x.id).as_deref(), Some("x"));
    assert_eq!(counted.counts().total(), 0, "get/key_of: 0 round trips");

    counted.reset();
    let r = pa.release("x").await.expect("release 1 of 2 local uses");
    assert!(r.held && !r.reclaimed);
    assert_eq!(
        counted.counts().total(),
        0,
        "release of a still-used local reference: 0 round trips"
    );
    let r = pa.release("x").await.expect("last local release");
    assert!(r.held && !r.reclaimed, "b still holds x");
    assert_eq!(counted.counts().total(), 1, "last local release: 1 round trip");

    counted.reset();
    let r = pb.release("x").await.expect("last release");
    assert!(r.held && r.reclaimed);
    assert_eq!(counted.counts().total(), 1, "last release reclaims in the same round trip");
    assert_eq!(raw_binding(&*counted, "p", "x").await, None);
}

/// A process's pools share one watch of the spec records: N pools followed take N watches of
/// their `id/` records and one more, not 2N (each etcd watch stream costs buffers and a watcher).
#[tokio::test(start_paused = true)]
async fn the_spec_records_of_every_pool_are_followed_by_one_watch() {
    let counted = Arc::new(CountingStore::new(EmbeddedStore::memory()));
    let a = allocator(counted.clone(), "a");
    for i in 0..5 {
        let p = a.ensure_pool(&PoolSpec::new(format!("p{i}"), 1, 10)).await.expect("pool");
        p.wait_synced().await.expect("synced");
    }
    tokio::time::sleep(Duration::from_secs(1)).await;
    let b = allocator(counted.clone(), "b");
    counted.reset();
    for i in 0..5 {
        b.pool(&format!("p{i}")).await.expect("open").wait_synced().await.expect("synced");
    }
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(counted.counts().watch, 5 + 1, "{:?}", counted.counts());
}

#[tokio::test(start_paused = true)]
async fn concurrent_acquires_of_one_key_share_one_request() {
    let counted = Arc::new(CountingStore::new(EmbeddedStore::memory()));
    let a = allocator(counted.clone(), "a");
    let p = a.ensure_pool(&PoolSpec::new("p", 1, 100)).await.expect("pool");
    p.wait_synced().await.expect("sync");
    p.acquire("warm").await.expect("warm");
    counted.reset();
    let results = futures::future::join_all((0..20).map(|_| p.acquire("shared"))).await;
    let ids: HashSet<u64> = results.into_iter().map(|r| r.expect("acquire").id).collect();
    assert_eq!(ids.len(), 1);
    assert_eq!(counted.counts().txn, 1, "20 concurrent acquires, one txn");
    assert_eq!(p.held().into_iter().find(|(k, _, _)| k == "shared").map(|(_, _, c)| c), Some(20));
}

#[tokio::test(start_paused = true)]
async fn cilium_pool_of_n_takes_exactly_n_keys_then_exhausted() {
    let store = Arc::new(EmbeddedStore::memory());
    let a = allocator(store.clone(), "a");
    let b = allocator(store.clone(), "b");
    let n = 50u64;
    let spec = PoolSpec::new("p", 1, n).prefix(0x1_0000).strategy(Strategy::Random);
    let pa = a.ensure_pool(&spec).await.expect("pool");
    let mut ids = HashMap::new();
    for i in 0..n {
        let key = format!("k{i}");
        let got = pa.acquire(&key).await.expect("acquire");
        assert!(got.new, "{key} is new");
        assert_eq!(got.id & 0xffff_0000, 0x1_0000, "prefix bits in {:#x}", got.id);
        let raw = got.id & 0xffff;
        assert!((1..=n).contains(&raw), "raw id {raw} in range");
        ids.insert(key, got.id);
    }
    let distinct: HashSet<u64> = ids.values().copied().collect();
    assert_eq!(distinct.len(), n as usize);
    match pa.acquire("one-too-many").await {
        Err(Error::Exhausted { pool, min, max, .. }) => {
            assert_eq!((pool.as_str(), min, max), ("p", 1, n))
        }
        other => panic!("expected Exhausted, got {other:?}"),
    }

    let pb = b.pool("p").await.expect("pool b");
    pb.wait_synced().await.expect("sync");
    for (key, id) in &ids {
        let got = pb.acquire(key).await.expect("acquire from b");
        assert_eq!(got.id, *id);
        assert!(!got.new);
    }
    // Releasing from one holder keeps the binding; from all, reclaims it.
    let r = pa.release("k0").await.expect("release a");
    assert!(!r.reclaimed);
    assert_eq!(raw_binding(&*store, "p", "k0").await, Some(ids["k0"]));
    let r = pb.release("k0").await.expect("release b");
    assert!(r.reclaimed);
    assert_eq!(raw_binding(&*store, "p", "k0").await, None);
    // The pool recovers from exhaustion once something is released.
    wait_until(|| pa.get("k0").is_none()).await;
    let got = pa.acquire("one-too-many").await.expect("a free ID again");
    assert_eq!(got.id, ids["k0"]);
    check_g1(&*store, "p").await;
}

#[tokio::test(start_paused = true)]
async fn contiv_init_pool_get_or_allocate_release() {
    let store = Arc::new(EmbeddedStore::memory());
    let a = allocator(store.clone(), "a");
    let spec =
        PoolSpec::new("vrf", 1, 20).reserve(5..=7).reserve(10..=10).strategy(Strategy::Lowest);
    a.init_pool(&spec).await.expect("init");
    a.init_pool(&spec).await.expect("equal spec again is fine");
    match a.init_pool(&PoolSpec::new("vrf", 1, 21)).await {
        Err(Error::RangeMismatch { pool, existing, requested }) => {
            assert_eq!(pool, "vrf");
            assert_eq!(*existing, spec);
            assert_eq!(requested.max(), 21);
        }
        other => panic!("expected RangeMismatch, got {other:?}"),
    }
    assert!(matches!(
        a.init_pool(&PoolSpec::new("vrf", 1, 20).reserve(5..=7)).await,
        Err(Error::RangeMismatch { .. })
    ));
    assert!(matches!(a.pool("nope").await, Err(Error::PoolNotFound { pool }) if pool == "nope"));

    let p = a.pool("vrf").await.expect("pool");
    let mut got = Vec::new();
    for i in 0..16 {
        let id = p.acquire_durable(&format!("t{i}"), "contiv").await.expect("get or allocate").id;
        // Stable per label.
        assert_eq!(p.acquire_durable(&format!("t{i}"), "contiv").await.expect("again").id, id);
        got.push(id);
    }
    let reserved = [5, 6, 7, 10];
    assert!(got.iter().all(|id| !reserved.contains(id)), "reserved IDs handed out: {got:?}");
    assert_eq!(
        got,
        vec![1, 2, 3, 4, 8, 9, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20],
        "lowest strategy"
    );
    assert!(matches!(p.acquire_durable("t16", "contiv").await, Err(Error::Exhausted { .. })));

    let r = p.release_durable("unknown-label", "contiv").await.expect("no-op");
    assert!(!r.held);
    let r = p.release_durable("t3", "someone-else").await.expect("no-op");
    assert!(!r.held && !r.reclaimed);
    assert_eq!(raw_binding(&*store, "vrf", "t3").await, Some(got[3]));
    let r = p.release_durable("t3", "contiv").await.expect("release");
    assert!(r.held && r.reclaimed);
    let r = p.release("never-held").await.expect("leased no-op");
    assert!(!r.held);
    // Contiv's ReleaseID on a pool that does not exist is a no-op too.
    let r = a.release_durable("no-such-pool", "t0", "contiv").await.expect("unknown pool no-op");
    assert!(!r.held && !r.reclaimed);
    assert!(matches!(
        a.release_durable("Bad Pool", "t0", "contiv").await,
        Err(Error::InvalidInput { .. })
    ));
}

#[tokio::test(start_paused = true)]
async fn bad_input_is_invalid_input_naming_value_and_rule() {
    let store = Arc::new(EmbeddedStore::memory());
    let a = allocator(store.clone(), "a");
    let p = a.ensure_pool(&PoolSpec::new("p", 1, 10)).await.expect("pool");
    let long = "x".repeat(4097);
    for (key, needle) in [("", "empty"), (long.as_str(), "4097")] {
        match p.acquire(key).await {
            Err(e @ Error::InvalidInput { input: Input::Key, .. }) => {
                let msg = e.to_string();
                assert!(msg.contains("4096"), "rule in {msg}");
                assert!(msg.contains(needle) || key.is_empty(), "value in {msg}");
            }
            other => {
                panic!("expected InvalidInput for {:?}, got {other:?}", &key[..key.len().min(8)])
            }
        }
    }
    for (spec, needle, kind) in [
        (PoolSpec::new("Bad Name", 1, 10), "Bad Name", Input::PoolName),
        (PoolSpec::new("p2", 10, 5), "10", Input::Spec),
        (PoolSpec::new("p3", 0, 5), "0", Input::Spec),
        (PoolSpec::new("p4", 1, 10).reserve(11..=11), "11", Input::Spec),
        (PoolSpec::new("p5", 1, 255).prefix(0x80), "0x80", Input::Spec),
    ] {
        match a.init_pool(&spec).await {
            Err(e @ Error::InvalidInput { input, .. }) if input == kind => {
                let msg = e.to_string();
                assert!(msg.contains(needle), "{needle} in {msg}");
            }
            other => panic!("expected InvalidInput for {spec:?}, got {other:?}"),
        }
    }
    // A holder name is its own input kind; deleting a pool that still has bindings is refused as
    // the pool's state standing in the way (PoolInUse: exit 1 in the CLI, 409 in the service), not
    // as a malformed call.
    let r = p.acquire_durable("k", "").await;
    assert!(matches!(r, Err(Error::InvalidInput { input: Input::Holder, .. })), "{r:?}");
    p.acquire("k").await.expect("acquire");
    let r = a.delete_pool("p", false).await;
    assert!(matches!(r, Err(Error::InvalidInput { input: Input::PoolInUse, .. })), "{r:?}");
    // Nothing half-written: none of the rejected pools exists.
    let names: Vec<String> =
        a.list_pools().await.expect("list").iter().map(|s| s.name().to_string()).collect();
    assert_eq!(names, vec!["p".to_string()]);
}

#[tokio::test(start_paused = true)]
async fn awkward_keys_round_trip_exactly() {
    let store = Arc::new(EmbeddedStore::memory());
    let a = allocator(store.clone(), "a");
    let b = allocator(store.clone(), "b");
    let p = a.ensure_pool(&PoolSpec::new("p", 1, 100)).await.expect("pool");
    let pb = b.pool("p").await.expect("pool b");
    let keys = ["a/b", "a", "a%2Fb", "with space", "ünïcödé ☃", "ctl\u{1}\u{7f}\n", "%", "/", "a/"];
    let mut ids = BTreeMap::new();
    for k in keys {
        ids.insert(k, p.acquire(k).await.expect("acquire").id);
    }
    let distinct: HashSet<u64> = ids.values().copied().collect();
    assert_eq!(distinct.len(), keys.len(), "every key has its own ID");
    pb.wait_synced().await.expect("sync");
    for k in keys {
        wait_until(|| pb.key_of(ids[k]).as_deref() == Some(k)).await;
        assert_eq!(pb.get(k), Some(ids[k]));
        assert_eq!(pb.key_of_consistent(ids[k]).await.expect("read").as_deref(), Some(k));
    }
    // Releasing "a" must not be blocked by a reference of "a/b" (prefixes never overlap).
    let r = p.release("a").await.expect("release a");
    assert!(r.reclaimed);
    check_g1(&*store, "p").await;
}

#[tokio::test(start_paused = true)]
async fn many_allocators_overlapping_keys_agree() {
    let store = Arc::new(EmbeddedStore::memory());
    let spec = PoolSpec::new("p", 1, 10_000);
    let setup = allocator(store.clone(), "setup");
    setup.init_pool(&spec).await.expect("init");
    let mut tasks = Vec::new();
    for n in 0..16u64 {
        let store = store.clone();
        tasks.push(tokio::spawn(async move {
            let a = allocator(store, &format!("node{n}"));
            let p = a.pool("p").await.expect("pool");
            let mut got = HashMap::new();
            // Heavy overlap: every node takes 1000 keys out of 1500, in its own order.
            for i in 0..1000u64 {
                let key = format!("k{}", (i * 7 + n * 97) % 1500);
                let id = p.acquire(&key).await.expect("acquire").id;
                if let Some(prev) = got.insert(key.clone(), id) {
                    assert_eq!(prev, id, "G2: {key} changed ID while held");
                }
            }
            // Still held: every key keeps its ID.
            for (key, id) in &got {
                assert_eq!(p.get(key), Some(*id));
            }
            (a, got)
        }));
    }
    let mut all: HashMap<String, u64> = HashMap::new();
    let mut allocs = Vec::new();
    for t in tasks {
        let (a, got) = t.await.expect("task");
        for (k, id) in got {
            if let Some(prev) = all.insert(k.clone(), id) {
                assert_eq!(prev, id, "nodes disagree on {k}");
            }
        }
        allocs.push(a);
    }
    let ids: HashSet<u64> = all.values().copied().collect();
    assert_eq!(ids.len(), all.len(), "G1: no ID shared by two keys");
    check_g1(&*store, "p").await;
    for a in allocs {
        a.close().await.expect("close");
    }
    let report = setup.pool("p").await.expect("pool").sweep().await.expect("sweep");
    assert_eq!(report.reclaimed.len(), all.len(), "closing revokes every leased reference");
    assert_only_specs_left(&*store).await;
}

#[tokio::test(start_paused = true)]
async fn crash_then_ttl_then_sweep_then_reuse_delay() {
    let store = Arc::new(EmbeddedStore::memory());
    let spec = PoolSpec::new("p", 1, 1).reuse_delay(Duration::from_secs(60));
    let crashing = allocator(store.clone(), "crashing");
    let id =
        crashing.ensure_pool(&spec).await.expect("pool").acquire("k").await.expect("acquire").id;
    drop(crashing); // no close(): behaves like a crash

    let survivor = allocator(store.clone(), "survivor");
    let p = survivor.pool("p").await.expect("pool");
    // Within the TTL the dead process's reference is still there.
    assert!(p.sweep().await.expect("sweep").reclaimed.is_empty());
    tokio::time::sleep(SESSION_TTL + Duration::from_secs(2)).await;
    let report = p.sweep().await.expect("sweep");
    assert_eq!(report.reclaimed, vec![(id, "k".to_string())]);
    // The only ID is in quarantine: another key cannot have it yet.
    assert!(matches!(p.acquire("other").await, Err(Error::Exhausted { .. })));
    tokio::time::sleep(Duration::from_secs(30)).await;
    assert!(
        matches!(p.acquire("other").await, Err(Error::Exhausted { .. })),
        "still within reuse_delay"
    );
    tokio::time::sleep(Duration::from_secs(45)).await;
    wait_until(|| p.key_of(id).is_none() && p.snapshot().is_empty()).await;
    let got = p.acquire("other").await.expect("usable after reuse_delay");
    assert_eq!(got.id, id);
}

#[tokio::test(start_paused = true)]
async fn idle_grace_keeps_the_id_for_a_returning_key_then_sweeps() {
    let store = Arc::new(EmbeddedStore::memory());
    let spec = PoolSpec::new("p", 1, 1000).idle_grace(Duration::from_secs(30));
    let a = allocator(store.clone(), "a");
    let p = a.ensure_pool(&spec).await.expect("pool");
    let id = p.acquire("k").await.expect("acquire").id;
    let r = p.release("k").await.expect("release");
    assert!(r.held && !r.reclaimed, "idle grace keeps the binding");
    assert_eq!(p.sweep().await.expect("sweep").reclaimed.len(), 0);
    tokio::time::sleep(Duration::from_secs(10)).await;
    assert_eq!(p.acquire("k").await.expect("back in time").id, id);
    p.release("k").await.expect("release again");
    // The grace restarts at the last release (the release rewrote the key record, so the sweeper's
    // first sighting of this idle period is now).
    assert_eq!(p.sweep().await.expect("sweep").idle, 1);
    tokio::time::sleep(Duration::from_secs(25)).await;
    let report = p.sweep().await.expect("sweep");
    assert!(report.reclaimed.is_empty());
    assert_eq!(report.idle, 1);
    tokio::time::sleep(Duration::from_secs(10)).await;
    assert_eq!(p.sweep().await.expect("sweep").reclaimed, vec![(id, "k".to_string())]);
    assert_only_specs_left(&*store).await;
}

#[tokio::test(start_paused = true)]
async fn lost_session_lease_is_replaced_and_keys_keep_their_ids() {
    let store = Arc::new(EmbeddedStore::memory());
    let a = allocator(store.clone(), "a");
    let p = a.ensure_pool(&PoolSpec::new("p", 1, 1000)).await.expect("pool");
    let ids: Vec<u64> = futures::future::join_all((0..10).map(|i| {
        let p = p.clone();
        async move { p.acquire(&format!("k{i}")).await.expect("acquire").id }
    }))
    .await;
    let lease = a.session_lease().await.expect("session");
    assert!(store.lease_revoke(lease).await.expect("revoke behind its back"));
    // The keep-alive notices within TTL/3, grants a new lease and re-references every key.
    tokio::time::sleep(SESSION_TTL).await;
    for (i, id) in ids.iter().enumerate() {
        wait_until(|| p.get(&format!("k{i}")) == Some(*id)).await;
        assert_eq!(raw_binding(&*store, "p", &format!("k{i}")).await, Some(*id));
    }
    let new_lease = a.session_lease().await.expect("new session");
    assert_ne!(new_lease, lease);
    assert_eq!(count_refs(&*store, "p").await, 10);
}

#[tokio::test(start_paused = true)]
async fn lost_records_are_recreated_and_a_taken_id_is_a_conflict() {
    let store = Arc::new(EmbeddedStore::memory());
    let a = allocator(store.clone(), "a");
    let intruder = allocator(store.clone(), "intruder");
    let p = a.ensure_pool(&PoolSpec::new("p", 1, 100)).await.expect("pool");
    let mut events = p.events();
    let x = p.acquire("x").await.expect("x").id;
    let y = p.acquire("y").await.expect("y").id;

    // Data loss: x's records vanish. The holder re-creates them with the same ID.
    raw_delete_binding(&*store, "p", "x", x).await;
    wait_until_async(|| async { raw_binding(&*store, "p", "x").await == Some(x) }).await;

    // y's records vanish and another key grabs y's ID before the holder can react: simulate by
    // writing the intruder's binding in the same txn as the deletion.
    let l = layout();
    store
        .txn(TxnRequest::new().and_then([
            TxnOp::delete(l.key_key("p", "y")),
            TxnOp::put(l.id_key("p", y), idalloc::layout::IdRecord::Bound("z".into()).encode()),
            TxnOp::put(l.key_key("p", "z"), y.to_string()),
            TxnOp::put(l.ref_key("p", "z", "intruder"), y.to_string()),
        ]))
        .await
        .expect("raw write");
    let conflict = loop {
        match tokio::time::timeout(Duration::from_secs(30), events.recv()).await {
            Ok(Some(Event::Conflict { key, old_id, new_id })) => break (key, old_id, new_id),
            Ok(Some(_)) => continue,
            other => panic!("expected a Conflict event, got {other:?}"),
        }
    };
    assert_eq!(conflict.0, "y");
    assert_eq!(conflict.1, y);
    assert_ne!(conflict.2, y);
    wait_until(|| p.get("y") == Some(conflict.2)).await;
    assert_eq!(raw_binding(&*store, "p", "y").await, Some(conflict.2));
    assert_eq!(raw_binding(&*store, "p", "z").await, Some(y));
    check_g1(&*store, "p").await;
    drop(intruder);
}

#[tokio::test(start_paused = true)]
async fn compaction_while_behind_relists_and_cache_equals_store() {
    let store = Arc::new(EmbeddedStore::memory());
    // b reaches the store through a fault wrapper, so its watch can be cut off.
    let faulty =
        Arc::new(FaultStore::new(store.clone(), 7, FaultConfig::default()).expect("fault store"));
    let a = allocator(store.clone(), "a");
    let b = allocator(faulty.clone(), "b");
    let pa = a.ensure_pool(&PoolSpec::new("p", 1, 1000)).await.expect("pool");
    pa.acquire("before").await.expect("acquire");
    let pb = b.pool("p").await.expect("pool b");
    pb.wait_synced().await.expect("sync");
    wait_until(|| pb.get("before").is_some()).await;
    let mut events = pb.events();
    // A late subscriber first gets the cache's picture, then exactly one Synced.
    let before = pb.get("before").expect("seen");
    assert_eq!(events.try_recv(), Some(Event::Upsert { id: before, key: "before".into() }));
    assert_eq!(events.try_recv(), Some(Event::Synced));

    // b is cut off: its watch breaks and cannot resume. Meanwhile the pool changes and the store
    // compacts past everything b has seen.
    faulty.partition(true);
    tokio::time::sleep(Duration::from_millis(100)).await;
    for i in 0..50 {
        pa.acquire(&format!("k{i}")).await.expect("acquire");
    }
    for i in 0..25 {
        pa.release(&format!("k{i}")).await.expect("release");
    }
    pa.release("before").await.expect("release");
    let rev = store.get(GetRequest::key("anything")).await.expect("rev").revision;
    store.compact(rev).await.expect("compact");
    assert_eq!(pb.snapshot(), vec![(pb.get("before").expect("stale view"), "before".to_string())]);

    // Healed: b resumes from its old revision, is told it is compacted, re-lists, and reports the
    // difference as events.
    faulty.partition(false);
    wait_until(|| pb.snapshot().len() == 25).await;
    assert_eq!(pb.snapshot(), raw_bindings(&*store, "p").await);
    assert_eq!(pb.snapshot(), pa.snapshot());
    let mut upserts = 0;
    let mut deletes = 0;
    let mut synced = 0;
    while let Some(e) = events.try_recv() {
        match e {
            Event::Upsert { .. } => upserts += 1,
            Event::Delete { key, .. } => {
                assert_eq!(key, "before");
                deletes += 1;
            }
            Event::Synced => synced += 1,
            _ => {}
        }
    }
    assert_eq!((upserts, deletes), (25, 1), "the re-list reports exactly the difference");
    assert_eq!(synced, 1, "one re-list, one Synced");
}

#[tokio::test(start_paused = true)]
async fn events_report_upserts_deletes_and_lag() {
    let store = Arc::new(EmbeddedStore::memory());
    let a = allocator(store.clone(), "a");
    let p = a.ensure_pool(&PoolSpec::new("p", 1, 100)).await.expect("pool");
    p.wait_synced().await.expect("sync");
    let mut events = p.events();
    // The replay of an empty, listed pool: one Synced.
    assert_eq!(events.try_recv(), Some(Event::Synced));
    let id = p.acquire("k").await.expect("acquire").id;
    p.release("k").await.expect("release");
    let mut seen = Vec::new();
    while seen.len() < 2 {
        match tokio::time::timeout(Duration::from_secs(10), events.recv()).await {
            Ok(Some(e)) => seen.push(e),
            other => panic!("expected events, got {other:?}"),
        }
    }
    assert_eq!(
        seen,
        vec![Event::Upsert { id, key: "k".into() }, Event::Delete { id, key: "k".into() }]
    );
    // A subscriber that does not read is told it lagged; allocation went on regardless.
    let small = allocator_with(store.clone(), "small", |o| o.event_buffer = 4);
    let ps = small.pool("p").await.expect("pool");
    ps.wait_synced().await.expect("sync");
    let mut slow = ps.events();
    assert_eq!(slow.try_recv(), Some(Event::Synced));
    for i in 0..20 {
        p.acquire(&format!("e{i}")).await.expect("acquire");
    }
    wait_until(|| ps.snapshot().len() == 20).await;
    match slow.recv().await {
        Some(Event::Lagged { missed }) => assert!(missed >= 16, "missed {missed}"),
        other => panic!("expected Lagged, got {other:?}"),
    }
}

#[tokio::test(start_paused = true)]
async fn sweepers_in_many_processes_and_acquires_race_safely() {
    let store = Arc::new(EmbeddedStore::memory());
    let spec = PoolSpec::new("p", 1, 200);
    let setup = allocator(store.clone(), "setup");
    let ps = setup.ensure_pool(&spec).await.expect("pool");
    for i in 0..100 {
        ps.acquire_durable(&format!("k{i}"), "old-owner").await.expect("seed");
    }
    // Drop the durable references behind the allocator's back: 100 orphans.
    store
        .txn(
            TxnRequest::new()
                .and_then([TxnOp::delete_range(KeyRange::prefix(layout().refs_prefix("p")))]),
        )
        .await
        .expect("raw delete refs");
    let mut tasks = Vec::new();
    for n in 0..4 {
        let store = store.clone();
        tasks.push(tokio::spawn(async move {
            let a = allocator(store, &format!("s{n}"));
            let p = a.pool("p").await.expect("pool");
            let mut held = HashMap::new();
            for round in 0..5 {
                let _ = p.sweep().await.expect("sweep");
                let key = format!("k{}", n * 20 + round);
                held.insert(key.clone(), p.acquire(&key).await.expect("acquire").id);
            }
            for (k, id) in &held {
                assert_eq!(p.get(k), Some(*id), "held key kept its ID");
            }
            (a, held)
        }));
    }
    let mut keep = Vec::new();
    for t in tasks {
        let (a, held) = t.await.expect("task");
        for (k, id) in &held {
            assert_eq!(raw_binding(&*store, "p", k).await, Some(*id), "{k} survived the sweepers");
        }
        keep.push(a);
    }
    check_g1(&*store, "p").await;
    let _ = ps.sweep().await.expect("final sweep");
    assert_eq!(raw_bindings(&*store, "p").await.len(), 20, "only the 20 held keys remain");
}

#[tokio::test(start_paused = true)]
async fn huge_range_works() {
    let store = Arc::new(EmbeddedStore::memory());
    let a = allocator(store.clone(), "a");
    let p = a.ensure_pool(&PoolSpec::new("p", 1, (1 << 32) - 1)).await.expect("pool");
    let mut ids = HashSet::new();
    for i in 0..100 {
        let id = p.acquire(&format!("k{i}")).await.expect("acquire").id;
        assert!((1..(1u64 << 32)).contains(&id));
        ids.insert(id);
    }
    assert_eq!(ids.len(), 100);
}

/// Found by the simulation: a last release whose response was lost restored the local hold
/// although the store had already dropped the reference, so another key could take the ID while
/// the process still believed it held it. An unknown outcome now leaves the key released locally
/// and completes the release in the background.
#[tokio::test(start_paused = true)]
async fn regression_release_with_lost_response_is_completed_not_restored() {
    let store = Arc::new(EmbeddedStore::memory());
    let fault = Arc::new(FaultStore::new(store.clone(), 3, FaultConfig::default()).expect("fault"));
    let a = allocator_with(fault.clone(), "a", |o| o.retry.max_attempts = 1);
    let p = a.ensure_pool(&PoolSpec::new("p", 1, 10)).await.expect("pool");
    p.acquire("k").await.expect("acquire");

    fault.set_config(FaultConfig { lose_response: 1.0, ..FaultConfig::default() }).expect("config");
    match p.release("k").await {
        Err(Error::Unavailable { reason, retryable, .. }) => {
            assert!(retryable, "an unknown release outcome is worth retrying");
            assert!(reason.contains("background"), "{reason}")
        }
        other => panic!("expected Unavailable, got {other:?}"),
    }
    fault.set_config(FaultConfig::default()).expect("config");
    assert!(p.held().is_empty(), "the key is not held any more");
    // The release took effect (the response was lost, not the request), and the background
    // completion finds nothing left to do.
    wait_until_async(|| async { raw_binding(&*store, "p", "k").await.is_none() }).await;
    assert_eq!(count_refs(&*store, "p").await, 0);
    // A later acquire starts afresh.
    let again = p.acquire("k").await.expect("acquire again");
    assert!(again.new);
    assert!(p.get("k").is_some());
}

/// The other half of an unknown outcome: the release never reached the store. The background
/// completion sends it again, so the reference does not leak.
#[tokio::test(start_paused = true)]
async fn release_that_never_arrived_is_completed_in_the_background() {
    let store = Arc::new(EmbeddedStore::memory());
    let fault = Arc::new(FaultStore::new(store.clone(), 4, FaultConfig::default()).expect("fault"));
    let a = allocator_with(fault.clone(), "a", |o| o.retry.max_attempts = 1);
    let p = a.ensure_pool(&PoolSpec::new("p", 1, 10)).await.expect("pool");
    p.acquire("k").await.expect("acquire");
    fault.fail_next(1);
    assert!(matches!(p.release("k").await, Err(Error::Unavailable { .. })));
    wait_until_async(|| async { count_refs(&*store, "p").await == 0 }).await;
    assert_eq!(raw_binding(&*store, "p", "k").await, None, "reclaimed by the completed release");
}

/// `Pool::stamped_events` (the service's watch fan-out): every change with the revision
/// of its store write, the several changes of one txn at one revision, a `Through` after them;
/// `snapshot_at` gives the bindings at a revision boundary.
#[tokio::test]
async fn stamped_events_carry_revisions_and_mark_each_revisions_end() {
    let store = Arc::new(EmbeddedStore::memory());
    let a = allocator(store.clone(), "a");
    let p = a.ensure_pool(&PoolSpec::new("p", 1, 1000)).await.expect("pool");
    p.acquire_durable("first", "h").await.expect("acquire");
    p.wait_synced().await.expect("synced");
    wait_until(|| p.snapshot_at().is_some_and(|(b, _)| b.len() == 1)).await;
    let (bindings, at) = p.snapshot_at().expect("at a boundary");
    assert_eq!(bindings.iter().map(|(_, k)| k.as_str()).collect::<Vec<_>>(), ["first"]);
    let mut feed = p.stamped_events();
    assert_eq!((feed.revision, feed.complete), (at, true));
    // Three keys in one txn: one revision; then a release at a later one.
    let keys = ["x", "y", "z"];
    let got = p.acquire_many_durable(&keys, "h").await;
    assert!(got.iter().all(|r| r.is_ok()), "{got:?}");
    p.release_durable("first", "h").await.expect("release");
    let mut seen: Vec<idalloc::Stamped> = Vec::new();
    while !matches!(seen.last(), Some(idalloc::Stamped::Through { revision }) if *revision > at
        && seen.iter().any(|s| matches!(s, idalloc::Stamped::Event { event: idalloc::Event::Delete { .. }, .. })))
    {
        let next = tokio::time::timeout(Duration::from_secs(10), feed.recv()).await;
        seen.push(next.expect("a change in time").expect("open").expect("not lagged"));
    }
    let upserts: Vec<i64> = seen
        .iter()
        .filter_map(|s| match s {
            idalloc::Stamped::Event { revision, event: idalloc::Event::Upsert { .. } } => {
                Some(*revision)
            }
            _ => None,
        })
        .collect();
    assert_eq!(upserts.len(), 3, "{seen:?}");
    assert!(upserts.iter().all(|r| *r == upserts[0] && *r > at), "one txn, one revision: {seen:?}");
    let delete = seen.iter().position(|s| {
        matches!(s, idalloc::Stamped::Event { event: idalloc::Event::Delete { .. }, .. })
    });
    let delete = delete.expect("the release");
    let last_upsert = seen
        .iter()
        .rposition(|s| {
            matches!(s, idalloc::Stamped::Event { event: idalloc::Event::Upsert { .. }, .. })
        })
        .expect("upserts");
    // The txn's revision is closed by a Through before the release's change comes.
    assert!(
        seen[last_upsert..delete].iter().any(
            |s| matches!(s, idalloc::Stamped::Through { revision } if *revision >= upserts[0])
        ),
        "{seen:?}"
    );
    let (after, rev) = p.snapshot_at().expect("at a boundary after the Through");
    assert!(rev > upserts[0]);
    assert_eq!(after.len(), 3);
}

/// A re-listing reaches `Pool::stamped_events` as one message however many changes it has: a watch
/// cut off while 5,000 bindings were made, then compacted past, re-lists 5,000
/// changes, more than the subscriber's buffer (`event_buffer`, 4,096 messages). The subscriber
/// gets every one of them at the listing's revision and is not told it lagged. The old feed sent
/// one message per change: the subscriber lost messages, and the service's fan-out hub, which
/// starts over when it lags, cut every SSE subscriber with `lagged`.
#[tokio::test(start_paused = true)]
async fn a_big_relisting_is_one_stamped_message_and_does_not_lag_the_subscriber() {
    const N: usize = 5_000;
    let store = Arc::new(EmbeddedStore::memory());
    let faulty =
        Arc::new(FaultStore::new(store.clone(), 7, FaultConfig::default()).expect("fault store"));
    let a = allocator(store.clone(), "a");
    let b = allocator(faulty.clone(), "b");
    let pa = a.ensure_pool(&PoolSpec::new("p", 1, 10_000)).await.expect("pool");
    let pb = b.pool("p").await.expect("pool b");
    pb.wait_synced().await.expect("sync");
    let mut feed = pb.stamped_events();

    faulty.partition(true);
    tokio::time::sleep(Duration::from_millis(100)).await;
    let keys: Vec<String> = (0..N).map(|i| format!("k{i}")).collect();
    for chunk in keys.chunks(100) {
        let got = pa.acquire_many_durable(chunk, "h").await;
        assert!(got.iter().all(|r| r.is_ok()), "{got:?}");
    }
    let rev = store.get(GetRequest::key("anything")).await.expect("rev").revision;
    store.compact(rev).await.expect("compact");
    faulty.partition(false);

    let (mut listings, mut upserts, mut synced) = (0, 0, 0);
    loop {
        let next = tokio::time::timeout(Duration::from_secs(60), feed.recv()).await;
        let next = next.expect("the re-listing in time").expect("the feed is open");
        match next.unwrap_or_else(|missed| panic!("the subscriber lagged: {missed} messages lost"))
        {
            idalloc::Stamped::Listing { revision, events } => {
                assert!(revision >= rev, "listed at {revision}, before the last write {rev}");
                listings += 1;
                for e in events.iter() {
                    match e {
                        Event::Upsert { .. } => upserts += 1,
                        Event::Synced => synced += 1,
                        other => panic!("only new bindings were made: {other:?}"),
                    }
                }
            }
            idalloc::Stamped::Event { revision, event } => {
                panic!("the cut-off watch cannot report {event:?} at {revision}")
            }
            idalloc::Stamped::Through { revision } if revision >= rev => break,
            idalloc::Stamped::Through { .. } => {}
        }
    }
    assert_eq!((listings, upserts, synced), (1, N, 1), "one message: every change, one Synced");
    assert_eq!(pb.snapshot().len(), N);
}
