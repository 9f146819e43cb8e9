//! The model checker in CI (docs/design/model-checking.md): every state of the CI scope
//! satisfies G1–G3, every quiescent one G4; each sabotage of the protocol is found, with a
//! shortest trace. `scripts/test.sh` runs this file with `--nocapture` so the state counts are
//! in the log. `MODEL_SCOPE=wide` widens the clean run (see the docs for its figures).

use idalloc_model::{explore, Report, Scope};
use idalloc_testkit::sabotage::Sabotage;

fn env_u(name: &str, default: u64) -> u64 {
    match std::env::var(name) {
        Ok(v) => v.parse().unwrap_or_else(|_| panic!("{name}={v:?} is not a number")),
        Err(_) => default,
    }
}

/// The CI scope, widened by `MODEL_SCOPE=wide` or field by field (`MODEL_PROCS`, `MODEL_KEYS`,
/// `MODEL_IDS`, `MODEL_OPS`, `MODEL_CRASHES`, `MODEL_TIMEOUTS`, `MODEL_DUPS`, `MODEL_SWEEPS`,
/// `MODEL_DELETES`, `MODEL_RESIZES`).
fn scope() -> Scope {
    let base = match std::env::var("MODEL_SCOPE").as_deref() {
        Ok("wide") => Scope { ops: 2, ..Scope::default() },
        _ => Scope::default(),
    };
    Scope {
        procs: env_u("MODEL_PROCS", base.procs as u64) as usize,
        keys: env_u("MODEL_KEYS", base.keys as u64) as usize,
        ids: env_u("MODEL_IDS", base.ids),
        ops: env_u("MODEL_OPS", base.ops.into()) as u32,
        crashes: env_u("MODEL_CRASHES", base.crashes.into()) as u32,
        timeouts: env_u("MODEL_TIMEOUTS", base.timeouts.into()) as u32,
        dups: env_u("MODEL_DUPS", base.dups.into()) as u32,
        sweeps: env_u("MODEL_SWEEPS", base.sweeps.into()) as u32,
        deletes: env_u("MODEL_DELETES", base.deletes.into()) as u32,
        resizes: env_u("MODEL_RESIZES", base.resizes.into()) as u32,
        same_holder: env_u("MODEL_SAME_HOLDER", 0) == 1,
        ..base
    }
}

fn line(what: &str, scope: &Scope, r: &Report) {
    println!(
        "model check {what}: {} states, {} transitions, {} quiescent, depth {}, {:.1} s \
         (procs {} keys {} ids {} ops {} crashes {} timeouts {} dups {} sweeps {} deletes {} resizes {} batch {})",
        r.states,
        r.transitions,
        r.quiescent,
        r.depth,
        r.elapsed.as_secs_f64(),
        scope.procs,
        scope.keys,
        scope.ids,
        scope.ops,
        scope.crashes,
        scope.timeouts,
        scope.dups,
        scope.sweeps,
        scope.deletes,
        scope.resizes,
        scope.batch
    );
}

#[test]
fn every_reachable_state_satisfies_g1_to_g4() {
    let scope = scope();
    let r = explore(scope.clone());
    line("clean protocol", &scope, &r);
    if let Some(v) = &r.violation {
        panic!("the protocol breaks a guarantee:\n{v}");
    }
    assert!(!r.truncated, "the search stopped at {} states before exhausting the scope", r.states);
    assert!(r.quiescent > 0, "no quiescent state was reached: G4 was never checked");
}

/// Lost answers and late and repeated applies, with releases, fence bumps, sweeps and folds: one
/// process (two make this scope too large for CI; see the docs for the wider runs).
#[test]
fn lost_answers_and_late_applies_break_nothing() {
    let scope = Scope { procs: 1, ops: 2, crashes: 0, timeouts: 1, dups: 1, ..Scope::default() };
    let r = explore(scope.clone());
    line("clean protocol, late applies", &scope, &r);
    if let Some(v) = &r.violation {
        panic!("the protocol breaks a guarantee:\n{v}");
    }
    assert!(!r.truncated && r.quiescent > 0);
}

/// The pool deleted (force) and re-created under two processes, with a sweep in flight.
#[test]
fn pool_delete_and_re_create_break_nothing() {
    let scope = Scope { crashes: 0, deletes: 1, ..Scope::default() };
    let r = explore(scope.clone());
    line("clean protocol, pool delete", &scope, &r);
    if let Some(v) = &r.violation {
        panic!("the protocol breaks a guarantee:\n{v}");
    }
    assert!(!r.truncated && r.quiescent > 0);
}

/// Resizes (grow, shrink, a reserved ID, and back) racing binds and releases of two processes
/// whose decisions were made under the old spec, which learn the new one from the spec watch or
/// from a failed write: G1 holds, and no ID record or held ID is ever outside the spec in force.
#[test]
fn resizes_racing_binds_break_nothing() {
    let scope = Scope { crashes: 0, sweeps: 0, resizes: 1, ..Scope::default() };
    let r = explore(scope.clone());
    line("clean protocol, resizes", &scope, &r);
    if let Some(v) = &r.violation {
        panic!("the protocol breaks a guarantee:\n{v}");
    }
    assert!(!r.truncated && r.quiescent > 0);
}

/// Resizes with a late apply: a bind that timed out under the old range and commits after the
/// resize, and a resize txn applied late after binds its listing did not see.
#[test]
fn resizes_racing_late_binds_break_nothing() {
    let scope = Scope {
        procs: 1,
        ops: 2,
        crashes: 0,
        timeouts: 1,
        sweeps: 0,
        resizes: 1,
        ..Scope::default()
    };
    let r = explore(scope.clone());
    line("clean protocol, resizes and late applies", &scope, &r);
    if let Some(v) = &r.violation {
        panic!("the protocol breaks a guarantee:\n{v}");
    }
    assert!(!r.truncated && r.quiescent > 0);
}

/// A process that restarts under the same holder name (a configured `AllocatorOptions::holder`):
/// a bind of its previous life applied after the new life re-referenced the key must not move the
/// reference back onto the old lease (it did, until binds compared the holder's own reference:
/// G2, "P1 holds k0 but its reference is gone", in this scope).
#[test]
fn a_restart_under_the_same_holder_name_breaks_nothing() {
    let scope = Scope {
        keys: 1,
        ids: 1,
        ops: 2,
        crashes: 1,
        sweeps: 0,
        same_holder: true,
        ..Scope::default()
    };
    let r = explore(scope.clone());
    line("clean protocol, same holder across a restart", &scope, &r);
    if let Some(v) = &r.violation {
        panic!("the protocol breaks a guarantee:\n{v}");
    }
    assert!(!r.truncated && r.quiescent > 0);
}

/// A lazy binder (no view; guessed candidates, learned collisions, the usage
/// read and the view loaded on demand) beside a synced one, with a crash and a sweep.
#[test]
fn lazy_binders_beside_synced_ones_break_nothing() {
    let scope = Scope { lazy: true, ..Scope::default() };
    let r = explore(scope.clone());
    line("clean protocol, lazy binder", &scope, &r);
    if let Some(v) = &r.violation {
        panic!("the protocol breaks a guarantee:\n{v}");
    }
    assert!(!r.truncated && r.quiescent > 0);
}

/// Lazily opened `lowest` pools: a lazy binder that reads the key record first and, for a new
/// key, every used ID before it picks (`Candidates::UsedIds`), beside a synced one, with a crash
/// and a sweep: the reads can be stale by the time the txn lands, and the compares still decide.
#[test]
fn lazy_lowest_binders_beside_synced_ones_break_nothing() {
    let scope = Scope { lazy: true, lazy_lowest: true, ..Scope::default() };
    let r = explore(scope.clone());
    line("clean protocol, lazy lowest binder", &scope, &r);
    if let Some(v) = &r.violation {
        panic!("the protocol breaks a guarantee:\n{v}");
    }
    assert!(!r.truncated && r.quiescent > 0);
}

/// The same sabotage as below, found with a lone lazy binder of a `lowest` pool: the used IDs it
/// read are no substitute for the ID-absent compare.
#[test]
fn sabotage_dropping_the_id_absent_compare_is_found_with_a_lazy_lowest_binder() {
    found(
        Sabotage::SkipIdAbsentCompare,
        Scope { procs: 1, crashes: 1, lazy: true, lazy_lowest: true, ..small() },
        &["G1"],
    );
}

/// Runs `sabotage` on `scope` and requires a violation naming one of `expect`, printing its trace.
fn found(sabotage: Sabotage, scope: Scope, expect: &[&str]) {
    let scope = Scope { sabotage: Some(sabotage), ..scope };
    let r = explore(scope.clone());
    line(&format!("{sabotage:?}"), &scope, &r);
    let Some(v) = r.violation else {
        panic!("{sabotage:?} was not found in {} states", r.states);
    };
    println!("{sabotage:?}: shortest trace ({} steps)\n{v}", v.trace.len());
    assert!(
        v.problems.iter().any(|p| expect.iter().any(|e| p.starts_with(e))),
        "{sabotage:?} broke something else than {expect:?}: {:?}",
        v.problems
    );
}

/// Small scopes that reach each sabotage fast; BFS makes the trace a shortest one.
fn small() -> Scope {
    Scope { ops: 2, crashes: 0, timeouts: 0, dups: 0, sweeps: 0, deletes: 0, ..Scope::default() }
}

#[test]
fn sabotage_dropping_the_id_absent_compare_is_found() {
    found(Sabotage::SkipIdAbsentCompare, small(), &["G1"]);
}

/// The ID-absent compare is what keeps a lazy binder's guesses safe: dropping it is found with a
/// lone lazy process too (the same scope finds it with a synced one, so this checks that the
/// lazy path is explored, not that only it breaks).
#[test]
fn sabotage_dropping_the_id_absent_compare_is_found_with_a_lazy_binder() {
    found(
        Sabotage::SkipIdAbsentCompare,
        Scope { procs: 1, crashes: 1, lazy: true, ..small() },
        &["G1"],
    );
}

#[test]
fn sabotage_dropping_the_key_absent_compare_is_found() {
    found(Sabotage::SkipKeyAbsentCompare, small(), &["G1", "G2"]);
}

#[test]
fn sabotage_dropping_the_release_refs_empty_compare_is_found() {
    found(Sabotage::SkipReleaseRefsEmpty, small(), &["G2", "G1"]);
}

#[test]
fn sabotage_dropping_the_sweep_refs_empty_compare_is_found() {
    found(
        Sabotage::SkipSweepRefsEmpty,
        Scope { ops: 1, crashes: 1, sweeps: 1, ..small() },
        &["G2", "G1"],
    );
}

#[test]
fn sabotage_dropping_the_late_fences_is_found() {
    found(
        Sabotage::SkipLateFences,
        Scope { procs: 1, timeouts: 1, ..small() },
        &["G4", "G2", "G1"],
    );
}

#[test]
fn sabotage_dropping_the_fence_floor_compare_is_found() {
    found(
        Sabotage::SkipFenceFloor,
        Scope { procs: 1, timeouts: 1, sweeps: 1, ..small() },
        &["G4", "G2", "G1"],
    );
}

/// Without the spec version compare, a bind decided under the old range commits after a shrink
/// (or a reservation) of it: an ID record outside the spec in force.
#[test]
fn sabotage_dropping_the_spec_compare_is_found_with_a_resize() {
    found(Sabotage::SkipSpecCompare, Scope { resizes: 1, ..small() }, &["G3"]);
}

/// Without the narrowing resize's compare on the ID records, a bind committed after the resize's
/// listing is left outside the narrowed spec.
#[test]
fn sabotage_dropping_the_resize_listing_compare_is_found() {
    found(Sabotage::SkipResizeListingCompare, Scope { ops: 1, resizes: 1, ..small() }, &["G3"]);
}

#[test]
fn sabotage_dropping_the_spec_compare_is_found() {
    found(Sabotage::SkipSpecCompare, Scope { deletes: 1, ..small() }, &["G4", "G2", "G1"]);
}
