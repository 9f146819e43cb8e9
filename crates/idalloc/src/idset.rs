//! The free-ID structure of one pool (DESIGN §5): which raw IDs of `[min, max]` are used, and a
//! fast choice of a free one.
//!
//! "Used" means anything that makes an ID unavailable for a new key: bound, tombstoned (reuse
//! delay) or reserved. The structure stores maximal runs of consecutive used IDs in a treap (a
//! randomised balanced search tree) keyed by run start, each node knowing how many used IDs its
//! subtree holds. That gives:
//! - memory proportional to the number of runs, never to the size of the range: a pool of
//!   `[1, 2^63 - 1]` with three bindings holds three nodes;
//! - `nth_free(r)` (the r-th free ID in increasing order) in O(log runs) by one descent, because
//!   the number of free IDs below a run's start is `start - min - used IDs before it`;
//! - therefore `random` = `nth_free(uniform r in [0, free))`, exactly uniform over the free IDs
//!   and O(log n) even when the pool is 99.99% full (no rejection sampling, which degrades as the
//!   pool fills), and `lowest` = `nth_free(0)`.
//!
//! Uniform choice matters: nodes allocating at the same time pick independent candidates, so their
//! create-only txns rarely collide. Treap priorities come from a private deterministic generator
//! (not the caller's RNG) so that the tree shape, and thus the cost, cannot be steered by the IDs
//! inserted, and so that a seeded simulation stays reproducible. Picks allocate nothing.
//!
//! Over 600 lines only with its tests: the structure itself is about 430 lines; a seeded model
//! test runs its operations against a plain ordered set.

use rand::Rng;

use crate::pool::Strategy;

/// A node index (`u32`: 4 bytes a link, and a pool never holds 2^32 runs in memory).
type Ix = u32;

const NIL: Ix = Ix::MAX;

/// One maximal run `[start, end]` of used IDs, and its treap links: 32 bytes. A pool whose
/// bindings are spread at random holds one node per binding, so this size is part of the cache's
/// bytes per binding. The treap priority is not stored: it is a hash of the node's
/// index (see [`IdSet::prio`]).
#[derive(Debug, Clone)]
struct Node {
    start: u64,
    end: u64,
    left: Ix,
    right: Ix,
    /// Used IDs in this node's subtree (sum of run lengths).
    sum: u64,
}

/// [`IdSet::runs_from`]: an in-order walk of the treap from a lower bound. The stack holds the
/// nodes still to visit whose left subtrees are done.
pub struct RunsFrom<'a> {
    set: &'a IdSet,
    stack: Vec<Ix>,
}

impl Iterator for RunsFrom<'_> {
    type Item = (u64, u64);

    fn next(&mut self) -> Option<(u64, u64)> {
        let t = self.stack.pop()?;
        let n = &self.set.nodes[t as usize];
        let mut c = n.right;
        while c != NIL {
            self.stack.push(c);
            c = self.set.nodes[c as usize].left;
        }
        Some((n.start, n.end))
    }
}

/// The used and free raw IDs of a pool's range. See the module docs for how and why.
#[derive(Debug, Clone)]
pub struct IdSet {
    min: u64,
    max: u64,
    /// Number of IDs in `[min, max]`; 0 for an empty range.
    len: u64,
    /// Reserved ranges clipped to the range: sorted, disjoint, non-adjacent. Never removable.
    reserved: Vec<(u64, u64)>,
    /// Arena of tree nodes; `free_slots` lists the indices of deleted ones for reuse.
    nodes: Vec<Node>,
    free_slots: Vec<Ix>,
    root: Ix,
    /// Seed of the treap priorities (see [`IdSet::prio`]).
    prio_seed: u64,
}

impl IdSet {
    /// A set over `[min, max]` where exactly the `reserved` IDs (inclusive ranges, in any order,
    /// clipped to the range) are used.
    ///
    /// ID 0 is never tracked (it means "no ID"; pool specs forbid it): a `min` of 0 is treated as 1,
    /// which also keeps every count within `u64`. An empty range (`min > max`) gives a set with
    /// nothing free.
    pub fn new(min: u64, max: u64, reserved: &[(u64, u64)]) -> Self {
        let min = min.max(1);
        let len = if min > max { 0 } else { max - min + 1 };
        let mut clipped: Vec<(u64, u64)> = reserved
            .iter()
            .map(|&(lo, hi)| (lo.max(min), hi.min(max)))
            .filter(|&(lo, hi)| len > 0 && lo <= hi)
            .collect();
        clipped.sort_unstable();
        let mut merged: Vec<(u64, u64)> = Vec::with_capacity(clipped.len());
        for (lo, hi) in clipped {
            match merged.last_mut() {
                Some(last) if lo <= last.1.saturating_add(1) => last.1 = last.1.max(hi),
                _ => merged.push((lo, hi)),
            }
        }
        let mut set = IdSet {
            min,
            max,
            len,
            reserved: Vec::new(),
            nodes: Vec::with_capacity(merged.len()),
            free_slots: Vec::new(),
            root: NIL,
            prio_seed: 0x001d_a110_c5ee,
        };
        // Runs arrive in increasing order: appending each on the right keeps the tree valid.
        for &(lo, hi) in &merged {
            let n = set.new_node(lo, hi);
            set.root = set.merge(set.root, n);
        }
        set.reserved = merged;
        set
    }

    /// The set for a pool spec: its range and reserved IDs, nothing else used yet.
    #[cfg(test)]
    pub fn for_spec(spec: &crate::pool::PoolSpec) -> Self {
        IdSet::new(spec.min(), spec.max(), spec.reserved())
    }

    /// Lowest raw ID of the range.
    #[cfg(test)]
    pub fn min(&self) -> u64 {
        self.min
    }

    /// Highest raw ID of the range.
    #[cfg(test)]
    pub fn max(&self) -> u64 {
        self.max
    }

    /// Marks `id` used. Returns false if it already was, or if it lies outside `[min, max]` (an ID
    /// outside the range cannot be handed out anyway, so a stray record does not matter here).
    pub fn insert(&mut self, id: u64) -> bool {
        if id < self.min || id > self.max {
            return false;
        }
        let (p, s) = self.neighbours(id);
        if p != NIL && self.nodes[p as usize].end >= id {
            return false;
        }
        let joins_prev = p != NIL && self.nodes[p as usize].end + 1 == id;
        // `s` starts after `id`, so `id + 1` cannot overflow when `s` exists.
        let joins_next = s != NIL && self.nodes[s as usize].start == id + 1;
        match (joins_prev, joins_next) {
            (true, true) => {
                let (s_start, s_end) = (self.nodes[s as usize].start, self.nodes[s as usize].end);
                self.root = self.remove_run(self.root, s_start);
                let p_start = self.nodes[p as usize].start;
                self.path_add(p_start, s_end - s_start + 2);
                self.nodes[p as usize].end = s_end;
            }
            (true, false) => {
                let p_start = self.nodes[p as usize].start;
                self.path_add(p_start, 1);
                self.nodes[p as usize].end = id;
            }
            (false, true) => {
                // Lowering the start keeps the order: no run lies between `id` and `s`.
                let s_start = self.nodes[s as usize].start;
                self.path_add(s_start, 1);
                self.nodes[s as usize].start = id;
            }
            (false, false) => {
                let n = self.new_node(id, id);
                self.insert_run(n);
            }
        }
        true
    }

    /// Marks every ID of `ids` used (in any order; IDs outside `[min, max]` are skipped), as
    /// [`IdSet::insert`] of each would, but in time linear in the set's runs plus a sort of the
    /// IDs when they are many.
    ///
    /// Why: a listing hands a cache its IDs in the store's key order (decimal names: `1`, `10`,
    /// `100`, …), which is no order at all for the tree. Inserted one by one, a million of them
    /// cost a split and two merges each down a tree that no longer fits the CPU's caches: 44 % of
    /// a new process's sync at 1M bindings on etcd (docs/benchmarks/scale.md, "Linear cost"). Here
    /// the IDs are sorted, merged with the runs already held, and the tree is rebuilt from the
    /// sorted runs in one pass (`IdSet::rebuild`). A few IDs into a big set are still inserted
    /// one by one, which is then cheaper than a rebuild.
    pub fn insert_many(&mut self, ids: impl IntoIterator<Item = u64>) {
        let (min, max) = (self.min, self.max);
        let mut add: Vec<u64> = ids.into_iter().filter(|&id| id >= min && id <= max).collect();
        if add.len() < 64 || add.len() < self.run_count() / 8 {
            for id in add {
                self.insert(id);
            }
            return;
        }
        add.sort_unstable();
        let mut runs: Vec<(u64, u64)> = Vec::with_capacity(self.run_count() + add.len());
        let push = |runs: &mut Vec<(u64, u64)>, (lo, hi): (u64, u64)| match runs.last_mut() {
            // `hi + 1` cannot overflow: `max` is below `u64::MAX` or nothing follows it.
            Some(last) if lo <= last.1.saturating_add(1) => last.1 = last.1.max(hi),
            _ => runs.push((lo, hi)),
        };
        let mut old = self.runs_from(0).peekable();
        let mut new = add.into_iter().peekable();
        loop {
            let next = match (old.peek(), new.peek()) {
                (Some(&(lo, _)), Some(&id)) if lo <= id => old.next(),
                (_, Some(_)) => new.next().map(|id| (id, id)),
                (Some(_), None) => old.next(),
                (None, None) => break,
            };
            if let Some(run) = next {
                push(&mut runs, run);
            }
        }
        self.rebuild(&runs);
    }

    /// Replaces the tree by one holding exactly `runs` (sorted, disjoint, non-adjacent), built in
    /// one pass: nodes appended in order on a stack of the tree's right spine (a Cartesian tree
    /// by priority), then the subtree sums from the leaves up. O(runs), no recursion.
    fn rebuild(&mut self, runs: &[(u64, u64)]) {
        self.nodes.clear();
        self.free_slots.clear();
        self.nodes.reserve(runs.len());
        let mut spine: Vec<Ix> = Vec::new();
        for &(lo, hi) in runs {
            let n = self.new_node(lo, hi);
            let mut last = NIL;
            while let Some(&top) = spine.last() {
                if self.prio(top) > self.prio(n) {
                    break;
                }
                last = top;
                spine.pop();
            }
            self.nodes[n as usize].left = last;
            if let Some(&top) = spine.last() {
                self.nodes[top as usize].right = n;
            }
            spine.push(n);
        }
        self.root = spine.first().copied().unwrap_or(NIL);
        // Pre-order, then backwards: every node after its children.
        let mut order = Vec::with_capacity(runs.len());
        let mut todo = vec![self.root];
        while let Some(t) = todo.pop() {
            if t != NIL {
                order.push(t);
                todo.push(self.nodes[t as usize].left);
                todo.push(self.nodes[t as usize].right);
            }
        }
        for &t in order.iter().rev() {
            self.update(t);
        }
    }

    /// Marks `id` free. Returns false if it was not used, or if it is reserved (reserved IDs stay
    /// used for the set's whole life).
    pub fn remove(&mut self, id: u64) -> bool {
        if self.is_reserved(id) {
            return false;
        }
        let (p, _) = self.neighbours(id);
        if p == NIL || self.nodes[p as usize].end < id {
            return false;
        }
        let (start, end) = (self.nodes[p as usize].start, self.nodes[p as usize].end);
        if start == id && end == id {
            self.root = self.remove_run(self.root, start);
        } else if start == id {
            self.path_sub(start, 1);
            self.nodes[p as usize].start = id + 1;
        } else if end == id {
            self.path_sub(start, 1);
            self.nodes[p as usize].end = id - 1;
        } else {
            // Split [start, end] into [start, id-1] and [id+1, end].
            self.path_sub(start, end - id + 1);
            self.nodes[p as usize].end = id - 1;
            let n = self.new_node(id + 1, end);
            self.insert_run(n);
        }
        true
    }

    /// True if `id` is used (bound, tombstoned or reserved). IDs outside the range are not.
    #[cfg(test)]
    pub fn contains(&self, id: u64) -> bool {
        let (p, _) = self.neighbours(id);
        p != NIL && self.nodes[p as usize].end >= id
    }

    /// True if `id` is reserved by the pool spec.
    pub fn is_reserved(&self, id: u64) -> bool {
        let i = self.reserved.partition_point(|&(_, hi)| hi < id);
        self.reserved.get(i).is_some_and(|&(lo, _)| lo <= id)
    }

    /// Number of free IDs in the range.
    pub fn free_count(&self) -> u64 {
        self.len - self.sum(self.root)
    }

    /// Number of used IDs in the range (reserved ones included).
    #[cfg(test)]
    pub fn used_count(&self) -> u64 {
        self.sum(self.root)
    }

    /// Number of maximal runs of used IDs: what the memory use is proportional to (the tests and
    /// the bench crate's pick benchmark report it; a lazily opened pool bounds it).
    pub fn run_count(&self) -> usize {
        self.nodes.len() - self.free_slots.len()
    }

    /// The used IDs as maximal inclusive runs, in increasing order (the tests' model check).
    #[cfg(test)]
    pub fn used_runs(&self) -> Vec<(u64, u64)> {
        let mut out = Vec::with_capacity(self.run_count());
        let mut stack = Vec::new();
        let mut t = self.root;
        while t != NIL || !stack.is_empty() {
            while t != NIL {
                stack.push(t);
                t = self.nodes[t as usize].left;
            }
            if let Some(n) = stack.pop() {
                out.push((self.nodes[n as usize].start, self.nodes[n as usize].end));
                t = self.nodes[n as usize].right;
            }
        }
        out
    }

    /// The runs of used IDs that end at or after `from`, in increasing order, lazily: O(log runs)
    /// to the first, then O(1) amortised each. A paged listing (`allocator/page.rs`) walks only
    /// the runs of its page instead of the whole set.
    pub fn runs_from(&self, from: u64) -> RunsFrom<'_> {
        let mut stack = Vec::new();
        let mut t = self.root;
        while t != NIL {
            let n = &self.nodes[t as usize];
            if n.end >= from {
                stack.push(t);
                t = n.left;
            } else {
                t = n.right;
            }
        }
        RunsFrom { set: self, stack }
    }

    /// The `r`-th free ID in increasing order (`r = 0` is the lowest), or `None` if fewer than
    /// `r + 1` IDs are free. One descent of the tree: O(log runs), no allocation.
    pub fn nth_free(&self, r: u64) -> Option<u64> {
        if r >= self.free_count() {
            return None;
        }
        // Invariant: `used_before` counts the used IDs of every run known to lie before the
        // answer; the answer lies in the gap between those runs and the subtree at `t`'s runs.
        let mut used_before = 0u64;
        let mut t = self.root;
        while t != NIL {
            let n = &self.nodes[t as usize];
            let used_left = used_before + self.sum(n.left);
            let free_before_start = (n.start - self.min) - used_left;
            if r < free_before_start {
                t = n.left;
            } else {
                used_before = used_left + (n.end - n.start + 1);
                t = n.right;
            }
        }
        // Exactly `used_before` used IDs lie below the answer, and `r` free ones.
        Some(self.min + r + used_before)
    }

    /// The smallest free ID, or `None` if none is free.
    pub fn lowest(&self) -> Option<u64> {
        self.nth_free(0)
    }

    /// A free ID chosen uniformly at random, or `None` if none is free.
    pub fn random<R: Rng + ?Sized>(&self, rng: &mut R) -> Option<u64> {
        let free = self.free_count();
        if free == 0 {
            return None;
        }
        self.nth_free(rng.random_range(0..free))
    }

    /// A free ID chosen by `strategy`, or `None` if none is free.
    pub fn pick<R: Rng + ?Sized>(&self, strategy: Strategy, rng: &mut R) -> Option<u64> {
        match strategy {
            Strategy::Random => self.random(rng),
            Strategy::Lowest => self.lowest(),
        }
    }

    // ---- tree internals ----

    fn sum(&self, t: Ix) -> u64 {
        if t == NIL {
            0
        } else {
            self.nodes[t as usize].sum
        }
    }

    fn update(&mut self, t: Ix) {
        let n = &self.nodes[t as usize];
        let s = self.sum(n.left) + (n.end - n.start + 1) + self.sum(n.right);
        self.nodes[t as usize].sum = s;
    }

    /// Node `t`'s treap priority: splitmix64 of its index and the set's seed. Cheap, well mixed,
    /// deterministic (a seeded simulation stays reproducible), and not stored: 8 bytes a node
    /// fewer. A node keeps its index (so its priority) for its whole life; a reused index is a
    /// new node inserted afresh, so the heap order holds.
    fn prio(&self, t: Ix) -> u64 {
        let mut z = self.prio_seed ^ u64::from(t).wrapping_mul(0x9E37_79B9_7F4A_7C15);
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    fn new_node(&mut self, start: u64, end: u64) -> Ix {
        let node = Node { start, end, left: NIL, right: NIL, sum: end - start + 1 };
        match self.free_slots.pop() {
            Some(i) => {
                self.nodes[i as usize] = node;
                i
            }
            None => {
                let i = Ix::try_from(self.nodes.len())
                    .ok()
                    .filter(|&i| i != NIL)
                    .unwrap_or_else(|| panic!("a free-ID set holds at most {NIL} runs"));
                self.nodes.push(node);
                i
            }
        }
    }

    /// The run with the largest start `<= id` and the run with the smallest start `> id`.
    fn neighbours(&self, id: u64) -> (Ix, Ix) {
        let (mut p, mut s) = (NIL, NIL);
        let mut t = self.root;
        while t != NIL {
            if self.nodes[t as usize].start <= id {
                p = t;
                t = self.nodes[t as usize].right;
            } else {
                s = t;
                t = self.nodes[t as usize].left;
            }
        }
        (p, s)
    }

    /// Adds `amount` to the subtree sums on the path to the run starting at `start` (its own
    /// included), before that run grows by `amount`.
    fn path_add(&mut self, start: u64, amount: u64) {
        self.path_update(start, |sum| sum + amount);
    }

    /// Subtracts `amount` on the path to the run starting at `start`, before it shrinks by `amount`.
    fn path_sub(&mut self, start: u64, amount: u64) {
        self.path_update(start, |sum| sum - amount);
    }

    /// Applies `f` to the subtree sum of every node on the path to the run starting at `start`.
    fn path_update(&mut self, start: u64, f: impl Fn(u64) -> u64) {
        let mut t = self.root;
        while t != NIL {
            self.nodes[t as usize].sum = f(self.nodes[t as usize].sum);
            let s = self.nodes[t as usize].start;
            t = if start < s {
                self.nodes[t as usize].left
            } else if start > s {
                self.nodes[t as usize].right
            } else {
                NIL
            };
        }
    }

    /// Splits `t` into runs starting before `key` and runs starting at or after it.
    fn split(&mut self, t: Ix, key: u64) -> (Ix, Ix) {
        if t == NIL {
            return (NIL, NIL);
        }
        if self.nodes[t as usize].start < key {
            let (l, r) = self.split(self.nodes[t as usize].right, key);
            self.nodes[t as usize].right = l;
            self.update(t);
            (t, r)
        } else {
            let (l, r) = self.split(self.nodes[t as usize].left, key);
            self.nodes[t as usize].left = r;
            self.update(t);
            (l, t)
        }
    }

    /// Joins two trees where every run of `a` lies before every run of `b`.
    fn merge(&mut self, a: Ix, b: Ix) -> Ix {
        if a == NIL {
            return b;
        }
        if b == NIL {
            return a;
        }
        if self.prio(a) > self.prio(b) {
            let r = self.merge(self.nodes[a as usize].right, b);
            self.nodes[a as usize].right = r;
            self.update(a);
            a
        } else {
            let l = self.merge(a, self.nodes[b as usize].left);
            self.nodes[b as usize].left = l;
            self.update(b);
            b
        }
    }

    /// Inserts the detached node `n` (whose run overlaps and touches no other run).
    fn insert_run(&mut self, n: Ix) {
        let (l, r) = self.split(self.root, self.nodes[n as usize].start);
        let l = self.merge(l, n);
        self.root = self.merge(l, r);
    }

    /// Removes the run starting at `start` from the subtree `t`; returns the new subtree root.
    fn remove_run(&mut self, t: Ix, start: u64) -> Ix {
        if t == NIL {
            return NIL;
        }
        let s = self.nodes[t as usize].start;
        if start == s {
            let m = self.merge(self.nodes[t as usize].left, self.nodes[t as usize].right);
            self.free_slots.push(t);
            return m;
        }
        if start < s {
            let l = self.remove_run(self.nodes[t as usize].left, start);
            self.nodes[t as usize].left = l;
        } else {
            let r = self.remove_run(self.nodes[t as usize].right, start);
            self.nodes[t as usize].right = r;
        }
        self.update(t);
        t
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pool::PoolSpec;
    use rand::rngs::StdRng;
    use rand::SeedableRng;
    use std::collections::BTreeSet;

    impl IdSet {
        /// Checks every structural invariant; returns the tree height.
        fn check(&self) -> usize {
            fn walk(s: &IdSet, t: Ix, lo: u64, hi: u64, prio_bound: u64) -> (u64, usize) {
                if t == NIL {
                    return (0, 0);
                }
                let n = &s.nodes[t as usize];
                let prio = s.prio(t);
                assert!(n.start >= lo && n.start <= hi, "BST order");
                assert!(n.start <= n.end && n.start >= s.min && n.end <= s.max, "run in range");
                assert!(prio <= prio_bound, "heap order");
                let (ls, lh) = walk(s, n.left, lo, n.start.saturating_sub(1), prio);
                let (rs, rh) = walk(s, n.right, n.start + 1, hi, prio);
                let sum = ls + (n.end - n.start + 1) + rs;
                assert_eq!(n.sum, sum, "subtree sum");
                (sum, 1 + lh.max(rh))
            }
            let (_, height) = walk(self, self.root, 0, u64::MAX, u64::MAX);
            let runs = self.used_runs();
            assert_eq!(runs.len(), self.run_count());
            for w in runs.windows(2) {
                assert!(w[0].1 + 1 < w[1].0, "runs maximal and disjoint: {w:?}");
            }
            height
        }
    }

    /// The obvious implementation the tree must agree with.
    struct Model {
        min: u64,
        max: u64,
        used: BTreeSet<u64>,
        reserved: BTreeSet<u64>,
    }

    impl Model {
        fn free(&self) -> Vec<u64> {
            (self.min..=self.max).filter(|i| !self.used.contains(i)).collect()
        }
    }

    fn run_model_test(seed: u64) {
        let mut rng = StdRng::seed_from_u64(seed);
        let min = [1, 2, 1000, u64::MAX - 80][rng.random_range(0..4)];
        let max = min + rng.random_range(0..70);
        let mut reserved = Vec::new();
        for _ in 0..rng.random_range(0..4) {
            let lo = rng.random_range(min.saturating_sub(3)..=max);
            let hi = lo.saturating_add(rng.random_range(0..5));
            reserved.push((lo, hi));
        }
        let mut set = IdSet::new(min, max, &reserved);
        let mut model = Model { min, max, used: BTreeSet::new(), reserved: BTreeSet::new() };
        for &(lo, hi) in &reserved {
            for i in lo.max(min)..=hi.min(max) {
                model.used.insert(i);
                model.reserved.insert(i);
            }
        }
        set.check();
        for step in 0..400 {
            let id = rng.random_range(min.saturating_sub(2)..=max.saturating_add(2));
            match rng.random_range(0..10) {
                0..=4 => {
                    let expect = id >= min && id <= max && model.used.insert(id);
                    assert_eq!(set.insert(id), expect, "seed {seed} step {step} insert {id}");
                }
                5..=8 => {
                    let expect = !model.reserved.contains(&id) && model.used.remove(&id);
                    assert_eq!(set.remove(id), expect, "seed {seed} step {step} remove {id}");
                }
                _ => {
                    // Empty a random stretch, to exercise splits and merges of long runs.
                    for i in id..=id.saturating_add(5).min(max) {
                        let expect = !model.reserved.contains(&i) && model.used.remove(&i);
                        assert_eq!(set.remove(i), expect);
                    }
                }
            }
            set.check();
            let free = model.free();
            assert_eq!(set.free_count(), free.len() as u64, "seed {seed} step {step}");
            assert_eq!(set.used_count(), model.used.len() as u64);
            assert_eq!(set.lowest(), free.first().copied());
            for (r, f) in free.iter().enumerate() {
                assert_eq!(set.nth_free(r as u64), Some(*f), "seed {seed} step {step} r {r}");
            }
            assert_eq!(set.nth_free(free.len() as u64), None);
            // runs_from(x) is the tail of the whole walk that ends at or after x.
            let runs = set.used_runs();
            let from = rng.random_range(min.saturating_sub(2)..=max.saturating_add(2));
            let tail: Vec<(u64, u64)> = runs.iter().copied().filter(|r| r.1 >= from).collect();
            assert_eq!(set.runs_from(from).collect::<Vec<_>>(), tail, "seed {seed} from {from}");
            for i in min.saturating_sub(2)..=max.saturating_add(2) {
                assert_eq!(set.contains(i), model.used.contains(&i) && i >= min && i <= max);
            }
            match set.random(&mut rng) {
                Some(c) => assert!(free.contains(&c)),
                None => assert!(free.is_empty()),
            }
        }
    }

    #[test]
    fn agrees_with_a_naive_model() {
        for seed in 0..150 {
            run_model_test(seed);
        }
    }

    /// `insert_many` leaves exactly the set that inserting each ID would (both of its paths: a
    /// few IDs into a big set, and the sort-and-rebuild), a valid treap of logarithmic height
    /// that later inserts, removes and picks keep working on.
    #[test]
    fn insert_many_is_insert_of_each() {
        for seed in 0..60 {
            let mut rng = StdRng::seed_from_u64(seed);
            let min = [1, 1000, u64::MAX - 5000][rng.random_range(0..3)];
            let max = min + rng.random_range(100..4000);
            let reserved = [(min + 3, min + 9), (max - 2, max.saturating_add(4))];
            let mut set = IdSet::new(min, max, &reserved);
            for _ in 0..rng.random_range(0..3000) {
                let id = rng.random_range(min..=max);
                if rng.random_bool(0.7) {
                    set.insert(id);
                } else {
                    set.remove(id);
                }
            }
            let n = [0, 5, 63, 64, 500, 3000][rng.random_range(0..6)];
            let ids: Vec<u64> = (0..n)
                .map(|_| rng.random_range(min.saturating_sub(3)..=max.saturating_add(3)))
                .collect();
            let mut each = set.clone();
            for &id in &ids {
                each.insert(id);
            }
            set.insert_many(ids);
            let height = set.check();
            assert_eq!(set.used_runs(), each.used_runs(), "seed {seed}, {n} IDs");
            assert_eq!(set.free_count(), each.free_count(), "seed {seed}");
            let runs = set.run_count().max(2) as f64;
            assert!(height as f64 <= 4.0 * runs.log2() + 4.0, "seed {seed}: height {height}");
            for _ in 0..300 {
                let id = rng.random_range(min..=max);
                if rng.random_bool(0.5) {
                    assert_eq!(set.insert(id), each.insert(id), "seed {seed} insert {id}");
                } else {
                    assert_eq!(set.remove(id), each.remove(id), "seed {seed} remove {id}");
                }
            }
            set.check();
            assert_eq!(set.used_runs(), each.used_runs(), "seed {seed} after more changes");
            let r = rng.random_range(0..set.free_count().max(1));
            assert_eq!(set.nth_free(r), each.nth_free(r), "seed {seed}");
        }
    }

    #[test]
    fn random_is_uniform_over_free_ids() {
        // A fragmented small range: ~half the IDs used, some reserved.
        let mut rng = StdRng::seed_from_u64(2024);
        let mut set = IdSet::new(1, 400, &[(10, 30), (200, 200)]);
        for _ in 0..200 {
            set.insert(rng.random_range(1..=400));
        }
        let free: Vec<u64> = (1..=400).filter(|&i| !set.contains(i)).collect();
        assert_eq!(set.free_count(), free.len() as u64);
        let per_bucket = 200u64;
        let samples = per_bucket * free.len() as u64;
        let mut counts = std::collections::HashMap::new();
        for _ in 0..samples {
            let c = set.random(&mut rng).unwrap();
            *counts.entry(c).or_insert(0u64) += 1;
        }
        assert_eq!(counts.len(), free.len(), "every free ID is picked, nothing else");
        let expected = per_bucket as f64;
        let chi2: f64 = free
            .iter()
            .map(|f| {
                let o = *counts.get(f).unwrap_or(&0) as f64;
                (o - expected).powi(2) / expected
            })
            .sum();
        let df = (free.len() - 1) as f64;
        // Mean df, standard deviation sqrt(2 df): 5 sigma. Deterministic with the fixed seed.
        assert!(chi2 < df + 5.0 * (2.0 * df).sqrt(), "chi2 {chi2} df {df}");
        // A biased picker (e.g. choosing a gap then an ID in it) would also show here:
        assert!(chi2 > df - 5.0 * (2.0 * df).sqrt(), "suspiciously even: chi2 {chi2} df {df}");
    }

    /// Random free IDs of `[1, max]`, sorted.
    fn random_free_ids(rng: &mut StdRng, max: u64, n: usize) -> BTreeSet<u64> {
        let mut free = BTreeSet::new();
        while free.len() < n {
            free.insert(rng.random_range(1..=max));
        }
        free
    }

    /// Takes every free ID with random picks, checking each is one of `free`, until exhaustion.
    fn drain_with_random_picks(set: &mut IdSet, free: &BTreeSet<u64>, rng: &mut StdRng) {
        assert_eq!(set.lowest(), free.first().copied());
        for _ in 0..1000 {
            let c = set.random(rng).unwrap();
            assert!(free.contains(&c));
        }
        let mut taken = BTreeSet::new();
        while let Some(c) = set.random(rng) {
            assert!(free.contains(&c) && taken.insert(c));
            assert!(set.insert(c));
        }
        assert_eq!(&taken, free);
        assert_eq!(set.free_count(), 0);
        assert_eq!(set.run_count(), 1);
        assert_eq!(set.used_runs(), vec![(1, set.max())]);
    }

    #[test]
    fn nearly_full_large_range() {
        // 2^24 IDs, all but 1677 (0.01%) used. The used IDs are given as reserved ranges (the
        // complement of the free ones) so the test builds the state without 16 million inserts;
        // the tree is the same either way (maximal runs), and the next test fills by inserts.
        let max = 1u64 << 24;
        let mut rng = StdRng::seed_from_u64(5);
        let free = random_free_ids(&mut rng, max, 1677);
        let mut used = Vec::new();
        let mut next = 1;
        for &f in &free {
            if f > next {
                used.push((next, f - 1));
            }
            next = f + 1;
        }
        if next <= max {
            used.push((next, max));
        }
        let mut set = IdSet::new(1, max, &used);
        assert_eq!(set.free_count(), 1677);
        assert!(set.check() < 64, "balanced");
        drain_with_random_picks(&mut set, &free, &mut rng);
    }

    #[test]
    fn nearly_full_range_filled_by_inserts() {
        // 2^20 IDs, all but 105 (0.01%) used, filled one insert at a time in increasing order.
        let max = 1u64 << 20;
        let mut rng = StdRng::seed_from_u64(6);
        let free = random_free_ids(&mut rng, max, 105);
        let mut set = IdSet::new(1, max, &[]);
        for id in 1..=max {
            if !free.contains(&id) {
                assert!(set.insert(id));
            }
        }
        assert_eq!(set.free_count(), 105);
        assert!(set.run_count() <= 106);
        set.check();
        drain_with_random_picks(&mut set, &free, &mut rng);
    }

    #[test]
    fn huge_ranges_use_memory_for_runs_only() {
        for max in [u32::MAX as u64, u64::MAX >> 1, u64::MAX] {
            let mut set = IdSet::new(1, max, &[(1, 1000)]);
            assert_eq!(set.free_count(), max - 1000);
            for id in [1001, 5000, max / 2, max - 1, max] {
                assert!(set.insert(id));
            }
            assert_eq!(set.free_count(), max - 1005);
            assert_eq!(
                set.used_runs(),
                vec![(1, 1001), (5000, 5000), (max / 2, max / 2), (max - 1, max)]
            );
            assert!(set.nodes.len() <= 5, "memory grows with runs: {}", set.nodes.len());
            assert_eq!(set.lowest(), Some(1002));
            assert_eq!(set.nth_free(set.free_count() - 1), Some(max - 2));
            let mut rng = StdRng::seed_from_u64(max);
            for _ in 0..1000 {
                let c = set.random(&mut rng).unwrap();
                assert!(!set.contains(c) && c <= max && c > 1001);
            }
            assert!(set.remove(max / 2));
            assert!(!set.remove(500), "reserved");
            assert_eq!(set.free_count(), max - 1004);
        }
    }

    #[test]
    fn exhaustion_and_reuse() {
        let mut set = IdSet::new(1, 5, &[(3, 3)]);
        let mut rng = StdRng::seed_from_u64(1);
        for _ in 0..4 {
            let c = set.pick(Strategy::Random, &mut rng).unwrap();
            assert!(set.insert(c));
        }
        assert_eq!(set.free_count(), 0);
        assert_eq!(set.random(&mut rng), None);
        assert_eq!(set.lowest(), None);
        assert_eq!(set.pick(Strategy::Lowest, &mut rng), None);
        assert!(set.remove(4));
        assert_eq!(set.pick(Strategy::Random, &mut rng), Some(4));
        assert_eq!(set.pick(Strategy::Lowest, &mut rng), Some(4));
    }

    #[test]
    fn reserved_ids_stay_used() {
        let mut set = IdSet::new(1, 10, &[(8, 20), (2, 3), (0, 1), (4, 4)]);
        assert_eq!(set.used_runs(), vec![(1, 4), (8, 10)]);
        assert_eq!(set.free_count(), 3);
        for r in [1, 2, 3, 4, 8, 9, 10] {
            assert!(set.is_reserved(r));
            assert!(!set.remove(r));
            assert!(!set.insert(r));
            assert!(set.contains(r));
        }
        assert!(set.insert(5) && set.insert(7));
        assert_eq!(set.used_runs(), vec![(1, 5), (7, 10)]);
        assert!(set.remove(5));
        assert_eq!(set.used_runs(), vec![(1, 4), (7, 10)]);
        assert_eq!(set.lowest(), Some(5));
    }

    #[test]
    fn lowest_strategy_takes_ids_in_order() {
        let mut set = IdSet::new(10, 20, &[(12, 13)]);
        let mut rng = StdRng::seed_from_u64(0);
        let mut got = Vec::new();
        while let Some(c) = set.pick(Strategy::Lowest, &mut rng) {
            set.insert(c);
            got.push(c);
        }
        assert_eq!(got, vec![10, 11, 14, 15, 16, 17, 18, 19, 20]);
    }

    #[test]
    fn edge_ranges() {
        let mut empty = IdSet::new(5, 4, &[(1, 10)]);
        assert_eq!(empty.free_count(), 0);
        assert!(!empty.insert(5));
        assert_eq!(empty.lowest(), None);
        let zero = IdSet::new(0, 3, &[]);
        assert_eq!((zero.min(), zero.free_count(), zero.lowest()), (1, 3, Some(1)));
        let mut one = IdSet::new(u64::MAX, u64::MAX, &[]);
        assert_eq!(one.lowest(), Some(u64::MAX));
        assert!(one.insert(u64::MAX) && !one.insert(u64::MAX));
        assert_eq!(one.lowest(), None);
        assert!(one.remove(u64::MAX) && !one.remove(u64::MAX));
        let spec = PoolSpec::new("p", 1, 100).reserve(50..=60);
        let s = IdSet::for_spec(&spec);
        assert_eq!(s.free_count(), spec.capacity());
    }

    #[test]
    fn same_seed_same_choices() {
        let mut set = IdSet::new(1, 1000, &[]);
        for i in (1..=1000).step_by(3) {
            set.insert(i);
        }
        let picks = |seed| {
            let mut rng = StdRng::seed_from_u64(seed);
            (0..50).map(|_| set.random(&mut rng).unwrap()).collect::<Vec<_>>()
        };
        assert_eq!(picks(9), picks(9));
        assert_ne!(picks(9), picks(10));
    }

    #[test]
    fn stays_balanced_under_sequential_and_split_heavy_loads() {
        // Every other ID used: 50,000 runs, inserted in increasing order (the worst case for an
        // unbalanced tree).
        let mut set = IdSet::new(1, 100_000, &[]);
        for i in (1..=100_000).step_by(2) {
            set.insert(i);
        }
        assert_eq!(set.run_count(), 50_000);
        assert!(set.check() < 60, "height");
        // Merge every run into one, then split it again from the middle out.
        for i in (2..100_000).step_by(2) {
            set.insert(i);
        }
        assert_eq!(set.run_count(), 1);
        for i in (2..100_000).step_by(2) {
            set.remove(i);
        }
        assert_eq!(set.run_count(), 50_000);
        assert!(set.check() < 60, "height");
        assert_eq!(set.nodes.len(), 50_000, "deleted nodes are reused");
    }

    /// One node per isolated binding: its size is part of the cache's bytes per binding.
    #[test]
    fn nodes_stay_compact() {
        assert_eq!(std::mem::size_of::<Node>(), 32);
    }
}
