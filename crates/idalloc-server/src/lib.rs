//! `idalloc serve`: the library behind an HTTP/JSON API (DESIGN §12).
//!
//! - [`api`]: request and response bodies; [`error`]: the JSON error body and G6 → HTTP statuses.
//! - [`handlers`]: the `/v1` endpoints; [`watch`]: a pool's events as Server-Sent Events.
//! - [`sessions`]: client sessions handed out (their ids are capabilities).
//! - [`auth`]: bearer tokens as named clients with scopes (a middleware of the router) and the
//!   holder namespacing they imply; [`tls`]: TLS on the listener, client certificates, reload.
//! - this module: the router, health, metrics endpoint, background tasks and graceful shutdown.

#![forbid(unsafe_code)]

pub mod api;
pub mod audit;
pub mod auth;
pub mod build_info;
pub mod conn;
pub mod deadline;
pub mod error;
pub mod fanout;
pub mod flight;
pub mod grants;
pub mod handlers;
pub mod keepalive;
pub mod labels;
pub mod limits;
pub mod openapi;
pub mod pool_slots;
pub mod quota;
pub mod ready;
pub mod ref_slots;
pub mod secret_files;
pub mod sessions;
pub mod slots;
pub mod snapshot;
pub mod sniff;
pub mod tls;
mod unread;
pub mod watch;

use std::future::Future;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::extract::{DefaultBodyLimit, MatchedPath, Request, State};
use axum::http::StatusCode;
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post, put};
use axum::{Json, Router};
use idalloc::layout::Layout;
use idalloc::store::{GetRequest, Store};
use idalloc::{Allocator, Pool};
use metrics_exporter_prometheus::{PrometheusBuilder, PrometheusHandle};
use tokio::sync::watch as signal;
use tracing::{info, warn};

use crate::error::ApiError;
use crate::sessions::Sessions;

/// The OpenAPI document of the `/v1` API (hand-written; a test checks that it names every route
/// of [`router`] and nothing else).
pub const OPENAPI: &str = include_str!("openapi.json");

/// HTTP requests served, by `route` (the route template, never the concrete path: paths carry
/// keys and session ids), `method` and `status`; every label from a fixed set ([`labels`]).
pub const HTTP_REQUESTS: &str = "idalloc_http_requests_total";
/// HTTP request duration, by `route` and `method`.
pub const HTTP_DURATION: &str = "idalloc_http_request_duration_seconds";

/// How the service runs.
#[derive(Clone, Debug)]
pub struct Config {
    /// Largest request body accepted (413 above).
    pub max_body_bytes: usize,
    /// Bound on the store probe of `/readyz`.
    pub probe_timeout: Duration,
    /// How often every pool in the store is opened (so the allocator's sweeper covers pools this
    /// instance has not served yet) and lost sessions are forgotten.
    pub maintenance_interval: Duration,
    /// After SIGTERM, how long in-flight requests may take before the process exits anyway.
    pub drain_timeout: Duration,
    /// After SIGTERM and before the drain, how long `/readyz` fails while every request is still
    /// served ([`AppState::begin_leaving`]): load balancers stop sending new requests meanwhile.
    pub shutdown_delay: Duration,
    /// Bearer tokens of the named clients; `None`: no authentication (every request is served,
    /// holders are used as given).
    pub tokens: Option<auth::Tokens>,
    /// Connection and request limits.
    pub limits: limits::Limits,
    /// Changes of each watched pool kept for watch streams to read and resume from
    /// ([`fanout`]); a stream more than this many changes behind is ended.
    pub watch_history: usize,
    /// How long a pool's watch feed (its hub and history) is kept after its last stream ended,
    /// so that a client that reconnects meanwhile resumes exactly from the history instead of
    /// getting 410 `gone`; after that (and at once for a deleted pool) it is dropped, so the
    /// service keeps no state per pool that nobody watches.
    pub watch_idle: Duration,
    /// Watch-stream wake-ups per second each watched pool aims at, at most: the pacing window
    /// widens with a pool's streams to stay within it ([`fanout::window`]), trading delivery
    /// latency for the CPU each wake-up's writes cost.
    pub watch_wake_budget: u64,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            max_body_bytes: 1 << 20,
            probe_timeout: Duration::from_secs(2),
            maintenance_interval: Duration::from_secs(30),
            drain_timeout: Duration::from_secs(10),
            shutdown_delay: Duration::ZERO,
            tokens: None,
            limits: limits::Limits::default(),
            watch_history: 10_000,
            watch_idle: Duration::from_secs(60),
            watch_wake_budget: fanout::WAKE_BUDGET,
        }
    }
}

/// Everything the handlers share.
pub struct AppState {
    pub alloc: Allocator,
    pub store: Arc<dyn Store>,
    pub layout: Layout,
    pub sessions: Sessions,
    pub config: Config,
    opened: Mutex<handlers::Opened>,
    /// The shared watch feed of each watched pool.
    hubs: Mutex<std::collections::HashMap<String, fanout::Held>>,
    /// Per watched pool, the shared read of its newest change ([`AppState::newest_change`]).
    newest: Mutex<std::collections::HashMap<String, Arc<flight::SingleFlight<i64, ApiError>>>>,
    shutting_down: AtomicBool,
    /// Set when the shutdown delay begins: readiness fails, requests are still served.
    leaving: AtomicBool,
    /// Flips to true when shutdown begins: ends open watch streams so they do not hold the drain.
    stop: signal::Sender<bool>,
    metrics: Option<PrometheusHandle>,
    /// Request slots, in total and per client.
    pub(crate) concurrency: limits::Concurrency,
    /// Open watch streams per client ([`watch::WatchSlot`]).
    pub(crate) watchers: Mutex<std::collections::HashMap<Arc<str>, usize>>,
    /// The OpenAPI document as served (security as configured, [`openapi::document`]).
    openapi: String,
}

impl AppState {
    /// `store` must be the allocator's store (the service reads pool usage and watches from it).
    pub fn new(
        alloc: Allocator,
        store: Arc<dyn Store>,
        prefix: &str,
        config: Config,
        metrics: Option<PrometheusHandle>,
    ) -> idalloc::Result<Arc<AppState>> {
        Ok(Arc::new(AppState {
            alloc,
            store,
            layout: Layout::new(prefix)?,
            sessions: Sessions::default(),
            concurrency: limits::Concurrency::new(&config.limits),
            opened: Mutex::new(Default::default()),
            hubs: Mutex::new(Default::default()),
            newest: Mutex::new(Default::default()),
            shutting_down: AtomicBool::new(false),
            leaving: AtomicBool::new(false),
            stop: signal::channel(false).0,
            metrics,
            watchers: Mutex::default(),
            openapi: openapi::document(config.tokens.is_some()),
            config,
        }))
    }

    fn opened(&self) -> std::sync::MutexGuard<'_, handlers::Opened> {
        self.opened.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A handle on pool `name` (opened once, then cached; `pool_not_found` if it has no spec).
    pub async fn pool(&self, name: &str) -> Result<Pool, ApiError> {
        if let Some(p) = self.opened().get(name) {
            // A handle whose pool was deleted (or re-created) is retired for good: open afresh.
            if !p.is_retired() {
                return Ok(p.clone());
            }
        }
        let p = self.alloc.pool(name).await?;
        self.remember(&p);
        Ok(p)
    }

    /// The shared watch feed of `pool` (started on its first watch; a new one once the pool was
    /// re-created).
    pub(crate) fn hub(&self, pool: &Pool) -> Arc<fanout::Hub> {
        self.prune_watch_state();
        let mut hubs = self.hubs.lock().unwrap_or_else(|p| p.into_inner());
        let name = pool.name();
        if let Some(h) = hubs.get_mut(name) {
            if !h.hub.is_ended() {
                h.idle_since = None;
                return h.hub.clone();
            }
        }
        let h = fanout::Hub::start(
            pool.clone(),
            self.config.watch_history,
            self.config.watch_wake_budget,
            self.stop_signal(),
        );
        hubs.insert(name.to_string(), fanout::Held { hub: h.clone(), idle_since: None });
        h
    }

    /// The newest mod revision of `pool`'s ID records in the store, from a read that started
    /// after this call: what a new watch stream waits for its feed to reach (read-your-writes).
    /// One record over the network however big the pool (a `newest_first` read of limit 1), and
    /// one read for all the streams that open at once ([`flight`]).
    pub(crate) async fn newest_change(&self, pool: &str) -> Result<i64, ApiError> {
        let flight = {
            let mut all = self.newest.lock().unwrap_or_else(|p| p.into_inner());
            let flight = all.entry(pool.to_string()).or_insert_with(|| {
                let store = self.store.clone();
                let prefix = self.layout.id_prefix(pool);
                flight::SingleFlight::new(move || {
                    let (store, prefix) = (store.clone(), prefix.clone());
                    async move {
                        let newest =
                            GetRequest::prefix(prefix).keys_only().newest_first().with_limit(1);
                        let resp = store.get(newest).await?;
                        Ok(resp.kvs.first().map_or(0, |kv| kv.mod_revision))
                    }
                })
            });
            flight.clone()
        };
        flight.get().await
    }

    /// Forgets the watch state of pools nobody watches: hubs that ended (their pool was deleted
    /// or re-created) or that nothing but the map has held for [`Config::watch_idle`] (their last
    /// stream ended, or the last one to open failed before it started), and shared reads of the
    /// newest change that no caller holds. Without this every pool ever watched kept its hub (a
    /// task, a cursor on the pool's feed, a history of up to `watch_history` events) and its read
    /// for as long as the service ran, however many pools were created and deleted since.
    ///
    /// An entry counts as unused only when the map holds its one strong reference, and only the
    /// map hands references out (under its lock, which this holds): no open stream loses its
    /// hub, and a stream that opens later starts a fresh one. The hub's own tasks hold weak
    /// references and end once it is dropped. Run on every new stream, on a pool's deletion and
    /// by the maintenance task.
    pub fn prune_watch_state(&self) {
        let now = tokio::time::Instant::now();
        let grace = self.config.watch_idle;
        self.hubs.lock().unwrap_or_else(|p| p.into_inner()).retain(|_, h| {
            let unused = Arc::strong_count(&h.hub) == 1;
            fanout::keep(h.hub.is_ended(), unused, &mut h.idle_since, now, grace)
        });
        let mut newest = self.newest.lock().unwrap_or_else(|p| p.into_inner());
        newest.retain(|_, f| Arc::strong_count(f) > 1);
    }

    /// The watch state the service keeps: (pools with a hub, pools with a shared read of their
    /// newest change). Bounded by the pools being watched (tests check that it does not grow
    /// with pools created, watched and deleted).
    pub fn watch_state(&self) -> (usize, usize) {
        let hubs = self.hubs.lock().unwrap_or_else(|p| p.into_inner()).len();
        let newest = self.newest.lock().unwrap_or_else(|p| p.into_inner()).len();
        (hubs, newest)
    }

    /// New watch streams of `pool` waiting for the read of its newest change (tests count them
    /// to know a burst of streams has arrived).
    pub fn streams_opening(&self, pool: &str) -> usize {
        let all = self.newest.lock().unwrap_or_else(|p| p.into_inner());
        all.get(pool).map_or(0, |f| f.waiting())
    }

    /// Forgets the handles of pools retired since they were opened: deleted (or re-created)
    /// by another process, which this service learns from its watch of each pool. A handle
    /// holds its pool's cache (every binding), so without this a replica kept a deleted pool's
    /// cache for as long as it ran, and `/readyz` kept counting it. Run by `/readyz` and the
    /// maintenance task; a later request for the name opens it afresh (or answers
    /// `pool_not_found`).
    pub fn prune_retired_pools(&self) {
        self.opened().retain(|_, p| !p.is_retired());
    }

    /// The names of the pools this service holds a handle on, sorted (tests check that a pool
    /// deleted elsewhere leaves none).
    pub fn pools_opened(&self) -> Vec<String> {
        let mut names: Vec<String> = self.opened().keys().cloned().collect();
        names.sort();
        names
    }

    pub(crate) fn remember(&self, p: &Pool) {
        self.opened().insert(p.name().to_string(), p.clone());
    }

    /// Forgets pool `name` (deleted through this service): its handle, and its watch state once
    /// no stream holds it (open streams end with `gone` when their hub sees the pool retired).
    pub(crate) fn forget(&self, name: &str) {
        self.opened().remove(name);
        self.hubs.lock().unwrap_or_else(|p| p.into_inner()).remove(name);
        self.prune_watch_state();
    }

    /// Starts the shutdown delay: readiness fails, every request is still served.
    pub fn begin_leaving(&self) {
        self.leaving.store(true, Ordering::Release);
    }

    /// Starts the shutdown: new API requests get 503, readiness fails, watch streams end.
    pub fn begin_shutdown(&self) {
        self.shutting_down.store(true, Ordering::Release);
        self.stop.send_replace(true);
    }

    pub fn is_shutting_down(&self) -> bool {
        self.shutting_down.load(Ordering::Acquire)
    }

    pub(crate) fn stop_signal(&self) -> signal::Receiver<bool> {
        self.stop.subscribe()
    }
}

/// Installs the Prometheus recorder as the process's `metrics` recorder. Call before building the
/// allocator, so the library's metric descriptions are registered with it.
pub fn install_prometheus() -> Result<PrometheusHandle, String> {
    // Buckets (seconds) from 0.5 ms to 10 s: local file-store operations to slow etcd retries.
    let buckets =
        [0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0];
    let handle = PrometheusBuilder::new()
        .set_buckets(&buckets)
        .map_err(|e| e.to_string())?
        .install_recorder()
        .map_err(|e| format!("cannot install the metrics recorder: {e}"))?;
    build_info::describe();
    Ok(handle)
}

/// The whole HTTP service.
pub fn router(state: Arc<AppState>) -> Router {
    let v1 = Router::new()
        .route("/v1/openapi.json", get(openapi))
        .route("/v1/version", get(version))
        .route("/v1/pools", get(handlers::list_pools).post(handlers::create_pool))
        .route(
            "/v1/pools/{pool}",
            get(handlers::show_pool).delete(handlers::delete_pool).patch(handlers::resize_pool),
        )
        .route("/v1/pools/{pool}/acquire", post(handlers::acquire))
        .route("/v1/pools/{pool}/release", post(handlers::release))
        .route("/v1/pools/{pool}/keys/{*key}", get(handlers::get_key))
        .route("/v1/pools/{pool}/ids/{id}", get(handlers::lookup_id))
        .route("/v1/pools/{pool}/bindings", get(handlers::list_bindings))
        .route("/v1/pools/{pool}/sweep", post(handlers::sweep))
        .route("/v1/pools/{pool}/watch", get(watch::watch))
        .route("/v1/sessions", post(handlers::open_session).get(handlers::list_sessions))
        .route("/v1/sessions/{id}", axum::routing::delete(handlers::end_session))
        .route("/v1/sessions/{id}/keepalive", put(handlers::keepalive))
        .layer(middleware::from_fn_with_state(state.clone(), refuse_when_shutting_down));
    Router::new()
        .merge(v1)
        .route("/healthz", get(healthz))
        .route("/readyz", get(readyz))
        .route("/metrics", get(metrics_text))
        .fallback(not_found)
        .method_not_allowed_fallback(method_not_allowed)
        .layer(DefaultBodyLimit::max(state.config.max_body_bytes))
        .layer(middleware::from_fn_with_state(state.clone(), refuse_oversized))
        // Inside authentication: the per-client request limit knows the client.
        .layer(middleware::from_fn_with_state(state.clone(), limits::limit_concurrency))
        // Before anything reads the request: who may ask is decided first.
        .layer(middleware::from_fn_with_state(state.clone(), auth::require_token))
        .layer(middleware::from_fn(http_metrics))
        // Every error answer is JSON, also those of axum's extractors and of the layers above.
        .layer(middleware::from_fn(error::json_errors))
        // Request ids and the audit line of every mutating request, refused ones included.
        .layer(middleware::from_fn(audit::audit))
        // Outermost: sees every answer, including the refusals of the layers above.
        .layer(middleware::from_fn(unread::close_if_body_unread))
        .with_state(state)
}

/// This build and its store's server (`store` is left out when the store does not answer within
/// the probe timeout: the version of the service itself never depends on the store).
async fn version(State(st): State<Arc<AppState>>) -> Response {
    let store = tokio::time::timeout(st.config.probe_timeout, st.store.server_version()).await;
    Json(build_info::version(store.ok().and_then(Result::ok).flatten())).into_response()
}

async fn openapi(State(st): State<Arc<AppState>>) -> Response {
    ([(axum::http::header::CONTENT_TYPE, "application/json")], st.openapi.clone()).into_response()
}

async fn not_found() -> ApiError {
    ApiError::not_found("no such route; the API is described at /v1/openapi.json")
}

async fn method_not_allowed() -> ApiError {
    ApiError::new(
        StatusCode::METHOD_NOT_ALLOWED,
        "method_not_allowed",
        "method not allowed on this route; see /v1/openapi.json",
    )
}

async fn refuse_when_shutting_down(
    State(st): State<Arc<AppState>>,
    req: Request,
    next: Next,
) -> Response {
    if st.is_shutting_down() {
        return ApiError::unavailable("the service is shutting down; retry on another instance")
            .into_response();
    }
    next.run(req).await
}

/// Answers 413 at once when the announced body length is over the limit, without reading (or
/// waiting for) the body; bodies without a length are cut at the limit while being read.
async fn refuse_oversized(State(st): State<Arc<AppState>>, req: Request, next: Next) -> Response {
    let announced = req
        .headers()
        .get(axum::http::header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if let Some(len) = announced {
        if len > st.config.max_body_bytes as u64 {
            return ApiError::new(
                StatusCode::PAYLOAD_TOO_LARGE,
                "too_large",
                format!(
                    "request body of {len} bytes is over the limit of {} bytes",
                    st.config.max_body_bytes
                ),
            )
            .into_response();
        }
    }
    next.run(req).await
}

/// Counts requests by route template, method and status, each label from a fixed set
/// ([`labels`]): no request can add a series.
async fn http_metrics(req: Request, next: Next) -> Response {
    let route = labels::route(req.extensions().get::<MatchedPath>().map(|m| m.as_str()));
    let method = labels::method(req.method());
    let start = Instant::now();
    let resp = next.run(req).await;
    metrics::histogram!(HTTP_DURATION, "route" => route, "method" => method)
        .record(start.elapsed().as_secs_f64());
    metrics::counter!(HTTP_REQUESTS, "route" => route, "method" => method,
        "status" => resp.status().as_u16().to_string())
    .increment(1);
    resp
}

async fn healthz() -> Response {
    Json(api::Health { status: "ok".into() }).into_response()
}

/// Ready: not shutting down, the store lets this service read and write its prefix (a probe
/// that writes nothing, [`ready`]) within the probe timeout, and every pool this instance serves
/// has its cache synced. A refusal says why.
async fn readyz(State(st): State<Arc<AppState>>) -> Response {
    if st.is_shutting_down() {
        return ApiError::unavailable("shutting down").into_response();
    }
    if st.leaving.load(Ordering::Acquire) {
        return ApiError::unavailable(format!(
            "shutting down: leaving the load balancer for {:?} before draining",
            st.config.shutdown_delay
        ))
        .into_response();
    }
    let probe =
        tokio::time::timeout(st.config.probe_timeout, ready::probe(&*st.store, &st.layout)).await;
    let revision = match probe {
        Ok(ready::Probe::Ready { revision }) => revision,
        Ok(ready::Probe::Denied(why)) => {
            return ApiError::new(StatusCode::SERVICE_UNAVAILABLE, "access_denied", why)
                .into_response()
        }
        Ok(ready::Probe::Unavailable(why)) => return ApiError::unavailable(why).into_response(),
        Err(_) => {
            return ApiError::unavailable(format!(
                "store: no answer within {:?}",
                st.config.probe_timeout
            ))
            .into_response()
        }
    };
    st.prune_retired_pools();
    let pools: Vec<Pool> = st.opened().values().cloned().collect();
    let mut unsynced = Vec::new();
    for p in &pools {
        // Zero wait: a synced pool answers on the first poll.
        if tokio::time::timeout(Duration::ZERO, p.wait_synced()).await.is_err() {
            unsynced.push(p.name().to_string());
        }
    }
    if !unsynced.is_empty() {
        unsynced.sort();
        return ApiError::unavailable(format!("pools not synced yet: {}", unsynced.join(", ")))
            .into_response();
    }
    Json(api::Ready { pools: api::count(pools.len()), revision, status: "ready".into() })
        .into_response()
}

async fn metrics_text(
    State(st): State<Arc<AppState>>,
    client: Option<axum::Extension<auth::Client>>,
) -> Response {
    match &st.metrics {
        Some(h) => {
            build_info::record_process();
            let mut text = h.render();
            // A client sees the per-pool samples of the pools it may read only.
            if let Some(axum::Extension(c)) = client {
                text = grants::filter_metrics(&text, |p| c.policy.can_read(p));
            }
            ([(axum::http::header::CONTENT_TYPE, "text/plain; version=0.0.4")], text)
                .into_response()
        }
        None => ApiError::not_found("metrics are not enabled in this process").into_response(),
    }
}

/// Periodic upkeep: opens every pool of the store (so the allocator's background sweeper covers
/// it), forgets sessions that are over and handles of pools deleted elsewhere, and drains the
/// exporter's histogram buffers.
async fn maintenance(st: Arc<AppState>) {
    let mut stop = st.stop_signal();
    loop {
        match st.alloc.list_pools().await {
            Ok(specs) => {
                for spec in specs {
                    if let Err(e) = st.pool(spec.name()).await {
                        warn!(pool = spec.name(), error = %e.message, "cannot open pool");
                    }
                }
            }
            Err(e) => warn!(error = %e, "cannot list pools"),
        }
        st.sessions.prune();
        st.prune_retired_pools();
        st.prune_watch_state();
        if let Some(h) = &st.metrics {
            h.run_upkeep();
        }
        tokio::select! {
            _ = tokio::time::sleep(st.config.maintenance_interval) => {}
            _ = stop.wait_for(|s| *s) => return,
        }
    }
}

/// Serves on `listener` until `shutdown` completes, then drains: new API requests get 503, open
/// watch streams end, in-flight requests finish (up to `drain_timeout`). Client sessions are NOT
/// ended: their leases run out on their own TTL unless the client renews them, so a restart does
/// not take IDs away from clients that come back in time.
pub async fn serve(
    state: Arc<AppState>,
    listener: tokio::net::TcpListener,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    let addr: SocketAddr = listener.local_addr()?;
    info!(%addr, "idalloc serve listening (plain HTTP)");
    // No Nagle delay: a watch stream's small paced writes would otherwise wait for the client's
    // delayed ACK of the previous one (tens of milliseconds).
    let keepalive = state.config.limits.keepalive;
    let listener = axum::serve::ListenerExt::tap_io(listener, move |tcp| {
        let _ = tcp.set_nodelay(true);
        if let Err(e) = keepalive::tune(tcp, keepalive) {
            warn!(error = %e, "cannot set TCP keepalive on a connection");
        }
    });
    serve_on(state, listener, shutdown).await
}

/// [`serve`] over TLS: handshakes with the config `tls` holds, which is reloaded on SIGHUP and
/// when its files change (checked every 5 s).
pub async fn serve_tls(
    state: Arc<AppState>,
    listener: tokio::net::TcpListener,
    tls: Arc<tls::TlsReloader>,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    let addr: SocketAddr = listener.local_addr()?;
    info!(
        %addr,
        client_certificates = tls.files().client_ca.is_some(),
        "idalloc serve listening (HTTPS)"
    );
    let reload = tokio::spawn(tls.clone().watch(Duration::from_secs(5)));
    let listener = tls::TlsListener::new(listener, tls, state.config.limits.keepalive)?;
    let r = serve_on(state, listener, shutdown).await;
    reload.abort();
    r
}

async fn serve_on<L>(
    state: Arc<AppState>,
    listener: L,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()>
where
    L: axum::serve::Listener<Addr = SocketAddr>,
    L::Io: sniff::Negotiate,
{
    let app = router(state.clone());
    let maint = tokio::spawn(maintenance(state.clone()));
    let drain_timeout = state.config.drain_timeout;
    let server =
        conn::serve_connections(listener, app, state.config.limits.clone(), state.stop_signal());
    tokio::pin!(server);
    tokio::select! {
        // Returns only after the stop signal, which only begin_shutdown sends.
        _ = &mut server => {}
        _ = shutdown => {}
    }
    let delay = state.config.shutdown_delay;
    if !delay.is_zero() {
        info!(?delay, "shutdown requested: not ready, still serving until the delay ends");
        state.begin_leaving();
        // The accept loop is polled meanwhile: new connections are still served. It returns
        // only after the stop signal, which only begin_shutdown sends.
        tokio::select! {
            _ = tokio::time::sleep(delay) => {}
            _ = &mut server => {}
        }
    }
    info!("shutdown requested: refusing new requests, finishing in-flight ones");
    state.begin_shutdown();
    if tokio::time::timeout(drain_timeout, &mut server).await.is_err() {
        warn!(?drain_timeout, "in-flight requests did not finish in time; exiting anyway");
    }
    maint.abort();
    Ok(())
}

/// Resolves on SIGTERM or SIGINT.
pub async fn shutdown_signal() {
    let ctrl_c = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    #[cfg(unix)]
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    #[cfg(not(unix))]
    let term = std::future::pending::<()>();
    tokio::select! {
        _ = ctrl_c => {}
        _ = term => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::body::Body;
    use axum::http::Request as HttpRequest;
    use idalloc::store::embedded::EmbeddedStore;
    use tower::ServiceExt;

    fn state() -> Arc<AppState> {
        let store: Arc<dyn Store> = Arc::new(EmbeddedStore::memory());
        let alloc = Allocator::from_arc(store.clone(), Default::default()).expect("allocator");
        AppState::new(alloc, store, "idalloc", Config::default(), None).expect("state")
    }

    /// Every route the router serves, as (method, template as served) pairs, read from this
    /// file's source (the code before its tests) so that a route added to `router` without
    /// documenting it fails the tests that use this. A `.route(` call may span lines.
    pub(crate) fn routes_in_source() -> Vec<(&'static str, &'static str)> {
        let src = include_str!("lib.rs");
        let code = src.split("#[cfg(test)]").next().unwrap_or(src);
        let mut out = Vec::new();
        for call in code.split(".route(").skip(1) {
            let Some(rest) = call.trim_start().strip_prefix('"') else { continue };
            let Some((path, after)) = rest.split_once('"') else { continue };
            // The handlers: up to the parenthesis that closes `.route(`.
            let mut depth = 1usize;
            let end = after
                .char_indices()
                .find(|&(_, c)| {
                    match c {
                        '(' => depth += 1,
                        ')' => depth -= 1,
                        _ => {}
                    }
                    depth == 0
                })
                .map_or(after.len(), |(i, _)| i);
            let handlers = &after[..end];
            for m in ["get", "post", "put", "delete", "patch"] {
                let called = handlers.match_indices(&format!("{m}(")).any(|(i, _)| {
                    i == 0 || matches!(handlers.as_bytes()[i - 1], b'.' | b' ' | b':')
                });
                if called {
                    out.push((m, path));
                }
            }
        }
        out
    }

    /// Every `$ref` of the document names something it defines.
    fn refs(v: &serde_json::Value, out: &mut Vec<String>) {
        match v {
            serde_json::Value::Object(o) => {
                for (k, x) in o {
                    match (k.as_str(), x.as_str()) {
                        ("$ref", Some(r)) => out.push(r.to_string()),
                        _ => refs(x, out),
                    }
                }
            }
            serde_json::Value::Array(a) => a.iter().for_each(|x| refs(x, out)),
            _ => {}
        }
    }

    #[test]
    fn the_openapi_document_resolves_its_refs_and_states_each_routes_scope() {
        let doc: serde_json::Value = serde_json::from_str(OPENAPI).expect("valid JSON");
        let mut found = Vec::new();
        refs(&doc, &mut found);
        assert!(found.len() > 40, "{found:?}");
        for r in &found {
            let ptr = r.strip_prefix('#').expect("local ref");
            assert!(doc.pointer(ptr).is_some(), "{r} does not resolve");
        }
        assert_eq!(doc["components"]["securitySchemes"]["bearer"]["scheme"], "bearer");
        for (path, ops) in doc["paths"].as_object().expect("paths") {
            for (method, op) in ops.as_object().expect("operations") {
                let m = axum::http::Method::from_bytes(method.to_uppercase().as_bytes())
                    .expect("method");
                let route = path.replace("{key}", "{*key}");
                let access = auth::classify(&m, &route).expect("classified");
                let responses = &op["responses"];
                match access {
                    auth::Access::Open => {
                        assert_eq!(op["security"], serde_json::json!([]), "{method} {path}");
                        assert!(responses.get("401").is_none(), "{method} {path}");
                    }
                    auth::Access::Needs(scope) => {
                        assert_eq!(op["x-scope"], scope.as_str(), "{method} {path}");
                        assert!(responses.get("401").is_some(), "{method} {path}: no 401");
                        // 403: a lower scope exists, or the pool named is outside the grants.
                        assert_eq!(
                            responses.get("403").is_some(),
                            scope > auth::Scope::Read || path.starts_with("/v1/pools/{pool}"),
                            "{method} {path}: 403 listed iff a lower scope exists or a pool is named"
                        );
                    }
                }
            }
        }
    }

    #[test]
    fn every_route_has_an_access_decision() {
        let routes = routes_in_source();
        for (m, path) in &routes {
            let method =
                axum::http::Method::from_bytes(m.to_uppercase().as_bytes()).expect("method");
            assert!(
                auth::classify(&method, path).is_some(),
                "{m} {path} has no access decision in auth::classify"
            );
        }
        assert!(routes.len() >= 21, "{} routes found: {routes:?}", routes.len());
    }

    #[test]
    fn the_openapi_document_names_every_route_and_method() {
        let doc: serde_json::Value = serde_json::from_str(OPENAPI).expect("valid JSON");
        let routes: Vec<(&str, String)> = routes_in_source()
            .into_iter()
            .map(|(m, p)| (m, p.replace("{*key}", "{key}")))
            .collect();
        assert!(routes.len() >= 21, "{routes:?}");
        for (method, path) in &routes {
            assert!(
                doc["paths"][path.as_str()][*method].is_object(),
                "{method} {path} is served but not in openapi.json"
            );
        }
        let documented: usize = doc["paths"]
            .as_object()
            .expect("paths")
            .values()
            .map(|p| p.as_object().map_or(0, |o| o.len()))
            .sum();
        assert_eq!(documented, routes.len(), "openapi.json documents routes that do not exist");
    }

    #[tokio::test]
    async fn requests_after_shutdown_began_get_503_and_readiness_fails() {
        let st = state();
        let app = router(st.clone());
        let req = || HttpRequest::get("/v1/pools").body(Body::empty()).expect("request");
        assert_eq!(app.clone().oneshot(req()).await.expect("response").status(), 200);
        st.begin_shutdown();
        let resp = app.clone().oneshot(req()).await.expect("response");
        assert_eq!(resp.status(), 503);
        let body = axum::body::to_bytes(resp.into_body(), 1 << 16).await.expect("body");
        let v: serde_json::Value = serde_json::from_slice(&body).expect("JSON");
        assert_eq!(v["kind"], "unavailable");
        assert!(v["message"].as_str().is_some_and(|m| m.contains("shutting down")), "{v}");
        let ready = HttpRequest::get("/readyz").body(Body::empty()).expect("request");
        assert_eq!(app.clone().oneshot(ready).await.expect("response").status(), 503);
        let alive = HttpRequest::get("/healthz").body(Body::empty()).expect("request");
        assert_eq!(app.oneshot(alive).await.expect("response").status(), 200);
    }

    #[tokio::test]
    async fn a_body_without_a_length_is_cut_at_the_limit_with_413() {
        let st = AppState::new(
            Allocator::new(EmbeddedStore::memory(), Default::default()).expect("allocator"),
            Arc::new(EmbeddedStore::memory()),
            "idalloc",
            Config { max_body_bytes: 100, ..Config::default() },
            None,
        )
        .expect("state");
        let app = router(st);
        let chunks = futures::stream::iter(
            (0..10).map(|_| Ok::<_, std::io::Error>(axum::body::Bytes::from(vec![b' '; 50]))),
        );
        let req =
            HttpRequest::post("/v1/sessions").body(Body::from_stream(chunks)).expect("request");
        let resp = app.oneshot(req).await.expect("response");
        assert_eq!(resp.status(), 413);
    }

    /// An answer given before the request body was read says `Connection: close`, so that a
    /// keep-alive client does not reuse a connection hyper is about to close (the secured-service
    /// test failed with "peer disconnected" in 2 of 14 suite runs under load); an answer after
    /// the body was read keeps the connection.
    #[tokio::test]
    async fn answers_that_leave_the_body_unread_close_the_connection() {
        let close = |r: &Response| r.headers().get(axum::http::header::CONNECTION).cloned();
        // A body whose end has not arrived (as on a slow connection): one chunk, then nothing.
        let slow = || {
            let first = futures::stream::iter([Ok::<_, std::io::Error>(axum::body::Bytes::from(
                "{\"name\":",
            ))]);
            Body::from_stream(first.chain(futures::stream::pending()))
        };
        use futures::StreamExt;
        let app = router(state());
        let unknown = HttpRequest::post("/v1/nope").body(slow()).expect("request");
        let resp = app.clone().oneshot(unknown).await.expect("response");
        assert_eq!(resp.status(), 404);
        assert_eq!(close(&resp).as_ref().map(|v| v.as_bytes()), Some(&b"close"[..]));

        let wrong_method = HttpRequest::put("/v1/pools").body(slow()).expect("request");
        let resp = app.clone().oneshot(wrong_method).await.expect("response");
        assert_eq!(resp.status(), 405);
        assert_eq!(close(&resp).as_ref().map(|v| v.as_bytes()), Some(&b"close"[..]));

        let create = HttpRequest::post("/v1/pools")
            .header(axum::http::header::CONTENT_TYPE, "application/json")
            .body(Body::from(r#"{"name":"p","min":1,"max":10}"#))
            .expect("request");
        let resp = app.clone().oneshot(create).await.expect("response");
        assert_eq!(resp.status(), 200);
        assert_eq!(close(&resp), None, "the body was read: the connection stays");

        let bad_json = HttpRequest::post("/v1/pools")
            .header(axum::http::header::CONTENT_TYPE, "application/json")
            .body(Body::from("{"))
            .expect("request");
        let resp = app.oneshot(bad_json).await.expect("response");
        assert_eq!(resp.status(), 400);
        assert_eq!(close(&resp), None, "the body was read: the connection stays");
    }
}
