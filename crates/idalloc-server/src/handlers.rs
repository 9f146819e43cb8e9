//! The `/v1` handlers: each one parses, calls the library, and shapes the answer. No allocator
//! logic lives here.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Instant;

use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Extension;
use axum::Json;
use idalloc::store::{GetRequest, KeyRange, OpResponse, TxnOp, TxnRequest};
use idalloc::{ClientSession, Pool};
use serde::Deserialize;
use serde_json::json;

use crate::api::{
    count, AcquireBody, Acquired, BindingBody, Deleted, Ended, IdAnswer, Keepalive, KeyAnswer,
    PoolInfo, PoolSpecBody, Pools, Reclaimed, Released, ResizeBody, Results, SessionBody,
    SessionInfo, SessionSummary, Sessions, SpecBody, Swept,
};
use crate::auth::Client;
use crate::error::{param, ApiError, ApiJson, ApiQuery};
use crate::AppState;

type ApiResult<T = Response> = Result<T, ApiError>;

/// Most keys one request may acquire or release (bounds the work of one request).
pub const MAX_KEYS_PER_REQUEST: usize = idalloc_wire::MAX_KEYS_PER_REQUEST;

pub async fn list_pools(State(st): State<Arc<AppState>>, client: Caller) -> ApiResult {
    let pools = st.alloc.list_pools().await?;
    // A client sees the pools it may read (its grants in the tokens file).
    let visible = |name: &str| caller(&client).is_none_or(|c| c.policy.can_read(name));
    let pools: Vec<PoolSpecBody> =
        pools.iter().filter(|p| visible(p.name())).map(PoolSpecBody::from_spec).collect();
    Ok(Json(Pools { pools }).into_response())
}

pub async fn create_pool(
    State(st): State<Arc<AppState>>,
    client: Caller,
    note: Option<Extension<crate::audit::Note>>,
    ApiJson(body): ApiJson<PoolSpecBody>,
) -> ApiResult {
    let spec = body.to_spec()?;
    if let Some(Extension(n)) = &note {
        n.pool(spec.name());
    }
    if let Some(c) = caller(&client) {
        let access = crate::grants::PoolAccess::Write;
        c.policy
            .check(&c.name, spec.name(), access)
            .map_err(|why| ApiError::new(StatusCode::FORBIDDEN, "forbidden", why))?;
    }
    // `pools=`: a slot in the store for a pool this client creates ([`crate::pool_slots`]).
    let limit = caller(&client).and_then(|c| Some((c.name.clone(), c.policy.pools?)));
    let claimed = match &limit {
        Some((name, limit)) => {
            let store = &*st.store;
            match crate::pool_slots::claim(store, &st.layout, name, *limit, spec.name()).await? {
                crate::pool_slots::Claim::Took(c) => Some(c),
                crate::pool_slots::Claim::Nothing => None,
                crate::pool_slots::Claim::Over { count, limit, pools } => {
                    if let Some(Extension(n)) = &note {
                        n.quota(format!("pools={limit} held={count}"));
                    }
                    return Err(crate::pool_slots::over(name, count, limit, &pools));
                }
            }
        }
        None => None,
    };
    let pool = match st.alloc.ensure_pool(&spec).await {
        Ok(p) => p,
        Err(e) => {
            // Only a definite failure gives the slot back (a timeout's txn may still apply).
            if let Some(c) = &claimed {
                if !matches!(e, idalloc::Error::Unavailable { .. }) {
                    crate::pool_slots::give_back(&*st.store, c).await;
                }
            }
            return Err(e.into());
        }
    };
    st.remember(&pool);
    Ok((StatusCode::OK, Json(PoolSpecBody::from_spec(&pool.spec()))).into_response())
}

pub async fn show_pool(State(st): State<Arc<AppState>>, Path(name): Path<String>) -> ApiResult {
    let pool = st.pool(&name).await?;
    let spec = pool.spec();
    let layout = &st.layout;
    let count =
        |prefix: Vec<u8>| TxnOp::get(GetRequest::new(KeyRange::prefix(prefix)).count_only());
    // Both counts in one txn, so they are of one revision.
    let resp = st
        .store
        .txn(
            TxnRequest::new()
                .and_then([count(layout.key_prefix(&name)), count(layout.id_prefix(&name))]),
        )
        .await?;
    let n = |i: usize| match resp.responses.get(i) {
        Some(OpResponse::Get(g)) => u64::try_from(g.count).unwrap_or(0),
        _ => 0,
    };
    let (bound, ids) = (n(0), n(1));
    let capacity = spec.capacity();
    let info = PoolInfo {
        spec: PoolSpecBody::from_spec(&spec),
        capacity,
        bound,
        quarantined: ids.saturating_sub(bound),
        used: ids,
        free: capacity.saturating_sub(ids),
    };
    Ok(Json(info).into_response())
}

/// `PATCH /v1/pools/{pool}`: a new range (and reserved IDs); the answer is the spec in force.
/// Narrowing over a bound or quarantined ID is 409 `invalid_input` naming the ID and its key.
pub async fn resize_pool(
    State(st): State<Arc<AppState>>,
    Path(name): Path<String>,
    ApiJson(body): ApiJson<ResizeBody>,
) -> ApiResult {
    let spec = st.alloc.resize_pool(&name, body.min, body.max, body.reserved.as_deref()).await?;
    Ok(Json(PoolSpecBody::from_spec(&spec)).into_response())
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DeleteQuery {
    #[serde(default)]
    force: Option<String>,
}

/// A boolean query parameter: `true` or `false` (absent: false).
fn flag(name: &str, raw: Option<&str>) -> ApiResult<bool> {
    raw.map_or(Ok(false), |r| param(name, r, "true or false"))
}

pub async fn delete_pool(
    State(st): State<Arc<AppState>>,
    Path(name): Path<String>,
    ApiQuery(q): ApiQuery<DeleteQuery>,
) -> ApiResult {
    let force = flag("force", q.force.as_deref())?;
    // The `pools=` slot counting the pool, freed once the pool is gone.
    let slot = crate::pool_slots::counted_by(&*st.store, &st.layout, &name).await?;
    let deleted = st.alloc.delete_pool(&name, force).await?;
    st.forget(&name);
    if let (true, Some(slot)) = (deleted, slot) {
        crate::pool_slots::release(&*st.store, &st.layout, &name, slot).await;
    }
    if !deleted {
        return Err(idalloc::Error::PoolNotFound { pool: name }.into());
    }
    Ok(Json(Deleted { deleted: true, pool: name }).into_response())
}

/// Whose references a request makes: a session's (leased) or a durable holder's.
enum Owner {
    Session(Arc<ClientSession>),
    Holder(String),
}

/// The authenticated client of a request (`None` when the service runs without tokens).
type Caller = Option<Extension<Client>>;

fn caller(c: &Caller) -> Option<&Client> {
    c.as_ref().map(|Extension(c)| c)
}

/// The owner a request names, checked: a session must be the caller's; a durable holder is
/// validated and, with tokens, namespaced by the caller's name (`client/holder`), so that one
/// client cannot act on another's references.
async fn owner(
    st: &AppState,
    client: Option<&Client>,
    session: Option<String>,
    holder: Option<String>,
) -> ApiResult<Owner> {
    match (session, holder) {
        (Some(s), None) => Ok(Owner::Session(st.sessions.resolve(st, &s, client).await?)),
        (None, Some(given)) => {
            // The same limit with and without tokens: the client's namespace has room of its
            // own (`MAX_HOLDER_NAMESPACE_BYTES`).
            idalloc::pool::validate_holder(&given)?;
            let h = match client {
                Some(c) => c.holder(&given),
                None => given.clone(),
            };
            idalloc::pool::validate_stored_holder(&h)?;
            // Sessions own their holder names.
            st.sessions.check_durable_holder(&given, &h)?;
            Ok(Owner::Holder(h))
        }
        (Some(_), Some(_)) => {
            Err(ApiError::invalid("give either \"session\" or \"holder\", not both"))
        }
        (None, None) => Err(ApiError::invalid(
            "give \"session\" (a session id from POST /v1/sessions) or \"holder\" (a durable holder name)",
        )),
    }
}

/// The keys of a request and whether it was the single-key form.
fn keys(key: Option<String>, keys: Option<Vec<String>>) -> ApiResult<(Vec<String>, bool)> {
    match (key, keys) {
        (Some(k), None) => Ok((vec![k], true)),
        (None, Some(ks)) if ks.is_empty() => Err(ApiError::invalid("\"keys\" is empty")),
        (None, Some(ks)) if ks.len() > MAX_KEYS_PER_REQUEST => Err(ApiError::invalid(format!(
            "\"keys\" has {} keys: at most {MAX_KEYS_PER_REQUEST} per request",
            ks.len()
        ))),
        (None, Some(ks)) => Ok((ks, false)),
        _ => Err(ApiError::invalid("give either \"key\" or \"keys\"")),
    }
}

/// What an acquire or release request asks for, checked: its keys (every one validated before
/// anything is written, so a bad key in a list writes nothing), whether it was the single-key
/// form, whose references it makes, and the pool.
struct KeysRequest {
    keys: Vec<String>,
    single: bool,
    owner: Owner,
    pool: Pool,
}

async fn keys_request(
    st: &AppState,
    client: &Caller,
    note: &Option<Extension<crate::audit::Note>>,
    name: &str,
    body: AcquireBody,
) -> ApiResult<KeysRequest> {
    let (keys, single) = keys(body.key, body.keys)?;
    if let Some(Extension(n)) = note {
        n.keys(keys.len());
    }
    for k in &keys {
        idalloc::pool::validate_key(k)?;
    }
    let owner = owner(st, caller(client), body.session, body.holder).await?;
    let pool = st.pool(name).await?;
    Ok(KeysRequest { keys, single, owner, pool })
}

/// The answer of an acquire or release: the one result for the single-key form, else the list.
fn answer<T: serde::Serialize>(mut out: Vec<T>, single: bool) -> Response {
    if single {
        Json(out.pop()).into_response()
    } else {
        Json(Results { results: out }).into_response()
    }
}

/// A session error after the lease vanished is "session not found", not "invalid input".
fn session_error(s: &ClientSession, e: idalloc::Error) -> ApiError {
    if s.is_lost() {
        ApiError::session_not_found()
    } else {
        e.into()
    }
}

pub async fn acquire(
    State(st): State<Arc<AppState>>,
    client: Caller,
    note: Option<Extension<crate::audit::Note>>,
    Path(name): Path<String>,
    ApiJson(body): ApiJson<AcquireBody>,
) -> ApiResult {
    let hint = body.hint;
    if let Some(h) = hint.filter(|_| body.keys.is_some() || body.session.is_some()) {
        return Err(ApiError::invalid(format!(
            "\"hint\": {h} goes with one \"key\" and a durable \"holder\" (not \"keys\" or a \
             \"session\")"
        )));
    }
    let KeysRequest { keys, single, owner, pool } =
        keys_request(&st, &client, &note, &name, body).await?;
    let what = format!("a request of {} keys", keys.len());
    if let Some(refused) =
        crate::quota::charge(caller(&client), crate::quota::cost::keys(keys.len()), &what)
    {
        return Ok(refused);
    }
    // The reference quota: slots in the store (crate::ref_slots), taken before the bind and
    // given back for the keys whose bind failed.
    let (holder, lease) = match &owner {
        Owner::Session(s) => (s.holder(), Some(s.lease())),
        Owner::Holder(h) => (h.as_str(), None),
    };
    let slots = ref_slots(&st, caller(&client), &name);
    let taken = match &slots {
        Some(rs) => Some(rs.acquire(holder, lease, &keys).await?),
        None => None,
    };
    let got = match &owner {
        Owner::Session(s) if single => vec![s.acquire(&pool, &keys[0]).await],
        // A session's list goes in batched txns too (one txn per key made a restart storm cost
        // etcd a write per key). The first failure answers the request, as
        // before; acquiring in a session is idempotent, so the client retries the whole list.
        Owner::Session(s) => s.acquire_many(&pool, &keys).await,
        // A durable holder's list goes in batched txns: ~100 keys per round trip.
        Owner::Holder(h) if single => vec![match hint {
            Some(id) => pool.acquire_durable_with_hint(&keys[0], h, id).await,
            None => pool.acquire_durable(&keys[0], h).await,
        }],
        Owner::Holder(h) => pool.acquire_many_durable(&keys, h).await,
    };
    if let (Some(rs), Some(taken)) = (&slots, &taken) {
        // Only a definite failure gives its slot back: after `Unavailable` (a timeout) the bind
        // may still be applied, and its reference must then hold the slot.
        let definite = |a: &idalloc::Result<idalloc::Acquired>| matches!(a, Err(e) if !matches!(e, idalloc::Error::Unavailable { .. }));
        let failed: Vec<&str> =
            keys.iter().zip(&got).filter(|(_, a)| definite(a)).map(|(k, _)| k.as_str()).collect();
        if !failed.is_empty() {
            rs.give_back(holder, taken, &failed).await;
        }
        // Every bound key is counted: a slot freed between the slot txn and the bind (a racing
        // release, `check --repair`) is taken again; a key that finds none free is released
        // again and the request refused, so no client ends above its limit.
        let bound: Vec<&String> =
            keys.iter().zip(&got).filter(|(_, a)| a.is_ok()).map(|(k, _)| k).collect();
        if let Some((over, uncounted)) = rs.confirm(holder, lease, &bound).await? {
            for key in &uncounted {
                let undone = match &owner {
                    Owner::Session(s) => s.release(&pool, key).await.map(|_| ()),
                    Owner::Holder(h) => pool.release_durable(key, h).await.map(|_| ()),
                };
                if let Err(e) = undone {
                    tracing::warn!(pool = %name, error = %e, "releasing an uncounted key failed");
                }
            }
            return Err(over);
        }
    }
    let mut out = Vec::with_capacity(keys.len());
    for (key, a) in keys.into_iter().zip(got) {
        let a = match &owner {
            Owner::Session(s) => a.map_err(|e| session_error(s, e))?,
            Owner::Holder(_) => a?,
        };
        out.push(Acquired { key, id: a.id, new: a.new, hint_granted: hint.map(|h| h == a.id) });
    }
    Ok(answer(out, single))
}

/// The reference-quota slots of `client` in `pool`, if it has `refs=`.
fn ref_slots<'a>(
    st: &'a AppState,
    client: Option<&'a Client>,
    pool: &'a str,
) -> Option<crate::ref_slots::RefSlots<'a>> {
    let c = client?;
    let limit = c.policy.refs?;
    Some(crate::ref_slots::RefSlots::new(&*st.store, &st.layout, &c.name, pool, limit))
}

pub async fn release(
    State(st): State<Arc<AppState>>,
    client: Caller,
    note: Option<Extension<crate::audit::Note>>,
    Path(name): Path<String>,
    ApiJson(body): ApiJson<AcquireBody>,
) -> ApiResult {
    if let Some(h) = body.hint {
        return Err(ApiError::invalid(format!("\"hint\": {h} is for acquire, not release")));
    }
    let KeysRequest { keys, single, owner, pool } =
        keys_request(&st, &client, &note, &name, body).await?;
    let what = format!("a request of {} keys", keys.len());
    if let Some(refused) =
        crate::quota::charge(caller(&client), crate::quota::cost::keys(keys.len()), &what)
    {
        return Ok(refused);
    }
    let mut out = Vec::with_capacity(keys.len());
    match &owner {
        Owner::Session(s) => {
            for key in keys {
                let r = s.release(&pool, &key).await?;
                out.push(Released { key, held: r.held, reclaimed: r.reclaimed });
            }
        }
        // Batched, as acquire.
        Owner::Holder(h) => {
            let got = if single {
                vec![pool.release_durable(&keys[0], h).await]
            } else {
                pool.release_many_durable(&keys, h).await
            };
            for (key, r) in keys.into_iter().zip(got) {
                let r = r?;
                out.push(Released { key, held: r.held, reclaimed: r.reclaimed });
            }
        }
    }
    // The released references give their quota slots back (crate::ref_slots).
    if let Some(rs) = ref_slots(&st, caller(&client), &name) {
        let holder = match &owner {
            Owner::Session(s) => s.holder(),
            Owner::Holder(h) => h.as_str(),
        };
        let released: Vec<&str> = out.iter().map(|r| r.key.as_str()).collect();
        rs.release(holder, &released).await?;
    }
    Ok(answer(out, single))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ReadQuery {
    /// Read from the store (one round trip) instead of the cache.
    #[serde(default)]
    consistent: Option<String>,
}

/// The `rate=` charge of a consistent read (a cached one costs the one token every request does).
fn charge_consistent(client: &Caller, consistent: bool) -> Option<Response> {
    let cost = crate::quota::cost::CONSISTENT_READ;
    consistent.then(|| crate::quota::charge(caller(client), cost, "a consistent read")).flatten()
}

async fn synced(pool: &Pool) -> ApiResult<()> {
    pool.wait_synced().await.map_err(ApiError::from)
}

pub async fn get_key(
    State(st): State<Arc<AppState>>,
    client: Caller,
    Path((name, key)): Path<(String, String)>,
    ApiQuery(q): ApiQuery<ReadQuery>,
) -> ApiResult {
    let consistent = flag("consistent", q.consistent.as_deref())?;
    if let Some(refused) = charge_consistent(&client, consistent) {
        return Ok(refused);
    }
    idalloc::pool::validate_key(&key)?;
    let pool = st.pool(&name).await?;
    let id = if consistent {
        pool.get_consistent(&key).await?
    } else {
        synced(&pool).await?;
        pool.get(&key)
    };
    match id {
        Some(id) => Ok(Json(KeyAnswer { id, key, pool: name }).into_response()),
        None => Err(ApiError::not_found(format!(
            "key {} has no ID in pool {name:?}",
            idalloc::error::show_value(&key)
        ))),
    }
}

pub async fn lookup_id(
    State(st): State<Arc<AppState>>,
    client: Caller,
    Path((name, id)): Path<(String, String)>,
    ApiQuery(q): ApiQuery<ReadQuery>,
) -> ApiResult {
    let consistent = flag("consistent", q.consistent.as_deref())?;
    if let Some(refused) = charge_consistent(&client, consistent) {
        return Ok(refused);
    }
    let id: u64 = param("ID", &id, "a decimal number from 0 to 18446744073709551615")?;
    let pool = st.pool(&name).await?;
    let key = if consistent {
        pool.key_of_consistent(id).await?
    } else {
        synced(&pool).await?;
        pool.key_of(id)
    };
    match key {
        Some(key) => Ok(Json(IdAnswer { id, key, pool: name }).into_response()),
        None => Err(ApiError::not_found(format!("ID {id} is not bound in pool {name:?}"))),
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ListQuery {
    /// Only bindings with an ID greater than this (the previous page's `next_after`).
    #[serde(default)]
    after: Option<String>,
    /// Page size (1..=10000, default 1000).
    #[serde(default)]
    limit: Option<String>,
}

/// Largest page of `GET …/bindings`.
pub const MAX_PAGE: usize = 10_000;

pub async fn list_bindings(
    State(st): State<Arc<AppState>>,
    client: Caller,
    Path(name): Path<String>,
    ApiQuery(q): ApiQuery<ListQuery>,
) -> ApiResult {
    let limits = "a whole number from 1 to 10000";
    let limit: usize = q.limit.as_deref().map_or(Ok(1000), |l| param("limit", l, limits))?;
    if !(1..=MAX_PAGE).contains(&limit) {
        return Err(ApiError::invalid(format!("invalid limit {limit}: {limits}")));
    }
    let what = format!("a page of up to {limit} bindings");
    if let Some(refused) =
        crate::quota::charge(caller(&client), crate::quota::cost::page(limit), &what)
    {
        return Ok(refused);
    }
    let after: Option<u64> = q
        .after
        .as_deref()
        .map(|a| param("after", a, "an ID: a whole number from 0 to 18446744073709551615"))
        .transpose()?;
    let pool = st.pool(&name).await?;
    // One page from the cache's ordered used IDs and one txn per 64 bindings for the holders:
    // O(limit) per page, not a listing of the whole pool per page (idalloc's `allocator/page.rs`).
    let got = pool.list_page(after, limit).await?;
    let page: Vec<BindingBody> = got
        .bindings
        .into_iter()
        .map(|b| BindingBody { id: b.id, key: b.key, holders: b.holders })
        .collect();
    let next_after = got.next_after;
    Ok(Json(json!({ "pool": name, "bindings": page, "next_after": next_after })).into_response())
}

pub async fn sweep(State(st): State<Arc<AppState>>, Path(name): Path<String>) -> ApiResult {
    let pool = st.pool(&name).await?;
    let r = pool.sweep().await?;
    let reclaimed = r.reclaimed.into_iter().map(|(id, key)| Reclaimed { id, key }).collect();
    Ok(Json(Swept {
        fence_records: count(r.fence_records),
        folded: count(r.folded),
        idle: count(r.idle),
        pool: name,
        reclaimed,
    })
    .into_response())
}

pub async fn open_session(
    State(st): State<Arc<AppState>>,
    client: Caller,
    ApiJson(body): ApiJson<SessionBody>,
) -> ApiResult {
    // The `sessions=` quota: slots in the store (crate::slots), checked before the lease is
    // granted and taken on the lease before the session is handed out.
    let quota = caller(&client).and_then(|c| Some((c.name.clone(), c.policy.sessions? as u64)));
    if let Some((name, limit)) = &quota {
        crate::slots::precheck(&*st.store, &st.layout, name, *limit).await?;
    }
    let sent = Instant::now();
    let owner = caller(&client).map(|c| c.name.clone());
    // The record any replica verifies the id against: a digest, never the secret.
    let (secret, record) = crate::sessions::new_secret(owner.as_deref(), body.ttl);
    let ttl = std::time::Duration::from_secs(body.ttl);
    let prefix = crate::sessions::SHARED_HOLDER_PREFIX;
    let s = st.alloc.shared_client_session(ttl, prefix, &record).await?;
    if let Some((name, limit)) = &quota {
        if let Err(e) = crate::slots::claim(&*st.store, &st.layout, name, *limit, s.lease()).await {
            // Never handed out: end it now rather than at its TTL (best effort).
            let _ = s.end().await;
            return Err(e);
        }
    }
    let id = crate::sessions::session_id(s.lease(), &secret);
    let info =
        SessionInfo { session: id.clone(), holder: s.holder().to_string(), ttl: s.ttl().as_secs() };
    st.sessions.insert(id, s, sent, owner);
    Ok((StatusCode::CREATED, Json(info)).into_response())
}

pub async fn keepalive(
    State(st): State<Arc<AppState>>,
    client: Caller,
    Path(id): Path<String>,
) -> ApiResult {
    let s = st.sessions.resolve(&st, &id, caller(&client)).await?;
    let sent = Instant::now();
    if s.keep_alive().await? {
        st.sessions.renewed(&id, sent);
        Ok(Json(Keepalive { ttl: s.ttl().as_secs() }).into_response())
    } else {
        st.sessions.remove(&id);
        Err(ApiError::session_not_found())
    }
}

/// The client whose sessions `client` may list and end: `None` for every client's (an
/// unrestricted administrator, or no tokens), else its own.
fn sessions_scope(client: Option<&Client>) -> Option<&str> {
    client.filter(|c| !c.administers_all()).map(|c| &*c.name)
}

/// Ends a session, named by its id or by the holder name `GET /v1/sessions` lists: any client's
/// for an unrestricted administrator (or anyone, without tokens), else only the caller's own
/// (another client's is `session_not_found`, as an unknown one).
pub async fn end_session(
    State(st): State<Arc<AppState>>,
    client: Caller,
    Path(id): Path<String>,
) -> ApiResult {
    let (id, s) = match st.sessions.resolve(&st, &id, caller(&client)).await {
        Ok(s) => (id, s),
        Err(_) => {
            let owner = sessions_scope(caller(&client));
            st.sessions.get_any(&st.alloc, &id, owner).await?
        }
    };
    s.end().await?;
    st.sessions.remove(&id);
    Ok(Json(Ended { ended: true }).into_response())
}

/// The live sessions of this instance the caller may see (every client's for an unrestricted
/// administrator, else its own): holder, client, TTL, age and the number of references each
/// holds, counted from the store in bounded pages (keys only), so no read grows with the pool.
pub async fn list_sessions(State(st): State<Arc<AppState>>, client: Caller) -> ApiResult {
    let sessions = st.sessions.list(sessions_scope(caller(&client)));
    let mut refs: HashMap<String, u64> = sessions.iter().map(|s| (s.holder.clone(), 0)).collect();
    if !refs.is_empty() {
        for spec in st.alloc.list_pools().await? {
            let name = spec.name();
            let range = KeyRange::prefix(st.layout.refs_prefix(name));
            let mut pages = idalloc::store::Pages::at(&*st.store, &range, 1000, 0).keys_only();
            while let Some(kvs) = pages.next_page().await? {
                for kv in &kvs {
                    if let Some((_, holder)) = st.layout.parse_ref_key(name, &kv.key) {
                        if let Some(n) = refs.get_mut(&holder) {
                            *n += 1;
                        }
                    }
                }
            }
        }
    }
    let sessions = sessions
        .iter()
        .map(|s| SessionSummary {
            age: s.age.as_secs(),
            client: s.client.as_deref().map(str::to_string),
            holder: s.holder.clone(),
            references: refs.get(&s.holder).copied().unwrap_or(0),
            ttl: s.ttl.as_secs(),
        })
        .collect();
    Ok(Json(Sessions { sessions }).into_response())
}

/// Pools this service has opened, by name (readiness checks that each is synced).
pub type Opened = HashMap<String, Pool>;
