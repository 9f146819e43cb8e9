//! Exit codes and the one-line error every failure becomes.
//!
//! Scripts branch on the exit code, so each library error maps to exactly one code: 1 for "the
//! world is not as needed" (store down, pool full, specs disagree), 2 for "the command is wrong"
//! (fix the input), 3 for "not there" (lets `get`/`lookup` double as existence checks), 4 for
//! "the store holds data idalloc cannot use" (a person must look: `idalloc check`).

use idalloc::{Error, Input};

/// Exit code of a successful command.
pub const OK: u8 = 0;
/// Runtime failure: store unavailable or locked, exhausted, spec mismatch, conflict.
pub const RUNTIME: u8 = 1;
/// Invalid input or usage.
pub const USAGE: u8 = 2;
/// Pool, key or ID not found.
pub const NOT_FOUND: u8 = 3;
/// Corrupt data: a record or store file idalloc cannot use (see `idalloc check`).
pub const CORRUPT: u8 = 4;

/// A failed command: its exit code and the message printed after `error: `.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Failure {
    pub code: u8,
    pub message: String,
}

impl Failure {
    pub fn usage(message: impl Into<String>) -> Self {
        Failure { code: USAGE, message: message.into() }
    }
    pub fn runtime(message: impl Into<String>) -> Self {
        Failure { code: RUNTIME, message: message.into() }
    }
    pub fn not_found(message: impl Into<String>) -> Self {
        Failure { code: NOT_FOUND, message: message.into() }
    }

    /// The line for stderr: `error: ` and the message on one line (newlines a store might put in a
    /// reason are folded, so log scrapers and `2>&1 | tail -1` see the whole message).
    pub fn line(&self) -> String {
        let one: String = self
            .message
            .split(['\n', '\r'])
            .map(str::trim)
            .filter(|s| !s.is_empty())
            .collect::<Vec<_>>()
            .join(" ");
        // Messages quote values with `{:?}`, but a store's own reason may carry anything.
        format!("error: {}", crate::render::controls(&one))
    }
}

impl From<Error> for Failure {
    fn from(e: Error) -> Self {
        let code = match &e {
            // Deleting a pool that still has bindings is refused as InvalidInput by the library,
            // but the command line is fine: the state of the pool is what stands in the way.
            Error::InvalidInput { input: Input::PoolInUse, .. } => RUNTIME,
            Error::InvalidInput { .. } => USAGE,
            Error::PoolNotFound { .. } => NOT_FOUND,
            Error::Corrupt { .. } => CORRUPT,
            Error::RangeMismatch { .. }
            | Error::PoolReplaced { .. }
            | Error::Exhausted { .. }
            | Error::Unavailable { .. }
            | Error::Conflict { .. }
            | Error::AccessDenied { .. } => RUNTIME,
        };
        Failure { code, message: e.to_string() }
    }
}

/// Renders a clap error (other than --help/--version) as one line: clap's own first line, which
/// names the bad argument or value, plus where to find the usage.
pub fn clap_line(rendered: &str) -> String {
    let first =
        rendered.lines().map(str::trim).find(|l| !l.is_empty()).unwrap_or("invalid command line");
    let first = first.strip_prefix("error: ").unwrap_or(first);
    // "the following required arguments were not provided:" lists them on the next lines.
    let listed: Vec<&str> = if first.ends_with(':') {
        rendered
            .lines()
            .skip_while(|l| !l.contains(first))
            .skip(1)
            .take_while(|l| l.starts_with("  ") && !l.trim().is_empty())
            .map(str::trim)
            .collect()
    } else {
        Vec::new()
    };
    // A bad value of a fixed set ("invalid value 'tcsh' for '<SHELL>'") lists what is allowed
    // on a line of its own: keep it, the message must say what is allowed.
    let allowed = rendered.lines().map(str::trim).find(|l| l.starts_with("[possible values:"));
    let joined;
    let first = match (listed.is_empty(), allowed) {
        (true, None) => first,
        (true, Some(a)) => {
            joined = format!("{first} {a}");
            &joined
        }
        (false, _) => {
            joined = format!("{first} {}", listed.join(", "));
            &joined
        }
    };
    // clap quotes the offending value: never a password from an etcd:// URL.
    let first = crate::parse::redact_urls(first);
    format!("{first} (see 'idalloc --help')")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes() {
        let f: Failure = Error::invalid_str(Input::Key, "key", "", "keys are non-empty").into();
        assert_eq!(f.code, USAGE);
        let f: Failure = Error::PoolNotFound { pool: "p".into() }.into();
        assert_eq!(f.code, NOT_FOUND);
        let f: Failure = Error::unavailable("x").into();
        assert_eq!(f.code, RUNTIME);
        let f: Failure = Error::unavailable_for_good("x").into();
        assert_eq!(f.code, RUNTIME);
        // The code follows the typed input kind, whatever the message says.
        let f: Failure = Error::invalid(Input::PoolInUse, "anything", "p", "has records").into();
        assert_eq!(f.code, RUNTIME);
        let f: Failure = Error::invalid(Input::Spec, "pool to delete", "p", "x").into();
        assert_eq!(f.code, USAGE);
        let f: Failure = Error::corrupt("P/pools/p", "unreadable").into();
        assert_eq!(f.code, CORRUPT);
    }

    #[test]
    fn clap_lists_on_the_next_lines_are_kept() {
        let rendered = "error: the following required arguments were not provided:\n  --tls-key <FILE>\n\nUsage: idalloc serve --tls-key <FILE> --tls-cert <FILE>\n\nFor more information, try '--help'.\n";
        assert_eq!(
            clap_line(rendered),
            "the following required arguments were not provided: --tls-key <FILE> (see 'idalloc --help')"
        );
    }

    #[test]
    fn the_allowed_values_of_a_bad_choice_are_kept() {
        let rendered = "error: invalid value 'tcsh' for '<SHELL>'\n  [possible values: bash, zsh, fish]\n\nFor more information, try '--help'.\n";
        assert_eq!(
            clap_line(rendered),
            "invalid value 'tcsh' for '<SHELL>' [possible values: bash, zsh, fish] (see 'idalloc --help')"
        );
    }

    #[test]
    fn one_line() {
        let f = Failure::runtime("a\nb\r\n c");
        assert_eq!(f.line(), "error: a b c");
        let f = Failure::runtime("store said \x1b[2J \"k\\n\"");
        assert_eq!(f.line(), "error: store said \\u{1b}[2J \"k\\n\"");
        assert_eq!(
            clap_line("error: unexpected argument '--x' found\n\n  tip: ...\n\nUsage: idalloc"),
            "unexpected argument '--x' found (see 'idalloc --help')"
        );
    }
}
