//! Session quota slots: the `sessions=N` quota as records in the store, so that it holds for every
//! instance of the service at once, across restarts, adoption and TTL rounding.
//!
//! A client with `sessions=N` owns the slot names `P/sessions/quota/<client>/<n>` for `n` in
//! `0..N`. A session takes one slot before it is handed out (or before it is adopted by an
//! instance that does not know it): a put on the session's own lease, guarded by
//! `create_revision == 0`, whose value is the lease in hex. The slot therefore lives exactly as
//! long as the store keeps the lease: from the open until etcd removes the lease (after an end,
//! or after the lease's TTL as etcd rounds it), whatever any instance believes about the
//! session's age, and whichever instance opened or renewed it. Two opens that pick the same free
//! slot cannot both succeed (the compare), so no sequence of opens and adoptions, sequential or
//! concurrent, through any mix of instances, puts more than N of the client's slot records in
//! the store, and a session without a slot is never handed out.
//!
//! The store work of a check is one read of the client's slot records (at most N small records,
//! bounded by the quota, not by anything that grows) and one txn.

use std::collections::HashSet;

use idalloc::layout::Layout;
use idalloc::store::{
    Compare, GetRequest, KeyRange, LeaseId, Store, StoreError, TxnOp, TxnRequest,
};

use crate::error::ApiError;

/// Attempts at a free slot before an open gives up as contended (each lost attempt means another
/// open of the same client took the slot in between).
const ATTEMPTS: usize = 16;

/// `P/sessions/quota/<client>/`: the session slots of `client`.
pub fn session_slots_prefix(layout: &Layout, client: &str) -> Vec<u8> {
    let mut p = layout.sessions_prefix();
    p.extend_from_slice(format!("quota/{client}/").as_bytes());
    p
}

/// The value of a slot: the lease it is on, 16 hex digits (as in the session's record name).
fn lease_value(lease: LeaseId) -> Vec<u8> {
    format!("{lease:016x}").into_bytes()
}

/// The lease a slot's value names.
fn parse_lease(value: &[u8]) -> Option<LeaseId> {
    let s = std::str::from_utf8(value).ok()?;
    (s.len() == 16).then(|| u64::from_str_radix(s, 16).ok().map(|l| l as i64))?
}

/// A free slot number below `limit` not in `taken`, chosen at random (so concurrent opens rarely
/// pick the same one); `None` if every one is taken. Pure.
pub fn pick_free(taken: &HashSet<u64>, limit: u64, r: u64) -> Option<u64> {
    let free = limit.saturating_sub(taken.iter().filter(|n| **n < limit).count() as u64);
    if free == 0 {
        return None;
    }
    // The (r mod k)-th free number, among the first k free ones (k bounded by the slots taken,
    // so the search stays short whatever the limit).
    let mut skip = r % free.min(taken.len() as u64 + 16);
    (0..limit).find(|n| {
        if taken.contains(n) {
            return false;
        }
        if skip == 0 {
            return true;
        }
        skip -= 1;
        false
    })
}

/// The client's live sessions in the store: the leases its slots are on.
pub async fn session_leases(
    store: &dyn Store,
    layout: &Layout,
    client: &str,
) -> Result<Vec<LeaseId>, ApiError> {
    let prefix = session_slots_prefix(layout, client);
    let got = store.get(GetRequest::new(KeyRange::prefix(prefix))).await?;
    Ok(got.kvs.iter().filter_map(|kv| parse_lease(&kv.value)).collect())
}

/// 429 `quota_exceeded` for a client at its session limit.
fn over(client: &str, open: u64, limit: u64) -> ApiError {
    crate::quota::quota_exceeded(format!(
        "client {client:?} has {open} sessions open in the store: its limit is {limit} \
         (sessions={limit} in the tokens file, for every instance together); end one or wait \
         until the store has expired one"
    ))
}

/// Refuses a new session of `client` if its slots are all taken now (checked before a lease is
/// granted, so that a refused open costs the store no lease). The open still takes a slot
/// ([`claim`]) after the grant; this only spares the lease.
pub async fn precheck(
    store: &dyn Store,
    layout: &Layout,
    client: &str,
    limit: u64,
) -> Result<(), ApiError> {
    let prefix = session_slots_prefix(layout, client);
    let got = store.get(GetRequest::new(KeyRange::prefix(prefix)).count_only()).await?;
    let open = u64::try_from(got.count).unwrap_or(0);
    if open >= limit {
        return Err(over(client, open, limit));
    }
    Ok(())
}

/// Makes sure the session on `lease` holds one of `client`'s `limit` slots: `Ok` if it has one
/// already (an adopted session) or took a free one; 429 `quota_exceeded` if all are taken by
/// other sessions; `session_not_found` if the lease is gone.
pub async fn claim(
    store: &dyn Store,
    layout: &Layout,
    client: &str,
    limit: u64,
    lease: LeaseId,
) -> Result<(), ApiError> {
    let prefix = session_slots_prefix(layout, client);
    for _ in 0..ATTEMPTS {
        let got = store.get(GetRequest::new(KeyRange::prefix(prefix.clone()))).await?;
        if got.kvs.iter().any(|kv| parse_lease(&kv.value) == Some(lease)) {
            return Ok(());
        }
        // Slots are counted by record, so slots above a lowered limit still count.
        let open = got.kvs.len() as u64;
        if open >= limit {
            return Err(over(client, open, limit));
        }
        let taken: HashSet<u64> = got
            .kvs
            .iter()
            .filter_map(|kv| kv.key.strip_prefix(prefix.as_slice()))
            .filter_map(|n| std::str::from_utf8(n).ok()?.parse().ok())
            .collect();
        let Some(slot) = pick_free(&taken, limit, rand::random()) else {
            return Err(over(client, open, limit));
        };
        let mut key = prefix.clone();
        key.extend_from_slice(slot.to_string().as_bytes());
        let txn = TxnRequest::new()
            .when([Compare::absent(key.clone())])
            .and_then([TxnOp::put_on_lease(key, lease_value(lease), lease)]);
        match store.txn(txn).await {
            Ok(r) if r.succeeded => return Ok(()),
            Ok(_) => continue,
            Err(StoreError::LeaseNotFound(_)) => return Err(ApiError::session_not_found()),
            Err(e) => return Err(e.into()),
        }
    }
    Err(ApiError::unavailable(format!(
        "client {client:?}: {ATTEMPTS} attempts at a free session slot were each taken by \
         another open of the same client at once; retry"
    )))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn picks_only_free_slots_below_the_limit() {
        let taken: HashSet<u64> = [0, 2, 7].into_iter().collect();
        for r in 0..20 {
            let s = pick_free(&taken, 4, r).expect("two are free");
            assert!(s == 1 || s == 3, "{s}");
        }
        // Slots above a lowered limit do not make room below it.
        assert_eq!(pick_free(&taken, 3, 5), Some(1));
        assert_eq!(pick_free(&[0, 1].into_iter().collect(), 2, 9), None);
        assert_eq!(pick_free(&HashSet::new(), 1, 123), Some(0));
    }

    #[test]
    fn slot_values_name_their_lease() {
        for lease in [1, 0x694d_8a3b_1f2c_0a01, -2] {
            assert_eq!(parse_lease(&lease_value(lease)), Some(lease));
        }
        assert_eq!(parse_lease(b"xyz"), None);
        let l = Layout::new("p").expect("layout");
        assert_eq!(session_slots_prefix(&l, "a"), b"p/sessions/quota/a/".to_vec());
    }
}
