//! Pool specs: the ID range, reserved IDs, prefix bits and reclaim settings of one pool, with their
//! validation, their JSON form in the store, and the input rules for pool names, keys and holders.
//!
//! A spec is written once by `init_pool` and compared on every later `init_pool` (equal → Ok,
//! different → [`Error::RangeMismatch`]), so its representation is canonical: reserved ranges are
//! sorted and merged, durations have millisecond precision. Two specs that mean the same are equal.

use std::time::Duration;

use crate::error::{show_value, Error, Input, Result};
use crate::spec::{bits_covering, fmt_range, fmt_ranges, normalize_ranges, whole_millis};
pub use crate::spec::{PoolSpec, Strategy};

/// Longest key, in bytes (DESIGN §1). Bounds the size of store keys (escaped keys appear in three
/// record names) and of txns.
pub const MAX_KEY_BYTES: usize = 4096;

/// Longest holder name, in bytes. Holders appear in reference record names; they are process or
/// service identities, never payloads.
pub const MAX_HOLDER_BYTES: usize = 256;

/// Longest namespace a service puts before a holder name it stores for a client (`idalloc serve`
/// stores `CLIENT/HOLDER`: a client name of at most 63 bytes and the separator), so that a
/// holder of [`MAX_HOLDER_BYTES`] is accepted under a namespace as without one.
pub const MAX_HOLDER_NAMESPACE_BYTES: usize = 64;

/// Longest holder name the pool operations accept: [`MAX_HOLDER_BYTES`] plus a namespace
/// ([`MAX_HOLDER_NAMESPACE_BYTES`]).
pub const MAX_STORED_HOLDER_BYTES: usize = MAX_HOLDER_BYTES + MAX_HOLDER_NAMESPACE_BYTES;

/// Most reserved ranges a pool may have. Each range is a node of every cache's free-ID structure
/// and part of the spec JSON read by every process; 10,000 keeps both small (a few hundred KiB).
pub const MAX_RESERVED_RANGES: usize = 10_000;

/// Longest `idle_grace` and `reuse_delay`: 30 days. Longer values are almost certainly unit mistakes
/// (seconds given as milliseconds); a reuse delay is a lease TTL, and etcd leases are not meant to
/// last months.
pub const MAX_DELAY: Duration = Duration::from_secs(30 * 24 * 3600);

const POOL_NAME_RULE: &str =
    "pool names match [a-z0-9][a-z0-9._-]{0,62} (1 to 63 lowercase letters, digits, '.', '_', '-'; first a letter or digit)";
const KEY_RULE: &str = "keys are non-empty UTF-8, at most 4096 bytes";
const HOLDER_RULE: &str = "holders are non-empty UTF-8, at most 256 bytes";
const STORED_HOLDER_RULE: &str =
    "holders are non-empty UTF-8, at most 256 bytes (320 with a namespace such as CLIENT/)";

impl PoolSpec {
    /// The end of the builder chain that starts at [`PoolSpec::new`]: the spec, checked by
    /// [`PoolSpec::validate`].
    ///
    /// ```
    /// use idalloc::PoolSpec;
    /// let spec = PoolSpec::new("vni", 4096, 16_777_215).reserve(4096..=4100).build()?;
    /// assert_eq!(spec.capacity(), 16_777_215 - 4096 + 1 - 5);
    /// assert!(PoolSpec::new("vni", 0, 10).build().is_err());
    /// # Ok::<(), idalloc::Error>(())
    /// ```
    pub fn build(self) -> Result<PoolSpec> {
        self.validate()?;
        Ok(self)
    }

    /// Checks every rule a pool spec must follow and names the first value that breaks one:
    /// - the name matches `[a-z0-9][a-z0-9._-]{0,62}` (it is a store path segment);
    /// - `1 <= min <= max`: ID 0 is never handed out, it means "no ID" (as in Cilium, where identity
    ///   0 is invalid, and Contiv, whose IDs start at 1), so zero-initialised fields are never taken
    ///   for a real binding;
    /// - every reserved ID lies in `[min, max]`, there are at most [`MAX_RESERVED_RANGES`] reserved
    ///   ranges, and at least one ID stays allocatable;
    /// - the prefix shares no bit with any number up to `max`, so `prefix | raw` is injective and
    ///   [`PoolSpec::strip_prefix`] can undo it;
    /// - `idle_grace` and `reuse_delay` are at most [`MAX_DELAY`].
    pub fn validate(&self) -> Result<()> {
        validate_pool_name(self.name())?;
        if self.min() == 0 {
            return Err(Error::invalid(
                Input::Spec,
                "pool min",
                0,
                "the lowest ID must be at least 1: ID 0 means \"no ID\" and is never handed out",
            ));
        }
        if self.min() > self.max() {
            return Err(Error::invalid(
                Input::Spec,
                "pool range",
                format!("[{}, {}]", self.min(), self.max()),
                "min must not exceed max",
            ));
        }
        if self.reserved().len() > MAX_RESERVED_RANGES {
            return Err(Error::invalid(
                Input::Spec,
                "reserved ID list",
                format!("of {} ranges", self.reserved().len()),
                format!(
                    "at most {MAX_RESERVED_RANGES} reserved ranges (after merging adjacent ones)"
                ),
            ));
        }
        if let Some(&(lo, hi)) = self.reserved().iter().find(|(lo, hi)| lo > hi) {
            return Err(Error::invalid(
                Input::Spec,
                "reserved range",
                format!("[{lo}, {hi}]"),
                "start must not exceed end",
            ));
        }
        if let Some(&(lo, hi)) =
            self.reserved().iter().find(|&&(lo, hi)| lo < self.min() || hi > self.max())
        {
            return Err(Error::invalid(
                Input::Spec,
                "reserved range",
                fmt_range(lo, hi),
                format!("reserved IDs must lie in the pool range [{}, {}]", self.min(), self.max()),
            ));
        }
        if self.capacity() == 0 {
            return Err(Error::invalid(
                Input::Spec,
                "reserved ID list",
                fmt_ranges(self.reserved()),
                format!(
                    "at least one ID of [{}, {}] must stay allocatable",
                    self.min(),
                    self.max()
                ),
            ));
        }
        let id_bits = bits_covering(self.max());
        if self.prefix_bits() & id_bits != 0 {
            return Err(Error::invalid(
                Input::Spec,
                "pool prefix",
                format!("{:#x}", self.prefix_bits()),
                format!(
                    "prefix bits must not overlap the ID bits {id_bits:#x} used by IDs up to max {}",
                    self.max()
                ),
            ));
        }
        for (what, d) in [
            ("idle_grace", self.idle_grace_duration()),
            ("reuse_delay", self.reuse_delay_duration()),
        ] {
            if d > MAX_DELAY {
                return Err(Error::invalid(
                    Input::Spec,
                    what,
                    format!("{}ms", whole_millis(d)),
                    format!("at most {}ms (30 days)", MAX_DELAY.as_millis()),
                ));
            }
        }
        Ok(())
    }

    /// Parses and validates a spec read from the store. A spec that does not parse or breaks a rule
    /// (edited by hand, or written by a buggy tool) is reported as [`Error::InvalidInput`] naming
    /// the problem, never used.
    pub fn from_json(bytes: &[u8]) -> Result<PoolSpec> {
        let spec: PoolSpec = serde_json::from_slice(bytes).map_err(|e| {
            Error::invalid_str(
                Input::Spec,
                "pool spec JSON",
                &String::from_utf8_lossy(bytes),
                format!("cannot parse: {e}"),
            )
        })?;
        spec.validate()?;
        Ok(spec)
    }
}

/// Checks a pool name: `[a-z0-9][a-z0-9._-]{0,62}`. Pool names are store path segments and
/// appear in CLI commands and metrics labels; the strict charset keeps them safe in all three.
pub fn validate_pool_name(name: &str) -> Result<()> {
    let b = name.as_bytes();
    let ok = !b.is_empty()
        && b.len() <= 63
        && (b[0].is_ascii_lowercase() || b[0].is_ascii_digit())
        && b.iter().all(|&c| {
            c.is_ascii_lowercase() || c.is_ascii_digit() || matches!(c, b'.' | b'_' | b'-')
        });
    if ok {
        Ok(())
    } else {
        Err(Error::invalid_str(Input::PoolName, "pool name", name, POOL_NAME_RULE))
    }
}

/// Checks a key: non-empty, at most [`MAX_KEY_BYTES`] bytes. UTF-8 is guaranteed by `&str`; any
/// character is allowed (keys are escaped in store paths, see `layout`).
pub fn validate_key(key: &str) -> Result<()> {
    if key.is_empty() || key.len() > MAX_KEY_BYTES {
        return Err(Error::invalid(
            Input::Key,
            "key",
            if key.is_empty() { "\"\" (0 bytes)".to_string() } else { show_len(key) },
            KEY_RULE,
        ));
    }
    Ok(())
}

/// Checks a key given as bytes (CLI arguments, HTTP bodies) and returns it as `&str`. Non-UTF-8
/// input is reported with the byte offset of the first invalid byte.
pub fn validate_key_bytes(key: &[u8]) -> Result<&str> {
    match std::str::from_utf8(key) {
        Ok(s) => {
            validate_key(s)?;
            Ok(s)
        }
        Err(e) => Err(Error::invalid(
            Input::Key,
            "key",
            format!("{} ({} bytes)", show_value(&String::from_utf8_lossy(key)), key.len()),
            format!("{KEY_RULE}; invalid UTF-8 at byte offset {}", e.valid_up_to()),
        )),
    }
}

/// The prefix of the leased holder names the library generates (an allocator's default holder
/// `lease:<host>-<8 hex>`, and its client sessions' `…-c<lease>`), which durable holder names may
/// not use ([`validate_durable_holder`]).
///
/// Why: a holder's fence record (`holder/<h>`) is keyed by the name alone, so a durable holder
/// named like a process's leased holder shares that process's record; a leased release of an
/// in-doubt key can put the record on the session lease, where it vanishes with the lease without
/// raising the pool's floor (docs/design/protocol.md). Keeping the two kinds of
/// names apart closes that without changing the store's layout.
pub const LEASED_HOLDER_PREFIX: &str = "lease:";

/// Checks a durable holder name: a valid holder ([`validate_holder`]) that does not start with
/// [`LEASED_HOLDER_PREFIX`], the namespace of generated leased holder names.
pub fn validate_durable_holder(holder: &str) -> Result<()> {
    validate_holder(holder)?;
    not_leased(holder)
}

/// Refuses a durable holder name in the namespace of leased holder names.
fn not_leased(holder: &str) -> Result<()> {
    if holder.starts_with(LEASED_HOLDER_PREFIX) {
        return Err(Error::invalid(
            Input::Holder,
            "durable holder",
            show_value(holder),
            format!(
                "durable holder names must not start with {LEASED_HOLDER_PREFIX:?}: the library \
                 names leased holders so, and a durable holder sharing a leased holder's name \
                 would share its fence record"
            ),
        ));
    }
    Ok(())
}

/// Checks a holder name: non-empty, at most [`MAX_HOLDER_BYTES`] bytes (escaped in store paths like
/// keys).
pub fn validate_holder(holder: &str) -> Result<()> {
    if holder.is_empty() || holder.len() > MAX_HOLDER_BYTES {
        return Err(Error::invalid(Input::Holder, "holder", show_len(holder), HOLDER_RULE));
    }
    Ok(())
}

/// Checks a holder name a pool operation receives: as [`validate_holder`], but up to
/// [`MAX_STORED_HOLDER_BYTES`], so that a name of [`MAX_HOLDER_BYTES`] still fits under a
/// service's namespace (`CLIENT/HOLDER`).
pub fn validate_stored_holder(holder: &str) -> Result<()> {
    if holder.is_empty() || holder.len() > MAX_STORED_HOLDER_BYTES {
        return Err(Error::invalid(Input::Holder, "holder", show_len(holder), STORED_HOLDER_RULE));
    }
    Ok(())
}

/// [`validate_durable_holder`] with the length of [`validate_stored_holder`]: the check of the
/// pool operations on durable references.
pub fn validate_stored_durable_holder(holder: &str) -> Result<()> {
    validate_stored_holder(holder)?;
    not_leased(holder)
}

/// A value shown with its length in bytes (length errors are about that length).
fn show_len(s: &str) -> String {
    let shown = show_value(s);
    if shown.ends_with(" bytes)") {
        shown
    } else {
        format!("{shown} ({} bytes)", s.len())
    }
}

/// Parses a reserved-ID list such as `"5,7,10-20"`: comma-separated decimal IDs and inclusive
/// `a-b` ranges, spaces around tokens allowed. Returns the ranges sorted and merged. Errors name
/// the bad token.
///
/// Every item must be present: an empty list (`""`) is refused just like an empty item (`5,,7`,
/// `,,,`), with the same kind of message, because both are the same typo (a variable that
/// expanded to nothing). "No reserved IDs" is said by giving no list at all.
pub fn parse_id_list(list: &str) -> Result<Vec<(u64, u64)>> {
    const RULE: &str = "a reserved ID list is comma-separated decimal IDs or inclusive ranges a-b with a <= b, e.g. 5,7,10-20";
    if list.trim().is_empty() {
        return Err(Error::invalid_str(
            Input::Spec,
            "reserved ID list",
            list,
            format!("the list is empty (for no reserved IDs, give no list); {RULE}"),
        ));
    }
    let mut out = Vec::new();
    for token in list.split(',') {
        let t = token.trim();
        let bad = || {
            if t.is_empty() {
                Error::invalid_str(
                    Input::Spec,
                    "reserved ID list",
                    list,
                    format!("it has an empty item (a comma at either end or two in a row); {RULE}"),
                )
            } else {
                Error::invalid_str(Input::Spec, "reserved ID list token", t, RULE)
            }
        };
        let parse = |s: &str| -> Result<u64> {
            let s = s.trim();
            if s.is_empty() || !s.bytes().all(|c| c.is_ascii_digit()) {
                return Err(bad());
            }
            s.parse::<u64>().map_err(|_| bad())
        };
        let (lo, hi) = match t.split_once('-') {
            Some((a, b)) => (parse(a)?, parse(b)?),
            None => {
                let v = parse(t)?;
                (v, v)
            }
        };
        if lo > hi {
            return Err(bad());
        }
        out.push((lo, hi));
    }
    Ok(normalize_ranges(out))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rule_of(e: Error) -> (String, String, String) {
        match e {
            Error::InvalidInput { what, value, rule, .. } => (what, value, rule),
            other => panic!("expected InvalidInput, got {other:?}"),
        }
    }

    #[test]
    fn builder_normalizes_reserved_ranges() {
        let s = PoolSpec::new("p", 1, 100)
            .reserve(10..=20)
            .reserve(5..=5)
            .reserve(15..=25)
            .reserve(26..=30);
        assert_eq!(s.reserved(), &[(5, 5), (10, 30)]);
        #[allow(clippy::reversed_empty_ranges)] // the point: an empty range reserves nothing
        let s = s.reserve(9..=3);
        assert_eq!(s.reserved(), &[(5, 5), (10, 30)]);
        let s = PoolSpec::new("p", 1, 100).reserve_all(&[(7, 8), (1, 2), (3, 6), (9, 1)]);
        assert_eq!(s.reserved(), &[(1, 8)]);
        let s =
            PoolSpec::new("p", 1, u64::MAX).reserve(u64::MAX - 1..=u64::MAX).reserve(5..=u64::MAX);
        assert_eq!(s.reserved(), &[(5, u64::MAX)]);
    }

    #[test]
    fn valid_specs_pass() {
        PoolSpec::new("p", 1, 1).validate().unwrap();
        PoolSpec::new("cilium.identity-0_x", 256, 65535)
            .reserve(256..=300)
            .prefix(1 << 24)
            .strategy(Strategy::Lowest)
            .idle_grace(Duration::from_secs(60))
            .reuse_delay(MAX_DELAY)
            .validate()
            .unwrap();
        PoolSpec::new("big", 1, u64::MAX).validate().unwrap();
        PoolSpec::new("p", 1, (1 << 32) - 1).prefix(0xff << 32).validate().unwrap();
    }

    #[test]
    fn pool_names() {
        for ok in ["a", "0", "a.b_c-d", &"x".repeat(63), "9abc"] {
            validate_pool_name(ok).unwrap();
        }
        for bad in ["", "A", "-a", ".a", "_a", "a/b", "a b", "é", &"x".repeat(64), "a\n"] {
            let (what, value, rule) = rule_of(validate_pool_name(bad).unwrap_err());
            assert_eq!(what, "pool name");
            assert!(value.starts_with('"'), "{value}");
            assert!(rule.contains("[a-z0-9][a-z0-9._-]{0,62}"));
        }
        let e = PoolSpec::new("Bad", 1, 2).validate().unwrap_err();
        assert_eq!(e.to_string().split(':').next().unwrap(), "invalid pool name \"Bad\"");
    }

    #[test]
    fn range_rules() {
        let (what, value, rule) = rule_of(PoolSpec::new("p", 0, 10).validate().unwrap_err());
        assert_eq!((what.as_str(), value.as_str()), ("pool min", "0"));
        assert!(rule.contains("no ID"));
        let (what, value, _) = rule_of(PoolSpec::new("p", 10, 9).validate().unwrap_err());
        assert_eq!((what.as_str(), value.as_str()), ("pool range", "[10, 9]"));
        let (what, value, rule) =
            rule_of(PoolSpec::new("p", 10, 20).reserve(5..=12).validate().unwrap_err());
        assert_eq!((what.as_str(), value.as_str()), ("reserved range", "5-12"));
        assert!(rule.contains("[10, 20]"));
        let (_, value, _) =
            rule_of(PoolSpec::new("p", 10, 20).reserve(21..=21).validate().unwrap_err());
        assert_eq!(value, "21");
        let (what, _, rule) =
            rule_of(PoolSpec::new("p", 10, 20).reserve(10..=20).validate().unwrap_err());
        assert_eq!(what, "reserved ID list");
        assert!(rule.contains("at least one ID"));
        PoolSpec::new("p", 10, 20).reserve(10..=19).validate().unwrap();
    }

    #[test]
    fn too_many_reserved_ranges() {
        let ranges: Vec<(u64, u64)> =
            (0..=MAX_RESERVED_RANGES as u64).map(|i| (2 * i + 1, 2 * i + 1)).collect();
        let s = PoolSpec::new("p", 1, 1 << 20).reserve_all(&ranges);
        assert_eq!(s.reserved().len(), MAX_RESERVED_RANGES + 1);
        let (what, value, _) = rule_of(s.validate().unwrap_err());
        assert_eq!(what, "reserved ID list");
        assert!(value.contains("10001"), "{value}");
        let s = PoolSpec::new("p", 1, 1 << 20).reserve_all(&ranges[..MAX_RESERVED_RANGES]);
        s.validate().unwrap();
    }

    #[test]
    fn prefix_rules() {
        // max 65535 uses bits 0..16: prefix bit 16 is fine, bit 15 is not.
        PoolSpec::new("p", 1, 65535).prefix(1 << 16).validate().unwrap();
        let (what, value, rule) =
            rule_of(PoolSpec::new("p", 1, 65535).prefix(1 << 15).validate().unwrap_err());
        assert_eq!((what.as_str(), value.as_str()), ("pool prefix", "0x8000"));
        assert!(rule.contains("0xffff"), "{rule}");
        // max 65536 uses bit 16 too.
        assert!(PoolSpec::new("p", 1, 65536).prefix(1 << 16).validate().is_err());
        assert!(PoolSpec::new("p", 1, u64::MAX).prefix(1 << 63).validate().is_err());
        PoolSpec::new("p", 1, u64::MAX >> 1).prefix(1 << 63).validate().unwrap();
        assert_eq!(bits_covering(0), 0);
        assert_eq!(bits_covering(1), 1);
        assert_eq!(bits_covering(u64::MAX), u64::MAX);
    }

    #[test]
    fn duration_rules_and_precision() {
        let s = PoolSpec::new("p", 1, 2).reuse_delay(MAX_DELAY + Duration::from_millis(1));
        let (what, value, _) = rule_of(s.validate().unwrap_err());
        assert_eq!((what.as_str(), value.as_str()), ("reuse_delay", "2592000001ms"));
        let s = PoolSpec::new("p", 1, 2).idle_grace(Duration::from_secs(u64::MAX));
        assert_eq!(rule_of(s.validate().unwrap_err()).0, "idle_grace");
        let s = PoolSpec::new("p", 1, 2).idle_grace(Duration::from_micros(1500));
        assert_eq!(s.idle_grace_duration(), Duration::from_millis(1));
    }

    #[test]
    fn capacity_and_allocatable() {
        let s = PoolSpec::new("p", 10, 20).reserve(12..=13).reserve(20..=20);
        assert_eq!(s.capacity(), 8);
        let allocatable: Vec<u64> = (0..30).filter(|&r| s.is_allocatable(r)).collect();
        assert_eq!(allocatable, vec![10, 11, 14, 15, 16, 17, 18, 19]);
        assert_eq!(PoolSpec::new("p", 1, u64::MAX).capacity(), u64::MAX);
        assert_eq!(PoolSpec::new("p", 0, u64::MAX).capacity(), u64::MAX); // saturated
        assert_eq!(PoolSpec::new("p", 5, 4).capacity(), 0);
        assert_eq!(PoolSpec::new("p", 1, 1 << 32).reserve(1..=(1 << 31)).capacity(), 1 << 31);
    }

    #[test]
    fn prefix_round_trip() {
        let s = PoolSpec::new("p", 1, 255).prefix(0x300);
        assert_eq!(s.apply_prefix(5), 0x305);
        assert_eq!(s.strip_prefix(0x305), Some(5));
        assert_eq!(s.strip_prefix(0x205), None, "missing a prefix bit");
        assert_eq!(s.strip_prefix(0x300), None, "raw 0 is out of range");
        assert_eq!(s.strip_prefix(0x705), None, "extra high bit makes raw 0x405 > max");
        assert_eq!(s.strip_prefix(5), None);
        for raw in 1..=255 {
            assert_eq!(s.strip_prefix(s.apply_prefix(raw)), Some(raw));
        }
        let s = PoolSpec::new("p", 1, 255);
        assert_eq!(s.strip_prefix(255), Some(255));
        assert_eq!(s.strip_prefix(256), None);
    }

    #[test]
    fn json_round_trip_and_stable_names() {
        let s = PoolSpec::new("p", 1, 65535)
            .reserve(10..=20)
            .reserve(5..=5)
            .prefix(65536)
            .strategy(Strategy::Lowest)
            .idle_grace(Duration::from_secs(2))
            .reuse_delay(Duration::from_millis(30_000));
        let json = String::from_utf8(s.to_json()).unwrap();
        assert_eq!(
            json,
            r#"{"name":"p","min":1,"max":65535,"reserved":[[5,5],[10,20]],"prefix":65536,"strategy":"lowest","idle_grace_ms":2000,"reuse_delay_ms":30000}"#
        );
        assert_eq!(PoolSpec::from_json(json.as_bytes()).unwrap(), s);
    }

    #[test]
    fn json_defaults_unknown_fields_and_normalization() {
        let s =
            PoolSpec::from_json(br#"{"name":"p","min":1,"max":9,"future_field":{"x":1}}"#).unwrap();
        assert_eq!(s, PoolSpec::new("p", 1, 9));
        let s = PoolSpec::from_json(
            br#"{"name":"p","min":1,"max":99,"reserved":[[20,30],[3,4],[5,6]]}"#,
        )
        .unwrap();
        assert_eq!(s.reserved(), &[(3, 6), (20, 30)]);
        assert_eq!(s, PoolSpec::new("p", 1, 99).reserve(20..=30).reserve(3..=6));
    }

    #[test]
    fn json_errors_are_invalid_input() {
        for bad in [
            &br#"{"name":"p","min":1}"#[..],
            br#"not json"#,
            br#"{"name":"p","min":1,"max":9,"reserved":[[5,4]]}"#,
            br#"{"name":"p","min":1,"max":9,"strategy":"fancy"}"#,
            br#"{"name":"p","min":-1,"max":9}"#,
        ] {
            let (what, _, rule) = rule_of(PoolSpec::from_json(bad).unwrap_err());
            assert_eq!(what, "pool spec JSON");
            assert!(rule.starts_with("cannot parse"), "{rule}");
        }
        // Parses but breaks a rule: validation error.
        let (what, _, _) =
            rule_of(PoolSpec::from_json(br#"{"name":"p","min":0,"max":9}"#).unwrap_err());
        assert_eq!(what, "pool min");
    }

    #[test]
    fn display_is_one_readable_line() {
        let s = PoolSpec::new("p", 1, 65535)
            .reserve(10..=20)
            .reserve(5..=5)
            .prefix(65536)
            .reuse_delay(Duration::from_secs(30));
        assert_eq!(
            s.to_string(),
            "pool \"p\": IDs [1, 65535], reserved 5,10-20, prefix 0x10000, strategy random, idle_grace 0ms, reuse_delay 30000ms"
        );
        let many: Vec<(u64, u64)> = (1..=50).map(|i| (i * 10, i * 10)).collect();
        let s = PoolSpec::new("p", 1, 1000).reserve_all(&many).to_string();
        assert!(s.contains("10,20,30,40,50,60,70,80,90,100,… (50 ranges)"), "{s}");
        assert!(!s.contains('\n'));
        assert!(PoolSpec::new("p", 1, 2).to_string().contains("reserved none"));
    }

    #[test]
    fn keys_and_holders() {
        validate_key("a").unwrap();
        validate_key("a/b %\u{0}\n é 😀").unwrap();
        validate_key(&"k".repeat(MAX_KEY_BYTES)).unwrap();
        let e = validate_key(&"k".repeat(MAX_KEY_BYTES + 1)).unwrap_err();
        let msg = e.to_string();
        assert!(msg.starts_with("invalid key \"kkkk"), "{msg}");
        assert!(
            msg.ends_with("… (4097 bytes): keys are non-empty UTF-8, at most 4096 bytes"),
            "{msg}"
        );
        let e = validate_key("").unwrap_err();
        assert_eq!(
            e.to_string(),
            "invalid key \"\" (0 bytes): keys are non-empty UTF-8, at most 4096 bytes"
        );

        validate_holder("node-1/pid-42").unwrap();
        assert!(validate_holder("").is_err());
        assert!(validate_holder(&"h".repeat(MAX_HOLDER_BYTES + 1))
            .unwrap_err()
            .to_string()
            .contains("257 bytes"));
    }

    #[test]
    fn key_bytes() {
        assert_eq!(validate_key_bytes("héllo".as_bytes()).unwrap(), "héllo");
        let (what, value, rule) = rule_of(validate_key_bytes(b"ab\xffcd").unwrap_err());
        assert_eq!(what, "key");
        assert!(value.contains("(5 bytes)"), "{value}");
        assert!(rule.contains("invalid UTF-8 at byte offset 2"), "{rule}");
        assert!(validate_key_bytes(b"").is_err());
        assert!(validate_key_bytes(&[b'x'; MAX_KEY_BYTES + 1]).is_err());
    }

    #[test]
    fn id_lists() {
        assert_eq!(parse_id_list("5,7,10-20").unwrap(), vec![(5, 5), (7, 7), (10, 20)]);
        assert_eq!(parse_id_list(" 10 - 20 , 5,6,7 ").unwrap(), vec![(5, 7), (10, 20)]);
        // Empty lists and empty items are the same mistake, refused alike.
        for input in ["", "  ", ",,,", "5,,7", "5,", ",5", " , "] {
            let (what, value, rule) = rule_of(parse_id_list(input).unwrap_err());
            assert_eq!(what, "reserved ID list", "{input:?}");
            assert_eq!(value, format!("{input:?}"));
            assert!(rule.contains("empty") && rule.contains("10-20"), "{input:?}: {rule}");
        }
        assert_eq!(parse_id_list("18446744073709551615").unwrap(), vec![(u64::MAX, u64::MAX)]);
        for (input, token) in [
            ("5,x,7", "\"x\""),
            ("20-10", "\"20-10\""),
            ("1-2-3", "\"1-2-3\""),
            ("-5", "\"-5\""),
            ("+5", "\"+5\""),
            ("18446744073709551616", "\"18446744073709551616\""),
        ] {
            let (what, value, rule) = rule_of(parse_id_list(input).unwrap_err());
            assert_eq!(what, "reserved ID list token", "{input}");
            assert_eq!(value, token, "{input}");
            assert!(rule.contains("10-20"));
        }
    }
}
