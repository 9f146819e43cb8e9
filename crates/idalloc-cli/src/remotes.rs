//! `--remote NAME=URL` on `get`, `lookup`, `list` and `watch`: answers across the local store and
//! read-only views of other clusters' stores (the library's remote views, DESIGN §12). Output
//! names the cluster of every answer (`local` or the remote's name).
//!
//! A remote must hold the same pool, under the same `--prefix`, with an ID space (prefix bits or
//! range) that does not overlap the local pool's or another remote's; otherwise the command is
//! refused before it answers. A remote is never written to.

use std::collections::BTreeMap;

use clap::Args;
use idalloc::remote::RemoteReader;
use idalloc::{Cluster, ClusterEvent, Event, Pool, RemoteOptions, RemotePool};
use serde_json::{json, Value};

use crate::commands::Out;
use crate::fail::Failure;
use crate::open::{self, Settings};
use crate::parse::{self, StoreUrl};
use crate::render::{table, text};

/// One `--remote` flag.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Remote {
    pub name: String,
    pub url: StoreUrl,
}

/// Parses `NAME=URL`.
pub fn remote(s: &str) -> Result<Remote, String> {
    let Some((name, url)) = s.split_once('=') else {
        return Err(format!(
            "{s:?} is not NAME=URL (e.g. cluster-b=etcd://10.0.0.2:2379): a remote needs a name for the output and a store URL"
        ));
    };
    idalloc::remote::validate_remote_name(name).map_err(|e| e.to_string())?;
    let url = parse::store_url(url)?;
    if url == StoreUrl::Memory {
        return Err(format!(
            "remote {name:?} is a memory: store, which would always be empty: name a file: or etcd:// store"
        ));
    }
    Ok(Remote { name: name.to_string(), url })
}

/// The `--remote` flags of a command.
#[derive(Args, Debug, Default, Clone)]
pub struct RemoteArgs {
    /// Also answer from another cluster's store, read-only (repeatable): NAME=URL, URL as for
    /// --store. Its pool of the same name must use a distinct ID space (prefix bits); the output
    /// names the cluster of each answer.
    #[arg(long = "remote", value_name = "NAME=URL", value_parser = remote)]
    pub remotes: Vec<Remote>,
}

impl RemoteArgs {
    pub fn any(&self) -> bool {
        !self.remotes.is_empty()
    }
}

/// Opens every remote store and starts its view of `pool`. With `synced`, waits (up to
/// `--timeout`) until each view holds the remote pool.
pub async fn attach(
    settings: &Settings,
    pool: &Pool,
    args: &RemoteArgs,
    synced: bool,
) -> Result<Vec<RemotePool>, Failure> {
    let mut views = Vec::new();
    let mut names: Vec<&str> = Vec::new();
    for r in &args.remotes {
        if names.contains(&r.name.as_str()) {
            return Err(Failure::usage(format!(
                "--remote {:?} is given twice: every remote needs its own name",
                r.name
            )));
        }
        names.push(&r.name);
        let (url, etcd) = crate::connect::remote_connection(&r.url, &settings.etcd)
            .map_err(|f| Failure { message: format!("--remote {}: {}", r.name, f.message), ..f })?;
        let s = Settings { url, etcd, ..settings.clone() };
        let opened = open::open_store(&s, false).await?;
        let opts = RemoteOptions {
            prefix: settings.prefix.clone(),
            request_timeout: settings.attempt_timeout(),
            probe_interval: settings.attempt_timeout(),
            ..RemoteOptions::default()
        };
        let view = pool.watch_remote(&r.name, opened.store, opts).await.map_err(|e| {
            let f = Failure::from(e.clone());
            Failure { message: format!("--remote {}: {}", r.name, e), ..f }
        })?;
        views.push(view);
    }
    if synced {
        for v in &views {
            if tokio::time::timeout(settings.timeout, v.wait_synced()).await.is_err() {
                return Err(Failure::runtime(format!(
                    "--remote {}: its pool could not be read within {:?} (--timeout)",
                    v.name(),
                    settings.timeout
                )));
            }
        }
    }
    Ok(views)
}

/// Opens a direct reader of every remote (one-shot answers: its spec is read and checked as for
/// a view, then only the records a question needs; no listing of the remote pool).
async fn readers(
    settings: &Settings,
    pool: &Pool,
    args: &RemoteArgs,
) -> Result<Vec<RemoteReader>, Failure> {
    let mut readers: Vec<RemoteReader> = Vec::new();
    for r in &args.remotes {
        if readers.iter().any(|x| x.cluster().name() == r.name) {
            return Err(Failure::usage(format!(
                "--remote {:?} is given twice: every remote needs its own name",
                r.name
            )));
        }
        let (url, etcd) = crate::connect::remote_connection(&r.url, &settings.etcd)
            .map_err(|f| Failure { message: format!("--remote {}: {}", r.name, f.message), ..f })?;
        let s = Settings { url, etcd, ..settings.clone() };
        let opened = open::open_store(&s, false).await?;
        let opts = RemoteOptions {
            prefix: settings.prefix.clone(),
            request_timeout: settings.attempt_timeout(),
            ..RemoteOptions::default()
        };
        let mut others = vec![(Cluster::Local, idalloc::remote::id_space(pool.spec()))];
        others.extend(readers.iter().map(|x| (x.cluster(), x.space())));
        let reader = RemoteReader::open(&r.name, pool.spec(), opened.store, &opts, &others)
            .await
            .map_err(|e| {
            let f = Failure::from(e.clone());
            Failure { message: format!("--remote {}: {}", r.name, e), ..f }
        })?;
        readers.push(reader);
    }
    Ok(readers)
}

fn remote_failure(r: &RemoteReader, e: idalloc::Error) -> Failure {
    let f = Failure::from(e.clone());
    Failure { message: format!("--remote {}: {}", r.cluster(), e), ..f }
}

/// `get POOL KEY --remote ...`: the key's ID in every cluster that has one.
pub async fn get(
    settings: &Settings,
    pool: &Pool,
    key: &str,
    args: &RemoteArgs,
    out: Out,
) -> Result<u8, Failure> {
    let local = pool.get_consistent(key).await?;
    let mut found: Vec<(Cluster, u64)> = local.map(|id| (Cluster::Local, id)).into_iter().collect();
    for r in readers(settings, pool, args).await? {
        if let Some(id) = r.get(key).await.map_err(|e| remote_failure(&r, e))? {
            found.push((r.cluster(), id));
        }
    }
    if found.is_empty() {
        return Err(Failure::not_found(format!(
            "key {} has no ID in pool {:?} in any cluster (local, {})",
            idalloc::error::show_value(key),
            pool.spec().name(),
            names(args)
        )));
    }
    out.either(
        || {
            json!({"pool": pool.spec().name(), "key": key, "id": local,
                   "clusters": found.iter().map(|(c, id)| json!({"cluster": c.name(), "id": id})).collect::<Vec<_>>()})
        },
        || found.iter().map(|(c, id)| format!("{}\t{id}\n", c.name())).collect(),
    )?;
    Ok(0)
}

fn names(args: &RemoteArgs) -> String {
    args.remotes.iter().map(|r| r.name.as_str()).collect::<Vec<_>>().join(", ")
}

/// `lookup POOL ID --remote ...`: the key of the ID, in the one cluster whose ID space holds it.
pub async fn lookup(
    settings: &Settings,
    pool: &Pool,
    id: u64,
    args: &RemoteArgs,
    out: Out,
) -> Result<u8, Failure> {
    let (lo, hi) = idalloc::remote::id_space(pool.spec());
    let readers = readers(settings, pool, args).await?;
    let found = if id >= lo && id <= hi {
        pool.key_of_consistent(id).await?.map(|k| (Cluster::Local, k))
    } else {
        match readers.iter().find(|r| id >= r.space().0 && id <= r.space().1) {
            Some(r) => {
                r.key_of(id).await.map_err(|e| remote_failure(r, e))?.map(|k| (r.cluster(), k))
            }
            None => None,
        }
    };
    match found {
        Some((c, key)) => {
            out.either(
                || json!({"pool": pool.spec().name(), "id": id, "key": key, "cluster": c.name()}),
                || format!("{}\t{}\n", c.name(), text(&key)),
            )?;
            Ok(0)
        }
        None => Err(Failure::not_found(format!(
            "ID {id} is not bound in pool {:?} in any cluster (local, {})",
            pool.spec().name(),
            names(args)
        ))),
    }
}

/// `list POOL --remote ...`: local bindings with holders, then each remote's (holders are not
/// part of a remote view).
pub async fn list(
    settings: &Settings,
    pool: &Pool,
    args: &RemoteArgs,
    out: Out,
) -> Result<u8, Failure> {
    let local = pool.list().await?;
    let views = attach(settings, pool, args, true).await?;
    let mut rows: Vec<(String, u64, String, Option<Vec<String>>)> =
        local.into_iter().map(|b| ("local".to_string(), b.id, b.key, Some(b.holders))).collect();
    for v in &views {
        rows.extend(v.snapshot().into_iter().map(|(id, k)| (v.name().to_string(), id, k, None)));
    }
    out.either(
        || {
            json!({"pool": pool.spec().name(),
                   "bindings": rows.iter().map(|(c, id, k, h)| {
                       let mut o = json!({"cluster": c, "id": id, "key": k});
                       if let Some(h) = h { o["holders"] = json!(h); }
                       o
                   }).collect::<Vec<Value>>()})
        },
        || {
            let t: Vec<Vec<String>> = rows
                .iter()
                .map(|(c, id, k, h)| {
                    vec![
                        c.clone(),
                        id.to_string(),
                        text(k).into_owned(),
                        match h {
                            None => "(remote)".to_string(),
                            Some(h) if h.is_empty() => "-".to_string(),
                            Some(h) => h.iter().map(|h| text(h)).collect::<Vec<_>>().join(","),
                        },
                    ]
                })
                .collect();
            table(&["CLUSTER", "ID", "KEY", "HOLDERS"], &t)
        },
    )?;
    Ok(0)
}

/// `watch POOL --remote ...`: per cluster, `synced CLUSTER N bindings` once its pool is read,
/// then one line per change, naming the cluster. A remote that becomes unreachable keeps its
/// bindings (a stale view); when it comes back, only what really changed is printed.
pub async fn watch(
    settings: &Settings,
    pool: &Pool,
    args: &RemoteArgs,
    count: Option<u64>,
    out: Out,
) -> Result<u8, Failure> {
    let mut events = pool.cluster_events();
    attach(settings, pool, args, false).await?;
    let name = pool.spec().name().to_string();
    let mut known: BTreeMap<Cluster, BTreeMap<u64, String>> = BTreeMap::new();
    let mut synced: BTreeMap<Cluster, bool> = BTreeMap::new();
    let mut printed = 0u64;
    let ctrl_c = tokio::signal::ctrl_c();
    tokio::pin!(ctrl_c);
    loop {
        let ev = tokio::select! {
            ev = events.recv() => ev,
            _ = &mut ctrl_c => return Ok(0),
        };
        let Some(ClusterEvent { cluster, event }) = ev else {
            return Err(Failure::runtime(format!("the event stream of pool {name:?} ended")));
        };
        let c = cluster.name().to_string();
        let live = synced.get(&cluster).copied().unwrap_or(false);
        let view = known.entry(cluster.clone()).or_default();
        let line = match event {
            Event::Synced => {
                if !live {
                    synced.insert(cluster, true);
                    let n = view.len();
                    out.either(
                        || json!({"event": "synced", "pool": name, "cluster": c, "bindings": n}),
                        || format!("synced {c} {n} bindings\n"),
                    )?;
                    if count == Some(0) && synced.len() > args.remotes.len() {
                        return Ok(0);
                    }
                }
                continue;
            }
            Event::Upsert { id, key } => {
                if view.get(&id) == Some(&key) {
                    continue;
                }
                view.insert(id, key.clone());
                if !live {
                    continue;
                }
                (
                    json!({"event": "upsert", "pool": name, "cluster": c, "id": id, "key": key}),
                    format!("{c} bound {id} {}\n", text(&key)),
                )
            }
            Event::Delete { id, key } => {
                if view.get(&id) != Some(&key) {
                    continue;
                }
                view.remove(&id);
                if !live {
                    continue;
                }
                (
                    json!({"event": "delete", "pool": name, "cluster": c, "id": id, "key": key}),
                    format!("{c} unbound {id} {}\n", text(&key)),
                )
            }
            Event::Conflict { key, old_id, new_id } => (
                json!({"event": "conflict", "pool": name, "cluster": c, "key": key, "old_id": old_id, "new_id": new_id}),
                format!("{c} conflict {} lost {old_id}, now {new_id}\n", text(&key)),
            ),
            Event::Lagged { missed } => {
                // Missed events of any cluster (the all-clusters channel cannot say which): every
                // cluster starts over from its current view, with a `lagged` line naming it, then
                // what changed in it. A cluster not synced yet is only brought up to date: its
                // `synced` line comes with its listing.
                let mut now: BTreeMap<Cluster, BTreeMap<u64, String>> = BTreeMap::new();
                for (c, id, k) in pool.snapshot_all() {
                    now.entry(c).or_default().insert(id, k);
                }
                let clusters: Vec<Cluster> = known
                    .keys()
                    .chain(now.keys())
                    .cloned()
                    .collect::<std::collections::BTreeSet<_>>()
                    .into_iter()
                    .collect();
                for c in clusters {
                    let fresh = now.remove(&c).unwrap_or_default();
                    let old = known.insert(c.clone(), fresh.clone()).unwrap_or_default();
                    if !synced.get(&c).copied().unwrap_or(false) {
                        continue;
                    }
                    out.either(
                        || json!({"event": "lagged", "pool": name, "cluster": c.name(), "missed": missed}),
                        || format!("{} lagged: {missed} messages of the pool's clusters missed, re-reading its view\n", c.name()),
                    )?;
                    for ch in crate::watch::diff(&old, &fresh) {
                        let (v, t) = match ch {
                            crate::watch::Change::Bound { id, key } => (
                                json!({"event": "upsert", "pool": name, "cluster": c.name(), "id": id, "key": key}),
                                format!("{} bound {id} {}\n", c.name(), text(&key)),
                            ),
                            crate::watch::Change::Unbound { id, key } => (
                                json!({"event": "delete", "pool": name, "cluster": c.name(), "id": id, "key": key}),
                                format!("{} unbound {id} {}\n", c.name(), text(&key)),
                            ),
                        };
                        out.either(|| v, || t)?;
                        printed += 1;
                        if count.is_some_and(|l| printed >= l) {
                            return Ok(0);
                        }
                    }
                }
                continue;
            }
        };
        out.either(|| line.0, || line.1)?;
        printed += 1;
        if count.is_some_and(|l| printed >= l) {
            return Ok(0);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn remote_flags() {
        assert_eq!(
            remote("b=etcd://127.0.0.1:2379"),
            Ok(Remote {
                name: "b".into(),
                url: StoreUrl::Etcd {
                    endpoints: vec!["127.0.0.1:2379".into()],
                    user: None,
                    password: None
                }
            })
        );
        assert!(remote("etcd://127.0.0.1:2379").expect_err("no name").contains("NAME=URL"));
        assert!(remote("local=etcd://127.0.0.1:2379").expect_err("reserved").contains("local"));
        assert!(remote("b=memory:").expect_err("memory").contains("memory"));
        assert!(remote("b=ftp://x").is_err());
    }
}
