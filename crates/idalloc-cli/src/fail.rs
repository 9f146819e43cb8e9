//! Exit codes and the one-line error every failure becomes.
//!
//! Scripts branch on the exit code, so each library error maps to exactly one code: 1 for "the
//! world is not as needed" (specs disagree, a conflict, access refused), 2 for "the command is
//! wrong" (fix the input), 3 for "not there" (lets `get`/`lookup` double as existence checks), 4
//! for "the store holds data idalloc cannot use" (a person must look: `idalloc check`), 5 for
//! "the store or server did not answer: retrying may succeed", 6 for "the pool is exhausted"
//! (only a release helps), and 141 (as a process killed by SIGPIPE) when stdout was closed
//! before everything was written (`| head`): quietly, the reader asked for no more.

use idalloc::{Error, Input};

/// Exit code of a successful command.
pub const OK: u8 = 0;
/// Runtime failure: spec mismatch, conflict, access refused, pool in use.
pub const RUNTIME: u8 = 1;
/// Invalid input or usage.
pub const USAGE: u8 = 2;
/// Pool, key or ID not found.
pub const NOT_FOUND: u8 = 3;
/// Corrupt data: a record or store file idalloc cannot use (see `idalloc check`).
pub const CORRUPT: u8 = 4;
/// The store or server did not answer (unreachable, timed out, file busy): a retry may succeed.
pub const UNAVAILABLE: u8 = 5;
/// The pool is exhausted: every allocatable ID is bound or waiting out its reuse delay.
pub const EXHAUSTED: u8 = 6;
/// stdout was closed by its reader (128 + SIGPIPE, what a shell reports for a process SIGPIPE
/// killed): the command stops quietly, since its output is no longer wanted.
pub const PIPE_CLOSED: u8 = 141;

/// The exit-code table of `--help` and docs/guide/cli.md, one place for both (a test compares them).
#[cfg(test)]
pub const TABLE: &[(u8, &str)] = &[
    (OK, "success"),
    (RUNTIME, "runtime error: spec mismatch, conflict, pool still has bindings, access refused (TLS, credentials, permissions)"),
    (USAGE, "invalid input or usage"),
    (NOT_FOUND, "not found (pool, key or ID)"),
    (CORRUPT, "corrupt data in the store (run `idalloc check`)"),
    (UNAVAILABLE, "the store or server did not answer (unreachable, timed out, file busy): retrying may succeed"),
    (EXHAUSTED, "pool exhausted"),
    (PIPE_CLOSED, "stdout closed by its reader (e.g. `head`): stopped quietly"),
];

/// Writes `line` and a newline to stderr, ignoring a failure (`eprintln!` panics when stderr is
/// closed, and a panic is exit 101).
pub fn say(line: &str) {
    use std::io::Write;
    let _ = writeln!(std::io::stderr().lock(), "{line}");
}

/// A failed write to stdout: quiet exit 141 if the reader closed it, else exit 1 naming the error.
pub fn stdout_error(e: std::io::Error) -> Failure {
    if e.kind() == std::io::ErrorKind::BrokenPipe {
        Failure { code: PIPE_CLOSED, kind: "pipe_closed", message: String::new() }
    } else {
        Failure::runtime(format!("writing to stdout: {e}"))
    }
}
/// A failed command: its exit code, its kind (the `kind` of `-o json`'s error, the HTTP API's
/// names: `invalid_input`, `pool_not_found`, `exhausted`, ...) and the message printed after
/// `error: `.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Failure {
    pub code: u8,
    pub kind: &'static str,
    pub message: String,
}

impl Failure {
    pub fn usage(message: impl Into<String>) -> Self {
        Failure { code: USAGE, kind: "invalid_input", message: message.into() }
    }
    pub fn runtime(message: impl Into<String>) -> Self {
        Failure { code: RUNTIME, kind: "failed", message: message.into() }
    }
    pub fn unavailable(message: impl Into<String>) -> Self {
        Failure { code: UNAVAILABLE, kind: "unavailable", message: message.into() }
    }
    pub fn not_found(message: impl Into<String>) -> Self {
        Failure { code: NOT_FOUND, kind: "not_found", message: message.into() }
    }

    /// A failure with nothing to say (stdout closed): main prints no line for it.
    pub fn is_quiet(&self) -> bool {
        self.message.is_empty()
    }

    /// The error as `-o json` writes it on stderr: `{"kind","message"}` on one line, as the HTTP
    /// API's error bodies.
    pub fn json_line(&self) -> String {
        serde_json::json!({"kind": self.kind, "message": self.message}).to_string()
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
            Error::Exhausted { .. } => EXHAUSTED,
            // Retryable: unreachable, timed out, contended. Not: closed, read-only, a bad answer.
            Error::Unavailable { retryable: true, .. } => UNAVAILABLE,
            Error::RangeMismatch { .. }
            | Error::PoolReplaced { .. }
            | Error::Unavailable { retryable: false, .. }
            | Error::Conflict { .. }
            | Error::AccessDenied { .. } => RUNTIME,
        };
        Failure { code, kind: e.kind(), message: e.to_string() }
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
    // clap's suggestions ("tip: a similar subcommand exists: 'pool'") are the fix for a typo.
    let tips: Vec<&str> =
        rendered.lines().map(str::trim).filter(|l| l.starts_with("tip: ")).collect();
    let mut first = first.to_string();
    for tip in tips {
        first.push_str("; ");
        first.push_str(tip);
    }
    // clap quotes the offending value: never a password from an etcd:// URL.
    let first = crate::parse::redact_urls(&first);
    format!("{first} (see 'idalloc --help')")
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The table of `--help` and the one of docs/guide/cli.md say what `TABLE` says, code by code.
    #[test]
    fn exit_code_tables_agree() {
        let help = crate::cli::TOP_HELP;
        let doc_path = concat!(env!("CARGO_MANIFEST_DIR"), "/../../docs/guide/cli.md");
        let doc = std::fs::read_to_string(doc_path).expect("docs/guide/cli.md");
        for (code, meaning) in TABLE {
            let line = format!("  {code:<4} {meaning}\n");
            assert!(help.contains(&line), "--help lacks {line:?}");
            let row = format!("| {code} | {} |\n", meaning.replace('|', "\\|"));
            assert!(doc.contains(&row), "docs/guide/cli.md lacks {row:?}");
        }
        let listed = help.lines().skip_while(|l| !l.starts_with("Exit codes:")).skip(1);
        assert_eq!(listed.take_while(|l| l.starts_with("  ")).count(), TABLE.len());
    }

    #[test]
    fn codes() {
        let f: Failure = Error::invalid_str(Input::Key, "key", "", "keys are non-empty").into();
        assert_eq!(f.code, USAGE);
        let f: Failure = Error::PoolNotFound { pool: "p".into() }.into();
        assert_eq!(f.code, NOT_FOUND);
        let f: Failure = Error::unavailable("x").into();
        assert_eq!(f.code, UNAVAILABLE);
        let f: Failure = Error::Exhausted { pool: "p".into(), min: 1, max: 2, capacity: 2 }.into();
        assert_eq!(f.code, EXHAUSTED);
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
            clap_line("error: unexpected argument '--x' found\n\nUsage: idalloc"),
            "unexpected argument '--x' found (see 'idalloc --help')"
        );
        assert_eq!(
            clap_line("error: unrecognized subcommand 'poool'\n\n  tip: a similar subcommand exists: 'pool'\n\nUsage: idalloc"),
            "unrecognized subcommand 'poool'; tip: a similar subcommand exists: 'pool' (see 'idalloc --help')"
        );
    }
}
