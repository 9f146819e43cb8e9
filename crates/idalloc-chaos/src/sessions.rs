//! When each client session's lease ended, as far as the history can tell: the
//! window `[lo, hi]` the checker places the session's [`Call::LeaseEnd`](crate::model::Call) in.
//!
//! - `lo`, the earliest it can have ended: a lease lives at least its TTL from the moment etcd's
//!   leader granted or renewed it, which is after the call was invoked; so not before
//!   `invoke + TTL` of the grant and of every renewal that answered "renewed" (renewals without
//!   an answer may have extended it too: that only moves the end later, so `lo` stays a lower
//!   bound). A revoke may end it at once: not before the revoke's invocation. A new leader only
//!   ever extends leases (etcd renews them all on election). [`CLOCK_SLACK`] covers the
//!   difference between our wall clock and etcd's monotonic timer.
//!
//!   Except for renewals during a leader fault: etcd before its `ensureLeadership` check in
//!   lease renewal (3.4.23 here; etcd-io/etcd#15247) lets a leader that was frozen or cut off,
//!   and does not know yet that another was elected, answer "renewed" from its own lessor while
//!   the real leader lets the lease expire on the earlier deadline. The chaos run found exactly
//!   that (a lease gone 0.76 s after a renewal answered by the resumed old leader). So a renewal
//!   overlapping a leader fault (the caller's `unreliable` windows) does not move `lo`; nor does
//!   its "gone" set `hi`: the same stale leader can answer "not found" for a lease granted after
//!   it stopped hearing from the others (not seen yet; it follows from the same code path). (Revokes and acquires go through raft: their answers hold.)
//! - `hi`, the latest: the first time it was seen gone — a renewal answering "gone", a revoke
//!   answering (it revoked, or found the lease already gone), a session acquire refused with
//!   "session gone", or the observer's `etcdctl lease timetolive` after the run. Never seen gone
//!   (the lease may still have been alive, e.g. of a process killed within its TTL before the
//!   end), the end is optional: it may or may not have happened by the final scan.
//!
//! A lease seen gone before its `lo` broke the lease contract (or this reasoning): reported.

use std::collections::BTreeMap;

use crate::history::{History, OpKind, Outcome};

/// Allowed disagreement between the clients' wall clock and etcd's lease timer.
pub const CLOCK_SLACK_NS: u64 = 100_000_000;
/// [`CLOCK_SLACK_NS`] as a name for the docs.
pub const CLOCK_SLACK: std::time::Duration = std::time::Duration::from_nanos(CLOCK_SLACK_NS);

/// The end of one session's lease.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LeaseEnd {
    pub holder: String,
    pub lease: i64,
    /// Earliest time it can have ended.
    pub lo: u64,
    /// First time it was seen gone; `None`: never seen gone.
    pub hi: Option<u64>,
}

/// What the observer found of a lease after the run: gone (at that time) or still alive.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FinalLease {
    Gone(u64),
    Alive,
}

/// The lease-end window of every session of `h`; `finals` are the observer's findings after the
/// run (by lease). Errors: leases seen gone before they could have ended.
pub fn lease_ends(
    h: &History,
    finals: &BTreeMap<i64, FinalLease>,
    unreliable: &[(u64, u64)],
) -> (Vec<LeaseEnd>, Vec<String>) {
    let overlaps = |a: u64, b: u64| unreliable.iter().any(|(s, e)| a <= *e && b >= *s);
    let mut problems = Vec::new();
    let mut out = Vec::new();
    for s in &h.sessions {
        let ttl = s.ttl_ms * 1_000_000;
        let mut expiry = s.invoke + ttl;
        let mut revoke_at: Option<u64> = None;
        let mut hi: Option<u64> = None;
        let seen_gone = |t: u64, hi: &mut Option<u64>| *hi = Some(hi.map_or(t, |h| h.min(t)));
        for op in h.ops.iter().filter(|o| o.holder == s.holder) {
            match (op.kind, &op.ret) {
                (OpKind::Renew, Some((t, Outcome::Lease { alive: true })))
                    if !overlaps(op.invoke, *t) =>
                {
                    expiry = expiry.max(op.invoke + ttl)
                }
                (OpKind::Renew, Some((t, Outcome::Lease { alive: false })))
                    if !overlaps(op.invoke, *t) =>
                {
                    seen_gone(*t, &mut hi)
                }
                (OpKind::Revoke, ret) => {
                    revoke_at = Some(revoke_at.map_or(op.invoke, |r| r.min(op.invoke)));
                    if let Some((t, Outcome::Lease { .. })) = ret {
                        seen_gone(*t, &mut hi);
                    }
                }
                (OpKind::Acquire, Some((t, Outcome::SessionGone))) => seen_gone(*t, &mut hi),
                _ => {}
            }
        }
        match finals.get(&s.lease) {
            Some(FinalLease::Gone(t)) => seen_gone(*t, &mut hi),
            Some(FinalLease::Alive) if hi.is_none() => continue,
            _ => {}
        }
        let lo = expiry.saturating_sub(CLOCK_SLACK_NS).min(revoke_at.unwrap_or(u64::MAX));
        if let Some(hi) = hi.filter(|hi| *hi < lo) {
            problems.push(format!(
                "lease {:x} of session {} was seen gone {:.3} s before it could have ended \
                 (its TTL {} ms from its last renewal, and no revoke)",
                s.lease,
                s.holder,
                (lo - hi) as f64 / 1e9,
                s.ttl_ms
            ));
        }
        out.push(LeaseEnd { holder: s.holder.clone(), lease: s.lease, lo, hi });
    }
    (out, problems)
}

/// Reads `etcdctl lease timetolive`'s answer: `Some(true)` alive ("granted with TTL(..),
/// remaining(..)"), `Some(false)` gone ("already expired"), `None` if neither (an error).
pub fn parse_timetolive(text: &str) -> Option<bool> {
    if text.contains("already expired") {
        Some(false)
    } else if text.contains("remaining(") {
        Some(true)
    } else {
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::history::{Op, SessionRec};

    const S: u64 = 1_000_000_000;

    fn op(kind: OpKind, invoke: u64, ret: Option<(u64, Outcome)>) -> Op {
        Op {
            proc: "h1.1".into(),
            holder: "h1-c1".into(),
            seq: 0,
            kind,
            key: String::new(),
            invoke,
            ret,
            batch: 0,
        }
    }

    fn history(ops: Vec<Op>) -> History {
        History {
            ops,
            sessions: vec![SessionRec {
                proc: "h1.1".into(),
                holder: "h1-c1".into(),
                lease: 1,
                ttl_ms: 2000,
                invoke: 10 * S,
            }],
            ..History::default()
        }
    }

    #[test]
    fn renewals_push_the_earliest_end_and_sightings_set_the_latest() {
        let h = history(vec![
            op(OpKind::Renew, 11 * S, Some((11 * S + 5, Outcome::Lease { alive: true }))),
            op(OpKind::Renew, 12 * S, None),
            op(OpKind::Renew, 20 * S, Some((20 * S + 5, Outcome::Lease { alive: false }))),
            op(OpKind::Acquire, 21 * S, Some((21 * S, Outcome::SessionGone))),
        ]);
        let (ends, problems) = lease_ends(&h, &BTreeMap::new(), &[]);
        assert!(problems.is_empty(), "{problems:?}");
        assert_eq!(ends[0].lo, 13 * S - CLOCK_SLACK_NS);
        assert_eq!(ends[0].hi, Some(20 * S + 5));
    }

    #[test]
    fn a_revoke_may_end_it_early_and_an_unseen_end_is_open() {
        let h = history(vec![op(
            OpKind::Revoke,
            10 * S + 10,
            Some((10 * S + 20, Outcome::Lease { alive: true })),
        )]);
        let (ends, _) = lease_ends(&h, &BTreeMap::new(), &[]);
        assert_eq!((ends[0].lo, ends[0].hi), (10 * S + 10, Some(10 * S + 20)));
        // Never seen: open; seen alive after the run: no end at all; gone: by then.
        let h = history(vec![]);
        assert_eq!(lease_ends(&h, &BTreeMap::new(), &[]).0[0].hi, None);
        let alive = [(1, FinalLease::Alive)].into();
        assert!(lease_ends(&h, &alive, &[]).0.is_empty());
        let gone = [(1, FinalLease::Gone(99 * S))].into();
        assert_eq!(lease_ends(&h, &gone, &[]).0[0].hi, Some(99 * S));
    }

    #[test]
    fn a_lease_gone_before_its_ttl_is_reported() {
        let h = history(vec![op(
            OpKind::Renew,
            11 * S,
            Some((11 * S + 5, Outcome::Lease { alive: false })),
        )]);
        let (_, problems) = lease_ends(&h, &BTreeMap::new(), &[]);
        assert_eq!(problems.len(), 1, "{problems:?}");
        // Renewed at 11 s, seen gone at 12.5 s: too early...
        let h = history(vec![
            op(OpKind::Renew, 11 * S, Some((11 * S + 5, Outcome::Lease { alive: true }))),
            op(OpKind::Renew, 12 * S, Some((12 * S + S / 2, Outcome::Lease { alive: false }))),
        ]);
        assert_eq!(lease_ends(&h, &BTreeMap::new(), &[]).1.len(), 1);
        // ...unless that renewal overlapped a leader fault: a stale leader may have answered it.
        let (ends, problems) = lease_ends(&h, &BTreeMap::new(), &[(11 * S + 1, 11 * S + 2)]);
        assert!(problems.is_empty(), "{problems:?}");
        assert_eq!(ends[0].lo, 12 * S - CLOCK_SLACK_NS);
        // A "gone" from a renewal during a leader fault is not a sighting either.
        let (ends, _) = lease_ends(&h, &BTreeMap::new(), &[(12 * S + 1, 12 * S + 2)]);
        assert_eq!(ends[0].hi, None);
        assert_eq!(parse_timetolive("lease 1 already expired"), Some(false));
        assert_eq!(parse_timetolive("lease 1 granted with TTL(2s), remaining(1s)"), Some(true));
        assert_eq!(parse_timetolive("Error: context deadline exceeded"), None);
    }
}
