//! Reaching the remotes of `--remote NAME=URL`: how long each may take, asking them all at once,
//! and routing a lookup by ID space.
//!
//! Every remote has its own [`Budget`]: everything one command asks it (connecting, its pool's
//! spec, the records a question needs, a view's first listing) must be answered within
//! `--timeout` of the command's first request to it. Remotes are asked at once, so a frozen
//! remote delays a command by at most `--timeout`, and only a command that needs it: `lookup`
//! of an ID in the local pool's ID space asks no remote, and `lookup` of another ID stops
//! waiting as soon as a remote that answered turns out to hold the ID's space. A failure names
//! the remote and the time really waited (measured, not assumed: "no answer within 1s" after a
//! 3.1 s wait was the bug).

use std::future::Future;
use std::time::Duration;

use futures::stream::{FuturesUnordered, StreamExt};
use idalloc::remote::{check_overlap, id_space, RemoteReader};
use idalloc::{Cluster, Pool, RemoteOptions, RemotePool};
use tokio::time::Instant;

use crate::fail::{Failure, NOT_FOUND, RUNTIME, UNAVAILABLE};
use crate::open::{self, Settings};
use crate::parse::StoreUrl;

/// One `--remote`: its name and store.
pub type Named<'a> = (&'a str, &'a StoreUrl);

/// What one remote may take of a command: `limit` (`--timeout`) from `start`.
#[derive(Clone, Copy, Debug)]
pub struct Budget {
    start: Instant,
    limit: Duration,
}

impl Budget {
    /// A budget of `--timeout` starting now.
    pub fn start(settings: &Settings) -> Budget {
        Budget { start: Instant::now(), limit: settings.timeout }
    }

    /// A bound for single requests inside the budget: longer than the budget, so that the budget
    /// (which failures report) ends a wait, not a request's own timer firing at the same instant.
    fn inner(&self) -> Duration {
        self.limit * 2
    }

    /// Runs `f` (requests to remote `name`) within what is left of the budget. A runtime failure
    /// (the remote is unreachable, or did not answer in time) says how long was really waited.
    pub async fn run<T>(
        &self,
        name: &str,
        f: impl Future<Output = Result<T, Failure>>,
    ) -> Result<T, Failure> {
        let r = tokio::time::timeout_at(self.start + self.limit, f).await;
        let waited = self.start.elapsed().as_secs_f64();
        match r {
            Ok(Ok(v)) => Ok(v),
            Ok(Err(f)) if f.code == RUNTIME || f.code == UNAVAILABLE => Err(Failure {
                message: format!("--remote {name}: {} (after {waited:.1}s)", f.message),
                ..f
            }),
            Ok(Err(f)) => Err(Failure { message: format!("--remote {name}: {}", f.message), ..f }),
            Err(_) => Err(Failure::unavailable(format!(
                "--remote {name}: no answer after {waited:.1}s (--timeout {:?}: each remote has \
                 that long for everything a command asks it)",
                self.limit
            ))),
        }
    }
}

/// Remote `url`'s store, with etcd's own timeouts as long as the budget (the budget bounds them).
async fn store(
    settings: &Settings,
    url: &StoreUrl,
    budget: Budget,
) -> Result<std::sync::Arc<dyn idalloc::store::Store>, Failure> {
    let (url, etcd) = crate::connect::remote_connection(url, &settings.etcd)?;
    let s = Settings { url, etcd, ..settings.clone() };
    Ok(open::open_store_bounded(&s, false, budget.inner()).await?.store)
}

/// The options of a remote view or reader. Its own bound on each request is above the budget
/// (`inner`), so that the budget, which the messages report, is what ends a wait.
fn options(settings: &Settings, inner: Duration) -> RemoteOptions {
    {
        let mut o = RemoteOptions::default();
        o.prefix = settings.prefix.clone();
        o.request_timeout = inner;
        o.probe_interval = settings.attempt_timeout();
        o
    }
}

/// A direct reader of remote `name`: its spec of `pool`, checked against the local pool's space.
pub async fn reader(
    settings: &Settings,
    pool: &Pool,
    (name, url): Named<'_>,
    budget: Budget,
) -> Result<RemoteReader, Failure> {
    budget
        .run(name, async {
            let store = store(settings, url, budget).await?;
            let local = [(Cluster::Local, id_space(&pool.spec()))];
            let opts = options(settings, budget.inner());
            Ok(RemoteReader::open(name, &pool.spec(), store, &opts, &local).await?)
        })
        .await
}

/// Refuses `r` if its ID space meets a remote's of `others` (the local pool's was checked when
/// it was opened).
fn no_overlap(r: &RemoteReader, others: &[&RemoteReader]) -> Result<(), Failure> {
    let spaces: Vec<(Cluster, (u64, u64))> =
        others.iter().map(|o| (o.cluster(), o.space())).collect();
    check_overlap(r.cluster().name(), r.spec(), &spaces).map_err(|e| {
        let f = Failure::from(e.clone());
        Failure { message: format!("--remote {}: {e}", r.cluster()), ..f }
    })
}

/// Readers of every remote, asked at once; in flag order, each with its budget. Fails with the
/// first failure in flag order (after every remote answered or ran out of time).
pub async fn readers(
    settings: &Settings,
    pool: &Pool,
    remotes: &[Named<'_>],
) -> Result<Vec<(RemoteReader, Budget)>, Failure> {
    let budget = Budget::start(settings);
    let all = futures::future::join_all(remotes.iter().map(|r| reader(settings, pool, *r, budget)));
    let mut out: Vec<(RemoteReader, Budget)> = Vec::new();
    for r in all.await {
        let r = r?;
        no_overlap(&r, &out.iter().map(|(o, _)| o).collect::<Vec<_>>())?;
        out.push((r, budget));
    }
    Ok(out)
}

/// The key bound to `id` in the one remote whose ID space holds it. The remotes are asked for
/// their spec at once; the first that answers with a space holding `id` is asked for the ID
/// (within its budget) and the others are no longer waited for. If none that answered holds
/// it, the remotes that did not answer might: then the command fails naming them.
pub async fn route(
    settings: &Settings,
    pool: &Pool,
    remotes: &[Named<'_>],
    id: u64,
) -> Result<Option<(Cluster, String)>, Failure> {
    let budget = Budget::start(settings);
    let mut pending: FuturesUnordered<_> =
        remotes.iter().map(|r| async move { reader(settings, pool, *r, budget).await }).collect();
    let mut answered: Vec<RemoteReader> = Vec::new();
    let mut unanswered: Vec<Failure> = Vec::new();
    while let Some(r) = pending.next().await {
        match r {
            Ok(r) => {
                no_overlap(&r, &answered.iter().collect::<Vec<_>>())?;
                let (lo, hi) = r.space();
                if lo <= id && id <= hi {
                    let name = r.cluster();
                    let key = budget.run(name.name(), async { Ok(r.key_of(id).await?) }).await?;
                    return Ok(key.map(|k| (name, k)));
                }
                answered.push(r);
            }
            // The remote has no such pool: it holds no ID of it.
            Err(f) if f.code == NOT_FOUND => {}
            // Unreachable, or no answer in time: its ID space is unknown, it might hold `id`.
            Err(f) if f.code == RUNTIME || f.code == UNAVAILABLE => unanswered.push(f),
            // The command is wrong (a bad URL, an overlapping remote) or a remote's data is
            // unusable: say so now.
            Err(f) => return Err(f),
        }
    }
    match unanswered.len() {
        0 => Ok(None),
        _ => {
            let (code, kind) = (unanswered[0].code, unanswered[0].kind);
            let why: Vec<String> = unanswered.into_iter().map(|f| f.message).collect();
            Err(Failure {
                code,
                kind,
                message: format!(
                    "ID {id} is in no ID space of the clusters that answered, and a remote whose \
                     space is unknown might hold it: {}",
                    why.join("; ")
                ),
            })
        }
    }
}

/// A view of every remote (for `list` and `watch`), opened at once, in flag order. With
/// `synced`, each must also have listed its remote pool within its budget.
pub async fn views(
    settings: &Settings,
    pool: &Pool,
    remotes: &[Named<'_>],
    synced: bool,
) -> Result<Vec<RemotePool>, Failure> {
    let budget = Budget::start(settings);
    let all = futures::future::join_all(remotes.iter().map(|(name, url)| {
        budget.run(name, async move {
            let store = store(settings, url, budget).await?;
            // The view's requests after start-up are bounded by `--timeout` itself.
            let view = pool.watch_remote(name, store, options(settings, budget.limit)).await?;
            if synced {
                view.wait_synced().await;
            }
            Ok(view)
        })
    }));
    all.await.into_iter().collect()
}
