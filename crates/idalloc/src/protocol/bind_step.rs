//! The bind loop of DESIGN §5 as a pure state machine: an input (what the store answered, what the
//! local view offered) goes in, the next step comes out. No I/O, no clock, no randomness: the
//! drivers (`allocator::bind` for one key, `allocator::batch` per key of a batch) execute the steps
//! (pick a candidate, send a txn, read a record, wait for the watch) and feed back what happened.
//!
//! Why a machine rather than the loop itself: the loop's memory (records read from the store and
//! their revisions, collisions lost, whether the store confirmed a full pool) is where G1–G3 are
//! decided, and as a machine every branch is a unit test that checks the step it emits, without a
//! store (the openraft engine / raft-rs `RawNode` split, DESIGN §9).
//!
//! The protocol of one step: [`BindLoop::next`] with [`Input::Resume`] starts the loop (and goes on
//! after every [`Action::Wait`]); every other action names the input that answers it. Before it
//! acts, the driver applies [`Step::learn`] to its cache (a candidate it claimed and did not use is
//! freed again; an ID a txn found taken is marked used).
//!
//! Over ~600 lines only with its tests: about 370 lines of code, then one test per branch
//! (DESIGN §10: unit tests next to the pure code).

use std::collections::HashMap;

use super::{decide, id_is_allocatable, BindOutcome, BindPlan, Decision};
use crate::layout::IdRecord;
use crate::pool::PoolSpec;
use crate::store::Revision;

/// Attempts (decisions) of one bind loop before it gives up as contended: each attempt costs one
/// round trip and only repeats because another writer changed the records in between.
pub const MAX_BIND_ATTEMPTS: usize = 64;

/// Candidates a probing loop ([`Candidates::Probe`]) may lose before it stops guessing: so many
/// taken candidates in one bind mean a nearly full pool (at fill `f`, a uniform guess is taken
/// with probability `f`, so 8 losses are a 1-in-256 event at half fill), where the full view pays
/// for itself. The loop then confirms the pool's usage with one count and loads the view
/// ([`Action::LoadView`]) unless the store is full.
pub const PROBE_COLLISIONS: u32 = 8;

/// Usage reads in a row that find free IDs while the view, caught up to each read's revision,
/// still has none, before the loop gives up as [`Failure::ViewBehind`]. Other writers taking
/// the free IDs between a read and the view's catching up is a race, and every round of it
/// fills the pool further (the next read says full: `Exhausted`); a view that stays full this
/// many times over is not catching up.
pub const VIEW_BEHIND_READS: u32 = 8;

/// Where the loop's fresh candidates come from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Candidates {
    /// The full view of the pool (listed, then watched): a pick is free unless the view lags.
    View,
    /// A partial view: the process has not listed the pool, so a pick is an
    /// ID the process has not seen taken, and only the txn's compares (unchanged: G1–G3) say
    /// whether it is free. There is no watch to wait for after a collision; after
    /// [`PROBE_COLLISIONS`] losses, or when even the partial view has nothing left, the loop
    /// reads the pool's usage and either fails `Exhausted` (the store is full) or asks for the
    /// full view and goes on with it.
    Probe,
    /// A partial view that is made exact before the first fresh pick, for `lowest` pools: the
    /// numeric bottom of the pool is the one thing no bounded read gives
    /// (IDs are decimal in the store, listed in string order). So the loop reads the key record
    /// first ([`Action::PeekKeyRecord`]): a key bound already, by anyone, is joined from its own
    /// records and the pool is never read. Only a new key asks the driver to read every used ID
    /// ([`Action::LoadUsedIds`]: keys only, no values, no watch) into the partial view, and
    /// then picks its lowest free ID. After that the loop behaves as [`Candidates::Probe`]: no
    /// watch to wait for, and after [`PROBE_COLLISIONS`] losses the usage count and the view.
    UsedIds,
}

/// How far the loop trusts the cache about a key's preferred ID.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Hints {
    /// A preferred ID the cache shows taken is skipped for a normal pick (restart restoration:
    /// skipping a hint is always safe, and it saves a failing txn).
    Lenient,
    /// Only a record read from the store moves a key off its preferred ID (single-key binds and
    /// re-referencing held keys: moving one means a `Conflict` for the application, G2).
    Strict,
}

/// What happened since the last step (the answer to the last [`Action`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Input {
    /// Decide now: the first call, and the answer to [`Action::Wait`].
    Resume,
    /// The answer to [`Action::Pick`]: the candidate claimed in the local view, or `None` if the
    /// view has no free ID.
    Picked(Option<u64>),
    /// The answer to [`Action::ReadUsage`]: the key record, the number of ID records that count as
    /// used, and the revision they were read at.
    Usage { key_rec: Option<u64>, used: u64, revision: Revision },
    /// The answer to [`Action::PeekKeyRecord`].
    KeyRecord(Option<u64>),
    /// The answer to [`Action::Send`]: what the txn came to.
    Answer(BindOutcome),
    /// The txn of [`Action::Send`] was not applied (the request failed, the lease is gone, the
    /// answer had the wrong shape). `retry`: the driver repaired the cause (renewed its session)
    /// and the loop goes on; otherwise the driver fails with the error it holds.
    NotApplied { retry: bool },
}

/// The next thing the driver does.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Step {
    /// Tell the local view first: `(id, used)`, as the cache's `learn`.
    pub learn: Option<(u64, bool)>,
    pub action: Action,
}

/// What the driver executes (and which [`Input`] it answers with).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Action {
    /// Claim a free candidate in the local view, spread over the lowest `2^lost` free IDs for the
    /// `lowest` strategy after `lost` collisions → [`Input::Picked`].
    Pick { lost: u32 },
    /// Send this plan's txn (fenced, with the holder's reference) → [`Input::Answer`] or
    /// [`Input::NotApplied`].
    Send(BindPlan),
    /// Read the key record and the number of used ID records, at one revision → [`Input::Usage`].
    /// How every loop (one key or batched, view or probing) confirms a full view: a full view
    /// is final only if the key has no binding and the store is full too at that revision (the
    /// view may lag behind other nodes' reclaims), so `Exhausted` always rests on a read.
    ReadUsage,
    /// Read the key record before deciding whether the pool's used IDs are needed at all
    /// ([`Candidates::UsedIds`]) → [`Input::KeyRecord`]. An absent record means a new key.
    PeekKeyRecord,
    /// Read every used ID of the pool (keys only) into the local view, which stays without a
    /// watch → [`Input::Resume`]. Only a [`Candidates::UsedIds`] loop asks, once, for a key the
    /// store showed unbound.
    LoadUsedIds,
    /// Load the full view of the pool (list it and follow it, as a [`Candidates::View`] loop
    /// assumes) and wait for its first listing → [`Input::Resume`]. Only a probing loop asks.
    LoadView,
    /// Wait (bounded) until the local view has applied this revision (0: no wait) → [`Input::Resume`].
    /// After a collision: others are binding too, and the watch teaches all their IDs at once
    /// where a read-back teaches one.
    Wait(Revision),
    /// Bound: the key holds `id`; `new` if this loop created the binding.
    Done { id: u64, new: bool },
    /// Give up.
    Fail(Failure),
}

/// Why a bind loop gave up (the driver turns it into an [`crate::Error`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Failure {
    /// The pool is full, as confirmed by the store (G6 `Exhausted`).
    Exhausted,
    /// The store has free IDs the local view has not caught up with (`Unavailable`, retryable).
    ViewBehind,
    /// `MAX_BIND_ATTEMPTS` decisions without binding (`Unavailable`).
    Contended,
    /// The pool's spec is not the one decided against (deleted: `None`; re-created: its spec).
    PoolGone { spec_now: Option<crate::store::KeyValue> },
    /// The key record names an ID the pool never hands out (DESIGN §11, G3): refused, unless the
    /// pool was re-created under the driver (which the driver checks).
    ForeignKeyRecord { id: u64 },
    /// The txn was not applied and not retried: the driver's own error stands.
    Aborted,
}

/// Where the loop is between two calls.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Phase {
    /// Ready to decide ([`Input::Resume`]).
    Idle,
    /// Waiting for [`Input::Picked`], to complete this half-made plan.
    Picking { expect_key: Option<u64>, moved_from: Option<(u64, Revision)> },
    /// Waiting for the answer to this plan; `claimed`: its ID is a candidate this loop claimed.
    Sent { plan: BindPlan, claimed: bool },
    /// Waiting for the answer to a read.
    Reading,
    /// Waiting for the answer to [`Action::PeekKeyRecord`].
    Peeking,
    /// Done or failed: every further input fails.
    Over,
}

/// One key's bind loop (see the module docs).
#[derive(Clone, Debug)]
pub struct BindLoop<'a> {
    spec: &'a PoolSpec,
    key: &'a str,
    preferred: Option<u64>,
    hints: Hints,
    /// Fresh candidates come from a partial view ([`Candidates::Probe`]) until the loop asks for
    /// the full view.
    probing: bool,
    /// The partial view still has to be completed with the pool's used IDs before a fresh pick
    /// ([`Candidates::UsedIds`]; cleared once asked for).
    used_ids_wanted: bool,
    /// The key record as last read from the store or, before any read, as the cache believes.
    key_rec: Option<u64>,
    /// A txn or read of this loop read the key record back.
    key_rec_read: bool,
    /// ID records read from the store, with their mod revisions (0: absent).
    observed: HashMap<u64, (Option<IdRecord>, Revision)>,
    /// Candidates that turned out taken: spreads `lowest` picks after collisions.
    lost: u32,
    /// The `Usage` full check ran and found the store full / not full.
    full_confirmed: bool,
    /// Usage reads that found free IDs while the view had none (see [`VIEW_BEHIND_READS`]).
    store_had_free: u32,
    attempts: usize,
    phase: Phase,
}

impl<'a> BindLoop<'a> {
    /// A loop binding `key` in the pool of `spec`, starting from `cached_key_rec` (the cache's
    /// belief about the key record), keeping `preferred` if at all possible: not if `spec` no
    /// longer hands it out (a shrink since it was held), where the key gets a normal pick.
    pub fn new(
        spec: &'a PoolSpec,
        key: &'a str,
        cached_key_rec: Option<u64>,
        preferred: Option<u64>,
        hints: Hints,
    ) -> Self {
        BindLoop {
            spec,
            key,
            preferred: preferred.filter(|&id| super::id_is_allocatable(spec, id)),
            hints,
            probing: false,
            used_ids_wanted: false,
            key_rec: cached_key_rec,
            key_rec_read: false,
            observed: HashMap::new(),
            lost: 0,
            full_confirmed: false,
            store_had_free: 0,
            attempts: 0,
            phase: Phase::Idle,
        }
    }

    /// The same loop taking its fresh candidates from `candidates` (a new loop takes them from
    /// the full view).
    pub fn candidates(mut self, candidates: Candidates) -> Self {
        self.probing = matches!(candidates, Candidates::Probe | Candidates::UsedIds);
        self.used_ids_wanted = candidates == Candidates::UsedIds;
        self
    }

    /// The key this loop binds.
    pub fn key(&self) -> &'a str {
        self.key
    }

    /// The ID to keep if at all possible (a batch's other keys pass over it).
    pub fn preferred(&self) -> Option<u64> {
        self.preferred
    }

    /// Decisions made so far (for logs).
    pub fn attempts(&self) -> usize {
        self.attempts
    }

    /// Takes `input` and returns the next step. `cache(id)` is the local view's record of `id`,
    /// consulted only when deciding ([`Input::Resume`]).
    pub fn next(&mut self, input: Input, cache: impl Fn(u64) -> Option<IdRecord>) -> Step {
        let phase = std::mem::replace(&mut self.phase, Phase::Idle);
        match (phase, input) {
            (Phase::Idle, Input::Resume) => self.decide(cache),
            (Phase::Picking { expect_key, moved_from }, Input::Picked(Some(id))) => {
                let plan = BindPlan { expect_key, id, expect_id: None, moved_from };
                self.send(plan, true)
            }
            (Phase::Picking { .. }, Input::Picked(None)) => self.view_full(),
            (Phase::Reading, Input::Usage { key_rec, used, revision }) => {
                self.full_confirmed = true;
                self.key_rec = key_rec;
                self.key_rec_read = true;
                if key_rec.is_some() || self.preferred.is_some() {
                    // Not a new key after all (another node bound it; or a repair keeping its
                    // ID): decide again with what was read.
                    self.wait(None, 0)
                } else if used >= self.spec.capacity() {
                    self.fail(None, Failure::Exhausted)
                } else if self.probing {
                    // Free IDs exist, but guessing keeps missing them: load the view (which is
                    // newer than this read when it is done) and pick from it.
                    self.probing = false;
                    self.used_ids_wanted = false;
                    self.store_had_free += 1;
                    self.phase = Phase::Idle;
                    act_step(Action::LoadView)
                } else {
                    // Let the watch catch up with the store, then pick again.
                    self.store_had_free += 1;
                    self.wait(None, revision)
                }
            }
            (Phase::Peeking, Input::KeyRecord(key_rec)) => {
                // Bound (by anyone): the next decision joins it. Absent: a new key, and the
                // next decision asks for the used IDs.
                self.key_rec = key_rec;
                self.key_rec_read = true;
                self.wait(None, 0)
            }
            (Phase::Sent { plan, claimed }, Input::Answer(outcome)) => {
                self.answer(plan, claimed, outcome)
            }
            (Phase::Sent { plan, claimed }, Input::NotApplied { retry }) => {
                let free = claimed.then_some((plan.id, false));
                if retry {
                    self.wait(free, 0)
                } else {
                    self.fail(free, Failure::Aborted)
                }
            }
            // An input that answers no step of this loop (a driver bug), or any input after the
            // end: stop rather than guess.
            (_, _) => self.fail(None, Failure::Aborted),
        }
    }

    /// One decision (DESIGN §5): what the key record points at, else the preferred ID, else a
    /// fresh candidate.
    fn decide(&mut self, cache: impl Fn(u64) -> Option<IdRecord>) -> Step {
        if self.attempts >= MAX_BIND_ATTEMPTS {
            return self.fail(None, Failure::Contended);
        }
        self.attempts += 1;
        let (key, key_rec, hints) = (self.key, self.key_rec, self.hints);
        let observed = &self.observed;
        let decision = decide(
            key,
            key_rec,
            |id| match observed.get(&id) {
                Some((rec, _)) => Some(rec.clone()),
                // The cache may lag behind the store (a broken watch, a partition): it may still
                // show an ID under a key it no longer belongs to. Only a record read from the
                // store may prove that an ID belongs to another key (which moves this key to a
                // fresh ID, G2); an unverified "not ours" counts as unknown, so the next txn
                // compares on it and reads it back. With lenient hints and no key record, the only
                // ID asked about is the preferred one, and a cache showing it taken just means a
                // normal pick instead of a txn that would fail.
                None => match cache(id) {
                    Some(rec)
                        if rec.key() == key || (key_rec.is_none() && hints == Hints::Lenient) =>
                    {
                        Some(Some(rec))
                    }
                    _ => None,
                },
            },
            self.preferred,
        );
        match decision {
            Decision::Send(plan) => self.send(plan, false),
            Decision::NeedCandidate { expect_key, .. } if self.used_ids_wanted && self.probing => {
                if !self.key_rec_read && expect_key.is_none() {
                    // Unread, the key may be bound by another process: its record (one read)
                    // decides whether the pool's used IDs (a pass over the pool) are needed.
                    self.phase = Phase::Peeking;
                    return act_step(Action::PeekKeyRecord);
                }
                self.used_ids_wanted = false;
                self.phase = Phase::Idle;
                act_step(Action::LoadUsedIds)
            }
            Decision::NeedCandidate { expect_key, moved_from } => {
                let moved_from = pinned(moved_from, |id| observed.get(&id).map(|o| o.1));
                self.phase = Phase::Picking { expect_key, moved_from };
                Step { learn: None, action: Action::Pick { lost: self.lost } }
            }
        }
    }

    /// The local view has no free ID: a full pool is final only once the store confirms it.
    fn view_full(&mut self) -> Step {
        if self.probing {
            // Even the partial view is out of candidates (a tiny pool): only the store can say
            // whether it is full.
            return self.read(Action::ReadUsage);
        }
        if self.store_had_free >= VIEW_BEHIND_READS {
            // The store had free IDs at every read, and the view, let catch up to each read's
            // revision, still has none: the view is stuck (`Unavailable`, retryable).
            self.fail(None, Failure::ViewBehind)
        } else if self.store_had_free > 0 {
            // The store had free IDs at the last read, the view caught up to it and has none:
            // others took them meanwhile, or the view is stuck. Only a new read tells which
            // (full now: `Exhausted`).
            self.read(Action::ReadUsage)
        } else if self.full_confirmed {
            // The last read found the store full and the view agrees.
            self.fail(None, Failure::Exhausted)
        } else {
            self.read(Action::ReadUsage)
        }
    }

    /// What a sent plan came to.
    fn answer(&mut self, plan: BindPlan, claimed: bool, outcome: BindOutcome) -> Step {
        match outcome {
            BindOutcome::PoolGone { spec_now } => {
                self.fail(claimed.then_some((plan.id, false)), Failure::PoolGone { spec_now })
            }
            BindOutcome::Bound { id, .. } => {
                self.phase = Phase::Over;
                Step {
                    learn: Some((id, true)),
                    action: Action::Done { id, new: plan.creates_binding() },
                }
            }
            BindOutcome::Observed(obs) => {
                let learn = Some((obs.id, obs.id_rec.is_some()));
                if claimed && obs.id_rec.is_some() {
                    self.lost += 1;
                }
                self.observed.insert(obs.id, (obs.id_rec, obs.records_revision));
                if let Some((from, rec, rev)) = obs.moved_from {
                    self.observed.insert(from, (rec, rev));
                }
                self.key_rec = obs.key_rec;
                self.key_rec_read = true;
                match self.key_rec {
                    Some(x) if !id_is_allocatable(self.spec, x) => {
                        self.fail(learn, Failure::ForeignKeyRecord { id: x })
                    }
                    None if self.probing && self.lost >= PROBE_COLLISIONS => {
                        // Many guesses taken: a nearly full pool (see `PROBE_COLLISIONS`).
                        self.phase = Phase::Reading;
                        Step { learn, action: Action::ReadUsage }
                    }
                    // A probing loop has no watch to wait for: decide again at once.
                    _ if self.probing => self.wait(learn, 0),
                    _ => self.wait(learn, obs.records_revision),
                }
            }
        }
    }

    fn send(&mut self, plan: BindPlan, claimed: bool) -> Step {
        self.phase = Phase::Sent { plan: plan.clone(), claimed };
        Step { learn: None, action: Action::Send(plan) }
    }

    fn read(&mut self, action: Action) -> Step {
        self.phase = Phase::Reading;
        Step { learn: None, action }
    }

    fn wait(&mut self, learn: Option<(u64, bool)>, revision: Revision) -> Step {
        self.phase = Phase::Idle;
        Step { learn, action: Action::Wait(revision) }
    }

    fn fail(&mut self, learn: Option<(u64, bool)>, failure: Failure) -> Step {
        self.phase = Phase::Over;
        Step { learn, action: Action::Fail(failure) }
    }
}

/// A step with nothing to learn.
fn act_step(action: Action) -> Step {
    Step { learn: None, action }
}

/// The move-off pin of a plan: the ID a key moves off and the mod revision of its record as read
/// from the store (`revision_of`). `decide` only asks to move a key off an ID whose record was
/// read (a cached record never proves another key's claim), so the revision is known; if it were
/// not, 0 ("absent") makes the txn fail and read the record back rather than move blindly.
fn pinned(
    moved_from: Option<(u64, IdRecord)>,
    revision_of: impl Fn(u64) -> Option<Revision>,
) -> Option<(u64, Revision)> {
    moved_from.map(|(id, _)| (id, revision_of(id).unwrap_or(0)))
}

/// Each test drives the machine through one branch and checks the steps it emits; each names the
/// DESIGN.md section (or guarantee) it checks.
#[cfg(test)]
mod tests {
    use super::*;
    use crate::protocol::Observation;

    const KEY: &str = "k";

    /// Pool `p`: IDs 1..=100 (capacity 100), 50 reserved.
    fn spec() -> PoolSpec {
        PoolSpec::new("p", 1, 100).reserve(50..=50)
    }

    fn bound(k: &str) -> IdRecord {
        IdRecord::Bound(k.into())
    }

    /// A cache that knows nothing.
    fn empty(_: u64) -> Option<IdRecord> {
        None
    }

    fn act(action: Action) -> Step {
        Step { learn: None, action }
    }

    fn strict<'a>(spec: &'a PoolSpec, cached: Option<u64>, preferred: Option<u64>) -> BindLoop<'a> {
        BindLoop::new(spec, KEY, cached, preferred, Hints::Strict)
    }

    fn batched<'a>(spec: &'a PoolSpec, preferred: Option<u64>) -> BindLoop<'a> {
        BindLoop::new(spec, KEY, None, preferred, Hints::Lenient)
    }

    /// A failed compare's read-back: the key record, the sent ID's record and its mod revision.
    fn observed(
        key_rec: Option<u64>,
        id: u64,
        id_rec: Option<IdRecord>,
        records_revision: Revision,
    ) -> Input {
        Input::Answer(BindOutcome::Observed(Observation {
            key_rec,
            id,
            id_rec,
            revision: records_revision + 1,
            records_revision,
            moved_from: None,
        }))
    }

    fn create(id: u64) -> Action {
        Action::Send(BindPlan { expect_key: None, id, expect_id: None, moved_from: None })
    }

    fn join(id: u64) -> Action {
        Action::Send(BindPlan {
            expect_key: Some(id),
            id,
            expect_id: Some(bound(KEY)),
            moved_from: None,
        })
    }

    /// Runs a new key up to its create txn for candidate `c`.
    fn sent_create(l: &mut BindLoop<'_>, c: u64) {
        assert_eq!(l.next(Input::Resume, empty), act(Action::Pick { lost: 0 }));
        assert_eq!(l.next(Input::Picked(Some(c)), empty), act(create(c)));
    }

    #[test]
    fn known_binding_joins_in_one_txn() {
        // DESIGN §5, "acquire(k), binding known from the cache": one txn comparing key/k == ID.
        let spec = spec();
        let mut l = strict(&spec, Some(7), None);
        let cache = |id| (id == 7).then(|| bound(KEY));
        assert_eq!(l.next(Input::Resume, cache), act(join(7)));
        let done = l.next(Input::Answer(BindOutcome::Bound { id: 7, revision: 9 }), empty);
        assert_eq!(
            done,
            Step { learn: Some((7, true)), action: Action::Done { id: 7, new: false } }
        );
    }

    #[test]
    fn new_key_picks_a_candidate_and_creates_in_one_txn() {
        // DESIGN §5, "acquire(k), new key": pick C from the local view, one create txn.
        let spec = spec();
        let mut l = strict(&spec, None, None);
        sent_create(&mut l, 12);
        let done = l.next(Input::Answer(BindOutcome::Bound { id: 12, revision: 3 }), empty);
        assert_eq!(
            done,
            Step { learn: Some((12, true)), action: Action::Done { id: 12, new: true } }
        );
        assert_eq!(l.attempts(), 1);
    }

    #[test]
    fn candidate_taken_learns_it_and_waits_for_the_watch_then_picks_wider() {
        // DESIGN §5, new key, Else branch: "if only C was taken, learn it and pick another"; the
        // loss widens `lowest`'s spread, and the loop waits for the watch to reach the read-back.
        let spec = spec();
        let mut l = strict(&spec, None, None);
        sent_create(&mut l, 12);
        let step = l.next(observed(None, 12, Some(bound("other")), 40), empty);
        assert_eq!(step, Step { learn: Some((12, true)), action: Action::Wait(40) });
        assert_eq!(l.next(Input::Resume, empty), act(Action::Pick { lost: 1 }));
    }

    #[test]
    fn candidate_found_free_is_not_a_loss() {
        // DESIGN §5: a create that failed only on the key's compare did not lose its candidate;
        // it is learned free and the spread stays.
        let spec = spec();
        let mut l = strict(&spec, None, None);
        sent_create(&mut l, 12);
        let step = l.next(observed(None, 12, None, 0), empty);
        assert_eq!(step, Step { learn: Some((12, false)), action: Action::Wait(0) });
        assert_eq!(l.next(Input::Resume, empty), act(Action::Pick { lost: 0 }));
    }

    #[test]
    fn key_bound_elsewhere_meanwhile_is_joined() {
        // DESIGN §5, new key, Else branch: "if key/k exists use it (1 more RT)".
        let spec = spec();
        let mut l = strict(&spec, None, None);
        sent_create(&mut l, 12);
        let step = l.next(observed(Some(30), 12, None, 0), empty);
        assert_eq!(step, Step { learn: Some((12, false)), action: Action::Wait(0) });
        // The other node's ID record is not in the cache yet: optimistically ours, compared.
        assert_eq!(l.next(Input::Resume, empty), act(join(30)));
    }

    #[test]
    fn cache_saying_the_id_is_another_keys_never_moves_the_key() {
        // G2: only a record read from the store may move a held key; a lagging cache's "not
        // ours" counts as unknown, so the txn compares the record and reads it back.
        let spec = spec();
        let mut l = strict(&spec, Some(7), None);
        let cache = |id| (id == 7).then(|| bound("other"));
        assert_eq!(l.next(Input::Resume, cache), act(join(7)));
    }

    #[test]
    fn id_read_back_as_another_keys_moves_the_key_pinning_that_record() {
        // DESIGN §7 / G2 exception (lost store data): the key record points at an ID the store
        // shows bound to another key; the key moves to a fresh ID with a txn pinning the mod
        // revision of that record, and a later read-back re-pins it.
        let spec = spec();
        let mut l = strict(&spec, Some(7), None);
        assert_eq!(l.next(Input::Resume, empty), act(join(7)));
        let step = l.next(observed(Some(7), 7, Some(bound("other")), 42), empty);
        assert_eq!(step, Step { learn: Some((7, true)), action: Action::Wait(42) });
        assert_eq!(l.next(Input::Resume, empty), act(Action::Pick { lost: 0 }));
        let move_plan = |id, rev| {
            Action::Send(BindPlan {
                expect_key: Some(7),
                id,
                expect_id: None,
                moved_from: Some((7, rev)),
            })
        };
        assert_eq!(l.next(Input::Picked(Some(20)), empty), act(move_plan(20, 42)));
        // The move failed: 7 was rewritten in between (revision 50); 20 was free.
        let again = Input::Answer(BindOutcome::Observed(Observation {
            key_rec: Some(7),
            id: 20,
            id_rec: None,
            revision: 51,
            records_revision: 0,
            moved_from: Some((7, Some(bound("third")), 50)),
        }));
        assert_eq!(
            l.next(again, empty),
            Step { learn: Some((20, false)), action: Action::Wait(0) }
        );
        // The claimed candidate came back free: no loss, and the new pin is revision 50.
        assert_eq!(l.next(Input::Resume, empty), act(Action::Pick { lost: 0 }));
        assert_eq!(l.next(Input::Picked(Some(21)), empty), act(move_plan(21, 50)));
    }

    #[test]
    fn preferred_id_is_kept_when_free() {
        // DESIGN §7: a repair re-creates the binding with the same ID when that ID is free.
        let spec = spec();
        let mut l = strict(&spec, None, Some(9));
        assert_eq!(l.next(Input::Resume, empty), act(create(9)));
    }

    #[test]
    fn a_preferred_id_the_spec_no_longer_hands_out_gives_a_normal_pick() {
        // A repair of a key held at ID 90 after the pool shrank to 1-80 (or 50 reserved since):
        // keeping the ID is impossible, and a plan for it is refused before it is sent, so the
        // repair would retry it for ever.
        for (spec, id) in [(PoolSpec::new("p", 1, 80), 90), (spec(), 50)] {
            for mut l in [strict(&spec, None, Some(id)), batched(&spec, Some(id))] {
                assert_eq!(l.preferred(), None, "{id} in {spec:?}");
                assert_eq!(l.next(Input::Resume, empty), act(Action::Pick { lost: 0 }));
            }
        }
    }

    #[test]
    fn preferred_id_tombstoned_for_the_same_key_is_taken_back() {
        // DESIGN §7: "... when that ID is free or tombstoned for the same key".
        let spec = spec();
        let mut l = strict(&spec, None, Some(9));
        let cache = |id| (id == 9).then(|| IdRecord::Tombstone(KEY.into()));
        assert_eq!(
            l.next(Input::Resume, cache),
            act(Action::Send(BindPlan {
                expect_key: None,
                id: 9,
                expect_id: Some(IdRecord::Tombstone(KEY.into())),
                moved_from: None
            }))
        );
    }

    #[test]
    fn strict_hints_try_a_preferred_id_the_cache_shows_taken() {
        // DESIGN §7 / G2: re-referencing a held key only moves it on a record read from the
        // store, so a cache showing its ID taken still gets the txn (which reads it back).
        let spec = spec();
        let mut l = strict(&spec, None, Some(9));
        let cache = |id| (id == 9).then(|| bound("other"));
        assert_eq!(l.next(Input::Resume, cache), act(create(9)));
    }

    #[test]
    fn lenient_hints_skip_a_preferred_id_the_cache_shows_taken() {
        // DESIGN §12 "Batching" (restart restoration): skipping a hint the cache shows taken is
        // safe and saves a failing txn.
        let spec = spec();
        let mut l = batched(&spec, Some(9));
        let cache = |id| (id == 9).then(|| bound("other"));
        assert_eq!(l.next(Input::Resume, cache), act(Action::Pick { lost: 0 }));
    }

    #[test]
    fn preferred_id_read_back_as_another_keys_gives_a_fresh_pick() {
        // DESIGN §7: "If the ID now belongs to another key, ... bind a new ID".
        let spec = spec();
        let mut l = strict(&spec, None, Some(9));
        assert_eq!(l.next(Input::Resume, empty), act(create(9)));
        let step = l.next(observed(None, 9, Some(bound("other")), 5), empty);
        assert_eq!(step, Step { learn: Some((9, true)), action: Action::Wait(5) });
        // Not a claimed candidate: no loss.
        assert_eq!(l.next(Input::Resume, empty), act(Action::Pick { lost: 0 }));
    }

    fn probing<'a>(spec: &'a PoolSpec) -> BindLoop<'a> {
        strict(spec, None, None).candidates(Candidates::Probe)
    }

    #[test]
    fn probing_loop_decides_again_at_once_after_a_collision() {
        // Without a watch there is nothing to wait for; the taken candidate is
        // learned (so the partial view never offers it again) and the next guess goes out.
        let spec = spec();
        let mut l = probing(&spec);
        sent_create(&mut l, 12);
        let step = l.next(observed(None, 12, Some(bound("other")), 40), empty);
        assert_eq!(step, Step { learn: Some((12, true)), action: Action::Wait(0) });
        assert_eq!(l.next(Input::Resume, empty), act(Action::Pick { lost: 1 }));
        // A key another node bound is joined as with the full view (DESIGN §5: 1 more RT).
        assert_eq!(l.next(Input::Picked(Some(13)), empty), act(create(13)));
        assert_eq!(
            l.next(observed(Some(30), 13, None, 41), empty),
            Step { learn: Some((13, false)), action: Action::Wait(0) }
        );
        assert_eq!(l.next(Input::Resume, empty), act(join(30)));
    }

    /// Runs a probing loop through `PROBE_COLLISIONS` taken candidates; returns the last step.
    fn lose_every_guess(l: &mut BindLoop<'_>) -> Step {
        let mut last = act(Action::Wait(0));
        for c in 0..u64::from(PROBE_COLLISIONS) {
            assert_eq!(last, Step { learn: last.learn, action: Action::Wait(0) });
            assert_eq!(l.next(Input::Resume, empty), act(Action::Pick { lost: c as u32 }));
            assert_eq!(l.next(Input::Picked(Some(c + 1)), empty), act(create(c + 1)));
            last = l.next(observed(None, c + 1, Some(bound("other")), 40), empty);
        }
        last
    }

    #[test]
    fn probing_loop_that_keeps_losing_confirms_usage_then_loads_the_view() {
        // A nearly full pool is where the full view pays; G6 `Exhausted` only
        // when the store's count says full.
        let spec = spec();
        let mut l = probing(&spec);
        let last = lose_every_guess(&mut l);
        assert_eq!(
            last,
            Step { learn: Some((u64::from(PROBE_COLLISIONS), true)), action: Action::ReadUsage }
        );
        let free = Input::Usage { key_rec: None, used: spec.capacity() - 1, revision: 77 };
        assert_eq!(l.next(free, empty), act(Action::LoadView));
        // From now on the loop picks from the full view, as a `View` loop does.
        assert_eq!(l.next(Input::Resume, empty), act(Action::Pick { lost: PROBE_COLLISIONS }));
        assert_eq!(l.next(Input::Picked(Some(70)), empty), act(create(70)));
        let step = l.next(observed(None, 70, Some(bound("other")), 90), empty);
        assert_eq!(step, Step { learn: Some((70, true)), action: Action::Wait(90) });

        let mut l = probing(&spec);
        lose_every_guess(&mut l);
        let full = Input::Usage { key_rec: None, used: spec.capacity(), revision: 77 };
        assert_eq!(l.next(full, empty), act(Action::Fail(Failure::Exhausted)));
    }

    #[test]
    fn probing_loop_without_a_candidate_asks_the_store_not_its_partial_view() {
        // G6: a partial view that has nothing left (every ID of a tiny pool learned taken) proves
        // nothing; the store's count decides, and a key bound meanwhile is joined.
        let spec = spec();
        let mut l = probing(&spec);
        assert_eq!(l.next(Input::Resume, empty), act(Action::Pick { lost: 0 }));
        assert_eq!(l.next(Input::Picked(None), empty), act(Action::ReadUsage));
        let full = Input::Usage { key_rec: None, used: spec.capacity(), revision: 7 };
        assert_eq!(l.next(full, empty), act(Action::Fail(Failure::Exhausted)));

        let mut l = probing(&spec);
        l.next(Input::Resume, empty);
        l.next(Input::Picked(None), empty);
        let bound_elsewhere =
            Input::Usage { key_rec: Some(30), used: spec.capacity(), revision: 8 };
        assert_eq!(l.next(bound_elsewhere, empty), act(Action::Wait(0)));
        assert_eq!(l.next(Input::Resume, empty), act(join(30)));

        let mut l = probing(&spec);
        l.next(Input::Resume, empty);
        l.next(Input::Picked(None), empty);
        let free = Input::Usage { key_rec: None, used: 3, revision: 8 };
        assert_eq!(l.next(free, empty), act(Action::LoadView));
    }

    fn lowest_lazy<'a>(spec: &'a PoolSpec) -> BindLoop<'a> {
        strict(spec, None, None).candidates(Candidates::UsedIds)
    }

    #[test]
    fn lowest_lazy_loop_joins_a_bound_key_without_reading_the_pool() {
        // Lazily opened `lowest` pools: a key bound already (by anyone) costs one read of its
        // record and the join's txn; the used IDs (a pass over the pool) are never asked for.
        let spec = spec();
        let mut l = lowest_lazy(&spec);
        assert_eq!(l.next(Input::Resume, empty), act(Action::PeekKeyRecord));
        assert_eq!(l.next(Input::KeyRecord(Some(30)), empty), act(Action::Wait(0)));
        assert_eq!(l.next(Input::Resume, empty), act(join(30)));
        let done = l.next(Input::Answer(BindOutcome::Bound { id: 30, revision: 9 }), empty);
        assert_eq!(
            done,
            Step { learn: Some((30, true)), action: Action::Done { id: 30, new: false } }
        );
        // A key the cache already knows bound (this process bound it) joins at once.
        let mut l = strict(&spec, Some(7), None).candidates(Candidates::UsedIds);
        assert_eq!(l.next(Input::Resume, empty), act(join(7)));
    }

    #[test]
    fn lowest_lazy_loop_reads_the_used_ids_once_for_a_new_key() {
        // A new key needs the numeric bottom, so the used IDs are read (once)
        // before the first pick; a collision after that decides again at once (no watch), and a
        // key bound meanwhile is joined.
        let spec = spec();
        let mut l = lowest_lazy(&spec);
        assert_eq!(l.next(Input::Resume, empty), act(Action::PeekKeyRecord));
        assert_eq!(l.next(Input::KeyRecord(None), empty), act(Action::Wait(0)));
        assert_eq!(l.next(Input::Resume, empty), act(Action::LoadUsedIds));
        assert_eq!(l.next(Input::Resume, empty), act(Action::Pick { lost: 0 }));
        assert_eq!(l.next(Input::Picked(Some(4)), empty), act(create(4)));
        let step = l.next(observed(None, 4, Some(bound("other")), 40), empty);
        assert_eq!(step, Step { learn: Some((4, true)), action: Action::Wait(0) });
        // Not read again: the spread over the lowest free IDs settles the race.
        assert_eq!(l.next(Input::Resume, empty), act(Action::Pick { lost: 1 }));
        assert_eq!(l.next(Input::Picked(Some(5)), empty), act(create(5)));
        let step = l.next(observed(Some(30), 5, None, 41), empty);
        assert_eq!(step, Step { learn: Some((5, false)), action: Action::Wait(0) });
        assert_eq!(l.next(Input::Resume, empty), act(join(30)));
    }

    #[test]
    fn lowest_lazy_loop_after_a_read_back_skips_the_peek() {
        // A repair keeping its ID (DESIGN §7) tries it first; when another key holds it, the
        // txn's read-back already showed the key record absent: no second read of it, straight
        // to the used IDs.
        let spec = spec();
        let mut l = strict(&spec, None, Some(9)).candidates(Candidates::UsedIds);
        let keep = BindPlan { expect_key: None, id: 9, expect_id: None, moved_from: None };
        assert_eq!(l.next(Input::Resume, empty), act(Action::Send(keep)));
        assert_eq!(
            l.next(observed(None, 9, Some(bound("other")), 5), empty).action,
            Action::Wait(0)
        );
        assert_eq!(l.next(Input::Resume, empty), act(Action::LoadUsedIds));
        assert_eq!(l.next(Input::Resume, empty), act(Action::Pick { lost: 0 }));
    }

    #[test]
    fn lowest_lazy_loop_full_or_losing_goes_to_the_store_as_probing_does() {
        // G6: after reading the used IDs, a full partial view asks the store's count (full:
        // `Exhausted`; not full: the view), and so do `PROBE_COLLISIONS` lost picks.
        let spec = spec();
        let mut l = lowest_lazy(&spec);
        l.next(Input::Resume, empty);
        l.next(Input::KeyRecord(None), empty);
        l.next(Input::Resume, empty);
        assert_eq!(l.next(Input::Resume, empty), act(Action::Pick { lost: 0 }));
        assert_eq!(l.next(Input::Picked(None), empty), act(Action::ReadUsage));
        let full = Input::Usage { key_rec: None, used: spec.capacity(), revision: 7 };
        assert_eq!(l.next(full, empty), act(Action::Fail(Failure::Exhausted)));

        let mut l = lowest_lazy(&spec);
        l.next(Input::Resume, empty);
        l.next(Input::KeyRecord(None), empty);
        l.next(Input::Resume, empty);
        l.next(Input::Resume, empty);
        l.next(Input::Picked(Some(1)), empty);
        let mut last = l.next(observed(None, 1, Some(bound("other")), 40), empty);
        for c in 1..u64::from(PROBE_COLLISIONS) {
            assert_eq!(last.action, Action::Wait(0));
            assert_eq!(l.next(Input::Resume, empty), act(Action::Pick { lost: c as u32 }));
            l.next(Input::Picked(Some(c + 1)), empty);
            last = l.next(observed(None, c + 1, Some(bound("other")), 40), empty);
        }
        assert_eq!(last.action, Action::ReadUsage);
        let free = Input::Usage { key_rec: None, used: 3, revision: 8 };
        assert_eq!(l.next(free, empty), act(Action::LoadView));
        // The view is loaded: picks come from it, and the used IDs are not read again.
        assert_eq!(l.next(Input::Resume, empty), act(Action::Pick { lost: PROBE_COLLISIONS }));
    }

    #[test]
    fn full_view_is_confirmed_by_the_store_before_exhausted() {
        // G6 `Exhausted` only when the store is full too: the view may lag behind reclaims.
        let spec = spec();
        let mut l = strict(&spec, None, None);
        assert_eq!(l.next(Input::Resume, empty), act(Action::Pick { lost: 0 }));
        assert_eq!(l.next(Input::Picked(None), empty), act(Action::ReadUsage));
        let full = Input::Usage { key_rec: None, used: spec.capacity(), revision: 77 };
        assert_eq!(l.next(full, empty), act(Action::Fail(Failure::Exhausted)));
    }

    #[test]
    fn store_with_free_ids_waits_for_the_watch_then_reports_a_lagging_view() {
        // G6: a view that stays behind a store with free IDs is `Unavailable` (retryable), never
        // `Exhausted`; the loop first lets the watch catch up to the read's revision, and reads
        // the usage again each time the caught-up view is still full.
        let spec = spec();
        let mut l = strict(&spec, None, None);
        l.next(Input::Resume, empty);
        l.next(Input::Picked(None), empty);
        let free = Input::Usage { key_rec: None, used: spec.capacity() - 1, revision: 77 };
        assert_eq!(l.next(free, empty), act(Action::Wait(77)));
        assert_eq!(l.next(Input::Resume, empty), act(Action::Pick { lost: 0 }));
        assert_eq!(l.next(Input::Picked(Some(3)), empty), act(create(3)));
        // Had the view stayed full while every read found free IDs: `ViewBehind` after
        // `VIEW_BEHIND_READS` reads.
        let mut l = strict(&spec, None, None);
        l.next(Input::Resume, empty);
        assert_eq!(l.next(Input::Picked(None), empty), act(Action::ReadUsage));
        for i in 0..VIEW_BEHIND_READS {
            let rev = 77 + i64::from(i);
            let free = Input::Usage { key_rec: None, used: 1, revision: rev };
            assert_eq!(l.next(free, empty), act(Action::Wait(rev)));
            assert_eq!(l.next(Input::Resume, empty), act(Action::Pick { lost: 0 }));
            let want = if i + 1 < VIEW_BEHIND_READS {
                act(Action::ReadUsage)
            } else {
                act(Action::Fail(Failure::ViewBehind))
            };
            assert_eq!(l.next(Input::Picked(None), empty), want);
        }
    }

    #[test]
    fn free_ids_taken_by_others_before_the_view_caught_up_is_exhausted() {
        // G6: the store had free IDs at one read, others took them before the view caught up:
        // the next read finds the pool full, and that is `Exhausted`, not `Unavailable`.
        let spec = spec();
        let mut l = strict(&spec, None, None);
        l.next(Input::Resume, empty);
        l.next(Input::Picked(None), empty);
        let free = Input::Usage { key_rec: None, used: spec.capacity() - 2, revision: 77 };
        assert_eq!(l.next(free, empty), act(Action::Wait(77)));
        assert_eq!(l.next(Input::Resume, empty), act(Action::Pick { lost: 0 }));
        assert_eq!(l.next(Input::Picked(None), empty), act(Action::ReadUsage));
        let full = Input::Usage { key_rec: None, used: spec.capacity(), revision: 80 };
        assert_eq!(l.next(full, empty), act(Action::Fail(Failure::Exhausted)));
        // The same for a probing loop, which loaded the view after its read found free IDs.
        let mut l = strict(&spec, None, None).candidates(Candidates::Probe);
        l.next(Input::Resume, empty);
        assert_eq!(l.next(Input::Picked(None), empty), act(Action::ReadUsage));
        let free = Input::Usage { key_rec: None, used: spec.capacity() - 2, revision: 77 };
        assert_eq!(l.next(free, empty), act(Action::LoadView));
        assert_eq!(l.next(Input::Resume, empty), act(Action::Pick { lost: 0 }));
        assert_eq!(l.next(Input::Picked(None), empty), act(Action::ReadUsage));
        let full = Input::Usage { key_rec: None, used: spec.capacity(), revision: 80 };
        assert_eq!(l.next(full, empty), act(Action::Fail(Failure::Exhausted)));
    }

    #[test]
    fn full_view_but_key_bound_in_the_store_joins_it() {
        // DESIGN §5: a full pool does not stop a key another node already bound (the view may lag
        // behind that bind); after the confirming read, a full view fails without reading again.
        let spec = spec();
        let mut l = strict(&spec, None, None);
        l.next(Input::Resume, empty);
        l.next(Input::Picked(None), empty);
        let bound_elsewhere =
            Input::Usage { key_rec: Some(30), used: spec.capacity(), revision: 8 };
        assert_eq!(l.next(bound_elsewhere, empty), act(Action::Wait(0)));
        assert_eq!(l.next(Input::Resume, empty), act(join(30)));
        // Released meanwhile: the key record is gone, the view still full.
        assert_eq!(
            l.next(observed(None, 30, None, 0), empty),
            Step { learn: Some((30, false)), action: Action::Wait(0) }
        );
        assert_eq!(l.next(Input::Resume, empty), act(Action::Pick { lost: 0 }));
        assert_eq!(l.next(Input::Picked(None), empty), act(Action::Fail(Failure::Exhausted)));
    }

    #[test]
    fn full_view_with_a_preferred_id_decides_again() {
        // DESIGN §7: a repair keeping its ID is not stopped by a full view.
        let spec = spec();
        let mut l = strict(&spec, None, Some(9));
        l.next(Input::Resume, empty);
        l.next(observed(None, 9, Some(bound("other")), 5), empty);
        l.next(Input::Resume, empty);
        assert_eq!(l.next(Input::Picked(None), empty), act(Action::ReadUsage));
        let read = Input::Usage { key_rec: None, used: spec.capacity(), revision: 6 };
        assert_eq!(l.next(read, empty), act(Action::Wait(0)));
    }

    #[test]
    fn batched_full_view_is_confirmed_by_the_usage_read() {
        // G6: a batched loop's full view is `Exhausted` only when the store is full at the
        // read's revision; free IDs there mean the view lags (wait for it, read again); a binding
        // → join it.
        let spec = spec();
        let mut l = batched(&spec, None);
        l.next(Input::Resume, empty);
        assert_eq!(l.next(Input::Picked(None), empty), act(Action::ReadUsage));
        let full = Input::Usage { key_rec: None, used: spec.capacity(), revision: 7 };
        assert_eq!(l.next(full, empty), act(Action::Fail(Failure::Exhausted)));

        let mut l = batched(&spec, None);
        l.next(Input::Resume, empty);
        l.next(Input::Picked(None), empty);
        let free = Input::Usage { key_rec: None, used: spec.capacity() - 1, revision: 7 };
        assert_eq!(l.next(free, empty), act(Action::Wait(7)));
        assert_eq!(l.next(Input::Resume, empty), act(Action::Pick { lost: 0 }));
        assert_eq!(l.next(Input::Picked(None), empty), act(Action::ReadUsage));

        let mut l = batched(&spec, None);
        l.next(Input::Resume, empty);
        l.next(Input::Picked(None), empty);
        let bound_elsewhere =
            Input::Usage { key_rec: Some(30), used: spec.capacity(), revision: 8 };
        assert_eq!(l.next(bound_elsewhere, empty), act(Action::Wait(0)));
        assert_eq!(l.next(Input::Resume, empty), act(join(30)));
    }

    #[test]
    fn batched_full_view_with_a_preferred_id_decides_again() {
        // DESIGN §7: restoring a preferred ID is not stopped by a full view.
        let spec = spec();
        let mut l = batched(&spec, Some(9));
        let cache = |id| (id == 9).then(|| bound("other"));
        l.next(Input::Resume, cache);
        l.next(Input::Picked(None), empty);
        let read = Input::Usage { key_rec: None, used: spec.capacity(), revision: 6 };
        assert_eq!(l.next(read, empty), act(Action::Wait(0)));
    }

    #[test]
    fn batched_full_view_after_a_read_back_still_reads_the_usage() {
        // G6: a failed txn read back the key record and one ID record, not the pool: the full
        // view may still lag behind reclaims, so the usage read decides.
        let spec = spec();
        let mut l = batched(&spec, None);
        sent_create(&mut l, 12);
        l.next(observed(None, 12, Some(bound("other")), 4), empty);
        assert_eq!(l.next(Input::Resume, empty), act(Action::Pick { lost: 1 }));
        assert_eq!(l.next(Input::Picked(None), empty), act(Action::ReadUsage));
    }

    #[test]
    fn pool_gone_fails_and_frees_the_candidate() {
        // DESIGN §11: a pool's spec is part of every decision; a changed spec ends the loop.
        let spec = spec();
        let mut l = strict(&spec, None, None);
        sent_create(&mut l, 12);
        let now = crate::store::KeyValue {
            key: b"idalloc/pools/p".to_vec(),
            value: b"{}".to_vec(),
            create_revision: 9,
            mod_revision: 9,
            version: 1,
            lease: 0,
        };
        let gone = Input::Answer(BindOutcome::PoolGone { spec_now: Some(now.clone()) });
        assert_eq!(
            l.next(gone, empty),
            Step {
                learn: Some((12, false)),
                action: Action::Fail(Failure::PoolGone { spec_now: Some(now) })
            }
        );
        // A join's ID was not claimed: nothing to free.
        let mut l = strict(&spec, Some(7), None);
        l.next(Input::Resume, empty);
        let gone = Input::Answer(BindOutcome::PoolGone { spec_now: None });
        assert_eq!(l.next(gone, empty), act(Action::Fail(Failure::PoolGone { spec_now: None })));
    }

    #[test]
    fn key_record_naming_an_id_the_pool_never_hands_out_is_refused() {
        // DESIGN §11 / G3: a key record outside the range (or reserved) is never joined.
        let spec = spec();
        for foreign in [500, 50] {
            let mut l = strict(&spec, None, None);
            sent_create(&mut l, 12);
            assert_eq!(
                l.next(observed(Some(foreign), 12, None, 0), empty),
                Step {
                    learn: Some((12, false)),
                    action: Action::Fail(Failure::ForeignKeyRecord { id: foreign })
                }
            );
        }
    }

    #[test]
    fn txn_not_applied_frees_the_candidate_and_retries_or_fails() {
        // G6: a request that failed leaves nothing claimed; a renewed session retries (DESIGN §7),
        // any other error ends the loop with the driver's error.
        let spec = spec();
        let mut l = strict(&spec, None, None);
        sent_create(&mut l, 12);
        assert_eq!(
            l.next(Input::NotApplied { retry: true }, empty),
            Step { learn: Some((12, false)), action: Action::Wait(0) }
        );
        assert_eq!(l.next(Input::Resume, empty), act(Action::Pick { lost: 0 }));
        assert_eq!(l.next(Input::Picked(Some(13)), empty), act(create(13)));
        assert_eq!(
            l.next(Input::NotApplied { retry: false }, empty),
            Step { learn: Some((13, false)), action: Action::Fail(Failure::Aborted) }
        );
        // A join claimed nothing.
        let mut l = strict(&spec, Some(7), None);
        l.next(Input::Resume, empty);
        assert_eq!(
            l.next(Input::NotApplied { retry: false }, empty),
            act(Action::Fail(Failure::Aborted))
        );
    }

    #[test]
    fn gives_up_as_contended_after_the_attempt_budget() {
        // G6 "never a hang": at most MAX_BIND_ATTEMPTS decisions (one round trip each).
        let spec = spec();
        let mut l = strict(&spec, None, None);
        for n in 0..MAX_BIND_ATTEMPTS {
            assert!(matches!(l.next(Input::Resume, empty).action, Action::Pick { .. }), "{n}");
            l.next(Input::Picked(Some(12)), empty);
            l.next(observed(None, 12, None, 0), empty);
        }
        assert_eq!(l.attempts(), MAX_BIND_ATTEMPTS);
        assert_eq!(l.next(Input::Resume, empty), act(Action::Fail(Failure::Contended)));
    }

    #[test]
    fn inputs_out_of_turn_end_the_loop() {
        // G6 "never a panic": a driver feeding an answer to no step gets a failure, not a guess.
        let spec = spec();
        let mut l = strict(&spec, None, None);
        assert_eq!(l.next(Input::Picked(Some(3)), empty), act(Action::Fail(Failure::Aborted)));
        // And nothing goes on after the end.
        assert_eq!(l.next(Input::Resume, empty), act(Action::Fail(Failure::Aborted)));
        let mut l = strict(&spec, Some(7), None);
        l.next(Input::Resume, empty);
        l.next(Input::Answer(BindOutcome::Bound { id: 7, revision: 2 }), empty);
        assert_eq!(l.next(Input::Resume, empty), act(Action::Fail(Failure::Aborted)));
    }

    #[test]
    fn a_move_without_a_read_revision_pins_absent() {
        // DESIGN §11 (late commits): a move pinned to an unknown revision compares "absent", so
        // the txn fails and reads the record back instead of moving blindly.
        assert_eq!(pinned(Some((7, bound("o"))), |_| None), Some((7, 0)));
        assert_eq!(pinned(Some((7, bound("o"))), |_| Some(42)), Some((7, 42)));
        assert_eq!(pinned(None, |_| Some(42)), None);
    }
}
