//! `idalloc completions SHELL` and `idalloc man` from the outside: they need
//! no store, and a shell that is not offered is refused with the allowed ones. The scripts' and
//! pages' contents are tested against the parser's own definitions in `src/docgen.rs`.

use std::time::Duration;

use assert_cmd::Command;

fn idalloc(dir: &std::path::Path) -> Command {
    let mut c = Command::cargo_bin("idalloc").unwrap();
    c.current_dir(dir)
        .env_remove("RUST_LOG")
        // A store nobody answers on: these commands must not try to reach it.
        .env("IDALLOC_STORE", "etcd://127.0.0.1:1")
        .timeout(Duration::from_secs(120));
    c
}

#[test]
fn completions_and_man_need_no_store() {
    let dir = tempfile::tempdir().unwrap();
    for shell in ["bash", "zsh", "fish"] {
        let out = idalloc(dir.path()).args(["completions", shell]).output().unwrap();
        assert!(out.status.success(), "{shell}: {}", String::from_utf8_lossy(&out.stderr));
        assert!(String::from_utf8_lossy(&out.stdout).contains("idalloc"), "{shell}");
    }
    let out = idalloc(dir.path()).arg("man").output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(String::from_utf8_lossy(&out.stdout).contains(".TH idalloc 1"));
    assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0, "no store file was made");
}

#[test]
fn an_unknown_shell_is_refused_with_the_allowed_ones() {
    let dir = tempfile::tempdir().unwrap();
    let out = idalloc(dir.path()).args(["completions", "tcsh"]).output().unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(err.lines().count(), 1, "one line: {err}");
    assert!(err.starts_with("error: ") && err.contains("'tcsh'"), "names the value: {err}");
    assert!(err.contains("bash, zsh, fish"), "lists the allowed values: {err}");
}

#[test]
fn man_dir_must_exist() {
    let dir = tempfile::tempdir().unwrap();
    let out = idalloc(dir.path()).args(["man", "--dir", "no-such-dir"]).output().unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("no-such-dir") && err.contains("not an existing directory"), "{err}");
}
