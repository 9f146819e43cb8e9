//! Client sessions: leased references that vanish when the client stops renewing them, on any
//! replica of the service.
//!
//! A [`Session`] renews itself every third of its TTL (the first time at a random point of the
//! first third: `renewal_wait`) from a background task that holds only a
//! weak reference: dropping every handle without [`Session::end`] behaves like a crash (the
//! renewals stop and the service's store expires the lease after the TTL), as in the library. The
//! renewal goes through the client's endpoints with failover like every call, so when the replica
//! that opened the session dies the next renewal goes to another, which verifies the session
//! against the store and adopts it: same lease, same holder, same references.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Weak};
use std::time::Duration;

use idalloc::{Acquired, Error, Released};
use reqwest::Method;
use tracing::{debug, warn};

use crate::api::{self, keys_body, Keys, Owner};
use crate::errors::Context;
use crate::pool::Pool;
use crate::transport::{Answer, Transport};

/// A client session of `idalloc serve`. Cheap to clone; see the module docs.
#[derive(Clone)]
pub struct Session {
    inner: Arc<Inner>,
}

pub(crate) struct Inner {
    t: Arc<Transport>,
    /// The capability: never logged, never in `Debug`.
    id: String,
    holder: String,
    ttl: Duration,
    lost: AtomicBool,
    /// Told once the session is lost (the client's own session is then replaced, `client.rs`).
    lost_tx: tokio::sync::watch::Sender<bool>,
    renewer: std::sync::Mutex<Option<tokio::task::AbortHandle>>,
}

impl Drop for Inner {
    fn drop(&mut self) {
        if let Some(h) = self.renewer.lock().unwrap_or_else(|p| p.into_inner()).take() {
            h.abort();
        }
    }
}

impl std::fmt::Debug for Session {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Session")
            .field("holder", &self.inner.holder)
            .field("ttl", &self.inner.ttl)
            .field("lost", &self.is_lost())
            .finish_non_exhaustive()
    }
}

impl Session {
    /// Opens a session of `ttl` (whole seconds, 1 s to a day) and starts its renewals.
    pub(crate) async fn open(t: Arc<Transport>, ttl: Duration) -> idalloc::Result<Session> {
        let max = idalloc::client_session::MAX_CLIENT_TTL;
        if ttl < Duration::from_secs(1) || ttl > max {
            return Err(Error::invalid(
                idalloc::Input::Options,
                "session TTL",
                format!("{ttl:?}"),
                format!("between 1 s and {} s", max.as_secs()),
            ));
        }
        let secs = ttl.as_secs() + u64::from(ttl.subsec_nanos() > 0);
        let body = api::json(&api::SessionBody { ttl: secs });
        let info: api::SessionInfo = t
            .expect(
                Method::POST,
                "/v1/sessions",
                Some(&body),
                "a session open",
                &Context::default(),
            )
            .await?;
        let inner = Arc::new(Inner {
            t,
            id: info.session,
            holder: info.holder,
            ttl: Duration::from_secs(info.ttl.max(1)),
            lost: AtomicBool::new(false),
            lost_tx: tokio::sync::watch::channel(false).0,
            renewer: std::sync::Mutex::new(None),
        });
        let task = tokio::spawn(renew(Arc::downgrade(&inner)));
        *inner.renewer.lock().unwrap_or_else(|p| p.into_inner()) = Some(task.abort_handle());
        Ok(Session { inner })
    }

    /// The holder name of the session's references (what the service's `bindings` shows).
    pub fn holder(&self) -> &str {
        &self.inner.holder
    }

    /// The lease TTL.
    pub fn ttl(&self) -> Duration {
        self.inner.ttl
    }

    /// True once the service said the session is gone (its lease expired or was ended): its
    /// references are gone; open a new session.
    pub fn is_lost(&self) -> bool {
        self.inner.lost.load(Ordering::Acquire)
    }

    fn path(&self) -> String {
        format!("/v1/sessions/{}", self.inner.id)
    }

    /// Marks the session lost if `e` says so, and passes `e` on.
    fn noting(&self, e: Error) -> Error {
        if matches!(&e, Error::InvalidInput { input: idalloc::Input::SessionGone, .. }) {
            self.mark_lost();
        }
        e
    }

    fn mark_lost(&self) {
        if !self.inner.lost.swap(true, Ordering::AcqRel) {
            warn!(holder = %self.inner.holder, "client session lost");
            self.inner.lost_tx.send_replace(true);
        }
    }

    /// Becomes true when the session is found lost; closed when the session is dropped.
    pub(crate) fn lost_signal(&self) -> tokio::sync::watch::Receiver<bool> {
        self.inner.lost_tx.subscribe()
    }

    /// The ID of `key` in `pool`, with this session's reference on it. Idempotent within the
    /// session (a retried request does not count twice). One request.
    pub async fn acquire(&self, pool: &Pool, key: &str) -> idalloc::Result<Acquired> {
        idalloc::pool::validate_key(key)?;
        let body = keys_body(Keys::One(key), Owner::Session(&self.inner.id));
        let a: api::Acquired = pool.post("acquire", &body).await.map_err(|e| self.noting(e))?;
        Ok(Acquired { id: a.id, new: a.new })
    }

    /// [`Session::acquire`] of several keys, up to 1000 per request, in order. Every key is
    /// validated before any request.
    pub async fn acquire_many(
        &self,
        pool: &Pool,
        keys: &[String],
    ) -> idalloc::Result<Vec<Acquired>> {
        for k in keys {
            idalloc::pool::validate_key(k)?;
        }
        let mut out = Vec::with_capacity(keys.len());
        for chunk in keys.chunks(api::MAX_KEYS_PER_REQUEST) {
            let body = keys_body(Keys::Many(chunk), Owner::Session(&self.inner.id));
            let r: api::Results<api::Acquired> =
                pool.post("acquire", &body).await.map_err(|e| self.noting(e))?;
            out.extend(r.results.into_iter().map(|a| Acquired { id: a.id, new: a.new }));
        }
        Ok(out)
    }

    /// Removes this session's reference to `key`; `held == false` if it had none.
    pub async fn release(&self, pool: &Pool, key: &str) -> idalloc::Result<Released> {
        idalloc::pool::validate_key(key)?;
        let body = keys_body(Keys::One(key), Owner::Session(&self.inner.id));
        let r: api::Released = pool.post("release", &body).await.map_err(|e| self.noting(e))?;
        Ok(Released { held: r.held, reclaimed: r.reclaimed })
    }

    /// Renews the lease once (the background task does this every third of the TTL).
    /// `Ok(false)`: the session is gone.
    pub async fn keep_alive(&self) -> idalloc::Result<bool> {
        keep_alive(&self.inner).await
    }

    /// Ends the session: its references vanish at once. `Ok(false)` if it was already gone.
    pub async fn end(&self) -> idalloc::Result<bool> {
        if let Some(h) = self.inner.renewer.lock().unwrap_or_else(|p| p.into_inner()).take() {
            h.abort();
        }
        let ans = self
            .inner
            .t
            .call::<serde_json::Value>(Method::DELETE, &self.path(), None, "a session end")
            .await?;
        self.inner.lost.store(true, Ordering::Release);
        match ans {
            Answer::Ok(_) => Ok(true),
            Answer::Refused { body: Some(b), .. } if b.kind == "session_not_found" => Ok(false),
            Answer::Refused { status, body } => {
                Err(crate::errors::from_answer(status, body, &Context::default()))
            }
        }
    }
}

async fn keep_alive(inner: &Inner) -> idalloc::Result<bool> {
    if inner.lost.load(Ordering::Acquire) {
        return Ok(false);
    }
    let path = format!("/v1/sessions/{}/keepalive", inner.id);
    match inner.t.call::<serde_json::Value>(Method::PUT, &path, None, "a session renewal").await? {
        Answer::Ok(_) => Ok(true),
        Answer::Refused { body: Some(b), .. } if b.kind == "session_not_found" => {
            if !inner.lost.swap(true, Ordering::AcqRel) {
                warn!(holder = %inner.holder, "client session lost: the service no longer knows it");
                inner.lost_tx.send_replace(true);
            }
            Ok(false)
        }
        Answer::Refused { status, body } => {
            Err(crate::errors::from_answer(status, body, &Context::default()))
        }
    }
}

/// What the last renewal step was, for [`renewal_wait`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Renewal {
    /// The session was just opened.
    Opened,
    Renewed,
    Failed,
}

/// The wait before the next renewal, for a uniform draw `unit` in `[0, 1]`:
/// - after a renewal, a third of the TTL;
/// - after the open, a random point of the first third: sessions opened
///   together, as a restart storm opens them, otherwise renew together every third for as long
///   as they live; this spreads them over the third, for at most one renewal more each;
/// - after a failed renewal (every endpoint down for a whole call), a random point of the next
///   ninth (full jitter), so that the lease is renewed in time if any replica comes back, and the
///   agents of a dead replica do not all retry at the same instant.
fn renewal_wait(ttl: Duration, last: Renewal, unit: f64) -> Duration {
    let unit = if unit.is_nan() { 0.0 } else { unit.clamp(0.0, 1.0) };
    match last {
        Renewal::Renewed => ttl / 3,
        Renewal::Opened => (ttl / 3).mul_f64(unit),
        Renewal::Failed => (ttl / 9).mul_f64(unit),
    }
}

/// Renews the session on [`renewal_wait`]'s schedule until it is gone or dropped.
async fn renew(session: Weak<Inner>) {
    let Some(ttl) = session.upgrade().map(|s| s.ttl) else { return };
    let mut last = Renewal::Opened;
    loop {
        tokio::time::sleep(renewal_wait(ttl, last, rand::random::<f64>())).await;
        let Some(s) = session.upgrade() else { return };
        match keep_alive(&s).await {
            Ok(true) => last = Renewal::Renewed,
            Ok(false) => return,
            Err(e) => {
                debug!(holder = %s.holder, error = %e, "session renewal failed; trying again");
                last = Renewal::Failed;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renewals_are_spread_after_the_open_and_after_a_failure_then_every_third() {
        let ttl = Duration::from_secs(15);
        assert_eq!(renewal_wait(ttl, Renewal::Renewed, 0.0), Duration::from_secs(5));
        assert_eq!(renewal_wait(ttl, Renewal::Renewed, 1.0), Duration::from_secs(5));
        // Sessions opened in one instant renew anywhere in the first third.
        assert_eq!(renewal_wait(ttl, Renewal::Opened, 0.2), Duration::from_secs(1));
        assert_eq!(renewal_wait(ttl, Renewal::Opened, 1.0), Duration::from_secs(5));
        assert_eq!(renewal_wait(ttl, Renewal::Failed, 0.5).as_millis(), 833);
        assert_eq!(renewal_wait(ttl, Renewal::Failed, 1.0).as_millis(), 1666);
        // Never past the third, whatever the draw: the lease is renewed in time.
        for unit in [-1.0, 2.0, f64::NAN] {
            for last in [Renewal::Opened, Renewal::Renewed, Renewal::Failed] {
                assert!(renewal_wait(ttl, last, unit) <= ttl / 3, "{last:?} {unit}");
            }
        }
    }
}
