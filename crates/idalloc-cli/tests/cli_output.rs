//! `list --holder H --key-prefix P` and `--no-headers`, on a file store and through `serve`.

use std::path::Path;
use std::process::{Command, Stdio};

fn bin() -> &'static str {
    env!("CARGO_BIN_EXE_idalloc")
}

fn run(dir: &Path, env: (&str, &str), args: &[&str]) -> (i32, String) {
    let o = Command::new(bin())
        .current_dir(dir)
        .env("USER", "alice")
        .env_remove("RUST_LOG")
        .env_remove("IDALLOC_STORE")
        .env_remove("IDALLOC_SERVER")
        .env(env.0, env.1)
        .args(args)
        .stdin(Stdio::null())
        .output()
        .expect("run idalloc");
    assert!(o.stderr.is_empty(), "{args:?}: {}", String::from_utf8_lossy(&o.stderr));
    (o.status.code().unwrap_or(-1), String::from_utf8_lossy(&o.stdout).into_owned())
}

fn filters_and_headers(dir: &Path, env: (&str, &str)) {
    let ok = |args: &[&str]| {
        let (code, out) = run(dir, env, args);
        assert_eq!(code, 0, "{args:?}: {out}");
        out
    };
    ok(&["pool", "create", "f", "--range", "1-100", "--strategy", "lowest"]);
    ok(&["acquire", "f", "web-1"]);
    ok(&["acquire", "f", "web-2", "--holder", "bob"]);
    ok(&["acquire", "f", "db-1", "--holder", "bob"]);
    assert_eq!(
        ok(&["list", "f", "--holder", "bob"]),
        "ID  KEY    HOLDERS\n2   web-2  bob\n3   db-1   bob\n"
    );
    assert_eq!(
        ok(&["list", "f", "--key-prefix", "web-"]),
        "ID  KEY    HOLDERS\n1   web-1  alice\n2   web-2  bob\n"
    );
    assert_eq!(
        ok(&["list", "f", "--holder", "bob", "--key-prefix", "web-"]),
        "ID  KEY    HOLDERS\n2   web-2  bob\n"
    );
    assert_eq!(ok(&["list", "f", "--holder", "nobody"]), "ID  KEY  HOLDERS\n");
    assert_eq!(
        ok(&["--no-headers", "list", "f", "--holder", "bob"]),
        "2   web-2  bob\n3   db-1   bob\n"
    );
    let j: serde_json::Value =
        serde_json::from_str(&ok(&["--json", "list", "f", "--key-prefix", "db"])).expect("JSON");
    assert_eq!(j["bindings"], serde_json::json!([{"id": 3, "key": "db-1", "holders": ["bob"]}]));
    let table = ok(&["--no-headers", "pool", "list"]);
    // The columns stay where the header would put them.
    assert!(table.starts_with("f     1-100  3"), "{table:?}");
    assert!(ok(&["pool", "list"]).starts_with("NAME"));
}

#[test]
fn list_filters_and_no_headers_on_a_file_store() {
    let dir = tempfile::tempdir().expect("tempdir");
    let store = format!("file:{}", dir.path().join("ids.redb").display());
    filters_and_headers(dir.path(), ("IDALLOC_STORE", &store));
}

#[test]
fn list_filters_and_no_headers_through_serve() {
    let dir = tempfile::tempdir().expect("tempdir");
    let store = format!("file:{}", dir.path().join("ids.redb").display());
    let serve = idalloc_testkit::serve::Serve::start(bin(), &["--store", &store], &[]);
    let url = format!("http://{}", serve.addr());
    filters_and_headers(dir.path(), ("IDALLOC_SERVER", &url));
    drop(serve);
}
