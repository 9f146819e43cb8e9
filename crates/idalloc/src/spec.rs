//! The pool spec as data: the ID range, reserved IDs, prefix bits and reclaim settings of one
//! pool, their canonical form, their JSON form in the store and their one-line rendering.
//!
//! A leaf module: it knows nothing of errors. The rules a spec must follow, and the input rules for
//! pool names, keys and holders, are in [`crate::pool`] (`PoolSpec::validate`,
//! `PoolSpec::from_json`), which reports breaches as [`crate::error::Error`]; the error type in
//! turn carries specs ([`crate::error::Error::RangeMismatch`]). Keeping the data here keeps that
//! dependency one way.

use std::fmt;
use std::ops::RangeInclusive;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::show::show_value;

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

/// Milliseconds in `d`, saturating (durations are validated against [`crate::pool::MAX_DELAY`] anyway).
pub(crate) fn whole_millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

/// `d` cut to whole milliseconds, the precision of the stored spec, so that a spec read back from
/// the store equals the one written.
fn truncate_to_millis(d: Duration) -> Duration {
    Duration::from_millis(whole_millis(d))
}

/// Sorts inclusive ranges and merges overlapping and adjacent ones, the canonical form of a reserved
/// list. Empty ranges (start > end) must be filtered out by the caller.
pub(crate) fn normalize_ranges(mut ranges: Vec<(u64, u64)>) -> Vec<(u64, u64)> {
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

    /// Reserves every range of `ranges` (inclusive pairs, as returned by [`crate::pool::parse_id_list`]); pairs
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

    /// This spec with range `[min, max]` and reserved ranges `reserved` (normalized as by
    /// [`PoolSpec::reserve_all`]) instead of its own: the spec a resize writes. Everything else
    /// (name, prefix, strategy, reclaim settings) stays. Not validated yet.
    pub fn resized(&self, min: u64, max: u64, reserved: &[(u64, u64)]) -> PoolSpec {
        PoolSpec { min, max, reserved: Vec::new(), ..self.clone() }.reserve_all(reserved)
    }

    /// True if `other` differs from this spec in its range and reserved IDs at most: the parts a
    /// resize may change.
    pub fn same_but_range(&self, other: &PoolSpec) -> bool {
        other.resized(self.min, self.max, &self.reserved) == *self
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
}

impl PoolSpec {
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
pub(crate) fn bits_covering(max: u64) -> u64 {
    u64::MAX.checked_shr(max.leading_zeros()).unwrap_or(0)
}

pub(crate) fn fmt_range(lo: u64, hi: u64) -> String {
    if lo == hi {
        lo.to_string()
    } else {
        format!("{lo}-{hi}")
    }
}

/// Renders reserved ranges in the `parse_id_list` syntax, eliding after the first ten so that a
/// spec with thousands of ranges still prints as one readable line.
pub(crate) fn fmt_ranges(ranges: &[(u64, u64)]) -> String {
    const SHOWN: usize = 10;
    let mut s: Vec<String> = ranges.iter().take(SHOWN).map(|&(lo, hi)| fmt_range(lo, hi)).collect();
    if ranges.len() > SHOWN {
        s.push(format!("… ({} ranges)", ranges.len()));
    }
    s.join(",")
}

/// One readable line, used in [`crate::error::Error::RangeMismatch`] messages and logs:
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
}
