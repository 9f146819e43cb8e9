//! The real `idalloc` binary against a locked-down etcd: etcdctl-style flags, their
//! `IDALLOC_...` variables, a Cilium-style `--etcd-config` file, store-URL credentials, and a
//! one-line error with exit 1 for each refusal. Certificates are made at run time; each test
//! starts its own etcd on free loopback ports (killed by PID when the test ends).

use std::path::{Path, PathBuf};
use std::time::Duration;

use assert_cmd::Command;
use idalloc_testkit::etcd::etcd_or_skip;
use idalloc_testkit::secure::{SecureEtcd, SecureSpec};
use serde_json::Value;

/// Only so a hang fails the test instead of blocking it; never a statement about speed.
const HARNESS_WAIT: Duration = Duration::from_secs(60);

const PREFIX: &str = "idalloc-secure/cli";

fn have_etcd() -> bool {
    etcd_or_skip("the security tests")
}

fn start(spec: SecureSpec) -> (tokio::runtime::Runtime, SecureEtcd) {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .expect("runtime");
    let etcd = rt.block_on(SecureEtcd::start(spec)).unwrap_or_else(|e| panic!("{e}"));
    (rt, etcd)
}

#[derive(Debug)]
struct Ran {
    code: i32,
    stdout: String,
    stderr: String,
    #[allow(dead_code)]
    args: Vec<String>,
}

impl Ran {
    fn ok(self) -> Ran {
        assert_eq!(self.code, 0, "{self:?}");
        self
    }
    fn fails(self, code: i32) -> Ran {
        assert_eq!(self.code, code, "{self:?}");
        let lines: Vec<&str> = self.stderr.lines().filter(|l| l.starts_with("error: ")).collect();
        assert_eq!(lines.len(), 1, "one error line: {self:?}");
        self
    }
    fn err_has(self, s: &str) -> Ran {
        assert!(self.stderr.contains(s), "stderr lacks {s:?}: {self:?}");
        self
    }
    fn json(&self) -> Value {
        serde_json::from_str(&self.stdout).unwrap_or_else(|e| panic!("not JSON ({e}): {self:?}"))
    }
    fn no_secret(self) -> Ran {
        for secret in [SecureEtcd::PASSWORD, SecureEtcd::ROOT_PASSWORD, "wrong-password"] {
            assert!(
                !self.stdout.contains(secret) && !self.stderr.contains(secret),
                "secret printed: {self:?}"
            );
        }
        self
    }
}

/// `idalloc` with a clean environment for the store settings, in `cwd`.
fn idalloc(cwd: &Path, envs: &[(&str, &str)], args: &[&str]) -> Ran {
    let mut c = Command::cargo_bin("idalloc").expect("binary");
    c.current_dir(cwd).timeout(HARNESS_WAIT).env("USER", "alice");
    for v in [
        "IDALLOC_STORE",
        "IDALLOC_ENDPOINTS",
        "IDALLOC_CACERT",
        "IDALLOC_CERT",
        "IDALLOC_KEY",
        "IDALLOC_USER",
        "IDALLOC_PASSWORD",
        "IDALLOC_PASSWORD_FILE",
        "IDALLOC_ETCD_CONFIG",
        "IDALLOC_INSECURE_SKIP_TLS_VERIFY",
        // Stderr is asserted on: no log lines from a RUST_LOG the caller set.
        "RUST_LOG",
    ] {
        c.env_remove(v);
    }
    c.env("IDALLOC_PREFIX", PREFIX);
    for (k, v) in envs {
        c.env(k, v);
    }
    let out = c.args(args).output().expect("run idalloc");
    Ran {
        code: out.status.code().unwrap_or(-1),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
        args: args.iter().map(|s| s.to_string()).collect(),
    }
}

fn s(p: &Path) -> String {
    p.display().to_string()
}

/// Mutual TLS through etcdctl's flags and through the environment; each misconfiguration is one
/// line with exit 1 naming the endpoint and the cause.
#[test]
fn mutual_tls_flags_env_and_failures() {
    if !have_etcd() {
        return;
    }
    let (_rt, etcd) = start(SecureSpec { tls: true, client_cert_auth: true, ..Default::default() });
    let dir = tempfile::tempdir().expect("tmp");
    let cwd = dir.path();
    let ep = etcd.endpoint();
    let pki = etcd.pki().clone();
    let (ca, cert, key) = (s(&pki.ca), s(&pki.client.cert), s(&pki.client.key));
    let tls = ["--endpoints", &ep, "--cacert", &ca, "--cert", &cert, "--key", &key];

    let mut args = tls.to_vec();
    args.extend(["pool", "create", "p", "--range", "1-100"]);
    idalloc(cwd, &[], &args).ok();
    let mut args = tls.to_vec();
    args.extend(["--json", "acquire", "p", "k1"]);
    let id = idalloc(cwd, &[], &args).ok().json()["id"].as_u64().expect("id");

    // The same through the environment, with a bare HOST:PORT (TLS flags make it https).
    let bare = ep.trim_start_matches("https://").to_string();
    let env = [
        ("IDALLOC_ENDPOINTS", bare.as_str()),
        ("IDALLOC_CACERT", ca.as_str()),
        ("IDALLOC_CERT", cert.as_str()),
        ("IDALLOC_KEY", key.as_str()),
    ];
    let got = idalloc(cwd, &env, &["--json", "get", "p", "k1"]).ok().json();
    assert_eq!(got["id"].as_u64(), Some(id));
    let st = idalloc(cwd, &env, &["--json", "status"]).ok().json();
    assert_eq!((st["store"].as_str(), st["endpoint"].as_str()), (Some("etcd"), Some(ep.as_str())));

    // Wrong CA, no client certificate, an expired one: exit 1, the endpoint and cause named.
    let other = s(&pki.other_ca);
    idalloc(
        cwd,
        &[],
        &[
            "--endpoints",
            &ep,
            "--cacert",
            &other,
            "--cert",
            &cert,
            "--key",
            &key,
            "--timeout",
            "3s",
            "get",
            "p",
            "k1",
        ],
    )
    .fails(1)
    .err_has(&ep)
    .err_has("not signed by a trusted CA");
    idalloc(cwd, &[], &["--endpoints", &ep, "--cacert", &ca, "--timeout", "3s", "get", "p", "k1"])
        .fails(1)
        .err_has(&ep)
        .err_has("client certificate");
    let (xc, xk) = (s(&pki.expired_client.cert), s(&pki.expired_client.key));
    idalloc(
        cwd,
        &[],
        &[
            "--endpoints",
            &ep,
            "--cacert",
            &ca,
            "--cert",
            &xc,
            "--key",
            &xk,
            "--timeout",
            "3s",
            "list",
            "p",
        ],
    )
    .fails(1)
    .err_has("rejected the client certificate");
    // Plain text against the TLS port.
    let plain = format!("http://{bare}");
    idalloc(cwd, &[], &["--endpoints", &plain, "--timeout", "3s", "get", "p", "k1"])
        .fails(1)
        .err_has(&plain)
        .err_has("speaks TLS");
    // status says why, and exits 1.
    let r = idalloc(
        cwd,
        &[],
        &["--endpoints", &ep, "--cacert", &other, "--timeout", "3s", "--json", "status"],
    );
    assert_eq!(r.code, 1, "{r:?}");
    assert!(r.json()["error"].as_str().is_some_and(|e| e.contains("trusted CA")), "{r:?}");
    // Bad files: usage errors naming the file.
    idalloc(cwd, &[], &["--endpoints", &ep, "--cacert", "/nonexistent/ca.pem", "get", "p", "k1"])
        .fails(2)
        .err_has("/nonexistent/ca.pem");
    // --insecure-skip-tls-verify works without a CA, and warns.
    idalloc(
        cwd,
        &[],
        &[
            "--endpoints",
            &ep,
            "--insecure-skip-tls-verify",
            "--cert",
            &cert,
            "--key",
            &key,
            "get",
            "p",
            "k1",
        ],
    )
    .ok()
    .err_has("warning: --insecure-skip-tls-verify");
}

fn write(dir: &Path, name: &str, text: &str) -> PathBuf {
    let p = dir.join(name);
    std::fs::write(&p, text).expect("write");
    p
}

/// User authentication on TLS: every password source, a Cilium-style config file alone, store-URL
/// credentials; the representative commands as the restricted user; refusals named; no secret
/// ever printed.
#[test]
fn authenticated_etcd_every_source_and_command_no_secret_printed() {
    if !have_etcd() {
        return;
    }
    let (_rt, etcd) = start(SecureSpec {
        tls: true,
        client_cert_auth: false,
        auth: true,
        auth_token_ttl: Some(2),
    });
    let dir = tempfile::tempdir().expect("tmp");
    let cwd = dir.path();
    let ep = etcd.endpoint();
    let ca = s(&etcd.pki().ca);
    let pw_file = write(cwd, "pw", &format!("{}\n", SecureEtcd::PASSWORD));
    let config = write(
        cwd,
        "etcd.config",
        &format!(
            "---\nendpoints:\n- {ep}\ntrusted-ca-file: '{ca}'\nusername: {}\ndial-timeout: 5s\n",
            SecureEtcd::USER
        ),
    );
    let cfg = s(&config);
    let pwf = s(&pw_file);
    // The config file alone selects etcd; the password comes from a file.
    let base = ["--etcd-config", &cfg, "--password-file", &pwf];
    let run = |extra: &[&str]| {
        let mut a = base.to_vec();
        a.extend_from_slice(extra);
        idalloc(cwd, &[], &a).no_secret()
    };
    run(&["pool", "create", "p", "--range", "1-50", "--strategy", "lowest"]).ok();
    let a = run(&["--json", "acquire", "p", "a"]).ok().json()["id"].as_u64().expect("id");
    let b = run(&["--json", "acquire", "p", "b", "--holder", "bob"]).ok().json()["id"]
        .as_u64()
        .expect("id");
    assert_ne!(a, b);
    assert_eq!(run(&["--json", "get", "p", "a"]).ok().json()["id"].as_u64(), Some(a));
    assert_eq!(run(&["--json", "lookup", "p", &b.to_string()]).ok().json()["key"], "b");
    let list = run(&["--json", "list", "p"]).ok().json();
    assert_eq!(list["bindings"].as_array().map(Vec::len), Some(2), "{list}");
    let r = run(&["--json", "release", "p", "a"]).ok().json();
    assert_eq!(r["reclaimed"], true);
    run(&["gc", "p"]).ok();
    let st = run(&["--json", "status"]).ok().json();
    assert_eq!(st["reachable"], true);
    assert_eq!(st["pools"], serde_json::json!(["p"]));
    let shown = run(&["--json", "pool", "show", "p"]).ok().json();
    assert_eq!(shown["bound"].as_u64(), Some(1), "{shown}");

    // Other password sources: the environment (no warning), the store URL (a warning), --user
    // NAME:PASSWORD (a warning), --password (a warning).
    let env_pw = [("IDALLOC_PASSWORD", SecureEtcd::PASSWORD)];
    let r = idalloc(
        cwd,
        &env_pw,
        &["--endpoints", &ep, "--cacert", &ca, "--user", "idalloc", "get", "p", "b"],
    )
    .ok();
    assert!(!r.stderr.contains("warning"), "{r:?}");
    let url =
        format!("etcd://idalloc:{}@{}", SecureEtcd::PASSWORD, ep.trim_start_matches("https://"));
    idalloc(cwd, &[], &["--store", &url, "--cacert", &ca, "get", "p", "b"])
        .ok()
        .err_has("warning: a password in the store URL")
        .no_secret();
    let user_pw = format!("idalloc:{}", SecureEtcd::PASSWORD);
    idalloc(cwd, &[], &["--endpoints", &ep, "--cacert", &ca, "--user", &user_pw, "get", "p", "b"])
        .ok()
        .err_has("NAME:PASSWORD")
        .no_secret();
    idalloc(
        cwd,
        &[],
        &[
            "--endpoints",
            &ep,
            "--cacert",
            &ca,
            "--user",
            "idalloc",
            "--password",
            SecureEtcd::PASSWORD,
            "get",
            "p",
            "b",
        ],
    )
    .ok()
    .err_has("warning: --password")
    .no_secret();
    // status never prints the URL's password.
    let r = idalloc(cwd, &[], &["--store", &url, "--cacert", &ca, "status"]).ok().no_secret();
    assert!(r.stdout.contains(&ep), "{r:?}");

    // Refusals: wrong password, no user, no password and no terminal, outside the prefix.
    idalloc(
        cwd,
        &[("IDALLOC_PASSWORD", "wrong-password")],
        &["--etcd-config", &cfg, "--timeout", "3s", "get", "p", "b"],
    )
    .fails(1)
    .err_has(&ep)
    .err_has("wrong user name or password")
    .no_secret();
    idalloc(cwd, &[], &["--endpoints", &ep, "--cacert", &ca, "--timeout", "3s", "get", "p", "b"])
        .fails(1)
        .err_has("requires a user");
    idalloc(cwd, &[], &["--etcd-config", &cfg, "get", "p", "b"])
        .fails(2)
        .err_has("needs a password")
        .err_has("IDALLOC_PASSWORD");
    let mut a = base.to_vec();
    a.extend(["--prefix", "other-app", "--timeout", "3s", "pool", "create", "q", "--range", "1-5"]);
    idalloc(cwd, &[], &a)
        .fails(1)
        .err_has(&ep)
        .err_has("permission denied")
        .err_has("user \"idalloc\"")
        .no_secret();

    // Root sees nothing written outside the prefix by all of the above.
    let outside = _rt.block_on(async {
        use idalloc::store::{GetRequest, KeyRange, Store};
        let root = etcd.root_store().await.expect("root");
        let all = root
            .get(GetRequest::new(KeyRange::range(vec![0u8], vec![0u8])).keys_only())
            .await
            .expect("root reads");
        all.kvs
            .iter()
            .map(|kv| String::from_utf8_lossy(&kv.key).into_owned())
            .filter(|k| !k.starts_with(SecureEtcd::PREFIX) && k != "idalloc-ready-probe")
            .collect::<Vec<_>>()
    });
    assert!(outside.is_empty(), "keys outside the prefix: {outside:?}");
}
