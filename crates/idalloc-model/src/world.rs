//! The explicit state machine: the store, the processes, the network, and the events that move
//! them (see docs/design/model-checking.md for what is modelled and what is abstracted).

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;

use idalloc::bench_api::{
    assemble, fold_fences_txn, id_is_allocatable, init_pool_txn, only_grows, pack, resize_txn,
    split, stray_ref_release_outcome, stray_ref_release_txn, sweep_txn, Action, BindLoop, BindPlan,
    Candidates, Failure, Fences, Frame, Hints, Input, LastRelease, MemoryCore, Orphan, RefTarget,
    ReleasePlan,
};
use idalloc::layout::{IdRecord, Layout};
use idalloc::records::PoolSnapshot;
use idalloc::store::{
    GetRequest, KeyRange, KeyValue, LeaseId, Revision, TxnOp, TxnRequest, TxnResponse,
};
use idalloc::PoolSpec;
use idalloc_testkit::g1;
use idalloc_testkit::sabotage::{Sabotage, Saboteur};

/// The one pool of the model.
pub const POOL: &str = "p";
/// The prefix bits of its IDs (G3 checks that every ID carries them).
const ID_PREFIX: u64 = 1 << 16;
const KEYS: [&str; 3] = ["k0", "k1", "k2"];
/// Holder names by process and life: a restarted process takes a new name, as the library's
/// default holder (host name plus a random suffix) does; with `Scope::same_holder` it keeps
/// its first one (a configured, fixed holder name).
const HOLDERS: [[&str; 4]; 3] = [
    ["h0", "h0.1", "h0.2", "h0.3"],
    ["h1", "h1.1", "h1.2", "h1.3"],
    ["h2", "h2.1", "h2.2", "h2.3"],
];

/// How far the search goes. Every budget is a total over the whole run (not per process), so the
/// state space is finite; the defaults are the CI scope.
#[derive(Clone, Debug)]
pub struct Scope {
    /// Processes (each with its own holder name and session lease), 1–3.
    pub procs: usize,
    /// Keys, 1–3.
    pub keys: usize,
    /// IDs in the pool, raw 1..=ids (with the prefix bits).
    pub ids: u64,
    /// Operations (acquire or release) each process starts.
    pub ops: u32,
    /// Crashes (a process loses its local state; its lease stays until an expiry event).
    pub crashes: u32,
    /// Requests whose sender gives up waiting (the txn stays in the network: applied later,
    /// never, or, with `dups`, twice).
    pub timeouts: u32,
    /// Txns applied a second time.
    pub dups: u32,
    /// Sweeps (a snapshot, then a sweep txn and a fence fold, each applied at any later point).
    pub sweeps: u32,
    /// Pool deletions (each may be followed by a re-create).
    pub deletes: u32,
    /// Resizes (`Allocator::resize_pool`: a read of the spec and, when narrowing, a listing
    /// of the ID records, then the resize txn, applied at any later point). Each goes from the
    /// spec in force to one of: the range grown by one ID, shrunk by one (its last ID), its
    /// first ID reserved, or back to the first spec.
    pub resizes: u32,
    /// Acquires may take two keys in one batched request (`pack` + `assemble` + `split`).
    pub batch: bool,
    /// A restarted process keeps its holder name (a configured holder) instead of taking a new
    /// one (the library's default).
    pub same_holder: bool,
    /// Process 0 opens its pool lazily (`AllocatorOptions::lazy_view`): no view
    /// until a bind asks for one (`Action::LoadView`) or a batch needs it; its single-key binds
    /// guess candidates (`Candidates::Probe`) among the IDs it has not learned taken.
    pub lazy: bool,
    /// With `lazy`: process 0's single-key binds work as in a `lowest` pool
    /// (`Candidates::UsedIds`): read the key record first, and for a new key read every used ID
    /// (`Action::LoadUsedIds`) into what it learned, then pick. (Picks branch over every free
    /// candidate either way; what changes is what the loop reads before it picks.)
    pub lazy_lowest: bool,
    /// Break the protocol on purpose (the checker must find it).
    pub sabotage: Option<Sabotage>,
    /// Stop after this many distinct states (a guard for widened scopes; the CI scope stays far
    /// below it).
    pub max_states: usize,
}

impl Default for Scope {
    /// The CI scope (about 51,000 states; docs/design/model-checking.md has the wider ones).
    fn default() -> Self {
        Scope {
            procs: 2,
            keys: 2,
            ids: 2,
            ops: 1,
            crashes: 1,
            timeouts: 0,
            dups: 0,
            sweeps: 1,
            deletes: 0,
            resizes: 0,
            batch: true,
            same_holder: false,
            lazy: false,
            lazy_lowest: false,
            sabotage: None,
            max_states: 20_000_000,
        }
    }
}

/// What happened in one step of a trace (its label).
pub type Event = String;

/// Things fixed for one search.
pub(crate) struct Ctx {
    pub scope: Scope,
    /// The pool's first spec (created with the pool, and again on a re-create).
    pub spec: &'static PoolSpec,
    /// Every spec the pool can have: the first, then the resize targets (see `Scope::resizes`).
    specs: Vec<&'static PoolSpec>,
    pub layout: Layout,
    saboteur: Saboteur,
}

impl Ctx {
    pub fn new(scope: Scope) -> Ctx {
        let spec: &'static PoolSpec =
            Box::leak(Box::new(PoolSpec::new(POOL, 1, scope.ids).prefix(ID_PREFIX)));
        let layout = match Layout::new("m") {
            Ok(l) => l,
            Err(e) => panic!("the model's layout prefix is valid: {e}"),
        };
        let saboteur = Saboteur::new(layout.clone(), scope.sabotage);
        let n = scope.ids;
        let mut targets = vec![spec.resized(1, n + 1, &[])];
        if n >= 2 {
            targets.push(spec.resized(1, n - 1, &[]));
            targets.push(spec.resized(1, n, &[(1, 1)]));
        }
        let mut specs = vec![spec];
        for t in targets {
            if let Err(e) = t.validate() {
                panic!("a resize target of the model is invalid: {e}");
            }
            specs.push(Box::leak(Box::new(t)));
        }
        Ctx { scope, spec, specs, layout, saboteur }
    }

    /// The IDs spec `i` hands out (with the prefix bits).
    fn ids(&self, i: usize) -> impl Iterator<Item = u64> + '_ {
        let spec = self.specs[i];
        (spec.min()..=spec.max())
            .filter(|raw| spec.is_allocatable(*raw))
            .map(|raw| spec.apply_prefix(raw))
    }

    /// Which of [`Ctx::specs`] a spec record holds.
    fn spec_index(&self, kv: &KeyValue) -> usize {
        let spec = match PoolSpec::from_json(&kv.value) {
            Ok(s) => s,
            Err(e) => panic!("the model's spec record is unreadable: {e}"),
        };
        match self.specs.iter().position(|s| **s == spec) {
            Some(i) => i,
            None => panic!("the model's spec record {spec} is none of its specs"),
        }
    }
}

/// One key's bind loop inside an acquire, with the inputs fed to it so far (its canonical
/// identity: the machine is deterministic in its inputs).
#[derive(Clone)]
struct Lp {
    key: &'static str,
    machine: BindLoop<'static>,
    log: Vec<String>,
    st: LpSt,
}

#[derive(Clone, Debug)]
enum LpSt {
    /// The next input to feed.
    Feed(Input),
    /// The loop asked to send this plan (sent with the others of its round).
    Sending(BindPlan),
    /// Sent; waiting for the answer.
    Waiting(BindPlan, Fences),
    Done(u64),
    Failed(Failure),
}

#[derive(Clone, Debug)]
struct Rel {
    key: &'static str,
    /// No key record: release the reference alone (`release_stray_ref`).
    stray: bool,
    id: u64,
    require_own_ref: bool,
    had_ref: Option<bool>,
    fenced_out: u32,
    fences: Fences,
    bump: Option<LeaseId>,
}

#[derive(Clone)]
enum Op {
    Acquire(Vec<Lp>),
    Release(Rel),
}

#[derive(Clone, Default)]
struct Proc {
    up: bool,
    /// Lives so far (the holder name's index in [`HOLDERS`]).
    life: usize,
    lease: Option<LeaseId>,
    /// Leases of earlier lives, alive until an expiry event.
    stale_leases: Vec<LeaseId>,
    /// The spec's create revision the process's pool handle was opened on (`None`: no pool).
    spec_rev: Option<Revision>,
    /// The version (mod revision) of the spec the handle uses, and which spec it is
    /// ([`Ctx::specs`]): what a resize changes, learned from the spec watch or a failed write.
    spec_ver: Revision,
    spec_i: usize,
    /// A failed request said the pool is gone: the handle is retired until reopened.
    retired: bool,
    seen: Revision,
    /// Opened lazily and not loaded: `view_ids`/`view_keys` stay empty and never sync.
    lazy: bool,
    view_ids: BTreeMap<u64, IdRecord>,
    view_keys: BTreeMap<String, u64>,
    learned: BTreeSet<u64>,
    held: BTreeMap<String, u64>,
    doubt: BTreeSet<String>,
    /// Keys of failed acquires with an attempt in doubt: `Repair::Abandon` releases this
    /// process's reference if one of those attempts committed after all.
    abandon: BTreeSet<&'static str>,
    ops_left: u32,
    op: Option<Op>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
enum Reply {
    /// Loops of the sender's acquire; `batch`: sent as one batched request.
    Bind {
        loops: Vec<usize>,
        batch: bool,
    },
    Release,
    /// Sweep, fold and resize txns: nobody waits for them.
    Sweep,
    Fold,
    Resize,
}

#[derive(Clone, Debug, PartialEq, Eq)]
struct Msg {
    /// The process waiting for the answer (`None`: nobody; applied late or never).
    waiter: Option<usize>,
    reply: Reply,
    txn: TxnRequest,
    /// Times it may still be applied again after its first apply.
    dup_used: bool,
}

#[derive(Clone, Debug, Hash)]
struct Budget {
    crashes: u32,
    timeouts: u32,
    dups: u32,
    sweeps: u32,
    deletes: u32,
    creates: u32,
    resizes: u32,
}

/// A state of the whole system.
#[derive(Clone)]
pub(crate) struct World {
    store: MemoryCore,
    procs: Vec<Proc>,
    net: Vec<Msg>,
    budget: Budget,
}

impl World {
    /// The pool created, every process up with a fresh session and a synced view.
    pub fn initial(ctx: &Ctx) -> World {
        let s = &ctx.scope;
        let mut w = World {
            store: MemoryCore::new(),
            procs: vec![Proc::default(); s.procs],
            net: Vec::new(),
            budget: Budget {
                crashes: s.crashes,
                timeouts: s.timeouts,
                dups: s.dups,
                sweeps: s.sweeps,
                deletes: s.deletes,
                creates: s.deletes,
                resizes: s.resizes,
            },
        };
        let create = init_pool_txn(&ctx.layout, POOL, ctx.spec.to_json());
        if let Err(e) = w.store.txn(&create) {
            panic!("creating the model's pool failed: {e}");
        }
        for p in 0..s.procs {
            w.procs[p].ops_left = s.ops;
            w.start(ctx, p);
        }
        w
    }

    /// A canonical encoding: equal for states no event can tell apart.
    pub fn canonical(&self) -> String {
        let mut s = String::new();
        let _ = write!(s, "r{} l{};", self.store.revision(), self.store.next_lease());
        if let Ok(all) = self.store.list(b"m/") {
            for kv in &all.kvs {
                // The version only matters as "exists" (absent compares use create revision 0).
                let _ = write!(
                    s,
                    "{}={}@{}/{}/L{};",
                    String::from_utf8_lossy(&kv.key),
                    String::from_utf8_lossy(&kv.value),
                    kv.create_revision,
                    kv.mod_revision,
                    kv.lease
                );
            }
        }
        for (i, p) in self.procs.iter().enumerate() {
            let _ = write!(
                s,
                "|P{i} {} {} {} {:?} {:?} {:?} {:?} v{} s{} {} {} {:?} {:?} {:?} {:?} {:?} {} ",
                p.up,
                p.lazy,
                p.life,
                p.abandon,
                p.lease,
                p.stale_leases,
                p.spec_rev,
                p.spec_ver,
                p.spec_i,
                p.retired,
                p.seen,
                p.view_ids,
                p.view_keys,
                p.learned,
                p.held,
                p.doubt,
                p.ops_left
            );
            match &p.op {
                None => s.push('-'),
                Some(Op::Release(r)) => {
                    let _ = write!(s, "{r:?}");
                }
                Some(Op::Acquire(loops)) => {
                    for l in loops {
                        let _ = write!(s, "[{} {:?} {:?}]", l.key, l.log, l.st);
                    }
                }
            }
        }
        let mut net: Vec<String> = self.net.iter().map(|m| format!("{m:?}")).collect();
        net.sort();
        let _ = write!(s, "|N{net:?}|B{:?}", self.budget);
        s
    }

    fn current_spec_rev(&self, ctx: &Ctx) -> Option<Revision> {
        self.spec_record(ctx).map(|kv| kv.create_revision)
    }

    /// The pool's spec record as the store holds it now.
    fn spec_record(&self, ctx: &Ctx) -> Option<KeyValue> {
        let req = GetRequest::new(KeyRange::key(ctx.layout.pool_spec_key(POOL)));
        self.store.get(&req).ok()?.kvs.into_iter().next()
    }

    /// The spec in force ([`Ctx::specs`] index), the first one while there is no pool.
    fn spec_now(&self, ctx: &Ctx) -> usize {
        self.spec_record(ctx).map_or(0, |kv| ctx.spec_index(&kv))
    }

    /// `p` adopts spec record `kv` if it is a newer version of the pool its handle is on (a
    /// resize: `PoolState::adopt`); returns false for anything else (deleted, re-created).
    fn adopt(&mut self, ctx: &Ctx, p: usize, kv: &KeyValue) -> bool {
        let pr = &mut self.procs[p];
        if pr.spec_rev != Some(kv.create_revision) {
            return false;
        }
        if kv.mod_revision > pr.spec_ver {
            pr.spec_ver = kv.mod_revision;
            pr.spec_i = ctx.spec_index(kv);
        }
        true
    }

    fn pool_records(&self, ctx: &Ctx) -> (Vec<KeyValue>, Revision) {
        match self.store.list(&ctx.layout.pool_data_prefix(POOL)) {
            Ok(r) => (r.kvs, r.revision),
            Err(e) => panic!("listing the memory core failed: {e}"),
        }
    }

    fn apply(&mut self, ctx: &Ctx, txn: &TxnRequest) -> Option<TxnResponse> {
        // A txn the store refuses (a put on an expired lease) applies nothing, as on etcd.
        self.store.txn(&ctx.saboteur.rewrite(txn.clone())).ok()
    }

    /// A (re)started or reopened process: a new session lease if it has none, the pool's
    /// current spec, a view synced to the store.
    fn start(&mut self, ctx: &Ctx, p: usize) {
        if self.procs[p].lease.is_none() {
            match self.store.lease_grant(10) {
                Ok(l) => self.procs[p].lease = Some(l),
                Err(e) => panic!("lease grant on the memory core failed: {e}"),
            }
        }
        let spec = self.spec_record(ctx);
        let spec_i = spec.as_ref().map_or(0, |kv| ctx.spec_index(kv));
        let pr = &mut self.procs[p];
        pr.up = true;
        pr.spec_rev = spec.as_ref().map(|kv| kv.create_revision);
        pr.spec_ver = spec.as_ref().map_or(0, |kv| kv.mod_revision);
        pr.spec_i = spec_i;
        pr.retired = false;
        pr.held.clear();
        pr.abandon.clear();
        pr.doubt.clear();
        pr.op = None;
        if ctx.scope.lazy && p == 0 {
            // Opening reads the spec only (at the store's current revision).
            let req = GetRequest::new(KeyRange::key(ctx.layout.pool_spec_key(POOL)));
            let rev = self.store.get(&req).map(|r| r.revision).unwrap_or(0);
            let pr = &mut self.procs[p];
            pr.lazy = true;
            pr.view_ids.clear();
            pr.view_keys.clear();
            pr.learned.clear();
            pr.seen = pr.seen.max(rev);
        } else {
            self.sync(ctx, p);
        }
    }

    /// A lazy process loads its view (`Inner::follow` + the first listing).
    fn load_view(&mut self, ctx: &Ctx, p: usize) {
        self.procs[p].lazy = false;
        self.sync(ctx, p);
    }

    /// The process's view catches up with the store (the watch-fed cache, coarsely: a view is
    /// always some past state of the store, refreshed at arbitrary points).
    fn sync(&mut self, ctx: &Ctx, p: usize) {
        let (kvs, rev) = self.pool_records(ctx);
        let snap = PoolSnapshot::parse(&ctx.layout, POOL, &kvs, rev);
        let pr = &mut self.procs[p];
        pr.view_ids =
            snap.ids.iter().filter_map(|(id, e)| Some((*id, e.record.clone()?))).collect();
        pr.view_keys = snap.keys.iter().filter_map(|(k, e)| Some((k.clone(), e.id?))).collect();
        pr.learned.clear();
        pr.seen = pr.seen.max(rev);
    }

    fn see(&mut self, p: usize, rev: Revision) {
        self.procs[p].seen = self.procs[p].seen.max(rev);
    }

    /// Every successor of this state, with the event that leads there.
    pub fn successors(&self, ctx: &Ctx) -> Vec<(Event, World)> {
        let mut out = Vec::new();
        let s = &ctx.scope;
        let spec_kv = self.spec_record(ctx);
        let spec_now = spec_kv.as_ref().map(|kv| kv.create_revision);
        for p in 0..self.procs.len() {
            let pr = &self.procs[p];
            if pr.up && pr.op.is_none() {
                let live = !pr.retired && pr.spec_rev.is_some() && pr.spec_rev == spec_now;
                if live && pr.ops_left > 0 {
                    for (k, key) in KEYS.iter().enumerate().take(s.keys) {
                        if pr.held.contains_key(*key) {
                            let mut w = self.clone();
                            w.begin_release(ctx, p, key);
                            out.push((format!("P{p} release {key}"), w));
                            continue;
                        }
                        let mut keys = vec![*key];
                        out.extend(self.begin_acquire(ctx, p, keys.clone()));
                        if s.batch {
                            for key2 in KEYS.iter().take(s.keys).skip(k + 1) {
                                if !pr.held.contains_key(*key2) {
                                    keys.push(key2);
                                    out.extend(self.begin_acquire(ctx, p, keys.clone()));
                                    keys.pop();
                                }
                            }
                        }
                    }
                }
                if let Some(&key) = pr.abandon.iter().next() {
                    let mut w = self.clone();
                    w.begin_abandon(ctx, p, key);
                    out.push((format!("P{p} abandons {key} (a failed acquire in doubt)"), w));
                }
                if spec_now.is_some() && (pr.retired || pr.spec_rev != spec_now) {
                    let mut w = self.clone();
                    w.start(ctx, p);
                    out.push((format!("P{p} reopens the pool"), w));
                }
            }
            if pr.up && !pr.lazy {
                let mut w = self.clone();
                w.sync(ctx, p);
                out.push((format!("P{p} view syncs"), w));
            }
            if let Some(kv) = spec_kv.as_ref().filter(|kv| {
                pr.up && pr.spec_rev == Some(kv.create_revision) && kv.mod_revision > pr.spec_ver
            }) {
                let mut w = self.clone();
                w.adopt(ctx, p, kv);
                out.push((format!("P{p} learns the resize (spec watch)"), w));
            }
            if pr.up {
                if self.budget.crashes > 0 {
                    let mut w = self.clone();
                    w.budget.crashes -= 1;
                    w.crash(ctx, p);
                    out.push((format!("P{p} crashes"), w));
                }
            } else {
                let mut w = self.clone();
                w.start(ctx, p);
                out.push((format!("P{p} restarts"), w));
            }
            for (i, _) in pr.stale_leases.iter().enumerate() {
                let mut w = self.clone();
                let lease = w.procs[p].stale_leases.remove(i);
                w.store.lease_revoke(lease);
                out.push((format!("P{p}'s old lease {lease} expires"), w));
            }
        }
        for (i, m) in self.net.iter().enumerate() {
            let what = describe(m);
            if let Some(p) = m.waiter {
                let mut w = self.clone();
                let sent = w.net.remove(i);
                let resp = w.apply(ctx, &sent.txn);
                let how = outcome(&resp);
                out.extend(
                    w.answer(ctx, p, sent, resp)
                        .into_iter()
                        .map(|w| (format!("apply {what}: {how}; P{p} gets the answer"), w)),
                );
                if self.budget.timeouts > 0 {
                    let mut w = self.clone();
                    w.budget.timeouts -= 1;
                    w.net[i].waiter = None;
                    out.extend(
                        w.timed_out(ctx, p, m)
                            .into_iter()
                            .map(|w| (format!("P{p} times out on {what} (it stays in flight)"), w)),
                    );
                }
            } else {
                let mut w = self.clone();
                let m = w.net.remove(i);
                let how = outcome(&w.apply(ctx, &m.txn));
                out.push((format!("apply late {what}: {how}"), w));
                if self.budget.dups > 0 && !m.dup_used {
                    let mut w = self.clone();
                    w.budget.dups -= 1;
                    w.net[i].dup_used = true;
                    let m = w.net[i].clone();
                    let how = outcome(&w.apply(ctx, &m.txn));
                    out.push((format!("apply late {what}: {how} (a copy stays in flight)"), w));
                }
                let mut w = self.clone();
                w.net.remove(i);
                out.push((format!("{what} is lost"), w));
            }
        }
        if self.budget.sweeps > 0 && spec_now.is_some() {
            let mut w = self.clone();
            w.budget.sweeps -= 1;
            let what = w.sweep(ctx);
            out.push((what, w));
        }
        if self.budget.deletes > 0 && spec_now.is_some() {
            let mut w = self.clone();
            w.budget.deletes -= 1;
            w.apply(ctx, &delete_pool_txn(&ctx.layout));
            out.push(("the pool is deleted (force)".to_string(), w));
        }
        if let Some(kv) = spec_kv.as_ref().filter(|_| self.budget.resizes > 0) {
            out.extend(self.resizes(ctx, kv));
        }
        if self.budget.creates > 0 && spec_now.is_none() {
            let mut w = self.clone();
            w.budget.creates -= 1;
            w.apply(ctx, &init_pool_txn(&ctx.layout, POOL, ctx.spec.to_json()));
            out.push(("the pool is re-created".to_string(), w));
        }
        out
    }

    /// `Allocator::resize_pool`'s decision from spec record `kv` to each other spec: when
    /// narrowing, a listing of the ID records now, refused (no successor) if one is outside the
    /// new spec; the resize txn then goes in flight (applied at any later point, or lost).
    fn resizes(&self, ctx: &Ctx, kv: &KeyValue) -> Vec<(Event, World)> {
        let from = ctx.spec_index(kv);
        let mut out = Vec::new();
        for (to, &new) in ctx.specs.iter().enumerate() {
            if to == from {
                continue;
            }
            let listed_at = if only_grows(ctx.specs[from], new) {
                None
            } else {
                let (kvs, rev) = self.pool_records(ctx);
                let snap = PoolSnapshot::parse(&ctx.layout, POOL, &kvs, rev);
                if snap.ids.keys().any(|id| !id_is_allocatable(new, *id)) {
                    continue;
                }
                Some(rev)
            };
            let mut w = self.clone();
            w.budget.resizes -= 1;
            let txn = resize_txn(&ctx.layout, POOL, kv.mod_revision, listed_at, new);
            w.net.push(Msg { waiter: None, reply: Reply::Resize, txn, dup_used: false });
            let how = listed_at.map_or(String::new(), |r| format!(", no ID outside it at r{r}"));
            out.push((format!("resize decided: {} -> {new}{how}", ctx.specs[from]), w));
        }
        out
    }

    fn crash(&mut self, ctx: &Ctx, p: usize) {
        let pr = &mut self.procs[p];
        if !ctx.scope.same_holder {
            pr.life += 1;
        }
        pr.up = false;
        pr.op = None;
        pr.abandon.clear();
        pr.held.clear();
        pr.doubt.clear();
        pr.view_ids.clear();
        pr.view_keys.clear();
        pr.learned.clear();
        pr.seen = 0;
        pr.spec_rev = None;
        pr.spec_ver = 0;
        pr.spec_i = 0;
        pr.retired = false;
        if let Some(l) = pr.lease.take() {
            pr.stale_leases.push(l);
        }
        for m in &mut self.net {
            if m.waiter == Some(p) {
                m.waiter = None;
            }
        }
    }

    fn begin_acquire(&self, ctx: &Ctx, p: usize, keys: Vec<&'static str>) -> Vec<(Event, World)> {
        let mut w = self.clone();
        let batch = keys.len() > 1;
        if batch && w.procs[p].lazy {
            // A batched bind waits for the whole view (`bind_many` → `wait_synced`).
            w.load_view(ctx, p);
        }
        let lazy = w.procs[p].lazy;
        let pr = &mut w.procs[p];
        pr.ops_left -= 1;
        let loops = keys
            .iter()
            .map(|key| {
                let hints = if batch { Hints::Lenient } else { Hints::Strict };
                let cached = pr.view_keys.get(*key).copied();
                Lp {
                    key,
                    machine: BindLoop::new(ctx.spec, key, cached, None, hints).candidates(
                        match (lazy, ctx.scope.lazy_lowest) {
                            (false, _) => Candidates::View,
                            (true, false) => Candidates::Probe,
                            (true, true) => Candidates::UsedIds,
                        },
                    ),
                    log: Vec::new(),
                    st: LpSt::Feed(Input::Resume),
                }
            })
            .collect();
        pr.op = Some(Op::Acquire(loops));
        let label = format!("P{p} acquire {}", keys.join("+"));
        w.drive(ctx, p).into_iter().map(|w| (label.clone(), w)).collect()
    }

    /// Runs the process's acquire until every loop waits for an answer, or all are over. Picks
    /// branch: every free candidate of the view is one successor.
    fn drive(mut self, ctx: &Ctx, p: usize) -> Vec<World> {
        let Some(Op::Acquire(loops)) = &mut self.procs[p].op else {
            return vec![self];
        };
        let Some(i) = loops.iter().position(|l| matches!(l.st, LpSt::Feed(_))) else {
            return self.round(ctx, p);
        };
        let pr = &mut self.procs[p];
        let Some(Op::Acquire(loops)) = &mut pr.op else { unreachable!() };
        let claimed: BTreeSet<u64> = loops
            .iter()
            .filter_map(|l| match &l.st {
                LpSt::Sending(plan) | LpSt::Waiting(plan, _) if plan.expect_id.is_none() => {
                    Some(plan.id)
                }
                _ => None,
            })
            .collect();
        let lp = &mut loops[i];
        let LpSt::Feed(input) = std::mem::replace(&mut lp.st, LpSt::Feed(Input::Resume)) else {
            unreachable!()
        };
        lp.log.push(format!("{input:?}"));
        let view_ids = &pr.view_ids;
        let step = lp.machine.next(input, |id| view_ids.get(&id).cloned());
        if let Some((id, true)) = step.learn {
            pr.learned.insert(id);
        }
        let Some(Op::Acquire(loops)) = &mut pr.op else { unreachable!() };
        let key = loops[i].key;
        match step.action {
            Action::Pick { .. } => {
                let free: Vec<u64> = ctx
                    .ids(pr.spec_i)
                    .filter(|id| {
                        !pr.view_ids.contains_key(id)
                            && !pr.learned.contains(id)
                            && !claimed.contains(id)
                    })
                    .collect();
                if free.is_empty() {
                    loops[i].st = LpSt::Feed(Input::Picked(None));
                    return self.drive(ctx, p);
                }
                let mut out = Vec::new();
                for c in free {
                    let mut w = self.clone();
                    if let Some(Op::Acquire(loops)) = &mut w.procs[p].op {
                        loops[i].st = LpSt::Feed(Input::Picked(Some(c)));
                    }
                    out.extend(w.drive(ctx, p));
                }
                return out;
            }
            Action::Send(plan) => loops[i].st = LpSt::Sending(plan),
            Action::Wait(_) => loops[i].st = LpSt::Feed(Input::Resume),
            Action::LoadView => {
                loops[i].st = LpSt::Feed(Input::Resume);
                self.load_view(ctx, p);
            }
            Action::Done { id, .. } => loops[i].st = LpSt::Done(id),
            Action::Fail(f) => loops[i].st = LpSt::Failed(f),
            Action::LoadUsedIds => {
                // Every ID record present now (keys only) joins what the process learned taken.
                let (kvs, rev) = self.pool_records(ctx);
                let snap = PoolSnapshot::parse(&ctx.layout, POOL, &kvs, rev);
                let pr = &mut self.procs[p];
                pr.learned.extend(snap.ids.keys().copied());
                pr.seen = pr.seen.max(rev);
                if let Some(Op::Acquire(loops)) = &mut pr.op {
                    loops[i].st = LpSt::Feed(Input::Resume);
                }
            }
            Action::ReadUsage | Action::PeekKeyRecord => {
                let (kvs, rev) = self.pool_records(ctx);
                let snap = PoolSnapshot::parse(&ctx.layout, POOL, &kvs, rev);
                let key_rec = snap.keys.get(key).and_then(|e| e.id);
                let input = if step.action == Action::ReadUsage {
                    Input::Usage { key_rec, used: snap.ids.len() as u64, revision: rev }
                } else {
                    Input::KeyRecord(key_rec)
                };
                self.see(p, rev);
                if let Some(Op::Acquire(loops)) = &mut self.procs[p].op {
                    loops[i].st = LpSt::Feed(input);
                }
            }
        }
        self.drive(ctx, p)
    }

    /// No loop has an input to take: wait for answers, send this round's plans, or finish.
    fn round(mut self, ctx: &Ctx, p: usize) -> Vec<World> {
        let pr = &mut self.procs[p];
        let holder_name = holder_of(pr, p);
        let Some(Op::Acquire(loops)) = &mut pr.op else { return vec![self] };
        if loops.iter().any(|l| matches!(l.st, LpSt::Waiting(..))) {
            return vec![self];
        }
        let sending: Vec<usize> =
            (0..loops.len()).filter(|&i| matches!(loops[i].st, LpSt::Sending(_))).collect();
        if sending.is_empty() {
            let Some(Op::Acquire(loops)) = pr.op.take() else { unreachable!() };
            for l in loops {
                match l.st {
                    LpSt::Done(id) => {
                        pr.held.insert(l.key.to_string(), id);
                    }
                    LpSt::Failed(Failure::PoolGone { spec_now }) => {
                        // A resize is adopted (the acquire answers `unavailable`); anything else
                        // retires the handle.
                        let resized = spec_now.as_ref().is_some_and(|kv| {
                            pr.spec_rev == Some(kv.create_revision)
                                && kv.mod_revision >= pr.spec_ver
                        });
                        if resized {
                            if let Some(kv) = spec_now.as_ref() {
                                pr.spec_ver = pr.spec_ver.max(kv.mod_revision);
                                pr.spec_i = ctx.spec_index(kv);
                            }
                        } else {
                            pr.retired = true;
                        }
                    }
                    _ => {}
                }
                if !pr.held.contains_key(l.key) && pr.doubt.contains(l.key) && !pr.retired {
                    pr.abandon.insert(l.key);
                }
            }
            return vec![self];
        }
        // `bind_fences`: the spec version in force now, and no new binding of an ID it does not
        // hand out (`unavailable`, nothing sent).
        let spec = ctx.specs[pr.spec_i];
        let outside = sending.iter().any(|&i| {
            matches!(&loops[i].st, LpSt::Sending(plan)
                if plan.creates_binding() && !id_is_allocatable(spec, plan.id))
        });
        if outside {
            for &i in &sending {
                loops[i].st = LpSt::Failed(Failure::Aborted);
            }
            return self.round(ctx, p);
        }
        let fences = Fences { spec_rev: pr.spec_rev.map(|_| pr.spec_ver), seen: Some(pr.seen) };
        let holder = RefTarget { holder: holder_name, lease: pr.lease.unwrap_or(0) };
        let mut txns = Vec::new();
        for &i in &sending {
            let LpSt::Sending(plan) = loops[i].st.clone() else { unreachable!() };
            txns.push(plan.txn_fenced(&ctx.layout, POOL, loops[i].key, Some(holder), fences));
            loops[i].st = LpSt::Waiting(plan, fences);
        }
        if loops.len() == 1 {
            let txn = txns.remove(0);
            self.net.push(Msg {
                waiter: Some(p),
                reply: Reply::Bind { loops: sending, batch: false },
                txn,
                dup_used: false,
            });
        } else {
            // The batched driver: one frame (nothing of its own for leased holders), packed by
            // the library's first fit; items whose writes overlap go to separate requests.
            let frame = Frame::default();
            for group in pack(&txns, &frame, 100) {
                let txn = assemble(&frame, group.iter().map(|&j| txns[j].clone()));
                let loops = group.iter().map(|&j| sending[j]).collect();
                self.net.push(Msg {
                    waiter: Some(p),
                    reply: Reply::Bind { loops, batch: true },
                    txn,
                    dup_used: false,
                });
            }
        }
        vec![self]
    }

    /// The answer to `m` reaches process `p` (`resp`: `None` if the store refused the txn).
    fn answer(mut self, ctx: &Ctx, p: usize, m: Msg, resp: Option<TxnResponse>) -> Vec<World> {
        if let Some(r) = &resp {
            self.see(p, r.revision);
        }
        match m.reply {
            Reply::Bind { loops: idx, batch } => {
                let per_loop: Vec<Option<TxnResponse>> = match (resp, batch) {
                    (None, _) => vec![None; idx.len()],
                    (Some(r), false) => vec![Some(r)],
                    (Some(r), true) => match split(r, &Frame::default(), idx.len()) {
                        Ok(Ok(rs)) => rs.into_iter().map(Some).collect(),
                        other => panic!("a batch without a guard answered {other:?}"),
                    },
                };
                let Some(Op::Acquire(loops)) = &mut self.procs[p].op else {
                    panic!("an answer for P{p}, which has no acquire")
                };
                for (i, r) in idx.into_iter().zip(per_loop) {
                    let LpSt::Waiting(plan, fences) = loops[i].st.clone() else {
                        panic!("an answer for a loop that waits for none")
                    };
                    loops[i].st = LpSt::Feed(match r {
                        None => Input::NotApplied { retry: true },
                        Some(r) => match plan.outcome_fenced(&r, fences) {
                            Ok(o) => Input::Answer(o),
                            Err(e) => panic!("bind response unreadable: {e}"),
                        },
                    });
                }
                self.drive(ctx, p)
            }
            Reply::Release => {
                let holder_name = holder_of(&self.procs[p], p);
                let Some(Op::Release(rel)) = &mut self.procs[p].op else {
                    panic!("a release answer for P{p}, which has no release")
                };
                let Some(resp) = resp else {
                    self.send_release(ctx, p);
                    return vec![self];
                };
                let out = if rel.stray {
                    stray_ref_release_outcome(&resp, rel.fences)
                } else {
                    release_plan(rel, holder_name).outcome(&resp)
                };
                let out = match out {
                    Ok(o) => o,
                    Err(e) => panic!("release response unreadable: {e}"),
                };
                let pr = &mut self.procs[p];
                let Some(Op::Release(rel)) = &mut pr.op else { unreachable!() };
                if let Some(spec_now) = &out.pool_gone {
                    let resized = spec_now.as_ref().filter(|kv| {
                        pr.spec_rev == Some(kv.create_revision) && kv.mod_revision >= pr.spec_ver
                    });
                    match resized.cloned() {
                        // Resized: adopted; the release answers `unavailable` (this attempt wrote
                        // nothing, an earlier one may have) and its caller retries it.
                        Some(kv) => {
                            self.adopt(ctx, p, &kv);
                            self.send_release(ctx, p);
                        }
                        None => {
                            pr.op = None;
                            pr.retired = true;
                        }
                    }
                    return vec![self];
                }
                if out.fenced_out {
                    rel.fenced_out += 1;
                    self.send_release(ctx, p);
                    return vec![self];
                }
                if rel.bump.is_some() {
                    pr.doubt.remove(rel.key);
                }
                let first = rel.had_ref.is_none();
                let had_ref = *rel.had_ref.get_or_insert(out.had_ref);
                match out.key_now {
                    Some(now) if first && had_ref && !resp.succeeded && now != rel.id => {
                        rel.id = now;
                        rel.require_own_ref = false;
                        self.send_release(ctx, p);
                    }
                    _ => {
                        let key = rel.key;
                        pr.held.remove(key);
                        pr.op = None;
                    }
                }
                vec![self]
            }
            Reply::Sweep | Reply::Fold | Reply::Resize => vec![self],
        }
    }

    /// `p` stops waiting for `m` (lost request or lost answer): the bind loops retry (the
    /// driver's `NotApplied { retry: true }`, the key now in doubt); a release is sent again.
    fn timed_out(mut self, ctx: &Ctx, p: usize, m: &Msg) -> Vec<World> {
        match &m.reply {
            Reply::Bind { loops: idx, .. } => {
                let pr = &mut self.procs[p];
                let Some(Op::Acquire(loops)) = &mut pr.op else { unreachable!() };
                for &i in idx {
                    pr.doubt.insert(loops[i].key.to_string());
                    loops[i].st = LpSt::Feed(Input::NotApplied { retry: true });
                }
                self.drive(ctx, p)
            }
            Reply::Release => {
                self.send_release(ctx, p);
                vec![self]
            }
            Reply::Sweep | Reply::Fold | Reply::Resize => vec![self],
        }
    }

    /// `Repair::Abandon`: unless the key is held again, release this process's reference, on
    /// the key's ID as read now, or alone if the key has no binding.
    fn begin_abandon(&mut self, ctx: &Ctx, p: usize, key: &'static str) {
        self.procs[p].abandon.remove(key);
        if self.procs[p].held.contains_key(key) {
            return;
        }
        let (kvs, rev) = self.pool_records(ctx);
        let snap = PoolSnapshot::parse(&ctx.layout, POOL, &kvs, rev);
        let now = snap.keys.get(key).and_then(|e| e.id);
        self.see(p, rev);
        self.procs[p].op = Some(Op::Release(Rel {
            key,
            stray: now.is_none(),
            id: now.unwrap_or(0),
            require_own_ref: false,
            had_ref: None,
            fenced_out: 0,
            fences: Fences::default(),
            bump: None,
        }));
        self.send_release(ctx, p);
    }

    fn begin_release(&mut self, _ctx: &Ctx, p: usize, key: &'static str) {
        let pr = &mut self.procs[p];
        pr.ops_left -= 1;
        let id = pr.held[key];
        pr.op = Some(Op::Release(Rel {
            stray: false,
            key,
            id,
            require_own_ref: false,
            had_ref: None,
            fenced_out: 0,
            fences: Fences::default(),
            bump: None,
        }));
        self.send_release(_ctx, p);
    }

    /// Sends (again) the process's release, fenced with what it has seen now, bumping its fence
    /// record while a bind of the key is in doubt (`release.rs`'s `bump_lease`).
    fn send_release(&mut self, ctx: &Ctx, p: usize) {
        let pr = &mut self.procs[p];
        let life = pr.life;
        let fences = Fences { spec_rev: pr.spec_rev.map(|_| pr.spec_ver), seen: Some(pr.seen) };
        let bump = if pr.doubt.iter().any(|k| Some(k.as_str()) == op_key(&pr.op)) {
            pr.lease
        } else {
            None
        };
        let Some(Op::Release(rel)) = &mut pr.op else { unreachable!() };
        rel.fences = fences;
        rel.bump = bump;
        let txn = if rel.stray {
            stray_ref_release_txn(&ctx.layout, POOL, rel.key, holder_of_life(p, life), fences, bump)
        } else {
            release_plan(rel, holder_of_life(p, life)).txn(&ctx.layout, POOL)
        };
        self.net.push(Msg { waiter: Some(p), reply: Reply::Release, txn, dup_used: false });
    }

    /// The sweeper's decision over a snapshot (`allocator/sweeper.rs`, idle grace 0, fold
    /// threshold 0): the sweep txn and the fold txn go into the network, to be applied at any
    /// later point.
    fn sweep(&mut self, ctx: &Ctx) -> Event {
        let (orphans, fences, spec_rev) = self.sweep_decision(ctx);
        let Some(spec_rev) = spec_rev else { return "sweep: no pool".to_string() };
        let mut what =
            format!("sweep snapshot at r{}: {} orphan(s)", self.store.revision(), orphans.len());
        if !orphans.is_empty() {
            let txn = sweep_txn(&ctx.layout, POOL, &orphans, None, Some(spec_rev));
            self.net.push(Msg { waiter: None, reply: Reply::Sweep, txn, dup_used: false });
        }
        if fences > 0 {
            what.push_str(", fold of the fence records");
            let txn = fold_fences_txn(&ctx.layout, POOL, spec_rev);
            self.net.push(Msg { waiter: None, reply: Reply::Fold, txn, dup_used: false });
        }
        what
    }

    fn sweep_decision(&self, ctx: &Ctx) -> (Vec<Orphan>, usize, Option<Revision>) {
        let (kvs, rev) = self.pool_records(ctx);
        let snap = PoolSnapshot::parse(&ctx.layout, POOL, &kvs, rev);
        let mut orphans = Vec::new();
        for (key, e) in &snap.keys {
            let Some(id) = e.id else { continue };
            if snap.is_referenced(key) {
                continue;
            }
            let id_rec = match snap.ids.get(&id) {
                Some(ie) if ie.record == Some(IdRecord::Bound(key.clone())) => {
                    Some((id, ie.mod_revision))
                }
                _ => None,
            };
            orphans.push(Orphan { key: key.clone(), key_rec: Some((id, e.mod_revision)), id_rec });
        }
        for (id, ie) in &snap.ids {
            if let Some(IdRecord::Bound(k)) = &ie.record {
                if !snap.keys.contains_key(k) && !snap.is_referenced(k) {
                    orphans.push(Orphan {
                        key: k.clone(),
                        key_rec: None,
                        id_rec: Some((*id, ie.mod_revision)),
                    });
                }
            }
        }
        (orphans, snap.fences.len(), self.spec_record(ctx).map(|kv| kv.mod_revision))
    }

    /// G1–G3 in this state (and G4 if it is quiescent): the broken rules, as messages.
    pub fn violations(&self, ctx: &Ctx) -> Vec<String> {
        let mut out = Vec::new();
        let (kvs, rev) = self.pool_records(ctx);
        let snap = PoolSnapshot::parse(&ctx.layout, POOL, &kvs, rev);
        out.extend(g1::check(&snap).iter().map(|p| p.to_string()));
        out.extend(g1::check_references(&snap).iter().map(|p| p.to_string()));
        // G3 against the spec in force: a resize never leaves an ID record outside it.
        let spec = ctx.specs[self.spec_now(ctx)];
        for id in snap.ids.keys() {
            if !id_is_allocatable(spec, *id) {
                out.push(format!("G3: ID record {id} is outside the pool's IDs ({spec})"));
            }
        }
        let spec_now = self.current_spec_rev(ctx);
        for (p, pr) in self.procs.iter().enumerate() {
            if !pr.up || pr.retired || pr.spec_rev != spec_now || spec_now.is_none() {
                continue;
            }
            for (key, id) in &pr.held {
                if matches!(&pr.op, Some(Op::Release(r)) if r.key == key) {
                    continue;
                }
                let now = snap.keys.get(key).and_then(|e| e.id);
                if now != Some(*id) {
                    out.push(format!("G2: P{p} holds {key} as {id} but key/{key} is {now:?}"));
                }
                let r = snap.refs.get(key).and_then(|h| h.get(holder_of(pr, p)));
                if r.and_then(|r| r.id) != Some(*id) {
                    out.push(format!("G2: P{p} holds {key} as {id} but its reference is gone"));
                }
                if !id_is_allocatable(spec, *id) {
                    out.push(format!(
                        "G3: P{p} holds {key} as {id}, outside the pool's IDs ({spec})"
                    ));
                }
            }
        }
        if self.quiescent(spec_now) {
            out.extend(self.unclean_after_sweep(ctx));
        }
        out
    }

    /// [`World::quiescent`] against the store's current spec.
    pub fn quiescent_now(&self, ctx: &Ctx) -> bool {
        self.quiescent(self.current_spec_rev(ctx))
    }

    /// Nothing in flight, every process idle with nothing held in the live pool, every old lease
    /// expired.
    pub fn quiescent(&self, spec_now: Option<Revision>) -> bool {
        self.net.is_empty()
            && self.procs.iter().all(|p| {
                p.op.is_none()
                    && p.abandon.is_empty()
                    && p.stale_leases.is_empty()
                    && (p.held.is_empty() || p.retired || p.spec_rev != spec_now)
            })
    }

    /// G4: a sweep (and fence fold) run now leaves only the spec and the fence floor.
    fn unclean_after_sweep(&self, ctx: &Ctx) -> Vec<String> {
        let mut w = self.clone();
        let mut out = Vec::new();
        let (orphans, fences, spec_rev) = w.sweep_decision(ctx);
        let names = ctx.scope.procs * (ctx.scope.crashes as usize + 1);
        if fences > names {
            out.push(format!("G4: {fences} holder fence records, more than {names} holder names"));
        }
        if let Some(spec_rev) = spec_rev {
            if !orphans.is_empty() {
                w.apply(ctx, &sweep_txn(&ctx.layout, POOL, &orphans, None, Some(spec_rev)));
            }
            w.apply(ctx, &fold_fences_txn(&ctx.layout, POOL, spec_rev));
        }
        let (kvs, _) = w.pool_records(ctx);
        for kv in kvs {
            if kv.key != ctx.layout.fence_floor_key(POOL) || spec_rev.is_none() {
                out.push(format!(
                    "G4: quiescent, swept, and {} = {} is left",
                    String::from_utf8_lossy(&kv.key),
                    String::from_utf8_lossy(&kv.value)
                ));
            }
        }
        out
    }

    /// A one-line summary for traces: the store's bindings and references, what each process
    /// holds.
    pub fn summary(&self, ctx: &Ctx) -> String {
        let (kvs, rev) = self.pool_records(ctx);
        let mut s = format!("r{rev}");
        match self.spec_record(ctx) {
            None => s.push_str(" (no pool)"),
            Some(kv) if ctx.spec_index(&kv) != 0 => {
                let _ = write!(s, " spec {}", ctx.specs[ctx.spec_index(&kv)]);
            }
            Some(_) => {}
        }
        for kv in &kvs {
            let name = String::from_utf8_lossy(&kv.key);
            let name = name.trim_start_matches("m/data/p/");
            let _ = write!(s, " {name}={}", String::from_utf8_lossy(&kv.value));
            if kv.lease != 0 {
                let _ = write!(s, "(L{})", kv.lease);
            }
        }
        for (p, pr) in self.procs.iter().enumerate() {
            let _ = write!(s, " | P{p}{} holds {:?}", if pr.up { "" } else { " down" }, pr.held);
        }
        s
    }
}

fn holder_of(pr: &Proc, p: usize) -> &'static str {
    holder_of_life(p, pr.life)
}

fn holder_of_life(p: usize, life: usize) -> &'static str {
    HOLDERS[p][life.min(3)]
}

fn op_key(op: &Option<Op>) -> Option<&str> {
    match op {
        Some(Op::Release(r)) => Some(r.key),
        _ => None,
    }
}

fn release_plan<'a>(rel: &Rel, holder: &'a str) -> ReleasePlan<'a>
where
    'static: 'a,
{
    ReleasePlan {
        key: rel.key,
        id: rel.id,
        holder,
        last: LastRelease::Reclaim { tombstone_lease: None },
        require_own_ref: rel.require_own_ref,
        fences: rel.fences,
        bump: rel.bump,
    }
}

/// `Allocator::delete_pool(name, force = true)`'s txn for a pool with nothing nested in it:
/// delete the spec, the pool's records and its fence floor, in one txn.
fn delete_pool_txn(l: &Layout) -> TxnRequest {
    let own = [l.id_prefix(POOL), l.key_prefix(POOL), l.refs_prefix(POOL), l.holders_prefix(POOL)];
    TxnRequest::new()
        .and_then([TxnOp::delete(l.pool_spec_key(POOL))])
        .and_then(own.into_iter().map(|p| TxnOp::delete_range(KeyRange::prefix(p))))
        .and_then([TxnOp::delete(l.fence_floor_key(POOL))])
}

/// How an applied txn came out, for traces.
fn outcome(resp: &Option<TxnResponse>) -> &'static str {
    match resp {
        None => "refused by the store",
        Some(r) if r.succeeded => "compares held",
        Some(_) => "compares failed",
    }
}

/// A short description of a message, for traces.
fn describe(m: &Msg) -> String {
    let who = m.waiter.map_or(String::new(), |p| format!("P{p}'s "));
    let what = match &m.reply {
        Reply::Bind { loops, batch: true } => format!("batched bind ({} keys)", loops.len()),
        Reply::Bind { .. } => "bind".to_string(),
        Reply::Release => "release".to_string(),
        Reply::Sweep => "sweep txn".to_string(),
        Reply::Fold => "fence fold".to_string(),
        Reply::Resize => "resize txn".to_string(),
    };
    let puts: Vec<String> = writes(&m.txn).into_iter().collect();
    format!("{who}{what} [{}]", puts.join(", "))
}

fn writes(t: &TxnRequest) -> Vec<String> {
    let mut out = Vec::new();
    for op in &t.success {
        match op {
            TxnOp::Put(p) => out.push(format!(
                "put {}={}",
                String::from_utf8_lossy(&p.key).trim_start_matches("m/data/p/"),
                String::from_utf8_lossy(&p.value)
            )),
            TxnOp::Delete(r) => out.push(format!(
                "del {}",
                String::from_utf8_lossy(&r.key).trim_start_matches("m/data/p/")
            )),
            TxnOp::Txn(n) => out.extend(writes(n)),
            TxnOp::Get(_) => {}
        }
    }
    out
}
