//! The I/O half of the `check` audit: read a pool (or the whole deployment) at one revision, run
//! [`crate::audit`] on it, and send the repairs it plans. Thin on purpose: every decision is in
//! `audit.rs` and `records.rs`, which are pure and unit-tested.
//!
//! Also the nesting probe for deployments sharing an etcd (issue 9, item 9): a prefix that lies
//! inside another deployment's, or contains one, is found with one txn of small reads.

use std::collections::BTreeMap;

use serde::Serialize;

use crate::audit::{self, Finding, RepairContext};
use crate::layout::Layout;
use crate::records::{self, PoolSnapshot};
use crate::store::listing::{BoundedPages, PageBound};
use crate::store::{
    GetRequest, KeyRange, KeyValue, OpResponse, Revision, Store, StoreResult, TxnOp, TxnRequest,
};

/// One pool's result.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct PoolCheck {
    pub pool: String,
    pub findings: Vec<Finding>,
}

/// What a check found, all of it as of `revision`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Report {
    pub revision: Revision,
    pub pools: Vec<PoolCheck>,
    /// Findings that belong to no readable pool: spec records with bad names, records under the
    /// prefix outside `pools/` and `data/` (another deployment nested inside this one).
    pub other: Vec<Finding>,
}

impl Report {
    /// Number of findings.
    pub fn breaches(&self) -> usize {
        self.other.len() + self.pools.iter().map(|p| p.findings.len()).sum::<usize>()
    }
}

/// Everything read for one check, kept for planning repairs.
pub struct Scan {
    pub report: Report,
    /// pool -> (usable spec and its record's mod revision, snapshot).
    snapshots: BTreeMap<String, (Option<(crate::PoolSpec, Revision)>, PoolSnapshot)>,
}

/// Reads pool `pool` (or, with `None`, every record under the prefix) at one revision and audits
/// it: [`scan_bounded`] with [`PageBound::default`] (the store's own bound on each page, a few
/// retries of each).
pub async fn scan(
    store: &dyn Store,
    layout: &Layout,
    pool: Option<&str>,
    page: i64,
) -> StoreResult<Scan> {
    scan_bounded(store, layout, pool, page, &PageBound::default()).await
}

/// [`scan`] with each page of its listings bounded and retried as `bound` says; the listing as a
/// whole takes as long as its pages keep coming (issue 21 item 1).
pub async fn scan_bounded(
    store: &dyn Store,
    layout: &Layout,
    pool: Option<&str>,
    page: i64,
    bound: &PageBound,
) -> StoreResult<Scan> {
    let pages = |range: KeyRange, what: String| {
        BoundedPages::new(store, &range, page, bound.clone()).named(what)
    };
    let (spec_kvs, data_kvs, other_kvs, revision) = match pool {
        Some(p) => {
            let data = KeyRange::prefix(layout.pool_data_prefix(p));
            let (data, rev) = pages(data, format!("pool {p:?}")).collect().await?;
            let spec = KeyRange::key(layout.pool_spec_key(p));
            let (spec, _) =
                pages(spec, format!("pool {p:?}'s spec")).at_revision(rev).collect().await?;
            (spec, data, Vec::new(), rev)
        }
        None => {
            let root = format!("{}/", layout.prefix()).into_bytes();
            let what = format!("prefix {:?}", layout.prefix());
            let (all, rev) = pages(KeyRange::prefix(root), what).collect().await?;
            let pools = layout.pools_prefix();
            let data = format!("{}/data/", layout.prefix()).into_bytes();
            let (mut specs, mut datas, mut others) = (Vec::new(), Vec::new(), Vec::new());
            for kv in all {
                if kv.key.starts_with(&pools) {
                    specs.push(kv);
                } else if kv.key.starts_with(&data) {
                    datas.push(kv);
                } else {
                    others.push(kv);
                }
            }
            (specs, datas, others, rev)
        }
    };

    let mut other: Vec<Finding> = other_kvs
        .iter()
        .map(|kv| Finding::UnreadableRecord {
            record: String::from_utf8_lossy(&kv.key).into_owned(),
            nested: true,
        })
        .collect();
    // Specs by pool name; problems of records that name no pool go to `other`.
    let mut specs: BTreeMap<String, Result<(crate::PoolSpec, Revision), Finding>> = BTreeMap::new();
    for kv in &spec_kvs {
        match records::parse_spec(layout, kv) {
            Ok(s) => {
                specs.insert(s.name().to_string(), Ok((s, kv.mod_revision)));
            }
            Err(p) => match p.pool.clone() {
                Some(name) => {
                    specs.insert(name, Err(audit::spec_finding(&p)));
                }
                None => other.push(audit::spec_finding(&p)),
            },
        }
    }
    // Data by pool name (the segment after `data/`).
    let data_root = format!("{}/data/", layout.prefix()).into_bytes();
    let mut data: BTreeMap<String, Vec<KeyValue>> = BTreeMap::new();
    for kv in data_kvs {
        let rest = &kv.key[data_root.len().min(kv.key.len())..];
        let name = rest.split(|&b| b == b'/').next().unwrap_or_default();
        data.entry(String::from_utf8_lossy(name).into_owned()).or_default().push(kv);
    }
    if let Some(p) = pool {
        specs
            .entry(p.to_string())
            .or_insert_with(|| Err(Finding::DataWithoutSpec { pool: p.to_string(), records: 0 }));
    }
    let names: std::collections::BTreeSet<String> =
        specs.keys().cloned().chain(data.keys().cloned()).collect();
    let mut report = Report { revision, pools: Vec::new(), other };
    let mut snapshots = BTreeMap::new();
    for name in names {
        let kvs = data.remove(&name).unwrap_or_default();
        let valid_name = crate::pool::validate_pool_name(&name).is_ok();
        let snap = if valid_name {
            PoolSnapshot::parse(layout, &name, &kvs, revision)
        } else {
            PoolSnapshot { pool: name.clone(), revision, ..Default::default() }
        };
        let mut findings = Vec::new();
        let spec = match specs.remove(&name) {
            Some(Ok(s)) => Some(s),
            Some(Err(Finding::DataWithoutSpec { .. })) | None => {
                if !kvs.is_empty() {
                    findings
                        .push(Finding::DataWithoutSpec { pool: name.clone(), records: kvs.len() });
                }
                None
            }
            Some(Err(f)) => {
                findings.push(f);
                None
            }
        };
        if valid_name {
            findings.extend(audit::audit(spec.as_ref().map(|(s, _)| s), &snap));
        } else {
            findings.extend(kvs.iter().map(|kv| Finding::UnreadableRecord {
                record: String::from_utf8_lossy(&kv.key).into_owned(),
                nested: false,
            }));
        }
        if spec.is_none() && findings.is_empty() {
            // `check nopool`: nothing there at all.
            if pool.is_some() {
                report.pools.push(PoolCheck { pool: name.clone(), findings });
            }
            continue;
        }
        report.pools.push(PoolCheck { pool: name.clone(), findings });
        snapshots.insert(name, (spec, snap));
    }
    Ok(Scan { report, snapshots })
}

/// What `--repair` did with one finding.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct RepairOutcome {
    pub pool: String,
    pub finding: Finding,
    /// The fix tried, or `None` when no fix is safe without a person.
    pub action: Option<String>,
    /// The fix committed. False with an action: the records changed since the scan (someone is
    /// using them); run check again.
    pub applied: bool,
}

/// Plans and sends the safe repairs of a scan, one guarded txn each.
pub async fn repair(
    store: &dyn Store,
    layout: &Layout,
    scan: &Scan,
) -> StoreResult<Vec<RepairOutcome>> {
    let mut out = Vec::new();
    for f in &scan.report.other {
        out.push(RepairOutcome {
            pool: String::new(),
            finding: f.clone(),
            action: None,
            applied: false,
        });
    }
    for pc in &scan.report.pools {
        let entry = scan.snapshots.get(&pc.pool);
        for f in &pc.findings {
            let plan = match entry {
                Some((Some((spec, spec_revision)), snap)) => audit::plan(
                    RepairContext { layout, spec, spec_revision: *spec_revision },
                    snap,
                    f,
                ),
                _ => None,
            };
            let (action, applied) = match plan {
                None => (None, false),
                Some(r) => {
                    let resp = store.txn(r.txn).await?;
                    (Some(r.action), resp.succeeded)
                }
            };
            out.push(RepairOutcome { pool: pc.pool.clone(), finding: f.clone(), action, applied });
        }
    }
    Ok(out)
}

/// Other deployments this one's prefix overlaps (issue 9, item 9): one message per overlap, empty
/// when none. Probes, in one txn: for every proper ancestor `Q` of the prefix (`a` and `a/b` for
/// `a/b/c`), whether `Q/pools/` holds a spec (then this prefix lies inside Q's deployment); and
/// whether anything lies under the prefix outside `pools/` and `data/` (a deployment nested
/// inside this one, or foreign data); and, for the pools that exist, whether their data holds
/// another deployment's `pools/` or `data/`.
pub async fn nesting(store: &dyn Store, layout: &Layout) -> StoreResult<Vec<String>> {
    let mut probes: Vec<(String, KeyRange)> = Vec::new();
    for q in layout.ancestor_prefixes() {
        let range = KeyRange::prefix(format!("{q}/pools/").into_bytes());
        probes.push((
            format!("prefix {:?} lies inside the deployment at prefix {q:?}", layout.prefix()),
            range,
        ));
    }
    for range in layout.foreign_ranges() {
        probes.push((
            format!("prefix {:?} contains records of another deployment or tool", layout.prefix()),
            range,
        ));
    }
    let mut found = Vec::new();
    for chunk in probes.chunks(crate::store::MAX_TXN_OPS) {
        let ops = chunk
            .iter()
            .map(|(_, r)| TxnOp::get(GetRequest::new(r.clone()).with_limit(1).keys_only()));
        let resp = store.txn(TxnRequest::new().and_then(ops)).await?;
        for ((msg, _), r) in chunk.iter().zip(&resp.responses) {
            if let OpResponse::Get(g) = r {
                if let Some(kv) = g.kvs.first() {
                    found.push(format!("{msg} (found {:?})", String::from_utf8_lossy(&kv.key)));
                }
            }
        }
    }
    Ok(found)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::embedded::EmbeddedStore;
    use crate::store::list_all;
    use crate::PoolSpec;

    /// A repair planned on a scan is not applied when an allocator touched its records in
    /// between: the compares fail and nothing changes.
    #[tokio::test]
    async fn a_repair_is_a_no_op_once_its_records_changed() {
        let store = EmbeddedStore::memory();
        let l = Layout::default();
        let put = |k: Vec<u8>, v: &[u8]| TxnRequest::new().and_then([TxnOp::put(k, v.to_vec())]);
        store.txn(put(l.pool_spec_key("p"), &PoolSpec::new("p", 1, 100).to_json())).await.unwrap();
        store.txn(put(l.id_key("p", 61), b"ghost")).await.unwrap();
        store.txn(put(l.id_key("p", 62), b"stray")).await.unwrap();
        let scan = scan(&store, &l, Some("p"), 1000).await.unwrap();
        assert_eq!(scan.report.breaches(), 2);
        // Meanwhile "ghost" gets its key record and a holder, as a bind would write them.
        store
            .txn(TxnRequest::new().and_then([
                TxnOp::put(l.key_key("p", "ghost"), b"61".to_vec()),
                TxnOp::put(l.ref_key("p", "ghost", "h"), b"61".to_vec()),
            ]))
            .await
            .unwrap();
        let outcomes = repair(&store, &l, &scan).await.unwrap();
        let applied: Vec<(u64, bool)> = outcomes
            .iter()
            .map(|o| match &o.finding {
                Finding::IdWithoutKeyRecord { id, .. } => (*id, o.applied),
                other => panic!("{other:?}"),
            })
            .collect();
        assert_eq!(applied, [(61, false), (62, true)]);
        let after = scan_pool_ids(&store, &l).await;
        assert_eq!(after, [61], "ghost's ID record survived; the stray one was freed");
    }

    async fn scan_pool_ids(store: &EmbeddedStore, l: &Layout) -> Vec<u64> {
        let (kvs, rev) = list_all(store, &KeyRange::prefix(l.id_prefix("p")), 10).await.unwrap();
        PoolSnapshot::parse(l, "p", &kvs, rev).ids.keys().copied().collect()
    }
}
