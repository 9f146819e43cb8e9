//! The Rust client crate (`idalloc-client`) against real `idalloc serve` processes on a real etcd:
//! sessions and their keep-alive, failover between two replicas keeping a
//! session's references, and the watch-fed cache equal to the store after churn.
//!
//! etcd: `IDALLOC_TEST_ETCD` if set, else a private etcd (`idalloc_testkit::etcd`); each test
//! uses its own key prefix. Every `serve` is stopped by its PID when the test ends.

use std::collections::BTreeSet;
use std::time::Duration;

use idalloc::{Error, Event, Input, PoolSpec};
use idalloc_client::{Client, ClientOptions, Pool};
use idalloc_testkit::serve::Serve;

fn bin() -> &'static str {
    env!("CARGO_BIN_EXE_idalloc")
}

fn unique_prefix() -> String {
    let p = String::from_utf8(idalloc_testkit::etcd::unique_prefix()).expect("utf-8 prefix");
    p.trim_matches('/').replace('/', "-")
}

fn start_serve(etcd: &str, prefix: &str) -> Serve {
    Serve::start(bin(), &["--store", etcd, "--prefix", prefix, "--timeout", "3s"], &[])
}

fn client(endpoints: &[&Serve]) -> Client {
    let urls: Vec<String> = endpoints.iter().map(|s| s.http("")).collect();
    let opts = ClientOptions::builder()
        .backoff_base(Duration::from_millis(50))
        .backoff_max(Duration::from_millis(500))
        // The client's own session: renewed every second.
        .session_ttl(Duration::from_secs(3))
        .build()
        .unwrap();
    Client::new(urls, opts).expect("client")
}

/// The holders of `key` as the service lists them (from the store), or None if it is unbound.
async fn holders(pool: &Pool, key: &str) -> Option<Vec<String>> {
    let list = pool.list().await.expect("list");
    list.into_iter().find(|b| b.key == key).map(|b| b.holders)
}

/// The holders of the sessions an instance serves (`GET /v1/sessions`, admin without tokens).
async fn instance_sessions(s: &Serve) -> Vec<String> {
    let r = reqwest::get(s.http("/v1/sessions")).await.expect("list sessions");
    let v: serde_json::Value = r.json().await.expect("json");
    let list = v["sessions"].as_array().cloned().unwrap_or_default();
    list.iter().filter_map(|s| s["holder"].as_str().map(str::to_string)).collect()
}

/// Polls `f` until it holds; fails the test after a minute (a bound for a broken client, never
/// a measure of speed).
async fn eventually<F, Fut>(what: &str, mut f: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    while !f().await {
        assert!(tokio::time::Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sessions_keep_alive_and_the_pool_api_works_over_http() {
    let Some(etcd) = idalloc_testkit::etcd::test_etcd_endpoint().await else { return };
    let s = start_serve(&etcd.endpoint(), &unique_prefix());
    let c = client(&[&s]);
    let pool = c.ensure_pool(&PoolSpec::new("p", 1, 1000)).await.expect("pool");
    let mut events = pool.events();

    // An explicit session: idempotent acquires, renewed in the background past its TTL.
    let sess = c.session(Duration::from_secs(2)).await.expect("session");
    let a = sess.acquire(&pool, "a").await.expect("acquire");
    assert!(a.new);
    assert_eq!(sess.acquire(&pool, "a").await.expect("again").id, a.id);
    let many = sess.acquire_many(&pool, &["b".into(), "c".into()]).await.expect("many");
    assert_eq!(many.len(), 2);
    tokio::time::sleep(Duration::from_secs(5)).await;
    assert!(!sess.is_lost());
    assert_eq!(holders(&pool, "a").await, Some(vec![sess.holder().to_string()]), "renewed");

    // The client's own session: refcounted like the library's Pool::acquire.
    let k = pool.acquire("k").await.expect("own acquire");
    assert_eq!(pool.acquire("k").await.expect("counted").id, k.id);
    assert_eq!(pool.held(), vec![("k".to_string(), k.id, 2)]);
    let r = pool.release("k").await.expect("release");
    assert!(r.held && !r.reclaimed, "{r:?}");
    assert!(holders(&pool, "k").await.is_some_and(|h| h.len() == 1), "one count left");
    let r = pool.release("k").await.expect("last release");
    assert!(r.held && r.reclaimed, "{r:?}");
    assert!(!pool.release("k").await.expect("not held").held);

    // Durable references, consistent reads, and the watch-fed view.
    let d = pool.acquire_durable("d", "ops").await.expect("durable");
    assert_eq!(pool.get_consistent("d").await.expect("consistent"), Some(d.id));
    assert_eq!(pool.key_of_consistent(d.id).await.expect("key_of").as_deref(), Some("d"));
    assert_eq!(pool.get_consistent("nope").await.expect("absent"), None);
    pool.wait_synced().await.expect("synced");
    eventually("the view to see d", || async { pool.get("d") == Some(d.id) }).await;
    assert_eq!(pool.key_of(a.id).as_deref(), Some("a"));
    let mut seen = Vec::new();
    while let Ok(Some(e)) = tokio::time::timeout(Duration::from_millis(200), events.recv()).await {
        seen.push(e);
    }
    assert!(seen.contains(&Event::Upsert { id: d.id, key: "d".into() }), "{seen:?}");

    // Errors are the library's: a durable holder in the sessions' namespace, a missing pool.
    match pool.acquire_durable("x", sess.holder()).await {
        Err(Error::InvalidInput { input: Input::Holder, .. }) => {}
        other => panic!("expected holder_reserved as InvalidInput(Holder), got {other:?}"),
    }
    assert!(
        matches!(c.pool("absent").await, Err(Error::PoolNotFound { pool }) if pool == "absent")
    );

    // The client's own session ended behind its back (an admin here; a TTL missed while every
    // replica was unreachable is the same): the client replaces it and references its held keys
    // again, as the library does after losing its lease.
    pool.acquire("kept").await.expect("own acquire");
    let old = holders(&pool, "kept").await.expect("bound").concat();
    let http = reqwest::Client::new();
    let end = http.delete(s.http(&format!("/v1/sessions/{old}"))).send().await.expect("admin end");
    assert_eq!(end.status().as_u16(), 200);
    eventually("the held key to be referenced by a new own session", || async {
        holders(&pool, "kept").await.is_some_and(|h| h.len() == 1 && h[0] != old)
    })
    .await;
    let id = pool.get_consistent("kept").await.expect("read").expect("bound");
    assert_eq!(pool.held(), vec![("kept".to_string(), id, 1)]);

    // Ending the session drops its references at once; the session then refuses.
    assert!(sess.end().await.expect("end"));
    // Unbound already if the sweeper (every second) came by.
    assert!(holders(&pool, "a").await.is_none_or(|h| h.is_empty()), "the reference went");
    match sess.acquire(&pool, "z").await {
        Err(Error::InvalidInput { input: Input::SessionGone, .. }) => {}
        other => panic!("expected SessionGone, got {other:?}"),
    }
    c.close().await.expect("close");
}

/// Failover: acquire with a session on replica A, kill A by its PID, and the
/// client goes on with B: the keep-alive continues (nothing expires over several TTLs), the same
/// IDs come back, release works, and the cache follows B's watch.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_fails_over_between_two_replicas_keeping_its_references() {
    let Some(etcd) = idalloc_testkit::etcd::test_etcd_endpoint().await else { return };
    let prefix = unique_prefix();
    let mut a = start_serve(&etcd.endpoint(), &prefix);
    let b = start_serve(&etcd.endpoint(), &prefix);
    // A first: every call goes to A while it answers.
    let c = client(&[&a, &b]);
    let pool = c.ensure_pool(&PoolSpec::new("p", 1, 100_000)).await.expect("pool");
    let sess = c.session(Duration::from_secs(2)).await.expect("session");
    let keys: Vec<String> = (0..10).map(|i| format!("k{i}")).collect();
    let before = sess.acquire_many(&pool, &keys).await.expect("acquire on A");
    let own = pool.acquire("own").await.expect("own session on A");
    pool.wait_synced().await.expect("synced");
    eventually("the view to hold the keys", || async { pool.get("k9") == Some(before[9].id) })
        .await;

    // The session lives on A; B has never seen it.
    assert!(instance_sessions(&a).await.contains(&sess.holder().to_string()));
    assert!(!instance_sessions(&b).await.contains(&sess.holder().to_string()));

    a.kill9();

    // Several TTLs pass: only renewals through B can keep the lease.
    tokio::time::sleep(Duration::from_secs(7)).await;
    assert!(!sess.is_lost(), "the session was lost after A died");
    for (k, got) in keys.iter().zip(&before) {
        assert_eq!(holders(&pool, k).await, Some(vec![sess.holder().to_string()]), "{k}");
        let again = sess.acquire(&pool, k).await.expect("acquire on B");
        assert_eq!((again.id, again.new), (got.id, false), "{k} kept its ID");
    }
    assert!(instance_sessions(&b).await.contains(&sess.holder().to_string()), "B adopted it");
    assert_eq!(pool.acquire("own").await.expect("own again").id, own.id);
    assert_eq!(
        holders(&pool, "own").await.map(|h| h.len()),
        Some(1),
        "the own session's ref lived"
    );

    // Release works through B, and the view (now fed by B's watch) follows.
    let r = sess.release(&pool, "k0").await.expect("release on B");
    assert!(r.held && r.reclaimed, "{r:?}");
    let fresh = sess.acquire(&pool, "new-on-b").await.expect("acquire new on B");
    eventually("the view to follow B", || async {
        pool.get("k0").is_none() && pool.get("new-on-b") == Some(fresh.id)
    })
    .await;
    // Another keep-alive period, and the renewal still works.
    assert!(sess.keep_alive().await.expect("renew on B"));
    assert!(sess.end().await.expect("end on B"));
    assert!(holders(&pool, "k1").await.is_none_or(|h| h.is_empty()), "the reference went");
}

/// A session id names its lease, but only its secret opens it: another replica refuses an id with
/// the right lease and a wrong secret, and one whose lease is gone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn another_replica_adopts_a_session_only_with_its_secret() {
    let Some(etcd) = idalloc_testkit::etcd::test_etcd_endpoint().await else { return };
    let prefix = unique_prefix();
    let a = start_serve(&etcd.endpoint(), &prefix);
    let b = start_serve(&etcd.endpoint(), &prefix);
    let http = reqwest::Client::new();
    let post =
        |s: &Serve, path: &str, body: serde_json::Value| http.post(s.http(path)).json(&body).send();
    post(&a, "/v1/pools", serde_json::json!({"name": "p", "min": 1, "max": 100}))
        .await
        .expect("pool");
    let opened: serde_json::Value = post(&a, "/v1/sessions", serde_json::json!({"ttl": 30}))
        .await
        .expect("open")
        .json()
        .await
        .expect("json");
    let sid = opened["session"].as_str().expect("id").to_string();
    let mut forged = sid.clone();
    let last = if sid.ends_with('0') { "1" } else { "0" };
    forged.replace_range(sid.len() - 1.., last);
    for (id, status) in [(&forged, 404), (&sid, 200)] {
        let r = post(&b, "/v1/pools/p/acquire", serde_json::json!({"key": "k", "session": id}))
            .await
            .expect("acquire on B");
        assert_eq!(r.status().as_u16(), status, "{}", r.text().await.unwrap_or_default());
    }
    let end = http.delete(b.http(&format!("/v1/sessions/{sid}"))).send().await.expect("end");
    assert_eq!(end.status().as_u16(), 200);
    // Ended on B: A, which opened it, finds it gone too.
    let r = post(&a, "/v1/pools/p/acquire", serde_json::json!({"key": "k2", "session": sid}))
        .await
        .expect("acquire on A");
    assert_eq!(r.status().as_u16(), 404);
}

/// The Proof's churn: several clients on two replicas acquire and release at once; afterwards an
/// observer's watch-fed cache equals the store's listing, binding for binding.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_cache_equals_the_store_after_churn() {
    let Some(etcd) = idalloc_testkit::etcd::test_etcd_endpoint().await else { return };
    let prefix = unique_prefix();
    let a = start_serve(&etcd.endpoint(), &prefix);
    let b = start_serve(&etcd.endpoint(), &prefix);
    let observer = client(&[&b, &a]);
    let spec = PoolSpec::new("p", 1, 10_000);
    let watched = observer.ensure_pool(&spec).await.expect("pool");
    watched.wait_synced().await.expect("synced");

    let mut tasks = Vec::new();
    for agent in 0..4u64 {
        let c = if agent % 2 == 0 { client(&[&a, &b]) } else { client(&[&b, &a]) };
        tasks.push(tokio::spawn(async move {
            let pool = c.pool("p").await.expect("pool");
            let sess = c.session(Duration::from_secs(10)).await.expect("session");
            for step in 0..60u64 {
                let key = format!("k{}", (agent * 7 + step * 13) % 25);
                match step % 4 {
                    0 | 1 => drop(sess.acquire(&pool, &key).await.expect("acquire")),
                    2 => drop(sess.release(&pool, &key).await.expect("release")),
                    _ => {
                        pool.acquire_durable(&key, &format!("d{agent}")).await.expect("durable");
                        pool.release_durable(&key, &format!("d{agent}")).await.expect("release d");
                    }
                }
            }
            // Half the agents leave their session's references; the others end theirs.
            if agent % 2 == 1 {
                sess.end().await.expect("end");
            }
            (c, sess)
        }));
    }
    let mut keep = Vec::new();
    for t in tasks {
        keep.push(t.await.expect("agent"));
    }
    // The ended sessions' bindings wait for the sweeper (every second); after it, nothing changes
    // until the sentinel.
    eventually("the sweeper to reclaim what nobody references", || async {
        watched.list().await.expect("list").iter().all(|b| !b.holders.is_empty())
    })
    .await;
    // A barrier through the store: once the view has the sentinel, it has every change before it
    // (the watch is ordered).
    let sentinel = watched.acquire_durable("sentinel", "ops").await.expect("sentinel");
    eventually("the view to see the sentinel", || async {
        watched.get("sentinel") == Some(sentinel.id)
    })
    .await;
    let listed: BTreeSet<(u64, String)> =
        watched.list().await.expect("list").into_iter().map(|b| (b.id, b.key)).collect();
    let cached: BTreeSet<(u64, String)> = watched.snapshot().into_iter().collect();
    assert!(listed.len() > 1, "the churn left bindings: {listed:?}");
    assert_eq!(cached, listed);
    drop(keep);
}

fn write_secret(path: &std::path::Path, text: &str) {
    use std::os::unix::fs::PermissionsExt;
    std::fs::write(path, text).expect("write");
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600)).expect("chmod");
}

/// With tokens, a session stays its opener's on every replica: the record another replica adopts
/// it by names the client, so another client presenting the id there is refused as on the
/// replica that opened it, and the opener's own client fails over with its token.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_tokens_a_session_is_its_openers_on_every_replica() {
    let Some(etcd) = idalloc_testkit::etcd::test_etcd_endpoint().await else { return };
    let dir = tempfile::tempdir().expect("tempdir");
    let token = |name: &str| format!("tok-{name}-{}-0123456789abcdef", std::process::id());
    let (alice, bob, ops) = (token("alice"), token("bob"), token("ops"));
    write_secret(&dir.path().join("alice.token"), &alice);
    write_secret(&dir.path().join("bob.token"), &bob);
    write_secret(&dir.path().join("ops.token"), &ops);
    let tokens = dir.path().join("tokens");
    write_secret(
        &tokens,
        "alice allocate file:alice.token\nbob allocate file:bob.token\nops admin file:ops.token\n",
    );
    let tokens = tokens.to_str().expect("utf-8").to_string();
    let (store, prefix) = (etcd.endpoint(), unique_prefix());
    let global = ["--store", store.as_str(), "--prefix", prefix.as_str(), "--timeout", "3s"];
    let serve = || Serve::start(bin(), &global, &["--auth-tokens", &tokens]);
    let (mut a, b) = (serve(), serve());
    let opts = |t: &str| ClientOptions::builder().token(t.to_string()).build().unwrap();
    let admin = Client::new([a.http(""), b.http("")], opts(&ops)).expect("admin client");
    admin.init_pool(&PoolSpec::new("p", 1, 1000)).await.expect("pool");
    let c = Client::new([a.http(""), b.http("")], opts(&alice)).expect("alice's client");
    let pool = c.pool("p").await.expect("pool");
    let sess = c.session(Duration::from_secs(2)).await.expect("session on A");
    let k = sess.acquire(&pool, "k").await.expect("acquire on A");

    // Bob holds alice's id: refused on B, which has to go to the store for it.
    let http = reqwest::Client::new();
    let id = http
        .post(a.http("/v1/sessions"))
        .bearer_auth(&alice)
        .json(&serde_json::json!({"ttl": 30}))
        .send()
        .await
        .expect("open a second session")
        .json::<serde_json::Value>()
        .await
        .expect("json")["session"]
        .as_str()
        .expect("id")
        .to_string();
    let as_bob = http
        .post(b.http("/v1/pools/p/acquire"))
        .bearer_auth(&bob)
        .json(&serde_json::json!({"key": "x", "session": id}))
        .send()
        .await
        .expect("bob on B");
    assert_eq!(as_bob.status().as_u16(), 404, "another client's session on another replica");

    // Alice's client loses A and goes on with B, with her token.
    a.kill9();
    tokio::time::sleep(Duration::from_secs(5)).await;
    assert!(!sess.is_lost(), "alice's session was lost after A died");
    let again = sess.acquire(&pool, "k").await.expect("acquire on B");
    assert_eq!((again.id, again.new), (k.id, false));
}

/// `GET` requests `serve` counted on `route` (its `idalloc_http_requests_total`, any status).
async fn gets_on(s: &Serve, route: &str) -> u64 {
    let text = reqwest::get(s.http("/metrics")).await.expect("metrics").text().await.expect("text");
    let route = format!("route=\"{route}\"");
    text.lines()
        .filter(|l| l.starts_with("idalloc_http_requests_total{"))
        .filter(|l| l.contains(&route) && l.contains("method=\"GET\""))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum::<f64>() as u64
}

/// Opening a pool reads the pools' specs, not the pool's usage: `GET /v1/pools/{pool}` counts
/// every key and ID record of the pool in etcd (an index walk per call), which every agent paid
/// on every (re)start of a storm. A missing pool still answers the service's
/// own error. Fails on the old client: each open was one `GET /v1/pools/{pool}`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn opening_a_pool_does_not_ask_the_service_to_count_its_bindings() {
    let Some(etcd) = idalloc_testkit::etcd::test_etcd_endpoint().await else { return };
    let s = start_serve(&etcd.endpoint(), &unique_prefix());
    let c = client(&[&s]);
    c.ensure_pool(&PoolSpec::new("p", 1, 1000)).await.expect("pool");
    let (by_name, listed) = (gets_on(&s, "/v1/pools/{pool}").await, gets_on(&s, "/v1/pools").await);

    let agent = client(&[&s]);
    for _ in 0..3 {
        let pool = agent.pool("p").await.expect("open");
        assert_eq!(pool.spec(), &PoolSpec::new("p", 1, 1000));
    }
    assert_eq!(gets_on(&s, "/v1/pools/{pool}").await, by_name, "no usage read to open a pool");
    assert_eq!(gets_on(&s, "/v1/pools").await, listed + 3, "one spec listing per open");

    match agent.pool("absent").await {
        Err(Error::PoolNotFound { pool }) => assert_eq!(pool, "absent"),
        other => panic!("a missing pool: {:?}", other.map(|p| p.spec().clone())),
    }
}

/// A TCP relay to `upstream` (`host:port`) on a free loopback port, keeping every byte of both
/// directions: the session ids the service hands out and the client sends back are in there.
async fn recording_relay(upstream: String) -> (String, std::sync::Arc<std::sync::Mutex<Vec<u8>>>) {
    let seen = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let url = format!("http://{}", listener.local_addr().expect("addr"));
    let kept = seen.clone();
    tokio::spawn(async move {
        while let Ok((client, _)) = listener.accept().await {
            let Ok(server) = tokio::net::TcpStream::connect(&upstream).await else { continue };
            let (cr, cw) = client.into_split();
            let (sr, sw) = server.into_split();
            tokio::spawn(pump(cr, sw, kept.clone()));
            tokio::spawn(pump(sr, cw, kept.clone()));
        }
    });
    (url, seen)
}

/// Copies `from` to `to` until either ends, keeping a copy of every byte in `kept`.
async fn pump(
    mut from: impl tokio::io::AsyncRead + Unpin,
    mut to: impl tokio::io::AsyncWrite + Unpin,
    kept: std::sync::Arc<std::sync::Mutex<Vec<u8>>>,
) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut buf = vec![0u8; 16 * 1024];
    while let Ok(n) = from.read(&mut buf).await {
        if n == 0 || to.write_all(&buf[..n]).await.is_err() {
            break;
        }
        kept.lock().unwrap_or_else(|p| p.into_inner()).extend_from_slice(&buf[..n]);
    }
    let _ = to.shutdown().await;
}

/// The session ids in `bytes`: every `"session":"…"` the service answered or the client sent.
fn session_ids(bytes: &[u8]) -> BTreeSet<String> {
    let text = String::from_utf8_lossy(bytes);
    text.split("\"session\":\"")
        .skip(1)
        .filter_map(|rest| rest.split('"').next())
        .filter(|id| !id.is_empty())
        .map(str::to_string)
        .collect()
}

/// A log writer into a shared buffer.
#[derive(Clone)]
struct Captured(std::sync::Arc<std::sync::Mutex<Vec<u8>>>);

impl std::io::Write for Captured {
    fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap_or_else(|p| p.into_inner()).extend_from_slice(b);
        Ok(b.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// The client keeps its secrets: neither its token nor a session id (a capability: whoever has
/// it acts as the session) appears in its errors, its `Debug` output or its logs (every target,
/// at trace), through a session's life, its renewals, a service that goes away and its loss.
#[tokio::test]
async fn the_client_puts_no_token_or_session_id_in_errors_debug_or_logs() {
    let Some(etcd) = idalloc_testkit::etcd::test_etcd_endpoint().await else { return };
    let logs = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let writer = Captured(logs.clone());
    let subscriber = tracing_subscriber::fmt()
        .with_max_level(tracing::Level::TRACE)
        .with_ansi(false)
        .with_writer(move || writer.clone())
        .finish();
    let _guard = tracing::subscriber::set_default(subscriber);

    let dir = tempfile::tempdir().expect("tempdir");
    let token = format!("tok-alice-{}-fedcba9876543210", std::process::id());
    write_secret(&dir.path().join("alice.token"), &token);
    let tokens = dir.path().join("tokens");
    write_secret(&tokens, "alice admin file:alice.token\n");
    let tokens = tokens.to_str().expect("utf-8").to_string();
    let (store, prefix) = (etcd.endpoint(), unique_prefix());
    let global = ["--store", store.as_str(), "--prefix", prefix.as_str(), "--timeout", "3s"];
    let mut s = Serve::start(bin(), &global, &["--auth-tokens", &tokens]);
    let upstream = s.http("").trim_start_matches("http://").trim_end_matches('/').to_string();
    let (url, wire) = recording_relay(upstream).await;
    let opts = ClientOptions::builder()
        .token(token.clone())
        .session_ttl(Duration::from_secs(2))
        .backoff_base(Duration::from_millis(50))
        .backoff_max(Duration::from_millis(200))
        .build()
        .unwrap();
    let c = Client::new([url], opts).expect("client");
    c.init_pool(&PoolSpec::new("p", 1, 100)).await.expect("pool");
    let pool = c.pool("p").await.expect("pool");
    let sess = c.session(Duration::from_secs(2)).await.expect("session");
    sess.acquire(&pool, "k").await.expect("acquire");
    pool.acquire("own").await.expect("acquire on the client's own session");
    tokio::time::sleep(Duration::from_secs(3)).await; // renewals
    let mut texts = vec![format!("{c:?}"), format!("{pool:?}"), format!("{sess:?}")];

    // The service goes away: errors while it is gone, then the sessions are lost.
    s.kill9();
    for _ in 0..3 {
        match sess.acquire(&pool, "k2").await {
            Ok(a) => panic!("acquired without a service: {a:?}"),
            Err(e) => texts.extend([e.to_string(), format!("{e:?}")]),
        }
        if let Err(e) = pool.acquire("own2").await {
            texts.extend([e.to_string(), format!("{e:?}")]);
        }
    }
    tokio::time::sleep(Duration::from_secs(4)).await;
    texts.push(format!("{sess:?}"));
    let ids = session_ids(&wire.lock().unwrap_or_else(|p| p.into_inner()));
    assert!(ids.len() >= 2, "the relay saw both sessions' ids: {ids:?}");
    let logged =
        String::from_utf8_lossy(&logs.lock().unwrap_or_else(|p| p.into_inner())).to_string();
    assert!(logged.contains("idalloc_client"), "the client logged something: {logged}");
    texts.push(logged);
    for text in &texts {
        assert!(!text.contains(&token), "the token in: {text}");
        for id in &ids {
            assert!(!text.contains(id.as_str()), "session id {id} in: {text}");
        }
    }
}
