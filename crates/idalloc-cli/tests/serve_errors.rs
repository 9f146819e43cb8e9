//! `idalloc serve` against careless and hostile requests, as a real
//! process over raw HTTP/1.1 (any method, any path, any header, as a client can send them):
//! `/metrics` keeps its size whatever requests arrive, and every error is JSON `{"kind","message"}`
//! with its documented status.
//!
//! The store is `memory:` (nothing here depends on the store). Every process is stopped by PID.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::path::Path;
use std::time::Duration;

use idalloc_testkit::serve::Serve;
use serde_json::Value;

fn bin() -> &'static str {
    env!("CARGO_BIN_EXE_idalloc")
}

fn start_serve(extra: &[&str]) -> Serve {
    Serve::start(bin(), &["--store", "memory:", "--timeout", "3s"], extra)
}

/// One answer, as read off the wire.
#[derive(Debug)]
struct Answer {
    status: u16,
    /// Header names lower-cased.
    headers: Vec<(String, String)>,
    body: Vec<u8>,
}

impl Answer {
    fn header(&self, name: &str) -> Option<&str> {
        self.headers.iter().find(|(k, _)| k == name).map(|(_, v)| v.as_str())
    }

    fn json(&self) -> Value {
        serde_json::from_slice(&self.body).unwrap_or_else(|e| {
            panic!("not JSON ({e}): {} {}", self.status, String::from_utf8_lossy(&self.body))
        })
    }

    /// Asserts a JSON error of this status and kind (with a non-empty message and the JSON
    /// content type); returns the message.
    fn error(&self, status: u16, kind: &str) -> String {
        let text = String::from_utf8_lossy(&self.body).to_string();
        assert_eq!(self.status, status, "{text}");
        assert_eq!(self.header("content-type"), Some("application/json"), "{text}");
        let v = self.json();
        assert_eq!(v["kind"], kind, "{text}");
        let msg = v["message"].as_str().unwrap_or_else(|| panic!("no message: {text}"));
        assert!(!msg.is_empty(), "{text}");
        msg.to_string()
    }
}

/// A keep-alive HTTP/1.1 connection that sends requests verbatim (any method token, any path) and
/// reads answers by their `content-length`; reconnects when the server closed the connection.
struct Raw {
    addr: String,
    conn: Option<BufReader<TcpStream>>,
}

impl Raw {
    fn new(addr: &str) -> Raw {
        Raw { addr: addr.to_string(), conn: None }
    }

    fn send(&mut self, method: &str, path: &str, headers: &[(&str, &str)], body: &[u8]) -> Answer {
        let mut head = format!("{method} {path} HTTP/1.1\r\nhost: {}\r\n", self.addr);
        for (k, v) in headers {
            head.push_str(&format!("{k}: {v}\r\n"));
        }
        head.push_str(&format!("content-length: {}\r\n\r\n", body.len()));
        let conn = match &mut self.conn {
            Some(c) => c,
            None => {
                let s = TcpStream::connect(&self.addr).expect("connect");
                s.set_read_timeout(Some(Duration::from_secs(30))).expect("timeout");
                self.conn.insert(BufReader::new(s))
            }
        };
        let s = conn.get_mut();
        s.write_all(head.as_bytes()).expect("write head");
        s.write_all(body).expect("write body");
        let mut line = String::new();
        conn.read_line(&mut line).expect("status line");
        let status = line
            .split_whitespace()
            .nth(1)
            .and_then(|x| x.parse().ok())
            .unwrap_or_else(|| panic!("bad status line {line:?} for {method} {path}"));
        let mut headers = Vec::new();
        loop {
            let mut h = String::new();
            conn.read_line(&mut h).expect("header");
            let h = h.trim_end();
            if h.is_empty() {
                break;
            }
            let (k, v) = h.split_once(':').expect("header line");
            headers.push((k.trim().to_ascii_lowercase(), v.trim().to_string()));
        }
        let len: usize = headers
            .iter()
            .find(|(k, _)| k == "content-length")
            .and_then(|(_, v)| v.parse().ok())
            .unwrap_or_else(|| panic!("no content-length: {status} {headers:?}"));
        let mut body = vec![0; len];
        conn.read_exact(&mut body).expect("body");
        let a = Answer { status, headers, body };
        if a.header("connection") == Some("close") {
            self.conn = None;
        }
        a
    }

    fn get(&mut self, path: &str) -> Answer {
        self.send("GET", path, &[], b"")
    }
}

/// Hostile round `round`: `n` requests with made-up methods and made-up paths (made-up pools,
/// keys, session ids, routes), each unique.
fn hostile_round(raw: &mut Raw, round: u32, n: u32, token: Option<&str>) {
    let auth = token.map(|t| format!("Bearer {t}"));
    let headers: Vec<(&str, &str)> = auth.iter().map(|a| ("authorization", a.as_str())).collect();
    for i in 0..n {
        let method = format!("M{round}X{i}");
        let path = match i % 6 {
            0 => format!("/v1/pools/made-up-{round}-{i}"),
            1 => format!("/v1/pools/p/keys/k-{round}-{i}"),
            2 => format!("/nowhere/{round}/{i}"),
            3 => format!("/v1/sessions/s{round}x{i}/keepalive"),
            4 => format!("/v1/pools/q{round}x{i}/acquire"),
            _ => format!("/metrics{round}{i}"),
        };
        let a = raw.send(&method, &path, &headers, b"");
        assert!(a.status >= 400, "{method} {path}: {}", a.status);
        // The real methods on made-up paths and pools too.
        let m = ["GET", "POST", "DELETE", "PUT"][(i % 4) as usize];
        let a = raw.send(m, &path, &headers, b"{}");
        assert!(a.status >= 400, "{m} {path}: {}", a.status);
    }
}

fn metrics_size(raw: &mut Raw, token: Option<&str>) -> usize {
    let auth = token.map(|t| format!("Bearer {t}"));
    let headers: Vec<(&str, &str)> = auth.iter().map(|a| ("authorization", a.as_str())).collect();
    let a = raw.send("GET", "/metrics", &headers, b"");
    assert_eq!(a.status, 200, "{}", String::from_utf8_lossy(&a.body));
    a.body.len()
}

fn sha256_hex(token: &str) -> String {
    let d = std::process::Command::new("sha256sum")
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .and_then(|mut c| {
            c.stdin.take().expect("stdin").write_all(token.as_bytes())?;
            c.wait_with_output()
        })
        .expect("sha256sum");
    String::from_utf8(d.stdout).expect("utf-8")[..64].to_string()
}

fn tokens_file(dir: &Path, admin: &str) -> String {
    let path = dir.join("tokens");
    std::fs::write(&path, format!("boss admin sha256:{}\n", sha256_hex(admin))).expect("write");
    path.to_str().expect("utf-8").to_string()
}

/// Thousands of requests with made-up methods and paths, with and without a token when
/// tokens are on, leave `/metrics` the size it had (a few hundred bytes of slack: counters grow
/// digits). Before the fix every made-up method (and unmatched path) was a new series.
#[test]
fn metrics_keep_their_size_whatever_requests_arrive() {
    let dir = tempfile::tempdir().expect("tempdir");
    let admin = "boss-token-0123456789abcdef";
    let tokens = tokens_file(dir.path(), admin);
    for (extra, token) in [(vec![], None), (vec!["--auth-tokens", tokens.as_str()], Some(admin))] {
        let s = start_serve(&extra);
        let mut raw = Raw::new(s.addr());
        let auth = token.map(|t| format!("Bearer {t}"));
        let h: Vec<(&str, &str)> = auth.iter().map(|a| ("authorization", a.as_str())).collect();
        let body = br#"{"name":"p","min":1,"max":100}"#;
        assert_eq!(raw.send("POST", "/v1/pools", &h, body).status, 200);
        // Warm-up: every label value the hostile rounds can reach exists after this.
        for round_token in [None, token] {
            hostile_round(&mut raw, 0, 60, round_token);
        }
        // Once before measuring: the first scrape adds its own series.
        metrics_size(&mut raw, token);
        let before = metrics_size(&mut raw, token);
        for round_token in [None, token] {
            hostile_round(&mut raw, 1, 1500, round_token);
        }
        let after = metrics_size(&mut raw, token);
        assert!(
            after <= before + before / 50 + 512,
            "/metrics grew from {before} to {after} bytes (tokens: {})",
            token.is_some()
        );
        let text = String::from_utf8(raw.get_with(token, "/metrics")).expect("utf-8");
        assert!(text.contains("method=\"other\""), "made-up methods are counted as other");
        assert!(text.contains("route=\"other\""), "unmatched paths are counted as other");
        assert!(!text.contains("M1X"), "no made-up method is a label");
        assert!(!text.contains("made-up"), "no made-up pool is a label");
    }
}

impl Raw {
    fn get_with(&mut self, token: Option<&str>, path: &str) -> Vec<u8> {
        let auth = token.map(|t| format!("Bearer {t}"));
        let h: Vec<(&str, &str)> = auth.iter().map(|a| ("authorization", a.as_str())).collect();
        self.send("GET", path, &h, b"").body
    }
}

/// Every error is JSON with its documented status, including the rejections of the
/// query, path and body extractors, unknown routes and 405 (with `Allow`).
#[test]
fn every_error_is_json_with_its_documented_status() {
    let dir = tempfile::tempdir().expect("tempdir");
    let admin = "boss-token-0123456789abcdef";
    let tokens = tokens_file(dir.path(), admin);
    let s = start_serve(&["--max-body", "1000"]);
    let mut raw = Raw::new(s.addr());
    let json = [("content-type", "application/json")];
    let created = raw.send("POST", "/v1/pools", &json, br#"{"name":"p","min":1,"max":100}"#);
    assert_eq!(created.status, 200, "{}", String::from_utf8_lossy(&created.body));

    // Query parameters: each names the parameter, the value and what is allowed.
    let cases: [(&str, &str, &[&str]); 9] = [
        ("GET", "/v1/pools/p/bindings?limit=abc", &["limit", "\"abc\"", "1 to 10000"]),
        ("GET", "/v1/pools/p/bindings?limit=0", &["limit", "1 to 10000"]),
        ("GET", "/v1/pools/p/bindings?after=-1", &["after", "\"-1\""]),
        ("GET", "/v1/pools/p/bindings?bogus=1", &["bogus"]),
        ("DELETE", "/v1/pools/p?force=yes", &["force", "\"yes\"", "true or false"]),
        ("GET", "/v1/pools/p/keys/k?consistent=maybe", &["consistent", "\"maybe\""]),
        ("GET", "/v1/pools/p/ids/abc", &["ID", "\"abc\""]),
        ("GET", "/v1/pools/p/watch?from_revision=x", &["from_revision", "\"x\""]),
        ("GET", "/v1/pools/p/watch?from_revision=0", &["from_revision", "at least 1"]),
    ];
    for (m, path, needles) in cases {
        let msg = raw.send(m, path, &[], b"").error(400, "invalid_input");
        for n in needles {
            assert!(msg.contains(n), "{m} {path}: {msg:?} does not name {n}");
        }
    }
    // Path segments that are not UTF-8.
    for path in ["/v1/pools/%FF", "/v1/pools/p/keys/%FF%FE", "/v1/pools/%C3/acquire"] {
        let m = if path.ends_with("acquire") { "POST" } else { "GET" };
        raw.send(m, path, &json, b"{}").error(400, "invalid_input");
    }
    // Bodies: malformed, unknown field, not JSON, too large (announced, and chunked).
    let msg = raw.send("POST", "/v1/pools", &json, b"{").error(400, "invalid_input");
    assert!(msg.contains("JSON"), "{msg}");
    let msg = raw
        .send("POST", "/v1/pools/p/acquire", &json, br#"{"key":"k","holder":"h","x":1}"#)
        .error(400, "invalid_input");
    assert!(msg.contains("unknown field"), "{msg}");
    for ct in ["text/plain", "application/x-www-form-urlencoded", "application/jsonx"] {
        let msg = raw
            .send("POST", "/v1/pools/p/acquire", &[("content-type", ct)], br#"{"key":"k"}"#)
            .error(415, "unsupported_media_type");
        assert!(msg.contains(ct) && msg.contains("application/json"), "{msg}");
    }
    let ok = raw.send(
        "POST",
        "/v1/pools/p/acquire",
        &[("content-type", "application/json; charset=utf-8")],
        br#"{"key":"k","holder":"h"}"#,
    );
    assert_eq!(ok.status, 200, "{}", String::from_utf8_lossy(&ok.body));
    let big = format!(r#"{{"key":"{}","holder":"h"}}"#, "k".repeat(2000));
    let msg =
        raw.send("POST", "/v1/pools/p/acquire", &json, big.as_bytes()).error(413, "too_large");
    assert!(msg.contains("1000"), "{msg}");
    let chunked = chunked_post(s.addr(), "/v1/pools/p/acquire", big.as_bytes());
    chunked.error(413, "too_large");

    // Unknown routes and methods.
    raw.get("/nowhere").error(404, "not_found");
    raw.send("POST", "/v1/pools/p/nothing", &json, b"{}").error(404, "not_found");
    for (m, path, allow) in [
        ("PUT", "/v1/pools", &["GET", "POST"][..]),
        ("BREW", "/v1/pools", &["GET", "POST"][..]),
        ("PATCH", "/healthz", &["GET"][..]),
        ("GET", "/v1/pools/p/acquire", &["POST"][..]),
        ("POST", "/v1/sessions/abc", &["DELETE"][..]),
    ] {
        let a = raw.send(m, path, &json, b"{}");
        a.error(405, "method_not_allowed");
        let allowed = a.header("allow").unwrap_or_else(|| panic!("{m} {path}: no Allow"));
        for want in allow {
            assert!(allowed.split(',').any(|x| x.trim() == *want), "{m} {path}: Allow {allowed}");
        }
    }

    // With tokens, the refusals are JSON too (and still carry their headers).
    let t = start_serve(&["--auth-tokens", &tokens]);
    let mut raw = Raw::new(t.addr());
    let a = raw.get("/v1/pools");
    a.error(401, "unauthenticated");
    assert!(a.header("www-authenticate").is_some_and(|v| v.starts_with("Bearer")));
    raw.get("/no/such/route").error(401, "unauthenticated");
    let bearer = format!("Bearer {admin}");
    let auth = [("authorization", bearer.as_str())];
    raw.send("GET", "/no/such/route", &auth, b"").error(404, "not_found");
    raw.send("GET", "/v1/pools/x/bindings?limit=abc", &auth, b"").error(400, "invalid_input");
}

/// POSTs `body` in chunks (no announced length), as a streaming client does.
fn chunked_post(addr: &str, path: &str, body: &[u8]) -> Answer {
    let mut c = TcpStream::connect(addr).expect("connect");
    c.set_read_timeout(Some(Duration::from_secs(30))).expect("timeout");
    let head = format!(
        "POST {path} HTTP/1.1\r\nhost: {addr}\r\ncontent-type: application/json\r\ntransfer-encoding: chunked\r\nconnection: close\r\n\r\n"
    );
    c.write_all(head.as_bytes()).expect("head");
    for chunk in body.chunks(100) {
        let _ = c.write_all(format!("{:x}\r\n", chunk.len()).as_bytes());
        let _ = c.write_all(chunk);
        let _ = c.write_all(b"\r\n");
    }
    let _ = c.write_all(b"0\r\n\r\n");
    let mut all = Vec::new();
    let _ = c.read_to_end(&mut all);
    let text = String::from_utf8_lossy(&all).to_string();
    let (head, body) = text.split_once("\r\n\r\n").expect("an answer");
    let mut lines = head.lines();
    let status =
        lines.next().and_then(|l| l.split_whitespace().nth(1)).and_then(|x| x.parse().ok());
    let headers = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(k, v)| (k.trim().to_ascii_lowercase(), v.trim().to_string()))
        .collect();
    Answer { status: status.expect("status"), headers, body: body.as_bytes().to_vec() }
}
