//! The example agent, written the same way in Go (`clients/go/examples/agent`) and Python
//! (`clients/python/examples/agent.py`): open a session, acquire 100 keys on it, wait until the
//! pool's watch-fed view shows every one of them with the ID the service gave, print the IDs as
//! one JSON line, release the keys and end the session. A test runs the three against one
//! `serve` and compares their lines.
//!
//! ```sh
//! idalloc --store memory: serve --listen 127.0.0.1:7379 &
//! cargo run -p idalloc-client --example agent -- http://127.0.0.1:7379 agents
//! ```

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use idalloc::PoolSpec;
use idalloc_client::{Client, ClientOptions};

/// The keys every agent acquires.
fn keys() -> Vec<String> {
    (0..100).map(|i| format!("agent-key-{i:03}")).collect()
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().collect();
    let endpoints = args.get(1).cloned().unwrap_or_else(|| "http://127.0.0.1:7379".into());
    let pool_name = args.get(2).cloned().unwrap_or_else(|| "agents".into());
    let mut opts = ClientOptions::builder();
    if let Ok(token) = std::env::var("IDALLOC_TOKEN") {
        opts = opts.token(token);
    }
    let opts = opts.build()?;
    let client = Client::new(endpoints.split(','), opts)?;
    let pool = client.ensure_pool(&PoolSpec::new(pool_name.as_str(), 1, 65_535)).await?;
    let session = client.session(Duration::from_secs(15)).await?;
    let keys = keys();
    let acquired = session.acquire_many(&pool, &keys).await?;
    let ids: BTreeMap<&str, u64> =
        keys.iter().map(String::as_str).zip(acquired.iter().map(|a| a.id)).collect();

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
        released += usize::from(session.release(&pool, k).await?.held);
    }
    session.end().await?;
    let line = serde_json::json!({
        "agent": "rust", "pool": pool_name, "ids": ids, "watched": watched, "released": released,
    });
    println!("{line}");
    Ok(())
}
