//! G6 with real processes: 10 `idalloc acquire` processes race for the last sixth of a pool, and
//! those that find it full fail with `Exhausted`, never `Unavailable` (which is kept for a store
//! that did not answer), on a file store and on etcd, with random and `lowest` pools, one key per
//! process or a `--from` batch of one.
//!
//! etcd: `IDALLOC_TEST_ETCD` if set, else a private etcd (see `idalloc_testkit::etcd`).

use std::io::Write;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use assert_cmd::cargo::CommandCargoExt;

/// Generous bound on one process: only there so a hang fails the test instead of blocking it.
const HARNESS_WAIT: Duration = Duration::from_secs(120);
const RACERS: usize = 10;
const ROUNDS: usize = 20;
/// IDs in each round's pool; 5/6 of them are taken before the race.
const SIZE: usize = 30;

struct Target {
    store: String,
    prefix: String,
    dir: tempfile::TempDir,
    _etcd: Option<idalloc_testkit::etcd::TestEtcd>,
}

impl Target {
    fn cmd(&self, args: &[&str]) -> Command {
        let mut c = Command::cargo_bin("idalloc").expect("the idalloc binary");
        c.current_dir(self.dir.path())
            .env("IDALLOC_STORE", &self.store)
            .env("IDALLOC_PREFIX", &self.prefix)
            .env("USER", "racer")
            .env_remove("RUST_LOG")
            .args(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        c
    }

    fn spawn(&self, args: &[&str], stdin: &str) -> Child {
        let mut child = self.cmd(args).spawn().expect("spawn idalloc");
        let mut input = child.stdin.take().expect("stdin");
        input.write_all(stdin.as_bytes()).expect("write stdin");
        drop(input);
        child
    }
}

fn wait(child: Child) -> std::process::Output {
    let pid = child.id();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(child.wait_with_output());
    });
    match rx.recv_timeout(HARNESS_WAIT) {
        Ok(out) => out.expect("wait"),
        Err(_) => {
            // The harness bound: the process this test started is killed by its own PID.
            let _ = Command::new("kill").arg("-9").arg(pid.to_string()).status();
            panic!("idalloc process {pid} did not finish within {HARNESS_WAIT:?}");
        }
    }
}

/// How each racer ended.
#[derive(Debug, Default)]
struct Tally {
    acquired: usize,
    exhausted: usize,
    other: Vec<String>,
}

fn race(t: &Target) {
    let mut total = Tally::default();
    for round in 0..ROUNDS {
        let pool = format!("full{round}");
        let range = format!("1-{SIZE}");
        let mut create = vec!["pool", "create", &pool, "--range", &range];
        if round % 2 == 1 {
            create.extend(["--strategy", "lowest"]);
        }
        let out = wait(t.spawn(&create, ""));
        assert!(out.status.success(), "{out:?}");
        let taken = SIZE * 5 / 6;
        let keys: String = (0..taken).map(|i| format!("pre-{i}\n")).collect();
        let out = wait(t.spawn(&["acquire", &pool, "--from", "-", "--holder", "pre"], &keys));
        assert!(out.status.success(), "{out:?}");

        let racers: Vec<Child> = (0..RACERS)
            .map(|i| {
                let key = format!("race-{i}");
                let holder = format!("h{i}");
                if i % 2 == 0 {
                    t.spawn(&["acquire", &pool, &key, "--holder", &holder], "")
                } else {
                    t.spawn(&["acquire", &pool, "--from", "-", "--holder", &holder], &key)
                }
            })
            .collect();
        let mut tally = Tally::default();
        for child in racers {
            let out = wait(child);
            let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
            if out.status.success() {
                tally.acquired += 1;
            } else if stderr.contains("is exhausted") && !stderr.contains("may have been") {
                tally.exhausted += 1;
            } else {
                tally.other.push(stderr);
            }
        }
        assert_eq!(tally.acquired, SIZE - taken, "round {round}: {tally:?}");
        assert_eq!(tally.exhausted, RACERS - (SIZE - taken), "round {round}: {tally:?}");
        total.acquired += tally.acquired;
        total.exhausted += tally.exhausted;
    }
    assert_eq!(total.exhausted, ROUNDS * (RACERS - SIZE / 6), "{total:?}");
}

#[test]
fn file_store_racers_into_a_full_pool_get_exhausted() {
    let dir = tempfile::tempdir().expect("tempdir");
    let store = format!("file:{}", dir.path().join("store.redb").display());
    race(&Target { store, prefix: "idalloc".into(), dir, _etcd: None });
}

#[test]
fn etcd_racers_into_a_full_pool_get_exhausted() {
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
    let Some(etcd) = rt.block_on(idalloc_testkit::etcd::test_etcd_endpoint()) else { return };
    static N: AtomicU64 = AtomicU64::new(0);
    let prefix = format!("fullpool-{}-{}", std::process::id(), N.fetch_add(1, Ordering::Relaxed));
    let dir = tempfile::tempdir().expect("tempdir");
    race(&Target { store: etcd.endpoint(), prefix, dir, _etcd: Some(etcd) });
}
