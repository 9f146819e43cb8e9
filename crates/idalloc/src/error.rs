//! The allocator's public error type: the closed list of failures of DESIGN G6.
//!
//! Every operation of the allocator either succeeds or returns one of these variants, so callers can
//! match on them exhaustively: bad input (fix the call), a pool set up differently elsewhere (fix the
//! configuration), a missing pool, a full pool, an unreachable store (retry later), or a binding that
//! changed under a holder (re-read). Messages name the offending value and the rule it broke, so an
//! operator reading a log line does not need the source to understand it.

use crate::pool::PoolSpec;
use crate::store::StoreError;

/// How many bytes of an offending value an error message shows. Keys may be 4 KiB; a log line with the
/// whole key would drown the message, and the first 80 bytes are enough to recognise it.
pub const SHOWN_VALUE_BYTES: usize = 80;

/// Everything an allocator operation can fail with (DESIGN G6).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Error {
    /// The caller passed a value the allocator cannot accept (a bad key, pool name, range...).
    /// Retrying the same call cannot help.
    #[error("invalid {what} {value}: {rule}")]
    InvalidInput {
        /// What kind of value it is: "key", "pool name", "reserved ID list"...
        what: String,
        /// The offending value as shown to humans: quoted, truncated to [`SHOWN_VALUE_BYTES`]
        /// bytes, with its length when truncated (see [`show_value`]).
        value: String,
        /// What is allowed.
        rule: String,
    },
    /// `init_pool` found the pool already defined with a different spec (Contiv's `InitPool`
    /// semantics): two parts of a deployment disagree about the pool, and silently using either
    /// spec would break G3 for the other.
    #[error("pool \"{pool}\" already exists with a different spec: existing {existing}; requested {requested}")]
    RangeMismatch {
        /// The pool's name.
        pool: String,
        /// The spec stored in the store.
        existing: Box<PoolSpec>,
        /// The spec the caller asked for.
        requested: Box<PoolSpec>,
    },
    /// The pool has no spec in the store: it was never initialised (or was deleted by hand).
    #[error("pool \"{pool}\" not found: initialise it with a pool spec first")]
    PoolNotFound {
        /// The pool's name.
        pool: String,
    },
    /// The pool this handle was opened on was deleted and re-created (with the same spec) since:
    /// the handle's bindings and references went with the old pool, so it refuses to act for the
    /// new one (a silent switch would hide that the holds were lost, G2). The handle's background
    /// work has stopped; open the pool again (`Allocator::pool`) to use the new one
    /// (docs/design-notes.md, "Pool handles outlive their pool").
    #[error(
        "pool \"{pool}\" was deleted and re-created since this handle was opened; the handle's \
         holds went with the old pool: open the pool again"
    )]
    PoolReplaced {
        /// The pool's name.
        pool: String,
    },
    /// Every allocatable ID of the pool is bound or still in its reuse delay.
    #[error(
        "pool \"{pool}\" is exhausted: all {capacity} allocatable IDs in [{min}, {max}] are bound \
         or waiting out their reuse delay"
    )]
    Exhausted {
        /// The pool's name.
        pool: String,
        /// Lowest raw ID of the pool.
        min: u64,
        /// Highest raw ID of the pool.
        max: u64,
        /// Number of allocatable IDs (range size minus reserved IDs).
        capacity: u64,
    },
    /// The store could not serve the request (unreachable, timed out after bounded retries, or
    /// unusable). The operation did not take effect, or took effect in a way a retry will observe
    /// and reuse (every write is idempotent on retry).
    #[error("store unavailable: {reason}")]
    Unavailable {
        /// What went wrong, for humans.
        reason: String,
    },
    /// The store refused this client (TLS, authentication or permissions: see
    /// [`StoreError::Access`]). Unlike [`Error::Unavailable`], retrying cannot help: the
    /// configuration must change. The reason names the endpoint and never holds a secret.
    #[error("{reason}")]
    AccessDenied {
        /// Which endpoint refused what, and why, for humans.
        reason: String,
    },
    /// The key held by a holder lost its ID (store data lost or edited by hand) and another key got
    /// that ID in between; the key was bound to a new ID. DESIGN G2: never silently.
    #[error(
        "key {key} in pool \"{pool}\" lost ID {old_id} to another key and is now bound to ID {new_id}",
        key = show_value(key)
    )]
    Conflict {
        /// The pool's name.
        pool: String,
        /// The key whose ID changed.
        key: String,
        /// The ID it had.
        old_id: u64,
        /// The ID it has now.
        new_id: u64,
    },
}

/// Results of allocator operations.
pub type Result<T> = std::result::Result<T, Error>;

impl Error {
    /// A short, stable name of the variant (`invalid_input`, `range_mismatch`, `pool_not_found`, `pool_replaced`,
    /// `exhausted`, `unavailable`, `access_denied`, `conflict`): the `kind` of the HTTP API's error bodies and the
    /// `outcome` label of metrics.
    pub fn kind(&self) -> &'static str {
        match self {
            Error::InvalidInput { .. } => "invalid_input",
            Error::RangeMismatch { .. } => "range_mismatch",
            Error::PoolNotFound { .. } => "pool_not_found",
            Error::PoolReplaced { .. } => "pool_replaced",
            Error::Exhausted { .. } => "exhausted",
            Error::Unavailable { .. } => "unavailable",
            Error::AccessDenied { .. } => "access_denied",
            Error::Conflict { .. } => "conflict",
        }
    }

    /// Builds [`Error::InvalidInput`] for a string value, quoting and truncating it with
    /// [`show_value`].
    pub fn invalid_str(what: impl Into<String>, value: &str, rule: impl Into<String>) -> Self {
        Error::InvalidInput { what: what.into(), value: show_value(value), rule: rule.into() }
    }

    /// Builds [`Error::InvalidInput`] for a value already rendered for humans (a number, a range).
    pub fn invalid(what: impl Into<String>, value: impl ToString, rule: impl Into<String>) -> Self {
        Error::InvalidInput { what: what.into(), value: value.to_string(), rule: rule.into() }
    }
}

/// Renders a string value for an error message: Rust-quoted (so control characters and quotes are
/// visible and unambiguous), cut to at most [`SHOWN_VALUE_BYTES`] bytes on a character boundary, and
/// followed by its length in bytes when cut, because "too long" errors are about that length.
pub fn show_value(value: &str) -> String {
    if value.len() <= SHOWN_VALUE_BYTES {
        return format!("{value:?}");
    }
    let mut end = SHOWN_VALUE_BYTES;
    while !value.is_char_boundary(end) {
        end -= 1;
    }
    format!("{:?}… ({} bytes)", &value[..end], value.len())
}

/// Store failures surface as [`Error::Unavailable`].
///
/// Retryable failures (the store is unreachable or timed out) are exactly what `Unavailable` means.
/// The others are mapped there too, with the store's reason kept in the message, because G6 has no
/// other variant for them and none of them is the caller's fault: an invalid store request is an
/// allocator bug, a lease or compaction error is handled by the driver before it can reach a caller,
/// and a locked or corrupt store file means the store cannot serve requests. The prefix
/// "(not retryable)" tells an operator that waiting will not help. The lead may refine this (for
/// example with a `retryable` flag) once the driver exists.
impl From<StoreError> for Error {
    fn from(e: StoreError) -> Self {
        if let StoreError::Access { .. } = e {
            return Error::AccessDenied { reason: e.to_string() };
        }
        if let StoreError::Unavailable(reason) = e {
            // Not `e.to_string()`: both Displays start with "store unavailable: ", and the
            // message would say it twice.
            Error::Unavailable { reason }
        } else if e.is_retryable() {
            Error::Unavailable { reason: e.to_string() }
        } else {
            Error::Unavailable { reason: format!("(not retryable) {e}") }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn short_values_are_quoted_whole() {
        assert_eq!(show_value("abc"), "\"abc\"");
        assert_eq!(show_value("a\"b\n"), "\"a\\\"b\\n\"");
        let exactly = "x".repeat(SHOWN_VALUE_BYTES);
        assert_eq!(show_value(&exactly), format!("\"{exactly}\""));
    }

    #[test]
    fn long_values_are_cut_on_a_char_boundary_with_their_length() {
        let long = "k".repeat(4097);
        let shown = show_value(&long);
        assert_eq!(shown, format!("\"{}\"… (4097 bytes)", "k".repeat(SHOWN_VALUE_BYTES)));

        // 'é' is 2 bytes: 79 ASCII bytes then 'é' straddles the 80-byte limit.
        let tricky = format!("{}é{}", "a".repeat(79), "b".repeat(100));
        let shown = show_value(&tricky);
        assert!(shown.starts_with(&format!("\"{}\"…", "a".repeat(79))), "{shown}");
        assert!(shown.ends_with(&format!("({} bytes)", tricky.len())), "{shown}");
    }

    #[test]
    fn invalid_input_message_names_value_and_rule() {
        let e = Error::invalid_str(
            "key",
            &"k".repeat(4097),
            "keys are non-empty UTF-8, at most 4096 bytes",
        );
        let msg = e.to_string();
        assert!(msg.starts_with("invalid key \"kkk"), "{msg}");
        assert!(
            msg.ends_with("… (4097 bytes): keys are non-empty UTF-8, at most 4096 bytes"),
            "{msg}"
        );
    }

    #[test]
    fn other_messages_name_their_values() {
        let e = Error::Exhausted { pool: "p".into(), min: 1, max: 10, capacity: 8 };
        assert_eq!(
            e.to_string(),
            "pool \"p\" is exhausted: all 8 allocatable IDs in [1, 10] are bound or waiting out their reuse delay"
        );
        let e = Error::PoolNotFound { pool: "net".into() };
        assert!(e.to_string().contains("\"net\""));
        let e = Error::Conflict { pool: "p".into(), key: "a/b".into(), old_id: 5, new_id: 9 };
        assert_eq!(
            e.to_string(),
            "key \"a/b\" in pool \"p\" lost ID 5 to another key and is now bound to ID 9"
        );
        let existing = Box::new(PoolSpec::new("p", 1, 10));
        let requested = Box::new(PoolSpec::new("p", 1, 20));
        let e = Error::RangeMismatch { pool: "p".into(), existing, requested };
        let msg = e.to_string();
        assert!(msg.contains("[1, 10]") && msg.contains("[1, 20]"), "{msg}");
    }

    #[test]
    fn store_errors_become_unavailable_with_reason() {
        let e: Error = StoreError::Unavailable("connection refused".into()).into();
        assert_eq!(e, Error::Unavailable { reason: "connection refused".into() });
        // Said once, not "store unavailable: store unavailable: ..." (issue 9, item 11).
        assert_eq!(e.to_string(), "store unavailable: connection refused");
        let e: Error =
            StoreError::Corrupt { path: "/x.redb".into(), reason: "bad magic".into() }.into();
        match e {
            Error::Unavailable { reason } => {
                assert!(reason.starts_with("(not retryable)"), "{reason}");
                assert!(reason.contains("/x.redb") && reason.contains("bad magic"), "{reason}");
            }
            other => panic!("expected Unavailable, got {other:?}"),
        }
    }
}
