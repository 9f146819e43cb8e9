//! The history one client process writes: JSON lines, one per event, appended and flushed before
//! the next step, so a process killed with SIGKILL loses at most the line it was writing (a torn
//! last line is ignored when reading).
//!
//! Timestamps are wall-clock nanoseconds since the Unix epoch: every process runs on the same
//! machine, so they share one clock, which is all the real-time order of linearizability needs.

use std::path::Path;
use std::time::{SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};

/// Now, in wall-clock nanoseconds since the Unix epoch.
pub fn now_ns() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_nanos() as u64)
}

/// Which allocator call an operation is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum OpKind {
    /// `Pool::acquire_durable(key, holder)`.
    Acquire,
    /// `Pool::release_durable(key, holder)`; for a client session's holder, the session's
    /// release (which is that call).
    Release,
    /// `ClientSession::keep_alive()` of the session whose holder the record names (no key).
    Renew,
    /// `ClientSession::end()`: revokes the session's lease (no key).
    Revoke,
    /// `Pool::get_consistent(key)`: reads the key's ID (no holder's doing; `holder` names the
    /// caller).
    Get,
}

/// What a call returned.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "r", rename_all = "snake_case")]
pub enum Outcome {
    Acquired {
        id: u64,
        new: bool,
    },
    Released {
        held: bool,
        reclaimed: bool,
    },
    /// A renewal or revoke answered: `alive` is `keep_alive`'s `true` (renewed) / `false` (the
    /// lease is gone), or `end`'s "the lease existed".
    Lease {
        alive: bool,
    },
    /// A `get` answered: the key's ID, or `None` if it has none.
    Got {
        id: Option<u64>,
    },
    /// A session's acquire refused because its lease is gone (`Input::SessionGone`): the call
    /// took no effect, and the lease had ended before it returned.
    SessionGone,
    /// An error: `kind` is the G6 variant name (`Unavailable`, `Conflict`...), or `Hang` if the
    /// client's own outer bound ran out first (G6 forbids hangs).
    Error {
        kind: String,
        msg: String,
    },
}

/// One line of a history file.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "ev", rename_all = "snake_case")]
pub enum Record {
    /// A client process started (`proc` names one run of one holder).
    Start { proc: String, holder: String, pid: u32, t: u64 },
    /// A call is about to be made. `batch`: 0 for a single-key call; `n` for one of the `n` keys
    /// of one batched call (`acquire_many_durable` / `release_many_durable`), each key with its
    /// own `seq` and its own return, checked like a single call (a batch keeps each key's
    /// guarantees: DESIGN §12).
    Invoke {
        proc: String,
        holder: String,
        seq: u64,
        op: OpKind,
        key: String,
        t: u64,
        #[serde(default)]
        batch: u32,
    },
    /// The call `seq` of `proc` came back.
    Return { proc: String, seq: u64, t: u64, outcome: Outcome },
    /// A client session was opened (`Allocator::client_session`): its holder name (every later
    /// record of the session names it), lease and TTL; `invoke` is when the grant was asked for,
    /// so the lease cannot expire before `invoke + ttl_ms` unless revoked.
    Session { proc: String, holder: String, lease: i64, ttl_ms: u64, invoke: u64, t: u64 },
    /// The client finished its run normally.
    Done { proc: String, t: u64 },
}

/// One operation, with its return if it had one.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Op {
    pub proc: String,
    pub holder: String,
    pub seq: u64,
    pub kind: OpKind,
    pub key: String,
    pub invoke: u64,
    /// `None`: the process died during the call (indeterminate).
    pub ret: Option<(u64, Outcome)>,
    /// The size of the batched call it was part of (0: a single-key call).
    pub batch: u32,
}

/// A client session, as its `Session` record says.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SessionRec {
    pub proc: String,
    pub holder: String,
    pub lease: i64,
    pub ttl_ms: u64,
    /// When the lease grant was invoked.
    pub invoke: u64,
}

/// Everything read from a set of history files.
#[derive(Debug, Default)]
pub struct History {
    pub ops: Vec<Op>,
    pub sessions: Vec<SessionRec>,
    /// Process runs that wrote `Start`.
    pub starts: usize,
    /// Process runs that wrote `Done`.
    pub dones: usize,
}

/// Reads and joins history files. A last line without its newline (the writer was killed while
/// writing it) is skipped; any other unreadable line is an error naming the file and line.
pub fn read_histories(paths: &[impl AsRef<Path>]) -> Result<History, String> {
    let mut h = History::default();
    let mut open: std::collections::HashMap<(String, u64), usize> = Default::default();
    for path in paths {
        let path = path.as_ref();
        let text = std::fs::read_to_string(path)
            .map_err(|e| format!("cannot read history {}: {e}", path.display()))?;
        let complete = text.ends_with('\n');
        let lines: Vec<&str> = text.lines().collect();
        for (n, line) in lines.iter().enumerate() {
            if line.trim().is_empty() {
                continue;
            }
            let rec: Record = match serde_json::from_str(line) {
                Ok(r) => r,
                Err(_) if !complete && n + 1 == lines.len() => continue,
                Err(e) => {
                    return Err(format!(
                        "{}:{}: bad history line {line:?}: {e}",
                        path.display(),
                        n + 1
                    ))
                }
            };
            match rec {
                Record::Start { .. } => h.starts += 1,
                Record::Done { .. } => h.dones += 1,
                Record::Session { proc, holder, lease, ttl_ms, invoke, .. } => {
                    h.sessions.push(SessionRec { proc, holder, lease, ttl_ms, invoke })
                }
                Record::Invoke { proc, holder, seq, op, key, t, batch } => {
                    open.insert((proc.clone(), seq), h.ops.len());
                    h.ops.push(Op {
                        proc,
                        holder,
                        seq,
                        kind: op,
                        key,
                        invoke: t,
                        ret: None,
                        batch,
                    });
                }
                Record::Return { proc, seq, t, outcome } => {
                    let i = open.remove(&(proc.clone(), seq)).ok_or_else(|| {
                        format!(
                            "{}:{}: return of {proc}#{seq} without an invoke",
                            path.display(),
                            n + 1
                        )
                    })?;
                    h.ops[i].ret = Some((t, outcome));
                }
            }
        }
    }
    Ok(h)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_torn_last_line_is_skipped_and_an_open_call_is_indeterminate() {
        let dir = tempfile_dir();
        let p = dir.join("h.jsonl");
        let inv = Record::Invoke {
            proc: "h0.1".into(),
            holder: "h0".into(),
            seq: 1,
            op: OpKind::Acquire,
            key: "k".into(),
            t: 5,
            batch: 0,
        };
        let text = format!("{}\n{{\"ev\":\"return\",\"pro", serde_json::to_string(&inv).unwrap());
        std::fs::write(&p, text).unwrap();
        let h = read_histories(&[&p]).unwrap();
        assert_eq!(h.ops.len(), 1);
        assert_eq!(h.ops[0].ret, None);

        std::fs::write(&p, "garbage\n").unwrap();
        assert!(read_histories(&[&p]).unwrap_err().contains("bad history line"));
        std::fs::remove_dir_all(dir).unwrap();
    }

    fn tempfile_dir() -> std::path::PathBuf {
        let d = std::env::temp_dir().join(format!(
            "idalloc-chaos-hist-{}-{}",
            std::process::id(),
            now_ns()
        ));
        std::fs::create_dir_all(&d).unwrap();
        d
    }
}
