//! The plain data of the driver's public API: options and results. No behaviour.

use std::time::Duration;

/// How store requests are retried when the store is unreachable or times out.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct RetryPolicy {
    /// Attempts per request, including the first (at least 1).
    pub max_attempts: u32,
    /// Wait before the second attempt; doubles each time up to `max_backoff`.
    pub initial_backoff: Duration,
    pub max_backoff: Duration,
}

impl Default for RetryPolicy {
    fn default() -> Self {
        RetryPolicy {
            max_attempts: 4,
            initial_backoff: Duration::from_millis(50),
            max_backoff: Duration::from_secs(1),
        }
    }
}

/// The default of [`AllocatorOptions::fold_fences_above`].
pub const DEFAULT_FOLD_FENCES_ABOVE: usize = 100;

/// How an [`Allocator`](super::Allocator) is set up: [`AllocatorOptions::builder`], or
/// [`AllocatorOptions::default`] and field assignments.
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct AllocatorOptions {
    /// Root of every store key (DESIGN §4).
    pub prefix: String,
    /// This process's holder name, used for its leased references. Default:
    /// `lease:<host>-<8 hex>` (a random suffix, so two processes on one host never share
    /// references). The `lease:` prefix ([`crate::pool::LEASED_HOLDER_PREFIX`]) is refused for
    /// durable holders, so a generated leased name never shares a durable holder's fence record.
    /// A name given here is not checked that way: do not also use it as a durable holder name
    /// (start it with `lease:` to have that enforced).
    pub holder: Option<String>,
    /// TTL of the session lease; keep-alives go out every third of it.
    pub session_ttl: Duration,
    /// Bound on every single store request.
    pub request_timeout: Duration,
    pub retry: RetryPolicy,
    /// Seed for candidate choice; `None` seeds from the OS. A fixed seed makes a run reproducible.
    pub seed: Option<u64>,
    /// Keys per page when listing a pool.
    pub list_page: i64,
    /// Events buffered per subscriber before it is told it lagged.
    pub event_buffer: usize,
    /// Run a sweeper in the background for every pool this allocator opens, at this interval.
    pub sweep_interval: Option<Duration>,
    /// A sweep that finds more holder fence records than this in a pool folds them all into the
    /// pool's fence floor (one txn), so a pool keeps at most this many fence records after each
    /// sweep, however many holder names ever released in it (DESIGN §13, docs/design/fences.md).
    /// Each fold makes the binds in flight at that moment fail once and be
    /// decided again, so folding rarely is cheaper; 0 folds on every sweep that finds one.
    pub fold_fences_above: usize,
    /// Open pools without loading their view: a pool opened by this allocator
    /// is not listed and watched until something needs its whole view (`wait_synced`, `resync`,
    /// an event subscription, a batched bind, or a single-key bind that keeps missing, which
    /// means a nearly full pool). Until then a single-key bind guesses candidates among the IDs
    /// it has not seen taken and lets the txn's compares (G1–G3, unchanged) decide, and the
    /// cache-only reads (`get`, `key_of`, `snapshot`) know only this process's own keys. For a
    /// process that touches a few keys and exits (the CLI, a job): one key costs a bounded
    /// number of round trips whatever the pool's size. A long-lived process keeps the default
    /// (false): its watched view makes every bind one round trip and every read free.
    pub lazy_view: bool,
    /// Txns of many-key calls (`acquire_many`, `release_many` and their durable and session
    /// forms, the repair task's, and the reads of pages and listings) this allocator has at the
    /// store at once, at least 1; the rest wait in this process, in turns between the clients of
    /// [`as_client`](crate::allocator::as_client): one per client while several have such work,
    /// one in all (of at most 25 keys) while single-key calls go on, and a client rests as long as
    /// its txn took before its next while another client's go on. Single-key calls never wait
    /// for them, so a key's acquire is not queued at the store behind a bulk restore
    /// (docs/design/bulk-admission.md). Each txn carries up to ~100 keys.
    pub bulk_in_flight: usize,
}

/// The default of [`AllocatorOptions::bulk_in_flight`].
pub const DEFAULT_BULK_IN_FLIGHT: usize = 8;

impl Default for AllocatorOptions {
    fn default() -> Self {
        AllocatorOptions {
            prefix: "idalloc".into(),
            holder: None,
            session_ttl: Duration::from_secs(15),
            request_timeout: Duration::from_secs(5),
            retry: RetryPolicy::default(),
            seed: None,
            list_page: 1000,
            event_buffer: 4096,
            sweep_interval: None,
            fold_fences_above: DEFAULT_FOLD_FENCES_ABOVE,
            lazy_view: false,
            bulk_in_flight: DEFAULT_BULK_IN_FLIGHT,
        }
    }
}

/// The result of an acquire.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Acquired {
    pub id: u64,
    /// True if this call created the binding (the key had no ID before).
    pub new: bool,
}

/// The result of a release. Releasing what is not held is not an error: `held` says so.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Released {
    /// The caller held the key (a local count for leased references; the reference record for
    /// durable ones). For a durable release, `false` can also mean that a request retried after
    /// its answer was lost found the reference already removed by its own first attempt.
    pub held: bool,
    /// This release removed the binding (it was the last reference and the pool has no idle grace).
    pub reclaimed: bool,
}

/// One binding as [`Pool::list`](super::Pool::list) reads it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Binding {
    pub id: u64,
    pub key: String,
    /// Holders with a reference (leased or durable), sorted.
    pub holders: Vec<String>,
}
