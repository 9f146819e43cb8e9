//! `--remote NAME=URL` with the real binary: two clusters, each its own etcd server on loopback
//! (started here, stopped by PID on drop), with their own prefix bits; plus a file store as the
//! remote whose ID space overlaps, which must be refused.

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};

use assert_cmd::cargo::CommandCargoExt;
use serde_json::Value;

struct Ran {
    code: i32,
    stdout: String,
    stderr: String,
}

fn run(store: &str, args: &[&str]) -> Ran {
    let out = Command::cargo_bin("idalloc")
        .expect("binary")
        .env("IDALLOC_STORE", store)
        .env("USER", "alice")
        .env_remove("IDALLOC_PREFIX")
        .env_remove("RUST_LOG")
        .args(args)
        .output()
        .expect("run idalloc");
    let r = Ran {
        code: out.status.code().unwrap_or(-1),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    };
    eprintln!("idalloc {args:?} -> {} {:?} {:?}", r.code, r.stdout, r.stderr);
    r
}

fn ok(store: &str, args: &[&str]) -> String {
    let r = run(store, args);
    assert_eq!((r.code, r.stderr.as_str()), (0, ""), "idalloc {args:?}");
    r.stdout
}

fn id(store: &str, args: &[&str]) -> u64 {
    ok(store, args).trim().parse().expect("an ID")
}

fn servers() -> Option<(idalloc_testkit::etcd::EtcdServer, idalloc_testkit::etcd::EtcdServer)> {
    if !idalloc_testkit::etcd::etcd_on_path() {
        assert!(std::env::var("CI").map_or(true, |v| v != "true"), "etcd missing under CI");
        eprintln!("SKIPPED: etcd is not on PATH");
        return None;
    }
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("rt");
    rt.block_on(async {
        let a = idalloc_testkit::etcd::EtcdServer::start().await.expect("etcd a");
        let b = idalloc_testkit::etcd::EtcdServer::start().await.expect("etcd b");
        Some((a, b))
    })
}

#[test]
fn get_lookup_list_and_watch_answer_across_two_etcd_clusters() {
    let Some((ea, eb)) = servers() else { return };
    let (a, b) = (ea.endpoint(), eb.endpoint());
    let remote_b = format!("b={}", b.replace("http://", "etcd://"));
    ok(&a, &["pool", "create", "ids", "--range", "1-65535", "--prefix-bits", "0x10000"]);
    ok(&b, &["pool", "create", "ids", "--range", "1-65535", "--prefix-bits", "0x20000"]);
    let a_only = id(&a, &["acquire", "ids", "a-only"]);
    let a_shared = id(&a, &["acquire", "ids", "shared"]);
    let b_only = id(&b, &["acquire", "ids", "b-only"]);
    let b_shared = id(&b, &["acquire", "ids", "shared"]);

    // get: one line per cluster that has the key, local first.
    assert_eq!(
        ok(&a, &["get", "ids", "shared", "--remote", &remote_b]),
        format!("local\t{a_shared}\nb\t{b_shared}\n")
    );
    assert_eq!(ok(&a, &["get", "ids", "b-only", "--remote", &remote_b]), format!("b\t{b_only}\n"));
    let j: Value =
        serde_json::from_str(&ok(&a, &["--json", "get", "ids", "shared", "--remote", &remote_b]))
            .expect("json");
    assert_eq!(j["id"], a_shared);
    assert_eq!(j["clusters"][1], serde_json::json!({"cluster": "b", "id": b_shared}));
    let miss = run(&a, &["get", "ids", "nowhere", "--remote", &remote_b]);
    assert_eq!(miss.code, 3);
    assert!(miss.stderr.contains("any cluster"), "{}", miss.stderr);

    // lookup: the ID's prefix bits pick the cluster.
    assert_eq!(
        ok(&a, &["lookup", "ids", &b_only.to_string(), "--remote", &remote_b]),
        "b\tb-only\n"
    );
    assert_eq!(
        ok(&a, &["lookup", "ids", &a_only.to_string(), "--remote", &remote_b]),
        "local\ta-only\n"
    );
    let j: Value = serde_json::from_str(&ok(
        &a,
        &["--json", "lookup", "ids", &b_shared.to_string(), "--remote", &remote_b],
    ))
    .expect("json");
    assert_eq!((j["cluster"].as_str(), j["key"].as_str()), (Some("b"), Some("shared")));

    // list: every binding of both clusters, named.
    let j: Value = serde_json::from_str(&ok(&a, &["--json", "list", "ids", "--remote", &remote_b]))
        .expect("json");
    let mut rows: Vec<(String, u64, String)> = j["bindings"]
        .as_array()
        .expect("bindings")
        .iter()
        .map(|b| {
            (
                b["cluster"].as_str().expect("cluster").to_string(),
                b["id"].as_u64().expect("id"),
                b["key"].as_str().expect("key").to_string(),
            )
        })
        .collect();
    rows.sort();
    let mut want = vec![
        ("local".to_string(), a_only, "a-only".to_string()),
        ("local".to_string(), a_shared, "shared".to_string()),
        ("b".to_string(), b_only, "b-only".to_string()),
        ("b".to_string(), b_shared, "shared".to_string()),
    ];
    want.sort();
    assert_eq!(rows, want);
    let table = ok(&a, &["list", "ids", "--remote", &remote_b]);
    assert!(table.starts_with("CLUSTER"), "{table}");
    assert!(table.lines().any(|l| l.starts_with('b') && l.contains("b-only")), "{table}");

    // watch: synced per cluster, then changes of either cluster, named.
    let mut child = Command::cargo_bin("idalloc")
        .expect("binary")
        .env("IDALLOC_STORE", &a)
        .env_remove("IDALLOC_PREFIX")
        .env_remove("RUST_LOG")
        .args(["--json", "watch", "ids", "--count", "2", "--remote", &remote_b])
        .stdout(Stdio::piped())
        .spawn()
        .expect("spawn watch");
    let mut out = BufReader::new(child.stdout.take().expect("stdout"));
    let mut synced = Vec::new();
    while synced.len() < 2 {
        let mut line = String::new();
        assert!(out.read_line(&mut line).expect("read") > 0, "watch ended early");
        let v: Value = serde_json::from_str(&line).expect("json line");
        assert_eq!(v["event"], "synced", "{line}");
        synced.push((v["cluster"].as_str().expect("cluster").to_string(), v["bindings"].as_u64()));
    }
    synced.sort();
    assert_eq!(synced, vec![("b".to_string(), Some(2)), ("local".to_string(), Some(2))]);
    let b_new = id(&b, &["acquire", "ids", "b-new"]);
    let a_new = id(&a, &["acquire", "ids", "a-new"]);
    let mut changes = Vec::new();
    for _ in 0..2 {
        let mut line = String::new();
        assert!(out.read_line(&mut line).expect("read") > 0, "watch ended early");
        let v: Value = serde_json::from_str(&line).expect("json line");
        changes.push((
            v["event"].as_str().expect("event").to_string(),
            v["cluster"].as_str().expect("cluster").to_string(),
            v["id"].as_u64().expect("id"),
        ));
    }
    changes.sort();
    assert_eq!(
        changes,
        vec![("upsert".into(), "b".into(), b_new), ("upsert".into(), "local".into(), a_new)]
    );
    let status = child.wait().expect("wait");
    assert_eq!(status.code(), Some(0));
}

#[test]
fn a_remote_with_overlapping_prefix_bits_is_refused() {
    let dir = tempfile::tempdir().expect("dir");
    let a = format!("file:{}", dir.path().join("a.redb").display());
    let b = format!("file:{}", dir.path().join("b.redb").display());
    ok(&a, &["pool", "create", "ids", "--range", "1-65535", "--prefix-bits", "0x10000"]);
    ok(&b, &["pool", "create", "ids", "--range", "1-65535", "--prefix-bits", "0x10000"]);
    let k = id(&b, &["acquire", "ids", "k"]);
    let remote = format!("twin={b}");
    let r = run(&a, &["get", "ids", "k", "--remote", &remote]);
    assert_eq!(r.code, 2, "{}", r.stderr);
    assert!(r.stdout.is_empty());
    assert!(
        r.stderr.starts_with("error: --remote twin:") && r.stderr.contains("overlap"),
        "{}",
        r.stderr
    );
    // With distinct prefix bits the same file answers (file stores work as remotes too).
    let c = format!("file:{}", dir.path().join("c.redb").display());
    ok(&c, &["pool", "create", "ids", "--range", "1-65535", "--prefix-bits", "0x20000"]);
    let kc = id(&c, &["acquire", "ids", "k"]);
    assert_eq!(
        ok(&c, &["get", "ids", "k", "--remote", &remote]),
        format!("local\t{kc}\ntwin\t{k}\n")
    );
    // Bad flags: one clear line, exit 2.
    let bad = run(&a, &["get", "ids", "k", "--remote", "no-equals-sign"]);
    assert_eq!(bad.code, 2);
    assert!(bad.stderr.contains("NAME=URL"), "{}", bad.stderr);
}

/// Reads one JSON line of a running `watch`.
fn json_line(out: &mut impl BufRead) -> Value {
    let mut line = String::new();
    assert!(out.read_line(&mut line).expect("read") > 0, "watch ended early");
    serde_json::from_str(&line).unwrap_or_else(|e| panic!("not a JSON line: {line:?}: {e}"))
}

/// A remote of more bindings than a subscriber's event buffer (4,096) made
/// `watch --remote` print `lagged` (without a cluster), thousands of `upsert` lines, `lagged`
/// again, then `synced`. The initial listing must come as `synced b N`, then changes only, every
/// line naming its cluster.
#[test]
fn watch_of_a_remote_larger_than_the_event_buffer_starts_with_synced() {
    let Some((ea, eb)) = servers() else { return };
    let (a, b) = (ea.endpoint(), eb.endpoint());
    let remote_b = format!("b={}", b.replace("http://", "etcd://"));
    ok(&a, &["pool", "create", "ids", "--range", "1-65535", "--prefix-bits", "0x10000"]);
    ok(&b, &["pool", "create", "ids", "--range", "1-65535", "--prefix-bits", "0x20000"]);
    const N: usize = 5_000;
    let dir = tempfile::tempdir().expect("dir");
    let keys = dir.path().join("keys");
    std::fs::write(&keys, (0..N).map(|i| format!("k{i}\n")).collect::<String>()).expect("keys");
    let acquired = ok(&b, &["acquire", "ids", "--from", keys.to_str().expect("path")]);
    assert_eq!(acquired.lines().count(), N);
    let a_one = id(&a, &["acquire", "ids", "a-one"]);

    let mut child = Command::cargo_bin("idalloc")
        .expect("binary")
        .env("IDALLOC_STORE", &a)
        .env_remove("IDALLOC_PREFIX")
        .env_remove("RUST_LOG")
        .args(["--json", "watch", "ids", "--count", "1", "--remote", &remote_b])
        .stdout(Stdio::piped())
        .spawn()
        .expect("spawn watch");
    let mut out = BufReader::new(child.stdout.take().expect("stdout"));
    let mut synced = Vec::new();
    while synced.len() < 2 {
        let v = json_line(&mut out);
        assert_eq!(v["event"], "synced", "{v}");
        synced.push((v["cluster"].as_str().expect("cluster").to_string(), v["bindings"].as_u64()));
    }
    synced.sort();
    assert_eq!(synced, vec![("b".to_string(), Some(N as u64)), ("local".to_string(), Some(1))]);
    let b_new = id(&b, &["acquire", "ids", "b-new"]);
    let v = json_line(&mut out);
    assert_eq!(
        (v["event"].as_str(), v["cluster"].as_str(), v["id"].as_u64()),
        (Some("upsert"), Some("b"), Some(b_new)),
        "{v}"
    );
    assert_ne!(b_new, a_one);
    let status = child.wait().expect("wait");
    assert_eq!(status.code(), Some(0));
}

/// A remote that is there but never answers, as a SIGSTOPped etcd looks to its clients: a TCP
/// listener on loopback that accepts every connection and never writes. Its thread and the held
/// connections live until the test process ends.
fn frozen_remote() -> String {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let addr = listener.local_addr().expect("addr");
    std::thread::spawn(move || {
        let mut held = Vec::new();
        for conn in listener.incoming() {
            match conn {
                Ok(c) => held.push(c),
                Err(_) => return,
            }
        }
    });
    format!("etcd://{addr}")
}

/// The seconds of "no answer after N.Ns" in a message.
fn waited(message: &str) -> f64 {
    let at = message.find("no answer after ").expect("the wait") + "no answer after ".len();
    let rest = &message[at..];
    rest[..rest.find('s').expect("seconds")].parse().expect("a number")
}

/// With one remote frozen, `lookup` of an ID the local pool's or a live
/// remote's prefix bits route elsewhere must answer (it failed with exit 1 after waiting for the
/// frozen remote's spec); an ID only the frozen remote could hold fails naming it and the time
/// really waited; `get`, which needs every cluster, fails the same way.
#[test]
fn lookup_routes_by_prefix_bits_past_a_frozen_remote() {
    let Some((ea, eb)) = servers() else { return };
    let (a, b) = (ea.endpoint(), eb.endpoint());
    let remote_b = format!("b={}", b.replace("http://", "etcd://"));
    let remote_c = format!("c={}", frozen_remote());
    ok(&a, &["pool", "create", "ids", "--range", "1-65535", "--prefix-bits", "0x10000"]);
    ok(&b, &["pool", "create", "ids", "--range", "1-65535", "--prefix-bits", "0x20000"]);
    let a_id = id(&a, &["acquire", "ids", "a-key"]).to_string();
    let b_id = id(&b, &["acquire", "ids", "b-key"]).to_string();
    let both = |args: &[&str]| {
        let mut v: Vec<String> = vec!["--timeout".into(), "3s".into()];
        v.extend(args.iter().map(|s| s.to_string()));
        v.extend(["--remote".into(), remote_b.clone(), "--remote".into(), remote_c.clone()]);
        run(&a, &v.iter().map(String::as_str).collect::<Vec<_>>())
    };

    // The local pool's prefix: no remote is asked.
    let r = both(&["lookup", "ids", &a_id]);
    assert_eq!((r.code, r.stdout.as_str()), (0, "local\ta-key\n"), "{}", r.stderr);
    // b's prefix: b answers, c is not waited for.
    let r = both(&["lookup", "ids", &b_id]);
    assert_eq!((r.code, r.stdout.as_str()), (0, "b\tb-key\n"), "{}", r.stderr);
    // An ID in no space that answered (c's space is unknown): the command needs c.
    let r = both(&["lookup", "ids", &((3u64 << 16) | 5).to_string()]);
    assert_eq!(r.code, 1, "{}", r.stderr);
    assert!(r.stderr.contains("--remote c: no answer after"), "{}", r.stderr);
    assert!(!r.stderr.contains("--remote b"), "b answered: {}", r.stderr);
    assert!(waited(&r.stderr) >= 3.0, "the message states the real wait: {}", r.stderr);
    // get asks every cluster.
    let r = both(&["get", "ids", "a-key"]);
    assert_eq!(r.code, 1, "{}", r.stderr);
    assert!(r.stderr.contains("--remote c: no answer after"), "{}", r.stderr);
    assert!(waited(&r.stderr) >= 3.0, "{}", r.stderr);
}
