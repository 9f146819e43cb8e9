//! `GET /v1/pools/{pool}/watch`: a pool's binding changes as Server-Sent Events.
//!
//! Same order as the library's cache (DESIGN §6): without a start revision, the pool is listed at
//! one revision R and every binding is sent as an `upsert`, then `synced` (with R), then live
//! changes from R+1. With `from_revision=N` (or a `Last-Event-ID: M` header, meaning N = M+1) the
//! store's history from N is replayed, then live changes follow: a client that saw revision M
//! resumes without gaps or repeats. Each change carries its revision as the SSE `id`.
//!
//! Events: `upsert {id,key,revision}`, `delete {id,key|null,revision}` (a tombstone or a deleted
//! ID record; the key is null when the stream never saw the binding), `synced {revision,bindings}`,
//! and `error {kind,message}` before the stream ends (`compacted`: the start revision is gone,
//! watch again without one; `unavailable`: the store broke the stream, resume from the last id).

use std::collections::{HashMap, HashSet};
use std::convert::Infallible;
use std::sync::Arc;

use axum::extract::{Path, State};
use axum::http::HeaderMap;
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use futures::channel::mpsc;
use futures::{SinkExt, StreamExt};
use idalloc::layout::IdRecord;
use idalloc::store::{list_all, GetRequest, KeyRange, StoreError, WatchEvent, WatchMessage};
use serde::Deserialize;
use serde_json::json;

use crate::error::{param, ApiError, ApiQuery};
use crate::AppState;

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WatchQuery {
    #[serde(default)]
    from_revision: Option<String>,
}

fn event(name: &str, id: Option<i64>, data: serde_json::Value) -> Event {
    let e = Event::default().event(name).data(data.to_string());
    match id {
        Some(r) => e.id(r.to_string()),
        None => e,
    }
}

pub async fn watch(
    State(st): State<Arc<AppState>>,
    Path(name): Path<String>,
    ApiQuery(q): ApiQuery<WatchQuery>,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
    let revisions = "a store revision: a whole number from 1";
    let from = match (q.from_revision, headers.get("last-event-id")) {
        (Some(r), _) => Some(param::<i64>("from_revision", &r, revisions)?),
        (None, Some(v)) => {
            let last: i64 =
                v.to_str().ok().and_then(|s| s.trim().parse().ok()).ok_or_else(|| {
                    ApiError::invalid("invalid Last-Event-ID header: a revision number")
                })?;
            Some(last + 1)
        }
        (None, None) => None,
    };
    if let Some(r) = from {
        if r < 1 {
            return Err(ApiError::invalid(format!("invalid from_revision {r}: at least 1")));
        }
    }
    // Opens the pool (404 if it does not exist) before the stream starts.
    st.pool(&name).await?;
    let (tx, rx) = mpsc::channel::<Event>(256);
    tokio::spawn(produce(st, name, from, tx));
    Ok(Sse::new(rx.map(Ok::<_, Infallible>)).keep_alive(KeepAlive::default()).into_response())
}

/// Feeds the stream until the client goes away, the store breaks it, or shutdown begins.
async fn produce(st: Arc<AppState>, pool: String, from: Option<i64>, mut tx: mpsc::Sender<Event>) {
    let mut stop = st.stop_signal();
    let id_prefix = st.layout.id_prefix(&pool);
    let mut keys: HashMap<u64, String> = HashMap::new();
    // IDs whose binding ended as a tombstone: the tombstone's later expiry is not another delete.
    let mut tombstoned: HashSet<u64> = HashSet::new();
    let start = match from {
        Some(r) => r,
        None => {
            let range = KeyRange::prefix(id_prefix.clone());
            let (kvs, rev) = match list_all(&*st.store, &range, 1000).await {
                Ok(x) => x,
                Err(e) => {
                    let _ = tx.send(error_event("unavailable", &e.to_string())).await;
                    return;
                }
            };
            for kv in &kvs {
                let Some(id) = st.layout.parse_id_key(&pool, &kv.key) else { continue };
                if let Some(IdRecord::Bound(key)) = IdRecord::decode(&kv.value) {
                    let e = event(
                        "upsert",
                        None,
                        json!({"id": id, "key": key, "revision": kv.mod_revision}),
                    );
                    keys.insert(id, key);
                    if tx.send(e).await.is_err() {
                        return;
                    }
                }
            }
            let synced =
                event("synced", Some(rev), json!({"revision": rev, "bindings": keys.len()}));
            if tx.send(synced).await.is_err() {
                return;
            }
            rev + 1
        }
    };
    let mut stream = match st.store.watch(KeyRange::prefix(id_prefix), start).await {
        Ok(s) => s,
        Err(StoreError::Compacted { compact_revision, .. }) => {
            let _ = tx.send(compacted(start, compact_revision)).await;
            return;
        }
        Err(e) => {
            let _ = tx.send(error_event("unavailable", &e.to_string())).await;
            return;
        }
    };
    loop {
        let msg = tokio::select! {
            m = stream.next() => m,
            _ = stop.wait_for(|s| *s) => return,
        };
        let events = match msg {
            Some(Ok(WatchMessage::Events(evs))) => evs,
            Some(Ok(WatchMessage::Compacted { compact_revision })) => {
                let _ = tx.send(compacted(start, compact_revision)).await;
                return;
            }
            Some(Err(e)) => {
                let _ = tx.send(error_event("unavailable", &e.to_string())).await;
                return;
            }
            None => return,
        };
        for ev in events {
            let kv = ev.kv();
            let Some(id) = st.layout.parse_id_key(&pool, &kv.key) else { continue };
            let rev = kv.mod_revision;
            let e = match (&ev, IdRecord::decode(&kv.value)) {
                (WatchEvent::Put(_), Some(IdRecord::Bound(key))) => {
                    keys.insert(id, key.clone());
                    event("upsert", Some(rev), json!({"id": id, "key": key, "revision": rev}))
                }
                (WatchEvent::Put(_), Some(IdRecord::Tombstone(key))) => {
                    keys.remove(&id);
                    tombstoned.insert(id);
                    event("delete", Some(rev), json!({"id": id, "key": key, "revision": rev}))
                }
                (WatchEvent::Delete(_), _) if tombstoned.remove(&id) => continue,
                (WatchEvent::Delete(_), _) => {
                    // A stream resumed from a revision may not have seen the binding: the key is
                    // the record's value just before the delete (null if compacted away).
                    let key = match keys.remove(&id) {
                        Some(k) => Some(k),
                        None => key_before(&st, &kv.key, rev).await,
                    };
                    event("delete", Some(rev), json!({"id": id, "key": key, "revision": rev}))
                }
                (WatchEvent::Put(_), None) => continue,
            };
            if tx.send(e).await.is_err() {
                return;
            }
        }
    }
}

/// The key an ID record held just before revision `rev`.
async fn key_before(st: &AppState, record: &[u8], rev: i64) -> Option<String> {
    let req = GetRequest::key(record.to_vec()).at_revision(rev - 1);
    let resp = st.store.get(req).await.ok()?;
    match IdRecord::decode(&resp.kvs.first()?.value)? {
        IdRecord::Bound(k) => Some(k),
        IdRecord::Tombstone(_) => None,
    }
}

fn error_event(kind: &str, message: &str) -> Event {
    event("error", None, json!({"kind": kind, "message": message}))
}

fn compacted(start: i64, compact_revision: i64) -> Event {
    error_event(
        "compacted",
        &format!(
            "revision {start} is compacted (oldest available: {compact_revision}); watch again without from_revision"
        ),
    )
}
