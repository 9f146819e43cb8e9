//! N agents as independent [`Client`]s in one process, sharing one `reqwest::Client` (one
//! connection pool): each opens the pool (its own watch stream and view), a session, and acquires
//! one key; then every agent's view is checked against a listing. Prints the time until all are
//! synced and the process's resident memory, to size agents per process and per replica.
//!
//! ```sh
//! idalloc --store memory: serve --listen 127.0.0.1:7379 &
//! cargo run --release -p idalloc-client --example agents -- http://127.0.0.1:7379 300
//! ```

use std::time::{Duration, Instant};

use idalloc::PoolSpec;
use idalloc_client::{Client, ClientOptions};

/// This process's resident set in KiB (0 where `/proc` cannot be read).
fn rss_kib() -> u64 {
    use idalloc_testkit::procs::{memory, Proc};
    memory(Proc::Myself).map_or(0, |m| m.rss / 1024)
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().collect();
    let endpoint = args.get(1).cloned().unwrap_or_else(|| "http://127.0.0.1:7379".into());
    let n: usize = match args.get(2) {
        Some(v) => v.parse().map_err(|e| format!("agents {v:?}: {e}"))?,
        None => 100,
    };
    let http = reqwest::Client::new();
    let opts = ClientOptions::builder().http(http).build()?;
    let admin = Client::new([&endpoint], opts.clone())?;
    admin.init_pool(&PoolSpec::new("agents", 1, 1_000_000)).await?;
    let before = rss_kib();
    let start = Instant::now();
    let mut tasks = Vec::with_capacity(n);
    for i in 0..n {
        let (endpoint, opts) = (endpoint.clone(), opts.clone());
        tasks.push(tokio::spawn(async move {
            let c = Client::new([endpoint], opts)?;
            let pool = c.pool("agents").await?;
            let s = c.session(Duration::from_secs(15)).await?;
            let a = s.acquire(&pool, &format!("agent-{i}")).await?;
            pool.wait_synced().await?;
            Ok::<_, idalloc::Error>((c, pool, s, a.id))
        }));
    }
    let mut agents = Vec::with_capacity(n);
    for t in tasks {
        agents.push(t.await??);
    }
    let synced = start.elapsed();
    // Every agent's view eventually holds every agent's key.
    let want = agents.len();
    let deadline = Instant::now() + Duration::from_secs(120);
    while agents.iter().any(|(_, p, _, _)| p.snapshot().len() < want) {
        if Instant::now() > deadline {
            return Err("views did not converge within 120 s".into());
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let converged = start.elapsed();
    let listed = agents[0].1.list().await?;
    let listed: Vec<(u64, String)> = listed.into_iter().map(|b| (b.id, b.key)).collect();
    let mut listed = listed;
    listed.sort();
    let equal = agents.iter().all(|(_, p, _, _)| p.snapshot() == listed);
    let after = rss_kib();
    println!(
        "agents={n} all_synced={:.2}s views_converged={:.2}s views_equal_listing={equal} \
         rss_before={before}KiB rss_after={after}KiB per_agent={}B",
        synced.as_secs_f64(),
        converged.as_secs_f64(),
        (after.saturating_sub(before) * 1024) / n.max(1) as u64
    );
    for (c, _, s, _) in &agents {
        s.end().await?;
        c.close().await?;
    }
    Ok(())
}
