//! `idalloc upgrade status|finalize` and the protocol in `idalloc version`: the cluster version
//! of a store (docs/guide/deployment.md, "Upgrades").

use std::process::Command;

fn run(args: &[&str]) -> (Option<i32>, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_idalloc"))
        .args(args)
        .env_remove("IDALLOC_STORE")
        .output()
        .expect("run");
    let text = |b: &[u8]| String::from_utf8_lossy(b).into_owned();
    (out.status.code(), text(&out.stdout), text(&out.stderr))
}

fn json(args: &[&str]) -> serde_json::Value {
    let (code, out, err) = run(args);
    assert_eq!(code, Some(0), "{args:?}: {err}");
    serde_json::from_str(&out).expect("JSON")
}

#[test]
fn a_store_without_a_version_record_is_at_version_one_until_finalized() {
    let dir = tempfile::tempdir().expect("tempdir");
    let file = format!("file:{}", dir.path().join("ids.redb").display());
    let (code, _, err) = run(&["--store", &file, "pool", "create", "p", "--range", "1-9"]);
    assert_eq!(code, Some(0), "{err}");

    let s = json(&["--store", &file, "--json", "upgrade", "status"]);
    assert_eq!((s["cluster_version"].as_u64(), s["recorded"].as_bool()), (Some(1), Some(false)));
    assert_eq!((s["protocol"].as_u64(), s["finalize_pending"].as_bool()), (Some(2), Some(true)));
    let (code, out, _) = run(&["--store", &file, "upgrade", "status"]);
    assert_eq!(code, Some(0));
    assert!(
        out.contains("cluster version: 1 (no record") && out.contains("upgrade finalize"),
        "{out}"
    );

    let f = json(&["--store", &file, "--json", "upgrade", "finalize"]);
    assert_eq!(
        (f["from"].as_u64(), f["to"].as_u64(), f["finalized"].as_bool()),
        (Some(1), Some(2), Some(true))
    );
    assert_eq!(f["grace_seconds"].as_u64(), Some(1200), "the default grace: {f}");
    let s = json(&["--store", &file, "--json", "upgrade", "status"]);
    assert_eq!(
        (s["cluster_version"].as_u64(), s["finalize_pending"].as_bool()),
        (Some(2), Some(false))
    );
    // During the grace the features of version 1 stay in force.
    assert_eq!(s["grace_seconds"].as_u64(), Some(1200), "{s}");
    assert!(!s["features"].as_array().unwrap().iter().any(|f| f == "fence-floor-fold"), "{s}");
    let again = json(&["--store", &file, "--json", "upgrade", "finalize"]);
    assert_eq!(again["finalized"].as_bool(), Some(false));

    // The store's other commands accept the record (no "records of another deployment").
    let (code, out, err) = run(&["--store", &file, "check"]);
    assert_eq!(code, Some(0), "{out}{err}");
    let (code, _, err) = run(&["--store", &file, "acquire", "p", "k"]);
    assert_eq!(code, Some(0), "{err}");
}

#[test]
fn version_reports_the_protocol_and_the_cluster_versions_it_runs_on() {
    let v = json(&["--json", "version"]);
    assert_eq!(v["protocol"].as_u64(), Some(2));
    assert_eq!(v["runs_on_cluster_versions"], serde_json::json!([1, 2]));
    let (_, out, _) = run(&["version"]);
    assert!(out.contains("protocol:   2 (runs on cluster versions 1 to 2)\n"), "{out}");
}

#[test]
fn upgrade_does_not_run_through_the_service() {
    let (code, _, err) = run(&["--server", "http://127.0.0.1:9", "upgrade", "status"]);
    assert_eq!(code, Some(2), "{err}");
    assert!(err.contains("not through --server"), "{err}");
}

/// `-o name` has no names to print for `upgrade`: refused before anything runs, so a finalize
/// asked that way does not move the version silently.
#[test]
fn upgrade_refuses_dash_o_name_and_finalizes_nothing() {
    let dir = tempfile::tempdir().expect("tempdir");
    let file = format!("file:{}", dir.path().join("ids.redb").display());
    let (code, _, err) = run(&["--store", &file, "pool", "create", "p", "--range", "1-9"]);
    assert_eq!(code, Some(0), "{err}");
    let (code, _, err) = run(&["--store", &file, "-o", "name", "upgrade", "finalize"]);
    assert_ne!(code, Some(0));
    assert!(err.contains("-o name"), "{err}");
    let s = json(&["--store", &file, "--json", "upgrade", "status"]);
    assert_eq!(s["cluster_version"].as_u64(), Some(1), "{s}");
}

/// `client_sessions` counts the client session records only, not the service's slot records
/// that share their prefix (`sessions/quota/`, `sessions/quota-pools/`).
#[test]
fn upgrade_status_counts_client_sessions_not_slot_records() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("ids.redb");
    let file = format!("file:{}", path.display());
    let (code, _, err) = run(&["--store", &file, "pool", "create", "p", "--range", "1-9"]);
    assert_eq!(code, Some(0), "{err}");
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    rt.block_on(async {
        use idalloc::store::embedded::{EmbeddedOptions, EmbeddedStore};
        use idalloc::store::{Store, TxnOp, TxnRequest};
        let l = idalloc::layout::Layout::default();
        let store = EmbeddedStore::open(&path, EmbeddedOptions::default()).await.unwrap();
        let mut slot = l.sessions_prefix();
        slot.extend_from_slice(b"quota/a/0");
        let mut pool_slot = l.sessions_prefix();
        pool_slot.extend_from_slice(b"quota-pools/a/0");
        let txn = TxnRequest::new().and_then([
            TxnOp::put(l.session_key(7), "s"),
            TxnOp::put(slot, "x"),
            TxnOp::put(pool_slot, "x"),
        ]);
        assert!(store.txn(txn).await.unwrap().succeeded);
    });
    drop(rt);
    let s = json(&["--store", &file, "--json", "upgrade", "status"]);
    assert_eq!(s["client_sessions"].as_u64(), Some(1), "{s}");
}

/// A shrink or a newly reserved ID is refused until the cluster version is finalized and its
/// grace is over, naming the step; growing is allowed meanwhile. The grace is a leased record of
/// the file store too: it ends across processes.
#[test]
fn narrowing_waits_for_finalize_and_its_grace() {
    let dir = tempfile::tempdir().expect("tempdir");
    let file = format!("file:{}", dir.path().join("ids.redb").display());
    let (code, _, err) = run(&["--store", &file, "pool", "create", "p", "--range", "1-9"]);
    assert_eq!(code, Some(0), "{err}");
    for narrow in [&["--range", "1-5"][..], &["--range", "1-9", "--reserve", "3"]] {
        let args = [&["--store", &file, "pool", "resize", "p"][..], narrow].concat();
        let (code, _, err) = run(&args);
        assert_eq!(code, Some(1), "{args:?}: {err}");
        assert!(err.contains("idalloc upgrade finalize") && err.contains("grace"), "{err}");
    }
    let (code, _, err) = run(&["--store", &file, "pool", "resize", "p", "--range", "1-20"]);
    assert_eq!(code, Some(0), "growing: {err}");

    let (code, _, err) = run(&["--store", &file, "upgrade", "finalize", "--grace", "8d"]);
    assert_eq!(code, Some(2), "not a duration the CLI takes: {err}");
    let (code, _, err) = run(&["--store", &file, "upgrade", "finalize", "--grace", "200h"]);
    assert!(code != Some(0) && err.contains("at most 7 days"), "{code:?} {err}");
    assert_eq!(json(&["--store", &file, "--json", "upgrade", "status"])["cluster_version"], 1);

    let f = json(&["--store", &file, "--json", "upgrade", "finalize", "--grace", "1s"]);
    assert_eq!((f["finalized"].as_bool(), f["grace_seconds"].as_u64()), (Some(true), Some(1)));
    let (code, out, _) = run(&["--store", &file, "upgrade", "status"]);
    assert!(code == Some(0) && out.contains("grace:           running"), "{out}");
    let (code, _, err) = run(&["--store", &file, "pool", "resize", "p", "--range", "1-5"]);
    assert!(code == Some(1) && err.contains("grace"), "during the grace: {err}");

    // Wait out the grace (the store ends it when its lease's deadline has passed).
    let mut s = json(&["--store", &file, "--json", "upgrade", "status"]);
    for _ in 0..100 {
        if s["grace_seconds"].is_null() {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(100));
        s = json(&["--store", &file, "--json", "upgrade", "status"]);
    }
    assert!(s["grace_seconds"].is_null(), "the grace ended: {s}");
    assert!(s["features"].as_array().unwrap().iter().any(|f| f == "fence-floor-fold"), "{s}");
    let (code, _, err) = run(&["--store", &file, "pool", "resize", "p", "--range", "1-5"]);
    assert_eq!(code, Some(0), "after the grace: {err}");
}

/// A store finalized past this build (cluster version 3, as a later release's finalize writes
/// it) is a downgrade: every command that opens a pool refuses it with exit 5 and one line
/// naming both versions, and writes nothing; `upgrade status` says so and `finalize` cannot
/// move the version back.
#[test]
fn a_store_finalized_past_this_build_is_refused() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("ids.redb");
    let file = format!("file:{}", path.display());
    let (code, _, err) = run(&["--store", &file, "pool", "create", "p", "--range", "1-9"]);
    assert_eq!(code, Some(0), "{err}");
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
    let store = rt.block_on(async {
        use idalloc::store::embedded::{EmbeddedOptions, EmbeddedStore};
        use idalloc::store::{Store, TxnOp, TxnRequest};
        let store = EmbeddedStore::open(&path, EmbeddedOptions::default()).await.expect("open");
        let l = idalloc::layout::Layout::new("idalloc").expect("layout");
        let put = TxnOp::put(l.cluster_version_key(), "3");
        store.txn(TxnRequest::new().and_then([put])).await.expect("write the version");
        store
    });
    drop(store);
    drop(rt);
    for args in [&["acquire", "p", "k"][..], &["get", "p", "k"], &["pool", "show", "p"]] {
        let args: Vec<&str> =
            ["--store", file.as_str()].into_iter().chain(args.iter().copied()).collect();
        let (code, out, err) = run(&args);
        assert_eq!(code, Some(1), "{args:?}: {out}{err}");
        assert!(err.contains("cluster version 3") && err.contains("protocol 2"), "{args:?}: {err}");
        assert_eq!(err.trim().lines().count(), 1, "one line: {err}");
    }
    let (code, out, _) = run(&["--store", &file, "upgrade", "status"]);
    assert_eq!(code, Some(1), "{out}");
    assert!(out.contains("cluster version: 3\n"), "{out}");
    assert!(out.contains("features:        unknown to this build"), "{out}");
    assert!(out.contains("refused:         store unavailable: cluster version 3"), "{out}");
    let (code, out, err) = run(&["--store", &file, "upgrade", "finalize"]);
    assert_eq!(code, Some(1), "no finalize from a newer version: {out}");
    assert!(err.contains("a finalized upgrade cannot be undone"), "{err}");
    let s = json(&["--store", &file, "--json", "pool", "list"]);
    assert!(s.to_string().contains("\"p\""), "the pool is still there: {s}");
}
