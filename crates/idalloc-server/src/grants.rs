//! Per-client pool grants and quotas of the tokens file: which pools a client
//! may read and write, the way an etcd role grants key ranges, and the limits of its usage.
//!
//! A tokens-file line is `NAME SCOPE SECRET [OPTION ...]`; the options ([`Policy::parse`]):
//! - `read=PATTERNS`, `write=PATTERNS`: comma-separated pool names or globs (`vni-*`, `t?`,
//!   `[ab]-*`). A pool is writable if it matches `write`, readable if it matches `read` or `write`
//!   (who may write a pool may see it). With neither option, every pool (`*`) for both, as before
//!   grants existed; with one of them, the other grants nothing of its own.
//! - `sessions=N`: client sessions open at once; `refs=N`: references per pool (the client's
//!   durable holders' and its sessions'); `rate=N`: requests per second (a token bucket refilled
//!   at N per second) with `burst=M` requests at once (default N); `pools=N`: pools it may
//!   create (counted in the store).
//! - `connections=N`, `watches=N`: connections and watch streams it may hold open at once on one
//!   instance, in place of the `--max-connections-per-client` and `--max-watches-per-client`
//!   defaults (higher or lower).
//!
//! The scope still decides the kind of operation (read, allocate, admin); the grants decide on
//! which pools. This module is the pure part: parsing, matching, and which access a route needs.

use std::num::NonZeroU32;

use axum::http::Method;

/// A list of pool-name patterns.
#[derive(Clone, Debug, Default)]
pub struct Patterns(Vec<glob::Pattern>);

impl Patterns {
    fn all() -> Patterns {
        Patterns(vec![glob::Pattern::new("*").expect("the pattern * is valid")])
    }

    fn parse(list: &str) -> Result<Patterns, String> {
        let mut out = Vec::new();
        for p in list.split(',') {
            if p.is_empty() {
                return Err(format!(
                    "empty pattern in {list:?}: comma-separated pool names or globs such as vni-*"
                ));
            }
            let ok = p
                .bytes()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || b"._-*?[]!".contains(&c));
            if !ok {
                return Err(format!(
                    "invalid pool pattern {p:?}: pool names [a-z0-9._-] with the globs * ? [...]"
                ));
            }
            out.push(
                glob::Pattern::new(p)
                    .map_err(|e| format!("invalid pool pattern {p:?}: {}", e.msg))?,
            );
        }
        Ok(Patterns(out))
    }

    pub fn matches(&self, pool: &str) -> bool {
        self.0.iter().any(|p| p.matches(pool))
    }

    fn shown(&self) -> String {
        if self.0.is_empty() {
            return "none".into();
        }
        self.0.iter().map(|p| p.as_str()).collect::<Vec<_>>().join(",")
    }
}

/// A client's grants and quotas.
#[derive(Clone, Debug)]
pub struct Policy {
    pub read: Patterns,
    pub write: Patterns,
    /// Most client sessions open at once.
    pub sessions: Option<usize>,
    /// Most references per pool.
    pub refs: Option<u64>,
    /// Requests per second and burst.
    pub rate: Option<(NonZeroU32, NonZeroU32)>,
    /// Most pools it may create (pools it created and nobody has deleted).
    pub pools: Option<u64>,
    /// Connections it may hold open at once on one instance (else the serve flag).
    pub connections: Option<usize>,
    /// Watch streams it may hold open at once on one instance (else the serve flag).
    pub watches: Option<usize>,
    /// Whether the line grants pools (`read=` or `write=`): an administrator with grants acts
    /// only on its own sessions ([`crate::auth::Client::administers_all`]).
    pub restricted: bool,
}

impl Default for Policy {
    /// Every pool, no quota: a line without options (the format before grants).
    fn default() -> Self {
        Policy {
            read: Patterns::all(),
            write: Patterns::all(),
            sessions: None,
            refs: None,
            rate: None,
            pools: None,
            connections: None,
            watches: None,
            restricted: false,
        }
    }
}

/// The grammar of the options, for error messages.
pub const OPTIONS: &str = "options are read=PATTERNS write=PATTERNS (pool names or globs, \
     comma-separated), sessions=N refs=N pools=N rate=N burst=N connections=N watches=N";

fn number(name: &str, v: &str) -> Result<u64, String> {
    match v.parse::<u64>() {
        Ok(n) if n > 0 && n <= u64::from(u32::MAX) => Ok(n),
        _ => Err(format!("invalid {name}={v:?}: a whole number from 1 to {}", u32::MAX)),
    }
}

fn nonzero(name: &str, v: &str) -> Result<NonZeroU32, String> {
    let n = number(name, v)?;
    NonZeroU32::new(u32::try_from(n).map_err(|_| format!("invalid {name}={v:?}"))?)
        .ok_or_else(|| format!("invalid {name}={v:?}"))
}

impl Policy {
    /// The policy of the options of one line (`key=value` each; a key at most once).
    pub fn parse(options: &[&str]) -> Result<Policy, String> {
        let mut read = None;
        let mut write = None;
        let mut p = Policy::default();
        let mut rate = None;
        let mut burst = None;
        let mut seen = Vec::new();
        for opt in options {
            let Some((k, v)) = opt.split_once('=') else {
                return Err(format!("invalid option {opt:?}: {OPTIONS}"));
            };
            if seen.contains(&k) {
                return Err(format!("option {k}= is given twice"));
            }
            seen.push(k);
            match k {
                "read" => read = Some(Patterns::parse(v)?),
                "write" => write = Some(Patterns::parse(v)?),
                "sessions" => p.sessions = Some(number(k, v)? as usize),
                "refs" => p.refs = Some(number(k, v)?),
                "rate" => rate = Some(nonzero(k, v)?),
                "burst" => burst = Some(nonzero(k, v)?),
                "pools" => p.pools = Some(number(k, v)?),
                "connections" => p.connections = Some(number(k, v)? as usize),
                "watches" => p.watches = Some(number(k, v)? as usize),
                _ => return Err(format!("unknown option {k:?}: {OPTIONS}")),
            }
        }
        if read.is_some() || write.is_some() {
            p.restricted = true;
            p.read = read.unwrap_or_default();
            p.write = write.unwrap_or_default();
        }
        p.rate = match (rate, burst) {
            (Some(r), b) => Some((r, b.unwrap_or(r))),
            (None, Some(_)) => return Err("burst= needs rate=".into()),
            (None, None) => None,
        };
        Ok(p)
    }

    pub fn can_read(&self, pool: &str) -> bool {
        self.read.matches(pool) || self.write.matches(pool)
    }

    pub fn can_write(&self, pool: &str) -> bool {
        self.write.matches(pool)
    }

    /// Whether `access` to `pool` is granted; `Err` is the reason (for a 403), naming the pool
    /// and the client's grants.
    pub fn check(&self, client: &str, pool: &str, access: PoolAccess) -> Result<(), String> {
        let (ok, what, granted) = match access {
            PoolAccess::Read => (
                self.can_read(pool),
                "read",
                format!("read={} write={}", self.read.shown(), self.write.shown()),
            ),
            PoolAccess::Write => {
                (self.can_write(pool), "write", format!("write={}", self.write.shown()))
            }
        };
        if ok {
            return Ok(());
        }
        Err(format!(
            "client {client:?} may not {what} pool {pool:?}: its grants in the tokens file are \
             {granted}"
        ))
    }
}

/// What a request does to the pool its path names.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PoolAccess {
    Read,
    Write,
}

/// The access `method` on `route` needs to its `{pool}`; `None` for routes without one.
pub fn pool_access(method: &Method, route: &str) -> Option<PoolAccess> {
    if !route.starts_with("/v1/pools/{pool}") {
        return None;
    }
    let read_only = *method == Method::GET || *method == Method::HEAD;
    Some(match route {
        "/v1/pools/{pool}/acquire" | "/v1/pools/{pool}/release" | "/v1/pools/{pool}/sweep" => {
            PoolAccess::Write
        }
        "/v1/pools/{pool}" if !read_only => PoolAccess::Write,
        _ if read_only => PoolAccess::Read,
        // A route under a pool not classified above: writing is the safe assumption.
        _ => PoolAccess::Write,
    })
}

/// The Prometheus text `text` with the samples of pools `visible` refuses left out (lines
/// carrying a `pool="NAME"` label); comments and other samples are kept.
pub fn filter_metrics(text: &str, visible: impl Fn(&str) -> bool) -> String {
    let mut out = String::with_capacity(text.len());
    for line in text.lines() {
        let pool = line
            .split_once("pool=\"")
            .filter(|_| !line.starts_with('#'))
            .and_then(|(_, rest)| rest.split_once('"'))
            .map(|(p, _)| p);
        if pool.is_none_or(&visible) {
            out.push_str(line);
            out.push('\n');
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn options_parse_and_grants_match_names_and_globs() {
        let p = Policy::default();
        assert!(p.can_read("x") && p.can_write("x"));
        let p = Policy::parse(&["read=shared,vni-*", "write=vni-a?", "sessions=3", "refs=10"])
            .expect("parse");
        assert!(p.can_read("shared") && !p.can_write("shared"));
        assert!(p.can_read("vni-9") && !p.can_write("vni-9"));
        assert!(p.can_read("vni-a1") && p.can_write("vni-a1"));
        assert!(!p.can_read("other"));
        assert_eq!((p.sessions, p.refs, p.rate), (Some(3), Some(10), None));
        let p = Policy::parse(&["write=t-*", "rate=5"]).expect("parse");
        assert!(p.can_read("t-1") && !p.can_read("u"));
        let five = NonZeroU32::new(5).expect("5");
        assert_eq!(p.rate, Some((five, five)));
        let e = p.check("c", "u", PoolAccess::Write).expect_err("refused");
        assert!(e.contains("\"u\"") && e.contains("write=t-*"), "{e}");
        for (opts, want) in [
            (&["read="][..], "empty pattern"),
            (&["read=a,,b"][..], "empty pattern"),
            (&["read=A"][..], "invalid pool pattern \"A\""),
            (&["write=[a"][..], "invalid pool pattern \"[a\""),
            (&["refs=0"][..], "invalid refs=\"0\""),
            (&["sessions=x"][..], "invalid sessions=\"x\""),
            (&["colour=red"][..], "unknown option \"colour\""),
            (&["rate"][..], "invalid option \"rate\""),
            (&["burst=3"][..], "burst= needs rate="),
            (&["refs=1", "refs=2"][..], "given twice"),
        ] {
            let e = Policy::parse(opts).expect_err(&format!("{opts:?}"));
            assert!(e.contains(want), "{opts:?}: {e}");
        }
    }

    #[test]
    fn routes_need_read_or_write_on_their_pool() {
        let (get, post, del) = (Method::GET, Method::POST, Method::DELETE);
        assert_eq!(pool_access(&get, "/v1/pools"), None);
        assert_eq!(pool_access(&get, "/v1/sessions"), None);
        assert_eq!(pool_access(&get, "/v1/pools/{pool}"), Some(PoolAccess::Read));
        assert_eq!(pool_access(&del, "/v1/pools/{pool}"), Some(PoolAccess::Write));
        assert_eq!(pool_access(&post, "/v1/pools/{pool}/acquire"), Some(PoolAccess::Write));
        assert_eq!(pool_access(&post, "/v1/pools/{pool}/release"), Some(PoolAccess::Write));
        assert_eq!(pool_access(&post, "/v1/pools/{pool}/sweep"), Some(PoolAccess::Write));
        for r in ["keys/{*key}", "ids/{id}", "bindings", "watch"] {
            let route = format!("/v1/pools/{{pool}}/{r}");
            assert_eq!(pool_access(&get, &route), Some(PoolAccess::Read), "{route}");
        }
    }

    #[test]
    fn metrics_of_other_pools_are_left_out() {
        let text = "# HELP x help\nx{pool=\"a\",op=\"acquire\"} 1\nx{pool=\"b\"} 2\ny 3\n";
        let f = filter_metrics(text, |p| p == "a");
        assert_eq!(f, "# HELP x help\nx{pool=\"a\",op=\"acquire\"} 1\ny 3\n");
    }
}
