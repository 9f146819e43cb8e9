//! The Kubernetes Deployment of `deploy/kubernetes/` as the kubelet would run it, and the
//! shutdown sequence its probes rely on.
//!
//! The manifest's pod is recreated on this machine: its Secret volumes as the kubelet writes them
//! (a timestamped directory, the `..data` link, one link per key; files owned by root, group
//! `fsGroup` when the pod has one, modes from `defaultMode` plus the group read the kubelet adds
//! for `fsGroup`), the container's arguments and environment with the mount paths moved into a
//! temporary directory, and `serve` started under the pod's `runAsUser`/`runAsGroup` with
//! `fsGroup` as supplementary group (`setpriv`). Only what cannot be the same here is replaced:
//! the etcd endpoints (a locked-down test etcd with TLS, client certificates and the manifest's
//! user), the prefix that user may write, and the listening address (a free loopback port).
//! `/readyz` must answer 200. The test needs root (for the owners and `setpriv`); CI runs it so.

mod common;

use std::io::{BufRead, BufReader};
use std::os::unix::fs::{symlink, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::{plain_agent, request};
use idalloc_testkit::procs::KillOnDrop;
use idalloc_testkit::secure::{SecureEtcd, SecureSpec};
use idalloc_testkit::serve::{listening_addr, Serve};
use serde_json::Value;
use ureq::tls::{Certificate, RootCerts, TlsConfig, TlsProvider};

fn repo_root() -> PathBuf {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    root.canonicalize().unwrap_or(root)
}

/// The YAML documents of `deploy/kubernetes/deployment.yaml`.
fn manifest() -> Vec<Value> {
    let text = std::fs::read_to_string(repo_root().join("deploy/kubernetes/deployment.yaml"))
        .expect("read deployment.yaml");
    serde_yaml_ng::Deserializer::from_str(&text)
        .map(|d| serde_yaml_ng::with::singleton_map_recursive::deserialize(d).expect("YAML"))
        .collect()
}

fn is_root() -> bool {
    let out = Command::new("id").arg("-u").output().expect("run id -u");
    String::from_utf8_lossy(&out.stdout).trim() == "0"
}

/// Chown through the `chown` command (no unsafe libc call in a test).
fn chown(path: &Path, owner: &str) {
    let ok = Command::new("chown").args(["-h", owner]).arg(path).status().expect("chown");
    assert!(ok.success(), "chown {owner} {}", path.display());
}

/// Writes one Secret volume at `dir` as the kubelet does: the files in a timestamped directory,
/// `..data` linking to it, each key a link through `..data`.
fn kubelet_secret(dir: &Path, files: &[(&str, Vec<u8>)], mode: u32, group: Option<u64>) {
    let stamp = "..2026_01_01_00_00_00.000000000";
    std::fs::create_dir_all(dir.join(stamp)).expect("mkdir");
    let owner = format!("0:{}", group.unwrap_or(0));
    for d in [dir.to_path_buf(), dir.join(stamp)] {
        std::fs::set_permissions(&d, std::fs::Permissions::from_mode(0o755)).expect("chmod dir");
        chown(&d, &owner);
    }
    symlink(stamp, dir.join("..data")).expect("link ..data");
    for (name, bytes) in files {
        let f = dir.join(stamp).join(name);
        std::fs::write(&f, bytes).expect("write secret file");
        std::fs::set_permissions(&f, std::fs::Permissions::from_mode(mode)).expect("chmod");
        chown(&f, &owner);
        symlink(format!("..data/{name}"), dir.join(name)).expect("link key");
    }
}

/// A `defaultMode` as Kubernetes reads it: YAML 1.1, where `0440` is octal (a YAML 1.2 parser
/// leaves it a string), a plain number is decimal (JSON); absent, 0644.
fn file_mode(v: &Value) -> u32 {
    match v {
        Value::Null => 0o644,
        Value::Number(n) => n.as_u64().and_then(|n| u32::try_from(n).ok()).expect("a mode"),
        Value::String(s) => {
            let digits = s.strip_prefix("0o").or_else(|| s.strip_prefix('0')).expect("octal");
            u32::from_str_radix(digits, 8).expect("an octal mode")
        }
        other => panic!("defaultMode {other}"),
    }
}

fn https_agent(ca: &Path) -> ureq::Agent {
    let ca = Certificate::from_pem(&std::fs::read(ca).expect("read CA")).expect("PEM");
    let tls = TlsConfig::builder()
        .provider(TlsProvider::Rustls)
        .unversioned_rustls_crypto_provider(Arc::new(rustls::crypto::ring::default_provider()))
        .root_certs(RootCerts::Specific(Arc::new(vec![ca])))
        .build();
    ureq::Agent::config_builder()
        .http_status_as_error(false)
        .timeout_global(Some(Duration::from_secs(10)))
        .tls_config(tls)
        .build()
        .into()
}

#[test]
fn the_deployment_starts_as_the_kubelet_runs_it_and_gets_ready() {
    if !is_root() {
        assert!(std::env::var_os("CI").is_none(), "CI must run this test as root");
        eprintln!("skipped: needs root (file owners and setpriv)");
        return;
    }
    if !idalloc_testkit::etcd::etcd_or_skip("the Kubernetes deployment test") {
        return;
    }
    let docs = manifest();
    let dep = docs.iter().find(|d| d["kind"] == "Deployment").expect("a Deployment");
    let pod = &dep["spec"]["template"]["spec"];
    let sc = &pod["securityContext"];
    let uid = sc["runAsUser"].as_u64().expect("runAsUser");
    let gid = sc["runAsGroup"].as_u64().expect("runAsGroup");
    let fs_group = sc["fsGroup"].as_u64();
    let c = &pod["containers"][0];

    let rt = tokio::runtime::Runtime::new().expect("runtime");
    let spec = SecureSpec { tls: true, client_cert_auth: true, auth: true, auth_token_ttl: None };
    let etcd = rt.block_on(SecureEtcd::start(spec)).expect("start the test etcd");
    let pki = etcd.pki().clone();

    // The pod's file system: a directory every uid may enter, the binary, the Secret volumes.
    let tmp = tempfile::tempdir().expect("tempdir");
    let root = tmp.path().to_path_buf();
    std::fs::set_permissions(&root, std::fs::Permissions::from_mode(0o755)).expect("chmod");
    let bin = root.join("idalloc");
    std::fs::copy(env!("CARGO_BIN_EXE_idalloc"), &bin).expect("copy the binary");
    std::fs::set_permissions(&bin, std::fs::Permissions::from_mode(0o755)).expect("chmod bin");
    let read = |p: &Path| std::fs::read(p).expect("read test file");
    let token_digest = "sha256:".to_string() + &"ab".repeat(32);
    let contents = |secret: &str| -> Vec<(&'static str, Vec<u8>)> {
        match secret {
            "idalloc-etcd" => vec![
                ("ca.crt", read(&pki.ca)),
                ("tls.crt", read(&pki.client.cert)),
                ("tls.key", read(&pki.client.key)),
                ("password", SecureEtcd::PASSWORD.as_bytes().to_vec()),
            ],
            "idalloc-serve" => vec![
                ("tls.crt", read(&pki.server.cert)),
                ("tls.key", read(&pki.server.key)),
                ("tokens", format!("prometheus read {token_digest}\n").into_bytes()),
            ],
            other => panic!("the test does not know Secret {other}"),
        }
    };
    let volumes = pod["volumes"].as_array().expect("volumes");
    let mut moved: Vec<(String, String)> = Vec::new();
    for m in c["volumeMounts"].as_array().expect("volumeMounts") {
        let (name, path) = (m["name"].as_str().expect("name"), m["mountPath"].as_str().expect("p"));
        let v = volumes.iter().find(|v| v["name"] == name).expect("the mount's volume");
        let secret = v["secret"]["secretName"].as_str().expect("a Secret volume");
        // Kubernetes' default mode is 0644; with fsGroup the kubelet adds group read.
        let mut mode = file_mode(&v["secret"]["defaultMode"]);
        if fs_group.is_some() {
            mode |= 0o440;
        }
        let here = root.join(path.trim_start_matches('/'));
        kubelet_secret(&here, &contents(secret), mode, fs_group);
        moved.push((path.to_string(), here.to_str().expect("utf-8").to_string()));
    }
    let relocate = |s: &str| {
        moved.iter().fold(s.to_string(), |acc, (from, to)| {
            acc.replace(&format!("{from}/"), &format!("{to}/"))
        })
    };
    let args: Vec<String> =
        c["args"]
            .as_array()
            .expect("args")
            .iter()
            .map(|a| a.as_str().expect("arg"))
            .map(|a| {
                if a.starts_with("--listen=") {
                    "--listen=127.0.0.1:0".into()
                } else {
                    relocate(a)
                }
            })
            .collect();
    let mut env: Vec<(String, String)> = Vec::new();
    for e in c["env"].as_array().expect("env") {
        let name = e["name"].as_str().expect("env name").to_string();
        let value = match name.as_str() {
            "IDALLOC_ENDPOINTS" => etcd.endpoint(),
            "IDALLOC_PREFIX" => SecureEtcd::PREFIX.trim_end_matches('/').to_string(),
            _ => relocate(e["value"].as_str().expect("env value")),
        };
        env.push((name, value));
    }
    assert!(env.iter().any(|(n, v)| n == "IDALLOC_USER" && v == SecureEtcd::USER), "{env:?}");

    let mut groups = vec![gid.to_string()];
    if let Some(g) = fs_group {
        groups.push(g.to_string());
    }
    let child = Command::new("setpriv")
        .arg(format!("--reuid={uid}"))
        .arg(format!("--regid={gid}"))
        .arg(format!("--groups={}", groups.join(",")))
        .args(["--inh-caps=-all", "--no-new-privs", "--"])
        .arg(&bin)
        .args(&args)
        .env_clear()
        .envs(env.iter().map(|(n, v)| (n.as_str(), v.as_str())))
        .current_dir(&root)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run setpriv");
    let mut serve = KillOnDrop(child);
    let mut first = String::new();
    let stdout = serve.0.stdout.take().expect("stdout");
    let _ = BufReader::new(stdout).read_line(&mut first);
    let Some(addr) = listening_addr(&first).map(str::to_string) else {
        let _ = serve.0.kill();
        let out = serve.0.wait_with_output_of_stderr();
        panic!("serve did not start as the manifest runs it: {first:?}\n{out}");
    };
    let agent = https_agent(&pki.ca);
    let deadline = Instant::now() + Duration::from_secs(30);
    let ready = loop {
        let r = request(&agent, "GET", &format!("https://{addr}/readyz"), None, None);
        match r {
            Ok(r) if r.status == 200 => break r,
            other if Instant::now() > deadline => panic!("never ready: {other:?}"),
            _ => std::thread::sleep(Duration::from_millis(200)),
        }
    };
    assert_eq!(ready.body["status"], "ready", "{}", ready.text);
}

/// Reads the rest of a child's stderr, for a failure message.
trait StderrOf {
    fn wait_with_output_of_stderr(&mut self) -> String;
}

impl StderrOf for std::process::Child {
    fn wait_with_output_of_stderr(&mut self) -> String {
        use std::io::Read;
        let mut s = String::new();
        if let Some(mut e) = self.stderr.take() {
            let _ = e.read_to_string(&mut s);
        }
        let _ = self.wait();
        s
    }
}

/// `--shutdown-delay`: after SIGTERM `/readyz` answers 503 while API requests are still
/// served and the process keeps running; then it drains and exits 0.
#[test]
fn after_sigterm_readiness_fails_first_while_requests_are_served_then_it_drains() {
    let dir = tempfile::tempdir().expect("tempdir");
    let store = format!("file:{}", dir.path().join("ids.redb").display());
    let mut s = Serve::start(
        env!("CARGO_BIN_EXE_idalloc"),
        &["--store", &store],
        &["--shutdown-delay", "8s", "--drain-timeout", "5s"],
    );
    let agent = plain_agent(Duration::from_secs(10));
    let get = |path: &str| request(&agent, "GET", &s.http(path), None, None).expect(path);
    assert_eq!(get("/readyz").status, 200);
    s.signal("TERM");
    // Phase 1: not ready, still serving.
    let deadline = Instant::now() + Duration::from_secs(5);
    let not_ready = loop {
        let r = get("/readyz");
        if r.status == 503 || Instant::now() > deadline {
            break r;
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    assert_eq!(not_ready.status, 503, "{}", not_ready.text);
    assert!(not_ready.text.contains("shutting down"), "{}", not_ready.text);
    let pools = get("/v1/pools");
    assert_eq!(pools.status, 200, "API requests are served during the delay: {}", pools.text);
    assert_eq!(get("/healthz").status, 200);
    // Phase 2: the drain, then a clean exit.
    assert_eq!(s.terminate(), Some(0));
}
