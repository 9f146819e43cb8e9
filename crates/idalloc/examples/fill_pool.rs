//! Fills a pool on etcd (or in a store file) with N durable bindings quickly, for the scale
//! measurements of docs/benchmarks/scale.md ("One key"): creates the pool through the library, then writes
//! each binding's exact records (`id/<ID>` bound to the key, `key/<key>` naming the ID,
//! `ref/<key>/<holder>`) in large txns, several in flight. The keys are 40 bytes. The IDs are
//! spread evenly over the range (a `random` pool at that fill), or with `--strategy lowest` packed
//! from 1 (IDs 1..=N of a `lowest` pool, as its binds leave it).
//!
//! ```sh
//! cargo run -p idalloc --example fill_pool -- --endpoint http://127.0.0.1:2379 --pool big \
//!     --bindings 1000000 --max 16777215 [--prefix idalloc] [--per-txn 1000] [--strategy lowest]
//! cargo run -p idalloc --example fill_pool -- --file target/tmp-bench/big.redb --pool big ...
//! ```
//!
//! etcd refuses txns of more than `--max-txn-ops` operations (128 by default); start it with
//! `--max-txn-ops` of at least 3 × `--per-txn`. A store file takes at most 128 operations per txn:
//! `--per-txn 42`, and many txns in flight (`--in-flight 512`, default 8) so that its writer
//! commits them in groups of up to 512 txns: 1M bindings in 73 s with the release build (64 in
//! flight took 2,248 s with a debug build). Not a test: it checks only that every txn applied.

use std::sync::Arc;
use std::time::Instant;

use idalloc::layout::{encode_id, IdRecord, Layout};
use idalloc::store::embedded::{EmbeddedOptions, EmbeddedStore};
use idalloc::store::etcd::{EtcdOptions, EtcdStore};
use idalloc::store::{Store, TxnOp, TxnRequest};
use idalloc::{Allocator, AllocatorOptions, PoolSpec, Strategy};

/// The value after `--name`, or `default`.
fn arg(name: &str, default: &str) -> String {
    let args: Vec<String> = std::env::args().collect();
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1).cloned())
        .unwrap_or_else(|| default.to_string())
}

fn num(name: &str, default: u64) -> u64 {
    let v = arg(name, &default.to_string());
    v.parse().unwrap_or_else(|_| panic!("{name} {v:?}: expected a number"))
}

/// Key `i`: 40 bytes, like the issue's figures.
fn key(i: u64) -> String {
    format!("pod-{i:012}.node-17.cluster-a.example")
}

#[tokio::main]
async fn main() {
    let endpoint = arg("--endpoint", "http://127.0.0.1:2379");
    let pool = arg("--pool", "big");
    let prefix = arg("--prefix", "idalloc");
    let n = num("--bindings", 100_000);
    let max = num("--max", (1 << 24) - 1);
    let per_txn = num("--per-txn", 1000);
    let holder = "filler";
    assert!(n <= max, "--bindings {n} do not fit in IDs 1..={max}");
    let lowest = match arg("--strategy", "random").as_str() {
        "random" => false,
        "lowest" => true,
        other => panic!("--strategy {other:?}: expected random or lowest"),
    };
    let file = arg("--file", "");
    let store: Arc<dyn Store> = if file.is_empty() {
        Arc::new(
            EtcdStore::connect(EtcdOptions::new(vec![endpoint.clone()])).await.expect("connect"),
        )
    } else {
        Arc::new(EmbeddedStore::open(&file, EmbeddedOptions::default()).await.expect("open file"))
    };
    let opts = AllocatorOptions::builder().prefix(prefix.clone()).build().expect("--prefix");
    let alloc = Allocator::from_arc(store.clone(), opts).expect("allocator");
    let spec = PoolSpec::new(pool.clone(), 1, max);
    let spec = if lowest { spec.strategy(Strategy::Lowest) } else { spec };
    alloc.init_pool(&spec).await.expect("init pool");
    alloc.close().await.expect("close");
    let layout = Layout::new(&prefix).expect("prefix");
    let step = if lowest { 1 } else { max / n };
    let started = Instant::now();
    let batches: Vec<(u64, u64)> =
        (0..n).step_by(per_txn as usize).map(|lo| (lo, (lo + per_txn).min(n))).collect();
    let next = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let batches = Arc::new(batches);
    let mut tasks = Vec::new();
    for _ in 0..num("--in-flight", 8) {
        let (store, layout, pool, next, batches) =
            (store.clone(), layout.clone(), pool.clone(), next.clone(), batches.clone());
        tasks.push(tokio::spawn(async move {
            loop {
                let b = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                let Some(&(lo, hi)) = batches.get(b) else { return };
                let mut ops = Vec::with_capacity(3 * (hi - lo) as usize);
                for i in lo..hi {
                    let (k, id) = (key(i), 1 + i * step);
                    ops.push(TxnOp::put(
                        layout.id_key(&pool, id),
                        IdRecord::Bound(k.clone()).encode(),
                    ));
                    ops.push(TxnOp::put(layout.key_key(&pool, &k), encode_id(id)));
                    ops.push(TxnOp::put(layout.ref_key(&pool, &k, holder), encode_id(id)));
                }
                // Puts only, so a retry after a timeout (a busy machine) is harmless.
                let txn = TxnRequest::new().and_then(ops);
                let mut attempt = 0;
                let resp = loop {
                    attempt += 1;
                    match store.txn(txn.clone()).await {
                        Ok(r) => break r,
                        Err(e) if attempt < 10 => eprintln!("batch {b}: {e}; retrying"),
                        Err(e) => panic!("batch {b}: {e} after {attempt} attempts"),
                    }
                };
                assert!(resp.succeeded);
                if b % 100 == 0 {
                    eprintln!("{hi} bindings written, {:.1} s", started.elapsed().as_secs_f64());
                }
            }
        }));
    }
    for t in tasks {
        t.await.expect("task");
    }
    println!(
        "{n} bindings in pool {pool:?} (IDs 1..={max}, every {step}th) in {:.1} s",
        started.elapsed().as_secs_f64()
    );
    // A store file is closed cleanly when its last handle drops, here.
}
