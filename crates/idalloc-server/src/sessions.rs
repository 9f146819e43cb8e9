//! The registry of client sessions this service handed out.
//!
//! A session id is a capability: whoever presents it acts as the session's holder. It is 256
//! random bits from the OS-seeded CSPRNG, hex-encoded, never logged and never a metric label; the
//! holder name (derived from the lease, visible in the store) is a different string, so listing a
//! pool does not reveal it.
//!
//! With bearer tokens, a session belongs to the client that opened it: to any other client it does
//! not exist (`session_not_found`, the answer for an unknown id, so its existence is not revealed).
//!
//! Sessions live in this process's memory: a session is served by the instance that opened it.
//! After that instance stops, the client's renewals fail with `session_not_found`; its references
//! stay until the lease's TTL, so a client that opens a new session elsewhere and re-acquires its
//! keys within the TTL gets the same IDs back.
//!
//! **Sessions own their holder names** (issue 20 item 4). A session's holder name is visible to
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

    /// Registers `s` (its lease just granted at `granted`, opened by client `owner`) under a new
    /// id and returns the id.
    pub fn insert(&self, s: ClientSession, granted: Instant, owner: Option<Arc<str>>) -> String {
        let id = new_id();
        let entry = Entry { session: Arc::new(s), renewed: granted, owner, opened: granted };
        self.lock().insert(id.clone(), entry);
        id
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
    /// administrator), with its id.
    pub fn get_any(&self, id_or_holder: &str) -> Result<(String, Arc<ClientSession>), ApiError> {
        let map = self.lock();
        let found = map.iter().find(|(id, e)| {
            !e.over() && (id.as_str() == id_or_holder || e.session.holder() == id_or_holder)
        });
        match found {
            Some((id, e)) => Ok((id.clone(), e.session.clone())),
            None => Err(ApiError::session_not_found()),
        }
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
    fn ids_are_long_random_and_distinct() {
        let a = new_id();
        let b = new_id();
        assert_eq!(a.len(), 64);
        assert!(a.chars().all(|c| c.is_ascii_hexdigit()));
        assert_ne!(a, b);
    }
}
