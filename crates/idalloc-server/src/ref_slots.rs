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
//! - **After a failed bind** the records taken for it are deleted again; **after a release**
//!   the mirror and its slot are deleted (one read, one txn).
//! - Under the pool's data prefix, so deleting the pool deletes them.
//!
//! So the slots taken are at least the client's counted references, and never more than N are in
//! the store: no sequence of requests through any mix of instances leaves a client with more
//! than N counted references in a pool. What can differ, always on the safe side (fewer
//! references than slots), is a slot whose bind never happened or whose release was not followed
//! by its delete (the instance died in between): `idalloc check` counts such records. A
//! reference made before the client had `refs=` holds no slot until it is acquired again.
//!
//! The store work of one acquire is one txn (and one read of the client's slot names when its
//! random pick was taken), per up to 64 keys, whatever the pool's size.

use std::collections::{HashMap, HashSet};

use idalloc::layout::{enc, Layout};
use idalloc::store::{
    Compare, GetRequest, KeyRange, LeaseId, OpResponse, Store, StoreError, TxnOp, TxnRequest,
    MAX_TXN_OPS,
};

use crate::error::ApiError;

/// Keys per txn: two compares and two puts each.
const CHUNK: usize = MAX_TXN_OPS / 2;

/// Attempts per chunk before an acquire gives up as contended.
const ATTEMPTS: usize = 16;

/// Where one client's slots and mirrors of one pool live.
pub struct RefSlots<'a> {
    store: &'a dyn Store,
    client: &'a str,
    pool: &'a str,
    limit: u64,
    /// `P/data/<pool>/quota/<client>/`.
    base: Vec<u8>,
}

/// The records an acquire took: (mirror, slot) per key, to give back if the bind fails.
#[derive(Default, Debug)]
pub struct Taken {
    by_key: HashMap<String, (Vec<u8>, Vec<u8>)>,
}

impl<'a> RefSlots<'a> {
    pub fn new(
        store: &'a dyn Store,
        layout: &Layout,
        client: &'a str,
        pool: &'a str,
        limit: u64,
    ) -> Self {
        let mut base = layout.quota_prefix(pool);
        base.extend_from_slice(format!("{client}/").as_bytes());
        RefSlots { store, client, pool, limit, base }
    }

    fn slots_prefix(&self) -> Vec<u8> {
        let mut p = self.base.clone();
        p.extend_from_slice(b"slot/");
        p
    }

    fn slot_key(&self, n: u64) -> Vec<u8> {
        let mut p = self.slots_prefix();
        p.extend_from_slice(n.to_string().as_bytes());
        p
    }

    fn mirror_key(&self, holder: &str, key: &str) -> Vec<u8> {
        let mut p = self.base.clone();
        p.extend_from_slice(format!("ref/{}/{}", enc(holder), enc(key)).as_bytes());
        p
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
            if let Err(e) = self.acquire_chunk(holder, lease, chunk, &mut taken).await {
                self.give_back(&taken, &[]).await;
                return Err(e);
            }
        }
        Ok(taken)
    }

    async fn acquire_chunk(
        &self,
        holder: &str,
        lease: Option<LeaseId>,
        keys: &[&String],
        taken: &mut Taken,
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
                let put = |key: Vec<u8>, value: Vec<u8>| match lease {
                    Some(l) => TxnOp::put_on_lease(key, value, l),
                    None => TxnOp::put(key, value),
                };
                puts.push(put(m.clone(), n.to_string().into_bytes()));
                puts.push(put(s, format!("{}/{}", enc(k), enc(holder)).into_bytes()));
                reads.push(TxnOp::get_key(m));
            }
            let txn = TxnRequest::new().when(compares).and_then(puts).or_else(reads);
            let r = match self.store.txn(txn).await {
                Ok(r) => r,
                Err(StoreError::LeaseNotFound(_)) => return Err(ApiError::session_not_found()),
                Err(e) => return Err(e.into()),
            };
            if r.succeeded {
                for (k, n) in want.iter().zip(&picks) {
                    let pair = (self.mirror_key(holder, k), self.slot_key(*n));
                    taken.by_key.insert(k.to_string(), pair);
                }
                return Ok(());
            }
            // Keys whose mirror exists are counted already; the others try again with slots
            // known free.
            let counted: HashSet<usize> = r
                .responses
                .iter()
                .enumerate()
                .filter(|(_, op)| matches!(op, OpResponse::Get(g) if !g.kvs.is_empty()))
                .map(|(i, _)| i)
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
    /// key). Best effort: a slot left behind only makes the quota stricter, and `idalloc check`
    /// counts it.
    pub async fn give_back(&self, taken: &Taken, failed: &[&str]) {
        let pairs: Vec<&(Vec<u8>, Vec<u8>)> = if failed.is_empty() {
            taken.by_key.values().collect()
        } else {
            failed.iter().filter_map(|k| taken.by_key.get(*k)).collect()
        };
        for chunk in pairs.chunks(CHUNK) {
            let ops = chunk
                .iter()
                .flat_map(|(m, s)| [TxnOp::delete(m.clone()), TxnOp::delete(s.clone())]);
            if let Err(e) = self.store.txn(TxnRequest::new().and_then(ops)).await {
                tracing::warn!(pool = self.pool, error = %e, "giving back reference slots failed");
            }
        }
    }

    /// After `holder` released `keys`: deletes their mirrors and the slots they name (one read
    /// and one txn per 64 keys). A mirror that changed in between is left alone.
    pub async fn release(&self, holder: &str, keys: &[&str]) -> Result<(), ApiError> {
        for chunk in keys.chunks(CHUNK) {
            let mirrors: Vec<Vec<u8>> = chunk.iter().map(|k| self.mirror_key(holder, k)).collect();
            let reads = mirrors.iter().map(|m| TxnOp::get_key(m.clone()));
            let got = self.store.txn(TxnRequest::new().and_then(reads)).await?;
            let mut compares = Vec::new();
            let mut deletes = Vec::new();
            for (m, op) in mirrors.iter().zip(&got.responses) {
                let OpResponse::Get(g) = op else { continue };
                let Some(kv) = g.kvs.first() else { continue };
                let Some(n) = std::str::from_utf8(&kv.value).ok().and_then(|v| v.parse().ok())
                else {
                    continue;
                };
                compares.push(Compare::mod_revision_is(m.clone(), kv.mod_revision));
                deletes.push(TxnOp::delete(m.clone()));
                deletes.push(TxnOp::delete(self.slot_key(n)));
            }
            if !deletes.is_empty() {
                self.store.txn(TxnRequest::new().when(compares).and_then(deletes)).await?;
            }
        }
        Ok(())
    }
}
