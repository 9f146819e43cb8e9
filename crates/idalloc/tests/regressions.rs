//! Regression tests for bugs the chaos test on a real etcd cluster found (docs/design/chaos.md). Each is
//! named after its bug and reproduces it deterministically on the embedded store.
//! DESIGN §11 (late commits, pool lifetime), §7 (recovery), G1/G2/G4.

mod common;

use std::sync::Arc;
use std::time::Duration;

use idalloc::store::embedded::EmbeddedStore;
use idalloc::store::{GetRequest, KeyRange, Store};
use idalloc::{Error, PoolSpec, Released, Strategy};
use idalloc_testkit::hooks::{freezable, hold_back, late_commit, HoldBack};

use common::{allocator, check_g1, count_refs, raw_binding, wait_until};

/// Bug: `release_durable` takes the key's ID from the watch-fed cache. When the cache lags (the
/// watch stalls) and the key was re-bound to another ID meanwhile, the release txn's compare on the
/// key record fails, its else branch only deletes the reference, and the binding is left with no
/// reference at all: the last holder's release reports `reclaimed: false` (not linearizable) and
/// the binding leaks (G4) when the pool has no idle grace and no sweeper runs.
#[tokio::test(start_paused = true)]
async fn durable_release_with_a_stale_cache_still_reclaims() {
    let shared = EmbeddedStore::memory();
    let store = Arc::new(shared.clone());
    // Only B's watch freezes; A sees every change.
    let b_store = Arc::new(freezable(shared));
    let a = allocator(store.clone(), "node-a");
    let b = allocator(b_store.clone(), "node-b");
    let spec = PoolSpec::new("p", 1, 10).strategy(Strategy::Lowest);
    let pa = a.ensure_pool(&spec).await.unwrap();
    let pb = b.ensure_pool(&spec).await.unwrap();
    pa.wait_synced().await.unwrap();
    pb.wait_synced().await.unwrap();

    // B binds k -> 1 and its cache sees it; then B's watch stalls.
    assert_eq!(pb.acquire_durable("k", "hb").await.unwrap().id, 1);
    wait_until(|| pb.get("k") == Some(1) && pa.get("k") == Some(1)).await;
    b_store.hook().freeze(true);

    // B releases k (reclaimed), A binds another key to the freed ID 1, and B binds k again: the
    // store moves it to ID 2, but B's cache still says k -> 1.
    assert_eq!(
        pb.release_durable("k", "hb").await.unwrap(),
        Released { held: true, reclaimed: true }
    );
    wait_until(|| pa.get("k").is_none()).await;
    assert_eq!(pa.acquire_durable("f", "ha").await.unwrap().id, 1);
    assert_eq!(pb.acquire_durable("k", "hb").await.unwrap().id, 2);
    assert_eq!(pb.get("k"), Some(1), "the test needs B's cache to be stale");

    // B is the only holder of k: its release must reclaim the binding.
    let r = pb.release_durable("k", "hb").await.unwrap();
    assert_eq!(r, Released { held: true, reclaimed: true });
    assert_eq!(raw_binding(&*store, "p", "k").await, None, "k must not stay bound without holders");
    assert_eq!(count_refs(&*store, "p").await, 1, "only A's reference to f is left");
    check_g1(&*store, "p").await;

    b_store.hook().freeze(false);
    tokio::time::sleep(Duration::from_millis(50)).await;
    wait_until(|| pb.get("k").is_none()).await;
}

/// Found by simulation seed 30 (docs/design/simulation.md): a node whose cache still showed an ID under
/// the key it used to belong to moved a key that another node had just bound to that ID onto a
/// second ID, leaving two ID records for one key (G1) and the other holders with a `Conflict`
/// without any data loss. Bites with both defences removed (the bind trusting a cached "not ours",
/// and the move's txn not pinning the other key's ID record).
#[tokio::test(start_paused = true)]
async fn stale_cache_must_not_move_a_key_off_its_id() {
    let shared = EmbeddedStore::memory();
    let store = Arc::new(shared.clone());
    let a_store = Arc::new(freezable(shared));
    let spec = PoolSpec::new("p", 1, 10).strategy(Strategy::Lowest);
    let b = allocator(store.clone(), "b");
    let pb = b.ensure_pool(&spec).await.unwrap();
    assert_eq!(pb.acquire("other").await.unwrap().id, 1);
    let a = allocator(a_store.clone(), "a");
    let pa = a.pool("p").await.unwrap();
    wait_until(|| pa.key_of(1).as_deref() == Some("other")).await;
    a_store.hook().freeze(true);

    // ID 1 changes hands behind a's back.
    assert!(pb.release("other").await.unwrap().reclaimed);
    wait_until(|| pb.key_of(1).is_none()).await;
    assert_eq!(pb.acquire("k").await.unwrap().id, 1);
    assert_eq!(pa.key_of(1).as_deref(), Some("other"), "the test needs a's cache to be stale");

    let got = pa.acquire("k").await.unwrap();
    assert_eq!((got.id, got.new), (1, false), "a joins the binding the store has");
    assert_eq!(raw_binding(&*store, "p", "k").await, Some(1));
    check_g1(&*store, "p").await;
    a_store.hook().freeze(false);
}

/// Found by the chaos test with etcd members paused longer than the client's request timeout: a
/// bind txn that timed out on the client but was applied after its retry succeeded and after the
/// holder released the key again re-created the holder's reference. Binds that join an existing
/// binding now carry a fence (the key record unchanged since a revision seen before sending) and
/// every release rewrites the key record, so the late attempt fails.
#[tokio::test(start_paused = true)]
async fn late_commit_of_a_timed_out_acquire_does_not_resurrect_a_released_reference() {
    let shared = EmbeddedStore::memory();
    let store = Arc::new(late_commit(shared.clone(), Duration::from_secs(5)));
    let a = common::allocator_with(store.clone(), "node-a", |o| {
        o.request_timeout = Duration::from_secs(1)
    });
    let pool = a.ensure_pool(&PoolSpec::new("p", 1, 10)).await.unwrap();
    let id = pool.acquire_durable("k", "other").await.unwrap().id;
    // The cache knows the binding, so the bind is a join: `If key/k == id ∧ id/id == k`.
    wait_until(|| pool.get("k") == Some(id)).await;

    store.hook().arm();
    // The first attempt hangs and is retried after the timeout; the retry succeeds.
    assert_eq!(pool.acquire_durable("k", "h").await.unwrap().id, id);
    assert_eq!(
        pool.release_durable("k", "h").await.unwrap(),
        Released { held: true, reclaimed: false }
    );
    // The held-back first attempt lands now.
    tokio::time::sleep(Duration::from_secs(10)).await;
    assert_eq!(count_refs(&shared, "p").await, 1, "only the other holder's reference may be left");
}

type HeldBack = idalloc_testkit::hooked::HookedStore<EmbeddedStore, HoldBack>;

/// Applies the txn `store` held back, now (late); whether its compares held.
async fn apply_held(store: &HeldBack) -> bool {
    store.hook().apply_held(store.inner()).await.expect("late apply").succeeded
}

fn held_back_allocator(store: &Arc<HeldBack>, holder: &str) -> idalloc::Allocator {
    common::allocator_with(store.clone(), holder, |o| o.request_timeout = Duration::from_secs(1))
}

async fn ref_exists(store: &EmbeddedStore, pool: &str, key: &str, holder: &str) -> bool {
    let k = common::layout().ref_key(pool, key, holder);
    !store.get(GetRequest::key(k)).await.unwrap().kvs.is_empty()
}

/// Late release (G2): a release whose first attempt got stuck, applied after its own retry
/// and after the holder acquired the key again, undid that acquire: as the last holder it
/// reclaimed the binding, otherwise its else branch deleted the new reference unconditionally.
/// Releases now act only if the reference is unchanged since a revision the sender had seen.
#[tokio::test(start_paused = true)]
async fn late_release_does_not_undo_a_later_acquire() {
    for other_holder in [false, true] {
        let shared = EmbeddedStore::memory();
        let store = Arc::new(hold_back(shared.clone()));
        let a = held_back_allocator(&store, "node-a");
        let spec = PoolSpec::new("p", 1, 10).strategy(Strategy::Lowest);
        let pool = a.ensure_pool(&spec).await.unwrap();
        if other_holder {
            pool.acquire_durable("k", "bob").await.unwrap();
        }
        let id = pool.acquire_durable("k", "alice").await.unwrap().id;
        wait_until(|| pool.get("k") == Some(id)).await;

        store.hook().hold_next();
        // The first attempt hangs; the retry after the timeout succeeds.
        let r = pool.release_durable("k", "alice").await.unwrap();
        assert_eq!(r, Released { held: true, reclaimed: !other_holder });
        // alice takes k again.
        let id = pool.acquire_durable("k", "alice").await.unwrap().id;
        // The stuck first release is applied now.
        apply_held(&store).await;
        assert!(
            ref_exists(&shared, "p", "k", "alice").await,
            "alice's new reference survives the late release (other holder: {other_holder})"
        );
        assert_eq!(raw_binding(&shared, "p", "k").await, Some(id));
        check_g1(&shared, "p").await;
    }
}

/// Late create (G4): a create whose first attempt got stuck, applied after its retry created
/// the binding and the holder's last release deleted every record of the key, found its
/// compares (key and ID records absent) true again and leaked a binding with a reference nobody
/// holds. Creates now compare the holder's fence record, which such a release bumps.
#[tokio::test(start_paused = true)]
async fn late_create_after_the_last_release_leaks_nothing() {
    // Durable holder (the CLI): every release bumps the fence.
    let shared = EmbeddedStore::memory();
    let store = Arc::new(hold_back(shared.clone()));
    let a = held_back_allocator(&store, "node-a");
    let pool = a.ensure_pool(&PoolSpec::new("p", 1, 10)).await.unwrap();
    pool.wait_synced().await.unwrap();
    store.hook().hold_next();
    pool.acquire_durable("k", "alice").await.unwrap();
    let r = pool.release_durable("k", "alice").await.unwrap();
    assert_eq!(r, Released { held: true, reclaimed: true });
    assert!(!apply_held(&store).await, "the late create must fail its compares");
    assert_eq!(raw_binding(&shared, "p", "k").await, None);
    assert_eq!(count_refs(&shared, "p").await, 0);
    common::assert_only_specs_left(&shared).await;

    // Leased holder (a process): its release bumps the fence because the acquire was in doubt.
    let shared = EmbeddedStore::memory();
    let store = Arc::new(hold_back(shared.clone()));
    let b = held_back_allocator(&store, "node-b");
    let pool = b.ensure_pool(&PoolSpec::new("p", 1, 10)).await.unwrap();
    pool.wait_synced().await.unwrap();
    pool.acquire("warm-up").await.unwrap(); // the session lease exists before the held attempt
    store.hook().hold_next();
    pool.acquire("k").await.unwrap();
    assert!(pool.release("k").await.unwrap().reclaimed);
    assert!(!apply_held(&store).await, "the late create must fail its compares");
    assert_eq!(raw_binding(&shared, "p", "k").await, None);
    assert_eq!(count_refs(&shared, "p").await, 1, "only warm-up's reference is left");
    assert!(pool.release("warm-up").await.unwrap().reclaimed);
    b.close().await.unwrap();
    common::assert_only_specs_left(&shared).await;
}

/// The holder fence records and the fence floor of pool `pool`, as the store holds them.
async fn fence_records(store: &EmbeddedStore, pool: &str) -> (usize, bool) {
    let snap = idalloc_testkit::g1::read_pool(store, &common::layout(), pool).await.unwrap();
    (snap.fences.len(), snap.fence_floor.is_some())
}

/// Folding holder fence records must not reopen the late-create window. A create
/// of `alice` decided before her release and the fold, applied after both, found her fence record
/// deleted (mod revision 0) and every other record it compares absent, so it committed a binding
/// and a reference nobody holds; it now fails on the pool's fence floor. A live bind whose attempt
/// crossed a fold fails once and is decided again, and succeeds.
#[tokio::test(start_paused = true)]
async fn a_late_create_applied_after_a_fold_fails_on_the_fence_floor() {
    let shared = EmbeddedStore::memory();
    let store = Arc::new(hold_back(shared.clone()));
    let a = held_back_allocator(&store, "node-a");
    // A sweeper that folds whenever it finds a fence record.
    let janitor = common::allocator_with(Arc::new(shared.clone()), "janitor", |o| {
        o.fold_fences_above = 0;
    });
    common::finalize(&shared, &common::layout()).await;
    let pool = a.ensure_pool(&PoolSpec::new("p", 1, 10)).await.unwrap();
    pool.wait_synced().await.unwrap();
    let sweeper = janitor.pool("p").await.unwrap();

    store.hook().hold_next();
    pool.acquire_durable("k", "alice").await.unwrap(); // its first attempt is held back
    assert!(pool.release_durable("k", "alice").await.unwrap().reclaimed);
    assert_eq!(fence_records(&shared, "p").await, (1, false), "alice's release left her record");
    let report = sweeper.sweep().await.unwrap();
    assert_eq!((report.fence_records, report.folded), (1, 1));
    assert_eq!(fence_records(&shared, "p").await, (0, true), "folded into the floor");
    assert!(!apply_held(&store).await, "the late create must fail on the fence floor");
    assert_eq!(raw_binding(&shared, "p", "k").await, None);
    assert_eq!(count_refs(&shared, "p").await, 0);

    // A live acquire whose attempt crosses a fold: the attempt is held (as in a paused member),
    // a fold commits, then the attempt's retry (sent with the revision seen before the fold)
    // fails on the floor; the bind is decided again and succeeds.
    assert!(pool.acquire_durable("warm", "carol").await.unwrap().new);
    assert!(pool.release_durable("warm", "carol").await.unwrap().reclaimed);
    store.hook().hold_next();
    let acquiring = {
        let pool = pool.clone();
        tokio::spawn(async move { pool.acquire_durable("k2", "bob").await })
    };
    wait_until(|| store.hook().is_holding()).await;
    assert_eq!(sweeper.sweep().await.unwrap().folded, 1);
    let got = acquiring.await.unwrap().expect("a live bind crossing a fold succeeds");
    assert!(got.new);
    assert_eq!(raw_binding(&shared, "p", "k2").await, Some(got.id));
    assert!(ref_exists(&shared, "p", "k2", "bob").await);
    assert!(!apply_held(&store).await, "the held first attempt, applied last, changes nothing");
    assert!(pool.release_durable("k2", "bob").await.unwrap().reclaimed);
    // Everything released: the spec, at most the fold threshold's fence records, and the floor.
    assert_eq!(sweeper.sweep().await.unwrap().folded, 1);
    common::assert_only_specs_left(&shared).await;
    assert_eq!(fence_records(&shared, "p").await, (0, true));
    // The floor goes with the pool.
    assert!(janitor.delete_pool("p", false).await.unwrap());
    let (kvs, _) =
        idalloc::store::list_all(&shared, &KeyRange::prefix("idalloc/data/"), 100).await.unwrap();
    assert!(kvs.is_empty(), "{kvs:?}");
}

/// Bind racing delete (G3, G4): a bind racing `pool delete` (even without force) committed after
/// the delete and left records without a spec; re-creating the pool with another range then
/// handed the key its old, out-of-range ID. Every write now compares the spec's create revision.
#[tokio::test(start_paused = true)]
async fn a_bind_racing_pool_delete_writes_nothing_into_the_deleted_pool() {
    let shared = EmbeddedStore::memory();
    let store = Arc::new(hold_back(shared.clone()));
    let a = held_back_allocator(&store, "node-a");
    let admin = common::allocator(Arc::new(shared.clone()), "admin");
    let pool = a.ensure_pool(&PoolSpec::new("p", 1, 100)).await.unwrap();
    pool.wait_synced().await.unwrap();

    store.hook().hold_next();
    let acquiring = {
        let pool = pool.clone();
        tokio::spawn(async move { pool.acquire_durable("k1", "alice").await })
    };
    tokio::time::sleep(Duration::from_millis(100)).await;
    // The pool is still empty in the store: a non-force delete succeeds.
    assert!(admin.delete_pool("p", false).await.unwrap());
    // The held bind lands after the delete; the acquire's own retry follows.
    assert!(!apply_held(&store).await, "a bind after the delete must fail its spec compare");
    let r = acquiring.await.unwrap();
    assert!(matches!(r, Err(idalloc::Error::PoolNotFound { .. })), "{r:?}");
    common::assert_only_specs_left(&shared).await;
    let (kvs, _) =
        idalloc::store::list_all(&shared, &KeyRange::prefix("idalloc/"), 100).await.unwrap();
    assert!(kvs.is_empty(), "no record outlives the spec: {kvs:?}");

    // Re-created with another range: k1 gets an ID in the new range.
    let spec2 = PoolSpec::new("p", 200, 300);
    let pool2 = admin.ensure_pool(&spec2).await.unwrap();
    let id = pool2.acquire_durable("k1", "alice").await.unwrap().id;
    assert!((200..=300).contains(&id), "{id}");
    // The old handle cannot write into the new pool either: it retired when it found the pool
    // deleted, and keeps saying so.
    assert!(pool.is_retired());
    let r = pool.acquire_durable("k2", "alice").await;
    assert!(matches!(r, Err(idalloc::Error::PoolNotFound { .. })), "{r:?}");
    assert_eq!(raw_binding(&shared, "p", "k2").await, None);
}

/// Forced delete under load: `pool delete --force` during a long run of acquires: the acquirer kept
/// writing bindings after the delete. Now its next write fails with `PoolNotFound` and nothing is
/// left; releases and sweeps on the old handle write nothing either.
#[tokio::test(start_paused = true)]
async fn force_delete_stops_a_running_acquirer() {
    let shared = EmbeddedStore::memory();
    let a = common::allocator(Arc::new(shared.clone()), "a");
    let admin = common::allocator(Arc::new(shared.clone()), "admin");
    let pool = a.ensure_pool(&PoolSpec::new("p", 1, 1000)).await.unwrap();
    for i in 0..20 {
        pool.acquire_durable(&format!("k{i}"), "cli").await.unwrap();
    }
    let leased = pool.acquire("mine").await.unwrap().id;
    assert!(admin.delete_pool("p", true).await.unwrap());
    for i in 20..25 {
        let r = pool.acquire_durable(&format!("k{i}"), "cli").await;
        assert!(matches!(r, Err(idalloc::Error::PoolNotFound { .. })), "{r:?}");
    }
    let r = pool.release("mine").await;
    assert!(matches!(r, Err(idalloc::Error::PoolNotFound { .. })), "{r:?}: {leased}");
    let r = pool.release_durable("k1", "cli").await;
    assert!(
        matches!(r, Err(idalloc::Error::PoolNotFound { .. }) | Ok(Released { held: false, .. })),
        "{r:?}"
    );
    let r = pool.sweep().await;
    assert!(r.is_ok() || matches!(r, Err(idalloc::Error::PoolNotFound { .. })), "{r:?}");
    let (kvs, _) =
        idalloc::store::list_all(&shared, &KeyRange::prefix("idalloc/"), 100).await.unwrap();
    assert!(kvs.is_empty(), "no record outlives the spec: {kvs:?}");
}

/// In a full pool, right after this process's own release reclaimed an ID, its
/// next acquire failed with `Exhausted`, because the local view learned of its own reclaim only
/// from the watch. Own committed reclaims now free the ID in the local view at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acquire_right_after_own_reclaim_in_a_full_pool_is_not_exhausted() {
    let shared = EmbeddedStore::memory();
    let a = common::allocator(Arc::new(shared.clone()), "a");
    let pool = a.ensure_pool(&PoolSpec::new("p", 1, 5)).await.unwrap();
    for i in 0..5 {
        pool.acquire(&format!("k{i}")).await.unwrap();
    }
    for round in 0..50 {
        let old = format!("k{round}");
        assert!(pool.release(&old).await.unwrap().reclaimed);
        let new = format!("k{}", round + 5);
        let r = pool.acquire(&new).await;
        assert!(r.is_ok(), "round {round}: {r:?}");
    }
    check_g1(&shared, "p").await;
}

/// `Exhausted` only when the store confirms it. A node whose watch lags still
/// shows a full pool after another node freed an ID; it must not report the pool exhausted.
#[tokio::test(start_paused = true)]
async fn a_lagging_view_of_a_full_pool_is_not_reported_as_exhausted() {
    let shared = EmbeddedStore::memory();
    let a = common::allocator(Arc::new(shared.clone()), "a");
    let b_store = Arc::new(freezable(shared.clone()));
    let b = common::allocator(b_store.clone(), "b");
    let pa = a.ensure_pool(&PoolSpec::new("p", 1, 3)).await.unwrap();
    for k in ["x", "y", "z"] {
        pa.acquire(k).await.unwrap();
    }
    let pb = b.pool("p").await.unwrap();
    pb.wait_synced().await.unwrap();
    wait_until(|| pb.snapshot().len() == 3).await;
    b_store.hook().freeze(true);
    assert!(pa.release("x").await.unwrap().reclaimed);
    let r = pb.acquire("new").await;
    assert!(!matches!(r, Err(idalloc::Error::Exhausted { .. })), "the store has a free ID: {r:?}");
    // Once the watch catches up, the free ID is found.
    b_store.hook().freeze(false);
    wait_until(|| pb.snapshot().len() == 2).await;
    assert!(pb.acquire("new").await.is_ok());
    // Really full now: confirmed by the store, so Exhausted.
    let r = pb.acquire("one-more").await;
    assert!(matches!(r, Err(idalloc::Error::Exhausted { .. })), "{r:?}");
}

/// An unreadable ID record (`""`, a lone 0xFF byte) was treated as free by the
/// cache and then aborted every bind that picked it (with `lowest`, every new key failed). It
/// now counts as used, is reported, and a bind that runs into one picks another ID.
#[tokio::test(start_paused = true)]
async fn unreadable_id_records_count_as_used_and_never_abort_binds() {
    let shared = EmbeddedStore::memory();
    let l = common::layout();
    let spec = PoolSpec::new("p", 1, 10).strategy(Strategy::Lowest);
    // b's watch is frozen while the records are damaged, so its first picks run into them.
    let b_store = Arc::new(freezable(shared.clone()));
    let b = common::allocator(b_store.clone(), "b");
    let pb = b.ensure_pool(&spec).await.unwrap();
    pb.wait_synced().await.unwrap();
    b_store.hook().freeze(true);
    for (id, value) in [(1u64, &b""[..]), (2, &[0xFFu8][..])] {
        shared
            .txn(
                idalloc::store::TxnRequest::new()
                    .and_then([idalloc::store::TxnOp::put(l.id_key("p", id), value.to_vec())]),
            )
            .await
            .unwrap();
    }
    assert_eq!(pb.acquire("k").await.unwrap().id, 3, "binds step over unreadable records");
    b_store.hook().freeze(false);

    // A fresh node lists them: never candidates (no wasted round trip on them), reported.
    let counted = Arc::new(idalloc_testkit::counting::CountingStore::new(shared.clone()));
    let a = common::allocator(counted.clone(), "a");
    let pa = a.pool("p").await.unwrap();
    pa.wait_synced().await.unwrap();
    assert_eq!(
        pa.unusable_id_records(),
        vec![(1, idalloc::Foreign::Unreadable), (2, idalloc::Foreign::Unreadable)]
    );
    for key in ["m", "n"] {
        counted.reset();
        let id = pa.acquire_durable(key, "h").await.unwrap().id;
        assert!(id > 3, "{key} got {id}");
        assert_eq!(counted.counts().txn, 1, "{key}: no attempt on an unreadable ID");
    }
}

/// A key record pointing at an ID outside the pool's range was returned as the
/// key's ID (G3). It is refused now, and the cache never shows such a binding.
#[tokio::test(start_paused = true)]
async fn a_key_record_outside_the_pool_range_is_refused() {
    let shared = EmbeddedStore::memory();
    let l = common::layout();
    let a = common::allocator(Arc::new(shared.clone()), "a");
    let pool = a.ensure_pool(&PoolSpec::new("p", 200, 300).reserve(250..=250)).await.unwrap();
    for (key, id) in [("old", 78u64), ("res", 250)] {
        shared
            .txn(idalloc::store::TxnRequest::new().and_then([
                idalloc::store::TxnOp::put(l.id_key("p", id), key.as_bytes().to_vec()),
                idalloc::store::TxnOp::put(l.key_key("p", key), id.to_string().into_bytes()),
            ]))
            .await
            .unwrap();
    }
    tokio::time::sleep(Duration::from_millis(100)).await;
    for (key, id) in [("old", 78u64), ("res", 250)] {
        assert_eq!(pool.get(key), None, "the cache never shows {key} -> {id}");
        let r = pool.acquire_durable(key, "h").await;
        assert!(
            matches!(r, Err(Error::Corrupt { .. })),
            "{key}: an ID the pool never hands out must not be returned, and is corrupt data: {r:?}"
        );
        let r = pool.get_consistent(key).await;
        assert!(matches!(r, Err(Error::Corrupt { .. })), "{key}: {r:?}");
    }
    // Other keys are served.
    let id = pool.acquire_durable("fine", "h").await.unwrap().id;
    assert!((200..=300).contains(&id) && id != 250);
}

async fn raw_put(store: &EmbeddedStore, key: Vec<u8>, value: &[u8]) {
    store
        .txn(
            idalloc::store::TxnRequest::new()
                .and_then([idalloc::store::TxnOp::put(key, value.to_vec())]),
        )
        .await
        .unwrap();
}

/// Unreadable ID record: a key record pointing at an ID whose record idalloc cannot read made
/// every bind of that key retry 64 times and report `Unavailable`: the move off that ID compared
/// the record's value against a value it made up for "unreadable". The move now pins the
/// record's mod revision, so it succeeds at once; the unreadable record stays (counted as used,
/// left for `idalloc check`), and the key gets a fresh in-range ID.
#[tokio::test(start_paused = true)]
async fn a_key_record_on_an_unreadable_id_record_moves_the_key_without_looping() {
    let shared = EmbeddedStore::memory();
    let l = common::layout();
    let counted = Arc::new(idalloc_testkit::counting::CountingStore::new(shared.clone()));
    let a = common::allocator(counted.clone(), "a");
    let pool = a.ensure_pool(&PoolSpec::new("p", 1, 10).strategy(Strategy::Lowest)).await.unwrap();
    pool.wait_synced().await.unwrap();
    for value in [&[0xFFu8][..], b"", &[0xFF, 0xFE, 0x00]] {
        raw_put(&shared, l.key_key("p", "k"), b"5").await;
        raw_put(&shared, l.id_key("p", 5), value).await;
        tokio::time::sleep(Duration::from_millis(100)).await;
        counted.reset();
        let got = pool.acquire_durable("k", "h").await;
        let id = got.unwrap_or_else(|e| panic!("value {value:?}: {e}")).id;
        assert!(id != 5 && (1..=10).contains(&id), "value {value:?}: got {id}");
        assert!(counted.counts().txn <= 3, "no retry loop: {:?}", counted.counts());
        assert_eq!(raw_binding(&shared, "p", "k").await, Some(id));
        let rec = shared.get(GetRequest::key(l.id_key("p", 5))).await.unwrap();
        assert_eq!(rec.kvs[0].value, value, "the unreadable record is left for a person");
        // Clean up for the next value: release, then drop the damaged record by hand.
        assert!(pool.release_durable("k", "h").await.unwrap().held);
        shared
            .txn(
                idalloc::store::TxnRequest::new()
                    .and_then([idalloc::store::TxnOp::delete(l.id_key("p", 5))]),
            )
            .await
            .unwrap();
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    common::assert_only_specs_left(&shared).await;
}

/// Counting ID records: the store's count of ID records, used to confirm `Exhausted`, counted
/// records the pool never hands out (out of range, not an ID at all: edited by hand), so a node
/// whose view lagged called the pool exhausted while an in-range ID was free. Only IDs the pool
/// hands out count now (an unreadable value on one still counts as used).
#[tokio::test(start_paused = true)]
async fn garbage_id_records_do_not_make_a_pool_with_free_ids_exhausted() {
    let shared = EmbeddedStore::memory();
    let l = common::layout();
    let a = common::allocator(Arc::new(shared.clone()), "a");
    let b_store = Arc::new(freezable(shared.clone()));
    let b = common::allocator(b_store.clone(), "b");
    let pa = a.ensure_pool(&PoolSpec::new("p", 1, 4).reserve(4..=4)).await.unwrap();
    for k in ["x", "y", "z"] {
        pa.acquire(k).await.unwrap();
    }
    // Records no allocator writes: out of range, reserved, not an ID.
    raw_put(&shared, l.id_key("p", 78), b"ghost").await;
    raw_put(&shared, l.id_key("p", 4), b"reserved-ghost").await;
    let mut not_an_id = l.id_prefix("p");
    not_an_id.extend_from_slice(b"007");
    raw_put(&shared, not_an_id, b"x").await;
    let pb = b.pool("p").await.unwrap();
    pb.wait_synced().await.unwrap();
    wait_until(|| pb.get("z").is_some()).await;
    b_store.hook().freeze(true);
    assert!(pa.release("x").await.unwrap().reclaimed);
    // b's view still shows the pool full; the store has 5 ID records for a capacity of 3, but
    // only 2 of them are IDs the pool hands out.
    let r = pb.acquire("new").await;
    assert!(!matches!(r, Err(idalloc::Error::Exhausted { .. })), "ID free in the store: {r:?}");
    b_store.hook().freeze(false);
    wait_until(|| pb.get("x").is_none()).await;
    let id = pb.acquire("new").await.unwrap().id;
    assert!((1..=3).contains(&id), "{id}");
    // Really full now (an unreadable value on an in-range ID would count as used too).
    let r = pb.acquire("one-more").await;
    assert!(matches!(r, Err(idalloc::Error::Exhausted { .. })), "{r:?}");
}

/// Re-created pool: a pool deleted and re-created with the same spec under a live handle.
/// The old handle answered `PoolNotFound` (the pool exists) while its sync task kept following
/// the new pool's records, so its reads served the new pool as if the old handle's holds still
/// stood. Now the handle retires: every operation returns `PoolReplaced`, its view is dropped,
/// its sync stops, and opening the pool again gives a working handle on the new pool.
#[tokio::test(start_paused = true)]
async fn a_handle_on_a_re_created_pool_retires_with_a_clear_error() {
    let shared = EmbeddedStore::memory();
    // `a`'s watches are frozen across the delete, so its handle learns of it only from its next
    // write (a handle whose watch shows the delete retires at once with `PoolNotFound`:
    // `a_deleted_pool_ends_its_subscriptions_with_a_delete_per_binding`).
    let a_store = Arc::new(freezable(shared.clone()));
    let a = common::allocator(a_store.clone(), "a");
    let admin = common::allocator(Arc::new(shared.clone()), "admin");
    let spec = PoolSpec::new("p", 1, 10).strategy(Strategy::Lowest);
    let old = a.ensure_pool(&spec).await.unwrap();
    assert_eq!(old.acquire("mine").await.unwrap().id, 1);
    old.wait_synced().await.unwrap();
    a_store.hook().freeze(true);
    assert!(admin.delete_pool("p", true).await.unwrap());
    let fresh = admin.ensure_pool(&spec).await.unwrap();
    assert_eq!(fresh.acquire_durable("theirs", "admin").await.unwrap().id, 1);

    let r = old.acquire("k2").await;
    assert!(matches!(r, Err(idalloc::Error::PoolReplaced { .. })), "{r:?}");
    assert!(old.is_retired());
    for r in [
        old.acquire_durable("k3", "h").await.map(|_| ()),
        old.release("mine").await.map(|_| ()),
        old.sweep().await.map(|_| ()),
    ] {
        assert!(matches!(r, Err(idalloc::Error::PoolReplaced { .. })), "{r:?}");
    }
    assert_eq!(old.held(), vec![], "the holds went with the old pool");
    a_store.hook().freeze(false);
    // The old handle's sync stopped: it never learns the new pool's bindings.
    assert!(fresh.acquire_durable("later", "admin").await.is_ok());
    tokio::time::sleep(Duration::from_secs(5)).await;
    assert_eq!((old.get("theirs"), old.get("later"), old.key_of(1)), (None, None, None));
    // Opening the pool again works on the new pool.
    let again = a.pool("p").await.unwrap();
    assert!(!again.is_retired());
    again.wait_synced().await.unwrap();
    assert_eq!(again.get("theirs"), Some(1));
    let id = again.acquire("k2").await.unwrap().id;
    assert!(id > 1, "{id}");
    assert_eq!(raw_binding(&shared, "p", "k2").await, Some(id));
    // Deleted for good: `PoolNotFound` on the handle, also when this allocator deleted it.
    assert!(a.delete_pool("p", true).await.unwrap());
    let r = again.acquire("k4").await;
    assert!(matches!(r, Err(idalloc::Error::PoolNotFound { .. })), "{r:?}");
    assert!(again.is_retired());
}

/// Found by the simulation's pool-deletion step: a handle opened before its pool was deleted and
/// re-created over another range read a key record of the new pool, saw an ID outside its own
/// (old) range and refused with `Unavailable` ("run `idalloc check`") on a healthy pool. It now
/// checks the spec on that path and retires with the real reason (`RangeMismatch`).
#[tokio::test(start_paused = true)]
async fn a_stale_handle_reports_the_re_created_pool_not_a_bad_record() {
    let shared = EmbeddedStore::memory();
    // Frozen watches: the handle learns of the delete from its write, not from its spec watch.
    let a_store = Arc::new(freezable(shared.clone()));
    let a = common::allocator(a_store.clone(), "a");
    let admin = common::allocator(Arc::new(shared.clone()), "admin");
    let old = a.ensure_pool(&PoolSpec::new("p", 1, 10)).await.unwrap();
    old.wait_synced().await.unwrap();
    a_store.hook().freeze(true);
    assert!(admin.delete_pool("p", true).await.unwrap());
    let fresh = admin.ensure_pool(&PoolSpec::new("p", 101, 110)).await.unwrap();
    let id = fresh.acquire_durable("k", "h").await.unwrap().id;
    assert!((101..=110).contains(&id));
    let r = old.release_durable("k", "h").await;
    assert!(matches!(r, Err(idalloc::Error::RangeMismatch { .. })), "{r:?}");
    assert!(old.is_retired());
    assert_eq!(raw_binding(&shared, "p", "k").await, Some(id), "nothing was touched");
}

/// Found by the simulation's tampering step: a batched acquire joined a key record that names an
/// ID the pool never hands out (written by hand) and returned that ID (G3), where the single-key
/// acquire refuses it. Both refuse now; the other keys of the batch are served.
#[tokio::test(start_paused = true)]
async fn a_batched_acquire_refuses_a_key_record_outside_the_range() {
    let shared = EmbeddedStore::memory();
    let l = common::layout();
    let a = common::allocator(Arc::new(shared.clone()), "a");
    let pool = a.ensure_pool(&PoolSpec::new("p", 200, 300)).await.unwrap();
    pool.wait_synced().await.unwrap();
    raw_put(&shared, l.key_key("p", "k"), b"78").await;
    for durable in [true, false] {
        let keys = ["k", "fine"];
        let got = if durable {
            pool.acquire_many_durable(&keys, "h").await
        } else {
            pool.acquire_many(&keys).await
        };
        assert!(got[0].is_err(), "durable={durable}: ID 78 must not be handed out: {:?}", got[0]);
        let fine = got[1].as_ref().expect("the other key is served").id;
        assert!((200..=300).contains(&fine), "{fine}");
    }
    let rec = shared.get(GetRequest::key(l.id_key("p", 78))).await.unwrap();
    assert!(rec.kvs.is_empty(), "no ID record written outside the range");
}
