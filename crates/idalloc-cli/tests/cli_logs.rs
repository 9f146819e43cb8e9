//! What `idalloc` says to operators: under `--log-format json` every line `serve` prints (stdout
//! and stderr) is JSON, and a command that got no answer names its store, the time it waited and,
//! for a host name that does not resolve, the DNS failure.

mod common;

use std::io::{BufRead, BufReader, Read};
use std::process::{Command, Stdio};
use std::time::Duration;

use common::{plain_agent, request};
use idalloc_testkit::serve::listening_addr;

fn bin() -> &'static str {
    env!("CARGO_BIN_EXE_idalloc")
}

/// serve's whole output under `--log-format json`, from start to SIGTERM, after a request: each
/// line of stdout (the listening line included) and of stderr parses as a JSON object.
#[test]
fn every_line_of_serve_under_json_logs_is_json() {
    let dir = tempfile::tempdir().expect("tempdir");
    let store = format!("file:{}", dir.path().join("ids.redb").display());
    let child = Command::new(bin())
        .args(["--store", &store, "--log-format", "json", "serve", "--listen", "127.0.0.1:0"])
        .env("RUST_LOG", "info")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn serve");
    let mut guard = idalloc_testkit::procs::KillOnDrop(child);
    let child = &mut guard.0;
    let mut stdout = BufReader::new(child.stdout.take().expect("stdout"));
    let mut first = String::new();
    stdout.read_line(&mut first).expect("read the first line");
    let line: serde_json::Value = serde_json::from_str(first.trim())
        .unwrap_or_else(|e| panic!("the listening line is not JSON ({e}): {first:?}"));
    let addr = line["fields"]["addr"].as_str().expect("an addr field").to_string();
    assert_eq!(listening_addr(&first), Some(addr.as_str()));
    assert!(line["fields"]["message"].as_str().is_some_and(|m| m.contains(&addr)), "{line}");
    let agent = plain_agent(Duration::from_secs(10));
    let body = r#"{"name":"p","min":1,"max":10}"#;
    let r = request(&agent, "POST", &format!("http://{addr}/v1/pools"), None, Some(body));
    assert_eq!(r.expect("create a pool").status, 200);
    let ok = Command::new("kill").args(["-TERM", &child.id().to_string()]).status();
    assert!(ok.expect("kill").success());
    let mut rest = String::new();
    stdout.read_to_string(&mut rest).expect("read stdout");
    let mut err = String::new();
    child.stderr.take().expect("stderr").read_to_string(&mut err).expect("read stderr");
    let st = child.wait().expect("wait");
    assert_eq!(st.code(), Some(0), "{err}");
    assert!(!err.trim().is_empty(), "serve logs its start and shutdown at info");
    for (what, text) in [("stdout", &rest), ("stderr", &err)] {
        for l in text.lines().filter(|l| !l.trim().is_empty()) {
            let v: Result<serde_json::Value, _> = serde_json::from_str(l);
            assert!(v.is_ok_and(|v| v.is_object()), "{what}: not a JSON line: {l:?}");
        }
    }
}

/// A host that cannot resolve (`.invalid` never does, RFC 6761): the error names the host and
/// the DNS failure.
#[test]
fn an_unresolvable_etcd_host_is_named_as_a_dns_failure() {
    let out = Command::new(bin())
        .args(["--store", "etcd://no-such-host.invalid:2379", "--timeout", "1s", "get", "p", "k"])
        .output()
        .expect("run idalloc");
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(5), "{err}");
    // Whichever bound ran out first (the command's attempt, or etcd's own request timeout,
    // which probes the endpoint), the line names the host and says DNS.
    assert!(err.contains("cannot resolve no-such-host.invalid"), "{err}");
    assert!(err.contains("(DNS lookup failed: "), "{err}");
    assert_eq!(err.lines().count(), 1, "{err}");
}
