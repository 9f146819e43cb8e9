//! The accept loop: hyper's connection builders with the limits of
//! [`crate::limits::Limits`], in place of `axum::serve` (which exposes no header timeout, no
//! connection cap and no HTTP/2 stream limit).
//!
//! - **Protocol**: each connection's HTTP version is decided before hyper reads from it (a peek of
//!   the HTTP/2 preface on plain TCP, ALPN under TLS: [`crate::sniff`]) and served by hyper's HTTP/1
//!   or HTTP/2 connection alone, not by hyper-util's auto builder, whose preface read doubled every
//!   HTTP/1 connection's read buffer (memory per watch subscriber).
//! - **Connection cap**: a semaphore taken on accept, held by the connection's task. Each
//!   connection counts for an owner: its address until a request on it authenticates, then that
//!   client ([`ConnTag`]; the per-client cap is applied there, [`crate::limits`]). At the cap, a
//!   connection of the client holding the most is closed to make room ([`at_the_cap`]: its idle
//!   one, else its newest, busy or not), so neither idle sockets nor watch streams that are never
//!   read can lock others out (2,000 idle sockets leave `/healthz` answering; one client's streams
//!   at the cap lose one to each newcomer). Only when the newcomer's own client holds the most
//!   and has nothing idle is it refused, with a 503 `overloaded` JSON answer and an audit line
//!   when it was a mutating request. The process thus holds at most `max_connections` client
//!   descriptors, and the default cap is below its open-files limit.
//! - **Header timeout**: a new connection whose first bytes do not say its protocol within it (it
//!   sent nothing, or stalls inside the HTTP/2 preface) is closed; then hyper's HTTP/1
//!   `header_read_timeout` bounds each request's header.
//! - **Idle timeout**: a reaper closes connections with no request in flight for `idle_timeout`
//!   (HTTP/1 keep-alive and HTTP/2).
//! - **Body deadline**: every request body (but an empty one) must arrive whole within
//!   `body_timeout` of the request's head ([`crate::deadline`]): a body trickled a byte at a time
//!   holds its request no longer than that.
//! - **HTTP/2 streams**: at most `max_requests_per_client` per connection.
//! - **Shutdown**: on `stop`, accepting ends, every connection is shut down gracefully (in-flight
//!   requests finish, idle connections close) and [`serve_connections`] returns when all are gone.

use std::collections::HashMap;
use std::convert::Infallible;
use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::body::Body;
use axum::extract::ConnectInfo;
use axum::Router;
use http_body_util::BodyExt;
use hyper::body::Incoming;
use hyper::rt::bounds::Http2ServerConnExec;
use hyper::server::conn::{http1, http2};
use hyper::service::HttpService;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use tokio::io::AsyncWriteExt;
use tokio::sync::{oneshot, watch, Semaphore};
use tower::ServiceExt;
use tracing::debug;

use crate::limits::Limits;
use crate::sniff::{Negotiate, Protocol};

/// Connections open now (gauge).
pub const HTTP_CONNECTIONS: &str = "idalloc_http_connections";
/// The connection cap (`--max-connections`), so that alerts can compare the gauge with it.
pub const HTTP_MAX_CONNECTIONS: &str = "idalloc_http_max_connections";
/// Connections closed by the service to stay under its cap, or refused at it, by `reason`
/// (`evicted_idle`, `evicted_busy`, `refused`, `idle_timeout`).
pub const HTTP_CONNECTIONS_CLOSED: &str = "idalloc_http_connections_closed_total";

/// Whether a connection has a request in flight, and since when it has not.
struct Activity {
    busy: AtomicUsize,
    /// Milliseconds since the registry's start when `busy` last dropped to 0 (or it connected).
    idle_since: AtomicU64,
}

/// Marks a request in flight for as long as it lives (until the answer's body is sent).
struct Busy {
    activity: Arc<Activity>,
    clock: Instant,
}

impl Busy {
    fn new(activity: &Arc<Activity>, clock: Instant) -> Busy {
        activity.busy.fetch_add(1, Ordering::AcqRel);
        Busy { activity: activity.clone(), clock }
    }
}

impl Drop for Busy {
    fn drop(&mut self) {
        let now = self.clock.elapsed().as_millis() as u64;
        self.activity.idle_since.store(now, Ordering::Release);
        self.activity.busy.fetch_sub(1, Ordering::AcqRel);
    }
}

/// One open connection: its activity, the signal that closes it, and whom it counts for.
struct Entry {
    activity: Arc<Activity>,
    close: oneshot::Sender<()>,
    /// The client it counts for: its address until a request on it is authenticated, then the
    /// client that request names ([`ConnTag::claim`]).
    owner: Arc<str>,
}

/// The open connections by id, and how many each owner holds.
#[derive(Default)]
struct Table {
    conns: HashMap<u64, Entry>,
    held: HashMap<Arc<str>, usize>,
}

impl Table {
    fn remove(&mut self, id: u64) -> Option<Entry> {
        let e = self.conns.remove(&id)?;
        if let Some(n) = self.held.get_mut(&e.owner) {
            *n -= 1;
            if *n == 0 {
                self.held.remove(&e.owner);
            }
        }
        Some(e)
    }
}

/// The open connections, for eviction, the per-client cap and the idle reaper.
struct Registry {
    clock: Instant,
    next: AtomicU64,
    table: Mutex<Table>,
}

/// What to do with a new connection at the connection cap ([`at_the_cap`]).
#[derive(Debug, PartialEq, Eq)]
pub enum AtCap {
    /// Close this connection to make room.
    Evict(u64),
    /// Refuse the newcomer: its own client holds the most and has nothing idle to give up.
    Refuse,
}

/// One open connection as [`at_the_cap`] sees it.
#[derive(Debug, Clone)]
pub struct Held<'a> {
    pub id: u64,
    pub owner: &'a str,
    pub busy: bool,
    /// When it last became idle (or connected); smaller is older.
    pub idle_since: u64,
}

/// The victim at the connection cap: a connection of the client holding the most connections
/// (ties: the one whose idle connection is the oldest, then the smallest name), its idle-longest
/// connection if it has one idle, else its newest. A newcomer is never the victim of another
/// client's hoard: when its own client holds the most, only an idle connection of that client
/// makes room for it, and with none idle it is refused. So one client holding every slot with
/// watch streams it never reads loses one of them to each newcomer, and the newcomer (another
/// client, or a probe) is served.
pub fn at_the_cap(conns: &[Held<'_>], newcomer: &str) -> AtCap {
    let mut held: HashMap<&str, usize> = HashMap::new();
    for c in conns {
        *held.entry(c.owner).or_default() += 1;
    }
    let Some(&most) = held.values().max() else { return AtCap::Refuse };
    // The top holders' connections, best victim first: idle before busy, idle-longest first,
    // then the newest busy one.
    let victim = conns.iter().filter(|c| held.get(c.owner) == Some(&most)).min_by(|a, b| {
        let key = |c: &Held<'_>| {
            (c.busy, if c.busy { u64::MAX - c.id } else { c.idle_since }, c.owner.to_string())
        };
        key(a).cmp(&key(b))
    });
    let newcomer_holds = held.get(newcomer).copied().unwrap_or(0);
    match victim {
        Some(v) if v.busy && newcomer_holds >= most => {
            // The newcomer's own client holds the most (with others as many): an idle connection
            // of its own makes room, else it is refused.
            conns
                .iter()
                .filter(|c| c.owner == newcomer && !c.busy)
                .min_by_key(|c| c.idle_since)
                .map_or(AtCap::Refuse, |c| AtCap::Evict(c.id))
        }
        Some(v) => AtCap::Evict(v.id),
        None => AtCap::Refuse,
    }
}

impl Registry {
    fn lock(&self) -> std::sync::MutexGuard<'_, Table> {
        self.table.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn now_ms(&self) -> u64 {
        self.clock.elapsed().as_millis() as u64
    }

    fn insert(&self, activity: Arc<Activity>, close: oneshot::Sender<()>, owner: Arc<str>) -> u64 {
        let id = self.next.fetch_add(1, Ordering::Relaxed);
        let mut t = self.lock();
        *t.held.entry(owner.clone()).or_default() += 1;
        t.conns.insert(id, Entry { activity, close, owner });
        id
    }

    fn remove(&self, id: u64) {
        self.lock().remove(id);
    }

    /// Counts connection `id` for `owner` from now on; returns how many connections `owner`
    /// holds (this one included), or 0 if the connection is gone.
    fn claim(&self, id: u64, owner: &str) -> usize {
        let mut t = self.lock();
        let Some(e) = t.conns.get_mut(&id) else { return 0 };
        if &*e.owner != owner {
            let old = std::mem::replace(&mut e.owner, Arc::from(owner));
            if let Some(n) = t.held.get_mut(&old) {
                *n -= 1;
                if *n == 0 {
                    t.held.remove(&old);
                }
            }
            *t.held.entry(Arc::from(owner)).or_default() += 1;
        }
        t.held.get(owner).copied().unwrap_or(0)
    }

    /// Makes room for a newcomer from `newcomer` ([`at_the_cap`]): closes the victim and returns
    /// its owner, or `None` if the newcomer is refused.
    fn evict_for(&self, newcomer: &str) -> Option<(Arc<str>, bool)> {
        let mut t = self.lock();
        let decision = {
            let conns: Vec<Held<'_>> = t
                .conns
                .iter()
                .map(|(id, e)| Held {
                    id: *id,
                    owner: &e.owner,
                    busy: e.activity.busy.load(Ordering::Acquire) > 0,
                    idle_since: e.activity.idle_since.load(Ordering::Acquire),
                })
                .collect();
            at_the_cap(&conns, newcomer)
        };
        let AtCap::Evict(id) = decision else { return None };
        let e = t.remove(id)?;
        let busy = e.activity.busy.load(Ordering::Acquire) > 0;
        let _ = e.close.send(());
        Some((e.owner, busy))
    }

    /// Closes every connection idle for `timeout` or longer.
    fn reap(&self, timeout: Duration) -> usize {
        let now = self.now_ms();
        let limit = timeout.as_millis() as u64;
        let mut t = self.lock();
        let idle: Vec<u64> = t
            .conns
            .iter()
            .filter(|(_, e)| {
                let a = &e.activity;
                a.busy.load(Ordering::Acquire) == 0
                    && now.saturating_sub(a.idle_since.load(Ordering::Acquire)) >= limit
            })
            .map(|(id, _)| *id)
            .collect();
        for id in &idle {
            if let Some(e) = t.remove(*id) {
                let _ = e.close.send(());
            }
        }
        idle.len()
    }
}

/// The connection a request came on (in the request's extensions): lets the request limits
/// count it for the client the request authenticates as.
#[derive(Clone)]
pub struct ConnTag {
    registry: Arc<Registry>,
    id: u64,
}

impl ConnTag {
    /// Counts this connection for `owner` (a client, or an address); returns how many
    /// connections `owner` holds now, this one included.
    pub fn claim(&self, owner: &str) -> usize {
        self.registry.claim(self.id, owner)
    }
}

/// The owner a connection from `addr` counts for until a request on it names its client.
pub fn address_owner(addr: &SocketAddr) -> String {
    format!("address {}", addr.ip())
}

/// The answer to a connection over the cap when none could be closed: written raw (no request
/// was read), then the connection is closed.
fn overloaded_answer(max: usize) -> Vec<u8> {
    let body = serde_json::json!({
        "kind": "overloaded",
        "message": format!(
            "the service has {max} connections open, its limit (--max-connections), each with a \
             request in flight; retry later or on another instance"
        ),
    })
    .to_string();
    format!(
        "HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\ncontent-length: \
         {}\r\nretry-after: 1\r\nconnection: close\r\n\r\n{body}",
        body.len()
    )
    .into_bytes()
}

/// Answers a connection refused at the cap: reads its request head (at most 8 KiB within 1 s) to
/// audit a mutating request like any other refusal, then writes `answer` and closes.
async fn refuse<I>(mut io: I, addr: SocketAddr, answer: Vec<u8>)
where
    I: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
{
    use tokio::io::AsyncReadExt;
    let mut head = Vec::with_capacity(1024);
    let _ = tokio::time::timeout(Duration::from_secs(1), async {
        let mut buf = [0u8; 1024];
        while head.len() < 8192 && !head.windows(4).any(|w| w == b"\r\n\r\n") {
            match io.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(n) => head.extend_from_slice(&buf[..n]),
            }
        }
    })
    .await;
    crate::audit::refused_at_connection_cap(&head, &addr);
    let _ = tokio::time::timeout(Duration::from_secs(1), async {
        let _ = io.write_all(&answer).await;
        let _ = io.shutdown().await;
    })
    .await;
}

/// hyper's two connection builders, set up once from the limits. Each connection gets the one its
/// protocol needs (`sniff.rs`), not hyper-util's auto builder, which reads the HTTP/2 preface
/// itself and so doubles every HTTP/1 connection's read buffer (see the module docs there).
struct Builders {
    http1: http1::Builder,
    http2: http2::Builder<TokioExecutor>,
}

impl Builders {
    fn new(limits: &Limits) -> Builders {
        let mut h1 = http1::Builder::new();
        h1.timer(TokioTimer::new()).header_read_timeout(limits.header_timeout);
        let mut h2 = http2::Builder::new(TokioExecutor::new());
        h2.timer(TokioTimer::new()).max_concurrent_streams(
            u32::try_from(limits.max_requests_per_client).unwrap_or(u32::MAX),
        );
        if let Some(every) = limits.keepalive {
            h2.keep_alive_interval(every).keep_alive_timeout(crate::keepalive::ping_timeout(every));
        }
        Builders { http1: h1, http2: h2 }
    }
}

/// hyper's HTTP/1 and HTTP/2 connections alike: a future that serves the connection, and the
/// graceful shutdown each has as an inherent method.
trait Graceful: Future<Output = hyper::Result<()>> + Unpin {
    fn graceful_shutdown(self: Pin<&mut Self>);
}

impl<I, S, B> Graceful for http1::Connection<I, S>
where
    S: HttpService<Incoming, ResBody = B>,
    S::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
    I: hyper::rt::Read + hyper::rt::Write + Unpin,
    B: http_body::Body + 'static,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    fn graceful_shutdown(self: Pin<&mut Self>) {
        http1::Connection::graceful_shutdown(self)
    }
}

impl<I, S, B> Graceful for Pin<Box<http2::Connection<I, S, TokioExecutor>>>
where
    S: HttpService<Incoming, ResBody = B>,
    S::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
    I: hyper::rt::Read + hyper::rt::Write + Unpin,
    B: http_body::Body + 'static,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
    TokioExecutor: Http2ServerConnExec<S::Future, B>,
{
    fn graceful_shutdown(self: Pin<&mut Self>) {
        self.get_mut().as_mut().graceful_shutdown()
    }
}

/// Serves `conn` until it ends, `close` fires (evicted, or idle too long: dropping it closes the
/// socket) or `stop` turns true (in-flight requests finish, then it closes).
async fn drive<C: Graceful>(
    mut conn: C,
    addr: SocketAddr,
    close: oneshot::Receiver<()>,
    mut stop: watch::Receiver<bool>,
) {
    tokio::select! {
        r = &mut conn => {
            if let Err(e) = r {
                debug!(%addr, error = %e, "connection ended with an error");
            }
        }
        _ = close => {}
        _ = stopped(&mut stop) => {
            Pin::new(&mut conn).graceful_shutdown();
            let _ = conn.await;
        }
    }
}

/// Resolves once `stop` is true (or its sender is gone), holding no borrow of it after.
async fn stopped(stop: &mut watch::Receiver<bool>) {
    let _ = stop.wait_for(|s| *s).await;
}

/// Serves `app` on `listener` with `limits` until `stop` turns true, then shuts every connection
/// down gracefully and returns once all are closed (the caller bounds that wait).
pub async fn serve_connections<L>(
    mut listener: L,
    app: Router,
    limits: Limits,
    mut stop: watch::Receiver<bool>,
) where
    L: axum::serve::Listener<Addr = SocketAddr>,
    L::Io: Negotiate,
{
    let max = limits.max_connections.max(1);
    metrics::gauge!(HTTP_MAX_CONNECTIONS).set(max as f64);
    metrics::gauge!(HTTP_CONNECTIONS).set(0.0);
    // Exported from the start (at 0), so that alerts on them have a series to read.
    for reason in ["evicted_idle", "evicted_busy", "refused", "idle_timeout"] {
        metrics::counter!(HTTP_CONNECTIONS_CLOSED, "reason" => reason).absolute(0);
    }
    let permits = Arc::new(Semaphore::new(max));
    let registry = Arc::new(Registry {
        clock: Instant::now(),
        next: AtomicU64::new(0),
        table: Mutex::default(),
    });
    // Shared, not cloned into every connection's task: their settings are a few hundred bytes,
    // per connection (thousands of watch streams are thousands of connections).
    let builders = Arc::new(Builders::new(&limits));
    let reaper = {
        let registry = registry.clone();
        let idle = limits.idle_timeout;
        tokio::spawn(async move {
            let tick = (idle / 4).clamp(Duration::from_millis(100), Duration::from_secs(5));
            loop {
                tokio::time::sleep(tick).await;
                let n = registry.reap(idle);
                if n > 0 {
                    metrics::counter!(HTTP_CONNECTIONS_CLOSED, "reason" => "idle_timeout")
                        .increment(n as u64);
                }
            }
        })
    };
    loop {
        let (io, addr) = tokio::select! {
            a = listener.accept() => a,
            _ = stopped(&mut stop) => break,
        };
        let owner = address_owner(&addr);
        let permit = match permits.clone().try_acquire_owned() {
            Ok(p) => Some(p),
            Err(_) => match registry.evict_for(&owner) {
                Some((victim, busy)) => {
                    let reason = if busy { "evicted_busy" } else { "evicted_idle" };
                    metrics::counter!(HTTP_CONNECTIONS_CLOSED, "reason" => reason).increment(1);
                    debug!(%addr, %victim, busy, "at the connection cap: closed a connection of \
                        the client holding the most");
                    // The evicted connection's task ends at its next poll and frees its permit.
                    tokio::time::timeout(Duration::from_secs(1), permits.clone().acquire_owned())
                        .await
                        .ok()
                        .and_then(Result::ok)
                }
                None => None,
            },
        };
        let Some(permit) = permit else {
            metrics::counter!(HTTP_CONNECTIONS_CLOSED, "reason" => "refused").increment(1);
            debug!(%addr, max, "connection refused: at the connection cap, its own client holds \
                the most");
            let answer = overloaded_answer(max);
            tokio::spawn(refuse(io, addr, answer));
            continue;
        };
        let activity = Arc::new(Activity {
            busy: AtomicUsize::new(0),
            idle_since: AtomicU64::new(registry.now_ms()),
        });
        let (close_tx, close_rx) = oneshot::channel();
        let id = registry.insert(activity.clone(), close_tx, owner.into());
        let tag = ConnTag { registry: registry.clone(), id };
        let clock = registry.clock;
        let body_timeout = limits.body_timeout;
        let app = app.clone();
        let svc = hyper::service::service_fn(move |req: hyper::Request<hyper::body::Incoming>| {
            let busy = Busy::new(&activity, clock);
            // A request without a body keeps hyper's body: `DeadlineBody` does not forward
            // `is_end_stream`, and an empty body that looks unread closes the connection
            // (`unread.rs`) after every GET.
            let mut req = req.map(|b| {
                if http_body::Body::is_end_stream(&b) {
                    Body::new(b)
                } else {
                    Body::new(crate::deadline::DeadlineBody::new(b, body_timeout))
                }
            });
            req.extensions_mut().insert(ConnectInfo(addr));
            req.extensions_mut().insert(tag.clone());
            let app = app.clone();
            async move {
                let resp = match app.oneshot(req).await {
                    Ok(r) => r,
                    Err(never) => match never {},
                };
                // The connection is busy until the answer's body is sent (watch streams too).
                Ok::<_, Infallible>(resp.map(|b| {
                    Body::new(b.map_frame(move |f| {
                        let _ = &busy;
                        f
                    }))
                }))
            }
        });
        let builders = builders.clone();
        let registry = registry.clone();
        let mut stop = stop.clone();
        let header_timeout = limits.header_timeout;
        tokio::spawn(async move {
            let _permit = permit;
            metrics::gauge!(HTTP_CONNECTIONS).increment(1.0);
            let mut close_rx = close_rx;
            // Which protocol, before hyper reads a byte (`sniff.rs`). A client that says nothing,
            // or stalls inside the HTTP/2 preface, is closed after the header timeout; it holds
            // its permit meanwhile and can be evicted as an idle connection.
            let protocol = tokio::select! {
                p = tokio::time::timeout(header_timeout, io.protocol()) => match p {
                    Ok(Ok(p)) => p,
                    Ok(Err(e)) => {
                        debug!(%addr, error = %e, "connection failed before its first request");
                        None
                    }
                    Err(_) => {
                        debug!(%addr, "no request within the header timeout");
                        None
                    }
                },
                _ = &mut close_rx => None,
                _ = stopped(&mut stop) => None,
            };
            match protocol {
                None => {}
                Some(Protocol::Http1) => {
                    let conn = builders.http1.serve_connection(TokioIo::new(io), svc);
                    drive(conn, addr, close_rx, stop).await;
                }
                // Boxed: HTTP/2's connection state is larger than HTTP/1's, and inline it would
                // size every connection's task (HTTP/1 watch streams included) to it.
                Some(Protocol::Http2) => {
                    let conn = Box::pin(builders.http2.serve_connection(TokioIo::new(io), svc));
                    drive(conn, addr, close_rx, stop).await;
                }
            }
            registry.remove(id);
            metrics::gauge!(HTTP_CONNECTIONS).decrement(1.0);
        });
    }
    drop(listener);
    // Every connection task holds a permit: all are back when all connections are closed.
    let _ = permits.acquire_many(max as u32).await;
    reaper.abort();
}
