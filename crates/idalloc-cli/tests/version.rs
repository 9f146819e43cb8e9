//! `idalloc version` and `GET /v1/version`: the client's version, git commit, API and record
//! layout versions, and the store's server (its etcd version, or the file store's format).

mod common;

use std::process::Command;
use std::time::Duration;

use common::{plain_agent, request};
use idalloc_testkit::serve::Serve;

fn bin() -> &'static str {
    env!("CARGO_BIN_EXE_idalloc")
}

fn run(args: &[&str]) -> (Option<i32>, String, String) {
    let out = Command::new(bin()).args(args).env_remove("IDALLOC_STORE").output().expect("run");
    let text = |b: &[u8]| String::from_utf8_lossy(b).into_owned();
    (out.status.code(), text(&out.stdout), text(&out.stderr))
}

/// A git commit as `build.rs` records it: 12 hex digits, or "unknown" outside a git checkout.
fn is_sha(s: &str) -> bool {
    s == "unknown" || (s.len() == 12 && s.bytes().all(|b| b.is_ascii_hexdigit()))
}

#[test]
fn version_names_the_client_and_with_a_store_its_server() {
    let (code, out, err) = run(&["version"]);
    assert_eq!(code, Some(0), "{err}");
    assert!(out.starts_with(&format!("idalloc {}\n", env!("CARGO_PKG_VERSION"))), "{out}");
    assert!(out.contains("api:        v1\n") && out.contains("layout:     1\n"), "{out}");
    assert!(!out.contains("store:"), "no store named, none asked: {out}");
    let (code, out, _) = run(&["--json", "version"]);
    assert_eq!(code, Some(0));
    let j: serde_json::Value = serde_json::from_str(&out).expect("JSON");
    assert_eq!(j["version"], env!("CARGO_PKG_VERSION"));
    assert!(is_sha(j["git_sha"].as_str().expect("git_sha")), "{j}");
    assert_eq!((j["api"].as_str(), j["layout"].as_u64()), (Some("v1"), Some(1)));
    assert!(j.get("store").is_none(), "{j}");

    let dir = tempfile::tempdir().expect("tempdir");
    let file = format!("file:{}", dir.path().join("ids.redb").display());
    let (code, _, err) = run(&["--store", &file, "pool", "create", "p", "--range", "1-9"]);
    assert_eq!(code, Some(0), "{err}");
    let (code, out, _) = run(&["--store", &file, "--json", "version"]);
    assert_eq!(code, Some(0));
    let j: serde_json::Value = serde_json::from_str(&out).expect("JSON");
    assert!(j["store"].as_str().is_some_and(|s| s.starts_with("idalloc file store, format ")));
    // A named store that is not there: the client's versions, then exit 1.
    let missing = format!("file:{}", dir.path().join("none.redb").display());
    let (code, out, _) = run(&["--store", &missing, "version"]);
    assert_eq!(code, Some(1), "{out}");
    assert!(out.starts_with("idalloc ") && out.contains("store:      unknown ("), "{out}");
    assert!(!dir.path().join("none.redb").exists(), "version created the file");

    if let Ok(etcd) = std::env::var("IDALLOC_TEST_ETCD") {
        let store = etcd.replacen("http://", "etcd://", 1);
        let (code, out, err) = run(&["--store", &store, "version"]);
        assert_eq!(code, Some(0), "{err}");
        assert!(out.contains("store:      etcd 3."), "{out}");
    }
}

#[test]
fn serve_answers_its_version_and_its_stores() {
    let dir = tempfile::tempdir().expect("tempdir");
    let store = format!("file:{}", dir.path().join("ids.redb").display());
    let s = Serve::start(bin(), &["--store", &store], &[]);
    let agent = plain_agent(Duration::from_secs(30));
    let v = request(&agent, "GET", &s.http("/v1/version"), None, None).expect("version").ok();
    assert_eq!(v["version"], env!("CARGO_PKG_VERSION"));
    assert!(is_sha(v["git_sha"].as_str().expect("git_sha")), "{v}");
    assert_eq!((v["api"].as_str(), v["layout"].as_u64()), (Some("v1"), Some(1)));
    assert!(v["store"].as_str().is_some_and(|s| s.starts_with("idalloc file store")), "{v}");
    // The same build as the CLI's.
    let (_, out, _) = run(&["--json", "version"]);
    let cli: serde_json::Value = serde_json::from_str(&out).expect("JSON");
    assert_eq!(cli["git_sha"], v["git_sha"]);
}
