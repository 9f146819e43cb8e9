//! `idalloc gc --holder NODE`: drop every durable reference of one holder (a node that is gone)
//! in one pool or in all of them, through the ordinary release path, so a binding is reclaimed
//! exactly when its last reference goes, as if the holder had released each key itself.
//!
//! The holder's bindings are found by reading the pool page by page: on a store with
//! [`idalloc::Pool::list_each`] (one revision, a page held at a time), through `--server` with
//! the service's paged `GET …/bindings` (1000 a page). Only the holder's keys are kept between
//! reads. `--dry-run` reports what would be released and changes nothing.

use serde_json::{json, Value};

use idalloc::{Binding, Error};

use crate::commands::Out;
use crate::fail::Failure;
use crate::render;

/// One reference of the holder: the binding, and after a real run whether releasing it
/// reclaimed the binding (it was the last reference).
#[derive(Debug, Clone)]
pub struct Dropped {
    pub id: u64,
    pub key: String,
    pub reclaimed: bool,
}

/// What one pool gave up.
#[derive(Debug, Clone)]
pub struct PoolReport {
    pub pool: String,
    pub dropped: Vec<Dropped>,
}

/// The references of `holder` among `page`, as not yet released.
pub fn held_by(page: &[Binding], holder: &str) -> Vec<Dropped> {
    page.iter()
        .filter(|b| b.holders.iter().any(|h| h == holder))
        .map(|b| Dropped { id: b.id, key: b.key.clone(), reclaimed: false })
        .collect()
}

/// The references among `page` that `holder` may have through a service: the service lists
/// holders as stored, and one with tokens stores the holder a client names under the client's
/// name (`CLIENT/HOLDER`), so a stored holder matches when it is `holder` or is `holder` under one
/// namespace segment. A match under another client's name is released as `held: false`.
pub fn held_through_server(page: &[Binding], holder: &str) -> Vec<Dropped> {
    let names = |h: &str| h == holder || h.split_once('/').is_some_and(|(_, rest)| rest == holder);
    page.iter()
        .filter(|b| b.holders.iter().any(|h| names(h)))
        .map(|b| Dropped { id: b.id, key: b.key.clone(), reclaimed: false })
        .collect()
}

/// Releases `holder`'s references in `pool` of a store (unless `dry_run`).
pub async fn on_store(
    pool: &idalloc::Pool,
    holder: &str,
    dry_run: bool,
) -> Result<Vec<Dropped>, Failure> {
    let mut found = Vec::new();
    pool.list_each(|page| {
        found.extend(held_by(page, holder));
        Ok::<_, Error>(())
    })
    .await?;
    if !dry_run {
        for d in &mut found {
            d.reclaimed = pool.release_durable(&d.key, holder).await?.reclaimed;
        }
    }
    Ok(found)
}

/// Releases `holder`'s references in `pool` through the service (unless `dry_run`), a page at
/// a time: the cursor is an ID, so releasing what a page found does not move the next page.
pub async fn through_server(
    pool: &idalloc_client::Pool,
    holder: &str,
    dry_run: bool,
) -> Result<Vec<Dropped>, Failure> {
    let mut out = Vec::new();
    let mut after = None;
    loop {
        let (page, next) = pool.list_page(after, 1000).await?;
        let mut found = held_through_server(&page, holder);
        if !dry_run {
            let mut held = Vec::with_capacity(found.len());
            for mut d in found {
                let r = pool.release_durable(&d.key, holder).await?;
                if r.held {
                    d.reclaimed = r.reclaimed;
                    held.push(d);
                }
            }
            found = held;
        }
        out.extend(found);
        match next {
            Some(n) if Some(n) != after => after = Some(n),
            _ => return Ok(out),
        }
    }
}

/// Prints the reports: JSON `{"holder","dry_run","pools":[{"pool","released":[{"id","key",
/// "reclaimed"}]}]}`, or a line per reference and a summary per pool.
pub fn print(holder: &str, dry_run: bool, reports: &[PoolReport], out: Out) -> Result<(), Failure> {
    out.either(
        || {
            json!({
                "holder": holder,
                "dry_run": dry_run,
                "pools": reports.iter().map(|r| json!({
                    "pool": r.pool,
                    "released": r.dropped.iter().map(|d| json!({
                        "id": d.id, "key": d.key, "reclaimed": d.reclaimed,
                    })).collect::<Vec<Value>>(),
                })).collect::<Vec<Value>>(),
            })
        },
        || {
            let verb = if dry_run { "would release" } else { "released" };
            let mut s = String::new();
            for r in reports {
                for d in &r.dropped {
                    let gone = if d.reclaimed { " (reclaimed)" } else { "" };
                    s.push_str(&format!(
                        "{}: {verb} {} {}{gone}\n",
                        r.pool,
                        d.id,
                        render::text(&d.key)
                    ));
                }
                let n = r.dropped.len();
                s.push_str(&format!(
                    "{}: {verb} {n} {} of holder {}\n",
                    r.pool,
                    if n == 1 { "reference" } else { "references" },
                    render::text(holder)
                ));
            }
            if reports.is_empty() {
                s.push_str("no pools\n");
            }
            s
        },
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_holders_bindings_are_kept() {
        let b = |id, key: &str, holders: &[&str]| Binding {
            id,
            key: key.into(),
            holders: holders.iter().map(|h| h.to_string()).collect(),
        };
        let page = [b(1, "a", &["n1"]), b(2, "b", &["n2"]), b(3, "c", &["n2", "n1"])];
        let keys: Vec<_> = held_by(&page, "n1").into_iter().map(|d| d.key).collect();
        assert_eq!(keys, ["a", "c"]);
        assert!(held_by(&page, "n3").is_empty());
    }
}
