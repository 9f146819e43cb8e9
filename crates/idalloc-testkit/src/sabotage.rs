//! Protocol sabotage on the wire: a store hook that rewrites the allocator's txns so that they
//! break a guarantee on purpose. The simulation runs with it to prove that its checker catches
//! real violations (a checker that never fails proves nothing).
//!
//! The library carries no switch for this: the sabotage happens between the allocator and the
//! store, on the txns themselves, exactly as a buggy protocol would send them.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use idalloc::layout::{IdRecord, Layout};
use idalloc::store::{CompareOp, CompareTarget, Store, StoreResult, TxnOp, TxnRequest};

use crate::hooked::{Hook, HookedStore, Request};

/// Which part of the protocol to break.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Sabotage {
    /// Binds of a new key lose their "key record absent" compare: two nodes binding one new key
    /// at once both succeed, with different IDs (breaks G1).
    SkipKeyAbsentCompare,
    /// Reclaims delete the ID record instead of writing a tombstone: the ID is reusable at once,
    /// ignoring the pool's reuse delay (breaks G5).
    SkipReuseTombstone,
    /// Writes lose their compare on the pool spec's version (its record's mod revision): a bind
    /// racing a pool deletion writes into the deleted pool (breaks DESIGN §11, G4), one racing a
    /// shrink binds outside the narrowed range (breaks G3).
    SkipSpecCompare,
    /// Writes lose their late-commit fences (`mod_revision <= seen` on the records the sender
    /// had seen): an attempt applied late undoes what its sender did after it (breaks G2 or G4).
    SkipLateFences,
    /// Binds lose only their compare on the pool's fence floor: a create decided
    /// before a fold of the holder fence records and applied after it finds the holder's record
    /// deleted and commits a reference nobody holds (breaks G4, or G2).
    SkipFenceFloor,
    /// Binds of a fresh candidate lose their "ID record absent" compare (`create_revision(id/C)
    /// == 0`): two keys racing for one free ID both bind it (breaks G1). Found by the model
    /// checker (`crates/idalloc-model`).
    SkipIdAbsentCompare,
    /// Releases lose their "no other reference" compares (the two empty ref ranges around the
    /// holder's own): a release that is not the last reclaims the binding under its other
    /// holders (breaks G2).
    SkipReleaseRefsEmpty,
    /// Sweeps lose their "no reference" compare on each orphan: a sweep decided on a snapshot
    /// where the key was idle reclaims it after a holder referenced it again (breaks G2).
    SkipSweepRefsEmpty,
    /// A narrowing resize loses its compares that no ID or key record of the pool changed since
    /// the listings that found none outside the new spec: a bind committed between the listing and
    /// the resize is left outside the spec in force (breaks G3). Found by the model checker.
    SkipResizeListingCompare,
    /// Not a bug but an older build: txns as a process of cluster protocol 1 sends them
    /// (docs/design/cluster-version.md). Its binds compare neither the pool's fence floor nor the
    /// holder's own reference, and a process with a pinned holder name does not bump its holder
    /// record before its first bind on a lease (the bump becomes an empty txn, which succeeds and
    /// writes nothing). Its spec compare stays on the mod revision, which equals protocol 1's
    /// create-revision compare on a pool never resized. Safe beside this build until the
    /// cluster version is finalized; beside a finalized one, a late create after a fold leaks
    /// (G4) as with [`Sabotage::SkipFenceFloor`].
    Protocol1,
}

/// The [`Hook`] that applies one [`Sabotage`] (or none) to every txn, nested txns included.
pub struct Saboteur {
    layout: Layout,
    sabotage: Option<Sabotage>,
    /// While false, txns pass unchanged (a process upgraded in place: [`sabotaged_while`]).
    on: Option<Arc<AtomicBool>>,
}

/// A store whose txns are rewritten by a [`Saboteur`].
pub type SabotagedStore<S> = HookedStore<S, Saboteur>;

/// Wraps `inner` so that txns on records under `layout` suffer `sabotage` (`None`: untouched).
pub fn sabotaged<S: Store>(
    inner: S,
    layout: Layout,
    sabotage: Option<Sabotage>,
) -> SabotagedStore<S> {
    HookedStore::with_hook(inner, Saboteur { layout, sabotage, on: None })
}

/// [`sabotaged`] while `on` is true; txns sent after it turned false pass unchanged.
pub fn sabotaged_while<S: Store>(
    inner: S,
    layout: Layout,
    sabotage: Option<Sabotage>,
    on: Arc<AtomicBool>,
) -> SabotagedStore<S> {
    HookedStore::with_hook(inner, Saboteur { layout, sabotage, on: Some(on) })
}

impl Saboteur {
    /// The rewriter alone, for drivers that apply txns themselves (the model checker).
    pub fn new(layout: Layout, sabotage: Option<Sabotage>) -> Self {
        Saboteur { layout, sabotage, on: None }
    }

    /// Whether `c` is an empty-range compare over references of some pool; `whole`: over one
    /// key's whole reference prefix (a sweep's), else a part of it (a release's).
    fn is_refs_empty(&self, c: &idalloc::store::Compare, whole: bool) -> bool {
        let empty = c.op == CompareOp::Equal
            && c.target == CompareTarget::CreateRevision(0)
            && !c.range.range_end.is_empty();
        let Some(pool) = self.pool_of(&c.range.key) else {
            return false;
        };
        let is_whole = c.range.range_end == idalloc::store::prefix_end(&c.range.key);
        empty && c.range.key.starts_with(&self.layout.refs_prefix(&pool)) && is_whole == whole
    }

    /// The pool a record of the layout's data belongs to (`P/data/<pool>/...`).
    fn pool_of(&self, record: &[u8]) -> Option<String> {
        let data = format!("{}/data/", self.layout.prefix());
        let rest = std::str::from_utf8(record.strip_prefix(data.as_bytes())?).ok()?;
        rest.split_once('/').map(|(pool, _)| pool.to_string())
    }

    fn is_floor(&self, c: &idalloc::store::Compare) -> bool {
        let floor = self.pool_of(&c.range.key).map(|p| self.layout.fence_floor_key(&p));
        floor.as_deref() == Some(c.range.key.as_slice())
    }

    fn is_ref_record(&self, record: &[u8]) -> bool {
        self.pool_of(record).is_some_and(|p| self.layout.parse_ref_key(&p, record).is_some())
    }

    /// The txn of `fence_earlier_lives`: its only op puts an empty holder record.
    fn is_pinned_holder_bump(&self, req: &TxnRequest) -> bool {
        match req.success.as_slice() {
            [TxnOp::Put(p)] => {
                p.value.is_empty()
                    && self
                        .pool_of(&p.key)
                        .is_some_and(|pool| self.layout.parse_holder_key(&pool, &p.key).is_some())
            }
            _ => false,
        }
    }

    fn is_key_record(&self, record: &[u8]) -> bool {
        self.pool_of(record).is_some_and(|p| self.layout.parse_key_key(&p, record).is_some())
    }

    fn is_id_record(&self, record: &[u8]) -> bool {
        self.pool_of(record).is_some_and(|p| self.layout.parse_id_key(&p, record).is_some())
    }

    /// `req` as the sabotaged protocol would have sent it.
    pub fn rewrite(&self, mut req: TxnRequest) -> TxnRequest {
        if self.on.as_ref().is_some_and(|on| !on.load(Ordering::SeqCst)) {
            return req;
        }
        match self.sabotage {
            None => return req,
            Some(Sabotage::SkipKeyAbsentCompare) => req.compare.retain(|c| {
                let absent = c.op == CompareOp::Equal
                    && c.target == CompareTarget::CreateRevision(0)
                    && c.range.range_end.is_empty();
                !(absent && self.is_key_record(&c.range.key))
            }),
            Some(Sabotage::SkipReuseTombstone) => {}
            Some(Sabotage::SkipIdAbsentCompare) => req.compare.retain(|c| {
                let absent = c.op == CompareOp::Equal
                    && c.target == CompareTarget::CreateRevision(0)
                    && c.range.range_end.is_empty();
                !(absent && self.is_id_record(&c.range.key))
            }),
            Some(Sabotage::SkipReleaseRefsEmpty) => {
                req.compare.retain(|c| !self.is_refs_empty(c, false))
            }
            Some(Sabotage::SkipSweepRefsEmpty) => {
                req.compare.retain(|c| !self.is_refs_empty(c, true))
            }
            Some(Sabotage::SkipSpecCompare) => {
                let pools = self.layout.pools_prefix();
                req.compare.retain(|c| {
                    let on_spec = matches!(c.target, CompareTarget::CreateRevision(_))
                        || (c.op == CompareOp::Equal
                            && matches!(c.target, CompareTarget::ModRevision(_)));
                    !(on_spec && c.range.key.starts_with(&pools))
                })
            }
            Some(Sabotage::SkipFenceFloor) => req.compare.retain(|c| !self.is_floor(c)),
            Some(Sabotage::Protocol1) => {
                if self.is_pinned_holder_bump(&req) {
                    return TxnRequest::new();
                }
                let own_refs: Vec<Vec<u8>> = req
                    .success
                    .iter()
                    .filter_map(|op| match op {
                        TxnOp::Put(p) if self.is_ref_record(&p.key) => Some(p.key.clone()),
                        _ => None,
                    })
                    .collect();
                req.compare.retain(|c| {
                    let own_ref = c.op == CompareOp::Less
                        && matches!(c.target, CompareTarget::ModRevision(_))
                        && c.range.range_end.is_empty()
                        && own_refs.contains(&c.range.key);
                    !(own_ref || self.is_floor(c))
                })
            }
            Some(Sabotage::SkipResizeListingCompare) => req.compare.retain(|c| {
                let over_records = !c.range.range_end.is_empty()
                    && self.pool_of(&c.range.key).is_some_and(|p| {
                        c.range.key == self.layout.id_prefix(&p)
                            || c.range.key == self.layout.key_prefix(&p)
                    });
                !(over_records && c.op == CompareOp::Less)
            }),
            Some(Sabotage::SkipLateFences) => req.compare.retain(|c| {
                !(c.op == CompareOp::Less && matches!(c.target, CompareTarget::ModRevision(_)))
            }),
        }
        let ops = |ops: Vec<TxnOp>| -> Vec<TxnOp> {
            ops.into_iter()
                .map(|op| match op {
                    TxnOp::Txn(nested) => TxnOp::Txn(self.rewrite(nested)),
                    TxnOp::Put(p)
                        if self.sabotage == Some(Sabotage::SkipReuseTombstone)
                            && self.is_id_record(&p.key)
                            && matches!(
                                IdRecord::decode(&p.value),
                                Some(IdRecord::Tombstone(_))
                            ) =>
                    {
                        TxnOp::delete(p.key)
                    }
                    other => other,
                })
                .collect()
        };
        req.success = ops(req.success);
        req.failure = ops(req.failure);
        req
    }
}

#[async_trait::async_trait]
impl<S: Store> Hook<S> for Saboteur {
    async fn before(&self, _inner: &Arc<S>, req: Request) -> StoreResult<Request> {
        Ok(match req {
            Request::Txn(txn) => Request::Txn(self.rewrite(txn)),
            other => other,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use idalloc::store::Compare;

    fn saboteur(s: Option<Sabotage>) -> Saboteur {
        Saboteur { layout: Layout::new("idalloc").unwrap(), sabotage: s, on: None }
    }

    fn bind(l: &Layout) -> TxnRequest {
        TxnRequest::new()
            .when([
                Compare::absent(l.key_key("p", "k")),
                Compare::absent(l.id_key("p", 3)),
                Compare::absent("other/data/p/key/k"),
            ])
            .and_then([TxnOp::put(l.id_key("p", 3), "k")])
    }

    fn release(l: &Layout) -> TxnRequest {
        let tomb =
            TxnOp::put_on_lease(l.id_key("p", 3), IdRecord::Tombstone("k".into()).encode(), 7);
        TxnRequest::new().and_then([
            tomb.clone(),
            TxnOp::put_on_lease(l.id_key("p", 4), IdRecord::Bound("k".into()).encode(), 7),
            TxnOp::Txn(TxnRequest::new().and_then([tomb])),
        ])
    }

    /// `mod_revision(k) <= 8`: a late-commit fence as binds send it.
    fn seen(k: Vec<u8>) -> Compare {
        Compare::new(
            idalloc::store::KeyRange::key(k),
            CompareOp::Less,
            CompareTarget::ModRevision(9),
        )
    }

    #[test]
    fn skip_fence_floor_drops_only_the_floor_compare() {
        let l = Layout::new("idalloc").unwrap();
        let fenced = TxnRequest::new()
            .when([seen(l.holder_key("p", "h")), seen(l.fence_floor_key("p"))])
            .and_then([TxnOp::put(l.id_key("p", 3), "k")]);
        let got = saboteur(Some(Sabotage::SkipFenceFloor)).rewrite(fenced.clone());
        let mut want = fenced;
        want.compare.pop();
        assert_eq!(got, want, "the holder's own fence stays");
    }

    #[test]
    fn protocol_1_drops_the_floor_and_own_reference_compares_of_binds_and_the_pinned_bump() {
        let l = Layout::new("idalloc").unwrap();
        let own = l.ref_key("p", "k", "h");
        let bind = TxnRequest::new()
            .when([
                Compare::absent(l.key_key("p", "k")),
                seen(own.clone()),
                seen(l.holder_key("p", "h")),
                seen(l.fence_floor_key("p")),
            ])
            .and_then([
                TxnOp::put(l.key_key("p", "k"), "3"),
                TxnOp::put_on_lease(own.clone(), "3", 7),
            ]);
        let s = saboteur(Some(Sabotage::Protocol1));
        let mut want = bind.clone();
        want.compare = vec![want.compare[0].clone(), want.compare[2].clone()];
        assert_eq!(s.rewrite(bind), want, "the key and holder compares stay");
        // A release compares its own reference in protocol 1 too: unchanged.
        let release = TxnRequest::new().when([seen(own.clone())]).and_then([TxnOp::delete(own)]);
        assert_eq!(s.rewrite(release.clone()), release);
        let bump = TxnRequest::new()
            .when([Compare::mod_revision_is(l.pool_spec_key("p"), 4)])
            .and_then([TxnOp::put_on_lease(l.holder_key("p", "h"), Vec::new(), 7)]);
        assert_eq!(s.rewrite(bump), TxnRequest::new(), "no bump: an empty txn");
    }

    #[test]
    fn no_sabotage_changes_nothing() {
        let l = Layout::new("idalloc").unwrap();
        let s = saboteur(None);
        assert_eq!(s.rewrite(bind(&l)), bind(&l));
        assert_eq!(s.rewrite(release(&l)), release(&l));
    }

    #[test]
    fn skip_key_absent_compare_drops_only_that_compare() {
        let l = Layout::new("idalloc").unwrap();
        let got = saboteur(Some(Sabotage::SkipKeyAbsentCompare)).rewrite(bind(&l));
        let mut want = bind(&l);
        want.compare.remove(0);
        assert_eq!(got, want, "the ID compare and a foreign prefix's compare stay");
        assert_eq!(
            saboteur(Some(Sabotage::SkipKeyAbsentCompare)).rewrite(release(&l)),
            release(&l)
        );
    }

    #[test]
    fn skip_reuse_tombstone_deletes_instead_of_every_tombstone_put() {
        let l = Layout::new("idalloc").unwrap();
        let got = saboteur(Some(Sabotage::SkipReuseTombstone)).rewrite(release(&l));
        let want = TxnRequest::new().and_then([
            TxnOp::delete(l.id_key("p", 3)),
            TxnOp::put_on_lease(l.id_key("p", 4), IdRecord::Bound("k".into()).encode(), 7),
            TxnOp::Txn(TxnRequest::new().and_then([TxnOp::delete(l.id_key("p", 3))])),
        ]);
        assert_eq!(got, want, "bound records stay, nested tombstones go too");
        assert_eq!(saboteur(Some(Sabotage::SkipReuseTombstone)).rewrite(bind(&l)), bind(&l));
    }

    #[test]
    fn refs_empty_sabotages_tell_a_release_from_a_sweep() {
        use idalloc::store::{prefix_end, KeyRange};
        let l = Layout::new("idalloc").unwrap();
        let refs = l.ref_prefix("p", "k");
        let own = l.ref_key("p", "k", "h");
        let mut after = own.clone();
        after.push(0);
        let release = TxnRequest::new().when([
            Compare::range_empty(KeyRange::range(refs.clone(), own.clone())),
            Compare::range_empty(KeyRange::range(after, prefix_end(&refs))),
            Compare::absent(l.id_key("p", 3)),
        ]);
        let sweep = TxnRequest::new().when([
            Compare::range_empty(KeyRange::prefix(refs)),
            Compare::mod_revision_is(l.key_key("p", "k"), 4),
        ]);
        let rel = saboteur(Some(Sabotage::SkipReleaseRefsEmpty));
        let swp = saboteur(Some(Sabotage::SkipSweepRefsEmpty));
        assert_eq!(rel.rewrite(release.clone()).compare, release.compare[2..].to_vec());
        assert_eq!(rel.rewrite(sweep.clone()), sweep, "a sweep keeps its compare");
        assert_eq!(swp.rewrite(sweep.clone()).compare, sweep.compare[1..].to_vec());
        assert_eq!(swp.rewrite(release.clone()), release, "a release keeps its compares");
        let ida = saboteur(Some(Sabotage::SkipIdAbsentCompare));
        assert_eq!(ida.rewrite(release.clone()).compare, release.compare[..2].to_vec());
    }
}
