//! The `sessions=` and `refs=` quotas of `idalloc serve` as facts of the store: exact across TTL
//! rounding, re-adoption, restarts and instances, and what restricted administrators and
//! `allocate` clients may see and end. Real `serve` processes over real HTTP on a real etcd;
//! every check of a quota is made on the store's records, not on what an instance believes.
//!
//! etcd: `IDALLOC_TEST_ETCD` if set, else a private etcd (see `idalloc_testkit::etcd`); each test
//! uses its own key prefix. Every process a test starts is stopped by PID when the test ends.

mod common;

use std::time::Duration;

use common::{plain_agent, request, Resp};
use idalloc::store::{GetRequest, KeyRange, Store};
use idalloc_testkit::serve::{tokens_file, Serve};
use serde_json::{json, Value};

fn bin() -> &'static str {
    env!("CARGO_BIN_EXE_idalloc")
}

fn unique_prefix() -> String {
    let p = String::from_utf8(idalloc_testkit::etcd::unique_prefix()).expect("utf-8 prefix");
    p.trim_matches('/').replace('/', "-")
}

fn start(etcd: &str, prefix: &str, extra: &[&str]) -> Serve {
    Serve::start(bin(), &["--store", etcd, "--prefix", prefix, "--timeout", "3s"], extra)
}

fn call(s: &Serve, method: &str, path: &str, token: &str, body: Option<Value>) -> Resp {
    let body = body.map(|b| b.to_string());
    request(
        &plain_agent(Duration::from_secs(30)),
        method,
        &s.http(path),
        Some(token),
        body.as_deref(),
    )
    .unwrap_or_else(|e| panic!("{method} {path}: {e}"))
}

fn rt() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime")
}

/// What the store holds for `client` right now: its live session records (`P/sessions/<lease>`
/// owned by it) and its references in `pool` (durable `client/…` holders and its sessions').
struct InStore {
    sessions: usize,
    refs: usize,
}

fn in_store(
    rt: &tokio::runtime::Runtime,
    store: &dyn Store,
    prefix: &str,
    client: &str,
    pool: &str,
) -> InStore {
    rt.block_on(async {
        let sess = store
            .get(GetRequest::new(KeyRange::prefix(format!("{prefix}/sessions/"))))
            .await
            .expect("read sessions");
        let mut holders = Vec::new();
        for kv in &sess.kvs {
            let Some(lease) = kv.key.strip_prefix(format!("{prefix}/sessions/").as_bytes()) else {
                continue;
            };
            let Ok(record) = serde_json::from_slice::<Value>(&kv.value) else { continue };
            if record["owner"] == client {
                let lease = String::from_utf8_lossy(lease).trim_start_matches('0').to_string();
                holders.push(format!("session:lease-{lease}"));
            }
        }
        let refs = store
            .get(
                GetRequest::new(KeyRange::prefix(format!("{prefix}/data/{pool}/ref/"))).keys_only(),
            )
            .await
            .expect("read refs");
        let own = idalloc::layout::enc(&format!("{client}/"));
        let refs = refs
            .kvs
            .iter()
            .filter(|kv| {
                let k = String::from_utf8_lossy(&kv.key);
                let holder = k.rsplit('/').next().unwrap_or_default().to_string();
                holder.starts_with(&own)
                    || holders.iter().any(|h| holder == idalloc::layout::enc(h))
            })
            .count();
        InStore { sessions: holders.len(), refs }
    })
}

/// `sessions=1 refs=3`, a `ttl=1` session, rounds of: acquire 3 keys, wait past the TTL the
/// instance counts (etcd may keep the lease longer: its minimum TTL), open a second session and
/// acquire in it, then renew the first (re-adoption). Through two instances and a restart of
/// one. After every request the store holds at most 1 live session and 3 references of the
/// client; a second session is refused while the first's lease is alive in the store (made
/// certain by renewing the first only through the other instance).
#[test]
fn session_and_reference_quotas_hold_in_the_store_across_ttl_rounding_restarts_and_instances() {
    let rt = rt();
    let Some(etcd) = rt.block_on(idalloc_testkit::etcd::test_etcd_endpoint()) else { return };
    let store = rt.block_on(idalloc_testkit::etcd::connect_test_store(&etcd.endpoint()));
    let store = store.expect("store");
    let dir = tempfile::tempdir().expect("tempdir");
    let tk = tokens_file(
        dir.path(),
        &["a allocate file:a.token sessions=1 refs=3", "boss admin file:boss.token"],
    );
    let (a, boss) = (tk.token("a"), tk.token("boss"));
    let prefix = unique_prefix();
    let mut one = start(&etcd.endpoint(), &prefix, &["--auth-tokens", tk.arg()]);
    let two = start(&etcd.endpoint(), &prefix, &["--auth-tokens", tk.arg()]);
    call(&one, "POST", "/v1/pools", boss, Some(json!({"name":"p","min":1,"max":1000}))).ok();
    let check = |what: &str| {
        let got = in_store(&rt, &store, &prefix, "a", "p");
        assert!(
            got.sessions <= 1 && got.refs <= 3,
            "{what}: the store holds {} sessions and {} references of a client with \
             sessions=1 refs=3",
            got.sessions,
            got.refs
        );
    };
    let open = |s: &Serve| call(s, "POST", "/v1/sessions", a, Some(json!({"ttl":1})));
    let acquire = |s: &Serve, sid: &str, round: usize| {
        let keys: Vec<String> = (0..3).map(|i| format!("r{round}-{i}")).collect();
        call(s, "POST", "/v1/pools/p/acquire", a, Some(json!({"keys":keys,"session":sid})))
    };
    let renew =
        |s: &Serve, sid: &str| call(s, "PUT", &format!("/v1/sessions/{sid}/keepalive"), a, None);

    let mut refused = 0;
    for round in 0..4 {
        let s = if round % 2 == 0 { &one } else { &two };
        // A first session (the previous round's may still be alive in the store: then refused).
        let first = open(s);
        check("after an open");
        if first.status != 201 {
            assert_eq!(first.body["kind"], "quota_exceeded", "{}", first.text);
            std::thread::sleep(Duration::from_millis(1500));
            continue;
        }
        let sid = first.body["session"].as_str().expect("session").to_string();
        acquire(s, &sid, round);
        check("after the first session's acquire");
        // Past the TTL the instance counts, inside the lease etcd keeps (its minimum TTL): a
        // second session, then a renewal of the first (which re-adopts it).
        std::thread::sleep(Duration::from_millis(1100));
        let second = open(s);
        check("after opening a second session");
        if second.status == 201 {
            let sid2 = second.body["session"].as_str().expect("session").to_string();
            acquire(s, &sid2, round + 100);
            check("after the second session's acquire");
        } else {
            assert_eq!(second.body["kind"], "quota_exceeded", "{}", second.text);
            assert!(second.text.contains("sessions=1"), "{}", second.text);
            refused += 1;
        }
        renew(s, &sid);
        check("after renewing the first");
        // Re-adopt the first through the other instance.
        let other = if round % 2 == 0 { &two } else { &one };
        renew(other, &sid);
        check("after re-adopting the first elsewhere");
    }
    let _ = refused;

    // The same gap made certain: a session renewed only through the other instance is over for
    // the instance that opened it (its TTL passed there) and alive in the store.
    std::thread::sleep(Duration::from_millis(2500));
    let s1 = call(&one, "POST", "/v1/sessions", a, Some(json!({"ttl":2}))).ok();
    let sid = s1["session"].as_str().expect("session").to_string();
    acquire(&one, &sid, 50).ok();
    for _ in 0..6 {
        std::thread::sleep(Duration::from_millis(500));
        renew(&two, &sid).ok();
    }
    let msg =
        call(&one, "POST", "/v1/sessions", a, Some(json!({"ttl":2}))).err(429, "quota_exceeded");
    assert!(msg.contains("sessions=1"), "{msg}");
    check("after an open at the instance that believes the session over");
    renew(&one, &sid).ok();
    call(&one, "DELETE", &format!("/v1/sessions/{sid}"), a, None).ok();

    // A restart: a live session and its references; after the restart a second session is
    // refused, and the first is re-adopted by a renewal.
    std::thread::sleep(Duration::from_millis(2500));
    let s1 = call(&one, "POST", "/v1/sessions", a, Some(json!({"ttl":30}))).ok();
    let sid = s1["session"].as_str().expect("session").to_string();
    let keys = json!(["x1", "x2", "x3"]);
    call(&one, "POST", "/v1/pools/p/acquire", a, Some(json!({"keys":keys,"session":sid}))).ok();
    one.terminate();
    let one = start(&etcd.endpoint(), &prefix, &["--auth-tokens", tk.arg()]);
    let msg =
        call(&one, "POST", "/v1/sessions", a, Some(json!({"ttl":30}))).err(429, "quota_exceeded");
    assert!(msg.contains("sessions=1") && msg.contains("1 sessions open"), "{msg}");
    call(&one, "PUT", &format!("/v1/sessions/{sid}/keepalive"), a, None).ok();
    check("after the restart");

    // Two instances, sequential requests: the session's 3 references through one instance, then
    // a durable holder's 4th through the other is refused.
    let msg = call(&two, "POST", "/v1/pools/p/acquire", a, Some(json!({"key":"y","holder":"h"})))
        .err(429, "quota_exceeded");
    assert!(msg.contains("refs=3") && msg.contains("holds 3"), "{msg}");
    check("after the other instance's acquire");
    // Ending the session frees its slot for an open anywhere.
    call(&two, "DELETE", &format!("/v1/sessions/{sid}"), a, None).ok();
    call(&one, "POST", "/v1/sessions", a, Some(json!({"ttl":30}))).ok();
    check("at the end");
}

/// Two instances, `sessions=2 refs=3`: a session's 3 references made through one instance count
/// at the other, for another session of the same client opened there.
#[test]
fn references_of_sessions_opened_elsewhere_count() {
    let rt = rt();
    let Some(etcd) = rt.block_on(idalloc_testkit::etcd::test_etcd_endpoint()) else { return };
    let store = rt.block_on(idalloc_testkit::etcd::connect_test_store(&etcd.endpoint()));
    let store = store.expect("store");
    let dir = tempfile::tempdir().expect("tempdir");
    let tk = tokens_file(
        dir.path(),
        &["b allocate file:b.token sessions=2 refs=3", "boss admin file:boss.token"],
    );
    let (b, boss) = (tk.token("b"), tk.token("boss"));
    let prefix = unique_prefix();
    let one = start(&etcd.endpoint(), &prefix, &["--auth-tokens", tk.arg()]);
    let two = start(&etcd.endpoint(), &prefix, &["--auth-tokens", tk.arg()]);
    call(&one, "POST", "/v1/pools", boss, Some(json!({"name":"p","min":1,"max":1000}))).ok();
    let s1 = call(&one, "POST", "/v1/sessions", b, Some(json!({"ttl":30}))).ok();
    let sid1 = s1["session"].as_str().expect("session");
    let keys = json!(["k1", "k2", "k3"]);
    call(&one, "POST", "/v1/pools/p/acquire", b, Some(json!({"keys":keys,"session":sid1}))).ok();
    let s2 = call(&two, "POST", "/v1/sessions", b, Some(json!({"ttl":30}))).ok();
    let sid2 = s2["session"].as_str().expect("session");
    let keys = json!(["k4", "k5", "k6"]);
    let msg =
        call(&two, "POST", "/v1/pools/p/acquire", b, Some(json!({"keys":keys,"session":sid2})))
            .err(429, "quota_exceeded");
    assert!(msg.contains("refs=3"), "{msg}");
    let got = in_store(&rt, &store, &prefix, "b", "p");
    assert_eq!((got.sessions, got.refs), (2, 3));
}

/// An administrator restricted to some pools (`write=ta-*`) neither lists nor ends another
/// client's session (it could otherwise end a session holding references in pools outside its
/// grants); an `allocate` client lists its own sessions and ends its own by holder; an
/// unrestricted administrator lists and ends any.
#[test]
fn restricted_admins_and_allocate_clients_act_only_on_their_own_sessions() {
    let rt = rt();
    let Some(etcd) = rt.block_on(idalloc_testkit::etcd::test_etcd_endpoint()) else { return };
    let dir = tempfile::tempdir().expect("tempdir");
    let tk = tokens_file(
        dir.path(),
        &[
            "ta allocate file:ta.token write=ta-*",
            "tb allocate file:tb.token write=tb-*",
            "adm admin file:adm.token write=ta-*",
            "root admin file:root.token",
        ],
    );
    let (ta, tb, adm, root) = (tk.token("ta"), tk.token("tb"), tk.token("adm"), tk.token("root"));
    let prefix = unique_prefix();
    let s = start(&etcd.endpoint(), &prefix, &["--auth-tokens", tk.arg()]);
    for p in ["ta-1", "tb-1"] {
        call(&s, "POST", "/v1/pools", root, Some(json!({"name":p,"min":1,"max":100}))).ok();
    }
    let open = |t: &str| {
        let b = call(&s, "POST", "/v1/sessions", t, Some(json!({"ttl":30}))).ok();
        (
            b["session"].as_str().expect("id").to_string(),
            b["holder"].as_str().expect("h").to_string(),
        )
    };
    let (b_id, b_holder) = open(tb);
    call(&s, "POST", "/v1/pools/tb-1/acquire", tb, Some(json!({"key":"k","session":b_id}))).ok();
    let (_, a_holder) = open(ta);
    let (_, adm_holder) = open(adm);
    let listed = |t: &str| {
        let l = call(&s, "GET", "/v1/sessions", t, None).ok();
        let mut v: Vec<String> = l["sessions"]
            .as_array()
            .expect("sessions")
            .iter()
            .map(|x| x["holder"].as_str().expect("holder").to_string())
            .collect();
        v.sort();
        v
    };
    // Each sees its own only; the unrestricted administrator sees all three.
    assert_eq!(listed(adm), [adm_holder.as_str()]);
    assert_eq!(listed(ta), [a_holder.as_str()]);
    let mut all = vec![a_holder.clone(), b_holder.clone(), adm_holder.clone()];
    all.sort();
    assert_eq!(listed(root), all);
    // The restricted administrator cannot end tb's session, by holder or by id; tb's reference
    // stays.
    for name in [&b_holder, &b_id] {
        call(&s, "DELETE", &format!("/v1/sessions/{name}"), adm, None)
            .err(404, "session_not_found");
    }
    call(&s, "DELETE", &format!("/v1/sessions/{b_holder}"), ta, None).err(404, "session_not_found");
    let k = call(&s, "GET", "/v1/pools/tb-1/bindings", root, None).ok();
    assert_eq!(k["bindings"][0]["holders"], json!([b_holder]), "{k}");
    // An allocate client ends its own session by holder; an administrator its own.
    call(&s, "DELETE", &format!("/v1/sessions/{a_holder}"), ta, None).ok();
    call(&s, "DELETE", &format!("/v1/sessions/{adm_holder}"), adm, None).ok();
    assert!(listed(ta).is_empty());
    // The unrestricted administrator ends anyone's.
    call(&s, "DELETE", &format!("/v1/sessions/{b_holder}"), root, None).ok();
    assert!(listed(root).is_empty());
}

/// A pool whose references are past etcd's 4 MiB answer limit (1,100 references of 4,000-byte
/// keys): a quota-limited acquire and release, `GET /v1/sessions` (with its reference counts)
/// and every other endpoint still answer.
#[test]
fn every_endpoint_answers_on_a_pool_past_the_store_answer_limit() {
    let rt = rt();
    let Some(etcd) = rt.block_on(idalloc_testkit::etcd::test_etcd_endpoint()) else { return };
    let dir = tempfile::tempdir().expect("tempdir");
    let tk = tokens_file(
        dir.path(),
        &[
            "bulk allocate file:bulk.token write=big",
            "q allocate file:q.token write=big sessions=2 refs=5",
            "root admin file:root.token",
        ],
    );
    let (bulk, q, root) = (tk.token("bulk"), tk.token("q"), tk.token("root"));
    let prefix = unique_prefix();
    let s = start(&etcd.endpoint(), &prefix, &["--auth-tokens", tk.arg()]);
    call(&s, "POST", "/v1/pools", root, Some(json!({"name":"big","min":1,"max":100000}))).ok();
    let long = "k".repeat(4000);
    for chunk in 0..11 {
        let keys: Vec<String> = (0..100).map(|i| format!("{long}{:05}", chunk * 100 + i)).collect();
        call(&s, "POST", "/v1/pools/big/acquire", bulk, Some(json!({"keys":keys,"holder":"h"})))
            .ok();
    }
    // The pool's references alone are past 4 MiB.
    let bytes = rt.block_on(async {
        let store =
            idalloc_testkit::etcd::connect_test_store(&etcd.endpoint()).await.expect("store");
        let mut n = 0usize;
        let range = KeyRange::prefix(format!("{prefix}/data/big/ref/"));
        let mut pages = idalloc::store::Pages::at(&store, &range, 100, 0).keys_only();
        while let Some(kvs) = pages.next_page().await.expect("page") {
            n += kvs.iter().map(|kv| kv.key.len()).sum::<usize>();
        }
        n
    });
    assert!(bytes > 4 << 20, "the references' names take {bytes} bytes");

    let sess = call(&s, "POST", "/v1/sessions", q, Some(json!({"ttl":30}))).ok();
    let sid = sess["session"].as_str().expect("session").to_string();
    let holder = sess["holder"].as_str().expect("holder").to_string();
    let a =
        call(&s, "POST", "/v1/pools/big/acquire", q, Some(json!({"key":"s1","session":sid}))).ok();
    let id = a["id"].as_u64().expect("id");
    call(&s, "POST", "/v1/pools/big/acquire", q, Some(json!({"keys":["d1","d2"],"holder":"x"})))
        .ok();
    let listed = call(&s, "GET", "/v1/sessions", root, None).ok();
    let mine = listed["sessions"]
        .as_array()
        .expect("sessions")
        .iter()
        .find(|x| x["holder"] == holder.as_str())
        .cloned()
        .expect("listed");
    assert_eq!(mine["references"], 1, "{listed}");
    call(&s, "GET", "/v1/sessions", q, None).ok();
    call(&s, "GET", "/v1/pools", q, None).ok();
    let info = call(&s, "GET", "/v1/pools/big", q, None).ok();
    assert_eq!(info["bound"], 1103, "{info}");
    let page = call(&s, "GET", "/v1/pools/big/bindings?limit=5", q, None).ok();
    assert_eq!(page["bindings"].as_array().map(Vec::len), Some(5), "{page}");
    call(&s, "GET", "/v1/pools/big/keys/s1?consistent=true", q, None).ok();
    call(&s, "GET", &format!("/v1/pools/big/ids/{id}?consistent=true"), q, None).ok();
    // The quota still counts: 3 held, 2 more fit, the 6th is refused.
    call(&s, "POST", "/v1/pools/big/acquire", q, Some(json!({"keys":["d3","d4"],"holder":"x"})))
        .ok();
    let msg = call(&s, "POST", "/v1/pools/big/acquire", q, Some(json!({"key":"d5","holder":"x"})))
        .err(429, "quota_exceeded");
    assert!(msg.contains("holds 5") && msg.contains("refs=5"), "{msg}");
    call(&s, "POST", "/v1/pools/big/release", q, Some(json!({"key":"d1","holder":"x"}))).ok();
    call(&s, "POST", "/v1/pools/big/acquire", q, Some(json!({"key":"d5","holder":"x"}))).ok();
    call(&s, "DELETE", &format!("/v1/sessions/{holder}"), q, None).ok();
    call(&s, "POST", "/v1/pools/big/sweep", root, None).ok();
}

/// How many records the store holds under `prefix`.
fn count(rt: &tokio::runtime::Runtime, store: &dyn Store, prefix: &str) -> i64 {
    rt.block_on(
        store.get(GetRequest::new(KeyRange::prefix(prefix.as_bytes().to_vec())).count_only()),
    )
    .expect("count")
    .count
}

/// `pools=2`: pools the client creates count in the store for every instance together; a
/// repeated create adds nothing, a third is refused (429 naming the numbers, and an audit line
/// with them), a delete through either instance gives the slot back, and a pool deleted behind
/// the service's back (`idalloc pool delete` on the store) frees its slot when the client next
/// needs one. The pool's quota records go with it.
#[test]
fn the_pools_quota_is_counted_in_the_store_and_a_delete_gives_the_slot_back() {
    let rt = rt();
    let Some(etcd) = rt.block_on(idalloc_testkit::etcd::test_etcd_endpoint()) else { return };
    let store = rt.block_on(idalloc_testkit::etcd::connect_test_store(&etcd.endpoint()));
    let store = store.expect("store");
    let dir = tempfile::tempdir().expect("tempdir");
    let tk = tokens_file(
        dir.path(),
        &["ta admin file:ta.token write=ta-* pools=2 refs=5", "boss admin file:boss.token"],
    );
    let ta = tk.token("ta");
    let prefix = unique_prefix();
    let one = Serve::start_logged(
        bin(),
        &[
            "--store",
            &etcd.endpoint(),
            "--prefix",
            &prefix,
            "--timeout",
            "3s",
            "--log-format",
            "json",
        ],
        &["--auth-tokens", tk.arg()],
        dir.path().join("one.log"),
    );
    let two = start(&etcd.endpoint(), &prefix, &["--auth-tokens", tk.arg()]);
    let spec = |name: &str| Some(json!({"name": name, "min": 1, "max": 100}));
    let slots = format!("{prefix}/sessions/quota-pools/ta/");

    call(&one, "POST", "/v1/pools", ta, spec("ta-1")).ok();
    call(&two, "POST", "/v1/pools", ta, spec("ta-2")).ok();
    call(&one, "POST", "/v1/pools", ta, spec("ta-1")).ok();
    call(&two, "POST", "/v1/pools", ta, spec("ta-1")).ok();
    assert_eq!(count(&rt, &store, &slots), 2, "two pools, two slots");
    // A pool another client created does not count for this one.
    call(&one, "POST", "/v1/pools", tk.token("boss"), spec("ta-boss")).ok();
    let msg = call(&two, "POST", "/v1/pools", ta, spec("ta-3")).err(429, "quota_exceeded");
    assert!(
        msg.contains("created 2 pools") && msg.contains("pools=2") && msg.contains("ta-1, ta-2"),
        "{msg}"
    );
    let msg = call(&one, "POST", "/v1/pools", ta, spec("ta-3")).err(429, "quota_exceeded");
    assert!(msg.contains("pools=2"), "{msg}");
    call(&one, "GET", "/v1/pools/ta-3", ta, None).err(404, "pool_not_found");

    // A reference in ta-1 (its quota records go with the pool).
    call(&one, "POST", "/v1/pools/ta-1/acquire", ta, Some(json!({"key":"k","holder":"h"}))).ok();
    assert!(count(&rt, &store, &format!("{prefix}/data/ta-1/quota/")) >= 2);
    call(&two, "DELETE", "/v1/pools/ta-1?force=true", ta, None).ok();
    assert_eq!(count(&rt, &store, &slots), 1, "the delete gave the slot back");
    assert_eq!(count(&rt, &store, &format!("{prefix}/data/ta-1/quota/")), 0);
    call(&one, "POST", "/v1/pools", ta, spec("ta-3")).ok();
    assert_eq!(count(&rt, &store, &slots), 2);

    // Deleted on the store directly: the slot stays until the client needs it.
    let out = std::process::Command::new(bin())
        .args(["--store", &etcd.endpoint(), "--prefix", &prefix, "pool", "delete", "ta-2"])
        .output()
        .expect("idalloc pool delete");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(count(&rt, &store, &slots), 2);
    call(&two, "POST", "/v1/pools", ta, spec("ta-4")).ok();
    assert_eq!(count(&rt, &store, &slots), 2, "ta-2's slot was freed and taken for ta-4");
    call(&two, "POST", "/v1/pools", ta, spec("ta-5")).err(429, "quota_exceeded");
    drop(two);

    let (_, log) = one.stop();
    let refused: Vec<Value> = log
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .filter(|v| v["target"] == "idalloc::audit" && v["fields"]["status"] == 429)
        .collect();
    assert_eq!(refused.len(), 1, "{refused:?}");
    let f = &refused[0]["fields"];
    assert_eq!((f["operation"].as_str(), f["pool"].as_str()), (Some("pool_create"), Some("ta-3")));
    assert_eq!(f["quota"], "pools=2 held=2", "{f}");
}
