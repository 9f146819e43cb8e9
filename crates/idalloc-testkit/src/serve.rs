//! `idalloc serve` as a child process on a free loopback port: the ONE launcher of the CLI's
//! HTTP tests (`serve.rs`, `serve_secure.rs`, `deploy.rs`), which each had a copy.
//!
//! The binary is passed in (`env!("CARGO_BIN_EXE_idalloc")` exists only in the CLI's own tests).
//! The server listens on `127.0.0.1:0` and prints `listening on ADDR` as its first stdout line,
//! which [`Serve::start`] waits for, so a test never races the bind. The process is stopped by its
//! own PID: SIGKILLed and reaped when the handle is dropped (also on a panic unwinding through the
//! test) unless it already exited.

use std::io::{BufRead, BufReader, Read};
use std::path::PathBuf;
use std::process::{Child, ChildStdout, Command, Stdio};
use std::time::{Duration, Instant};

/// How long a SIGTERMed server may take to drain and exit.
const EXIT_TIMEOUT: Duration = Duration::from_secs(20);

/// How long a server may take to print its listening line: a bound for a hang (a loaded machine
/// starts it in well under a second), not a statement about speed.
const START_TIMEOUT: Duration = Duration::from_secs(60);

/// A running `idalloc serve`.
pub struct Serve {
    child: Child,
    addr: String,
    /// The rest of stdout after the listening line (what a clean shutdown prints).
    stdout: BufReader<ChildStdout>,
    /// Where stderr goes, when not to the test's own stderr.
    stderr: Option<PathBuf>,
}

impl Serve {
    /// `BIN <global> serve --listen 127.0.0.1:0 --sweep-interval 1s <args>` with `RUST_LOG=warn`
    /// (and the audit log off: one line per write would flood the test's output) and stderr on the
    /// test's stderr. `global` holds the options before the subcommand
    /// (`--store`, `--prefix`, `--timeout`, …).
    pub fn start(bin: &str, global: &[&str], args: &[&str]) -> Serve {
        Serve::spawn(bin, global, args, "warn,idalloc::audit=off", None, None)
    }

    /// [`Serve::start`] in the working directory `dir` (so that a relative `file:` store, or the
    /// default `file:idalloc.redb`, is the file there) and without the `IDALLOC_*` variables of
    /// the test's environment: what a user typing the command in `dir` starts.
    pub fn start_in(bin: &str, dir: &std::path::Path, global: &[&str], args: &[&str]) -> Serve {
        Serve::spawn(bin, global, args, "warn,idalloc::audit=off", None, Some(dir))
    }

    /// The same with `RUST_LOG=debug` and stderr written to the file `log`, for tests that read
    /// the server's log ([`Serve::log`]).
    pub fn start_logged(bin: &str, global: &[&str], args: &[&str], log: PathBuf) -> Serve {
        Serve::spawn(bin, global, args, "debug", Some(log), None)
    }

    fn spawn(
        bin: &str,
        global: &[&str],
        args: &[&str],
        rust_log: &str,
        stderr: Option<PathBuf>,
        dir: Option<&std::path::Path>,
    ) -> Serve {
        let err = match &stderr {
            Some(path) => Stdio::from(std::fs::File::create(path).expect("create the stderr file")),
            None => Stdio::inherit(),
        };
        let mut cmd = Command::new(bin);
        if let Some(dir) = dir {
            cmd.current_dir(dir);
            for (name, _) in std::env::vars_os() {
                if name.to_string_lossy().starts_with("IDALLOC_") {
                    cmd.env_remove(name);
                }
            }
        }
        let mut child = cmd
            .args(global)
            .args(["serve", "--listen", "127.0.0.1:0", "--sweep-interval", "1s"])
            .args(args)
            .env("RUST_LOG", rust_log)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(err)
            .spawn()
            .expect("spawn idalloc serve");
        // The first line is read on a thread, so that a server that never prints it fails the
        // test (killed, with its log) instead of blocking it.
        let mut stdout = BufReader::new(child.stdout.take().expect("stdout"));
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let mut line = String::new();
            let read = stdout.read_line(&mut line);
            let _ = tx.send((read.map(|_| line), stdout));
        });
        let (line, stdout) = match rx.recv_timeout(START_TIMEOUT) {
            Ok((Ok(line), stdout)) => (line, Some(stdout)),
            Ok((Err(e), _)) => (format!("(unreadable: {e})"), None),
            Err(_) => (format!("(none within {START_TIMEOUT:?})"), None),
        };
        let (Some(addr), Some(stdout)) = (listening_addr(&line), stdout) else {
            let _ = child.kill();
            let _ = child.wait();
            let log = stderr.map(|p| std::fs::read_to_string(p).unwrap_or_default());
            panic!(
                "serve did not start: first line {line:?}; stderr:\n{}",
                log.unwrap_or_default()
            );
        };
        let serve = Serve { addr: addr.to_string(), child, stdout, stderr };
        // Checked once the handle exists, so that a failure still kills the server.
        assert!(serve.addr.starts_with("127.0.0.1:"), "{}", serve.addr);
        serve
    }

    /// `127.0.0.1:PORT`.
    pub fn addr(&self) -> &str {
        &self.addr
    }

    /// `http://ADDR{path}` (`path` empty for the base URL).
    pub fn http(&self, path: &str) -> String {
        format!("http://{}{path}", self.addr)
    }

    /// `https://ADDR{path}`.
    pub fn https(&self, path: &str) -> String {
        format!("https://{}{path}", self.addr)
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Sends `sig` (`"TERM"`, `"HUP"`, …) to this process only, by its PID.
    pub fn signal(&self, sig: &str) {
        let ok = Command::new("kill")
            .args([&format!("-{sig}"), &self.pid().to_string()])
            .status()
            .expect("run kill")
            .success();
        assert!(ok, "kill -{sig} failed");
    }

    /// SIGTERM, then waits for the exit (bounded); returns the exit code.
    pub fn terminate(&mut self) -> Option<i32> {
        self.signal("TERM");
        let deadline = Instant::now() + EXIT_TIMEOUT;
        loop {
            if let Some(st) = self.child.try_wait().expect("wait") {
                return st.code();
            }
            assert!(Instant::now() < deadline, "serve did not exit after SIGTERM");
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// SIGKILL and reap: a crash, as far as the store can tell.
    pub fn kill9(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// Everything written to stderr so far (only for [`Serve::start_logged`]).
    pub fn log(&self) -> String {
        let path = self.stderr.as_ref().expect("log() needs a server from start_logged");
        std::fs::read_to_string(path).expect("read stderr")
    }

    /// [`Serve::terminate`], then what the process wrote: the rest of stdout and its stderr log
    /// (empty unless started with [`Serve::start_logged`]).
    pub fn stop(mut self) -> (String, String) {
        self.terminate();
        let mut out = String::new();
        let _ = self.stdout.read_to_string(&mut out);
        let log = if self.stderr.is_some() { self.log() } else { String::new() };
        (out, log)
    }
}

impl Drop for Serve {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            self.kill9();
        }
    }
}

/// The `idalloc` binary for tests of crates other than the CLI (where
/// `env!("CARGO_BIN_EXE_idalloc")` does not exist): `IDALLOC_BIN` if set, else the binary the
/// workspace build put beside this test's own directory (`target/<profile>/idalloc`). Panics with
/// how to get it when there is none.
pub fn workspace_bin() -> PathBuf {
    if let Some(p) = std::env::var_os("IDALLOC_BIN") {
        return PathBuf::from(p);
    }
    let exe = std::env::current_exe().unwrap_or_else(|e| panic!("this test's path: {e}"));
    match exe.parent().and_then(|d| d.parent()).map(|d| d.join("idalloc")) {
        Some(b) if b.is_file() => b,
        _ => panic!(
            "this test runs `idalloc serve` and did not find the binary next to {}: build it \
             (`cargo build -p idalloc-cli`) or set IDALLOC_BIN",
            exe.display()
        ),
    }
}

/// Reads `c` until the server closes it (EOF or a reset) and returns what came before; panics if
/// it is still open after 30 s, far beyond the header and idle timeouts the tests set, so that
/// only the server's own timeouts can pass it.
pub fn read_until_closed(c: &mut std::net::TcpStream) -> Vec<u8> {
    c.set_read_timeout(Some(Duration::from_secs(30))).expect("read timeout");
    let mut rest = Vec::new();
    match c.read_to_end(&mut rest) {
        Ok(_) => rest,
        Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => rest,
        Err(e) => panic!("not closed by the server: {e}"),
    }
}

/// The address of serve's first stdout line: `listening on ADDR`, or under `--log-format json`
/// the JSON log line whose `addr` field holds it.
pub fn listening_addr(line: &str) -> Option<&str> {
    let line = line.trim();
    if let Some(addr) = line.strip_prefix("listening on ") {
        return Some(addr);
    }
    let rest = &line[line.find("\"addr\":\"")? + "\"addr\":\"".len()..];
    rest.split('"').next()
}

/// A tokens file for `serve --auth-tokens`, written by [`tokens_file`]: its path and each
/// client's token.
pub struct TokensFile {
    pub path: PathBuf,
    tokens: Vec<(String, String)>,
}

impl TokensFile {
    /// The file's path as a string (for a command line).
    pub fn arg(&self) -> &str {
        self.path.to_str().expect("a UTF-8 temporary path")
    }

    /// Every client's token (to check that none is in a log).
    pub fn tokens(&self) -> impl Iterator<Item = &str> {
        self.tokens.iter().map(|(_, t)| t.as_str())
    }

    /// The token of client `name` (a line of the file); panics for a name not in it.
    pub fn token(&self, name: &str) -> &str {
        match self.tokens.iter().find(|(n, _)| n == name) {
            Some((_, t)) => t,
            None => panic!("no client {name:?} in the tokens file"),
        }
    }
}

/// Writes a tokens file (mode 0600) of `lines` (`NAME SCOPE file:NAME.token [OPTION…]`) in
/// `dir`, and each client's token (unique per call: time and PID) to `NAME.token` (mode 0600),
/// as `serve` requires of secret files.
pub fn tokens_file(dir: &std::path::Path, lines: &[&str]) -> TokensFile {
    use std::os::unix::fs::PermissionsExt;
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or(7);
    let mut tokens = Vec::new();
    for line in lines {
        let name = line.split_whitespace().next().expect("a client name").to_string();
        let token = format!("tok-{name}-{nanos:x}-{}", std::process::id());
        let file = dir.join(format!("{name}.token"));
        std::fs::write(&file, &token).expect("write a token file");
        std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o600)).expect("chmod");
        tokens.push((name, token));
    }
    let path = dir.join("tokens");
    std::fs::write(&path, lines.join("\n") + "\n").expect("write the tokens file");
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).expect("chmod");
    TokensFile { path, tokens }
}
