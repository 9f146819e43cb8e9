//! Test tooling for idalloc, kept out of the library so that a build serving users carries none
//! of it (raft-rs keeps its `harness/` apart the same way; redb's fault backends live in tests).
//!
//! - [`etcd`]: real etcd processes on loopback (one member or a cluster) and the choice of which
//!   etcd a test uses (`IDALLOC_TEST_ETCD` or a private server).
//! - [`conformance`]: the store conformance suite, one set of cases run against every `Store`
//!   implementation with a real etcd as the reference ([`conformance_tests!`]).
//! - [`fault`]: a store wrapper that injects faults, reproducibly from a seed.
//! - [`counting`]: a store wrapper that counts round trips per request kind (the budgets of
//!   DESIGN.md §5).
//!
//! The library's integration tests, the CLI's tests, the chaos test and the bench harness depend
//! on this crate; the library's own unit tests do not (a dev-dependency cycle would give them a
//! second copy of the library's types).

#![forbid(unsafe_code)]

pub mod conformance;
pub mod counting;
pub mod etcd;
pub mod fault;
