//! Permissions of the service's secret files, checked as OpenSSH checks private
//! keys and PostgreSQL its server key: before the file is used, by its mode.
//!
//! - Writable by group or others: **refused**, for every kind. Whoever can write the tokens file
//!   can add an admin; whoever can write a token file or the TLS key can replace them.
//! - Readable by others: **refused** for a token file and the TLS key (they are the secret
//!   itself); **warned** for the tokens file, which may hold only SHA-256 digests (its `file:`
//!   entries are checked on their own).
//! - Readable by group: **warned** (a Kubernetes secret mounted with `fsGroup`, or a key shared
//!   with a group on purpose, is 0640).
//!
//! Each message names the file, its mode and the fix (`chmod 600 FILE`).

use std::path::Path;

/// What a file is, for the rules and the messages.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// `--auth-tokens`.
    TokensFile,
    /// A `file:` entry of the tokens file.
    TokenFile,
    /// `--tls-key`.
    TlsKey,
}

impl Kind {
    fn what(self) -> &'static str {
        match self {
            Kind::TokensFile => "the tokens file",
            Kind::TokenFile => "the token file",
            Kind::TlsKey => "the TLS key",
        }
    }
}

/// The verdict on a file of `kind` with permission bits `mode`: `Err` refuses (the message),
/// `Ok(Some)` is a warning, `Ok(None)` is fine.
pub fn judge(path: &Path, mode: u32, kind: Kind) -> Result<Option<String>, String> {
    let mode = mode & 0o7777;
    let shown = format!("{} {} (mode {mode:04o})", kind.what(), path.display());
    let fix = format!("run `chmod 600 {}`", path.display());
    if mode & 0o022 != 0 {
        let who = if mode & 0o002 != 0 { "anyone" } else { "its group" };
        return Err(format!("{shown} is writable by {who}: refusing to use it; {fix}"));
    }
    if mode & 0o004 != 0 {
        let msg = format!("{shown} is readable by anyone");
        return match kind {
            Kind::TokensFile => Ok(Some(format!("{msg}; {fix}"))),
            _ => Err(format!("{msg}: refusing to use it; {fix}")),
        };
    }
    if mode & 0o040 != 0 {
        return Ok(Some(format!("{shown} is readable by its group; unless that is meant, {fix}")));
    }
    Ok(None)
}

/// [`judge`] on the file at `path` (following symbolic links, as a Kubernetes secret mount
/// needs). A warning is logged; `Err` refuses. A file that cannot be examined passes: reading it
/// then fails with the reader's own message.
pub fn check(path: &Path, kind: Kind) -> Result<(), String> {
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        let Ok(meta) = std::fs::metadata(path) else { return Ok(()) };
        if let Some(warning) = judge(path, meta.permissions().mode(), kind)? {
            tracing::warn!("{warning}");
        }
    }
    #[cfg(not(unix))]
    let _ = (path, kind);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn writable_is_refused_readable_by_others_refused_or_warned_group_warned() {
        let p = Path::new("/etc/idalloc/x");
        for kind in [Kind::TokensFile, Kind::TokenFile, Kind::TlsKey] {
            assert_eq!(judge(p, 0o100600, kind), Ok(None));
            assert_eq!(judge(p, 0o400, kind), Ok(None));
            for mode in [0o666, 0o620, 0o602, 0o660] {
                let e = judge(p, mode, kind).expect_err("writable");
                assert!(
                    e.contains("/etc/idalloc/x") && e.contains("chmod 600 /etc/idalloc/x"),
                    "{e}"
                );
                assert!(e.contains(&format!("{mode:04o}")), "{e}");
            }
            let w = judge(p, 0o640, kind).expect("group-readable is allowed");
            assert!(w.is_some_and(|w| w.contains("group") && w.contains("chmod 600")));
        }
        assert!(judge(p, 0o644, Kind::TokensFile).expect("warned").is_some());
        for kind in [Kind::TokenFile, Kind::TlsKey] {
            let e = judge(p, 0o644, kind).expect_err("world-readable secret");
            assert!(e.contains("readable by anyone"), "{e}");
        }
    }
}
