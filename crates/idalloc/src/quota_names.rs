//! The names and values of `idalloc serve`'s quota records (docs/design/quotas.md): written and
//! read by the service, audited by `idalloc check`, so both take them from here. Pure.
//!
//! ```text
//! P/data/p/quota/<client>/slot/<n>                 -> enc(key)/enc(holder)   (a reference slot)
//! P/data/p/quota/<client>/ref/<enc(h)>/<enc(k)>    -> n                      (its mirror)
//! P/data/p/quota/~creator                          -> <client>/<n>           (the pool's creator)
//! P/sessions/quota-pools/<client>/<n>              -> pool name              (a pool slot)
//! ```
//!
//! Client names are lower-case letters, digits, `.`, `_` and `-` (the tokens file refuses
//! others), so a client's segment never holds `/`, and `~creator` is no client's.

use crate::layout::{dec, enc, Layout};

/// A record name under a pool's quota prefix ([`Layout::quota_prefix`]), parsed.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum QuotaName {
    /// `<client>/slot/<n>`: one of the client's `refs=` slots in the pool.
    Slot { client: String, n: u64 },
    /// `<client>/ref/<enc(holder)>/<enc(key)>`: the mirror of a counted reference, naming its
    /// slot.
    Mirror { client: String, holder: String, key: String },
    /// `~creator`: which client's pool slot counts the pool.
    Creator,
}

impl Layout {
    /// `P/data/p/quota/<client>/`: one client's reference slots and mirrors in pool `p`.
    pub fn quota_client_prefix(&self, pool: &str, client: &str) -> Vec<u8> {
        let mut p = self.quota_prefix(pool);
        p.extend_from_slice(client.as_bytes());
        p.push(b'/');
        p
    }

    /// `P/data/p/quota/<client>/slot/`: the client's reference slots in pool `p`.
    pub fn quota_slots_prefix(&self, pool: &str, client: &str) -> Vec<u8> {
        let mut p = self.quota_client_prefix(pool, client);
        p.extend_from_slice(b"slot/");
        p
    }

    /// `P/data/p/quota/<client>/slot/<n>`: reference slot `n` of the client in pool `p`.
    pub fn quota_slot_key(&self, pool: &str, client: &str, n: u64) -> Vec<u8> {
        let mut p = self.quota_slots_prefix(pool, client);
        p.extend_from_slice(n.to_string().as_bytes());
        p
    }

    /// `P/data/p/quota/<client>/ref/<enc(h)>/<enc(k)>`: the mirror of the client's counted
    /// reference of holder `h` on key `k`.
    pub fn quota_mirror_key(&self, pool: &str, client: &str, holder: &str, key: &str) -> Vec<u8> {
        let mut p = self.quota_client_prefix(pool, client);
        p.extend_from_slice(format!("ref/{}/{}", enc(holder), enc(key)).as_bytes());
        p
    }

    /// `P/data/p/quota/~creator`: the record naming the pool slot that counts pool `p`.
    pub fn quota_creator_key(&self, pool: &str) -> Vec<u8> {
        let mut p = self.quota_prefix(pool);
        p.extend_from_slice(b"~creator");
        p
    }

    /// `P/sessions/quota-pools/`: every client's pool slots.
    pub fn pool_slots_root(&self) -> Vec<u8> {
        let mut p = self.sessions_prefix();
        p.extend_from_slice(b"quota-pools/");
        p
    }

    /// `P/sessions/quota-pools/<client>/`: the client's pool slots.
    pub fn pool_slots_prefix(&self, client: &str) -> Vec<u8> {
        let mut p = self.pool_slots_root();
        p.extend_from_slice(client.as_bytes());
        p.push(b'/');
        p
    }

    /// `P/sessions/quota-pools/<client>/<n>`: the client's pool slot `n`.
    pub fn pool_slot_key(&self, client: &str, n: u64) -> Vec<u8> {
        let mut p = self.pool_slots_prefix(client);
        p.extend_from_slice(n.to_string().as_bytes());
        p
    }

    /// The client and number of a pool slot's record name, or `None` if `record` is not one.
    pub fn parse_pool_slot_key(&self, record: &[u8]) -> Option<(String, u64)> {
        let rest = std::str::from_utf8(record.strip_prefix(self.pool_slots_root().as_slice())?);
        let (client, n) = rest.ok()?.split_once('/')?;
        valid_client(client).then_some(())?;
        Some((client.to_string(), parse_number(n)?))
    }

    /// A record name under pool `pool`'s quota prefix, parsed; `None` if `record` is no quota
    /// record name the service writes.
    pub fn parse_quota_key(&self, pool: &str, record: &[u8]) -> Option<QuotaName> {
        let rest = std::str::from_utf8(record.strip_prefix(self.quota_prefix(pool).as_slice())?);
        let rest = rest.ok()?;
        if rest == "~creator" {
            return Some(QuotaName::Creator);
        }
        let (client, rest) = rest.split_once('/')?;
        if !valid_client(client) {
            return None;
        }
        let client = client.to_string();
        if let Some(n) = rest.strip_prefix("slot/") {
            return Some(QuotaName::Slot { client, n: parse_number(n)? });
        }
        let (h, k) = rest.strip_prefix("ref/")?.split_once('/')?;
        let (holder, key) = (dec(h)?, dec(k)?);
        (!holder.is_empty() && !key.is_empty()).then_some(QuotaName::Mirror { client, holder, key })
    }
}

/// A reference slot's value: the reference it counts, `enc(key)/enc(holder)`.
pub fn slot_value(key: &str, holder: &str) -> Vec<u8> {
    format!("{}/{}", enc(key), enc(holder)).into_bytes()
}

/// The (key, holder) a reference slot's value names.
pub fn parse_slot_value(value: &[u8]) -> Option<(String, String)> {
    let (k, h) = std::str::from_utf8(value).ok()?.split_once('/')?;
    let (key, holder) = (dec(k)?, dec(h)?);
    (!key.is_empty() && !holder.is_empty()).then_some((key, holder))
}

/// A mirror's value: the slot number.
pub fn mirror_value(n: u64) -> Vec<u8> {
    n.to_string().into_bytes()
}

/// The slot number a mirror's value names.
pub fn parse_mirror_value(value: &[u8]) -> Option<u64> {
    parse_number(std::str::from_utf8(value).ok()?)
}

/// A creator record's value: `<client>/<n>`, the pool slot that counts the pool.
pub fn creator_value(client: &str, n: u64) -> Vec<u8> {
    format!("{client}/{n}").into_bytes()
}

/// The (client, n) a creator record's value names.
pub fn parse_creator_value(value: &[u8]) -> Option<(String, u64)> {
    let (client, n) = std::str::from_utf8(value).ok()?.split_once('/')?;
    valid_client(client).then_some(())?;
    Some((client.to_string(), parse_number(n)?))
}

/// A canonical decimal number (no sign, no leading zero but `0` itself).
fn parse_number(s: &str) -> Option<u64> {
    let canonical = !s.is_empty() && (s == "0" || !s.starts_with('0'));
    canonical.then(|| s.parse().ok()).flatten()
}

/// A client name as the tokens file allows it.
fn valid_client(s: &str) -> bool {
    !s.is_empty() && s.bytes().all(|b| b.is_ascii_alphanumeric() || b"-_.".contains(&b))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_parse_back_and_nothing_else_does() {
        let l = Layout::new("p").expect("layout");
        assert_eq!(l.quota_slot_key("x", "t1", 7), b"p/data/x/quota/t1/slot/7".to_vec());
        assert_eq!(l.quota_mirror_key("x", "t1", "h/1", "k%"), b"p/data/x/quota/t1/ref/h%2F1/k%25");
        assert_eq!(l.quota_creator_key("x"), b"p/data/x/quota/~creator".to_vec());
        assert_eq!(l.pool_slot_key("t1", 3), b"p/sessions/quota-pools/t1/3".to_vec());
        let slot = QuotaName::Slot { client: "t1".into(), n: 7 };
        assert_eq!(l.parse_quota_key("x", &l.quota_slot_key("x", "t1", 7)), Some(slot));
        let m = QuotaName::Mirror { client: "t1".into(), holder: "h/1".into(), key: "k%".into() };
        assert_eq!(l.parse_quota_key("x", &l.quota_mirror_key("x", "t1", "h/1", "k%")), Some(m));
        assert_eq!(l.parse_quota_key("x", &l.quota_creator_key("x")), Some(QuotaName::Creator));
        assert_eq!(l.parse_pool_slot_key(&l.pool_slot_key("t1", 3)), Some(("t1".into(), 3)));
        for bad in [
            "p/data/x/quota/t1/slot/07",
            "p/data/x/quota/t1/slot/",
            "p/data/x/quota/t1/slot/-1",
            "p/data/x/quota/t1/other",
            "p/data/x/quota/t1/ref/h",
            "p/data/x/quota/t 1/slot/1",
            "p/data/x/quota/~creator/1",
            "p/data/y/quota/t1/slot/1",
        ] {
            assert_eq!(l.parse_quota_key("x", bad.as_bytes()), None, "{bad}");
        }
        assert_eq!(parse_slot_value(&slot_value("a/b", "h")), Some(("a/b".into(), "h".into())));
        assert_eq!(parse_slot_value(b"nokey"), None);
        assert_eq!(parse_mirror_value(&mirror_value(12)), Some(12));
        assert_eq!(parse_mirror_value(b"012"), None);
        assert_eq!(parse_creator_value(&creator_value("t1", 4)), Some(("t1".into(), 4)));
        assert_eq!(parse_creator_value(b"t/1/4"), None);
    }
}
