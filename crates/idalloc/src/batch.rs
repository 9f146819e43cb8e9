//! Batched operations as pure functions: many single-key txns (the per-key plans of
//! [`crate::protocol`], unchanged) → as few store requests as etcd's limits allow → one outcome per
//! key. No I/O here; the driver (`allocator/batch.rs`) sends the requests and runs the rounds.
//!
//! A batch is one outer txn whose success branch holds one nested txn per key:
//!
//! ```text
//! If <frame guard> Then <frame ops>, txn(key 1's plan), txn(key 2's plan), … Else <frame reads>
//! ```
//!
//! etcd evaluates every compare of the tree against the state before the txn, and a nested txn
//! whose compares fail runs its own else branch without affecting its siblings, so each key keeps
//! exactly the guarantees of its lone txn (same compares, same fences) and one key's lost race
//! does not fail the others. What the packing must respect (etcd `checkTxnRequest`,
//! `checkIntervals`, `--max-request-bytes`):
//!
//! - **ops per level**: a txn may have at most 128 compares and 128 ops per branch, and a nested
//!   txn only `128 − (its parent's largest of compares/success/failure)`, recursively
//!   ([`ops_needed`]);
//! - **no key written twice** anywhere in the tree (then- and else-branch of one nested txn may
//!   share a key; siblings may not): items whose writes overlap go to different batches
//!   ([`written_keys`]);
//! - **request size**: kept under [`BATCH_BYTES`] by an estimate that errs on the large side.

use std::collections::HashSet;

use crate::protocol::ProtocolError;
use crate::store::{
    Compare, CompareTarget, OpResponse, TxnOp, TxnRequest, TxnResponse, MAX_REQUEST_BYTES,
    MAX_TXN_OPS,
};

/// Bytes one batch request may take by [`txn_bytes`]' estimate: etcd's default 1.5 MiB less a
/// margin for protobuf framing the estimate does not model exactly.
pub const BATCH_BYTES: usize = MAX_REQUEST_BYTES - 128 * 1024;

/// Keys one batch holds at most even when every limit would allow more: beyond ~100 nested txns
/// etcd's apply time per request grows faster than the round trip it saves.
pub const MAX_BATCH_KEYS: usize = 100;

/// What surrounds the nested per-key txns of a batch.
///
/// `guard`: compares of the whole batch (the pool's spec, when the frame writes something of its
/// own); `ops`: writes shared by every key of the batch (the holder's fence bump, written once
/// per tree since etcd refuses a key written twice); `otherwise`: what to read back when the guard
/// fails (nothing of the batch ran then).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Frame {
    pub guard: Vec<Compare>,
    pub ops: Vec<TxnOp>,
    pub otherwise: Vec<TxnOp>,
}

/// The largest of a txn's compares, success ops and failure ops: what etcd counts against the
/// level's budget.
fn level_ops(t: &TxnRequest) -> usize {
    t.compare.len().max(t.success.len()).max(t.failure.len())
}

/// The smallest op budget `b` for which etcd accepts `t` as a txn nested with budget `b` (for a
/// top-level txn, `b` is 128): `t`'s own level count plus what its deepest nested txn needs.
pub fn ops_needed(t: &TxnRequest) -> usize {
    let nested = t
        .success
        .iter()
        .chain(&t.failure)
        .filter_map(|op| match op {
            TxnOp::Txn(n) => Some(ops_needed(n)),
            _ => None,
        })
        .max()
        .unwrap_or(0);
    level_ops(t) + nested
}

/// Every key `t` may put or delete, in either branch, at any depth (deletes by their start key:
/// the per-key plans delete single keys only). Borrowed: packing asks this of every key of every
/// batch, and copying the keys was a visible part of a bulk acquire's client CPU.
pub fn written_keys(t: &TxnRequest) -> HashSet<&[u8]> {
    let mut out = HashSet::new();
    collect_writes(t, &mut out);
    out
}

fn collect_writes<'a>(t: &'a TxnRequest, out: &mut HashSet<&'a [u8]>) {
    for op in t.success.iter().chain(&t.failure) {
        match op {
            TxnOp::Put(p) => {
                out.insert(&p.key);
            }
            TxnOp::Delete(r) => {
                out.insert(&r.key);
            }
            TxnOp::Txn(n) => collect_writes(n, out),
            TxnOp::Get(_) => {}
        }
    }
}

fn op_bytes(op: &TxnOp) -> usize {
    match op {
        TxnOp::Get(g) => g.range.key.len() + g.range.range_end.len() + 32,
        TxnOp::Put(p) => p.key.len() + p.value.len() + 32,
        TxnOp::Delete(r) => r.key.len() + r.range_end.len() + 16,
        TxnOp::Txn(t) => txn_bytes(t) + 16,
    }
}

/// An estimate, on the large side, of a txn's encoded size (key and value bytes plus generous
/// framing per field).
pub fn txn_bytes(t: &TxnRequest) -> usize {
    let compares: usize = t
        .compare
        .iter()
        .map(|c| {
            let target = match &c.target {
                CompareTarget::Value(v) => v.len(),
                _ => 10,
            };
            c.range.key.len() + c.range.range_end.len() + target + 24
        })
        .sum();
    compares + t.success.iter().chain(&t.failure).map(op_bytes).sum::<usize>() + 16
}

/// One batch under construction.
struct Open<'a> {
    items: Vec<usize>,
    writes: HashSet<&'a [u8]>,
    bytes: usize,
    need: usize,
}

/// Splits `items` (one txn per key) into batches for `frame`: lists of item indexes, each batch in
/// input order, batches in order of their first item. First fit: an item goes into the first batch
/// where the op budget, the size estimate and the written keys all still allow it, else it opens
/// a new batch. An item that fits in no batch even alone still gets one of its own (the store's
/// answer then names the limit).
pub fn pack(items: &[TxnRequest], frame: &Frame, max_keys: usize) -> Vec<Vec<usize>> {
    let max_keys = max_keys.clamp(1, MAX_TXN_OPS);
    let frame_bytes = txn_bytes(&TxnRequest {
        compare: frame.guard.clone(),
        success: frame.ops.clone(),
        failure: frame.otherwise.clone(),
    });
    let frame_ops =
        TxnRequest { compare: Vec::new(), success: frame.ops.clone(), failure: Vec::new() };
    let frame_writes = written_keys(&frame_ops);
    let mut open: Vec<Open> = Vec::new();
    for (i, item) in items.iter().enumerate() {
        let writes = written_keys(item);
        let bytes = txn_bytes(item) + 16;
        let need = ops_needed(item);
        let fits = |b: &Open| {
            let n = b.items.len() + 1;
            let outer = frame.guard.len().max(frame.ops.len() + n).max(frame.otherwise.len());
            n <= max_keys
                && outer + b.need.max(need) <= MAX_TXN_OPS
                && b.bytes + bytes <= BATCH_BYTES
                && writes.iter().all(|k| !b.writes.contains(k))
        };
        match open.iter_mut().find(|b| fits(b)) {
            Some(b) => {
                b.items.push(i);
                b.writes.extend(writes);
                b.bytes += bytes;
                b.need = b.need.max(need);
            }
            None => {
                let mut all = frame_writes.clone();
                all.extend(writes);
                open.push(Open { items: vec![i], writes: all, bytes: frame_bytes + bytes, need });
            }
        }
    }
    open.into_iter().map(|b| b.items).collect()
}

/// The batch request: `frame` around one nested txn per item, in the given order.
pub fn assemble(frame: &Frame, items: impl IntoIterator<Item = TxnRequest>) -> TxnRequest {
    let mut success = frame.ops.clone();
    success.extend(items.into_iter().map(TxnOp::Txn));
    TxnRequest { compare: frame.guard.clone(), success, failure: frame.otherwise.clone() }
}

/// The nested responses of a batch sent with `frame` and `n` items, in item order, each read by
/// the item's own plan as if it had been sent alone; `Err(resp)` holds the frame's read-back
/// (the guard failed and nothing of the batch ran).
pub fn split(
    resp: TxnResponse,
    frame: &Frame,
    n: usize,
) -> Result<Result<Vec<TxnResponse>, Vec<OpResponse>>, ProtocolError> {
    if !resp.succeeded {
        if !frame.guard.is_empty() {
            return Ok(Err(resp.responses));
        }
        return Err(ProtocolError::Shape("a batch without a guard reported failure".into()));
    }
    let skip = frame.ops.len();
    if resp.responses.len() != skip + n {
        return Err(ProtocolError::Shape(format!(
            "batch of {n} expected {} results, got {}",
            skip + n,
            resp.responses.len()
        )));
    }
    resp.responses
        .into_iter()
        .skip(skip)
        .map(|r| match r {
            OpResponse::Txn(mut t) => {
                t.revision = resp.revision;
                Ok(t)
            }
            other => {
                Err(ProtocolError::Shape(format!("expected a nested txn result, got {other:?}")))
            }
        })
        .collect::<Result<Vec<_>, _>>()
        .map(Ok)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::layout::Layout;
    use crate::protocol::{spec_compare, BindPlan, Fences, LastRelease, RefTarget, ReleasePlan};
    use crate::store::{GetResponse, KeyValue};

    fn layout() -> Layout {
        Layout::new("/idalloc").expect("valid prefix")
    }

    fn fences() -> Fences {
        Fences { spec_rev: Some(3), seen: Some(40) }
    }

    fn bind(key: &str, id: u64) -> TxnRequest {
        let plan = BindPlan { expect_key: None, id, expect_id: None, moved_from: None };
        plan.txn_fenced(&layout(), "p", key, Some(RefTarget { holder: "h", lease: 7 }), fences())
    }

    fn release(key: &str, id: u64) -> TxnRequest {
        ReleasePlan {
            key,
            id,
            holder: "h",
            last: LastRelease::Reclaim { tombstone_lease: Some(9) },
            require_own_ref: true,
            fences: fences(),
            bump: None,
        }
        .txn(&layout(), "p")
    }

    /// etcd's `checkTxnRequest`, written out independently of [`ops_needed`]: every level within
    /// its budget, nested budgets reduced by the parent's count.
    fn etcd_accepts_ops(t: &TxnRequest, budget: usize) -> bool {
        let opc = t.compare.len().max(t.success.len()).max(t.failure.len());
        opc <= budget
            && t.success.iter().chain(&t.failure).all(|op| match op {
                TxnOp::Txn(n) => etcd_accepts_ops(n, budget - opc),
                _ => true,
            })
    }

    #[test]
    fn ops_needed_matches_etcds_recursive_budget() {
        for t in [bind("a", 1), release("a", 1)] {
            let need = ops_needed(&t);
            assert!(etcd_accepts_ops(&t, need));
            assert!(!etcd_accepts_ops(&t, need - 1), "need {need} is not the smallest budget");
        }
        // The release plan nests two levels deep: 7 compares, then 2 (guards / not-last ops), then 1.
        assert_eq!(ops_needed(&release("a", 1)), 7 + 2 + 1);
    }

    #[test]
    fn every_batch_passes_etcds_op_check_and_takes_as_many_keys_as_allowed() {
        let binds: Vec<TxnRequest> = (0..1000).map(|i| bind(&format!("k{i}"), i)).collect();
        let batches = pack(&binds, &Frame::default(), 128);
        // A new key's bind has 6 compares (key, ID, spec, own reference, holder fence, fence
        // floor) and 3 ops per branch, so the nested budget 128 − n must stay ≥ 6: n = 122 keys
        // per batch.
        assert_eq!(ops_needed(&binds[0]), 6);
        assert_eq!(batches[0].len(), 122);
        assert_eq!(batches.iter().map(Vec::len).sum::<usize>(), 1000);
        let releases: Vec<TxnRequest> = (0..300).map(|i| release(&format!("k{i}"), i)).collect();
        let frame = Frame {
            guard: vec![spec_compare(&layout(), "p", 3)],
            ops: vec![TxnOp::put(layout().holder_key("p", "h"), Vec::new())],
            otherwise: vec![TxnOp::get_key(layout().pool_spec_key("p"))],
        };
        let batches = pack(&releases, &frame, 128);
        // 1 bump + n nested + 10 needed by each release plan ≤ 128.
        assert_eq!(batches[0].len(), 117);
        for b in batches.iter() {
            let req = assemble(&frame, b.iter().map(|&i| releases[i].clone()));
            assert!(etcd_accepts_ops(&req, MAX_TXN_OPS));
        }
        // Input order is kept inside and across batches.
        let flat: Vec<usize> = batches.concat();
        assert_eq!(flat, (0..300).collect::<Vec<_>>());
    }

    #[test]
    fn items_writing_the_same_key_never_share_a_batch() {
        // Two keys that would both write the record of ID 5 (a hint taken twice): apart.
        let items = vec![bind("a", 5), bind("b", 6), bind("c", 5)];
        let batches = pack(&items, &Frame::default(), 128);
        assert_eq!(batches, vec![vec![0, 1], vec![2]]);
    }

    #[test]
    fn large_keys_split_by_size_and_every_batch_stays_under_the_request_limit() {
        let big = "/".repeat(4096);
        let items: Vec<TxnRequest> = (0..40).map(|i| bind(&format!("{big}{i}"), i)).collect();
        let batches = pack(&items, &Frame::default(), 128);
        assert!(batches.len() > 1, "4 KiB keys must not all fit one request");
        for b in &batches {
            let req = assemble(&Frame::default(), b.iter().map(|&i| items[i].clone()));
            assert!(txn_bytes(&req) <= BATCH_BYTES, "{} > {BATCH_BYTES}", txn_bytes(&req));
        }
        assert_eq!(batches.concat(), (0..40).collect::<Vec<_>>());
    }

    #[test]
    fn max_keys_caps_a_batch() {
        let items: Vec<TxnRequest> = (0..10).map(|i| bind(&format!("k{i}"), i)).collect();
        let batches = pack(&items, &Frame::default(), 4);
        assert_eq!(batches, vec![vec![0, 1, 2, 3], vec![4, 5, 6, 7], vec![8, 9]]);
    }

    #[test]
    fn split_returns_nested_results_with_the_outer_revision_or_the_frame_read_back() {
        let frame = Frame {
            guard: vec![spec_compare(&layout(), "p", 3)],
            ops: vec![TxnOp::put("fence", "")],
            otherwise: vec![TxnOp::get_key("spec")],
        };
        let nested =
            |ok| OpResponse::Txn(TxnResponse { succeeded: ok, responses: vec![], revision: 0 });
        let resp = TxnResponse {
            succeeded: true,
            responses: vec![OpResponse::Put, nested(true), nested(false)],
            revision: 77,
        };
        let parts = split(resp, &frame, 2).expect("shape").expect("ran");
        assert_eq!(
            parts.iter().map(|t| (t.succeeded, t.revision)).collect::<Vec<_>>(),
            vec![(true, 77), (false, 77)]
        );
        let spec = OpResponse::Get(GetResponse {
            kvs: vec![KeyValue {
                key: b"spec".to_vec(),
                value: Vec::new(),
                create_revision: 3,
                mod_revision: 3,
                version: 1,
                lease: 0,
            }],
            ..Default::default()
        });
        let failed = TxnResponse { succeeded: false, responses: vec![spec.clone()], revision: 80 };
        assert_eq!(split(failed, &frame, 2).expect("shape"), Err(vec![spec]));
        let short = TxnResponse { succeeded: true, responses: vec![OpResponse::Put], revision: 1 };
        assert!(split(short, &frame, 2).is_err());
    }
}
