//! Every past format of the embedded store file opens with today's build. The fixtures
//! (`tests/fixtures/file-format-N.redb`) were written by the builds that wrote format N, with
//! `scripts/make-format-fixtures.sh` (which says what each holds): two pools, reserved IDs,
//! durable references of several holders, a key and a holder that need escaping, a released key
//! whose ID is a tombstone in its reuse delay, a holder fence record, and leased references of a
//! client session of `serve`.
//!
//! Each test works on a copy in a temporary directory. The leases in a fixture carry wall-clock
//! deadlines from the day it was written; [`renew_leases`] moves them to now + TTL, as a process
//! reopening the file right after would see them, so that the references and the tombstone on
//! them can be checked; `expired_leases_of_a_past_format_expire_at_open` moves them to the past.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::{SystemTime, UNIX_EPOCH};

use assert_cmd::Command;
use idalloc::layout::TOMBSTONE_MARK;
use idalloc::store::embedded::{EmbeddedOptions, EmbeddedStore};
use idalloc::store::{GetRequest, Store, StoreError, TxnOp, TxnRequest};
use redb::{Database, ReadableDatabase, ReadableTable, TableDefinition};
use serde_json::Value;

const LEASES: TableDefinition<i64, (i64, i64)> = TableDefinition::new("leases");
const META: TableDefinition<&str, i64> = TableDefinition::new("meta");

/// The formats with a fixture: every format any build has written.
const FORMATS: [i64; 2] = [1, 2];

/// Today's format (the `idalloc version` line names it).
const CURRENT_FORMAT: i64 = 2;

/// The records every fixture holds under `idalloc/` (the session record of format 2 aside), as
/// `name -> value`, with `S` for the client session's holder name and `(leased)` after the value
/// of a record on a lease. Pool specs are checked through `pool show`.
const EXPECTED: &[(&str, &str)] = &[
    ("data/fx/holder/dave", ""),
    ("data/fx/id/1", "alpha"),
    ("data/fx/id/2", "beta"),
    ("data/fx/id/3", "a/b %c"),
    ("data/fx/id/4", "<tombstone>gone (leased)"),
    ("data/fx/id/6", "leased"),
    ("data/fx/key/a%2Fb %25c", "3"),
    ("data/fx/key/alpha", "1"),
    ("data/fx/key/beta", "2"),
    ("data/fx/key/leased", "6"),
    ("data/fx/ref/a%2Fb %25c/carol%2Fx", "3"),
    ("data/fx/ref/alpha/alice", "1"),
    ("data/fx/ref/beta/S", "2 (leased)"),
    ("data/fx/ref/beta/alice", "2"),
    ("data/fx/ref/beta/bob", "2"),
    ("data/fx/ref/leased/S", "6 (leased)"),
    ("data/fy/id/257", "k"),
    ("data/fy/key/k", "257"),
    ("data/fy/ref/k/alice", "257"),
    ("pools/fx", "<spec>"),
    ("pools/fy", "<spec>"),
];

fn fixture(format: i64) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join(format!("tests/fixtures/file-format-{format}.redb"))
}

/// A copy of the fixture in a fresh temporary directory.
fn copy(format: i64) -> (tempfile::TempDir, PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("store.redb");
    std::fs::copy(fixture(format), &path).unwrap();
    (dir, path)
}

fn now_ms() -> i64 {
    SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_millis() as i64
}

/// Moves every lease's deadline to now + its TTL (both formats keep leases in one table, `id ->
/// (ttl seconds, deadline as unix ms)`). Returns how many leases the file has.
fn renew_leases(path: &Path) -> usize {
    set_deadlines(path, |ttl| now_ms() + ttl * 1000)
}

/// Moves every lease's deadline to a second ago, as if the file had been closed for longer than
/// any TTL.
fn expire_leases(path: &Path) -> usize {
    set_deadlines(path, |_| now_ms() - 1000)
}

fn set_deadlines(path: &Path, deadline: impl Fn(i64) -> i64) -> usize {
    let db = Database::open(path).unwrap();
    let w = db.begin_write().unwrap();
    let n;
    {
        let mut t = w.open_table(LEASES).unwrap();
        let leases: Vec<(i64, i64)> = t
            .iter()
            .unwrap()
            .map(|row| {
                let (id, v) = row.unwrap();
                (id.value(), v.value().0)
            })
            .collect();
        n = leases.len();
        for (id, ttl) in leases {
            t.insert(id, (ttl, deadline(ttl))).unwrap();
        }
    }
    w.commit().unwrap();
    n
}

/// The format number the file says it has.
fn format_of(path: &Path) -> i64 {
    let db = Database::open(path).unwrap();
    let r = db.begin_read().unwrap();
    let t = r.open_table(META).unwrap();
    let v = t.get("format_version").unwrap().expect("format_version").value();
    v
}

fn rt() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap()
}

/// Every record under `idalloc/`, rendered as [`EXPECTED`] has them, and the session records
/// (`sessions/…`, opaque) apart; the session holder's name is replaced by `S`.
async fn records(store: &EmbeddedStore) -> (BTreeMap<String, String>, Vec<String>) {
    let resp = store.get(GetRequest::prefix("idalloc/")).await.unwrap();
    let known = ["alice", "bob", "carol%2Fx", "dave"];
    let mut out = BTreeMap::new();
    let mut sessions = Vec::new();
    for kv in &resp.kvs {
        let name = String::from_utf8(kv.key.clone()).unwrap();
        let name = name.strip_prefix("idalloc/").unwrap().to_string();
        if name.starts_with("sessions/") {
            sessions.push(name);
            continue;
        }
        let name = match name.rsplit_once('/') {
            Some((head, holder)) if name.contains("/ref/") && !known.contains(&holder) => {
                format!("{head}/S")
            }
            _ => name,
        };
        let mut value = if name.starts_with("pools/") {
            assert!(kv.value.starts_with(b"{"), "{name}: {:?}", kv.value);
            "<spec>".to_string()
        } else if kv.value.first() == Some(&TOMBSTONE_MARK) {
            format!("<tombstone>{}", String::from_utf8(kv.value[1..].to_vec()).unwrap())
        } else {
            String::from_utf8(kv.value.clone()).unwrap()
        };
        if kv.lease != 0 {
            value.push_str(" (leased)");
        }
        out.insert(name, value);
    }
    (out, sessions)
}

fn expected() -> BTreeMap<String, String> {
    EXPECTED.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()
}

fn idalloc(path: &Path, args: &[&str]) -> assert_cmd::assert::Assert {
    let store = format!("file:{}", path.display());
    Command::cargo_bin("idalloc").unwrap().args(["--store", &store]).args(args).assert()
}

fn json(a: &assert_cmd::assert::Assert) -> Value {
    serde_json::from_slice(&a.get_output().stdout).unwrap()
}

/// `list fx` as `(id, key, holders)` with the session holder as `S`.
fn bindings(path: &Path) -> Vec<(u64, String, Vec<String>)> {
    let out = json(&idalloc(path, &["--json", "list", "fx"]).success());
    let rows = out.as_array().or_else(|| out["bindings"].as_array()).expect("bindings");
    rows.iter()
        .map(|b| {
            let holders = b["holders"]
                .as_array()
                .unwrap()
                .iter()
                .map(|h| h.as_str().unwrap())
                .map(|h| if ["alice", "bob", "carol/x"].contains(&h) { h } else { "S" })
                .map(str::to_string)
                .collect();
            (b["id"].as_u64().unwrap(), b["key"].as_str().unwrap().to_string(), holders)
        })
        .collect()
}

fn strings(v: &[&str]) -> Vec<String> {
    v.iter().map(|s| s.to_string()).collect()
}

#[test]
fn every_past_format_opens_read_only_unchanged_with_every_record() {
    for format in FORMATS {
        let (_dir, path) = copy(format);
        assert_eq!(format_of(&path), format, "the fixture of format {format} says another");
        assert!(renew_leases(&path) >= 2, "format {format}: the quarantine and session leases");
        rt().block_on(async {
            let opts = EmbeddedOptions::builder().read_only(true).build().unwrap();
            let store = EmbeddedStore::open(&path, opts).await.unwrap();
            let (recs, sessions) = records(&store).await;
            assert_eq!(recs, expected(), "format {format}");
            // Shared client sessions (format 2's build has them) keep one record on their lease.
            assert_eq!(sessions.len(), usize::from(format >= 2), "format {format}: {sessions:?}");
            let write = TxnRequest::new().and_then([TxnOp::put("idalloc/x", "1")]);
            match store.txn(write).await {
                Err(StoreError::ReadOnly { .. }) => {}
                other => panic!("format {format}: a write to a read-only store: {other:?}"),
            }
        });
        assert_eq!(format_of(&path), format, "a read-only open changed the file's format");
    }
}

#[test]
fn every_past_format_opens_writable_migrated_and_check_finds_it_clean() {
    for format in FORMATS {
        let (_dir, path) = copy(format);
        renew_leases(&path);
        // `check` is the first writable open: it migrates, audits every pool and finds nothing.
        let out = json(&idalloc(&path, &["--json", "check"]).success());
        assert_eq!(out["breaches"], 0, "format {format}: {out}");
        assert_eq!(format_of(&path), CURRENT_FORMAT, "format {format} was not migrated");
        rt().block_on(async {
            let store = EmbeddedStore::open(&path, EmbeddedOptions::default()).await.unwrap();
            assert_eq!(records(&store).await.0, expected(), "format {format} after migration");
        });
        assert_eq!(
            bindings(&path),
            vec![
                (1, "alpha".into(), strings(&["alice"])),
                (2, "beta".into(), strings(&["alice", "bob", "S"])),
                (3, "a/b %c".into(), strings(&["carol/x"])),
                (6, "leased".into(), strings(&["S"])),
            ],
            "format {format}"
        );
        let fx = json(&idalloc(&path, &["--json", "pool", "show", "fx"]).success());
        assert_eq!(fx["spec"]["reserved"], serde_json::json!([[5, 5], [7, 9]]), "{fx}");
        assert_eq!(fx["spec"]["reuse_delay_ms"], 720 * 3_600_000u64, "{fx}");
        assert_eq!((&fx["bound"], &fx["quarantined"]), (&4.into(), &1.into()), "{fx}");
        let fy = json(&idalloc(&path, &["--json", "pool", "show", "fy"]).success());
        assert_eq!(fy["spec"]["prefix"], 0x100, "format {format}: {fy}");
        // The next free ID by the lowest strategy skips the bindings, the tombstone in its reuse
        // delay (4) and the reserved IDs (5, 7-9).
        let got = idalloc(&path, &["acquire", "fx", "new", "--holder", "eve"]).success();
        assert_eq!(String::from_utf8_lossy(&got.get_output().stdout).trim(), "10");
        let got = idalloc(&path, &["acquire", "fy", "k2", "--holder", "bob"]).success();
        assert_eq!(String::from_utf8_lossy(&got.get_output().stdout).trim(), "258");
        let out = json(&idalloc(&path, &["--json", "check"]).success());
        assert_eq!(out["breaches"], 0, "format {format}: {out}");
    }
}

/// Leases whose deadline passed while the file was closed expire at open: the leased references
/// and the tombstone go, the durable records stay, and the tombstone's ID is free again.
#[test]
fn expired_leases_of_a_past_format_expire_at_open() {
    for format in FORMATS {
        let (_dir, path) = copy(format);
        assert!(expire_leases(&path) >= 2, "format {format}: the quarantine and session leases");
        rt().block_on(async {
            let store = EmbeddedStore::open(&path, EmbeddedOptions::default()).await.unwrap();
            let (recs, sessions) = records(&store).await;
            let durable: BTreeMap<String, String> =
                expected().into_iter().filter(|(_, v)| !v.ends_with("(leased)")).collect();
            assert_eq!(recs, durable, "format {format}");
            assert!(sessions.is_empty(), "format {format}: {sessions:?}");
        });
        let got = idalloc(&path, &["acquire", "fx", "new", "--holder", "eve"]).success();
        assert_eq!(String::from_utf8_lossy(&got.get_output().stdout).trim(), "4");
        let out = json(&idalloc(&path, &["--json", "check"]).success());
        assert_eq!(out["breaches"], 0, "format {format}: {out}");
    }
}
