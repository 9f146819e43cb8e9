//! Through `serve`: the fleet of [`crate::fleet`] with every agent an
//! independent `idalloc-client` instance (its own `Client`, so its own HTTP connections, its own
//! session, its own SSE watch stream and view) against 1 or 2 `idalloc serve` replicas, real
//! processes on loopback free ports, on one private etcd. etcd then sees one watch per replica and
//! one lease per agent session, whatever N is.
//!
//! Phases, as in direct mode:
//! - **cold start**: every agent opens the pool and waits until its view is synced (its watch
//!   stream's listing is complete);
//! - **hold**: every agent opens a session and acquires its keys on it (one request of up to 1000
//!   keys); with views, then until every agent's view has every agent's first and last key;
//! - **restart storm** (a crash): every agent's process "dies" (its client, view and session
//!   handles are dropped: renewals stop, nothing is ended) and, with `kill_replica`, replica 0 is
//!   killed (SIGKILL) at the same moment. Each agent restarts at once as a new client and
//!   **re-creates** its session, then re-acquires its keys on it before it lists anything
//!   (`ClientOptions::lazy_view`): a write needs no view, the service decides. Its keys keep
//!   their IDs because the old session's references hold their bindings until its lease ends
//!   (`session_ttl`, 60 s, well past the restore): the restore adds the new session's reference
//!   to a live binding. Why re-create rather than adopt the old session: a crashed process has lost
//!   the session's secret unless it wrote it to disk, and a secret on disk is a capability any
//!   reader of the node's disk could use; re-creating costs one lease grant per agent (measured
//!   below the storm's budget) and needs nothing kept. The time until all keys are restored is the
//!   storm's figure; with views, the **storm sync** phase is then the time until every restarted
//!   agent's view is synced again (started after its restore);
//! - **churn**: every agent acquires and releases one new key per second on its session.
//!
//! A probe (one more client, own session) acquires and releases a fresh key every
//! [`crate::fleet::PROBE_EVERY`] throughout. Figures per phase as in direct mode, plus the
//! replicas' CPU and resident memory (`/proc/<pid>`).
//!
//! With `views: false` the agents after the cold start keep no view (lazy, never asked): the
//! cold start is measured with views, then those instances are dropped and the agents of the later
//! phases are new ones that only write. This is what lets one process hold 1,000 agents with 100
//! keys each: with views, every agent's view would hold all 110,000 bindings (about 11 GB for
//! 1,000 views in one address space) and the hold phase would deliver 10⁸ events.

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use idalloc_client::{Client, ClientOptions, Pool, Session};

use tokio::task::JoinSet;

use crate::contender::{err, POOL};
use crate::fleet::{
    agent_key, jitter, log, Counters, FleetOptions, FleetRun, Meter, Phase, Probe, Tally,
};

/// How long an agent waits for its view to be synced before it counts as failed.
const SYNC_LIMIT: Duration = Duration::from_secs(600);

/// The through-serve shape of a fleet run.
#[derive(Clone, Debug)]
pub struct ServeMode {
    /// The `idalloc` binary that runs `serve`.
    pub bin: PathBuf,
    /// `serve` replicas (agent i starts on replica i mod replicas and fails over to the others).
    pub replicas: usize,
    /// Kill replica 0 (SIGKILL) at the start of the restart storm (needs 2 replicas).
    pub kill_replica: bool,
    /// Agents keep a view through every phase (see the module docs for `false`).
    pub views: bool,
}

/// A running `idalloc serve` replica, killed (by PID) on drop.
struct Replica {
    child: Child,
    url: String,
}

impl Replica {
    fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Replica {
    fn drop(&mut self) {
        self.kill();
    }
}

/// Starts one replica on a free loopback port, on etcd `etcd`, under the prefix the pool was
/// prefilled under. The per-client request limit is raised: every agent here comes from
/// 127.0.0.1, which the service counts as one client (on a real fleet, one per node).
async fn start_replica(bin: &std::path::Path, etcd: &str) -> Result<Replica, String> {
    let mut child = Command::new(bin)
        .args(["--endpoints", etcd, "--prefix", "idalloc", "--timeout", "10s", "serve"])
        .args(["--listen", "127.0.0.1:0", "--sweep-interval", "1h"])
        .args(["--max-requests", "100000", "--max-requests-per-client", "100000"])
        // Warnings only: the audit log (one line per request) would flood the run's output.
        .env("RUST_LOG", "warn,idalloc::audit=off")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .map_err(|e| format!("cannot start {}: {e}", bin.display()))?;
    let stdout = child.stdout.take().ok_or("serve: no stdout")?;
    let mut replica = Replica { child, url: String::new() };
    // The first line says where it listens; a serve that fails exits, which ends the read.
    let line = tokio::task::spawn_blocking(move || {
        let mut line = String::new();
        let _ = std::io::BufRead::read_line(&mut std::io::BufReader::new(stdout), &mut line);
        line
    })
    .await
    .map_err(|e| err("serve start task", e))?;
    let addr = line
        .trim()
        .strip_prefix("listening on ")
        .ok_or_else(|| format!("serve did not print its address (got {line:?})"))?;
    replica.url = format!("http://{addr}");
    Ok(replica)
}

/// One agent: its client (own connections), its pool handle (its view) and its session.
struct Agent {
    _client: Client,
    pool: Pool,
    session: Option<Session>,
}

/// The replicas' URLs with agent `i`'s first: agents spread over the replicas and fail over
/// in order.
fn endpoints_of(urls: &[String], i: usize) -> Vec<String> {
    let n = urls.len().max(1);
    (0..urls.len()).map(|k| urls[(i + k) % n].clone()).collect()
}

/// A new client of agent `i` and its pool handle (a watch only once asked, with `lazy`).
async fn open_agent(urls: &[String], i: usize, lazy: bool, ttl: Duration) -> Result<Agent, String> {
    let opts = ClientOptions::builder()
        .lazy_view(lazy)
        .session_ttl(ttl)
        .build()
        .map_err(|e| err("agent options", e))?;
    let client = Client::new(endpoints_of(urls, i), opts).map_err(|e| err("agent client", e))?;
    let pool = client.pool(POOL).await.map_err(|e| err("agent open pool", e))?;
    Ok(Agent { _client: client, pool, session: None })
}

async fn synced(pool: &Pool) -> Result<(), String> {
    match tokio::time::timeout(SYNC_LIMIT, pool.wait_synced()).await {
        Ok(r) => r.map_err(|e| err("agent sync", e)),
        Err(_) => Err(format!("agent sync: not synced after {SYNC_LIMIT:?}")),
    }
}

/// Opens a session on `agent` and acquires `keys` on it: the IDs, or the first error.
async fn hold(agent: &mut Agent, ttl: Duration, keys: &[String]) -> Result<Vec<u64>, String> {
    let client = &agent._client;
    let session = client.session(ttl).await.map_err(|e| err("agent session", e))?;
    let got = session.acquire_many(&agent.pool, keys).await;
    agent.session = Some(session);
    Ok(got.map_err(|e| err("acquire", e))?.into_iter().map(|a| a.id).collect())
}

/// The probe: its own client and session.
async fn start_probe(urls: &[String], ttl: Duration) -> Result<Probe, String> {
    let mut agent = open_agent(urls, 0, true, ttl).await?;
    hold(&mut agent, ttl, &[]).await?;
    let agent = Arc::new(agent);
    Ok(Probe::spawn(move |key| {
        let agent = agent.clone();
        Box::pin(async move {
            let Some(s) = agent.session.as_ref() else { return (None, false) };
            let t = Instant::now();
            match s.acquire(&agent.pool, &key).await {
                Ok(_) => {
                    let d = t.elapsed();
                    (Some(d), s.release(&agent.pool, &key).await.is_ok())
                }
                Err(_) => (None, false),
            }
        })
    }))
}

/// Cold start: `n` agents open the pool at once (each after its jitter); time until each is
/// synced.
async fn cold_start(o: &FleetOptions, urls: &Arc<Vec<String>>) -> (Vec<(usize, Agent)>, Tally) {
    let t0 = Instant::now();
    let mut set = JoinSet::new();
    for i in 0..o.agents {
        let (urls, ttl, wait) = (urls.clone(), o.session_ttl, jitter(o.jitter));
        set.spawn(async move {
            tokio::time::sleep(wait).await;
            let agent = open_agent(&urls, i, false, ttl).await?;
            synced(&agent.pool).await?;
            Ok::<_, String>((i, agent, t0.elapsed()))
        });
    }
    let mut agents = Vec::with_capacity(o.agents);
    let mut tally = Tally::new();
    while let Some(r) = set.join_next().await {
        match r {
            Ok(Ok((i, agent, d))) => {
                agents.push((i, agent));
                tally.ok += 1;
                tally.times.push(d);
            }
            Ok(Err(e)) => tally.fail(e),
            Err(e) => tally.fail(err("agent task", e)),
        }
    }
    (agents, tally)
}

/// Runs one through-serve fleet (see the module docs).
pub async fn run(o: &FleetOptions, mode: &ServeMode) -> Result<FleetRun, String> {
    if o.close {
        return Err("--close is for direct agents: the HTTP API has no ID hints, so a clean \
                    close followed by a sweep cannot bring IDs back through serve"
            .into());
    }
    if mode.replicas == 0 || (mode.kill_replica && mode.replicas < 2) {
        return Err(format!(
            "{} replicas{}: at least 1, and 2 to kill one",
            mode.replicas,
            if mode.kill_replica { " with a kill" } else { "" }
        ));
    }
    let (etcd, prefill_secs) = crate::fleet::prefilled_etcd(o.bindings).await?;
    let endpoint = etcd.endpoint();
    let mut replicas = Vec::with_capacity(mode.replicas);
    for _ in 0..mode.replicas {
        replicas.push(start_replica(&mode.bin, &endpoint).await?);
    }
    let urls: Arc<Vec<String>> = Arc::new(replicas.iter().map(|r| r.url.clone()).collect());
    let mut meter = Meter {
        endpoint: endpoint.clone(),
        etcd_pid: etcd.pid(),
        serve_pids: replicas.iter().map(|r| r.child.id()).collect(),
        retired_cpu: 0.0,
    };
    // The probe starts on the last replica: the one never killed.
    let probe_urls: Vec<String> = urls.iter().rev().cloned().collect();
    let probe = start_probe(&probe_urls, o.session_ttl).await?;
    probe.take();
    let mut phases = Vec::new();

    // Cold start.
    log(&format!(
        "cold start of {} agents on {} bindings through {} serve replicas",
        o.agents, o.bindings, mode.replicas
    ));
    let before = Counters::sample(&meter).await;
    let (mut agents, tally) = cold_start(o, &urls).await;
    phases.push(tally.finish("cold start", &before, &meter, &probe).await);
    if !mode.views {
        // The cold start's instances go; the later phases' agents write only (module docs).
        drop(agents);
        agents = Vec::with_capacity(o.agents);
        for i in 0..o.agents {
            agents.push((i, open_agent(&urls, i, true, o.session_ttl).await?));
        }
    }

    // Hold.
    log(&format!("hold: {} keys per agent", o.keys));
    let before = Counters::sample(&meter).await;
    let t0 = Instant::now();
    let mut set = JoinSet::new();
    for (i, mut a) in agents {
        let (n, ttl) = (o.keys, o.session_ttl);
        set.spawn(async move {
            let keys: Vec<String> = (0..n).map(|k| agent_key(i, k)).collect();
            let got = hold(&mut a, ttl, &keys).await;
            (i, a, keys, got, t0.elapsed())
        });
    }
    let mut tally = Tally::new();
    let mut agents = Vec::with_capacity(o.agents);
    let mut checkpoint: Vec<(usize, Vec<(String, u64)>)> = Vec::new();
    while let Some(r) = set.join_next().await {
        match r {
            Ok((i, a, keys, got, d)) => {
                match got {
                    Ok(ids) => {
                        tally.ok += ids.len() as u64;
                        checkpoint.push((i, keys.into_iter().zip(ids).collect()));
                    }
                    Err(e) => tally.fail(format!("hold agent-{i}: {e}")),
                }
                tally.times.push(d);
                agents.push((i, a));
            }
            Err(e) => tally.fail(err("hold task", e)),
        }
    }
    checkpoint.sort_by_key(|(i, _)| *i);
    if mode.views {
        let probes: Vec<(String, u64)> = checkpoint
            .iter()
            .flat_map(|(_, h)| h.first().into_iter().chain(h.last()).cloned())
            .collect();
        loop {
            let behind = agents
                .iter()
                .filter(|(_, a)| probes.iter().any(|(k, id)| a.pool.get(k) != Some(*id)))
                .count();
            if behind == 0 {
                break;
            }
            if t0.elapsed() > SYNC_LIMIT {
                tally.fail(format!("hold: {behind} agents had not seen every key"));
                break;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        tally.times.push(t0.elapsed());
    }
    phases.push(tally.finish("hold (acquire + fan-out)", &before, &meter, &probe).await);

    // Restart storm: every agent crashes (handles dropped, nothing ended), replica 0 with them
    // if asked; each restarts, re-creates its session and re-acquires its keys before listing.
    log(&format!(
        "restart storm (crash{})",
        if mode.kill_replica { ", replica 0 killed" } else { "" }
    ));
    let before = Counters::sample(&meter).await;
    drop(agents);
    if mode.kill_replica {
        let pid = replicas[0].child.id();
        meter.retired_cpu += crate::stats::cpu_secs(&pid.to_string(), false).unwrap_or(0.0);
        meter.serve_pids.retain(|p| *p != pid);
        replicas[0].kill();
    }
    let t0 = Instant::now();
    let mut set = JoinSet::new();
    for (i, held) in checkpoint {
        let (urls, ttl, wait) = (urls.clone(), o.session_ttl, jitter(o.jitter));
        set.spawn(async move {
            tokio::time::sleep(wait).await;
            let mut a = open_agent(&urls, i, true, ttl).await?;
            let keys: Vec<String> = held.iter().map(|(k, _)| k.clone()).collect();
            let ids = hold(&mut a, ttl, &keys).await?;
            let changed = held.iter().zip(&ids).filter(|((_, old), new)| old != *new).count();
            Ok::<_, String>((i, a, ids.len() as u64, changed as u64, t0.elapsed()))
        });
    }
    let mut tally = Tally::new();
    let mut agents = Vec::with_capacity(o.agents);
    while let Some(r) = set.join_next().await {
        match r {
            Ok(Ok((i, a, n, changed, d))) => {
                tally.ok += n;
                tally.changed += changed;
                tally.times.push(d);
                agents.push((i, a));
            }
            Ok(Err(e)) => tally.fail(format!("restart: {e}")),
            Err(e) => tally.fail(err("restart task", e)),
        }
    }
    phases.push(tally.finish("restart storm", &before, &meter, &probe).await);

    if mode.views {
        log("storm sync: every restarted agent's view");
        let before = Counters::sample(&meter).await;
        let mut set = JoinSet::new();
        for (_, a) in &agents {
            let pool = a.pool.clone();
            set.spawn(async move { synced(&pool).await.map(|_| t0.elapsed()) });
        }
        let mut tally = Tally::new();
        while let Some(r) = set.join_next().await {
            match r {
                Ok(Ok(d)) => {
                    tally.ok += 1;
                    tally.times.push(d);
                }
                Ok(Err(e)) => tally.fail(e),
                Err(e) => tally.fail(err("sync task", e)),
            }
        }
        phases.push(tally.finish("storm sync (views)", &before, &meter, &probe).await);
    }

    // Churn.
    log(&format!("churn for {:?}", o.churn));
    let before = Counters::sample(&meter).await;
    let end = Instant::now() + o.churn;
    let mut set = JoinSet::new();
    for (i, a) in agents {
        set.spawn(async move {
            let (mut lat, mut errors) = (Vec::new(), Vec::new());
            let Some(s) = a.session.as_ref() else {
                return (lat, vec![format!("agent-{i} has no session")]);
            };
            tokio::time::sleep(jitter(Duration::from_secs(1))).await;
            let mut tick = tokio::time::interval(Duration::from_secs(1));
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            let mut n = 0;
            loop {
                tick.tick().await;
                if Instant::now() >= end {
                    break;
                }
                n += 1;
                let key = format!("agent-{i}/churn-{n}");
                let t = Instant::now();
                match s.acquire(&a.pool, &key).await {
                    Ok(_) => {
                        lat.push(t.elapsed());
                        if let Err(e) = s.release(&a.pool, &key).await {
                            errors.push(format!("churn release {key}: {e}"));
                        }
                    }
                    Err(e) => errors.push(format!("churn acquire {key}: {e}")),
                }
            }
            (lat, errors)
        });
    }
    let t0 = Instant::now();
    let mut tally = Tally::new();
    while let Some(r) = set.join_next().await {
        match r {
            Ok((lat, errors)) => {
                tally.ok += lat.len() as u64;
                tally.times.extend(lat);
                for e in errors {
                    tally.fail(e);
                }
            }
            Err(e) => tally.fail(err("churn task", e)),
        }
    }
    let churn_secs = t0.elapsed().as_secs_f64();
    let mut churn: Phase = tally.finish("churn", &before, &meter, &probe).await;
    churn.secs = churn_secs;
    phases.push(churn);
    probe.stop().await;
    drop(replicas);
    Ok(FleetRun { opts: o.clone(), prefill_secs, phases })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn agents_spread_over_the_replicas_and_fail_over_to_every_other() {
        let urls: Vec<String> = ["a", "b"].iter().map(|s| s.to_string()).collect();
        assert_eq!(endpoints_of(&urls, 0), ["a", "b"]);
        assert_eq!(endpoints_of(&urls, 3), ["b", "a"]);
        assert_eq!(endpoints_of(&urls[..1], 5), ["a"]);
    }
}
