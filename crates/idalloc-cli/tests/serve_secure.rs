//! `idalloc serve` locked down, as a real process over real HTTPS, with
//! certificates made at test time (`idalloc_testkit::secure::TestPki`, plus a second CA made here
//! for the rotation test): TLS on the listener and certificate reload, mutual TLS, bearer tokens
//! with scopes per endpoint class, holders and sessions scoped per client, no token in the logs,
//! and configuration errors named at start-up.
//!
//! The store is `memory:` (authentication sits in front of the store; the store side
//! is tested in `cli_secure.rs` and `etcd_secure.rs`). Every process is stopped by its PID.

mod common;

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::{plain_agent, request, Resp};
use idalloc_testkit::secure::{CertFiles, TestPki};
use idalloc_testkit::serve::Serve;
use serde_json::{json, Value};
use ureq::tls::{Certificate, ClientCert, PrivateKey, RootCerts, TlsConfig, TlsProvider};

fn bin() -> &'static str {
    env!("CARGO_BIN_EXE_idalloc")
}

/// `idalloc --store memory: --timeout 3s serve … EXTRA` with its debug log in a file under
/// `dir`, by the testkit's launcher.
fn start_serve(dir: &Path, extra: &[&str]) -> Serve {
    let log = dir.join(format!("serve-{}.stderr", now_ns()));
    Serve::start_logged(bin(), &["--store", "memory:", "--timeout", "3s"], extra, log)
}

fn now_ns() -> u128 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).expect("clock").as_nanos()
}

fn pem_cert(path: &Path) -> Certificate<'static> {
    Certificate::from_pem(&std::fs::read(path).expect("read cert")).expect("PEM cert")
}

/// An HTTPS client trusting `ca` (only), presenting `client` if given. A new agent opens new
/// connections, so each one sees the server's current certificate.
fn agent(ca: &Path, client: Option<&CertFiles>) -> ureq::Agent {
    let mut tls = TlsConfig::builder()
        .provider(TlsProvider::Rustls)
        .unversioned_rustls_crypto_provider(Arc::new(rustls::crypto::ring::default_provider()))
        .root_certs(RootCerts::Specific(Arc::new(vec![pem_cert(ca)])));
    if let Some(c) = client {
        let key = PrivateKey::from_pem(&std::fs::read(&c.key).expect("read key")).expect("key");
        tls = tls.client_cert(Some(ClientCert::new_with_certs(&[pem_cert(&c.cert)], key)));
    }
    ureq::Agent::config_builder()
        .http_status_as_error(false)
        .timeout_global(Some(Duration::from_secs(30)))
        .tls_config(tls.build())
        .build()
        .into()
}

/// A request of the scope matrix: method, path, body.
type Case = (&'static str, String, Option<Value>);

/// One request with a JSON body (see `common::request`).
fn call(
    a: &ureq::Agent,
    method: &str,
    url: &str,
    token: Option<&str>,
    body: Option<Value>,
) -> Result<Resp, String> {
    request(a, method, url, token, body.map(|b| b.to_string()).as_deref())
}

fn ok(r: Result<Resp, String>) -> Value {
    r.expect("transport").ok()
}

/// Writes a new CA and a server certificate for 127.0.0.1 it signed: (CA file, cert PEM, key PEM).
fn new_server_identity(dir: &Path, name: &str) -> (PathBuf, String, String) {
    use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, KeyPair, SanType};
    let mut ca = CertificateParams::new(Vec::<String>::new()).expect("params");
    ca.distinguished_name.push(DnType::CommonName, format!("{name} CA"));
    ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    let ca_key = KeyPair::generate().expect("key");
    let ca_cert = ca.self_signed(&ca_key).expect("CA");
    let mut leaf = CertificateParams::new(Vec::<String>::new()).expect("params");
    leaf.distinguished_name.push(DnType::CommonName, name);
    leaf.subject_alt_names = vec![SanType::IpAddress(std::net::IpAddr::from([127, 0, 0, 1]))];
    let key = KeyPair::generate().expect("key");
    let cert = leaf.signed_by(&key, &ca_cert, &ca_key).expect("leaf");
    let ca_file = dir.join(format!("{name}-ca.crt"));
    std::fs::write(&ca_file, ca_cert.pem()).expect("write CA");
    (ca_file, cert.pem(), key.serialize_pem())
}

fn wait_until(what: &str, timeout: Duration, mut f: impl FnMut() -> bool) {
    let deadline = Instant::now() + timeout;
    while !f() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

#[test]
fn https_serves_refuses_plain_http_and_a_wrong_ca_and_rotates_its_certificate() {
    let dir = tempfile::tempdir().expect("tempdir");
    let pki = TestPki::generate(dir.path()).expect("certificates");
    // The files the service reads; the test rotates them in place.
    let cert = dir.path().join("live.crt");
    let key = dir.path().join("live.key");
    std::fs::copy(&pki.server.cert, &cert).expect("copy");
    std::fs::copy(&pki.server.key, &key).expect("copy");
    let s = start_serve(
        dir.path(),
        &["--tls-cert", cert.to_str().expect("utf-8"), "--tls-key", key.to_str().expect("utf-8")],
    );

    // A client trusting the right CA is served (no client certificate needed: no --client-ca).
    let r = ok(call(&agent(&pki.ca, None), "GET", &s.https("/healthz"), None, None));
    assert_eq!(r["status"], "ok");
    ok(call(&agent(&pki.ca, None), "GET", &s.https("/v1/pools"), None, None));
    // Trusting another CA: the server's certificate is refused by the client.
    let e = call(&agent(&pki.other_ca, None), "GET", &s.https("/healthz"), None, None)
        .expect_err("a client trusting another CA must not connect");
    assert!(e.to_lowercase().contains("certificate") || e.contains("UnknownIssuer"), "{e}");
    // Plain HTTP to the TLS port gets no HTTP answer.
    let plain = call(&plain_agent(Duration::from_secs(30)), "GET", &s.http("/healthz"), None, None);
    assert!(plain.is_err(), "plain HTTP to the TLS port answered: {plain:?}");

    // Rotation on SIGHUP: a new certificate from a new CA, without restart.
    let (ca2, cert2, key2) = new_server_identity(dir.path(), "rotated");
    std::fs::write(&key, &key2).expect("write key");
    std::fs::write(&cert, &cert2).expect("write cert");
    s.signal("HUP");
    wait_until("the rotated certificate after SIGHUP", Duration::from_secs(15), || {
        call(&agent(&ca2, None), "GET", &s.https("/healthz"), None, None).is_ok()
    });
    assert!(call(&agent(&pki.ca, None), "GET", &s.https("/healthz"), None, None).is_err());
    wait_until("the SIGHUP reload log line", Duration::from_secs(5), || {
        s.log().contains("TLS certificate reloaded (SIGHUP)")
    });

    // A broken rotation (a key that is not a key) keeps the current certificate serving.
    std::fs::write(&key, "not a key\n").expect("write key");
    s.signal("HUP");
    wait_until("the failed reload log line", Duration::from_secs(5), || {
        s.log().contains("TLS reload (SIGHUP) failed, still serving the previous certificate")
    });
    ok(call(&agent(&ca2, None), "GET", &s.https("/healthz"), None, None));

    // Rotation by changing the files alone (e.g. a Kubernetes secret update): picked up by the
    // file check, no signal.
    std::fs::copy(&pki.server.key, &key).expect("copy");
    std::fs::copy(&pki.server.cert, &cert).expect("copy");
    wait_until("the original certificate after the files changed", Duration::from_secs(20), || {
        call(&agent(&pki.ca, None), "GET", &s.https("/healthz"), None, None).is_ok()
    });
    assert!(s.log().contains("TLS certificate reloaded (the files changed)"), "{}", s.log());
    let (_, log) = s.stop();
    assert!(!log.contains("BEGIN"), "key material in the log:\n{log}");
}

#[test]
fn mutual_tls_refuses_clients_without_a_certificate_of_the_client_ca() {
    let dir = tempfile::tempdir().expect("tempdir");
    let pki = TestPki::generate(dir.path()).expect("certificates");
    let path = |p: &Path| p.to_str().expect("utf-8").to_string();
    let s = start_serve(
        dir.path(),
        &[
            "--tls-cert",
            &path(&pki.server.cert),
            "--tls-key",
            &path(&pki.server.key),
            "--client-ca",
            &path(&pki.ca),
        ],
    );
    ok(call(&agent(&pki.ca, Some(&pki.client)), "GET", &s.https("/v1/pools"), None, None));
    for (what, client) in [
        ("no client certificate", None),
        ("a certificate of another CA", Some(&pki.stranger)),
        ("an expired certificate", Some(&pki.expired_client)),
    ] {
        let r = call(&agent(&pki.ca, client), "GET", &s.https("/v1/pools"), None, None);
        assert!(r.is_err(), "{what}: served: {r:?}");
    }
    // Probes need the handshake too: with --client-ca every connection is mutual TLS.
    assert!(call(&agent(&pki.ca, None), "GET", &s.https("/healthz"), None, None).is_err());
    ok(call(&agent(&pki.ca, Some(&pki.client)), "GET", &s.https("/healthz"), None, None));
}

fn sha256_hex(token: &str) -> String {
    // As docs/security.md tells operators: `printf %s TOKEN | sha256sum`.
    let mut child = Command::new("sha256sum")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .expect("run sha256sum");
    std::io::Write::write_all(&mut child.stdin.take().expect("stdin"), token.as_bytes())
        .expect("write");
    let out = child.wait_with_output().expect("sha256sum");
    String::from_utf8(out.stdout).expect("utf-8")[..64].to_string()
}

/// Writes a secret file with mode 0600 (the service refuses token files others can read).
fn write_secret(path: &Path, text: &str) {
    use std::os::unix::fs::PermissionsExt;
    std::fs::write(path, text).expect("write");
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600)).expect("chmod");
}

struct Tokens {
    reader: String,
    worker: String,
    other: String,
    boss: String,
}

/// A tokens file with both forms: `reader` and `boss` by SHA-256, `worker` and `other` from
/// token files.
fn tokens_file(dir: &Path) -> (PathBuf, Tokens) {
    let t = |name: &str| format!("tok-{name}-{:x}-{}", now_ns(), std::process::id());
    let tokens =
        Tokens { reader: t("reader"), worker: t("worker"), other: t("other"), boss: t("boss") };
    write_secret(&dir.join("worker.token"), &format!("{}\n", tokens.worker));
    write_secret(&dir.join("other.token"), &tokens.other);
    let text = format!(
        "# idalloc serve clients\nreader   read     sha256:{}\nworker   allocate file:worker.token\nother    allocate file:other.token\nboss     admin    sha256:{}  # operators\n",
        sha256_hex(&tokens.reader),
        sha256_hex(&tokens.boss)
    );
    let path = dir.join("tokens");
    std::fs::write(&path, text).expect("write tokens");
    (path, tokens)
}

#[test]
fn tokens_scope_every_endpoint_class_scope_holders_and_sessions_and_never_reach_the_logs() {
    let dir = tempfile::tempdir().expect("tempdir");
    let pki = TestPki::generate(dir.path()).expect("certificates");
    let (tokens_path, tk) = tokens_file(dir.path());
    let path = |p: &Path| p.to_str().expect("utf-8").to_string();
    let s = start_serve(
        dir.path(),
        &[
            "--tls-cert",
            &path(&pki.server.cert),
            "--tls-key",
            &path(&pki.server.key),
            "--auth-tokens",
            &path(&tokens_path),
        ],
    );
    let a = agent(&pki.ca, None);
    let req = |m: &str, p: &str, t: Option<&str>, b: Option<Value>| {
        call(&a, m, &s.https(p), t, b).expect("transport")
    };

    // Open without a token: liveness and readiness only.
    assert_eq!(req("GET", "/healthz", None, None).status, 200);
    assert_eq!(req("GET", "/readyz", None, None).status, 200);

    // Set-up by the admin: pool p, and key k acquired by worker.
    ok(Ok(req("POST", "/v1/pools", Some(&tk.boss), Some(json!({"name":"p","min":1,"max":100})))));
    let id = ok(Ok(req(
        "POST",
        "/v1/pools/p/acquire",
        Some(&tk.worker),
        Some(json!({"key":"k","holder":"node-1"})),
    )))["id"]
        .as_u64()
        .expect("id");

    // Every endpoint class: who is let in, who gets 403, and 401 without or with a bad token.
    let read: Vec<Case> = vec![
        ("GET", "/v1/pools".into(), None),
        ("GET", "/v1/pools/p".into(), None),
        ("GET", "/v1/pools/p/keys/k?consistent=true".into(), None),
        ("GET", format!("/v1/pools/p/ids/{id}?consistent=true"), None),
        ("GET", "/v1/pools/p/bindings".into(), None),
        ("GET", "/v1/pools/p/watch".into(), None),
        ("GET", "/v1/openapi.json".into(), None),
        ("GET", "/metrics".into(), None),
    ];
    for (m, p, b) in &read {
        for t in [&tk.reader, &tk.worker, &tk.boss] {
            assert_eq!(req(m, p, Some(t), b.clone()).status, 200, "{m} {p}");
        }
    }
    let allocate: Vec<Case> = vec![
        ("POST", "/v1/pools/p/acquire".into(), Some(json!({"key":"k2","holder":"h"}))),
        ("POST", "/v1/pools/p/release".into(), Some(json!({"key":"k2","holder":"h"}))),
        ("POST", "/v1/sessions".into(), Some(json!({"ttl":30}))),
    ];
    for (m, p, b) in &allocate {
        for t in [&tk.worker, &tk.boss] {
            let r = req(m, p, Some(t), b.clone());
            assert!(r.status == 200 || r.status == 201, "{m} {p}: {} {}", r.status, r.text);
        }
    }
    let sess = ok(Ok(req("POST", "/v1/sessions", Some(&tk.worker), Some(json!({"ttl":30})))));
    let sid = sess["session"].as_str().expect("session").to_string();
    let admin: Vec<Case> = vec![
        ("POST", "/v1/pools".into(), Some(json!({"name":"q","min":1,"max":10}))),
        ("POST", "/v1/pools/q/sweep".into(), None),
        ("DELETE", "/v1/pools/q".into(), None),
    ];
    for (m, p, b) in &admin {
        assert_eq!(req(m, p, Some(&tk.boss), b.clone()).status, 200, "{m} {p}");
    }
    let keepalive = format!("/v1/sessions/{sid}/keepalive");
    let end = format!("/v1/sessions/{sid}");
    let mut allocate_all = allocate.clone();
    allocate_all.push(("PUT", keepalive.clone(), None));
    allocate_all.push(("DELETE", end.clone(), None));
    let forbidden: Vec<(&String, &Case)> = allocate_all
        .iter()
        .map(|c| (&tk.reader, c))
        .chain(admin.iter().map(|c| (&tk.reader, c)))
        .chain(admin.iter().map(|c| (&tk.worker, c)))
        .collect();
    for (t, (m, p, b)) in &forbidden {
        let r = req(m, p, Some(t), b.clone());
        assert_eq!(r.status, 403, "{m} {p}: {}", r.text);
        assert_eq!(r.body["kind"], "forbidden", "{}", r.text);
        let msg = r.body["message"].as_str().expect("message");
        assert!(msg.contains("needs scope"), "{msg}");
    }
    // Refused means nothing happened: the pool the worker tried to delete is there, and the
    // session the reader tried to end is alive.
    ok(Ok(req("POST", "/v1/pools", Some(&tk.boss), Some(json!({"name":"q","min":1,"max":10})))));
    assert_eq!(req("DELETE", "/v1/pools/p", Some(&tk.worker), None).status, 403);
    assert_eq!(req("GET", "/v1/pools/p", Some(&tk.reader), None).status, 200);
    assert_eq!(req("PUT", &keepalive, Some(&tk.worker), None).status, 200);

    let everything: Vec<&Case> = read.iter().chain(&allocate_all).chain(&admin).collect();
    let bogus = format!("{}x", tk.boss);
    for (m, p, b) in everything {
        for (t, invalid) in [(None, false), (Some(bogus.as_str()), true)] {
            let r = req(m, p, t, b.clone());
            assert_eq!(r.status, 401, "{m} {p}: {}", r.text);
            assert_eq!(r.body["kind"], "unauthenticated", "{}", r.text);
            let challenge = r.www_authenticate.expect("WWW-Authenticate");
            assert!(challenge.starts_with("Bearer"), "{challenge}");
            assert_eq!(challenge.contains("invalid_token"), invalid, "{challenge}");
            assert!(!r.text.contains(&bogus), "the token is echoed: {}", r.text);
        }
    }
    // Not a bearer token, and unknown routes: 401 without a token, 404 with one.
    let basic = a
        .get(s.https("/v1/pools"))
        .header("authorization", "Basic dXNlcjpwdw==")
        .call()
        .expect("transport");
    assert_eq!(basic.status().as_u16(), 401);
    assert_eq!(req("GET", "/v1/nothing-here", None, None).status, 401);
    assert_eq!(req("GET", "/v1/nothing-here", Some(&tk.reader), None).status, 404);

    // Holders are namespaced by client: worker's "node-1" is "worker/node-1" in the store, and
    // other can release neither by "node-1" nor by the full name.
    let b = ok(Ok(req("GET", "/v1/pools/p/bindings", Some(&tk.reader), None)));
    let holders_of_k = |b: &Value| -> Vec<String> {
        b["bindings"]
            .as_array()
            .expect("bindings")
            .iter()
            .find(|x| x["key"] == "k")
            .map(|x| {
                x["holders"]
                    .as_array()
                    .expect("holders")
                    .iter()
                    .map(|h| h.as_str().expect("str").to_string())
                    .collect()
            })
            .unwrap_or_default()
    };
    assert_eq!(holders_of_k(&b), vec!["worker/node-1".to_string()]);
    for holder in ["node-1", "worker/node-1"] {
        let r = ok(Ok(req(
            "POST",
            "/v1/pools/p/release",
            Some(&tk.other),
            Some(json!({"key":"k","holder":holder})),
        )));
        assert_eq!(r["held"], false, "other released worker's reference as {holder}");
    }
    let b = ok(Ok(req("GET", "/v1/pools/p/bindings", Some(&tk.reader), None)));
    assert_eq!(holders_of_k(&b), vec!["worker/node-1".to_string()]);
    // Acquiring the same key under the same holder string gives other its own reference.
    let r = ok(Ok(req(
        "POST",
        "/v1/pools/p/acquire",
        Some(&tk.other),
        Some(json!({"key":"k","holder":"node-1"})),
    )));
    assert_eq!(r["id"].as_u64(), Some(id));
    let b = ok(Ok(req("GET", "/v1/pools/p/bindings", Some(&tk.reader), None)));
    let mut hs = holders_of_k(&b);
    hs.sort();
    assert_eq!(hs, vec!["other/node-1".to_string(), "worker/node-1".to_string()]);
    for t in [&tk.other, &tk.worker] {
        let r = ok(Ok(req(
            "POST",
            "/v1/pools/p/release",
            Some(t),
            Some(json!({"key":"k","holder":"node-1"})),
        )));
        assert_eq!(r["held"], true);
    }

    // Sessions belong to the client that opened them: to another they do not exist.
    let r = ok(Ok(req(
        "POST",
        "/v1/pools/p/acquire",
        Some(&tk.worker),
        Some(json!({"key":"s1","session":sid})),
    )));
    let sid_id = r["id"].as_u64().expect("id");
    for (m, p, body) in [
        ("PUT", keepalive.clone(), None),
        ("DELETE", end.clone(), None),
        ("POST", "/v1/pools/p/release".to_string(), Some(json!({"key":"s1","session":sid}))),
        ("POST", "/v1/pools/p/acquire".to_string(), Some(json!({"key":"s2","session":sid}))),
    ] {
        let r = req(m, &p, Some(&tk.other), body);
        assert_eq!(r.status, 404, "{m} {p}: {}", r.text);
        assert_eq!(r.body["kind"], "session_not_found", "{}", r.text);
    }
    let r = ok(Ok(req("GET", "/v1/pools/p/keys/s1?consistent=true", Some(&tk.reader), None)));
    assert_eq!(r["id"].as_u64(), Some(sid_id), "the session's reference survived");
    ok(Ok(req("PUT", &keepalive, Some(&tk.worker), None)));
    ok(Ok(req("DELETE", &end, Some(&tk.worker), None)));

    // Metrics: never a token; 401 and 403 counted by route template.
    let metrics = req("GET", "/metrics", Some(&tk.reader), None).text;
    assert!(metrics.contains("status=\"401\"") && metrics.contains("status=\"403\""));

    // Nothing the process wrote (RUST_LOG=debug) holds a token.
    let (out, log) = s.stop();
    assert!(log.contains("DEBUG"), "debug logging was not on: {log}");
    for (name, t) in [
        ("reader", &tk.reader),
        ("worker", &tk.worker),
        ("other", &tk.other),
        ("boss", &tk.boss),
        ("bogus", &bogus),
    ] {
        for (what, text) in [("stdout", &out), ("stderr", &log), ("metrics", &metrics)] {
            assert!(!text.contains(t.as_str()), "{name}'s token in {what}");
        }
    }
}

/// The shipped Python client over HTTPS with a token: its demo (create a pool, open a session,
/// acquire, keep alive, release, end) runs with an admin token and the test CA, and is refused
/// (401) without the token.
#[test]
fn the_python_client_speaks_https_with_a_token() {
    if Command::new("python3").arg("--version").output().is_err() {
        assert!(std::env::var("CI").is_err(), "python3 is required under CI");
        eprintln!("SKIPPED: no python3");
        return;
    }
    let dir = tempfile::tempdir().expect("tempdir");
    let pki = TestPki::generate(dir.path()).expect("certificates");
    let (tokens_path, tk) = tokens_file(dir.path());
    let path = |p: &Path| p.to_str().expect("utf-8").to_string();
    let s = start_serve(
        dir.path(),
        &[
            "--tls-cert",
            &path(&pki.server.cert),
            "--tls-key",
            &path(&pki.server.key),
            "--auth-tokens",
            &path(&tokens_path),
        ],
    );
    let client: PathBuf =
        [env!("CARGO_MANIFEST_DIR"), "..", "..", "clients", "python", "idalloc_client.py"]
            .iter()
            .collect();
    let boss = dir.path().join("boss.token");
    std::fs::write(&boss, format!("{}\n", tk.boss)).expect("write");
    let run = |extra: &[&str]| {
        Command::new("python3")
            .arg(&client)
            .args(["--demo", &s.https("")])
            .args(["--cafile", &path(&pki.ca)])
            .args(extra)
            .output()
            .expect("run the python client")
    };
    let out = run(&["--token-file", &path(&boss)]);
    let stdout = String::from_utf8_lossy(&out.stdout).to_string();
    assert!(out.status.success(), "{stdout} {}", String::from_utf8_lossy(&out.stderr));
    let lines: Vec<Value> =
        stdout.lines().map(|l| serde_json::from_str(l).expect("JSON line")).collect();
    assert!(lines.iter().any(|l| l["step"] == "acquire" && l["id"].as_u64().is_some()));
    assert!(lines.iter().any(|l| l["step"] == "release" && l["held"] == true));
    assert!(lines.iter().any(|l| l["step"] == "end"));
    let out = run(&[]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(stderr.contains("401 unauthenticated"), "{stderr}");
}

/// Runs serve expecting it to refuse to start: exit 2 and one `error:` line naming `needle`.
fn refused(extra: &[&str], needle: &str) -> String {
    let listen: &[&str] =
        if extra.contains(&"--listen") { &[] } else { &["--listen", "127.0.0.1:0"] };
    let out = Command::new(bin())
        .args(["--store", "memory:", "serve"])
        .args(listen)
        .args(extra)
        .stdin(Stdio::null())
        .output()
        .expect("run serve");
    let err = String::from_utf8_lossy(&out.stderr).to_string();
    assert_eq!(out.status.code(), Some(2), "{extra:?}: {err}");
    let lines: Vec<&str> = err.lines().collect();
    assert_eq!(lines.len(), 1, "{extra:?}: not one line: {err}");
    assert!(lines[0].starts_with("error: ") && lines[0].contains(needle), "{extra:?}: {err}");
    assert!(out.stdout.is_empty(), "{extra:?}: it started listening");
    err
}

#[test]
fn bad_configuration_stops_serve_at_start_with_one_line_naming_the_file() {
    let dir = tempfile::tempdir().expect("tempdir");
    let pki = TestPki::generate(dir.path()).expect("certificates");
    let p = |p: &Path| p.to_str().expect("utf-8").to_string();
    let (cert, key, ca) = (p(&pki.server.cert), p(&pki.server.key), p(&pki.ca));
    let missing = p(&dir.path().join("missing.pem"));

    refused(&["--auth-tokens", &missing], &missing);
    let bad = dir.path().join("bad-tokens");
    let secret = "s3cr3t-pasted-here-by-mistake";
    write_secret(&bad, &format!("alpha read sha256:{}\nbeta admin {secret}\n", "0".repeat(64)));
    let e = refused(&["--auth-tokens", &p(&bad)], &format!("tokens file {}: line 2", p(&bad)));
    assert!(!e.contains(secret), "{e}");
    let short = dir.path().join("short-tokens");
    write_secret(&dir.path().join("short.token"), "abc");
    write_secret(&short, "alpha read file:short.token\n");
    refused(&["--auth-tokens", &p(&short)], "short.token is 3 bytes");

    refused(&["--tls-cert", &missing, "--tls-key", &key], &format!("--tls-cert) {missing}"));
    refused(&["--tls-cert", &cert, "--tls-key", &missing], &format!("--tls-key) {missing}"));
    refused(&["--tls-cert", &cert, "--tls-key", &cert], &format!("(--tls-key) {cert}"));
    refused(&["--tls-cert", &key, "--tls-key", &key], &format!("(--tls-cert) {key}"));
    refused(&["--tls-cert", &cert, "--tls-key", &key, "--client-ca", &missing], &missing);
    // The client's key does not belong to the server's certificate.
    refused(&["--tls-cert", &cert, "--tls-key", &p(&pki.client.key)], "usable pair");
    refused(&["--tls-cert", &cert], "--tls-key");
    refused(&["--client-ca", &ca], "--tls-cert");

    // Not loopback: refused without TLS and client authentication, naming the way out.
    refused(&["--listen", "0.0.0.0:0"], "--insecure-listen");
    refused(&["--listen", "0.0.0.0:0", "--tls-cert", &cert, "--tls-key", &key], "--auth-tokens");
}
