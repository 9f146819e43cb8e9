//! idalloc against a locked-down etcd: TLS with client-certificate authentication,
//! user authentication with a short token TTL and a role that covers only idalloc's prefix.
//!
//! Real parts only: certificates made at run time (rcgen), real etcd processes on free loopback
//! ports (killed by PID on drop). Each failure case must be a [`StoreError::Access`] naming the
//! endpoint and the cause, within the request timeout (the outer `timeout` is a hang detector, not
//! a speed assertion).

mod common;

use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use idalloc::store::etcd::{EtcdAuth, EtcdOptions, EtcdStore, EtcdTls};
use idalloc::store::{
    AccessCause, GetRequest, KeyRange, Store, StoreError, TxnOp, TxnRequest, WatchMessage,
};
use idalloc::{Allocator, AllocatorOptions, Error, PoolSpec};
use idalloc_testkit::conformance::{self, TestStore};
use idalloc_testkit::etcd::etcd_or_skip;
use idalloc_testkit::secure::{Grant, SecureEtcd, SecureSpec};

/// Longer than any request timeout used here: reaching it means a hang.
const HANG: Duration = Duration::from_secs(30);

/// etcd's simple-token TTL on the authenticated server: tokens expire after this long unused.
const TOKEN_TTL_S: u64 = 2;

fn have_etcd() -> bool {
    etcd_or_skip("the security tests")
}

async fn start(spec: SecureSpec) -> SecureEtcd {
    SecureEtcd::start(spec).await.unwrap_or_else(|e| panic!("{e}"))
}

/// Connects with `opts` and does one read, returning the error (the test expects one).
async fn refused(opts: EtcdOptions) -> StoreError {
    let attempt = async {
        let store = EtcdStore::connect(opts).await?;
        store.get(GetRequest::key("idalloc-secure/probe")).await.map(|_| ())
    };
    match tokio::time::timeout(HANG, attempt).await {
        Ok(Err(e)) => e,
        Ok(Ok(())) => panic!("expected a refusal, the read succeeded"),
        Err(_) => panic!("hang: no answer within {HANG:?}"),
    }
}

fn assert_access(e: &StoreError, cause: AccessCause, endpoint: &str, words: &str) {
    match e {
        StoreError::Access { endpoint: ep, cause: c, detail } => {
            assert_eq!(*c, cause, "{e}");
            assert!(ep.contains(endpoint), "endpoint {endpoint} not named: {e}");
            assert!(detail.contains(words), "expected {words:?} in: {e}");
        }
        other => panic!("expected an Access error ({cause:?}), got {other:?}"),
    }
    let line = e.to_string();
    assert!(!line.contains('\n'), "one line: {line}");
    assert!(!line.contains(SecureEtcd::PASSWORD), "password printed: {line}");
}

fn short(mut opts: EtcdOptions) -> EtcdOptions {
    opts.connect_timeout = Duration::from_secs(1);
    opts.request_timeout = Duration::from_secs(2);
    opts
}

/// Mutual TLS: a good client works; each wrong setting is refused with its cause named.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mutual_tls_works_and_every_misconfiguration_is_named() {
    if !have_etcd() {
        return;
    }
    let etcd = start(SecureSpec { tls: true, client_cert_auth: true, ..Default::default() }).await;
    let ep = etcd.endpoint();
    assert!(ep.starts_with("https://"), "{ep}");
    let pki = etcd.pki().clone();

    // The good client: reads and writes.
    let store = EtcdStore::connect(etcd.options(None)).await.expect("connect");
    let r = store
        .txn(TxnRequest::new().and_then([TxnOp::put("idalloc-secure/k", "v")]))
        .await
        .expect("put over mTLS");
    assert!(r.succeeded);
    let got = store.get(GetRequest::key("idalloc-secure/k")).await.expect("get over mTLS");
    assert_eq!(got.kvs[0].value, b"v");

    // Wrong CA: our side refuses the server.
    let mut o = short(etcd.options(None));
    o.tls = Some({
        let mut o = pki.client_tls();
        o.ca_file = Some(pki.other_ca.clone());
        o
    });
    assert_access(&refused(o).await, AccessCause::Tls, &ep, "not signed by a trusted CA");

    // No client certificate: the server refuses us.
    let mut o = short(etcd.options(None));
    o.tls = Some({
        let mut o = EtcdTls::default();
        o.ca_file = Some(pki.ca.clone());
        o
    });
    assert_access(&refused(o).await, AccessCause::Tls, &ep, "client certificate");

    // An expired client certificate, and one from a CA the server does not trust.
    for bad in [&pki.expired_client, &pki.stranger] {
        let mut o = short(etcd.options(None));
        o.tls = Some({
            let mut o = pki.client_tls();
            o.cert_file = Some(bad.cert.clone());
            o.key_file = Some(bad.key.clone());
            o
        });
        assert_access(&refused(o).await, AccessCause::Tls, &ep, "rejected the client certificate");
    }

    // A plain-text client against the TLS port.
    let plain = ep.replacen("https://", "http://", 1);
    let mut o = short(EtcdOptions::new([plain.clone()]));
    o.tls = None;
    assert_access(&refused(o).await, AccessCause::Tls, &plain, "speaks TLS");

    // --insecure-skip-tls-verify: no CA, still a client certificate; works (testing only).
    let mut o = short(etcd.options(None));
    o.tls = Some({
        let mut o = pki.client_tls();
        o.ca_file = None;
        o.insecure_skip_verify = true;
        o
    });
    let insecure = EtcdStore::connect(o).await.expect("connect insecure");
    let got = insecure.get(GetRequest::key("idalloc-secure/k")).await.expect("insecure read");
    assert_eq!(got.kvs[0].value, b"v");

    // Bad files are named before any network use.
    let mut o = etcd.options(None);
    o.tls = Some({
        let mut o = pki.client_tls();
        o.ca_file = Some(pki.client.key.clone());
        o
    });
    let e = EtcdStore::connect(o).await.expect_err("a key is not a CA");
    assert!(
        matches!(&e, StoreError::InvalidRequest(m) if m.contains("client.key") && m.contains("no PEM certificate")),
        "{e:?}"
    );
    let mut o = etcd.options(None);
    o.tls = Some({
        let mut o = pki.client_tls();
        o.key_file = None;
        o
    });
    let e = EtcdStore::connect(o).await.expect_err("cert without key");
    assert!(matches!(&e, StoreError::InvalidRequest(m) if m.contains("needs its key")), "{e:?}");
}

/// A TLS client against a plain-text etcd is named too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_client_against_plain_etcd_is_named() {
    if !have_etcd() {
        return;
    }
    let etcd = start(SecureSpec::default()).await;
    let ep = etcd.endpoint().replacen("http://", "https://", 1);
    let mut o = short(EtcdOptions::new([ep.clone()]));
    o.tls = Some(etcd.pki().client_tls());
    assert_access(&refused(o).await, AccessCause::Tls, &ep, "does not speak TLS");
}

fn user_allocator(store: Arc<EtcdStore>, holder: &str) -> Allocator {
    let opts = AllocatorOptions::builder()
        .prefix("idalloc-secure/alloc")
        .holder(holder)
        .session_ttl(Duration::from_secs(3))
        .build()
        .unwrap();
    Allocator::from_arc(store, opts).expect("allocator")
}

/// The full lock-down (mTLS + users + a role on the prefix only + 2 s tokens): the store
/// conformance cases and the allocator work as the restricted user, across several token
/// lifetimes and an etcd restart; nothing outside the prefix is reachable; wrong credentials are
/// named.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn restricted_user_works_inside_its_prefix_only_across_token_expiry_and_restart() {
    if !have_etcd() {
        return;
    }
    let mut etcd = start(SecureSpec {
        tls: true,
        client_cert_auth: true,
        auth: true,
        auth_token_ttl: Some(TOKEN_TTL_S),
    })
    .await;
    let ep = etcd.endpoint();
    let store = Arc::new(
        EtcdStore::connect(etcd.options(Some(SecureEtcd::user_auth()))).await.expect("connect"),
    );
    let dbg = format!("{store:?} {:?}", etcd.options(Some(SecureEtcd::user_auth())));
    assert!(!dbg.contains(SecureEtcd::PASSWORD), "password in Debug output: {dbg}");

    // The store's conformance cases that keep to one prefix, as the restricted user (not
    // `range_compare_holds_for_every_key`: it compares up to the end of the keyspace, which the
    // allocator never does and the role rightly refuses). They take
    // several token lifetimes in all (lease cases wait for expiry), so tokens expire between
    // requests and are renewed.
    macro_rules! cases {
        ($($case:ident),* $(,)?) => {$(
            let ts = TestStore::new(store.clone(), format!("idalloc-secure/{}/", stringify!($case)));
            conformance::$case(ts).await;
        )*};
    }
    cases!(
        txn_then_else_and_responses_per_op,
        compare_ops_on_each_target,
        nested_txn_compares_see_state_before_outer_txn,
        get_at_old_revision,
        get_future_revision,
        delete_range_counts,
        lease_expiry_deletes_keys_and_watch_sees_deletes,
        lease_revoke_deletes_keys,
        lease_keep_alive_extends,
        watch_replays_history_then_live_events,
        list_all_is_pinned_to_one_revision,
    );

    // The allocator, as two processes with session leases.
    let a = user_allocator(store.clone(), "a");
    let b = user_allocator(store.clone(), "b");
    a.init_pool(&PoolSpec::new("p", 1, 100)).await.expect("init pool");
    let pa = a.pool("p").await.expect("pool a");
    let pb = b.pool("p").await.expect("pool b");
    let x = pa.acquire("x").await.expect("acquire");
    assert_eq!(pb.acquire("x").await.expect("b acquire").id, x.id);

    // Idle for more than two token lifetimes: the next requests re-authenticate.
    tokio::time::sleep(Duration::from_secs(2 * TOKEN_TTL_S + 1)).await;
    let y = pa.acquire("y").await.expect("acquire after token expiry");
    assert_ne!(y.id, x.id);
    assert_eq!(pb.acquire("y").await.expect("b after expiry").id, y.id);
    let got = store
        .get(GetRequest::prefix("idalloc-secure/alloc/"))
        .await
        .expect("read after token expiry");
    assert!(!got.kvs.is_empty());

    // A watch as the first request after the token expired: etcd refuses the stale token of a
    // new watch as "permission denied" (not "invalid auth token"), so the store renews it.
    tokio::time::sleep(Duration::from_secs(2 * TOKEN_TTL_S + 1)).await;
    let mut w = store
        .watch(KeyRange::prefix("idalloc-secure/w/"), 0)
        .await
        .expect("watch after token expiry");
    store
        .txn(TxnRequest::new().and_then([TxnOp::put("idalloc-secure/w/1", "x")]))
        .await
        .expect("put");
    let msg = tokio::time::timeout(HANG, w.next()).await.expect("watch event in time");
    assert!(matches!(msg, Some(Ok(WatchMessage::Events(ref ev))) if ev.len() == 1), "{msg:?}");
    drop(w);

    // etcd restarts: every token is gone; the same store renews its own.
    etcd.restart().await.expect("restart");
    let z = pa.acquire("z").await.expect("acquire after restart");
    assert!(![x.id, y.id].contains(&z.id));
    assert_eq!(pb.acquire("z").await.expect("b after restart").id, z.id);
    assert!(pa.release("x").await.expect("release").held);

    // Outside the prefix: refused, by name, for reads, writes and watches.
    let e = store.get(GetRequest::key("other-app/secret")).await.expect_err("read outside");
    assert_access(&e, AccessCause::Permission, &ep, "user \"idalloc\"");
    let e = store
        .txn(TxnRequest::new().and_then([TxnOp::put("other-app/x", "y")]))
        .await
        .expect_err("write outside");
    assert_access(&e, AccessCause::Permission, &ep, "readwrite on its prefix");
    let e = store.watch(KeyRange::prefix("other-app/"), 0).await.err();
    let e = e.expect("watch outside must be refused");
    assert_access(&e, AccessCause::Permission, &ep, "watch");
    // ... and through the allocator, as its own error kind.
    let outside = Allocator::from_arc(
        store.clone(),
        AllocatorOptions::builder().prefix("other-app").build().unwrap(),
    )
    .expect("allocator");
    let e = outside.init_pool(&PoolSpec::new("p", 1, 10)).await.expect_err("outside prefix");
    assert!(matches!(&e, Error::AccessDenied { reason } if reason.contains(&ep)), "{e:?}");

    // Root sees that nothing was written outside the prefix.
    let root = etcd.root_store().await.expect("root");
    let all = root
        .get(GetRequest::new(KeyRange::range(vec![0u8], vec![0u8])))
        .await
        .expect("root reads all");
    let outside: Vec<String> = all
        .kvs
        .iter()
        .map(|kv| String::from_utf8_lossy(&kv.key).into_owned())
        .filter(|k| !k.starts_with(SecureEtcd::PREFIX) && k != "idalloc-ready-probe")
        .collect();
    assert!(outside.is_empty(), "keys outside the prefix: {outside:?}");

    // Wrong password, unknown user, no user at all: named, one line, no password shown.
    let wrong = |user: &str, pw: &str| Some(EtcdAuth::new(user, pw));
    for auth in [wrong("idalloc", "not-the-password"), wrong("nobody", SecureEtcd::PASSWORD)] {
        let e = refused(short(etcd.options(auth))).await;
        assert_access(&e, AccessCause::Authentication, &ep, "wrong user name or password");
        assert!(!e.to_string().contains("not-the-password"), "{e}");
    }
    // No password: with --client-cert-auth etcd takes the certificate's CN ("idalloc") as the
    // user, so the certificate alone grants exactly the role's prefix.
    let cert_only = EtcdStore::connect(etcd.options(None)).await.expect("connect by certificate");
    cert_only.get(GetRequest::key("idalloc-secure/k")).await.expect("read inside by certificate");
    let e = cert_only.get(GetRequest::key("other-app/k")).await.expect_err("outside");
    assert_access(&e, AccessCause::Permission, &ep, "permission denied");
}

/// A store that refuses this user ends the waits at once, as damaged data does,
/// instead of letting `acquire` wait out its whole no-progress budget (timeout × attempts, 15 s
/// here) and report the pool as "could not be listed". Two real users with less than readwrite:
/// one may read the pool but not write it, one may read only the pool specs (not its data). Each
/// `acquire` fails with `AccessDenied` naming the endpoint; the outer timeout is a hang detector.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_user_without_permission_is_refused_at_once_not_after_the_wait_budget() {
    if !have_etcd() {
        return;
    }
    let etcd = start(SecureSpec { auth: true, ..SecureSpec::default() }).await;
    let ep = etcd.endpoint();
    let prefix = "idalloc-secure/limited";
    let allocator = |store: EtcdStore, holder: &str| {
        let opts = AllocatorOptions::builder()
            .prefix(prefix)
            .holder(holder)
            .session_ttl(Duration::from_secs(10))
            .request_timeout(Duration::from_secs(5))
            .retry(idalloc::RetryPolicy::builder().max_attempts(3).build().unwrap())
            .build()
            .unwrap();
        Allocator::from_arc(Arc::new(store), opts).expect("allocator")
    };
    let user = |name: &str| EtcdAuth::new(name, "pw-of-test");
    let connect = |name: &str| EtcdStore::connect(etcd.options(Some(user(name))));

    let rw = EtcdStore::connect(etcd.options(Some(SecureEtcd::user_auth()))).await.expect("rw");
    let owner = allocator(rw, "owner");
    let pool = owner.ensure_pool(&PoolSpec::new("p", 1, 100)).await.expect("pool");
    pool.acquire_durable("x", "owner").await.expect("acquire as the owner");

    etcd.add_user("reader", "pw-of-test", &[(prefix, Grant::Read)]).await.expect("reader");
    let specs = format!("{prefix}/pools/");
    etcd.add_user("specs", "pw-of-test", &[(specs.as_str(), Grant::Read)]).await.expect("specs");

    for name in ["reader", "specs"] {
        let a = allocator(connect(name).await.expect("connect"), name);
        let attempt = async {
            let p = a.pool("p").await?;
            p.acquire("y").await
        };
        let e = tokio::time::timeout(HANG, attempt)
            .await
            .unwrap_or_else(|_| panic!("{name}: hang"))
            .expect_err("no write permission");
        match &e {
            Error::AccessDenied { reason } => {
                assert!(reason.contains(&ep) && reason.contains("permission denied"), "{e}")
            }
            other => panic!("{name}: expected AccessDenied at once, got {other:?}"),
        }
        let _ = a.close().await;
    }
    owner.close().await.expect("close");
}
