//! A linearizability checker for the history of one key against [`crate::model`], in the spirit
//! of Wing & Gong / Lowe's just-in-time linearization: walk the calls and returns in real-time
//! order, keeping every configuration (model state, calls invoked but not yet linearized) that
//! explains the history so far. At a return, each configuration must linearize the returning call,
//! possibly after some other pending calls; configurations that cannot are dropped. If none is
//! left, no linearization exists and the returning call is reported.
//!
//! Calls without a definite answer ([`Ret::Unknown`]: the process died mid-call, or an error that
//! may have come after the write committed) may take effect at any point between their invocation
//! and their `end` (a bound the caller chooses: a request cannot commit long after its process
//! stopped sending it), or never. Bounding that window keeps the search small: without it every
//! unknown call would stay pending forever and the configurations would double with each.

use std::collections::{BTreeSet, HashMap, HashSet, VecDeque};

use crate::model::{step, Call, KeyState, Ret};

/// One call on the key.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KeyOp {
    pub call: Call,
    pub ret: Ret,
    /// Invocation time.
    pub invoke: u64,
    /// Return time; for [`Ret::Unknown`], the latest time it may take effect.
    pub end: u64,
}

/// Why a history is not linearizable.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Violation {
    /// Index (into the input) of the call no configuration could linearize by its return.
    pub op: usize,
    /// Up to a few model states that explained the history just before that return.
    pub states_before: Vec<KeyState>,
}

/// Statistics of a successful check.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Checked {
    pub ops: usize,
    /// Largest number of configurations kept at once (a measure of the search's width).
    pub max_configs: usize,
}

/// Bound on configurations kept at once; past it the check gives up (reported as an error,
/// never as a pass).
pub const MAX_CONFIGS: usize = 200_000;

type Config = (KeyState, BTreeSet<usize>);

/// Checks `ops` starting from `initial`.
pub fn check(initial: KeyState, ops: &[KeyOp]) -> Result<Checked, CheckError> {
    // Events: (time, 0 = invoke / 1 = return or end, op). Invocations first at equal times, so
    // calls that touch in time count as concurrent (the lenient reading).
    let mut events: Vec<(u64, u8, usize)> = Vec::with_capacity(ops.len() * 2);
    for (i, op) in ops.iter().enumerate() {
        events.push((op.invoke, 0, i));
        events.push((op.end.max(op.invoke), 1, i));
    }
    events.sort();
    let mut configs: HashSet<Config> = HashSet::new();
    configs.insert((initial, BTreeSet::new()));
    let mut stats = Checked { ops: ops.len(), max_configs: 1 };
    // The latest invocation of an acquire by each holder (for `settle`).
    let mut last_acquire: HashMap<u32, u64> = HashMap::new();
    for op in ops {
        if let Call::Acquire { holder } = op.call {
            let t = last_acquire.entry(holder).or_default();
            *t = (*t).max(op.invoke);
        }
    }
    for (now, kind, i) in events {
        if kind == 0 {
            configs = configs
                .into_iter()
                .map(|(s, mut p)| {
                    p.insert(i);
                    settle(ops, &last_acquire, now, s, p)
                })
                .collect();
            continue;
        }
        let unknown = ops[i].ret == Ret::Unknown;
        let mut next: HashSet<Config> = linearize_through(ops, &configs, i)?;
        if unknown {
            // ...or it never took effect.
            for (s, p) in &configs {
                let mut p = p.clone();
                p.remove(&i);
                next.insert((s.clone(), p));
            }
        }
        let next: HashSet<Config> =
            next.into_iter().map(|(s, p)| settle(ops, &last_acquire, now, s, p)).collect();
        if next.is_empty() {
            return Err(CheckError::Violation(Violation {
                op: i,
                states_before: configs.iter().take(4).map(|(s, _)| s.clone()).collect(),
            }));
        }
        configs = next;
        stats.max_configs = stats.max_configs.max(configs.len());
    }
    Ok(stats)
}

/// Linearizes at once every pending lease end that can no longer change anything: its holder has
/// no reference in `s`, and no acquire of that holder is pending or still to be invoked after
/// `now` (only an acquire could give it one again, or meet the ended lease). Placing such an end
/// now or at any later point of its window gives the same states, so keeping both would only
/// double the configurations for each (the lease ends of killed clients, whose windows run to the
/// end of the history, made the widest search 2,048 in 60 s runs without this).
fn settle(
    ops: &[KeyOp],
    last_acquire: &HashMap<u32, u64>,
    now: u64,
    mut s: KeyState,
    mut pending: BTreeSet<usize>,
) -> Config {
    let acquiring = |h: u32, pending: &BTreeSet<usize>| {
        last_acquire.get(&h).is_some_and(|t| *t >= now)
            || pending.iter().any(|q| ops[*q].call == Call::Acquire { holder: h })
    };
    let inert: Vec<usize> = pending
        .iter()
        .copied()
        .filter(|p| match ops[*p].call {
            Call::LeaseEnd { holder } => {
                !s.holders.contains(&holder) && !acquiring(holder, &pending)
            }
            _ => false,
        })
        .collect();
    for p in inert {
        if let Some(n) = step(&s, &ops[p].call, &ops[p].ret) {
            s = n;
            pending.remove(&p);
        }
    }
    (s, pending)
}

/// Every configuration reachable from `configs` by linearizing pending calls, up to and including
/// `target`, in which `target` is linearized.
fn linearize_through(
    ops: &[KeyOp],
    configs: &HashSet<Config>,
    target: usize,
) -> Result<HashSet<Config>, CheckError> {
    let mut out = HashSet::new();
    let mut seen: HashSet<Config> = configs.clone();
    let mut queue: VecDeque<Config> = configs.iter().cloned().collect();
    while let Some((s, pending)) = queue.pop_front() {
        if !pending.contains(&target) {
            out.insert((s, pending));
            continue;
        }
        for &p in &pending {
            if let Some(n) = step(&s, &ops[p].call, &ops[p].ret) {
                let mut rest = pending.clone();
                rest.remove(&p);
                let c = (n, rest);
                if seen.insert(c.clone()) {
                    if seen.len() > MAX_CONFIGS {
                        return Err(CheckError::TooWide { op: target });
                    }
                    queue.push_back(c);
                }
            }
        }
    }
    Ok(out)
}

/// A failed check.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum CheckError {
    Violation(Violation),
    /// The search exceeded [`MAX_CONFIGS`] at this call: inconclusive, treated as a failure.
    TooWide {
        op: usize,
    },
}

#[cfg(test)]
mod tests {
    use super::*;

    fn acq(h: u32, id: u64, new: bool, invoke: u64, end: u64) -> KeyOp {
        KeyOp { call: Call::Acquire { holder: h }, ret: Ret::Acquired { id, new }, invoke, end }
    }
    fn rel(h: u32, held: bool, reclaimed: bool, invoke: u64, end: u64) -> KeyOp {
        KeyOp {
            call: Call::Release { holder: h },
            ret: Ret::Released { held, reclaimed },
            invoke,
            end,
        }
    }
    fn unknown(call: Call, invoke: u64, end: u64) -> KeyOp {
        KeyOp { call, ret: Ret::Unknown, invoke, end }
    }
    fn observe(bound: Option<u64>, holders: &[u32], t: u64) -> KeyOp {
        KeyOp {
            call: Call::Observe { bound, holders: holders.iter().copied().collect() },
            ret: Ret::Observed,
            invoke: t,
            end: t,
        }
    }
    fn ok(ops: &[KeyOp]) -> bool {
        check(KeyState::default(), ops).is_ok()
    }

    #[test]
    fn sequential_good_history_passes() {
        assert!(ok(&[
            acq(1, 5, true, 0, 1),
            acq(2, 5, false, 2, 3),
            rel(1, true, false, 4, 5),
            rel(1, false, false, 6, 7),
            rel(2, true, true, 8, 9),
            acq(1, 9, true, 10, 11),
            observe(Some(9), &[1], 12),
        ]));
    }

    #[test]
    fn two_new_bindings_without_a_release_between_fail() {
        // Both claim to have created the binding, with different IDs, one after the other.
        let h = [acq(1, 5, true, 0, 1), acq(2, 6, true, 2, 3)];
        assert!(matches!(
            check(KeyState::default(), &h),
            Err(CheckError::Violation(Violation { op: 1, .. }))
        ));
        // Even overlapping: whichever goes second finds the key bound.
        assert!(!ok(&[acq(1, 5, true, 0, 3), acq(2, 6, true, 1, 2)]));
    }

    #[test]
    fn id_change_while_held_fails() {
        assert!(!ok(&[acq(1, 5, true, 0, 1), acq(2, 6, false, 2, 3)]));
    }

    #[test]
    fn concurrent_release_and_acquire_may_order_either_way() {
        // h1 holds; h1's release and h2's acquire overlap. Either the acquire joined (same ID,
        // release not last) or the release reclaimed first (new binding, any ID).
        let base = acq(1, 5, true, 0, 1);
        assert!(ok(&[base.clone(), rel(1, true, false, 2, 5), acq(2, 5, false, 3, 4)]));
        assert!(ok(&[base.clone(), rel(1, true, true, 2, 5), acq(2, 8, true, 3, 4)]));
        // But not "reclaimed" and a join of the old ID with h2 still holding... then a later
        // observe with no binding is a leak the history cannot explain.
        assert!(!ok(&[base.clone(), rel(1, true, false, 2, 3), observe(None, &[], 10),]));
        // Sequential: after a reclaim nobody holds the key.
        assert!(!ok(&[base.clone(), rel(1, true, true, 2, 3), rel(2, true, false, 4, 5)]));
        // A re-bind after a reclaim may say new = false (a retried request finds what its first
        // attempt created), and may get any ID.
        assert!(ok(&[base, rel(1, true, true, 2, 3), acq(2, 7, false, 4, 5)]));
    }

    #[test]
    fn phantom_reference_fails() {
        // Released twice with "held" and no acquire between: a reference came back from nowhere
        // (a late commit of an acquire's timed-out first attempt, docs/design/chaos.md).
        assert!(!ok(&[
            acq(1, 5, true, 0, 1),
            acq(2, 5, false, 2, 3),
            rel(1, true, false, 4, 5),
            rel(1, true, false, 6, 7),
        ]));
        // "Not held" from the holder is read as a retried release that did the work.
        assert!(ok(&[acq(1, 5, true, 0, 1), rel(1, false, false, 2, 3), observe(None, &[], 9)]));
        assert!(!ok(&[
            acq(1, 5, true, 0, 1),
            rel(1, false, false, 2, 3),
            observe(Some(5), &[1], 9)
        ]));
    }

    #[test]
    fn unknown_calls_may_or_may_not_take_effect_within_their_window() {
        // Died mid-acquire; a later acquire by h2 finds it bound (the first took effect)...
        assert!(ok(&[
            unknown(Call::Acquire { holder: 1 }, 0, 100),
            acq(2, 5, false, 10, 11),
            observe(Some(5), &[1, 2], 200),
        ]));
        // ...or creates it (it did not).
        assert!(ok(&[
            unknown(Call::Acquire { holder: 1 }, 0, 100),
            acq(2, 5, true, 10, 11),
            observe(Some(5), &[2], 200),
        ]));
        // Took effect after h2's acquire, still within its window.
        assert!(ok(&[
            unknown(Call::Acquire { holder: 1 }, 0, 100),
            acq(2, 5, true, 10, 11),
            observe(Some(5), &[1, 2], 200),
        ]));
        // But not after its window: h1 appearing then is unexplained.
        assert!(!ok(&[
            unknown(Call::Acquire { holder: 1 }, 0, 100),
            acq(2, 5, true, 150, 151),
            observe(Some(5), &[1, 2], 200),
        ]));
        // An unknown release of the only holder explains a vanished binding.
        assert!(ok(&[
            acq(1, 5, true, 0, 1),
            unknown(Call::Release { holder: 1 }, 2, 50),
            observe(None, &[], 200),
        ]));
        assert!(!ok(&[acq(1, 5, true, 0, 1), observe(None, &[], 200)]));
    }

    #[test]
    fn many_unknown_calls_stay_tractable() {
        let mut h = Vec::new();
        for i in 0..200u64 {
            let holder = (i % 5) as u32;
            let call = if i % 2 == 0 { Call::Acquire { holder } } else { Call::Release { holder } };
            h.push(unknown(call, i * 10, i * 10 + 40));
        }
        h.push(acq(9, 3, false, 3000, 3001));
        h.push(rel(9, true, false, 3002, 3003));
        h.push(observe(Some(3), &[0], 5000));
        // The last five unknown calls (t >= 1950) can leave holder 0 alone on the binding;
        // whether it is satisfiable or not, the check must finish.
        let r = check(KeyState::default(), &h);
        assert!(!matches!(r, Err(CheckError::TooWide { .. })), "{r:?}");
    }

    fn lease_end(h: u32, lo: u64, hi: Option<u64>, last: u64) -> KeyOp {
        match hi {
            Some(hi) => {
                KeyOp { call: Call::LeaseEnd { holder: h }, ret: Ret::Ended, invoke: lo, end: hi }
            }
            None => unknown(Call::LeaseEnd { holder: h }, lo, last),
        }
    }

    #[test]
    fn a_session_held_key_keeps_its_id_until_the_lease_ends() {
        // Session 1000 holds k (ID 5) from t = 1; its lease ends somewhere in [20, 30].
        let base = [acq(1000, 5, true, 0, 1), lease_end(1000, 20, Some(30), 0)];
        // Another holder joining before the window: same ID (G2)...
        assert!(ok(&[base[0].clone(), acq(2, 5, false, 10, 11), base[1].clone()]));
        // ...a different ID while the session holds it is reported.
        let moved = [base[0].clone(), acq(2, 6, false, 10, 11), base[1].clone()];
        assert!(matches!(
            check(KeyState::default(), &moved),
            Err(CheckError::Violation(Violation { op: 1, .. }))
        ));
        // So is a new binding while it holds (the key was reclaimed under the session).
        assert!(!ok(&[base[0].clone(), acq(2, 6, true, 10, 11), base[1].clone()]));
        // And a release by someone else that claims to be the last one.
        assert!(!ok(&[
            base[0].clone(),
            acq(2, 5, false, 4, 5),
            rel(2, true, true, 10, 11),
            base[1].clone()
        ]));
        // After the window the key may have been swept and re-bound to any ID.
        assert!(ok(&[base[0].clone(), base[1].clone(), acq(2, 6, true, 40, 41)]));
        // Overlapping the window: either order.
        assert!(ok(&[base[0].clone(), base[1].clone(), acq(2, 6, true, 25, 26)]));
        assert!(ok(&[base[0].clone(), base[1].clone(), acq(2, 5, false, 25, 26)]));
    }

    #[test]
    fn a_session_reference_vanishing_early_or_surviving_its_lease_is_reported() {
        let held = acq(1000, 5, true, 0, 1);
        // The scan finds the session's reference gone before its lease could have ended.
        assert!(!ok(&[held.clone(), observe(Some(5), &[], 10), lease_end(1000, 20, Some(30), 0)]));
        // ...or still there after its lease was seen gone.
        assert!(!ok(&[
            held.clone(),
            lease_end(1000, 20, Some(30), 0),
            observe(Some(5), &[1000], 40)
        ]));
        // After the end: gone, and the orphan binding swept or not.
        assert!(ok(&[held.clone(), lease_end(1000, 20, Some(30), 0), observe(None, &[], 40)]));
        assert!(ok(&[held.clone(), lease_end(1000, 20, Some(30), 0), observe(Some(5), &[], 40)]));
        // A lease never seen gone may or may not have ended by the scan.
        assert!(ok(&[held.clone(), lease_end(1000, 20, None, 50), observe(Some(5), &[1000], 40)]));
        assert!(ok(&[held.clone(), lease_end(1000, 20, None, 50), observe(None, &[], 40)]));
        // An acquire of the session after its lease was seen gone cannot have succeeded...
        assert!(!ok(&[
            held.clone(),
            lease_end(1000, 20, Some(30), 0),
            acq(1000, 5, false, 40, 41)
        ]));
        // ...and a "session gone" refusal before its lease could have ended is unexplained.
        let gone =
            KeyOp { call: Call::Acquire { holder: 1000 }, ret: Ret::Gone, invoke: 5, end: 6 };
        assert!(!ok(&[held.clone(), gone.clone(), lease_end(1000, 20, Some(30), 0)]));
        let late = KeyOp { invoke: 31, end: 32, ..gone };
        assert!(ok(&[held, lease_end(1000, 20, Some(30), 0), late]));
    }

    #[test]
    fn lease_ends_that_change_nothing_more_do_not_widen_the_search() {
        // 30 sessions each acquire and release the key, then die: their lease ends stay open to
        // the end of the history. Kept pending, they would double the configurations each.
        let mut h = vec![acq(1, 5, true, 0, 1)];
        for i in 0..30u32 {
            let t = 10 + u64::from(i) * 10;
            h.push(acq(1000 + i, 5, false, t, t + 1));
            h.push(rel(1000 + i, true, false, t + 2, t + 3));
            h.push(lease_end(1000 + i, t + 4, None, 10_000));
        }
        h.push(observe(Some(5), &[1], 10_000));
        let c = check(KeyState::default(), &h).unwrap();
        assert!(c.max_configs <= 4, "{c:?}");
        // A session that still holds the key when its lease may end keeps its end pending, and
        // the check still requires it: the scan may find its reference or not...
        let mut h = vec![acq(1, 5, true, 0, 1), acq(1000, 5, false, 2, 3)];
        h.push(lease_end(1000, 4, None, 10_000));
        h.push(observe(Some(5), &[1], 10_000));
        assert!(ok(&h));
        *h.last_mut().unwrap() = observe(Some(5), &[1, 1000], 10_000);
        assert!(ok(&h));
        // ...but a lease seen gone must have taken it.
        h[2] = lease_end(1000, 4, Some(20), 0);
        assert!(!ok(&h));
    }
}
