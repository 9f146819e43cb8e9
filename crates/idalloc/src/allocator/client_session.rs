//! Client sessions: leased references for a process that does not link the library.
//!
//! A remote client (a Go agent, a CNI plugin talking to `idalloc serve`) needs what a library
//! process gets from its session lease: its references vanish when it dies (G4). A
//! [`ClientSession`] is that lease, granted for the client and renewed only when the client asks
//! ([`ClientSession::keep_alive`]); nothing in this process renews it behind the client's back, so
//! a client that stops renewing loses its references after the TTL, exactly like a crashed library
//! process, and the sweeper then reclaims bindings nobody references (DESIGN §8).
//!
//! A session's references are `ref/<key>/<holder>` records on the session's lease, one per key
//! (acquiring a key twice in one session is idempotent, as a durable reference is: a remote client
//! retries requests whose answer it lost, and a count would then leak). The holder name is derived
//! from the lease id and is visible to anyone who can list the pool; it is not a secret. Whoever
//! hands the session to a client must name it by something unguessable (the service does).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tracing::{info, warn};

use crate::allocator::{Inner, Pool};
use crate::error::{Error, Input, Result};
use crate::metrics::{self, SessionKind};
use crate::pool::validate_holder;
use crate::store::{GetRequest, LeaseId, TxnOp, TxnRequest};
use crate::{Acquired, Released};

/// Longest client session TTL: a day. Longer leases would let a dead client pin IDs for days.
pub const MAX_CLIENT_TTL: Duration = Duration::from_secs(24 * 3600);

/// A lease-backed holder for a remote client. See the module docs.
pub struct ClientSession {
    inner: Arc<Inner>,
    lease: LeaseId,
    ttl: Duration,
    holder: String,
    lost: AtomicBool,
}

impl std::fmt::Debug for ClientSession {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClientSession")
            .field("holder", &self.holder)
            .field("ttl", &self.ttl)
            .field("lost", &self.is_lost())
            .finish()
    }
}

pub(crate) async fn open(inner: &Arc<Inner>, ttl: Duration) -> Result<ClientSession> {
    let secs = whole_seconds(ttl)?;
    let lease = inner.lease_call(|s| async move { s.lease_grant(secs).await }).await?;
    let holder = format!("{}-c{:x}", inner.holder(), lease.id);
    info!(holder, ttl = secs, "client session opened");
    Ok(session(inner, lease.id, secs, holder))
}

/// The holder name of a shared client session: `<prefix><lease in hex>`, derived from the lease
/// alone, so that every process that adopts the lease ([`Allocator::adopt_client_session`]) names
/// the session's references alike and they stay the same references after a failover.
///
/// [`Allocator::adopt_client_session`]: crate::Allocator::adopt_client_session
pub fn shared_holder(prefix: &str, lease: LeaseId) -> String {
    format!("{prefix}{lease:x}")
}

/// Opens a shared session: grants the lease, then puts `record` at `P/sessions/<lease>` on it
/// (so the record lives exactly as long as the lease). Two round trips. If the put fails the
/// lease is revoked (best effort: it expires after `ttl` anyway, with nothing on it).
pub(crate) async fn open_shared(
    inner: &Arc<Inner>,
    ttl: Duration,
    holder_prefix: &str,
    record: &[u8],
) -> Result<ClientSession> {
    let secs = whole_seconds(ttl)?;
    validate_holder(&shared_holder(holder_prefix, 0))?;
    let lease = inner.lease_call(|s| async move { s.lease_grant(secs).await }).await?;
    let key = inner.layout.session_key(lease.id);
    let put = TxnRequest::new().and_then([TxnOp::put_on_lease(key, record.to_vec(), lease.id)]);
    if let Err(e) = inner.req.txn(put).await {
        let id = lease.id;
        let _ = inner.lease_call(|s| async move { s.lease_revoke(id).await }).await;
        return Err(e.into());
    }
    Ok(session(inner, lease.id, secs, shared_holder(holder_prefix, lease.id)))
}

/// The record a shared session put on its lease, or `None` once the lease is gone (or if the lease
/// was never a shared session's). One round trip.
pub(crate) async fn shared_record(inner: &Arc<Inner>, lease: LeaseId) -> Result<Option<Vec<u8>>> {
    let key = inner.layout.session_key(lease);
    let got = inner.req.call(|| inner.req.store.get(GetRequest::key(key.clone()))).await?;
    // Only a record on this very lease counts: a record put by hand without it is not a session.
    Ok(got.kvs.into_iter().find(|kv| kv.key == key && kv.lease == lease).map(|kv| kv.value))
}

/// A handle on the shared session of `lease`, opened by any process on this store. No request:
/// the caller has verified the session ([`shared_record`]); the store judges the lease on every
/// use (an acquire or renewal on a lease that is gone marks the session lost).
pub(crate) fn adopt(
    inner: &Arc<Inner>,
    lease: LeaseId,
    ttl: Duration,
    holder_prefix: &str,
) -> Result<ClientSession> {
    let secs = whole_seconds(ttl)?;
    let holder = shared_holder(holder_prefix, lease);
    validate_holder(&holder)?;
    info!(holder, ttl = secs, "client session adopted");
    Ok(session(inner, lease, secs, holder))
}

/// `ttl` in whole seconds, rounded up (a lease never lives shorter than asked), checked against
/// the allowed range.
fn whole_seconds(ttl: Duration) -> Result<i64> {
    if ttl < Duration::from_secs(1) || ttl > MAX_CLIENT_TTL {
        return Err(Error::invalid(
            Input::Options,
            "session TTL",
            format!("{ttl:?}"),
            format!("between 1 s and {} s", MAX_CLIENT_TTL.as_secs()),
        ));
    }
    Ok((ttl.as_secs() + u64::from(ttl.subsec_nanos() > 0)) as i64)
}

fn session(inner: &Arc<Inner>, lease: LeaseId, secs: i64, holder: String) -> ClientSession {
    metrics::client_sessions(1.0);
    ClientSession {
        inner: inner.clone(),
        lease,
        ttl: Duration::from_secs(secs as u64),
        holder,
        lost: AtomicBool::new(false),
    }
}

impl ClientSession {
    /// The holder name of this session's references.
    pub fn holder(&self) -> &str {
        &self.holder
    }

    /// The lease the references are on.
    pub fn lease(&self) -> LeaseId {
        self.lease
    }

    /// The lease TTL (whole seconds).
    pub fn ttl(&self) -> Duration {
        self.ttl
    }

    /// True once the store said the lease is gone (a renewal or an acquire found it missing).
    pub fn is_lost(&self) -> bool {
        self.lost.load(Ordering::Acquire)
    }

    fn mark_lost(&self) {
        if !self.lost.swap(true, Ordering::AcqRel) {
            warn!(holder = %self.holder, "client session lost its lease");
            metrics::session_lost(SessionKind::Client);
        }
    }

    fn check(&self) -> Result<()> {
        if self.is_lost() {
            return Err(Error::lease_gone(self.lease));
        }
        Ok(())
    }

    /// The ID of `key` in `pool`, with this session's reference on its lease. Idempotent within
    /// the session. One round trip when uncontended. Fails with `InvalidInput` ([`Input::SessionGone`])
    /// once the lease is gone, and the session is then [lost](ClientSession::is_lost).
    pub async fn acquire(&self, pool: &Pool, key: &str) -> Result<Acquired> {
        self.check()?;
        let f = pool.acquire_on_lease(key, &self.holder, self.lease);
        let r = metrics::timed(pool.name(), "acquire_session", f).await;
        if matches!(&r, Err(Error::InvalidInput { input: Input::SessionGone, .. })) {
            self.mark_lost();
        }
        r
    }

    /// [`ClientSession::acquire`] for many keys, packed many per round trip (one txn of up to
    /// ~100 keys when uncontended, where one call per key costs a round trip and a store write
    /// each). Results per key in input order; a key given twice is acquired once. Every key fails
    /// with `InvalidInput` ([`Input::SessionGone`]) once the lease is gone, and the session is
    /// then [lost](ClientSession::is_lost).
    pub async fn acquire_many<K: AsRef<str>>(
        &self,
        pool: &Pool,
        keys: &[K],
    ) -> Vec<Result<Acquired>> {
        if let Err(e) = self.check() {
            return keys.iter().map(|_| Err(e.clone())).collect();
        }
        let f = pool.acquire_many_on_lease(keys, &self.holder, self.lease);
        let r = metrics::timed(pool.name(), "acquire_session", async { Ok(f.await) })
            .await
            .unwrap_or_default();
        if r.iter().any(|a| matches!(a, Err(Error::InvalidInput { input: Input::SessionGone, .. })))
        {
            self.mark_lost();
        }
        r
    }

    /// Removes this session's reference to `key`; reclaims the binding if it was the last one and
    /// the pool has no idle grace. A no-op (`held == false`) if the session did not hold it (or its
    /// reference already expired with the lease).
    pub async fn release(&self, pool: &Pool, key: &str) -> Result<Released> {
        pool.release_reference(key, &self.holder).await
    }

    /// Renews the lease once. `Ok(false)`: the lease is gone (expired or revoked) and the session
    /// is lost for good; its references are gone with it.
    pub async fn keep_alive(&self) -> Result<bool> {
        if self.is_lost() {
            return Ok(false);
        }
        let lease = self.lease;
        let r = self.inner.lease_call(|s| async move { s.lease_keep_alive(lease).await }).await;
        match r {
            Ok(Some(_)) => {
                metrics::renewal(SessionKind::Client, Some(true));
                Ok(true)
            }
            Ok(None) | Err(crate::store::StoreError::LeaseNotFound(_)) => {
                metrics::renewal(SessionKind::Client, Some(false));
                self.mark_lost();
                Ok(false)
            }
            Err(e) => {
                metrics::renewal(SessionKind::Client, None);
                Err(e.into())
            }
        }
    }

    /// Ends the session now: revokes the lease, so every reference of the session vanishes at once
    /// (the sweeper or a last release reclaims the bindings). Returns false if the lease was
    /// already gone.
    pub async fn end(&self) -> Result<bool> {
        let lease = self.lease;
        let existed = self.inner.lease_call(|s| async move { s.lease_revoke(lease).await }).await?;
        self.lost.store(true, Ordering::Release);
        info!(holder = %self.holder, "client session ended");
        Ok(existed)
    }
}

impl Drop for ClientSession {
    fn drop(&mut self) {
        // Dropping does not revoke: like a crash, the lease runs out on its own.
        metrics::client_sessions(-1.0);
    }
}
