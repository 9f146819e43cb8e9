//! `idalloc serve` as a real process on a free loopback port, over real HTTP, on a real etcd and on
//! the file store: every endpoint, bad input, sessions that expire, `kill -9`, two instances on one
//! etcd, concurrent clients from several processes, metrics, store outages and shutdown.
//!
//! etcd: `IDALLOC_TEST_ETCD` if set, else a private etcd (see `idalloc_testkit::etcd`); each test uses
//! its own key prefix. Every process a test starts is stopped by PID when the test ends.

mod common;

use std::collections::{BTreeMap, HashMap, HashSet};
use std::io::{BufRead, BufReader, Read};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::{plain_agent, request, Resp};
use idalloc_testkit::serve::Serve;
use serde_json::{json, Value};

fn bin() -> &'static str {
    env!("CARGO_BIN_EXE_idalloc")
}

fn unique_prefix() -> String {
    let p = String::from_utf8(idalloc_testkit::etcd::unique_prefix()).expect("utf-8 prefix");
    p.trim_matches('/').replace('/', "-")
}

/// `idalloc --store STORE --prefix PREFIX --timeout 3s serve … EXTRA`, by the testkit's launcher.
fn start_serve(store: &str, prefix: &str, extra: &[&str]) -> Serve {
    Serve::start(bin(), &["--store", store, "--prefix", prefix, "--timeout", "3s"], extra)
}

fn agent() -> ureq::Agent {
    plain_agent(Duration::from_secs(60))
}

/// One request over plain HTTP; a transport failure fails the test.
fn send(method: &str, url: &str, body: Option<&str>) -> Resp {
    request(&agent(), method, url, None, body).unwrap_or_else(|e| panic!("{method} {url}: {e}"))
}

fn get(s: &Serve, path: &str) -> Resp {
    send("GET", &s.http(path), None)
}

/// GETs `path` until `done` holds for the answer (at most 30 s; a cached read follows the watch).
fn get_until(s: &Serve, path: &str, done: impl Fn(&Resp) -> bool) -> Resp {
    // A bound for a loaded machine (CI runs test binaries next to builds), not an expected delay.
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let r = get(s, path);
        if done(&r) || Instant::now() > deadline {
            return r;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn post(s: &Serve, path: &str, body: Value) -> Resp {
    send("POST", &s.http(path), Some(&body.to_string()))
}

fn rt() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime")
}

/// A test etcd endpoint, or None (skip outside CI when etcd is missing).
fn etcd() -> Option<(tokio::runtime::Runtime, idalloc_testkit::etcd::TestEtcd)> {
    let rt = rt();
    let e = rt.block_on(idalloc_testkit::etcd::test_etcd_endpoint())?;
    Some((rt, e))
}

fn wait_until(what: &str, timeout: Duration, mut f: impl FnMut() -> bool) {
    let deadline = Instant::now() + timeout;
    while !f() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Announces a `len`-byte body and sends only its first 64 KiB: the service must answer 413 from
/// the announced length without waiting for (or reading) the rest. A raw socket, because an HTTP
/// client that insists on sending the whole body sees the connection closed under it.
fn oversized_post(s: &Serve, path: &str, len: usize) -> (u16, String) {
    use std::io::Write;
    let addr = s.addr();
    let mut c = std::net::TcpStream::connect(addr).expect("connect");
    c.set_read_timeout(Some(Duration::from_secs(30))).expect("timeout");
    let head = format!(
        "POST {path} HTTP/1.1\r\nhost: {addr}\r\ncontent-type: application/json\r\ncontent-length: {len}\r\n\r\n"
    );
    c.write_all(head.as_bytes()).expect("write head");
    let _ = c.write_all(&vec![b' '; 64 << 10]);
    let mut resp = Vec::new();
    let _ = c.read_to_end(&mut resp);
    let text = String::from_utf8_lossy(&resp).to_string();
    let status = text.split_whitespace().nth(1).and_then(|x| x.parse().ok()).unwrap_or(0);
    let body = text.split("\r\n\r\n").nth(1).unwrap_or("").to_string();
    (status, body)
}

/// Every endpoint and every bad input, against one running service.
fn every_endpoint(s: &Serve) {
    // Health.
    assert_eq!(get(s, "/healthz").ok()["status"], "ok");
    assert_eq!(get(s, "/readyz").ok()["status"], "ready");

    // Pools: create (idempotent), mismatch, list, show.
    let spec =
        json!({"name": "vni", "min": 1, "max": 50, "reserved": [[5, 9]], "strategy": "lowest"});
    let created = post(s, "/v1/pools", spec.clone()).ok();
    assert_eq!(created["name"], "vni");
    assert_eq!(created["reserved"], json!([[5, 9]]));
    assert_eq!(post(s, "/v1/pools", spec).ok()["name"], "vni");
    let msg = post(s, "/v1/pools", json!({"name": "vni", "min": 1, "max": 60}))
        .err(409, "range_mismatch");
    assert!(msg.contains("[1, 50]") && msg.contains("[1, 60]"), "{msg}");
    post(s, "/v1/pools", json!({"name": "tiny", "min": 1, "max": 1})).ok();
    let pools = get(s, "/v1/pools").ok();
    let names: Vec<&str> =
        pools["pools"].as_array().unwrap().iter().map(|p| p["name"].as_str().unwrap()).collect();
    assert_eq!(names, ["tiny", "vni"]);
    let show = get(s, "/v1/pools/vni").ok();
    assert_eq!((show["capacity"].as_u64(), show["bound"].as_u64()), (Some(45), Some(0)));
    get(s, "/v1/pools/nope").err(404, "pool_not_found");

    // Acquire/release for a durable holder: one key, then a list.
    let a = post(s, "/v1/pools/vni/acquire", json!({"key": "tenant/blue", "holder": "alice"})).ok();
    assert_eq!((a["key"].as_str(), a["new"].as_bool()), (Some("tenant/blue"), Some(true)));
    let blue = a["id"].as_u64().unwrap();
    assert_eq!(blue, 1, "lowest strategy hands out 1 first");
    let again =
        post(s, "/v1/pools/vni/acquire", json!({"key": "tenant/blue", "holder": "bob"})).ok();
    assert_eq!((again["id"].as_u64(), again["new"].as_bool()), (Some(blue), Some(false)));
    let many =
        post(s, "/v1/pools/vni/acquire", json!({"keys": ["k1", "k2", "k3"], "holder": "alice"}))
            .ok();
    let results = many["results"].as_array().unwrap();
    assert_eq!(results.len(), 3);
    let ids: HashSet<u64> = results.iter().map(|r| r["id"].as_u64().unwrap()).collect();
    assert_eq!(ids.len(), 3);
    assert!(!ids.contains(&blue) && ids.iter().all(|id| !(5..=9).contains(id)), "{ids:?}");

    // Reads: cached and consistent, by key (with a '/') and by ID. A durable reference is not
    // held by the service's process, so its cached read follows the watch (docs/guide/api.md): it may
    // lag the acquire by the watch delay, and must converge within a bound.
    let g = get_until(s, "/v1/pools/vni/keys/tenant/blue", |r| r.status == 200).ok();
    assert_eq!(g["id"].as_u64(), Some(blue));
    let g = get(s, "/v1/pools/vni/keys/tenant%2Fblue?consistent=true").ok();
    assert_eq!(g["id"].as_u64(), Some(blue));
    let l = get(s, &format!("/v1/pools/vni/ids/{blue}")).ok();
    assert_eq!(l["key"], "tenant/blue");
    get(s, "/v1/pools/vni/keys/absent").err(404, "not_found");
    get(s, "/v1/pools/vni/ids/49").err(404, "not_found");
    get(s, "/v1/pools/vni/ids/x1").err(400, "invalid_input");

    // Bindings, paginated: 4 bindings in pages of 3. A page's IDs come from the cache, which
    // follows the watch (as above): wait (bounded) until it shows the batch acquired above.
    let p1 = get_until(s, "/v1/pools/vni/bindings?limit=3", |r| r.body["next_after"].is_u64()).ok();
    assert_eq!(p1["bindings"].as_array().unwrap().len(), 3);
    let after = p1["next_after"].as_u64().expect("a next page");
    let p2 = get(s, &format!("/v1/pools/vni/bindings?limit=3&after={after}")).ok();
    assert_eq!(p2["bindings"].as_array().unwrap().len(), 1);
    assert!(p2["next_after"].is_null());
    let first = &p1["bindings"][0];
    assert_eq!((first["id"].as_u64(), &first["holders"]), (Some(blue), &json!(["alice", "bob"])));
    get(s, "/v1/pools/vni/bindings?limit=0").err(400, "invalid_input");

    // Release: one, a list, not held; the last holder reclaims.
    let r = post(s, "/v1/pools/vni/release", json!({"key": "tenant/blue", "holder": "alice"})).ok();
    assert_eq!((r["held"].as_bool(), r["reclaimed"].as_bool()), (Some(true), Some(false)));
    let r = post(s, "/v1/pools/vni/release", json!({"key": "tenant/blue", "holder": "bob"})).ok();
    assert_eq!((r["held"].as_bool(), r["reclaimed"].as_bool()), (Some(true), Some(true)));
    let r = post(s, "/v1/pools/vni/release", json!({"key": "tenant/blue", "holder": "bob"})).ok();
    assert_eq!(r["held"].as_bool(), Some(false));
    get(s, "/v1/pools/vni/keys/tenant/blue?consistent=true").err(404, "not_found");
    let r = post(s, "/v1/pools/vni/release", json!({"keys": ["k1", "k2"], "holder": "alice"})).ok();
    assert!(r["results"].as_array().unwrap().iter().all(|x| x["reclaimed"] == true), "{r}");

    // Exhausted: the one-ID pool.
    post(s, "/v1/pools/tiny/acquire", json!({"key": "a", "holder": "h"})).ok();
    let msg =
        post(s, "/v1/pools/tiny/acquire", json!({"key": "b", "holder": "h"})).err(409, "exhausted");
    assert!(msg.contains("tiny"), "{msg}");

    // Sessions: open, acquire/release as the session, keep alive, end.
    let sess = post(s, "/v1/sessions", json!({"ttl": 30})).ok();
    let sid = sess["session"].as_str().unwrap().to_string();
    let holder = sess["holder"].as_str().unwrap().to_string();
    // The lease (16 hex digits) and the secret (64): usable on every replica.
    assert_eq!(sid.len(), 80);
    assert!(!holder.contains(&sid) && !sid.contains(&holder));
    let a = post(s, "/v1/pools/vni/acquire", json!({"key": "s1", "session": sid})).ok();
    let s1 = a["id"].as_u64().unwrap();
    // Idempotent within the session (a retried request does not count twice).
    let a2 = post(s, "/v1/pools/vni/acquire", json!({"key": "s1", "session": sid})).ok();
    assert_eq!(a2["id"].as_u64(), Some(s1));
    // A session's reference is not the service process's own either: the cache follows the watch.
    let in_cache = |r: &Resp| {
        r.body["bindings"].as_array().and_then(|b| b.iter().find(|x| x["key"] == "s1")).cloned()
    };
    let b = get_until(s, "/v1/pools/vni/bindings", |r| in_cache(r).is_some());
    let s1b = in_cache(&b).unwrap_or_else(|| panic!("s1 not in bindings: {}", b.text));
    assert_eq!(s1b["holders"], json!([holder]));
    assert_eq!(
        send("PUT", &s.http(&format!("/v1/sessions/{sid}/keepalive")), None).ok()["ttl"],
        30
    );
    let r = post(s, "/v1/pools/vni/release", json!({"key": "s1", "session": sid})).ok();
    assert_eq!((r["held"].as_bool(), r["reclaimed"].as_bool()), (Some(true), Some(true)));
    post(s, "/v1/pools/vni/acquire", json!({"key": "s2", "session": sid})).ok();
    send("DELETE", &s.http(&format!("/v1/sessions/{sid}")), None).ok();
    send("PUT", &s.http(&format!("/v1/sessions/{sid}/keepalive")), None)
        .err(404, "session_not_found");
    post(s, "/v1/pools/vni/acquire", json!({"key": "s3", "session": sid}))
        .err(404, "session_not_found");
    // Ending the session removed its reference: the sweeper (or a manual sweep) reclaims s2.
    let sw = post(s, "/v1/pools/vni/sweep", json!({})).ok();
    assert!(sw["reclaimed"].as_array().is_some(), "{sw}");
    wait_until("s2 reclaimed", Duration::from_secs(20), || {
        get(s, "/v1/pools/vni/keys/s2?consistent=true").status == 404
    });

    // Bad input: each a JSON error, nothing written.
    let before = get(s, "/v1/pools/vni").ok()["bound"].clone();
    let url = s.http("/v1/pools/vni/acquire");
    let m = send("POST", &url, Some("{\"key\": ")).err(400, "invalid_input");
    assert!(m.contains("JSON"), "{m}");
    let m = post(s, "/v1/pools/vni/acquire", json!({"key": "x", "holder": "h", "hodler": "h"}))
        .err(400, "invalid_input");
    assert!(m.contains("hodler"), "{m}");
    let (status, body) = oversized_post(s, "/v1/pools/vni/acquire", 2 << 20);
    assert_eq!(status, 413, "{body}");
    let body: Value = serde_json::from_str(&body).expect("JSON error body");
    assert_eq!(body["kind"], "too_large");
    let m = post(s, "/v1/pools/vni/acquire", json!({"key": "", "holder": "h"}))
        .err(400, "invalid_input");
    assert!(m.contains("key"), "{m}");
    let long = "k".repeat(4097);
    let m = post(s, "/v1/pools/vni/acquire", json!({"keys": ["ok", long], "holder": "h"}))
        .err(400, "invalid_input");
    assert!(m.contains("4097 bytes"), "{m}");
    // The key at the limit is fine.
    let at_limit = "k".repeat(4096);
    post(s, "/v1/pools/vni/acquire", json!({"key": at_limit, "holder": "h"})).ok();
    post(s, "/v1/pools/vni/release", json!({"key": at_limit, "holder": "h"})).ok();
    post(s, "/v1/pools/Bad_Name/acquire", json!({"key": "x", "holder": "h"}))
        .err(400, "invalid_input");
    post(s, "/v1/pools", json!({"name": "Bad_Name", "min": 1, "max": 2})).err(400, "invalid_input");
    post(s, "/v1/pools", json!({"name": "z", "min": 5, "max": 2})).err(400, "invalid_input");
    post(s, "/v1/pools/vni/acquire", json!({"key": "x"})).err(400, "invalid_input");
    post(s, "/v1/pools/vni/acquire", json!({"key": "x", "session": "00"}))
        .err(404, "session_not_found");
    post(s, "/v1/sessions", json!({"ttl": 0})).err(400, "invalid_input");
    post(s, "/v1/sessions", json!({"ttl": 10, "extra": 1})).err(400, "invalid_input");
    assert_eq!(get(s, "/v1/pools/vni").ok()["bound"], before, "bad input wrote nothing");
    get(s, "/v1/nothing").err(404, "not_found");
    send("PUT", &s.http("/v1/pools"), None).err(405, "method_not_allowed");

    // Delete: refused while records exist, then forced; then gone.
    // The pool's records stand in the way, not the request: 409 (typed Input::PoolInUse).
    let m = send("DELETE", &s.http("/v1/pools/tiny"), None).err(409, "invalid_input");
    assert!(m.contains("force"), "{m}");
    assert_eq!(send("DELETE", &s.http("/v1/pools/tiny?force=true"), None).ok()["deleted"], true);
    send("DELETE", &s.http("/v1/pools/tiny"), None).err(404, "pool_not_found");

    // The OpenAPI document names every route.
    let doc = get(s, "/v1/openapi.json").ok();
    for path in [
        "/v1/pools",
        "/v1/pools/{pool}",
        "/v1/pools/{pool}/acquire",
        "/v1/pools/{pool}/release",
        "/v1/pools/{pool}/keys/{key}",
        "/v1/pools/{pool}/ids/{id}",
        "/v1/pools/{pool}/bindings",
        "/v1/pools/{pool}/watch",
        "/v1/sessions",
        "/v1/sessions/{id}/keepalive",
    ] {
        assert!(doc["paths"].get(path).is_some(), "{path} missing from the OpenAPI document");
    }
}

#[test]
fn every_endpoint_on_the_file_store() {
    let dir = tempfile::tempdir().expect("tempdir");
    let store = format!("file:{}", dir.path().join("ids.redb").display());
    let mut s = start_serve(&store, "idalloc", &[]);
    every_endpoint(&s);
    assert_eq!(s.terminate(), Some(0));
}

#[test]
fn every_endpoint_on_etcd() {
    let Some((_rt, etcd)) = etcd() else { return };
    let mut s = start_serve(&etcd.endpoint(), &unique_prefix(), &[]);
    every_endpoint(&s);
    assert_eq!(s.terminate(), Some(0));
}

/// The holders of `key` as `list` shows them (None: no binding).
fn holders(s: &Serve, pool: &str, key: &str) -> Option<Vec<String>> {
    let b = get(s, &format!("/v1/pools/{pool}/bindings")).ok();
    b["bindings"].as_array().unwrap().iter().find(|x| x["key"] == key).map(|x| {
        x["holders"].as_array().unwrap().iter().map(|h| h.as_str().unwrap().to_string()).collect()
    })
}

#[test]
fn a_session_that_stops_renewing_loses_its_references_after_its_ttl() {
    let Some((_rt, etcd)) = etcd() else { return };
    let s = start_serve(&etcd.endpoint(), &unique_prefix(), &[]);
    post(&s, "/v1/pools", json!({"name": "p", "min": 1, "max": 1000})).ok();
    let sess = post(&s, "/v1/sessions", json!({"ttl": 2})).ok();
    let sid = sess["session"].as_str().unwrap().to_string();
    let holder = sess["holder"].as_str().unwrap().to_string();
    let kept = post(&s, "/v1/sessions", json!({"ttl": 2})).ok();
    let kid = kept["session"].as_str().unwrap().to_string();
    let id = post(&s, "/v1/pools/p/acquire", json!({"key": "dies", "session": sid})).ok()["id"]
        .as_u64()
        .unwrap();
    post(&s, "/v1/pools/p/acquire", json!({"key": "lives", "session": kid})).ok();
    // The kept session renews for 3 x its TTL; the other does not renew at all.
    let start = Instant::now();
    while start.elapsed() < Duration::from_secs(6) {
        send("PUT", &s.http(&format!("/v1/sessions/{kid}/keepalive")), None).ok();
        std::thread::sleep(Duration::from_millis(500));
    }
    assert!(
        holders(&s, "p", "lives").is_some_and(|h| h.len() == 1),
        "renewed session kept its ref"
    );
    // etcd expired the lease: the reference is gone, and the sweeper (1 s) reclaims the binding.
    wait_until("the dead session's reference and binding to go", Duration::from_secs(20), || {
        holders(&s, "p", "dies").is_none()
    });
    send("PUT", &s.http(&format!("/v1/sessions/{sid}/keepalive")), None)
        .err(404, "session_not_found");
    post(&s, "/v1/pools/p/acquire", json!({"key": "again", "session": sid}))
        .err(404, "session_not_found");
    get(&s, &format!("/v1/pools/p/ids/{id}?consistent=true")).err(404, "not_found");
    let _ = holder;
}

#[test]
fn kill_9_of_serve_lets_its_sessions_references_expire() {
    let Some((_rt, etcd)) = etcd() else { return };
    let prefix = unique_prefix();
    let mut a = start_serve(&etcd.endpoint(), &prefix, &[]);
    let b = start_serve(&etcd.endpoint(), &prefix, &[]);
    post(&a, "/v1/pools", json!({"name": "p", "min": 1, "max": 1000})).ok();
    let sid =
        post(&a, "/v1/sessions", json!({"ttl": 2})).ok()["session"].as_str().unwrap().to_string();
    let keys: Vec<String> = (0..5).map(|i| format!("k{i}")).collect();
    post(&a, "/v1/pools/p/acquire", json!({"keys": keys, "session": sid})).ok();
    // A durable reference made through A survives A's death.
    post(&a, "/v1/pools/p/acquire", json!({"key": "durable", "holder": "ops"})).ok();
    assert!(holders(&b, "p", "k0").is_some());
    a.kill9();
    wait_until("A's session references to expire", Duration::from_secs(20), || {
        keys.iter().all(|k| holders(&b, "p", k).is_none())
    });
    assert_eq!(holders(&b, "p", "durable"), Some(vec!["ops".to_string()]));
    // Nobody renewed it, so its lease and the record B would adopt it by are gone.
    post(&b, "/v1/pools/p/acquire", json!({"key": "x", "session": sid}))
        .err(404, "session_not_found");
}

#[test]
fn two_instances_on_one_etcd_agree_on_every_id() {
    let Some((_rt, etcd)) = etcd() else { return };
    let prefix = unique_prefix();
    let a = start_serve(&etcd.endpoint(), &prefix, &[]);
    let b = start_serve(&etcd.endpoint(), &prefix, &[]);
    post(&a, "/v1/pools", json!({"name": "p", "min": 1, "max": 100000})).ok();
    let keys: Vec<String> = (0..60).map(|i| format!("key-{i}")).collect();
    // Both instances acquire the same keys at once, in opposite orders.
    let run = |s: &Serve, holder: &str, rev: bool| {
        let mut ks = keys.clone();
        if rev {
            ks.reverse();
        }
        let mut got = BTreeMap::new();
        for k in ks {
            let r = post(s, "/v1/pools/p/acquire", json!({"key": k, "holder": holder})).ok();
            got.insert(k, r["id"].as_u64().unwrap());
        }
        got
    };
    let (ga, gb) = std::thread::scope(|sc| {
        let ha = sc.spawn(|| run(&a, "via-a", false));
        let hb = sc.spawn(|| run(&b, "via-b", true));
        (ha.join().unwrap(), hb.join().unwrap())
    });
    assert_eq!(ga, gb, "both instances hand out the same ID for each key");
    let distinct: HashSet<u64> = ga.values().copied().collect();
    assert_eq!(distinct.len(), keys.len(), "no two keys share an ID");
    // And each instance's lookups agree with the other's acquires.
    for (k, id) in &ga {
        let l = get(&b, &format!("/v1/pools/p/ids/{id}?consistent=true")).ok();
        assert_eq!(l["key"].as_str(), Some(k.as_str()));
    }
}

/// A small stdlib-only Python client, run as several processes at once.
const PY_CLIENT: &str = r#"
import json, sys, urllib.request
base, holder = sys.argv[1], sys.argv[2]
out = {}
for k in sys.argv[3:]:
    req = urllib.request.Request(base + "/v1/pools/p/acquire", method="POST",
        data=json.dumps({"key": k, "holder": holder}).encode(), headers={"content-type": "application/json"})
    with urllib.request.urlopen(req, timeout=60) as r:
        out[k] = json.load(r)["id"]
print(json.dumps(out))
"#;

#[test]
fn concurrent_clients_from_several_processes_agree() {
    if Command::new("python3").arg("--version").output().is_err() {
        assert!(std::env::var("CI").is_err(), "python3 is required under CI");
        eprintln!("SKIPPED: no python3");
        return;
    }
    let Some((_rt, etcd)) = etcd() else { return };
    let s = start_serve(&etcd.endpoint(), &unique_prefix(), &[]);
    post(&s, "/v1/pools", json!({"name": "p", "min": 1, "max": 100000})).ok();
    let keys: Vec<String> = (0..30).map(|i| format!("shared-{i}")).collect();
    let children: Vec<Child> = (0..4)
        .map(|i| {
            let mut ks = keys.clone();
            ks.rotate_left(i * 7);
            Command::new("python3")
                .args(["-c", PY_CLIENT, &s.http(""), &format!("proc-{i}")])
                .args(&ks)
                .stdout(Stdio::piped())
                .spawn()
                .expect("spawn python3")
        })
        .collect();
    let mut maps: Vec<HashMap<String, u64>> = Vec::new();
    for c in children {
        let out = c.wait_with_output().expect("python client");
        assert!(out.status.success(), "python client failed");
        maps.push(serde_json::from_slice(&out.stdout).expect("client output"));
    }
    for m in &maps[1..] {
        assert_eq!(m, &maps[0], "every process saw the same ID for each key");
    }
    let distinct: HashSet<u64> = maps[0].values().copied().collect();
    assert_eq!(distinct.len(), keys.len());
    let b = get(&s, "/v1/pools/p/bindings").ok();
    for x in b["bindings"].as_array().unwrap() {
        assert_eq!(x["holders"].as_array().unwrap().len(), 4, "{x}");
    }
}

/// Parses Prometheus text format: `name{labels} value` lines (HELP/TYPE comments skipped). Panics
/// on a line that is neither, so a malformed exposition fails the test.
fn parse_prometheus(text: &str) -> Vec<(String, BTreeMap<String, String>, f64)> {
    let mut out = Vec::new();
    for line in text.lines() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            if let Some(rest) = line.strip_prefix("# TYPE ") {
                let kind = rest.split_whitespace().nth(1).unwrap_or("");
                assert!(
                    ["counter", "gauge", "histogram", "summary", "untyped"].contains(&kind),
                    "bad TYPE line {line:?}"
                );
            }
            continue;
        }
        let (series, value) = line.rsplit_once(' ').unwrap_or_else(|| panic!("bad line {line:?}"));
        let value: f64 = value.parse().unwrap_or_else(|_| panic!("bad value in {line:?}"));
        let (name, labels) = match series.split_once('{') {
            None => (series.to_string(), BTreeMap::new()),
            Some((n, rest)) => {
                let body = rest.strip_suffix('}').unwrap_or_else(|| panic!("bad labels {line:?}"));
                let mut labels = BTreeMap::new();
                for pair in body.split("\",").filter(|p| !p.is_empty()) {
                    let (k, v) =
                        pair.split_once("=\"").unwrap_or_else(|| panic!("bad label {line:?}"));
                    labels.insert(k.to_string(), v.trim_end_matches('"').to_string());
                }
                (n.to_string(), labels)
            }
        };
        assert!(
            name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_' || c == ':'),
            "bad metric name {name:?}"
        );
        out.push((name, labels, value));
    }
    out
}

fn metric(
    samples: &[(String, BTreeMap<String, String>, f64)],
    name: &str,
    labels: &[(&str, &str)],
) -> f64 {
    samples
        .iter()
        .filter(|(n, l, _)| {
            n == name && labels.iter().all(|(k, v)| l.get(*k).map(String::as_str) == Some(*v))
        })
        .map(|(_, _, v)| v)
        .sum()
}

#[test]
fn metrics_parse_and_move_with_operations() {
    let Some((_rt, etcd)) = etcd() else { return };
    let s = start_serve(&etcd.endpoint(), &unique_prefix(), &[]);
    post(&s, "/v1/pools", json!({"name": "m", "min": 1, "max": 10})).ok();
    let before = parse_prometheus(&get(&s, "/metrics").text);
    let acq = [("operation", "acquire_durable"), ("outcome", "ok"), ("pool", "m")];
    let n0 = metric(&before, "idalloc_operation_duration_seconds_count", &acq);
    let txn0 =
        metric(&before, "idalloc_store_requests_total", &[("kind", "txn"), ("result", "ok")]);
    for k in ["a", "b", "c"] {
        post(&s, "/v1/pools/m/acquire", json!({"key": k, "holder": "h"})).ok();
    }
    let sid =
        post(&s, "/v1/sessions", json!({"ttl": 5})).ok()["session"].as_str().unwrap().to_string();
    send("PUT", &s.http(&format!("/v1/sessions/{sid}/keepalive")), None).ok();
    post(&s, "/v1/pools/m/acquire", json!({"key": "x", "holder": ""})).err(400, "invalid_input");
    wait_until("the pool gauge to show 3 bindings", Duration::from_secs(10), || {
        let m = parse_prometheus(&get(&s, "/metrics").text);
        metric(&m, "idalloc_pool_bindings", &[("pool", "m")]) == 3.0
    });
    let text = get(&s, "/metrics").text;
    assert!(!text.contains(&sid), "a session id must never appear in metrics");
    let after = parse_prometheus(&text);
    assert_eq!(metric(&after, "idalloc_operation_duration_seconds_count", &acq) - n0, 3.0);
    assert!(
        metric(&after, "idalloc_store_requests_total", &[("kind", "txn"), ("result", "ok")])
            >= txn0 + 3.0
    );
    assert_eq!(metric(&after, "idalloc_pool_capacity", &[("pool", "m")]), 10.0);
    assert_eq!(metric(&after, "idalloc_pool_free_ids", &[("pool", "m")]), 7.0);
    assert_eq!(
        metric(
            &after,
            "idalloc_session_renewals_total",
            &[("session", "client"), ("result", "ok")]
        ),
        1.0
    );
    assert_eq!(metric(&after, "idalloc_client_sessions", &[]), 1.0);
    assert!(metric(&after, "idalloc_sweeps_total", &[("pool", "m"), ("outcome", "ok")]) >= 0.0);
    assert_eq!(
        metric(
            &after,
            "idalloc_http_requests_total",
            &[("route", "/v1/pools/{pool}/acquire"), ("status", "400")]
        ),
        1.0
    );
    // Labels are bounded: no key, holder or session label anywhere.
    for (_, labels, _) in &after {
        for k in labels.keys() {
            assert!(
                [
                    "pool",
                    "operation",
                    "outcome",
                    "kind",
                    "result",
                    "session",
                    "by",
                    "route",
                    "method",
                    "reason",
                    "status",
                    "le",
                    "quantile",
                    // idalloc_build_info's, one series per process
                    "version",
                    "git_sha"
                ]
                .contains(&k.as_str()),
                "unexpected label {k}"
            );
        }
        if let Some(v) = labels.get("session") {
            assert!(v == "client" || v == "process", "session label is a kind, not an id: {v}");
        }
    }
}

#[test]
fn store_down_gives_503_and_not_ready_then_recovers_by_itself() {
    let rt = rt();
    if !idalloc_testkit::etcd::etcd_on_path() {
        assert!(std::env::var("CI").is_err(), "etcd must be on PATH under CI");
        return;
    }
    let mut cluster = rt.block_on(idalloc_testkit::etcd::EtcdCluster::start(1)).expect("etcd");
    let endpoint = cluster.endpoints()[0].clone();
    let s = start_serve(&endpoint, "idalloc", &[]);
    post(&s, "/v1/pools", json!({"name": "p", "min": 1, "max": 100})).ok();
    post(&s, "/v1/pools/p/acquire", json!({"key": "before", "holder": "h"})).ok();
    assert_eq!(get(&s, "/readyz").status, 200);
    cluster.kill_member(0).expect("kill etcd");
    let start = Instant::now();
    let m = post(&s, "/v1/pools/p/acquire", json!({"key": "during", "holder": "h"}))
        .err(503, "unavailable");
    let took = start.elapsed();
    assert!(took < Duration::from_secs(30), "503 came after {took:?}");
    assert!(!m.is_empty());
    get(&s, "/readyz").err(503, "unavailable");
    rt.block_on(cluster.restart_member(0)).expect("restart etcd");
    wait_until("readiness to come back", Duration::from_secs(60), || {
        get(&s, "/readyz").status == 200
    });
    let r = post(&s, "/v1/pools/p/acquire", json!({"key": "after", "holder": "h"})).ok();
    assert!(r["id"].as_u64().is_some());
    let b = get(&s, "/v1/pools/p/keys/before?consistent=true").ok();
    assert!(b["id"].as_u64().is_some());
}

#[test]
fn watch_streams_replay_then_live_and_resumes_from_a_revision() {
    let Some((_rt, etcd)) = etcd() else { return };
    let s = start_serve(&etcd.endpoint(), &unique_prefix(), &[]);
    post(&s, "/v1/pools", json!({"name": "w", "min": 1, "max": 100})).ok();
    let first = post(&s, "/v1/pools/w/acquire", json!({"key": "old", "holder": "h"})).ok()["id"]
        .as_u64()
        .unwrap();
    let resp = agent().get(&s.http("/v1/pools/w/watch")).call().expect("watch");
    assert_eq!(resp.status().as_u16(), 200);
    let mut lines = BufReader::new(resp.into_body().into_reader()).lines();
    let mut next_event = move || -> (String, Option<i64>, Value) {
        let (mut name, mut id, mut data) = (String::new(), None, Value::Null);
        loop {
            let line = lines.next().expect("stream open").expect("read");
            if line.is_empty() {
                if !name.is_empty() {
                    return (name, id, data);
                }
                continue;
            }
            if let Some(v) = line.strip_prefix("event:") {
                name = v.trim().to_string();
            } else if let Some(v) = line.strip_prefix("id:") {
                id = v.trim().parse().ok();
            } else if let Some(v) = line.strip_prefix("data:") {
                data = serde_json::from_str(v.trim()).expect("data is JSON");
            }
        }
    };
    let (n, _, d) = next_event();
    assert_eq!(
        (n.as_str(), d["id"].as_u64(), d["key"].as_str()),
        ("upsert", Some(first), Some("old"))
    );
    let (n, synced_rev, _) = next_event();
    assert_eq!(n, "synced");
    let synced_rev = synced_rev.expect("synced carries the revision");
    let new =
        post(&s, "/v1/pools/w/acquire", json!({"key": "new", "holder": "h"})).ok()["id"].as_u64();
    let (n, rev, d) = next_event();
    assert_eq!((n.as_str(), d["id"].as_u64(), d["key"].as_str()), ("upsert", new, Some("new")));
    let rev = rev.expect("events carry revisions");
    assert!(rev > synced_rev);
    post(&s, "/v1/pools/w/release", json!({"key": "old", "holder": "h"})).ok();
    let (n, _, d) = next_event();
    assert_eq!(
        (n.as_str(), d["id"].as_u64(), d["key"].as_str()),
        ("delete", Some(first), Some("old"))
    );
    // Resume after the "new" upsert: the delete is replayed, and nothing before it.
    let mut resumed = agent()
        .get(&s.http(&format!("/v1/pools/w/watch?from_revision={}", rev + 1)))
        .call()
        .expect("resume");
    let mut buf = [0u8; 512];
    let mut got = String::new();
    while !got.contains("\n\n") {
        let n = resumed.body_mut().as_reader().read(&mut buf).expect("read");
        assert!(n > 0, "stream ended early");
        got.push_str(&String::from_utf8_lossy(&buf[..n]));
    }
    assert!(got.contains("event: delete") && got.contains("\"key\":\"old\""), "{got}");
    assert!(!got.contains("\"key\":\"new\""), "{got}");
}

/// The next SSE event of `lines`: its name, id and data.
fn sse_event(
    lines: &mut impl Iterator<Item = std::io::Result<String>>,
) -> (String, Option<i64>, Value) {
    let (mut name, mut id, mut data) = (String::new(), None, Value::Null);
    loop {
        let line = lines.next().expect("stream open").expect("read");
        if line.is_empty() {
            if !name.is_empty() {
                return (name, id, data);
            }
            continue;
        }
        if let Some(v) = line.strip_prefix("event:") {
            name = v.trim().to_string();
        } else if let Some(v) = line.strip_prefix("id:") {
            id = v.trim().parse().ok();
        } else if let Some(v) = line.strip_prefix("data:") {
            data = serde_json::from_str(v.trim()).expect("data is JSON");
        }
    }
}

/// A resize (`PATCH /v1/pools/{pool}`) during a watch is a `spec` event with the spec as `GET
/// /v1/pools/{pool}` shows it and the resize's revision, without an SSE id; the bindings' events
/// go on after it; a stream resumed from before the resize starts with it, one resumed from after
/// it does not.
#[test]
fn a_resize_during_a_watch_is_a_spec_event() {
    let Some((_rt, etcd)) = etcd() else { return };
    let s = start_serve(&etcd.endpoint(), &unique_prefix(), &[]);
    post(&s, "/v1/pools", json!({"name": "rs", "min": 1, "max": 10})).ok();
    let resp = agent().get(&s.http("/v1/pools/rs/watch")).call().expect("watch");
    assert_eq!(resp.status().as_u16(), 200);
    let mut lines = BufReader::new(resp.into_body().into_reader()).lines();
    let (n, synced_rev, _) = sse_event(&mut lines);
    assert_eq!(n, "synced");
    let synced_rev = synced_rev.expect("synced carries the revision");

    let r =
        send("PATCH", &s.http("/v1/pools/rs"), Some(r#"{"min":1,"max":20,"reserved":[[13,14]]}"#));
    r.ok();
    let (n, id, d) = sse_event(&mut lines);
    assert_eq!(n, "spec", "{d}");
    assert_eq!(id, None, "a spec event names no revision the client has all of");
    let shown = get(&s, "/v1/pools/rs").ok();
    assert_eq!(d["spec"], shown["spec"], "the spec as the pool endpoint shows it");
    assert_eq!(
        (d["spec"]["max"].as_u64(), d["spec"]["reserved"].clone()),
        (Some(20), json!([[13, 14]]))
    );
    let spec_rev = d["revision"].as_i64().expect("the resize's revision");
    assert!(spec_rev > synced_rev, "{spec_rev} after {synced_rev}");

    let k =
        post(&s, "/v1/pools/rs/acquire", json!({"key": "k", "holder": "h"})).ok()["id"].as_u64();
    // The service re-lists the pool after a resize: a `synced` may come first.
    let (mut n, mut rev, mut d) = sse_event(&mut lines);
    while n == "synced" {
        (n, rev, d) = sse_event(&mut lines);
    }
    assert_eq!((n.as_str(), d["id"].as_u64(), d["key"].as_str()), ("upsert", k, Some("k")));
    let rev = rev.expect("an upsert carries its revision");

    // Resumed from before the resize: the spec first, then the upsert.
    let resumed = agent()
        .get(&s.http(&format!("/v1/pools/rs/watch?from_revision={}", synced_rev + 1)))
        .call()
        .expect("resume");
    let mut again = BufReader::new(resumed.into_body().into_reader()).lines();
    let (n, _, d) = sse_event(&mut again);
    assert_eq!((n.as_str(), d["revision"].as_i64()), ("spec", Some(spec_rev)));
    loop {
        let (n, _, d) = sse_event(&mut again);
        if n == "upsert" {
            assert_eq!(d["key"].as_str(), Some("k"));
            break;
        }
        assert!(n == "spec" || n == "synced", "only the spec (again) before the upsert: {n} {d}");
    }
    // Resumed from after it: the next event is the next change, no spec.
    let later = agent()
        .get(&s.http(&format!("/v1/pools/rs/watch?from_revision={}", rev + 1)))
        .call()
        .expect("resume");
    let mut later = BufReader::new(later.into_body().into_reader()).lines();
    post(&s, "/v1/pools/rs/release", json!({"key": "k", "holder": "h"})).ok();
    let (n, _, d) = sse_event(&mut later);
    assert_eq!((n.as_str(), d["key"].as_str()), ("delete", Some("k")), "{d}");
}

#[test]
fn sigterm_ends_watches_exits_zero_and_refuses_new_connections() {
    let dir = tempfile::tempdir().expect("tempdir");
    let store = format!("file:{}", dir.path().join("ids.redb").display());
    let mut s = start_serve(&store, "idalloc", &[]);
    post(&s, "/v1/pools", json!({"name": "p", "min": 1, "max": 10})).ok();
    let sid =
        post(&s, "/v1/sessions", json!({"ttl": 30})).ok()["session"].as_str().unwrap().to_string();
    post(&s, "/v1/pools/p/acquire", json!({"key": "kept", "session": sid})).ok();
    let resp = agent().get(&s.http("/v1/pools/p/watch")).call().expect("watch");
    // The reader says when the stream has shown `synced` (the watch is up and has sent its
    // replay), and reads on until the server ends the stream.
    let (synced_tx, synced_rx) = std::sync::mpsc::channel();
    let reader = std::thread::spawn(move || {
        let mut body = resp.into_body().into_reader();
        let (mut all, mut buf) = (Vec::new(), [0u8; 4096]);
        while let Ok(n @ 1..) = body.read(&mut buf) {
            all.extend_from_slice(&buf[..n]);
            if String::from_utf8_lossy(&all).contains("event: synced") {
                let _ = synced_tx.send(());
            }
        }
        String::from_utf8_lossy(&all).into_owned()
    });
    synced_rx.recv_timeout(Duration::from_secs(30)).expect("`event: synced` within 30 s");
    assert_eq!(s.terminate(), Some(0));
    let streamed = reader.join().expect("reader");
    assert!(streamed.contains("event: synced"), "{streamed}");
    let err = agent().get(&s.http("/healthz")).call();
    assert!(err.is_err(), "no one listens after shutdown");
    // The session was not ended: its reference is still in the store (the file store keeps
    // leases across restarts; it expires after its TTL).
    let s2 = start_serve(&store, "idalloc", &[]);
    let h = holders(&s2, "p", "kept").expect("binding still there");
    assert_eq!(h.len(), 1);
}

#[test]
fn the_shipped_python_client_runs_against_serve() {
    if Command::new("python3").arg("--version").output().is_err() {
        assert!(std::env::var("CI").is_err(), "python3 is required under CI");
        return;
    }
    let client: PathBuf =
        [env!("CARGO_MANIFEST_DIR"), "..", "..", "clients", "python", "src"].iter().collect();
    if !client.exists() {
        panic!("{} is missing", client.display());
    }
    let dir = tempfile::tempdir().expect("tempdir");
    let store = format!("file:{}", dir.path().join("ids.redb").display());
    let s = start_serve(&store, "idalloc", &[]);
    let out = Command::new("python3")
        .env("PYTHONPATH", &client)
        .args(["-m", "idalloc_client", "--demo", &s.http("")])
        .output()
        .expect("run the python client");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "client failed: {stdout} {}",
        String::from_utf8_lossy(&out.stderr)
    );
    // The demo prints one JSON line per step; the acquired ID must be the one the service reports.
    let lines: Vec<Value> =
        stdout.lines().map(|l| serde_json::from_str(l).expect("JSON line")).collect();
    let acquired = lines.iter().find(|l| l["step"] == "acquire").expect("acquire step");
    let id = acquired["id"].as_u64().expect("id");
    assert!(lines.iter().any(|l| l["step"] == "keepalive" && l["ttl"].as_u64().is_some()));
    assert!(lines.iter().any(|l| l["step"] == "release" && l["held"] == true));
    assert!(lines.iter().any(|l| l["step"] == "end"));
    // Released and reclaimed: the ID is free again.
    get(&s, &format!("/v1/pools/demo/ids/{id}?consistent=true")).err(404, "not_found");
}

/// A durable holder's bulk acquire and release (`"keys"`) go in batched txns, not one
/// txn per key: 50 keys take one txn each way (counted by the service's own store-request metric),
/// and every key gets its own ID and is released.
#[test]
fn bulk_requests_of_a_durable_holder_go_in_batched_txns() {
    let Some((_rt, etcd)) = etcd() else { return };
    let s = start_serve(&etcd.endpoint(), &unique_prefix(), &[]);
    post(&s, "/v1/pools", json!({"name": "bulk", "min": 1, "max": 1000})).ok();
    let txns = || {
        let m = parse_prometheus(&get(&s, "/metrics").text);
        metric(&m, "idalloc_store_requests_total", &[("kind", "txn"), ("result", "ok")])
    };
    // The pool's cache is listed and the spec read before counting.
    post(&s, "/v1/pools/bulk/acquire", json!({"key": "warm", "holder": "h"})).ok();
    // Bulk txns hold at most 25 keys for 200 ms after a single-key call (docs/design/
    // bulk-admission.md, "Turns between clients"): the calls below are bulk work alone.
    std::thread::sleep(std::time::Duration::from_millis(300));
    let keys: Vec<String> = (0..50).map(|i| format!("bulk-{i}")).collect();
    let t0 = txns();
    let r = post(&s, "/v1/pools/bulk/acquire", json!({"keys": keys, "holder": "h"})).ok();
    assert_eq!(txns() - t0, 1.0, "50 keys in one batched txn");
    let results = r["results"].as_array().expect("results");
    let ids: std::collections::HashSet<u64> =
        results.iter().map(|x| x["id"].as_u64().expect("id")).collect();
    assert_eq!(ids.len(), 50, "distinct IDs: {r}");
    for (x, k) in results.iter().zip(&keys) {
        assert_eq!(x["key"], json!(k));
        let got = get_until(&s, &format!("/v1/pools/bulk/keys/{k}"), |g| g.body["id"] == x["id"]);
        assert_eq!(got.body["id"], x["id"], "{k}");
    }
    let t1 = txns();
    let r = post(&s, "/v1/pools/bulk/release", json!({"keys": keys, "holder": "h"})).ok();
    assert_eq!(txns() - t1, 1.0, "50 releases in one batched txn");
    let results = r["results"].as_array().expect("results");
    assert!(
        results.iter().all(|x| x["held"] == json!(true) && x["reclaimed"] == json!(true)),
        "{r}"
    );
}

/// `hint` on acquire: the preferred ID is given when free and `hint_granted` says so; a taken
/// ID, a reserved one or one in its reuse delay is not, and the key gets a usual ID; a key
/// already bound keeps its ID; a hint with `keys`, a session or on release is refused (400).
#[test]
fn acquire_with_a_hint_gets_the_id_when_free_and_says_which() {
    let dir = tempfile::tempdir().expect("tempdir");
    let store = format!("file:{}", dir.path().join("ids.redb").display());
    let s = start_serve(&store, "idalloc", &[]);
    let spec = json!({"name": "h", "min": 1, "max": 1000, "reserved": [[500, 509]],
                      "reuse_delay_ms": 3_600_000u64});
    post(&s, "/v1/pools", spec).ok();
    let acquire = |body: Value| post(&s, "/v1/pools/h/acquire", body);

    let a = acquire(json!({"key": "a", "holder": "n1", "hint": 700})).ok();
    assert_eq!((a["id"].as_u64(), a["hint_granted"].as_bool()), (Some(700), Some(true)), "{a}");
    // Taken by another key: a usual ID, and the answer says the hint was not granted.
    let b = acquire(json!({"key": "b", "holder": "n1", "hint": 700})).ok();
    assert_eq!(b["hint_granted"], false, "{b}");
    assert_ne!(b["id"], 700, "{b}");
    // Reserved: not granted either.
    let c = acquire(json!({"key": "c", "holder": "n1", "hint": 505})).ok();
    assert_eq!(c["hint_granted"], false, "{c}");
    // In its reuse delay after a release: not granted.
    post(&s, "/v1/pools/h/release", json!({"key": "a", "holder": "n1"})).ok();
    let d = acquire(json!({"key": "d", "holder": "n1", "hint": 700})).ok();
    assert_eq!((d["hint_granted"].as_bool(), d["new"].as_bool()), (Some(false), Some(true)), "{d}");
    assert_ne!(d["id"], 700, "{d}");
    // A bound key keeps its ID whatever the hint.
    let again = acquire(json!({"key": "b", "holder": "n2", "hint": 42})).ok();
    assert_eq!((&again["id"], &again["hint_granted"]), (&b["id"], &json!(false)), "{again}");
    // Without a hint the answer has no hint_granted.
    let plain = acquire(json!({"key": "e", "holder": "n1"})).ok();
    assert!(plain.get("hint_granted").is_none(), "{plain}");
    // Refused forms name the hint.
    for body in [
        json!({"keys": ["x", "y"], "holder": "n1", "hint": 3}),
        json!({"key": "x", "session": "0".repeat(80), "hint": 3}),
    ] {
        let msg = acquire(body).err(400, "invalid_input");
        assert!(msg.contains("hint"), "{msg}");
    }
    let msg = post(&s, "/v1/pools/h/release", json!({"key": "b", "holder": "n1", "hint": 3}))
        .err(400, "invalid_input");
    assert!(msg.contains("hint"), "{msg}");
}
