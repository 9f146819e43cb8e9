//! Chaos testing of idalloc on a real etcd cluster: the history format the client processes write
//! ([`history`]), the sequential model of one key ([`model`]) and a linearizability checker that
//! tests a concurrent history of one key against that model ([`linearize`]), with the lease ends
//! of client sessions placed by [`sessions`]. The soak run (`tests/soak.rs`) samples processes
//! with [`procs`] and judges growth with [`soak`].
//!
//! The test itself (`tests/chaos_etcd.rs`) starts a 3-member etcd cluster and several
//! `chaos-client` processes (`src/bin/chaos_client.rs`), injects faults, and then runs these
//! checks on what the clients recorded. See `docs/design/chaos.md`.

pub mod delay;
pub mod history;
pub mod linearize;
pub mod model;
pub mod netlab;
pub mod procs;
pub mod scan;
pub mod sessions;
pub mod soak;
