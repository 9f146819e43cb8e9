//! ONE forwarding [`Store`] wrapper with a hook around each request: the base of every test-side
//! store wrapper (fault injection, round-trip counting, frozen watches, late commits, txn
//! rewriting), so that none of them repeats the seven-method forwarding boilerplate.
//!
//! A [`Hook`] sees every request as a [`Request`] value and every answer as a [`Response`]; it can
//! rewrite or refuse a request before it is sent ([`Hook::before`]), replace or inspect the answer
//! ([`Hook::after`]), or take the whole round trip in hand ([`Hook::call`]) when one decision spans
//! both (the fault injector decides up front whether the answer will be lost). [`send`] is the one
//! place that turns a [`Request`] into a call on the inner store.
//!
//! Model: tower's `Service` middleware, minus the generality: one store trait, one enum of
//! requests.
//!
//! The library's unit tests compile this file too (`#[path]` in `idalloc/src/lib.rs`, where
//! `idalloc::` names the library itself): keep it to `idalloc::` paths, std and `async_trait`.

use std::sync::Arc;

use idalloc::store::{
    GetRequest, GetResponse, KeyRange, Lease, LeaseId, Revision, Store, StoreError, StoreResult,
    TxnRequest, TxnResponse, WatchStream,
};

/// One store request, as a value a hook can look at and rewrite.
#[derive(Clone, Debug, PartialEq)]
pub enum Request {
    Txn(TxnRequest),
    Get(GetRequest),
    LeaseGrant { ttl: i64 },
    LeaseKeepAlive(LeaseId),
    LeaseRevoke(LeaseId),
    Watch { range: KeyRange, start_revision: Revision },
    Compact(Revision),
}

/// The kind of a [`Request`] (what [`Hook::after`] is told about the request it answers).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Kind {
    Txn,
    Get,
    LeaseGrant,
    LeaseKeepAlive,
    LeaseRevoke,
    Watch,
    Compact,
}

impl Request {
    pub fn kind(&self) -> Kind {
        match self {
            Request::Txn(_) => Kind::Txn,
            Request::Get(_) => Kind::Get,
            Request::LeaseGrant { .. } => Kind::LeaseGrant,
            Request::LeaseKeepAlive(_) => Kind::LeaseKeepAlive,
            Request::LeaseRevoke(_) => Kind::LeaseRevoke,
            Request::Watch { .. } => Kind::Watch,
            Request::Compact(_) => Kind::Compact,
        }
    }
}

/// What a request ends with: the answer, or the store's error.
pub type Answer = StoreResult<Response>;

/// The answer to one [`Request`], of the matching kind.
pub enum Response {
    Txn(TxnResponse),
    Get(GetResponse),
    LeaseGrant(Lease),
    LeaseKeepAlive(Option<i64>),
    LeaseRevoke(bool),
    Watch(WatchStream),
    Compact,
}

impl std::fmt::Debug for Response {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Response::Txn(r) => f.debug_tuple("Txn").field(r).finish(),
            Response::Get(r) => f.debug_tuple("Get").field(r).finish(),
            Response::LeaseGrant(l) => f.debug_tuple("LeaseGrant").field(l).finish(),
            Response::LeaseKeepAlive(t) => f.debug_tuple("LeaseKeepAlive").field(t).finish(),
            Response::LeaseRevoke(b) => f.debug_tuple("LeaseRevoke").field(b).finish(),
            Response::Watch(_) => f.write_str("Watch(..)"),
            Response::Compact => f.write_str("Compact"),
        }
    }
}

/// Sends `req` to `store`: the one mapping from [`Request`] to the [`Store`] methods.
pub async fn send<S: Store + ?Sized>(store: &S, req: Request) -> Answer {
    Ok(match req {
        Request::Txn(r) => Response::Txn(store.txn(r).await?),
        Request::Get(r) => Response::Get(store.get(r).await?),
        Request::LeaseGrant { ttl } => Response::LeaseGrant(store.lease_grant(ttl).await?),
        Request::LeaseKeepAlive(id) => Response::LeaseKeepAlive(store.lease_keep_alive(id).await?),
        Request::LeaseRevoke(id) => Response::LeaseRevoke(store.lease_revoke(id).await?),
        Request::Watch { range, start_revision } => {
            Response::Watch(store.watch(range, start_revision).await?)
        }
        Request::Compact(rev) => {
            store.compact(rev).await?;
            Response::Compact
        }
    })
}

/// What a test adds around each request of a [`HookedStore`]. Every method has a default that
/// forwards unchanged, so a hook overrides only what it changes.
#[async_trait::async_trait]
pub trait Hook<S: Store>: Send + Sync + 'static {
    /// Before `req` reaches the inner store: return it (rewritten or not) to send it, or an error
    /// to fail it unsent.
    async fn before(&self, _inner: &Arc<S>, req: Request) -> StoreResult<Request> {
        Ok(req)
    }

    /// After the inner store answered a request of kind `kind` (with its result or error): return
    /// what the caller sees.
    async fn after(&self, _inner: &Arc<S>, _kind: Kind, result: Answer) -> Answer {
        result
    }

    /// The whole round trip: [`Hook::before`], [`send`], [`Hook::after`]. Override when one
    /// decision covers both sides of the request.
    async fn call(&self, inner: &Arc<S>, req: Request) -> Answer {
        let req = self.before(inner, req).await?;
        let kind = req.kind();
        let result = send(&**inner, req).await;
        self.after(inner, kind, result).await
    }
}

/// A [`Store`] that passes every request through its [`Hook`] to an inner store.
pub struct HookedStore<S, H> {
    inner: Arc<S>,
    hook: H,
}

impl<S: Store, H: Hook<S>> HookedStore<S, H> {
    /// Wraps `inner` with `hook`.
    pub fn with_hook(inner: S, hook: H) -> Self {
        HookedStore { inner: Arc::new(inner), hook }
    }

    /// The wrapped store, without the hook (to check what really happened).
    pub fn inner(&self) -> &S {
        &self.inner
    }

    /// The hook (to change its settings or read what it recorded).
    pub fn hook(&self) -> &H {
        &self.hook
    }

    async fn call(&self, req: Request) -> Answer {
        self.hook.call(&self.inner, req).await
    }
}

/// The error for a hook that answered a request with a response of another kind (a bug in the
/// hook, reported as an invalid request rather than a panic).
fn mismatch(kind: Kind, got: &Response) -> StoreError {
    StoreError::InvalidRequest(format!("store hook answered a {kind:?} request with {got:?}"))
}

#[async_trait::async_trait]
impl<S: Store, H: Hook<S>> Store for HookedStore<S, H> {
    async fn txn(&self, req: TxnRequest) -> StoreResult<TxnResponse> {
        match self.call(Request::Txn(req)).await? {
            Response::Txn(r) => Ok(r),
            other => Err(mismatch(Kind::Txn, &other)),
        }
    }
    async fn get(&self, req: GetRequest) -> StoreResult<GetResponse> {
        match self.call(Request::Get(req)).await? {
            Response::Get(r) => Ok(r),
            other => Err(mismatch(Kind::Get, &other)),
        }
    }
    async fn lease_grant(&self, ttl: i64) -> StoreResult<Lease> {
        match self.call(Request::LeaseGrant { ttl }).await? {
            Response::LeaseGrant(l) => Ok(l),
            other => Err(mismatch(Kind::LeaseGrant, &other)),
        }
    }
    async fn lease_keep_alive(&self, id: LeaseId) -> StoreResult<Option<i64>> {
        match self.call(Request::LeaseKeepAlive(id)).await? {
            Response::LeaseKeepAlive(t) => Ok(t),
            other => Err(mismatch(Kind::LeaseKeepAlive, &other)),
        }
    }
    async fn lease_revoke(&self, id: LeaseId) -> StoreResult<bool> {
        match self.call(Request::LeaseRevoke(id)).await? {
            Response::LeaseRevoke(b) => Ok(b),
            other => Err(mismatch(Kind::LeaseRevoke, &other)),
        }
    }
    async fn watch(&self, range: KeyRange, start_revision: Revision) -> StoreResult<WatchStream> {
        match self.call(Request::Watch { range, start_revision }).await? {
            Response::Watch(w) => Ok(w),
            other => Err(mismatch(Kind::Watch, &other)),
        }
    }
    async fn compact(&self, revision: Revision) -> StoreResult<()> {
        match self.call(Request::Compact(revision)).await? {
            Response::Compact => Ok(()),
            other => Err(mismatch(Kind::Compact, &other)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use idalloc::store::embedded::EmbeddedStore;
    use idalloc::store::TxnOp;
    use std::sync::Mutex;

    /// Records every request kind and rewrites puts of "a" into puts of "b".
    #[derive(Default)]
    struct Recorder(Mutex<Vec<Kind>>);

    #[async_trait::async_trait]
    impl Hook<EmbeddedStore> for Recorder {
        async fn before(&self, _: &Arc<EmbeddedStore>, req: Request) -> StoreResult<Request> {
            self.0.lock().unwrap().push(req.kind());
            Ok(match req {
                Request::Txn(_) => Request::Txn(TxnRequest::new().and_then([TxnOp::put("b", "1")])),
                other => other,
            })
        }
    }

    #[tokio::test]
    async fn every_request_passes_the_hook_and_may_be_rewritten() {
        let s = HookedStore::with_hook(EmbeddedStore::memory(), Recorder::default());
        s.txn(TxnRequest::new().and_then([TxnOp::put("a", "1")])).await.unwrap();
        assert_eq!(s.inner().get(GetRequest::key("a")).await.unwrap().count, 0);
        assert_eq!(s.get(GetRequest::key("b")).await.unwrap().count, 1, "rewritten to b");
        let l = s.lease_grant(10).await.unwrap();
        assert_eq!(s.lease_keep_alive(l.id).await.unwrap(), Some(10));
        assert!(s.lease_revoke(l.id).await.unwrap());
        let _w = s.watch(KeyRange::key("a"), 0).await.unwrap();
        s.compact(2).await.unwrap();
        use Kind::*;
        assert_eq!(
            *s.hook().0.lock().unwrap(),
            [Txn, Get, LeaseGrant, LeaseKeepAlive, LeaseRevoke, Watch, Compact]
        );
    }

    /// Answers every request with a txn response.
    struct Liar;

    #[async_trait::async_trait]
    impl Hook<EmbeddedStore> for Liar {
        async fn call(&self, _: &Arc<EmbeddedStore>, _: Request) -> Answer {
            Ok(Response::Txn(TxnResponse::default()))
        }
    }

    #[tokio::test]
    async fn an_answer_of_the_wrong_kind_is_an_error_not_a_panic() {
        let s = HookedStore::with_hook(EmbeddedStore::memory(), Liar);
        let err = s.get(GetRequest::key("a")).await.unwrap_err();
        assert!(
            matches!(&err, StoreError::InvalidRequest(m) if m.contains("Get request")),
            "{err:?}"
        );
    }
}
