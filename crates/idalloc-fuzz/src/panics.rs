//! Panics on any thread, counted.
//!
//! A property runs the code under test on threads it does not own (tokio's blocking pool runs the
//! file store's writer, and drops it there), where a panic never reaches the property's caller:
//! tokio catches it. libFuzzer's panic hook aborts on a panic on any thread, so cargo-fuzz sees
//! those; the stable run must too. This hook counts every panic that reaches it, and a property
//! asserts the count did not move.
//!
//! Order matters: the file store's `guarded` wraps the hook it finds when it first runs and keeps
//! redb panics it turns into errors from the hooks below it. [`install`] is called before any
//! store is opened, so redb panics that become `Corrupt` are not counted, and every other panic
//! is.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Once;

static PANICS: AtomicUsize = AtomicUsize::new(0);

/// Installs the counting hook (once per process) in front of the current one.
pub fn install() {
    static HOOK: Once = Once::new();
    HOOK.call_once(|| {
        let previous = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            PANICS.fetch_add(1, Ordering::SeqCst);
            previous(info);
        }));
    });
}

/// Panics counted so far in this process.
pub fn count() -> usize {
    PANICS.load(Ordering::SeqCst)
}
