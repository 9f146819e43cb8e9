//! The allocator's core behaviour, written once and run on every backend: the in-memory store,
//! the file store and a real etcd (started by `scripts/test.sh`, or privately when run alone; each
//! test uses its own key prefix, so they share one etcd).
//!
//! Time: the embedded backends (memory, file) run on tokio's paused clock, so TTL waits are instant
//! and deterministic; etcd's leases expire in real time, which a paused clock cannot advance, so
//! on etcd the same tests run in real time with short TTLs. Tests that need the clock to jump
//! (reuse delays, idle grace, hours-long waits) cannot run on etcd: they stay embedded-only in
//! `tests/allocator.rs`. The backends and the macro that runs a test on each come from
//! `tests/common/backends.rs` (shared with `tests/batch.rs`).
//! DESIGN §2 (G1–G4 on every backend), §5 (round-trip budgets), §7 (recovery).

mod common;

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use common::backends::{allocator_on, env, on_backends, Backend};
use common::*;
use idalloc::layout::{IdRecord, Layout};
use idalloc::store::{Store, TxnOp, TxnRequest};
use idalloc::{Allocator, Error, Event, PoolSpec, Strategy};
use idalloc_testkit::counting::CountingStore;

const TTL: Duration = Duration::from_secs(3);

on_backends!(
    [Memory, File, Etcd, SecureEtcd],
    [
        round_trip_budgets_are_exact,
        cilium_and_contiv_behaviour,
        many_allocators_overlapping_keys_agree,
        lost_lease_lost_data_and_conflict,
        crashed_process_is_reclaimed_after_its_ttl,
        a_deleted_pool_ends_its_subscriptions_with_a_delete_per_binding,
        a_resize_grows_refuses_a_shrink_over_bound_ids_and_every_process_learns_it,
        the_grace_after_finalize_is_ended_by_the_store,
        a_resize_is_a_spec_event_for_the_subscribers_of_every_process,
        one_spec_watch_serves_every_pool_whenever_it_was_opened,
    ]
);

fn alloc(store: Arc<dyn Store>, l: &Layout, holder: &str) -> Allocator {
    allocator_on(store, l, holder, TTL)
}

async fn round_trip_budgets_are_exact(backend: Backend) {
    let Some(env) = env(backend).await else { return };
    let counted = Arc::new(CountingStore::new(env.store.clone()));
    let a = alloc(counted.clone(), &env.layout, "a");
    let b = alloc(counted.clone(), &env.layout, "b");
    counted.reset();
    a.init_pool(&PoolSpec::new("p", 1, 1000)).await.expect("init");
    assert_eq!(counted.counts().excluding_keep_alives(), 1, "init_pool");
    let pa = a.pool("p").await.expect("pool");
    let pb = b.pool("p").await.expect("pool");
    pa.acquire("warm-a").await.expect("warm");
    pb.acquire("warm-b").await.expect("warm");
    // The followers' and spec watch's first requests are sent in the background.
    counted.settle(Duration::from_millis(300)).await;

    counted.reset();
    let x = pa.acquire("x").await.expect("new key");
    assert!(x.new);
    assert_eq!(counted.counts().excluding_keep_alives(), 1, "new key");
    counted.reset();
    pa.acquire("x").await.expect("again");
    assert_eq!(counted.counts().excluding_keep_alives(), 0, "re-acquire");
    wait_until(|| pb.get("x") == Some(x.id)).await;
    counted.reset();
    let bx = pb.acquire("x").await.expect("bound elsewhere");
    assert_eq!((bx.id, bx.new), (x.id, false));
    assert_eq!(counted.counts().excluding_keep_alives(), 1, "key bound elsewhere");
    counted.reset();
    assert_eq!(pa.key_of(x.id).as_deref(), Some("x"));
    assert_eq!(counted.counts().excluding_keep_alives(), 0, "key_of");
    pa.release("x").await.expect("release");
    counted.reset();
    pa.release("x").await.expect("release");
    assert_eq!(counted.counts().excluding_keep_alives(), 1, "last local release");
    counted.reset();
    let r = pb.release("x").await.expect("release");
    assert!(r.reclaimed);
    assert_eq!(
        counted.counts().excluding_keep_alives(),
        1,
        "last release reclaims in one round trip"
    );
    assert_eq!(raw_binding_in(&*env.store, &env.layout, "p", "x").await, None);
}

async fn cilium_and_contiv_behaviour(backend: Backend) {
    let Some(env) = env(backend).await else { return };
    let (store, l) = (env.store.clone(), &env.layout);
    let a = alloc(store.clone(), l, "a");
    let b = alloc(store.clone(), l, "b");
    let n = 20;
    let spec = PoolSpec::new("p", 1, n).prefix(0x100).reserve(3..=4);
    a.init_pool(&spec).await.expect("init");
    a.init_pool(&spec).await.expect("equal again");
    assert!(matches!(
        a.init_pool(&PoolSpec::new("p", 1, n)).await,
        Err(Error::RangeMismatch { .. })
    ));
    let pa = a.pool("p").await.expect("pool");
    let mut ids = HashMap::new();
    for i in 0..n - 2 {
        let got = pa.acquire(&format!("k{i}")).await.expect("acquire");
        assert!(got.new);
        assert_eq!(got.id & 0x100, 0x100, "prefix in {:#x}", got.id);
        assert!(![3, 4].contains(&(got.id & 0xff)), "reserved {}", got.id);
        ids.insert(format!("k{i}"), got.id);
    }
    assert_eq!(ids.values().collect::<HashSet<_>>().len(), ids.len());
    assert!(matches!(pa.acquire("extra").await, Err(Error::Exhausted { .. })));
    let pb = b.pool("p").await.expect("pool");
    for (k, id) in &ids {
        let got = pb.acquire_durable(k, "b-owner").await.expect("b acquires");
        assert_eq!((got.id, got.new), (*id, false));
    }
    assert!(!pa.release("k0").await.expect("release").reclaimed);
    let r = pb.release_durable("k0", "b-owner").await.expect("release");
    assert!(r.held && r.reclaimed);
    assert!(!pb.release_durable("k0", "b-owner").await.expect("again").held);
    check_g1_in(&*store, l, "p").await;
}

async fn many_allocators_overlapping_keys_agree(backend: Backend) {
    let Some(env) = env(backend).await else { return };
    let l = env.layout.clone();
    let setup = alloc(env.store.clone(), &l, "setup");
    setup.init_pool(&PoolSpec::new("p", 1, 1000).strategy(Strategy::Lowest)).await.expect("init");
    let mut tasks = Vec::new();
    for n in 0..8u64 {
        let (store, l) = (env.store.clone(), l.clone());
        tasks.push(tokio::spawn(async move {
            let a = alloc(store, &l, &format!("node{n}"));
            let p = a.pool("p").await.expect("pool");
            let mut got = HashMap::new();
            for i in 0..100u64 {
                let key = format!("k{}", (i * 7 + n * 13) % 150);
                let id = p.acquire(&key).await.expect("acquire").id;
                if let Some(prev) = got.insert(key.clone(), id) {
                    assert_eq!(prev, id, "G2 for {key}");
                }
            }
            (a, got)
        }));
    }
    let mut all = HashMap::new();
    let mut keep = Vec::new();
    for t in tasks {
        let (a, got) = t.await.expect("task");
        for (k, id) in got {
            assert_eq!(*all.entry(k.clone()).or_insert(id), id, "nodes disagree on {k}");
        }
        keep.push(a);
    }
    assert_eq!(all.values().collect::<HashSet<_>>().len(), all.len(), "G1");
    check_g1_in(&*env.store, &l, "p").await;
    for a in keep {
        a.close().await.expect("close");
    }
    let swept = setup.pool("p").await.expect("pool").sweep().await.expect("sweep");
    assert_eq!(swept.reclaimed.len(), all.len());
    assert_only_specs_left_in(&*env.store, &l).await;
}

async fn lost_lease_lost_data_and_conflict(backend: Backend) {
    let Some(env) = env(backend).await else { return };
    let (store, l) = (env.store.clone(), &env.layout);
    let a = alloc(store.clone(), l, "a");
    let p = a.ensure_pool(&PoolSpec::new("p", 1, 100)).await.expect("pool");
    let mut events = p.events();
    let x = p.acquire("x").await.expect("x").id;
    let y = p.acquire("y").await.expect("y").id;

    // The session lease vanishes: a new one is granted and both keys are re-referenced.
    let lease = a.session_lease().await.expect("lease");
    assert!(store.lease_revoke(lease).await.expect("revoke"));
    wait_until_async(|| async {
        a.session_lease().await.is_some_and(|n| n != lease)
            && count_refs_in(&*store, l, "p").await == 2
    })
    .await;
    assert_eq!(raw_binding_in(&*store, l, "p", "x").await, Some(x));

    // x's records are deleted: re-created with the same ID.
    raw_delete_binding_in(&*store, l, "p", "x", x).await;
    wait_until_async(|| async { raw_binding_in(&*store, l, "p", "x").await == Some(x) }).await;

    // y's ID goes to another key in the same txn that deletes y's records: Conflict, new ID.
    store
        .txn(TxnRequest::new().and_then([
            TxnOp::delete(l.key_key("p", "y")),
            TxnOp::put(l.id_key("p", y), IdRecord::Bound("z".into()).encode()),
            TxnOp::put(l.key_key("p", "z"), y.to_string()),
            TxnOp::put(l.ref_key("p", "z", "intruder"), y.to_string()),
        ]))
        .await
        .expect("raw write");
    let (key, old, new) = loop {
        match tokio::time::timeout(Duration::from_secs(30), events.recv()).await {
            Ok(Some(Event::Conflict { key, old_id, new_id })) => break (key, old_id, new_id),
            Ok(Some(_)) => {}
            other => panic!("expected Conflict, got {other:?}"),
        }
    };
    assert_eq!((key.as_str(), old), ("y", y));
    assert_ne!(new, y);
    assert_eq!(raw_binding_in(&*store, l, "p", "y").await, Some(new));
    check_g1_in(&*store, l, "p").await;
}

async fn crashed_process_is_reclaimed_after_its_ttl(backend: Backend) {
    let Some(env) = env(backend).await else { return };
    let (store, l) = (env.store.clone(), &env.layout);
    let crashing = alloc(store.clone(), l, "crashing");
    let id = crashing
        .ensure_pool(&PoolSpec::new("p", 1, 10))
        .await
        .expect("pool")
        .acquire("k")
        .await
        .expect("k")
        .id;
    drop(crashing);
    let survivor = alloc(store.clone(), l, "survivor");
    let p = survivor.pool("p").await.expect("pool");
    assert!(p.sweep().await.expect("sweep").reclaimed.is_empty(), "lease still alive");
    wait_until_async(|| async { count_refs_in(&*store, l, "p").await == 0 }).await;
    assert_eq!(p.sweep().await.expect("sweep").reclaimed, vec![(id, "k".to_string())]);
    assert_only_specs_left_in(&*store, l).await;
}

/// The next event, or `None` at the end of the stream; a stream that neither yields nor ends
/// within 60 s fails the test (a hang guard, not a timing assertion).
async fn next_event(ev: &mut idalloc::Events) -> Option<Event> {
    tokio::time::timeout(Duration::from_secs(60), ev.recv())
        .await
        .expect("the subscription neither yielded an event nor ended")
}

/// Reads `ev` to its end, skipping the replay up to its `Synced`; the events after that.
async fn rest_after_synced(ev: &mut idalloc::Events) -> Vec<Event> {
    loop {
        match next_event(ev).await {
            Some(Event::Synced) => break,
            Some(_) => continue,
            None => panic!("the subscription ended before its replay's Synced"),
        }
    }
    let mut out = Vec::new();
    while let Some(e) = next_event(ev).await {
        out.push(e);
    }
    out
}

/// A subscriber mirrors the pool from its events, so deleting the pool must show
/// up there: a `Delete` for every binding it was shown, then the end of the stream, whether this
/// process deleted the pool (the cache used to be emptied silently and the stream never ended) or
/// another one did (seen through the watch), with force or while empty.
async fn a_deleted_pool_ends_its_subscriptions_with_a_delete_per_binding(backend: Backend) {
    let Some(env) = env(backend).await else { return };
    let a = alloc(env.store.clone(), &env.layout, "a");
    let b = alloc(env.store.clone(), &env.layout, "b");
    let pa = a.ensure_pool(&PoolSpec::new("p", 1, 100)).await.expect("pool");
    let x = pa.acquire("x").await.expect("x").id;
    let y = pa.acquire("y").await.expect("y").id;
    let pb = b.pool("p").await.expect("pool");
    pb.wait_synced().await.expect("synced");
    wait_until(|| pb.get("y") == Some(y) && pa.snapshot().len() == 2).await;
    let mut own = pa.events();
    let mut other = pb.events();
    assert!(a.delete_pool("p", true).await.expect("delete"));
    let mut want =
        vec![Event::Delete { id: x, key: "x".into() }, Event::Delete { id: y, key: "y".into() }];
    want.sort_by_key(|e| format!("{e:?}"));
    for (who, ev) in [("the deleting process", &mut own), ("another process", &mut other)] {
        let mut got = rest_after_synced(ev).await;
        got.sort_by_key(|e| format!("{e:?}"));
        assert_eq!(got, want, "{who}: a Delete per binding, then the end");
    }
    assert!(pb.snapshot().is_empty(), "the other process's mirror is empty");
    assert!(matches!(pb.acquire("z").await, Err(Error::PoolNotFound { .. })));

    // An empty pool deleted by another process: nothing changes under `id/`, the stream still ends.
    let pa = a.ensure_pool(&PoolSpec::new("q", 1, 100)).await.expect("pool");
    pa.wait_synced().await.expect("synced");
    let mut ev = pa.events();
    assert!(b.delete_pool("q", false).await.expect("delete"));
    assert_eq!(rest_after_synced(&mut ev).await, Vec::<Event>::new());
    assert!(matches!(pa.acquire("z").await, Err(Error::PoolNotFound { .. })));
    // A subscription taken after the delete ends at once.
    assert_eq!(next_event(&mut pa.events()).await, None);
}

/// A process follows the spec records of all its pools with one watch: a pool opened long after
/// that watch started (its spec older than the watch's position) still learns of its deletion,
/// and deletions, re-creations and resizes by another process reach exactly the pools they
/// concern.
async fn one_spec_watch_serves_every_pool_whenever_it_was_opened(backend: Backend) {
    let Some(env) = env(backend).await else { return };
    let a = alloc(env.store.clone(), &env.layout, "a");
    let b = alloc(env.store.clone(), &env.layout, "b");
    let mut pools = Vec::new();
    for i in 0..4 {
        let p = a.ensure_pool(&PoolSpec::new(format!("p{i}"), 1, 10)).await.expect("pool");
        p.wait_synced().await.expect("synced");
        pools.push(p);
    }
    // Made by the other process before `a` opens it; `a`'s spec watch is already past it.
    b.ensure_pool(&PoolSpec::new("late", 1, 10)).await.expect("pool");
    b.ensure_pool(&PoolSpec::new("busy", 1, 10))
        .await
        .expect("pool")
        .acquire("k")
        .await
        .expect("k");
    let late = a.pool("late").await.expect("open late");
    late.wait_synced().await.expect("synced");
    let mut late_events = late.events();
    assert!(b.delete_pool("late", false).await.expect("delete"));
    assert_eq!(rest_after_synced(&mut late_events).await, Vec::<Event>::new());
    wait_until(|| late.is_retired()).await;

    assert!(b.delete_pool("p1", false).await.expect("delete"));
    b.ensure_pool(&PoolSpec::new("p1", 5, 20)).await.expect("re-create");
    let grown = b.resize_pool("p2", 1, 30, None).await.expect("grow");
    wait_until(|| pools[1].is_retired() && pools[2].spec() == grown).await;
    assert!(matches!(
        pools[1].acquire("x").await,
        Err(Error::PoolReplaced { .. } | Error::PoolNotFound { .. } | Error::RangeMismatch { .. })
    ));
    for i in [0, 2, 3] {
        assert!(!pools[i].is_retired(), "p{i} was not touched");
        pools[i].acquire("x").await.expect("acquire in an untouched pool");
    }
    let busy = a.pool("busy").await.expect("open busy");
    busy.wait_synced().await.expect("synced");
    assert_eq!(busy.get("k").map(|_| ()), Some(()), "a pool opened last has its view");
}

/// Growing a full pool frees IDs for every process that has it open (it learns the new range from
/// the spec record's watch, without reopening); shrinking or reserving over a bound ID is refused
/// with the ID and its key named (also for a key record whose ID record was lost); once the ID is
/// released and the cluster version finalized
/// the shrink goes through, and a process
/// that had the wide range open binds only inside the narrow one.
async fn a_resize_grows_refuses_a_shrink_over_bound_ids_and_every_process_learns_it(
    backend: Backend,
) {
    let Some(env) = env(backend).await else { return };
    let a = alloc(env.store.clone(), &env.layout, "a");
    let b = alloc(env.store.clone(), &env.layout, "b");
    let pa = a.ensure_pool(&PoolSpec::new("p", 1, 3)).await.expect("pool");
    for k in ["k1", "k2", "k3"] {
        pa.acquire(k).await.expect("fill");
    }
    let pb = b.pool("p").await.expect("pool");
    pb.wait_synced().await.expect("synced");
    assert!(matches!(pb.acquire("k4").await, Err(Error::Exhausted { .. })), "full before");

    let grown = a.resize_pool("p", 1, 5, None).await.expect("grow");
    assert_eq!((grown.min(), grown.max()), (1, 5));
    assert_eq!(pa.spec().max(), 5, "the resizing process knows at once");
    wait_until(|| pb.spec().max() == 5).await;
    let k4 = pb.acquire("k4").await.expect("a free ID after growing").id;
    assert!((4..=5).contains(&k4), "k4 got {k4}");
    assert_eq!(a.pool("p").await.expect("reopen").spec(), grown);

    for (range, reserve) in [((1, 3), None), ((1, 5), Some(vec![(k4, k4)]))] {
        let e =
            a.resize_pool("p", range.0, range.1, reserve.as_deref()).await.expect_err("refused");
        let msg = e.to_string();
        assert!(
            matches!(e, Error::InvalidInput { input: idalloc::Input::PoolInUse, .. })
                && msg.contains(&format!("ID {k4} is bound to key \"k4\"")),
            "{msg}"
        );
    }
    assert_eq!(a.pool("p").await.expect("pool").spec().max(), 5, "a refusal changes nothing");

    pb.release("k4").await.expect("release");
    // Nothing is outside, but shrinking also waits for the finalized cluster version.
    let e = a.resize_pool("p", 1, 3, None).await.expect_err("not finalized");
    assert!(e.to_string().contains("idalloc upgrade finalize"), "{e}");
    idalloc::cluster_version::finalize(&*env.store, &env.layout, Duration::ZERO)
        .await
        .expect("finalize");
    // A key record whose ID record was lost with store data still holds its ID (a repair
    // re-creates the binding there): the shrink is refused while it names one outside.
    let lost = env.layout.key_key("p", "lost");
    env.store
        .txn(TxnRequest::new().and_then([TxnOp::put(lost.clone(), idalloc::layout::encode_id(5))]))
        .await
        .expect("a key record left by data loss");
    let e = a.resize_pool("p", 1, 3, None).await.expect_err("a key record outside");
    assert!(e.to_string().contains("key \"lost\" is bound to ID 5"), "{e}");
    env.store.txn(TxnRequest::new().and_then([TxnOp::delete(lost)])).await.expect("repaired");
    let shrunk = a.resize_pool("p", 1, 3, None).await.expect("shrink once nothing is outside");
    assert_eq!(shrunk.max(), 3);
    wait_until(|| pb.spec().max() == 3).await;
    assert!(
        matches!(pb.acquire("k5").await, Err(Error::Exhausted { max: 3, .. })),
        "no bind outside the narrowed range"
    );
    assert!(matches!(a.resize_pool("nope", 1, 3, None).await, Err(Error::PoolNotFound { .. })));
    let e = a.resize_pool("p", 5, 1, None).await.expect_err("min above max");
    assert!(e.to_string().contains("min must not exceed max"), "{e}");
}

/// The grace after a finalize is a record on a lease nobody keeps alive: until the store ends it,
/// narrowing is refused (the gate compared in the store); then it commits. On etcd, in real time.
async fn the_grace_after_finalize_is_ended_by_the_store(backend: Backend) {
    let Some(env) = env(backend).await else { return };
    let a = alloc(env.store.clone(), &env.layout, "a");
    a.ensure_pool(&PoolSpec::new("p", 1, 9)).await.expect("pool");
    let grace = Duration::from_secs(3);
    idalloc::cluster_version::finalize(&*env.store, &env.layout, grace).await.expect("finalize");
    let now = idalloc::cluster_version::read(&*env.store, &env.layout).await.expect("read");
    assert_eq!((now.version, now.grace, now.in_force()), (2, Some(grace), 1));
    let e = a.resize_pool("p", 1, 5, None).await.expect_err("during the grace");
    assert!(e.to_string().contains("grace"), "{e}");
    let mut ended = false;
    for _ in 0..100 {
        tokio::time::sleep(Duration::from_millis(200)).await;
        let now = idalloc::cluster_version::read(&*env.store, &env.layout).await.expect("read");
        if now.grace.is_none() {
            assert_eq!(now.in_force(), 2);
            ended = true;
            break;
        }
    }
    assert!(ended, "the store ended the grace");
    assert_eq!(a.resize_pool("p", 1, 5, None).await.expect("after the grace").max(), 5);
}

/// The events after the replay's `Synced` up to the first `Spec`, and that spec.
async fn until_spec(ev: &mut idalloc::Events) -> (Vec<Event>, PoolSpec) {
    let mut before = Vec::new();
    loop {
        match next_event(ev).await {
            Some(Event::Spec(spec)) => return (before, spec),
            Some(e) => before.push(e),
            None => panic!("the subscription ended before a spec event; it had {before:?}"),
        }
    }
}

/// A resize reaches the subscribers of the resizing process and of another one (which learns it
/// from the spec record's watch) as `Event::Spec` with the spec now in force, once per resize and
/// in order with the bindings' changes; a resize to the spec already in force sends nothing.
async fn a_resize_is_a_spec_event_for_the_subscribers_of_every_process(backend: Backend) {
    let Some(env) = env(backend).await else { return };
    let a = alloc(env.store.clone(), &env.layout, "a");
    let b = alloc(env.store.clone(), &env.layout, "b");
    let pa = a.ensure_pool(&PoolSpec::new("p", 1, 3)).await.expect("pool");
    pa.acquire("k1").await.expect("acquire");
    let pb = b.pool("p").await.expect("pool");
    pb.wait_synced().await.expect("synced");
    let (mut ea, mut eb) = (pa.events(), pb.events());

    let grown = a.resize_pool("p", 1, 5, None).await.expect("grow");
    for ev in [&mut ea, &mut eb] {
        let (before, spec) = until_spec(ev).await;
        assert_eq!(spec, grown, "the spec in force");
        assert!(
            before.iter().all(|e| matches!(e, Event::Upsert { .. } | Event::Synced)),
            "{before:?}"
        );
    }
    // The same spec again changes nothing and is no event: the next one is the bind after it.
    assert_eq!(a.resize_pool("p", 1, 5, None).await.expect("no-op"), grown);
    let k2 = pa.acquire("k2").await.expect("acquire").id;
    for ev in [&mut ea, &mut eb] {
        // A resize re-lists the pool (a `Synced`, maybe the known bindings again): whatever
        // comes before the bind, no second spec event.
        let want = Event::Upsert { id: k2, key: "k2".into() };
        loop {
            let e = next_event(ev).await.expect("the subscription ended");
            assert!(!matches!(e, Event::Spec(_)), "a spec event for a no-op resize");
            if e == want {
                break;
            }
        }
    }
    // A reservation by the other process: both see it, after the release before it.
    pa.release("k2").await.expect("release");
    // The bindings and the spec come through separate watches: the release is seen first.
    wait_until(|| pa.get("k2").is_none() && pb.get("k2").is_none()).await;
    // Reserving narrows: the cluster version is finalized first.
    idalloc::cluster_version::finalize(&*env.store, &env.layout, Duration::ZERO)
        .await
        .expect("finalize");
    let reserved = b.resize_pool("p", 1, 5, Some(&[(k2, k2)])).await.expect("reserve");
    assert_eq!(reserved.reserved(), &[(k2, k2)]);
    for ev in [&mut ea, &mut eb] {
        let (before, spec) = until_spec(ev).await;
        assert_eq!(spec, reserved);
        assert!(
            before.contains(&Event::Delete { id: k2, key: "k2".into() }),
            "in order: {before:?}"
        );
        assert!(!before.iter().any(|e| matches!(e, Event::Spec(_))), "one spec event: {before:?}");
    }
    assert_eq!(pa.spec(), reserved);
}
