//! Pool quota slots: the `pools=N` quota (pools a client may create) as records in the store, so
//! that it holds for every instance of the service at once, and a pool delete gives the slot back.
//!
//! A client with `pools=N` owns the slot names `P/sessions/quota-pools/<client>/<n>` for `n` in
//! `0..N`; a slot's value is the name of the pool it counts. The pool it counts holds a creator
//! record, `P/data/<pool>/quota/~creator` (`~` is no client name's character), whose value is
//! `<client>/<n>`: the slot that counts it.
//!
//! - **Before the create** the service puts the slot and the creator record in one txn guarded by
//!   both being absent and the pool's spec being absent: two creates cannot take one slot, a pool
//!   is counted once (for the client that created it), and a pool that exists already (a
//!   repeated, idempotent create) takes nothing.
//! - **A delete** of the pool removes its creator record with the pool's records (one txn,
//!   `Allocator::delete_pool`), then the service deletes the slot, guarded by its value still
//!   naming the pool and the creator record being absent.
//! - **A slot whose creator record does not name it** counts no pool: the pool was deleted (by an
//!   instance that died before freeing the slot, or by `idalloc pool delete` on the store). A
//!   client at its limit frees such slots before it is refused ([`orphaned`], pure), so no slot
//!   outlives its pool for long; `idalloc check --repair` frees them too. A slot whose creator
//!   record names it but whose pool was never created (an instance died in between) counts
//!   until the client creates that pool again or the pool's records are deleted (`idalloc check`
//!   reports them as data without a spec, and leaves them: a create may be in flight): always
//!   on the safe side (stricter).
//!
//! The store work is one read of the client's slots (at most N small records) and one txn per
//! create; a client at its limit reads the creator records of its slots (at most N) once.

use std::collections::HashSet;

use idalloc::layout::Layout;
use idalloc::store::{
    Compare, GetRequest, KeyRange, KeyValue, OpResponse, Store, StoreError, TxnOp, TxnRequest,
    MAX_TXN_OPS,
};

use crate::error::ApiError;

/// Attempts at a free slot before a create gives up as contended.
const ATTEMPTS: usize = 16;

/// `P/sessions/quota-pools/<client>/`: the pool slots of `client`.
pub fn pool_slots_prefix(layout: &Layout, client: &str) -> Vec<u8> {
    layout.pool_slots_prefix(client)
}

/// `P/data/<pool>/quota/~creator`: which client's slot counts `pool`.
pub fn creator_key(layout: &Layout, pool: &str) -> Vec<u8> {
    layout.quota_creator_key(pool)
}

/// The value of a creator record: `<client>/<n>`.
pub fn creator_value(client: &str, slot: u64) -> Vec<u8> {
    idalloc::quota_names::creator_value(client, slot)
}

/// One of a client's slot records, as read: its number and the pool its value names.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Slot {
    pub n: u64,
    pub pool: String,
}

/// The slots of `client` among `slots` whose pool's creator record (`creators[i]`, the value
/// read for `slots[i]`'s pool, `None` if absent) does not name them: they count no pool and may
/// be freed. Pure.
pub fn orphaned<'a>(
    client: &str,
    slots: &'a [Slot],
    creators: &[Option<Vec<u8>>],
) -> Vec<&'a Slot> {
    slots
        .iter()
        .zip(creators)
        .filter(|(s, c)| c.as_deref() != Some(creator_value(client, s.n).as_slice()))
        .map(|(s, _)| s)
        .collect()
}

/// What a create took: the records to give back if the create fails.
#[derive(Debug)]
pub struct Claimed {
    slot: Vec<u8>,
    creator: Vec<u8>,
    value: Vec<u8>,
    /// The pool's spec key: the slot is given back only while it is absent.
    spec: Vec<u8>,
}

fn parse_slots(prefix: &[u8], kvs: &[KeyValue]) -> Vec<(Slot, i64)> {
    kvs.iter()
        .filter_map(|kv| {
            let n = std::str::from_utf8(kv.key.strip_prefix(prefix)?).ok()?.parse().ok()?;
            let pool = String::from_utf8(kv.value.clone()).ok()?;
            Some((Slot { n, pool }, kv.mod_revision))
        })
        .collect()
}

/// What [`claim`] decided.
#[derive(Debug)]
pub enum Claim {
    /// Nothing to count: the pool exists, or its creator record is there (a repeated create).
    Nothing,
    /// A slot taken for the pool.
    Took(Claimed),
    /// Refused: `count` slots count pools that exist, the limit is `limit`.
    Over { count: u64, limit: u64, pools: Vec<Slot> },
}

/// 429 `quota_exceeded` for `client` at its pool limit, naming the numbers.
pub fn over(client: &str, count: u64, limit: u64, pools: &[Slot]) -> ApiError {
    let mut names: Vec<&str> = pools.iter().map(|s| s.pool.as_str()).collect();
    names.sort_unstable();
    crate::quota::quota_exceeded(format!(
        "client {client:?} has created {count} pools that exist in the store ({}): its limit is \
         {limit} (pools={limit} in the tokens file, for every instance together); delete one \
         first",
        names.join(", ")
    ))
}

/// Makes sure that creating `pool` counts against `client`'s `limit`: [`Claim::Nothing`] if
/// nothing needs counting, [`Claim::Took`] the slot taken for it (give it back with
/// [`give_back`] if the create fails), [`Claim::Over`] if all `limit` slots count pools that
/// exist.
pub async fn claim(
    store: &dyn Store,
    layout: &Layout,
    client: &str,
    limit: u64,
    pool: &str,
) -> Result<Claim, ApiError> {
    let prefix = pool_slots_prefix(layout, client);
    let spec = layout.pool_spec_key(pool);
    let creator = creator_key(layout, pool);
    for _ in 0..ATTEMPTS {
        let reads = [
            TxnOp::get_key(spec.clone()),
            TxnOp::get_key(creator.clone()),
            TxnOp::get(GetRequest::new(KeyRange::prefix(prefix.clone()))),
        ];
        let got = store.txn(TxnRequest::new().and_then(reads)).await?;
        let kvs = |i: usize| match got.responses.get(i) {
            Some(OpResponse::Get(g)) => g.kvs.clone(),
            _ => Vec::new(),
        };
        if !kvs(0).is_empty() || !kvs(1).is_empty() {
            return Ok(Claim::Nothing);
        }
        let slots = parse_slots(&prefix, &kvs(2));
        // Every record counts, also any above a lowered limit.
        let count = kvs(2).len() as u64;
        if count >= limit {
            if free_orphans(store, layout, client, &prefix, &slots).await? > 0 {
                continue;
            }
            let pools = slots.into_iter().map(|(s, _)| s).collect();
            return Ok(Claim::Over { count, limit, pools });
        }
        let taken: HashSet<u64> = slots.iter().map(|(s, _)| s.n).collect();
        let Some(n) = crate::slots::pick_free(&taken, limit, rand::random()) else {
            let pools = slots.into_iter().map(|(s, _)| s).collect();
            return Ok(Claim::Over { count, limit, pools });
        };
        let mut slot = prefix.clone();
        slot.extend_from_slice(n.to_string().as_bytes());
        let value = creator_value(client, n);
        let txn = TxnRequest::new()
            .when([
                Compare::absent(slot.clone()),
                Compare::absent(creator.clone()),
                Compare::absent(spec.clone()),
            ])
            .and_then([
                TxnOp::put(slot.clone(), pool.as_bytes().to_vec()),
                TxnOp::put(creator.clone(), value.clone()),
            ]);
        if store.txn(txn).await?.succeeded {
            return Ok(Claim::Took(Claimed { slot, creator, value, spec }));
        }
    }
    Err(ApiError::unavailable(format!(
        "client {client:?}: {ATTEMPTS} attempts at a free pool slot were each taken by another \
         create at once; retry"
    )))
}

/// Deletes the slots among `slots` that count no pool ([`orphaned`]); returns how many.
async fn free_orphans(
    store: &dyn Store,
    layout: &Layout,
    client: &str,
    prefix: &[u8],
    slots: &[(Slot, i64)],
) -> Result<usize, ApiError> {
    // Only when the client is at its limit: at most N reads of one record each.
    let mut freed = 0;
    for chunk in slots.chunks(MAX_TXN_OPS) {
        let reads = chunk.iter().map(|(s, _)| TxnOp::get_key(creator_key(layout, &s.pool)));
        let got = store.txn(TxnRequest::new().and_then(reads)).await?;
        let creators: Vec<Option<Vec<u8>>> = got
            .responses
            .iter()
            .map(|op| match op {
                OpResponse::Get(g) => g.kvs.first().map(|kv| kv.value.clone()),
                _ => None,
            })
            .collect();
        let plain: Vec<Slot> = chunk.iter().map(|(s, _)| s.clone()).collect();
        for s in orphaned(client, &plain, &creators) {
            let rev = chunk.iter().find(|(c, _)| c.n == s.n).map_or(0, |(_, r)| *r);
            freed += free_one(store, layout, client, prefix, s, rev).await? as usize;
        }
    }
    Ok(freed)
}

/// Deletes orphaned slot `s` (read at mod revision `rev`) if it is unchanged and its pool's
/// creator record still does not name it.
async fn free_one(
    store: &dyn Store,
    layout: &Layout,
    client: &str,
    prefix: &[u8],
    s: &Slot,
    rev: i64,
) -> Result<bool, ApiError> {
    let mut key = prefix.to_vec();
    key.extend_from_slice(s.n.to_string().as_bytes());
    let creator = creator_key(layout, &s.pool);
    // The creator record is absent, or names another slot: read it again in the txn's compare
    // by pinning its state (absent, or its current mod revision).
    let now = store.get(GetRequest::key(creator.clone())).await?;
    let pin = match now.kvs.first() {
        None => Compare::absent(creator),
        Some(kv) if kv.value != creator_value(client, s.n) => {
            Compare::mod_revision_is(creator, kv.mod_revision)
        }
        Some(_) => return Ok(false),
    };
    let txn = TxnRequest::new()
        .when([Compare::mod_revision_is(key.clone(), rev), pin])
        .and_then([TxnOp::delete(key)]);
    Ok(store.txn(txn).await?.succeeded)
}

/// Gives back what [`claim`] took, after a create that definitely failed, but only while the
/// pool's spec is absent: if another create (seeing the creator record, so taking nothing) made
/// the pool meanwhile, this slot is the one that counts it and stays. Best effort: a slot left
/// behind only makes the quota stricter, and the client's next create of that pool reuses it.
pub async fn give_back(store: &dyn Store, claimed: &Claimed) {
    let txn = TxnRequest::new()
        .when([
            Compare::value_is(claimed.creator.clone(), claimed.value.clone()),
            Compare::absent(claimed.spec.clone()),
        ])
        .and_then([TxnOp::delete(claimed.creator.clone()), TxnOp::delete(claimed.slot.clone())]);
    if let Err(e) = store.txn(txn).await {
        tracing::warn!(error = %e, "giving back a pool slot failed");
    }
}

/// The key of the slot that counts `pool` (read before the pool is deleted), if any.
pub async fn counted_by(
    store: &dyn Store,
    layout: &Layout,
    pool: &str,
) -> Result<Option<Vec<u8>>, StoreError> {
    let got = store.get(GetRequest::key(creator_key(layout, pool))).await?;
    let Some(kv) = got.kvs.first() else { return Ok(None) };
    let Some((client, n)) = std::str::from_utf8(&kv.value).ok().and_then(|v| v.rsplit_once('/'))
    else {
        return Ok(None);
    };
    let mut key = pool_slots_prefix(layout, client);
    key.extend_from_slice(n.as_bytes());
    Ok(Some(key))
}

/// After `pool` was deleted: frees `slot` (from [`counted_by`]) if it still names the pool and
/// the pool has no creator record again (not re-created since). Best effort: a slot left behind
/// is freed when its client reaches its limit.
pub async fn release(store: &dyn Store, layout: &Layout, pool: &str, slot: Vec<u8>) {
    let txn = TxnRequest::new()
        .when([
            Compare::value_is(slot.clone(), pool.as_bytes().to_vec()),
            Compare::absent(creator_key(layout, pool)),
        ])
        .and_then([TxnOp::delete(slot)]);
    if let Err(e) = store.txn(txn).await {
        tracing::warn!(pool, error = %e, "freeing a pool slot failed");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A create that lost to another client's create of the same pool (its `ensure_pool` failed
    /// because the spec now exists, with another range) must not give back the slot: the
    /// creator record names it, and the pool that exists is counted by nobody else.
    #[tokio::test]
    async fn a_failed_create_keeps_its_slot_when_the_pool_exists_meanwhile() {
        let store = idalloc::store::embedded::EmbeddedStore::memory();
        let l = Layout::new("p").expect("layout");
        let Claim::Took(c) = claim(&store, &l, "t1", 1, "x").await.expect("claim") else {
            panic!("the first create of x takes a slot");
        };
        // Another create makes the pool meanwhile.
        let spec = l.pool_spec_key("x");
        store
            .txn(TxnRequest::new().and_then([TxnOp::put(spec, b"spec".to_vec())]))
            .await
            .expect("put spec");
        give_back(&store, &c).await;
        let slot = store.get(GetRequest::key(c.slot.clone())).await.expect("get slot");
        assert_eq!(slot.kvs.len(), 1, "the slot still counts x");
        let creator = store.get(GetRequest::key(c.creator.clone())).await.expect("get creator");
        assert_eq!(creator.kvs.first().map(|kv| kv.value.clone()), Some(c.value.clone()));
        // At pools=1 the client can create no other pool.
        assert!(matches!(
            claim(&store, &l, "t1", 1, "y").await.expect("claim y"),
            Claim::Over { count: 1, limit: 1, .. }
        ));
    }

    /// Before the pool exists, giving back frees the slot and the creator record.
    #[tokio::test]
    async fn a_failed_create_gives_its_slot_back_while_the_pool_is_absent() {
        let store = idalloc::store::embedded::EmbeddedStore::memory();
        let l = Layout::new("p").expect("layout");
        let Claim::Took(c) = claim(&store, &l, "t1", 1, "x").await.expect("claim") else {
            panic!("the first create of x takes a slot");
        };
        give_back(&store, &c).await;
        assert!(store.get(GetRequest::key(c.slot.clone())).await.expect("get").kvs.is_empty());
        assert!(store.get(GetRequest::key(c.creator.clone())).await.expect("get").kvs.is_empty());
    }

    #[test]
    fn a_slot_counts_a_pool_only_while_the_pools_creator_record_names_it() {
        let slots = vec![
            Slot { n: 0, pool: "a".into() },
            Slot { n: 1, pool: "b".into() },
            Slot { n: 2, pool: "c".into() },
            Slot { n: 3, pool: "d".into() },
        ];
        let creators = vec![
            Some(b"t1/0".to_vec()), // counts a
            None,                   // b deleted
            Some(b"t1/7".to_vec()), // c re-created with another slot
            Some(b"t2/3".to_vec()), // d re-created by another client
        ];
        let free: Vec<u64> = orphaned("t1", &slots, &creators).iter().map(|s| s.n).collect();
        assert_eq!(free, vec![1, 2, 3]);
        let l = Layout::new("p").expect("layout");
        assert_eq!(pool_slots_prefix(&l, "t1"), b"p/sessions/quota-pools/t1/".to_vec());
        assert_eq!(creator_key(&l, "a"), b"p/data/a/quota/~creator".to_vec());
        // The session slots' prefix does not cover the pool slots.
        assert!(
            !pool_slots_prefix(&l, "t1").starts_with(&crate::slots::session_slots_prefix(&l, "t1"))
        );
    }
}
