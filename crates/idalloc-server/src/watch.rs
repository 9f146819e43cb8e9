//! `GET /v1/pools/{pool}/watch`: a pool's binding changes as Server-Sent Events, from the pool's
//! shared feed ([`crate::fanout`]): no store watch per client.
//!
//! Without a start revision, the pool's bindings as of one revision R (the cache's, at a revision
//! boundary) are sent as `upsert` events, then `synced {revision: R, bindings}` with id R, then
//! every change after R. With `Last-Event-ID: M` (or `?from_revision=N`, meaning M = N-1) the
//! changes after M are sent, exactly, from the service's recent history; if that history no longer
//! reaches back to M, the answer is 410 `gone` with the current revision: re-list (watch without a
//! revision). Each revision's last event carries the revision as its SSE `id`, so `Last-Event-ID`
//! always names a revision the client has seen all of.
//!
//! Events: `upsert {id,key,revision}`, `delete {id,key,revision}` (a binding ended: tombstoned,
//! reclaimed or deleted), `synced {revision,bindings}` (after the initial bindings, and after the
//! service re-listed the pool), `spec {revision,spec}` (the pool was resized: the spec now in
//! force, as `GET /v1/pools/{pool}` shows it; it carries no `id`, and a stream resumed from
//! before the resize starts with it), and `error {kind,message,...}` before the stream ends: `lagged`
//! (this client fell more than the history behind; `revision` is the last revision it has all of:
//! resume with `Last-Event-ID` = it, or `from_revision` = `from_revision` of the event), `gone`
//! (the pool was deleted or re-created).
//!
//! A stream's resources go with its connection: hyper drops the body as soon as the client
//! cancels the stream (HTTP/2 `RST_STREAM`) or closes the connection, over HTTP/1.1 and HTTP/2,
//! also on an idle pool with nothing to send and when the client had stopped reading
//! (`tests/serve_protocols.rs` checks each). A comment line every 15 s keeps proxies from closing
//! an idle stream.

use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::extract::{Path, State};
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Extension;
use idalloc::store::GetRequest;
use serde::Deserialize;
use serde_json::json;

use crate::error::{param, ApiError, ApiQuery};
use crate::fanout::{join, sse, Hub, Tick};
use crate::limits::Who;
use crate::snapshot::Encoded;
use crate::AppState;

/// Open watch streams, by `pool`.
pub const WATCH_SUBSCRIBERS: &str = "idalloc_watch_subscribers";
/// Watch streams ended because their client fell behind the history, by `pool`.
pub const WATCH_LAGGED: &str = "idalloc_watch_lagged_total";

/// Groups a stream takes out of the ring at a time (one frame).
const BATCH: usize = 256;
/// How long a new stream waits for the pool's feed to reach the cache's revision.
const CATCH_UP: Duration = Duration::from_secs(5);

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WatchQuery {
    #[serde(default)]
    from_revision: Option<String>,
}

pub async fn watch(
    State(st): State<Arc<AppState>>,
    Path(name): Path<String>,
    ApiQuery(q): ApiQuery<WatchQuery>,
    who: Option<Extension<Who>>,
    client: Option<Extension<crate::auth::Client>>,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
    // Taken first and held by the stream: refused before any work when the client is at its cap
    // (`watches=` of its tokens-file line, else `--max-watches-per-client`).
    let slot = match who {
        Some(Extension(Who(who))) => {
            let own = client.as_ref().and_then(|Extension(c)| c.policy.watches);
            Some(WatchSlot::take(&st, who, own)?)
        }
        None => None,
    };
    let revisions = "a store revision: a whole number from 1";
    // The last revision the client has all of.
    let from_revision = q.from_revision.clone();
    let seen = match (q.from_revision, headers.get("last-event-id")) {
        (Some(r), _) => {
            let r: i64 = param("from_revision", &r, revisions)?;
            if r < 1 {
                return Err(ApiError::invalid(format!("invalid from_revision {r}: at least 1")));
            }
            Some(r - 1)
        }
        (None, Some(v)) => {
            let v = v.to_str().unwrap_or("(not text)");
            let m: i64 = param("Last-Event-ID", v.trim(), "a revision: a whole number from 0")?;
            if m < 0 {
                return Err(ApiError::invalid(format!("invalid Last-Event-ID {m}: at least 0")));
            }
            Some(m)
        }
        (None, None) => None,
    };
    let pool = st.pool(&name).await?;
    pool.wait_synced().await?;
    if let Some(m) = seen {
        // A revision the store has not reached yet is a client's mistake, not a wait: refused
        // with the current revision (else the stream would wait, silent, for a revision that
        // may never come).
        let read = GetRequest::prefix(st.layout.id_prefix(&name)).keys_only().with_limit(1);
        let current = st.store.get(read).await?.revision;
        if m > current {
            let asked = match &from_revision {
                Some(r) => format!("from_revision {r}"),
                None => format!("Last-Event-ID {m}"),
            };
            return Err(ApiError {
                revision: Some(current),
                ..ApiError::invalid(format!(
                    "invalid {asked}: after the store's current revision {current}; resume from \
                     a revision this service sent (an event's id, or a synced revision)"
                ))
            });
        }
    }
    let hub = st.hub(&pool);
    let (first, cursor, last_id) = match seen {
        Some(m) => {
            let current = caught_up(&hub, None).await?;
            let st = hub.lock();
            match st.ring.seq_after(m) {
                // A resize after `m` is sent first (again, if the stream's changes hold it too).
                Some(seq) => match &st.spec {
                    Some((r, chunk)) if *r > m => (chunk.clone(), seq, m),
                    _ => (Bytes::new(), seq, m),
                },
                None => {
                    let floor = st.ring.floor();
                    return Err(ApiError {
                        revision: Some(current),
                        ..ApiError::new(
                            StatusCode::GONE,
                            "gone",
                            format!(
                                "revision {m} is older than this service's watch history of pool \
                                 {name:?} (it holds the changes after revision {floor}; the \
                                 current revision is {current}): list the bindings again and \
                                 watch without a revision"
                            ),
                        )
                    });
                }
            }
        }
        None => {
            // Read-your-writes: the snapshot includes every binding the store holds now (the
            // cache follows the store's watch, so it can be a moment behind a write that just
            // returned).
            let newest = st.newest_change(&name).await?;
            caught_up(&hub, Some(newest)).await?;
            snapshot(&hub, &pool).await?
        }
    };
    let mut sub = Subscriber::new(st.clone(), hub, cursor, last_id, first);
    sub.slot = slot;
    let stream = futures::stream::unfold(sub, |mut s| async move {
        s.next().await.map(|b| (Ok::<_, Infallible>(b), s))
    });
    Ok((
        [
            (header::CONTENT_TYPE, "text/event-stream"),
            (header::CACHE_CONTROL, "no-cache"),
            (header::HeaderName::from_static("x-accel-buffering"), "no"),
        ],
        Body::from_stream(stream),
    )
        .into_response())
}

/// Waits until the hub has every change through `revision` (any boundary if `None`); returns the
/// hub's revision.
async fn caught_up(hub: &Hub, revision: Option<i64>) -> Result<i64, ApiError> {
    let wait = async {
        loop {
            // Registered before the check, so a move between the check and the wait wakes it.
            let moved = hub.moved.notified();
            tokio::pin!(moved);
            moved.as_mut().enable();
            {
                let st = hub.lock();
                if let Some(why) = &st.ended {
                    return Err(ApiError::unavailable(why.clone()));
                }
                if let Some(r) = st.revision {
                    if revision.is_none_or(|want| r >= want) {
                        return Ok(r);
                    }
                }
            }
            moved.await;
        }
    };
    tokio::time::timeout(CATCH_UP, wait).await.unwrap_or_else(|_| {
        Err(ApiError::unavailable(format!(
            "the pool's change feed did not catch up within {CATCH_UP:?}; retry"
        )))
    })
}

/// The initial bindings (at a revision boundary R of the cache) and `synced`, and the cursor of
/// the first change after R.
async fn snapshot(hub: &Hub, pool: &idalloc::Pool) -> Result<(Bytes, u64, i64), ApiError> {
    for _ in 0..100 {
        let moved = hub.moved.notified();
        tokio::pin!(moved);
        moved.as_mut().enable();
        // Shared by the streams that open at this revision: one encode, no copy.
        let Some(Encoded { revision: r, chunk }) = hub.snapshots.at(pool).await else {
            // A watch response is being applied: its end (a `Through`) is moments away, and the
            // hub says so when it has read it.
            if tokio::time::timeout(CATCH_UP, moved).await.is_err() {
                return Err(ApiError::unavailable(format!(
                    "the pool's change feed did not move within {CATCH_UP:?}; retry"
                )));
            }
            continue;
        };
        caught_up(hub, Some(r)).await?;
        let Some(seq) = hub.lock().ring.seq_after(r) else {
            // The ring moved past R meanwhile (a burst of changes): take a newer snapshot.
            continue;
        };
        return Ok((chunk, seq, r));
    }
    Err(ApiError::unavailable("the pool changes too fast to take a snapshot of it; retry"))
}

/// One open stream: a cursor into the hub's ring. Kept small, as there may be thousands: no
/// queue (each wake-up sends what it read as one frame), no timer and no shutdown signal of its
/// own (the hub wakes it for the keep-alive and on shutdown).
struct Subscriber {
    hub: Arc<Hub>,
    st: Arc<AppState>,
    cursor: u64,
    /// The revision of the last group sent (what the client's `Last-Event-ID` is).
    last_id: i64,
    /// The initial bindings, sent first.
    first: Option<Bytes>,
    tick: tokio::sync::watch::Receiver<Tick>,
    /// The hub's keep-alive count when this stream last sent something.
    keep_alive: u64,
    done: bool,
    /// The client's watch-stream slot, freed with the stream.
    slot: Option<WatchSlot>,
}

/// One of a client's watch streams (`--max-watches-per-client`), counted from the request until
/// its stream is dropped (the client went, or the stream ended).
pub(crate) struct WatchSlot {
    st: Arc<AppState>,
    who: Arc<str>,
}

impl WatchSlot {
    /// `own`: the client's `watches=` (tokens file), which replaces the flag's default.
    fn take(st: &Arc<AppState>, who: Arc<str>, own: Option<usize>) -> Result<WatchSlot, ApiError> {
        let max = own.unwrap_or(st.config.limits.max_watches_per_client);
        let setting = match own {
            Some(_) => format!("watches={max} in the tokens file"),
            None => format!("--max-watches-per-client {max}"),
        };
        let mut all = st.watchers.lock().unwrap_or_else(|p| p.into_inner());
        let open = all.entry(who.clone()).or_default();
        if *open >= max {
            let open = *open;
            return Err(ApiError::new(
                StatusCode::TOO_MANY_REQUESTS,
                "rate_limited",
                format!(
                    "{who} has {open} watch streams open, its limit ({setting}); close one \
                     first (one stream per pool is enough)"
                ),
            ));
        }
        *open += 1;
        Ok(WatchSlot { st: st.clone(), who })
    }
}

impl Drop for WatchSlot {
    fn drop(&mut self) {
        let mut all = self.st.watchers.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(n) = all.get_mut(&self.who) {
            *n = n.saturating_sub(1);
            if *n == 0 {
                all.remove(&self.who);
            }
        }
    }
}

impl Subscriber {
    fn new(st: Arc<AppState>, hub: Arc<Hub>, cursor: u64, last_id: i64, first: Bytes) -> Self {
        metrics::gauge!(WATCH_SUBSCRIBERS, "pool" => hub.pool.clone()).increment(1.0);
        // At zero from the first stream on, so that the series exists (and alerts on its rate
        // work) before any stream ever lags.
        metrics::counter!(WATCH_LAGGED, "pool" => hub.pool.clone()).increment(0);
        let tick = hub.subscribe();
        let keep_alive = tick.borrow().keep_alive;
        Subscriber {
            tick,
            hub,
            st,
            cursor,
            last_id,
            first: (!first.is_empty()).then_some(first),
            keep_alive,
            done: false,
            slot: None,
        }
    }

    /// The next chunk of the stream: everything up to the hub's last wake-up, as one frame;
    /// `None` ends it.
    async fn next(&mut self) -> Option<Bytes> {
        if let Some(b) = self.first.take() {
            return Some(b);
        }
        loop {
            if self.done || self.st.is_shutting_down() {
                return None;
            }
            // Marks the wake-up seen before reading, so a later one wakes us. Nothing is held
            // across the hub's lock below.
            let (horizon, batch, keep_alive, ended) = {
                let t = self.tick.borrow_and_update();
                let batch = t.batch.as_ref().filter(|b| b.from == self.cursor).cloned();
                (t.horizon, batch, t.keep_alive, t.ended)
            };
            if self.cursor < horizon {
                self.keep_alive = keep_alive;
                // Caught up at the previous wake-up: the frame every such stream shares.
                if let Some(b) = batch {
                    self.cursor = horizon;
                    self.last_id = b.revision;
                    return Some(b.chunk);
                }
                // Further behind (a new stream, or a slow reader): its own read of the ring.
                let want = usize::try_from(horizon - self.cursor).unwrap_or(BATCH).min(BATCH);
                let read = self.hub.lock().ring.read(self.cursor, want);
                match read {
                    Ok(groups) if !groups.is_empty() => {
                        self.cursor += groups.len() as u64;
                        self.last_id = groups.last().map_or(self.last_id, |g| g.revision);
                        return Some(join(groups.iter()));
                    }
                    Ok(_) => {}
                    Err(_) => {
                        self.done = true;
                        metrics::counter!(WATCH_LAGGED, "pool" => self.hub.pool.clone())
                            .increment(1);
                        let r = self.last_id;
                        let why = format!(
                            "this stream fell behind the service's watch history and was ended; \
                             resume with Last-Event-ID: {r} (or from_revision={})",
                            r + 1
                        );
                        return Some(error_event("lagged", &why, Some(r)));
                    }
                }
            }
            if ended {
                self.done = true;
                let why = self.hub.lock().ended.clone().unwrap_or_default();
                return Some(error_event("gone", &why, None));
            }
            if keep_alive != self.keep_alive {
                self.keep_alive = keep_alive;
                return Some(Bytes::from_static(b": keep-alive\n\n"));
            }
            if self.tick.changed().await.is_err() {
                self.done = true;
            }
        }
    }
}

impl Drop for Subscriber {
    fn drop(&mut self) {
        // The client's slot first: once the gauge shows the stream gone, its slot is free too.
        drop(self.slot.take());
        metrics::gauge!(WATCH_SUBSCRIBERS, "pool" => self.hub.pool.clone()).decrement(1.0);
    }
}

fn error_event(kind: &str, message: &str, revision: Option<i64>) -> Bytes {
    let data = match revision {
        Some(r) => json!({"kind": kind, "message": message, "revision": r, "from_revision": r + 1}),
        None => json!({"kind": kind, "message": message}),
    };
    Bytes::from(sse("error", None, &data))
}
