//! Splitting many small reads (one record, or one key's references, each) into txns a store
//! accepts: at most [`MAX_TXN_OPS`] operations and [`READ_BATCH_BYTES`] of record names each.
//! Used where a pass over one family of records needs the matching records of another family,
//! which are not in the same key order (`list`'s holders, `check`'s cross-record reads). Pure.

use crate::store::{TxnOp, MAX_REQUEST_BYTES, MAX_TXN_OPS};

/// Bytes of record names one txn of reads may carry: a third of etcd's request limit, so that
/// the answer (the records, with their values, each a few times its name at most) stays well
/// inside a client's 4 MiB.
pub(crate) const READ_BATCH_BYTES: usize = MAX_REQUEST_BYTES / 3;

/// The size of one read in a request: its range's two ends plus framing.
fn op_bytes(op: &TxnOp) -> usize {
    match op {
        TxnOp::Get(g) => g.range.key.len() + g.range.range_end.len() + 24,
        _ => 64,
    }
}

/// `ops` in order, cut into txns' worth (each non-empty).
pub(crate) fn batches(ops: Vec<TxnOp>) -> Vec<Vec<TxnOp>> {
    let mut out: Vec<Vec<TxnOp>> = Vec::new();
    let mut bytes = 0;
    for op in ops {
        let size = op_bytes(&op);
        match out.last_mut() {
            Some(last) if last.len() < MAX_TXN_OPS && bytes + size <= READ_BATCH_BYTES => {
                bytes += size;
                last.push(op);
            }
            _ => {
                bytes = size;
                out.push(vec![op]);
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::{GetRequest, KeyRange};

    #[test]
    fn cut_by_count_and_by_bytes_keeping_order() {
        let small: Vec<TxnOp> = (0..300).map(|i| TxnOp::get_key(format!("k{i}"))).collect();
        let b = batches(small.clone());
        assert_eq!(b.iter().map(Vec::len).collect::<Vec<_>>(), [128, 128, 44]);
        assert_eq!(b.concat(), small);
        let big: Vec<TxnOp> = (0..100)
            .map(|i| TxnOp::get(GetRequest::new(KeyRange::prefix(format!("{i:0>12000}")))))
            .collect();
        let b = batches(big.clone());
        assert!(
            b.len() > 1
                && b.iter().all(|t| t.iter().map(op_bytes).sum::<usize>() <= READ_BATCH_BYTES)
        );
        assert_eq!(b.concat(), big);
        assert!(batches(Vec::new()).is_empty());
    }
}
