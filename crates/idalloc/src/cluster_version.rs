//! The cluster version: which protocol features are in force under one store prefix (DESIGN §14,
//! docs/design/cluster-version.md).
//!
//! One record, `P/cluster/version`, holds a decimal version. No record means version 1: the
//! protocol of every build that predates the record. A process of this build runs on cluster
//! versions [`OLDEST_CLUSTER_VERSION`] ..= [`PROTOCOL_VERSION`] and refuses any other with one line
//! naming both versions. Features that processes of the previous version would break stay off
//! until `idalloc upgrade finalize` moves the record up (one txn, logged) and a grace after it
//! has passed; until then this build behaves so that a process of the previous version beside
//! it, or a request such a process sent before the finalize and the network delivers late, stays
//! safe:
//!
//! - it does not fold holder fence records into the pool's fence floor (a previous-version bind
//!   does not compare the floor, so a fold would let one applied late commit: a leak);
//! - a process with a pinned holder name (`AllocatorOptions::holder`) bumps its holder fence
//!   record, on its session lease, before its first bind in a pool (a previous-version bind does
//!   not compare its own reference, so a late bind of an earlier life under the same name could
//!   otherwise move the reference back onto that life's lease: G2);
//! - it does not narrow a pool (a previous-version process never rereads a spec whose create
//!   revision is unchanged, so it would keep handing out the IDs a shrink or a new reserved ID
//!   excluded).
//!
//! The grace is a record, `P/cluster/grace`, written by the finalize txn on a lease as long as the
//! grace (20 minutes by default): the gated features compare it absent in the store, so nothing
//! depends on a process's clock or on when it last read the version.
//!
//! Everything here is pure (record values, txns and their outcomes) except [`read`] and
//! [`finalize`], a few store requests each, used by `idalloc upgrade`.

use std::time::Duration;

use crate::error::{Error, Input, Result};
use crate::layout::Layout;
use crate::store::{
    Compare, GetRequest, KeyRange, KeyValue, OpResponse, Revision, Store, TxnOp, TxnRequest,
    TxnResponse,
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

/// How long after a finalize the new version's features wait by default: longer than a request
/// sent before the finalize, by a process of the previous version, can take to reach the store.
/// Its client gives up after seconds, but bytes it wrote stay in its kernel's socket, which
/// retransmits them for up to about 15.5 minutes at Linux defaults (`tcp_retries2` = 15), even
/// after the process is gone; 20 minutes covers that.
pub const DEFAULT_GRACE: Duration = Duration::from_secs(1200);

/// The longest grace [`finalize`] accepts.
pub const MAX_GRACE: Duration = Duration::from_secs(7 * 24 * 3600);

/// The protocol features a cluster version puts in force, for `idalloc upgrade status` and
/// `idalloc version`.
pub fn features(version: u32) -> &'static [&'static str] {
    match version {
        1 => &["holder-fences"],
        2 => &["holder-fences", "fence-floor-fold", "own-reference-compare"],
        _ => &[],
    }
}

/// Whether this build folds holder fence records at the version in force `version` (off before
/// finalize and during its grace: see the module docs).
pub fn folds_fences(version: u32) -> bool {
    version >= 2
}

/// Whether this build bumps a pinned holder's fence record before its first bind in a pool at
/// the version in force `version` (on before finalize and during its grace: see the module docs).
pub fn bumps_pinned_holder(version: u32) -> bool {
    version < 2
}

/// Whether this build narrows pools (a higher min, a lower max, newly reserved IDs) at the
/// version in force `version` (off before finalize and during its grace: see the module docs).
pub fn narrows_pools(version: u32) -> bool {
    version >= 2
}

/// The cluster records as read: the recorded version and whether its grace still runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Records {
    /// The recorded version ([`UNRECORDED_VERSION`] without a record): what a build must know to
    /// run on the store ([`check_supported`]).
    pub version: u32,
    /// Whether the grace after the finalize to `version` still runs (`P/cluster/grace` exists).
    pub grace: bool,
}

impl Records {
    /// The version whose features are in force: the recorded one, or the one before it while
    /// the grace after its finalize runs.
    pub fn in_force(&self) -> u32 {
        if self.grace && self.version > UNRECORDED_VERSION {
            self.version - 1
        } else {
            self.version
        }
    }

    /// The records among `kvs` (a read of `P/cluster/`); other keys are ignored.
    pub fn from_kvs(layout: &Layout, kvs: &[KeyValue]) -> Result<Records> {
        let version_key = layout.cluster_version_key();
        let grace_key = layout.cluster_grace_key();
        Ok(Records {
            version: decode(kvs.iter().find(|kv| kv.key == version_key))?,
            grace: kvs.iter().any(|kv| kv.key == grace_key),
        })
    }
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

/// The read of the cluster records (the version and its grace), an op to add to a txn that reads
/// anyway (pool open).
pub fn read_op(layout: &Layout) -> TxnOp {
    TxnOp::get(GetRequest::new(KeyRange::prefix(layout.cluster_prefix())))
}

/// The records a [`read_op`]'s response holds.
pub fn from_response(layout: &Layout, r: Option<&OpResponse>) -> Result<Records> {
    match r {
        Some(OpResponse::Get(g)) => Records::from_kvs(layout, &g.kvs),
        other => Err(Error::Unavailable {
            reason: format!("expected the cluster version read, got {other:?}"),
            retryable: false,
            source: None,
        }),
    }
}

/// The compares that hold once version 2 is in force: the record says 2 and its grace is over.
/// In the txn that uses a version-2 feature, so a process whose view of the version is stale
/// still uses it only once in force.
pub fn in_force_compares(layout: &Layout) -> [Compare; 2] {
    [
        Compare::value_is(layout.cluster_version_key(), encode(2)),
        Compare::absent(layout.cluster_grace_key()),
    ]
}

/// A txn that runs `txn` only once version 2 is in force (the fold of fence records):
/// `If value(version) == "2" and grace absent Then txn(...) Else get cluster/`.
pub fn when_finalized(layout: &Layout, txn: TxnRequest) -> TxnRequest {
    TxnRequest::new()
        .when(in_force_compares(layout))
        .and_then([TxnOp::Txn(txn)])
        .or_else([read_op(layout)])
}

/// What a [`when_finalized`] txn came to: the inner txn's response, or the version in force that
/// kept it from running.
pub fn when_finalized_outcome<'r>(
    layout: &Layout,
    resp: &'r TxnResponse,
) -> Result<std::result::Result<&'r TxnResponse, u32>> {
    if !resp.succeeded {
        return from_response(layout, resp.responses.first()).map(|r| Err(r.in_force()));
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
    /// The recorded version ([`UNRECORDED_VERSION`] without a record).
    pub version: u32,
    /// Whether the store holds a version record.
    pub recorded: bool,
    /// The grace after the finalize to `version`, as the finalize set it, while it still runs:
    /// the features of `version` wait until it ends.
    pub grace: Option<Duration>,
    /// The revision of the read.
    pub revision: Revision,
}

impl ClusterVersion {
    /// The version whose features are in force (the one before `version` during its grace).
    pub fn in_force(&self) -> u32 {
        Records { version: self.version, grace: self.grace.is_some() }.in_force()
    }
}

/// Reads the cluster version of the deployment at `layout`'s prefix (one request).
pub async fn read(store: &dyn Store, layout: &Layout) -> Result<ClusterVersion> {
    let resp = store.get(GetRequest::new(KeyRange::prefix(layout.cluster_prefix()))).await?;
    let records = Records::from_kvs(layout, &resp.kvs)?;
    let version_key = layout.cluster_version_key();
    let grace_key = layout.cluster_grace_key();
    let grace = resp.kvs.iter().find(|kv| kv.key == grace_key).map(|kv| {
        // Written by `finalize` as whole seconds; anything else still means a grace runs.
        let secs = std::str::from_utf8(&kv.value).ok().and_then(|s| s.parse::<u64>().ok());
        Duration::from_secs(secs.unwrap_or(0))
    });
    Ok(ClusterVersion {
        version: records.version,
        recorded: resp.kvs.iter().any(|kv| kv.key == version_key),
        grace,
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

/// The finalize txn: `If the record is as read (mod revision, 0 when absent) Then put version`,
/// and, with a grace, the grace record on `grace` = (its lease, its length in whole seconds).
pub fn finalize_txn(
    layout: &Layout,
    read_mod_revision: Revision,
    grace: Option<(crate::store::LeaseId, u64)>,
) -> TxnRequest {
    let mut then = vec![TxnOp::put(layout.cluster_version_key(), encode(PROTOCOL_VERSION))];
    if let Some((lease, secs)) = grace {
        then.push(TxnOp::put_on_lease(layout.cluster_grace_key(), secs.to_string(), lease));
    }
    TxnRequest::new()
        .when([Compare::mod_revision_is(layout.cluster_version_key(), read_mod_revision)])
        .and_then(then)
        .or_else([read_op(layout)])
}

/// `grace` in whole seconds (rounded up), or the refusal naming it.
fn grace_seconds(grace: Duration) -> Result<u64> {
    if grace > MAX_GRACE {
        return Err(Error::invalid(
            Input::Options,
            "upgrade grace",
            format!("{grace:?}"),
            format!("at most {} days", MAX_GRACE.as_secs() / 86_400),
        ));
    }
    Ok(grace.as_secs() + u64::from(grace.subsec_nanos() > 0))
}

/// Moves the cluster version at `layout`'s prefix to [`PROTOCOL_VERSION`]: once `grace` has
/// passed, the new features go into force for every process of this build at once (each checks
/// the records in the txn that uses a feature, or before). Only after every process of an older
/// build has stopped: they cannot read the record; the grace covers their requests still in
/// flight ([`DEFAULT_GRACE`]; zero puts the features in force at once). Refuses a cluster this
/// build does not run on. Logged.
pub async fn finalize(store: &dyn Store, layout: &Layout, grace: Duration) -> Result<Finalized> {
    let secs = grace_seconds(grace)?;
    for _ in 0..8 {
        let resp = store.get(GetRequest::key(layout.cluster_version_key())).await?;
        let kv = resp.kvs.first();
        let version = decode(kv)?;
        check_supported(layout, version)?;
        if version == PROTOCOL_VERSION {
            return Ok(Finalized::Already);
        }
        let read_mod = kv.map_or(0, |kv| kv.mod_revision);
        // The grace's lease, granted first and never kept alive: the store ends the grace.
        let lease = match secs {
            0 => None,
            s => Some(store.lease_grant(i64::try_from(s).unwrap_or(i64::MAX)).await?.id),
        };
        let resp = store.txn(finalize_txn(layout, read_mod, lease.map(|l| (l, secs)))).await?;
        if resp.succeeded {
            tracing::info!(
                prefix = %layout.prefix(),
                from = version,
                to = PROTOCOL_VERSION,
                revision = resp.revision,
                grace_seconds = secs,
                "cluster version finalized; its features wait for the grace"
            );
            return Ok(Finalized::Moved { from: version, revision: resp.revision });
        }
        if let Some(l) = lease {
            // Unused; it would expire anyway.
            let _ = store.lease_revoke(l).await;
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
        assert!(!narrows_pools(1) && narrows_pools(2));
        assert!(features(2).contains(&"fence-floor-fold"));
        assert!(!features(1).contains(&"fence-floor-fold"));
    }

    #[test]
    fn the_fold_gate_compares_the_record_and_the_grace_in_the_store() {
        let l = Layout::default();
        let t = when_finalized(&l, TxnRequest::new());
        assert_eq!(
            t.compare,
            vec![
                Compare::value_is(l.cluster_version_key(), b"2".to_vec()),
                Compare::absent(l.cluster_grace_key())
            ]
        );
    }

    #[test]
    fn during_the_grace_the_version_before_is_in_force() {
        let l = Layout::default();
        let mut grace = kv("600");
        grace.key = l.cluster_grace_key();
        let r = Records::from_kvs(&l, &[grace.clone(), kv("2")]).unwrap();
        assert_eq!((r.version, r.grace, r.in_force()), (2, true, 1));
        let r = Records::from_kvs(&l, &[kv("2")]).unwrap();
        assert_eq!((r.version, r.grace, r.in_force()), (2, false, 2));
        // A grace record without a version record (never written so) changes nothing.
        assert_eq!(Records::from_kvs(&l, &[grace]).unwrap().in_force(), 1);
    }

    #[test]
    fn graces_are_whole_seconds_rounded_up_and_bounded() {
        assert_eq!(grace_seconds(Duration::ZERO).unwrap(), 0);
        assert_eq!(grace_seconds(Duration::from_millis(1)).unwrap(), 1);
        assert_eq!(grace_seconds(DEFAULT_GRACE).unwrap(), 1200);
        let e = grace_seconds(MAX_GRACE + Duration::from_secs(1)).unwrap_err().to_string();
        assert!(e.contains("upgrade grace") && e.contains("at most 7 days"), "{e}");
    }
}
