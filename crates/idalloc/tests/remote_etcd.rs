//! Remote views (multi-cluster, DESIGN §12) against real parts: every cluster is its own etcd
//! server on loopback with its own allocator and prefix bits. Outages are real: `kill -9` and
//! SIGSTOP of the remote's etcd (by the PID this test started), and a TCP relay between the
//! watcher and the remote that the test cuts, so the remote can change while the watcher is away.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use idalloc::layout::{IdRecord, Layout};
use idalloc::remote::Validator;
use idalloc::store::etcd::{EtcdOptions, EtcdStore};
use idalloc::store::{list_all, GetRequest, KeyRange, Store, TxnOp, TxnRequest};
use idalloc::{
    Allocator, AllocatorOptions, Cluster, ClusterEvent, Error, Event, Pool, PoolSpec,
    RemoteOptions, RemoteState,
};
use idalloc_testkit::etcd::{etcd_or_skip, EtcdCluster};
use tokio::net::{TcpListener, TcpStream};
use tokio::task::AbortHandle;

const POOL: &str = "ids";

/// One cluster: its own etcd, an allocator on it, and the pool with this cluster's prefix bits.
struct Site {
    etcd: EtcdCluster,
    store: Arc<EtcdStore>,
    alloc: Allocator,
    pool: Pool,
}

fn have_etcd() -> bool {
    etcd_or_skip("the remote-view tests")
}

fn spec(cluster_id: u64) -> PoolSpec {
    PoolSpec::new(POOL, 1, 0xffff).prefix(cluster_id << 16)
}

async fn site(cluster_id: u64) -> Site {
    let etcd = EtcdCluster::start(1).await.expect("start etcd");
    let store = Arc::new(connect(&etcd.endpoints()[0]).await);
    let opts = AllocatorOptions::builder()
        .holder(format!("site{cluster_id}"))
        .session_ttl(Duration::from_secs(10))
        .build()
        .unwrap();
    let alloc = Allocator::from_arc(store.clone(), opts).expect("allocator");
    let pool = alloc.ensure_pool(&spec(cluster_id)).await.expect("pool");
    pool.wait_synced().await.expect("synced");
    Site { etcd, store, alloc, pool }
}

/// A client for watching a remote: short timeouts and keep-alives, so outages show quickly.
async fn connect(endpoint: &str) -> EtcdStore {
    let mut o = EtcdOptions::new([endpoint.to_string()]);
    o.connect_timeout = Duration::from_secs(1);
    o.request_timeout = Duration::from_secs(2);
    o.keep_alive_interval = Duration::from_secs(1);
    o.keep_alive_timeout = Duration::from_secs(1);
    EtcdStore::connect(o).await.expect("connect")
}

/// A client for watching a remote in a test that exercises no outage: timeouts and keep-alives a
/// loaded machine does not run into, so the view never takes a slow answer for an outage and
/// re-lists (which would add a second `Synced` and replayed events).
async fn connect_patient(endpoint: &str) -> EtcdStore {
    let mut o = EtcdOptions::new([endpoint.to_string()]);
    o.request_timeout = Duration::from_secs(30);
    o.keep_alive_interval = Duration::from_secs(10);
    o.keep_alive_timeout = Duration::from_secs(30);
    EtcdStore::connect(o).await.expect("connect")
}

/// [`RemoteOptions`] to go with [`connect_patient`].
fn patient_remote_opts() -> RemoteOptions {
    RemoteOptions::builder().request_timeout(Duration::from_secs(30)).build().unwrap()
}

fn remote_opts() -> RemoteOptions {
    RemoteOptions::builder()
        .probe_interval(Duration::from_millis(300))
        .request_timeout(Duration::from_secs(1))
        .build()
        .unwrap()
}

/// The bindings of `POOL` as the store holds them, read raw (not through any allocator).
async fn truth(store: &dyn Store) -> BTreeMap<u64, String> {
    let l = Layout::new("idalloc").expect("layout");
    let (kvs, _) =
        list_all(store, &KeyRange::prefix(l.id_prefix(POOL)), 500).await.expect("raw list");
    kvs.iter()
        .filter_map(|kv| match (l.parse_id_key(POOL, &kv.key), IdRecord::decode(&kv.value)) {
            (Some(id), Some(IdRecord::Bound(k))) => Some((id, k)),
            _ => None,
        })
        .collect()
}

async fn revision(store: &dyn Store) -> i64 {
    store.get(GetRequest::key("x")).await.expect("revision").revision
}

async fn eventually(what: &str, mut cond: impl FnMut() -> bool) {
    for _ in 0..600 {
        if cond() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("not within 30 s: {what}");
}

/// Reads events of `cluster` until `synced` `Synced` events of it came (30 s at most); returns
/// them all (other clusters' events are skipped).
async fn events_until_synced(
    ev: &mut idalloc::ClusterEvents,
    cluster: &Cluster,
    synced: usize,
) -> Vec<Event> {
    let mut out = Vec::new();
    let mut n = 0;
    while n < synced {
        let e = tokio::time::timeout(Duration::from_secs(30), ev.recv())
            .await
            .unwrap_or_else(|_| panic!("no Synced of {cluster} within 30 s; got {out:?}"))
            .expect("stream open");
        if &e.cluster != cluster {
            continue;
        }
        if e.event == Event::Synced {
            n += 1;
        }
        out.push(e.event);
    }
    out
}

/// Applies `events` to `view`, checking each one against it (no Upsert of what is there, no
/// Delete of what is not): the difference they describe is then exact.
fn apply(view: &mut BTreeMap<u64, String>, events: &[Event]) {
    for e in events {
        match e {
            Event::Upsert { id, key } => {
                assert_ne!(view.get(id), Some(key), "Upsert of a binding already shown: {e:?}");
                view.insert(*id, key.clone());
            }
            Event::Delete { id, key } => {
                assert_eq!(view.remove(id).as_ref(), Some(key), "Delete of a binding not shown");
            }
            Event::Synced => {}
            other => panic!("unexpected event {other:?}"),
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_clusters_resolve_each_others_ids_with_zero_writes_to_remotes() {
    if !have_etcd() {
        return;
    }
    let sites = [site(1).await, site(2).await, site(3).await];
    // Each cluster allocates its own keys and a few keys every cluster has.
    let mut allocated: Vec<BTreeMap<String, u64>> = Vec::new();
    for (i, s) in sites.iter().enumerate() {
        let mut m = BTreeMap::new();
        for k in 0..30 {
            let key = if k < 5 { format!("shared-{k}") } else { format!("c{i}-{k}") };
            let got = s.pool.acquire_durable(&key, "owner").await.expect("acquire");
            m.insert(key, got.id);
        }
        allocated.push(m);
    }
    let names = ["one", "two", "three"];
    let before: Vec<i64> = {
        let mut v = Vec::new();
        for s in &sites {
            v.push(revision(&*s.store).await);
        }
        v
    };
    for (i, s) in sites.iter().enumerate() {
        for (j, r) in sites.iter().enumerate() {
            if i != j {
                let store = Arc::new(connect(&r.etcd.endpoints()[0]).await);
                let view =
                    s.pool.watch_remote(names[j], store, remote_opts()).await.expect("watch");
                tokio::time::timeout(Duration::from_secs(30), view.wait_synced())
                    .await
                    .expect("remote synced");
                assert_eq!(view.state(), RemoteState::Synced);
            }
        }
    }
    for (i, s) in sites.iter().enumerate() {
        for (j, m) in allocated.iter().enumerate() {
            let c = if i == j { Cluster::Local } else { Cluster::Remote(names[j].into()) };
            for (key, id) in m {
                assert_eq!(s.pool.key_of_any(*id), Some((c.clone(), key.clone())), "site {i}");
            }
        }
        for k in 0..5 {
            let key = format!("shared-{k}");
            let mut want: Vec<(Cluster, u64)> = (0..3)
                .map(|j| {
                    let c = if i == j { Cluster::Local } else { Cluster::Remote(names[j].into()) };
                    (c, allocated[j][&key])
                })
                .collect();
            want.sort();
            let mut got = s.pool.ids_of(&key);
            got.sort();
            assert_eq!(got, want);
        }
        let all = s.pool.snapshot_all();
        assert_eq!(all.len(), 90);
        let mut visited = 0;
        s.pool.foreach_all(|_, _, _| visited += 1);
        assert_eq!(visited, 90);
    }
    // Watching wrote nothing to any store.
    for (s, rev) in sites.iter().zip(before) {
        assert_eq!(revision(&*s.store).await, rev, "a remote view wrote to its store");
    }
    // New bindings reach the other clusters through the watch.
    let late = sites[1].pool.acquire_durable("late", "owner").await.expect("acquire").id;
    eventually("the late binding reaches site 0", || {
        sites[0].pool.key_of_any(late) == Some((Cluster::Remote("two".into()), "late".into()))
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn overlapping_remotes_are_refused_and_invalid_entries_dropped_and_counted() {
    if !have_etcd() {
        return;
    }
    let a = site(1).await;
    let twin = site(1).await; // same cluster ID: the same prefix bits
    let b = site(2).await;
    let err = a
        .pool
        .watch_remote("twin", Arc::new(connect(&twin.etcd.endpoints()[0]).await), remote_opts())
        .await
        .expect_err("an overlapping remote must be refused");
    assert!(matches!(err, Error::InvalidInput { .. }), "{err}");
    assert!(err.to_string().contains("overlap"), "{err}");
    assert!(a.pool.remotes().is_empty());

    // Foreign data in b: an ID record outside b's space, and one a user validator refuses.
    let l = Layout::new("idalloc").expect("layout");
    let good = b.pool.acquire_durable("fine", "o").await.expect("acquire").id;
    let put =
        |id: u64, key: &str| TxnOp::put(l.id_key(POOL, id), IdRecord::Bound(key.into()).encode());
    b.store
        .txn(TxnRequest::new().and_then([put(0x1_0005, "stray"), put(0x2_0007, "bad-key")]))
        .await
        .expect("raw write");
    let no_bad: Validator = idalloc::remote::upserts_only(|_, key: &str| {
        if key.starts_with("bad") {
            Err(format!("{key:?} is banned"))
        } else {
            Ok(())
        }
    });
    let opts = {
        let mut o = remote_opts();
        o.validators = vec![no_bad];
        o
    };
    let view = a
        .pool
        .watch_remote("b", Arc::new(connect(&b.etcd.endpoints()[0]).await), opts)
        .await
        .expect("watch b");
    tokio::time::timeout(Duration::from_secs(30), view.wait_synced()).await.expect("synced");
    assert_eq!(view.snapshot(), vec![(good, "fine".to_string())]);
    assert_eq!(view.dropped(), 2);
    assert_eq!(a.pool.key_of_any(0x2_0007), None);
    let mut ev = view.events();
    assert_eq!(ev.try_recv(), Some(Event::Upsert { id: good, key: "fine".into() }));
    assert_eq!(ev.try_recv(), Some(Event::Synced));

    // A watched put that fails validation is dropped; turning a shown binding invalid removes it.
    b.store.txn(TxnRequest::new().and_then([put(0x2_0009, "bad-too")])).await.expect("raw");
    b.store.txn(TxnRequest::new().and_then([put(good, "bad-now")])).await.expect("raw");
    let e = tokio::time::timeout(Duration::from_secs(30), ev.recv()).await.expect("event");
    assert_eq!(e, Some(Event::Delete { id: good, key: "fine".into() }));
    eventually("both drops counted", || view.dropped() == 4).await;
    assert!(view.snapshot().is_empty());
    drop((a.alloc, twin.alloc, b.alloc));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killed_and_paused_remote_goes_stale_serves_its_view_and_resyncs() {
    if !have_etcd() {
        return;
    }
    let mut b = site(2).await;
    let a = site(1).await;
    let mut ids = BTreeMap::new();
    for k in 0..20 {
        ids.insert(
            b.pool.acquire_durable(&format!("b{k}"), "o").await.expect("b").id,
            format!("b{k}"),
        );
    }
    let view = a
        .pool
        .watch_remote("b", Arc::new(connect(&b.etcd.endpoints()[0]).await), remote_opts())
        .await
        .expect("watch");
    tokio::time::timeout(Duration::from_secs(30), view.wait_synced()).await.expect("synced");
    let mut ev = a.pool.cluster_events();
    let cb = Cluster::Remote("b".into());
    // The replay: local's Synced, b's 20 bindings and its Synced.
    let replay = events_until_synced(&mut ev, &cb, 1).await;
    assert_eq!(replay.len(), 21);

    for (round, how) in ["STOP", "KILL"].into_iter().enumerate() {
        let pid = b.etcd.member_pid(0).expect("b's etcd runs");
        match how {
            "STOP" => b.etcd.pause_member(0).expect("SIGSTOP"),
            _ => b.etcd.kill_member(0).expect("kill -9"),
        }
        tokio::time::timeout(Duration::from_secs(30), view.wait_stale())
            .await
            .unwrap_or_else(|_| panic!("view of b not stale within 30 s after {how} of pid {pid}"));
        assert!(matches!(view.state(), RemoteState::Stale { .. }));
        // Local work goes on while the remote is away, and b's IDs still resolve.
        for k in 0..10 {
            let key = format!("a{round}-{k}");
            let got = a.pool.acquire(&key).await.expect("local acquire while remote is away");
            // (The local watch, not the remote, brings it into the cache.)
            let want = Some((Cluster::Local, key.clone()));
            eventually("local binding in view", || a.pool.key_of_any(got.id) == want).await;
            a.pool.release(&key).await.expect("local release while remote is away");
        }
        for (id, key) in &ids {
            assert_eq!(a.pool.key_of_any(*id), Some((cb.clone(), key.clone())));
        }
        match how {
            "STOP" => b.etcd.resume_member(0).expect("SIGCONT"),
            _ => b.etcd.restart_member(0).await.expect("restart"),
        }
        tokio::time::timeout(Duration::from_secs(30), view.wait_synced()).await.expect("resynced");
        // Nothing changed in b: the resync is exactly one Synced and no change.
        let got = events_until_synced(&mut ev, &cb, 1).await;
        assert_eq!(got, vec![Event::Synced], "after {how}");
        assert_eq!(view.snapshot().into_iter().collect::<BTreeMap<_, _>>(), ids);
    }
    // b's pool is deleted: every entry of it goes, with events.
    let b_alloc = b.alloc.clone();
    b_alloc.delete_pool(POOL, true).await.expect("delete b's pool");
    eventually("b's entries dropped", || view.is_empty()).await;
    let mut shown = ids.clone();
    let mut left = Vec::new();
    while shown.len() > left.len() {
        let e = tokio::time::timeout(Duration::from_secs(30), ev.recv()).await.expect("event");
        let e = e.expect("open");
        if e.cluster == cb {
            left.push(e.event);
            if left.len() == ids.len() {
                break;
            }
        }
    }
    apply(&mut shown, &left);
    assert!(shown.is_empty());
}

/// A TCP relay the test can cut (every connection closed, new ones refused) and heal.
struct Relay {
    addr: String,
    cut: Arc<AtomicBool>,
    conns: Arc<Mutex<Vec<AbortHandle>>>,
    accept: AbortHandle,
}

impl Relay {
    async fn start(upstream: &str) -> Relay {
        let upstream = upstream.trim_start_matches("http://").to_string();
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind relay");
        let addr = format!("http://{}", listener.local_addr().expect("addr"));
        let cut = Arc::new(AtomicBool::new(false));
        let conns: Arc<Mutex<Vec<AbortHandle>>> = Arc::default();
        let (c, cs) = (cut.clone(), conns.clone());
        let accept = tokio::spawn(async move {
            while let Ok((mut down, _)) = listener.accept().await {
                if c.load(Ordering::SeqCst) {
                    continue; // dropped: refused
                }
                let up = upstream.clone();
                let t = tokio::spawn(async move {
                    if let Ok(mut up) = TcpStream::connect(&up).await {
                        let _ = tokio::io::copy_bidirectional(&mut down, &mut up).await;
                    }
                });
                cs.lock().expect("relay lock").push(t.abort_handle());
            }
        })
        .abort_handle();
        Relay { addr, cut, conns, accept }
    }

    fn cut(&self) {
        self.cut.store(true, Ordering::SeqCst);
        for t in self.conns.lock().expect("relay lock").drain(..) {
            t.abort();
        }
    }

    fn heal(&self) {
        self.cut.store(false, Ordering::SeqCst);
    }
}

impl Drop for Relay {
    fn drop(&mut self) {
        self.accept.abort();
        self.cut();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn changes_and_compaction_while_away_come_back_as_the_exact_difference() {
    if !have_etcd() {
        return;
    }
    let b = site(2).await;
    let a = site(1).await;
    for k in 0..30 {
        b.pool.acquire_durable(&format!("b{k}"), "o").await.expect("b");
    }
    let relay = Relay::start(&b.etcd.endpoints()[0]).await;
    let view = a
        .pool
        .watch_remote("b", Arc::new(connect(&relay.addr).await), remote_opts())
        .await
        .expect("watch");
    tokio::time::timeout(Duration::from_secs(30), view.wait_synced()).await.expect("synced");
    let cb = Cluster::Remote("b".into());
    let mut ev = a.pool.cluster_events();
    let mut shown = BTreeMap::new();
    apply(&mut shown, &events_until_synced(&mut ev, &cb, 1).await);
    assert_eq!(shown, truth(&*b.store).await);

    relay.cut();
    tokio::time::timeout(Duration::from_secs(30), view.wait_stale()).await.expect("stale");
    // While a is away, b releases some keys, binds new ones, and compacts its history.
    for k in 0..10 {
        b.pool.release_durable(&format!("b{k}"), "o").await.expect("release");
    }
    for k in 0..7 {
        b.pool.acquire_durable(&format!("new{k}"), "o").await.expect("acquire");
    }
    b.pool.acquire_durable("flash", "o").await.expect("acquire");
    b.pool.release_durable("flash", "o").await.expect("release"); // came and went: no event
    let rev = revision(&*b.store).await;
    b.store.compact(rev).await.expect("compact");
    let after = truth(&*b.store).await;
    assert_eq!(after.len(), 27);
    assert_eq!(view.len(), 30, "the stale view keeps serving what it knew");

    relay.heal();
    tokio::time::timeout(Duration::from_secs(30), view.wait_synced()).await.expect("resynced");
    let diff = events_until_synced(&mut ev, &cb, 1).await;
    let deletes: BTreeSet<u64> = diff
        .iter()
        .filter_map(|e| match e {
            Event::Delete { id, .. } => Some(*id),
            _ => None,
        })
        .collect();
    let upserts: BTreeSet<u64> = diff
        .iter()
        .filter_map(|e| match e {
            Event::Upsert { id, .. } => Some(*id),
            _ => None,
        })
        .collect();
    // The exact difference: 10 synthetic Deletes, 7 Upserts, one Synced, nothing else.
    assert_eq!((deletes.len(), upserts.len(), diff.len()), (10, 7, 18), "{diff:?}");
    apply(&mut shown, &diff);
    assert_eq!(shown, after);
    assert_eq!(view.snapshot().into_iter().collect::<BTreeMap<_, _>>(), after);

    // remove_remote: a Delete for every binding b contributed.
    assert!(a.pool.remove_remote("b"));
    assert!(!a.pool.remove_remote("b"));
    let mut gone = Vec::new();
    while gone.len() < after.len() {
        let e = tokio::time::timeout(Duration::from_secs(10), ev.recv())
            .await
            .expect("delete events")
            .expect("open");
        if e.cluster == cb {
            gone.push(e.event);
        }
    }
    apply(&mut shown, &gone);
    assert!(shown.is_empty());
    assert!(a.pool.snapshot_all().iter().all(|(c, _, _)| *c == Cluster::Local));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stale_ttl_drops_a_remote_that_stays_away_and_it_comes_back_on_reconnect() {
    if !have_etcd() {
        return;
    }
    let b = site(2).await;
    let a = site(1).await;
    for k in 0..5 {
        b.pool.acquire_durable(&format!("b{k}"), "o").await.expect("b");
    }
    let relay = Relay::start(&b.etcd.endpoints()[0]).await;
    let opts = {
        let mut o = remote_opts();
        o.stale_ttl = Some(Duration::from_secs(1));
        o
    };
    let view =
        a.pool.watch_remote("b", Arc::new(connect(&relay.addr).await), opts).await.expect("watch");
    tokio::time::timeout(Duration::from_secs(30), view.wait_synced()).await.expect("synced");
    assert_eq!(view.len(), 5);
    let mut ev = view.events();
    let mut shown = BTreeMap::new();
    let mut replay = Vec::new();
    while let Some(e) = ev.try_recv() {
        replay.push(e);
    }
    apply(&mut shown, &replay);
    relay.cut();
    eventually("entries dropped after the stale TTL", || view.is_empty()).await;
    assert!(matches!(view.state(), RemoteState::Stale { .. }));
    let mut dropped = Vec::new();
    for _ in 0..5 {
        dropped.push(
            tokio::time::timeout(Duration::from_secs(10), ev.recv())
                .await
                .expect("ev")
                .expect("open"),
        );
    }
    apply(&mut shown, &dropped);
    assert!(shown.is_empty());
    relay.heal();
    tokio::time::timeout(Duration::from_secs(30), view.wait_synced()).await.expect("resynced");
    assert_eq!(view.snapshot().into_iter().collect::<BTreeMap<_, _>>(), truth(&*b.store).await);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn late_subscribers_on_other_threads_see_replay_one_synced_then_live_events_in_order() {
    if !have_etcd() {
        return;
    }
    let b = Arc::new(site(2).await);
    let a = site(1).await;
    for k in 0..50 {
        b.pool.acquire_durable(&format!("k{k}"), "o").await.expect("b");
    }
    let remote = Arc::new(connect_patient(&b.etcd.endpoints()[0]).await);
    let view = a.pool.watch_remote("b", remote, patient_remote_opts()).await.expect("watch");
    // Churn in b (and locally) while subscribers arrive on other threads at different times.
    let churn = {
        let b = b.clone();
        tokio::spawn(async move {
            for i in 0..150 {
                let key = format!("k{}", i % 70);
                if i % 3 == 0 {
                    let _ = b.pool.release_durable(&key, "o").await;
                } else {
                    let _ = b.pool.acquire_durable(&key, "o").await;
                }
            }
        })
    };
    // Once the churn is over and the view shows the final bindings, the test sends them to the
    // subscribers, who read on until their events describe them (then take what else is queued,
    // so an extra event still fails the checks below). A quiet period is no sign of the end: a
    // loaded machine can pause the churn for longer than any.
    let (fin_tx, fin_rx) = tokio::sync::watch::channel(None::<BTreeMap<u64, String>>);
    let mut subs = Vec::new();
    for s in 0..6 {
        let v = view.clone();
        let p = a.pool.clone();
        let mut fin_rx = fin_rx.clone();
        subs.push(tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(40 * s)).await;
            let (mut ev, mut all) = (v.events(), p.cluster_events());
            let mut got = Vec::new();
            let mut got_all = Vec::new();
            let b_part = |all: &[ClusterEvent]| {
                all.iter()
                    .filter(|e| e.cluster == Cluster::Remote("b".into()))
                    .map(|e| e.event.clone())
                    .collect::<Vec<_>>()
            };
            let shows = |events: &[Event], fin: &Option<BTreeMap<u64, String>>| {
                let mut m = BTreeMap::new();
                apply(&mut m, events);
                fin.as_ref() == Some(&m)
            };
            loop {
                let fin = fin_rx.borrow_and_update().clone();
                if shows(&got, &fin) && shows(&b_part(&got_all), &fin) {
                    break;
                }
                tokio::select! {
                    e = ev.recv() => got.push(e.expect("view events open")),
                    e = all.recv() => got_all.push(e.expect("cluster events open")),
                    r = fin_rx.changed() => r.expect("the test sends the final bindings"),
                    _ = tokio::time::sleep(Duration::from_secs(60)) => {
                        panic!("no event for 60 s; view {got:?}; final {fin:?}")
                    }
                }
            }
            got.extend(std::iter::from_fn(|| ev.try_recv()));
            got_all.extend(std::iter::from_fn(|| all.try_recv()));
            (got, got_all)
        }));
    }
    churn.await.expect("churn");
    let want = truth(&*b.store).await;
    eventually("view caught up", || {
        view.snapshot().into_iter().collect::<BTreeMap<_, _>>() == want
    })
    .await;
    fin_tx.send_replace(Some(want.clone()));
    let mut results = Vec::new();
    for s in subs {
        results.push(s.await.expect("subscriber"));
    }
    let fin = want;
    for (got, got_all) in results {
        // Shape: Upserts (the replay), then exactly one Synced per listing (one here), then live
        // changes; replayed and live events together describe the final view exactly.
        let first_synced = got.iter().position(|e| *e == Event::Synced);
        if let Some(p) = first_synced {
            assert!(got[..p].iter().all(|e| matches!(e, Event::Upsert { .. })), "{got:?}");
        }
        assert!(got.iter().filter(|e| **e == Event::Synced).count() <= 1, "{got:?}");
        assert!(!got.iter().any(|e| matches!(e, Event::Lagged { .. })));
        let mut m = BTreeMap::new();
        apply(&mut m, &got);
        assert_eq!(m, fin);
        // The all-clusters subscription: b's part tells the same story.
        let mine: Vec<Event> = got_all
            .iter()
            .filter(|e: &&ClusterEvent| e.cluster == Cluster::Remote("b".into()))
            .map(|e| e.event.clone())
            .collect();
        let mut m = BTreeMap::new();
        apply(&mut m, &mine);
        assert_eq!(m, fin);
    }
}

/// A remote pool re-created with another spec (DESIGN §12): the view notices (the spec record's
/// create revision changes in its watch), re-validates the new spec against the local pool and
/// re-lists. Re-created (by hand) with the local pool's prefix bits, it is refused: state
/// `Refused`, a refusal naming the overlap, its entries dropped with `Delete` events, nothing
/// answered from it. Deleted and re-created with prefix bits of its own, it comes back with the
/// new spec and the new bindings, then one `Synced`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_remote_pool_recreated_with_another_spec_is_revalidated_and_refused_or_relisted() {
    if !have_etcd() {
        return;
    }
    let a = site(1).await;
    let b = site(2).await;
    let old = b.pool.acquire_durable("old", "o").await.expect("acquire").id;
    let view = a
        .pool
        .watch_remote("b", Arc::new(connect(&b.etcd.endpoints()[0]).await), remote_opts())
        .await
        .expect("watch b");
    tokio::time::timeout(Duration::from_secs(30), view.wait_synced()).await.expect("synced");
    let cb = Cluster::Remote("b".into());
    assert_eq!(a.pool.key_of_any(old), Some((cb.clone(), "old".to_string())));
    let mut ev = view.events();
    assert_eq!(ev.try_recv(), Some(Event::Upsert { id: old, key: "old".into() }));
    assert_eq!(ev.try_recv(), Some(Event::Synced));

    // The spec record replaced by hand with cluster a's prefix bits; b's ID records stay.
    let l = Layout::new("idalloc").expect("layout");
    let spec_key = l.pool_spec_key(POOL);
    b.store.txn(TxnRequest::new().and_then([TxnOp::delete(spec_key.clone())])).await.expect("del");
    b.store
        .txn(TxnRequest::new().and_then([TxnOp::put(spec_key.clone(), spec(1).to_json())]))
        .await
        .expect("put");
    eventually("view refused", || view.state() == RemoteState::Refused).await;
    let why = view.refusal().expect("a refusal");
    assert!(why.contains("overlap") && why.contains("local"), "{why}");
    let e = tokio::time::timeout(Duration::from_secs(30), ev.recv()).await.expect("event");
    assert_eq!(e, Some(Event::Delete { id: old, key: "old".into() }));
    assert!(view.snapshot().is_empty());
    assert_eq!(a.pool.key_of_any(old), None, "nothing answered from a refused view");
    assert_eq!(a.pool.ids_of("old"), vec![]);

    // Deleted and re-created properly, with prefix bits of its own (cluster 3).
    let b2 = Allocator::from_arc(b.store.clone(), AllocatorOptions::default()).expect("alloc");
    assert!(b2.delete_pool(POOL, true).await.expect("delete pool"));
    let p3 = b2.ensure_pool(&spec(3)).await.expect("re-create");
    let new = p3.acquire_durable("new", "o").await.expect("acquire").id;
    assert_eq!(new >> 16, 3);
    let mut seen = Vec::new();
    while !(seen.contains(&Event::Synced)
        && seen.contains(&Event::Upsert { id: new, key: "new".into() }))
    {
        let e = tokio::time::timeout(Duration::from_secs(30), ev.recv())
            .await
            .unwrap_or_else(|_| panic!("no Upsert of new and Synced within 30 s: {seen:?}"))
            .expect("stream open");
        seen.push(e);
    }
    assert!(
        seen.iter()
            .all(|e| matches!(e, Event::Synced)
                || *e == Event::Upsert { id: new, key: "new".into() }),
        "only the new binding and Synced: {seen:?}"
    );
    eventually("synced with the new spec", || view.state() == RemoteState::Synced).await;
    assert_eq!(view.spec(), spec(3));
    assert_eq!(view.refusal(), None);
    assert_eq!(view.snapshot(), vec![(new, "new".to_string())]);
    assert_eq!(a.pool.key_of_any(new), Some((cb, "new".to_string())));
    assert_eq!(a.pool.key_of_any(old), None);
    drop((a.alloc, b.alloc, b2));
}
