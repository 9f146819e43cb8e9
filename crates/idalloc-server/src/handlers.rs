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
    PoolInfo, PoolSpecBody, Pools, Reclaimed, Released, Results, SessionBody, SessionInfo,
    SessionSummary, Sessions, SpecBody, Swept,
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
    let pool = st.alloc.ensure_pool(&spec).await?;
    st.remember(&pool);
    Ok((StatusCode::OK, Json(PoolSpecBody::from_spec(pool.spec()))).into_response())
}

pub async fn show_pool(State(st): State<Arc<AppState>>, Path(name): Path<String>) -> ApiResult {
    let pool = st.pool(&name).await?;
    let spec = pool.spec().clone();
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
    let deleted = st.alloc.delete_pool(&name, force).await?;
    st.forget(&name);
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
        (Some(s), None) => Ok(Owner::Session(st.sessions.resolve(&st.alloc, &s, client).await?)),
        (None, Some(given)) => {
            idalloc::pool::validate_holder(&given)?;
            let h = match client {
                Some(c) => c.holder(&given),
                None => given.clone(),
            };
            idalloc::pool::validate_holder(&h)?;
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
    let KeysRequest { keys, single, owner, pool } =
        keys_request(&st, &client, &note, &name, body).await?;
    // The reference quota, checked before writing; its lock is held until the write is done.
    let holder = match &owner {
        Owner::Session(s) => s.holder(),
        Owner::Holder(h) => h.as_str(),
    };
    let _quota = crate::quota::check_refs(&st, caller(&client), &name, &keys, holder).await?;
    let mut out = Vec::with_capacity(keys.len());
    match &owner {
        Owner::Session(s) if single => {
            let a = s.acquire(&pool, &keys[0]).await.map_err(|e| session_error(s, e))?;
            out.extend(keys.into_iter().map(|key| Acquired { key, id: a.id, new: a.new }));
        }
        // A session's list goes in batched txns too (one txn per key made a
        // restart storm cost etcd a write per key). The first failure answers the request, as
        // before; acquiring in a session is idempotent, so the client retries the whole list.
        Owner::Session(s) => {
            let got = s.acquire_many(&pool, &keys).await;
            for (key, a) in keys.into_iter().zip(got) {
                let a = a.map_err(|e| session_error(s, e))?;
                out.push(Acquired { key, id: a.id, new: a.new });
            }
        }
        // A durable holder's list goes in batched txns: ~100 keys per round trip.
        Owner::Holder(h) => {
            let got = if single {
                vec![pool.acquire_durable(&keys[0], h).await]
            } else {
                pool.acquire_many_durable(&keys, h).await
            };
            for (key, a) in keys.into_iter().zip(got) {
                let a = a?;
                out.push(Acquired { key, id: a.id, new: a.new });
            }
        }
    }
    Ok(answer(out, single))
}

pub async fn release(
    State(st): State<Arc<AppState>>,
    client: Caller,
    note: Option<Extension<crate::audit::Note>>,
    Path(name): Path<String>,
    ApiJson(body): ApiJson<AcquireBody>,
) -> ApiResult {
    let KeysRequest { keys, single, owner, pool } =
        keys_request(&st, &client, &note, &name, body).await?;
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
    Ok(answer(out, single))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ReadQuery {
    /// Read from the store (one round trip) instead of the cache.
    #[serde(default)]
    consistent: Option<String>,
}

async fn synced(pool: &Pool) -> ApiResult<()> {
    pool.wait_synced().await.map_err(ApiError::from)
}

pub async fn get_key(
    State(st): State<Arc<AppState>>,
    Path((name, key)): Path<(String, String)>,
    ApiQuery(q): ApiQuery<ReadQuery>,
) -> ApiResult {
    let consistent = flag("consistent", q.consistent.as_deref())?;
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
    Path((name, id)): Path<(String, String)>,
    ApiQuery(q): ApiQuery<ReadQuery>,
) -> ApiResult {
    let consistent = flag("consistent", q.consistent.as_deref())?;
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
    Path(name): Path<String>,
    ApiQuery(q): ApiQuery<ListQuery>,
) -> ApiResult {
    let limits = "a whole number from 1 to 10000";
    let limit: usize = q.limit.as_deref().map_or(Ok(1000), |l| param("limit", l, limits))?;
    if !(1..=MAX_PAGE).contains(&limit) {
        return Err(ApiError::invalid(format!("invalid limit {limit}: {limits}")));
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
    // The `sessions=` quota: a slot reserved before the lease is granted.
    let _slot = st.sessions.reserve(caller(&client))?;
    let sent = Instant::now();
    let owner = caller(&client).map(|c| c.name.clone());
    // The record any replica verifies the id against: a digest, never the secret.
    let (secret, record) = crate::sessions::new_secret(owner.as_deref(), body.ttl);
    let ttl = std::time::Duration::from_secs(body.ttl);
    let prefix = crate::sessions::SHARED_HOLDER_PREFIX;
    let s = st.alloc.shared_client_session(ttl, prefix, &record).await?;
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
    let s = st.sessions.resolve(&st.alloc, &id, caller(&client)).await?;
    let sent = Instant::now();
    if s.keep_alive().await? {
        st.sessions.renewed(&id, sent);
        Ok(Json(Keepalive { ttl: s.ttl().as_secs() }).into_response())
    } else {
        st.sessions.remove(&id);
        Err(ApiError::session_not_found())
    }
}

/// Ends a session. Its owner names it by id; an administrator (or anyone, without tokens) may
/// also end any client's session, by id or by the holder name `GET /v1/sessions` lists.
pub async fn end_session(
    State(st): State<Arc<AppState>>,
    client: Caller,
    Path(id): Path<String>,
) -> ApiResult {
    let admin = caller(&client).is_none_or(|c| c.scope == crate::auth::Scope::Admin);
    let (id, s) = match st.sessions.resolve(&st.alloc, &id, caller(&client)).await {
        Ok(s) => (id, s),
        Err(e) if !admin => return Err(e),
        Err(_) => st.sessions.get_any(&st.alloc, &id).await?,
    };
    s.end().await?;
    st.sessions.remove(&id);
    Ok(Json(Ended { ended: true }).into_response())
}

/// Every live session of this instance, for administrators: holder, client, TTL, age and the
/// number of references it holds (counted from the store: one read of each pool's references).
pub async fn list_sessions(State(st): State<Arc<AppState>>) -> ApiResult {
    let sessions = st.sessions.list();
    let mut refs: HashMap<String, u64> = sessions.iter().map(|s| (s.holder.clone(), 0)).collect();
    if !refs.is_empty() {
        for spec in st.alloc.list_pools().await? {
            let name = spec.name();
            let prefix = st.layout.refs_prefix(name);
            let got = st.store.get(GetRequest::new(KeyRange::prefix(prefix)).keys_only()).await?;
            for kv in &got.kvs {
                if let Some((_, holder)) = st.layout.parse_ref_key(name, &kv.key) {
                    if let Some(n) = refs.get_mut(&holder) {
                        *n += 1;
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
