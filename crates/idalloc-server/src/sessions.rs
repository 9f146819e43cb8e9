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

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use idalloc::ClientSession;
use rand::RngCore;

use crate::auth::Client;
use crate::error::ApiError;

/// Open sessions by id, with when each was last renewed.
#[derive(Default)]
pub struct Sessions {
    map: Mutex<HashMap<String, Entry>>,
}

struct Entry {
    session: Arc<ClientSession>,
    /// When the lease was granted or last renewed. Only this service renews it, so once a TTL has
    /// passed since, the store has expired it (or is about to): the session is over.
    renewed: Instant,
    /// The client that opened it (with tokens).
    owner: Option<Arc<str>>,
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
        self.lock().insert(id.clone(), Entry { session: Arc::new(s), renewed: granted, owner });
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
    fn ids_are_long_random_and_distinct() {
        let a = new_id();
        let b = new_id();
        assert_eq!(a.len(), 64);
        assert!(a.chars().all(|c| c.is_ascii_hexdigit()));
        assert_ne!(a, b);
    }
}
