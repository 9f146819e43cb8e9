//! The contenders and what they have in common: a node that acquires and releases keys over a
//! store whose requests are counted.
//!
//! Every node talks to etcd through its own [`CountingStore`] (one client connection per node, as
//! separate processes would), so round trips per operation are counted the same way for all of
//! them: one [`Store`] call is one request to etcd.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use idalloc::layout::{encode_id, IdRecord, Layout};
use idalloc::store::{Compare, KeyRange, OpResponse, Store, TxnOp, TxnRequest};
use idalloc::{Allocator, AllocatorOptions, Pool, PoolSpec};
use idalloc_testkit::counting::{CountingStore, RoundTrips};

use crate::{cilium, contiv};

/// The store every node uses: a counted handle on its own etcd (or embedded) connection.
pub type Counted = Arc<CountingStore<Arc<dyn Store>>>;

/// Session lease TTL of every contender's node: long enough that no keep-alive falls inside a
/// measured run (keep-alives are per process, not per operation).
pub const SESSION_TTL: Duration = Duration::from_secs(60);

/// Every contender's ID range: `[1, 2^24 - 1]` (a VNI-sized space, like Cilium's identities).
pub const RANGE: (u64, u64) = (1, (1 << 24) - 1);

/// Pool name for idalloc and the ceiling.
pub const POOL: &str = "bench";

/// The protocols compared.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Kind {
    /// idalloc through its public API (`Allocator` + `Pool`).
    Idalloc,
    /// A bare txn with idalloc's compares and three puts: the best a one-round-trip protocol can do.
    Ceiling,
    /// Cilium v1.6's allocator protocol, step by step (`cilium.rs`).
    Cilium,
    /// Contiv-VPP's whole-pool compare-and-swap protocol (`contiv.rs`).
    Contiv,
}

impl Kind {
    pub const ALL: [Kind; 4] = [Kind::Idalloc, Kind::Ceiling, Kind::Cilium, Kind::Contiv];

    pub fn name(self) -> &'static str {
        match self {
            Kind::Idalloc => "idalloc",
            Kind::Ceiling => "etcd ceiling",
            Kind::Cilium => "Cilium v1.6 replica",
            Kind::Contiv => "Contiv replica",
        }
    }

    /// Plot colour.
    pub fn colour(self) -> &'static str {
        match self {
            Kind::Idalloc => "#1f77b4",
            Kind::Ceiling => "#7f7f7f",
            Kind::Cilium => "#d62728",
            Kind::Contiv => "#2ca02c",
        }
    }
}

/// One participant: a process-like node of one contender.
#[async_trait::async_trait]
pub trait Node: Send + Sync {
    /// The ID of `key`, allocating one if the key has none.
    async fn acquire(&self, key: &str) -> Result<u64, String>;
    /// Drops this node's use of `key` (it acquired it before).
    async fn release(&self, key: &str) -> Result<(), String>;
    /// True once this node's local view knows every one of `keys` bound (for "bound elsewhere":
    /// nodes that keep a watch-fed cache get to use it, as they would in production).
    async fn knows(&self, keys: &[String]) -> bool;
    /// Protocol-level retries so far (lost compares, failed attempts).
    fn retries(&self) -> u64;
    /// The node's counted store.
    fn store(&self) -> &Counted;
    /// Stops background tasks and releases the session.
    async fn close(&self);
}

impl dyn Node {
    pub fn counts(&self) -> RoundTrips {
        self.store().counts()
    }
}

/// What nodes of one run share: the ceiling's perfect knowledge (it stands for a cache that is
/// never stale) and its candidate counter.
#[derive(Default)]
pub struct Shared {
    oracle: Mutex<HashMap<String, u64>>,
    next_id: AtomicU64,
}

/// Starts node number `index` of contender `kind` on `store`.
pub async fn start_node(
    kind: Kind,
    store: Counted,
    index: usize,
    shared: Arc<Shared>,
) -> Result<Arc<dyn Node>, String> {
    Ok(match kind {
        Kind::Idalloc => Arc::new(IdallocNode::start(store, index).await?),
        Kind::Ceiling => Arc::new(CeilingNode::start(store, index, shared).await?),
        Kind::Cilium => Arc::new(cilium::CiliumNode::start(store, index).await?),
        Kind::Contiv => Arc::new(contiv::ContivNode::start(store, index).await?),
    })
}

/// Fails with a message naming the contender and operation.
pub fn err(what: &str, e: impl std::fmt::Display) -> String {
    format!("{what}: {e}")
}

// ---------------------------------------------------------------------------------------------
// idalloc

/// idalloc through its public API only.
pub struct IdallocNode {
    alloc: Allocator,
    pool: Pool,
    store: Counted,
    ops: AtomicU64,
}

impl IdallocNode {
    pub async fn start(store: Counted, index: usize) -> Result<Self, String> {
        Self::start_in(store, index, "idalloc").await
    }

    /// Like [`IdallocNode::start`] with another store prefix.
    pub async fn start_in(store: Counted, index: usize, prefix: &str) -> Result<Self, String> {
        let opts = AllocatorOptions::builder()
            .prefix(prefix)
            .holder(format!("node{index}"))
            .session_ttl(SESSION_TTL)
            .request_timeout(Duration::from_secs(30))
            .build()
            .map_err(|e| err("idalloc options", e))?;
        let alloc = Allocator::new(store.clone(), opts).map_err(|e| err("idalloc new", e))?;
        let pool = alloc
            .ensure_pool(&PoolSpec::new(POOL, RANGE.0, RANGE.1))
            .await
            .map_err(|e| err("idalloc ensure_pool", e))?;
        pool.wait_synced().await.map_err(|e| err("idalloc wait_synced", e))?;
        // Grant the session lease now (first leased acquire does it), outside any measured run.
        let warm = format!("warm-up-{index}");
        pool.acquire(&warm).await.map_err(|e| err("idalloc warm-up acquire", e))?;
        pool.release(&warm).await.map_err(|e| err("idalloc warm-up release", e))?;
        Ok(IdallocNode { alloc, pool, store, ops: AtomicU64::new(0) })
    }

    pub fn pool(&self) -> &Pool {
        &self.pool
    }
}

#[async_trait::async_trait]
impl Node for IdallocNode {
    async fn acquire(&self, key: &str) -> Result<u64, String> {
        self.ops.fetch_add(1, Ordering::Relaxed);
        self.pool.acquire(key).await.map(|a| a.id).map_err(|e| err("idalloc acquire", e))
    }
    async fn release(&self, key: &str) -> Result<(), String> {
        self.ops.fetch_add(1, Ordering::Relaxed);
        self.pool.release(key).await.map(|_| ()).map_err(|e| err("idalloc release", e))
    }
    async fn knows(&self, keys: &[String]) -> bool {
        keys.iter().all(|k| self.pool.get(k).is_some())
    }
    fn retries(&self) -> u64 {
        // Every operation measured here needs exactly one request when nothing races; anything
        // beyond is a retry (a lost compare, or a read after one).
        let c = self.store.counts();
        (c.txn + c.get).saturating_sub(self.ops.load(Ordering::Relaxed))
    }
    fn store(&self) -> &Counted {
        &self.store
    }
    async fn close(&self) {
        let _ = self.alloc.clone().close().await;
    }
}

// ---------------------------------------------------------------------------------------------
// etcd ceiling

/// A bare txn per operation with exactly idalloc's compares and writes (DESIGN §5), and a perfect
/// cache (the run's shared map) instead of a watch: what any one-round-trip protocol can reach on
/// this etcd. It does no client-side work beyond building the request.
pub struct CeilingNode {
    layout: Layout,
    holder: String,
    lease: i64,
    store: Counted,
    shared: Arc<Shared>,
    retries: AtomicU64,
}

impl CeilingNode {
    pub async fn start(store: Counted, index: usize, shared: Arc<Shared>) -> Result<Self, String> {
        let layout = Layout::new("ceiling").map_err(|e| err("ceiling layout", e))?;
        let lease = store
            .lease_grant(SESSION_TTL.as_secs() as i64)
            .await
            .map_err(|e| err("ceiling lease", e))?
            .id;
        Ok(CeilingNode {
            layout,
            holder: format!("node{index}"),
            lease,
            store,
            shared,
            retries: AtomicU64::new(0),
        })
    }

    fn known(&self, key: &str) -> Option<u64> {
        self.shared.oracle.lock().ok()?.get(key).copied()
    }
}

#[async_trait::async_trait]
impl Node for CeilingNode {
    async fn acquire(&self, key: &str) -> Result<u64, String> {
        let key_rec = self.layout.key_key(POOL, key);
        let ref_rec = self.layout.ref_key(POOL, key, &self.holder);
        if let Some(id) = self.known(key) {
            // Bound elsewhere: If value(key/k) == ID Then put ref/k/h.
            let req = TxnRequest::new()
                .when([Compare::value_is(key_rec.clone(), encode_id(id))])
                .and_then([TxnOp::put_on_lease(ref_rec, encode_id(id), self.lease)])
                .or_else([TxnOp::get_key(key_rec)]);
            let resp = self.store.txn(req).await.map_err(|e| err("ceiling txn", e))?;
            return if resp.succeeded {
                Ok(id)
            } else {
                Err(format!("ceiling: {key:?} is not bound to {id} any more"))
            };
        }
        let id = RANGE.0 + self.shared.next_id.fetch_add(1, Ordering::Relaxed);
        let id_rec = self.layout.id_key(POOL, id);
        let req = TxnRequest::new()
            .when([Compare::absent(key_rec.clone()), Compare::absent(id_rec.clone())])
            .and_then([
                TxnOp::put(id_rec.clone(), IdRecord::Bound(key.to_string()).encode()),
                TxnOp::put(key_rec.clone(), encode_id(id)),
                TxnOp::put_on_lease(ref_rec, encode_id(id), self.lease),
            ])
            .or_else([TxnOp::get_key(key_rec), TxnOp::get_key(id_rec)]);
        let resp = self.store.txn(req).await.map_err(|e| err("ceiling txn", e))?;
        if !resp.succeeded {
            self.retries.fetch_add(1, Ordering::Relaxed);
            return Err(format!("ceiling: fresh key {key:?} or ID {id} was taken"));
        }
        if let Ok(mut m) = self.shared.oracle.lock() {
            m.insert(key.to_string(), id);
        }
        Ok(id)
    }

    async fn release(&self, key: &str) -> Result<(), String> {
        let id = self.known(key).ok_or_else(|| format!("ceiling: {key:?} is not held"))?;
        let key_rec = self.layout.key_key(POOL, key);
        let ref_rec = self.layout.ref_key(POOL, key, &self.holder);
        let refs = self.layout.ref_prefix(POOL, key);
        let mut after = ref_rec.clone();
        after.push(0);
        // idalloc's last-release compares: the binding is as known, and no other reference exists
        // on either side of ours.
        let req = TxnRequest::new()
            .when([
                Compare::value_is(key_rec.clone(), encode_id(id)),
                Compare::range_empty(KeyRange::range(refs.clone(), ref_rec.clone())),
                Compare::range_empty(KeyRange::range(after, idalloc::store::prefix_end(&refs))),
            ])
            .and_then([
                TxnOp::delete(ref_rec.clone()),
                TxnOp::delete(key_rec),
                TxnOp::delete(self.layout.id_key(POOL, id)),
            ])
            .or_else([TxnOp::delete(ref_rec)]);
        let resp = self.store.txn(req).await.map_err(|e| err("ceiling release", e))?;
        if resp.succeeded {
            if let Ok(mut m) = self.shared.oracle.lock() {
                m.remove(key);
            }
        }
        Ok(())
    }

    async fn knows(&self, keys: &[String]) -> bool {
        keys.iter().all(|k| self.known(k).is_some())
    }
    fn retries(&self) -> u64 {
        self.retries.load(Ordering::Relaxed)
    }
    fn store(&self) -> &Counted {
        &self.store
    }
    async fn close(&self) {
        let _ = self.store.lease_revoke(self.lease).await;
    }
}

/// The value of the only get in a txn branch, if any (helper for the replicas).
pub fn first_get(responses: &[OpResponse]) -> Option<&idalloc::store::GetResponse> {
    responses.iter().find_map(|r| match r {
        OpResponse::Get(g) => Some(g),
        _ => None,
    })
}
