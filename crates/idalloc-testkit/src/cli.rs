//! Running the `idalloc` binary in tests with a clean environment: the variables that choose a
//! store, a service, a prefix or a token are cleared, so a developer's shell cannot change what
//! a test runs against.

use std::path::Path;
use std::process::{Command, Stdio};

/// One run: exit code (-1 if killed by a signal), stdout, stderr.
#[derive(Debug, PartialEq, Eq)]
pub struct Ran {
    pub code: i32,
    pub stdout: String,
    pub stderr: String,
}

/// `bin ARGS` in `dir` with `env` set, stdin empty, `USER=alice` (the default holder's name)
/// and `RUST_LOG`, `IDALLOC_STORE`, `IDALLOC_SERVER`, `IDALLOC_PREFIX`, `IDALLOC_TOKEN_FILE`
/// cleared.
pub fn run(bin: &str, dir: &Path, env: &[(&str, &str)], args: &[&str]) -> Ran {
    let o = Command::new(bin)
        .current_dir(dir)
        .env("USER", "alice")
        .env_remove("RUST_LOG")
        .env_remove("IDALLOC_STORE")
        .env_remove("IDALLOC_SERVER")
        .env_remove("IDALLOC_PREFIX")
        .env_remove("IDALLOC_TOKEN_FILE")
        .envs(env.iter().copied())
        .args(args)
        .stdin(Stdio::null())
        .output()
        .expect("run idalloc");
    Ran {
        code: o.status.code().unwrap_or(-1),
        stdout: String::from_utf8_lossy(&o.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&o.stderr).into_owned(),
    }
}
