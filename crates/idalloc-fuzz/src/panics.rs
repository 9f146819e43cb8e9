//! Panics on any thread, counted per property run.
//!
//! A property runs the code under test on threads it does not own (tokio's blocking pool runs the
//! file store's writer, and drops it there), where a panic never reaches the property's caller:
//! tokio catches it. libFuzzer's panic hook aborts on a panic on any thread, so cargo-fuzz sees
//! those; the stable run must too. This hook counts every panic that reaches it, by the name of
//! the thread it happened on, and a property asserts its own count did not move.
//!
//! Per run, not per process: `cargo test` runs the properties on parallel threads, and with one
//! process-wide count a panic in one property's run failed every property running at the time
//! (one failure showed as two). Each run is a [`Scope`]: its runtime's threads carry the scope's
//! unique name, and only panics on those threads count against it.
//!
//! Order matters: the file store's `guarded` wraps the hook it finds when it first runs and keeps
//! redb panics it turns into errors from the hooks below it. [`install`] is called before any
//! store is opened, so redb panics that become `Corrupt` are not counted, and every other panic
//! is.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, Once};

/// Panics so far, by the name of the thread they happened on (`""`: an unnamed thread).
static PANICS: Mutex<Option<HashMap<String, usize>>> = Mutex::new(None);

/// Installs the counting hook (once per process) in front of the current one.
pub fn install() {
    static HOOK: Once = Once::new();
    HOOK.call_once(|| {
        let previous = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            let name = std::thread::current().name().unwrap_or("").to_string();
            let mut counts = PANICS.lock().unwrap_or_else(|p| p.into_inner());
            *counts.get_or_insert_with(HashMap::new).entry(name).or_insert(0) += 1;
            drop(counts);
            previous(info);
        }));
    });
}

/// Panics counted on threads named `name`.
fn count_on(name: &str) -> usize {
    let counts = PANICS.lock().unwrap_or_else(|p| p.into_inner());
    counts.as_ref().and_then(|c| c.get(name)).copied().unwrap_or(0)
}

/// One run of a property: a name no other run has, for its runtime's threads and its files.
pub struct Scope {
    name: String,
}

impl Scope {
    /// A new scope for a run of `target` (installs the hook).
    pub fn new(target: &str) -> Scope {
        static NEXT: AtomicU64 = AtomicU64::new(0);
        install();
        Scope { name: format!("fuzz-{target}-{}", NEXT.fetch_add(1, Ordering::Relaxed)) }
    }

    /// The scope's unique name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Runs `fut` to completion on a thread of its own that carries the scope's name, in a
    /// current-thread runtime whose blocking pool carries it too: so every task and blocking job
    /// of the run is on a thread of this scope. A panic of the future itself (a failed assertion)
    /// reaches the caller, as if it had run there.
    pub fn block_on<F>(&self, fut: F) -> F::Output
    where
        F: std::future::Future + Send,
        F::Output: Send,
    {
        std::thread::scope(|s| {
            let run = std::thread::Builder::new().name(self.name.clone()).spawn_scoped(s, || {
                tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .thread_name(self.name.clone())
                    .build()
                    .expect("tokio runtime")
                    .block_on(fut)
                // The runtime is dropped here: its blocking threads are done.
            });
            match run.expect("a thread for the run").join() {
                Ok(out) => out,
                Err(panic) => std::panic::resume_unwind(panic),
            }
        })
    }

    /// Panics on this scope's threads so far.
    pub fn panics(&self) -> usize {
        count_on(&self.name)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A panic on one run's threads (a task tokio catches, a blocking job) counts against that
    /// run only, also while another run is going on (with one process-wide count, both saw it).
    #[test]
    fn a_panic_counts_against_its_own_scope_only() {
        let (a, b) = (Scope::new("a"), Scope::new("b"));
        assert_ne!(a.name(), b.name());
        let (caught_task, caught_job) = std::thread::scope(|s| {
            let other = s.spawn(|| b.block_on(async { tokio::task::spawn_blocking(|| ()).await }));
            let caught = a.block_on(async {
                let task = tokio::spawn(async { panic!("planted panic in a task") }).await;
                let job = tokio::task::spawn_blocking(|| panic!("planted panic in a job")).await;
                (task.is_err(), job.is_err())
            });
            assert!(other.join().expect("b ran").is_ok());
            caught
        });
        assert!(caught_task && caught_job, "tokio caught both panics");
        assert_eq!((a.panics(), b.panics()), (2, 0));
    }

    /// A failed assertion inside the run reaches the caller.
    #[test]
    fn a_panic_of_the_run_itself_reaches_the_caller() {
        let scope = Scope::new("c");
        let r = std::panic::catch_unwind(|| scope.block_on(async { panic!("the property broke") }));
        assert!(r.is_err());
    }
}
