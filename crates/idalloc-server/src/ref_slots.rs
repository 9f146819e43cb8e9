//! Reference quota slots: the `refs=N` quota as records in the store, so that it holds for every
//! instance of the service at once and its check costs the same on a pool of ten references as on
//! one of a million.
//!
//! A client with `refs=N` owns, in each pool, the slot names `P/data/<pool>/quota/<client>/slot/<n>`
//! for `n` in `0..N`. Each reference the client makes (one per (key, holder), durable or a
//! session's) holds one slot, and a mirror record `P/data/<pool>/quota/<client>/ref/<enc(holder)>/
//! <enc(key)>` names the slot it holds, so that a release finds it in one read:
//!
//! - **Before the bind** the service takes the slot and the mirror in one txn guarded by
//!   `create_revision == 0` on both (a slot chosen at random among the free ones, so concurrent
//!   acquires of one client rarely collide and never both win). A mirror already present means
//!   the reference is counted already (an acquire is idempotent). A session's slot and mirror
//!   are put on the session's lease: they vanish with the session's references, whenever etcd
//!   removes the lease.
//! - **After the bind** the acquire confirms each bound key's mirror in one read-only txn; a
//!   mirror gone meanwhile (a racing release, or `idalloc check --repair`, freed it while the
//!   reference was absent) is taken again, guarded by the reference being present. If no slot is
//!   free then, the key is released again and the request answers 429.
//! - **After a failed bind** the records taken for it are deleted again; **after a release**
//!   the mirror and its slot are deleted (one read, one txn). Both deletes compare the
//!   reference absent: a reference that exists (bound again meanwhile) keeps its slot.
//! - Under the pool's data prefix, so deleting the pool deletes them.
//!
//! So the slots taken are at least the client's counted references, and never more than N are in
//! the store: no sequence of requests through any mix of instances leaves a client with more
//! than N counted references in a pool. What can differ, always on the safe side (fewer
//! references than slots), is a slot whose bind never happened or whose release was not followed
//! by its delete (the instance died in between): `idalloc check --repair` frees such records. A
//! reference made before the client had `refs=` holds no slot until it is acquired again.
//!
//! The store work of one acquire is one txn (and one read of the client's slot names when its
//! random pick was taken) and one read-only txn, per up to 64 keys, whatever the pool's size.

use std::collections::{HashMap, HashSet};

use idalloc::layout::Layout;
use idalloc::quota_names::{mirror_value, parse_mirror_value, slot_value};
use idalloc::store::{
    Compare, CompareOp, CompareTarget, GetRequest, KeyRange, LeaseId, OpResponse, Store,
    StoreError, TxnOp, TxnRequest, MAX_TXN_OPS,
};

use crate::error::ApiError;

/// Keys per txn: two compares and two puts each (a store takes up to `MAX_TXN_OPS` compares and
/// as many operations per branch).
const CHUNK: usize = MAX_TXN_OPS / 2;

/// Keys per txn of a slot taken after the bind: three compares each.
const BOUND_CHUNK: usize = MAX_TXN_OPS / 3;

/// Attempts per chunk before an acquire gives up as contended.
const ATTEMPTS: usize = 16;

/// Where one client's slots and mirrors of one pool live.
pub struct RefSlots<'a> {
    store: &'a dyn Store,
    layout: &'a Layout,
    client: &'a str,
    pool: &'a str,
    limit: u64,
}

/// The records an acquire took: (mirror, slot number) per key, to give back if the bind fails.
#[derive(Default, Debug)]
pub struct Taken {
    by_key: HashMap<String, (Vec<u8>, u64)>,
}

/// A mirror and its slot to delete, on the condition `guard` (the mirror as read) and the
/// reference being absent.
struct Free {
    guard: Compare,
    mirror: Vec<u8>,
    slot: Vec<u8>,
    reference: Vec<u8>,
}

/// `key` exists (`create_revision > 0`).
fn present(key: Vec<u8>) -> Compare {
    Compare::new(KeyRange::key(key), CompareOp::Greater, CompareTarget::CreateRevision(0))
}

fn found(op: Option<&OpResponse>) -> bool {
    matches!(op, Some(OpResponse::Get(g)) if !g.kvs.is_empty())
}

impl<'a> RefSlots<'a> {
    pub fn new(
        store: &'a dyn Store,
        layout: &'a Layout,
        client: &'a str,
        pool: &'a str,
        limit: u64,
    ) -> Self {
        RefSlots { store, layout, client, pool, limit }
    }

    fn slots_prefix(&self) -> Vec<u8> {
        self.layout.quota_slots_prefix(self.pool, self.client)
    }

    fn slot_key(&self, n: u64) -> Vec<u8> {
        self.layout.quota_slot_key(self.pool, self.client, n)
    }

    fn mirror_key(&self, holder: &str, key: &str) -> Vec<u8> {
        self.layout.quota_mirror_key(self.pool, self.client, holder, key)
    }

    fn ref_key(&self, holder: &str, key: &str) -> Vec<u8> {
        self.layout.ref_key(self.pool, key, holder)
    }

    /// The slot numbers taken now, and how many slot records there are (all of them count,
    /// also any above a lowered limit).
    async fn taken(&self) -> Result<(HashSet<u64>, u64), ApiError> {
        let prefix = self.slots_prefix();
        let got = self.store.get(GetRequest::new(KeyRange::prefix(prefix.clone())).keys_only());
        let got = got.await?;
        let nums = got
            .kvs
            .iter()
            .filter_map(|kv| kv.key.strip_prefix(prefix.as_slice()))
            .filter_map(|n| std::str::from_utf8(n).ok()?.parse().ok())
            .collect();
        Ok((nums, got.kvs.len() as u64))
    }

    /// Takes a slot for each of `keys` that `holder` does not hold a counted reference to (on
    /// `lease` for a session's references), before they are bound; 429 `quota_exceeded` if the
    /// free slots are fewer than the new references (then nothing is taken for the chunk that
    /// did not fit, and what earlier chunks took is given back).
    pub async fn acquire(
        &self,
        holder: &str,
        lease: Option<LeaseId>,
        keys: &[String],
    ) -> Result<Taken, ApiError> {
        let mut uniq: Vec<&String> = Vec::new();
        let mut seen = HashSet::new();
        for k in keys {
            if seen.insert(k.as_str()) {
                uniq.push(k);
            }
        }
        let mut taken = Taken::default();
        for chunk in uniq.chunks(CHUNK) {
            if let Err(e) = self.acquire_chunk(holder, lease, chunk, &mut taken, false).await {
                self.give_back(holder, &taken, &[]).await;
                return Err(e);
            }
        }
        Ok(taken)
    }

    /// After the bind of `keys` (those whose bind succeeded): makes sure each is counted, taking
    /// a slot again for a key whose mirror was deleted between the acquire's slot txn and its
    /// bind (a racing release of the same key and holder, or `idalloc check --repair`) while its
    /// reference is present. `Ok(None)`: every key is counted; `Ok(Some((429, keys)))`: `keys`
    /// could not be, for lack of a free slot, and must be released again. One read-only txn per
    /// 64 keys when nothing raced.
    pub async fn confirm(
        &self,
        holder: &str,
        lease: Option<LeaseId>,
        keys: &[&String],
    ) -> Result<Option<(ApiError, Vec<String>)>, ApiError> {
        let mut uncounted: Option<(ApiError, Vec<String>)> = None;
        for chunk in keys.chunks(CHUNK) {
            let compares = chunk.iter().map(|k| present(self.mirror_key(holder, k)));
            let reads = chunk.iter().flat_map(|k| {
                [
                    TxnOp::get_key(self.mirror_key(holder, k)),
                    TxnOp::get_key(self.ref_key(holder, k)),
                ]
            });
            let r = self.store.txn(TxnRequest::new().when(compares).or_else(reads)).await?;
            if r.succeeded {
                continue;
            }
            let missing: Vec<&String> = chunk
                .iter()
                .enumerate()
                .filter(|(i, _)| {
                    !found(r.responses.get(2 * i)) && found(r.responses.get(2 * i + 1))
                })
                .map(|(_, k)| *k)
                .collect();
            if missing.is_empty() {
                continue;
            }
            for part in missing.chunks(BOUND_CHUNK) {
                let mut taken = Taken::default();
                match self.acquire_chunk(holder, lease, part, &mut taken, true).await {
                    Ok(()) => {}
                    Err(e) if e.kind == "quota_exceeded" => {
                        let (_, keys) = uncounted.get_or_insert_with(|| (e, Vec::new()));
                        keys.extend(part.iter().map(|k| k.to_string()));
                    }
                    Err(e) => return Err(e),
                }
            }
        }
        Ok(uncounted)
    }

    /// Takes slots for `keys`; with `bound`, only for keys whose reference is present (the
    /// confirm after a bind), else for all.
    async fn acquire_chunk(
        &self,
        holder: &str,
        lease: Option<LeaseId>,
        keys: &[&String],
        taken: &mut Taken,
        bound: bool,
    ) -> Result<(), ApiError> {
        let mut want: Vec<&String> = keys.to_vec();
        // Slots known taken (from a read after a lost pick); empty until then.
        let mut known: Option<(HashSet<u64>, u64)> = None;
        for _ in 0..ATTEMPTS {
            if want.is_empty() {
                return Ok(());
            }
            let picks = match &known {
                None => {
                    (0..want.len()).map(|_| rand::random::<u64>() % self.limit).collect::<Vec<_>>()
                }
                Some((nums, count)) => {
                    let free = self.limit.saturating_sub(*count);
                    if free < want.len() as u64 {
                        return Err(self.over(*count, want.len()));
                    }
                    let mut nums = nums.clone();
                    let mut picks = Vec::new();
                    for _ in 0..want.len() {
                        let Some(n) = crate::slots::pick_free(&nums, self.limit, rand::random())
                        else {
                            return Err(self.over(*count, want.len()));
                        };
                        nums.insert(n);
                        picks.push(n);
                    }
                    picks
                }
            };
            // Random picks may repeat: such a txn would put one slot twice.
            if picks.iter().collect::<HashSet<_>>().len() < picks.len() {
                known = Some(self.taken().await?);
                continue;
            }
            let mut compares = Vec::new();
            let mut puts = Vec::new();
            let mut reads = Vec::new();
            for (k, n) in want.iter().zip(&picks) {
                let (m, s) = (self.mirror_key(holder, k), self.slot_key(*n));
                compares.push(Compare::absent(m.clone()));
                compares.push(Compare::absent(s.clone()));
                if bound {
                    compares.push(present(self.ref_key(holder, k)));
                }
                let put = |key: Vec<u8>, value: Vec<u8>| match lease {
                    Some(l) => TxnOp::put_on_lease(key, value, l),
                    None => TxnOp::put(key, value),
                };
                puts.push(put(m.clone(), mirror_value(*n)));
                puts.push(put(s, slot_value(k, holder)));
                reads.push(TxnOp::get_key(m));
                if bound {
                    reads.push(TxnOp::get_key(self.ref_key(holder, k)));
                }
            }
            let txn = TxnRequest::new().when(compares).and_then(puts).or_else(reads);
            let r = match self.store.txn(txn).await {
                Ok(r) => r,
                Err(StoreError::LeaseNotFound(_)) => return Err(ApiError::session_not_found()),
                Err(e) => return Err(e.into()),
            };
            if r.succeeded {
                for (k, n) in want.iter().zip(&picks) {
                    taken.by_key.insert(k.to_string(), (self.mirror_key(holder, k), *n));
                }
                return Ok(());
            }
            // Keys whose mirror exists are counted already, and (after a bind) keys whose
            // reference is gone need nothing; the others try again with slots known free.
            let per = if bound { 2 } else { 1 };
            let counted: HashSet<usize> = (0..want.len())
                .filter(|i| {
                    found(r.responses.get(per * i))
                        || (bound && !found(r.responses.get(per * i + 1)))
                })
                .collect();
            let lost_slot = counted.len() < want.len();
            want = want
                .into_iter()
                .enumerate()
                .filter(|(i, _)| !counted.contains(i))
                .map(|x| x.1)
                .collect();
            if lost_slot {
                known = Some(self.taken().await?);
            }
        }
        Err(ApiError::unavailable(format!(
            "client {:?}, pool {:?}: {ATTEMPTS} attempts at free reference slots were each taken \
             by another acquire of the same client at once; retry",
            self.client, self.pool
        )))
    }

    fn over(&self, count: u64, adds: usize) -> ApiError {
        let limit = self.limit;
        crate::quota::quota_exceeded(format!(
            "client {:?} holds {count} references in pool {:?} and this request would add \
             {adds}: over its limit of {limit} (refs={limit} in the tokens file, counted in the \
             store for every instance together); release some first",
            self.client, self.pool
        ))
    }

    /// Gives back what an acquire took for the keys whose bind failed (`failed`; empty: every
    /// key), unless the reference exists (another acquire of the same key and holder, which
    /// found this mirror and so took nothing, bound it). Best effort: a slot left behind only
    /// makes the quota stricter, and `idalloc check --repair` frees it.
    pub async fn give_back(&self, holder: &str, taken: &Taken, failed: &[&str]) {
        let keys: Vec<&str> = if failed.is_empty() {
            taken.by_key.keys().map(String::as_str).collect()
        } else {
            failed.to_vec()
        };
        let frees: Vec<Free> = keys
            .iter()
            .filter_map(|k| {
                let (m, n) = taken.by_key.get(*k)?;
                Some(Free {
                    guard: Compare::value_is(m.clone(), mirror_value(*n)),
                    mirror: m.clone(),
                    slot: self.slot_key(*n),
                    reference: self.ref_key(holder, k),
                })
            })
            .collect();
        if let Err(e) = self.free(frees).await {
            tracing::warn!(pool = self.pool, error = %e, "giving back reference slots failed");
        }
    }

    /// After `holder` released `keys`: deletes their mirrors and the slots they name (one read
    /// and one txn per 64 keys). A mirror that changed in between, or whose reference exists
    /// again (bound by an acquire meanwhile), is left alone: it counts that reference.
    pub async fn release(&self, holder: &str, keys: &[&str]) -> Result<(), ApiError> {
        for chunk in keys.chunks(CHUNK) {
            let mirrors: Vec<Vec<u8>> = chunk.iter().map(|k| self.mirror_key(holder, k)).collect();
            let reads = mirrors.iter().map(|m| TxnOp::get_key(m.clone()));
            let got = self.store.txn(TxnRequest::new().and_then(reads)).await?;
            let mut frees = Vec::new();
            for ((k, m), op) in chunk.iter().zip(&mirrors).zip(&got.responses) {
                let OpResponse::Get(g) = op else { continue };
                let Some(kv) = g.kvs.first() else { continue };
                let Some(n) = parse_mirror_value(&kv.value) else { continue };
                frees.push(Free {
                    guard: Compare::mod_revision_is(m.clone(), kv.mod_revision),
                    mirror: m.clone(),
                    slot: self.slot_key(n),
                    reference: self.ref_key(holder, k),
                });
            }
            self.free(frees).await?;
        }
        Ok(())
    }

    /// Deletes each mirror and slot of `frees` whose guard holds and whose reference is absent:
    /// one txn for all, and one per record pair if that one found any condition false.
    async fn free(&self, frees: Vec<Free>) -> Result<(), StoreError> {
        let txn = |fs: &[Free]| {
            let compares =
                fs.iter().flat_map(|f| [f.guard.clone(), Compare::absent(f.reference.clone())]);
            let deletes = fs
                .iter()
                .flat_map(|f| [TxnOp::delete(f.mirror.clone()), TxnOp::delete(f.slot.clone())]);
            TxnRequest::new().when(compares).and_then(deletes)
        };
        for chunk in frees.chunks(CHUNK) {
            if self.store.txn(txn(chunk)).await?.succeeded || chunk.len() == 1 {
                continue;
            }
            for f in chunk {
                self.store.txn(txn(std::slice::from_ref(f))).await?;
            }
        }
        Ok(())
    }
}
