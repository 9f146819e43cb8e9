//! Store benchmark: throughput and latency of the allocator's typical write, a create-if-absent
//! txn with three puts (`If create_rev(a) == 0 ∧ create_rev(b) == 0 Then put a, put b, put c`), on
//! fresh keys each time, with 1, 16 and 64 concurrent clients (or `--clients 1,64`).
//!
//! ```sh
//! cargo run --release -p idalloc --example store_bench -- [--seconds N] [--clients 1,16,64] \
//!     [--stores memory,file,etcd]
//! ```
//!
//! Starts its own etcd on loopback (needs `etcd` on `PATH`) unless `--stores` leaves it out. To
//! compare another store, add one line to `stores` in `main`. Prints a Markdown table (figures go to docs/benchmarks/store.md).
//! This is a benchmark, not a test: it asserts only that every txn succeeded.

use std::sync::Arc;
use std::time::{Duration, Instant};

use idalloc::store::embedded::{EmbeddedOptions, EmbeddedStore};
use idalloc::store::{Compare, Store, TxnOp, TxnRequest};
use idalloc_testkit::etcd::{unique_prefix, EtcdServer};

/// Client counts to run for every store unless `--clients` says otherwise.
const CLIENTS: [usize; 3] = [1, 16, 64];

struct Row {
    store: String,
    clients: usize,
    txns: usize,
    secs: f64,
    p50: Duration,
    p99: Duration,
}

/// Runs `clients` concurrent loops of create-if-absent txns for `run` and collects latencies.
async fn bench(store: Arc<dyn Store>, clients: usize, run: Duration) -> (Vec<Duration>, f64) {
    let prefix = unique_prefix();
    let start = Instant::now();
    let deadline = start + run;
    let mut tasks = Vec::with_capacity(clients);
    for client in 0..clients {
        let store = store.clone();
        let prefix = prefix.clone();
        tasks.push(tokio::spawn(async move {
            let mut lat = Vec::new();
            let mut i = 0u64;
            while Instant::now() < deadline {
                let key = |k: &str| {
                    let mut v = prefix.clone();
                    v.extend_from_slice(format!("{client}/{i}/{k}").as_bytes());
                    v
                };
                let (a, b, c) = (key("a"), key("b"), key("c"));
                let req = TxnRequest::new()
                    .when([Compare::absent(a.clone()), Compare::absent(b.clone())])
                    .and_then([TxnOp::put(a, "id"), TxnOp::put(b, "key"), TxnOp::put(c, "ref")]);
                let t = Instant::now();
                let resp = store.txn(req).await.expect("benchmark txn failed");
                lat.push(t.elapsed());
                assert!(resp.succeeded, "fresh keys: the create-if-absent txn must succeed");
                i += 1;
            }
            lat
        }));
    }
    let mut all = Vec::new();
    for t in tasks {
        all.extend(t.await.expect("benchmark task panicked"));
    }
    (all, start.elapsed().as_secs_f64())
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    let idx = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[idx.min(sorted.len() - 1)]
}

fn ms(d: Duration) -> String {
    format!("{:.2}", d.as_secs_f64() * 1000.0)
}

#[tokio::main(flavor = "multi_thread")]
async fn main() -> Result<(), String> {
    let mut seconds = 5u64;
    let mut clients: Vec<usize> = CLIENTS.to_vec();
    let mut which: Vec<String> = vec!["memory".into(), "file".into(), "etcd".into()];
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "--seconds" => {
                let v = args.next().ok_or("--seconds needs a value")?;
                seconds =
                    v.parse().map_err(|_| format!("--seconds: {v:?} is not a whole number"))?;
            }
            "--clients" => {
                let v = args.next().ok_or("--clients needs a list such as 1,16,64")?;
                clients = v
                    .split(',')
                    .map(|c| match c.parse::<usize>() {
                        Ok(n) if n > 0 => Ok(n),
                        _ => Err(format!("--clients: {c:?} is not a positive whole number")),
                    })
                    .collect::<Result<_, _>>()?;
            }
            "--stores" => {
                let v = args.next().ok_or("--stores needs a list such as memory,file,etcd")?;
                which = v.split(',').map(str::to_string).collect();
                if let Some(bad) =
                    which.iter().find(|s| !["memory", "file", "etcd"].contains(&s.as_str()))
                {
                    return Err(format!("--stores: {bad:?} is not one of memory, file, etcd"));
                }
            }
            other => {
                return Err(format!(
                "unknown argument {other:?}; allowed: --seconds N, --clients LIST, --stores LIST"
            ))
            }
        }
    }
    let run = Duration::from_secs(seconds);

    let want = |s: &str| which.iter().any(|w| w == s);
    let mut stores: Vec<(&str, Arc<dyn Store>)> = Vec::new();
    if want("memory") {
        stores.push(("memory (embedded)", Arc::new(EmbeddedStore::memory())));
    }
    let dir = tempfile::tempdir().map_err(|e| format!("temp dir: {e}"))?;
    if want("file") {
        let file_store =
            EmbeddedStore::open(dir.path().join("bench.redb"), EmbeddedOptions::default())
                .await
                .map_err(|e| format!("opening the file store: {e}"))?;
        stores.push(("file (embedded, redb)", Arc::new(file_store)));
    }
    let etcd = if want("etcd") { Some(EtcdServer::start().await?) } else { None };
    if let Some(etcd) = &etcd {
        stores.push(("etcd (1 member, loopback)", Arc::new(etcd.store().await?)));
    }

    let mut rows = Vec::new();
    for (name, store) in &stores {
        // Warm-up: connections, etcd's first allocations.
        bench(store.clone(), 4, Duration::from_millis(500)).await;
        for &clients in &clients {
            let (mut lat, secs) = bench(store.clone(), clients, run).await;
            lat.sort();
            rows.push(Row {
                store: name.to_string(),
                clients,
                txns: lat.len(),
                secs,
                p50: percentile(&lat, 0.50),
                p99: percentile(&lat, 0.99),
            });
        }
    }

    println!("| store | clients | txns | txn/s | p50 ms | p99 ms |");
    println!("|---|---:|---:|---:|---:|---:|");
    for r in rows {
        println!(
            "| {} | {} | {} | {:.0} | {} | {} |",
            r.store,
            r.clients,
            r.txns,
            r.txns as f64 / r.secs,
            ms(r.p50),
            ms(r.p99)
        );
    }
    Ok(())
}
