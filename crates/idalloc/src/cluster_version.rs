//! The cluster version: which protocol features are in force under one store prefix (DESIGN §14,
//! docs/design/cluster-version.md).
//!
//! One record, `P/cluster/version`, holds a decimal version. No record means version 1: the
//! protocol of every build that predates the record. A process of this build runs on cluster
//! versions [`OLDEST_CLUSTER_VERSION`] ..= [`PROTOCOL_VERSION`] and refuses any other with one line
//! naming both versions. Features that processes of the previous version would break stay off
//! until `idalloc upgrade finalize` moves the record up (one txn, logged); until then this build
//! behaves so that a process of the previous version beside it stays safe:
//!
//! - it does not fold holder fence records into the pool's fence floor (a previous-version bind
//!   does not compare the floor, so a fold would let one applied late commit: a leak);
//! - a process with a pinned holder name (`AllocatorOptions::holder`) bumps its holder fence
//!   record, on its session lease, before its first bind in a pool (a previous-version bind does
//!   not compare its own reference, so a late bind of an earlier life under the same name could
//!   otherwise move the reference back onto that life's lease: G2).
//!
//! Everything here is pure (record values, txns and their outcomes) except [`read`] and
//! [`finalize`], one store request each, used by `idalloc upgrade`.

use crate::error::{Error, Result};
use crate::layout::Layout;
use crate::store::{
    Compare, GetRequest, KeyValue, OpResponse, Revision, Store, TxnOp, TxnRequest, TxnResponse,
};

/// The protocol version this build speaks: the cluster version it finalizes to.
///
/// - 1: every build before the cluster version record (no record in the store means 1).
/// - 2: holder fence records are folded into a pool-level fence floor, which every bind
///   compares; every bind compares the holder's own reference.
pub const PROTOCOL_VERSION: u32 = 2;

/// The oldest cluster version this build runs on (the skew policy: N and N-1). A process refuses
/// a store whose cluster version is older: it was finalized by no build this one can stand beside.
pub const OLDEST_CLUSTER_VERSION: u32 = PROTOCOL_VERSION - 1;

/// The cluster version of a store that holds no version record.
pub const UNRECORDED_VERSION: u32 = 1;

/// The protocol features a cluster version puts in force, for `idalloc upgrade status` and
/// `idalloc version`.
pub fn features(version: u32) -> &'static [&'static str] {
    match version {
        1 => &["holder-fences"],
        2 => &["holder-fences", "fence-floor-fold", "own-reference-compare"],
        _ => &[],
    }
}

/// Whether this build folds holder fence records at `version` (off before finalize: see the
/// module docs).
pub fn folds_fences(version: u32) -> bool {
    version >= 2
}

/// Whether this build bumps a pinned holder's fence record before its first bind in a pool at
/// `version` (on before finalize: see the module docs).
pub fn bumps_pinned_holder(version: u32) -> bool {
    version < 2
}

/// A version record's value: the version in decimal.
pub fn encode(version: u32) -> Vec<u8> {
    version.to_string().into_bytes()
}

/// The version a record holds; `None` for a missing record means [`UNRECORDED_VERSION`]. A value
/// that is not a decimal version (ASCII digits only, no sign, no leading zero) is an error
/// naming it.
pub fn decode(kv: Option<&KeyValue>) -> Result<u32> {
    let Some(kv) = kv else { return Ok(UNRECORDED_VERSION) };
    std::str::from_utf8(&kv.value)
        .ok()
        // ASCII digits only: `u32::from_str` also takes a leading '+', which the store's
        // `value == "2"` gate does not.
        .filter(|s| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit()))
        .and_then(|s| s.parse::<u32>().ok())
        .filter(|v| *v >= 1 && kv.value.first() != Some(&b'0'))
        .ok_or_else(|| Error::Corrupt {
            what: String::from_utf8_lossy(&kv.key).into_owned(),
            reason: format!(
                "the cluster version record holds {:?}; it must be a decimal version, 1 or more",
                String::from_utf8_lossy(&kv.value)
            ),
        })
}

/// `Ok` if this build may run on a store at `version`; otherwise the refusal, one line naming
/// both versions and what to do.
pub fn check_supported(layout: &Layout, version: u32) -> Result<()> {
    let reason = if version > PROTOCOL_VERSION {
        format!(
            "cluster version {version} at prefix {:?} is newer than this build knows (it speaks \
             protocol {PROTOCOL_VERSION} and runs on cluster versions {OLDEST_CLUSTER_VERSION} to \
             {PROTOCOL_VERSION}): run a newer idalloc; a finalized upgrade cannot be undone",
            layout.prefix()
        )
    } else if version < OLDEST_CLUSTER_VERSION {
        format!(
            "cluster version {version} at prefix {:?} is too old for this build (it speaks \
             protocol {PROTOCOL_VERSION} and runs on cluster versions {OLDEST_CLUSTER_VERSION} to \
             {PROTOCOL_VERSION}): upgrade through the versions between and finalize each",
            layout.prefix()
        )
    } else {
        return Ok(());
    };
    Err(Error::Unavailable { reason, retryable: false, source: None })
}

/// The read of the version record, an op to add to a txn that reads anyway (pool open).
pub fn read_op(layout: &Layout) -> TxnOp {
    TxnOp::get_key(layout.cluster_version_key())
}

/// The version a [`read_op`]'s response holds.
pub fn from_response(r: Option<&OpResponse>) -> Result<u32> {
    match r {
        Some(OpResponse::Get(g)) => decode(g.kvs.first()),
        other => Err(Error::Unavailable {
            reason: format!("expected the cluster version read, got {other:?}"),
            retryable: false,
            source: None,
        }),
    }
}

/// A txn that runs `txn` only if the cluster version is at least 2 (the fold of fence records):
/// `If value(version) == "2" Then txn(...) Else get version`. In the store, so a fold decided
/// by a process whose view of the version is stale still happens only once finalized.
pub fn when_finalized(layout: &Layout, txn: TxnRequest) -> TxnRequest {
    TxnRequest::new()
        .when([Compare::value_is(layout.cluster_version_key(), encode(2))])
        .and_then([TxnOp::Txn(txn)])
        .or_else([read_op(layout)])
}

/// What a [`when_finalized`] txn came to: the inner txn's response, or the cluster version that
/// kept it from running.
pub fn when_finalized_outcome(
    resp: &TxnResponse,
) -> Result<std::result::Result<&TxnResponse, u32>> {
    if !resp.succeeded {
        return from_response(resp.responses.first()).map(Err);
    }
    match resp.responses.first() {
        Some(OpResponse::Txn(inner)) => Ok(Ok(inner)),
        other => Err(Error::Unavailable {
            reason: format!("expected the gated txn's response, got {other:?}"),
            retryable: false,
            source: None,
        }),
    }
}

/// The cluster version of a store, as read.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ClusterVersion {
    /// The version in force ([`UNRECORDED_VERSION`] without a record).
    pub version: u32,
    /// Whether the store holds a version record.
    pub recorded: bool,
    /// The revision of the read.
    pub revision: Revision,
}

/// Reads the cluster version of the deployment at `layout`'s prefix (one request).
pub async fn read(store: &dyn Store, layout: &Layout) -> Result<ClusterVersion> {
    let resp = store.get(GetRequest::key(layout.cluster_version_key())).await?;
    Ok(ClusterVersion {
        version: decode(resp.kvs.first())?,
        recorded: !resp.kvs.is_empty(),
        revision: resp.revision,
    })
}

/// What [`finalize`] did.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Finalized {
    /// The cluster moved from `from` to [`PROTOCOL_VERSION`] at `revision`.
    Moved {
        /// The version before.
        from: u32,
        /// The revision of the write.
        revision: Revision,
    },
    /// The cluster was at [`PROTOCOL_VERSION`] already; nothing was written.
    Already,
}

/// The finalize txn: `If the record is as read (mod revision, 0 when absent) Then put version`.
pub fn finalize_txn(layout: &Layout, read_mod_revision: Revision) -> TxnRequest {
    TxnRequest::new()
        .when([Compare::mod_revision_is(layout.cluster_version_key(), read_mod_revision)])
        .and_then([TxnOp::put(layout.cluster_version_key(), encode(PROTOCOL_VERSION))])
        .or_else([read_op(layout)])
}

/// Moves the cluster version at `layout`'s prefix to [`PROTOCOL_VERSION`]: the new features go
/// into force for every process of this build at once (each checks the record in the txn that
/// uses a feature, or before). Only after every process of an older build has stopped: they
/// cannot read the record. Refuses a cluster this build does not run on. Logged.
pub async fn finalize(store: &dyn Store, layout: &Layout) -> Result<Finalized> {
    for _ in 0..8 {
        let resp = store.get(GetRequest::key(layout.cluster_version_key())).await?;
        let kv = resp.kvs.first();
        let version = decode(kv)?;
        check_supported(layout, version)?;
        if version == PROTOCOL_VERSION {
            return Ok(Finalized::Already);
        }
        let read_mod = kv.map_or(0, |kv| kv.mod_revision);
        let resp = store.txn(finalize_txn(layout, read_mod)).await?;
        if resp.succeeded {
            tracing::info!(
                prefix = %layout.prefix(),
                from = version,
                to = PROTOCOL_VERSION,
                revision = resp.revision,
                "cluster version finalized"
            );
            return Ok(Finalized::Moved { from: version, revision: resp.revision });
        }
    }
    Err(Error::Unavailable {
        reason: "the cluster version record kept changing during finalize; try again".into(),
        retryable: true,
        source: None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn kv(value: &str) -> KeyValue {
        KeyValue {
            key: Layout::default().cluster_version_key(),
            value: value.as_bytes().to_vec(),
            create_revision: 1,
            mod_revision: 1,
            version: 1,
            lease: 0,
        }
    }

    #[test]
    fn no_record_is_version_one_and_bad_values_are_named() {
        assert_eq!(decode(None).unwrap(), 1);
        assert_eq!(decode(Some(&kv("2"))).unwrap(), 2);
        for bad in ["", "0", "02", "two", "-1", "2 ", "+2"] {
            let e = decode(Some(&kv(bad))).unwrap_err().to_string();
            assert!(
                e.contains("idalloc/cluster/version") && e.contains(&format!("{bad:?}")),
                "{e}"
            );
        }
    }

    #[test]
    fn this_build_runs_on_n_and_n_minus_one_only() {
        let l = Layout::default();
        assert!(check_supported(&l, PROTOCOL_VERSION).is_ok());
        assert!(check_supported(&l, PROTOCOL_VERSION - 1).is_ok());
        let newer = check_supported(&l, PROTOCOL_VERSION + 1).unwrap_err().to_string();
        assert!(newer.contains("cluster version 3") && newer.contains("protocol 2"), "{newer}");
        assert!(!newer.contains('\n'));
        let older = check_supported(&l, 0).unwrap_err().to_string();
        assert!(older.contains("too old"), "{older}");
    }

    #[test]
    fn new_behaviour_waits_for_finalize() {
        assert!(!folds_fences(1) && folds_fences(2));
        assert!(bumps_pinned_holder(1) && !bumps_pinned_holder(2));
        assert!(features(2).contains(&"fence-floor-fold"));
        assert!(!features(1).contains(&"fence-floor-fold"));
    }

    #[test]
    fn the_fold_gate_compares_the_record_in_the_store() {
        let l = Layout::default();
        let t = when_finalized(&l, TxnRequest::new());
        assert_eq!(t.compare, vec![Compare::value_is(l.cluster_version_key(), b"2".to_vec())]);
    }
}
