//! Small [`Hook`]s that reproduce one misbehaviour of a real cluster each, deterministically on
//! the embedded store (the regression tests of bugs the chaos test found use them).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use idalloc::store::Store;
use tokio::sync::watch;

use crate::hooked::{send, Answer, Hook, HookedStore, Kind, Request, Response};

/// Holds back watch messages while frozen (delivered after the thaw), as when the etcd member
/// serving a client's watch is paused or partitioned while its unary requests go to healthy
/// members.
pub struct FreezeWatches {
    frozen: watch::Sender<bool>,
}

impl Default for FreezeWatches {
    fn default() -> Self {
        FreezeWatches { frozen: watch::channel(false).0 }
    }
}

impl FreezeWatches {
    /// Freezes (`true`) or thaws (`false`) every watch of the store, open or opened later.
    pub fn freeze(&self, on: bool) {
        self.frozen.send_replace(on);
    }
}

/// `inner` with watches that [`FreezeWatches::freeze`] can stall.
pub fn freezable<S: Store>(inner: S) -> HookedStore<S, FreezeWatches> {
    HookedStore::with_hook(inner, FreezeWatches::default())
}

#[async_trait::async_trait]
impl<S: Store> Hook<S> for FreezeWatches {
    async fn after(&self, _inner: &Arc<S>, _kind: Kind, result: Answer) -> Answer {
        let Ok(Response::Watch(stream)) = result else {
            return result;
        };
        let rx = self.frozen.subscribe();
        Ok(Response::Watch(
            futures::stream::unfold((stream, rx), |(mut stream, mut rx)| async move {
                let m = stream.next().await?;
                // Hold the message while frozen; a closed channel means nobody can freeze any more.
                let _ = rx.wait_for(|f| !*f).await;
                Some((m, (stream, rx)))
            })
            .boxed(),
        ))
    }
}

/// Holds back one txn once armed: the caller never gets an answer, and the store applies the txn
/// `delay` later (like a request queued in a paused etcd member that processes it after its
/// resume, long after the client gave up).
pub struct LateCommit {
    armed: AtomicBool,
    delay: Duration,
}

impl LateCommit {
    /// Makes the next txn a late one.
    pub fn arm(&self) {
        self.armed.store(true, Ordering::SeqCst);
    }
}

/// `inner` whose next txn after [`LateCommit::arm`] commits `delay` late and is never answered.
pub fn late_commit<S: Store>(inner: S, delay: Duration) -> HookedStore<S, LateCommit> {
    HookedStore::with_hook(inner, LateCommit { armed: AtomicBool::new(false), delay })
}

#[async_trait::async_trait]
impl<S: Store> Hook<S> for LateCommit {
    async fn call(&self, inner: &Arc<S>, req: Request) -> Answer {
        if req.kind() == Kind::Txn && self.armed.swap(false, Ordering::SeqCst) {
            let (inner, delay) = (inner.clone(), self.delay);
            tokio::spawn(async move {
                tokio::time::sleep(delay).await;
                let _ = send(&*inner, req).await;
            });
            return std::future::pending().await;
        }
        send(&**inner, req).await
    }
}

/// Holds back one txn once armed, until the test applies it: the caller never gets an answer (it
/// times out and retries), and [`HoldBack::apply_held`] applies the request whenever the test
/// wants it late — after the retry, after later operations — as a paused etcd member does with a
/// request queued in it when it resumes (late releases, late creates, binds racing a
/// pool delete).
#[derive(Default)]
pub struct HoldBack {
    armed: AtomicBool,
    held: std::sync::Mutex<Option<idalloc::store::TxnRequest>>,
}

impl HoldBack {
    /// Holds back the next txn.
    pub fn hold_next(&self) {
        self.armed.store(true, Ordering::SeqCst);
    }

    /// True while a txn is held (armed or not).
    pub fn is_holding(&self) -> bool {
        self.held.lock().unwrap_or_else(|e| e.into_inner()).is_some()
    }

    /// Takes the held txn out, to apply it as often and whenever the test wants (a request
    /// duplicated on the way, or one whose first attempt and retry both land late).
    pub fn take_held(&self) -> Option<idalloc::store::TxnRequest> {
        self.held.lock().unwrap_or_else(|e| e.into_inner()).take()
    }

    /// Applies the held txn to `store` now; its result. Fails if nothing was held.
    pub async fn apply_held<S: Store + ?Sized>(
        &self,
        store: &S,
    ) -> idalloc::store::StoreResult<idalloc::store::TxnResponse> {
        let held = self.held.lock().unwrap_or_else(|e| e.into_inner()).take();
        match held {
            Some(req) => store.txn(req).await,
            None => Err(idalloc::store::StoreError::InvalidRequest(
                "HoldBack: no txn was held back".into(),
            )),
        }
    }
}

/// `inner` whose next txn after [`HoldBack::hold_next`] is held until [`HoldBack::apply_held`].
pub fn hold_back<S: Store>(inner: S) -> HookedStore<S, HoldBack> {
    HookedStore::with_hook(inner, HoldBack::default())
}

#[async_trait::async_trait]
impl<S: Store> Hook<S> for HoldBack {
    async fn call(&self, inner: &Arc<S>, req: Request) -> Answer {
        if let Request::Txn(txn) = &req {
            if self.armed.swap(false, Ordering::SeqCst) {
                *self.held.lock().unwrap_or_else(|e| e.into_inner()) = Some(txn.clone());
                return std::future::pending().await;
            }
        }
        send(&**inner, req).await
    }
}
