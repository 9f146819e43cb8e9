//! Flags bounded to what the store can take, and the errors that name what to fix: values
//! outside `--bulk-in-flight`'s and `--concurrency`'s range are refused naming the value and the
//! range; a temporary file that cannot be made names `TMPDIR` and the directory.

use assert_cmd::Command;
use predicates::prelude::*;

fn idalloc(dir: &tempfile::TempDir) -> Command {
    let mut c = Command::cargo_bin("idalloc").expect("the idalloc binary");
    c.current_dir(dir.path())
        .env("IDALLOC_STORE", format!("file:{}", dir.path().join("s.redb").display()))
        .env_remove("RUST_LOG")
        .env_remove("IDALLOC_BULK_IN_FLIGHT")
        .timeout(std::time::Duration::from_secs(120));
    c
}

#[test]
fn in_flight_bounds_are_refused_naming_the_value_and_the_range() {
    let dir = tempfile::tempdir().expect("tempdir");
    for args in [
        &["serve", "--listen", "127.0.0.1:0", "--bulk-in-flight", "64"][..],
        &["acquire", "p", "--from", "-", "--concurrency", "64"],
        &["release", "p", "--from", "-", "--concurrency", "33"],
    ] {
        let bad = args.last().expect("a value");
        idalloc(&dir)
            .args(args)
            .write_stdin("k\n")
            .assert()
            .code(2)
            .stderr(predicate::str::contains(format!("{bad} is not in 1..=32")));
    }
    // The bound itself is accepted.
    idalloc(&dir)
        .args(["acquire", "p", "--range", "1-10", "--from", "-", "--concurrency", "32"])
        .write_stdin("k\n")
        .assert()
        .success();
}

#[test]
fn a_missing_tmpdir_is_named() {
    let dir = tempfile::tempdir().expect("tempdir");
    let missing = dir.path().join("no-such-dir");
    idalloc(&dir)
        .env("TMPDIR", &missing)
        .args(["acquire", "p", "--range", "1-10", "--from", "-"])
        .write_stdin("k\n")
        .assert()
        .code(1)
        .stderr(predicate::str::contains("TMPDIR"))
        .stderr(predicate::str::contains(missing.display().to_string()));
}
