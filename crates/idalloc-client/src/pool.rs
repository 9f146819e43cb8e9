//! [`Pool`]: the library's pool handle over HTTP. Lookups answer from the local view fed by the
//! service's watch (no request); writes go to the service.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use idalloc::{Acquired, Binding, Error, Event, PoolSpec, Released};
use reqwest::Method;
use serde::de::DeserializeOwned;
use serde_json::Value;
use tokio::sync::broadcast;

use crate::api::{self, keys_body, Keys, Owner};
use crate::client::Shared;
use crate::errors::{self, Context};
use crate::transport::{encode_segment, Answer};
use crate::watch::Feed;
use idalloc_wire::errors::kind;

/// What every handle on one pool of one client shares: the watch-fed view and the counts of the
/// keys the client's own session holds.
pub(crate) struct PoolShared {
    pub spec: PoolSpec,
    pub feed: Arc<Feed>,
    /// Key → (references counted here, ID) of the client's own session ([`Pool::acquire`]).
    pub held: Mutex<HashMap<String, Arc<tokio::sync::Mutex<Held>>>>,
    /// The transport, until the pool's watch task is started ([`PoolShared::follow`]).
    pub unstarted: Mutex<Option<Arc<crate::transport::Transport>>>,
}

impl PoolShared {
    /// Starts the pool's watch task, once (at open, or at the view's first use with
    /// `ClientOptions::lazy_view`).
    pub(crate) fn follow(&self) {
        let t = self.unstarted.lock().unwrap_or_else(|p| p.into_inner()).take();
        if let Some(t) = t {
            let feed = Arc::downgrade(&self.feed);
            tokio::spawn(crate::watch::follow(t, self.spec.name().to_string(), feed));
        }
    }
}

/// One key held by the client's own session.
#[derive(Default, Debug)]
pub(crate) struct Held {
    pub count: u64,
    pub id: u64,
    /// The session the reference was made on (a replaced session must make it again).
    pub session: u64,
}

/// A handle on one pool of the service. Cheap to clone.
#[derive(Clone)]
pub struct Pool {
    pub(crate) client: Arc<Shared>,
    pub(crate) spec: Arc<PoolSpec>,
    pub(crate) shared: Arc<PoolShared>,
    /// `/v1/pools/<name>`.
    base: Arc<str>,
}

impl std::fmt::Debug for Pool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Pool").field("spec", &self.spec).finish()
    }
}

/// The events of one pool, as the library's [`idalloc::Events`] gives them.
pub struct Events {
    rx: broadcast::Receiver<Event>,
}

impl Events {
    /// The next event; `None` once the client is gone. A subscriber that fell more than
    /// `event_buffer` events behind receives [`Event::Lagged`] with how many it missed (re-read
    /// [`Pool::snapshot`] to catch up).
    pub async fn recv(&mut self) -> Option<Event> {
        match self.rx.recv().await {
            Ok(e) => Some(e),
            Err(broadcast::error::RecvError::Lagged(missed)) => Some(Event::Lagged { missed }),
            Err(broadcast::error::RecvError::Closed) => None,
        }
    }
}

impl Pool {
    pub(crate) fn new(client: Arc<Shared>, spec: PoolSpec, shared: Arc<PoolShared>) -> Pool {
        let base = format!("/v1/pools/{}", encode_segment(spec.name(), false)).into();
        Pool { client, spec: Arc::new(spec), shared, base }
    }

    /// The pool's spec.
    pub fn spec(&self) -> &PoolSpec {
        &self.spec
    }

    fn cx(&self) -> Context<'_> {
        Context { pool: Some(self.spec.name()), spec: Some(&self.spec) }
    }

    /// `POST /v1/pools/<pool>/<op>` with `body`.
    pub(crate) async fn post<T: DeserializeOwned>(
        &self,
        op: &str,
        body: &Value,
    ) -> idalloc::Result<T> {
        let path = format!("{}/{op}", self.base);
        let what = format!("{op} in pool {:?}", self.spec.name());
        self.client.t.expect(Method::POST, &path, Some(body), &what, &self.cx()).await
    }

    /// The ID of `key`, with a reference of this client's own session (opened on the first call,
    /// kept alive in the background, failing over between the endpoints). Refcounted like the
    /// library's: each acquire needs one release. One request for the first acquire of a key,
    /// none for the next ones.
    pub async fn acquire(&self, key: &str) -> idalloc::Result<Acquired> {
        idalloc::pool::validate_key(key)?;
        let slot = {
            let mut held = self.shared.held.lock().unwrap_or_else(|p| p.into_inner());
            held.entry(key.to_string()).or_default().clone()
        };
        let mut h = slot.lock().await;
        let (session, generation) = self.client.own_session().await?;
        if h.count > 0 && h.session == generation {
            h.count += 1;
            return Ok(Acquired { id: h.id, new: false });
        }
        let a = session.acquire(self, key).await?;
        h.count += 1;
        h.id = a.id;
        h.session = generation;
        Ok(a)
    }

    /// Drops one reference taken by [`Pool::acquire`]; the last one releases the key at the
    /// service. `held == false` if this client did not hold it.
    pub async fn release(&self, key: &str) -> idalloc::Result<Released> {
        idalloc::pool::validate_key(key)?;
        let slot = {
            let held = self.shared.held.lock().unwrap_or_else(|p| p.into_inner());
            held.get(key).cloned()
        };
        let Some(slot) = slot else { return Ok(Released { held: false, reclaimed: false }) };
        let mut h = slot.lock().await;
        if h.count == 0 {
            return Ok(Released { held: false, reclaimed: false });
        }
        if h.count > 1 {
            h.count -= 1;
            return Ok(Released { held: true, reclaimed: false });
        }
        let (session, _) = self.client.own_session().await?;
        let r = session.release(self, key).await?;
        h.count = 0;
        drop(h);
        let mut held = self.shared.held.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(s) = held.get(key) {
            if Arc::strong_count(s) <= 2 && s.try_lock().is_ok_and(|h| h.count == 0) {
                held.remove(key);
            }
        }
        Ok(Released { held: true, reclaimed: r.reclaimed })
    }

    /// References again, on the client's own session of generation `generation`, every key held
    /// on an older one (after that one was lost: DESIGN §7, as the library re-references its held
    /// keys on a new lease). A key whose ID changed meanwhile (the old binding was reclaimed and
    /// the key rebound) is reported as [`Event::Conflict`]. Failures are left to the key's next
    /// [`Pool::acquire`], which re-references a key of an older generation too.
    pub(crate) async fn rereference(&self, session: &crate::Session, generation: u64) {
        let slots: Vec<(String, Arc<tokio::sync::Mutex<Held>>)> = {
            let held = self.shared.held.lock().unwrap_or_else(|p| p.into_inner());
            held.iter().map(|(k, s)| (k.clone(), s.clone())).collect()
        };
        for (key, slot) in slots {
            let mut h = slot.lock().await;
            if h.count == 0 || h.session >= generation {
                continue;
            }
            match session.acquire(self, &key).await {
                Ok(a) => {
                    if a.id != h.id {
                        let e = Event::Conflict { key: key.clone(), old_id: h.id, new_id: a.id };
                        let _ = self.shared.feed.events.send(e);
                    }
                    h.id = a.id;
                    h.session = generation;
                }
                Err(e) => {
                    tracing::warn!(key, error = %e, "re-referencing a held key failed; its next acquire retries")
                }
            }
        }
    }

    /// Keys this client's own session holds, with their IDs and counts.
    pub fn held(&self) -> Vec<(String, u64, u64)> {
        let held = self.shared.held.lock().unwrap_or_else(|p| p.into_inner());
        let mut v: Vec<_> = held
            .iter()
            .filter_map(|(k, s)| {
                s.try_lock().ok().filter(|h| h.count > 0).map(|h| (k.clone(), h.id, h.count))
            })
            .collect();
        v.sort();
        v
    }

    /// The ID of `key` with a durable reference of `holder` (stays until that holder releases it).
    /// Idempotent per holder.
    pub async fn acquire_durable(&self, key: &str, holder: &str) -> idalloc::Result<Acquired> {
        idalloc::pool::validate_key(key)?;
        idalloc::pool::validate_durable_holder(holder)?;
        let a: api::Acquired =
            self.post("acquire", &keys_body(Keys::One(key), Owner::Holder(holder))).await?;
        Ok(Acquired { id: a.id, new: a.new })
    }

    /// [`Pool::acquire_durable`] with a preferred ID (the service's `hint`): `id` if it is free
    /// (not bound, reserved or in its reuse delay) or already the key's, else the usual pick; as
    /// the library's `acquire_durable_with_hint`. Whether it was granted is `result.id == id`.
    pub async fn acquire_durable_with_hint(
        &self,
        key: &str,
        holder: &str,
        id: u64,
    ) -> idalloc::Result<Acquired> {
        idalloc::pool::validate_key(key)?;
        idalloc::pool::validate_durable_holder(holder)?;
        let mut body = keys_body(Keys::One(key), Owner::Holder(holder));
        body["hint"] = serde_json::json!(id);
        let a: api::Acquired = self.post("acquire", &body).await?;
        Ok(Acquired { id: a.id, new: a.new })
    }

    /// [`Pool::acquire_durable`] of several keys (batched by the service, 1000 per request).
    pub async fn acquire_many_durable(
        &self,
        keys: &[String],
        holder: &str,
    ) -> idalloc::Result<Vec<Acquired>> {
        for k in keys {
            idalloc::pool::validate_key(k)?;
        }
        idalloc::pool::validate_durable_holder(holder)?;
        let mut out = Vec::with_capacity(keys.len());
        for chunk in keys.chunks(api::MAX_KEYS_PER_REQUEST) {
            let r: api::Results<api::Acquired> =
                self.post("acquire", &keys_body(Keys::Many(chunk), Owner::Holder(holder))).await?;
            out.extend(r.results.into_iter().map(|a| Acquired { id: a.id, new: a.new }));
        }
        Ok(out)
    }

    /// Removes `holder`'s durable reference to `key`.
    pub async fn release_durable(&self, key: &str, holder: &str) -> idalloc::Result<Released> {
        idalloc::pool::validate_key(key)?;
        idalloc::pool::validate_durable_holder(holder)?;
        let r: api::Released =
            self.post("release", &keys_body(Keys::One(key), Owner::Holder(holder))).await?;
        Ok(Released { held: r.held, reclaimed: r.reclaimed })
    }

    /// [`Pool::release_durable`] of several keys (batched by the service, 1000 per request): one
    /// result per key, in order. Releasing what `holder` does not hold is `held: false`, not an
    /// error.
    pub async fn release_many_durable(
        &self,
        keys: &[String],
        holder: &str,
    ) -> idalloc::Result<Vec<Released>> {
        for k in keys {
            idalloc::pool::validate_key(k)?;
        }
        idalloc::pool::validate_durable_holder(holder)?;
        let mut out = Vec::with_capacity(keys.len());
        for chunk in keys.chunks(api::MAX_KEYS_PER_REQUEST) {
            let r: api::Results<api::Released> =
                self.post("release", &keys_body(Keys::Many(chunk), Owner::Holder(holder))).await?;
            out.extend(
                r.results.into_iter().map(|r| Released { held: r.held, reclaimed: r.reclaimed }),
            );
        }
        Ok(out)
    }

    /// The ID of `key` from the local view (no request): `None` if unbound, or not seen yet
    /// (see [`Pool::wait_synced`]).
    pub fn get(&self, key: &str) -> Option<u64> {
        self.shared.follow();
        self.shared.feed.view().get(key)
    }

    /// The key bound to `id`, from the local view.
    pub fn key_of(&self, id: u64) -> Option<String> {
        self.shared.follow();
        self.shared.feed.view().key_of(id)
    }

    /// Every binding in the local view, sorted by ID.
    pub fn snapshot(&self) -> Vec<(u64, String)> {
        self.shared.follow();
        self.shared.feed.view().snapshot()
    }

    /// The ID of `key` read from the store by the service (one request).
    pub async fn get_consistent(&self, key: &str) -> idalloc::Result<Option<u64>> {
        idalloc::pool::validate_key(key)?;
        let path = format!("{}/keys/{}?consistent=true", self.base, encode_segment(key, true));
        Ok(self.lookup::<api::KeyAnswer>(&path).await?.map(|a| a.id))
    }

    /// The key bound to `id`, read from the store by the service (one request).
    pub async fn key_of_consistent(&self, id: u64) -> idalloc::Result<Option<String>> {
        let path = format!("{}/ids/{id}?consistent=true", self.base);
        Ok(self.lookup::<api::IdAnswer>(&path).await?.map(|a| a.key))
    }

    async fn lookup<T: DeserializeOwned>(&self, path: &str) -> idalloc::Result<Option<T>> {
        match self.client.t.call::<T>(Method::GET, path, None, "a lookup").await? {
            Answer::Ok(t) => Ok(Some(t)),
            Answer::Refused { body: Some(b), .. } if b.kind == kind::NOT_FOUND => Ok(None),
            Answer::Refused { status, body } => Err(errors::from_answer(status, body, &self.cx())),
        }
    }

    /// Every binding with its holders, from the service's paged listing (`GET …/bindings`, 1000
    /// per page; the pages are read one after the other, not at one revision).
    pub async fn list(&self) -> idalloc::Result<Vec<Binding>> {
        let mut out = Vec::new();
        let mut after: Option<u64> = None;
        loop {
            let (page, next) = self.list_page(after, 1000).await?;
            out.extend(page);
            match next {
                Some(n) if Some(n) != after => after = Some(n),
                _ => return Ok(out),
            }
        }
    }

    /// One page of the service's listing (`GET …/bindings?limit=…&after=…`): up to `limit`
    /// bindings with an ID above `after`, in ID order, and the cursor of the next page (`None`
    /// after the last one). The service accepts a `limit` from 1 to 10000 and refuses any other
    /// as invalid input.
    pub async fn list_page(
        &self,
        after: Option<u64>,
        limit: usize,
    ) -> idalloc::Result<(Vec<Binding>, Option<u64>)> {
        let path = match after {
            Some(a) => format!("{}/bindings?limit={limit}&after={a}", self.base),
            None => format!("{}/bindings?limit={limit}", self.base),
        };
        let page: api::BindingsPage =
            self.client.t.expect(Method::GET, &path, None, "a listing", &self.cx()).await?;
        let bindings = page
            .bindings
            .into_iter()
            .map(|b| Binding { id: b.id, key: b.key, holders: b.holders })
            .collect();
        Ok((bindings, page.next_after))
    }

    /// The pool's changes as they reach the local view. Subscribe before the first listing
    /// completes to see it as `Upsert`s then `Synced`.
    pub fn events(&self) -> Events {
        self.shared.follow();
        Events { rx: self.shared.feed.events.subscribe() }
    }

    /// Waits until the local view holds the whole pool (its first listing is complete).
    pub async fn wait_synced(&self) -> idalloc::Result<()> {
        self.shared.follow();
        let mut rx = self.shared.feed.synced.subscribe();
        rx.wait_for(|s| *s).await.map(|_| ()).map_err(|_| Error::Unavailable {
            reason: "the client's watch of the pool stopped".into(),
            retryable: false,
            source: None,
        })
    }
}
