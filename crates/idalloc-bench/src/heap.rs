//! Bytes on the heap, counted by a global allocator that the benchmark binary installs
//! (`main.rs`): the memory a structure retains, measured exactly, where the process's resident
//! size (RSS) also moves with allocator caching, freed-but-kept pages and listing buffers.
//!
//! Counting is off unless a measurement is running ([`measure`]), so the other benchmarks pay
//! one relaxed load per allocation, not a shared atomic add. Only this bench crate has a global
//! allocator; the library has none and no `unsafe`.

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, Ordering};

static ON: AtomicBool = AtomicBool::new(false);
static INSTALLED: AtomicBool = AtomicBool::new(false);
/// Bytes allocated minus bytes freed while counting was on.
static NET: AtomicI64 = AtomicI64::new(0);
/// Bytes allocated (never decreased by a free) while counting was on: the allocation traffic of
/// a piece of work, which shows a copy made again and again where the net figure does not.
static ALLOCATED: AtomicU64 = AtomicU64::new(0);

fn count(bytes: usize) {
    NET.fetch_add(bytes as i64, Ordering::Relaxed);
    ALLOCATED.fetch_add(bytes as u64, Ordering::Relaxed);
}

/// The system allocator, counting requested bytes while a measurement runs.
pub struct Counting;

// SAFETY: every call is forwarded unchanged to the system allocator; the counters are plain
// atomics and never touch the memory.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        // SAFETY: same contract as the caller's.
        let p = unsafe { System.alloc(layout) };
        if !p.is_null() && ON.load(Ordering::Relaxed) {
            count(layout.size());
        }
        p
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        // SAFETY: same contract as the caller's.
        let p = unsafe { System.alloc_zeroed(layout) };
        if !p.is_null() && ON.load(Ordering::Relaxed) {
            count(layout.size());
        }
        p
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: same contract as the caller's.
        unsafe { System.dealloc(ptr, layout) };
        if ON.load(Ordering::Relaxed) {
            NET.fetch_sub(layout.size() as i64, Ordering::Relaxed);
        }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        // SAFETY: same contract as the caller's.
        let p = unsafe { System.realloc(ptr, layout, new_size) };
        if !p.is_null() && ON.load(Ordering::Relaxed) {
            NET.fetch_add(new_size as i64 - layout.size() as i64, Ordering::Relaxed);
            // A realloc may move the block: the new size is what it can have copied.
            ALLOCATED.fetch_add(new_size as u64, Ordering::Relaxed);
        }
        p
    }
}

/// Called by a binary that installed [`Counting`] as its global allocator.
pub fn installed() {
    INSTALLED.store(true, Ordering::Relaxed);
}

/// Runs `f` with counting on; the net bytes it left allocated (allocated minus freed during the
/// run), or `None` if [`Counting`] is not the global allocator. Memory allocated before and
/// freed during the run counts negative: run it on a quiet process.
pub async fn measure<T>(f: impl std::future::Future<Output = T>) -> (T, Option<i64>) {
    let (out, net, _) = measure_both(f).await;
    (out, net)
}

/// Runs `f` with counting on; the bytes allocated during the run (every allocation, freed or
/// not: the work's allocation traffic), or `None` if [`Counting`] is not the global allocator.
/// Counts the whole process's allocations meanwhile, so run it with nothing else busy.
pub async fn allocated<T>(f: impl std::future::Future<Output = T>) -> (T, Option<u64>) {
    let (out, _, total) = measure_both(f).await;
    (out, total)
}

async fn measure_both<T>(f: impl std::future::Future<Output = T>) -> (T, Option<i64>, Option<u64>) {
    NET.store(0, Ordering::SeqCst);
    ALLOCATED.store(0, Ordering::SeqCst);
    ON.store(true, Ordering::SeqCst);
    let out = f.await;
    ON.store(false, Ordering::SeqCst);
    let (net, total) = (NET.load(Ordering::SeqCst), ALLOCATED.load(Ordering::SeqCst));
    let installed = INSTALLED.load(Ordering::Relaxed);
    (out, installed.then_some(net), installed.then_some(total))
}
