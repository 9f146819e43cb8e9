//! The CLI through `idalloc serve` (`--server`, `IDALLOC_SERVER`): every command that makes sense
//! over HTTP gives the same output and exit code as on a store; the others refuse with exit 2;
//! tokens and TLS; a server that does not answer is exit 5.

use std::path::Path;
use std::process::{Command, Stdio};

use idalloc_testkit::cli::Ran;
use idalloc_testkit::serve::Serve;

fn bin() -> &'static str {
    env!("CARGO_BIN_EXE_idalloc")
}

/// `idalloc ARGS` in `dir` with `env` set (and the store and server variables cleared).
fn run(dir: &Path, env: &[(&str, &str)], args: &[&str]) -> Ran {
    idalloc_testkit::cli::run(bin(), dir, env, args)
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
    // Both stores finalized (no grace), so the script's shrinks and new reserved IDs may commit.
    for store in [&direct_store, &served_store] {
        let r = run(direct.path(), &[], &["--store", store, "upgrade", "finalize", "--grace", "0"]);
        assert_eq!(r.code, 0, "{r:?}");
    }
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
        vec!["pool", "resize", "tiny", "--range", "1-2"],
        vec!["acquire", "tiny", "y"],
        vec!["pool", "resize", "tiny", "--range", "1-1"],
        vec!["pool", "resize", "tiny", "--range", "1-3", "--reserve", "2"],
        vec!["--json", "pool", "resize", "tiny", "--range", "1-3", "--reserve", "3"],
        vec!["pool", "show", "tiny"],
        vec!["pool", "resize", "tiny", "--range", "3-1"],
        vec!["pool", "resize", "nopool", "--range", "1-5"],
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
        // A shrink over a bound ID names it and its key, on a store and through the service.
        if args[..2] == ["pool", "resize"] && args.ends_with(&["1-1"]) {
            for r in [&a, &b] {
                assert!(r.code == 1 && r.stderr.contains("ID 2 is bound to key \"y\""), "{r:?}");
            }
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

    // And a resize made through the service (the SSE `spec` event, through idalloc-client).
    let mut w = Command::new(bin())
        .args(["--server", &url, "watch", "p", "--count", "1"])
        .env_remove("RUST_LOG")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn watch");
    let mut stdout = std::io::BufReader::new(w.stdout.take().expect("stdout"));
    let mut line = String::new();
    std::io::BufRead::read_line(&mut stdout, &mut line).expect("synced line");
    assert!(line.starts_with("synced"), "{line}");
    let r = run(
        served.path(),
        &[("IDALLOC_SERVER", &url)],
        &["pool", "resize", "p", "--range", "1-500"],
    );
    assert_eq!(r.code, 0, "{r:?}");
    line.clear();
    std::io::BufRead::read_line(&mut stdout, &mut line).expect("resized line");
    assert!(line.starts_with("resized 1-500"), "{line}");
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

/// `gc --holder NODE` on a store and through a serve: a dry run changes nothing; the run drops
/// exactly NODE's references, reclaiming the bindings nobody else holds and keeping the others.
#[test]
fn gc_holder_frees_one_nodes_bindings_and_nothing_else() {
    let dir = tempfile::tempdir().expect("tempdir");
    let served = format!("file:{}", dir.path().join("served.redb").display());
    let serve = Serve::start(bin(), &["--store", &served], &[]);
    let url = format!("http://{}", serve.addr());
    let direct = format!("file:{}", dir.path().join("direct.redb").display());
    for env in [("IDALLOC_STORE", direct.as_str()), ("IDALLOC_SERVER", url.as_str())] {
        let idalloc = |args: &[&str]| {
            let r = run(dir.path(), &[env], args);
            assert_eq!(r.code, 0, "{env:?} {args:?}: {r:?}");
            r.stdout
        };
        idalloc(&["pool", "create", "p", "--range", "1-100", "--strategy", "lowest"]);
        idalloc(&["pool", "create", "other", "--range", "1-10", "--strategy", "lowest"]);
        for (key, holder) in
            [("a", "n1"), ("b", "n2"), ("c", "n1"), ("shared", "n1"), ("shared", "n2")]
        {
            idalloc(&["acquire", "p", key, "--holder", holder]);
        }
        idalloc(&["acquire", "other", "x", "--holder", "n1"]);
        let before = idalloc(&["--json", "list", "p"]);

        let dry: serde_json::Value =
            serde_json::from_str(&idalloc(&["--json", "gc", "--holder", "n1", "p", "--dry-run"]))
                .expect("JSON");
        let keys: Vec<_> = dry["pools"][0]["released"]
            .as_array()
            .expect("released")
            .iter()
            .map(|d| d["key"].as_str().unwrap_or_default().to_string())
            .collect();
        assert_eq!(keys, ["a", "c", "shared"], "{env:?}: {dry}");
        assert_eq!(dry["dry_run"], true, "{dry}");
        assert_eq!(idalloc(&["--json", "list", "p"]), before, "{env:?}: a dry run changed nothing");

        let done: serde_json::Value =
            serde_json::from_str(&idalloc(&["--json", "gc", "--holder", "n1", "p"])).expect("JSON");
        let reclaimed: Vec<_> = done["pools"][0]["released"]
            .as_array()
            .expect("released")
            .iter()
            .map(|d| (d["key"].as_str().unwrap_or_default().to_string(), d["reclaimed"] == true))
            .collect();
        assert_eq!(
            reclaimed,
            [("a".to_string(), true), ("c".to_string(), true), ("shared".to_string(), false)],
            "{env:?}: {done}"
        );
        assert_eq!(
            idalloc(&["list", "p"]),
            "ID  KEY     HOLDERS\n2   b       n2\n4   shared  n2\n",
            "{env:?}: n2's bindings untouched"
        );
        // Another pool was not named, so n1 keeps it; without a pool, every pool is swept.
        assert!(idalloc(&["list", "other"]).contains("n1"), "{env:?}");
        let all = idalloc(&["gc", "--holder", "n1"]);
        assert!(all.contains("other: released 1 x (reclaimed)"), "{env:?}: {all}");
        assert!(all.contains("p: released 0 references"), "{env:?}: {all}");
        let r = run(dir.path(), &[env], &["gc", "--holder", "lease:x"]);
        assert_eq!(r.code, 2, "{env:?}: a holder name that cannot be durable: {r:?}");
    }
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
    // `gc --holder` names the holder as `acquire --holder` does, though the service stores it
    // under the client's name (`cli/n1`).
    let t = [("IDALLOC_TOKEN_FILE", good.as_str())];
    for (key, holder) in [("h1", "n1"), ("h2", "n2")] {
        let r = with(&t, &["acquire", "p", key, "--holder", holder]);
        assert_eq!(r.code, 0, "{r:?}");
    }
    let r = with(&t, &["gc", "--holder", "n1", "p", "--dry-run"]);
    assert_eq!(r.code, 0, "{r:?}");
    assert!(r.stdout.contains("p: would release 1 reference of holder n1"), "{r:?}");
    let r = with(&t, &["gc", "--holder", "n1", "p"]);
    assert_eq!(r.code, 0, "{r:?}");
    assert!(r.stdout.contains(" h1 (reclaimed)"), "{r:?}");
    assert!(r.stdout.contains("p: released 1 reference of holder n1"), "{r:?}");
    let r = with(&t, &["list", "p"]);
    assert!(!r.stdout.contains("h1") && r.stdout.contains("h2"), "n2 keeps its key: {r:?}");
    drop(serve);
}

/// A token file or TLS file that cannot be used is a usage error (exit 2) before any request,
/// naming the flag (or its variable's flag), the file and what it must hold; `--cert` without
/// `--key` too.
#[test]
fn unusable_token_and_tls_files_are_refused_naming_the_flag() {
    let dir = tempfile::tempdir().expect("tempdir");
    let file = |name: &str, text: &str| {
        let p = dir.path().join(name);
        std::fs::write(&p, text).expect("write");
        p.to_str().expect("utf-8").to_string()
    };
    let empty = file("empty.token", "\n  \n");
    let not_pem = file("not.pem", "not a certificate\n");
    let missing = dir.path().join("missing.pem").to_str().expect("utf-8").to_string();
    // Nothing listens there: a request would end in exit 5, not 2.
    let server = [("IDALLOC_SERVER", "http://127.0.0.1:1")];
    for (args, env, flag, value, rule) in [
        (vec!["--token-file", empty.as_str()], None, "--token-file", &empty, "first line"),
        (
            vec![],
            Some(("IDALLOC_TOKEN_FILE", empty.as_str())),
            "--token-file",
            &empty,
            "first line",
        ),
        (vec!["--token-file", missing.as_str()], None, "--token-file", &missing, "readable"),
        (vec!["--cacert", missing.as_str()], None, "--cacert", &missing, "readable"),
        (vec!["--cacert", not_pem.as_str()], None, "--cacert", &not_pem, "PEM certificate"),
        (
            vec!["--cert", not_pem.as_str(), "--key", missing.as_str()],
            None,
            "--key",
            &missing,
            "readable",
        ),
        (
            vec!["--cert", not_pem.as_str(), "--key", not_pem.as_str()],
            None,
            "--cert",
            &not_pem,
            "private key",
        ),
    ] {
        let mut env_all = server.to_vec();
        env_all.extend(env);
        let mut a = args.clone();
        a.extend(["get", "p", "k"]);
        let r = run(dir.path(), &env_all, &a);
        assert_eq!(r.code, 2, "{args:?} {env:?}: {r:?}");
        let e = r.stderr.trim_end();
        assert_eq!(e.lines().count(), 1, "{e}");
        assert!(e.starts_with(&format!("error: {flag}: ")), "{args:?}: {e}");
        assert!(e.contains(value.as_str()) && e.contains(rule), "{args:?}: {e}");
    }
    let r = run(dir.path(), &server, &["--cert", &not_pem, "get", "p", "k"]);
    assert_eq!(r.code, 2, "{r:?}");
    assert!(r.stderr.contains("--cert and --key go together"), "{r:?}");
}

/// Requests `serve` counted for `method` on `route` (its `idalloc_http_requests_total`, any
/// status), read from its /metrics.
fn requests_on(serve: &Serve, method: &str, route: &str) -> u64 {
    let text = ureq::get(&serve.http("/metrics"))
        .call()
        .expect("metrics")
        .body_mut()
        .read_to_string()
        .expect("metrics text");
    let route = format!("route=\"{route}\"");
    let method = format!("method=\"{method}\"");
    text.lines()
        .filter(|l| l.starts_with("idalloc_http_requests_total{"))
        .filter(|l| l.contains(&route) && l.contains(&method))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum::<f64>() as u64
}

/// `release --from` through serve sends its keys in batches (one request per 100 keys, as
/// `acquire --from` does), not one request per key, and still prints one line per key.
#[test]
fn release_from_through_serve_sends_batches() {
    let served = tempfile::tempdir().expect("tempdir");
    let store = format!("file:{}", served.path().join("ids.redb").display());
    let serve = Serve::start(bin(), &["--store", &store], &[]);
    let url = format!("http://{}", serve.addr());
    let keys = served.path().join("keys.txt");
    let text: String = (0..250).map(|i| format!("k{i}\n")).collect();
    std::fs::write(&keys, text).expect("keys");
    let keys = keys.to_str().expect("utf-8");
    let env = [("IDALLOC_SERVER", url.as_str())];
    let r = run(served.path(), &env, &["acquire", "p", "--from", keys, "--range", "1-1000"]);
    assert_eq!(r.code, 0, "{r:?}");

    let before = requests_on(&serve, "POST", "/v1/pools/{pool}/release");
    let r = run(served.path(), &env, &["--json", "release", "p", "--from", keys]);
    assert_eq!(r.code, 0, "{r:?}");
    let lines: Vec<serde_json::Value> =
        r.stdout.lines().map(|l| serde_json::from_str(l).expect("JSON line")).collect();
    assert_eq!(lines.len(), 250, "{r:?}");
    assert!(lines.iter().all(|l| l["released"] == true && l["reclaimed"] == true), "{r:?}");
    assert_eq!(lines[249]["key"], "k249");
    let sent = requests_on(&serve, "POST", "/v1/pools/{pool}/release") - before;
    assert_eq!(sent, 3, "250 keys in batches of 100");
    // Everything was released: the pool is empty.
    let r = run(served.path(), &env, &["--json", "list", "p"]);
    assert_eq!(
        serde_json::from_str::<serde_json::Value>(&r.stdout).expect("list")["bindings"],
        serde_json::json!([])
    );
}
