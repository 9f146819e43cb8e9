//! Where the allocator's records live in the store (DESIGN §4), and how keys are escaped into
//! record names.
//!
//! ```text
//! P/pools/p                 -> pool spec (JSON)
//! P/data/p/id/<ID>          -> key, or 0xFF + key for a tombstone       (IdRecord)
//! P/data/p/key/<enc(k)>     -> ID (decimal)
//! P/data/p/ref/<enc(k)>/<enc(h)> -> ID (decimal)
//! P/sessions/<lease:016x>   -> a shared client session's record, on its lease (opaque here)
//! P/cluster/version         -> the cluster version (decimal; none means 1)
//! P/cluster/grace           -> the grace after a finalize, on a lease of its length (seconds)
//! ```
//!
//! Everything here is pure: building record names, parsing them back, encoding record values. The
//! escaping [`enc`] never produces `/`, so `ref/<enc(a)>/` never covers the references of key `a/b`
//! (whose segment is `a%2Fb`), which is what makes "no reference left for key k" a single range
//! compare. Pool names are not escaped: they are validated ([`crate::pool::validate_pool_name`]) to
//! a charset without `/` or `%`, and callers pass validated names.
//!
//! Over 600 lines only with its tests: the layout itself is about 350 lines; the tests pin the
//! escaping and the record names byte for byte.

use std::fmt::Write as _;

use crate::error::{Error, Input, Result};

/// The version of this record layout (DESIGN §4), shown by `idalloc version` and
/// `GET /v1/version`: processes that share a store must agree on it. A change that older
/// processes would misread increments it.
pub const LAYOUT_VERSION: u32 = 1;

/// The store prefix used when none is configured.
pub const DEFAULT_PREFIX: &str = "idalloc";

/// Longest store prefix, in bytes. It is repeated in every record name.
pub const MAX_PREFIX_BYTES: usize = 256;

/// First byte of a tombstone's value. No UTF-8 string contains 0xFF, so a tombstone can never be
/// mistaken for a bound key, yet it still names the key it belonged to (DESIGN §4).
pub const TOMBSTONE_MARK: u8 = 0xFF;

/// The record names of one allocator deployment: every name starts with `prefix/`. Several
/// independent deployments can share one etcd by using different prefixes.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Layout {
    prefix: String,
}

impl Default for Layout {
    /// The layout under [`DEFAULT_PREFIX`].
    fn default() -> Self {
        Layout { prefix: DEFAULT_PREFIX.to_string() }
    }
}

impl Layout {
    /// A layout under `prefix`. The prefix must be non-empty, at most [`MAX_PREFIX_BYTES`] bytes,
    /// without a trailing `/` (the layout adds the separator; `a/` would give `a//pools`), and
    /// without control characters (record names must stay readable in `etcdctl get --prefix`).
    /// A leading `/` is allowed (`/registry`-style prefixes are common on shared etcds).
    pub fn new(prefix: impl Into<String>) -> Result<Layout> {
        let prefix = prefix.into();
        const RULE: &str = "a store prefix is 1 to 256 bytes of printable UTF-8 (no control characters) not ending in '/'";
        if prefix.is_empty()
            || prefix.len() > MAX_PREFIX_BYTES
            || prefix.ends_with('/')
            || prefix.chars().any(char::is_control)
        {
            return Err(Error::invalid_str(Input::Options, "store prefix", &prefix, RULE));
        }
        Ok(Layout { prefix })
    }

    /// The prefix, as configured.
    pub fn prefix(&self) -> &str {
        &self.prefix
    }

    /// `P/pools/p`: the pool's spec.
    pub fn pool_spec_key(&self, pool: &str) -> Vec<u8> {
        format!("{}/pools/{pool}", self.prefix).into_bytes()
    }

    /// `P/pools/`: every pool spec (listing pools).
    pub fn pools_prefix(&self) -> Vec<u8> {
        format!("{}/pools/", self.prefix).into_bytes()
    }

    /// `P/data/p/`: every record of one pool (deleting a pool's data, tests asserting G4).
    pub fn pool_data_prefix(&self, pool: &str) -> Vec<u8> {
        format!("{}/data/{pool}/", self.prefix).into_bytes()
    }

    /// `P/data/p/id/<ID>`: the ID's record (the key it is bound to, or a tombstone).
    pub fn id_key(&self, pool: &str, id: u64) -> Vec<u8> {
        format!("{}/data/{pool}/id/{id}", self.prefix).into_bytes()
    }

    /// `P/data/p/id/`: every ID record of the pool, the only prefix caches watch. Note that IDs are
    /// decimal, so the store lists them in string order (`10` before `9`), not numeric order.
    pub fn id_prefix(&self, pool: &str) -> Vec<u8> {
        format!("{}/data/{pool}/id/", self.prefix).into_bytes()
    }

    /// `P/data/p/key/<enc(k)>`: the key's record (its ID).
    pub fn key_key(&self, pool: &str, key: &str) -> Vec<u8> {
        let mut s = format!("{}/data/{pool}/key/", self.prefix);
        enc_into(&mut s, key);
        s.into_bytes()
    }

    /// `P/data/p/key/`: every key record of the pool (the sweeper's snapshot).
    pub fn key_prefix(&self, pool: &str) -> Vec<u8> {
        format!("{}/data/{pool}/key/", self.prefix).into_bytes()
    }

    /// `P/data/p/ref/<enc(k)>/<enc(h)>`: holder `h`'s reference on key `k`.
    pub fn ref_key(&self, pool: &str, key: &str, holder: &str) -> Vec<u8> {
        let mut s = format!("{}/data/{pool}/ref/", self.prefix);
        enc_into(&mut s, key);
        s.push('/');
        enc_into(&mut s, holder);
        s.into_bytes()
    }

    /// `P/data/p/ref/<enc(k)>/`: every reference on key `k` and on no other key ("is anyone still
    /// holding k?" is one range compare on this prefix).
    pub fn ref_prefix(&self, pool: &str, key: &str) -> Vec<u8> {
        let mut s = format!("{}/data/{pool}/ref/", self.prefix);
        enc_into(&mut s, key);
        s.push('/');
        s.into_bytes()
    }

    /// `P/data/p/quota/`: the reference-quota records of `idalloc serve`'s clients in pool `p`
    /// (`quota/<client>/slot/<n>` and `quota/<client>/ref/<enc(h)>/<enc(k)>`: a slot per counted
    /// reference and the mirror naming it). The allocator neither writes nor reads them; they
    /// go with the pool's data.
    pub fn quota_prefix(&self, pool: &str) -> Vec<u8> {
        format!("{}/data/{pool}/quota/", self.prefix).into_bytes()
    }

    /// `P/data/p/ref/`: every reference of the pool (the sweeper's snapshot).
    pub fn refs_prefix(&self, pool: &str) -> Vec<u8> {
        format!("{}/data/{pool}/ref/", self.prefix).into_bytes()
    }

    /// Every proper ancestor of the prefix at a `/` boundary (`a` and `a/b` for `a/b/c`): the
    /// prefixes of deployments this one would lie inside.
    pub fn ancestor_prefixes(&self) -> Vec<String> {
        self.prefix
            .match_indices('/')
            .map(|(i, _)| &self.prefix[..i])
            .filter(|q| !q.is_empty())
            .map(str::to_string)
            .collect()
    }

    /// `P/sessions/<lease as 16 hex digits>`: the record of a shared client session, put on the
    /// session's own lease so that it vanishes with it. What it holds is the
    /// business of whoever opened the session (`idalloc serve` keeps a digest of the session's
    /// secret and its owner there, so that any replica can verify and adopt the session).
    pub fn session_key(&self, lease: crate::store::LeaseId) -> Vec<u8> {
        format!("{}/sessions/{:016x}", self.prefix, lease).into_bytes()
    }

    /// `P/cluster/version`: the cluster version, which protocol features are in force under this
    /// prefix (see [`crate::cluster_version`]).
    pub fn cluster_version_key(&self) -> Vec<u8> {
        format!("{}/cluster/version", self.prefix).into_bytes()
    }

    /// `P/cluster/grace`: present, on a lease as long as the grace, for a while after the cluster
    /// version moved up; the new version's features wait until it is gone (see
    /// [`crate::cluster_version`]).
    pub fn cluster_grace_key(&self) -> Vec<u8> {
        format!("{}/cluster/grace", self.prefix).into_bytes()
    }

    /// `P/cluster/`: the deployment-wide records (the cluster version and its grace).
    pub fn cluster_prefix(&self) -> Vec<u8> {
        format!("{}/cluster/", self.prefix).into_bytes()
    }

    /// `P/sessions/`: every shared client session record.
    pub fn sessions_prefix(&self) -> Vec<u8> {
        format!("{}/sessions/", self.prefix).into_bytes()
    }

    /// The ranges under `P/` that no record of this deployment lies in (everything but
    /// `P/cluster/`, `P/pools/`, `P/data/` and `P/sessions/`): a record there belongs to a
    /// deployment nested inside this one, or to another tool.
    pub fn foreign_ranges(&self) -> Vec<crate::store::KeyRange> {
        use crate::store::{prefix_end, KeyRange};
        let root = format!("{}/", self.prefix).into_bytes();
        let cluster = self.cluster_prefix();
        let data = format!("{}/data/", self.prefix).into_bytes();
        let pools = self.pools_prefix();
        let sessions = self.sessions_prefix();
        // `cluster/` sorts before `data/`, `data/` before `pools/`, which sorts before `sessions/`.
        vec![
            KeyRange::range(root.clone(), cluster.clone()),
            KeyRange::range(prefix_end(&cluster), data.clone()),
            KeyRange::range(prefix_end(&data), pools.clone()),
            KeyRange::range(prefix_end(&pools), sessions.clone()),
            KeyRange::range(prefix_end(&sessions), prefix_end(&root)),
        ]
    }

    /// Where another deployment nested at `P/data/<pool>` (a prefix inside this pool's data)
    /// keeps its records: its `pools/` and `data/`. Deleting the pool must not delete them.
    pub fn nested_in_pool_ranges(&self, pool: &str) -> [crate::store::KeyRange; 2] {
        use crate::store::KeyRange;
        [
            KeyRange::prefix(format!("{}/data/{pool}/pools/", self.prefix).into_bytes()),
            KeyRange::prefix(format!("{}/data/{pool}/data/", self.prefix).into_bytes()),
        ]
    }

    /// `P/data/p/holder/<enc(h)>`: holder `h`'s fence record in pool `p`. Its mod revision is
    /// bumped by releases of `h`, and every create or join of `h` requires it unchanged since a
    /// revision `h` had seen before sending, so a bind that the store applies late (after `h`
    /// released the key again) fails (docs/design/fences.md, "Late commits").
    pub fn holder_key(&self, pool: &str, holder: &str) -> Vec<u8> {
        let mut s = format!("{}/data/{pool}/holder/", self.prefix);
        enc_into(&mut s, holder);
        s.into_bytes()
    }

    /// `P/data/p/fence`: the pool's fence floor. The sweeper folds the holder fence records into
    /// it (deletes them all and puts this record, in one txn), and every create or join with a
    /// holder requires it unchanged since the sender's seen revision, as it requires the holder's
    /// own record: a bind decided before a fold and applied after it fails, whatever record the
    /// fold removed (docs/design/fences.md). Outside `holder/`, so the fold's range
    /// delete and its put never touch one key twice.
    pub fn fence_floor_key(&self, pool: &str) -> Vec<u8> {
        format!("{}/data/{pool}/fence", self.prefix).into_bytes()
    }

    /// `P/data/p/holder/`: every holder fence record of the pool.
    pub fn holders_prefix(&self, pool: &str) -> Vec<u8> {
        format!("{}/data/{pool}/holder/", self.prefix).into_bytes()
    }

    /// The holder of a holder fence record name of pool `pool`, or `None` if `record` is not one.
    pub fn parse_holder_key(&self, pool: &str, record: &[u8]) -> Option<String> {
        let rest = record.strip_prefix(self.holders_prefix(pool).as_slice())?;
        let holder = dec(std::str::from_utf8(rest).ok()?)?;
        (!holder.is_empty()).then_some(holder)
    }

    /// The pool name of a record under [`Layout::pools_prefix`], if it is a valid pool name.
    pub fn parse_pool_spec_key(&self, record: &[u8]) -> Option<String> {
        let rest = record.strip_prefix(self.pools_prefix().as_slice())?;
        let name = std::str::from_utf8(rest).ok()?;
        crate::pool::validate_pool_name(name).ok()?;
        Some(name.to_string())
    }

    /// The ID of an ID record name of pool `pool`, or `None` if `record` is not one (another pool,
    /// another kind of record, or a non-canonical number such as `007` written by hand).
    pub fn parse_id_key(&self, pool: &str, record: &[u8]) -> Option<u64> {
        parse_id_value(record.strip_prefix(self.id_prefix(pool).as_slice())?)
    }

    /// The key of a key record name of pool `pool`, or `None` if `record` is not one (including
    /// escapes [`enc`] would not have produced: each key has exactly one record name).
    pub fn parse_key_key(&self, pool: &str, record: &[u8]) -> Option<String> {
        let rest = record.strip_prefix(self.key_prefix(pool).as_slice())?;
        let key = dec(std::str::from_utf8(rest).ok()?)?;
        (!key.is_empty()).then_some(key)
    }

    /// The key and holder of a reference record name of pool `pool`, or `None` if `record` is not
    /// one.
    pub fn parse_ref_key(&self, pool: &str, record: &[u8]) -> Option<(String, String)> {
        let rest = record.strip_prefix(self.refs_prefix(pool).as_slice())?;
        let (k, h) = std::str::from_utf8(rest).ok()?.split_once('/')?;
        let (key, holder) = (dec(k)?, dec(h)?);
        (!key.is_empty() && !holder.is_empty()).then_some((key, holder))
    }
}

/// Bytes [`enc`] escapes: the separator `/`, the escape character `%`, and control bytes (they make
/// `etcdctl` output unreadable, and 0x00 has special meaning in etcd range ends).
fn needs_escape(b: u8) -> bool {
    b == b'/' || b == b'%' || b < 0x20 || b == 0x7f
}

fn enc_into(out: &mut String, s: &str) {
    for ch in s.chars() {
        // Every byte that needs escaping is ASCII, so it is a whole char.
        match u8::try_from(ch) {
            Ok(b) if needs_escape(b) => {
                // Writing into a String cannot fail.
                let _ = write!(out, "%{b:02X}");
            }
            _ => out.push(ch),
        }
    }
}

/// Escapes a key or holder for use as one record-name segment: `/`, `%` and control bytes
/// (0x00–0x1f, 0x7f) become `%XX` with uppercase hex; everything else, including non-ASCII UTF-8,
/// is kept as is so that names stay readable. Injective, and the result never contains `/`.
pub fn enc(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    enc_into(&mut out, s);
    out
}

/// Undoes [`enc`]. Strict: returns `None` for anything [`enc`] cannot produce (a raw `/` or control
/// byte, a `%` not followed by two uppercase hex digits, an escape of a byte that needs none), so
/// that `enc(dec(s)) == s` whenever `dec(s)` is `Some`: one key, one record name.
pub fn dec(s: &str) -> Option<String> {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        let c = b[i];
        if c == b'%' {
            let hi = hex_upper(*b.get(i + 1)?)?;
            let lo = hex_upper(*b.get(i + 2)?)?;
            let v = hi << 4 | lo;
            if !needs_escape(v) {
                return None;
            }
            out.push(v);
            i += 3;
        } else if needs_escape(c) {
            return None;
        } else {
            out.push(c);
            i += 1;
        }
    }
    String::from_utf8(out).ok()
}

fn hex_upper(c: u8) -> Option<u8> {
    match c {
        b'0'..=b'9' => Some(c - b'0'),
        b'A'..=b'F' => Some(c - b'A' + 10),
        _ => None,
    }
}

/// The value of an ID record (`P/data/p/id/<ID>`).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum IdRecord {
    /// The ID is bound to this key.
    Bound(String),
    /// The ID was freed from this key and is unusable until its quarantine lease expires (G5).
    /// Keeping the key lets recovery (DESIGN §7) rebind the same key to the same ID.
    Tombstone(String),
}

impl IdRecord {
    /// The key the record names (bound or formerly bound).
    pub fn key(&self) -> &str {
        match self {
            IdRecord::Bound(k) | IdRecord::Tombstone(k) => k,
        }
    }

    /// The stored value: the key's bytes for a binding, [`TOMBSTONE_MARK`] then the key's bytes for
    /// a tombstone. Both stay readable with `etcdctl get`.
    pub fn encode(&self) -> Vec<u8> {
        match self {
            IdRecord::Bound(k) => k.as_bytes().to_vec(),
            IdRecord::Tombstone(k) => {
                let mut v = Vec::with_capacity(k.len() + 1);
                v.push(TOMBSTONE_MARK);
                v.extend_from_slice(k.as_bytes());
                v
            }
        }
    }

    /// Parses a stored value. `None` for a value no allocator writes (empty, or not UTF-8 after the
    /// optional mark): the caller treats the ID as used by something it does not understand.
    pub fn decode(value: &[u8]) -> Option<IdRecord> {
        let (tomb, rest) = match value.split_first() {
            Some((&TOMBSTONE_MARK, rest)) => (true, rest),
            _ => (false, value),
        };
        let key = std::str::from_utf8(rest).ok()?;
        if key.is_empty() {
            return None;
        }
        let key = key.to_string();
        Some(if tomb { IdRecord::Tombstone(key) } else { IdRecord::Bound(key) })
    }
}

/// The value of key and reference records: the ID in decimal (readable, and what `etcdctl` users
/// expect).
pub fn encode_id(id: u64) -> Vec<u8> {
    id.to_string().into_bytes()
}

/// Parses a decimal ID as [`encode_id`] writes it; `None` for anything else (empty, sign, spaces,
/// leading zeros, overflow), so each ID has exactly one spelling.
pub fn parse_id_value(value: &[u8]) -> Option<u64> {
    if value.is_empty()
        || !value.iter().all(u8::is_ascii_digit)
        || (value.len() > 1 && value[0] == b'0')
    {
        return None;
    }
    std::str::from_utf8(value).ok()?.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::prefix_end;
    use rand::rngs::StdRng;
    use rand::{Rng, SeedableRng};

    fn l() -> Layout {
        Layout::default()
    }

    /// Random strings biased towards the characters that matter for escaping.
    fn random_string(rng: &mut impl Rng, max_chars: usize) -> String {
        const ALPHABET: &[char] = &[
            'a', 'b', 'A', 'F', '0', '2', '/', '%', ' ', '\0', '\n', '\u{1f}', '\u{7f}', '\u{80}',
            'é', '😀', '-', '.',
        ];
        let n = rng.random_range(0..=max_chars);
        (0..n)
            .map(|_| {
                if rng.random_bool(0.1) {
                    // Any Unicode scalar value.
                    loop {
                        if let Some(c) = char::from_u32(rng.random_range(0..=0x10FFFF)) {
                            break c;
                        }
                    }
                } else {
                    ALPHABET[rng.random_range(0..ALPHABET.len())]
                }
            })
            .collect()
    }

    #[test]
    fn record_names() {
        let l = l();
        assert_eq!(l.pool_spec_key("p"), b"idalloc/pools/p");
        assert_eq!(l.pools_prefix(), b"idalloc/pools/");
        assert_eq!(l.pool_data_prefix("p"), b"idalloc/data/p/");
        assert_eq!(l.id_key("p", 42), b"idalloc/data/p/id/42");
        assert_eq!(l.id_prefix("p"), b"idalloc/data/p/id/");
        assert_eq!(l.key_key("p", "a/b%c d"), b"idalloc/data/p/key/a%2Fb%25c d");
        assert_eq!(l.key_prefix("p"), b"idalloc/data/p/key/");
        assert_eq!(l.ref_key("p", "a/b", "node-1/7"), b"idalloc/data/p/ref/a%2Fb/node-1%2F7");
        assert_eq!(l.ref_prefix("p", "a/b"), b"idalloc/data/p/ref/a%2Fb/");
        assert_eq!(l.refs_prefix("p"), b"idalloc/data/p/ref/");
        let l = Layout::new("/registry/ids").unwrap();
        assert_eq!(l.id_key("x", 1), b"/registry/ids/data/x/id/1");
    }

    #[test]
    fn every_record_of_a_pool_is_under_its_data_prefix_and_no_other_pools() {
        let l = l();
        for pool in ["p", "p.x", "p-1"] {
            let data = l.pool_data_prefix(pool);
            for rec in [
                l.id_key(pool, 1),
                l.key_key(pool, "k"),
                l.ref_key(pool, "k", "h"),
                l.id_prefix(pool),
                l.key_prefix(pool),
                l.refs_prefix(pool),
                l.holder_key(pool, "h"),
                l.holders_prefix(pool),
            ] {
                assert!(rec.starts_with(&data));
                assert!(!rec.starts_with(&l.pools_prefix()));
                for other in ["p", "p.x", "p-1"].into_iter().filter(|o| *o != pool) {
                    assert!(!rec.starts_with(&l.pool_data_prefix(other)));
                }
            }
        }
    }

    #[test]
    fn holder_records_round_trip_and_are_no_other_record() {
        let l = l();
        for h in ["h", "a/b", "100%", "x y"] {
            let rec = l.holder_key("p", h);
            assert_eq!(l.parse_holder_key("p", &rec).as_deref(), Some(h));
            assert_eq!(l.parse_id_key("p", &rec), None);
            assert_eq!(l.parse_key_key("p", &rec), None);
            assert_eq!(l.parse_ref_key("p", &rec), None);
            assert_eq!(l.parse_holder_key("q", &rec), None);
        }
        assert_eq!(l.parse_holder_key("p", &l.ref_key("p", "k", "h")), None);
        assert_eq!(l.parse_holder_key("p", &l.holders_prefix("p")), None);
    }

    #[test]
    fn prefix_rules() {
        assert_eq!(Layout::new("idalloc").unwrap(), Layout::default());
        Layout::new("a/b").unwrap();
        Layout::new("é").unwrap();
        Layout::new("x".repeat(MAX_PREFIX_BYTES)).unwrap();
        for bad in ["", "a/", "/", "a\nb", "a\0", "\u{7f}", &"x".repeat(MAX_PREFIX_BYTES + 1)] {
            match Layout::new(bad).unwrap_err() {
                Error::InvalidInput { what, rule, .. } => {
                    assert_eq!(what, "store prefix");
                    assert!(rule.contains("not ending in '/'"));
                }
                other => panic!("{other:?}"),
            }
        }
    }

    #[test]
    fn nesting_ranges() {
        let l = Layout::new("pa/data/vni").unwrap();
        assert_eq!(l.ancestor_prefixes(), ["pa", "pa/data"]);
        assert_eq!(Layout::new("/registry/ids").unwrap().ancestor_prefixes(), ["/registry"]);
        assert!(Layout::default().ancestor_prefixes().is_empty());
        // Foreign ranges cover every name under P/ except P's own pools/, data/ and sessions/.
        assert_eq!(Layout::new("pa").unwrap().session_key(7), b"pa/sessions/0000000000000007");
        let a = Layout::new("pa").unwrap();
        let foreign = a.foreign_ranges();
        let in_foreign = |k: &[u8]| foreign.iter().any(|r| r.contains(k));
        for own in
            [a.pool_spec_key("vni"), a.id_key("vni", 1), a.ref_key("x", "k", "h"), a.session_key(7)]
        {
            assert!(!in_foreign(&own), "{:?}", String::from_utf8_lossy(&own));
        }
        for other in [
            &b"pa/b/pools/x"[..],
            b"pa/a",
            b"pa/datax/1",
            b"pa/pools0",
            b"pa/sessions0",
            b"pa/zzz",
            b"pa/",
        ] {
            assert!(in_foreign(other), "{:?}", String::from_utf8_lossy(other));
        }
        assert!(!in_foreign(b"pb/pools/x") && !in_foreign(b"pa0"));
        // B at pa/data/vni keeps its specs and data where A's pool vni's nested ranges are.
        let b = Layout::new("pa/data/vni").unwrap();
        let [np, nd] = a.nested_in_pool_ranges("vni");
        assert!(np.contains(&b.pool_spec_key("x")) && nd.contains(&b.id_key("x", 1)));
        assert!(!np.contains(&a.id_key("vni", 1)) && !nd.contains(&a.key_key("vni", "data")));
    }

    #[test]
    fn enc_examples() {
        assert_eq!(enc("plain key"), "plain key");
        assert_eq!(enc("a/b"), "a%2Fb");
        assert_eq!(enc("100%"), "100%25");
        assert_eq!(enc("\0\n\u{1f}\u{7f}"), "%00%0A%1F%7F");
        assert_eq!(enc("é😀\u{80}"), "é😀\u{80}");
        assert_eq!(enc("%2F"), "%252F");
        assert_eq!(enc(""), "");
    }

    #[test]
    fn dec_is_strict() {
        assert_eq!(dec("a%2Fb").as_deref(), Some("a/b"));
        assert_eq!(dec("%00%7F%25").as_deref(), Some("\0\u{7f}%"));
        for bad in ["a/b", "%2f", "%", "%2", "%G0", "%41", "a\nb", "\u{7f}", "%20", "%C3%A9"] {
            assert_eq!(dec(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn enc_dec_round_trip_random() {
        let mut rng = StdRng::seed_from_u64(0x1d_a110c);
        let mut seen = std::collections::HashMap::new();
        for _ in 0..20_000 {
            let s = random_string(&mut rng, 12);
            let e = enc(&s);
            assert!(!e.contains('/'), "{s:?} -> {e:?}");
            assert!(!e.bytes().any(|b| b < 0x20 || b == 0x7f), "{s:?} -> {e:?}");
            assert_eq!(dec(&e).as_deref(), Some(s.as_str()));
            // Injective: no two different strings share an encoding.
            if let Some(prev) = seen.insert(e.clone(), s.clone()) {
                assert_eq!(prev, s, "{e:?}");
            }
        }
    }

    #[test]
    fn dec_then_enc_is_identity_random() {
        // Random strings that dec accepts must be exactly what enc would produce.
        let mut rng = StdRng::seed_from_u64(7);
        let mut accepted = 0;
        for _ in 0..50_000 {
            let s = random_string(&mut rng, 8).replace("é", "%2F").replace('b', "%25");
            if let Some(d) = dec(&s) {
                accepted += 1;
                assert_eq!(enc(&d), s);
            }
        }
        assert!(accepted > 1000, "the test should exercise accepted strings too: {accepted}");
    }

    #[test]
    fn key_and_ref_names_round_trip_random() {
        let l = l();
        let mut rng = StdRng::seed_from_u64(42);
        for _ in 0..5_000 {
            let mut key = random_string(&mut rng, 10);
            if key.is_empty() {
                key.push('k');
            }
            let mut holder = random_string(&mut rng, 6);
            if holder.is_empty() {
                holder.push('h');
            }
            assert_eq!(l.parse_key_key("p", &l.key_key("p", &key)).as_deref(), Some(key.as_str()));
            assert_eq!(
                l.parse_ref_key("p", &l.ref_key("p", &key, &holder)),
                Some((key.clone(), holder.clone()))
            );
            assert!(l.ref_key("p", &key, &holder).starts_with(&l.ref_prefix("p", &key)));
            assert_eq!(l.parse_key_key("q", &l.key_key("p", &key)), None);
            assert_eq!(l.parse_ref_key("p", &l.key_key("p", &key)), None);
        }
    }

    #[test]
    fn ref_prefix_of_a_key_never_covers_another_keys_refs() {
        let l = l();
        // The classic case: "a" and "a/b".
        let pa = l.ref_prefix("p", "a");
        assert!(!l.ref_key("p", "a/b", "h").starts_with(&pa));
        assert!(!l.ref_key("p", "a/", "h").starts_with(&pa));
        // Also as a range: [ref_prefix(a), prefix_end(ref_prefix(a))) excludes a/b's refs.
        let end = prefix_end(&pa);
        let rab = l.ref_key("p", "a/b", "h");
        assert!(!(rab >= pa && rab < end));
        // Random pairs: ref_key(k2, h) is under ref_prefix(k1) exactly when k1 == k2.
        let mut rng = StdRng::seed_from_u64(99);
        for _ in 0..20_000 {
            let k1 = format!("{}x", random_string(&mut rng, 4));
            let k2 = if rng.random_bool(0.5) {
                format!("{k1}{}", random_string(&mut rng, 3))
            } else {
                format!("{}x", random_string(&mut rng, 4))
            };
            let h = format!("h{}", random_string(&mut rng, 3));
            let under = l.ref_key("p", &k2, &h).starts_with(&l.ref_prefix("p", &k1));
            assert_eq!(under, k1 == k2, "k1={k1:?} k2={k2:?} h={h:?}");
        }
    }

    #[test]
    fn holder_order_within_a_key() {
        // The release compare splits a key's refs around ref/k/h: [ref/k/, ref/k/h) and
        // (ref/k/h, end). Appending 0x00 to ref/k/h gives the first name after it, and no other
        // holder's name falls between (enc never produces 0x00).
        let l = l();
        let h = l.ref_key("p", "k", "h");
        let mut after = h.clone();
        after.push(0);
        for other in ["g", "h0", "h/", "h%", "ha", "hz", "i", "\0"] {
            let o = l.ref_key("p", "k", other);
            assert!(o < h || o >= after, "{other:?}");
            assert!(o != after);
        }
    }

    #[test]
    fn parse_id_key_edge_cases() {
        let l = l();
        assert_eq!(l.parse_id_key("p", b"idalloc/data/p/id/42"), Some(42));
        assert_eq!(l.parse_id_key("p", b"idalloc/data/p/id/0"), Some(0));
        assert_eq!(l.parse_id_key("p", b"idalloc/data/p/id/18446744073709551615"), Some(u64::MAX));
        for bad in [
            &b"idalloc/data/p/id/"[..],
            b"idalloc/data/p/id/007",
            b"idalloc/data/p/id/18446744073709551616",
            b"idalloc/data/p/id/1/2",
            b"idalloc/data/p/id/+1",
            b"idalloc/data/p/id/ 1",
            b"idalloc/data/p/id/-1",
            b"idalloc/data/q/id/1",
            b"idalloc/data/p.x/id/1",
            b"idalloc/data/p/key/1",
            b"other/data/p/id/1",
        ] {
            assert_eq!(l.parse_id_key("p", bad), None, "{:?}", String::from_utf8_lossy(bad));
        }
        for id in [1, 9, 10, 99, 100, u64::MAX - 1] {
            assert_eq!(l.parse_id_key("p", &l.id_key("p", id)), Some(id));
        }
        // Decimal names sort as strings: the cache must not rely on numeric order of a listing.
        assert!(l.id_key("p", 10) < l.id_key("p", 9));
    }

    #[test]
    fn parse_key_and_ref_edge_cases() {
        let l = l();
        assert_eq!(l.parse_key_key("p", b"idalloc/data/p/key/"), None, "empty key");
        assert_eq!(l.parse_key_key("p", b"idalloc/data/p/key/a/b"), None, "raw slash");
        assert_eq!(l.parse_key_key("p", b"idalloc/data/p/key/a%2fb"), None, "lowercase escape");
        assert_eq!(l.parse_key_key("p", b"idalloc/data/p/key/\xff"), None, "not UTF-8");
        assert_eq!(l.parse_key_key("p", b"idalloc/data/p/key/a%2Fb").as_deref(), Some("a/b"));
        assert_eq!(l.parse_ref_key("p", b"idalloc/data/p/ref/k"), None, "no holder");
        assert_eq!(l.parse_ref_key("p", b"idalloc/data/p/ref/k/"), None, "empty holder");
        assert_eq!(l.parse_ref_key("p", b"idalloc/data/p/ref//h"), None, "empty key");
        assert_eq!(l.parse_ref_key("p", b"idalloc/data/p/ref/k/h/x"), None, "raw slash in holder");
        assert_eq!(
            l.parse_ref_key("p", b"idalloc/data/p/ref/k/h").map(|(k, h)| k + "|" + &h).as_deref(),
            Some("k|h")
        );
    }

    #[test]
    fn parse_pool_spec_keys() {
        let l = l();
        assert_eq!(l.parse_pool_spec_key(&l.pool_spec_key("net-1")).as_deref(), Some("net-1"));
        assert_eq!(l.parse_pool_spec_key(b"idalloc/pools/"), None);
        assert_eq!(l.parse_pool_spec_key(b"idalloc/pools/Bad"), None);
        assert_eq!(l.parse_pool_spec_key(b"idalloc/data/p/id/1"), None);
    }

    #[test]
    fn id_records() {
        for key in ["k", "a/b", "é😀", "\0", &"x".repeat(4096)] {
            for rec in [IdRecord::Bound(key.to_string()), IdRecord::Tombstone(key.to_string())] {
                assert_eq!(IdRecord::decode(&rec.encode()), Some(rec.clone()));
                assert_eq!(rec.key(), key);
            }
        }
        assert_eq!(IdRecord::Bound("k".into()).encode(), b"k");
        assert_eq!(IdRecord::Tombstone("k".into()).encode(), b"\xffk");
        assert_eq!(IdRecord::decode(b""), None);
        assert_eq!(IdRecord::decode(b"\xff"), None, "a tombstone must name its key");
        assert_eq!(IdRecord::decode(b"a\xffb"), None, "not UTF-8");
        assert_eq!(IdRecord::decode(b"\xff\xff"), None);
        assert_eq!(IdRecord::decode(b"\xc3"), None, "truncated UTF-8");
        // A tombstone never decodes as a binding of any key, and vice versa.
        let mut rng = StdRng::seed_from_u64(3);
        for _ in 0..2_000 {
            let k = format!("{}k", random_string(&mut rng, 6));
            assert!(matches!(
                IdRecord::decode(&IdRecord::Tombstone(k.clone()).encode()),
                Some(IdRecord::Tombstone(_))
            ));
            assert!(matches!(
                IdRecord::decode(&IdRecord::Bound(k).encode()),
                Some(IdRecord::Bound(_))
            ));
        }
    }

    #[test]
    fn id_values() {
        for id in [0, 1, 10, 65535, u64::MAX] {
            assert_eq!(parse_id_value(&encode_id(id)), Some(id));
        }
        assert_eq!(encode_id(1234), b"1234");
        for bad in
            [&b""[..], b"01", b"00", b"1 ", b"-1", b"+1", b"0x10", b"18446744073709551616", b"1e3"]
        {
            assert_eq!(parse_id_value(bad), None, "{:?}", String::from_utf8_lossy(bad));
        }
    }
}
