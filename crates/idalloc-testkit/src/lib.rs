//! Test tooling for idalloc, kept out of the library so that a build serving users carries none
//! of it (raft-rs keeps its `harness/` apart the same way; redb's fault backends live in tests).
//!
//! - [`etcd`]: real etcd processes on loopback (one member or a cluster) and the choice of which
//!   etcd a test uses (`IDALLOC_TEST_ETCD` or a private server).
//! - [`secure`]: certificates made at run time and an etcd with TLS, client-certificate and user
//!   authentication (the security tests).
//! - [`conformance`]: the store conformance suite, one set of cases run against every `Store`
//!   implementation with a real etcd as the reference ([`conformance_tests!`]).
//! - [`fault`]: a store wrapper that injects faults, reproducibly from a seed.
//! - [`counting`]: a store wrapper that counts round trips per request kind (the budgets of
//!   DESIGN.md §5).
//! - [`g1`]: the ONE checker of a pool's raw records (G1, half-written bindings, references),
//!   on the library's one record parser (`idalloc::records::PoolSnapshot`); the allocator
//!   tests, the simulation and the chaos scan all use it.
//! - [`hooked`]: the ONE forwarding store wrapper, with a [`hooked::Hook`] around each request;
//!   the fault, counting, sabotage and regression wrappers are hooks on it.
//! - [`hooks`]: frozen watches and late commits, for regression tests of cluster misbehaviour.
//! - [`procs`]: a process's resident memory (now and peak) and open fds, from `/proc`.
//! - [`recorder`]: an in-memory `metrics` recorder, to check that the library's metrics move.
//! - [`sabotage`]: rewrites the allocator's txns to break a guarantee on purpose, so the
//!   simulation can show its checker notices.
//! - [`serve`]: the ONE launcher of an `idalloc serve` process, for the CLI's HTTP tests.
//!
//! The library's integration tests, the CLI's tests, the chaos test and the bench harness depend
//! on this crate; the library's own unit tests do not (a dev-dependency cycle would give them a
//! second copy of the library's types): they compile [`hooked`]'s source file into the library
//! instead (`#[path]` in `idalloc/src/lib.rs`), so there is still one forwarding store.

#![forbid(unsafe_code)]

pub mod cli;
pub mod conformance;
pub mod counting;
pub mod etcd;
pub mod fault;
pub mod g1;
pub mod hooked;
pub mod hooks;
pub mod procs;
pub mod recorder;
pub mod sabotage;
pub mod secure;
pub mod serve;
