//! `idalloc serve` shared by many clients (issue 20): sessions own their holder names, per-pool
//! grants and quotas, connection limits and timeouts, administration and audit, secret-file
//! permissions. Real processes on the file store, over real HTTP on free loopback ports.

mod common;

use std::path::{Path, PathBuf};
use std::time::Duration;

use common::{plain_agent, request, Resp};
use idalloc_testkit::serve::Serve;
use serde_json::{json, Value};

fn bin() -> &'static str {
    env!("CARGO_BIN_EXE_idalloc")
}

/// `idalloc --store file:DIR/ids.redb --timeout 3s serve … EXTRA`.
fn start(dir: &Path, extra: &[&str]) -> Serve {
    let store = format!("file:{}", dir.join("ids.redb").display());
    Serve::start(bin(), &["--store", &store, "--timeout", "3s"], extra)
}

fn call(s: &Serve, method: &str, path: &str, token: Option<&str>, body: Option<Value>) -> Resp {
    let body = body.map(|b| b.to_string());
    request(&plain_agent(Duration::from_secs(30)), method, &s.http(path), token, body.as_deref())
        .unwrap_or_else(|e| panic!("{method} {path}: {e}"))
}

/// A tokens file (mode 0600) of `lines` (`NAME SCOPE file:NAME.token …`), each client's token
/// written to `NAME.token` (mode 0600); returns the file and the token of each name.
fn tokens_file(dir: &Path, lines: &[&str]) -> (PathBuf, Vec<(String, String)>) {
    use std::os::unix::fs::PermissionsExt;
    let mut tokens = Vec::new();
    for line in lines {
        let name = line.split_whitespace().next().expect("name").to_string();
        let token = format!("tok-{name}-{:x}-{}", rand_u64(), std::process::id());
        let file = dir.join(format!("{name}.token"));
        std::fs::write(&file, &token).expect("write token");
        std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o600)).expect("chmod");
        tokens.push((name, token));
    }
    let path = dir.join("tokens");
    std::fs::write(&path, lines.join("\n") + "\n").expect("write tokens");
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).expect("chmod");
    (path, tokens)
}

fn rand_u64() -> u64 {
    use std::time::{SystemTime, UNIX_EPOCH};
    SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_nanos() as u64).unwrap_or(7)
}

fn token<'a>(tokens: &'a [(String, String)], name: &str) -> &'a str {
    &tokens.iter().find(|(n, _)| n == name).expect("client").1
}

/// A durable acquire or release naming a session's holder is refused (409 `holder_reserved`,
/// naming the holder), without and with tokens, and the session's reference stays the only one.
#[test]
fn sessions_own_their_holder_names() {
    let dir = tempfile::tempdir().expect("tempdir");
    let s = start(dir.path(), &[]);
    call(&s, "POST", "/v1/pools", None, Some(json!({"name":"p","min":1,"max":100}))).ok();
    let sess = call(&s, "POST", "/v1/sessions", None, Some(json!({"ttl":30}))).ok();
    let sid = sess["session"].as_str().expect("session").to_string();
    let holder = sess["holder"].as_str().expect("holder").to_string();
    assert!(holder.starts_with("session:"), "{holder}");
    call(&s, "POST", "/v1/pools/p/acquire", None, Some(json!({"key":"k","session":sid}))).ok();
    for op in ["acquire", "release"] {
        let msg = call(
            &s,
            "POST",
            &format!("/v1/pools/p/{op}"),
            None,
            Some(json!({"keys":["k","k2"],"holder":holder})),
        )
        .err(409, "holder_reserved");
        assert!(msg.contains(&holder) && msg.contains("session"), "{msg}");
    }
    // Any name of the sessions' namespace, live or not (another instance's session).
    call(&s, "POST", "/v1/pools/p/acquire", None, Some(json!({"key":"k","holder":"session:x-c1"})))
        .err(409, "holder_reserved");
    let b = call(&s, "GET", "/v1/pools/p/bindings", None, None).ok();
    assert_eq!(b["bindings"][0]["holders"], json!([holder]), "{b}");
    assert_eq!(b["bindings"].as_array().map(Vec::len), Some(1), "{b}");
    // Other durable holders still work.
    call(&s, "POST", "/v1/pools/p/acquire", None, Some(json!({"key":"k","holder":"node-1"}))).ok();
    drop(s);

    let (tokens, tk) =
        tokens_file(dir.path(), &["w allocate file:w.token", "boss admin file:boss.token"]);
    let tokens = tokens.to_str().expect("utf-8").to_string();
    let s = start(dir.path(), &["--auth-tokens", &tokens]);
    let w = Some(token(&tk, "w"));
    let sess = call(&s, "POST", "/v1/sessions", w, Some(json!({"ttl":30}))).ok();
    let holder = sess["holder"].as_str().expect("holder").to_string();
    for op in ["acquire", "release"] {
        call(&s, "POST", &format!("/v1/pools/p/{op}"), w, Some(json!({"key":"k","holder":holder})))
            .err(409, "holder_reserved");
    }
}
