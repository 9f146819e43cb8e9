//! The session (DESIGN §5, §7): one lease per process, granted on first use, kept alive every
//! TTL/3; a lost lease is replaced and every held key re-referenced on the new one (G2); a dead process's lease expires (G4).

use std::sync::atomic::Ordering;
use std::sync::{Arc, Weak};

use tokio::time::Instant;
use tracing::{info, warn};

use super::pool_state::lock;
use super::registry::Inner;
use super::repair_queue::Repair;
use super::request::ttl_secs;
use crate::error::{Error, Result};
use crate::store::LeaseId;

impl Inner {
    /// The session lease, granted (and its keep-alive started) on first use.
    pub(super) async fn session_lease(self: &Arc<Self>) -> Result<LeaseId> {
        if self.closed.load(Ordering::Acquire) {
            return Err(Error::unavailable_for_good("the allocator is closed"));
        }
        let mut s = self.session.lock().await;
        if let Some(l) = s.lease {
            return Ok(l);
        }
        let ttl = ttl_secs(self.opts.session_ttl);
        let lease = self.req.call(|| self.req.store.lease_grant(ttl)).await?;
        info!(holder = %self.holder, lease = lease.id, ttl = lease.ttl, "session lease granted");
        s.lease = Some(lease.id);
        if !s.keepalive_started {
            s.keepalive_started = true;
            let task = tokio::spawn(keepalive_loop(Arc::downgrade(self)));
            lock(&self.tasks).push(task.abort_handle());
        }
        Ok(lease.id)
    }

    /// Forgets a lost session lease (once, whoever notices first) and schedules the re-referencing
    /// of every held key on a new one.
    pub(super) async fn session_lost(&self, lost: LeaseId) {
        let mut s = self.session.lock().await;
        if s.lease == Some(lost) {
            warn!(holder = %self.holder, lease = lost, "session lease lost; re-referencing held keys on a new lease");
            s.lease = None;
            crate::metrics::session_lost(crate::metrics::SessionKind::Process);
            self.repairs.push(Repair::All);
        }
    }
}

/// Renews the session lease every TTL/3. A lease the store says is gone, or one not renewed for a
/// whole TTL (the store will have expired it), is replaced and every held key re-referenced.
pub(super) async fn keepalive_loop(inner: Weak<Inner>) {
    let (period, ttl) = match inner.upgrade() {
        Some(i) => (i.opts.session_ttl / 3, i.opts.session_ttl),
        None => return,
    };
    let mut last_ok = Instant::now();
    loop {
        tokio::time::sleep(period).await;
        let Some(inner) = inner.upgrade() else { return };
        let Some(lease) = inner.session.lock().await.lease else {
            last_ok = Instant::now();
            continue;
        };
        let result = tokio::time::timeout(
            inner.opts.request_timeout,
            inner.req.store.lease_keep_alive(lease),
        )
        .await;
        match result {
            Ok(Ok(Some(_))) => {
                crate::metrics::renewal(crate::metrics::SessionKind::Process, Some(true));
                last_ok = Instant::now()
            }
            Ok(Ok(None)) => {
                crate::metrics::renewal(crate::metrics::SessionKind::Process, Some(false));
                inner.session_lost(lease).await;
                last_ok = Instant::now();
            }
            Ok(Err(e)) if !e.is_retryable() => {
                warn!(lease, error = %e, "keep-alive rejected; treating the lease as lost");
                inner.session_lost(lease).await;
                last_ok = Instant::now();
            }
            other => {
                crate::metrics::renewal(crate::metrics::SessionKind::Process, None);
                let why = match other {
                    Ok(Err(e)) => e.to_string(),
                    _ => "timed out".to_string(),
                };
                warn!(lease, error = %why, "keep-alive failed");
                if last_ok.elapsed() >= ttl {
                    inner.session_lost(lease).await;
                    last_ok = Instant::now();
                }
            }
        }
    }
}
