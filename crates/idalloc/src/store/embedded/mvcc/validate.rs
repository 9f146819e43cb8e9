//! Validation of requests (etcd's v3rpc checks, before a request reaches the state machine):
//! empty keys, duplicate keys in one txn, too many ops, too large.

use std::collections::BTreeSet;

use crate::store::{
    CompareTarget, KeyRange, StoreError, StoreResult, TxnOp, TxnRequest, MAX_REQUEST_BYTES,
    MAX_TXN_OPS,
};

fn show(key: &[u8]) -> String {
    format!("{:?}", String::from_utf8_lossy(key))
}

/// An empty key is refused (etcd: "key is not provided"). As an exception, a range with an empty
/// start and a non-empty end is accepted and means "from the first key": etcd clients send that
/// as `"\0"`, and no key is empty, so the meaning is the same.
pub(crate) fn check_range_key(range: &KeyRange, what: &str) -> StoreResult<()> {
    if range.key.is_empty() && range.range_end.is_empty() {
        return Err(StoreError::InvalidRequest(format!(
            "{what}: key is empty (keys must be non-empty)"
        )));
    }
    Ok(())
}

/// etcd's `checkTxnRequest` + `checkIntervals` + the request size limit.
pub(crate) fn validate_txn(req: &TxnRequest) -> StoreResult<()> {
    check_txn_request(req)?;
    check_intervals(&req.success)?;
    check_intervals(&req.failure)?;
    let size = txn_size(req);
    if size > MAX_REQUEST_BYTES {
        return Err(StoreError::InvalidRequest(format!(
            "txn request is too large: about {size} bytes (at most {MAX_REQUEST_BYTES})"
        )));
    }
    Ok(())
}

fn check_txn_request(req: &TxnRequest) -> StoreResult<()> {
    let opc = req.compare.len().max(req.success.len()).max(req.failure.len());
    if opc > MAX_TXN_OPS {
        return Err(StoreError::InvalidRequest(format!(
            "too many operations in txn request: {opc} (at most {MAX_TXN_OPS} compares and \
             {MAX_TXN_OPS} ops per branch)"
        )));
    }
    for op in req.success.iter().chain(&req.failure) {
        match op {
            TxnOp::Get(g) => check_range_key(&g.range, "get")?,
            TxnOp::Put(p) => {
                if p.key.is_empty() {
                    return Err(StoreError::InvalidRequest(
                        "put: key is empty (keys must be non-empty)".into(),
                    ));
                }
            }
            TxnOp::Delete(r) => check_range_key(r, "delete")?,
            TxnOp::Txn(t) => check_txn_request(t)?,
        }
    }
    Ok(())
}

fn duplicate(key: &[u8]) -> StoreError {
    StoreError::InvalidRequest(format!(
        "duplicate key given in txn request: {} is written twice (put twice, or put and deleted)",
        show(key)
    ))
}

/// etcd's `checkIntervals`, rule for rule (including its quirk that a put in one nested txn and a
/// delete of the same key in a *later* sibling nested txn pass). One difference: etcd builds a
/// broken interval for a delete "to the end of the keyspace" (`range_end == [0]`) and so misses
/// puts it covers; here such a delete covers every key `>= key`, so the overlap is refused.
fn check_intervals(ops: &[TxnOp]) -> StoreResult<(BTreeSet<Vec<u8>>, Vec<KeyRange>)> {
    let mut dels: Vec<KeyRange> = ops
        .iter()
        .filter_map(|op| if let TxnOp::Delete(r) = op { Some(r.clone()) } else { None })
        .collect();
    let covered = |dels: &[KeyRange], k: &[u8]| dels.iter().any(|r| r.contains(k));
    let mut puts: BTreeSet<Vec<u8>> = BTreeSet::new();
    for op in ops {
        let TxnOp::Txn(t) = op else { continue };
        let (puts_then, dels_then) = check_intervals(&t.success)?;
        let (puts_else, dels_else) = check_intervals(&t.failure)?;
        for k in &puts_then {
            if puts.contains(k) || covered(&dels, k) {
                return Err(duplicate(k));
            }
            puts.insert(k.clone());
        }
        for k in &puts_else {
            // A key in both branches of one nested txn is fine: only one branch runs.
            if (puts.contains(k) && !puts_then.contains(k)) || covered(&dels, k) {
                return Err(duplicate(k));
            }
            puts.insert(k.clone());
        }
        dels.extend(dels_then);
        dels.extend(dels_else);
    }
    for op in ops {
        let TxnOp::Put(p) = op else { continue };
        if puts.contains(&p.key) || covered(&dels, &p.key) {
            return Err(duplicate(&p.key));
        }
        puts.insert(p.key.clone());
    }
    Ok((puts, dels))
}

/// An estimate of the protobuf size of a txn request (bytes plus a little framing per field), to
/// enforce etcd's `--max-request-bytes`.
pub(crate) fn txn_size(req: &TxnRequest) -> usize {
    let compares: usize = req
        .compare
        .iter()
        .map(|c| {
            let target = match &c.target {
                CompareTarget::Value(v) => v.len(),
                _ => 8,
            };
            c.range.key.len() + c.range.range_end.len() + target + 12
        })
        .sum();
    let ops: usize = req
        .success
        .iter()
        .chain(&req.failure)
        .map(|op| match op {
            TxnOp::Get(g) => g.range.key.len() + g.range.range_end.len() + 24,
            TxnOp::Put(p) => p.key.len() + p.value.len() + 16,
            TxnOp::Delete(r) => r.key.len() + r.range_end.len() + 8,
            TxnOp::Txn(t) => txn_size(t) + 4,
        })
        .sum();
    compares + ops
}
