//! `idalloc serve` speaks HTTP/1.1 and HTTP/2 on one port (each connection's
//! protocol is chosen before hyper reads from it, by a peek of the HTTP/2 preface on plain TCP and
//! by ALPN under TLS), and frees a watch stream when its client goes, whatever the protocol.
//! Real processes, real sockets, certificates made at test time.

use std::io::Write;
use std::path::Path;
use std::time::Duration;

use idalloc_testkit::secure::TestPki;
use idalloc_testkit::serve::{read_until_closed, Serve};
use reqwest::Version;
use serde_json::{json, Value};

fn bin() -> &'static str {
    env!("CARGO_BIN_EXE_idalloc")
}

/// `idalloc --store memory: --timeout 3s serve … EXTRA`, its debug log in a file under `dir`.
fn start(dir: &Path, extra: &[&str]) -> Serve {
    let log = dir.join(format!("serve-{}.stderr", std::process::id()));
    Serve::start_logged(bin(), &["--store", "memory:", "--timeout", "3s"], extra, log)
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime")
}

/// GET `url`: (HTTP version, status, JSON body).
async fn get(c: &reqwest::Client, url: &str) -> (Version, u16, Value) {
    let r = c.get(url).send().await.unwrap_or_else(|e| panic!("GET {url}: {e:?}"));
    let (v, st) = (r.version(), r.status().as_u16());
    (v, st, r.json().await.unwrap_or_else(|e| panic!("GET {url}: not JSON: {e}")))
}

/// The same client calls: a pool is made, listed, read by several requests at once (on HTTP/2,
/// streams of one connection), and a watch stream sends its first event; every answer in
/// `version`.
async fn exercise(c: &reqwest::Client, base: &str, pool: &str, version: Version) {
    let r = c
        .post(format!("{base}/v1/pools"))
        .json(&json!({"name": pool, "min": 1, "max": 100}))
        .send()
        .await
        .expect("create the pool");
    assert_eq!(r.version(), version);
    assert_eq!(r.status().as_u16(), 200, "{:?}", r.text().await);
    let url = format!("{base}/v1/pools/{pool}");
    let gets = (0..8).map(|_| get(c, &url));
    for (v, st, body) in futures::future::join_all(gets).await {
        assert_eq!((v, st), (version, 200), "{body}");
        assert_eq!(body["spec"]["name"], pool, "{body}");
    }
    let (v, st, body) = get(c, &format!("{base}/healthz")).await;
    assert_eq!((v, st), (version, 200), "{body}");

    // A watch stream: its head, then the first event (the pool's snapshot) arrives.
    let mut w = c.get(format!("{base}/v1/pools/{pool}/watch")).send().await.expect("watch");
    assert_eq!((w.version(), w.status().as_u16()), (version, 200));
    let first = tokio::time::timeout(Duration::from_secs(30), w.chunk())
        .await
        .expect("the watch sends within 30 s")
        .expect("a chunk")
        .expect("not the end");
    let text = String::from_utf8_lossy(&first);
    assert!(text.contains("event:") || text.contains("data:"), "{text}");
}

/// HTTP/1.1 and HTTP/2 with prior knowledge (h2c) on the same plain port, each served whole.
#[test]
fn plain_tcp_serves_http1_and_h2c_prior_knowledge() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut s = start(dir.path(), &[]);
    let base = s.http("");
    runtime().block_on(async {
        let h1 = reqwest::Client::builder().http1_only().build().expect("client");
        exercise(&h1, &base, "one", Version::HTTP_11).await;
        let h2 = reqwest::Client::builder().http2_prior_knowledge().build().expect("client");
        exercise(&h2, &base, "two", Version::HTTP_2).await;
    });
    assert_eq!(s.terminate(), Some(0), "shut down cleanly with an HTTP/2 connection open");
}

/// Over TLS the protocol is ALPN's: a client offering `h2` gets HTTP/2, one offering only
/// `http/1.1` gets HTTP/1.1.
#[test]
fn tls_serves_http2_by_alpn_and_http1_without_it() {
    let dir = tempfile::tempdir().expect("tempdir");
    let pki = TestPki::generate(dir.path()).expect("certificates");
    let path = |p: &Path| p.to_str().expect("utf-8").to_string();
    let mut s = start(
        dir.path(),
        &["--tls-cert", &path(&pki.server.cert), "--tls-key", &path(&pki.server.key)],
    );
    let base = s.https("");
    let ca = reqwest::Certificate::from_pem(&std::fs::read(&pki.ca).expect("read CA")).expect("CA");
    let client = |h1: bool| {
        let b = reqwest::Client::builder()
            .use_rustls_tls()
            .tls_built_in_root_certs(false)
            .add_root_certificate(ca.clone());
        let b = if h1 { b.http1_only() } else { b };
        b.build().expect("client")
    };
    runtime().block_on(async {
        exercise(&client(false), &base, "alpn-h2", Version::HTTP_2).await;
        exercise(&client(true), &base, "alpn-http1", Version::HTTP_11).await;
    });
    assert_eq!(s.terminate(), Some(0));
}

/// A client that sends part of the HTTP/2 preface and stalls, or sends nothing, is closed after
/// `--header-timeout` (not only after the much longer idle timeout); the service still answers
/// both protocols afterwards.
#[test]
fn a_stalled_preface_or_silence_is_cut_by_the_header_timeout() {
    let dir = tempfile::tempdir().expect("tempdir");
    let s = start(dir.path(), &["--header-timeout", "1s", "--idle-timeout", "600s"]);
    let mut partial = std::net::TcpStream::connect(s.addr()).expect("connect");
    partial.write_all(b"PRI * HTTP/2.0\r\n").expect("part of the preface");
    assert!(read_until_closed(&mut partial).is_empty(), "closed without an answer");
    let mut silent = std::net::TcpStream::connect(s.addr()).expect("connect");
    assert!(read_until_closed(&mut silent).is_empty(), "closed without an answer");
    // A slow HTTP/1 header is hyper's header timeout, after the protocol was chosen.
    let mut slow = std::net::TcpStream::connect(s.addr()).expect("connect");
    slow.write_all(b"GET /healthz HTTP/1.1\r\nhost: x\r\n").expect("half a header");
    read_until_closed(&mut slow);
    runtime().block_on(async {
        let h2 = reqwest::Client::builder().http2_prior_knowledge().build().expect("client");
        let (v, st, _) = get(&h2, &s.http("/healthz")).await;
        assert_eq!((v, st), (Version::HTTP_2, 200));
        let h1 = reqwest::Client::builder().http1_only().build().expect("client");
        let (v, st, _) = get(&h1, &s.http("/healthz")).await;
        assert_eq!((v, st), (Version::HTTP_11, 200));
    });
}

/// The value of `idalloc_watch_subscribers{pool="POOL"}` on `base`'s `/metrics` (0 if absent).
async fn subscribers(c: &reqwest::Client, base: &str, pool: &str) -> f64 {
    let url = format!("{base}/metrics");
    let text = c.get(&url).send().await.expect("metrics").text().await.expect("metrics text");
    let series = format!("idalloc_watch_subscribers{{pool=\"{pool}\"}}");
    text.lines()
        .find_map(|l| l.strip_prefix(series.as_str()).and_then(|v| v.trim().parse().ok()))
        .unwrap_or(0.0)
}

/// Opens a watch stream of `pool` with `client` and reads its first chunk; the answer is
/// returned open. `client` must have been built inside the running runtime that owns it.
async fn open_watch(client: &reqwest::Client, base: &str, pool: &str) -> reqwest::Response {
    let mut w = client.get(format!("{base}/v1/pools/{pool}/watch")).send().await.expect("watch");
    assert_eq!(w.status().as_u16(), 200, "{:?}", w.headers());
    tokio::time::timeout(Duration::from_secs(30), w.chunk())
        .await
        .expect("the watch sends within 30 s")
        .expect("a chunk")
        .expect("not the end");
    w
}

/// Polls the gauge of `pool` (read by a new client from `make`) until it reads `want`; panics
/// only after 3 s (a hang: the idle pool's keep-alive comes every 15 s, so a stream freed only
/// when a write to it fails stays counted that long).
fn wait_subscribers(make: &dyn Fn() -> reqwest::Client, base: &str, want: f64, what: &str) {
    let deadline = std::time::Instant::now() + Duration::from_secs(3);
    runtime().block_on(async {
        let probe = make();
        loop {
            let now = subscribers(&probe, base, "idle").await;
            if now == want {
                return;
            }
            assert!(std::time::Instant::now() < deadline, "{what}: {now} streams, not {want}");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    });
}

/// A watch stream on an idle pool (nothing to send that would reveal the client's absence) is
/// freed as soon as its client goes, over HTTP/1.1, h2c and HTTP/2 under TLS, whether the client
/// cancels the stream (HTTP/2 `RST_STREAM`) or closes the connection: the subscriber gauge drops
/// and the client's stream slot (`--max-watches-per-client 1`) is free for its next stream.
#[test]
fn a_watch_stream_is_freed_when_its_client_goes_over_every_protocol() {
    let dir = tempfile::tempdir().expect("tempdir");
    let pki = TestPki::generate(dir.path()).expect("certificates");
    let path = |p: &Path| p.to_str().expect("utf-8").to_string();
    let one = ["--max-watches-per-client", "1", "--idle-timeout", "600s"];
    let plain_dir = dir.path().join("plain");
    let tls_dir = dir.path().join("tls");
    for d in [&plain_dir, &tls_dir] {
        std::fs::create_dir(d).expect("mkdir");
    }
    let plain = start(&plain_dir, &one);
    let mut tls_args = vec!["--tls-cert".to_string(), path(&pki.server.cert)];
    tls_args.extend(["--tls-key".to_string(), path(&pki.server.key)]);
    tls_args.extend(one.iter().map(|a| a.to_string()));
    let tls_args: Vec<&str> = tls_args.iter().map(String::as_str).collect();
    let tls = start(&tls_dir, &tls_args);
    let ca = reqwest::Certificate::from_pem(&std::fs::read(&pki.ca).expect("read CA")).expect("CA");
    // A client of one protocol; built (and used) inside the runtime that runs its connections.
    let make = |kind: &str| {
        let b = reqwest::Client::builder();
        match kind {
            "http1" => b.http1_only(),
            "h2c" => b.http2_prior_knowledge(),
            _ => b.use_rustls_tls().tls_built_in_root_certs(false).add_root_certificate(ca.clone()),
        }
        .build()
        .expect("client")
    };
    let probe_plain = || make("http1");
    let probe_tls = || make("h2");
    let probes: [(String, &dyn Fn() -> reqwest::Client); 2] =
        [(plain.http(""), &probe_plain), (tls.https(""), &probe_tls)];
    for (base, probe) in &probes {
        runtime().block_on(async {
            let r = probe()
                .post(format!("{base}/v1/pools"))
                .json(&json!({"name": "idle", "min": 1, "max": 100}))
                .send()
                .await
                .expect("create the pool");
            assert_eq!(r.status().as_u16(), 200, "{:?}", r.text().await);
        });
    }
    for (kind, (base, probe), version) in [
        ("http1", &probes[0], Version::HTTP_11),
        ("h2c", &probes[0], Version::HTTP_2),
        ("h2", &probes[1], Version::HTTP_2),
    ] {
        // The client cancels the stream (HTTP/2: RST_STREAM on a connection that stays open).
        // Its own worker thread, so that its connection acts on the drop at once.
        let rt = one_worker();
        let client = rt.block_on(async { make(kind) });
        let w = rt.block_on(open_watch(&client, base, "idle"));
        assert_eq!(w.version(), version, "{kind}");
        wait_subscribers(*probe, base, 1.0, kind);
        drop(w);
        wait_subscribers(*probe, base, 0.0, &format!("{kind}, stream cancelled"));
        // The client closes the connection with the stream open (its runtime and sockets go).
        let w = rt.block_on(open_watch(&client, base, "idle"));
        wait_subscribers(*probe, base, 1.0, kind);
        drop(rt);
        wait_subscribers(*probe, base, 0.0, &format!("{kind}, connection closed"));
        drop((w, client));
        // The client stops reading while the pool changes, until the service's writes to it
        // stall (flow-control window and socket buffers full), then closes the connection.
        let rt = one_worker();
        let client = rt.block_on(async { make(kind) });
        let w = rt.block_on(open_watch(&client, base, "idle"));
        runtime().block_on(async {
            let p = probe();
            for round in 0..8 {
                let keys: Vec<String> =
                    (0..100).map(|i| format!("{kind}-{round}-{i}-{}", "x".repeat(3000))).collect();
                let r = p
                    .post(format!("{base}/v1/pools/idle/acquire"))
                    .json(&json!({"keys": keys, "holder": "bulk"}))
                    .send()
                    .await
                    .expect("acquire");
                assert_eq!(r.status().as_u16(), 200, "{:?}", r.text().await);
                let r = p
                    .post(format!("{base}/v1/pools/idle/release"))
                    .json(&json!({"keys": keys, "holder": "bulk"}))
                    .send()
                    .await
                    .expect("release");
                assert_eq!(r.status().as_u16(), 200, "{:?}", r.text().await);
            }
        });
        drop(rt);
        wait_subscribers(*probe, base, 0.0, &format!("{kind}, unread stream closed"));
        drop((w, client));
    }
}

/// A client's own runtime with one worker thread, so that its connections act on a drop at once
/// and dropping the runtime closes them.
fn one_worker() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .expect("runtime")
}

/// The timer column (`tr`, `tm->when` in clock ticks) of the service's side of a TCP connection,
/// from the kernel's `/proc/net/tcp`: the socket whose local port is `server_port` and whose peer
/// is `client_port`. On an established socket, timer 2 is its keepalive timer.
#[cfg(target_os = "linux")]
fn server_socket_timer(server_port: u16, client_port: u16) -> (u8, u64) {
    let table = std::fs::read_to_string("/proc/net/tcp").expect("read /proc/net/tcp");
    let port_of = |a: &str| u16::from_str_radix(a.rsplit(':').next().unwrap_or(""), 16).ok();
    for line in table.lines().skip(1) {
        let f: Vec<&str> = line.split_whitespace().collect();
        if f.len() < 6 || f[3] != "01" {
            continue;
        }
        if port_of(f[1]) == Some(server_port) && port_of(f[2]) == Some(client_port) {
            let (tr, when) = f[5].split_once(':').expect("tr:when");
            let tr = u8::from_str_radix(tr, 16).expect("tr");
            return (tr, u64::from_str_radix(when, 16).expect("when"));
        }
    }
    panic!("no established socket {server_port} -> {client_port} in /proc/net/tcp:\n{table}");
}

/// A connection whose client's host vanishes (no FIN) is found by TCP keepalive: the service's
/// side of an accepted connection carries a keepalive timer of at most `--keepalive` (the
/// kernel's own default is 2 hours), and none with `--keepalive 0`. Read from the kernel's socket
/// table, so it is the service's socket that is checked, not the test's.
#[cfg(target_os = "linux")]
#[test]
fn accepted_connections_carry_the_keepalive_timer_of_the_setting() {
    use std::io::Read;
    let dir = tempfile::tempdir().expect("tempdir");
    for (setting, want) in [("45s", Some(45u64)), ("0", None)] {
        let s = start(dir.path(), &["--keepalive", setting]);
        let mut c = std::net::TcpStream::connect(s.addr()).expect("connect");
        c.write_all(b"GET /healthz HTTP/1.1\r\nhost: x\r\n\r\n").expect("request");
        let mut head = [0u8; 12];
        c.read_exact(&mut head).expect("answer");
        assert_eq!(&head, b"HTTP/1.1 200", "--keepalive {setting}");
        let server_port = c.peer_addr().expect("peer").port();
        let client_port = c.local_addr().expect("local").port();
        let (tr, when) = server_socket_timer(server_port, client_port);
        match want {
            Some(secs) => {
                assert_eq!(tr, 2, "--keepalive {setting}: the keepalive timer runs");
                // In clock ticks (USER_HZ, 100 a second): due within the setting.
                assert!(when > 0 && when <= secs * 100, "--keepalive {setting}: due in {when}");
            }
            None => assert_eq!(tr, 0, "--keepalive 0: no timer on an idle connection"),
        }
    }
}

/// An HTTP/2 connection is pinged every `--keepalive`, stays open while its client answers, and
/// is closed when the client stops answering (its host gone), long before the idle timeout.
#[test]
fn http2_connections_are_pinged_and_closed_when_pings_go_unanswered() {
    use std::io::Read;
    let dir = tempfile::tempdir().expect("tempdir");
    let s = start(dir.path(), &["--keepalive", "1s", "--idle-timeout", "600s"]);
    let mut c = std::net::TcpStream::connect(s.addr()).expect("connect");
    c.set_read_timeout(Some(Duration::from_secs(60))).expect("read timeout");
    // The preface and an empty SETTINGS frame (9-byte frame headers: length, type, flags, stream).
    c.write_all(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n").expect("preface");
    c.write_all(&[0, 0, 0, 4, 0, 0, 0, 0, 0]).expect("settings");
    let frame = |c: &mut std::net::TcpStream| -> Option<(u8, u8, Vec<u8>)> {
        let mut h = [0u8; 9];
        c.read_exact(&mut h).ok()?;
        let len = (usize::from(h[0]) << 16) | (usize::from(h[1]) << 8) | usize::from(h[2]);
        let mut payload = vec![0u8; len];
        c.read_exact(&mut payload).ok()?;
        Some((h[3], h[4], payload))
    };
    let mut answered = 0;
    while answered < 2 {
        let (kind, flags, payload) = frame(&mut c).expect("a frame within 60 s");
        match (kind, flags & 1) {
            // SETTINGS: acknowledged.
            (4, 0) => c.write_all(&[0, 0, 0, 4, 1, 0, 0, 0, 0]).expect("settings ack"),
            // PING: answered with the same 8 bytes.
            (6, 0) => {
                assert_eq!(payload.len(), 8);
                c.write_all(&[0, 0, 8, 6, 1, 0, 0, 0, 0]).expect("ping ack");
                c.write_all(&payload).expect("ping ack payload");
                answered += 1;
            }
            _ => {}
        }
    }
    // Pings now go unanswered: the service closes the connection (a GOAWAY may come first).
    loop {
        let mut buf = [0u8; 512];
        match c.read(&mut buf) {
            Ok(0) => break,
            Ok(_) => {}
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => break,
            Err(e) => panic!("the connection was not closed within 60 s of unanswered pings: {e}"),
        }
    }
}
