//! The file store at scale: what one short-lived process pays to open a store
//! file of N records and do one-key work in it.
//!
//! ```sh
//! # fill: N records through the store API, 128 puts per txn, 32 txns in flight
//! cargo run -p idalloc --example file_store_scale -- fill target/tmp-bench/s.redb 1000000
//! # probe (a fresh process): open, one create-if-absent txn, one key read, one range read
//! cargo run -p idalloc --example file_store_scale -- probe target/tmp-bench/s.redb
//! ```
//!
//! Keys are `idalloc/data/p/id/NNNNNNN` (25 bytes), values 40 bytes, about the shape of an ID
//! record. `probe` prints one Markdown table row: records, file size, open, txn, get, range
//! (10 keys with `limit`), and the process's peak resident memory (`VmHWM`). A measurement, not
//! a test: it asserts only that every call succeeded and read what was written.

use std::sync::Arc;
use std::time::Instant;

use idalloc::store::embedded::{EmbeddedOptions, EmbeddedStore};
use idalloc::store::{Compare, GetRequest, KeyRange, Store, TxnOp, TxnRequest};

fn key(i: u64) -> String {
    format!("idalloc/data/p/id/{i:07}")
}

fn value(i: u64) -> String {
    format!("key-{i:036}")
}

/// Peak and current resident memory in KiB, from `/proc/self/status` (0 where unavailable).
fn rss_kib() -> (u64, u64) {
    use idalloc_testkit::procs::{memory, Proc};
    memory(Proc::Myself).map_or((0, 0), |m| (m.peak / 1024, m.rss / 1024))
}

fn ms(since: Instant) -> f64 {
    since.elapsed().as_secs_f64() * 1000.0
}

async fn fill(path: &str, n: u64) {
    let store =
        Arc::new(EmbeddedStore::open(path, EmbeddedOptions::default()).await.expect("open"));
    let start = Instant::now();
    let chunks: Vec<u64> = (0..n.div_ceil(128)).collect();
    let per_task = chunks.len().div_ceil(32).max(1);
    let mut tasks = Vec::new();
    for part in chunks.chunks(per_task) {
        let store = store.clone();
        let part = part.to_vec();
        tasks.push(tokio::spawn(async move {
            for c in part {
                let ops = (c * 128..((c + 1) * 128).min(n)).map(|i| TxnOp::put(key(i), value(i)));
                store.txn(TxnRequest::new().and_then(ops)).await.expect("fill txn");
            }
        }));
    }
    for t in tasks {
        t.await.expect("fill task");
    }
    let (hwm, _) = rss_kib();
    println!(
        "filled {n} records in {:.1} s, peak RSS {} MiB",
        start.elapsed().as_secs_f64(),
        hwm / 1024
    );
}

async fn probe(path: &str) {
    let size = std::fs::metadata(path).map(|m| m.len()).unwrap_or(0);
    let t = Instant::now();
    let store = EmbeddedStore::open(path, EmbeddedOptions::default()).await.expect("open");
    let open = ms(t);
    let n = store
        .get(GetRequest::prefix("idalloc/data/p/id/").count_only())
        .await
        .expect("count")
        .count;
    let probe_key = format!("probe/{}", std::process::id());
    let t = Instant::now();
    let txn = TxnRequest::new()
        .when([Compare::absent(probe_key.clone())])
        .and_then([TxnOp::put(probe_key.clone(), "v")]);
    store.txn(txn).await.expect("txn");
    let txn_ms = ms(t);
    let mid = (n / 2) as u64;
    let t = Instant::now();
    let got = store.get(GetRequest::key(key(mid))).await.expect("get");
    let get_ms = ms(t);
    assert_eq!(got.kvs.first().map(|kv| kv.value.clone()), Some(value(mid).into_bytes()));
    let t = Instant::now();
    let range = store
        .get(GetRequest::new(KeyRange::range(key(mid), key(mid + 1000))).with_limit(10))
        .await
        .expect("range");
    let range_ms = ms(t);
    assert_eq!(range.kvs.len(), 10.min(n as usize));
    let (hwm, _) = rss_kib();
    println!(
        "| {n} | {:.1} MB ({:.0} B/record) | {open:.1} ms | {txn_ms:.1} ms | {get_ms:.2} ms | {range_ms:.1} ms | {:.1} MB |",
        size as f64 / 1e6,
        size as f64 / n.max(1) as f64,
        hwm as f64 / 1024.0
    );
}

/// `probe` without the count (which reads every record): open, txn, get, range only, so the peak
/// memory is that of one-key work.
async fn probe_one(path: &str, n: u64) {
    let t = Instant::now();
    let store = EmbeddedStore::open(path, EmbeddedOptions::default()).await.expect("open");
    let open = ms(t);
    let probe_key = format!("probe/{}", std::process::id());
    let t = Instant::now();
    let txn = TxnRequest::new()
        .when([Compare::absent(probe_key.clone())])
        .and_then([TxnOp::put(probe_key.clone(), "v")]);
    store.txn(txn).await.expect("txn");
    let txn_ms = ms(t);
    let mid = n / 2;
    let t = Instant::now();
    let got = store.get(GetRequest::key(key(mid))).await.expect("get");
    let get_ms = ms(t);
    assert_eq!(got.kvs.first().map(|kv| kv.value.clone()), Some(value(mid).into_bytes()));
    let t = Instant::now();
    let range = store
        .get(GetRequest::new(KeyRange::range(key(mid), key(mid + 10))).with_limit(10))
        .await
        .expect("range");
    let range_ms = ms(t);
    assert_eq!(range.kvs.len(), 10.min(n as usize));
    let (hwm, _) = rss_kib();
    println!(
        "| {n} | {open:.1} ms | {txn_ms:.1} ms | {get_ms:.2} ms | {range_ms:.2} ms | {:.1} MB |",
        hwm as f64 / 1024.0
    );
}

#[tokio::main(flavor = "current_thread")]
async fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match args.iter().map(String::as_str).collect::<Vec<_>>().as_slice() {
        ["fill", path, n] => fill(path, n.parse().expect("a record count")).await,
        ["probe", path] => probe(path).await,
        ["one", path, n] => probe_one(path, n.parse().expect("the record count")).await,
        _ => {
            eprintln!("usage: file_store_scale fill PATH N | probe PATH | one PATH N");
            std::process::exit(2);
        }
    }
}
