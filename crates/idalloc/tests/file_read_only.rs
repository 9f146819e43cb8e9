//! A store file this process may not write: reads must work, and a write must
//! fail with a clear error naming the file and the reason, changing nothing.
//!
//! The file is made read-only by its mode (0444). Root may write any file, so when the test runs
//! as root (as CI does) the part that opens the file runs as a child process of this test binary
//! under the unprivileged uid/gid 65534 ("nobody"); otherwise it runs as the current user. A
//! second test leaves the file as a killed writer does, not closed cleanly.
//!
//! The child must be able to reach what it runs and opens wherever the checkout lies: under a
//! directory other users cannot enter (a clone in root's home, or in a 0700
//! `mktemp -d`), "nobody" can execute neither the test binary where cargo built it nor anything
//! beside it. So each test makes its own directory every user can enter ([`world_dir`]), puts the
//! store file there and runs a copy of this test binary from there.

use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::Command;

use idalloc::store::embedded::{EmbeddedOptions, EmbeddedStore};
use idalloc::store::{GetRequest, Store, StoreError, TxnOp, TxnRequest};

const CHILD_ENV: &str = "IDALLOC_READ_ONLY_CHILD";
const TEST_NAME: &str = "read_only_store_file_serves_reads_and_refuses_writes";
const NOBODY: u32 = 65534;

fn rt() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap()
}

/// The part that runs without write permission: prints what it saw, one fact a line.
fn child(path: &str) {
    rt().block_on(async {
        let store = EmbeddedStore::open(path, EmbeddedOptions::default())
            .await
            .unwrap_or_else(|e| panic!("OPEN FAILED: {e}"));
        let a = store.get(GetRequest::key("k/a")).await.unwrap();
        println!("GET k/a={}", String::from_utf8_lossy(&a.kvs[0].value));
        let all = store.get(GetRequest::prefix("k/")).await.unwrap();
        println!("LIST {} at {}", all.count, all.revision);
        match store.txn(TxnRequest::new().and_then([TxnOp::put("k/c", "3")])).await {
            Err(e @ StoreError::ReadOnly { .. }) => println!("WRITE REFUSED: {e}"),
            other => println!("WRITE UNEXPECTED: {other:?}"),
        }
        let again = store.get(GetRequest::prefix("k/")).await.unwrap();
        println!("LIST AFTER {} at {}", again.count, again.revision);
    });
}

/// The writer that leaves the file without closing it (as a killed process does): writes, then
/// exits with the store open.
fn unclean_writer(path: &str) {
    rt().block_on(async {
        let s = EmbeddedStore::open(path, EmbeddedOptions::default()).await.unwrap();
        s.txn(TxnRequest::new().and_then([TxnOp::put("k/a", "1"), TxnOp::put("k/b", "2")]))
            .await
            .unwrap(); // revision 2
        std::mem::forget(s);
    });
    std::process::exit(0);
}

/// True if every user may enter `dir` and each directory above it (the "x" bit for others).
fn enterable_by_all(dir: &Path) -> bool {
    dir.ancestors().all(|a| std::fs::metadata(a).is_ok_and(|m| m.mode() & 0o001 != 0))
}

/// A fresh directory every user can enter (mode 0755): in the temporary directory if everyone
/// can reach it, else in `/tmp`.
fn world_dir() -> tempfile::TempDir {
    let base = [std::env::temp_dir(), PathBuf::from("/tmp")]
        .into_iter()
        .find(|d| enterable_by_all(d))
        .expect("neither $TMPDIR nor /tmp can be entered by every user");
    let dir = tempfile::tempdir_in(base).unwrap();
    perms(dir.path(), 0o755);
    dir
}

/// Runs this test binary as a child in `mode` on `path` (as "nobody" if `nobody`). The child
/// runs a copy placed beside the store file (in a [`world_dir`]), not the binary where cargo
/// built it, which "nobody" may not be able to reach.
fn run_child(test: &str, mode: &str, path: &Path, nobody: bool) -> std::process::Output {
    let exe = path.with_file_name("test-binary");
    if !exe.exists() {
        std::fs::copy(std::env::current_exe().unwrap(), &exe).unwrap();
        perms(&exe, 0o755);
    }
    let mut cmd = Command::new(&exe);
    cmd.args([test, "--exact", "--nocapture", "--test-threads=1"])
        .env(CHILD_ENV, format!("{mode}:{}", path.display()));
    if nobody {
        cmd.uid(NOBODY).gid(NOBODY);
    }
    // The copy was written through a file descriptor; a child that another test thread forks
    // while that descriptor is open holds it until its own exec, and exec of a file open for
    // writing fails with ETXTBSY. The window is short, so retry (as Go's os/exec tests do).
    let mut busy = 0;
    loop {
        match cmd.output() {
            Err(e) if e.kind() == std::io::ErrorKind::ExecutableFileBusy && busy < 200 => {
                busy += 1;
                std::thread::sleep(std::time::Duration::from_millis(10));
            }
            r => return r.unwrap_or_else(|e| panic!("running {}: {e}", exe.display())),
        }
    }
}

/// Dispatches a child run; false if this is the parent.
fn as_child() -> bool {
    let Ok(arg) = std::env::var(CHILD_ENV) else { return false };
    match arg.split_once(':') {
        Some(("read", path)) => child(path),
        Some(("write", path)) => unclean_writer(path),
        _ => panic!("bad {CHILD_ENV}: {arg}"),
    }
    true
}

fn perms(p: &Path, mode: u32) {
    std::fs::set_permissions(p, std::fs::Permissions::from_mode(mode)).unwrap()
}

/// Makes the file read-only for the reader, runs it, checks what it saw.
fn check_reader(test: &str, dir: &Path, path: &Path, unclean: bool) {
    perms(path, 0o444);
    perms(dir, 0o755);
    let root = std::fs::metadata(path).unwrap().uid() == 0;
    let out = run_child(test, "read", path, root);
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "reader failed\nstdout:\n{stdout}\nstderr:\n{stderr}");
    assert!(stdout.contains("GET k/a=1"), "{stdout}");
    assert!(stdout.contains("LIST 2 at 2"), "{stdout}");
    let refused = stdout
        .lines()
        .find_map(|l| l.split_once("WRITE REFUSED: ").map(|(_, m)| m.to_string()))
        .unwrap_or_else(|| panic!("the write was not refused as read-only:\n{stdout}"));
    assert!(refused.contains(&path.display().to_string()), "names the file: {refused}");
    assert!(refused.contains("ermission denied"), "tells the reason: {refused}");
    assert_eq!(refused.contains("not closed cleanly"), unclean, "{refused}");
    assert!(stdout.contains("LIST AFTER 2 at 2"), "nothing changed: {stdout}");

    // The file is intact and writable again once its mode allows it.
    perms(path, 0o644);
    rt().block_on(async {
        let s = EmbeddedStore::open(path, EmbeddedOptions::default()).await.unwrap();
        assert_eq!(s.get(GetRequest::prefix("k/")).await.unwrap().revision, 2);
        s.txn(TxnRequest::new().and_then([TxnOp::put("k/c", "3")])).await.unwrap();
    });
}

#[test]
fn read_only_store_file_serves_reads_and_refuses_writes() {
    if as_child() {
        return;
    }
    let dir = world_dir();
    let path = dir.path().join("store.redb");
    rt().block_on(async {
        let s = EmbeddedStore::open(&path, EmbeddedOptions::default()).await.unwrap();
        s.txn(TxnRequest::new().and_then([TxnOp::put("k/a", "1"), TxnOp::put("k/b", "2")]))
            .await
            .unwrap(); // revision 2
    });
    check_reader(TEST_NAME, dir.path(), &path, false);
}

/// The last writer was killed and never closed the file. redb cannot open such a
/// file read-only (it needs a recovery, which writes); the store reads a recovered private copy.
#[test]
fn read_only_store_file_not_closed_cleanly_still_serves_reads() {
    const NAME: &str = "read_only_store_file_not_closed_cleanly_still_serves_reads";
    if as_child() {
        return;
    }
    let dir = world_dir();
    let path = dir.path().join("store.redb");
    let out = run_child(NAME, "write", &path, false);
    assert!(out.status.success(), "writer: {}", String::from_utf8_lossy(&out.stderr));
    check_reader(NAME, dir.path(), &path, true);
}
