//! Lookups across 1 local pool + 8 remote views, one kind per run, for profilers: instruction
//! counts are deterministic under callgrind, so a change to the read path can be judged by them
//! on a loaded machine where timings are not.
//!
//! ```text
//! cargo build --release -p idalloc-bench --example lookup_profile
//! valgrind --tool=callgrind --toggle-collect='*lookup_loop*' \
//!     target/release/examples/lookup_profile key_of_any 10000 200000
//! ```
//! Kinds: `key_of` (local IDs), `key_of_any` (IDs of all 9 clusters), `get` (local keys),
//! `ids_of` (keys of all 9 clusters). Prints the number of hits, so the loop is not optimised away.

use std::hint::black_box;

use idalloc::Pool;
use idalloc_bench::remote::{lookup_fixture, LookupFixture};

fn scatter(i: u64, m: usize) -> usize {
    (i.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 17) as usize % m
}

#[inline(never)]
fn lookup_loop(kind: &str, pool: &Pool, ids: &[u64], keys: &[String], iters: u64) -> u64 {
    let mut hits = 0u64;
    for i in 0..iters {
        let j = scatter(i, ids.len());
        let hit = match kind {
            "key_of" => black_box(pool.key_of(black_box(ids[j]))).is_some(),
            "key_of_any" => black_box(pool.key_of_any(black_box(ids[j]))).is_some(),
            "get" => black_box(pool.get(black_box(&keys[j]))).is_some(),
            _ => !black_box(pool.ids_of(black_box(&keys[j]))).is_empty(),
        };
        hits += u64::from(hit);
    }
    hits
}

#[tokio::main(flavor = "multi_thread", worker_threads = 1)]
async fn main() -> Result<(), String> {
    let mut args = std::env::args().skip(1);
    let kind = args.next().unwrap_or_else(|| "key_of_any".into());
    let n: usize = args.next().and_then(|a| a.parse().ok()).unwrap_or(10_000);
    let iters: u64 = args.next().and_then(|a| a.parse().ok()).unwrap_or(200_000);
    let LookupFixture { alloc: _alloc, pool, ids, keys } = lookup_fixture(n).await?;
    let local = kind == "key_of" || kind == "get";
    let (ids, keys) = if local { (&ids[..n], &keys[..n]) } else { (&ids[..], &keys[..]) };
    let t0 = std::time::Instant::now();
    let hits = tokio::task::block_in_place(|| lookup_loop(&kind, &pool, ids, keys, iters));
    let ns = t0.elapsed().as_nanos() as f64 / iters as f64;
    println!("{kind}: {hits} hits of {iters}, {ns:.0} ns per lookup (wall clock)");
    Ok(())
}
