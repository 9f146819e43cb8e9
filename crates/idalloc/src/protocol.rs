//! The allocation protocol as pure functions: what is known → which txn to send → what its response
//! means. No I/O happens here; `allocator.rs` runs the loop and `sweeper.rs` the reclaim passes. The
//! bind loop's own memory and branches are the state machine of `bind_step` ([`BindLoop`](bind_step::BindLoop)).
//!
//! Every write the allocator makes is one txn whose compares pin exactly the records it read (or
//! assumed from its cache). If anyone changed them in between, the compares fail, the else branch
//! reads the records back, and the next decision is made on fresh facts. That is why no lock is
//! needed anywhere (DESIGN §5): safety comes from the compares, progress from the else branches.
//!
//! The records of one binding (DESIGN §4): `id/<ID> -> key` (or a tombstone), `key/<k> -> ID`, and one
//! `ref/<k>/<holder> -> ID` per holder. Every txn here keeps `id/` and `key/` in agreement.
//!
//! One file (about 750 lines of code, the rest its tests) because it is the protocol of DESIGN §5
//! in one place: bind, release, stray-reference and sweep txns share the compare builders and the
//! fences, and a reader checks the G1–G5 arguments against one file, not five.

// Named by its users as `protocol::bind_step::…`, not re-exported here: the bind loop is built on
// this file's decisions, and a re-export would make this file import its own child back.
pub(crate) mod bind_step;

use crate::error::Error;
use crate::layout::{IdRecord, Layout};
use crate::store::{
    prefix_end, Compare, CompareOp, CompareTarget, GetResponse, KeyRange, KeyValue, LeaseId,
    OpResponse, Revision, TxnOp, TxnRequest, TxnResponse,
};

/// Operations a sweep packs into one txn at most (each orphan is one nested txn of ≤ 3 compares and
/// ≤ 2 writes; 40 × 2 writes stays well inside etcd's 128-ops limit, DESIGN §5).
pub const SWEEP_BATCH: usize = 40;

/// What one binding attempt expects to find and will write.
///
/// `expect_key` is the key record's value the txn requires (`None`: the key record must be absent);
/// `expect_id` is what the record of `id` must hold (`None`: absent). On success the store holds
/// `id/<id> = key`, `key/<k> = id` and (if a holder is given) the holder's reference.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BindPlan {
    pub expect_key: Option<u64>,
    pub id: u64,
    pub expect_id: Option<IdRecord>,
    /// When the key moves off an ID that belongs to another key (or holds a record idalloc cannot
    /// read): that ID and the mod revision of the record that proved it, as read from the store.
    /// The txn compares that mod revision (and reads the record back on failure), so the move
    /// happens only if the record is still exactly the one read. A mod revision rather than the
    /// value: an unreadable record has no value the plan could spell, and comparing a value it
    /// made up would fail forever (a key record naming an unreadable ID).
    pub moved_from: Option<(u64, Revision)>,
}

/// The holder reference a bind writes: `ref/<k>/<holder>`, on `lease` (0: durable).
#[derive(Clone, Copy, Debug)]
pub struct RefTarget<'a> {
    pub holder: &'a str,
    pub lease: LeaseId,
}

/// The decision for the next attempt of a bind loop.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Decision {
    /// Send this plan.
    Send(BindPlan),
    /// The key needs a fresh ID: pick a free candidate `C`, then send
    /// `BindPlan { expect_key, id: C, expect_id: None, moved_from }`.
    NeedCandidate { expect_key: Option<u64>, moved_from: Option<(u64, IdRecord)> },
}

/// Decides the next bind attempt for `key`.
///
/// - `key_rec`: the key record's value as last observed or, before any observation, as the cache
///   believes (`None`: absent).
/// - `id_state(id)`: what is known of an ID's record (observed, else from the cache; `None` if
///   nothing is known, which for an ID the key record points at is read optimistically as "bound to
///   this key", the common case).
/// - `preferred`: the ID this process held for the key before (recovery after lost data, §7).
pub fn decide(
    key: &str,
    key_rec: Option<u64>,
    id_state: impl Fn(u64) -> Option<Option<IdRecord>>,
    preferred: Option<u64>,
) -> Decision {
    let ours = |rec: &Option<IdRecord>| match rec {
        None => true,
        Some(IdRecord::Bound(k)) | Some(IdRecord::Tombstone(k)) => k == key,
    };
    match key_rec {
        Some(x) => {
            let state = id_state(x).unwrap_or_else(|| Some(IdRecord::Bound(key.to_string())));
            match state {
                Some(rec) if !ours(&Some(rec.clone())) => {
                    // The key record points at an ID that now belongs to another key (only
                    // possible after store data loss): the key moves to a fresh ID, and the move's
                    // txn pins that record, so it happens only if the ID is still the other key's.
                    Decision::NeedCandidate { expect_key: Some(x), moved_from: Some((x, rec)) }
                }
                state => Decision::Send(BindPlan {
                    expect_key: Some(x),
                    id: x,
                    expect_id: state,
                    moved_from: None,
                }),
            }
        }
        None => match preferred {
            Some(p) => {
                let state = id_state(p).unwrap_or(None);
                if ours(&state) {
                    Decision::Send(BindPlan {
                        expect_key: None,
                        id: p,
                        expect_id: state,
                        moved_from: None,
                    })
                } else {
                    Decision::NeedCandidate { expect_key: None, moved_from: None }
                }
            }
            None => Decision::NeedCandidate { expect_key: None, moved_from: None },
        },
    }
}

use crate::layout::encode_id as id_value;

/// True if `id` is one `spec` hands out: its prefix bits, its raw part in range and not reserved.
/// A key record naming any other ID is refused (DESIGN §11, G3).
pub fn id_is_allocatable(spec: &crate::pool::PoolSpec, id: u64) -> bool {
    spec.strip_prefix(id).is_some_and(|raw| spec.is_allocatable(raw))
}
pub use crate::layout::parse_id_value;

fn id_compare(layout: &Layout, pool: &str, id: u64, expect: &Option<IdRecord>) -> Compare {
    let key = layout.id_key(pool, id);
    match expect {
        None => Compare::absent(key),
        Some(rec) => Compare::value_is(key, rec.encode()),
    }
}

fn key_compare(layout: &Layout, pool: &str, key: &str, expect: Option<u64>) -> Compare {
    let k = layout.key_key(pool, key);
    match expect {
        None => Compare::absent(k),
        Some(id) => Compare::value_is(k, id_value(id)),
    }
}

/// What every write of a pool is conditioned on besides the records it touches (DESIGN §11).
///
/// - `spec_rev`: the mod revision of the pool's spec record that the decision was made against.
///   A resize rewrites the record and a deleted and re-created pool gets a new one, so
///   `mod_revision(pools/p) == spec_rev` in the same txn means "the pool I decided for still
///   exists, with the range I decided for": a write can never land in a deleted pool, in its
///   successor, or outside the range of a pool shrunk meanwhile (docs/design/resize.md).
/// - `seen`: the newest store revision the sender had seen before sending (`L`: txn headers, reads,
///   the cache's applied revision). Records compared `mod_revision <= L` were not written after the
///   send, so an attempt the store applies late fails against anything written after it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Fences {
    pub spec_rev: Option<Revision>,
    pub seen: Option<Revision>,
}

/// `mod_revision(pools/p) == rev`: the spec version a write was decided against is still the one
/// in force.
pub fn spec_compare(layout: &Layout, pool: &str, rev: Revision) -> Compare {
    Compare::new(
        KeyRange::key(layout.pool_spec_key(pool)),
        CompareOp::Equal,
        CompareTarget::ModRevision(rev),
    )
}

/// `mod_revision(key) <= seen` (true for an absent record, whose mod revision compares as 0).
pub fn unchanged_since(key: Vec<u8>, seen: Revision) -> Compare {
    Compare::new(
        KeyRange::key(key),
        CompareOp::Less,
        CompareTarget::ModRevision(seen.saturating_add(1)),
    )
}

/// Reads a spec record that a failed txn read back: `None` if it is the version the txn was
/// decided against, else `Some(record)` there now (`Some(None)`: the pool is gone; a record with
/// the same create revision: the pool was resized).
fn spec_changed(kv: Option<&KeyValue>, spec_rev: Revision) -> Option<Option<KeyValue>> {
    match kv {
        Some(kv) if kv.mod_revision == spec_rev => None,
        Some(kv) => Some(Some(kv.clone())),
        None => Some(None),
    }
}

impl BindPlan {
    /// True if a success of this plan creates the key's binding (rather than joining or repairing
    /// an existing one): what `acquire` reports as `new`.
    pub fn creates_binding(&self) -> bool {
        self.expect_key != Some(self.id)
    }

    /// The txn: `If key record == expect_key ∧ id record == expect_id Then write what is missing
    /// Else read both back`. Unfenced: the driver always sends [`BindPlan::txn_fenced`]; the tests
    /// check the plain shape with it.
    #[cfg(test)]
    pub fn txn(
        &self,
        layout: &Layout,
        pool: &str,
        key: &str,
        holder: Option<RefTarget<'_>>,
    ) -> TxnRequest {
        self.txn_fenced(layout, pool, key, holder, Fences::default())
    }

    /// The bind txn (`If key record == expect_key ∧ id record == expect_id Then write what is
    /// missing Else read back`) with fences (see [`Fences`]):
    /// - the pool's spec record is the one decided against (`spec_rev`);
    /// - when the plan expects an existing key record, that record is unchanged since `seen`: every
    ///   release rewrites or deletes it, so a join the store applies late fails;
    /// - with a holder, the holder's fence record is unchanged since `seen`: releases of that
    ///   holder bump it, so a create applied late — after the key's last release deleted every
    ///   record it compares — fails too (docs/design/fences.md, "Late commits"); and so is the
    ///   pool's fence floor, which a fold of the holder records bumps (see `fold_fences_txn`).
    ///
    /// The else branch reads back the key and ID records (and the moved-from ID, the spec and the
    /// holder record when compared), which [`BindPlan::outcome_fenced`] turns into the next input.
    pub fn txn_fenced(
        &self,
        layout: &Layout,
        pool: &str,
        key: &str,
        holder: Option<RefTarget<'_>>,
        fences: Fences,
    ) -> TxnRequest {
        let bound = IdRecord::Bound(key.to_string());
        let mut then = Vec::with_capacity(3);
        if self.expect_id.as_ref() != Some(&bound) {
            // A plain put (lease 0) also detaches a tombstone from its quarantine lease.
            then.push(TxnOp::put(layout.id_key(pool, self.id), bound.encode()));
        }
        if self.expect_key != Some(self.id) {
            then.push(TxnOp::put(layout.key_key(pool, key), id_value(self.id)));
        }
        if let Some(h) = holder {
            then.push(TxnOp::put_on_lease(
                layout.ref_key(pool, key, h.holder),
                id_value(self.id),
                h.lease,
            ));
        }
        let mut compare = vec![
            key_compare(layout, pool, key, self.expect_key),
            id_compare(layout, pool, self.id, &self.expect_id),
        ];
        let mut read_back = vec![
            TxnOp::get_key(layout.key_key(pool, key)),
            TxnOp::get_key(layout.id_key(pool, self.id)),
        ];
        if let (Some(_), Some(seen)) = (self.expect_key, fences.seen) {
            compare.push(unchanged_since(layout.key_key(pool, key), seen));
        }
        if let Some((from, rev)) = self.moved_from {
            compare.push(Compare::mod_revision_is(layout.id_key(pool, from), rev));
            read_back.push(TxnOp::get_key(layout.id_key(pool, from)));
        }
        if let Some(rev) = fences.spec_rev {
            compare.push(spec_compare(layout, pool, rev));
            read_back.push(TxnOp::get_key(layout.pool_spec_key(pool)));
        }
        if let (Some(h), Some(seen)) = (holder, fences.seen) {
            // The holder's own reference too, as a release compares it: a bind of this holder
            // sent before the reference was last written and applied after it fails. Without
            // it, a bind of a previous life of a process that keeps its holder name
            // (`AllocatorOptions::holder`) or of a lease it lost, applied after the new life
            // re-referenced the key, would move the reference back onto the old lease, whose
            // end then takes a reference the new life holds (G2; found by the model checker).
            compare.push(unchanged_since(layout.ref_key(pool, key, h.holder), seen));
            compare.push(unchanged_since(layout.holder_key(pool, h.holder), seen));
            // The pool's fence floor stands in for every holder record a fold deleted.
            compare.push(unchanged_since(layout.fence_floor_key(pool), seen));
        }
        TxnRequest::new().when(compare).and_then(then).or_else(read_back)
    }

    /// Reads the response of [`BindPlan::txn`]: bound, or what the records hold now (tests only,
    /// like the unfenced txn).
    #[cfg(test)]
    pub fn outcome(&self, resp: &TxnResponse) -> Result<BindOutcome, ProtocolError> {
        self.outcome_fenced(resp, Fences::default())
    }

    /// Reads the response of [`BindPlan::txn_fenced`] sent with `fences`: bound, the pool gone
    /// (or replaced), or what the records hold now. An unreadable ID record read back counts as
    /// taken by another key (never as free, never as an error: DESIGN §11).
    pub fn outcome_fenced(
        &self,
        resp: &TxnResponse,
        fences: Fences,
    ) -> Result<BindOutcome, ProtocolError> {
        if resp.succeeded {
            return Ok(BindOutcome::Bound { id: self.id, revision: resp.revision });
        }
        if let Some(rev) = fences.spec_rev {
            let at = 2 + usize::from(self.moved_from.is_some());
            if let Some(spec_now) = spec_changed(single(resp, at)?, rev) {
                return Ok(BindOutcome::PoolGone { spec_now });
            }
        }
        let key_kv = single(resp, 0)?;
        let id_kv = single(resp, 1)?;
        let key_rec = match key_kv {
            None => None,
            Some(kv) => {
                Some(parse_id_value(&kv.value).ok_or_else(|| ProtocolError::bad_record(kv))?)
            }
        };
        let id_rec = id_kv.map(|kv| read_id_record(&kv.value));
        let records_revision = id_kv.map_or(0, |kv| kv.mod_revision);
        let moved_from = match &self.moved_from {
            None => None,
            Some((from, _)) => {
                let kv = single(resp, 2)?;
                let rec = kv.map(|kv| read_id_record(&kv.value));
                Some((*from, rec, kv.map_or(0, |kv| kv.mod_revision)))
            }
        };
        Ok(BindOutcome::Observed(Observation {
            key_rec,
            id: self.id,
            id_rec,
            revision: resp.revision,
            records_revision,
            moved_from,
        }))
    }
}

/// What a bind attempt came to.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum BindOutcome {
    /// The binding and reference are in place, as of `revision`.
    Bound { id: u64, revision: Revision },
    /// The compares failed; these are the records as of `revision`.
    Observed(Observation),
    /// The pool's spec record is no longer the one decided against: `None`, the pool was deleted;
    /// `Some(spec)`, it was deleted and re-created (with this spec). Nothing was written.
    PoolGone { spec_now: Option<KeyValue> },
}

/// An ID record as a bind reads it back: a record idalloc cannot read (edited by hand, truncated)
/// is treated as bound to a key no real key can equal, so the ID counts as taken and the bind
/// picks another (DESIGN §11: an unreadable ID record counts as used; it never aborts a bind).
pub fn read_id_record(value: &[u8]) -> IdRecord {
    IdRecord::decode(value).unwrap_or_else(|| IdRecord::Bound(UNREADABLE.to_string()))
}

/// The key an unreadable ID record stands for in decisions: empty, which no valid key is, so it
/// never equals the key being bound.
pub const UNREADABLE: &str = "";

/// The records a failed bind read back.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Observation {
    pub key_rec: Option<u64>,
    pub id: u64,
    pub id_rec: Option<IdRecord>,
    pub revision: Revision,
    /// The ID record's mod revision (0 if absent): once the cache (which watches ID records) has
    /// applied this revision, it knows at least what this attempt learned about IDs.
    pub records_revision: Revision,
    /// The record of the ID the key was moving off and its mod revision (0: absent), as read
    /// back (if the plan moved the key).
    pub moved_from: Option<(u64, Option<IdRecord>, Revision)>,
}

/// A response that does not have the shape the txn asked for, or a record that does not parse: the
/// store holds something idalloc did not write (or a bug). Never guessed around.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ProtocolError {
    #[error("unexpected store response: {0}")]
    Shape(String),
    #[error("record {key:?} holds {value:?}, which idalloc cannot read")]
    BadRecord { key: String, value: String },
}

impl ProtocolError {
    fn bad_record(kv: &KeyValue) -> Self {
        ProtocolError::BadRecord {
            key: String::from_utf8_lossy(&kv.key).into_owned(),
            value: String::from_utf8_lossy(&kv.value).into_owned(),
        }
    }
}

/// A record idalloc cannot read is [`Error::Corrupt`]; a response of the wrong shape is an
/// [`Error::Unavailable`] that retrying cannot cure (the store does not answer as etcd does).
impl From<ProtocolError> for Error {
    fn from(e: ProtocolError) -> Self {
        match e {
            ProtocolError::BadRecord { key, value } => Error::corrupt(
                key,
                format!("it holds {value:?}, which idalloc cannot read; run `idalloc check`"),
            ),
            ProtocolError::Shape(_) => Error::unavailable_for_good(e.to_string()),
        }
    }
}

fn get_at(resp: &TxnResponse, i: usize) -> Result<&GetResponse, ProtocolError> {
    match resp.responses.get(i) {
        Some(OpResponse::Get(g)) => Ok(g),
        other => Err(ProtocolError::Shape(format!("expected a get result at {i}, got {other:?}"))),
    }
}

fn single(resp: &TxnResponse, i: usize) -> Result<Option<&KeyValue>, ProtocolError> {
    Ok(get_at(resp, i)?.kvs.first())
}

/// How a release txn should treat the binding when it finds itself the last holder.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LastRelease {
    /// `idle_grace == 0`: delete the binding in the same txn; the ID record is deleted, or replaced
    /// by a tombstone on this quarantine lease when the pool has a reuse delay.
    Reclaim { tombstone_lease: Option<LeaseId> },
    /// `idle_grace > 0`: keep the binding but rewrite the key record, so its mod revision marks the
    /// moment it became idle; the sweeper's compare on it then sees any later use.
    Touch,
}

/// One holder giving up its reference.
#[derive(Clone, Debug)]
pub struct ReleasePlan<'a> {
    pub key: &'a str,
    pub id: u64,
    pub holder: &'a str,
    pub last: LastRelease,
    /// Take the last-holder branch only if the holder's reference exists. Durable releases set this,
    /// so a holder that never held the key cannot reclaim a binding others left idle; a process's own
    /// leased release does not, since a lost lease may have taken its reference already.
    pub require_own_ref: bool,
    /// The spec and the sender's seen revision (see [`Fences`]). With `seen`, the release acts only
    /// if the holder's reference is unchanged since then: a re-acquire re-puts the reference, so a
    /// release the store applies late (after the holder acquired the key again) does nothing.
    pub fences: Fences,
    /// Bump the holder's fence record (`Some(lease)`: put it, on that lease, 0 for durable), so
    /// that binds of this holder sent before this release and applied after it fail.
    pub bump: Option<LeaseId>,
}

impl ReleasePlan<'_> {
    /// ```text
    /// If key/k == ID ∧ no other reference [∧ own reference exists] [∧ id/ID == k]
    ///    [∧ spec unchanged] [∧ mod_revision(own reference) <= seen]
    /// Then delete own reference, reclaim-or-touch, [bump holder record]
    /// Else get key/k, get own reference, [get spec],
    ///      txn(If [spec unchanged] [∧ mod_revision(own reference) <= seen]
    ///          Then delete own reference, [bump holder record],
    ///               txn(If key/k == ID Then put key/k = ID))
    /// ```
    ///
    /// Nothing in the else branch writes unless the same fences hold, so a release applied late
    /// is harmless. The else branch reads the key record back because `ID` may come from a cache
    /// that lags: if the key was re-bound to another ID meanwhile, the caller learns it from the
    /// outcome ([`ReleaseOutcome::key_now`]) and can finish the last-holder reclaim (see
    /// `release_ref` in the allocator) instead of leaving a binding without references. A release
    /// that is not the last rewrites the key record (same value), the fence of late joins.
    pub fn txn(&self, layout: &Layout, pool: &str) -> TxnRequest {
        let own = layout.ref_key(pool, self.key, self.holder);
        let refs = layout.ref_prefix(pool, self.key);
        let mut after_own = own.clone();
        after_own.push(0);
        let mut guards = Vec::new();
        if let Some(rev) = self.fences.spec_rev {
            guards.push(spec_compare(layout, pool, rev));
        }
        if let Some(seen) = self.fences.seen {
            guards.push(unchanged_since(own.clone(), seen));
        }
        let mut compare = vec![
            key_compare(layout, pool, self.key, Some(self.id)),
            Compare::range_empty(KeyRange::range(refs.clone(), own.clone())),
            Compare::range_empty(KeyRange::range(after_own, prefix_end(&refs))),
        ];
        if self.require_own_ref {
            compare.push(Compare::new(
                KeyRange::key(own.clone()),
                CompareOp::Greater,
                CompareTarget::CreateRevision(0),
            ));
        }
        let bump = self.bump.map(|lease| {
            TxnOp::put_on_lease(layout.holder_key(pool, self.holder), Vec::new(), lease)
        });
        let mut then = vec![TxnOp::delete(own.clone())];
        match self.last {
            LastRelease::Reclaim { tombstone_lease } => {
                let bound = IdRecord::Bound(self.key.to_string());
                compare.push(id_compare(layout, pool, self.id, &Some(bound)));
                then.push(TxnOp::delete(layout.key_key(pool, self.key)));
                then.push(retire_id(layout, pool, self.id, self.key, tombstone_lease));
            }
            LastRelease::Touch => {
                then.push(TxnOp::put(layout.key_key(pool, self.key), id_value(self.id)))
            }
        }
        then.extend(bump.clone());
        compare.extend(guards.iter().cloned());
        let mut not_last = vec![TxnOp::delete(own.clone())];
        not_last.extend(bump);
        // Not the last holder: rewrite the key record (same value) so that a bind of this key
        // sent before now and applied later fails its fence (see `txn_fenced`).
        not_last.push(TxnOp::Txn(
            TxnRequest::new()
                .when([key_compare(layout, pool, self.key, Some(self.id))])
                .and_then([TxnOp::put(layout.key_key(pool, self.key), id_value(self.id))]),
        ));
        let mut otherwise =
            vec![TxnOp::get_key(layout.key_key(pool, self.key)), TxnOp::get_key(own)];
        if self.fences.spec_rev.is_some() {
            otherwise.push(TxnOp::get_key(layout.pool_spec_key(pool)));
        }
        otherwise.push(TxnOp::Txn(TxnRequest::new().when(guards).and_then(not_last)));
        TxnRequest::new().when(compare).and_then(then).or_else(otherwise)
    }

    /// Reads a release txn's response.
    pub fn outcome(&self, resp: &TxnResponse) -> Result<ReleaseOutcome, ProtocolError> {
        let reclaimed = resp.succeeded && matches!(self.last, LastRelease::Reclaim { .. });
        let mut out = ReleaseOutcome {
            had_ref: false,
            reclaimed,
            key_now: Some(self.id),
            revision: resp.revision,
            fenced_out: false,
            pool_gone: None,
        };
        if resp.succeeded {
            out.had_ref = match resp.responses.first() {
                Some(OpResponse::Delete { deleted }) => *deleted > 0,
                other => {
                    return Err(ProtocolError::Shape(format!(
                        "expected a delete result, got {other:?}"
                    )))
                }
            };
            return Ok(out);
        }
        out.key_now = match single(resp, 0)? {
            None => None,
            Some(kv) => {
                Some(parse_id_value(&kv.value).ok_or_else(|| ProtocolError::bad_record(kv))?)
            }
        };
        let own = single(resp, 1)?;
        let nested = match resp.responses.last() {
            Some(OpResponse::Txn(t)) => t.succeeded,
            other => {
                return Err(ProtocolError::Shape(format!(
                    "expected a nested txn result, got {other:?}"
                )))
            }
        };
        if nested {
            out.had_ref = own.is_some();
            return Ok(out);
        }
        if let Some(rev) = self.fences.spec_rev {
            if let Some(spec_now) = spec_changed(single(resp, 2)?, rev) {
                out.pool_gone = Some(spec_now);
                return Ok(out);
            }
        }
        // The spec holds, so the reference changed after `seen`.
        out.fenced_out = true;
        Ok(out)
    }
}

/// What a release did.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ReleaseOutcome {
    /// The holder's reference existed (and is gone now).
    pub had_ref: bool,
    /// The binding was deleted in the same txn.
    pub reclaimed: bool,
    /// The key record's ID as this txn saw it before writing (`None`: the key is unbound). When it
    /// differs from the plan's ID, the plan was made on stale knowledge.
    pub key_now: Option<u64>,
    pub revision: Revision,
    /// Nothing was written: the holder's reference was written after the plan's `seen` revision
    /// (by a bind of this holder the sender had not seen answered). A fresh attempt, sent with a
    /// `seen` at least this response's revision, decides again.
    pub fenced_out: bool,
    /// Nothing was written: the pool's spec is not the one decided against (see
    /// [`BindOutcome::PoolGone`]).
    pub pool_gone: Option<Option<KeyValue>>,
}

/// A reference without a binding (`release_durable` found no key record): `If [spec unchanged]
/// [∧ mod_revision(ref) <= seen] Then delete ref, [bump holder record] Else get spec`. Fenced like
/// every release, so a late apply never deletes a reference acquired after it.
pub fn stray_ref_release_txn(
    layout: &Layout,
    pool: &str,
    key: &str,
    holder: &str,
    fences: Fences,
    bump: Option<LeaseId>,
) -> TxnRequest {
    let own = layout.ref_key(pool, key, holder);
    let mut guards = Vec::new();
    if let Some(rev) = fences.spec_rev {
        guards.push(spec_compare(layout, pool, rev));
    }
    if let Some(seen) = fences.seen {
        guards.push(unchanged_since(own.clone(), seen));
    }
    let mut then = vec![TxnOp::delete(own.clone())];
    if let Some(lease) = bump {
        then.push(TxnOp::put_on_lease(layout.holder_key(pool, holder), Vec::new(), lease));
    }
    TxnRequest::new()
        .when(guards)
        .and_then(then)
        .or_else([TxnOp::get_key(own), TxnOp::get_key(layout.pool_spec_key(pool))])
}

/// What [`stray_ref_release_txn`] did: like [`ReleasePlan::outcome`] (`key_now` always `None`).
pub fn stray_ref_release_outcome(
    resp: &TxnResponse,
    fences: Fences,
) -> Result<ReleaseOutcome, ProtocolError> {
    let mut out = ReleaseOutcome {
        had_ref: false,
        reclaimed: false,
        key_now: None,
        revision: resp.revision,
        fenced_out: false,
        pool_gone: None,
    };
    if resp.succeeded {
        out.had_ref =
            matches!(resp.responses.first(), Some(OpResponse::Delete { deleted }) if *deleted > 0);
        return Ok(out);
    }
    if let Some(rev) = fences.spec_rev {
        if let Some(spec_now) = spec_changed(single(resp, 1)?, rev) {
            out.pool_gone = Some(spec_now);
            return Ok(out);
        }
    }
    out.fenced_out = true;
    Ok(out)
}

/// Frees an ID record: delete it, or (reuse delay) replace it by a tombstone that still names the key
/// and disappears with the quarantine lease.
fn retire_id(
    layout: &Layout,
    pool: &str,
    id: u64,
    key: &str,
    tombstone_lease: Option<LeaseId>,
) -> TxnOp {
    match tombstone_lease {
        None => TxnOp::delete(layout.id_key(pool, id)),
        Some(lease) => TxnOp::put_on_lease(
            layout.id_key(pool, id),
            IdRecord::Tombstone(key.to_string()).encode(),
            lease,
        ),
    }
}

/// One binding the sweeper found without references, as of its snapshot.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Orphan {
    pub key: String,
    /// The key record's value and mod revision (`None`: no key record, only a stray ID record).
    pub key_rec: Option<(u64, Revision)>,
    /// The ID record to retire with it, and its mod revision. Only an ID record that names this key
    /// is touched.
    pub id_rec: Option<(u64, Revision)>,
}

/// A sweep batch: one outer txn holding one nested txn per orphan. etcd evaluates every nested
/// compare against the state before the txn, so each orphan is reclaimed only if its records are
/// exactly as the snapshot saw them and it still has no reference; the others are untouched.
///
/// With `spec_rev`, the whole batch is conditional on the pool's spec (`Else get spec`), so a sweep
/// never writes into a deleted or re-created pool.
pub fn sweep_txn(
    layout: &Layout,
    pool: &str,
    orphans: &[Orphan],
    tombstone_lease: Option<LeaseId>,
    spec_rev: Option<Revision>,
) -> TxnRequest {
    let nested = orphans.iter().map(|o| {
        let mut compare =
            vec![Compare::range_empty(KeyRange::prefix(layout.ref_prefix(pool, &o.key)))];
        let mut then = Vec::with_capacity(2);
        match o.key_rec {
            Some((_, rev)) => {
                compare.push(Compare::mod_revision_is(layout.key_key(pool, &o.key), rev));
                then.push(TxnOp::delete(layout.key_key(pool, &o.key)));
            }
            None => compare.push(Compare::absent(layout.key_key(pool, &o.key))),
        }
        if let Some((id, rev)) = o.id_rec {
            compare.push(Compare::mod_revision_is(layout.id_key(pool, id), rev));
            then.push(retire_id(layout, pool, id, &o.key, tombstone_lease));
        }
        TxnOp::Txn(TxnRequest::new().when(compare).and_then(then))
    });
    let txn = TxnRequest::new().and_then(nested);
    match spec_rev {
        None => txn,
        Some(rev) => txn
            .when([spec_compare(layout, pool, rev)])
            .or_else([TxnOp::get_key(layout.pool_spec_key(pool))]),
    }
}

/// Folds every holder fence record of `pool` into its fence floor:
/// `If create_revision(spec) == spec_rev Then delete holder/ (the whole range), put fence Else get
/// spec`. One txn of three ops whatever the number of records, so etcd's per-txn limits never
/// bind.
///
/// Why no late bind can commit after it: a bind of holder `h` sent having seen revision `L`
/// compares `mod_revision(holder/h) <= L` and `mod_revision(fence) <= L`. The per-holder fence
/// matters only for a release of `h` at some `r > L`; its record then has a mod revision `>= r`
/// until deleted, and the only deletions are this fold (which puts the floor at its own revision
/// `d > r > L` in the same txn; the floor is never deleted but with the pool and only ever moves
/// up) and the pool's delete (which fails the bind's spec compare). So a bind applied after the
/// release fails on the holder record, the floor or the spec. Deleting *every* holder record, also
/// ones written after the sweep's snapshot, is therefore as safe as deleting none; the price is
/// that every bind in flight across the fold (any holder) fails once and is decided again with a
/// seen revision past the fold.
pub fn fold_fences_txn(layout: &Layout, pool: &str, spec_rev: Revision) -> TxnRequest {
    TxnRequest::new()
        .when([spec_compare(layout, pool, spec_rev)])
        .and_then([
            TxnOp::delete_range(KeyRange::prefix(layout.holders_prefix(pool))),
            TxnOp::put(layout.fence_floor_key(pool), Vec::new()),
        ])
        .or_else([TxnOp::get_key(layout.pool_spec_key(pool))])
}

/// What a fold came to: `Ok(n)`, `n` holder records deleted; `Err(spec_now)` if the pool's spec
/// is not the one the fold was decided for (nothing was written; `spec_now` as read back).
pub fn fold_outcome(resp: &TxnResponse) -> Result<Result<i64, Option<KeyValue>>, ProtocolError> {
    if !resp.succeeded {
        return Ok(Err(single(resp, 0)?.cloned()));
    }
    match resp.responses.first() {
        Some(OpResponse::Delete { deleted }) => Ok(Ok(*deleted)),
        other => {
            Err(ProtocolError::Shape(format!("expected the fold's delete result, got {other:?}")))
        }
    }
}

/// Which orphans of a sweep batch were reclaimed; `None` if the pool's spec was not the one the
/// sweep was decided against (nothing was written).
pub fn sweep_outcome(resp: &TxnResponse, batch: usize) -> Result<Option<Vec<bool>>, ProtocolError> {
    if !resp.succeeded {
        return Ok(None);
    }
    if resp.responses.len() != batch {
        return Err(ProtocolError::Shape(format!(
            "sweep expected {batch} nested results, got {}",
            resp.responses.len()
        )));
    }
    resp.responses
        .iter()
        .map(|r| match r {
            OpResponse::Txn(t) => Ok(t.succeeded),
            other => {
                Err(ProtocolError::Shape(format!("expected a nested txn result, got {other:?}")))
            }
        })
        .collect::<Result<Vec<bool>, ProtocolError>>()
        .map(Some)
}

/// `init_pool`: `If pools/p absent Then put spec Else get pools/p`.
pub fn init_pool_txn(layout: &Layout, pool: &str, spec_json: Vec<u8>) -> TxnRequest {
    let key = layout.pool_spec_key(pool);
    TxnRequest::new()
        .when([Compare::absent(key.clone())])
        .and_then([TxnOp::put(key.clone(), spec_json)])
        .or_else([TxnOp::get_key(key)])
}

/// What `init_pool` found: `None` if it created the pool (its create revision is the txn's), else
/// the existing spec's record:
/// its create revision is the pool's incarnation, its mod revision the spec version in force.
pub fn init_pool_record(resp: &TxnResponse) -> Result<Option<&KeyValue>, ProtocolError> {
    if resp.succeeded {
        return Ok(None);
    }
    match single(resp, 0)? {
        Some(kv) => Ok(Some(kv)),
        None => {
            Err(ProtocolError::Shape("init_pool: compare failed but the spec is missing".into()))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn layout() -> Layout {
        Layout::new("t").expect("valid prefix")
    }

    fn bound(k: &str) -> IdRecord {
        IdRecord::Bound(k.into())
    }

    #[test]
    fn only_ids_the_pool_hands_out_are_allocatable() {
        let spec = crate::pool::PoolSpec::new("p", 200, 300).reserve(250..=251).prefix(1 << 20);
        assert!(id_is_allocatable(&spec, (1 << 20) | 200));
        assert!(id_is_allocatable(&spec, (1 << 20) | 300));
        assert!(!id_is_allocatable(&spec, 200), "without the prefix bits");
        assert!(!id_is_allocatable(&spec, (1 << 20) | 78), "below the range");
        assert!(!id_is_allocatable(&spec, (1 << 20) | 301), "above the range");
        assert!(!id_is_allocatable(&spec, (1 << 20) | 250), "reserved");
    }

    #[test]
    fn decide_attaches_to_a_binding_the_cache_knows() {
        let d = decide("k", Some(7), |_| None, None);
        assert_eq!(
            d,
            Decision::Send(BindPlan {
                expect_key: Some(7),
                id: 7,
                expect_id: Some(bound("k")),
                moved_from: None
            })
        );
    }

    #[test]
    fn decide_needs_a_candidate_for_a_new_key() {
        assert_eq!(
            decide("k", None, |_| None, None),
            Decision::NeedCandidate { expect_key: None, moved_from: None }
        );
    }

    #[test]
    fn decide_repairs_a_missing_id_record_with_the_same_id() {
        let d = decide("k", Some(7), |_| Some(None), None);
        assert_eq!(
            d,
            Decision::Send(BindPlan {
                expect_key: Some(7),
                id: 7,
                expect_id: None,
                moved_from: None
            })
        );
        let d = decide("k", Some(7), |_| Some(Some(IdRecord::Tombstone("k".into()))), None);
        assert_eq!(
            d,
            Decision::Send(BindPlan {
                expect_key: Some(7),
                id: 7,
                expect_id: Some(IdRecord::Tombstone("k".into())),
                moved_from: None
            })
        );
    }

    #[test]
    fn decide_moves_a_key_whose_id_went_to_another_key() {
        let d = decide("k", Some(7), |_| Some(Some(bound("other"))), None);
        assert_eq!(
            d,
            Decision::NeedCandidate { expect_key: Some(7), moved_from: Some((7, bound("other"))) }
        );
        let d = decide("k", None, |_| Some(Some(bound("other"))), Some(7));
        assert_eq!(d, Decision::NeedCandidate { expect_key: None, moved_from: None });
        let d = decide("k", None, |_| Some(Some(IdRecord::Tombstone("other".into()))), Some(7));
        assert_eq!(d, Decision::NeedCandidate { expect_key: None, moved_from: None });
    }

    #[test]
    fn decide_recreates_a_lost_binding_with_the_preferred_id() {
        let d = decide("k", None, |_| None, Some(9));
        assert_eq!(
            d,
            Decision::Send(BindPlan { expect_key: None, id: 9, expect_id: None, moved_from: None })
        );
        let d = decide("k", None, |_| Some(Some(IdRecord::Tombstone("k".into()))), Some(9));
        assert_eq!(
            d,
            Decision::Send(BindPlan {
                expect_key: None,
                id: 9,
                expect_id: Some(IdRecord::Tombstone("k".into())),
                moved_from: None
            })
        );
    }

    #[test]
    fn new_key_txn_is_create_only_on_both_records_with_three_puts() {
        let l = layout();
        let plan = BindPlan { expect_key: None, id: 5, expect_id: None, moved_from: None };
        let txn = plan.txn(&l, "p", "k", Some(RefTarget { holder: "h", lease: 42 }));
        assert_eq!(
            txn.compare,
            vec![Compare::absent(l.key_key("p", "k")), Compare::absent(l.id_key("p", 5))]
        );
        assert_eq!(
            txn.success,
            vec![
                TxnOp::put(l.id_key("p", 5), bound("k").encode()),
                TxnOp::put(l.key_key("p", "k"), b"5".to_vec()),
                TxnOp::put_on_lease(l.ref_key("p", "k", "h"), b"5".to_vec(), 42),
            ]
        );
        assert_eq!(
            txn.failure,
            vec![TxnOp::get_key(l.key_key("p", "k")), TxnOp::get_key(l.id_key("p", 5))]
        );
        assert!(plan.creates_binding());
    }

    #[test]
    fn moving_a_key_pins_the_record_that_proves_its_id_is_taken() {
        let l = layout();
        let plan =
            BindPlan { expect_key: Some(7), id: 8, expect_id: None, moved_from: Some((7, 4)) };
        let txn = plan.txn(&l, "p", "k", None);
        assert!(txn.compare.contains(&Compare::mod_revision_is(l.id_key("p", 7), 4)));
        assert_eq!(txn.failure.last(), Some(&TxnOp::get_key(l.id_key("p", 7))));
        // The read-back of the old ID feeds the next decision.
        let resp = TxnResponse {
            succeeded: false,
            responses: vec![
                OpResponse::Get(GetResponse {
                    kvs: vec![kv(l.key_key("p", "k"), b"7".to_vec())],
                    ..Default::default()
                }),
                OpResponse::Get(GetResponse::default()),
                OpResponse::Get(GetResponse {
                    kvs: vec![kv(l.id_key("p", 7), bound("k").encode())],
                    ..Default::default()
                }),
            ],
            revision: 9,
        };
        match plan.outcome(&resp) {
            Ok(BindOutcome::Observed(obs)) => {
                assert_eq!(obs.moved_from, Some((7, Some(bound("k")), 3)));
                assert_eq!(obs.key_rec, Some(7));
            }
            other => panic!("expected an observation, got {other:?}"),
        }
    }

    #[test]
    fn attach_txn_writes_only_the_reference() {
        let l = layout();
        let plan =
            BindPlan { expect_key: Some(5), id: 5, expect_id: Some(bound("k")), moved_from: None };
        let txn = plan.txn(&l, "p", "k", Some(RefTarget { holder: "h", lease: 0 }));
        assert_eq!(
            txn.compare,
            vec![
                Compare::value_is(l.key_key("p", "k"), b"5".to_vec()),
                Compare::value_is(l.id_key("p", 5), bound("k").encode())
            ]
        );
        assert_eq!(txn.success, vec![TxnOp::put(l.ref_key("p", "k", "h"), b"5".to_vec())]);
        assert!(!plan.creates_binding());
    }

    fn kv(key: Vec<u8>, value: Vec<u8>) -> KeyValue {
        KeyValue { key, value, create_revision: 3, mod_revision: 3, version: 1, lease: 0 }
    }

    #[test]
    fn failed_bind_reports_what_it_read() {
        let l = layout();
        let plan = BindPlan { expect_key: None, id: 5, expect_id: None, moved_from: None };
        let resp = TxnResponse {
            succeeded: false,
            responses: vec![
                OpResponse::Get(GetResponse { kvs: vec![], count: 0, more: false, revision: 9 }),
                OpResponse::Get(GetResponse {
                    kvs: vec![kv(l.id_key("p", 5), IdRecord::Tombstone("x".into()).encode())],
                    count: 1,
                    more: false,
                    revision: 9,
                }),
            ],
            revision: 9,
        };
        assert_eq!(
            plan.outcome(&resp),
            Ok(BindOutcome::Observed(Observation {
                key_rec: None,
                id: 5,
                id_rec: Some(IdRecord::Tombstone("x".into())),
                revision: 9,
                records_revision: 3,
                moved_from: None,
            }))
        );
    }

    #[test]
    fn unreadable_key_record_is_an_error_not_a_guess() {
        let l = layout();
        let plan = BindPlan { expect_key: None, id: 5, expect_id: None, moved_from: None };
        let resp = TxnResponse {
            succeeded: false,
            responses: vec![
                OpResponse::Get(GetResponse {
                    kvs: vec![kv(l.key_key("p", "k"), b"five".to_vec())],
                    count: 1,
                    more: false,
                    revision: 9,
                }),
                OpResponse::Get(GetResponse::default()),
            ],
            revision: 9,
        };
        assert!(matches!(plan.outcome(&resp), Err(ProtocolError::BadRecord { .. })));
    }

    #[test]
    fn release_compares_exclude_only_the_own_reference() {
        let l = layout();
        let plan = ReleasePlan {
            key: "k",
            id: 5,
            holder: "h",
            last: LastRelease::Reclaim { tombstone_lease: None },
            require_own_ref: false,
            fences: Fences::default(),
            bump: None,
        };
        let txn = plan.txn(&l, "p");
        let own = l.ref_key("p", "k", "h");
        let refs = l.ref_prefix("p", "k");
        let before = &txn.compare[1].range;
        let after = &txn.compare[2].range;
        assert!(before.contains(&refs) && !before.contains(&own));
        let mut other = refs.clone();
        other.extend_from_slice(b"zzz");
        assert!(after.contains(&other) && !after.contains(&own));
        let mut own_child = own.clone();
        own_child.extend_from_slice(b"x");
        assert!(after.contains(&own_child), "a holder whose name extends ours is another holder");
        assert_eq!(
            txn.success,
            vec![
                TxnOp::delete(own.clone()),
                TxnOp::delete(l.key_key("p", "k")),
                TxnOp::delete(l.id_key("p", 5))
            ]
        );
        assert_eq!(
            txn.failure,
            vec![
                TxnOp::get_key(l.key_key("p", "k")),
                TxnOp::get_key(own.clone()),
                TxnOp::Txn(
                    TxnRequest::new().and_then([
                        TxnOp::delete(own),
                        // Not the last holder: the key record is rewritten (the fence of late binds).
                        TxnOp::Txn(
                            TxnRequest::new()
                                .when([Compare::value_is(l.key_key("p", "k"), b"5".to_vec())])
                                .and_then([TxnOp::put(l.key_key("p", "k"), b"5".to_vec())])
                        ),
                    ])
                ),
            ]
        );
    }

    #[test]
    fn a_release_writes_nothing_unless_its_reference_and_spec_are_as_seen() {
        let l = layout();
        let fences = Fences { spec_rev: Some(3), seen: Some(42) };
        let plan = ReleasePlan {
            key: "k",
            id: 5,
            holder: "h",
            last: LastRelease::Reclaim { tombstone_lease: None },
            require_own_ref: true,
            fences,
            bump: Some(0),
        };
        let txn = plan.txn(&l, "p");
        let own = l.ref_key("p", "k", "h");
        let spec = spec_compare(&l, "p", 3);
        let ref_fence = Compare::new(
            KeyRange::key(own.clone()),
            CompareOp::Less,
            CompareTarget::ModRevision(43),
        );
        assert!(txn.compare.contains(&spec) && txn.compare.contains(&ref_fence));
        let bump = TxnOp::put(l.holder_key("p", "h"), Vec::new());
        assert!(txn.success.contains(&bump));
        // The else branch writes only inside a nested txn guarded by the same fences.
        let mut writes_outside = 0;
        for op in &txn.failure {
            match op {
                TxnOp::Txn(t) => {
                    assert_eq!(t.compare, vec![spec.clone(), ref_fence.clone()]);
                    assert!(t.success.contains(&TxnOp::delete(own.clone())));
                    assert!(t.success.contains(&bump));
                }
                TxnOp::Get(_) => {}
                _ => writes_outside += 1,
            }
        }
        assert_eq!(writes_outside, 0);

        // Outcomes: nested txn failed with the spec in place -> fenced out; spec gone -> pool gone.
        let spec_kv = |create: Revision| KeyValue {
            key: l.pool_spec_key("p"),
            value: b"{}".to_vec(),
            create_revision: create,
            mod_revision: create,
            version: 1,
            lease: 0,
        };
        let failed = |spec: Option<KeyValue>, nested: bool| TxnResponse {
            succeeded: false,
            responses: vec![
                OpResponse::Get(GetResponse {
                    kvs: vec![kv(l.key_key("p", "k"), b"5".to_vec())],
                    ..Default::default()
                }),
                OpResponse::Get(GetResponse {
                    kvs: vec![kv(own.clone(), b"5".to_vec())],
                    ..Default::default()
                }),
                OpResponse::Get(GetResponse {
                    kvs: spec.into_iter().collect(),
                    ..Default::default()
                }),
                OpResponse::Txn(TxnResponse { succeeded: nested, ..Default::default() }),
            ],
            revision: 50,
        };
        let out = plan.outcome(&failed(Some(spec_kv(3)), false)).unwrap();
        assert!(out.fenced_out && !out.had_ref && out.pool_gone.is_none());
        let out = plan.outcome(&failed(None, false)).unwrap();
        assert_eq!(out.pool_gone, Some(None));
        let out = plan.outcome(&failed(Some(spec_kv(9)), false)).unwrap();
        assert_eq!(out.pool_gone, Some(Some(spec_kv(9))));
        // A resize keeps the create revision and moves the mod revision: the spec the release
        // was decided against is gone too (docs/design/resize.md).
        let resized = KeyValue { mod_revision: 12, ..spec_kv(3) };
        let out = plan.outcome(&failed(Some(resized.clone()), false)).unwrap();
        assert_eq!(out.pool_gone, Some(Some(resized)));
        let out = plan.outcome(&failed(Some(spec_kv(3)), true)).unwrap();
        assert!(out.had_ref && !out.fenced_out && !out.reclaimed);
    }

    #[test]
    fn a_fold_deletes_every_holder_record_and_bumps_the_floor_in_one_guarded_txn() {
        let l = layout();
        let txn = fold_fences_txn(&l, "p", 3);
        assert_eq!(txn.compare, vec![spec_compare(&l, "p", 3)]);
        assert_eq!(
            txn.success,
            vec![
                TxnOp::delete_range(KeyRange::prefix(l.holders_prefix("p"))),
                TxnOp::put(l.fence_floor_key("p"), Vec::new()),
            ]
        );
        // The floor lies outside the deleted range: etcd refuses a txn writing one key twice.
        assert!(!l.fence_floor_key("p").starts_with(&l.holders_prefix("p")));
        assert_eq!(txn.failure, vec![TxnOp::get_key(l.pool_spec_key("p"))]);
        let done = TxnResponse {
            succeeded: true,
            responses: vec![OpResponse::Delete { deleted: 7 }, OpResponse::Put],
            revision: 9,
        };
        assert_eq!(fold_outcome(&done), Ok(Ok(7)));
        let gone = TxnResponse {
            succeeded: false,
            responses: vec![OpResponse::Get(GetResponse::default())],
            revision: 9,
        };
        assert_eq!(fold_outcome(&gone), Ok(Err(None)));
    }

    #[test]
    fn binds_compare_the_spec_and_the_holder_fence_and_read_the_spec_back() {
        let l = layout();
        let fences = Fences { spec_rev: Some(3), seen: Some(42) };
        let create = BindPlan { expect_key: None, id: 5, expect_id: None, moved_from: None };
        let txn =
            create.txn_fenced(&l, "p", "k", Some(RefTarget { holder: "h", lease: 0 }), fences);
        assert!(txn.compare.contains(&spec_compare(&l, "p", 3)));
        assert!(txn.compare.contains(&Compare::new(
            KeyRange::key(l.holder_key("p", "h")),
            CompareOp::Less,
            CompareTarget::ModRevision(43)
        )));
        // ... and the holder's own reference (a bind of an earlier life of the same holder
        // name, or on a lease it lost, fails once the reference was written again) ...
        assert!(txn.compare.contains(&Compare::new(
            KeyRange::key(l.ref_key("p", "k", "h")),
            CompareOp::Less,
            CompareTarget::ModRevision(43)
        )));
        // ... and the pool's fence floor, which stands in for folded holder records.
        assert!(txn.compare.contains(&Compare::new(
            KeyRange::key(l.fence_floor_key("p")),
            CompareOp::Less,
            CompareTarget::ModRevision(43)
        )));
        assert_eq!(txn.failure.last(), Some(&TxnOp::get_key(l.pool_spec_key("p"))));
        let resp = TxnResponse {
            succeeded: false,
            responses: vec![
                OpResponse::Get(GetResponse::default()),
                OpResponse::Get(GetResponse::default()),
                OpResponse::Get(GetResponse::default()),
            ],
            revision: 50,
        };
        assert_eq!(
            create.outcome_fenced(&resp, fences),
            Ok(BindOutcome::PoolGone { spec_now: None })
        );
        // Without a holder there is no holder fence.
        let txn = create.txn_fenced(&l, "p", "k", None, fences);
        assert_eq!(txn.compare.len(), 3);
    }

    #[test]
    fn an_unreadable_id_record_read_back_counts_as_taken() {
        let l = layout();
        let plan = BindPlan { expect_key: None, id: 5, expect_id: None, moved_from: None };
        for garbage in [&b""[..], &[0xFF][..], &[0xC3, 0x28][..]] {
            let resp = TxnResponse {
                succeeded: false,
                responses: vec![
                    OpResponse::Get(GetResponse::default()),
                    OpResponse::Get(GetResponse {
                        kvs: vec![kv(l.id_key("p", 5), garbage.to_vec())],
                        ..Default::default()
                    }),
                ],
                revision: 9,
            };
            match plan.outcome(&resp) {
                Ok(BindOutcome::Observed(obs)) => {
                    let rec = obs.id_rec.expect("taken");
                    assert_ne!(rec.key(), "k");
                    assert_eq!(rec.key(), UNREADABLE);
                }
                other => panic!("expected an observation, got {other:?}"),
            }
        }
    }

    #[test]
    fn a_join_is_fenced_on_the_key_record_a_create_is_not() {
        let l = layout();
        let fence = Compare::new(
            KeyRange::key(l.key_key("p", "k")),
            CompareOp::Less,
            CompareTarget::ModRevision(43),
        );
        let join =
            BindPlan { expect_key: Some(5), id: 5, expect_id: Some(bound("k")), moved_from: None };
        let fences = Fences { spec_rev: None, seen: Some(42) };
        assert!(join.txn_fenced(&l, "p", "k", None, fences).compare.contains(&fence));
        assert!(!join.txn(&l, "p", "k", None).compare.contains(&fence));
        // A create compares the key record's absence already; a fence adds nothing there.
        let create = BindPlan { expect_key: None, id: 5, expect_id: None, moved_from: None };
        assert_eq!(create.txn_fenced(&l, "p", "k", None, fences).compare.len(), 2);
    }

    #[test]
    fn release_with_reuse_delay_writes_a_tombstone_on_the_quarantine_lease() {
        let l = layout();
        let plan = ReleasePlan {
            key: "k",
            id: 5,
            holder: "h",
            last: LastRelease::Reclaim { tombstone_lease: Some(77) },
            require_own_ref: true,
            fences: Fences::default(),
            bump: None,
        };
        let txn = plan.txn(&l, "p");
        assert!(txn.success.contains(&TxnOp::put_on_lease(
            l.id_key("p", 5),
            IdRecord::Tombstone("k".into()).encode(),
            77
        )));
        assert!(txn.compare.contains(&Compare::new(
            KeyRange::key(l.ref_key("p", "k", "h")),
            CompareOp::Greater,
            CompareTarget::CreateRevision(0)
        )));
    }

    #[test]
    fn release_outcome_tells_held_and_reclaimed() {
        let plan = ReleasePlan {
            key: "k",
            id: 5,
            holder: "h",
            last: LastRelease::Touch,
            require_own_ref: false,
            fences: Fences::default(),
            bump: None,
        };
        let resp = TxnResponse {
            succeeded: true,
            responses: vec![OpResponse::Delete { deleted: 1 }, OpResponse::Put],
            revision: 4,
        };
        assert_eq!(
            plan.outcome(&resp),
            Ok(ReleaseOutcome {
                had_ref: true,
                reclaimed: false,
                key_now: Some(5),
                revision: 4,
                fenced_out: false,
                pool_gone: None
            })
        );
        let plan = ReleasePlan { last: LastRelease::Reclaim { tombstone_lease: None }, ..plan };
        let nested_ok = OpResponse::Txn(TxnResponse { succeeded: true, ..Default::default() });
        let resp = TxnResponse {
            succeeded: false,
            responses: vec![
                OpResponse::Get(GetResponse::default()),
                OpResponse::Get(GetResponse::default()),
                nested_ok.clone(),
            ],
            revision: 4,
        };
        assert_eq!(
            plan.outcome(&resp),
            Ok(ReleaseOutcome {
                had_ref: false,
                reclaimed: false,
                key_now: None,
                revision: 4,
                fenced_out: false,
                pool_gone: None
            })
        );
        // The key was re-bound to another ID than the plan assumed: the outcome says which.
        let l = layout();
        let resp = TxnResponse {
            succeeded: false,
            responses: vec![
                OpResponse::Get(GetResponse {
                    kvs: vec![kv(l.key_key("p", "k"), b"7".to_vec())],
                    count: 1,
                    more: false,
                    revision: 4,
                }),
                OpResponse::Get(GetResponse {
                    kvs: vec![kv(l.ref_key("p", "k", "h"), b"7".to_vec())],
                    ..Default::default()
                }),
                nested_ok,
            ],
            revision: 4,
        };
        assert_eq!(
            plan.outcome(&resp),
            Ok(ReleaseOutcome {
                had_ref: true,
                reclaimed: false,
                key_now: Some(7),
                revision: 4,
                fenced_out: false,
                pool_gone: None
            })
        );
    }

    #[test]
    fn sweep_batch_is_one_txn_of_independent_nested_txns() {
        let l = layout();
        let orphans = vec![
            Orphan { key: "a".into(), key_rec: Some((1, 10)), id_rec: Some((1, 10)) },
            Orphan { key: "b".into(), key_rec: None, id_rec: Some((2, 11)) },
        ];
        let txn = sweep_txn(&l, "p", &orphans, None, None);
        assert!(txn.compare.is_empty());
        let guarded = sweep_txn(&l, "p", &orphans, None, Some(3));
        assert_eq!(guarded.compare, vec![spec_compare(&l, "p", 3)]);
        assert_eq!(guarded.failure, vec![TxnOp::get_key(l.pool_spec_key("p"))]);
        assert_eq!(txn.success.len(), 2);
        match &txn.success[1] {
            TxnOp::Txn(t) => {
                assert!(t.compare.contains(&Compare::absent(l.key_key("p", "b"))));
                assert_eq!(t.success, vec![TxnOp::delete(l.id_key("p", 2))]);
            }
            other => panic!("expected nested txn, got {other:?}"),
        }
        let resp = TxnResponse {
            succeeded: true,
            responses: vec![
                OpResponse::Txn(TxnResponse { succeeded: true, ..Default::default() }),
                OpResponse::Txn(TxnResponse::default()),
            ],
            revision: 12,
        };
        assert_eq!(sweep_outcome(&resp, 2), Ok(Some(vec![true, false])));
        assert_eq!(sweep_outcome(&TxnResponse::default(), 2), Ok(None));
        assert!(sweep_outcome(&resp, 3).is_err());
    }
}
