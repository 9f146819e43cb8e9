//! Parsers for the values users type: durations, ID ranges, prefix bits, store URLs, holder names.
//!
//! Pure functions, used by clap as value parsers, so that a bad value is rejected before any store
//! is opened and the message (one line) names the value and what is allowed.

use std::time::Duration;

pub use idalloc::store::url::{redact_store, redact_urls, store_url, StoreUrl};

/// Accepted duration forms, quoted in every duration error.
pub const DURATION_RULE: &str =
    "a duration is a whole number with a unit ms, s, m or h (e.g. 250ms, 30s, 5m, 1h), or 0";

/// Parses `30s`, `5m`, `1h`, `250ms` or `0`. A bare number other than 0 is refused: `30` could mean
/// seconds or milliseconds, and guessing wrong by a factor of 1000 is worse than asking.
pub fn duration(s: &str) -> Result<Duration, String> {
    let t = s.trim();
    if t == "0" {
        return Ok(Duration::ZERO);
    }
    let split = t
        .find(|c: char| !c.is_ascii_digit())
        .ok_or_else(|| format!("{s:?} has no unit: {DURATION_RULE}"))?;
    let (num, unit) = t.split_at(split);
    if num.is_empty() {
        return Err(format!("{s:?} does not start with a number: {DURATION_RULE}"));
    }
    let n: u64 = num.parse().map_err(|_| format!("{s:?} is too large: {DURATION_RULE}"))?;
    let ms_per_unit: u64 = match unit {
        "ms" => 1,
        "s" => 1000,
        "m" => 60_000,
        "h" => 3_600_000,
        _ => return Err(format!("{s:?} has unknown unit {unit:?}: {DURATION_RULE}")),
    };
    n.checked_mul(ms_per_unit)
        .map(Duration::from_millis)
        .ok_or_else(|| format!("{s:?} is too large: {DURATION_RULE}"))
}

/// An inclusive raw ID range `MIN-MAX`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct IdRange {
    pub min: u64,
    pub max: u64,
}

/// Parses `MIN-MAX` (decimal, inclusive, `MIN <= MAX`). Zero and the pool's other rules are checked
/// by the pool spec's own validation, whose message explains them.
pub fn id_range(s: &str) -> Result<IdRange, String> {
    const RULE: &str = "a range is MIN-MAX: two decimal IDs with MIN <= MAX, e.g. 1-65535";
    let (a, b) = s.split_once('-').ok_or_else(|| format!("{s:?} is not MIN-MAX: {RULE}"))?;
    let num = |x: &str| -> Result<u64, String> {
        let x = x.trim();
        if x.is_empty() || !x.bytes().all(|c| c.is_ascii_digit()) {
            return Err(format!("{s:?} has {x:?} where a decimal ID is expected: {RULE}"));
        }
        x.parse().map_err(|_| format!("{s:?} has {x:?}, larger than 18446744073709551615: {RULE}"))
    };
    let (min, max) = (num(a)?, num(b)?);
    if min > max {
        return Err(format!("{s:?} has MIN {min} above MAX {max}: {RULE}"));
    }
    Ok(IdRange { min, max })
}

/// Parses prefix bits in hexadecimal, with or without `0x` (`0x1000000`, `1000000`).
pub fn hex_bits(s: &str) -> Result<u64, String> {
    const RULE: &str = "prefix bits are a hexadecimal number, e.g. 0x1000000";
    let t = s.trim();
    let digits = t.strip_prefix("0x").or_else(|| t.strip_prefix("0X")).unwrap_or(t);
    if digits.is_empty() || !digits.bytes().all(|c| c.is_ascii_hexdigit()) {
        return Err(format!("{s:?} is not hexadecimal: {RULE}"));
    }
    u64::from_str_radix(digits, 16).map_err(|_| format!("{s:?} does not fit in 64 bits: {RULE}"))
}

/// The default holder of durable references: the user's name, so that `release` by the same user
/// finds the reference `acquire` made.
pub fn default_holder(user: Option<String>, logname: Option<String>) -> String {
    [user, logname]
        .into_iter()
        .flatten()
        .map(|s| s.trim().to_string())
        .find(|s| !s.is_empty())
        .unwrap_or_else(|| "idalloc".to_string())
}

#[cfg(test)]
mod tests {
    use super::*;
    use idalloc::store::etcd::Password;

    #[test]
    fn durations() {
        assert_eq!(duration("0").unwrap(), Duration::ZERO);
        assert_eq!(duration("250ms").unwrap(), Duration::from_millis(250));
        assert_eq!(duration("30s").unwrap(), Duration::from_secs(30));
        assert_eq!(duration("5m").unwrap(), Duration::from_secs(300));
        assert_eq!(duration("1h").unwrap(), Duration::from_secs(3600));
        assert_eq!(duration("0s").unwrap(), Duration::ZERO);
        for bad in ["", "30", "s", "1.5s", "-1s", "5d", "10 s", "99999999999999999999h"] {
            let e = duration(bad).unwrap_err();
            assert!(e.contains(&format!("{bad:?}")), "{bad}: {e}");
            assert!(e.contains("250ms"), "{bad}: {e}");
        }
    }

    #[test]
    fn ranges() {
        assert_eq!(id_range("1-10").unwrap(), IdRange { min: 1, max: 10 });
        assert_eq!(id_range("5-5").unwrap(), IdRange { min: 5, max: 5 });
        assert_eq!(id_range("1-18446744073709551615").unwrap().max, u64::MAX);
        let e = id_range("10-5").unwrap_err();
        assert!(e.contains("\"10-5\"") && e.contains("MIN 10 above MAX 5"), "{e}");
        for bad in ["10", "a-b", "-5", "1-", "1-2-3", "1-99999999999999999999", "+1-2"] {
            let e = id_range(bad).unwrap_err();
            assert!(e.contains(&format!("{bad:?}")), "{bad}: {e}");
            assert!(e.contains("MIN-MAX"), "{bad}: {e}");
        }
    }

    #[test]
    fn hex() {
        assert_eq!(hex_bits("0x1000000").unwrap(), 0x1000000);
        assert_eq!(hex_bits("ff").unwrap(), 255);
        assert_eq!(hex_bits("0XFF").unwrap(), 255);
        for bad in ["", "0x", "xyz", "0x1_0", "0x10000000000000000"] {
            assert!(hex_bits(bad).is_err(), "{bad}");
        }
    }

    fn etcd(endpoints: &[&str]) -> StoreUrl {
        StoreUrl::Etcd {
            endpoints: endpoints.iter().map(|e| e.to_string()).collect(),
            user: None,
            password: None,
        }
    }

    #[test]
    fn stores() {
        assert_eq!(store_url("file:idalloc.redb").unwrap(), StoreUrl::File("idalloc.redb".into()));
        assert_eq!(store_url("file:///tmp/x.redb").unwrap(), StoreUrl::File("/tmp/x.redb".into()));
        assert_eq!(store_url("memory:").unwrap(), StoreUrl::Memory);
        // Bare members: the TLS flags pick the scheme later (`connect`).
        assert_eq!(
            store_url("etcd://127.0.0.1:2379,h2:2380").unwrap(),
            etcd(&["127.0.0.1:2379", "h2:2380"])
        );
        assert_eq!(store_url("http://127.0.0.1:2379/").unwrap(), etcd(&["http://127.0.0.1:2379"]));
        assert_eq!(
            store_url("https://h1:2379,h2:2379").unwrap(),
            etcd(&["https://h1:2379", "https://h2:2379"])
        );
        for bad in [
            "redis://x:1",
            "file:",
            "etcd://",
            "etcd://host",
            "etcd://h:0",
            "etcd://h:x",
            "https://h",
            "x",
            "etcd://@h:1",
        ] {
            let e = store_url(bad).unwrap_err();
            assert!(e.contains("file:PATH") && e.contains("etcd://"), "{bad}: {e}");
        }
    }

    #[test]
    fn store_url_credentials_are_parsed_and_never_shown() {
        let u = store_url("etcd://ann:s%40cret:x@h1:2379,https://h2:2379").unwrap();
        assert_eq!(
            u,
            StoreUrl::Etcd {
                endpoints: vec!["h1:2379".into(), "https://h2:2379".into()],
                user: Some("ann".into()),
                password: Some(Password::new("s@cret:x")),
            }
        );
        assert_eq!(u.endpoint(), "h1:2379,https://h2:2379");
        assert!(!format!("{u:?}").contains("cret"), "{u:?}");
        let u = store_url("etcd://bob@h:1").unwrap();
        assert!(
            matches!(u, StoreUrl::Etcd { user: Some(ref b), password: None, .. } if b == "bob")
        );
        assert_eq!(
            redact_urls("invalid value 'etcd://ann:hunter2@h' for '--store <URL>': x etcd://b@c:1"),
            "invalid value 'etcd://ann:***@h' for '--store <URL>': x etcd://b@c:1"
        );
        // Errors quote the URL without its password.
        for bad in ["etcd://ann:hunter2@h", "etcd://ann:hunter2@h:1,x", "etcd://ann:hunter2%zz@h:1"]
        {
            let e = store_url(bad).unwrap_err();
            assert!(!e.contains("hunter2"), "{bad}: {e}");
            assert!(e.contains("ann:***@"), "{bad}: {e}");
        }
    }

    #[test]
    fn holders() {
        assert_eq!(default_holder(Some("ann".into()), None), "ann");
        assert_eq!(default_holder(Some(" ".into()), Some("bob".into())), "bob");
        assert_eq!(default_holder(None, None), "idalloc");
    }
}
