//! Crash consistency of the embedded store's file mode, with a real process and a real SIGKILL.
//!
//! The test re-runs its own binary as a child (selected by an environment variable). The child
//! opens a store file and writes txns as fast as it can; each txn writes three keys of its
//! counter `i` plus `last = i`, and after the txn returns the child prints `ACK i`. The parent
//! kills the child with SIGKILL mid-stream, reopens the file and checks that every acknowledged
//! txn is there and that no txn is torn (its three keys are present together or not at all).

use std::collections::BTreeSet;
use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};

use idalloc::store::embedded::{EmbeddedOptions, EmbeddedStore};
use idalloc::store::{GetRequest, Store, TxnOp, TxnRequest};

const CHILD_ENV: &str = "IDALLOC_FILE_CRASH_CHILD";
const TEST_NAME: &str = "acknowledged_txns_survive_sigkill_and_none_is_torn";

/// Kills and reaps the child however the test ends.
struct KillOnDrop(Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

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
