//! A new watch stream's initial bindings, encoded once per cache revision and shared by every
//! stream that opens at that revision.
//!
//! Each new stream used to copy the pool out of the cache and encode it as Server-Sent Events
//! for itself: 1,000 agents opening on a pool of 10,000 bindings were 1,000 copies and encodes of
//! about 600 KB each (600 MB built, the service's CPU spent on JSON). Streams that open at the
//! same revision send the same bytes, so the last encode is kept with its revision and handed out
//! as a shared [`Bytes`] (a reference count, no copy). It is replaced when a stream opens at a
//! newer revision, and dropped by [`Snapshots::drop_unused`] once no stream holds it any more, so
//! a quiet pool does not keep a copy of itself in the service.

use axum::body::Bytes;
use serde_json::json;

use crate::fanout::sse;

/// The initial bindings at one revision, as the stream sends them.
#[derive(Clone, Debug)]
pub struct Encoded {
    pub revision: i64,
    /// Every binding as an `upsert` event, then `synced` with the revision as its id.
    pub chunk: Bytes,
}

/// The last encode of one pool's snapshot.
#[derive(Default)]
pub struct Snapshots {
    last: tokio::sync::Mutex<Option<Encoded>>,
}

impl Snapshots {
    /// The pool's bindings at its cache's current revision, encoded: the last encode if it is at
    /// that revision, else a new one (which replaces it). `None` while the cache is not at a
    /// revision boundary (see [`idalloc::Pool::snapshot_at`]). Streams that ask at once wait for
    /// one encode instead of each making its own.
    pub async fn at(&self, pool: &idalloc::Pool) -> Option<Encoded> {
        let mut last = self.last.lock().await;
        let now = pool.revision_at()?;
        if let Some(e) = last.as_ref().filter(|e| e.revision == now) {
            return Some(e.clone());
        }
        let (bindings, revision) = pool.snapshot_at()?;
        let e = Encoded { revision, chunk: encode(&bindings, revision) };
        *last = Some(e.clone());
        Some(e)
    }

    /// Drops the last encode if nothing but this holds it (every stream that took it has sent
    /// it); skipped if an encode is under way.
    pub fn drop_unused(&self) {
        if let Ok(mut last) = self.last.try_lock() {
            if last.as_ref().is_some_and(|e| e.chunk.is_unique()) {
                *last = None;
            }
        }
    }

    /// Whether an encode is kept (for tests).
    pub fn is_kept(&self) -> bool {
        self.last.try_lock().map(|l| l.is_some()).unwrap_or(true)
    }
}

/// `bindings` at `revision` as `upsert` events and the closing `synced` (id: `revision`).
pub fn encode(bindings: &[(u64, String)], revision: i64) -> Bytes {
    let mut out = String::with_capacity(bindings.len() * 64 + 64);
    for (id, key) in bindings {
        out.push_str(&sse("upsert", None, &json!({"id": id, "key": key, "revision": revision})));
    }
    out.push_str(&sse(
        "synced",
        Some(revision),
        &json!({"revision": revision, "bindings": bindings.len()}),
    ));
    Bytes::from(out)
}
