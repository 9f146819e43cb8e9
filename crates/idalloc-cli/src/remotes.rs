//! `--remote NAME=URL` on `get`, `lookup`, `list` and `watch`: answers across the local store and
//! read-only views of other clusters' stores (the library's remote views, DESIGN §12). Output
//! names the cluster of every answer (`local` or the remote's name).
//!
//! A remote must hold the same pool, under the same `--prefix`, with an ID space (prefix bits or
//! range) that does not overlap the local pool's or another remote's; otherwise the command is
//! refused before it answers. A remote is never written to.

use std::collections::BTreeMap;

use clap::Args;
use idalloc::{Cluster, ClusterEvent, Event, Pool, RemotePool};
use serde_json::{json, Value};

use crate::commands::Out;
use crate::fail::Failure;
use crate::open::Settings;
use crate::parse::{self, StoreUrl};
use crate::reach::{self, Named};
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

impl RemoteArgs {
    /// The remotes as (name, URL), refusing a name given twice.
    fn named(&self) -> Result<Vec<Named<'_>>, Failure> {
        let mut out: Vec<Named<'_>> = Vec::new();
        for r in &self.remotes {
            if out.iter().any(|(n, _)| *n == r.name) {
                return Err(Failure::usage(format!(
                    "--remote {:?} is given twice: every remote needs its own name",
                    r.name
                )));
            }
            out.push((&r.name, &r.url));
        }
        Ok(out)
    }
}

/// Opens every remote store and starts its view of `pool`, all at once. With `synced`, waits
/// until each view holds its remote pool; each remote has `--timeout` for all of it
/// (`reach::Budget`).
pub async fn attach(
    settings: &Settings,
    pool: &Pool,
    args: &RemoteArgs,
    synced: bool,
) -> Result<Vec<RemotePool>, Failure> {
    reach::views(settings, pool, &args.named()?, synced).await
}

/// `get POOL KEY --remote ...`: the key's ID in every cluster that has one (every remote is
/// asked, at once).
pub async fn get(
    settings: &Settings,
    pool: &Pool,
    key: &str,
    args: &RemoteArgs,
    out: Out,
) -> Result<u8, Failure> {
    let named = args.named()?;
    let local = pool.get_consistent(key).await?;
    let mut found: Vec<(Cluster, u64)> = local.map(|id| (Cluster::Local, id)).into_iter().collect();
    let readers = reach::readers(settings, pool, &named).await?;
    let answers = futures::future::join_all(readers.iter().map(|(r, budget)| {
        let name = r.cluster();
        async move { budget.run(name.name(), async { Ok(r.get(key).await?) }).await }
    }))
    .await;
    for ((r, _), answer) in readers.iter().zip(answers) {
        if let Some(id) = answer? {
            found.push((r.cluster(), id));
        }
    }
    if found.is_empty() {
        return Err(Failure::not_found(format!(
            "key {} has no ID in pool {:?} in any cluster (local, {})",
            idalloc::error::show_value(key),
            pool.name(),
            names(args)
        )));
    }
    out.either(
        || {
            json!({"pool": pool.name(), "key": key, "id": local,
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
/// An ID of the local pool's space asks no remote; another asks the remotes for their spaces at
/// once and waits only until one that holds it answers (`reach::route`).
pub async fn lookup(
    settings: &Settings,
    pool: &Pool,
    id: u64,
    args: &RemoteArgs,
    out: Out,
) -> Result<u8, Failure> {
    let named = args.named()?;
    let (lo, hi) = idalloc::remote::id_space(&pool.spec());
    let found = if id >= lo && id <= hi {
        pool.key_of_consistent(id).await?.map(|k| (Cluster::Local, k))
    } else {
        reach::route(settings, pool, &named, id).await?
    };
    match found {
        Some((c, key)) => {
            out.either(
                || json!({"pool": pool.name(), "id": id, "key": key, "cluster": c.name()}),
                || format!("{}\t{}\n", c.name(), text(&key)),
            )?;
            Ok(0)
        }
        None => Err(Failure::not_found(format!(
            "ID {id} is not bound in pool {:?} in any cluster (local, {})",
            pool.name(),
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
            json!({"pool": pool.name(),
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
    let name = pool.name().to_string();
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
            Event::Spec(spec) => {
                let mut v = crate::watch::spec_doc(&name, &spec);
                v["cluster"] = json!(c);
                (v, format!("{c} {}", crate::watch::spec_line(&spec)))
            }
            // Kinds this version does not know say nothing about the bindings.
            _ => continue,
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
