//! `idalloc serve` shared by many clients: sessions own their holder names, per-pool
//! grants and quotas, connection limits and timeouts, administration and audit, secret-file
//! permissions. Real processes on the file store, over real HTTP on free loopback ports.

mod common;

use std::path::Path;
use std::time::Duration;

use common::{plain_agent, request, Resp};
use idalloc_testkit::serve::{tokens_file, Serve};
use serde_json::{json, Value};

fn bin() -> &'static str {
    env!("CARGO_BIN_EXE_idalloc")
}

/// `idalloc --store file:DIR/ids.redb --timeout 3s serve … EXTRA`.
fn start(dir: &Path, extra: &[&str]) -> Serve {
    let store = format!("file:{}", dir.join("ids.redb").display());
    Serve::start(bin(), &["--store", &store, "--timeout", "3s"], extra)
}

fn call(s: &Serve, method: &str, path: &str, token: Option<&str>, body: Option<Value>) -> Resp {
    let body = body.map(|b| b.to_string());
    request(&plain_agent(Duration::from_secs(30)), method, &s.http(path), token, body.as_deref())
        .unwrap_or_else(|e| panic!("{method} {path}: {e}"))
}

/// A durable acquire or release naming a session's holder is refused (409 `holder_reserved`,
/// naming the holder), without and with tokens, and the session's reference stays the only one.
#[test]
fn sessions_own_their_holder_names() {
    let dir = tempfile::tempdir().expect("tempdir");
    let s = start(dir.path(), &[]);
    call(&s, "POST", "/v1/pools", None, Some(json!({"name":"p","min":1,"max":100}))).ok();
    let sess = call(&s, "POST", "/v1/sessions", None, Some(json!({"ttl":30}))).ok();
    let sid = sess["session"].as_str().expect("session").to_string();
    let holder = sess["holder"].as_str().expect("holder").to_string();
    assert!(holder.starts_with("session:"), "{holder}");
    call(&s, "POST", "/v1/pools/p/acquire", None, Some(json!({"key":"k","session":sid}))).ok();
    for op in ["acquire", "release"] {
        let msg = call(
            &s,
            "POST",
            &format!("/v1/pools/p/{op}"),
            None,
            Some(json!({"keys":["k","k2"],"holder":holder})),
        )
        .err(409, "holder_reserved");
        assert!(msg.contains(&holder) && msg.contains("session"), "{msg}");
    }
    // Any name of the sessions' namespace, live or not (another instance's session).
    call(&s, "POST", "/v1/pools/p/acquire", None, Some(json!({"key":"k","holder":"session:x-c1"})))
        .err(409, "holder_reserved");
    let b = call(&s, "GET", "/v1/pools/p/bindings", None, None).ok();
    assert_eq!(b["bindings"][0]["holders"], json!([holder]), "{b}");
    assert_eq!(b["bindings"].as_array().map(Vec::len), Some(1), "{b}");
    // Other durable holders still work.
    call(&s, "POST", "/v1/pools/p/acquire", None, Some(json!({"key":"k","holder":"node-1"}))).ok();
    drop(s);

    let tk = tokens_file(dir.path(), &["w allocate file:w.token", "boss admin file:boss.token"]);
    let tokens = tk.arg().to_string();
    let s = start(dir.path(), &["--auth-tokens", &tokens]);
    let w = Some(tk.token("w"));
    let sess = call(&s, "POST", "/v1/sessions", w, Some(json!({"ttl":30}))).ok();
    let holder = sess["holder"].as_str().expect("holder").to_string();
    for op in ["acquire", "release"] {
        call(&s, "POST", &format!("/v1/pools/p/{op}"), w, Some(json!({"key":"k","holder":holder})))
            .err(409, "holder_reserved");
    }
}

/// The holder limit is 256 bytes with and without tokens: a 256-byte holder is acquired,
/// listed (as `CLIENT/HOLDER` with tokens) and released, and a 257-byte one is refused 400
/// naming the limit, on both.
#[test]
fn the_holder_limit_is_the_same_with_and_without_tokens() {
    let (plain_dir, tokens_dir) =
        (tempfile::tempdir().expect("tempdir"), tempfile::tempdir().expect("tempdir"));
    let tk = tokens_file(
        tokens_dir.path(),
        &["a-client-name allocate file:a-client-name.token", "boss admin file:boss.token"],
    );
    let plain = start(plain_dir.path(), &[]);
    let tokened = start(tokens_dir.path(), &["--auth-tokens", tk.arg()]);
    let longest = "h".repeat(256);
    let over = "h".repeat(257);
    for (s, admin, user, stored) in [
        (&plain, None, None, longest.clone()),
        (
            &tokened,
            Some(tk.token("boss")),
            Some(tk.token("a-client-name")),
            format!("a-client-name/{longest}"),
        ),
    ] {
        call(s, "POST", "/v1/pools", admin, Some(json!({"name":"p","min":1,"max":9}))).ok();
        let got =
            call(s, "POST", "/v1/pools/p/acquire", user, Some(json!({"key":"k","holder":longest})));
        assert!(got.ok()["id"].as_u64().is_some());
        let b = call(s, "GET", "/v1/pools/p/bindings", user, None).ok();
        assert_eq!(b["bindings"][0]["holders"], json!([stored]), "{b}");
        let r =
            call(s, "POST", "/v1/pools/p/release", user, Some(json!({"key":"k","holder":longest})))
                .ok();
        assert_eq!(r["held"], true, "{r}");
        let msg =
            call(s, "POST", "/v1/pools/p/acquire", user, Some(json!({"key":"k","holder":over})))
                .err(400, "invalid_input");
        assert!(msg.contains("257 bytes") && msg.contains("at most 256 bytes"), "{msg}");
    }
}

/// Per-pool grants and quotas of the tokens file, each allowed and refused.
#[test]
fn grants_and_quotas_of_the_tokens_file() {
    let dir = tempfile::tempdir().expect("tempdir");
    let tk = tokens_file(
        dir.path(),
        &[
            "a allocate file:a.token read=shared write=vni-a* sessions=2 refs=3",
            "r read file:r.token rate=1 burst=2",
            "boss admin file:boss.token",
        ],
    );
    let s = start(dir.path(), &["--auth-tokens", tk.arg()]);
    let (a, r, boss) = (Some(tk.token("a")), Some(tk.token("r")), Some(tk.token("boss")));
    for p in ["vni-a1", "vni-b1", "shared"] {
        call(&s, "POST", "/v1/pools", boss, Some(json!({"name":p,"min":1,"max":100}))).ok();
    }
    call(&s, "POST", "/v1/pools/vni-b1/acquire", boss, Some(json!({"key":"x","holder":"h"}))).ok();

    // Grants: write vni-a*, read shared (and what it may write); nothing else, not even listed.
    call(&s, "POST", "/v1/pools/vni-a1/acquire", a, Some(json!({"key":"k1","holder":"h"}))).ok();
    for p in ["vni-b1", "shared"] {
        let msg = call(
            &s,
            "POST",
            &format!("/v1/pools/{p}/acquire"),
            a,
            Some(json!({"key":"k","holder":"h"})),
        )
        .err(403, "forbidden");
        assert!(msg.contains(&format!("{p:?}")) && msg.contains("write=vni-a*"), "{msg}");
    }
    call(&s, "GET", "/v1/pools/shared", a, None).ok();
    call(&s, "GET", "/v1/pools/vni-a1/bindings", a, None).ok();
    for path in [
        "/v1/pools/vni-b1",
        "/v1/pools/vni-b1/bindings",
        "/v1/pools/vni-b1/watch",
        "/v1/pools/vni-b1/keys/x",
    ] {
        let msg = call(&s, "GET", path, a, None).err(403, "forbidden");
        assert!(msg.contains("\"vni-b1\""), "{path}: {msg}");
    }
    let names = |t| {
        let l = call(&s, "GET", "/v1/pools", t, None).ok();
        let mut v: Vec<String> = l["pools"]
            .as_array()
            .expect("pools")
            .iter()
            .map(|p| p["name"].as_str().expect("name").to_string())
            .collect();
        v.sort();
        v
    };
    assert_eq!(names(a), ["shared", "vni-a1"]);
    assert_eq!(names(boss), ["shared", "vni-a1", "vni-b1"]);
    let m = call(&s, "GET", "/metrics", boss, None).text;
    assert!(m.contains("pool=\"vni-b1\""), "the test needs per-pool samples");
    let m = call(&s, "GET", "/metrics", a, None).text;
    assert!(!m.contains("pool=\"vni-b1\"") && m.contains("pool=\"vni-a1\""), "{m}");

    // refs=3 per pool: the 4th reference is refused and not written; an idempotent re-acquire
    // and a release still pass; a session's references count too.
    call(&s, "POST", "/v1/pools/vni-a1/acquire", a, Some(json!({"keys":["k2","k1"],"holder":"h"})))
        .ok();
    let sess = call(&s, "POST", "/v1/sessions", a, Some(json!({"ttl":30}))).ok();
    let sid = sess["session"].as_str().expect("session").to_string();
    call(&s, "POST", "/v1/pools/vni-a1/acquire", a, Some(json!({"key":"k3","session":sid}))).ok();
    let msg = call(
        &s,
        "POST",
        "/v1/pools/vni-a1/acquire",
        a,
        Some(json!({"keys":["k4","k1"],"holder":"h2"})),
    )
    .err(429, "quota_exceeded");
    assert!(
        msg.contains("refs=3") && msg.contains("\"vni-a1\"") && msg.contains("holds 3"),
        "{msg}"
    );
    call(&s, "GET", "/v1/pools/vni-a1/keys/k4?consistent=true", a, None).err(404, "not_found");
    call(&s, "POST", "/v1/pools/vni-a1/acquire", a, Some(json!({"key":"k1","holder":"h"}))).ok();
    call(&s, "POST", "/v1/pools/vni-a1/release", a, Some(json!({"key":"k1","holder":"h"}))).ok();
    call(&s, "POST", "/v1/pools/vni-a1/acquire", a, Some(json!({"key":"k4","holder":"h"}))).ok();

    // sessions=2: one is open; the second passes, the third is refused until one ends.
    let second = call(&s, "POST", "/v1/sessions", a, Some(json!({"ttl":30}))).ok();
    let msg =
        call(&s, "POST", "/v1/sessions", a, Some(json!({"ttl":30}))).err(429, "quota_exceeded");
    assert!(msg.contains("sessions=2"), "{msg}");
    let id2 = second["session"].as_str().expect("session");
    call(&s, "DELETE", &format!("/v1/sessions/{id2}"), a, None).ok();
    call(&s, "POST", "/v1/sessions", a, Some(json!({"ttl":30}))).ok();
    // Another client's sessions are not counted against it.
    call(&s, "POST", "/v1/sessions", boss, Some(json!({"ttl":30}))).ok();

    // rate=1 burst=2: of 10 requests sent at once, at most the burst plus one per second passes;
    // the refusals are 429 rate_limited with Retry-After.
    let agent = plain_agent(Duration::from_secs(30));
    let start = std::time::Instant::now();
    let (mut passed, mut refused) = (0u64, 0u64);
    for _ in 0..10 {
        let mut resp = agent
            .get(&s.http("/v1/pools"))
            .header("authorization", &format!("Bearer {}", r.expect("r")))
            .call()
            .expect("transport");
        match resp.status().as_u16() {
            200 => passed += 1,
            429 => {
                refused += 1;
                let after = resp.headers().get("retry-after").and_then(|v| v.to_str().ok());
                assert_eq!(after, Some("1"));
                let body: Value =
                    serde_json::from_str(&resp.body_mut().read_to_string().expect("body"))
                        .expect("JSON");
                assert_eq!(body["kind"], "rate_limited", "{body}");
                assert!(body["message"].as_str().is_some_and(|m| m.contains("\"r\"")), "{body}");
            }
            other => panic!("status {other}"),
        }
    }
    assert!(passed <= 2 + start.elapsed().as_secs() + 1, "{passed} passed");
    assert!(refused > 0 || start.elapsed() > Duration::from_secs(8), "none refused");
    // Other clients are not slowed by r's bucket.
    call(&s, "GET", "/v1/pools", a, None).ok();
}

/// Descriptors the process `pid` has open.
fn open_fds(pid: u32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd")).expect("read /proc/PID/fd").count()
}

/// 2,000 idle sockets: the service keeps at most `--max-connections` of them (closing the idle
/// longest to make room), so its descriptors stay bounded and `/healthz` still answers; when every
/// connection has a request in flight, a new one gets 503 `overloaded` as JSON.
#[test]
fn idle_sockets_cannot_lock_clients_out_and_extras_are_refused_as_json() {
    use std::io::{Read, Write};
    common::need_open_files(2000 + 256, "2,000 idle sockets");
    let dir = tempfile::tempdir().expect("tempdir");
    let s = start(dir.path(), &["--max-connections", "100", "--header-timeout", "120s"]);
    call(&s, "POST", "/v1/pools", None, Some(json!({"name":"p","min":1,"max":10}))).ok();
    let idle: Vec<std::net::TcpStream> = (0..2000)
        .map(|i| {
            std::net::TcpStream::connect(s.addr()).unwrap_or_else(|e| panic!("socket {i}: {e}"))
        })
        .collect();
    let r = call(&s, "GET", "/healthz", None, None);
    assert_eq!(r.status, 200, "{}", r.text);
    let fds = open_fds(s.pid());
    assert!(fds < 100 + 64, "serve holds {fds} descriptors with --max-connections 100");
    drop(idle);

    // Every connection busy: two watch streams take a cap of 2; a third connection is refused.
    drop(s);
    let s = start(dir.path(), &["--max-connections", "2"]);
    let watch = || {
        let mut c = std::net::TcpStream::connect(s.addr()).expect("connect");
        write!(c, "GET /v1/pools/p/watch HTTP/1.1\r\nhost: x\r\n\r\n").expect("send");
        let mut head = [0u8; 12];
        c.read_exact(&mut head).expect("the watch answers");
        assert_eq!(&head, b"HTTP/1.1 200", "{}", String::from_utf8_lossy(&head));
        c
    };
    let watches = [watch(), watch()];
    let mut c = std::net::TcpStream::connect(s.addr()).expect("connect");
    c.set_read_timeout(Some(Duration::from_secs(20))).expect("timeout");
    let mut answer = String::new();
    let _ = c.read_to_string(&mut answer);
    assert!(answer.starts_with("HTTP/1.1 503"), "{answer}");
    assert!(answer.contains("retry-after: 1"), "{answer}");
    let body: Value =
        serde_json::from_str(answer.split("\r\n\r\n").nth(1).expect("body")).expect("JSON");
    assert_eq!(body["kind"], "overloaded", "{body}");
    assert!(body["message"].as_str().is_some_and(|m| m.contains("--max-connections")), "{body}");
    drop(watches);
    let mut ok = false;
    for _ in 0..100 {
        if request(&plain_agent(Duration::from_secs(5)), "GET", &s.http("/healthz"), None, None)
            .is_ok_and(|r| r.status == 200)
        {
            ok = true;
            break;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    assert!(ok, "healthz answers once the watches are gone");
}

/// A client that sends its header too slowly (or nothing) is cut after `--header-timeout`; one
/// that keeps a connection idle is cut after `--idle-timeout`.
#[test]
fn slow_header_and_idle_clients_are_cut() {
    use std::io::{Read, Write};
    let dir = tempfile::tempdir().expect("tempdir");
    let s = start(dir.path(), &["--header-timeout", "1s", "--idle-timeout", "2s"]);
    // Closed by the server: EOF or a reset, not our own 30 s read timeout.
    let closed = idalloc_testkit::serve::read_until_closed;
    let mut slow = std::net::TcpStream::connect(s.addr()).expect("connect");
    write!(slow, "GET /healthz HTTP/1.1\r\nhost: x\r\n").expect("half a header");
    closed(&mut slow);
    let mut silent = std::net::TcpStream::connect(s.addr()).expect("connect");
    closed(&mut silent);
    // A keep-alive connection serves several requests, then is closed once idle.
    let mut kept = std::net::TcpStream::connect(s.addr()).expect("connect");
    kept.set_read_timeout(Some(Duration::from_secs(30))).expect("timeout");
    for _ in 0..2 {
        write!(kept, "GET /v1/pools HTTP/1.1\r\nhost: x\r\n\r\n").expect("request");
        let mut got = Vec::new();
        let mut byte = [0u8; 1];
        // The answer: its head, then as many body bytes as it announces.
        while !got.ends_with(b"\r\n\r\n") {
            kept.read_exact(&mut byte).expect("the answer's head");
            got.push(byte[0]);
        }
        let head = String::from_utf8_lossy(&got).to_lowercase();
        assert!(head.starts_with("http/1.1 200") && !head.contains("connection: close"), "{head}");
        let len: usize = head
            .lines()
            .find_map(|l| l.strip_prefix("content-length: "))
            .and_then(|n| n.trim().parse().ok())
            .expect("content-length");
        let mut body = vec![0u8; len];
        kept.read_exact(&mut body).expect("the answer's body");
    }
    assert!(closed(&mut kept).is_empty(), "closed with nothing more sent");
    // The service still answers.
    call(&s, "GET", "/healthz", None, None).ok();
}

/// An admin lists every client's sessions (holder, client, TTL, age, references; no id) and ends
/// any of them by holder; another client lists only its own and cannot end it. Every mutating request leaves one audit line (JSON)
/// with its request id (echoed, or generated), client, operation, pool, keys and outcome, and no
/// token anywhere in the log.
#[test]
fn admins_list_and_end_sessions_and_every_write_is_audited_without_tokens() {
    let dir = tempfile::tempdir().expect("tempdir");
    let tk = tokens_file(
        dir.path(),
        &["w allocate file:w.token", "boss admin file:boss.token", "x allocate file:x.token"],
    );
    let store = format!("file:{}", dir.path().join("ids.redb").display());
    let s = Serve::start_logged(
        bin(),
        &["--store", &store, "--timeout", "3s", "--log-format", "json"],
        &["--auth-tokens", tk.arg()],
        dir.path().join("serve.log"),
    );
    let (w, boss) = (Some(tk.token("w")), Some(tk.token("boss")));
    call(&s, "POST", "/v1/pools", boss, Some(json!({"name":"p","min":1,"max":100}))).ok();
    let sess = call(&s, "POST", "/v1/sessions", w, Some(json!({"ttl":30}))).ok();
    let (sid, holder) =
        (sess["session"].as_str().expect("id"), sess["holder"].as_str().expect("h"));
    call(&s, "POST", "/v1/pools/p/acquire", w, Some(json!({"keys":["a","b"],"session":sid}))).ok();

    let x = Some(tk.token("x"));
    let none = call(&s, "GET", "/v1/sessions", x, None).ok();
    assert_eq!(none["sessions"], json!([]), "{none}");
    let list = call(&s, "GET", "/v1/sessions", boss, None).ok();
    let one = &list["sessions"][0];
    assert_eq!(list["sessions"].as_array().map(Vec::len), Some(1), "{list}");
    assert_eq!((one["holder"].as_str(), one["client"].as_str()), (Some(holder), Some("w")));
    assert_eq!((one["ttl"].as_u64(), one["references"].as_u64()), (Some(30), Some(2)), "{one}");
    assert!(one["age"].as_u64().is_some() && !list.to_string().contains(sid), "{list}");
    // Another allocate client cannot end it by holder; the admin can.
    call(&s, "DELETE", &format!("/v1/sessions/{holder}"), x, None).err(404, "session_not_found");
    call(&s, "DELETE", &format!("/v1/sessions/{holder}"), boss, None).ok();
    call(&s, "POST", "/v1/pools/p/acquire", w, Some(json!({"key":"c","session":sid})))
        .err(404, "session_not_found");

    // X-Request-Id: echoed when sent, generated when not.
    let agent = plain_agent(Duration::from_secs(30));
    let resp = agent
        .post(&s.http("/v1/pools/p/acquire"))
        .header("authorization", &format!("Bearer {}", w.expect("w")))
        .header("x-request-id", "req-42")
        .header("content-type", "application/json")
        .send(json!({"keys":["k1","k2","k3"],"holder":"h"}).to_string())
        .expect("transport");
    assert_eq!(resp.headers().get("x-request-id").and_then(|v| v.to_str().ok()), Some("req-42"));
    let resp = agent.get(&s.http("/healthz")).call().expect("transport");
    let generated = resp.headers().get("x-request-id").and_then(|v| v.to_str().ok());
    assert!(generated.is_some_and(|g| g.len() == 32), "{generated:?}");
    // A refused write is audited too (refused before its body is read: no pool named).
    call(&s, "POST", "/v1/pools", w, Some(json!({"name":"q","min":1,"max":10})))
        .err(403, "forbidden");

    let (_, log) = s.stop();
    let audit: Vec<Value> = log
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .filter(|v| v["target"] == "idalloc::audit")
        .collect();
    let find = |id: &str| audit.iter().find(|v| v["fields"]["request_id"] == id);
    let line = find("req-42").unwrap_or_else(|| panic!("no audit line for req-42 in {audit:?}"));
    let f = &line["fields"];
    assert_eq!(
        (&f["client"], &f["operation"], &f["pool"], &f["keys"], &f["status"], &f["outcome"]),
        (&json!("w"), &json!("acquire"), &json!("p"), &json!(3), &json!(200), &json!("ok")),
        "{line}"
    );
    let refused = audit
        .iter()
        .find(|v| v["fields"]["operation"] == "pool_create" && v["fields"]["status"] == 403);
    assert!(
        refused
            .is_some_and(|v| v["fields"]["client"] == "w" && v["fields"]["outcome"] == "refused"),
        "{audit:?}"
    );
    let ended = audit
        .iter()
        .find(|v| v["fields"]["operation"] == "session_end" && v["fields"]["outcome"] == "ok");
    assert!(ended.is_some_and(|v| v["fields"]["client"] == "boss"), "{audit:?}");
    // One line per mutating request: pool create, session open, acquire, 2 session ends,
    // 2 acquires, pool create refused (GETs are not audited).
    assert_eq!(audit.len(), 8, "{audit:#?}");
    for t in tk.tokens() {
        assert!(!log.contains(t), "a token is in the log");
    }
    assert!(!log.contains(sid), "a session id is in the log");
}

/// `serve` with `extra` flags on a memory store: exit code, stdout, stderr. A server that starts
/// is stopped by its PID.
fn run_serve(extra: &[&str]) -> (Option<i32>, String, String) {
    use std::io::{BufRead, BufReader};
    use std::process::{Command, Stdio};
    let mut child = Command::new(bin())
        .args(["--store", "memory:", "serve", "--listen", "127.0.0.1:0"])
        .args(extra)
        .env("RUST_LOG", "warn")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run serve");
    let mut first = String::new();
    let _ = BufReader::new(child.stdout.take().expect("stdout")).read_line(&mut first);
    if first.starts_with("listening on") {
        let _ = child.kill();
    }
    let out = child.wait_with_output().expect("wait");
    (out.status.code(), first, String::from_utf8_lossy(&out.stderr).to_string())
}

fn chmod(path: &Path, mode: u32) {
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).expect("chmod");
}

/// A tokens file, token file or TLS key others can write is refused; a token file or key anyone
/// can read is refused; a tokens file anyone can read (it may hold only digests) starts with a
/// warning; each message names the file and `chmod 600 FILE`.
#[test]
fn secret_files_others_can_write_or_read_are_refused_or_warned() {
    let dir = tempfile::tempdir().expect("tempdir");
    let tk = tokens_file(dir.path(), &["w allocate file:w.token"]);
    let (tokens, t) = (tk.path.clone(), tk.arg().to_string());
    let token_file = dir.path().join("w.token");
    let refused = |extra: &[&str], file: &Path, why: &str| {
        let (code, out, err) = run_serve(extra);
        assert_eq!(code, Some(2), "{extra:?}: {out} {err}");
        assert!(
            err.contains(why) && err.contains(&format!("chmod 600 {}", file.display())),
            "{err}"
        );
    };
    chmod(&tokens, 0o666);
    refused(&["--auth-tokens", &t], &tokens, "writable by anyone");
    chmod(&tokens, 0o620);
    refused(&["--auth-tokens", &t], &tokens, "writable by its group");
    chmod(&tokens, 0o644);
    let (_, out, err) = run_serve(&["--auth-tokens", &t]);
    assert!(out.starts_with("listening on"), "{out} {err}");
    assert!(err.contains("readable by anyone") && err.contains(&t), "{err}");
    chmod(&tokens, 0o600);
    chmod(&token_file, 0o644);
    refused(&["--auth-tokens", &t], &token_file, "readable by anyone: refusing");
    chmod(&token_file, 0o600);
    let (_, out, err) = run_serve(&["--auth-tokens", &t]);
    assert!(out.starts_with("listening on") && !err.contains("chmod"), "{out} {err}");

    let pki = idalloc_testkit::secure::TestPki::generate(dir.path()).expect("certificates");
    let (cert, key) =
        (pki.server.cert.to_str().expect("utf-8"), pki.server.key.to_str().expect("utf-8"));
    chmod(&pki.server.key, 0o644);
    refused(&["--tls-cert", cert, "--tls-key", key], &pki.server.key, "the TLS key");
    chmod(&pki.server.key, 0o600);
    let (_, out, err) = run_serve(&["--tls-cert", cert, "--tls-key", key]);
    assert!(out.starts_with("listening on"), "{out} {err}");
}

/// Requests in flight are bounded per client (429 `rate_limited` with Retry-After) and in total
/// (503 `overloaded`); a body that stops arriving is given up after `--body-timeout`, which frees
/// the slot.
///
/// The held request must have its slot before the next request is sent. Writing it first is not
/// enough: the service serves its connections in parallel, so a request sent right after it on
/// another connection can reach the limiter first, take the only slot and get the held request
/// refused at once (this test failed that way in about 1 run of 20 while it polled; a trace of
/// the service showed the poll entering the limiter before the held request, which was answered
/// 503). So the held request says `Expect: 100-continue` and sends its (partial) body only after
/// the `100 Continue`, which hyper sends when the handler first reads the body, after every
/// layer, the limiter included, has let the request through.
#[test]
fn requests_in_flight_are_bounded_per_client_and_in_total_and_slow_bodies_time_out() {
    use std::io::{Read, Write};
    let dir = tempfile::tempdir().expect("tempdir");
    // A request whose body never completes: it holds its slot until the body timeout. Returns
    // once the service is reading its body, so once it holds its slot.
    let hold = |s: &Serve| {
        let mut c = std::net::TcpStream::connect(s.addr()).expect("connect");
        c.set_read_timeout(Some(Duration::from_secs(30))).expect("timeout");
        write!(
            c,
            "POST /v1/sessions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n\
             content-length: 100\r\nexpect: 100-continue\r\n\r\n"
        )
        .expect("send");
        let mut head = [0u8; 25];
        c.read_exact(&mut head).expect("an interim answer");
        assert_eq!(&head, b"HTTP/1.1 100 Continue\r\n\r\n", "{}", String::from_utf8_lossy(&head));
        c.write_all(b"{\"ttl\":").expect("part of the body");
        c
    };
    let slot_freed = |s: &Serve, held: &mut std::net::TcpStream| {
        let mut head = [0u8; 12];
        held.read_exact(&mut head).expect("the slow request is answered after the body timeout");
        let status = String::from_utf8_lossy(&head[9..12]).to_string();
        assert!(status.starts_with('4'), "{}", String::from_utf8_lossy(&head));
        call(s, "GET", "/v1/pools", None, None).ok();
    };
    let s = start(dir.path(), &["--max-requests-per-client", "1", "--body-timeout", "2s"]);
    let mut held = hold(&s);
    let msg = call(&s, "GET", "/v1/pools", None, None).err(429, "rate_limited");
    assert!(msg.contains("127.0.0.1") && msg.contains("--max-requests-per-client"), "{msg}");
    assert_eq!(call(&s, "GET", "/healthz", None, None).status, 200, "healthz is never limited");
    slot_freed(&s, &mut held);
    drop(s);

    let s = start(dir.path(), &["--max-requests", "1", "--body-timeout", "2s"]);
    let mut held = hold(&s);
    let msg = call(&s, "GET", "/v1/pools", None, None).err(503, "overloaded");
    assert!(msg.contains("--max-requests"), "{msg}");
    slot_freed(&s, &mut held);
}
