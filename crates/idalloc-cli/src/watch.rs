//! `watch POOL`: one line per binding change until ctrl-c (exit 0) or `--count` changes.
//!
//! On etcd (and memory) the pool's event stream is followed. A file store belongs to one process
//! at a time, so holding it open for a watch would lock every other `idalloc` out; instead the file
//! is opened every `--interval`, read, and closed, and the difference to the last reading is
//! printed. Both paths keep the set of bindings already reported and print only real changes, so
//! the pool's initial listing (which the event stream replays as upserts) is not reported twice.

use std::collections::BTreeMap;

use idalloc::{Allocator, Event};
use serde_json::json;

use crate::cli::WatchArgs;
use crate::commands::Out;
use crate::fail::Failure;
use crate::open::{self, Settings};
use crate::render;

/// One reported change.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Change {
    Bound { id: u64, key: String },
    Unbound { id: u64, key: String },
}

/// What changed from `old` to `new` (ID → key maps): unbindings first, then bindings, each by ID,
/// so a key that moved to another ID reads "unbound old, bound new".
pub fn diff(old: &BTreeMap<u64, String>, new: &BTreeMap<u64, String>) -> Vec<Change> {
    let mut out = Vec::new();
    for (id, key) in old {
        if new.get(id) != Some(key) {
            out.push(Change::Unbound { id: *id, key: key.clone() });
        }
    }
    for (id, key) in new {
        if old.get(id) != Some(key) {
            out.push(Change::Bound { id: *id, key: key.clone() });
        }
    }
    out
}

/// A resize (`Event::Spec`) in a structured format: the range and reserved IDs now in force.
pub fn spec_doc(pool: &str, spec: &idalloc::PoolSpec) -> serde_json::Value {
    json!({"event": "spec", "pool": pool, "min": spec.min(), "max": spec.max(), "reserved": spec.reserved()})
}

/// A resize as a text line: `resized 1-200 reserved 5-9,17`.
pub fn spec_line(spec: &idalloc::PoolSpec) -> String {
    let reserved: Vec<String> = spec
        .reserved()
        .iter()
        .map(|&(lo, hi)| if lo == hi { lo.to_string() } else { format!("{lo}-{hi}") })
        .collect();
    match reserved.is_empty() {
        true => format!("resized {}-{}\n", spec.min(), spec.max()),
        false => format!("resized {}-{} reserved {}\n", spec.min(), spec.max(), reserved.join(",")),
    }
}

struct Printer {
    pool: String,
    out: Out,
    printed: u64,
    limit: Option<u64>,
}

impl Printer {
    fn synced(&self, bindings: usize) -> Result<(), Failure> {
        self.out.either(
            || json!({"event": "synced", "pool": self.pool, "bindings": bindings}),
            || format!("synced {bindings} bindings\n"),
        )
    }

    /// Prints a change; true once `--count` changes are printed.
    fn change(&mut self, c: &Change) -> Result<bool, Failure> {
        match c {
            Change::Bound { id, key } => self.out.either(
                || json!({"event": "upsert", "pool": self.pool, "id": id, "key": key}),
                || format!("bound {id} {}\n", render::text(key)),
            )?,
            Change::Unbound { id, key } => self.out.either(
                || json!({"event": "delete", "pool": self.pool, "id": id, "key": key}),
                || format!("unbound {id} {}\n", render::text(key)),
            )?,
        }
        self.count()
    }

    fn count(&mut self) -> Result<bool, Failure> {
        self.printed += 1;
        Ok(self.limit.is_some_and(|l| self.printed >= l))
    }
}

/// What [`follow`] needs of a pool: the library's (on a store) or `idalloc-client`'s (through
/// `--server`), which give the same events.
#[allow(async_fn_in_trait)]
pub trait Followed {
    type Events;
    fn subscribe(&self) -> Self::Events;
    async fn next(events: &mut Self::Events) -> Option<Event>;
    async fn synced(&self) -> idalloc::Result<()>;
    fn bindings(&self) -> Vec<(u64, String)>;
    /// Whether the pool was deleted (its event stream then ends).
    fn retired(&self) -> bool;
}

impl Followed for idalloc::Pool {
    type Events = idalloc::Events;
    fn subscribe(&self) -> Self::Events {
        self.events()
    }
    async fn next(events: &mut Self::Events) -> Option<Event> {
        events.recv().await
    }
    async fn synced(&self) -> idalloc::Result<()> {
        self.wait_synced().await
    }
    fn bindings(&self) -> Vec<(u64, String)> {
        self.snapshot()
    }
    fn retired(&self) -> bool {
        self.is_retired()
    }
}

impl Followed for idalloc_client::Pool {
    type Events = idalloc_client::Events;
    fn subscribe(&self) -> Self::Events {
        self.events()
    }
    async fn next(events: &mut Self::Events) -> Option<Event> {
        events.recv().await
    }
    async fn synced(&self) -> idalloc::Result<()> {
        self.wait_synced().await
    }
    fn bindings(&self) -> Vec<(u64, String)> {
        self.snapshot()
    }
    fn retired(&self) -> bool {
        false
    }
}

/// Follows the pool's events (etcd, memory).
pub async fn follow(alloc: &Allocator, w: &WatchArgs, out: Out) -> Result<(), Failure> {
    let pool = alloc.pool(&w.pool).await?;
    follow_pool(&pool, w, out).await
}

/// Follows the events of a pool of `idalloc serve` (`--server`), printed as [`follow`] does.
pub async fn follow_client(
    pool: &idalloc_client::Pool,
    w: &WatchArgs,
    out: Out,
) -> Result<(), Failure> {
    follow_pool(pool, w, out).await
}

async fn follow_pool<P: Followed>(pool: &P, w: &WatchArgs, out: Out) -> Result<(), Failure> {
    let mut events = pool.subscribe();
    pool.synced().await?;
    let mut known: BTreeMap<u64, String> = pool.bindings().into_iter().collect();
    let mut p = Printer { pool: w.pool.clone(), out, printed: 0, limit: w.count };
    p.synced(known.len())?;
    if w.count == Some(0) {
        return Ok(());
    }
    let ctrl_c = tokio::signal::ctrl_c();
    tokio::pin!(ctrl_c);
    loop {
        let ev = tokio::select! {
            ev = P::next(&mut events) => ev,
            _ = &mut ctrl_c => return Ok(()),
        };
        let Some(ev) = ev else {
            // The stream ends after a `Delete` per binding when the pool is deleted (by anyone).
            if pool.retired() {
                return Err(idalloc::Error::PoolNotFound { pool: w.pool.clone() }.into());
            }
            return Err(Failure::runtime(format!("the event stream of pool {:?} ended", w.pool)));
        };
        let changes = match ev {
            Event::Upsert { id, key } => {
                let mut next = known.clone();
                next.insert(id, key);
                diff(&known, &next)
            }
            Event::Delete { id, key } => {
                if known.get(&id) != Some(&key) {
                    continue;
                }
                vec![Change::Unbound { id, key }]
            }
            Event::Synced => continue,
            Event::Conflict { key, old_id, new_id } => {
                out.either(
                    || json!({"event": "conflict", "pool": w.pool, "key": key, "old_id": old_id, "new_id": new_id}),
                    || format!("conflict {} lost {old_id}, now {new_id}\n", render::text(&key)),
                )?;
                if p.count()? {
                    return Ok(());
                }
                continue;
            }
            Event::Lagged { missed } => {
                out.either(
                    || json!({"event": "lagged", "pool": w.pool, "missed": missed}),
                    || format!("lagged: {missed} events missed, re-reading the pool\n"),
                )?;
                let now: BTreeMap<u64, String> = pool.bindings().into_iter().collect();
                diff(&known, &now)
            }
            Event::Spec(spec) => {
                out.either(|| spec_doc(&w.pool, &spec), || spec_line(&spec))?;
                if p.count()? {
                    return Ok(());
                }
                continue;
            }
            // Kinds this version does not know say nothing about the bindings.
            _ => continue,
        };
        for c in &changes {
            match c {
                Change::Bound { id, key } => known.insert(*id, key.clone()),
                Change::Unbound { id, .. } => known.remove(id),
            };
            if p.change(c)? {
                return Ok(());
            }
        }
    }
}

/// Polls a file store (see the module docs).
pub async fn poll_file(settings: &Settings, w: &WatchArgs, out: Out) -> Result<(), Failure> {
    let mut p = Printer { pool: w.pool.clone(), out, printed: 0, limit: w.count };
    let mut known: Option<(idalloc::PoolSpec, BTreeMap<u64, String>)> = None;
    let ctrl_c = tokio::signal::ctrl_c();
    tokio::pin!(ctrl_c);
    loop {
        let (spec, now) = tokio::select! {
            r = read_bindings(settings, &w.pool) => r?,
            _ = &mut ctrl_c => return Ok(()),
        };
        match &known {
            None => {
                p.synced(now.len())?;
                if w.count == Some(0) {
                    return Ok(());
                }
            }
            Some((old_spec, old)) => {
                // A resize between two readings: printed as the event stream prints it.
                if *old_spec != spec {
                    p.out.either(|| spec_doc(&w.pool, &spec), || spec_line(&spec))?;
                    if p.count()? {
                        return Ok(());
                    }
                }
                for c in diff(old, &now) {
                    if p.change(&c)? {
                        return Ok(());
                    }
                }
            }
        }
        known = Some((spec, now));
        tokio::select! {
            _ = tokio::time::sleep(w.interval) => {}
            _ = &mut ctrl_c => return Ok(()),
        }
    }
}

/// Opens the file, reads the pool's bindings, closes the file. The bindings are the pool's view
/// once synced, as [`follow`] reads them on etcd: the opened pool lists its ID records anyway,
/// and a `Pool::list` on top read every record of the pool a second time (about half of a
/// poll's CPU at 1M bindings; docs/benchmarks/scale.md, "Linear cost").
async fn read_bindings(
    settings: &Settings,
    pool: &str,
) -> Result<(idalloc::PoolSpec, BTreeMap<u64, String>), Failure> {
    let opened = open::open_store(settings, false).await?;
    let alloc =
        open::allocator(settings, opened.store, false, idalloc::allocator::DEFAULT_BULK_IN_FLIGHT)?;
    let result = async {
        let pool = alloc.pool(pool).await?;
        pool.wait_synced().await?;
        Ok::<_, Failure>((pool.spec(), pool.snapshot().into_iter().collect()))
    }
    .await;
    let _ = alloc.close().await;
    result
}

#[cfg(test)]
mod tests {
    use super::*;

    fn m(v: &[(u64, &str)]) -> BTreeMap<u64, String> {
        v.iter().map(|(i, k)| (*i, k.to_string())).collect()
    }

    #[test]
    fn diffs() {
        assert!(diff(&m(&[(1, "a")]), &m(&[(1, "a")])).is_empty());
        assert_eq!(
            diff(&m(&[(1, "a"), (2, "b")]), &m(&[(2, "b"), (3, "a"), (1, "c")])),
            vec![
                Change::Unbound { id: 1, key: "a".into() },
                Change::Bound { id: 1, key: "c".into() },
                Change::Bound { id: 3, key: "a".into() },
            ]
        );
    }
}
