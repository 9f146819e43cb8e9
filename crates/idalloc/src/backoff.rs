//! Waits between retries: exponential backoff with **full jitter** (AWS Architecture Blog,
//! "Exponential Backoff and Jitter", 2015). The wait before retry `n` (0: the first retry after a
//! failure) is uniform in `[0, min(cap, base · 2ⁿ)]`.
//!
//! Why full jitter and not plain doubling: N processes that fail at the same instant (a store
//! that stalls under a restart storm, a `serve` replica that dies under its agents) retry at the
//! same instants with plain doubling, so every retry is the same storm again, and the requests
//! that time out in it fail again together (100 agents re-listing a pool in
//! lockstep after their pages timed out). A uniform wait over the whole step spreads them over it,
//! for the least total work of the schemes that article compares ("equal jitter", half the step
//! plus a random half, keeps a floor where everyone waits at least as long, and the herd arrives
//! together at that floor's end).
//!
//! Pure: the random draw is an argument ([`FullJitter::wait`]) so the schedule is tested without
//! sleeping, and a seeded caller (the simulation) replays the same waits. `Backoff`
//! (crate-private) adds the count of failures since the last progress and a seeded generator,
//! for the follower.

use std::time::Duration;

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

/// Exponential backoff with full jitter: `base` is the first step, doubling up to `cap`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FullJitter {
    pub base: Duration,
    pub cap: Duration,
}

impl FullJitter {
    /// The largest wait before retry `retry` (0: the first): `min(cap, base · 2^retry)`.
    pub fn ceiling(&self, retry: u32) -> Duration {
        let factor = 1u32.checked_shl(retry).unwrap_or(u32::MAX);
        self.base.saturating_mul(factor).min(self.cap)
    }

    /// The wait before retry `retry` for a uniform draw `unit` in `[0, 1]`: `unit · ceiling`. A
    /// draw outside `[0, 1]` is clamped (NaN counts as 0), so a bad draw cannot stretch a wait.
    pub fn wait(&self, retry: u32, unit: f64) -> Duration {
        let unit = if unit.is_nan() { 0.0 } else { unit.clamp(0.0, 1.0) };
        self.ceiling(retry).mul_f64(unit)
    }
}

/// A retry schedule in progress: [`FullJitter`] with the count of failures since the last
/// progress, drawing from its own seeded generator (a seeded allocator gives the same waits in the
/// same order on every run; an unseeded one seeds from the OS).
#[derive(Debug)]
pub(crate) struct Backoff {
    policy: FullJitter,
    failures: u32,
    rng: StdRng,
}

impl Backoff {
    pub(crate) fn new(policy: FullJitter, seed: u64) -> Backoff {
        Backoff { policy, failures: 0, rng: StdRng::seed_from_u64(seed) }
    }

    /// One more failure: the wait before the next retry.
    pub(crate) fn failed(&mut self) -> Duration {
        let wait = self.policy.wait(self.failures, self.rng.random::<f64>());
        self.failures = self.failures.saturating_add(1);
        wait
    }

    /// Something succeeded (a page read, a watch opened): the next failure waits at most `base`
    /// again.
    pub(crate) fn progressed(&mut self) {
        self.failures = 0;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const P: FullJitter =
        FullJitter { base: Duration::from_millis(50), cap: Duration::from_secs(2) };

    #[test]
    fn the_ceiling_doubles_from_base_to_cap_and_never_overflows() {
        let ms = |r| P.ceiling(r).as_millis();
        assert_eq!((ms(0), ms(1), ms(2), ms(5)), (50, 100, 200, 1600));
        assert_eq!((ms(6), ms(31), ms(32), ms(u32::MAX)), (2000, 2000, 2000, 2000));
    }

    #[test]
    fn the_wait_is_the_draw_times_the_ceiling_anywhere_from_zero() {
        assert_eq!(P.wait(0, 0.0), Duration::ZERO, "full jitter: no floor");
        assert_eq!(P.wait(0, 1.0), Duration::from_millis(50));
        assert_eq!(P.wait(3, 0.5), Duration::from_millis(200));
        assert_eq!(P.wait(9, 0.25), Duration::from_millis(500), "a quarter of the cap");
        // A bad draw cannot stretch or break a wait.
        assert_eq!(P.wait(9, 7.0), Duration::from_secs(2));
        assert_eq!((P.wait(9, -1.0), P.wait(9, f64::NAN)), (Duration::ZERO, Duration::ZERO));
    }

    /// What jitter is for: 1,000 processes that fail together do not retry together. With the
    /// old doubling they all waited exactly 50 ms; here their first waits spread over the step,
    /// every tenth of it holding about a tenth of them.
    #[test]
    fn processes_that_fail_together_spread_over_the_step() {
        let mut tenths = [0usize; 10];
        for seed in 0..1000 {
            let w = Backoff::new(P, seed).failed();
            assert!(w <= P.base, "{w:?}");
            tenths[((w.as_secs_f64() / P.base.as_secs_f64() * 10.0) as usize).min(9)] += 1;
        }
        assert!(tenths.iter().all(|&n| (50..=150).contains(&n)), "{tenths:?}");
    }

    #[test]
    fn failures_grow_the_step_and_progress_resets_it() {
        let mut b = Backoff::new(P, 7);
        let first: Vec<Duration> = (0..8).map(|_| b.failed()).collect();
        for (n, w) in first.iter().enumerate() {
            assert!(*w <= P.ceiling(n as u32), "retry {n} waited {w:?}");
        }
        assert!(first[6..].iter().any(|w| *w > P.base), "the step grew: {first:?}");
        b.progressed();
        assert!(b.failed() <= P.base, "after progress the step is base again");
        // The same seed, the same waits (the simulation replays its seeds).
        let mut again = Backoff::new(P, 7);
        assert_eq!((0..8).map(|_| again.failed()).collect::<Vec<_>>(), first);
    }
}
