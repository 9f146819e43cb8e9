//! The reference quota (`refs=`, docs/design/quotas.md) under crashes and races, driven step by
//! step against the embedded store: the service's slot code (`ref_slots`) and the library's binds
//! as the acquire and release handlers call them, interleaved by a seeded scheduler, with
//! instances that die between the slot and the bind or between the release and the free, and
//! client sessions that end (their lease, references, slots and mirrors go at once).
//!
//! After every step no client has more slot records than its limit; whenever nothing is in
//! flight, every reference is counted (a slot and a mirror naming it); and after
//! `check --repair` (the library's `check::scan` and `check::repair`), each client's slots are
//! exactly its references, and a second check finds nothing.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use idalloc::layout::Layout;
use idalloc::quota_names::{parse_mirror_value, parse_slot_value, QuotaName};
use idalloc::store::embedded::EmbeddedStore;
use idalloc::store::{list_all, KeyRange, Store};
use idalloc::{check, Allocator, AllocatorOptions, ClientSession, Pool, PoolSpec};
use idalloc_server::ref_slots::{RefSlots, Taken};

const POOL: &str = "q";
const CLIENTS: [(&str, u64); 2] = [("c1", 3), ("c2", 2)];

struct World {
    store: Arc<dyn Store>,
    layout: Layout,
    alloc: Allocator,
    pool: Pool,
    /// Each client's current session.
    sessions: Mutex<BTreeMap<&'static str, Arc<ClientSession>>>,
    /// Session holder -> its client (durable holders are `<client>/…`).
    owners: Mutex<BTreeMap<String, &'static str>>,
}

impl World {
    async fn new() -> World {
        let store: Arc<dyn Store> = Arc::new(EmbeddedStore::memory());
        let alloc = Allocator::from_arc(store.clone(), AllocatorOptions::default()).expect("alloc");
        let pool = alloc.ensure_pool(&PoolSpec::new(POOL, 1, 1000)).await.expect("pool");
        let w = World {
            store,
            layout: Layout::default(),
            alloc,
            pool,
            sessions: Mutex::default(),
            owners: Mutex::default(),
        };
        for (client, _) in CLIENTS {
            w.open_session(client).await;
        }
        w
    }

    async fn open_session(&self, client: &'static str) {
        let s = self.alloc.client_session(Duration::from_secs(600)).await.expect("session");
        self.owners.lock().expect("owners").insert(s.holder().to_string(), client);
        self.sessions.lock().expect("sessions").insert(client, Arc::new(s));
    }

    fn session(&self, client: &str) -> Arc<ClientSession> {
        self.sessions.lock().expect("sessions")[client].clone()
    }

    fn slots<'a>(&'a self, client: &'a str) -> RefSlots<'a> {
        let limit = CLIENTS.iter().find(|(c, _)| *c == client).map_or(1, |(_, l)| *l);
        RefSlots::new(&*self.store, &self.layout, client, POOL, limit)
    }

    /// The store's references of the pool, (key, holder), and the quota records.
    async fn state(&self) -> State {
        let l = &self.layout;
        let range = KeyRange::prefix(l.pool_data_prefix(POOL));
        let (kvs, _) = list_all(&*self.store, &range, 500).await.expect("list");
        let mut s =
            State { owners: self.owners.lock().expect("owners").clone(), ..State::default() };
        for kv in kvs {
            if let Some(r) = l.parse_ref_key(POOL, &kv.key) {
                s.refs.insert(r);
            }
            match l.parse_quota_key(POOL, &kv.key) {
                Some(QuotaName::Slot { client, n }) => {
                    let named = parse_slot_value(&kv.value).expect("slot value");
                    s.slots.entry(client).or_default().insert(n, named);
                }
                Some(QuotaName::Mirror { client, holder, key }) => {
                    let n = parse_mirror_value(&kv.value).expect("mirror value");
                    s.mirrors.entry(client).or_default().insert((key, holder), n);
                }
                _ => {}
            }
        }
        s
    }

    /// `check --repair` on the pool, then a second check: what the second found.
    async fn check_repair(&self) -> Vec<String> {
        let l = &self.layout;
        let scan = check::scan(&*self.store, l, Some(POOL), 100).await.expect("scan");
        check::repair(&*self.store, l, &scan).await.expect("repair");
        let again = check::scan(&*self.store, l, Some(POOL), 100).await.expect("scan");
        again.report.pools.iter().flat_map(|p| &p.findings).map(|f| f.to_string()).collect()
    }
}

#[derive(Default, Debug)]
struct State {
    owners: BTreeMap<String, &'static str>,
    refs: BTreeSet<(String, String)>,
    /// client -> slot -> (key, holder) it names.
    slots: BTreeMap<String, BTreeMap<u64, (String, String)>>,
    /// client -> (key, holder) -> slot.
    mirrors: BTreeMap<String, BTreeMap<(String, String), u64>>,
}

impl State {
    fn client_refs(&self, client: &str) -> BTreeSet<(String, String)> {
        let ns = format!("{client}/");
        let of = |h: &str| h.starts_with(&ns) || self.owners.get(h) == Some(&client);
        self.refs.iter().filter(|(_, h)| of(h)).cloned().collect()
    }

    /// References of `client` not counted by a mirror naming a slot that names them.
    fn uncounted(&self, client: &str) -> Vec<(String, String)> {
        let (none_m, none_s) = (BTreeMap::new(), BTreeMap::new());
        let mirrors = self.mirrors.get(client).unwrap_or(&none_m);
        let slots = self.slots.get(client).unwrap_or(&none_s);
        self.client_refs(client)
            .into_iter()
            .filter(|r| mirrors.get(r).and_then(|n| slots.get(n)) != Some(r))
            .collect()
    }
}

/// A deterministic generator (xorshift64*), so that a failing seed replays.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

/// One request of one instance, as the handlers run it, a stage at a time. `session`: the
/// client session the reference is on (`None`: a durable holder).
enum Op {
    /// The slot txn (stage 0), the bind (1), the confirm (2).
    Acquire {
        client: &'static str,
        holder: String,
        session: Option<Arc<ClientSession>>,
        key: String,
        stage: u8,
        taken: Option<Taken>,
    },
    /// The library's release (stage 0), the free of the slot (1).
    Release {
        client: &'static str,
        holder: String,
        session: Option<Arc<ClientSession>>,
        key: String,
        stage: u8,
    },
    /// The client's session ends (its lease is revoked) and it opens another.
    EndSession { client: &'static str },
}

fn acquire_op(client: &'static str, holder: &str, key: &str) -> Op {
    let (holder, key) = (holder.to_string(), key.to_string());
    Op::Acquire { client, holder, session: None, key, stage: 0, taken: None }
}

fn release_op(client: &'static str, holder: &str, key: &str) -> Op {
    let (holder, key) = (holder.to_string(), key.to_string());
    Op::Release { client, holder, session: None, key, stage: 0 }
}

/// Runs stage of `op`; `true` when the op is finished.
async fn advance(w: &World, op: &mut Op) -> bool {
    match op {
        Op::Acquire { client, holder, session, key, stage, taken } => {
            let rs = w.slots(client);
            let keys = [key.clone()];
            let lease = session.as_ref().map(|s| s.lease());
            match stage {
                0 => match rs.acquire(holder, lease, &keys).await {
                    Ok(t) => *taken = Some(t),
                    // Refused over the quota, or the session is gone: nothing taken.
                    Err(_) => return true,
                },
                1 => {
                    let bound = match session {
                        Some(s) => s.acquire(&w.pool, key).await,
                        None => w.pool.acquire_durable(key, holder).await,
                    };
                    if let Err(e) = bound {
                        // As the handler: a definite failure gives the slot back.
                        assert!(session.is_some(), "a durable bind failed: {e}");
                        if let Some(t) = taken {
                            rs.give_back(holder, t, &[key.as_str()]).await;
                        }
                        return true;
                    }
                }
                _ => {
                    let bound: Vec<&String> = keys.iter().collect();
                    let confirmed = rs.confirm(holder, lease, &bound).await;
                    if let Ok(Some((_, uncounted))) = confirmed {
                        for k in uncounted {
                            let _ = match session {
                                Some(s) => s.release(&w.pool, &k).await.map(|_| ()),
                                None => w.pool.release_durable(&k, holder).await.map(|_| ()),
                            };
                        }
                    } else if let Err(e) = confirmed {
                        // Only a session that ended meanwhile makes the confirm fail.
                        assert!(session.is_some(), "{e:?}");
                    }
                    return true;
                }
            }
            *stage += 1;
            false
        }
        Op::Release { client, holder, session, key, stage } => {
            if *stage == 0 {
                let released = match session {
                    Some(s) => s.release(&w.pool, key).await.map(|_| ()),
                    None => w.pool.release_durable(key, holder).await.map(|_| ()),
                };
                if let Err(e) = released {
                    // The session ended: its records went with its lease.
                    assert!(session.is_some(), "a durable release failed: {e}");
                    return true;
                }
                *stage = 1;
                return false;
            }
            w.slots(client).release(holder, &[key.as_str()]).await.expect("free");
            true
        }
        Op::EndSession { client } => {
            w.session(client).end().await.expect("end");
            w.open_session(client).await;
            true
        }
    }
}

/// The stages after which an instance may die: between the slot and the bind, between the
/// release and the free.
fn may_crash_after(op: &Op) -> bool {
    matches!(op, Op::Acquire { stage: 1, .. } | Op::Release { stage: 1, .. })
}

fn new_op(w: &World, rng: &mut Rng) -> Op {
    let (client, _) = CLIENTS[rng.below(2) as usize];
    if rng.below(20) == 0 {
        return Op::EndSession { client };
    }
    // Durable holders `<client>/h0`, `<client>/h1`, and the client's session.
    let (holder, session) = match rng.below(3) {
        2 => {
            let s = w.session(client);
            (s.holder().to_string(), Some(s))
        }
        h => (format!("{client}/h{h}"), None),
    };
    let key = format!("k{}", rng.below(5));
    if rng.below(2) == 0 {
        Op::Acquire { client, holder, session, key, stage: 0, taken: None }
    } else {
        Op::Release { client, holder, session, key, stage: 0 }
    }
}

async fn run(seed: u64) {
    let w = World::new().await;
    let mut rng = Rng(seed | 1);
    let (mut crashes, mut steps, mut ends, mut session_refs) = (0, 0, 0, 0);
    for round in 0..12 {
        let mut flight: Vec<Op> = Vec::new();
        let mut started = 0;
        while started < 25 || !flight.is_empty() {
            steps += 1;
            if started < 25 && ((flight.len() < 3 && rng.below(3) != 0) || flight.is_empty()) {
                flight.push(new_op(&w, &mut rng));
                started += 1;
                continue;
            }
            let i = rng.below(flight.len() as u64) as usize;
            ends += usize::from(matches!(flight[i], Op::EndSession { .. }));
            if may_crash_after(&flight[i]) && rng.below(5) == 0 {
                flight.swap_remove(i);
                crashes += 1;
                continue;
            }
            if advance(&w, &mut flight[i]).await {
                flight.swap_remove(i);
            }
            let s = w.state().await;
            for (client, limit) in CLIENTS {
                let n = s.slots.get(client).map_or(0, |m| m.len()) as u64;
                assert!(n <= limit, "seed {seed} round {round}: {client} has {n} slots: {s:?}");
            }
        }
        // Nothing in flight: every reference is counted (crashes leave extra slots only).
        let s = w.state().await;
        session_refs += s.refs.iter().filter(|(_, h)| s.owners.contains_key(h)).count();
        for (client, _) in CLIENTS {
            let missing = s.uncounted(client);
            assert!(missing.is_empty(), "seed {seed} round {round}: {client} {missing:?}: {s:?}");
        }
        if round % 3 == 2 {
            let left = w.check_repair().await;
            assert!(left.is_empty(), "seed {seed} round {round}: after repair: {left:?}");
            let s = w.state().await;
            for (client, _) in CLIENTS {
                let slots: BTreeSet<(String, String)> =
                    s.slots.get(client).map(|m| m.values().cloned().collect()).unwrap_or_default();
                let n = s.slots.get(client).map_or(0, |m| m.len());
                assert_eq!(n, slots.len(), "seed {seed}: one slot per reference: {s:?}");
                assert_eq!(slots, s.client_refs(client), "seed {seed} round {round}: {s:?}");
                assert!(s.uncounted(client).is_empty(), "seed {seed}: {s:?}");
            }
        }
    }
    // The scheduler did reach the cases the test is about.
    assert!(crashes > 5 && steps > 500, "seed {seed}: {crashes} crashes in {steps} steps");
    assert!(ends > 0 && session_refs > 0, "seed {seed}: {ends} session ends, {session_refs}");
}

#[tokio::test]
async fn crashes_leave_extra_slots_that_check_repair_frees() {
    for seed in [1, 7, 42, 2026, 0x5eed] {
        run(seed).await;
    }
}

/// The race of quotas.md: an acquire finds the mirror of a reference being released (so takes
/// nothing), the release frees it, then the acquire binds. The confirm after the bind counts the
/// new reference.
#[tokio::test]
async fn an_acquire_racing_a_release_of_the_same_reference_stays_counted() {
    let w = World::new().await;
    let (h, k) = ("c1/h0".to_string(), "k0".to_string());
    let held = acquire_op("c1", &h, &k);
    let mut held = held;
    while !advance(&w, &mut held).await {}
    let mut acquire = acquire_op("c1", &h, &k);
    let mut release = release_op("c1", &h, &k);
    assert!(!advance(&w, &mut acquire).await, "slot txn: the mirror is there, nothing taken");
    assert!(!advance(&w, &mut release).await, "the library's release");
    assert!(advance(&w, &mut release).await, "the free: the reference is absent");
    assert!(w.state().await.mirrors.is_empty());
    assert!(!advance(&w, &mut acquire).await, "the bind");
    assert_eq!(w.state().await.uncounted("c1"), vec![(k.clone(), h.clone())], "in flight");
    assert!(advance(&w, &mut acquire).await, "the confirm");
    let s = w.state().await;
    assert_eq!(s.client_refs("c1").len(), 1);
    assert!(s.uncounted("c1").is_empty(), "{s:?}");
    assert_eq!(s.slots["c1"].len(), 1, "{s:?}");

    // The other order: the bind lands before the free, which then leaves the slot to it.
    let mut release = release_op("c1", &h, &k);
    let mut acquire = acquire_op("c1", &h, &k);
    assert!(!advance(&w, &mut acquire).await);
    assert!(!advance(&w, &mut release).await);
    assert!(!advance(&w, &mut acquire).await, "the bind, before the free");
    assert!(advance(&w, &mut release).await, "the free finds the reference present");
    assert!(advance(&w, &mut acquire).await);
    let s = w.state().await;
    assert!(s.uncounted("c1").is_empty() && s.slots["c1"].len() == 1, "{s:?}");

    // And the acquire confirms before the free: the free must leave the slot to the reference.
    let mut release = release_op("c1", &h, &k);
    let mut acquire = acquire_op("c1", &h, &k);
    assert!(!advance(&w, &mut acquire).await);
    assert!(!advance(&w, &mut release).await);
    assert!(!advance(&w, &mut acquire).await, "the bind");
    assert!(advance(&w, &mut acquire).await, "the confirm: the mirror is there");
    assert!(advance(&w, &mut release).await, "the free finds the reference present");
    let s = w.state().await;
    assert!(s.uncounted("c1").is_empty() && s.slots["c1"].len() == 1, "{s:?}");
}

/// `check --repair` between an acquire's slot txn and its bind frees the slot (the reference is
/// absent then); the confirm after the bind takes one again. At the limit, it finds none free:
/// the key is released again and the acquire refused.
#[tokio::test]
async fn a_repair_racing_a_bind_does_not_leave_it_uncounted() {
    let w = World::new().await;
    let mut a = acquire_op("c2", "c2/h0", "k0");
    assert!(!advance(&w, &mut a).await, "slot txn");
    assert_eq!(w.check_repair().await, Vec::<String>::new());
    assert!(w.state().await.slots.is_empty(), "the repair freed the slot of the unbound key");
    assert!(!advance(&w, &mut a).await, "the bind");
    assert!(advance(&w, &mut a).await, "the confirm");
    let s = w.state().await;
    assert!(s.uncounted("c2").is_empty() && s.slots["c2"].len() == 1, "{s:?}");

    // c2 has refs=2. Another acquire takes its slot, a repair frees it, a third fills the quota
    // meanwhile: the second's confirm finds no slot free and undoes its bind.
    let mut b = acquire_op("c2", "c2/h1", "k1");
    assert!(!advance(&w, &mut b).await);
    assert_eq!(w.check_repair().await, Vec::<String>::new());
    let mut c = acquire_op("c2", "c2/h1", "k2");
    while !advance(&w, &mut c).await {}
    assert!(!advance(&w, &mut b).await, "the bind");
    assert!(advance(&w, &mut b).await, "the confirm");
    let s = w.state().await;
    assert_eq!(s.client_refs("c2").len(), 2, "k1 was released again: {s:?}");
    assert!(!s.refs.contains(&("k1".into(), "c2/h1".into())), "{s:?}");
    assert!(s.uncounted("c2").is_empty() && s.slots["c2"].len() == 2, "{s:?}");
}
