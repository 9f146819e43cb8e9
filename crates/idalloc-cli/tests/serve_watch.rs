//! Watch fan-out of `idalloc serve`, as real processes over real HTTP: clients
//! that never read do not slow anyone, 1,000 subscribers are one etcd watch (etcd's own metrics),
//! a subscriber that disconnects is freed at once on an idle pool, `Last-Event-ID` resumes with
//! exactly the missed events, a client that falls behind the history is ended with the revision
//! to resume from, and a revision older than the history answers 410 `gone`.
//!
//! etcd: a private single-member etcd per test that needs one (its watcher count must be this
//! test's alone). Every process is stopped by its PID.

mod common;

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use common::{plain_agent, request, Resp};
use idalloc_testkit::serve::Serve;
use serde_json::{json, Value};

fn bin() -> &'static str {
    env!("CARGO_BIN_EXE_idalloc")
}

fn start_serve(store: &str, extra: &[&str]) -> Serve {
    Serve::start(bin(), &["--store", store, "--prefix", "w", "--timeout", "15s"], extra)
}

fn agent() -> ureq::Agent {
    plain_agent(Duration::from_secs(120))
}

fn post(s: &Serve, path: &str, body: Value) -> Resp {
    request(&agent(), "POST", &s.http(path), None, Some(&body.to_string()))
        .unwrap_or_else(|e| panic!("POST {path}: {e}"))
}

fn get(s: &Serve, path: &str) -> Resp {
    request(&agent(), "GET", &s.http(path), None, None)
        .unwrap_or_else(|e| panic!("GET {path}: {e}"))
}

fn wait_until(what: &str, timeout: Duration, mut f: impl FnMut() -> bool) {
    let deadline = Instant::now() + timeout;
    while !f() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// The value of the sample `name{labels}` in Prometheus text (0 if absent).
fn sample(text: &str, series: &str) -> f64 {
    text.lines()
        .find_map(|l| l.strip_prefix(series).and_then(|rest| rest.trim().parse().ok()))
        .unwrap_or(0.0)
}

fn subscribers(s: &Serve, pool: &str) -> f64 {
    sample(&get(s, "/metrics").text, &format!("idalloc_watch_subscribers{{pool=\"{pool}\"}}"))
}

/// One SSE event: name, id, data.
type Sse = (String, Option<i64>, Value);

/// A watch stream read over HTTP/1.0 (no chunked framing: the body is the event stream itself,
/// until the server closes it).
struct Stream {
    r: BufReader<TcpStream>,
}

impl Stream {
    /// Opens `GET path` with an optional `Last-Event-ID`; returns the status and, for 200, the
    /// stream (else the body).
    fn open(addr: &str, path: &str, last_event_id: Option<i64>) -> Result<Stream, (u16, Value)> {
        let mut c = TcpStream::connect(addr).expect("connect");
        c.set_read_timeout(Some(Duration::from_secs(60))).expect("timeout");
        let mut head = format!("GET {path} HTTP/1.0\r\nhost: {addr}\r\n");
        if let Some(id) = last_event_id {
            head.push_str(&format!("last-event-id: {id}\r\n"));
        }
        head.push_str("\r\n");
        c.write_all(head.as_bytes()).expect("write");
        let mut r = BufReader::new(c);
        let mut status = String::new();
        r.read_line(&mut status).expect("status line");
        let code: u16 =
            status.split_whitespace().nth(1).and_then(|x| x.parse().ok()).expect("status");
        loop {
            let mut h = String::new();
            r.read_line(&mut h).expect("header");
            if h.trim().is_empty() {
                break;
            }
        }
        if code != 200 {
            let mut body = String::new();
            let _ = r.read_to_string(&mut body);
            return Err((code, serde_json::from_str(&body).unwrap_or(Value::Null)));
        }
        Ok(Stream { r })
    }

    /// The next event (comments skipped); `None` when the stream ended.
    fn next(&mut self) -> Option<Sse> {
        let (mut name, mut id, mut data) = (String::new(), None, Value::Null);
        loop {
            let mut line = String::new();
            if self.r.read_line(&mut line).expect("read") == 0 {
                return None;
            }
            let line = line.trim_end_matches('\n');
            if line.is_empty() {
                if !name.is_empty() {
                    return Some((name, id, data));
                }
                continue;
            }
            if let Some(v) = line.strip_prefix("event: ") {
                name = v.to_string();
            } else if let Some(v) = line.strip_prefix("id: ") {
                id = Some(v.parse().expect("id is a revision"));
            } else if let Some(v) = line.strip_prefix("data: ") {
                data = serde_json::from_str(v).expect("data is JSON");
            }
        }
    }

    /// Events up to and including the first `synced`.
    fn until_synced(&mut self) -> Vec<Sse> {
        let mut out = Vec::new();
        loop {
            let e = self.next().expect("stream open until synced");
            let done = e.0 == "synced";
            out.push(e);
            if done {
                return out;
            }
        }
    }
}

fn acquire_many(s: &Serve, pool: &str, keys: &[String]) {
    let r = post(s, &format!("/v1/pools/{pool}/acquire"), json!({"keys": keys, "holder": "bulk"}));
    assert_eq!(r.status, 200, "{}", r.text);
}

/// A pool's keys named `{prefix}-{i}` for `i` in `range`, padded to `len` bytes.
fn keys(prefix: &str, range: std::ops::Range<usize>, len: usize) -> Vec<String> {
    range.map(|i| format!("{prefix}-{i:06}-{}", "x".repeat(len.saturating_sub(16)))).collect()
}

/// A subscriber that goes away is freed at once, on an idle pool (nothing to send it that would
/// reveal the closed connection), and the service's gauge says so.
#[test]
fn a_disconnected_subscriber_is_freed_at_once_on_an_idle_pool() {
    let s = start_serve("memory:", &[]);
    post(&s, "/v1/pools", json!({"name": "idle", "min": 1, "max": 100})).ok();
    post(&s, "/v1/pools/idle/acquire", json!({"key": "a", "holder": "h"})).ok();
    let mut streams: Vec<Stream> = (0..5)
        .map(|_| {
            let mut st = Stream::open(s.addr(), "/v1/pools/idle/watch", None).expect("watch");
            st.until_synced();
            st
        })
        .collect();
    assert_eq!(subscribers(&s, "idle"), 5.0);
    streams.truncate(2);
    // The keep-alive comment comes every 15 s: freed well before it, or the test fails.
    wait_until("closed streams to be freed", Duration::from_secs(5), || {
        subscribers(&s, "idle") == 2.0
    });
    drop(streams);
    wait_until("every stream to be freed", Duration::from_secs(5), || {
        subscribers(&s, "idle") == 0.0
    });
}

/// `Last-Event-ID` resumes with exactly the events missed while disconnected; a client that
/// falls behind the history is ended with the revision to resume from; a revision older than
/// the history is 410 `gone` with the current revision.
#[test]
fn resume_is_exact_a_slow_client_is_ended_and_an_old_revision_is_gone() {
    let s = start_serve("memory:", &["--watch-history", "100"]);
    post(&s, "/v1/pools", json!({"name": "r", "min": 1, "max": 100000})).ok();
    acquire_many(&s, "r", &keys("a", 0..10, 10));

    // A full stream from the start, read along as the reference.
    let mut reference = Stream::open(s.addr(), "/v1/pools/r/watch", None).expect("watch");
    let initial = reference.until_synced();
    assert_eq!(initial.len(), 11, "10 bindings and synced: {initial:?}");

    let mut first = Stream::open(s.addr(), "/v1/pools/r/watch", None).expect("watch");
    first.until_synced();
    acquire_many(&s, "r", &keys("b", 0..5, 10));
    let mut seen = Vec::new();
    while seen.len() < 5 {
        seen.push(first.next().expect("event"));
    }
    let last_id = seen.last().and_then(|e| e.1).expect("the last event of a revision has its id");
    drop(first);
    // Missed while away: releases and acquires, several per revision.
    post(&s, "/v1/pools/r/release", json!({"keys": keys("a", 0..3, 10), "holder": "bulk"})).ok();
    acquire_many(&s, "r", &keys("c", 0..4, 10));
    post(&s, "/v1/pools/r/acquire", json!({"key": "single", "holder": "h"})).ok();
    let missed_n = 3 + 4 + 1;
    let mut want = Vec::new();
    for _ in 0..5 + missed_n {
        want.push(reference.next().expect("reference event"));
    }
    let want = want.split_off(5);
    let mut resumed = Stream::open(s.addr(), "/v1/pools/r/watch", Some(last_id)).expect("resume");
    let got: Vec<Sse> = (0..missed_n).map(|_| resumed.next().expect("resumed event")).collect();
    assert_eq!(got, want, "exactly the missed events, in order, with the same ids");
    let kinds: Vec<&str> = got.iter().map(|e| e.0.as_str()).collect();
    assert_eq!(kinds.iter().filter(|k| **k == "delete").count(), 3, "{kinds:?}");
    // And the same through ?from_revision=.
    let mut by_query =
        Stream::open(s.addr(), &format!("/v1/pools/r/watch?from_revision={}", last_id + 1), None)
            .expect("resume");
    let got: Vec<Sse> = (0..missed_n).map(|_| by_query.next().expect("event")).collect();
    assert_eq!(got, want);

    // A client that stops reading while more than the history (100 changes) goes by, with
    // events large enough (3 KB keys, ~18 MB in all) to fill the socket buffers between us
    // (at most ~4 MB on the sending side here; the receiving side grows only as its reader reads).
    let mut slow = Stream::open(s.addr(), "/v1/pools/r/watch", None).expect("watch");
    let synced = slow.until_synced();
    let synced_rev = synced.last().and_then(|e| e.1).expect("synced id");
    for round in 0..60 {
        acquire_many(&s, "r", &keys(&format!("big{round}"), 0..100, 3000));
    }
    let mut last = None;
    let mut count = 0;
    while let Some(e) = slow.next() {
        count += 1;
        last = Some(e);
    }
    let (name, _, data) = last.expect("an event");
    assert_eq!((name.as_str(), data["kind"].as_str()), ("error", Some("lagged")), "{data}");
    let resume = data["revision"].as_i64().expect("the revision to resume from");
    assert!(resume >= synced_rev, "{data}");
    assert_eq!(data["from_revision"].as_i64(), Some(resume + 1), "{data}");
    assert!(count < 6000, "ended before the end: {count} events");

    // That revision is long out of the 100-change history: 410 gone, with the current revision.
    let (status, body) =
        Stream::open(s.addr(), "/v1/pools/r/watch", Some(resume)).err().expect("not a stream");
    assert_eq!((status, body["kind"].as_str()), (410, Some("gone")), "{body}");
    assert!(body["revision"].as_i64().is_some_and(|r| r > resume), "{body}");
    assert!(body["message"].as_str().is_some_and(|m| m.contains("watch without")), "{body}");
    drop(reference);
}

/// etcd's count of its watchers, from its own `/metrics`.
fn etcd_watchers(endpoint: &str) -> f64 {
    let text = agent()
        .get(&format!("{endpoint}/metrics"))
        .call()
        .expect("etcd metrics")
        .body_mut()
        .read_to_string()
        .expect("text");
    for name in ["etcd_debugging_mvcc_watcher_total ", "etcd_mvcc_watcher_total "] {
        if let Some(v) = text.lines().find_map(|l| l.strip_prefix(name)) {
            return v.trim().parse().expect("a number");
        }
    }
    panic!("etcd exports no watcher gauge");
}

fn private_etcd() -> Option<(tokio::runtime::Runtime, idalloc_testkit::etcd::EtcdServer)> {
    if !idalloc_testkit::etcd::etcd_or_skip("the watch fan-out tests") {
        return None;
    }
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
    let etcd = rt.block_on(idalloc_testkit::etcd::EtcdServer::start()).expect("etcd");
    Some((rt, etcd))
}

/// 1,000 subscribers on one pool add no etcd watcher: they share the pool's cache's watch.
#[test]
fn a_thousand_subscribers_on_one_pool_are_one_etcd_watch() {
    // 1,000 streams here and in serve, whose connection cap is its limit less 128.
    common::need_open_files(1000 + 512, "1,000 watch streams");
    let Some((_rt, etcd)) = private_etcd() else { return };
    let s = start_serve(&etcd.endpoint(), &[]);
    post(&s, "/v1/pools", json!({"name": "many", "min": 1, "max": 1000})).ok();
    post(&s, "/v1/pools/many/acquire", json!({"key": "k", "holder": "h"})).ok();
    let before = etcd_watchers(&etcd.endpoint());
    let mut streams: Vec<Stream> = Vec::new();
    for _ in 0..1000 {
        let mut st = Stream::open(s.addr(), "/v1/pools/many/watch", None).expect("watch");
        st.until_synced();
        streams.push(st);
    }
    let with_1000 = etcd_watchers(&etcd.endpoint());
    assert_eq!(with_1000, before, "1,000 subscribers added {} etcd watchers", with_1000 - before);
    assert_eq!(subscribers(&s, "many"), 1000.0);
    // Every one of them sees the next change.
    post(&s, "/v1/pools/many/acquire", json!({"key": "k2", "holder": "h"})).ok();
    for st in &mut streams {
        let e = st.next().expect("event");
        assert_eq!((e.0.as_str(), e.2["key"].as_str()), ("upsert", Some("k2")));
    }
    eprintln!("etcd watchers: {before} before, {with_1000} with 1,000 subscribers");
}

/// 50 clients that open a watch and never read, then 20,000 changes: every other client's
/// acquires succeed (none refused) while it happens.
#[test]
fn fifty_clients_that_never_read_slow_no_one() {
    let Some((_rt, etcd)) = private_etcd() else { return };
    let s = start_serve(&etcd.endpoint(), &[]);
    post(&s, "/v1/pools", json!({"name": "busy", "min": 1, "max": 100000})).ok();
    post(&s, "/v1/pools", json!({"name": "other", "min": 1, "max": 100000})).ok();
    let stalled: Vec<TcpStream> = (0..50)
        .map(|_| {
            let mut c = TcpStream::connect(s.addr()).expect("connect");
            let head = format!("GET /v1/pools/busy/watch HTTP/1.1\r\nhost: {}\r\n\r\n", s.addr());
            c.write_all(head.as_bytes()).expect("write");
            // The answer's status line, and not one byte more, ever.
            let mut status = [0u8; 12];
            c.read_exact(&mut status).expect("status line");
            assert_eq!(&status, b"HTTP/1.1 200");
            c
        })
        .collect();
    let addr = s.http("");
    let others = std::thread::spawn(move || {
        let a = plain_agent(Duration::from_secs(60));
        let mut n = 0;
        let mut failures = Vec::new();
        for i in 0..300 {
            for pool in ["busy", "other"] {
                let body = json!({"key": format!("single-{i}"), "holder": "h"}).to_string();
                let url = format!("{addr}/v1/pools/{pool}/acquire");
                match request(&a, "POST", &url, None, Some(&body)) {
                    Ok(r) if r.status == 200 => n += 1,
                    Ok(r) => failures.push(format!("{} {}", r.status, r.text)),
                    Err(e) => failures.push(e),
                }
            }
        }
        (n, failures)
    });
    // 20,000 changes: 200 requests of 100 keys (one txn per ~100 keys). 400-byte keys: ~10 MB
    // of events per client, more than the socket buffers between it and the service hold.
    for round in 0..200 {
        acquire_many(&s, "busy", &keys(&format!("r{round}"), 0..100, 400));
    }
    let (n, failures) = others.join().expect("other client");
    assert!(failures.is_empty(), "refused or failed: {failures:?}");
    assert_eq!(n, 600);
    assert_eq!(get(&s, "/readyz").status, 200);
    let pools = get(&s, "/v1/pools/busy").ok();
    assert_eq!(pools["bound"].as_u64(), Some(20_000 + 300));
    drop(stalled);
}
