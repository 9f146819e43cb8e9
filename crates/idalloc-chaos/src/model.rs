//! The sequential specification of one key of an idalloc pool with durable references,
//! `idle_grace = 0` (the last release reclaims in its own txn) and no data loss.
//!
//! State: the key's binding (none, or an ID — possibly one not yet known to the checker, when the
//! only call that could have created it never returned) and the set of holders with a reference.
//!
//! - `acquire(k, h)`: bound to `b` → returns `b`, `new = false`, adds `h`; unbound → binds some ID
//!   (the one returned), adds `h`. `new` may be false even when this call created the binding: a
//!   request retried after a lost response finds the binding its first attempt made.
//! - `release(k, h)`: `held` says whether `h` had a reference; the last holder's release reclaims
//!   the binding (`reclaimed = true`); anyone else's does not. `held = false` is also accepted from
//!   a holder that had a reference, with the release's full effect: the allocator retries a request
//!   whose answer was lost (e.g. the etcd member died after its leader committed), and the retry
//!   finds the reference already gone. `held = true` must be exact.
//!
//! - `get(k)`: a consistent read of the binding (`Pool::get_consistent`): its ID, or none. It
//!   changes nothing, but pins an ID not yet known.
//!
//! Which ID an unbound key gets ("any ID not bound to another key") is a cross-key property; the
//! chaos test checks it on raw store scans (G1) instead of here.
//!
//! Session references: a client session's holder acquires and releases like a
//! durable holder, and its references also end with its lease:
//! - `lease_end(h)`: every reference of `h` vanishes (revoke or expiry; etcd deletes the lease's
//!   keys in one step, here seen one key at a time), and `h` can never reference again: an
//!   acquire of `h` linearized after it cannot have succeeded (etcd refuses a put on a gone
//!   lease) and answers "session gone" (`Ret::Gone`), which in turn needs the lease ended.
//! - The lease deletes only references: a binding left without any (an *orphan*) stays until the
//!   sweeper reclaims it, at a moment no history records. So while orphaned, a key may be found
//!   bound to its ID or unbound, and an acquire may join it (same ID, not new) or bind it anew
//!   (any ID). While any reference exists, the key keeps its ID (G2), as for durable holders.

use std::collections::BTreeSet;

/// The binding of the key: `None` unbound; `Some(None)` bound to an ID not observed yet.
pub type Bound = Option<Option<u64>>;

/// The state of one key.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct KeyState {
    pub bound: Bound,
    pub holders: BTreeSet<u32>,
    /// Session holders whose lease has ended (they can hold nothing any more).
    pub ended: BTreeSet<u32>,
}

impl KeyState {
    /// Bound, but nobody references it: a lease end took the last reference, and the sweeper
    /// may reclaim the binding at any moment.
    pub fn orphaned(&self) -> bool {
        self.bound.is_some() && self.holders.is_empty()
    }
}

/// A call on one key; holders are small integers.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Call {
    Acquire {
        holder: u32,
    },
    Release {
        holder: u32,
    },
    /// The lease of the session holder `holder` ended (revoked or expired).
    LeaseEnd {
        holder: u32,
    },
    /// A read of the binding alone (`get`).
    Get,
    /// A read of the whole state (the raw store scan after the run).
    Observe {
        bound: Option<u64>,
        holders: BTreeSet<u32>,
    },
}

/// What a call returned.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Ret {
    Acquired {
        id: u64,
        new: bool,
    },
    Released {
        held: bool,
        reclaimed: bool,
    },
    Observed,
    /// What a `get` read: the ID, or `None` if unbound.
    Got {
        id: Option<u64>,
    },
    /// A lease end that certainly happened within its window (it was seen gone by its end).
    Ended,
    /// A session's acquire refused because the lease is gone: no effect.
    Gone,
    /// No answer, or an error that may have come after the write committed: the call took effect
    /// or did not.
    Unknown,
}

/// Applies `call` returning `ret` to `s`: the next state, or `None` if `ret` is impossible in `s`.
/// For [`Ret::Unknown`] this is the state if the call took effect (not taking effect is the
/// checker's business).
pub fn step(s: &KeyState, call: &Call, ret: &Ret) -> Option<KeyState> {
    let mut n = s.clone();
    let orphan = s.orphaned();
    match (call, ret) {
        (Call::Acquire { holder }, Ret::Acquired { id, new }) => {
            if s.ended.contains(holder) {
                return None;
            }
            // Joining a binding: it must be this ID (if known), and not created by this call.
            // An orphan may have been swept meanwhile: joined or bound anew, any answer fits.
            if let (Some(b), false) = (s.bound, orphan) {
                if *new || b.is_some_and(|b| b != *id) {
                    return None;
                }
            }
            n.bound = Some(Some(*id));
            n.holders.insert(*holder);
            Some(n)
        }
        (Call::Acquire { holder }, Ret::Unknown) => {
            if s.ended.contains(holder) {
                return None;
            }
            if n.bound.is_none() || orphan {
                // Unbound: some ID. Orphaned: its ID, or any if it was swept first.
                n.bound = Some(None);
            }
            n.holders.insert(*holder);
            Some(n)
        }
        (Call::Acquire { holder }, Ret::Gone) => s.ended.contains(holder).then_some(n),
        (Call::Release { holder }, Ret::Released { held: false, reclaimed })
            if orphan && !s.holders.contains(holder) =>
        {
            // Nobody references the orphan: the release finds nothing, and may reclaim it.
            if *reclaimed {
                n.bound = None;
            }
            Some(n)
        }
        (Call::Release { holder }, Ret::Released { held: false, reclaimed: false })
            if s.holders.contains(holder) =>
        {
            // The allocator retried a request whose first attempt had already removed the
            // reference (and maybe reclaimed): the retry finds nothing and says "not held".
            n.holders.remove(holder);
            if n.holders.is_empty() {
                n.bound = None;
            }
            Some(n)
        }
        (Call::Release { holder }, Ret::Released { held, reclaimed }) => {
            if s.holders.contains(holder) != *held {
                return None;
            }
            let last = *held && s.holders.len() == 1;
            if last != *reclaimed {
                return None;
            }
            n.holders.remove(holder);
            if last {
                n.bound = None;
            }
            Some(n)
        }
        (Call::Release { holder }, Ret::Unknown) => {
            if n.holders.remove(holder) && n.holders.is_empty() {
                n.bound = None;
            }
            Some(n)
        }
        (Call::LeaseEnd { holder }, Ret::Ended | Ret::Unknown) => {
            // Only the references go; the binding stays (maybe orphaned) for the sweeper.
            n.holders.remove(holder);
            n.ended.insert(*holder);
            Some(n)
        }
        (Call::Observe { bound, holders }, Ret::Observed) => {
            if !reads(s, *bound) || s.holders != *holders {
                return None;
            }
            n.bound = bound.map(Some);
            Some(n)
        }
        (Call::Get, Ret::Got { id }) => {
            if !reads(s, *id) {
                return None;
            }
            n.bound = id.map(Some);
            Some(n)
        }
        _ => None,
    }
}

/// Whether a read of `s` may find the key bound to `bound` (`None`: unbound).
fn reads(s: &KeyState, bound: Option<u64>) -> bool {
    match (s.bound, bound) {
        (None, None) => true,
        (Some(None), Some(_)) => true,
        (Some(Some(a)), Some(b)) => a == b,
        // Swept.
        (Some(_), None) => s.orphaned(),
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn st(bound: Bound, holders: &[u32]) -> KeyState {
        KeyState { bound, holders: holders.iter().copied().collect(), ended: BTreeSet::new() }
    }

    #[test]
    fn acquire_binds_or_joins() {
        let a = Call::Acquire { holder: 1 };
        let s = step(&st(None, &[]), &a, &Ret::Acquired { id: 7, new: true }).unwrap();
        assert_eq!(s, st(Some(Some(7)), &[1]));
        // Joining an existing binding: same ID, not new.
        let b = Call::Acquire { holder: 2 };
        assert_eq!(
            step(&s, &b, &Ret::Acquired { id: 7, new: false }),
            Some(st(Some(Some(7)), &[1, 2]))
        );
        assert_eq!(step(&s, &b, &Ret::Acquired { id: 8, new: false }), None);
        assert_eq!(step(&s, &b, &Ret::Acquired { id: 7, new: true }), None);
        // An unknown ID gets pinned by the first answer that names it.
        let u = st(Some(None), &[3]);
        assert_eq!(
            step(&u, &b, &Ret::Acquired { id: 9, new: false }),
            Some(st(Some(Some(9)), &[2, 3]))
        );
    }

    #[test]
    fn release_reports_held_and_reclaims_on_the_last_holder() {
        let r = Call::Release { holder: 1 };
        let two = st(Some(Some(7)), &[1, 2]);
        assert_eq!(
            step(&two, &r, &Ret::Released { held: true, reclaimed: false }),
            Some(st(Some(Some(7)), &[2]))
        );
        assert_eq!(step(&two, &r, &Ret::Released { held: true, reclaimed: true }), None);
        let one = st(Some(Some(7)), &[1]);
        assert_eq!(
            step(&one, &r, &Ret::Released { held: true, reclaimed: true }),
            Some(st(None, &[]))
        );
        assert_eq!(step(&one, &r, &Ret::Released { held: true, reclaimed: false }), None);
        // "Not held" from the holder itself: a retry that found its first attempt's work done.
        assert_eq!(
            step(&one, &r, &Ret::Released { held: false, reclaimed: false }),
            Some(st(None, &[]))
        );
        assert_eq!(step(&one, &r, &Ret::Released { held: false, reclaimed: true }), None);
        // "Held" must be exact.
        let none = st(Some(Some(7)), &[2]);
        assert_eq!(step(&none, &r, &Ret::Released { held: true, reclaimed: false }), None);
        let other = st(Some(Some(7)), &[2]);
        assert_eq!(
            step(&other, &r, &Ret::Released { held: false, reclaimed: false }),
            Some(other.clone())
        );
        assert_eq!(step(&other, &r, &Ret::Unknown), Some(other));
        assert_eq!(step(&one, &r, &Ret::Unknown), Some(st(None, &[])));
    }

    #[test]
    fn observe_must_match_the_state() {
        let s = st(Some(Some(7)), &[1]);
        let ok = Call::Observe { bound: Some(7), holders: [1].into() };
        assert_eq!(step(&s, &ok, &Ret::Observed), Some(s.clone()));
        let wrong_id = Call::Observe { bound: Some(8), holders: [1].into() };
        assert_eq!(step(&s, &wrong_id, &Ret::Observed), None);
        let leak = Call::Observe { bound: Some(7), holders: [].into() };
        assert_eq!(step(&st(None, &[]), &leak, &Ret::Observed), None);
    }

    #[test]
    fn get_reads_the_binding_and_pins_an_unknown_id() {
        let held = st(Some(Some(7)), &[1]);
        assert_eq!(step(&held, &Call::Get, &Ret::Got { id: Some(7) }), Some(held.clone()));
        assert_eq!(step(&held, &Call::Get, &Ret::Got { id: Some(8) }), None);
        assert_eq!(step(&held, &Call::Get, &Ret::Got { id: None }), None);
        assert_eq!(step(&st(None, &[]), &Call::Get, &Ret::Got { id: Some(7) }), None);
        assert_eq!(step(&st(None, &[]), &Call::Get, &Ret::Got { id: None }), Some(st(None, &[])));
        let unknown = st(Some(None), &[1]);
        assert_eq!(
            step(&unknown, &Call::Get, &Ret::Got { id: Some(9) }),
            Some(st(Some(Some(9)), &[1]))
        );
    }

    #[test]
    fn a_lease_end_drops_the_reference_and_the_holder_for_good() {
        let end = Call::LeaseEnd { holder: 9 };
        // A session (9) and a durable holder (1) share the key; the lease ends.
        let s = step(&st(Some(Some(7)), &[1, 9]), &end, &Ret::Ended).unwrap();
        assert_eq!(s.holders, [1].into());
        assert_eq!(s.bound, Some(Some(7)));
        assert!(s.ended.contains(&9));
        // The ended session cannot acquire again; its refusal needs the lease ended.
        let again = Call::Acquire { holder: 9 };
        assert_eq!(step(&s, &again, &Ret::Acquired { id: 7, new: false }), None);
        assert_eq!(step(&s, &again, &Ret::Unknown), None);
        assert_eq!(step(&s, &again, &Ret::Gone), Some(s.clone()));
        assert_eq!(step(&st(Some(Some(7)), &[9]), &again, &Ret::Gone), None);
        // The durable holder is now the last one: its release reclaims.
        let r = Call::Release { holder: 1 };
        assert_eq!(
            step(&s, &r, &Ret::Released { held: true, reclaimed: true }).map(|s| s.bound),
            Some(None)
        );
        // While the durable holder holds, the key keeps its ID (G2).
        let other = Call::Acquire { holder: 2 };
        assert_eq!(step(&s, &other, &Ret::Acquired { id: 8, new: false }), None);
    }

    #[test]
    fn an_orphan_may_be_swept_or_joined() {
        let o = step(&st(Some(Some(7)), &[9]), &Call::LeaseEnd { holder: 9 }, &Ret::Ended).unwrap();
        assert!(o.orphaned());
        let a = Call::Acquire { holder: 2 };
        // Joined (same ID) or bound anew after a sweep (any ID, new).
        assert!(step(&o, &a, &Ret::Acquired { id: 7, new: false }).is_some());
        assert!(step(&o, &a, &Ret::Acquired { id: 3, new: true }).is_some());
        // Observed swept, or still bound to its ID, but not to another ID.
        let seen = |bound| Call::Observe { bound, holders: BTreeSet::new() };
        assert!(step(&o, &seen(None), &Ret::Observed).is_some());
        assert!(step(&o, &seen(Some(7)), &Ret::Observed).is_some());
        assert_eq!(step(&o, &seen(Some(3)), &Ret::Observed), None);
        // A key with a reference is not an orphan: it cannot have been swept.
        assert_eq!(step(&st(Some(Some(7)), &[2]), &seen(None), &Ret::Observed), None);
    }
}
