//! The real `idalloc` binary as a Unix tool: a closed stdout, a typo, a missing directory, a store
//! that does not answer, a full pool, each with the exit code and the one line documented in
//! docs/guide/cli.md ("Exit codes and errors").

use std::path::PathBuf;
use std::process::{Command, Output, Stdio};

fn bin() -> &'static str {
    env!("CARGO_BIN_EXE_idalloc")
}

/// A file store in a fresh directory, and commands on it.
struct Files {
    dir: tempfile::TempDir,
}

impl Files {
    fn new() -> Files {
        Files { dir: tempfile::tempdir().expect("tempdir") }
    }

    fn store(&self) -> String {
        format!("file:{}", self.dir.path().join("ids.redb").display())
    }

    fn cmd(&self, args: &[&str]) -> Command {
        let mut c = Command::new(bin());
        c.current_dir(self.dir.path())
            .env("IDALLOC_STORE", self.store())
            .env("USER", "alice")
            .env_remove("RUST_LOG")
            .env_remove("IDALLOC_PREFIX")
            .args(args)
            .stdin(Stdio::null());
        c
    }

    fn run(&self, args: &[&str]) -> Output {
        self.cmd(args).output().expect("run idalloc")
    }

    #[track_caller]
    fn ok(&self, args: &[&str]) -> String {
        let o = self.run(args);
        assert_eq!(o.status.code(), Some(0), "{args:?}: {}", String::from_utf8_lossy(&o.stderr));
        String::from_utf8_lossy(&o.stdout).into_owned()
    }

    fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }
}

/// Exit code and the stderr lines of a run.
fn code_and_lines(o: &Output) -> (Option<i32>, Vec<String>) {
    (o.status.code(), String::from_utf8_lossy(&o.stderr).lines().map(str::to_string).collect())
}

/// Asserts exit `code` with exactly one `error: ` line on stderr containing every `needles`.
#[track_caller]
fn fails_with(o: &Output, code: i32, needles: &[&str]) {
    let (c, lines) = code_and_lines(o);
    assert_eq!(c, Some(code), "{lines:?}");
    assert_eq!(lines.len(), 1, "one error line: {lines:?}");
    assert!(lines[0].starts_with("error: "), "{lines:?}");
    for n in needles {
        assert!(lines[0].contains(n), "{n:?} not in {lines:?}");
    }
}

/// Every command, its stdout a pipe whose reader is already gone (as `| head -c1` once head has
/// read its byte): each ends quietly, exit 0 or 141, never a panic (101) nor an error line.
#[test]
fn a_closed_stdout_ends_every_command_quietly() {
    let f = Files::new();
    f.ok(&["pool", "create", "p", "--range", "1-100000"]);
    let keys: String = (0..3000).map(|i| format!("k{i}\n")).collect();
    let keys_file = f.path("keys.txt");
    std::fs::write(&keys_file, &keys).expect("write keys");
    let keys_arg = keys_file.to_str().expect("utf-8 path");
    f.ok(&["acquire", "p", "--from", keys_arg]);
    let id = f.ok(&["get", "p", "k1"]).trim().to_string();
    let man_dir = f.path("man");
    std::fs::create_dir(&man_dir).expect("man dir");
    let commands: Vec<Vec<&str>> = vec![
        vec!["pool", "create", "q", "--range", "1-10"],
        vec!["pool", "list"],
        vec!["pool", "show", "p"],
        vec!["acquire", "p", "one"],
        vec!["acquire", "p", "--from", keys_arg],
        vec!["release", "p", "one"],
        vec!["get", "p", "k1"],
        vec!["lookup", "p", &id],
        vec!["list", "p"],
        vec!["--json", "list", "p"],
        vec!["watch", "p", "--count", "1"],
        vec!["gc", "--dry-run"],
        vec!["check"],
        vec!["status"],
        vec!["completions", "bash"],
        vec!["man"],
        vec!["--help"],
        vec!["--version"],
        vec!["release", "p", "--from", keys_arg],
        vec!["pool", "delete", "q"],
    ];
    for args in &commands {
        let (reader, writer) = std::io::pipe().expect("pipe");
        drop(reader);
        let o = f.cmd(args).stdout(Stdio::from(writer)).output().expect("run idalloc");
        let (code, lines) = code_and_lines(&o);
        assert!(matches!(code, Some(0) | Some(141)), "{args:?}: exit {code:?}, stderr {lines:?}");
        assert!(lines.is_empty(), "{args:?}: exit {code:?}, stderr {lines:?}");
    }
    // A long listing whose reader leaves after one line is the common case: quiet 141.
    let mut child = f.cmd(&["list", "p"]).stdout(Stdio::piped()).spawn().expect("spawn");
    let mut first = [0u8; 1];
    std::io::Read::read_exact(child.stdout.as_mut().expect("stdout"), &mut first).expect("a byte");
    drop(child.stdout.take());
    let o = child.wait_with_output().expect("wait");
    let (code, lines) = code_and_lines(&o);
    assert_eq!((code, lines.len()), (Some(141), 0), "{lines:?}");
}

/// A typo in a command, a flag or a pool name is answered with the likely fix.
#[test]
fn typos_get_suggestions() {
    let f = Files::new();
    fails_with(&f.run(&["poool", "list"]), 2, &["'poool'", "similar subcommand", "'pool'"]);
    fails_with(&f.run(&["pool", "lst"]), 2, &["'lst'", "'list'"]);
    fails_with(&f.run(&["--jsn", "status"]), 2, &["'--jsn'", "'--json'"]);
    f.ok(&["pool", "create", "vni", "--range", "1-100"]);
    f.ok(&["pool", "create", "vlan", "--range", "1-100"]);
    for args in [
        vec!["get", "vnii", "k"],
        vec!["acquire", "vnii", "k"],
        vec!["lookup", "vnii", "5"],
        vec!["list", "vnii"],
        vec!["pool", "show", "vnii"],
        vec!["pool", "delete", "vnii"],
    ] {
        fails_with(&f.run(&args), 3, &["\"vnii\" not found", "did you mean \"vni\"?"]);
    }
    fails_with(&f.run(&["get", "vlna", "k"]), 3, &["did you mean \"vlan\"?"]);
    // Nothing close: no guess; a missing key in a pool that exists: no guess either.
    let o = f.run(&["get", "tenants", "k"]);
    fails_with(&o, 3, &["\"tenants\""]);
    assert!(!String::from_utf8_lossy(&o.stderr).contains("did you mean"));
    let o = f.run(&["get", "vni", "nokey"]);
    fails_with(&o, 3, &["\"nokey\""]);
    assert!(!String::from_utf8_lossy(&o.stderr).contains("did you mean"));
}

/// A `file:` store in a directory that does not exist is an error naming the path, for every
/// command, never an empty store.
#[test]
fn a_missing_store_directory_is_an_error_for_every_command() {
    let f = Files::new();
    let store = format!("file:{}", f.path("no/such/dir/x.redb").display());
    let commands: Vec<Vec<&str>> = vec![
        vec!["status"],
        vec!["pool", "list"],
        vec!["pool", "show", "p"],
        vec!["pool", "create", "p", "--range", "1-10"],
        vec!["pool", "delete", "p"],
        vec!["acquire", "p", "k", "--range", "1-10"],
        vec!["release", "p", "k"],
        vec!["get", "p", "k"],
        vec!["lookup", "p", "1"],
        vec!["list", "p"],
        vec!["watch", "p", "--count", "1"],
        vec!["gc"],
        vec!["check"],
    ];
    for args in &commands {
        let o = f.cmd(&[&["--store", &store][..], args].concat()).output().expect("run");
        fails_with(&o, 2, &["no/such/dir", "does not exist"]);
        assert!(o.stdout.is_empty(), "{args:?}");
    }
    assert!(!f.path("no").exists(), "nothing was created");
}

/// Exit 5: the store did not answer (retry may succeed); `status` still prints what it knows.
#[test]
fn an_unreachable_store_exits_5_and_status_still_prints() {
    let held = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let port = held.local_addr().expect("addr").port();
    // Connections to a port that is bound but whose listener is dropped are refused; keep the
    // port ours by binding a socket that never listens.
    drop(held);
    let socket = tokio::net::TcpSocket::new_v4()
        .and_then(|s| s.bind(([127, 0, 0, 1], port).into()).map(|()| s))
        .expect("hold the port");
    let f = Files::new();
    let store = format!("etcd://127.0.0.1:{port}");
    let o = f.run(&["--store", &store, "--timeout", "1s", "get", "p", "k"]);
    fails_with(&o, 5, &["unavailable"]);
    let o = f.run(&["--store", &store, "--timeout", "1s", "status"]);
    let text = String::from_utf8_lossy(&o.stdout);
    assert_eq!(o.status.code(), Some(5), "{text}");
    assert!(text.contains("reachable:  no (") && text.contains("pools:      unknown"), "{text}");
    drop(socket);
}

/// A file store another process holds (a running `serve`): `status` prints what it knows, says
/// why, and exits 5; other commands exit 5 after --lock-timeout.
#[test]
fn a_locked_file_store_exits_5_and_status_still_prints() {
    let f = Files::new();
    f.ok(&["pool", "create", "p", "--range", "1-10"]);
    let store = f.store();
    let serve = idalloc_testkit::serve::Serve::start(bin(), &["--store", &store], &[]);
    let o = f.run(&["--lock-timeout", "200ms", "--json", "status"]);
    assert_eq!(o.status.code(), Some(5), "{}", String::from_utf8_lossy(&o.stderr));
    let j: serde_json::Value = serde_json::from_slice(&o.stdout).expect("status JSON");
    assert_eq!(j["reachable"], false, "{j}");
    assert_eq!(j["store"], "file", "{j}");
    assert!(j["error"].as_str().is_some_and(|e| e.contains("in use by another process")), "{j}");
    let o = f.run(&["--lock-timeout", "200ms", "get", "p", "k"]);
    fails_with(&o, 5, &["in use by another process"]);
    drop(serve);
}

/// Exit 6: the pool is full (only a release helps); unlike a spec mismatch (1).
#[test]
fn an_exhausted_pool_exits_6() {
    let f = Files::new();
    f.ok(&["pool", "create", "tiny", "--range", "1-2"]);
    f.ok(&["acquire", "tiny", "a"]);
    f.ok(&["acquire", "tiny", "b"]);
    fails_with(&f.run(&["acquire", "tiny", "c"]), 6, &["exhausted"]);
    fails_with(&f.run(&["pool", "create", "tiny", "--range", "1-3"]), 1, &["different spec"]);
    let keys = f.path("keys");
    std::fs::write(&keys, "c\nd\n").expect("keys");
    let o = f.run(&["acquire", "tiny", "--from", keys.to_str().expect("utf-8")]);
    assert_eq!(o.status.code(), Some(6), "{}", String::from_utf8_lossy(&o.stderr));
}
