//! The I/O half of the `check` audit: read a pool (or the whole deployment) at one revision, run
//! [`crate::audit`] on it, and send the repairs it plans. Thin on purpose: every decision is in
//! `audit.rs` and `records.rs`, which are pure and unit-tested.
//!
//! Also the nesting probe for deployments sharing an etcd: a prefix that lies
//! inside another deployment's, or contains one, is found with one txn of small reads.

use std::collections::{BTreeMap, BTreeSet};

use serde::Serialize;

use crate::audit::{self, Finding, RepairContext, Suspects};
use crate::layout::{parse_id_value, IdRecord, Layout};
use crate::point_reads;
use crate::quota_audit::{self, ClientQuota, Planned, QuotaRecord};
use crate::quota_names::{parse_creator_value, QuotaName};
use crate::records::{self, PoolSnapshot, RefEntry};
use crate::store::listing::{BoundedPages, PageBound};
use crate::store::{
    prefix_end, GetRequest, KeyRange, KeyValue, OpResponse, Revision, Store, StoreError,
    StoreResult, TxnOp, TxnRequest,
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
    /// prefix outside `pools/`, `data/` and `sessions/` (another deployment nested inside this
    /// one).
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
    /// The findings about the service's quota records and their repairs, planned while reading
    /// them (a client's records at a time): pool -> planned, `""` for the pool slots.
    quota: BTreeMap<String, Vec<Planned>>,
}

/// Reads pool `pool` (or, with `None`, every record under the prefix) at one revision and audits
/// it, streaming: memory is a page of records, a small entry per bound ID and the records of what
/// it finds, never the pool's records ([`Suspects`] says how). [`scan_bounded`]
/// with [`PageBound::default`] (the store's own bound on each page, a few retries of each).
pub async fn scan(
    store: &dyn Store,
    layout: &Layout,
    pool: Option<&str>,
    page: i64,
) -> StoreResult<Scan> {
    scan_bounded(store, layout, pool, page, &PageBound::default()).await
}

/// [`scan`] with each page of its listings bounded and retried as `bound` says; the listing as a
/// whole takes as long as its pages keep coming.
pub async fn scan_bounded(
    store: &dyn Store,
    layout: &Layout,
    pool: Option<&str>,
    page: i64,
    bound: &PageBound,
) -> StoreResult<Scan> {
    let pages = |range: &KeyRange, what: String| {
        BoundedPages::new(store, range, page, bound.clone()).named(what)
    };
    // The first read fixes the revision every later read names.
    let (spec_kvs, data_names, other, revision) = match pool {
        Some(p) => {
            let resp = store.get(GetRequest::key(layout.pool_spec_key(p))).await?;
            (resp.kvs, vec![p.to_string()], Vec::new(), resp.revision)
        }
        None => {
            let specs_range = KeyRange::prefix(layout.pools_prefix());
            let (specs, rev) = pages(&specs_range, "the pool specs".into()).collect().await?;
            let mut other = Vec::new();
            // Everything under the prefix but `pools/`, `data/` and `sessions/` (shared client
            // sessions' records, on their leases): where another deployment nested inside
            // this one keeps its records.
            for range in layout.foreign_ranges() {
                let what = format!("the records outside pools/, data/ and sessions/ ({range:?})");
                let mut pages = pages(&range, what).at_revision(rev).keys_only();
                while let Some(kvs) = pages.next_page().await? {
                    other.extend(kvs.iter().map(|kv| Finding::UnreadableRecord {
                        record: String::from_utf8_lossy(&kv.key).into_owned(),
                        nested: true,
                    }));
                }
            }
            (specs, data_pool_names(store, layout, rev).await?, other, rev)
        }
    };
    let mut other = other;
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
    if let Some(p) = pool {
        specs
            .entry(p.to_string())
            .or_insert_with(|| Err(Finding::DataWithoutSpec { pool: p.to_string(), records: 0 }));
    }
    let names: BTreeSet<String> = specs.keys().cloned().chain(data_names).collect();
    let mut report = Report { revision, pools: Vec::new(), other };
    let mut snapshots = BTreeMap::new();
    let mut quota = BTreeMap::new();
    if pool.is_none() {
        let planned = pool_slots(store, layout, page, bound, revision).await?;
        report.other.extend(planned.iter().map(|(f, _)| f.clone()));
        quota.insert(String::new(), planned);
    }
    for name in names {
        let spec = match specs.remove(&name) {
            Some(Ok(s)) => Ok(Some(s)),
            Some(Err(Finding::DataWithoutSpec { .. })) | None => Ok(None),
            Some(Err(f)) => Err(f),
        };
        let usable = spec.as_ref().ok().cloned().flatten();
        // Every-pool mode reads the record named `data/<name>` too (a listing of the prefix
        // grouped it with the pool); `check POOL` reads the pool's data prefix only.
        let read =
            PoolRead { store, layout, pool: &name, page, bound, revision, exact: pool.is_none() };
        let valid_name = crate::pool::validate_pool_name(&name).is_ok();
        let mut planned = Vec::new();
        let (snap, records, unreadable_names) = if valid_name {
            let (mut snap, records) = read.audited(usable.as_ref().map(|(s, _)| s)).await?;
            let (quota_records, p) = read.quota(usable.as_ref().map(|(_, r)| *r)).await?;
            snap.quota_records = quota_records;
            planned = p;
            (snap, records + quota_records, Vec::new())
        } else {
            let (records, names) = read.names().await?;
            (PoolSnapshot { pool: name.clone(), revision, ..Default::default() }, records, names)
        };
        let mut findings = Vec::new();
        match spec {
            Ok(Some(_)) => {}
            Ok(None) => {
                if records > 0 {
                    findings.push(Finding::DataWithoutSpec { pool: name.clone(), records });
                }
            }
            Err(f) => findings.push(f),
        }
        if valid_name {
            findings.extend(audit::audit(usable.as_ref().map(|(s, _)| s), &snap));
            findings.extend(planned.iter().map(|(f, _)| f.clone()));
        } else {
            findings.extend(
                unreadable_names
                    .into_iter()
                    .map(|record| Finding::UnreadableRecord { record, nested: false }),
            );
        }
        if usable.is_none() && findings.is_empty() {
            // `check nopool`: nothing there at all.
            if pool.is_some() {
                report.pools.push(PoolCheck { pool: name.clone(), findings });
            }
            continue;
        }
        report.pools.push(PoolCheck { pool: name.clone(), findings });
        quota.insert(name.clone(), planned);
        snapshots.insert(name, (usable, snap));
    }
    Ok(Scan { report, snapshots, quota })
}

/// Every client's pool slots (`P/sessions/quota-pools/`, at most the sum of the clients'
/// `pools=`), each against the creator record of the pool it names.
async fn pool_slots(
    store: &dyn Store,
    layout: &Layout,
    page: i64,
    bound: &PageBound,
    revision: Revision,
) -> StoreResult<Vec<Planned>> {
    let range = KeyRange::prefix(layout.pool_slots_root());
    let mut pages = BoundedPages::new(store, &range, page, bound.clone())
        .named("the pool slots")
        .at_revision(revision);
    let mut out = Vec::new();
    let mut slots = Vec::new();
    while let Some(kvs) = pages.next_page().await? {
        for kv in kvs {
            match layout.parse_pool_slot_key(&kv.key) {
                Some((client, n)) => slots.push((client, n, record(kv))),
                None => out.push((unreadable(&kv.key), None)),
            }
        }
    }
    let creators = |v: &[u8]| {
        let pool =
            std::str::from_utf8(v).ok().filter(|p| crate::pool::validate_pool_name(p).is_ok());
        pool.map(|p| layout.quota_creator_key(p))
    };
    let keys: Vec<Option<Vec<u8>>> = slots.iter().map(|(_, _, s)| creators(&s.value)).collect();
    let read = point_read(store, revision, keys.iter().flatten().cloned().collect()).await?;
    for ((client, n, slot), key) in slots.iter().zip(&keys) {
        let creator = key.as_ref().and_then(|k| read.get(k));
        out.extend(quota_audit::audit_pool_slot(layout, client, *n, slot, creator));
    }
    Ok(out)
}

/// A record as the quota audit takes it.
fn record(kv: KeyValue) -> QuotaRecord {
    QuotaRecord { value: kv.value, mod_revision: kv.mod_revision, lease: kv.lease }
}

fn unreadable(key: &[u8]) -> Finding {
    Finding::UnreadableRecord { record: String::from_utf8_lossy(key).into_owned(), nested: false }
}

/// The records among `keys` that exist at `revision`, read in txns of point reads.
async fn point_read(
    store: &dyn Store,
    revision: Revision,
    keys: Vec<Vec<u8>>,
) -> StoreResult<BTreeMap<Vec<u8>, QuotaRecord>> {
    let ops = keys.into_iter().map(|k| TxnOp::get(GetRequest::key(k).at_revision(revision)));
    let mut out = BTreeMap::new();
    for batch in point_reads::batches(ops.collect()) {
        for r in store.txn(TxnRequest::new().and_then(batch)).await?.responses {
            if let OpResponse::Get(g) = r {
                out.extend(g.kvs.into_iter().map(|kv| (kv.key.clone(), record(kv))));
            }
        }
    }
    Ok(out)
}

/// The pool names under `data/` (the segment after it, up to the next `/`), each found with one
/// read of one name that then skips the pool's records: O(pools) reads, not a listing.
async fn data_pool_names(
    store: &dyn Store,
    layout: &Layout,
    revision: Revision,
) -> StoreResult<Vec<String>> {
    let data = format!("{}/data/", layout.prefix()).into_bytes();
    let end = prefix_end(&data);
    let mut from = data.clone();
    let mut names = Vec::new();
    loop {
        let req = GetRequest::new(KeyRange::range(from.clone(), end.clone()))
            .with_limit(1)
            .keys_only()
            .loose_count()
            .at_revision(revision);
        let resp = store.get(req).await?;
        let Some(kv) = resp.kvs.first() else { return Ok(names) };
        let rest = &kv.key[data.len().min(kv.key.len())..];
        let name = rest.split(|&b| b == b'/').next().unwrap_or_default();
        let mut pool_prefix = data.clone();
        pool_prefix.extend_from_slice(name);
        from = if rest.len() == name.len() {
            // The record `data/<name>` itself: names like `<name>-x` sort before `<name>/`.
            let mut next = kv.key.clone();
            next.push(0);
            next
        } else {
            pool_prefix.push(b'/');
            prefix_end(&pool_prefix)
        };
        names.push(String::from_utf8_lossy(name).into_owned());
    }
}

/// One pool's records at the scan's revision.
struct PoolRead<'a> {
    store: &'a dyn Store,
    layout: &'a Layout,
    pool: &'a str,
    page: i64,
    bound: &'a PageBound,
    revision: Revision,
    /// Also read the record named `data/<pool>` (every-pool mode).
    exact: bool,
}

impl PoolRead<'_> {
    fn exact_key(&self) -> Vec<u8> {
        format!("{}/data/{}", self.layout.prefix(), self.pool).into_bytes()
    }

    /// The pool's records in the order a listing of the pool has them: the `data/<pool>` record
    /// (every-pool mode), then each range of `ranges`, a page at a time.
    async fn each_page(
        &self,
        ranges: &[KeyRange],
        keys_only: bool,
        mut each: impl FnMut(usize, Vec<KeyValue>),
    ) -> StoreResult<()> {
        if self.exact {
            let resp = self
                .store
                .get(GetRequest::key(self.exact_key()).at_revision(self.revision))
                .await?;
            if !resp.kvs.is_empty() {
                each(usize::MAX, resp.kvs);
            }
        }
        for (i, range) in ranges.iter().enumerate() {
            let mut pages = BoundedPages::new(self.store, range, self.page, self.bound.clone())
                .named(format!("pool {:?}", self.pool))
                .at_revision(self.revision);
            if keys_only {
                pages = pages.keys_only();
            }
            while let Some(kvs) = pages.next_page().await? {
                each(i, kvs);
            }
        }
        Ok(())
    }

    /// A pool whose name is not valid: how many records, and their names.
    async fn names(&self) -> StoreResult<(usize, Vec<String>)> {
        let mut names = Vec::new();
        let ranges = [KeyRange::prefix(self.layout.pool_data_prefix(self.pool))];
        self.each_page(&ranges, true, |_, kvs| {
            names.extend(kvs.iter().map(|kv| String::from_utf8_lossy(&kv.key).into_owned()))
        })
        .await?;
        Ok((names.len(), names))
    }

    /// A pool streamed family by family ([`Suspects`]), then the closure of its suspects read
    /// record by record: the snapshot the audit and the repairs need, and the number of records
    /// the pool has.
    async fn audited(&self, spec: Option<&crate::PoolSpec>) -> StoreResult<(PoolSnapshot, usize)> {
        let (l, p) = (self.layout, self.pool);
        let data = l.pool_data_prefix(p);
        let (ids, keys, refs) = (l.id_prefix(p), l.key_prefix(p), l.refs_prefix(p));
        let quota = l.quota_prefix(p);
        // The three families in the order the audit needs them, then the rest of the pool's
        // prefix (fence records, names no allocator writes) but the service's quota records
        // (`key/` < `quota/` < `ref/`), which [`PoolRead::quota`] reads.
        let ranges = [
            KeyRange::prefix(ids.clone()),
            KeyRange::prefix(keys.clone()),
            KeyRange::prefix(refs.clone()),
            KeyRange::range(data.clone(), ids.clone()),
            KeyRange::range(prefix_end(&ids), keys.clone()),
            KeyRange::range(prefix_end(&keys), quota.clone()),
            KeyRange::range(prefix_end(&quota), refs.clone()),
            KeyRange::range(prefix_end(&refs), prefix_end(&data)),
        ];
        let mut suspects = Suspects::new(spec.cloned());
        let mut records = 0usize;
        self.each_page(&ranges, false, |family, kvs| {
            records += kvs.len();
            let mut page = PoolSnapshot::parse(l, p, &kvs, self.revision);
            suspects.unreadable_page(&mut page);
            match family {
                0 => suspects.id_page(&page),
                1 => suspects.key_page(&page),
                2 => suspects.ref_page(&page),
                _ => {}
            }
        })
        .await?;
        let (keys, ids, unreadable) = suspects.finish();
        let mut snap = self.closure(keys, ids).await?;
        snap.unreadable = unreadable;
        Ok((snap, records))
    }

    /// The service's quota records of the pool ([`crate::quota_names`]), a client at a time: how
    /// many, and what [`quota_audit`] finds in them. Memory is one client's records (at most
    /// twice its `refs=` when the service wrote them), never the pool's. `spec_revision`: the
    /// pool's spec record's mod revision, `None` without a usable spec.
    async fn quota(&self, spec_revision: Option<Revision>) -> StoreResult<(usize, Vec<Planned>)> {
        let (l, p) = (self.layout, self.pool);
        let range = KeyRange::prefix(l.quota_prefix(p));
        let mut pages = BoundedPages::new(self.store, &range, self.page, self.bound.clone())
            .named(format!("the quota records of pool {p:?}"))
            .at_revision(self.revision);
        let (mut records, mut out) = (0, Vec::new());
        let mut client = ClientQuota::default();
        let mut creator = None;
        while let Some(kvs) = pages.next_page().await? {
            records += kvs.len();
            for kv in kvs {
                let name = l.parse_quota_key(p, &kv.key);
                let of = match &name {
                    Some(QuotaName::Slot { client, .. } | QuotaName::Mirror { client, .. }) => {
                        Some(client.as_str())
                    }
                    _ => None,
                };
                // A client's records are contiguous (its name never holds `/`).
                if let Some(c) = of.filter(|c| *c != client.client) {
                    let done = std::mem::take(&mut client);
                    out.extend(self.client_quota(done).await?);
                    client.client = c.to_string();
                }
                match name {
                    Some(QuotaName::Slot { n, .. }) => {
                        client.slots.insert(n, record(kv));
                    }
                    Some(QuotaName::Mirror { holder, key, .. }) => {
                        client.mirrors.insert((key, holder), record(kv));
                    }
                    Some(QuotaName::Creator) => creator = Some(record(kv)),
                    None => out.push((unreadable(&kv.key), None)),
                }
            }
        }
        out.extend(self.client_quota(client).await?);
        if let Some(c) = creator {
            let named =
                parse_creator_value(&c.value).map(|(client, n)| l.pool_slot_key(&client, n));
            let slot = match named {
                Some(k) => {
                    point_read(self.store, self.revision, vec![k]).await?.into_values().next()
                }
                None => None,
            };
            out.extend(quota_audit::audit_creator(l, p, &c, spec_revision, slot.as_ref()));
        }
        Ok((records, out))
    }

    /// One client's quota records against the references they name.
    async fn client_quota(&self, q: ClientQuota) -> StoreResult<Vec<Planned>> {
        if q.client.is_empty() {
            return Ok(Vec::new());
        }
        let (l, p) = (self.layout, self.pool);
        let wanted: Vec<((String, String), Vec<u8>)> = q
            .references()
            .into_iter()
            .map(|(k, h)| {
                let key = l.ref_key(p, &k, &h);
                ((k, h), key)
            })
            .collect();
        let read =
            point_read(self.store, self.revision, wanted.iter().map(|(_, k)| k.clone()).collect())
                .await?;
        let refs = wanted
            .into_iter()
            .filter_map(|(id, key)| {
                let r = read.get(&key)?;
                let entry = RefEntry {
                    id: parse_id_value(&r.value),
                    mod_revision: r.mod_revision,
                    lease: r.lease,
                };
                Some((id, entry))
            })
            .collect();
        Ok(quota_audit::audit_client(l, p, &q, &refs))
    }

    /// The records of `keys` (key record and references) and `ids` (ID record), then of every
    /// key and ID they name, until none is new.
    async fn closure(
        &self,
        mut want_keys: BTreeSet<String>,
        mut want_ids: BTreeSet<u64>,
    ) -> StoreResult<PoolSnapshot> {
        let (l, p) = (self.layout, self.pool);
        let mut snap =
            PoolSnapshot { pool: p.to_string(), revision: self.revision, ..Default::default() };
        let (mut read_keys, mut read_ids) = (BTreeSet::new(), BTreeSet::new());
        loop {
            let keys: Vec<String> = want_keys.difference(&read_keys).cloned().collect();
            let ids: Vec<u64> = want_ids.difference(&read_ids).copied().collect();
            if keys.is_empty() && ids.is_empty() {
                return Ok(snap);
            }
            let at = |r: GetRequest| TxnOp::get(r.at_revision(self.revision));
            let mut ops = Vec::with_capacity(2 * keys.len() + ids.len());
            for k in &keys {
                ops.push(at(GetRequest::key(l.key_key(p, k))));
                ops.push(at(GetRequest::prefix(l.ref_prefix(p, k))));
            }
            ops.extend(ids.iter().map(|id| at(GetRequest::key(l.id_key(p, *id)))));
            let mut kvs = Vec::new();
            for batch in point_reads::batches(ops) {
                let resp = self.store.txn(TxnRequest::new().and_then(batch)).await?;
                for r in resp.responses {
                    if let OpResponse::Get(g) = r {
                        kvs.extend(g.kvs);
                    }
                }
            }
            read_keys.extend(keys);
            read_ids.extend(ids);
            // Names no allocator writes were all met by the passes already.
            let part = PoolSnapshot::parse(l, p, &kvs, self.revision);
            for (id, e) in part.ids {
                if let Some(IdRecord::Bound(k)) = &e.record {
                    want_keys.insert(k.clone());
                }
                snap.ids.insert(id, e);
            }
            for (k, e) in part.keys {
                want_ids.extend(e.id);
                snap.keys.insert(k, e);
            }
            for (k, hs) in part.refs {
                want_ids.extend(hs.values().filter_map(|r| r.id));
                snap.refs.entry(k).or_default().extend(hs);
            }
        }
    }
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
    // A quota finding's repair was planned with it.
    let quota_plan = |pool: &str, f: &Finding| {
        let planned = scan.quota.get(pool)?.iter().find(|(q, _)| q == f)?;
        Some(planned.1.clone())
    };
    for f in &scan.report.other {
        let plan = quota_plan("", f).flatten();
        let (action, applied) = send(store, plan).await?;
        out.push(RepairOutcome { pool: String::new(), finding: f.clone(), action, applied });
    }
    for pc in &scan.report.pools {
        let entry = scan.snapshots.get(&pc.pool);
        for f in &pc.findings {
            let plan = match (quota_plan(&pc.pool, f), entry) {
                (Some(plan), _) => plan,
                (None, Some((Some((spec, spec_revision)), snap))) => audit::plan(
                    RepairContext { layout, spec, spec_revision: *spec_revision },
                    snap,
                    f,
                ),
                _ => None,
            };
            let (action, applied) = send(store, plan).await?;
            out.push(RepairOutcome { pool: pc.pool.clone(), finding: f.clone(), action, applied });
        }
    }
    Ok(out)
}

/// Sends one planned repair: (its action, whether it committed). A put on a session's lease
/// that etcd has removed meanwhile is a repair that did not apply (the records went with it).
async fn send(
    store: &dyn Store,
    plan: Option<audit::Repair>,
) -> StoreResult<(Option<String>, bool)> {
    let Some(r) = plan else { return Ok((None, false)) };
    match store.txn(r.txn).await {
        Ok(resp) => Ok((Some(r.action), resp.succeeded)),
        Err(StoreError::LeaseNotFound(_)) => Ok((Some(r.action), false)),
        Err(e) => Err(e),
    }
}

/// Other deployments this one's prefix overlaps: one message per overlap, empty
/// when none. Probes, in one txn: for every proper ancestor `Q` of the prefix (`a` and `a/b` for
/// `a/b/c`), whether `Q/pools/` holds a spec (then this prefix lies inside Q's deployment); and
/// whether anything lies under the prefix outside `pools/`, `data/` and `sessions/` (a
/// deployment nested inside this one, or foreign data); and, for the pools that exist, whether their data holds
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
    use crate::layout::encode_id;
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

    /// What `check` reported before it streamed: the pool's whole listing
    /// parsed into one snapshot and audited, and each finding's repair planned on it.
    async fn whole(
        store: &EmbeddedStore,
        l: &Layout,
        spec: Option<&PoolSpec>,
    ) -> (Vec<Finding>, Vec<Option<audit::Repair>>) {
        let (kvs, rev) =
            list_all(store, &KeyRange::prefix(l.pool_data_prefix("p")), 7).await.unwrap();
        let snap = PoolSnapshot::parse(l, "p", &kvs, rev);
        let mut findings = Vec::new();
        if spec.is_none() && !kvs.is_empty() {
            findings.push(Finding::DataWithoutSpec { pool: "p".into(), records: kvs.len() });
        }
        findings.extend(audit::audit(spec, &snap));
        let plans = plans(l, spec, &snap, &findings);
        (findings, plans)
    }

    fn plans(
        l: &Layout,
        spec: Option<&PoolSpec>,
        snap: &PoolSnapshot,
        findings: &[Finding],
    ) -> Vec<Option<audit::Repair>> {
        let Some(spec) = spec else { return Vec::new() };
        let cx = RepairContext { layout: l, spec, spec_revision: 2 };
        findings.iter().map(|f| audit::plan(cx, snap, f)).collect()
    }

    /// The streaming scan finds exactly what the whole-pool audit found, and plans the same
    /// repairs, on pools damaged at random in every way the audit knows (unreadable values and
    /// names, IDs bound twice, keys named twice, stale and missing records of each family,
    /// references naming other IDs, IDs out of the range or reserved, tombstones), with pages
    /// of 3 records so that every pass crosses pages, and IDs of 1 to 3 digits so that their
    /// names do not sort as their numbers do.
    #[tokio::test]
    async fn streaming_finds_what_the_whole_pool_audit_found() {
        use rand::{Rng, SeedableRng};
        let l = Layout::default();
        let mut rng = rand::rngs::StdRng::seed_from_u64(21);
        let keys = ["a", "b", "c/d", "c", "e%", "f"];
        let holders = ["h", "g"];
        let ids = [1u64, 2, 9, 10, 11, 50, 99, 100, 500];
        let mut nonempty = 0;
        for case in 0..300 {
            let store = EmbeddedStore::memory();
            let spec = PoolSpec::new("p", 1, 200).reserve(50..=50);
            let with_spec = case % 5 != 0;
            let mut ops = Vec::new();
            if with_spec {
                ops.push(TxnOp::put(l.pool_spec_key("p"), spec.to_json()));
            }
            // Mostly healthy bindings, each record then damaged now and then.
            let mut free: Vec<u64> = ids.to_vec();
            for k in keys {
                if rng.random_bool(0.2) || free.is_empty() {
                    continue;
                }
                let id = free.swap_remove(rng.random_range(0..free.len()));
                let pick = |rng: &mut rand::rngs::StdRng| ids[rng.random_range(0..ids.len())];
                let id_value = match rng.random_range(0..12) {
                    0 => None,
                    1 => Some(b"".to_vec()),
                    2 => Some(IdRecord::Tombstone(k.into()).encode()),
                    3 => Some(keys[rng.random_range(0..keys.len())].as_bytes().to_vec()),
                    _ => Some(k.as_bytes().to_vec()),
                };
                if let Some(v) = id_value {
                    ops.push(TxnOp::put(l.id_key("p", id), v));
                }
                let key_value = match rng.random_range(0..12) {
                    0 => None,
                    1 => Some(b"x1".to_vec()),
                    2 => Some(encode_id(pick(&mut rng))),
                    _ => Some(encode_id(id)),
                };
                if let Some(v) = key_value {
                    ops.push(TxnOp::put(l.key_key("p", k), v));
                }
                for h in holders {
                    match rng.random_range(0..10) {
                        0..=3 => {}
                        4 => ops.push(TxnOp::put(l.ref_key("p", k, h), b"?".to_vec())),
                        5 => ops.push(TxnOp::put(l.ref_key("p", k, h), encode_id(pick(&mut rng)))),
                        _ => ops.push(TxnOp::put(l.ref_key("p", k, h), encode_id(id))),
                    }
                }
            }
            // Strays: records of nothing, and names no allocator writes.
            for _ in 0..rng.random_range(0..3) {
                let id = ids[rng.random_range(0..ids.len())];
                let k = keys[rng.random_range(0..keys.len())];
                match rng.random_range(0..6) {
                    0 => ops.push(TxnOp::put(l.id_key("p", id), k.as_bytes().to_vec())),
                    1 => ops.push(TxnOp::put(l.key_key("p", k), encode_id(id))),
                    2 => ops.push(TxnOp::put(l.ref_key("p", k, "s"), encode_id(id))),
                    3 => ops.push(TxnOp::put(b"idalloc/data/p/id/007".to_vec(), b"a".to_vec())),
                    4 => ops.push(TxnOp::put(b"idalloc/data/p/zz".to_vec(), b"a".to_vec())),
                    _ => ops.push(TxnOp::put(l.holder_key("p", "h"), b"".to_vec())),
                }
            }
            for op in ops {
                store.txn(TxnRequest::new().and_then([op])).await.unwrap();
            }
            let spec_ref = with_spec.then_some(&spec);
            let (want, want_plans) = whole(&store, &l, spec_ref).await;
            let got = scan(&store, &l, Some("p"), 3).await.unwrap();
            let pc = &got.report.pools;
            let findings = pc.first().map(|p| p.findings.clone()).unwrap_or_default();
            assert_eq!(findings, want, "case {case}");
            if let Some((_, snap)) = got.snapshots.get("p") {
                assert_eq!(plans(&l, spec_ref, snap, &findings), want_plans, "case {case}");
            }
            nonempty += usize::from(!want.is_empty());
        }
        assert!(nonempty > 150, "most cases are damaged: {nonempty}");
    }

    /// Every-pool mode finds pools by their data as well as by their specs, with records named
    /// `data/<pool>` and pools whose names no allocator writes, as the whole listing did.
    #[tokio::test]
    async fn every_pool_mode_finds_pools_by_spec_and_by_data() {
        let store = EmbeddedStore::memory();
        let l = Layout::default();
        let put = |k: Vec<u8>, v: &[u8]| TxnRequest::new().and_then([TxnOp::put(k, v.to_vec())]);
        for (k, v) in [
            (l.pool_spec_key("p"), PoolSpec::new("p", 1, 100).to_json()),
            (l.pool_spec_key("empty"), PoolSpec::new("empty", 1, 100).to_json()),
            (l.id_key("p", 61), b"ghost".to_vec()),
            (l.id_key("q", 5), b"k".to_vec()),
            (l.key_key("q", "k"), b"5".to_vec()),
            (b"idalloc/data/q".to_vec(), b"x".to_vec()),
            (b"idalloc/data/q-x/id/1".to_vec(), b"k".to_vec()),
            (b"idalloc/data/Bad/id/1".to_vec(), b"k".to_vec()),
            (b"idalloc/other".to_vec(), b"x".to_vec()),
            (b"idalloc/zzz/pools/a".to_vec(), b"x".to_vec()),
        ] {
            store.txn(put(k, &v)).await.unwrap();
        }
        let got = scan(&store, &l, None, 2).await.unwrap();
        let by_pool: Vec<(String, Vec<Finding>)> =
            got.report.pools.iter().map(|p| (p.pool.clone(), p.findings.clone())).collect();
        let unreadable = |r: &str| Finding::UnreadableRecord { record: r.into(), nested: false };
        assert_eq!(
            by_pool,
            vec![
                (
                    "Bad".to_string(),
                    vec![
                        Finding::DataWithoutSpec { pool: "Bad".into(), records: 1 },
                        unreadable("idalloc/data/Bad/id/1"),
                    ]
                ),
                ("empty".to_string(), vec![]),
                (
                    "p".to_string(),
                    vec![Finding::IdWithoutKeyRecord {
                        id: 61,
                        key: "ghost".into(),
                        key_record: None
                    }]
                ),
                ("q".to_string(), vec![Finding::DataWithoutSpec { pool: "q".into(), records: 3 }]),
                (
                    "q-x".to_string(),
                    vec![
                        Finding::DataWithoutSpec { pool: "q-x".into(), records: 1 },
                        Finding::IdWithoutKeyRecord { id: 1, key: "k".into(), key_record: None },
                    ]
                ),
            ]
        );
        let nested = |r: &str| Finding::UnreadableRecord { record: r.into(), nested: true };
        assert_eq!(got.report.other, vec![nested("idalloc/other"), nested("idalloc/zzz/pools/a")]);
    }

    async fn scan_pool_ids(store: &EmbeddedStore, l: &Layout) -> Vec<u64> {
        let (kvs, rev) = list_all(store, &KeyRange::prefix(l.id_prefix("p")), 10).await.unwrap();
        PoolSnapshot::parse(l, "p", &kvs, rev).ids.keys().copied().collect()
    }
}
