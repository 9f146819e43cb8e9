//! One feed per pool shared by every watch subscriber, as the Kubernetes watch
//! cache and etcd's grpc-proxy do.
//!
//! A [`Hub`] per watched pool follows the pool's cache ([`idalloc::Pool::stamped_events`]: the one
//! store watch the library already has for an open pool) and keeps a [`Ring`] of its recent
//! changes, grouped by revision and rendered once as Server-Sent Events. Subscribers do not get
//! a copy pushed to them: each reads the ring at its own pace with its own cursor (a sequence
//! number), so the hub never waits for anyone, a client that stops reading costs one cursor,
//! and 1,000 subscribers are one store watch. A subscriber whose cursor falls off the ring's
//! tail (more than the ring's capacity behind) is ended with a last event saying so and the
//! revision to resume from. Resuming (`Last-Event-ID`, `from_revision`) starts the cursor at the
//! first group after the client's revision, if the ring still holds everything after it; else
//! the client must re-list (410 `gone`).
//!
//! Subscribers are woken in step, not per change: the hub wakes them at most once per window
//! (a change after a quiet spell wakes them at once; changes during the window wait for its end
//! and go out together), and at each wake-up it publishes a *horizon* (the ring's end) and the
//! groups since the previous wake-up as one frame ([`Tick`]). A subscriber that had sent
//! everything up to the previous horizon (the usual case) sends that shared frame, a reference
//! count and no copy; one further behind reads its own way from the ring, up to the horizon. So
//! each subscriber writes at most once per wake-up, and the fan-out's cost follows subscribers ×
//! wake-ups, not subscribers × changes. Subscribers are woken in [`SHARDS`] shards, the hub
//! yielding to the runtime between them (`Hub::publish`), so that the requests the service
//! serves meanwhile wait behind one shard's streams, not behind all of them; a task of its own
//! does that, so the feed is read and new streams catch up while a wake-up is under way.
//!
//! The window widens with the number of subscribers ([`window`]): each wake-up costs one socket
//! write per subscriber (the kernel's TCP path is most of the fan-out's CPU), so the hub keeps its
//! subscriber wake-ups near [`WAKE_BUDGET`] per second (`--watch-wake-budget`): 10 ms up to 100
//! subscribers, 100 ms at 1,000, at most 250 ms. A wide window's wake-up is spread over it
//! ([`stagger`]): shard after shard, not one burst of every stream's write at its end. The delay a change may wait is thus bounded, and paid only where the
//! alternative is CPU taken from every request of the service. The hub also wakes subscribers for
//! the keep-alive comment and on shutdown, so a subscriber needs no timer or signal of its own.
//! New streams waiting for the feed to reach a revision are woken apart ([`Hub::moved`]), at
//! once, not at the subscribers' pace.
//!
//! The ring is plain data ([`Ring`]), the pacing pure rules ([`Pacer`], [`window`]); the hub's
//! task is the only writer.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use tokio::time::Instant;

use axum::body::Bytes;
use idalloc::{Event, Pool, Stamped};
use serde_json::json;
use tokio::sync::{watch, Notify};

use crate::snapshot::Snapshots;

/// One revision's changes, rendered as SSE events; the last one carries the revision as its id,
/// so a client's `Last-Event-ID` is always a revision whose changes it has all seen.
#[derive(Clone, Debug)]
pub struct Group {
    pub revision: i64,
    pub events: usize,
    pub chunk: Bytes,
}

/// Recent groups, oldest first, numbered by sequence (`front_seq` is the first one's). Holds at
/// most `cap` events (and always the newest group). `floor`: every change after this revision is
/// in the ring, so a client that has seen everything through `floor` or later can resume exactly.
#[derive(Debug)]
pub struct Ring {
    groups: VecDeque<Group>,
    front_seq: u64,
    events: usize,
    cap: usize,
    floor: i64,
}

/// A subscriber's cursor fell off the ring: what it missed is gone.
#[derive(Debug, PartialEq, Eq)]
pub struct Lagged;

impl Ring {
    pub fn new(cap: usize, floor: i64) -> Ring {
        Ring { groups: VecDeque::new(), front_seq: 0, events: 0, cap: cap.max(1), floor }
    }

    /// The sequence number the next group will have.
    pub fn next_seq(&self) -> u64 {
        self.front_seq + self.groups.len() as u64
    }

    pub fn floor(&self) -> i64 {
        self.floor
    }

    pub fn push(&mut self, g: Group) {
        self.events += g.events;
        self.groups.push_back(g);
        while self.events > self.cap && self.groups.len() > 1 {
            if let Some(old) = self.groups.pop_front() {
                self.events -= old.events;
                self.floor = old.revision;
                self.front_seq += 1;
            }
        }
    }

    /// Forgets every group and starts again after `floor`, skipping one sequence number so that
    /// every current cursor (even one that had read everything) is behind: changes were lost.
    pub fn reset(&mut self, floor: i64) {
        self.front_seq = self.next_seq() + 1;
        self.groups.clear();
        self.events = 0;
        self.floor = floor;
    }

    /// The revision of the newest group (the floor if there is none): where a group that is no
    /// revision of its own (a spec change) goes, keeping the groups in revision order.
    pub fn end_revision(&self) -> i64 {
        self.groups.back().map_or(self.floor, |g| g.revision).max(self.floor)
    }

    /// Up to `max` groups from sequence `seq` on (empty if none yet).
    pub fn read(&self, seq: u64, max: usize) -> Result<Vec<Group>, Lagged> {
        if seq < self.front_seq {
            return Err(Lagged);
        }
        let from = (seq - self.front_seq) as usize;
        Ok(self.groups.iter().skip(from).take(max).cloned().collect())
    }

    /// The groups `from..to` as one frame, with the revision of the last one; `None` if there are
    /// none or the first is no longer in the ring.
    pub fn frame(&self, from: u64, to: u64) -> Option<Batch> {
        if from < self.front_seq || to <= from || to > self.next_seq() {
            return None;
        }
        let (a, b) = ((from - self.front_seq) as usize, (to - self.front_seq) as usize);
        let groups = self.groups.range(a..b);
        let revision = self.groups.get(b - 1)?.revision;
        Some(Batch { from, revision, chunk: join(groups) })
    }

    /// The cursor of a client that has seen every change through `revision`: the first group
    /// after it. `None` if the ring no longer holds everything after `revision`.
    pub fn seq_after(&self, revision: i64) -> Option<u64> {
        if revision < self.floor {
            return None;
        }
        let i = self.groups.partition_point(|g| g.revision <= revision);
        Some(self.front_seq + i as u64)
    }
}

/// The shortest time between two wake-ups of the subscribers: what a change may wait so that
/// the changes of the window go out in one write per subscriber.
pub const WAKE_EVERY: Duration = Duration::from_millis(10);
/// The longest: the bound on what pacing adds to a change's delivery, however many subscribers.
pub const WAKE_EVERY_MAX: Duration = Duration::from_millis(250);
/// Subscriber wake-ups per second a hub aims at, at most (each one is a socket write, and on
/// loopback the reader's TCP receive too): 10,000 keeps the window at 10 ms up to 100
/// subscribers and makes it 100 ms at 1,000. At 20,000 (50 ms at 1,000) the acquires of a
/// 2-core machine with 1,000 subscribers reading beside them were 0.75x of without, at 10,000
/// 0.86x (docs/benchmarks/serve.md): the writes' kernel path, not the bytes, is most
/// of a wake-up's cost on both ends.
pub const WAKE_BUDGET: u64 = 10_000;

/// The window for `subscribers`: [`WAKE_EVERY`], widened so that wake-ups × subscribers stay
/// within `budget` per second ([`WAKE_BUDGET`] by default), at most [`WAKE_EVERY_MAX`].
pub fn window(subscribers: usize, budget: u64) -> Duration {
    let us = (subscribers as u64).saturating_mul(1_000_000) / budget.max(1);
    Duration::from_micros(us).clamp(WAKE_EVERY, WAKE_EVERY_MAX)
}

/// The pause between two shards of a wake-up for a window of `window`: none at the narrowest
/// window (few subscribers: every stream at once, the shards only yield to the runtime), else
/// the window spread over the [`SHARDS`], so that a pool's streams are written to in 32 small
/// runs across the window rather than all in one burst at its end. A burst of 1,000 writes
/// takes both cores of a small machine for milliseconds, and every request in flight (and the
/// store beside the service) waits that long; spread, the same writes cost the same CPU but
/// hold nothing up. A change still reaches every stream within one window (plus the writes),
/// and each stream still gets one write per window.
pub fn stagger(window: Duration) -> Duration {
    if window <= WAKE_EVERY {
        return Duration::ZERO;
    }
    window / SHARDS as u32
}

/// When to wake the subscribers after a change: at once if the last wake-up is at least a window
/// old, else at its end (changes meanwhile join that one wake-up). Pure: the hub's task feeds it
/// the clock and the window.
#[derive(Debug, Default)]
pub struct Pacer {
    last: Option<Instant>,
    due: Option<Instant>,
}

impl Pacer {
    pub fn new() -> Pacer {
        Pacer::default()
    }

    /// A change happened at `now`, with a window of `every`: `true` to wake now; else a wake-up
    /// is due at [`Pacer::due`].
    pub fn changed(&mut self, now: Instant, every: Duration) -> bool {
        if self.due.is_some() {
            return false;
        }
        match self.last {
            Some(last) if now < last + every => {
                self.due = Some(last + every);
                false
            }
            _ => {
                self.last = Some(now);
                true
            }
        }
    }

    /// The pending wake-up, if a change is waiting for one.
    pub fn due(&self) -> Option<Instant> {
        self.due
    }

    /// The pending wake-up happened at `now`.
    pub fn woke(&mut self, now: Instant) {
        self.due = None;
        self.last = Some(now);
    }
}

/// `event: NAME`, `data: JSON`, and `id: ID` if given, as one SSE event.
pub fn sse(name: &str, id: Option<i64>, data: &serde_json::Value) -> String {
    match id {
        Some(id) => format!("id: {id}\nevent: {name}\ndata: {data}\n\n"),
        None => format!("event: {name}\ndata: {data}\n\n"),
    }
}

/// Renders one revision's changes (`bindings`: the pool's size, for a `synced` after a
/// re-listing).
pub fn render(revision: i64, events: &[Event], bindings: impl Fn() -> usize) -> Group {
    let mut out = String::new();
    let n = events.len();
    for (i, e) in events.iter().enumerate() {
        let id = (i + 1 == n).then_some(revision);
        let s = match e {
            Event::Upsert { id: x, key } => {
                sse("upsert", id, &json!({"id": x, "key": key, "revision": revision}))
            }
            Event::Delete { id: x, key } => {
                sse("delete", id, &json!({"id": x, "key": key, "revision": revision}))
            }
            Event::Synced => {
                sse("synced", id, &json!({"revision": revision, "bindings": bindings()}))
            }
            // Not store changes of the bindings: never stamped, or sent apart (`render_spec`).
            _ => continue,
        };
        out.push_str(&s);
    }
    Group { revision, events: n, chunk: Bytes::from(out) }
}

/// A spec change (a resize at store revision `revision`) as an SSE `spec` event without an
/// `id`: the bindings' changes before `revision` may still be on their way (the spec is followed
/// by a watch of its own), so it names no revision the client has all of, and the stream's
/// `Last-Event-ID` stays the last one that does. `at`: the ring's newest revision, where the
/// group goes.
pub fn render_spec(revision: i64, spec: &idalloc::PoolSpec, at: i64) -> Group {
    use crate::api::{PoolSpecBody, SpecBody};
    let change = idalloc_wire::SpecChange { revision, spec: PoolSpecBody::from_spec(spec) };
    let data = serde_json::to_value(change).unwrap_or_default();
    Group { revision: at, events: 1, chunk: Bytes::from(sse("spec", None, &data)) }
}

/// Groups' chunks as one frame (one write); one group's chunk as it is (no copy).
pub fn join<'a>(groups: impl ExactSizeIterator<Item = &'a Group>) -> Bytes {
    let mut groups = groups;
    if groups.len() == 1 {
        return groups.next().map(|g| g.chunk.clone()).unwrap_or_default();
    }
    let groups: Vec<&Group> = groups.collect();
    let mut out = Vec::with_capacity(groups.iter().map(|g| g.chunk.len()).sum());
    for g in groups {
        out.extend_from_slice(&g.chunk);
    }
    Bytes::from(out)
}

/// The groups a wake-up adds, rendered once for every subscriber that had sent all before them.
#[derive(Clone, Debug)]
pub struct Batch {
    /// The sequence number of its first group: the previous horizon.
    pub from: u64,
    /// The revision of its last group (the stream's `Last-Event-ID` after it).
    pub revision: i64,
    pub chunk: Bytes,
}

/// What a wake-up tells the subscribers; read without the hub's lock.
#[derive(Clone, Debug, Default)]
pub struct Tick {
    /// Subscribers send the groups before this sequence number (the ring's end at the wake-up);
    /// later ones wait for the next wake-up, so a subscriber writes once per wake-up.
    pub horizon: u64,
    /// The groups from the previous horizon to this one as one frame (`None` if there are none,
    /// or the ring started over).
    pub batch: Option<Batch>,
    /// Bumped every [`KEEP_ALIVE`]: a subscriber that sees it move sends a comment, so that
    /// proxies do not close a quiet stream.
    pub keep_alive: u64,
    /// The hub stopped for good: subscribers end, with [`HubState::ended`]'s message.
    pub ended: bool,
}

/// What the hub publishes to its subscribers.
#[derive(Debug)]
pub struct HubState {
    pub ring: Ring,
    /// Every change through this revision is in the ring (`None` until the hub knows a boundary).
    pub revision: Option<i64>,
    /// Set when the hub stopped for good (the pool was deleted or re-created, the allocator
    /// closed): subscribers end with this message.
    pub ended: Option<String>,
    /// The newest spec change the hub saw (its store revision and rendered `spec` event): a
    /// stream resumed from before that revision starts with it.
    pub spec: Option<(i64, Bytes)>,
}

/// The shared feed of one pool.
pub struct Hub {
    pub pool: String,
    state: Mutex<HubState>,
    /// The subscribers' wake-ups, in [`SHARDS`] channels woken one after the other.
    ticks: Vec<watch::Sender<Tick>>,
    /// Woken (apart from the subscribers) whenever the hub's revision moves, it starts over or
    /// ends: what a new stream waits on to catch up.
    pub moved: Notify,
    /// Wake-ups asked of the publishing task (requests made while it publishes make one more).
    wakes: Arc<Notify>,
    /// Bumped every [`KEEP_ALIVE`], published with the next wake-up.
    keep_alive: AtomicU64,
    /// The initial bindings new streams send, encoded once per revision.
    pub snapshots: Snapshots,
    /// Subscriber wake-ups per second the pacing aims at ([`window`]).
    budget: u64,
}

impl Drop for Hub {
    fn drop(&mut self) {
        // The publishing task waits for a request: this one finds the hub gone and ends it.
        self.wakes.notify_one();
    }
}

impl Hub {
    /// Starts following `pool` with a ring of at most `cap` events, pacing wake-ups to at most
    /// about `budget` per second ([`window`]); `stop` turning true (the service shutting down)
    /// wakes every subscriber a last time.
    pub fn start(pool: Pool, cap: usize, budget: u64, stop: watch::Receiver<bool>) -> Arc<Hub> {
        let hub = Arc::new(Hub {
            pool: pool.name().to_string(),
            state: Mutex::new(HubState {
                ring: Ring::new(cap, 0),
                revision: None,
                ended: None,
                spec: None,
            }),
            ticks: (0..SHARDS).map(|_| watch::channel(Tick::default()).0).collect(),
            moved: Notify::new(),
            wakes: Arc::new(Notify::new()),
            keep_alive: AtomicU64::new(0),
            snapshots: Snapshots::default(),
            budget,
        });
        tokio::spawn(run(Arc::downgrade(&hub), pool, stop));
        tokio::spawn(publisher(Arc::downgrade(&hub), hub.wakes.clone()));
        hub
    }

    pub fn lock(&self) -> MutexGuard<'_, HubState> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A new stream's wake-ups: from the shard with the fewest streams.
    pub fn subscribe(&self) -> watch::Receiver<Tick> {
        let fewest = self.ticks.iter().min_by_key(|t| t.receiver_count());
        match fewest {
            Some(t) => t.subscribe(),
            // Never: there are SHARDS (> 0) shards. A closed channel ends the stream at once.
            None => watch::channel(Tick { ended: true, ..Tick::default() }).1,
        }
    }

    /// Open streams (each holds one receiver of the wake-ups).
    pub fn subscribers(&self) -> usize {
        self.ticks.iter().map(|t| t.receiver_count()).sum()
    }

    pub fn is_ended(&self) -> bool {
        self.lock().ended.is_some()
    }

    /// Applies `f` to every shard's [`Tick`] and wakes its streams, one shard at a time, pausing
    /// after each shard that has streams: a yield to the runtime when `spacing` is zero, so that a
    /// wake-up of 1,000 streams is 32 runs of about 32 tasks with the service's other tasks
    /// (requests, the store's answers) run in between, instead of one run of 1,000 that every
    /// request woken meanwhile waits behind; else a sleep of `spacing` ([`stagger`]).
    async fn publish(&self, spacing: Duration, f: impl Fn(&mut Tick)) {
        let start = Instant::now();
        let last = self.ticks.len().saturating_sub(1);
        for (i, t) in self.ticks.iter().enumerate() {
            t.send_modify(&f);
            if t.receiver_count() == 0 || i == last {
                continue;
            }
            if spacing.is_zero() {
                tokio::task::yield_now().await;
            } else {
                // Deadlines from the start, so that the timer's rounding does not add up.
                let due = start + spacing * (i as u32 + 1);
                tokio::time::sleep_until(due).await;
            }
        }
    }

    /// Wakes the subscribers, shard by shard ([`Hub::publish`], spread over the window when it is
    /// wide: [`stagger`]): publishes the ring's end at that moment as the shard's horizon, and
    /// the groups since the shard's previous horizon as one frame its streams share.
    async fn wake(&self) {
        let keep_alive = self.keep_alive.load(Ordering::Relaxed);
        let ended = self.is_ended();
        let spacing =
            if ended { Duration::ZERO } else { stagger(window(self.subscribers(), self.budget)) };
        self.publish(spacing, |t| {
            let st = self.lock();
            let horizon = st.ring.next_seq();
            t.batch = st.ring.frame(t.horizon, horizon);
            t.horizon = horizon;
            t.ended = st.ended.is_some();
            t.keep_alive = keep_alive;
        })
        .await;
    }

    /// Asks the publishing task for a wake-up.
    fn request_wake(&self) {
        self.wakes.notify_one();
    }

    fn end(&self, why: String) {
        self.lock().ended = Some(why);
        self.moved.notify_waiters();
        self.request_wake();
    }
}

/// The task that wakes the subscribers, apart from the one that follows the feed: a wake-up of
/// thousands of streams yields to the runtime between shards and so takes as long as their
/// writes, and meanwhile the feed is still read into the ring and new streams still catch up.
async fn publisher(hub: std::sync::Weak<Hub>, wakes: Arc<Notify>) {
    loop {
        wakes.notified().await;
        let Some(h) = hub.upgrade() else { return };
        h.wake().await;
    }
}

/// A hub as the service holds it: with the moment it was first seen unused (held by nothing
/// but the service's map), for [`keep`].
pub struct Held {
    pub hub: Arc<Hub>,
    pub idle_since: Option<Instant>,
}

/// Whether the service keeps a hub at `now`: not once it `ended` (its pool was deleted or
/// re-created; its streams end on their own), nor once it has been `unused` (no stream holds
/// it) for `grace` on end. Notes in `idle_since` when it was first seen unused, and forgets that
/// when it is used again. The grace lets a client that reconnects soon resume exactly from the
/// hub's history rather than get 410 `gone` from a fresh hub.
pub fn keep(
    ended: bool,
    unused: bool,
    idle_since: &mut Option<Instant>,
    now: Instant,
    grace: Duration,
) -> bool {
    if ended {
        return false;
    }
    if !unused {
        *idle_since = None;
        return true;
    }
    let since = *idle_since.get_or_insert(now);
    now.saturating_duration_since(since) < grace
}

/// Shards of the subscribers' wake-ups (see `Hub::publish`).
pub const SHARDS: usize = 32;

/// How often the hub checks that its pool still exists (a deleted pool's feed just goes quiet).
const RETIRED_CHECK: Duration = Duration::from_secs(1);
/// Interval of the subscribers' keep-alive comment.
pub const KEEP_ALIVE: Duration = Duration::from_secs(15);

/// The hub's task: follows the pool's stamped changes into the ring until the pool is retired,
/// the allocator closes, the service stops, or every handle on the hub is gone.
async fn run(hub: std::sync::Weak<Hub>, pool: Pool, mut stop: watch::Receiver<bool>) {
    let mut check = tokio::time::interval(RETIRED_CHECK);
    let mut keep_alive = tokio::time::interval(KEEP_ALIVE);
    keep_alive.reset();
    let mut pacer = Pacer::new();
    'subscribe: loop {
        let mut feed = pool.stamped_events();
        let start = feed.revision;
        {
            let Some(h) = hub.upgrade() else { return };
            {
                let mut st = h.lock();
                // Everything before this subscription is unknown to the ring: it starts after
                // `start` (a partial revision at `start` is dropped below).
                st.ring.reset(start);
                st.revision = feed.complete.then_some(start);
            }
            h.moved.notify_waiters();
            h.request_wake();
        }
        let mut pending: Vec<(i64, Event)> = Vec::new();
        loop {
            let due = pacer.due();
            // What woke the hub, decided before anything is awaited (the select's own values,
            // a borrow of `stop` among them, must not live across the awaits below).
            let step = tokio::select! {
                m = feed.recv() => Step::Feed(m),
                _ = tokio::time::sleep_until(due.unwrap_or_else(Instant::now)), if due.is_some() => Step::Due,
                _ = keep_alive.tick() => Step::KeepAlive,
                _ = stop.wait_for(|s| *s) => Step::Stop,
                _ = check.tick() => Step::Check,
            };
            let Some(h) = hub.upgrade() else { return };
            let msg = match step {
                Step::Feed(m) => m,
                Step::Due => {
                    pacer.woke(Instant::now());
                    h.request_wake();
                    continue;
                }
                Step::KeepAlive => {
                    h.keep_alive.fetch_add(1, Ordering::Relaxed);
                    h.request_wake();
                    continue;
                }
                Step::Stop => {
                    // Subscribers see the service shutting down when woken, and end.
                    h.moved.notify_waiters();
                    h.request_wake();
                    return;
                }
                Step::Check => {
                    h.snapshots.drop_unused();
                    if pool.is_retired() {
                        let why =
                            format!("pool {:?} was deleted or re-created: watch it again", h.pool);
                        h.end(why);
                        return;
                    }
                    continue;
                }
            };
            match msg {
                None => {
                    h.end("the service stopped following this pool".to_string());
                    return;
                }
                // The hub fell more than the pool's event buffer behind (it only copies, so the
                // machine is overloaded): start over; every subscriber is told it lagged.
                Some(Err(_missed)) => continue 'subscribe,
                // A resize: sent at once, apart from the bindings' revisions (`render_spec`).
                Some(Ok(Stamped::Event { revision, event: Event::Spec(spec) })) => {
                    {
                        let mut st = h.lock();
                        let g = render_spec(revision, &spec, st.ring.end_revision());
                        st.spec = Some((revision, g.chunk.clone()));
                        st.ring.push(g);
                    }
                    h.moved.notify_waiters();
                    if pacer.changed(Instant::now(), window(h.subscribers(), h.budget)) {
                        h.request_wake();
                    }
                }
                Some(Ok(Stamped::Event { revision, event })) => {
                    if revision > start {
                        pending.push((revision, event));
                    }
                }
                // A re-listing arrives as one message however big the pool (so it cannot make
                // the hub lag and cut every subscriber); its changes become one group.
                Some(Ok(Stamped::Listing { revision, events })) => {
                    if revision > start {
                        pending.extend(events.iter().map(|e| (revision, e.clone())));
                    }
                }
                Some(Ok(Stamped::Through { revision })) => {
                    let groups = group(std::mem::take(&mut pending), &pool);
                    {
                        let mut st = h.lock();
                        for g in groups {
                            st.ring.push(g);
                        }
                        st.revision = Some(st.revision.unwrap_or(start).max(revision));
                    }
                    h.moved.notify_waiters();
                    if pacer.changed(Instant::now(), window(h.subscribers(), h.budget)) {
                        h.request_wake();
                    }
                }
            }
        }
    }
}

/// What woke the hub's task.
enum Step<M> {
    Feed(Option<M>),
    Due,
    KeepAlive,
    Stop,
    Check,
}

/// Splits changes (in revision order) into one rendered group per revision.
fn group(changes: Vec<(i64, Event)>, pool: &Pool) -> Vec<Group> {
    let mut out = Vec::new();
    let mut i = 0;
    while i < changes.len() {
        let rev = changes[i].0;
        let j = changes[i..].iter().position(|(r, _)| *r != rev).map_or(changes.len(), |k| i + k);
        let events: Vec<Event> = changes[i..j].iter().map(|(_, e)| e.clone()).collect();
        out.push(render(rev, &events, || pool.snapshot().len()));
        i = j;
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn g(revision: i64, events: usize) -> Group {
        Group { revision, events, chunk: Bytes::from(format!("r{revision}")) }
    }

    #[test]
    fn the_ring_keeps_at_most_cap_events_and_moves_its_floor() {
        let mut r = Ring::new(5, 10);
        assert_eq!(r.seq_after(9), None, "before the floor: re-list");
        assert_eq!(r.seq_after(10), Some(0));
        r.push(g(11, 2));
        r.push(g(12, 2));
        assert_eq!(r.seq_after(10), Some(0));
        assert_eq!(r.seq_after(11), Some(1));
        assert_eq!(r.seq_after(15), Some(2), "after everything: the next group");
        r.push(g(14, 2));
        // 6 events > 5: the oldest group goes, and with it the ability to resume from 10.
        assert_eq!(r.floor(), 11);
        assert_eq!(r.seq_after(10), None);
        assert_eq!(r.seq_after(11), Some(1));
        assert_eq!(r.read(0, 10).map(|v| v.len()), Err(Lagged));
        let got: Vec<i64> = r.read(1, 10).expect("read").iter().map(|g| g.revision).collect();
        assert_eq!(got, [12, 14]);
        assert_eq!(r.read(3, 10).expect("read").len(), 0, "nothing new yet");
        // A single group over the cap is kept (the newest is always there).
        r.push(g(20, 50));
        assert_eq!(r.read(3, 10).expect("read").len(), 1);
    }

    #[test]
    fn a_reset_lags_every_cursor_even_a_caught_up_one() {
        let mut r = Ring::new(100, 0);
        r.push(g(1, 1));
        let caught_up = r.next_seq();
        r.reset(7);
        assert_eq!(r.read(caught_up, 10).map(|v| v.len()), Err(Lagged));
        assert_eq!(r.seq_after(6), None);
        assert_eq!(r.seq_after(7), Some(r.next_seq()));
    }

    #[test]
    fn the_pacer_wakes_at_once_after_a_quiet_spell_and_else_once_at_the_windows_end() {
        let t0 = Instant::now();
        let ms = |n| t0 + Duration::from_millis(n);
        let w = Duration::from_millis(10);
        let mut p = Pacer::new();
        assert!(p.changed(ms(0), w), "the first change wakes at once");
        assert_eq!(p.due(), None);
        // Changes within the window wait for its end, all for the same one wake-up.
        assert!(!p.changed(ms(3), w));
        assert_eq!(p.due(), Some(ms(10)));
        assert!(!p.changed(ms(7), w));
        assert_eq!(p.due(), Some(ms(10)));
        p.woke(ms(10));
        assert_eq!(p.due(), None);
        // The next window runs from that wake-up.
        assert!(!p.changed(ms(15), w));
        assert_eq!(p.due(), Some(ms(20)));
        p.woke(ms(21));
        assert!(p.changed(ms(40), w), "quiet for longer than the window: at once");
        assert!(!p.changed(ms(40), w));
        assert_eq!(p.due(), Some(ms(50)));
        // A wider window (more subscribers) holds the next wake-up back longer.
        p.woke(ms(50));
        assert!(!p.changed(ms(70), Duration::from_millis(50)));
        assert_eq!(p.due(), Some(ms(100)));
    }

    #[test]
    fn the_window_keeps_subscriber_wake_ups_within_the_budget_between_its_bounds() {
        let b = 20_000;
        assert_eq!(window(0, b), WAKE_EVERY);
        assert_eq!(window(1, b), WAKE_EVERY);
        assert_eq!(window(200, b), WAKE_EVERY, "200 × 100 wake-ups/s is the budget");
        assert_eq!(window(1000, b), Duration::from_millis(50));
        assert_eq!(window(2000, b), Duration::from_millis(100));
        assert_eq!(window(5000, b), WAKE_EVERY_MAX);
        assert_eq!(window(usize::MAX, b), WAKE_EVERY_MAX);
        assert_eq!(window(1000, 0), WAKE_EVERY_MAX, "a zero budget is the widest window");
        // Within the budget wherever the widest window does not cap it.
        for budget in [b, WAKE_BUDGET] {
            for n in [300, 1000, 2000] {
                let per_sec = n as f64 / window(n, budget).as_secs_f64();
                assert!(per_sec <= budget as f64 + 1.0, "{n} subscribers: {per_sec} wake-ups/s");
            }
        }
    }

    #[test]
    fn a_frame_joins_the_groups_between_two_horizons_once_and_none_if_gone() {
        let mut r = Ring::new(5, 0);
        r.push(g(1, 1));
        r.push(g(2, 1));
        r.push(g(3, 1));
        let b = r.frame(1, 3).expect("groups 1 and 2");
        assert_eq!((b.from, b.revision, &b.chunk[..]), (1, 3, &b"r2r3"[..]));
        let one = r.frame(2, 3).expect("one group");
        assert_eq!(one.chunk.as_ptr(), r.read(2, 1).expect("read")[0].chunk.as_ptr(), "no copy");
        assert!(r.frame(3, 3).is_none(), "nothing new");
        assert!(r.frame(1, 9).is_none(), "past the ring's end");
        for rev in 4..10 {
            r.push(g(rev, 1));
        }
        assert!(r.frame(0, 4).is_none(), "the first group fell off the ring");
    }

    /// A hub with no pool behind it, for the wake-up order alone.
    fn bare_hub() -> Arc<Hub> {
        Arc::new(Hub {
            pool: "p".into(),
            state: Mutex::new(HubState {
                ring: Ring::new(10, 0),
                revision: None,
                ended: None,
                spec: None,
            }),
            ticks: (0..SHARDS).map(|_| watch::channel(Tick::default()).0).collect(),
            moved: Notify::new(),
            wakes: Arc::new(Notify::new()),
            keep_alive: AtomicU64::new(0),
            snapshots: Snapshots::default(),
            budget: WAKE_BUDGET,
        })
    }

    #[tokio::test(flavor = "current_thread")]
    async fn a_wake_up_lets_other_tasks_run_between_its_shards() {
        // 4 streams a shard. The first stream to run wakes a "request" (as a socket turning
        // readable mid-wake-up would): it must run before most streams have, not after all.
        let hub = bare_hub();
        let n = 4 * SHARDS;
        let log = Arc::new(Mutex::new(Vec::new()));
        let request = Arc::new(Notify::new());
        let mut tasks = Vec::new();
        for i in 0..n {
            let mut rx = hub.subscribe();
            let (log, request) = (log.clone(), request.clone());
            tasks.push(tokio::spawn(async move {
                if rx.changed().await.is_ok() {
                    let mut l = log.lock().unwrap_or_else(|p| p.into_inner());
                    if l.is_empty() {
                        request.notify_one();
                    }
                    l.push(i);
                }
            }));
        }
        assert_eq!(hub.subscribers(), n);
        let req = {
            let (log, request) = (log.clone(), request.clone());
            tokio::spawn(async move {
                request.notified().await;
                let l = log.lock().unwrap_or_else(|p| p.into_inner());
                l.len()
            })
        };
        tokio::task::yield_now().await; // every task is waiting now
        let h = hub.clone();
        let publish = async move { h.publish(Duration::ZERO, |t| t.keep_alive += 1).await };
        tokio::spawn(publish).await.expect("publish");
        let streams_before_the_request = req.await.expect("request");
        for t in tasks {
            t.await.expect("stream");
        }
        assert_eq!(log.lock().unwrap_or_else(|p| p.into_inner()).len(), n, "every stream woke");
        assert!(
            streams_before_the_request <= 2 * (n / SHARDS),
            "the request ran after {streams_before_the_request} of {n} streams"
        );
    }

    #[test]
    fn a_hub_is_kept_while_used_and_for_the_grace_after_and_never_once_ended() {
        let t0 = Instant::now();
        let s = |n| t0 + Duration::from_secs(n);
        let grace = Duration::from_secs(60);
        let mut idle = None;
        assert!(keep(false, false, &mut idle, s(0), grace), "in use");
        assert_eq!(idle, None);
        assert!(keep(false, true, &mut idle, s(10), grace), "unused: the grace starts");
        assert_eq!(idle, Some(s(10)));
        assert!(keep(false, true, &mut idle, s(69), grace), "still within the grace");
        assert!(!keep(false, true, &mut idle, s(70), grace), "the grace is over");
        let mut idle = Some(s(10));
        assert!(keep(false, false, &mut idle, s(65), grace), "used again meanwhile");
        assert_eq!(idle, None, "the grace starts over when it is unused again");
        assert!(!keep(true, false, &mut None, s(0), grace), "ended: dropped even while held");
        assert!(!keep(false, true, &mut None, s(0), Duration::ZERO), "no grace: at once");
    }

    #[test]
    fn a_wide_window_is_spread_over_the_shards_and_the_narrowest_is_not() {
        assert_eq!(stagger(WAKE_EVERY), Duration::ZERO);
        assert_eq!(stagger(Duration::from_millis(1)), Duration::ZERO);
        assert_eq!(stagger(Duration::from_millis(64)), Duration::from_millis(2));
        assert_eq!(stagger(WAKE_EVERY_MAX) * SHARDS as u32, WAKE_EVERY_MAX);
    }

    #[tokio::test(flavor = "current_thread", start_paused = true)]
    async fn a_wake_up_of_many_streams_is_spread_over_the_window_not_one_burst() {
        // 1,000 streams: a window of 100 ms at the default budget. The clock is tokio's paused
        // one (it moves only when every task waits), so this checks the order, not a speed.
        let hub = bare_hub();
        let n = 1000;
        let w = window(n, WAKE_BUDGET);
        assert!(w > WAKE_EVERY, "{w:?}");
        let woke = Arc::new(Mutex::new(Vec::new()));
        let mut tasks = Vec::new();
        for _ in 0..n {
            let mut rx = hub.subscribe();
            let woke = woke.clone();
            tasks.push(tokio::spawn(async move {
                if rx.changed().await.is_ok() {
                    woke.lock().unwrap_or_else(|p| p.into_inner()).push(Instant::now());
                }
            }));
        }
        tokio::task::yield_now().await;
        let t0 = Instant::now();
        hub.lock().ring.push(g(1, 1));
        hub.wake().await;
        for t in tasks {
            t.await.expect("stream");
        }
        let woke = woke.lock().unwrap_or_else(|p| p.into_inner()).clone();
        assert_eq!(woke.len(), n, "every stream woke");
        let last = woke.iter().map(|t| *t - t0).max().unwrap_or_default();
        let at_once = woke.iter().filter(|t| **t == t0).count();
        assert!(at_once <= n / SHARDS + 1, "{at_once} of {n} streams woke in the first shard");
        assert!(last >= w - stagger(w) && last <= w, "the last shard woke after {last:?}");
    }

    #[tokio::test(flavor = "current_thread")]
    async fn each_shard_gets_the_groups_since_its_own_previous_wake_up() {
        let hub = bare_hub();
        hub.lock().ring.push(g(1, 1));
        hub.wake().await;
        for t in &hub.ticks {
            let t = t.borrow();
            let b = t.batch.as_ref().expect("a frame");
            assert_eq!((t.horizon, b.from, b.revision, &b.chunk[..]), (1, 0, 1, &b"r1"[..]));
        }
        hub.lock().ring.push(g(2, 1));
        hub.lock().ring.push(g(3, 1));
        hub.wake().await;
        for t in &hub.ticks {
            let t = t.borrow();
            let b = t.batch.as_ref().expect("a frame");
            assert_eq!((t.horizon, b.from, b.revision, &b.chunk[..]), (3, 1, 3, &b"r2r3"[..]));
        }
        hub.wake().await;
        assert!(hub.ticks.iter().all(|t| t.borrow().batch.is_none()), "nothing new: no frame");
    }

    #[test]
    fn a_group_puts_its_revision_on_its_last_event_only() {
        let events =
            [Event::Upsert { id: 1, key: "a".into() }, Event::Delete { id: 2, key: "b\"c".into() }];
        let text = String::from_utf8(render(42, &events, || 0).chunk.to_vec()).expect("utf-8");
        assert_eq!(
            text,
            "event: upsert\ndata: {\"id\":1,\"key\":\"a\",\"revision\":42}\n\n\
             id: 42\nevent: delete\ndata: {\"id\":2,\"key\":\"b\\\"c\",\"revision\":42}\n\n"
        );
    }
}
