//! A Rust client for `idalloc serve` (docs/guide/api.md) with the library's [`idalloc::Pool`] API, for
//! agents that should not each load etcd: N agents cost etcd one watch per pool
//! per `serve` replica, the way Kubernetes puts its API server in front of etcd.
//!
//! ```no_run
//! use idalloc::PoolSpec;
//! use idalloc_client::{Client, ClientOptions};
//!
//! # async fn demo() -> idalloc::Result<()> {
//! let client = Client::new(["http://10.0.0.1:7379", "http://10.0.0.2:7379"], ClientOptions::default())?;
//! let vni = client.ensure_pool(&PoolSpec::new("vni", 4096, 16_777_215)).await?;
//! let blue = vni.acquire("tenant-blue").await?; // on the client's own session
//! vni.wait_synced().await?;
//! assert_eq!(vni.get("tenant-blue"), Some(blue.id)); // from the local, watch-fed view
//! vni.release("tenant-blue").await?;
//! client.close().await?;
//! # Ok(())
//! # }
//! ```
//!
//! The example agent (acquire 100 keys on a session, watch them arrive in the view, release
//! them), as `examples/agent.rs` runs it; the same agent with the library on the store itself is
//! in the `idalloc` crate's docs, and in Go in `clients/go/examples/agent`:
//!
//! ```no_run
//! # use std::time::Duration;
//! # use idalloc::PoolSpec;
//! # use idalloc_client::{Client, ClientOptions};
//! # async fn agent() -> Result<(), Box<dyn std::error::Error>> {
//! let client = Client::new(["http://127.0.0.1:7379"], ClientOptions::builder().build()?)?;
//! let pool = client.ensure_pool(&PoolSpec::new("agents", 1, 65_535)).await?;
//! let session = client.session(Duration::from_secs(15)).await?;
//! let keys: Vec<String> = (0..100).map(|i| format!("agent-key-{i:03}")).collect();
//! let acquired = session.acquire_many(&pool, &keys).await?;
//! pool.wait_synced().await?;
//! for (k, a) in keys.iter().zip(&acquired) {
//!     while pool.get(k) != Some(a.id) {
//!         tokio::time::sleep(Duration::from_millis(20)).await; // the watch brings it
//!     }
//! }
//! for k in &keys {
//!     session.release(&pool, k).await?;
//! }
//! session.end().await?;
//! # Ok(())
//! # }
//! ```
//!
//! - [`Client`] (like the library's `Allocator`): the endpoints, pools, sessions.
//! - [`Pool`]: `acquire`/`release` (refcounted, on the client's own session),
//!   `acquire_durable`/`release_durable`, `get`/`key_of`/`snapshot` from a local view fed by the
//!   service's shared watch (`GET /v1/pools/{pool}/watch`: resumed with `Last-Event-ID`, re-listed
//!   after 410), [`Pool::events`], [`Pool::wait_synced`], `get_consistent`, `list`.
//! - [`Session`]: a client session with its own keep-alive task. **Sessions survive the replica
//!   that opened them**: the service stores a digest of the session's secret on the session's
//!   lease, so any replica verifies and adopts it; the client fails over on its own and the
//!   session keeps its references.
//! - Errors are the library's [`idalloc::Error`] (the service's `{"kind","message"}` mapped,
//!   `errors.rs`), retryable where the library's would be. What the client retries by itself and
//!   on which endpoint: `transport.rs`.
//!
//! Layout: `options` (settings), `transport` (the one request path: failover, retries, backoff),
//! `errors` (pure: answers to errors), `api` (the wire bodies), `view` (pure: the watch-fed view)
//! and `watch` (its stream task), `session`, `pool`, `client`.

#![forbid(unsafe_code)]

mod api;
mod client;
pub mod env;
mod errors;
mod options;
mod pool;
mod session;
mod transport;
mod view;
mod watch;

pub use client::{Client, PoolUsage};
/// Cilium-style label sets as keys ([`idalloc::labels`]).
pub use idalloc::labels::{Label, Labels};
pub use options::{ClientOptions, ClientOptionsBuilder};
pub use pool::{Events, Pool};
pub use session::Session;
