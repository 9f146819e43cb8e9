//! Crash consistency of the embedded store's file mode, with a real process and a real SIGKILL.
//!
//! The test re-runs its own binary as a child (selected by an environment variable). The child
//! opens a store file and writes txns as fast as it can; each txn writes three keys of its
//! counter `i` plus `last = i`, and after the txn returns the child prints `ACK i`. The parent
//! kills the child with SIGKILL mid-stream, reopens the file and checks that every acknowledged
//! txn is there and that no txn is torn (its three keys are present together or not at all).
//!
//! The second test does the same with 16 concurrent writers, whose txns the store commits in
//! groups (one redb commit for all txns queued meanwhile, `store/embedded/group.rs`): a kill in
//! the middle of a group must still lose no acknowledged txn and tear none, and every txn keeps
//! its own revision.

use std::collections::{BTreeMap, BTreeSet};
use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};

use idalloc::store::embedded::{EmbeddedOptions, EmbeddedStore};
use idalloc::store::{GetRequest, Store, TxnOp, TxnRequest};
use idalloc_testkit::procs::KillOnDrop;

const CHILD_ENV: &str = "IDALLOC_FILE_CRASH_CHILD";
const TEST_NAME: &str = "acknowledged_txns_survive_sigkill_and_none_is_torn";

fn txn_for(i: u64) -> TxnRequest {
    let v = i.to_string();
    TxnRequest::new().and_then([
        TxnOp::put(format!("c/{i:08}/a"), v.clone()),
        TxnOp::put(format!("c/{i:08}/b"), v.clone()),
        TxnOp::put(format!("c/{i:08}/c"), v.clone()),
        TxnOp::put("last", v),
    ])
}

/// The child: write forever, acknowledging each durable txn on stdout.
fn child(path: &str) {
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    rt.block_on(async {
        let store = EmbeddedStore::open(path, EmbeddedOptions::default()).await.unwrap();
        for i in 1.. {
            store.txn(txn_for(i)).await.unwrap();
            // Rust's stdout is line-buffered: the line is out when println returns.
            println!("ACK {i}");
        }
    });
}

#[test]
fn acknowledged_txns_survive_sigkill_and_none_is_torn() {
    if let Ok(path) = std::env::var(CHILD_ENV) {
        child(&path);
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("crash.redb");
    let exe = std::env::current_exe().unwrap();
    let mut child = KillOnDrop(
        Command::new(exe)
            .args([TEST_NAME, "--exact", "--nocapture", "--test-threads=1"])
            .env(CHILD_ENV, &path)
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .unwrap(),
    );
    let stdout = child.0.stdout.take().unwrap();
    let mut lines = BufReader::new(stdout).lines();
    let mut acked: Vec<u64> = Vec::new();
    // Let a good number of txns through, then kill while the child is mid-stream.
    while acked.len() < 300 {
        let line = lines.next().expect("child exited early").unwrap();
        if let Some(n) = line.strip_prefix("ACK ") {
            acked.push(n.parse().unwrap());
        }
    }
    child.0.kill().unwrap(); // SIGKILL, by PID
    let status = child.0.wait().unwrap();
    assert!(!status.success(), "child was killed");
    // Acks printed before the kill may still be in the pipe.
    for line in lines {
        let Ok(line) = line else { break };
        if let Some(n) = line.strip_prefix("ACK ") {
            acked.push(n.parse().unwrap());
        }
    }
    let max_acked = *acked.iter().max().unwrap();

    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    rt.block_on(async {
        let store = EmbeddedStore::open(&path, EmbeddedOptions::default()).await.unwrap();
        let r = store.get(GetRequest::prefix("c/")).await.unwrap();
        let mut parts: std::collections::BTreeMap<u64, BTreeSet<String>> = Default::default();
        for kv in &r.kvs {
            let key = String::from_utf8(kv.key.clone()).unwrap();
            let mut it = key.split('/').skip(1);
            let i: u64 = it.next().unwrap().parse().unwrap();
            assert_eq!(kv.value, i.to_string().into_bytes());
            parts.entry(i).or_default().insert(it.next().unwrap().to_string());
        }
        for (i, p) in &parts {
            assert_eq!(p.len(), 3, "txn {i} is torn: only {p:?} present");
        }
        for i in &acked {
            assert!(parts.contains_key(i), "acknowledged txn {i} lost");
        }
        // Txns are sequential: what survived is exactly 1..=n, with n >= the last ack (the txn
        // in flight at the kill may or may not have committed).
        let n = parts.len() as u64;
        assert!(n >= max_acked && n <= max_acked + 1, "survivors 1..={n}, last ack {max_acked}");
        assert_eq!(parts.keys().copied().collect::<Vec<_>>(), (1..=n).collect::<Vec<_>>());
        let last = store.get(GetRequest::key("last")).await.unwrap();
        assert_eq!(last.kvs[0].value, n.to_string().into_bytes());
        assert_eq!(last.revision, n as i64 + 1, "one revision per txn");
    });
}

const GROUP_CHILD_ENV: &str = "IDALLOC_FILE_CRASH_GROUP_CHILD";
const GROUP_TEST_NAME: &str = "concurrent_writers_acknowledged_txns_survive_sigkill_mid_group";
const WRITERS: u64 = 16;

fn group_txn(t: u64, i: u64) -> TxnRequest {
    let v = i.to_string();
    TxnRequest::new().and_then([
        TxnOp::put(format!("g/{t:02}/{i:08}/a"), v.clone()),
        TxnOp::put(format!("g/{t:02}/{i:08}/b"), v.clone()),
        TxnOp::put(format!("g/{t:02}/{i:08}/c"), v.clone()),
        TxnOp::put(format!("last/{t:02}"), v),
    ])
}

/// The child: `WRITERS` tasks write forever on a multi-thread runtime, each acknowledging its
/// durable txns on stdout as `ACK task i`.
fn group_child(path: &str) {
    let rt =
        tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    rt.block_on(async {
        let store = EmbeddedStore::open(path, EmbeddedOptions::default()).await.unwrap();
        let tasks: Vec<_> = (0..WRITERS)
            .map(|t| {
                let store = store.clone();
                tokio::spawn(async move {
                    for i in 1.. {
                        store.txn(group_txn(t, i)).await.unwrap();
                        // One `println!` writes its line under stdout's lock, whole.
                        println!("ACK {t} {i}");
                    }
                })
            })
            .collect();
        for t in tasks {
            t.await.unwrap();
        }
    });
}

/// `ACK t i` anywhere on the line: with `--nocapture` the first one may follow the test
/// harness's own "test NAME ... " on the same line.
fn parse_ack(line: &str) -> Option<(u64, u64)> {
    let mut it = line[line.find("ACK ")? + 4..].split(' ');
    Some((it.next()?.parse().ok()?, it.next()?.parse().ok()?))
}

#[test]
fn concurrent_writers_acknowledged_txns_survive_sigkill_mid_group() {
    if let Ok(path) = std::env::var(GROUP_CHILD_ENV) {
        group_child(&path);
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("crash.redb");
    let exe = std::env::current_exe().unwrap();
    let mut child = KillOnDrop(
        Command::new(exe)
            .args([GROUP_TEST_NAME, "--exact", "--nocapture", "--test-threads=1"])
            .env(GROUP_CHILD_ENV, &path)
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .unwrap(),
    );
    let stdout = child.0.stdout.take().unwrap();
    let mut lines = BufReader::new(stdout).lines();
    // Highest acknowledged txn per writer (each writer's txns are sequential).
    let mut acked: BTreeMap<u64, u64> = BTreeMap::new();
    let mut total = 0;
    while total < 1500 {
        let line = lines.next().expect("child exited early").unwrap();
        if let Some((t, i)) = parse_ack(&line) {
            let last = acked.entry(t).or_default();
            assert_eq!(i, *last + 1, "writer {t} acknowledges in order");
            *last = i;
            total += 1;
        }
    }
    child.0.kill().unwrap(); // SIGKILL, by PID, while 16 writers are mid-stream
    let status = child.0.wait().unwrap();
    assert!(!status.success(), "child was killed");
    for line in lines {
        let Ok(line) = line else { break };
        if let Some((t, i)) = parse_ack(&line) {
            let last = acked.entry(t).or_default();
            *last = (*last).max(i);
        }
    }
    assert!(acked.len() > 1, "several writers got acknowledgements: {acked:?}");

    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    rt.block_on(async {
        let store = EmbeddedStore::open(&path, EmbeddedOptions::default()).await.unwrap();
        let r = store.get(GetRequest::prefix("g/")).await.unwrap();
        // (writer, txn) -> parts present, and the revision each part was written at.
        let mut parts: BTreeMap<(u64, u64), BTreeSet<String>> = BTreeMap::new();
        let mut revs: BTreeMap<(u64, u64), BTreeSet<i64>> = BTreeMap::new();
        for kv in &r.kvs {
            let key = String::from_utf8(kv.key.clone()).unwrap();
            let f: Vec<&str> = key.split('/').collect();
            let (t, i): (u64, u64) = (f[1].parse().unwrap(), f[2].parse().unwrap());
            assert_eq!(kv.value, i.to_string().into_bytes());
            parts.entry((t, i)).or_default().insert(f[3].to_string());
            revs.entry((t, i)).or_default().insert(kv.mod_revision);
        }
        for (ti, p) in &parts {
            assert_eq!(p.len(), 3, "txn {ti:?} is torn: only {p:?} present");
        }
        let mut all_revs = BTreeSet::new();
        for (ti, r) in &revs {
            assert_eq!(r.len(), 1, "txn {ti:?} was written at one revision");
            assert!(all_revs.insert(*r.first().unwrap()), "txn {ti:?} shares a revision");
        }
        for t in 0..WRITERS {
            let survived: Vec<u64> =
                parts.keys().filter(|(w, _)| *w == t).map(|(_, i)| *i).collect();
            let n = survived.len() as u64;
            assert_eq!(survived, (1..=n).collect::<Vec<_>>(), "writer {t}: a gap");
            let last_ack = acked.get(&t).copied().unwrap_or(0);
            assert!(
                n >= last_ack && n <= last_ack + 1,
                "writer {t}: survivors 1..={n}, last ack {last_ack} (one txn may be in flight)"
            );
            if n > 0 {
                let last = store.get(GetRequest::key(format!("last/{t:02}"))).await.unwrap();
                assert_eq!(last.kvs[0].value, n.to_string().into_bytes());
            }
        }
        // One revision per txn, nothing else: revisions 2..=1+survivors.
        let survivors = parts.len() as i64;
        assert_eq!(r.revision, 1 + survivors, "one revision per surviving txn");
        assert_eq!(all_revs, (2..=1 + survivors).collect::<BTreeSet<i64>>());
    });
}
