//! TEST-ONLY protocol sabotage (feature `sabotage`): switches that deliberately break the protocol,
//! so the deterministic simulation (`tests/simulation.rs`) can show that its checker catches real
//! violations. Never enable this feature in a build that serves users.
//!
//! The switch is per thread: the simulation runs each seed on a current-thread runtime, so every
//! allocator task of that run sees the switch, while tests running on other threads are untouched.
//! Off by default; [`set`] turns one sabotage on for the calling thread.

use std::cell::Cell;

/// Which part of the protocol to break.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Sabotage {
    /// The protocol as designed.
    None,
    /// New-key binds omit the "key record absent" compare: two nodes binding one new key at once
    /// both succeed with different IDs (breaks G1).
    SkipKeyAbsentCompare,
    /// Reclaims delete the ID record instead of writing a tombstone: the ID is reusable at once
    /// (breaks G5).
    SkipReuseTombstone,
}

thread_local! {
    static ACTIVE: Cell<Sabotage> = const { Cell::new(Sabotage::None) };
}

/// Turns `s` on for the calling thread (`Sabotage::None` turns sabotage off).
pub fn set(s: Sabotage) {
    ACTIVE.with(|a| a.set(s));
}

/// The sabotage active on the calling thread.
pub fn active() -> Sabotage {
    ACTIVE.with(|a| a.get())
}

/// True if `s` is active on the calling thread.
pub(crate) fn is(s: Sabotage) -> bool {
    active() == s
}
