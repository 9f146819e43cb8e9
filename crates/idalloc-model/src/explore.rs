//! The search: breadth-first over distinct states (a 128-bit hash of [`World::canonical`]), so
//! the first violation found comes with a shortest trace.

use std::collections::hash_map::DefaultHasher;
use std::collections::{HashMap, VecDeque};
use std::hash::{Hash, Hasher};
use std::time::{Duration, Instant};

use crate::world::{Ctx, Event, Scope, World};

/// What a search found.
#[derive(Debug)]
pub struct Report {
    /// Distinct states reached (each checked).
    pub states: usize,
    /// Transitions generated (successor states, before de-duplication).
    pub transitions: usize,
    /// Quiescent states among them (each checked for G4 after a final sweep).
    pub quiescent: usize,
    /// The longest shortest path from the initial state.
    pub depth: usize,
    pub elapsed: Duration,
    /// The first violation found, if any (the search stops there).
    pub violation: Option<Violation>,
    /// The search stopped at `Scope::max_states` before exhausting the scope.
    pub truncated: bool,
}

/// A broken guarantee and a shortest sequence of events from the initial state to it.
#[derive(Debug)]
pub struct Violation {
    pub problems: Vec<String>,
    /// Each step: the event and the state after it (summary).
    pub trace: Vec<(Event, String)>,
}

impl std::fmt::Display for Violation {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        writeln!(f, "violated: {}", self.problems.join("; "))?;
        for (i, (event, state)) in self.trace.iter().enumerate() {
            writeln!(f, "  {:>2}. {event}\n      -> {state}", i + 1)?;
        }
        Ok(())
    }
}

fn fingerprint(w: &World) -> u128 {
    let c = w.canonical();
    let mut a = DefaultHasher::new();
    c.hash(&mut a);
    let mut b = DefaultHasher::new();
    0x9e37_79b9_7f4a_7c15u64.hash(&mut b);
    c.hash(&mut b);
    (u128::from(a.finish()) << 64) | u128::from(b.finish())
}

/// Explores every state reachable within `scope`, checking each.
pub fn explore(scope: Scope) -> Report {
    let start = Instant::now();
    let ctx = Ctx::new(scope);
    let init = World::initial(&ctx);
    let root = fingerprint(&init);
    // state -> (parent, event) for trace reconstruction; the root is its own parent.
    let mut seen: HashMap<u128, (u128, Event)> = HashMap::new();
    seen.insert(root, (root, String::new()));
    let mut queue: VecDeque<(World, u128, usize)> = VecDeque::new();
    let mut report = Report {
        states: 1,
        transitions: 0,
        quiescent: 0,
        depth: 0,
        elapsed: Duration::ZERO,
        violation: None,
        truncated: false,
    };
    let check = |w: &World, h: u128, seen: &HashMap<u128, (u128, Event)>| {
        let problems = w.violations(&ctx);
        (!problems.is_empty()).then(|| Violation { problems, trace: trace(&ctx, seen, h) })
    };
    if let Some(v) = check(&init, root, &seen) {
        report.violation = Some(v);
        return report;
    }
    queue.push_back((init, root, 0));
    while let Some((w, h, depth)) = queue.pop_front() {
        report.depth = report.depth.max(depth);
        for (event, next) in w.successors(&ctx) {
            report.transitions += 1;
            let nh = fingerprint(&next);
            if seen.contains_key(&nh) {
                continue;
            }
            seen.insert(nh, (h, event));
            report.states += 1;
            if next.quiescent_now(&ctx) {
                report.quiescent += 1;
            }
            if let Some(v) = check(&next, nh, &seen) {
                report.violation = Some(v);
                report.elapsed = start.elapsed();
                return report;
            }
            if report.states >= ctx.scope.max_states {
                report.truncated = true;
                report.elapsed = start.elapsed();
                return report;
            }
            if report.states % 500_000 == 0 {
                eprintln!(
                    "model check: {} states, {} queued, depth {depth}, {:.0} s",
                    report.states,
                    queue.len(),
                    start.elapsed().as_secs_f64()
                );
            }
            queue.push_back((next, nh, depth + 1));
        }
    }
    report.elapsed = start.elapsed();
    report
}

/// The events from the initial state to `h`, replayed to print each state after its event.
fn trace(ctx: &Ctx, seen: &HashMap<u128, (u128, Event)>, h: u128) -> Vec<(Event, String)> {
    let mut path = Vec::new();
    let mut at = h;
    while let Some((parent, _)) = seen.get(&at) {
        if *parent == at {
            break;
        }
        path.push(at);
        at = *parent;
    }
    path.reverse();
    let mut w = World::initial(ctx);
    let mut out = Vec::new();
    for step in path {
        let Some((event, next)) =
            w.successors(ctx).into_iter().find(|(_, n)| fingerprint(n) == step)
        else {
            out.push(("(replay diverged)".to_string(), String::new()));
            break;
        };
        out.push((event, next.summary(ctx)));
        w = next;
    }
    out
}
