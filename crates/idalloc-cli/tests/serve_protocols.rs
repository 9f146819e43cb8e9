//! `idalloc serve` speaks HTTP/1.1 and HTTP/2 on one port (each connection's
//! protocol is chosen before hyper reads from it, by a peek of the HTTP/2 preface on plain TCP and
//! by ALPN under TLS). Real processes, real sockets, certificates made at test time.

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
