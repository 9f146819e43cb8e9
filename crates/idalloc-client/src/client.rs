//! [`Client`]: the entry point, like the library's `Allocator`.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use idalloc::{Error, Input, PoolSpec};
use reqwest::Method;
use serde_json::Value;

use crate::api::{self, spec_body, to_spec, SpecBody};
use crate::errors::{self, Context};
use crate::options::ClientOptions;
use crate::pool::{Pool, PoolShared};
use crate::session::Session;
use crate::transport::{encode_segment, Answer, Transport};
use crate::watch::Feed;
use idalloc_wire::errors::kind;

/// A client of one `idalloc serve` deployment: one or more replicas sharing one store. Cheap to
/// clone. Build many in one process with a shared [`ClientOptions::http`] to share one
/// connection pool.
#[derive(Clone)]
pub struct Client {
    shared: Arc<Shared>,
}

/// A pool's spec and how many of its IDs are taken, counted at one revision.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct PoolUsage {
    /// The pool's spec.
    pub spec: PoolSpec,
    /// Keys with an ID.
    pub bound: u64,
    /// IDs waiting out their reuse delay.
    pub quarantined: u64,
}

/// What a client's handles share.
pub(crate) struct Shared {
    pub t: Arc<Transport>,
    /// Pools with a live handle, by name: one watch stream each.
    pools: Mutex<HashMap<String, Weak<PoolShared>>>,
    /// The client's own session ([`Pool::acquire`]) and its generation (bumped when a lost one
    /// is replaced, so keys held on the old one are referenced again on their next acquire).
    own: tokio::sync::Mutex<Option<(Session, u64)>>,
}

impl std::fmt::Debug for Client {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Client").field("endpoints", &self.shared.t.endpoints).finish()
    }
}

fn invalid(what: &str, value: impl ToString, rule: &str) -> Error {
    Error::invalid(Input::Options, what, value, rule)
}

/// `endpoint` checked and without a trailing `/`: `http://` or `https://`, a host, no query.
fn endpoint(raw: &str) -> idalloc::Result<String> {
    const RULE: &str = "an http:// or https:// URL of an idalloc serve (e.g. http://127.0.0.1:7379), without query or fragment";
    let url = reqwest::Url::parse(raw).map_err(|_| invalid("endpoint", raw, RULE))?;
    if !matches!(url.scheme(), "http" | "https")
        || url.host_str().is_none()
        || url.query().is_some()
        || url.fragment().is_some()
    {
        return Err(invalid("endpoint", raw, RULE));
    }
    Ok(url.as_str().trim_end_matches('/').to_string())
}

impl Client {
    /// A client of the service at `endpoints` (tried in order, failing over on the errors
    /// `transport.rs` lists). Makes no request yet.
    pub fn new<I, S>(endpoints: I, opts: ClientOptions) -> idalloc::Result<Client>
    where
        I: IntoIterator<Item = S>,
        S: AsRef<str>,
    {
        let endpoints: Vec<String> =
            endpoints.into_iter().map(|e| endpoint(e.as_ref())).collect::<idalloc::Result<_>>()?;
        if endpoints.is_empty() {
            return Err(invalid("endpoints", "(none)", "at least one endpoint"));
        }
        opts.validate()?;
        let http = match &opts.http {
            Some(h) => h.clone(),
            None => reqwest::Client::builder()
                .connect_timeout(opts.request_timeout.min(Duration::from_secs(5)))
                .build()
                .map_err(|e| invalid("HTTP client", e, "an HTTP client this platform can build"))?,
        };
        let t = Arc::new(Transport::new(http, endpoints, opts));
        Ok(Client {
            shared: Arc::new(Shared {
                t,
                pools: Mutex::new(HashMap::new()),
                own: tokio::sync::Mutex::new(None),
            }),
        })
    }

    /// A client of the service the environment names, as the CLI's `--server` reads it
    /// ([`crate::env`]: `IDALLOC_SERVER`, `IDALLOC_TOKEN_FILE`, `IDALLOC_CACERT`,
    /// `IDALLOC_CERT`, `IDALLOC_KEY`), with `opts` for everything else.
    pub fn from_env(opts: ClientOptions) -> idalloc::Result<Client> {
        let (endpoints, opts) = crate::env::settings(|name| std::env::var(name).ok(), opts)?;
        Client::new(endpoints, opts)
    }

    /// Creates pool `spec.name()`, or succeeds if an equal spec exists; a different one gives
    /// `RangeMismatch` naming both.
    pub async fn init_pool(&self, spec: &PoolSpec) -> idalloc::Result<()> {
        self.create(spec).await.map(|_| ())
    }

    async fn create(&self, spec: &PoolSpec) -> idalloc::Result<PoolSpec> {
        spec.validate()?;
        let body = serde_json::to_value(spec_body(spec))
            .map_err(|e| errors::bad_answer("a pool create", e))?;
        let cx = Context { pool: Some(spec.name()), spec: Some(spec) };
        match self
            .shared
            .t
            .call::<SpecBody>(Method::POST, "/v1/pools", Some(&body), "a pool create")
            .await?
        {
            Answer::Ok(s) => to_spec(&s),
            Answer::Refused { body: Some(b), .. } if b.kind == kind::RANGE_MISMATCH => {
                let existing = self.spec_of(spec.name()).await?;
                Err(Error::RangeMismatch {
                    pool: spec.name().to_string(),
                    existing: Box::new(existing),
                    requested: Box::new(spec.clone()),
                })
            }
            Answer::Refused { status, body } => Err(errors::from_answer(status, body, &cx)),
        }
    }

    /// [`Client::init_pool`], then a handle on the pool.
    pub async fn ensure_pool(&self, spec: &PoolSpec) -> idalloc::Result<Pool> {
        let spec = self.create(spec).await?;
        Ok(self.open(spec))
    }

    /// A handle on an existing pool; `PoolNotFound` if there is none. Starts the pool's watch
    /// (one stream per pool per client).
    pub async fn pool(&self, name: &str) -> idalloc::Result<Pool> {
        let spec = self.spec_of(name).await?;
        Ok(self.open(spec))
    }

    /// The spec of pool `name`, from the listing of the pools' specs (`GET /v1/pools`): that
    /// costs the store a read of the spec records, O(pools). `GET /v1/pools/{pool}` would also
    /// answer the spec, but it counts the pool's bindings for its usage figures, which etcd does
    /// by walking every key and ID record of the pool: 4–6 ms of etcd's CPU per call at 10,000
    /// bindings, 48 ms at 100,000, paid by every agent that (re)starts in a storm (docs/benchmarks/scale.md).
    /// Only a pool missing from the listing is asked for by name, so that its
    /// error is the service's own (`pool_not_found`, or `forbidden` for a pool this client is
    /// not granted), and a pool created since the listing is found.
    async fn spec_of(&self, name: &str) -> idalloc::Result<PoolSpec> {
        idalloc::pool::validate_pool_name(name)?;
        let cx = Context::default();
        let listed: api::Pools =
            self.shared.t.expect(Method::GET, "/v1/pools", None, "a pool listing", &cx).await?;
        if let Some(body) = listed.pools.iter().find(|p| p.name == name) {
            return to_spec(body);
        }
        let path = format!("/v1/pools/{}", encode_segment(name, false));
        let cx = Context { pool: Some(name), spec: None };
        let info: api::PoolInfo =
            self.shared.t.expect(Method::GET, &path, None, "a pool read", &cx).await?;
        to_spec(&info.spec)
    }

    fn open(&self, spec: PoolSpec) -> Pool {
        let mut pools = self.shared.pools.lock().unwrap_or_else(|p| p.into_inner());
        pools.retain(|_, w| w.strong_count() > 0);
        let live = pools.get(spec.name()).and_then(Weak::upgrade);
        let shared = match live {
            Some(s) => s,
            None => {
                let feed = Arc::new(Feed::new(self.shared.t.opts.event_buffer));
                let held = Mutex::new(HashMap::new());
                let unstarted = Mutex::new(Some(self.shared.t.clone()));
                let s = Arc::new(PoolShared { spec: spec.clone(), feed, held, unstarted });
                if !self.shared.t.opts.lazy_view {
                    s.follow();
                }
                pools.insert(spec.name().to_string(), Arc::downgrade(&s));
                s
            }
        };
        Pool::new(self.shared.clone(), spec, shared)
    }

    /// Every pool spec, sorted by name.
    pub async fn list_pools(&self) -> idalloc::Result<Vec<PoolSpec>> {
        let cx = Context::default();
        let p: api::Pools =
            self.shared.t.expect(Method::GET, "/v1/pools", None, "a pool listing", &cx).await?;
        p.pools.iter().map(to_spec).collect()
    }

    /// A pool's spec and usage (`GET /v1/pools/{pool}`): what `idalloc pool show` prints. Costs
    /// the store a count of the pool's records (see [`Client::pool`] on why handles do not).
    pub async fn pool_usage(&self, name: &str) -> idalloc::Result<PoolUsage> {
        idalloc::pool::validate_pool_name(name)?;
        let path = format!("/v1/pools/{}", encode_segment(name, false));
        let cx = Context { pool: Some(name), spec: None };
        let info: api::PoolInfo =
            self.shared.t.expect(Method::GET, &path, None, "a pool read", &cx).await?;
        Ok(PoolUsage {
            spec: to_spec(&info.spec)?,
            bound: info.bound,
            quarantined: info.quarantined,
        })
    }

    /// The service's build and what serves its store (`GET /v1/version`): what `idalloc version
    /// --server` prints beside the client's own.
    pub async fn server_version(&self) -> idalloc::Result<idalloc_wire::Version> {
        let cx = Context::default();
        self.shared.t.expect(Method::GET, "/v1/version", None, "a version read", &cx).await
    }

    /// Deletes a pool (with `force`, also its bindings); false if there was none.
    /// `PATCH /v1/pools/{pool}`: gives pool `name` the range `[min, max]` (and `reserved`, if
    /// given); the spec now in force. Narrowing over a bound or quarantined ID is refused
    /// (`InvalidInput`, the ID and its key named), as by `idalloc::Allocator::resize_pool`.
    pub async fn resize_pool(
        &self,
        name: &str,
        min: u64,
        max: u64,
        reserved: Option<&[(u64, u64)]>,
    ) -> idalloc::Result<PoolSpec> {
        idalloc::pool::validate_pool_name(name)?;
        let body = idalloc_wire::ResizeBody { min, max, reserved: reserved.map(<[_]>::to_vec) };
        let body =
            serde_json::to_value(body).map_err(|e| errors::bad_answer("a pool resize", e))?;
        let path = format!("/v1/pools/{}", encode_segment(name, false));
        let cx = Context { pool: Some(name), spec: None };
        match self
            .shared
            .t
            .call::<SpecBody>(Method::PATCH, &path, Some(&body), "a pool resize")
            .await?
        {
            Answer::Ok(s) => to_spec(&s),
            Answer::Refused { status, body } => Err(errors::from_answer(status, body, &cx)),
        }
    }

    pub async fn delete_pool(&self, name: &str, force: bool) -> idalloc::Result<bool> {
        idalloc::pool::validate_pool_name(name)?;
        let path = format!("/v1/pools/{}?force={force}", encode_segment(name, false));
        let cx = Context { pool: Some(name), spec: None };
        match self.shared.t.call::<Value>(Method::DELETE, &path, None, "a pool delete").await? {
            Answer::Ok(_) => Ok(true),
            Answer::Refused { body: Some(b), .. } if b.kind == "pool_not_found" => Ok(false),
            Answer::Refused { status, body } => Err(errors::from_answer(status, body, &cx)),
        }
    }

    /// A new client session of `ttl`, renewed in the background until dropped or ended.
    pub async fn session(&self, ttl: Duration) -> idalloc::Result<Session> {
        Session::open(self.shared.t.clone(), ttl).await
    }

    /// Ends the client's own session (its references vanish at once). Other handles stay usable;
    /// a later [`Pool::acquire`] opens a new session.
    pub async fn close(&self) -> idalloc::Result<()> {
        let own = self.shared.own.lock().await.take();
        if let Some((s, _)) = own {
            s.end().await?;
        }
        Ok(())
    }
}

impl Shared {
    /// The client's own session, opened (or replaced, once lost) on demand.
    pub(crate) async fn own_session(self: &Arc<Self>) -> idalloc::Result<(Session, u64)> {
        let mut own = self.own.lock().await;
        if let Some((s, g)) = own.as_ref() {
            if !s.is_lost() {
                return Ok((s.clone(), *g));
            }
        }
        let generation = own.as_ref().map_or(1, |(_, g)| g + 1);
        let s = Session::open(self.t.clone(), self.t.opts.session_ttl).await?;
        *own = Some((s.clone(), generation));
        tokio::spawn(guard(Arc::downgrade(self), s.lost_signal()));
        Ok((s, generation))
    }
}

/// Waits for the client's own session to be lost, then replaces it (or takes the replacement an
/// acquire made meanwhile) and references every key held on an older session again on the new
/// one (the library does the same when its session lease is lost). Ends without doing anything
/// when the session is dropped (the client is gone) or was ended by [`Client::close`].
///
/// Boxed, as a `Send` future of a named type: it awaits [`Shared::own_session`], which spawns it.
fn guard(
    shared: Weak<Shared>,
    lost: tokio::sync::watch::Receiver<bool>,
) -> futures::future::BoxFuture<'static, ()> {
    Box::pin(guard_body(shared, lost))
}

async fn guard_body(shared: Weak<Shared>, mut lost: tokio::sync::watch::Receiver<bool>) {
    if lost.wait_for(|l| *l).await.is_err() {
        return;
    }
    let mut attempt = 0u32;
    let (session, now) = loop {
        let Some(sh) = shared.upgrade() else { return };
        if sh.own.lock().await.is_none() {
            return; // closed by Client::close
        }
        match sh.own_session().await {
            Ok(got) => break got,
            Err(e) => {
                tracing::warn!(error = %e, "replacing the client's lost session failed; trying again");
                attempt = attempt.saturating_add(1);
                let first_backoff = u32::try_from(sh.t.endpoints.len()).unwrap_or(u32::MAX);
                sh.t.pause(attempt.max(first_backoff), None).await;
            }
        }
    };
    let Some(sh) = shared.upgrade() else { return };
    let pools: Vec<Arc<PoolShared>> = {
        let pools = sh.pools.lock().unwrap_or_else(|p| p.into_inner());
        pools.values().filter_map(Weak::upgrade).collect()
    };
    for p in pools {
        let pool = Pool::new(sh.clone(), p.spec.clone(), p);
        pool.rereference(&session, now).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn endpoints_are_checked_and_named_when_refused() {
        assert_eq!(endpoint("http://127.0.0.1:7379/").as_deref(), Ok("http://127.0.0.1:7379"));
        assert_eq!(
            endpoint("https://ids.example/base/").as_deref(),
            Ok("https://ids.example/base")
        );
        for bad in ["127.0.0.1:7379", "ftp://h", "http://h/?a=b", "", "http://"] {
            match endpoint(bad) {
                Err(Error::InvalidInput { value, .. }) => assert!(value.contains(bad), "{value}"),
                other => panic!("{bad:?} accepted: {other:?}"),
            }
        }
        let none: [&str; 0] = [];
        assert!(Client::new(none, ClientOptions::default()).is_err());
        let zero = ClientOptions { attempts: 0, ..ClientOptions::default() };
        assert!(Client::new(["http://127.0.0.1:1"], zero).is_err());
    }
}
