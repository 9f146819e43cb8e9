//! Helpers shared by the allocator tests: allocators with test settings, and raw views of the store
//! that check the guarantees independently of the allocator's own cache.
#![allow(dead_code)]

pub mod backends;

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use idalloc::layout::{IdRecord, Layout};
use idalloc::store::{list_all, GetRequest, KeyRange, Store, TxnOp, TxnRequest};
use idalloc::{Allocator, AllocatorOptions};
use idalloc_testkit::g1::read_pool;

pub const SESSION_TTL: Duration = Duration::from_secs(6);

pub fn layout() -> Layout {
    Layout::new("idalloc").expect("default prefix is valid")
}

fn seed_of(holder: &str) -> u64 {
    holder
        .bytes()
        .fold(0xcbf2_9ce4_8422_2325u64, |h, b| (h ^ u64::from(b)).wrapping_mul(0x100_0000_01b3))
}

pub fn allocator_with<S: Store>(
    store: Arc<S>,
    holder: &str,
    f: impl FnOnce(&mut AllocatorOptions),
) -> Allocator {
    let mut opts = AllocatorOptions::builder()
        .holder(holder.to_string())
        .session_ttl(SESSION_TTL)
        .seed(seed_of(holder))
        .build()
        .unwrap();
    f(&mut opts);
    Allocator::from_arc(store, opts).expect("allocator")
}

pub fn allocator<S: Store>(store: Arc<S>, holder: &str) -> Allocator {
    allocator_with(store, holder, |_| {})
}

/// Polls `cond` (yielding to background tasks; under paused time each poll advances the clock a
/// little) until it holds; fails the test after a minute of (virtual) time.
pub async fn wait_until(mut cond: impl FnMut() -> bool) {
    for _ in 0..6000 {
        if cond() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("condition not met within 60 s");
}

pub async fn wait_until_async<F, Fut>(mut cond: F)
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    for _ in 0..6000 {
        if cond().await {
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("condition not met within 60 s");
}

/// The key record of `key` in `pool`, read straight from the store, after checking that the ID
/// record it points at names the key back.
pub async fn raw_binding<S: Store + ?Sized>(store: &S, pool: &str, key: &str) -> Option<u64> {
    raw_binding_in(store, &layout(), pool, key).await
}

pub async fn raw_binding_in<S: Store + ?Sized>(
    store: &S,
    l: &Layout,
    pool: &str,
    key: &str,
) -> Option<u64> {
    let resp = store.get(GetRequest::key(l.key_key(pool, key))).await.expect("read key record");
    let kv = resp.kvs.first()?;
    let id: u64 = std::str::from_utf8(&kv.value).expect("utf8").parse().expect("decimal id");
    let idr = store.get(GetRequest::key(l.id_key(pool, id))).await.expect("read id record");
    let rec = idr.kvs.first().and_then(|kv| IdRecord::decode(&kv.value));
    assert_eq!(rec, Some(IdRecord::Bound(key.to_string())), "id record of {id} names {key}");
    Some(id)
}

/// Every bound ID record of `pool`, sorted by ID.
pub async fn raw_bindings<S: Store + ?Sized>(store: &S, pool: &str) -> Vec<(u64, String)> {
    raw_bindings_in(store, &layout(), pool).await
}

pub async fn raw_bindings_in<S: Store + ?Sized>(
    store: &S,
    l: &Layout,
    pool: &str,
) -> Vec<(u64, String)> {
    let snap = read_pool(store, l, pool).await.expect("read the pool's records");
    snap.bound().map(|(id, k)| (id, k.to_string())).collect()
}

/// G1 on the raw store: ID records and key records form a bijection (the testkit's one checker).
pub async fn check_g1<S: Store + ?Sized>(store: &S, pool: &str) {
    check_g1_in(store, &layout(), pool).await
}

pub async fn check_g1_in<S: Store + ?Sized>(store: &S, l: &Layout, pool: &str) {
    idalloc_testkit::g1::assert_g1(store, l, pool).await
}

pub async fn count_refs<S: Store + ?Sized>(store: &S, pool: &str) -> usize {
    count_refs_in(store, &layout(), pool).await
}

pub async fn count_refs_in<S: Store + ?Sized>(store: &S, l: &Layout, pool: &str) -> usize {
    let snap = read_pool(store, l, pool).await.expect("read the pool's records");
    snap.refs.values().map(|holders| holders.len()).sum()
}

/// A durable holder's fence record (`P/data/<pool>/holder/<h>`) or a pool's fence floor
/// (`P/data/<pool>/fence`): G4 as amended in docs/design/fences.md lets these stay (at most the
/// fold threshold's fence records per pool after a sweep, and one floor; gone with the pool).
pub fn is_holder_fence(l: &Layout, record: &[u8]) -> bool {
    let data = format!("{}/data/", l.prefix());
    let Some(rest) = record.strip_prefix(data.as_bytes()) else { return false };
    let Some(slash) = rest.iter().position(|b| *b == b'/') else { return false };
    let pool = String::from_utf8_lossy(&rest[..slash]).into_owned();
    l.parse_holder_key(&pool, record).is_some() || record == l.fence_floor_key(&pool).as_slice()
}

/// Moves the cluster version at `l`'s prefix to this build's with no grace, which puts the fold
/// of fence records in force at once (tests of the fold).
pub async fn finalize<S: Store>(store: &S, l: &Layout) {
    idalloc::cluster_version::finalize(store, l, std::time::Duration::ZERO)
        .await
        .expect("finalize");
}

/// G4: nothing but pool specs (and durable holders' fence records, and the cluster version)
/// under the prefix.
pub async fn assert_only_specs_left<S: Store + ?Sized>(store: &S) {
    assert_only_specs_left_in(store, &layout()).await
}

pub async fn assert_only_specs_left_in<S: Store + ?Sized>(store: &S, l: &Layout) {
    let (kvs, _) =
        list_all(store, &KeyRange::prefix(format!("{}/", l.prefix())), 500).await.expect("list");
    let pools = l.pools_prefix();
    let extra: Vec<String> = kvs
        .iter()
        .filter(|kv| {
            !kv.key.starts_with(&pools)
                && !is_holder_fence(l, &kv.key)
                && kv.key != l.cluster_version_key()
        })
        .map(|kv| String::from_utf8_lossy(&kv.key).into_owned())
        .collect();
    assert!(extra.is_empty(), "left in the store: {extra:?}");
}

/// Deletes a binding's key and ID records behind the allocators' backs (store data loss).
pub async fn raw_delete_binding<S: Store + ?Sized>(store: &S, pool: &str, key: &str, id: u64) {
    raw_delete_binding_in(store, &layout(), pool, key, id).await
}

pub async fn raw_delete_binding_in<S: Store + ?Sized>(
    store: &S,
    l: &Layout,
    pool: &str,
    key: &str,
    id: u64,
) {
    store
        .txn(
            TxnRequest::new()
                .and_then([TxnOp::delete(l.key_key(pool, key)), TxnOp::delete(l.id_key(pool, id))]),
        )
        .await
        .expect("raw delete");
}
