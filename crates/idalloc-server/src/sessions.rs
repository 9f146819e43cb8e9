//! The registry of client sessions this service handed out or adopted.
//!
//! A session id is a capability: whoever presents it acts as the session's holder. Its secret part
//! is 256 random bits from the OS-seeded CSPRNG, hex-encoded; the id is never logged and never a
//! metric label. The holder name (derived from the lease, visible in the store) shares only the
//! lease with it, so listing a pool does not reveal the capability.
//!
//! With bearer tokens, a session belongs to the client that opened it: to any other client it does
//! not exist (`session_not_found`, the answer for an unknown id, so its existence is not revealed).
//!
//! **A session is usable on every replica**. Its id is `<lease><secret>`: the
//! store lease's id (16 hex digits) and 256 random bits (64 hex digits). Opening one puts a record
//! on the lease (`P/sessions/<lease>`, [`idalloc::layout::Layout::session_key`]) holding the
//! SHA-256 of the secret, the owning client's name (never a token) and the TTL; it vanishes with
//! the lease. An instance that does not know an id reads that record, compares the digest in
//! constant time, checks the owner, renews the lease once (so its view of the TTL is exact) and
//! adopts the session ([`idalloc::Allocator::adopt_client_session`]). The holder name derives from
//! the lease alone (`session:lease-<hex>`), so the adopted session's references are the same
//! references: a client whose instance died goes on with another, keeping its IDs. The store's
//! record holds no secret: reading etcd does not give the capability.
//!
//! **Sessions own their holder names**. A session's holder name is visible to
//! anyone who can list the pool; if a durable acquire or release could use it, anyone could release
//! the session's references, or add a durable reference under the same name that outlives the
//! lease (the ID would then stay bound after the session ended). So the service names its
//! sessions in a reserved namespace ([`SESSION_HOLDER_PREFIX`], through the allocator holder
//! [`service_holder`] it gives the library) and [`Sessions::check_durable_holder`] refuses every durable
//! holder in that namespace, whichever instance opened the session and whether it is still live;
//! holders of live sessions of this instance are refused too (also if they predate the prefix).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use idalloc::ClientSession;
use rand::RngCore;

use axum::http::StatusCode;

use crate::auth::Client;
use crate::error::ApiError;

/// Every session holder of a service starts with this (the library names a client session's
/// holder `<allocator holder>-c<lease>`, and the service's allocator holder starts with it).
/// Durable holder names starting with it are refused: the namespace belongs to sessions.
pub const SESSION_HOLDER_PREFIX: &str = "session:";

/// The holder name of a session is this followed by its lease in hex: derived from the lease
/// alone, so every replica that adopts the session names its references alike.
pub const SHARED_HOLDER_PREFIX: &str = "session:lease-";

/// Hex digits of the lease part of a session id.
const LEASE_HEX: usize = 16;
/// Hex digits of the secret part of a session id (256 bits).
const SECRET_HEX: usize = 64;

/// What a session's store record holds (`P/sessions/<lease>`): enough for any replica to verify a
/// client's claim, nothing that grants it.
#[derive(serde::Serialize, serde::Deserialize, Debug, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct SessionRecord {
    /// Format version (1).
    pub v: u32,
    /// SHA-256 of the secret part of the session id, hex.
    pub digest: String,
    /// The client that opened it (with tokens), so that it stays that client's everywhere.
    pub owner: Option<String>,
    /// The lease TTL in seconds.
    pub ttl: u64,
}

/// The holder name of the shared session on `lease`.
pub fn shared_holder(lease: idalloc::store::LeaseId) -> String {
    idalloc::client_session::shared_holder(SHARED_HOLDER_PREFIX, lease)
}

/// A fresh session secret and the record to store for it. The id is `<lease><secret>`
/// ([`session_id`]) once the lease is granted.
pub fn new_secret(owner: Option<&str>, ttl: u64) -> (String, Vec<u8>) {
    let secret = new_id();
    let record =
        SessionRecord { v: 1, digest: digest(&secret), owner: owner.map(str::to_string), ttl };
    // Serializing a struct of strings and numbers cannot fail.
    let bytes = serde_json::to_vec(&record).unwrap_or_default();
    (secret, bytes)
}

/// The id handed to the client: the lease (16 hex digits) then the secret (64 hex digits).
pub fn session_id(lease: idalloc::store::LeaseId, secret: &str) -> String {
    format!("{lease:016x}{secret}")
}

/// The lease and secret of a well-formed session id (80 lowercase hex digits), else `None`.
fn parse_id(id: &str) -> Option<(idalloc::store::LeaseId, &str)> {
    let lower_hex = |c: u8| c.is_ascii_digit() || (b'a'..=b'f').contains(&c);
    if id.len() != LEASE_HEX + SECRET_HEX || !id.bytes().all(lower_hex) {
        return None;
    }
    let lease = u64::from_str_radix(&id[..LEASE_HEX], 16).ok()?;
    // Lease ids are i64 in etcd; the hex is the two's complement bit pattern.
    Some((lease as i64, &id[LEASE_HEX..]))
}

/// SHA-256 of `secret`, hex.
fn digest(secret: &str) -> String {
    let d = ring::digest::digest(&ring::digest::SHA256, secret.as_bytes());
    d.as_ref().iter().map(|x| format!("{x:02x}")).collect()
}

/// Whether `record` (as stored) vouches for `secret` presented by `client`: the digest matches
/// (compared in constant time) and the owner is the same.
fn vouches(record: &SessionRecord, secret: &str, client: Option<&str>) -> bool {
    use subtle::ConstantTimeEq;
    let same = digest(secret).as_bytes().ct_eq(record.digest.as_bytes());
    bool::from(same) && record.v == 1 && record.owner.as_deref() == client
}

/// The allocator holder name the service runs with: `session:<host>-<8 hex>`, so that every
/// client session it opens is named in the reserved namespace.
pub fn service_holder() -> String {
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .ok()
        .or_else(|| std::env::var("HOSTNAME").ok())
        .map(|h| h.trim().to_string())
        .filter(|h| !h.is_empty() && !h.contains('/'))
        .unwrap_or_else(|| "host".to_string());
    format!("{SESSION_HOLDER_PREFIX}{host}-{:08x}", rand::random::<u32>())
}

/// The refusal of a durable acquire or release naming a session's holder: 409 `holder_reserved`.
fn holder_reserved(holder: &str, why: &str) -> ApiError {
    ApiError::new(
        StatusCode::CONFLICT,
        "holder_reserved",
        format!(
            "holder {} {why}; a durable acquire or release cannot use it: act through the session \
             (\"session\": ID) or choose another holder name",
            idalloc::error::show_value(holder)
        ),
    )
}

/// Open sessions by id, with when each was last renewed.
#[derive(Default)]
pub struct Sessions {
    map: Mutex<HashMap<String, Entry>>,
    /// Session slots reserved by opens in progress, by client (the `sessions=` quota).
    pending: Mutex<HashMap<Arc<str>, usize>>,
}

/// A reserved session slot of a client ([`Sessions::reserve`]); freed when dropped (the session
/// is registered, or its open failed).
pub struct Slot<'a> {
    sessions: &'a Sessions,
    owner: Arc<str>,
}

impl Drop for Slot<'_> {
    fn drop(&mut self) {
        let mut p = self.sessions.pending.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(n) = p.get_mut(&self.owner) {
            *n -= 1;
            if *n == 0 {
                p.remove(&self.owner);
            }
        }
    }
}

struct Entry {
    session: Arc<ClientSession>,
    /// When the lease was granted or last renewed. Only this service renews it, so once a TTL has
    /// passed since, the store has expired it (or is about to): the session is over.
    renewed: Instant,
    /// The client that opened it (with tokens).
    owner: Option<Arc<str>>,
    /// When it was opened (for the administrators' list).
    opened: Instant,
}

/// A session as the administrators' list shows it (no id: ids are capabilities).
#[derive(Clone, Debug)]
pub struct SessionView {
    pub holder: String,
    pub client: Option<Arc<str>>,
    pub ttl: std::time::Duration,
    pub age: std::time::Duration,
}

impl Entry {
    fn over(&self) -> bool {
        self.session.is_lost() || self.renewed.elapsed() >= self.session.ttl()
    }
}

/// A fresh, unguessable session id: 32 bytes from a CSPRNG, hex.
fn new_id() -> String {
    let mut b = [0u8; 32];
    // ThreadRng: a CSPRNG (ChaCha) seeded and periodically reseeded from the OS.
    rand::rng().fill_bytes(&mut b);
    b.iter().map(|x| format!("{x:02x}")).collect()
}

impl Sessions {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Entry>> {
        self.map.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Registers `s` (its lease granted or last renewed at `granted`, opened by client `owner`)
    /// under `id`.
    pub fn insert(
        &self,
        id: String,
        s: ClientSession,
        granted: Instant,
        owner: Option<Arc<str>>,
    ) -> Arc<ClientSession> {
        let session = Arc::new(s);
        let entry = Entry { session: session.clone(), renewed: granted, owner, opened: granted };
        self.lock().insert(id, entry);
        session
    }

    /// The live session `id` of `client`, known here ([`Sessions::get`]) or opened on another
    /// replica (or known here once, then renewed elsewhere): then its store record is read and
    /// checked, its lease renewed once and the session adopted. `session_not_found` if the id is
    /// malformed, the record is gone (the lease ended or expired) or does not vouch for the id
    /// and client. One read and one renewal for the first request of an adopted session, none
    /// after.
    pub async fn resolve(
        &self,
        alloc: &idalloc::Allocator,
        id: &str,
        client: Option<&Client>,
    ) -> Result<Arc<ClientSession>, ApiError> {
        if let Ok(s) = self.get(id, client) {
            return Ok(s);
        }
        let Some((lease, secret)) = parse_id(id) else {
            return Err(ApiError::session_not_found());
        };
        let Some(raw) = alloc.client_session_record(lease).await? else {
            return Err(ApiError::session_not_found());
        };
        let record: SessionRecord = match serde_json::from_slice(&raw) {
            Ok(r) => r,
            Err(e) => {
                // Never the id: it is a capability. The lease names the record.
                tracing::warn!(lease = format!("{lease:016x}"), error = %e, "unreadable session record");
                return Err(ApiError::session_not_found());
            }
        };
        let owner = client.map(|c| &*c.name);
        if !vouches(&record, secret, owner) {
            return Err(ApiError::session_not_found());
        }
        let ttl = std::time::Duration::from_secs(record.ttl);
        let s = alloc.adopt_client_session(lease, ttl, SHARED_HOLDER_PREFIX)?;
        let sent = Instant::now();
        if !s.keep_alive().await? {
            return Err(ApiError::session_not_found());
        }
        let owner = client.map(|c| c.name.clone());
        Ok(self.insert(id.to_string(), s, sent, owner))
    }

    /// The live session `id` of `client`; `session_not_found` if unknown, another client's, lost
    /// or past its TTL (such an entry is forgotten).
    pub fn get(&self, id: &str, client: Option<&Client>) -> Result<Arc<ClientSession>, ApiError> {
        let mut map = self.lock();
        match map.get(id) {
            Some(e) if e.owner.as_deref() != client.map(|c| &*c.name) => {
                Err(ApiError::session_not_found())
            }
            Some(e) if e.over() => {
                map.remove(id);
                Err(ApiError::session_not_found())
            }
            Some(e) => Ok(e.session.clone()),
            None => Err(ApiError::session_not_found()),
        }
    }

    /// The live session whose id or holder name is `id_or_holder`, whoever opened it (for an
    /// administrator), with its id. A holder name of a session this instance does not know
    /// (`session:lease-<hex>`, opened on another replica) is found through its store record; the
    /// handle returned then has an empty id (nothing registered here).
    pub async fn get_any(
        &self,
        alloc: &idalloc::Allocator,
        id_or_holder: &str,
    ) -> Result<(String, Arc<ClientSession>), ApiError> {
        {
            let map = self.lock();
            let found = map.iter().find(|(id, e)| {
                !e.over() && (id.as_str() == id_or_holder || e.session.holder() == id_or_holder)
            });
            if let Some((id, e)) = found {
                return Ok((id.clone(), e.session.clone()));
            }
        }
        let lease = id_or_holder
            .strip_prefix(SHARED_HOLDER_PREFIX)
            .filter(|h| {
                !h.is_empty() && h.len() <= LEASE_HEX && h.bytes().all(|c| c.is_ascii_hexdigit())
            })
            .and_then(|h| u64::from_str_radix(h, 16).ok())
            .map(|l| l as i64);
        let Some(lease) = lease else { return Err(ApiError::session_not_found()) };
        // Only the canonical spelling names the session (the holder is `{lease:x}`).
        if crate::sessions::shared_holder(lease) != id_or_holder {
            return Err(ApiError::session_not_found());
        }
        let Some(raw) = alloc.client_session_record(lease).await? else {
            return Err(ApiError::session_not_found());
        };
        let record: SessionRecord =
            serde_json::from_slice(&raw).map_err(|_| ApiError::session_not_found())?;
        let ttl = std::time::Duration::from_secs(record.ttl);
        let s = alloc.adopt_client_session(lease, ttl, SHARED_HOLDER_PREFIX)?;
        Ok((String::new(), Arc::new(s)))
    }

    /// Every live session, by holder name.
    pub fn list(&self) -> Vec<SessionView> {
        let map = self.lock();
        let mut out: Vec<SessionView> = map
            .values()
            .filter(|e| !e.over())
            .map(|e| SessionView {
                holder: e.session.holder().to_string(),
                client: e.owner.clone(),
                ttl: e.session.ttl(),
                age: e.opened.elapsed(),
            })
            .collect();
        out.sort_by(|a, b| a.holder.cmp(&b.holder));
        out
    }

    /// Records a successful renewal sent at `sent` (the TTL counts from the request, not from the
    /// answer, so the local view never outlives the store's).
    pub fn renewed(&self, id: &str, sent: Instant) {
        if let Some(e) = self.lock().get_mut(id) {
            e.renewed = e.renewed.max(sent);
        }
    }

    /// Forgets session `id`.
    pub fn remove(&self, id: &str) -> Option<Arc<ClientSession>> {
        self.lock().remove(id).map(|e| e.session)
    }

    /// Forgets every session that is over (called periodically, so a client that vanished does
    /// not leave an entry behind).
    pub fn prune(&self) {
        self.lock().retain(|_, e| !e.over());
    }

    /// Whether a durable request may use holder `given` (as the client sent it), `stored` being the
    /// name it stands for in the store (namespaced by the client with tokens). Refused: names in
    /// the sessions' namespace, and the holder of any session registered here.
    pub fn check_durable_holder(&self, given: &str, stored: &str) -> Result<(), ApiError> {
        if given.starts_with(SESSION_HOLDER_PREFIX) || stored.starts_with(SESSION_HOLDER_PREFIX) {
            return Err(holder_reserved(
                given,
                &format!("is in the namespace of client sessions (names starting with {SESSION_HOLDER_PREFIX:?})"),
            ));
        }
        if self.lock().values().any(|e| e.session.holder() == stored || e.session.holder() == given)
        {
            return Err(holder_reserved(given, "belongs to a client session"));
        }
        Ok(())
    }

    /// Reserves a session slot for `client` if it has a `sessions=` quota: refused with 429
    /// `quota_exceeded` when its live sessions plus opens in progress reach the limit. Take it
    /// before granting the lease and drop it after [`Sessions::insert`].
    pub fn reserve(&self, client: Option<&Client>) -> Result<Option<Slot<'_>>, ApiError> {
        let Some(c) = client else { return Ok(None) };
        let Some(limit) = c.policy.sessions else { return Ok(None) };
        let map = self.lock();
        let mut pending = self.pending.lock().unwrap_or_else(|p| p.into_inner());
        let live = map.values().filter(|e| !e.over() && e.owner.as_deref() == Some(&*c.name));
        let open = live.count() + pending.get(&c.name).copied().unwrap_or(0);
        if open >= limit {
            return Err(crate::quota::quota_exceeded(format!(
                "client {:?} has {open} sessions open: its limit is {limit} (sessions={limit} in \
                 the tokens file); end one or wait for one to expire",
                &*c.name
            )));
        }
        *pending.entry(c.name.clone()).or_default() += 1;
        Ok(Some(Slot { sessions: self, owner: c.name.clone() }))
    }

    /// The holder names of the live sessions client `owner` opened.
    pub fn holders_of(&self, owner: &str) -> Vec<String> {
        let map = self.lock();
        let mine = map.values().filter(|e| !e.over() && e.owner.as_deref() == Some(owner));
        mine.map(|e| e.session.holder().to_string()).collect()
    }

    /// Sessions registered now (over or not).
    pub fn len(&self) -> usize {
        self.lock().len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_service_holder_is_in_the_reserved_namespace() {
        let h = service_holder();
        assert!(h.starts_with(SESSION_HOLDER_PREFIX), "{h}");
        idalloc::pool::validate_holder(&h).expect("valid holder");
        let s = Sessions::default();
        assert!(s.check_durable_holder("node-1", "node-1").is_ok());
        let e =
            s.check_durable_holder(&format!("{h}-c1"), &format!("{h}-c1")).expect_err("reserved");
        assert_eq!((e.status.as_u16(), e.kind), (409, "holder_reserved"));
        assert!(e.message.contains(&h), "{}", e.message);
    }

    #[test]
    fn session_ids_carry_the_lease_and_records_vouch_only_for_their_secret_and_owner() {
        let (secret, raw) = new_secret(Some("agent-a"), 15);
        let id = session_id(0x694d_8a3b_1f2c_0a01, &secret);
        assert_eq!(id.len(), 80);
        assert_eq!(parse_id(&id), Some((0x694d_8a3b_1f2c_0a01, secret.as_str())));
        // Leases with the top bit set survive the round trip through hex.
        assert_eq!(parse_id(&session_id(-2, &secret)).map(|p| p.0), Some(-2));
        for bad in [&id[1..], &id.to_uppercase(), &format!("{id}0"), "", &id.replace('a', "g")] {
            assert_eq!(parse_id(bad), None, "{bad}");
        }
        let record: SessionRecord = serde_json::from_slice(&raw).expect("record");
        assert!(!String::from_utf8_lossy(&raw).contains(&secret), "the secret is never stored");
        assert_eq!((record.owner.as_deref(), record.ttl), (Some("agent-a"), 15));
        assert!(vouches(&record, &secret, Some("agent-a")));
        assert!(!vouches(&record, &secret, Some("agent-b")), "another client");
        assert!(!vouches(&record, &secret, None), "no client");
        assert!(!vouches(&record, &new_id(), Some("agent-a")), "another secret");
    }

    #[test]
    fn ids_are_long_random_and_distinct() {
        let a = new_id();
        let b = new_id();
        assert_eq!(a.len(), 64);
        assert!(a.chars().all(|c| c.is_ascii_hexdigit()));
        assert_ne!(a, b);
    }
}
