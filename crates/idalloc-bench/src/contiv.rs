//! A replica of Contiv-VPP's `idalloc` protocol on etcd, for comparison.
//!
//! What it follows: the seed `003_d200b37001ca98cd.txt` documents only the API — named pools with
//! an ID range (`InitPool`), `GetOrAllocateID(pool, label)`, `ReleaseID(pool, label)`, and a
//! `RemoteDB nodesync.KVDBWithAtomic` dependency (a KV store with atomic compare-and-swap). The
//! store protocol is the one DESIGN.md §5 and the benchmark issue describe: the whole pool is one
//! JSON value (range plus every label→ID allocation); an allocation reads it, scans linearly from
//! `min` for the first free ID, and writes the whole value back with a compare-and-swap on its
//! revision, retrying up to 10 times when another writer got there first. A release is the same
//! read-modify-CAS without the label.
//!
//! Assumption in Contiv's favour: calls within one node are serialized by a local mutex, so a node
//! never loses a CAS to itself; only other nodes cause retries. An existing label is answered by one
//! read (Contiv also keeps a watch-fed copy of the pool; the replica does not, which costs it one
//! read per lookup of a label another node allocated).

use std::collections::{BTreeMap, HashSet};
use std::sync::atomic::{AtomicU64, Ordering};

use idalloc::store::{Compare, GetRequest, Store, TxnOp, TxnRequest};
use serde_json::{json, Value};

use crate::contender::{err, Counted, Node, RANGE};

/// Attempts per operation before giving up.
pub const MAX_ATTEMPTS: u32 = 10;

/// The one store key holding the pool.
pub const POOL_KEY: &[u8] = b"contiv/idalloc/pool/bench";

/// The pool value with `allocations` label→ID pairs.
pub fn pool_value(allocations: &BTreeMap<String, u64>) -> Vec<u8> {
    json!({
        "name": "bench",
        "range": { "min_id": RANGE.0, "max_id": RANGE.1 },
        "id_allocations": allocations,
    })
    .to_string()
    .into_bytes()
}

fn parse(value: &[u8]) -> Result<BTreeMap<String, u64>, String> {
    let v: Value = serde_json::from_slice(value).map_err(|e| err("contiv pool JSON", e))?;
    let allocs =
        v.get("id_allocations").and_then(Value::as_object).ok_or("contiv: no allocations")?;
    allocs
        .iter()
        .map(|(k, v)| {
            v.as_u64().map(|id| (k.clone(), id)).ok_or_else(|| format!("contiv: bad ID for {k}"))
        })
        .collect()
}

/// One Contiv node.
pub struct ContivNode {
    store: Counted,
    local: tokio::sync::Mutex<()>,
    retries: AtomicU64,
}

impl ContivNode {
    /// `InitPool`: creates the pool value if absent (one txn).
    pub async fn start(store: Counted, _index: usize) -> Result<Self, String> {
        store
            .txn(
                TxnRequest::new()
                    .when([Compare::absent(POOL_KEY)])
                    .and_then([TxnOp::put(POOL_KEY, pool_value(&BTreeMap::new()))]),
            )
            .await
            .map_err(|e| err("contiv InitPool", e))?;
        Ok(ContivNode { store, local: tokio::sync::Mutex::new(()), retries: AtomicU64::new(0) })
    }

    /// Read the pool, let `change` decide (Ok(None): nothing to write), CAS it; up to 10 times.
    async fn read_modify_cas(
        &self,
        what: &str,
        change: impl Fn(&mut BTreeMap<String, u64>) -> Result<Option<u64>, String>,
    ) -> Result<u64, String> {
        let _local = self.local.lock().await;
        for attempt in 0..MAX_ATTEMPTS {
            let got = self
                .store
                .get(GetRequest::key(POOL_KEY))
                .await
                .map_err(|e| err("contiv read", e))?;
            let kv = got.kvs.first().ok_or("contiv: pool missing")?;
            let mut allocs = parse(&kv.value)?;
            let Some(id) = change(&mut allocs)? else {
                return Ok(0);
            };
            let resp = self
                .store
                .txn(
                    TxnRequest::new()
                        .when([Compare::mod_revision_is(POOL_KEY, kv.mod_revision)])
                        .and_then([TxnOp::put(POOL_KEY, pool_value(&allocs))]),
                )
                .await
                .map_err(|e| err("contiv CAS", e))?;
            if resp.succeeded {
                return Ok(id);
            }
            if attempt + 1 < MAX_ATTEMPTS {
                self.retries.fetch_add(1, Ordering::Relaxed);
            }
        }
        Err(format!("contiv {what}: {MAX_ATTEMPTS} compare-and-swap attempts lost"))
    }
}

/// The first ID from `min` no label has: a linear scan, as Contiv does.
fn first_free(allocs: &BTreeMap<String, u64>) -> Option<u64> {
    let used: HashSet<u64> = allocs.values().copied().collect();
    (RANGE.0..=RANGE.1).find(|id| !used.contains(id))
}

#[async_trait::async_trait]
impl Node for ContivNode {
    /// `GetOrAllocateID`.
    async fn acquire(&self, key: &str) -> Result<u64, String> {
        // An existing label is returned after the read, without a write.
        let existing = std::sync::Mutex::new(None);
        let id = self
            .read_modify_cas("GetOrAllocateID", |allocs| {
                if let Some(id) = allocs.get(key) {
                    if let Ok(mut e) = existing.lock() {
                        *e = Some(*id);
                    }
                    return Ok(None);
                }
                let id = first_free(allocs).ok_or("contiv: pool exhausted")?;
                allocs.insert(key.to_string(), id);
                Ok(Some(id))
            })
            .await?;
        let found = existing.lock().ok().and_then(|e| *e);
        Ok(found.unwrap_or(id))
    }

    /// `ReleaseID`: NOOP if the label has no ID.
    async fn release(&self, key: &str) -> Result<(), String> {
        self.read_modify_cas("ReleaseID", |allocs| Ok(allocs.remove(key).map(|_| 1)))
            .await
            .map(|_| ())
    }

    async fn knows(&self, _keys: &[String]) -> bool {
        true // no local view: every lookup reads the store
    }
    fn retries(&self) -> u64 {
        self.retries.load(Ordering::Relaxed)
    }
    fn store(&self) -> &Counted {
        &self.store
    }
    async fn close(&self) {}
}
