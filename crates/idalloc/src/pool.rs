//! Pool specs: the ID range, reserved IDs, prefix bits and reclaim settings of one pool, with their
//! validation, their JSON form in the store, and the input rules for pool names, keys and holders.
//!
//! A spec is written once by `init_pool` and compared on every later `init_pool` (equal → Ok,
//! different → [`Error::RangeMismatch`]), so its representation is canonical: reserved ranges are
//! sorted and merged, durations have millisecond precision. Two specs that mean the same are equal.

use std::fmt;
use std::ops::RangeInclusive;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::error::{show_value, Error, Input, Result};

/// Longest key, in bytes (DESIGN §1). Bounds the size of store keys (escaped keys appear in three
/// record names) and of txns.
pub const MAX_KEY_BYTES: usize = 4096;

/// Longest holder name, in bytes. Holders appear in reference record names; they are process or
/// service identities, never payloads.
pub const MAX_HOLDER_BYTES: usize = 256;

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

/// How a pool chooses a free ID for a new key.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Strategy {
    /// Uniform over the free IDs: nodes that allocate at the same time rarely pick the same
    /// candidate, so their create-only txns rarely collide (DESIGN §5). The default.
    #[default]
    Random,
    /// The smallest free ID: compact ID spaces (small bitmaps, dense tables) at the price of more
    /// collisions between nodes allocating at the same time.
    Lowest,
}

impl fmt::Display for Strategy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Strategy::Random => "random",
            Strategy::Lowest => "lowest",
        })
    }
}

/// One pool's definition. Build it with [`PoolSpec::new`] and the chained setters, then
/// [`PoolSpec::validate`] it (the allocator does so before writing or using a spec).
///
/// Raw IDs are the numbers in `[min, max]`; the ID handed out is `prefix | raw`
/// ([`PoolSpec::apply_prefix`]), so several pools can share one numeric space (Cilium's cluster-ID
/// bits) without overlapping.
///
/// JSON form (the value of `P/pools/<name>`), stable field names:
/// `{"name":"p","min":1,"max":65535,"reserved":[[5,5],[10,20]],"prefix":0,"strategy":"random",
/// "idle_grace_ms":0,"reuse_delay_ms":0}`. Every field but `name`, `min`, `max` may be omitted
/// (defaults: none reserved, prefix 0, random, 0 ms). Unknown fields are ignored so that a spec
/// written by a newer version can still be read by an older one (forward compatibility); the older
/// one then compares only the fields it knows.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(try_from = "SpecJson", into = "SpecJson")]
pub struct PoolSpec {
    name: String,
    min: u64,
    max: u64,
    reserved: Vec<(u64, u64)>,
    prefix: u64,
    strategy: Strategy,
    idle_grace: Duration,
    reuse_delay: Duration,
}

/// The JSON shape of a spec, kept apart from [`PoolSpec`] so that the stored format (field names,
/// millisecond integers) is spelled out in one place and can evolve without changing the Rust API.
#[derive(Serialize, Deserialize)]
struct SpecJson {
    name: String,
    min: u64,
    max: u64,
    #[serde(default)]
    reserved: Vec<(u64, u64)>,
    #[serde(default)]
    prefix: u64,
    #[serde(default)]
    strategy: Strategy,
    #[serde(default)]
    idle_grace_ms: u64,
    #[serde(default)]
    reuse_delay_ms: u64,
}

impl From<PoolSpec> for SpecJson {
    fn from(s: PoolSpec) -> Self {
        SpecJson {
            name: s.name,
            min: s.min,
            max: s.max,
            reserved: s.reserved,
            prefix: s.prefix,
            strategy: s.strategy,
            idle_grace_ms: whole_millis(s.idle_grace),
            reuse_delay_ms: whole_millis(s.reuse_delay),
        }
    }
}

impl TryFrom<SpecJson> for PoolSpec {
    type Error = String;
    fn try_from(j: SpecJson) -> std::result::Result<Self, String> {
        if let Some(&(lo, hi)) = j.reserved.iter().find(|(lo, hi)| lo > hi) {
            return Err(format!("reserved range [{lo}, {hi}] is empty (start > end)"));
        }
        Ok(PoolSpec {
            name: j.name,
            min: j.min,
            max: j.max,
            reserved: normalize_ranges(j.reserved),
            prefix: j.prefix,
            strategy: j.strategy,
            idle_grace: Duration::from_millis(j.idle_grace_ms),
            reuse_delay: Duration::from_millis(j.reuse_delay_ms),
        })
    }
}

/// Milliseconds in `d`, saturating (durations are validated against [`MAX_DELAY`] anyway).
fn whole_millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

/// `d` cut to whole milliseconds, the precision of the stored spec, so that a spec read back from
/// the store equals the one written.
fn truncate_to_millis(d: Duration) -> Duration {
    Duration::from_millis(whole_millis(d))
}

/// Sorts inclusive ranges and merges overlapping and adjacent ones, the canonical form of a reserved
/// list. Empty ranges (start > end) must be filtered out by the caller.
fn normalize_ranges(mut ranges: Vec<(u64, u64)>) -> Vec<(u64, u64)> {
    ranges.sort_unstable();
    let mut out: Vec<(u64, u64)> = Vec::with_capacity(ranges.len());
    for (lo, hi) in ranges {
        match out.last_mut() {
            Some(last) if lo <= last.1.saturating_add(1) => last.1 = last.1.max(hi),
            _ => out.push((lo, hi)),
        }
    }
    out
}

impl PoolSpec {
    /// A pool named `name` handing out raw IDs in `[min, max]`, with nothing reserved, no prefix,
    /// random choice, and immediate reclaim and reuse. Not validated yet: see [`PoolSpec::validate`].
    pub fn new(name: impl Into<String>, min: u64, max: u64) -> Self {
        PoolSpec {
            name: name.into(),
            min,
            max,
            reserved: Vec::new(),
            prefix: 0,
            strategy: Strategy::Random,
            idle_grace: Duration::ZERO,
            reuse_delay: Duration::ZERO,
        }
    }

    /// Reserves the raw IDs in `range` (never handed out). Overlapping and adjacent reservations are
    /// merged. An empty range (`5..=4`) reserves nothing, as it contains nothing.
    pub fn reserve(mut self, range: RangeInclusive<u64>) -> Self {
        let (lo, hi) = range.into_inner();
        if lo <= hi {
            self.reserved.push((lo, hi));
            self.reserved = normalize_ranges(std::mem::take(&mut self.reserved));
        }
        self
    }

    /// Reserves every range of `ranges` (inclusive pairs, as returned by [`parse_id_list`]); pairs
    /// with start > end are ignored like empty ranges in [`PoolSpec::reserve`].
    pub fn reserve_all(mut self, ranges: &[(u64, u64)]) -> Self {
        self.reserved.extend(ranges.iter().copied().filter(|(lo, hi)| lo <= hi));
        self.reserved = normalize_ranges(std::mem::take(&mut self.reserved));
        self
    }

    /// Sets the prefix bits ORed into every handed-out ID. They must not overlap the bits of `max`.
    pub fn prefix(mut self, prefix: u64) -> Self {
        self.prefix = prefix;
        self
    }

    /// Sets the candidate choice.
    pub fn strategy(mut self, strategy: Strategy) -> Self {
        self.strategy = strategy;
        self
    }

    /// Sets how long a binding without references survives before the sweeper reclaims it (same key
    /// back in time → same ID). Stored with millisecond precision; finer parts are dropped.
    pub fn idle_grace(mut self, d: Duration) -> Self {
        self.idle_grace = truncate_to_millis(d);
        self
    }

    /// Sets how long a reclaimed ID stays unusable (tombstoned) before another key may get it (G5).
    /// Stored with millisecond precision; finer parts are dropped.
    pub fn reuse_delay(mut self, d: Duration) -> Self {
        self.reuse_delay = truncate_to_millis(d);
        self
    }

    /// The pool's name.
    pub fn name(&self) -> &str {
        &self.name
    }
    /// Lowest raw ID.
    pub fn min(&self) -> u64 {
        self.min
    }
    /// Highest raw ID.
    pub fn max(&self) -> u64 {
        self.max
    }
    /// Reserved raw IDs: inclusive ranges, sorted, disjoint and non-adjacent.
    pub fn reserved(&self) -> &[(u64, u64)] {
        &self.reserved
    }
    /// Prefix bits ORed into handed-out IDs.
    pub fn prefix_bits(&self) -> u64 {
        self.prefix
    }
    /// Candidate choice.
    pub fn strategy_kind(&self) -> Strategy {
        self.strategy
    }
    /// Reclaim grace for bindings without references.
    pub fn idle_grace_duration(&self) -> Duration {
        self.idle_grace
    }
    /// Quarantine of reclaimed IDs.
    pub fn reuse_delay_duration(&self) -> Duration {
        self.reuse_delay
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
        validate_pool_name(&self.name)?;
        if self.min == 0 {
            return Err(Error::invalid(
                Input::Spec,
                "pool min",
                0,
                "the lowest ID must be at least 1: ID 0 means \"no ID\" and is never handed out",
            ));
        }
        if self.min > self.max {
            return Err(Error::invalid(
                Input::Spec,
                "pool range",
                format!("[{}, {}]", self.min, self.max),
                "min must not exceed max",
            ));
        }
        if self.reserved.len() > MAX_RESERVED_RANGES {
            return Err(Error::invalid(
                Input::Spec,
                "reserved ID list",
                format!("of {} ranges", self.reserved.len()),
                format!(
                    "at most {MAX_RESERVED_RANGES} reserved ranges (after merging adjacent ones)"
                ),
            ));
        }
        if let Some(&(lo, hi)) = self.reserved.iter().find(|(lo, hi)| lo > hi) {
            return Err(Error::invalid(
                Input::Spec,
                "reserved range",
                format!("[{lo}, {hi}]"),
                "start must not exceed end",
            ));
        }
        if let Some(&(lo, hi)) =
            self.reserved.iter().find(|&&(lo, hi)| lo < self.min || hi > self.max)
        {
            return Err(Error::invalid(
                Input::Spec,
                "reserved range",
                fmt_range(lo, hi),
                format!("reserved IDs must lie in the pool range [{}, {}]", self.min, self.max),
            ));
        }
        if self.capacity() == 0 {
            return Err(Error::invalid(
                Input::Spec,
                "reserved ID list",
                fmt_ranges(&self.reserved),
                format!("at least one ID of [{}, {}] must stay allocatable", self.min, self.max),
            ));
        }
        let id_bits = bits_covering(self.max);
        if self.prefix & id_bits != 0 {
            return Err(Error::invalid(
                Input::Spec,
                "pool prefix",
                format!("{:#x}", self.prefix),
                format!(
                    "prefix bits must not overlap the ID bits {id_bits:#x} used by IDs up to max {}",
                    self.max
                ),
            ));
        }
        for (what, d) in [("idle_grace", self.idle_grace), ("reuse_delay", self.reuse_delay)] {
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

    /// Number of raw IDs the pool can hand out: the range size minus the reserved IDs. Zero for an
    /// inverted range. Saturates at `u64::MAX` for the (invalid) full range `[0, u64::MAX]`.
    pub fn capacity(&self) -> u64 {
        if self.min > self.max {
            return 0;
        }
        let span = (self.max - self.min).saturating_add(1);
        let reserved: u64 = self
            .reserved
            .iter()
            .map(|&(lo, hi)| {
                let (lo, hi) = (lo.max(self.min), hi.min(self.max));
                if lo > hi {
                    0
                } else {
                    (hi - lo).saturating_add(1)
                }
            })
            .fold(0u64, u64::saturating_add);
        span.saturating_sub(reserved)
    }

    /// True if `raw` is in `[min, max]` and not reserved: a raw ID this pool may hand out.
    pub fn is_allocatable(&self, raw: u64) -> bool {
        raw >= self.min && raw <= self.max && !self.is_reserved(raw)
    }

    /// True if `raw` lies in a reserved range (binary search: the list is sorted and disjoint).
    pub fn is_reserved(&self, raw: u64) -> bool {
        let i = self.reserved.partition_point(|&(_, hi)| hi < raw);
        self.reserved.get(i).is_some_and(|&(lo, _)| lo <= raw)
    }

    /// The ID handed out for raw ID `raw`: `prefix | raw`.
    pub fn apply_prefix(&self, raw: u64) -> u64 {
        self.prefix | raw
    }

    /// The raw ID behind a handed-out ID, or `None` if `id` does not carry this pool's prefix or its
    /// raw part is outside `[min, max]` (an ID from another pool or a typo). Reserved raw IDs are
    /// returned: they belong to the pool even though it never hands them out.
    pub fn strip_prefix(&self, id: u64) -> Option<u64> {
        if id & self.prefix != self.prefix {
            return None;
        }
        let raw = id & !self.prefix;
        (raw >= self.min && raw <= self.max).then_some(raw)
    }
}

/// All bits any number `<= max` can have set: the mask of `max`'s bit length.
fn bits_covering(max: u64) -> u64 {
    u64::MAX.checked_shr(max.leading_zeros()).unwrap_or(0)
}

fn fmt_range(lo: u64, hi: u64) -> String {
    if lo == hi {
        lo.to_string()
    } else {
        format!("{lo}-{hi}")
    }
}

/// Renders reserved ranges in the `parse_id_list` syntax, eliding after the first ten so that a
/// spec with thousands of ranges still prints as one readable line.
fn fmt_ranges(ranges: &[(u64, u64)]) -> String {
    const SHOWN: usize = 10;
    let mut s: Vec<String> = ranges.iter().take(SHOWN).map(|&(lo, hi)| fmt_range(lo, hi)).collect();
    if ranges.len() > SHOWN {
        s.push(format!("… ({} ranges)", ranges.len()));
    }
    s.join(",")
}

/// One readable line, used in [`Error::RangeMismatch`] messages and logs:
/// `pool "p": IDs [1, 65535], reserved 5,10-20, prefix 0x10000, strategy random, idle_grace 0ms, reuse_delay 30000ms`.
impl fmt::Display for PoolSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "pool {}: IDs [{}, {}]", show_value(&self.name), self.min, self.max)?;
        if self.reserved.is_empty() {
            write!(f, ", reserved none")?;
        } else {
            write!(f, ", reserved {}", fmt_ranges(&self.reserved))?;
        }
        write!(
            f,
            ", prefix {:#x}, strategy {}, idle_grace {}ms, reuse_delay {}ms",
            self.prefix,
            self.strategy,
            whole_millis(self.idle_grace),
            whole_millis(self.reuse_delay)
        )
    }
}

impl PoolSpec {
    /// The spec's JSON, as stored in `P/pools/<name>`.
    pub fn to_json(&self) -> Vec<u8> {
        // Serialising plain integers, strings and a unit enum into memory cannot fail.
        serde_json::to_vec(self).unwrap_or_default()
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

/// Checks a holder name: non-empty, at most [`MAX_HOLDER_BYTES`] bytes (escaped in store paths like
/// keys).
pub fn validate_holder(holder: &str) -> Result<()> {
    if holder.is_empty() || holder.len() > MAX_HOLDER_BYTES {
        return Err(Error::invalid(Input::Holder, "holder", show_len(holder), HOLDER_RULE));
    }
    Ok(())
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
        // Empty lists and empty items are the same mistake, refused alike (issue 9, item 11).
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
