//! The allocator's public error type: the closed list of failures of DESIGN G6.
//!
//! Every operation of the allocator either succeeds or returns one of these variants, so callers can
//! match on them exhaustively: bad input (fix the call), a pool set up differently elsewhere (fix the
//! configuration), a missing pool, a full pool, an unreachable store (retry later), or a binding that
//! changed under a holder (re-read). Messages name the offending value and the rule it broke, so an
//! operator reading a log line does not need the source to understand it.

pub use crate::show::{show_value, SHOWN_VALUE_BYTES};
use crate::spec::PoolSpec;
use crate::store::{LeaseId, StoreError};

/// Which kind of input an [`Error::InvalidInput`] is about, so callers map it (CLI exit codes, HTTP
/// statuses) without reading the message.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Input {
    /// A key (empty, over 4096 bytes, not UTF-8).
    Key,
    /// A holder name.
    Holder,
    /// A pool name.
    PoolName,
    /// A pool spec or one of its parts (range, reserved IDs, prefix, durations, its JSON).
    Spec,
    /// Configuration: allocator, remote or session options, the store prefix, a remote's name.
    Options,
    /// The call is well formed, but the pool's records stand in the way: deleting a pool that
    /// still has bindings, references or tombstones (or another deployment's records) without
    /// `force`; narrowing a pool over bound IDs, or before the cluster version allows narrowing.
    /// Not the caller's typing: the state of the pool or store must change first.
    PoolInUse,
    /// A client session whose lease has expired or was ended: its references are gone; open a new
    /// session.
    SessionGone,
}

/// Everything an allocator operation can fail with (DESIGN G6).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Error {
    /// The caller passed a value the allocator cannot accept (a bad key, pool name, range...), or
    /// asked for something the pool's state forbids ([`Input::PoolInUse`]). Retrying the same call
    /// cannot help.
    #[error("invalid {what} {value}: {rule}")]
    InvalidInput {
        /// Which kind of input: what callers match on.
        input: Input,
        /// What the value is, for humans: "key", "pool name", "reserved ID list"...
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
    /// (docs/design/protocol.md, "Pool incarnations").
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
    /// The store could not serve the request (unreachable, timed out after bounded retries,
    /// contended, or unusable). The operation did not take effect, or took effect in a way a
    /// retry will observe and reuse (every write is idempotent on retry).
    #[error("store unavailable: {reason}")]
    Unavailable {
        /// What went wrong, for humans.
        reason: String,
        /// Whether the same call may succeed later (the store was unreachable, slow or
        /// contended). `false` when waiting cannot help: the allocator is closed, the store file
        /// is locked read-only, the store answered with something idalloc did not ask for.
        retryable: bool,
        /// The store's own error, when one caused this.
        #[source]
        source: Option<StoreError>,
    },
    /// The store refused this client (TLS, authentication or permissions: see
    /// [`StoreError::Access`]). Unlike [`Error::Unavailable`], retrying cannot help: the
    /// configuration must change. The reason names the endpoint and never holds a secret.
    #[error("{reason}")]
    AccessDenied {
        /// Which endpoint refused what, and why, for humans.
        reason: String,
    },
    /// Data the allocator needs cannot be used: a record idalloc never writes (an unreadable or
    /// lying pool spec, a key record that is not one of the pool's IDs), or a damaged store file.
    /// Never guessed around and never retried: a person must look (`idalloc check` names what
    /// is wrong and repairs what is safe).
    #[error("corrupt data in {what}: {reason}")]
    Corrupt {
        /// Which data: the store record's name or the store file's path.
        what: String,
        /// What is wrong with it.
        reason: String,
    },
    /// The key held by a holder lost its ID (store data lost or edited by hand) and another key got
    /// that ID in between; the key was bound to a new ID. DESIGN G2: never silently.
    ///
    /// Reported as an [`Event::Conflict`](crate::Event::Conflict) on the pool's events (the
    /// holder keeps its key, on the new ID); no operation returns this variant today. It stays in
    /// the closed list so callers that forward events as errors have a kind for them.
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
    /// The error a client-session operation returns once its lease is gone (expired or ended).
    /// Here rather than in `allocator/client_session.rs` because the bind loop returns it too,
    /// and the client session is built on the bind loop (no file imports one that imports it).
    pub(crate) fn lease_gone(lease: LeaseId) -> Error {
        Error::invalid(
            Input::SessionGone,
            "client session",
            format!("lease {lease:x}"),
            "the session's lease has expired or was ended; its references are gone; open a new session",
        )
    }

    /// A short, stable name of the variant (`invalid_input`, `range_mismatch`, `pool_not_found`,
    /// `pool_replaced`, `exhausted`, `unavailable`, `access_denied`, `corrupt`, `conflict`): the
    /// `kind` of the HTTP API's error bodies and the `outcome` label of metrics.
    pub fn kind(&self) -> &'static str {
        match self {
            Error::InvalidInput { .. } => "invalid_input",
            Error::RangeMismatch { .. } => "range_mismatch",
            Error::PoolNotFound { .. } => "pool_not_found",
            Error::PoolReplaced { .. } => "pool_replaced",
            Error::Exhausted { .. } => "exhausted",
            Error::Unavailable { .. } => "unavailable",
            Error::AccessDenied { .. } => "access_denied",
            Error::Corrupt { .. } => "corrupt",
            Error::Conflict { .. } => "conflict",
        }
    }

    /// True if the same call may succeed later without anything else changing: only a retryable
    /// [`Error::Unavailable`].
    pub fn is_retryable(&self) -> bool {
        matches!(self, Error::Unavailable { retryable: true, .. })
    }

    /// True if a store request went unanswered (unreachable, timed out): the call may have taken
    /// effect all the same. Failures the store did answer (a contended key, a view that would
    /// not catch up, an answer of the wrong shape) are not: nothing was written for them.
    pub fn store_did_not_answer(&self) -> bool {
        matches!(self, Error::Unavailable { source: Some(StoreError::Unavailable(_)), .. })
    }

    /// Builds [`Error::InvalidInput`] for a string value, quoting and truncating it with
    /// [`show_value`].
    pub fn invalid_str(
        input: Input,
        what: impl Into<String>,
        value: &str,
        rule: impl Into<String>,
    ) -> Self {
        Error::InvalidInput {
            input,
            what: what.into(),
            value: show_value(value),
            rule: rule.into(),
        }
    }

    /// Builds [`Error::InvalidInput`] for a value already rendered for humans (a number, a range).
    pub fn invalid(
        input: Input,
        what: impl Into<String>,
        value: impl ToString,
        rule: impl Into<String>,
    ) -> Self {
        Error::InvalidInput {
            input,
            what: what.into(),
            value: value.to_string(),
            rule: rule.into(),
        }
    }

    /// A retryable [`Error::Unavailable`] with no store error behind it (timed out, contended).
    pub fn unavailable(reason: impl Into<String>) -> Self {
        Error::Unavailable { reason: reason.into(), retryable: true, source: None }
    }

    /// An [`Error::Unavailable`] that waiting cannot cure (the allocator is closed, the store
    /// answered with something idalloc did not ask for).
    pub fn unavailable_for_good(reason: impl Into<String>) -> Self {
        Error::Unavailable { reason: reason.into(), retryable: false, source: None }
    }

    /// Builds [`Error::Corrupt`].
    pub fn corrupt(what: impl Into<String>, reason: impl Into<String>) -> Self {
        Error::Corrupt { what: what.into(), reason: reason.into() }
    }
}

/// Renders a string value for an error message: Rust-quoted (so control characters and quotes are
/// visible and unambiguous), cut to at most [`SHOWN_VALUE_BYTES`] bytes on a character boundary, and
/// followed by its length in byte:is_retryable`] (an invalid store request is an allocator bug,
/// a lease or compaction error is handled by the driver before it can reach a caller, a locked or
/// read-only store file must be freed or reopened: none of them is the caller's fault, and G6 has
/// no better kind for them).
impl From<StoreError> for Error {
    fn from(e: StoreError) -> Self {
        match e {
            StoreError::Access { .. } => Error::AccessDenied { reason: e.to_string() },
            StoreError::Corrupt { path, reason } => Error::Corrupt { what: path, reason },
            // Not `e.to_string()`: both Displays start with "store unavailable: ", and the
            // message would say it twice.
            StoreError::Unavailable(ref reason) => {
                Error::Unavailable { reason: reason.clone(), retryable: true, source: Some(e) }
            }
            e => Error::Unavailable {
                reason: e.to_string(),
                retryable: e.is_retryable(),
                source: Some(e),
            },
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
            Input::Key,
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
        let down = StoreError::Unavailable("connection refused".into());
        let e: Error = down.clone().into();
        assert_eq!(
            e,
            Error::Unavailable {
                reason: "connection refused".into(),
                retryable: true,
                source: Some(down.clone())
            }
        );
        assert!(e.is_retryable());
        // Said once, not "store unavailable: store unavailable: ...".
        assert_eq!(e.to_string(), "store unavailable: connection refused");
        let source = std::error::Error::source(&e).map(|s| s.to_string());
        assert_eq!(source, Some(down.to_string()));
    }

    #[test]
    fn retryability_is_a_field_not_a_message_prefix() {
        let locked = StoreError::Locked { path: "/x.redb".into(), waited: Default::default() };
        let e: Error = locked.clone().into();
        match &e {
            Error::Unavailable { reason, retryable, source } => {
                assert!(!retryable);
                assert_eq!(source.as_ref(), Some(&locked));
                assert!(!reason.contains("not retryable"), "{reason}");
                assert!(reason.contains("/x.redb"), "{reason}");
            }
            other => panic!("expected Unavailable, got {other:?}"),
        }
        assert!(!e.is_retryable());
        assert!(Error::unavailable("timed out").is_retryable());
        // Only a store that did not answer leaves the outcome unknown.
        assert!(Error::from(StoreError::Unavailable("deadline".into())).store_did_not_answer());
        assert!(!Error::unavailable("key \"k\" stayed contended").store_did_not_answer());
        assert!(!Error::from(StoreError::InvalidRequest("x".into())).store_did_not_answer());
        assert!(!Error::unavailable_for_good("closed").is_retryable());
        assert!(!Error::PoolNotFound { pool: "p".into() }.is_retryable());
    }

    #[test]
    fn a_corrupt_store_file_is_its_own_kind() {
        let e: Error =
            StoreError::Corrupt { path: "/x.redb".into(), reason: "bad magic".into() }.into();
        assert_eq!(e, Error::Corrupt { what: "/x.redb".into(), reason: "bad magic".into() });
        assert_eq!(e.kind(), "corrupt");
        assert!(!e.is_retryable());
        assert_eq!(e.to_string(), "corrupt data in /x.redb: bad magic");
    }

    #[test]
    fn access_refusals_are_access_denied() {
        let e: Error = StoreError::Access {
            endpoint: "127.0.0.1:1".into(),
            cause: crate::store::AccessCause::Permission,
            detail: "no role".into(),
        }
        .into();
        assert_eq!(e.kind(), "access_denied");
        assert!(!e.is_retryable());
    }
}
