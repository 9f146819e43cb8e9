//! No client of `idalloc serve` can lock the others out: per-client caps on connections and
//! watch streams, the victim at the connection cap (the client holding the most, never a
//! newcomer), probes always answered, a total deadline on request bodies, refusals at the
//! connection cap audited, a watch from a future revision refused. Real processes on the file
//! store, over real HTTP on free loopback ports; raw sockets where a test must hold connections.

mod common;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::Path;
use std::time::Duration;

use common::{plain_agent, request, Resp};
use idalloc_testkit::serve::{read_until_closed, tokens_file, Serve};
use serde_json::{json, Value};

fn bin() -> &'static str {
    env!("CARGO_BIN_EXE_idalloc")
}

fn store(dir: &Path) -> String {
    format!("file:{}", dir.join("ids.redb").display())
}

/// `idalloc --store file:DIR/ids.redb --timeout 3s serve … EXTRA`.
fn start(dir: &Path, extra: &[&str]) -> Serve {
    Serve::start(bin(), &["--store", &store(dir), "--timeout", "3s"], extra)
}

fn call(s: &Serve, method: &str, path: &str, token: Option<&str>, body: Option<Value>) -> Resp {
    let body = body.map(|b| b.to_string());
    request(&plain_agent(Duration::from_secs(30)), method, &s.http(path), token, body.as_deref())
        .unwrap_or_else(|e| panic!("{method} {path}: {e}"))
}

/// Sends `GET path` on a new connection (with the token, if any) and reads the answer's head;
/// returns the status, the head and the connection (a watch stream's stays open).
fn open(s: &Serve, path: &str, token: Option<&str>) -> (u16, String, TcpStream) {
    let mut c = TcpStream::connect(s.addr()).expect("connect");
    c.set_read_timeout(Some(Duration::from_secs(30))).expect("timeout");
    let auth = token.map(|t| format!("authorization: Bearer {t}\r\n")).unwrap_or_default();
    write!(c, "GET {path} HTTP/1.1\r\nhost: x\r\n{auth}\r\n").expect("send");
    let head = read_head(&mut c);
    let status = head.get(9..12).and_then(|s| s.parse().ok()).unwrap_or(0);
    (status, head, c)
}

/// Reads an answer's head (through the blank line), lowercased.
fn read_head(c: &mut TcpStream) -> String {
    let mut got = Vec::new();
    let mut byte = [0u8; 1];
    while !got.ends_with(b"\r\n\r\n") {
        match c.read(&mut byte) {
            Ok(1) => got.push(byte[0]),
            other => panic!("the answer's head ended early ({other:?}): {got:?}"),
        }
    }
    String::from_utf8_lossy(&got).to_lowercase()
}

/// The body of an answer with a `content-length`, as JSON.
fn read_body(c: &mut TcpStream, head: &str) -> Value {
    let len: usize = head
        .lines()
        .find_map(|l| l.strip_prefix("content-length: "))
        .and_then(|n| n.trim().parse().ok())
        .unwrap_or_else(|| panic!("no content-length: {head}"));
    let mut body = vec![0u8; len];
    c.read_exact(&mut body).expect("the answer's body");
    serde_json::from_slice(&body).expect("a JSON body")
}

/// True if the server has closed `c` (EOF or reset, after whatever it had sent); false if it is
/// open with nothing more to read now.
fn closed(c: &mut TcpStream) -> bool {
    c.set_read_timeout(Some(Duration::from_millis(300))).expect("timeout");
    let mut buf = [0u8; 4096];
    loop {
        match c.read(&mut buf) {
            Ok(0) => return true,
            Ok(_) => continue,
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => return true,
            Err(_) => return false,
        }
    }
}

/// One client holds watch streams and connections at its caps: its next stream and its next
/// connection are refused (429, naming the limit), while another client acquires and `/healthz`,
/// `/readyz` and `/metrics` answer.
#[test]
fn a_client_at_its_watch_and_connection_caps_locks_nobody_out() {
    let dir = tempfile::tempdir().expect("tempdir");
    let tk = tokens_file(
        dir.path(),
        &[
            "flood read file:flood.token",
            "other allocate file:other.token",
            "boss admin file:boss.token",
        ],
    );
    let s = start(
        dir.path(),
        &[
            "--auth-tokens",
            tk.arg(),
            "--max-connections",
            "20",
            "--max-connections-per-client",
            "5",
            "--max-watches-per-client",
            "3",
        ],
    );
    let (flood, other, boss) = (tk.token("flood"), tk.token("other"), tk.token("boss"));
    call(&s, "POST", "/v1/pools", Some(boss), Some(json!({"name":"p","min":1,"max":100}))).ok();

    let mut held = Vec::new();
    for i in 0..3 {
        let (status, head, c) = open(&s, "/v1/pools/p/watch", Some(flood));
        assert_eq!(status, 200, "watch {i}: {head}");
        held.push(c);
    }
    // A fourth stream: refused, its connection (the fourth) kept.
    let (status, head, mut c) = open(&s, "/v1/pools/p/watch", Some(flood));
    assert_eq!(status, 429, "{head}");
    let body = read_body(&mut c, &head);
    assert_eq!(body["kind"], "rate_limited", "{body}");
    let msg = body["message"].as_str().unwrap_or("");
    assert!(msg.contains("--max-watches-per-client 3") && msg.contains("flood"), "{body}");
    held.push(c);
    // A fifth connection is served; a sixth is refused and closed.
    let (status, head, c) = open(&s, "/v1/pools", Some(flood));
    assert_eq!(status, 200, "{head}");
    held.push(c);
    let (status, head, mut c) = open(&s, "/v1/pools", Some(flood));
    assert_eq!(status, 429, "{head}");
    assert!(head.contains("connection: close") && head.contains("retry-after: 1"), "{head}");
    let body = read_body(&mut c, &head);
    let msg = body["message"].as_str().unwrap_or("");
    assert!(msg.contains("6 connections") && msg.contains("--max-connections-per-client"), "{msg}");
    assert!(read_until_closed(&mut c).is_empty());

    // Everyone else is served.
    let got =
        call(&s, "POST", "/v1/pools/p/acquire", Some(other), Some(json!({"key":"k","holder":"h"})));
    assert_eq!(got.ok()["id"].as_u64().map(|id| id >= 1), Some(true));
    for (probe, t) in [("/healthz", None), ("/readyz", None), ("/metrics", Some(other))] {
        let (status, head, _c) = open(&s, probe, t);
        assert_eq!(status, 200, "{probe}: {head}");
    }
    let (status, head, _c) = open(&s, "/v1/pools/p/watch", Some(other));
    assert_eq!(status, 200, "another client's stream: {head}");
    drop(held);
}

/// `connections=` and `watches=` on a client's tokens-file line replace the per-client flags for
/// that client, lower or higher; the refusals name the tokens-file setting.
#[test]
fn tokens_file_caps_replace_the_per_client_flags() {
    let dir = tempfile::tempdir().expect("tempdir");
    let tk = tokens_file(
        dir.path(),
        &[
            "tight read file:tight.token watches=1 connections=3",
            "wide read file:wide.token watches=4",
            "boss admin file:boss.token",
        ],
    );
    let s = start(
        dir.path(),
        &[
            "--auth-tokens",
            tk.arg(),
            "--max-connections-per-client",
            "10",
            "--max-watches-per-client",
            "2",
        ],
    );
    let boss = Some(tk.token("boss"));
    call(&s, "POST", "/v1/pools", boss, Some(json!({"name":"p","min":1,"max":9}))).ok();
    let mut held = Vec::new();

    // `tight`: one stream (below the flag's 2), three connections (below the flag's 10).
    let (status, head, c) = open(&s, "/v1/pools/p/watch", Some(tk.token("tight")));
    assert_eq!(status, 200, "{head}");
    held.push(c);
    let (status, head, mut c) = open(&s, "/v1/pools/p/watch", Some(tk.token("tight")));
    assert_eq!(status, 429, "{head}");
    let body = read_body(&mut c, &head);
    let msg = body["message"].as_str().unwrap_or("");
    assert!(
        msg.contains("1 watch streams") && msg.contains("watches=1 in the tokens file"),
        "{body}"
    );
    held.push(c);
    let (status, head, c) = open(&s, "/v1/pools", Some(tk.token("tight")));
    assert_eq!(status, 200, "the third connection: {head}");
    held.push(c);
    let (status, head, mut c) = open(&s, "/v1/pools", Some(tk.token("tight")));
    assert_eq!(status, 429, "the fourth connection: {head}");
    let body = read_body(&mut c, &head);
    let msg = body["message"].as_str().unwrap_or("");
    assert!(
        msg.contains("4 connections") && msg.contains("connections=3 in the tokens file"),
        "{body}"
    );

    // `wide`: four streams (above the flag's 2), not a fifth.
    for i in 0..4 {
        let (status, head, c) = open(&s, "/v1/pools/p/watch", Some(tk.token("wide")));
        assert_eq!(status, 200, "stream {i}: {head}");
        held.push(c);
    }
    let (status, head, mut c) = open(&s, "/v1/pools/p/watch", Some(tk.token("wide")));
    assert_eq!(status, 429, "{head}");
    let body = read_body(&mut c, &head);
    assert!(body["message"].as_str().unwrap_or("").contains("watches=4"), "{body}");
    drop(held);
}

/// At the connection cap, a newcomer (a probe, another client) closes a connection of the
/// client holding the most (its newest watch stream), never one of a client holding fewer, and is
/// served; a newcomer whose own address holds the most and nothing idle is refused instead.
#[test]
fn at_the_connection_cap_the_client_holding_the_most_gives_way() {
    let dir = tempfile::tempdir().expect("tempdir");
    let tk = tokens_file(
        dir.path(),
        &[
            "flood read file:flood.token",
            "small read file:small.token",
            "other allocate file:other.token",
            "boss admin file:boss.token",
        ],
    );
    let s = start(
        dir.path(),
        &["--auth-tokens", tk.arg(), "--max-connections", "6", "--max-connections-per-client", "6"],
    );
    let (flood, small, other) = (tk.token("flood"), tk.token("small"), tk.token("other"));
    call(
        &s,
        "POST",
        "/v1/pools",
        Some(tk.token("boss")),
        Some(json!({"name":"p","min":1,"max":9})),
    )
    .ok();
    let watch = |t: &str| {
        let (status, head, c) = open(&s, "/v1/pools/p/watch", Some(t));
        assert_eq!(status, 200, "{head}");
        c
    };
    let mut big: Vec<TcpStream> = (0..4).map(|_| watch(flood)).collect();
    let mut few: Vec<TcpStream> = (0..2).map(|_| watch(small)).collect();

    // Six busy connections, the cap: a probe takes the newest of the four.
    let (status, head, _probe) = open(&s, "/healthz", None);
    assert_eq!(status, 200, "{head}");
    assert!(closed(&mut big[3]), "the newest stream of the client holding the most is closed");
    for (i, c) in big[..3].iter_mut().chain(few.iter_mut()).enumerate() {
        assert!(!closed(c), "stream {i} is still open");
    }
    // Another client's acquire: the next newest of the four goes.
    let mut c = TcpStream::connect(s.addr()).expect("connect");
    c.set_read_timeout(Some(Duration::from_secs(30))).expect("timeout");
    let body = json!({"key":"k","holder":"h"}).to_string();
    write!(
        c,
        "POST /v1/pools/p/acquire HTTP/1.1\r\nhost: x\r\nauthorization: Bearer {other}\r\n\
         content-type: application/json\r\ncontent-length: {}\r\n\r\n{body}",
        body.len()
    )
    .expect("send");
    let head = read_head(&mut c);
    assert!(head.starts_with("http/1.1 200"), "{head}");
    assert!(closed(&mut big[2]), "the next newest stream of the client holding the most");
    for (i, c) in big[..2].iter_mut().chain(few.iter_mut()).enumerate() {
        assert!(!closed(c), "stream {i} is still open");
    }
}

/// A body trickled a byte at a time (each byte well within any per-read timeout) is cut at the
/// total deadline, not served when it ends; the answer names the deadline.
#[test]
fn a_trickled_body_is_cut_at_the_body_deadline() {
    let dir = tempfile::tempdir().expect("tempdir");
    let s = start(dir.path(), &["--body-timeout", "2s"]);
    let mut c = TcpStream::connect(s.addr()).expect("connect");
    write!(
        c,
        "POST /v1/sessions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n\
         content-length: 100\r\n\r\n"
    )
    .expect("send");
    let mut writer = c.try_clone().expect("clone");
    let (stop_tx, stop_rx) = std::sync::mpsc::channel::<()>();
    let trickle = std::thread::spawn(move || {
        let mut sent = 0;
        while sent < 100 && stop_rx.recv_timeout(Duration::from_millis(250)).is_err() {
            if writer.write_all(b" ").is_err() {
                break;
            }
            sent += 1;
        }
        sent
    });
    c.set_read_timeout(Some(Duration::from_secs(60))).expect("timeout");
    let head = read_head(&mut c);
    let _ = stop_tx.send(());
    let sent = trickle.join().expect("the trickling thread");
    assert!(sent < 100, "the request was held until its whole body came ({sent} bytes)");
    assert!(head.starts_with("http/1.1 400"), "{head}");
    let body = read_body(&mut c, &head);
    assert!(body["message"].as_str().is_some_and(|m| m.contains("--body-timeout")), "{body}");
}

/// A watch from a revision the store has not reached is 400 with the current revision; a
/// mutating request refused at the connection cap leaves an audit line (request id, operation,
/// pool, 503) like any other refusal.
#[test]
fn future_revisions_are_refused_and_refusals_at_the_connection_cap_are_audited() {
    let dir = tempfile::tempdir().expect("tempdir");
    let s = Serve::start_logged(
        bin(),
        &["--store", &store(dir.path()), "--timeout", "3s", "--log-format", "json"],
        &["--max-connections", "2"],
        dir.path().join("serve.log"),
    );
    call(&s, "POST", "/v1/pools", None, Some(json!({"name":"p","min":1,"max":9}))).ok();
    let (status, head, first) = open(&s, "/v1/pools/p/watch", None);
    assert_eq!(status, 200, "{head}");
    let now = call(&s, "GET", "/v1/pools/p/watch?from_revision=1000000000", None, None);
    let current = now.body["revision"].as_i64().unwrap_or_else(|| panic!("{}", now.text));
    let msg = now.err(400, "invalid_input");
    assert_eq!(now_revision(&msg), current, "{msg}");
    assert!(msg.contains("from_revision 1000000000"), "{msg}");
    assert!((1..1_000_000_000).contains(&current), "{msg}");
    // Resuming after the current revision is no mistake: the stream waits for what comes next.
    let (status, head, second) =
        open(&s, &format!("/v1/pools/p/watch?from_revision={}", current + 1), None);
    assert_eq!(status, 200, "{head}");

    // Two streams hold both connections; the same address's acquire is refused at the cap
    // (once the setup's closed connections are gone: while one is still counted, idle, it is
    // closed instead, and the acquire, sent with `connection: close`, served).
    let mut refused = false;
    for _ in 0..50 {
        let mut c = TcpStream::connect(s.addr()).expect("connect");
        c.set_read_timeout(Some(Duration::from_secs(30))).expect("timeout");
        let body = json!({"key":"k","holder":"h"}).to_string();
        write!(
            c,
            "POST /v1/pools/p/acquire HTTP/1.1\r\nhost: x\r\nx-request-id: at-the-cap\r\n\
             connection: close\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{body}",
            body.len()
        )
        .expect("send");
        let head = read_head(&mut c);
        if head.starts_with("http/1.1 503") {
            refused = true;
            break;
        }
        assert!(head.starts_with("http/1.1 200"), "{head}");
        read_until_closed(&mut c);
        std::thread::sleep(Duration::from_millis(100));
    }
    assert!(refused, "the acquire was never refused at the cap");
    drop((first, second));

    let (_, log) = s.stop();
    let line = log
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .filter(|v| v["target"] == "idalloc::audit" && v["fields"]["request_id"] == "at-the-cap")
        .find(|v| v["fields"]["status"] == 503)
        .unwrap_or_else(|| panic!("no audit line of the refusal at the cap in {log}"));
    let f = &line["fields"];
    assert_eq!(
        (&f["operation"], &f["pool"], &f["status"], &f["outcome"], &f["address"]),
        (&json!("acquire"), &json!("p"), &json!(503), &json!("failed"), &json!("127.0.0.1")),
        "{line}"
    );
}

/// The current revision a 400 of a future revision names (`… current revision N; …`).
fn now_revision(msg: &str) -> i64 {
    msg.split("current revision ")
        .nth(1)
        .and_then(|r| r.split(|c: char| !c.is_ascii_digit()).next())
        .and_then(|r| r.parse().ok())
        .unwrap_or_else(|| panic!("no current revision in {msg:?}"))
}

/// `rate=` charges by work: a 1,000-key acquire costs 11 tokens (1 per 100 keys beyond the
/// first), so after it a client of `rate=1 burst=12` has about one cached read left, not 11; the
/// refusal names the rate and the burst.
#[test]
fn the_request_rate_charges_by_work() {
    let dir = tempfile::tempdir().expect("tempdir");
    let tk = tokens_file(
        dir.path(),
        &["w allocate file:w.token rate=1 burst=12", "boss admin file:boss.token"],
    );
    let s = start(dir.path(), &["--auth-tokens", tk.arg()]);
    let (w, boss) = (tk.token("w"), tk.token("boss"));
    call(&s, "POST", "/v1/pools", Some(boss), Some(json!({"name":"p","min":1,"max":5000}))).ok();
    let keys: Vec<String> = (0..1000).map(|i| format!("k{i}")).collect();
    let got =
        call(&s, "POST", "/v1/pools/p/acquire", Some(w), Some(json!({"keys":keys,"holder":"h"})));
    assert_eq!(got.ok()["results"].as_array().map(Vec::len), Some(1000));
    let mut served = 0;
    let msg = loop {
        let r = call(&s, "GET", "/v1/pools/p/keys/k0", Some(w), None);
        if r.status == 429 {
            break r.err(429, "rate_limited");
        }
        assert_eq!(r.status, 200, "{}", r.text);
        served += 1;
        assert!(served < 12, "the 1,000-key acquire cost as much as a get");
    };
    assert!(served < 5, "{served} reads served after a 1,000-key acquire at burst 12");
    assert!(msg.contains("rate=1"), "{msg}");
}
