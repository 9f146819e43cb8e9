//! Store URLs, as users type them (`file:PATH`, `memory:`, `etcd://HOST:PORT,...`,
//! `http[s]://HOST:PORT,...`): one parser and one opener, shared by the `idalloc` CLI and the
//! CNI IPAM plugin, so that a URL means the same store to both.
//!
//! [`store_url`] is pure (a bad URL is refused before anything is opened, and its message names
//! the value and the accepted forms, never a password); [`open`] opens what it names with
//! [`OpenOptions`]. The CLI adds its flags (etcd TLS files, the password sources) on top of the
//! parsed [`StoreUrl`] before opening.

use std::sync::Arc;
use std::time::Duration;

use super::embedded::{EmbeddedOptions, EmbeddedStore};
use super::etcd::{EtcdAuth, EtcdOptions, EtcdStore, EtcdTls, Password};
use super::{Store, StoreError, StoreResult};

/// Accepted store forms, quoted in every store URL error.
pub const STORE_RULE: &str =
    "accepted stores: file:PATH (a local file, default file:idalloc.redb), \
     memory: (throwaway, this process only), etcd://HOST:PORT[,HOST:PORT...] (with a user: \
     etcd://USER@HOST:PORT), http://HOST:PORT[,...] or https://HOST:PORT[,...]";

/// Where the data lives.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum StoreUrl {
    /// A `redb` file on this machine.
    File(String),
    /// An in-memory store that disappears with the process.
    Memory,
    /// etcd client URLs (`http://host:port`, `https://host:port`, or a bare `host:port` whose
    /// scheme the caller's TLS settings decide), and credentials from the URL's user info.
    Etcd { endpoints: Vec<String>, user: Option<String>, password: Option<Password> },
}

impl StoreUrl {
    /// "file", "memory" or "etcd".
    pub fn kind(&self) -> &'static str {
        match self {
            StoreUrl::File(_) => "file",
            StoreUrl::Memory => "memory",
            StoreUrl::Etcd { .. } => "etcd",
        }
    }

    /// The path or the endpoints, for humans. Never the credentials.
    pub fn endpoint(&self) -> String {
        match self {
            StoreUrl::File(p) => p.clone(),
            StoreUrl::Memory => "(this process)".to_string(),
            StoreUrl::Etcd { endpoints, .. } => endpoints.join(","),
        }
    }
}

/// `s` with the password of an `etcd://user:password@...` URL replaced by `***`, for messages.
pub fn redact_store(s: &str) -> String {
    let Some(rest) = s.strip_prefix("etcd://") else { return s.to_string() };
    match rest.rsplit_once('@') {
        Some((userinfo, hosts)) => match userinfo.split_once(':') {
            Some((user, _)) => format!("etcd://{user}:***@{hosts}"),
            None => s.to_string(),
        },
        None => s.to_string(),
    }
}

/// `text` with every `etcd://user:password@` in it redacted as [`redact_store`] does: for messages
/// that quote the command line (clap's "invalid value '...'").
pub fn redact_urls(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(at) = rest.find("etcd://") {
        out.push_str(&rest[..at]);
        let tail = &rest[at..];
        let end =
            tail.find(|c: char| c.is_whitespace() || c == '\'' || c == '"').unwrap_or(tail.len());
        out.push_str(&redact_store(&tail[..end]));
        rest = &tail[end..];
    }
    out.push_str(rest);
    out
}

/// Decodes `%XX` escapes (URL user info), so a password may hold `@`, `:` or `,`.
fn percent_decode(s: &str, whole: &str) -> Result<String, String> {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' {
            let hex = bytes.get(i + 1..i + 3).and_then(|h| std::str::from_utf8(h).ok());
            match hex.and_then(|h| u8::from_str_radix(h, 16).ok()) {
                Some(b) => {
                    out.push(b);
                    i += 3;
                    continue;
                }
                None => {
                    return Err(format!(
                        "store {:?} has a bad %-escape in its user info: {STORE_RULE}",
                        redact_store(whole)
                    ))
                }
            }
        }
        out.push(bytes[i]);
        i += 1;
    }
    String::from_utf8(out).map_err(|_| {
        format!("store {:?} has user info that is not UTF-8: {STORE_RULE}", redact_store(whole))
    })
}

/// Parses `file:PATH`, `memory:`, `etcd://[USER[:PASSWORD]@]HOST:PORT[,HOST:PORT...]` or
/// `http[s]://HOST:PORT[,http[s]://HOST:PORT...]` (the scheme on later members is optional).
/// Messages never repeat a password.
pub fn store_url(s: &str) -> Result<StoreUrl, String> {
    if let Some(path) = s.strip_prefix("file:") {
        // `file://` URLs carry an absolute path after the authority; accept `file:///x` as `/x`.
        let path = path.strip_prefix("//").unwrap_or(path);
        if path.is_empty() {
            return Err(format!("store {s:?} names no file: {STORE_RULE}"));
        }
        return Ok(StoreUrl::File(path.to_string()));
    }
    if s == "memory:" || s == "memory" {
        return Ok(StoreUrl::Memory);
    }
    let shown = redact_store(s);
    let (mut user, mut password) = (None, None);
    let (members, default_scheme) = if let Some(rest) = s.strip_prefix("etcd://") {
        let hosts = match rest.rsplit_once('@') {
            Some((userinfo, hosts)) => {
                let (u, p) = match userinfo.split_once(':') {
                    Some((u, p)) => (u, Some(p)),
                    None => (userinfo, None),
                };
                if u.is_empty() {
                    return Err(format!("store {shown:?} has an empty user name: {STORE_RULE}"));
                }
                user = Some(percent_decode(u, s)?);
                password = p.map(|p| percent_decode(p, s)).transpose()?.map(Password::new);
                hosts
            }
            None => rest,
        };
        (hosts, "")
    } else if s.starts_with("http://") {
        (s, "http://")
    } else if s.starts_with("https://") {
        (s, "https://")
    } else {
        return Err(format!("unknown store {shown:?}: {STORE_RULE}"));
    };
    let mut endpoints = Vec::new();
    for m in members.split(',') {
        let (scheme, hp) = if let Some(hp) = m.strip_prefix("http://") {
            ("http://", hp)
        } else if let Some(hp) = m.strip_prefix("https://") {
            ("https://", hp)
        } else {
            (default_scheme, m)
        };
        let hp = hp.trim_end_matches('/');
        let ok = match hp.rsplit_once(':') {
            Some((host, port)) => {
                !host.is_empty()
                    && !host.contains(['/', '@'])
                    && port.parse::<u16>().is_ok_and(|p| p != 0)
            }
            None => false,
        };
        if !ok {
            let m = if m.contains('@') { "(with user info)" } else { m };
            return Err(format!("store {shown:?} has member {m:?}, not HOST:PORT: {STORE_RULE}"));
        }
        endpoints.push(format!("{scheme}{hp}"));
    }
    Ok(StoreUrl::Etcd { endpoints, user, password })
}

/// How [`open`] opens a store: [`OpenOptions::builder`], or [`OpenOptions::default`] and field
/// assignments.
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct OpenOptions {
    /// etcd's connect and request timeouts.
    pub etcd_timeout: Duration,
    /// TLS settings for etcd (`None`: plain `http://`, or the system's trust store for
    /// `https://`).
    pub etcd_tls: Option<EtcdTls>,
    /// How long to wait for another process to release a store file.
    pub lock_timeout: Duration,
    /// The etcd user, for a URL without one (a URL's own `USER:PASSWORD@` wins).
    pub etcd_auth: Option<EtcdAuth>,
    /// Run the file store's whole-file integrity check on opening
    /// ([`EmbeddedOptions::check_integrity`]). Default false.
    pub check_integrity: bool,
}

impl Default for OpenOptions {
    fn default() -> Self {
        OpenOptions {
            etcd_timeout: Duration::from_secs(5),
            etcd_tls: None,
            lock_timeout: Duration::from_secs(30),
            etcd_auth: None,
            check_integrity: false,
        }
    }
}

impl OpenOptions {
    /// A builder starting from [`OpenOptions::default`].
    pub fn builder() -> OpenOptionsBuilder {
        OpenOptionsBuilder { opts: OpenOptions::default() }
    }
}

/// Builds [`OpenOptions`]; every setter sets the field of the same name.
#[derive(Clone, Debug)]
#[must_use]
pub struct OpenOptionsBuilder {
    opts: OpenOptions,
}

impl OpenOptionsBuilder {
    /// [`OpenOptions::etcd_timeout`].
    pub fn etcd_timeout(mut self, timeout: Duration) -> Self {
        self.opts.etcd_timeout = timeout;
        self
    }
    /// [`OpenOptions::etcd_tls`].
    pub fn etcd_tls(mut self, tls: Option<EtcdTls>) -> Self {
        self.opts.etcd_tls = tls;
        self
    }
    /// [`OpenOptions::lock_timeout`].
    pub fn lock_timeout(mut self, timeout: Duration) -> Self {
        self.opts.lock_timeout = timeout;
        self
    }
    /// [`OpenOptions::etcd_auth`].
    pub fn etcd_auth(mut self, auth: Option<EtcdAuth>) -> Self {
        self.opts.etcd_auth = auth;
        self
    }
    /// [`OpenOptions::check_integrity`].
    pub fn check_integrity(mut self, check: bool) -> Self {
        self.opts.check_integrity = check;
        self
    }
    /// The options; a zero timeout is refused, naming it.
    pub fn build(self) -> StoreResult<OpenOptions> {
        if self.opts.etcd_timeout.is_zero() {
            return Err(StoreError::InvalidRequest(
                "store open option etcd_timeout is 0: it must be a positive duration".into(),
            ));
        }
        Ok(self.opts)
    }
}

/// etcd client URLs with their scheme: a bare `HOST:PORT` is `https://` when `tls` (TLS settings
/// are given), else `http://`; a URL with a scheme is kept.
pub fn with_scheme(endpoints: &[String], tls: bool) -> Vec<String> {
    let scheme = if tls { "https://" } else { "http://" };
    endpoints
        .iter()
        .map(|e| {
            if e.starts_with("http://") || e.starts_with("https://") {
                e.clone()
            } else {
                format!("{scheme}{e}")
            }
        })
        .collect()
}

/// Opens the store `url` names: a file store (created if missing), a fresh memory store, or an
/// etcd client (authenticated with the URL's user and password, if it has them). Errors are the
/// store's: [`StoreError::InvalidRequest`] for a bad URL or settings, `Locked` for a file another
/// process holds past `lock_timeout`, `Unavailable` for an etcd that cannot be reached.
pub async fn open(url: &str, opts: &OpenOptions) -> StoreResult<Arc<dyn Store>> {
    let parsed = store_url(url).map_err(StoreError::InvalidRequest)?;
    open_parsed(&parsed, opts).await
}

/// [`open`] for a URL parsed already.
pub async fn open_parsed(url: &StoreUrl, opts: &OpenOptions) -> StoreResult<Arc<dyn Store>> {
    match url {
        StoreUrl::Memory => Ok(Arc::new(EmbeddedStore::memory())),
        StoreUrl::File(path) => {
            let eo = EmbeddedOptions {
                lock_timeout: opts.lock_timeout,
                check_integrity: opts.check_integrity,
                ..EmbeddedOptions::default()
            };
            Ok(Arc::new(EmbeddedStore::open(path, eo).await?))
        }
        StoreUrl::Etcd { endpoints, user, password } => {
            let mut eo = EtcdOptions::new(with_scheme(endpoints, opts.etcd_tls.is_some()));
            eo.connect_timeout = opts.etcd_timeout;
            eo.request_timeout = opts.etcd_timeout;
            eo.tls = opts.etcd_tls.clone();
            eo.auth = match (user, password) {
                (Some(user), Some(password)) => {
                    Some(EtcdAuth { user: user.clone(), password: password.clone() })
                }
                (Some(user), None) => {
                    return Err(StoreError::InvalidRequest(format!(
                        "etcd user {user:?} has no password: give it in the URL, \
                         etcd://USER:PASSWORD@HOST:PORT"
                    )))
                }
                (None, _) => opts.etcd_auth.clone(),
            };
            Ok(Arc::new(EtcdStore::connect(eo).await?))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn forms() {
        assert_eq!(store_url("file:/x/y.redb").unwrap(), StoreUrl::File("/x/y.redb".into()));
        assert_eq!(store_url("file:///x").unwrap(), StoreUrl::File("/x".into()));
        assert_eq!(store_url("memory:").unwrap(), StoreUrl::Memory);
        assert_eq!(
            store_url("etcd://10.0.0.1:2379,10.0.0.2:2379").unwrap(),
            StoreUrl::Etcd {
                endpoints: vec!["10.0.0.1:2379".into(), "10.0.0.2:2379".into()],
                user: None,
                password: None
            }
        );
        let e = store_url("etcd://u:secret@h").unwrap_err();
        assert!(!e.contains("secret") && e.contains("accepted stores"), "{e}");
        assert!(store_url("ftp://x").unwrap_err().contains("\"ftp://x\""));
        let eps = ["h:1".to_string(), "http://a:2".to_string(), "https://b:3".to_string()];
        assert_eq!(with_scheme(&eps, true), ["https://h:1", "http://a:2", "https://b:3"]);
        assert_eq!(with_scheme(&eps, false), ["http://h:1", "http://a:2", "https://b:3"]);
    }

    #[tokio::test]
    async fn open_memory_and_refuse_bad_urls() {
        assert!(open("memory:", &OpenOptions::default()).await.is_ok());
        match open("etcd://alice@127.0.0.1:1", &OpenOptions::default()).await {
            Err(StoreError::InvalidRequest(m)) => assert!(m.contains("alice"), "{m}"),
            other => panic!("{:?}", other.map(|_| ())),
        }
        match open("nope", &OpenOptions::default()).await {
            Err(StoreError::InvalidRequest(m)) => assert!(m.contains("\"nope\""), "{m}"),
            other => panic!("{:?}", other.map(|_| ())),
        }
    }
}
