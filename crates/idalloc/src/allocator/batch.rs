//! Batched acquire and release: many keys per round trip.
//!
//! Each round decides one plan per pending key exactly as the single-key loops do (each key's bind
//! decisions are its own [`BindLoop`], as in `Inner::bind`, with lenient hints and the key-record
//! check of a full view; the same candidate pick, [`BindPlan::txn_fenced`] / [`ReleasePlan::txn`]
//! with the same fences), packs the plans as nested txns ([`crate::batch`]) and sends the batches.
//! A key whose compares failed learns from its own read-back and goes into the next round with a
//! fresh decision; the others are done. Every key gets at most as many attempts as a lone bind
//! ([`MAX_BIND_ATTEMPTS`]), and the results come back per key in input order.
//!
//! Releases share one thing between keys: the holder's fence record. etcd refuses a key written
//! twice in one txn tree, so the per-key plans are built without their bump and the batch bumps the
//! record once, at the outer level, guarded by the pool's spec (docs/design/batching.md, "Each key
//! keeps its own txn").
//!
//! One file (about 800 lines) because batched bind and batched release share the packing frame, the
//! per-round bookkeeping (read-backs, the fence bumped once per tree) and the result ordering; the
//! pure packing is `crate::batch`, the single-key decisions `crate::protocol`, so what remains here
//! is the driver loop of both.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use tracing::{debug, warn};

use super::bind::{Hints, RefLease, MAX_BIND_ATTEMPTS};
use super::handle::Pool;
use super::pool_state::{lock, Held, KeyGuard, PoolState};
use super::registry::{protocol_error, Inner};
use super::repair_queue::Repair;
use super::request::Class;
use super::types::{Acquired, Released};
use crate::batch::{self, Frame};
use crate::error::{Error, Result};
use crate::pool::Strategy;
use crate::pool::{validate_key, validate_stored_durable_holder};
use crate::protocol::bind_step::{Action, BindLoop, Candidates, Failure, Input, Step};
use crate::protocol::{spec_compare, BindOutcome, BindPlan, LastRelease, RefTarget, ReleasePlan};
use crate::store::{OpResponse, StoreError, TxnOp, TxnRequest};

/// Free-set runs (about one per ID a probing bind learned taken, 32 bytes each) above which a
/// lazily opened pool forgets what it learned: about 2 MiB.
const FORGET_LEARNED_ABOVE: usize = 65_536;

/// Distinct keys one call locks and works on at a time (the per-key single-flight locks are
/// taken in sorted order, so concurrent batches and single calls never deadlock).
const CHUNK: usize = 2048;

/// One key of a bind round: its loop's decisions ([`BindLoop`]) and, once settled, its result.
struct BindSlot<'a> {
    bl: BindLoop<'a>,
    result: Option<Result<Acquired>>,
}

/// One key of a release round.
struct ReleaseSlot<'a> {
    key: &'a str,
    id: u64,
    require_own_ref: bool,
    held: Option<bool>,
    fenced_out: usize,
    result: Option<Result<Released>>,
}

impl Inner {
    /// [`Inner::bind`] for many distinct keys at once (each with an optional preferred ID), with
    /// `holder`'s reference on the session lease (`leased`) or durable.
    pub(super) async fn bind_many(
        self: &Arc<Self>,
        pool: &PoolState,
        keys: &[(&str, Option<u64>)],
        holder: &str,
        leased: RefLease,
        hints: Hints,
        class: Class,
    ) -> Vec<Result<Acquired>> {
        let _interactive = (class == Class::Interactive).then(|| self.req.interactive());
        if let Err(e) = pool.live() {
            return keys.iter().map(|_| Err(e.clone())).collect();
        }
        // A lazily opened `random` pool binds by guessing, as a lone
        // bind does there: the txn's compares decide (G1–G3 unchanged), the loop reads the usage
        // and loads the view only after many lost guesses (a nearly full pool). A process that
        // acquires 1M new keys then never holds the pool's view, which grows with every key.
        let probing = self.view_unloaded(pool) && pool.spec.strategy_kind() == Strategy::Random;
        let candidates = if probing {
            // What guessing learned (IDs found taken, one treap node each when isolated) would
            // grow with the input: past a bound it is forgotten, at the price of a lost guess
            // now and then.
            pool.lock_cache().forget_learned_above(FORGET_LEARNED_ABOVE);
            Candidates::Probe
        } else {
            if let Err(e) = self.wait_synced(pool).await {
                return keys.iter().map(|_| Err(e.clone())).collect();
            }
            Candidates::View
        };
        let name = pool.spec.name();
        let spec = pool.spec_now();
        let mut slots: Vec<BindSlot<'_>> = {
            let cache = pool.lock_cache();
            keys.iter()
                .map(|&(key, preferred)| BindSlot {
                    bl: BindLoop::new(&spec, key, cache.get(key), preferred, hints)
                        .candidates(candidates),
                    result: None,
                })
                .collect()
        };
        // Applies what a step tells the cache.
        let learn = |step: &Step| {
            if let Some((id, used)) = step.learn {
                pool.lock_cache().learn(id, used);
            }
        };
        // A sent plan that was not applied: its loop frees a claimed candidate (`retry`: the key
        // goes into the next round; otherwise the caller settles its result).
        let not_applied = |s: &mut BindSlot<'_>, retry: bool| {
            learn(&s.bl.next(Input::NotApplied { retry }, |_| None));
        };
        let mut gone: Option<Error> = None;
        for round in 0..MAX_BIND_ATTEMPTS {
            // (slot, plan)
            let mut plans: Vec<(usize, BindPlan)> = Vec::new();
            // IDs that keys still to bind prefer: a normal pick passes over them, or two keys of
            // one txn tree would race for one ID and the loser would cost another round trip (a
            // restored checkpoint took three instead of one when a moved key picked another
            // key's old ID).
            let preferred: HashSet<u64> = slots
                .iter()
                .filter(|s| s.result.is_none())
                .filter_map(|s| s.bl.preferred())
                .collect();
            let mut passed_over: Vec<u64> = Vec::new();
            // The newest revision a key's loop waits for the view to reach (a usage read that
            // found free IDs the view lacks, a failed txn's read-back): the round waits once.
            let mut newest = 0;
            for (i, s) in slots.iter_mut().enumerate() {
                if s.result.is_some() {
                    continue;
                }
                // Run the key's loop until it sends a plan (packed below), settles, or waits for
                // the next round.
                let mut input = Input::Resume;
                loop {
                    let step = s.bl.next(input, |id| pool.lock_cache().record(id));
                    learn(&step);
                    input = match step.action {
                        Action::Pick { lost } => Input::Picked(
                            self.pick_avoiding(pool, lost, &preferred, &mut passed_over).ok(),
                        ),
                        Action::PeekKeyRecord => {
                            match self.read_key_record(pool, s.bl.key()).await {
                                Ok(rec) => Input::KeyRecord(rec),
                                Err(e) => {
                                    s.result = Some(Err(e));
                                    break;
                                }
                            }
                        }
                        Action::ReadUsage => {
                            match self.read_key_and_usage(pool, s.bl.key()).await {
                                Ok((key_rec, used, revision)) => {
                                    Input::Usage { key_rec, used, revision }
                                }
                                Err(e) => {
                                    s.result = Some(Err(e));
                                    break;
                                }
                            }
                        }
                        Action::Send(plan) => {
                            plans.push((i, plan));
                            break;
                        }
                        // A probing loop that lost too many guesses in a pool that is not full:
                        // load the view (once for the process) and go on with it.
                        Action::LoadView if probing => match self.wait_synced(pool).await {
                            Ok(()) => Input::Resume,
                            Err(e) => {
                                s.result = Some(Err(e));
                                break;
                            }
                        },
                        // Decide again in the next round (the round waits for the watch once). A
                        // loop on the full view never asks for it, and a batch never reads used IDs
                        // alone (a `lowest` pool's batch loads the view).
                        Action::Wait(revision) => {
                            newest = newest.max(revision);
                            break;
                        }
                        Action::LoadView | Action::LoadUsedIds => break,
                        Action::Done { id, new } => {
                            s.result = Some(Ok(Acquired { id, new }));
                            break;
                        }
                        Action::Fail(f) => {
                            s.result = Some(Err(self.bind_failure(pool, s.bl.key(), f).await));
                            break;
                        }
                    };
                }
            }
            if !passed_over.is_empty() {
                // Claimed only to be passed over: free again (their own keys' plans use them).
                let mut cache = pool.lock_cache();
                for id in passed_over {
                    cache.learn(id, false);
                }
            }
            if plans.is_empty() {
                if slots.iter().all(|s| s.result.is_some()) {
                    break;
                }
                self.wait_applied(pool, newest).await;
                continue;
            }
            let lease = match leased {
                RefLease::Durable => 0,
                RefLease::Client(l) => l,
                RefLease::Session => match self.session_lease().await {
                    Ok(l) => match self.fence_earlier_lives(pool, l).await {
                        Ok(()) => l,
                        Err(e) => {
                            for (i, _) in &plans {
                                not_applied(&mut slots[*i], false);
                            }
                            gone = Some(e);
                            break;
                        }
                    },
                    Err(e) => {
                        for (i, _) in &plans {
                            not_applied(&mut slots[*i], false);
                        }
                        gone = Some(e);
                        break;
                    }
                },
            };
            let target = RefTarget { holder, lease };
            let fences = match self.bind_fences(pool, plans.iter().map(|(_, p)| p)) {
                Ok(f) => f,
                Err(e) => {
                    for (i, _) in &plans {
                        not_applied(&mut slots[*i], false);
                    }
                    gone = Some(e);
                    break;
                }
            };
            let txns: Vec<TxnRequest> = plans
                .iter()
                .map(|(i, plan)| {
                    plan.txn_fenced(&self.layout, name, slots[*i].bl.key(), Some(target), fences)
                })
                .collect();
            let frame = Frame::default();
            let groups = batch::pack(&txns, &frame, self.req.batch_keys(class));
            // Each txn goes into exactly one request: moved there, not cloned (the copies were
            // about a tenth of `acquire --from`'s client CPU, with their drops).
            let mut txns: Vec<Option<TxnRequest>> = txns.into_iter().map(Some).collect();
            let answers = futures::future::join_all(groups.iter().map(|g| {
                let req = batch::assemble(&frame, g.iter().filter_map(|&j| txns[j].take()));
                async move {
                    let _slot = self.req.admit(class).await;
                    self.req.txn_noting_doubt(req).await
                }
            }))
            .await;
            for (g, (result, doubt)) in groups.iter().zip(answers) {
                // In-doubt references of this process's own session are repaired by it; a
                // client session's are its client's to retry (idempotent, as a lone bind's).
                if doubt && leased == RefLease::Session {
                    let mut d = lock(&pool.doubt);
                    for &j in g {
                        d.insert(slots[plans[j].0].bl.key().to_string());
                    }
                }
                let failed = match result {
                    Ok(resp) => match batch::split(resp, &frame, g.len()) {
                        Ok(Ok(parts)) => Ok(parts),
                        Ok(Err(_)) | Err(_) => Err(Some(Error::unavailable_for_good(format!(
                            "pool {name:?}: a batch answer had an unexpected shape"
                        )))),
                    },
                    Err(StoreError::LeaseNotFound(l)) if leased == RefLease::Session => {
                        self.session_lost(l).await;
                        Err(None)
                    }
                    // A client session's lease is gone: every key of the group fails with
                    // `SessionGone`, as a lone bind on it does.
                    Err(StoreError::LeaseNotFound(l)) if leased == RefLease::Client(l) => {
                        Err(Some(Error::lease_gone(l)))
                    }
                    Err(e) => Err(Some(e.into())),
                };
                let parts = match failed {
                    Ok(parts) => parts,
                    // The group was not applied: retried in the next round (`None`: the session
                    // was renewed) or settled with the error.
                    Err(e) => {
                        for &j in g {
                            let s = &mut slots[plans[j].0];
                            not_applied(s, e.is_none());
                            if let Some(e) = &e {
                                s.result = Some(Err(e.clone()));
                            }
                        }
                        continue;
                    }
                };
                for (&j, part) in g.iter().zip(parts) {
                    let (i, plan) = &plans[j];
                    let s = &mut slots[*i];
                    let outcome = match plan.outcome_fenced(&part, fences) {
                        Ok(outcome) => outcome,
                        Err(pe) => {
                            not_applied(s, false);
                            s.result = Some(Err(protocol_error(pe)));
                            continue;
                        }
                    };
                    if let BindOutcome::Observed(obs) = &outcome {
                        debug!(pool = %name, key = s.bl.key(), ?obs, round, "batched bind compare failed; deciding again");
                    }
                    let mut step = s.bl.next(Input::Answer(outcome), |_| None);
                    learn(&step);
                    if step.action == Action::ReadUsage {
                        // A probing loop that lost many guesses: the pool's usage decides
                        // between `Exhausted` and loading the view.
                        let key = s.bl.key();
                        let input = match self.read_key_and_usage(pool, key).await {
                            Ok((key_rec, used, revision)) => {
                                Input::Usage { key_rec, used, revision }
                            }
                            Err(e) => {
                                s.result = Some(Err(e));
                                continue;
                            }
                        };
                        step = s.bl.next(input, |_| None);
                        learn(&step);
                    }
                    match step.action {
                        Action::Done { id, new } => s.result = Some(Ok(Acquired { id, new })),
                        Action::Wait(revision) => newest = newest.max(revision),
                        // The pool is not full: the view is loaded (once for the process) and
                        // the key decides again in the next round.
                        Action::LoadView if probing => {
                            if let Err(e) = self.wait_synced(pool).await {
                                s.result = Some(Err(e));
                            }
                        }
                        Action::Fail(Failure::PoolGone { spec_now }) => {
                            if gone.is_none() {
                                gone = Some(self.pool_gone(pool, spec_now));
                            }
                        }
                        // A stale handle (its pool re-created over another range) retires
                        // instead of blaming the key record (`bind_failure` checks).
                        Action::Fail(f) => {
                            s.result = Some(Err(self.bind_failure(pool, s.bl.key(), f).await))
                        }
                        other => {
                            s.result = Some(Err(Error::unavailable_for_good(format!(
                            "the bind of key {:?} in pool {name:?} answered a txn with {other:?}",
                            s.bl.key()
                        ))))
                        }
                    }
                }
            }
            if gone.is_some() {
                break;
            }
            self.wait_applied(pool, newest).await;
        }
        slots
            .into_iter()
            .map(|s| match s.result {
                Some(r) => r,
                None => Err(gone.clone().unwrap_or_else(|| {
                    warn!(pool = %name, key = s.bl.key(), "gave up binding after {MAX_BIND_ATTEMPTS} contended attempts");
                    Error::unavailable(format!(
                            "key {:?} in pool {name:?} stayed contended for {MAX_BIND_ATTEMPTS} attempts",
                            s.bl.key()
                        ))
                })),
            })
            .collect()
    }

    /// [`Inner::release_ref`] for many distinct keys (`(key, id as believed)`) of one holder.
    pub(super) async fn release_ref_many<'k>(
        self: &Arc<Self>,
        pool: &PoolState,
        items: &[(&'k str, u64)],
        holder: &'k str,
        durable: bool,
        class: Class,
    ) -> Vec<Result<Released>> {
        let _interactive = (class == Class::Interactive).then(|| self.req.interactive());
        let name = pool.spec.name();
        let reclaim = pool.spec.idle_grace_duration().is_zero();
        let mut slots: Vec<ReleaseSlot<'k>> = items
            .iter()
            .map(|&(key, id)| ReleaseSlot {
                key,
                id,
                require_own_ref: durable,
                held: None,
                fenced_out: 0,
                result: None,
            })
            .collect();
        let mut gone: Option<Error> = None;
        for _round in 0..=MAX_BIND_ATTEMPTS + 1 {
            let pending: Vec<usize> =
                (0..slots.len()).filter(|&i| slots[i].result.is_none()).collect();
            if pending.is_empty() {
                break;
            }
            // The holder's fence bump, once for the whole batch (see the module doc).
            let bump = if durable {
                Some(0)
            } else if pending.iter().any(|&i| lock(&pool.doubt).contains(slots[i].key)) {
                let lease = self.session.lock().await.lease;
                if lease.is_none() {
                    let mut d = lock(&pool.doubt);
                    for &i in &pending {
                        d.remove(slots[i].key);
                    }
                }
                lease
            } else {
                None
            };
            let fences = self.fences(pool);
            let frame = Frame {
                guard: vec![spec_compare(&self.layout, name, fences.spec_rev.unwrap_or_default())],
                ops: bump
                    .map(|lease| {
                        TxnOp::put_on_lease(self.layout.holder_key(name, holder), Vec::new(), lease)
                    })
                    .into_iter()
                    .collect(),
                otherwise: vec![TxnOp::get_key(self.layout.pool_spec_key(name))],
            };
            let plan = |s: &ReleaseSlot<'k>, tombstone_lease| {
                release_plan(
                    s.key,
                    s.id,
                    holder,
                    reclaim,
                    s.require_own_ref,
                    fences,
                    tombstone_lease,
                )
            };
            // Sized with a tombstone put (the larger of the two ways to retire an ID).
            let estimate: Vec<TxnRequest> =
                pending.iter().map(|&i| plan(&slots[i], Some(1)).txn(&self.layout, name)).collect();
            let groups = batch::pack(&estimate, &frame, self.req.batch_keys(class));
            let session = bump.filter(|l| *l != 0);
            let answers = {
                let slots = &slots;
                let pending = &pending;
                let frame = &frame;
                futures::future::join_all(groups.iter().map(|g| async move {
                    let _slot = self.req.admit(class).await;
                    self.req
                        .txn_with_leases(pool, reclaim, session, move |lease| {
                            batch::assemble(
                                frame,
                                g.iter().map(|&j| {
                                    plan(&slots[pending[j]], lease).txn(&self.layout, name)
                                }),
                            )
                        })
                        .await
                }))
                .await
            };
            for (g, answer) in groups.iter().zip(answers) {
                let resp = match answer {
                    Err(e) => {
                        for &j in g {
                            slots[pending[j]].result = Some(Err(e.clone()));
                        }
                        continue;
                    }
                    Ok(None) => {
                        // The session lease carrying the bump is gone, and with it every
                        // reference and in-flight bind on it: nothing is left to fence.
                        if let Some(l) = session {
                            self.session_lost(l).await;
                        }
                        let mut d = lock(&pool.doubt);
                        for &j in g {
                            d.remove(slots[pending[j]].key);
                        }
                        continue;
                    }
                    Ok(Some(resp)) => resp,
                };
                let parts = match batch::split(resp, &frame, g.len()) {
                    Ok(Ok(parts)) => parts,
                    Ok(Err(reads)) => {
                        let spec_now = match reads.first() {
                            Some(OpResponse::Get(g)) => g.kvs.first().cloned(),
                            _ => None,
                        };
                        if gone.is_none() {
                            gone = Some(self.pool_gone(pool, spec_now));
                        }
                        continue;
                    }
                    Err(pe) => {
                        let e = protocol_error(pe);
                        for &j in g {
                            slots[pending[j]].result = Some(Err(e.clone()));
                        }
                        continue;
                    }
                };
                for (&j, part) in g.iter().zip(parts) {
                    let s = &mut slots[pending[j]];
                    let out = match plan(s, None).outcome(&part) {
                        Ok(out) => out,
                        Err(pe) => {
                            s.result = Some(Err(protocol_error(pe)));
                            continue;
                        }
                    };
                    if let Some(spec_now) = out.pool_gone {
                        if gone.is_none() {
                            gone = Some(self.pool_gone(pool, spec_now));
                        }
                        continue;
                    }
                    if out.fenced_out {
                        s.fenced_out += 1;
                        if s.fenced_out > MAX_BIND_ATTEMPTS {
                            s.result = Some(Err(Error::unavailable(format!("release of key {:?} in pool {name:?} kept finding its reference rewritten", s.key))));
                        }
                        continue;
                    }
                    if bump.is_some() && !durable {
                        lock(&pool.doubt).remove(s.key);
                    }
                    if out.reclaimed && pool.spec.reuse_delay_duration().is_zero() {
                        // As in `release_ref`: our own committed write frees the ID locally.
                        pool.lock_cache().freed_by_own_write(s.id, out.revision);
                    }
                    let first = s.held.is_none();
                    let had_ref = *s.held.get_or_insert(out.had_ref);
                    match out.key_now {
                        // As in `release_ref`: the ID came from a lagging cache; finish on the
                        // key's real ID in the next round.
                        Some(now) if first && had_ref && !part.succeeded && now != s.id => {
                            s.id = now;
                            s.require_own_ref = false;
                        }
                        _ => {
                            s.result =
                                Some(Ok(Released { held: had_ref, reclaimed: out.reclaimed }))
                        }
                    }
                }
            }
            if gone.is_some() {
                break;
            }
        }
        slots
            .into_iter()
            .map(|s| match s.result {
                Some(r) => r,
                None => Err(gone.clone().unwrap_or_else(|| Error::unavailable(format!(
                        "release of key {:?} in pool {name:?} did not settle within {MAX_BIND_ATTEMPTS} rounds",
                        s.key
                    )))),
            })
            .collect()
    }
}

/// One key's release plan in a batch: exactly the single-key plan, without its own fence bump (the
/// batch bumps once).
fn release_plan<'a>(
    key: &'a str,
    id: u64,
    holder: &'a str,
    reclaim: bool,
    require_own_ref: bool,
    fences: crate::protocol::Fences,
    tombstone_lease: Option<crate::store::LeaseId>,
) -> ReleasePlan<'a> {
    ReleasePlan {
        key,
        id,
        holder,
        last: if reclaim { LastRelease::Reclaim { tombstone_lease } } else { LastRelease::Touch },
        require_own_ref,
        fences,
        bump: None,
    }
}

/// Distinct keys in first-seen order, and for each input position the index of its distinct key.
fn distinct<'a>(keys: &[&'a str]) -> (Vec<&'a str>, Vec<usize>) {
    let mut index: HashMap<&str, usize> = HashMap::new();
    let mut out = Vec::new();
    let at = keys
        .iter()
        .map(|&k| {
            *index.entry(k).or_insert_with(|| {
                out.push(k);
                out.len() - 1
            })
        })
        .collect();
    (out, at)
}

impl Pool {
    /// Takes the single-flight locks of `keys` in sorted order.
    async fn lock_keys(&self, keys: &[&str]) -> Vec<KeyGuard<'_>> {
        let mut sorted: Vec<&str> = keys.to_vec();
        sorted.sort_unstable();
        let mut guards = Vec::with_capacity(sorted.len());
        for k in sorted {
            guards.push(self.state.lock_key(k).await);
        }
        guards
    }

    /// A preferred ID is used only if it is one this pool could allocate.
    pub(super) fn usable_hint(&self, id: Option<u64>) -> Option<u64> {
        let spec = self.state.spec_now();
        id.filter(|id| spec.strip_prefix(*id).is_some_and(|raw| spec.is_allocatable(raw)))
    }

    /// [`Pool::acquire`] with a preferred ID: `id` is used if it is free or already this key's,
    /// else the key gets a normal pick (restart restoration: re-acquire with the ID held before).
    /// An `id` outside the pool's allocatable range is ignored.
    pub async fn acquire_with_hint(&self, key: &str, id: u64) -> Result<Acquired> {
        let mut r = self.acquire_many_with_hints(&[(key, Some(id))]).await;
        r.pop().unwrap_or_else(|| Err(Error::unavailable_for_good("no result")))
    }

    /// [`Pool::acquire`] for many keys, packed many per round trip (one round trip per batch of up
    /// to ~100 keys when uncontended). Results per key in input order; a key given twice is
    /// acquired once and counted twice (each occurrence needs one release).
    pub async fn acquire_many<K: AsRef<str>>(&self, keys: &[K]) -> Vec<Result<Acquired>> {
        let with: Vec<(&str, Option<u64>)> = keys.iter().map(|k| (k.as_ref(), None)).collect();
        self.acquire_many_with_hints(&with).await
    }

    /// [`Pool::acquire_many`] with a preferred ID per key (see [`Pool::acquire_with_hint`]).
    pub async fn acquire_many_with_hints(
        &self,
        keys: &[(&str, Option<u64>)],
    ) -> Vec<Result<Acquired>> {
        let names: Vec<&str> = keys.iter().map(|(k, _)| *k).collect();
        self.many(&names, |distinct, at| async move {
            let hints: HashMap<&str, Option<u64>> =
                keys.iter().rev().map(|(k, h)| (*k, self.usable_hint(*h))).collect();
            let mut occ = vec![0u64; distinct.len()];
            for &d in &at {
                occ[d] += 1;
            }
            let _guards = self.lock_keys(&distinct).await;
            let mut out: Vec<Option<Result<Acquired>>> = vec![None; distinct.len()];
            let mut to_bind = Vec::new();
            for (d, key) in distinct.iter().enumerate() {
                let mut held = lock(&self.state.held);
                match held.get_mut(*key) {
                    Some(h) => {
                        h.count += occ[d];
                        out[d] = Some(Ok(Acquired { id: h.id, new: false }));
                    }
                    None => to_bind.push((d, (*key, hints.get(key).copied().flatten()))),
                }
            }
            let holder = self.inner.holder.clone();
            let args: Vec<(&str, Option<u64>)> = to_bind.iter().map(|(_, a)| *a).collect();
            let results = self
                .inner
                .bind_many(
                    &self.state,
                    &args,
                    &holder,
                    RefLease::Session,
                    Hints::Lenient,
                    Class::Bulk,
                )
                .await;
            for ((d, (key, _)), r) in to_bind.into_iter().zip(results) {
                match &r {
                    Ok(a) => {
                        lock(&self.state.held)
                            .insert(key.to_string(), Held { id: a.id, count: occ[d] });
                    }
                    Err(Error::Unavailable { .. }) if lock(&self.state.doubt).contains(key) => {
                        self.inner
                            .repairs
                            .push(Repair::Abandon(self.state.clone(), key.to_string()));
                    }
                    Err(_) => {}
                }
                out[d] = Some(r);
            }
            spread(out, &at, |a| Acquired { id: a.id, new: false })
        })
        .await
    }

    /// [`Pool::acquire_durable`] for many keys, packed many per round trip. A key given twice is
    /// bound once (the second occurrence reports `new: false`).
    pub async fn acquire_many_durable<K: AsRef<str>>(
        &self,
        keys: &[K],
        holder: &str,
    ) -> Vec<Result<Acquired>> {
        if let Err(e) = validate_stored_durable_holder(holder) {
            return keys.iter().map(|_| Err(e.clone())).collect();
        }
        self.acquire_many_as(keys, holder, RefLease::Durable).await
    }

    /// A client session's references to many keys ([`crate::ClientSession::acquire_many`]),
    /// packed many per round trip as [`Pool::acquire_many_durable`]: the references go on the
    /// session's `lease` under `holder`. A key given twice is bound once. Why batched: a restart
    /// storm through `idalloc serve` re-acquires every agent's keys on new sessions, and one txn
    /// per key cost etcd a proposal (and its WAL write) per key.
    pub(crate) async fn acquire_many_on_lease<K: AsRef<str>>(
        &self,
        keys: &[K],
        holder: &str,
        lease: crate::store::LeaseId,
    ) -> Vec<Result<Acquired>> {
        self.acquire_many_as(keys, holder, RefLease::Client(lease)).await
    }

    /// `holder`'s references to many keys on `target` (durable or a client session's lease): the
    /// distinct keys locked and bound many per round trip, each result spread back to every
    /// position its key had in `keys`.
    async fn acquire_many_as<K: AsRef<str>>(
        &self,
        keys: &[K],
        holder: &str,
        target: RefLease,
    ) -> Vec<Result<Acquired>> {
        let names: Vec<&str> = keys.iter().map(|k| k.as_ref()).collect();
        self.many(&names, |distinct, at| async move {
            let _guards = self.lock_keys(&distinct).await;
            let args: Vec<(&str, Option<u64>)> = distinct.iter().map(|k| (*k, None)).collect();
            let results = self
                .inner
                .bind_many(&self.state, &args, holder, target, Hints::Lenient, Class::Bulk)
                .await;
            // Read-your-writes, as for one durable acquire: these references are not in `held`,
            // so the bindings reach the cache only through the watch.
            let bound: Vec<(&str, u64)> = distinct
                .iter()
                .zip(&results)
                .filter_map(|(k, r)| r.as_ref().ok().map(|a| (*k, a.id)))
                .collect();
            self.until_cached(&bound, &[]).await;
            spread(results.into_iter().map(Some).collect(), &at, |a| Acquired {
                id: a.id,
                new: false,
            })
        })
        .await
    }

    /// [`Pool::release`] for many keys, packed many per round trip. A key given twice counts down
    /// twice, as two calls would.
    pub async fn release_many<K: AsRef<str>>(&self, keys: &[K]) -> Vec<Result<Released>> {
        let names: Vec<&str> = keys.iter().map(|k| k.as_ref()).collect();
        self.many(&names, |distinct, at| async move {
            let _guards = self.lock_keys(&distinct).await;
            // Per input position: decided locally, or waiting for the store (distinct index).
            let mut local: Vec<Option<Result<Released>>> = vec![None; at.len()];
            let mut seen = vec![0u64; distinct.len()];
            let mut send: Vec<Option<u64>> = vec![None; distinct.len()];
            let mut sender: Vec<Option<usize>> = vec![None; distinct.len()];
            {
                let mut held = lock(&self.state.held);
                for (pos, &d) in at.iter().enumerate() {
                    seen[d] += 1;
                    let key = distinct[d];
                    match held.get_mut(key) {
                        None => local[pos] = Some(Ok(Released { held: false, reclaimed: false })),
                        Some(h) if h.count > 1 => {
                            h.count -= 1;
                            local[pos] = Some(Ok(Released { held: true, reclaimed: false }));
                        }
                        Some(h) => {
                            send[d] = Some(h.id);
                            sender[d] = Some(pos);
                            held.remove(key);
                        }
                    }
                }
            }
            let items: Vec<(usize, (&str, u64))> = send
                .iter()
                .enumerate()
                .filter_map(|(d, id)| id.map(|id| (d, (distinct[d], id))))
                .collect();
            let args: Vec<(&str, u64)> = items.iter().map(|(_, a)| *a).collect();
            let holder = self.inner.holder.clone();
            let results =
                self.inner.release_ref_many(&self.state, &args, &holder, false, Class::Bulk).await;
            for ((d, (key, id)), r) in items.into_iter().zip(results) {
                let r = match r {
                    Ok(r) => Ok(Released { held: true, reclaimed: r.reclaimed }),
                    Err(Error::Unavailable { reason, retryable, source }) => {
                        warn!(pool = %self.state.spec.name(), key, id, %reason, "release outcome unknown; completing it in the background");
                        self.inner.repairs.push(Repair::Release(self.state.clone(), key.to_string(), id));
                        Err(Error::Unavailable { reason: format!("{reason}; the release is completed in the background"), retryable, source })
                    }
                    Err(e @ (Error::PoolNotFound { .. } | Error::RangeMismatch { .. })) => Err(e),
                    Err(e) => {
                        lock(&self.state.held).insert(key.to_string(), Held { id, count: 1 });
                        Err(e)
                    }
                };
                if let Some(pos) = sender[d] {
                    local[pos] = Some(r);
                }
            }
            local
                .into_iter()
                .map(|r| r.unwrap_or_else(|| Err(Error::unavailable_for_good("no result"))))
                .collect()
        })
        .await
    }

    /// [`Pool::release_durable`] for many keys, packed many per round trip. A key given twice is
    /// released once (the second occurrence reports `held: false`, as a second call would).
    pub async fn release_many_durable<K: AsRef<str>>(
        &self,
        keys: &[K],
        holder: &str,
    ) -> Vec<Result<Released>> {
        if let Err(e) = validate_stored_durable_holder(holder) {
            return keys.iter().map(|_| Err(e.clone())).collect();
        }
        let names: Vec<&str> = keys.iter().map(|k| k.as_ref()).collect();
        self.many(&names, |distinct, at| async move {
            let _guards = self.lock_keys(&distinct).await;
            // A lazily opened pool reads each key's record instead of loading the whole view.
            let synced = !self.inner.view_unloaded(&self.state)
                && self.inner.wait_synced(&self.state).await.is_ok();
            let mut out: Vec<Option<Result<Released>>> = vec![None; distinct.len()];
            let mut items: Vec<(usize, (&str, u64))> = Vec::new();
            for (d, key) in distinct.iter().enumerate() {
                let id = match synced.then(|| self.get(key)).flatten() {
                    Some(id) => Ok(Some(id)),
                    None => self.get_consistent(key).await,
                };
                match id {
                    Ok(Some(id)) => items.push((d, (*key, id))),
                    // No binding: at most a stray reference is left (rare; one round trip each).
                    Ok(None) => {
                        out[d] =
                            Some(self.inner.release_stray_ref(&self.state, key, holder, true).await)
                    }
                    Err(e) => out[d] = Some(Err(e)),
                }
            }
            let args: Vec<(&str, u64)> = items.iter().map(|(_, a)| *a).collect();
            let results =
                self.inner.release_ref_many(&self.state, &args, holder, true, Class::Bulk).await;
            // Read-your-writes, as for one durable release: the reclaimed bindings leave the
            // cache only through the watch.
            let freed: Vec<(&str, u64)> = items
                .iter()
                .zip(&results)
                .filter(|(_, r)| r.as_ref().is_ok_and(|r| r.reclaimed))
                .map(|((_, a), _)| *a)
                .collect();
            self.until_cached(&[], &freed).await;
            for ((d, _), r) in items.into_iter().zip(results) {
                out[d] = Some(r);
            }
            spread(out, &at, |_| Released { held: false, reclaimed: false })
        })
        .await
    }

    /// Runs `f` on chunks of the valid distinct keys of `keys` and puts the results back per input
    /// position (invalid keys get their validation error).
    async fn many<'k, T, F, Fut>(&self, keys: &[&'k str], f: F) -> Vec<Result<T>>
    where
        T: Clone,
        F: Fn(Vec<&'k str>, Vec<usize>) -> Fut,
        Fut: std::future::Future<Output = Vec<Result<T>>>,
    {
        let mut out: Vec<Option<Result<T>>> = vec![None; keys.len()];
        let mut valid: Vec<(usize, &'k str)> = Vec::with_capacity(keys.len());
        for (pos, &k) in keys.iter().enumerate() {
            match validate_key(k) {
                Ok(()) => valid.push((pos, k)),
                Err(e) => out[pos] = Some(Err(e)),
            }
        }
        // Chunks of whole keys: every occurrence of a key lands in the same chunk.
        let names: Vec<&'k str> = valid.iter().map(|(_, k)| *k).collect();
        let (all_distinct, all_at) = distinct(&names);
        let mut start = 0;
        while start < all_distinct.len() {
            let end = (start + CHUNK).min(all_distinct.len());
            let positions: Vec<usize> =
                (0..valid.len()).filter(|&v| (start..end).contains(&all_at[v])).collect();
            let chunk_keys: Vec<&'k str> = positions.iter().map(|&v| valid[v].1).collect();
            let (d, at) = distinct(&chunk_keys);
            let results = f(d, at).await;
            for (&v, r) in positions.iter().zip(results) {
                out[valid[v].0] = Some(r);
            }
            start = end;
        }
        out.into_iter()
            .map(|r| r.unwrap_or_else(|| Err(Error::unavailable_for_good("no result"))))
            .collect()
    }
}

/// Per input position from per distinct key: the first occurrence gets the key's result, later
/// ones `again(result)` (a success) or the same error.
fn spread<T: Clone>(
    per_key: Vec<Option<Result<T>>>,
    at: &[usize],
    again: impl Fn(&T) -> T,
) -> Vec<Result<T>> {
    let mut first = vec![true; per_key.len()];
    at.iter()
        .map(|&d| {
            let r =
                per_key[d].clone().unwrap_or_else(|| Err(Error::unavailable_for_good("no result")));
            if std::mem::take(&mut first[d]) {
                r
            } else {
                r.map(|t| again(&t))
            }
        })
        .collect()
}
