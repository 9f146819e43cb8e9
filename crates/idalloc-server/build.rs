//! Records the git commit the service is built from, for `idalloc version`, `GET /v1/version`
//! and the `idalloc_build_info` metric. No network and no failure: a source tree without git
//! (a crate tarball, a container build without `.git`) builds with "unknown".
//! `IDALLOC_GIT_SHA` set at build time wins (for builds from an exported tree).

use std::process::Command;

fn git(args: &[&str]) -> Option<String> {
    let out = Command::new("git").args(args).output().ok()?;
    if !out.status.success() {
        return None;
    }
    let s = String::from_utf8(out.stdout).ok()?.trim().to_string();
    (!s.is_empty()).then_some(s)
}

fn main() {
    println!("cargo:rerun-if-env-changed=IDALLOC_GIT_SHA");
    let sha = std::env::var("IDALLOC_GIT_SHA")
        .ok()
        .filter(|s| !s.is_empty())
        .or_else(|| git(&["rev-parse", "--short=12", "HEAD"]))
        .unwrap_or_else(|| "unknown".to_string());
    // Rebuilt when HEAD moves: HEAD itself (a checkout) and the ref it names (a commit).
    if let Some(head) = git(&["rev-parse", "--git-path", "HEAD"]) {
        println!("cargo:rerun-if-changed={head}");
    }
    if let Some(r) = git(&["symbolic-ref", "-q", "HEAD"]) {
        if let Some(path) = git(&["rev-parse", "--git-path", &r]) {
            println!("cargo:rerun-if-changed={path}");
        }
    }
    println!("cargo:rustc-env=IDALLOC_GIT_SHA={sha}");
}
