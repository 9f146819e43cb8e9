//! The store probe of `/readyz`: can this service read AND write its prefix?
//!
//! Reading alone is not enough: a service connected as an etcd user with a read-only role answers
//! every read, so it looked ready, and then every acquire failed with `access_denied`. The probe
//! is one txn that writes nothing yet needs write permission: its guard (`create_revision < 0` on
//! the probe key) can never hold, so its `then` branch (a put of the probe key) never runs, but
//! etcd checks the permissions of every operation of both branches before it evaluates the guard
//! (`checkTxnReqsPermission` over `success` and `failure`), so a user without write access on the
//! prefix is refused. The `else` branch counts the pool specs: the read half of the probe, and
//! the revision the answer reports. One round trip, no revision spent, nothing to clean up.

use idalloc::layout::Layout;
use idalloc::store::{
    Compare, CompareOp, CompareTarget, GetRequest, KeyRange, OpResponse, Store, StoreError, TxnOp,
    TxnRequest,
};

/// The key the probe would write (it never does): under the service's prefix, outside the
/// `pools/` and `data/` records, so nothing that reads them ever sees it.
pub fn probe_key(layout: &Layout) -> Vec<u8> {
    format!("{}/readyz-probe", layout.prefix()).into_bytes()
}

/// The probe's txn: a guard that never holds, a put it therefore never runs, and a count of the
/// pool specs in its place.
pub fn probe_txn(layout: &Layout) -> TxnRequest {
    let key = probe_key(layout);
    TxnRequest::new()
        .when([Compare::new(
            KeyRange::key(key.clone()),
            CompareOp::Less,
            CompareTarget::CreateRevision(0),
        )])
        .and_then([TxnOp::put(key, b"never written".to_vec())])
        .or_else([TxnOp::get(
            GetRequest::new(KeyRange::prefix(layout.pools_prefix())).count_only(),
        )])
}

/// What the probe found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Probe {
    /// Read and write are allowed; the store's revision.
    Ready { revision: i64 },
    /// The store refused (credentials or permissions): why, for an operator.
    Denied(String),
    /// The store did not answer properly.
    Unavailable(String),
}

/// Runs the probe against `store`.
pub async fn probe(store: &dyn Store, layout: &Layout) -> Probe {
    match store.txn(probe_txn(layout)).await {
        Ok(r) if r.succeeded => Probe::Unavailable(
            "the store ran the readiness probe's write, whose guard can never hold: it is not \
             etcd-compatible"
                .to_string(),
        ),
        Ok(r) => match r.responses.first() {
            Some(OpResponse::Get(_)) => Probe::Ready { revision: r.revision },
            _ => Probe::Unavailable("the store's answer to the readiness probe has no read".into()),
        },
        Err(e @ StoreError::Access { .. }) => Probe::Denied(format!(
            "the store refuses this service's reads or writes under {:?} ({e}): its etcd user \
             needs a role with readwrite on the prefix (etcdctl role grant-permission ROLE \
             readwrite {}/ --prefix)",
            layout.prefix(),
            layout.prefix()
        )),
        Err(e) => Probe::Unavailable(format!("store: {e}")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use idalloc::store::embedded::EmbeddedStore;

    #[tokio::test]
    async fn the_probe_writes_nothing_and_spends_no_revision() {
        let store = EmbeddedStore::memory();
        let layout = Layout::new("p").expect("layout");
        let before = store.get(GetRequest::prefix(b"".to_vec())).await.expect("get").revision;
        assert_eq!(probe(&store, &layout).await, Probe::Ready { revision: before });
        let after = store.get(GetRequest::prefix(b"".to_vec())).await.expect("get");
        assert_eq!(after.revision, before);
        assert!(after.kvs.is_empty(), "{:?}", after.kvs);
    }
}
