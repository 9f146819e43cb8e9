//! The CLI through `idalloc serve` (`--server`, `IDALLOC_SERVER`): every command that makes sense
//! over HTTP gives the same output and exit code as on a store; the others refuse with exit 2;
//! tokens and TLS; a server that does not answer is exit 5.

use std::path::Path;
use std::process::{Command, Stdio};

use idalloc_testkit::serve::Serve;

fn bin() -> &'static str {
    env!("CARGO_BIN_EXE_idalloc")
}

/// One run: exit code, stdout, stderr.
#[derive(Debug, PartialEq, Eq)]
struct Ran {
    code: i32,
    stdout: String,
    stderr: String,
}

/// `idalloc ARGS` in `dir` with `env` set (and the store and server variables cleared).
fn run(dir: &Path, env: &[(&str, &str)], args: &[&str]) -> Ran {
    let mut c = Command::new(bin());
    c.current_dir(dir)
        .env("USER", "alice")
        .env_remove("RUST_LOG")
        .env_remove("IDALLOC_STORE")
        .env_remove("IDALLOC_SERVER")
        .env_remove("IDALLOC_PREFIX")
        .env_remove("IDALLOC_TOKEN_FILE")
        .envs(env.iter().copied())
        .args(args)
        .stdin(Stdio::null());
    let o = c.output().expect("run idalloc");
    Ran {
        code: o.status.code().unwrap_or(-1),
        stdout: String::from_utf8_lossy(&o.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&o.stderr).into_owned(),
    }
}

/// The same commands on a file store and through a serve of another (fresh) file store: the
/// same exit codes and stdout, and an `error:` line on the same ones.
#[test]
fn every_command_through_serve_answers_as_on_a_store() {
    let direct = tempfile::tempdir().expect("tempdir");
    let served = tempfile::tempdir().expect("tempdir");
    let keys = direct.path().join("keys.txt");
    std::fs::write(&keys, "k1\nk2\nk3\n").expect("keys");
    let keys = keys.to_str().expect("utf-8").to_string();
    let direct_store = format!("file:{}", direct.path().join("ids.redb").display());
    let served_store = format!("file:{}", served.path().join("ids.redb").display());
    let serve = Serve::start(bin(), &["--store", &served_store], &[]);
    let url = format!("http://{}", serve.addr());

    let script: Vec<Vec<&str>> = vec![
        vec!["pool", "create", "p", "--range", "1-100", "--strategy", "lowest"],
        vec!["--json", "pool", "create", "p", "--range", "1-100", "--strategy", "lowest"],
        vec!["pool", "create", "p", "--range", "1-200"],
        vec!["acquire", "p", "a"],
        vec!["acquire", "p", "a"],
        vec!["--json", "acquire", "p", "b"],
        vec!["acquire", "p", "--from", &keys],
        vec!["--json", "acquire", "p", "--from", &keys, "--holder", "bob"],
        vec!["acquire", "q", "x", "--range", "10-10"],
        vec!["acquire", "nopool", "x"],
        vec!["acquire", "pp", "x"],
        vec!["get", "p", "a"],
        vec!["--json", "get", "p", "k2"],
        vec!["get", "p", "nokey"],
        vec!["get", "pp", "a"],
        vec!["lookup", "p", "1"],
        vec!["--json", "lookup", "p", "2"],
        vec!["lookup", "p", "99"],
        vec!["list", "p"],
        vec!["--json", "list", "p"],
        vec!["list", "nopool"],
        vec!["pool", "list"],
        vec!["--json", "pool", "list"],
        vec!["pool", "show", "p"],
        vec!["--json", "pool", "show", "p"],
        vec!["pool", "show", "pp"],
        vec!["release", "p", "a"],
        vec!["release", "p", "a"],
        vec!["--json", "release", "p", "b"],
        vec!["release", "p", "--from", &keys],
        vec!["--json", "release", "p", "--from", &keys, "--holder", "bob"],
        vec!["release", "nopool", "k"],
        vec!["pool", "create", "tiny", "--range", "1-1"],
        vec!["acquire", "tiny", "x"],
        vec!["acquire", "tiny", "y"],
        vec!["acquire", "p", ""],
        vec!["acquire", "p", "k", "--holder", ""],
        vec!["pool", "delete", "q"],
        vec!["pool", "delete", "q", "--force"],
        vec!["--json", "pool", "delete", "tiny", "--force"],
        vec!["pool", "delete", "q"],
        vec!["watch", "p", "--count", "0"],
        vec!["--json", "watch", "p", "--count", "0"],
    ];
    for args in &script {
        let a = run(direct.path(), &[("IDALLOC_STORE", &direct_store)], args);
        let b = run(served.path(), &[("IDALLOC_SERVER", &url)], args);
        assert_eq!((a.code, &a.stdout), (b.code, &b.stdout), "{args:?}: {a:?} / {b:?}");
        assert_eq!(a.stderr.is_empty(), b.stderr.is_empty(), "{args:?}: {a:?} / {b:?}");
        if a.code != 0 {
            assert!(b.stderr.starts_with("error: ") && b.stderr.lines().count() == 1, "{b:?}");
        }
    }
    // Every answer came from the service: no store was opened beside it.
    assert!(!served.path().join("idalloc.redb").exists(), "a local store was opened");
    // The typo's suggestion comes through the service too.
    let r = run(served.path(), &[("IDALLOC_SERVER", &url)], &["get", "pp", "a"]);
    assert!(r.stderr.contains("did you mean \"p\"?"), "{r:?}");
    // The flag works as the variable does.
    let r = run(served.path(), &[], &["--server", &url, "acquire", "p", "via-flag"]);
    assert_eq!(r.code, 0, "{r:?}");
    let again = run(served.path(), &[("IDALLOC_SERVER", &url)], &["get", "p", "via-flag"]);
    assert_eq!((again.code, &again.stdout), (0, &r.stdout), "{again:?}");

    // A watch sees a change made through the service.
    let mut w = Command::new(bin())
        .args(["--server", &url, "--json", "watch", "p", "--count", "1"])
        .env_remove("RUST_LOG")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn watch");
    let mut stdout = std::io::BufReader::new(w.stdout.take().expect("stdout"));
    let mut line = String::new();
    std::io::BufRead::read_line(&mut stdout, &mut line).expect("synced line");
    assert!(line.contains("\"synced\""), "{line}");
    let r = run(served.path(), &[("IDALLOC_SERVER", &url)], &["acquire", "p", "watched"]);
    assert_eq!(r.code, 0, "{r:?}");
    line.clear();
    std::io::BufRead::read_line(&mut stdout, &mut line).expect("upsert line");
    let j: serde_json::Value = serde_json::from_str(&line).expect("JSON");
    assert_eq!((j["event"].as_str(), j["key"].as_str()), (Some("upsert"), Some("watched")), "{j}");
    assert_eq!(w.wait().expect("watch exits").code(), Some(0));

    // status: the service, its revision and pools.
    let r = run(served.path(), &[("IDALLOC_SERVER", &url)], &["--json", "status"]);
    assert_eq!(r.code, 0, "{r:?}");
    let j: serde_json::Value = serde_json::from_str(&r.stdout).expect("status JSON");
    assert_eq!(
        (j["store"].as_str(), j["reachable"].as_bool()),
        (Some("server"), Some(true)),
        "{j}"
    );
    assert!(j["revision"].as_i64().is_some(), "{j}");
    assert_eq!(j["pools"], serde_json::json!(["p"]), "{j}");

    // Commands that need the store itself refuse, naming what to do.
    for args in [
        vec!["check"],
        vec!["gc"],
        vec!["serve"],
        vec!["get", "p", "a", "--remote", "b=etcd://127.0.0.1:1"],
    ] {
        let r = run(served.path(), &[("IDALLOC_SERVER", &url)], &args);
        assert_eq!(r.code, 2, "{args:?}: {r:?}");
        assert!(r.stderr.contains("--store") && r.stdout.is_empty(), "{args:?}: {r:?}");
    }
    let r = run(served.path(), &[], &["--server", &url, "--store", "memory:", "status"]);
    assert_eq!(r.code, 2, "{r:?}");
    drop(serve);

    // The service gone: exit 5, and status still prints what it knows.
    let r = run(served.path(), &[("IDALLOC_SERVER", &url)], &["--timeout", "1s", "get", "p", "a"]);
    assert_eq!(r.code, 5, "{r:?}");
    assert!(r.stderr.contains(serve_addr(&url)), "names the endpoint: {r:?}");
    let r = run(served.path(), &[("IDALLOC_SERVER", &url)], &["--timeout", "1s", "status"]);
    assert_eq!(r.code, 5, "{r:?}");
    assert!(r.stdout.contains("reachable:  no (") && r.stdout.contains(&url), "{r:?}");
}

fn serve_addr(url: &str) -> &str {
    url.trim_start_matches("http://")
}

/// HTTPS with a private CA and a bearer token from --token-file (env too); a wrong token or none
/// is refused with exit 1 (retrying cannot help).
#[test]
fn through_serve_with_tls_and_a_token() {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().expect("tempdir");
    let pki = idalloc_testkit::secure::TestPki::generate(dir.path()).expect("certificates");
    let token = format!("tok-{:032}", std::process::id());
    let secret = |name: &str, text: &str| {
        let p = dir.path().join(name);
        std::fs::write(&p, text).expect("write");
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o600)).expect("chmod");
        p.to_str().expect("utf-8").to_string()
    };
    secret("cli.token", &format!("{token}\n"));
    let tokens = secret("tokens", "cli admin file:cli.token\n");
    let wrong = secret("wrong.token", "not-the-token\n");
    let good = dir.path().join("cli.token").to_str().expect("utf-8").to_string();
    let p = |x: &Path| x.to_str().expect("utf-8").to_string();
    let store = format!("file:{}", dir.path().join("ids.redb").display());
    let serve = Serve::start(
        bin(),
        &["--store", &store],
        &[
            "--tls-cert",
            &p(&pki.server.cert),
            "--tls-key",
            &p(&pki.server.key),
            "--auth-tokens",
            &tokens,
        ],
    );
    let url = format!("https://{}", serve.addr());
    let ca = p(&pki.ca);
    let with = |extra: &[(&str, &str)], args: &[&str]| {
        let mut env = vec![("IDALLOC_SERVER", url.as_str()), ("IDALLOC_CACERT", ca.as_str())];
        env.extend_from_slice(extra);
        run(dir.path(), &env, args)
    };
    let r = with(&[("IDALLOC_TOKEN_FILE", &good)], &["acquire", "p", "k", "--range", "1-10"]);
    assert_eq!(r.code, 0, "{r:?}");
    let id = r.stdout.trim().to_string();
    let r = with(&[], &["--token-file", &good, "get", "p", "k"]);
    assert_eq!((r.code, r.stdout.trim()), (0, id.as_str()), "{r:?}");
    let r = with(&[], &["get", "p", "k"]);
    assert_eq!(r.code, 1, "no token: {r:?}");
    assert!(r.stderr.contains("unauthenticated"), "{r:?}");
    let r = with(&[("IDALLOC_TOKEN_FILE", &wrong)], &["get", "p", "k"]);
    assert_eq!(r.code, 1, "wrong token: {r:?}");
    // Without the CA the service's certificate is not trusted.
    let r = run(
        dir.path(),
        &[("IDALLOC_SERVER", &url), ("IDALLOC_TOKEN_FILE", &good)],
        &["--timeout", "2s", "get", "p", "k"],
    );
    assert_ne!(r.code, 0, "{r:?}");
    let r = with(&[("IDALLOC_TOKEN_FILE", &good)], &["--json", "status"]);
    assert_eq!(r.code, 0, "{r:?}");
    drop(serve);
}
