//! idalloc: small numeric IDs for string keys, the same on every node of a cluster.
//!
//! Services ask "which ID does key K have in pool P?"; every process gets the same answer, no two
//! keys share an ID, an ID returns to its pool when nobody uses its key any more, and a process that
//! dies does not leak its IDs. The contract (guarantees G1–G6, store layout, protocol) is
//! `DESIGN.md`; this crate implements it on etcd for clusters and on an embedded store (memory or
//! one `redb` file) for one machine.
//!
//! ```
//! use idalloc::{Allocator, AllocatorOptions, PoolSpec};
//! use idalloc::store::embedded::EmbeddedStore;
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> idalloc::Result<()> {
//! let store = EmbeddedStore::memory();
//! let alloc = Allocator::new(store, AllocatorOptions::default())?;
//! let vni = alloc.ensure_pool(&PoolSpec::new("vni", 4096, 16_777_215)).await?;
//!
//! let blue = vni.acquire("tenant-blue").await?; // one round trip
//! assert!(blue.new);
//! assert_eq!(vni.acquire("tenant-blue").await?.id, blue.id); // held already: no round trip
//! assert_eq!(vni.get("tenant-blue"), Some(blue.id));
//! assert_eq!(vni.key_of_consistent(blue.id).await?.as_deref(), Some("tenant-blue"));
//!
//! vni.release("tenant-blue").await?;
//! let last = vni.release("tenant-blue").await?; // last use: the binding is reclaimed
//! assert!(last.reclaimed);
//! alloc.close().await?;
//! # Ok(())
//! # }
//! ```
//!
//! # One agent, three ways
//!
//! The job every example agent does (acquire 100 keys on its session, watch them arrive in the
//! pool's view, release them), here with the library on a store of its own; the same agent with
//! `idalloc-client` through `idalloc serve` is in that crate's docs, and in Go in
//! `clients/go/examples/agent` (`crates/idalloc/examples/lib_agent.rs` is this one as a program
//! taking a store URL; a test runs all four agents against one store and compares their answers).
//!
//! ```
//! use idalloc::{Allocator, AllocatorOptions, PoolSpec};
//! use idalloc::store::embedded::EmbeddedStore;
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let opts = AllocatorOptions::builder().prefix("idalloc").build()?;
//! let alloc = Allocator::new(EmbeddedStore::memory(), opts)?;
//! let pool = alloc.ensure_pool(&PoolSpec::new("agents", 1, 65_535).build()?).await?;
//! let keys: Vec<String> = (0..100).map(|i| format!("agent-key-{i:03}")).collect();
//! let mut ids = Vec::new();
//! for r in pool.acquire_many(&keys).await {
//!     ids.push(r?.id); // on this allocator's session lease
//! }
//! pool.wait_synced().await?;
//! // Watch: the pool's view learns every binding from the store's watch; reads from it need no
//! // round trip.
//! while keys.iter().zip(&ids).any(|(k, id)| pool.key_of(*id).as_deref() != Some(k.as_str())) {
//!     tokio::time::sleep(std::time::Duration::from_millis(10)).await;
//! }
//! for (k, id) in keys.iter().zip(&ids) {
//!     assert_eq!(pool.get(k), Some(*id));
//! }
//! for k in &keys {
//!     assert!(pool.release(k).await?.held);
//! }
//! alloc.close().await?; // ends the session
//! # Ok(())
//! # }
//! ```
//!
//! # Cargo features
//!
//! `etcd` (the etcd store, [`store::etcd`]: etcd-client, tonic, rustls) and `embedded` (the
//! embedded store, [`store::embedded`]: redb) are both on by default. A crate that needs only the
//! library's types, errors and checks — `idalloc-client`, which talks to `idalloc serve` over
//! HTTP — takes `default-features = false` and so builds without etcd's gRPC stack and without
//! `protoc`. The Go and Python clients are in `clients/`.
//!
//! # Coming from Cilium or Contiv
//!
//! | Cilium `pkg/allocator` (v1.6) | Contiv-VPP `idalloc` | idalloc |
//! |---|---|---|
//! | `NewAllocator(typ, backend, WithMin, WithMax, WithPrefixMask)` | `InitPool(name, range)` | [`Allocator::new`] + [`Allocator::init_pool`] / [`Allocator::ensure_pool`] with a [`PoolSpec`] (range, reserved, prefix, strategy, idle grace, reuse delay) |
//! | `Allocate(ctx, key)` → `(id, isNew)` | `GetOrAllocateID(pool, label)` | [`Pool::acquire`] → [`Acquired`] `{ id, new }` (leased, refcounted) or [`Pool::acquire_durable`] (named owner, no lease) |
//! | `Release(ctx, key)` → `lastUse` | `ReleaseID(pool, label)` (NOOP if absent) | [`Pool::release`] / [`Pool::release_durable`] → [`Released`] `{ held, reclaimed }`; releasing what is not held is a no-op |
//! | `Get`, `GetNoCache`, `GetByID` | — | [`Pool::get`], [`Pool::get_consistent`], [`Pool::key_of`], [`Pool::key_of_consistent`] |
//! | `ForeachCache` | — | [`Pool::snapshot`] |
//! | `GetEvents()` (`AllocatorEventChan`) | `Update` / KubeStateChange | [`Pool::events`]: `Upsert`, `Delete`, `Synced`, `Conflict`, `Lagged` |
//! | `WaitForInitialSync` | `Resync` | [`Pool::wait_synced`], [`Pool::resync`] |
//! | `RunGC`, `RunLocksGC` | — | [`Pool::sweep`] or [`AllocatorOptions::sweep_interval`]; there are no locks to collect |
//! | `WithMasterKeyProtection` | — | always on: a held key's lost ID record is re-created (DESIGN §7) |
//! | `Delete()` | `Close()` | [`Allocator::close`] (revokes the session lease) |
//!
//! # What is public
//!
//! - At the root: [`Allocator`], [`AllocatorOptions`], [`RetryPolicy`], [`Pool`] with its
//!   results [`Acquired`], [`Released`], [`Binding`], [`SweepReport`] and its events [`Events`] /
//!   [`Event`] / [`Foreign`] (and [`ClusterEvents`]); [`PoolSpec`] and [`Strategy`];
//!   [`ClientSession`]; the remote views [`Cluster`], [`RemotePool`], [`RemoteOptions`],
//!   [`RemoteState`], [`ClusterEvent`]; [`Error`], [`Input`], [`Result`].
//! - Modules: [`store`] (the storage seam and its etcd and embedded implementations, for
//!   building an allocator and for tools that read the raw records), [`allocator`], [`pool`],
//!   [`error`], [`remote`], [`client_session`] (the homes of the types above, with their less
//!   used companions), [`layout`] (the store keys and record values, for tools that read
//!   them), [`records`] (the parser of a pool's raw records), [`audit`] and [`check`] (the
//!   `check` audit), [`metrics`] (the metric names), [`backoff`] (the retry waits with full
//!   jitter the follower uses, shared with the service's client crate), [`labels`] (Cilium-style
//!   label sets as keys, in Cilium's sorted form).
//! - Everything else is crate-private: the free-ID set, the bind/release/sweep protocol, the
//!   watch-fed cache, the sweeper and the batch packing can change without notice. The bench
//!   crate's micro-benchmarks reach them through `bench_api`, compiled only with the `bench`
//!   feature and outside any stability promise.
//!
//! # Layout of the crate
//!
//! - [`store`]: the storage seam (one trait with etcd semantics) and its implementations.
//! - [`pool`], [`layout`], and the private `idset`, `protocol`, `batch`, `cache`: pure code —
//!   specs and validation, store keys, free-ID choice, which txn to send and what its answer
//!   means (and how many of them one request carries), the watch-fed view.
//! - [`records`]: the one parser of a pool's raw records (typed snapshot, spec records).
//! - [`audit`] (pure: invariants and safe repairs) and [`check`] (its I/O): the `check` audit.
//! - [`allocator`]: the async driver, in parts that each do one job (`src/allocator/`):
//!   `request` (the one request path: timeout, retries with one [`RetryPolicy`] backoff, the
//!   quarantine lease), `session` (lease, keep-alive, loss), `registry` (the shared state and the
//!   pool registry), `pool_state` (per-pool state and the per-key single-flight guard), `bind`
//!   (runs the steps of the bind loop, `protocol::BindLoop`), `release`, `repair_queue` + `repair`
//!   (DESIGN §7), `handle` ([`Pool`]),
//!   `events` + `cluster_events`, `coalesce` + `lanes` (its queues), `types` (options and
//!   results), `sync` (the cache feeder), `sweeper` and
//!   `client_session` (its leases). `sync` and `sweeper` use only the request path, the key
//!   layout and the repair queue, never the allocator itself: no file imports one that imports it
//!   back (`scripts/check-imports.py`, run by `scripts/test.sh`; the
//!   pool spec's data lives in the leaf `spec`, so the error type can carry specs while `pool`'s
//!   validation returns errors).
//! - [`remote`] with `feed`: read-only views of other clusters, one list+watch follower for all.
//! - [`client_session`]: leases kept alive by a remote client (what `idalloc serve` hands out).
//! - [`metrics`]: the metric names and the helpers the driver records them with.
//!
//! # Guarantee map
//!
//! Where each guarantee of DESIGN §2 is enforced, and the tests that check it (test files under
//! `crates/idalloc/tests/` unless named otherwise).
//!
//! | Guarantee | Enforced by | Checked by |
//! |---|---|---|
//! | G1 uniqueness | `protocol::decide` and `BindPlan::txn_fenced` (every bind compares the key and
//! ID records it relies on), the bind loop's decisions in `protocol::BindLoop`
//! (`protocol/bind_step.rs`: only a record read from the store may move a key), run by
//! `allocator/bind.rs` and `allocator/batch.rs`, the spec-revision and holder fences
//! (`Inner::fences`, DESIGN §11) | `protocol::bind_step` unit tests
//! (`cache_saying_the_id_is_another_keys_never_moves_the_key`,
//! `id_read_back_as_another_keys_moves_the_key_pinning_that_record`); `simulation.rs`:
//! `simulation_seeds`, `checker_catches_binds_without_the_key_absent_compare`; `allocator.rs`:
//! `many_allocators_overlapping_keys_agree`, `concurrent_acquires_of_one_key_share_one_request`;
//! `regressions.rs`: `a_bind_racing_pool_delete_writes_nothing_into_the_deleted_pool`;
//! idalloc-chaos `chaos_on_a_3_member_etcd_cluster_is_linearizable`; `one_key.rs`:
//! `lazy_binders_racing_agree` (pools opened without a view) |
//! | G2 stability | `allocator/repair_queue.rs` (`after_cache_event`, `check_held`), `allocator/repair.rs` (`repair_key`, `rebind_held`: `Conflict` event if the ID changed), `allocator/session.rs` (lost lease → re-reference every held key), `BindPlan::txn_fenced` (a bind compares the holder's own reference, so a bind of an earlier life or a lost lease applied late cannot move a held reference back onto the old lease) | idalloc-model `a_restart_under_the_same_holder_name_breaks_nothing`; `allocator.rs`: `lost_records_are_recreated_and_a_taken_id_is_a_conflict`, `lost_session_lease_is_replaced_and_keys_keep_their_ids`; `allocator_backends.rs`: `lost_lease_lost_data_and_conflict`; `regressions.rs`: `stale_cache_must_not_move_a_key_off_its_id`; `simulation.rs`: `simulation_seeds` |
//! | G3 range | [`PoolSpec::validate`], `idset.rs` (candidates only from the free set), `Inner::pick_candidate` with [`PoolSpec::apply_prefix`] | `allocator.rs`: `cilium_pool_of_n_takes_exactly_n_keys_then_exhausted`, `huge_range_works`; `simulation.rs`: `simulation_seeds` |
//! | G4 no leaks | `Inner::release_ref` (the last reference reclaims in the same txn), `sweeper.rs` (`sweep`: idle grace), the session lease (a dead process's references expire), `Repair::Release` / `Repair::Abandon` (unknown outcomes completed) | `allocator.rs`: `crash_then_ttl_then_sweep_then_reuse_delay`, `idle_grace_keeps_the_id_for_a_returning_key_then_sweeps`, `release_that_never_arrived_is_completed_in_the_background`; `allocator_backends.rs`: `crashed_process_is_reclaimed_after_its_ttl`; `regressions.rs`: `late_create_after_the_last_release_leaks_nothing`, `late_commit_of_a_timed_out_acquire_does_not_resurrect_a_released_reference` |
//! | G5 reuse delay | `protocol::retire_id` (a tombstone instead of a delete), `Requester::quarantine_lease` / `Requester::txn_with_quarantine` (a fresh lease per attempt) | `allocator.rs`: `crash_then_ttl_then_sweep_then_reuse_delay`; `simulation.rs`: `checker_catches_reclaims_without_tombstones`, `simulation_seeds` |
//! | G6 clear failure | [`Error`] (the closed list), `Requester::call` (every request bounded by the timeout and the retry policy), the `validate_*` functions of [`pool`] | `allocator.rs`: `bad_input_is_invalid_input_naming_value_and_rule`, `round_trip_budgets_are_exact`; `regressions.rs`: `force_delete_stops_a_running_acquirer`; `simulation.rs`: `simulation_seeds` (every error is one of G6's kinds) |
//!
//! `Conflict` is reported as an [`Event::Conflict`] on the pool's events (the holder keeps its
//! key, on a new ID); no operation returns [`Error::Conflict`] today.

#![forbid(unsafe_code)]

pub mod allocator;
pub mod audit;
pub mod backoff;
mod batch;
mod bindings;
mod cache;
pub mod check;
pub mod cluster_version;
mod decimal_ids;
pub mod error;
mod feed;
mod idset;
pub mod labels;
pub mod layout;
pub mod metrics;
mod point_reads;
pub mod pool;
mod protocol;
mod quota_audit;
pub mod quota_names;
pub mod records;
pub mod remote;
mod retry;
mod show;
mod spec;
pub mod store;

// The unit tests wrap stores with the testkit's ONE forwarding store (`HookedStore` and its
// `Hook`s), compiled here from the testkit's source file: a dev-dependency on the testkit would
// give them a second copy of this crate's types. Its `idalloc::` paths name this crate through
// the alias. (Its own tests then run here too; they are quick.)
#[cfg(test)]
extern crate self as idalloc;
#[cfg(test)]
#[path = "../../idalloc-testkit/src/hooked.rs"]
#[allow(dead_code)]
mod hooked;

pub use allocator::client_session;
pub use allocator::client_session::ClientSession;
pub use allocator::sweeper::SweepReport;
pub use allocator::{
    Acquired, Allocator, AllocatorOptions, Binding, BindingsPage, ClusterEvents, Events, Pool,
    Released, RetryPolicy, Stamped, StampedEvents,
};
pub use cache::{Event, Foreign};
pub use error::{Error, Input, Result};
pub use pool::{PoolSpec, Strategy};
pub use remote::{Cluster, ClusterEvent, RemoteOptions, RemotePool, RemoteState};

/// Crate internals for the bench crate's micro-benchmarks (free-ID picks, cache lookups, the
/// batched etcd ceiling built from the real bind plan). **Unstable**: compiled only with the
/// `bench` feature, which only `idalloc-bench` enables; these types change without notice and
/// are no part of the public API.
#[cfg(feature = "bench")]
pub mod bench_api {
    pub use crate::allocator::resize::{only_grows, resize_txn};
    pub use crate::batch::{assemble, pack, split, Frame};
    pub use crate::cache::PoolCache;
    pub use crate::idset::IdSet;
    pub use crate::protocol::bind_step::{
        Action, BindLoop, Candidates, Failure, Hints, Input, Step, PROBE_COLLISIONS,
    };
    pub use crate::protocol::{
        fold_fences_txn, fold_outcome, id_is_allocatable, init_pool_record, init_pool_txn,
        stray_ref_release_outcome, stray_ref_release_txn, sweep_outcome, sweep_txn, BindOutcome,
        BindPlan, Fences, LastRelease, Orphan, RefTarget, ReleaseOutcome, ReleasePlan,
    };
    /// The memory store's state machine, synchronous and clonable (the model checker's store).
    pub use crate::store::embedded::bench_core::MemoryCore;
}
