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
//! # Layout of the crate
//!
//! - [`store`]: the storage seam (one trait with etcd semantics) and its implementations.
//! - [`pool`], [`layout`], [`idset`], [`protocol`], [`cache`]: pure code — specs and validation,
//!   store keys, free-ID choice, which txn to send and what its answer means, the watch-fed view.
//! - [`records`]: the one parser of a pool's raw records (typed snapshot, spec records).
//! - [`allocator`], [`sweeper`]: the async driver that runs those decisions against a store.
//! - [`client_session`]: leases kept alive by a remote client (what `idalloc serve` hands out).
//! - [`metrics`]: the metric names and the helpers the driver records them with.

#![forbid(unsafe_code)]

pub mod allocator;
pub mod bindings;
pub mod cache;
pub mod client_session;
pub mod error;
mod feed;
pub mod idset;
pub mod layout;
pub mod metrics;
pub mod pool;
pub mod protocol;
pub mod records;
pub mod remote;
pub mod store;
pub mod sweeper;
mod sync;

pub use allocator::{
    Acquired, Allocator, AllocatorOptions, Binding, ClusterEvents, Events, Pool, Released,
    RetryPolicy,
};
pub use cache::Event;
pub use client_session::ClientSession;
pub use error::{Error, Result};
pub use pool::{PoolSpec, Strategy};
pub use remote::{Cluster, ClusterEvent, RemoteOptions, RemotePool, RemoteState};
pub use sweeper::SweepReport;
