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
