//! One chaos client process: durable acquire/release of random keys of a small key set, as one
//! holder, until a wall-clock deadline, recording every call in a JSON-lines history
//! (`idalloc_chaos::history`). The chaos test starts several, kills some with SIGKILL mid-call and
//! restarts them under the same holder name; the durable references of a killed run persist, so
//! the next run simply carries on.
//!
//! Usage: `chaos-client --endpoints URL[,URL...] --prefix P --pool NAME --holder H --proc TAG
//! --keys N --until-ns T --history FILE [--seed S] [--pause-ms MS] [--max-id N]
//! [--reuse-delay-ms MS] [--acquire-pct P] [--cacert FILE] [--cert FILE --key FILE]
//! [--user NAME --password-file FILE]`
//!
//! The TLS and user flags (etcdctl's names) point the client at a secured etcd (`https://`
//! endpoints, mutual TLS, an etcd user whose token expires and is renewed); the password comes
//! from a file, never from the command line.
//!
//! `--acquire-pct` (default 35) is the share of acquires among calls: below 50 keeps few holders
//! per key, so bindings are often reclaimed and re-created (the contended paths).
//! `--batch-pct` (default 25) is the share of calls that are batched: `acquire_many_durable` or
//! `release_many_durable` on 2–4 distinct keys, recorded as one invoke and one return per key.
//!
//! `--burst-tasks` (default 4): beside the recorded durable calls, bursts of that many concurrent
//! single-key *session* calls (`Pool::acquire`/`release`) every 1–2 s, on keys `c<task>.<0|1>`
//! shared by every client, which the allocator coalesces into batched txns with two flights in
//! the air. They are not in the history (the model is of durable references); the
//! store scans check them for G1 with everything else, and this process checks its own: no two
//! keys it holds at once have one ID, a release of a confirmed hold says `held`, and no error
//! but `Unavailable`. It prints `coalesced: N answered, M unavailable` to stderr at the end and
//! exits non-zero on a violation. 0 turns the bursts off.
//!
//! `--session-pct` (default 30) is the share of steps spent on a *client session*
//! (`Allocator::client_session`, TTL `--session-ttl-ms`, default 2000): acquires and releases of
//! the same recorded keys as the durable calls, under the session's holder, renewals every third
//! of the TTL, and in the end a revoke (`ClientSession::end`) or, one session in four, abandonment:
//! no more renewals, so the lease expires, which the next renewal or acquire then sees. All of it
//! is recorded (`Session`, and invokes/returns of `renew` and `revoke`), so the checker places
//! each lease's end (`idalloc_chaos::sessions`) and checks the session references against the
//! model with the durable ones. 0 turns sessions off.

use std::collections::HashMap;
use std::fs::File;
use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use idalloc::store::etcd::{EtcdAuth, EtcdOptions, EtcdStore, EtcdTls};
use idalloc::store::StoreError;
use idalloc::{Allocator, AllocatorOptions, ClientSession, Error, Input, PoolSpec};
use idalloc_chaos::history::{now_ns, OpKind, Outcome, Record};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

/// A call that has not returned after this long is a hang (G6 forbids them); the allocator's own
/// bound is request timeout × attempts plus back-off, well below.
const HANG_BOUND: Duration = Duration::from_secs(60);

struct Args {
    endpoints: Vec<String>,
    prefix: String,
    pool: String,
    holder: String,
    proc_tag: String,
    keys: usize,
    until_ns: u64,
    history: PathBuf,
    seed: u64,
    pause_ms: u64,
    max_id: u64,
    reuse_delay_ms: u64,
    acquire_pct: u64,
    batch_pct: u64,
    burst_tasks: usize,
    session_pct: u64,
    session_ttl: Duration,
    tls: Option<EtcdTls>,
    auth: Option<EtcdAuth>,
}

fn parse_args() -> Result<Args, String> {
    let mut m: HashMap<String, String> = HashMap::new();
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let name = flag
            .strip_prefix("--")
            .ok_or_else(|| format!("unexpected argument {flag:?}: expected --name value"))?;
        let value = it.next().ok_or_else(|| format!("flag {flag} needs a value"))?;
        m.insert(name.to_string(), value);
    }
    let get = |k: &str| m.get(k).cloned().ok_or_else(|| format!("missing --{k}"));
    let num = |k: &str, default: Option<u64>| -> Result<u64, String> {
        match m.get(k) {
            Some(v) => v.parse().map_err(|e| format!("--{k} {v:?} is not a number: {e}")),
            None => default.ok_or_else(|| format!("missing --{k}")),
        }
    };
    let endpoints: Vec<String> = get("endpoints")?.split(',').map(str::to_string).collect();
    for e in &endpoints {
        // The chaos tests must stay on this machine: loopback, or the addresses the
        // network-namespace chaos test gives its own namespaces (10.231.0.0/16, which exist only
        // inside them; `tests/chaos_netns.rs`).
        let host = e.strip_prefix("http://").or_else(|| e.strip_prefix("https://")).unwrap_or("");
        if !host.starts_with("127.0.0.1:") && !host.starts_with("10.231.") {
            return Err(format!(
                "endpoint {e:?} is neither on 127.0.0.1 nor in the netns test's 10.231.0.0/16: \
                 only those are allowed"
            ));
        }
    }
    let path = |k: &str| m.get(k).map(PathBuf::from);
    let tls = (m.contains_key("cacert") || m.contains_key("cert")).then(|| {
        let mut tls = EtcdTls::default();
        tls.ca_file = path("cacert");
        tls.cert_file = path("cert");
        tls.key_file = path("key");
        tls
    });
    let auth = match (m.get("user"), path("password-file")) {
        (Some(user), Some(file)) => {
            let pw = std::fs::read_to_string(&file)
                .map_err(|e| format!("cannot read --password-file {}: {e}", file.display()))?;
            Some(EtcdAuth::new(user.clone(), pw.trim_end_matches(['\r', '\n'])))
        }
        (None, None) => None,
        _ => return Err("--user and --password-file go together".into()),
    };
    Ok(Args {
        tls,
        auth,
        endpoints,
        prefix: get("prefix")?,
        pool: get("pool")?,
        holder: get("holder")?,
        proc_tag: get("proc")?,
        keys: num("keys", None)? as usize,
        until_ns: num("until-ns", None)?,
        history: PathBuf::from(get("history")?),
        seed: num("seed", Some(1))?,
        pause_ms: num("pause-ms", Some(100))?,
        max_id: num("max-id", Some(64))?,
        reuse_delay_ms: num("reuse-delay-ms", Some(0))?,
        acquire_pct: num("acquire-pct", Some(35))?.min(100),
        batch_pct: num("batch-pct", Some(25))?.min(100),
        burst_tasks: num("burst-tasks", Some(4))?.min(64) as usize,
        session_pct: num("session-pct", Some(30))?.min(100),
        session_ttl: Duration::from_millis(num("session-ttl-ms", Some(2000))?.max(1000)),
    })
}

/// The pool every client uses; all must agree on it exactly (else `RangeMismatch`).
fn pool_spec(a: &Args) -> PoolSpec {
    PoolSpec::new(a.pool.clone(), 1, a.max_id).reuse_delay(Duration::from_millis(a.reuse_delay_ms))
}

struct Log {
    file: File,
}

impl Log {
    /// Appends one record with a single write, so a SIGKILL tears at most this line.
    fn write(&mut self, r: &Record) -> Result<(), String> {
        let mut line = serde_json::to_string(r).map_err(|e| format!("encoding {r:?}: {e}"))?;
        line.push('\n');
        self.file.write_all(line.as_bytes()).map_err(|e| format!("writing history: {e}"))
    }
}

fn error_kind(e: &Error) -> &'static str {
    match e {
        Error::InvalidInput { .. } => "InvalidInput",
        Error::RangeMismatch { .. } => "RangeMismatch",
        Error::PoolNotFound { .. } => "PoolNotFound",
        Error::PoolReplaced { .. } => "PoolReplaced",
        Error::Exhausted { .. } => "Exhausted",
        Error::Unavailable { .. } => "Unavailable",
        Error::Conflict { .. } => "Conflict",
        Error::AccessDenied { .. } => "AccessDenied",
        Error::Corrupt { .. } => "Corrupt",
    }
}

async fn run(a: Args) -> Result<(), String> {
    let file = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&a.history)
        .map_err(|e| format!("cannot open history {}: {e}", a.history.display()))?;
    let mut log = Log { file };
    let proc_tag = a.proc_tag.clone();
    log.write(&Record::Start {
        proc: proc_tag.clone(),
        holder: a.holder.clone(),
        pid: std::process::id(),
        t: now_ns(),
    })?;

    let mut eo = EtcdOptions::new(a.endpoints.clone());
    eo.connect_timeout = Duration::from_secs(1);
    eo.request_timeout = Duration::from_secs(2);
    eo.keep_alive_interval = Duration::from_secs(2);
    eo.keep_alive_timeout = Duration::from_secs(2);
    eo.tls = a.tls.clone();
    eo.auth = a.auth.clone();
    // Connecting is set-up too (with a user it authenticates over the network, so a client
    // started while etcd's only member is down cannot connect): retry an outage until the
    // deadline, as an agent's start-up would. Refusals (TLS, credentials) still end the run.
    let store = loop {
        match EtcdStore::connect(eo.clone()).await {
            Ok(s) => break s,
            Err(StoreError::Unavailable(reason)) if now_ns() < a.until_ns => {
                eprintln!("{proc_tag}: connecting to etcd: {reason}; retrying");
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            Err(e) => return Err(format!("etcd client: {e}")),
        }
    };
    let opts = AllocatorOptions::builder()
        .prefix(a.prefix.clone())
        .holder(a.holder.clone())
        .request_timeout(Duration::from_secs(2))
        .seed(a.seed)
        .build()
        .map_err(|e| format!("allocator options: {e}"))?;
    let alloc = Allocator::new(store, opts).map_err(|e| format!("allocator: {e}"))?;
    let spec = pool_spec(&a);
    // Opening the pool is set-up, not a recorded call: retry through faults until the deadline.
    let pool = loop {
        match alloc.ensure_pool(&spec).await {
            Ok(p) => break p,
            Err(Error::Unavailable { reason, .. }) if now_ns() < a.until_ns => {
                eprintln!("{proc_tag}: opening the pool: {reason}; retrying");
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            Err(e) => return Err(format!("opening pool {}: {e}", a.pool)),
        }
    };

    let bursts = tokio::spawn(bursts(pool.clone(), a.burst_tasks, a.seed, a.until_ns));
    let mut rng = StdRng::seed_from_u64(a.seed);
    let mut seq = 0u64;
    let mut session: Option<Sess> = None;
    while now_ns() < a.until_ns {
        if rng.random_range(0..100) < a.session_pct {
            let mut ctx = Ctx { log: &mut log, seq: &mut seq, proc_tag: &proc_tag, rng: &mut rng };
            session_step(&a, &alloc, &pool, &mut session, &mut ctx).await?;
            let pause = rng.random_range(0..=2 * a.pause_ms);
            tokio::time::sleep(Duration::from_millis(pause)).await;
            continue;
        }
        let op = if rng.random_range(0..100) < a.acquire_pct {
            OpKind::Acquire
        } else {
            OpKind::Release
        };
        // One key, or 2–4 distinct keys in one batched call.
        let mut keys: Vec<String> = Vec::new();
        let want = if rng.random_range(0..100) < a.batch_pct { rng.random_range(2..=4) } else { 1 };
        while keys.len() < want.min(a.keys) {
            let key = format!("k{}", rng.random_range(0..a.keys));
            if !keys.contains(&key) {
                keys.push(key);
            }
        }
        let batch = if keys.len() > 1 { keys.len() as u32 } else { 0 };
        let first = seq + 1;
        for key in &keys {
            seq += 1;
            log.write(&Record::Invoke {
                proc: proc_tag.clone(),
                holder: a.holder.clone(),
                seq,
                op,
                key: key.clone(),
                t: now_ns(),
                batch,
            })?;
        }
        let call = async {
            let acquired = |r: idalloc::Result<idalloc::Acquired>| {
                r.map(|r| Outcome::Acquired { id: r.id, new: r.new })
            };
            let released = |r: idalloc::Result<idalloc::Released>| {
                r.map(|r| Outcome::Released { held: r.held, reclaimed: r.reclaimed })
            };
            match (op, batch) {
                (OpKind::Acquire, 0) => {
                    vec![acquired(pool.acquire_durable(&keys[0], &a.holder).await)]
                }
                (OpKind::Release, 0) => {
                    vec![released(pool.release_durable(&keys[0], &a.holder).await)]
                }
                (OpKind::Acquire, _) => pool
                    .acquire_many_durable(&keys, &a.holder)
                    .await
                    .into_iter()
                    .map(acquired)
                    .collect(),
                (OpKind::Release, _) => pool
                    .release_many_durable(&keys, &a.holder)
                    .await
                    .into_iter()
                    .map(released)
                    .collect(),
                // Only client sessions renew and revoke (`session_step`); nothing here reads.
                (OpKind::Renew | OpKind::Revoke | OpKind::Get, _) => Vec::new(),
            }
        };
        let outcomes: Vec<Outcome> = match tokio::time::timeout(HANG_BOUND, call).await {
            Ok(results) => results
                .into_iter()
                .map(|r| match r {
                    Ok(o) => o,
                    Err(e) => Outcome::Error { kind: error_kind(&e).into(), msg: e.to_string() },
                })
                .collect(),
            Err(_) => keys
                .iter()
                .map(|_| Outcome::Error {
                    kind: "Hang".into(),
                    msg: format!("no answer in {HANG_BOUND:?}"),
                })
                .collect(),
        };
        if outcomes.len() != keys.len() {
            return Err(format!("{} keys, {} results", keys.len(), outcomes.len()));
        }
        let t = now_ns();
        for (i, outcome) in outcomes.into_iter().enumerate() {
            let seq = first + i as u64;
            log.write(&Record::Return { proc: proc_tag.clone(), seq, t, outcome })?;
        }
        let pause = rng.random_range(0..=2 * a.pause_ms);
        tokio::time::sleep(Duration::from_millis(pause)).await;
    }
    // A clean end ends the session too (recorded), as a well-behaved client would.
    if let Some(cur) = session.take().filter(|c| !c.abandoned) {
        let mut ctx = Ctx { log: &mut log, seq: &mut seq, proc_tag: &proc_tag, rng: &mut rng };
        let seq = ctx.invoke(cur.s.holder(), OpKind::Revoke, "")?;
        let outcome = match bounded(cur.s.end()).await {
            Ok(existed) => Outcome::Lease { alive: existed },
            Err(o) => o,
        };
        ctx.ret(seq, outcome)?;
    }
    let burst = bursts.await.map_err(|e| format!("burst task: {e}"))?;
    eprintln!(
        "{proc_tag}: coalesced: {} answered, {} unavailable",
        burst.answered, burst.unavailable
    );
    if !burst.violations.is_empty() {
        return Err(format!("coalesced calls broke a guarantee: {}", burst.violations.join("; ")));
    }
    log.write(&Record::Done { proc: proc_tag, t: now_ns() })?;
    Ok(())
}

/// The client session in use, and how it is being treated.
struct Sess {
    s: ClientSession,
    renewed: Instant,
    /// Steps left before it is revoked or abandoned.
    steps_left: u32,
    /// Abandoned: no more renewals; it is used until it is seen gone.
    abandoned: bool,
}

/// What a recorded call needs of the main loop.
struct Ctx<'a> {
    log: &'a mut Log,
    seq: &'a mut u64,
    proc_tag: &'a str,
    rng: &'a mut StdRng,
}

impl Ctx<'_> {
    /// Records the invocation of `op` by `holder` on `key` and returns its `seq`.
    fn invoke(&mut self, holder: &str, op: OpKind, key: &str) -> Result<u64, String> {
        *self.seq += 1;
        self.log.write(&Record::Invoke {
            proc: self.proc_tag.to_string(),
            holder: holder.to_string(),
            seq: *self.seq,
            op,
            key: key.to_string(),
            t: now_ns(),
            batch: 0,
        })?;
        Ok(*self.seq)
    }

    fn ret(&mut self, seq: u64, outcome: Outcome) -> Result<(), String> {
        self.log.write(&Record::Return {
            proc: self.proc_tag.to_string(),
            seq,
            t: now_ns(),
            outcome,
        })
    }
}

fn error_outcome(e: &Error) -> Outcome {
    if matches!(e, Error::InvalidInput { input: Input::SessionGone, .. }) {
        return Outcome::SessionGone;
    }
    Outcome::Error { kind: error_kind(e).into(), msg: e.to_string() }
}

/// A call bounded by [`HANG_BOUND`]; a hang is an error of kind `Hang`.
async fn bounded<T>(
    f: impl std::future::Future<Output = idalloc::Result<T>>,
) -> Result<T, Outcome> {
    match tokio::time::timeout(HANG_BOUND, f).await {
        Ok(r) => r.map_err(|e| error_outcome(&e)),
        Err(_) => {
            Err(Outcome::Error { kind: "Hang".into(), msg: format!("no answer in {HANG_BOUND:?}") })
        }
    }
}

/// One step of the client-session work (see the crate docs): open a session, renew it when a
/// third of its TTL has passed, acquire or release one key under it, or end it.
async fn session_step(
    a: &Args,
    alloc: &Allocator,
    pool: &idalloc::Pool,
    session: &mut Option<Sess>,
    ctx: &mut Ctx<'_>,
) -> Result<(), String> {
    let Some(cur) = session.as_mut() else {
        let invoke = now_ns();
        match tokio::time::timeout(HANG_BOUND, alloc.client_session(a.session_ttl)).await {
            Ok(Ok(s)) => {
                ctx.log.write(&Record::Session {
                    proc: ctx.proc_tag.to_string(),
                    holder: s.holder().to_string(),
                    lease: s.lease(),
                    ttl_ms: s.ttl().as_millis() as u64,
                    invoke,
                    t: now_ns(),
                })?;
                let steps_left = ctx.rng.random_range(4..16);
                let abandoned = false;
                *session = Some(Sess { s, renewed: Instant::now(), steps_left, abandoned });
            }
            // Not a recorded call: a session that failed to open holds nothing.
            Ok(Err(Error::Unavailable { .. })) | Err(_) => {}
            Ok(Err(e)) => return Err(format!("opening a client session: {e}")),
        }
        return Ok(());
    };
    let holder = cur.s.holder().to_string();
    let renew_due = cur.renewed.elapsed() >= cur.s.ttl() / 3;
    if (renew_due && !cur.abandoned) || (cur.abandoned && cur.renewed.elapsed() > cur.s.ttl() * 2) {
        // Renew (an abandoned session: only long after its TTL, to see it gone).
        let seq = ctx.invoke(&holder, OpKind::Renew, "")?;
        let started = Instant::now();
        let outcome = match bounded(cur.s.keep_alive()).await {
            Ok(alive) => Outcome::Lease { alive },
            Err(o) => o,
        };
        ctx.ret(seq, outcome.clone())?;
        match outcome {
            Outcome::Lease { alive: true } => cur.renewed = started,
            Outcome::Lease { alive: false } => *session = None,
            _ => {}
        }
        return Ok(());
    }
    if cur.steps_left == 0 && !cur.abandoned {
        if ctx.rng.random_range(0..4) == 0 {
            cur.abandoned = true;
            return Ok(());
        }
        let seq = ctx.invoke(&holder, OpKind::Revoke, "")?;
        let outcome = match bounded(cur.s.end()).await {
            Ok(existed) => Outcome::Lease { alive: existed },
            Err(o) => o,
        };
        ctx.ret(seq, outcome)?;
        *session = None;
        return Ok(());
    }
    cur.steps_left = cur.steps_left.saturating_sub(1);
    let key = format!("k{}", ctx.rng.random_range(0..a.keys));
    let acquire = ctx.rng.random_range(0..100) < 50;
    let op = if acquire { OpKind::Acquire } else { OpKind::Release };
    let seq = ctx.invoke(&holder, op, &key)?;
    let outcome = if acquire {
        match bounded(cur.s.acquire(pool, &key)).await {
            Ok(r) => Outcome::Acquired { id: r.id, new: r.new },
            Err(o) => o,
        }
    } else {
        match bounded(cur.s.release(pool, &key)).await {
            Ok(r) => Outcome::Released { held: r.held, reclaimed: r.reclaimed },
            Err(o) => o,
        }
    };
    let gone = outcome == Outcome::SessionGone;
    ctx.ret(seq, outcome)?;
    if gone {
        *session = None;
    }
    Ok(())
}

/// What the bursts of coalesced session calls saw.
#[derive(Default)]
struct Bursts {
    answered: u64,
    unavailable: u64,
    violations: Vec<String>,
}

/// Bursts of `tasks` concurrent single-key session calls until `until_ns` (see the crate docs of
/// this binary): each task acquires its key if this process does not hold it, else releases it.
/// Holds are tracked only while confirmed: an `Unavailable` answer makes the key's state unknown
/// (the call may have committed), so the key is dropped from the checks until a later answer.
async fn bursts(pool: idalloc::Pool, tasks: usize, seed: u64, until_ns: u64) -> Bursts {
    let mut out = Bursts::default();
    if tasks == 0 {
        return out;
    }
    let mut rng = StdRng::seed_from_u64(seed ^ 0xc0a1_e5ce);
    // key -> ID of a confirmed hold of this process, and the reverse.
    let mut held: HashMap<String, u64> = HashMap::new();
    let mut by_id: HashMap<u64, String> = HashMap::new();
    while now_ns() < until_ns {
        tokio::time::sleep(Duration::from_millis(rng.random_range(1000..=2000))).await;
        let keys: Vec<String> =
            (0..tasks).map(|t| format!("c{t}.{}", rng.random_range(0..2))).collect();
        let calls = keys.iter().map(|k| {
            let (pool, k, acquire) = (pool.clone(), k.clone(), !held.contains_key(k));
            tokio::spawn(async move {
                let r = if acquire {
                    pool.acquire(&k).await.map(|a| Ok(a.id))
                } else {
                    pool.release(&k).await.map(|r| Err(r.held))
                };
                (k, r)
            })
        });
        let calls: Vec<_> = calls.collect();
        for call in calls {
            let (k, r) = match tokio::time::timeout(HANG_BOUND, call).await {
                Ok(Ok(done)) => done,
                Ok(Err(e)) => {
                    out.violations.push(format!("a coalesced call's task failed: {e}"));
                    continue;
                }
                Err(_) => {
                    out.violations.push(format!("a coalesced call hung for {HANG_BOUND:?}"));
                    continue;
                }
            };
            match r {
                Ok(Ok(id)) => {
                    out.answered += 1;
                    if let Some(other) = by_id.get(&id).filter(|o| **o != k) {
                        out.violations.push(format!("{k} and {other}, both held, share ID {id}"));
                    }
                    held.insert(k.clone(), id);
                    by_id.insert(id, k);
                }
                Ok(Err(was_held)) => {
                    out.answered += 1;
                    if !was_held {
                        out.violations.push(format!("release of {k}, held, said held = false"));
                    }
                    if let Some(id) = held.remove(&k) {
                        by_id.remove(&id);
                    }
                }
                Err(Error::Unavailable { .. }) => {
                    out.unavailable += 1;
                    if let Some(id) = held.remove(&k) {
                        by_id.remove(&id);
                    }
                }
                Err(e) => out.violations.push(format!("{k}: {} error: {e}", error_kind(&e))),
            }
        }
    }
    out
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> ExitCode {
    let args = match parse_args() {
        Ok(a) => a,
        Err(e) => {
            eprintln!("chaos-client: {e}");
            return ExitCode::from(2);
        }
    };
    match run(args).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("chaos-client: {e}");
            ExitCode::FAILURE
        }
    }
}
