//! The example agent written with the library, the same job as the client agents
//! (`crates/idalloc-client/examples/agent.rs`, `clients/go/examples/agent`,
//! `clients/python/examples/agent.py`), but on the store itself rather than through `serve`:
//! acquire 100 keys on this process's session, wait until the pool's watch-fed view shows every
//! one of them with the ID it was given, print the IDs as one JSON line, release the keys and
//! close (which ends the session). A test runs the four against one store (`serve` on it for the
//! other three) and compares their lines.
//!
//! ```sh
//! cargo run -p idalloc --example lib_agent -- etcd://127.0.0.1:2379 idalloc agents
//! ```

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use idalloc::store::url::{open, OpenOptions};
use idalloc::{Allocator, AllocatorOptions, PoolSpec};

/// The keys every agent acquires.
fn keys() -> Vec<String> {
    (0..100).map(|i| format!("agent-key-{i:03}")).collect()
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().collect();
    let store_url = args.get(1).cloned().unwrap_or_else(|| "file:idalloc.redb".into());
    let prefix = args.get(2).cloned().unwrap_or_else(|| "idalloc".into());
    let pool_name = args.get(3).cloned().unwrap_or_else(|| "agents".into());
    let store = open(&store_url, &OpenOptions::default()).await?;
    let opts = AllocatorOptions::builder().prefix(prefix).build()?;
    let alloc = Allocator::from_arc(store, opts)?;
    let pool = alloc.ensure_pool(&PoolSpec::new(pool_name.as_str(), 1, 65_535)).await?;
    let keys = keys();
    let mut ids = BTreeMap::new();
    for (k, r) in keys.iter().zip(pool.acquire_many(&keys).await) {
        ids.insert(k.as_str(), r?.id);
    }

    // Watch: the view shows every key with its ID (a bound for a loaded machine).
    pool.wait_synced().await?;
    let deadline = Instant::now() + Duration::from_secs(60);
    while ids.iter().any(|(k, id)| pool.get(k) != Some(*id)) {
        if Instant::now() > deadline {
            return Err("the view did not show every acquired key within 60 s".into());
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let watched = ids.iter().filter(|(k, id)| pool.key_of(**id).as_deref() == Some(**k)).count();

    let mut released = 0;
    for k in &keys {
        released += usize::from(pool.release(k).await?.held);
    }
    alloc.close().await?;
    let line = serde_json::json!({
        "agent": "rust-library", "pool": pool_name, "ids": ids, "watched": watched,
        "released": released,
    });
    println!("{line}");
    Ok(())
}
