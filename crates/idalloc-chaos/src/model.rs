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
//! Which ID an unbound key gets ("any ID not bound to another key") is a cross-key property; the
//! chaos test checks it on raw store scans (G1) instead of here.

use std::collections::BTreeSet;

/// The binding of the key: `None` unbound; `Some(None)` bound to an ID not observed yet.
pub type Bound = Option<Option<u64>>;

/// The state of one key.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct KeyState {
    pub bound: Bound,
    pub holders: BTreeSet<u32>,
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
    /// No answer, or an error that may have come after the write committed: the call took effect
    /// or did not.
    Unknown,
}

/// Applies `call` returning `ret` to `s`: the next state, or `None` if `ret` is impossible in `s`.
/// For [`Ret::Unknown`] this is the state if the call took effect (not taking effect is the
/// checker's business).
pub fn step(s: &KeyState, call: &Call, ret: &Ret) -> Option<KeyState> {
    let mut n = s.clone();
    match (call, ret) {
        (Call::Acquire { holder }, Ret::Acquired { id, new }) => {
            // Joining a binding: it must be this ID (if known), and not created by this call.
            if let Some(b) = s.bound {
                if *new || b.is_some_and(|b| b != *id) {
                    return None;
                }
            }
            n.bound = Some(Some(*id));
            n.holders.insert(*holder);
            Some(n)
        }
        (Call::Acquire { holder }, Ret::Unknown) => {
            if n.bound.is_none() {
                n.bound = Some(None);
            }
            n.holders.insert(*holder);
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
        (Call::Observe { bound, holders }, Ret::Observed) => {
            let bound_ok = match (s.bound, bound) {
                (None, None) => true,
                (Some(None), Some(_)) => true,
                (Some(Some(a)), Some(b)) => a == *b,
                _ => false,
            };
            if !bound_ok || s.holders != *holders {
                return None;
            }
            n.bound = bound.map(Some);
            Some(n)
        }
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn st(bound: Bound, holders: &[u32]) -> KeyState {
        KeyState { bound, holders: holders.iter().copied().collect() }
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
}
