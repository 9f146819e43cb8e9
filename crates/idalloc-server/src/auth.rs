//! Bearer tokens as named clients with scopes.
//!
//! - The tokens file ([`Tokens::load`]) names each client, its scope and how to recognise its
//!   token: `NAME SCOPE sha256:HEX` (the SHA-256 of the token, so the file holds no secret) or
//!   `NAME SCOPE file:PATH` (a file holding the token itself, e.g. a Kubernetes secret mount).
//! - [`required`] is the pure decision of which scope each route needs; the router's middleware
//!   ([`require_token`]) applies it, so the handlers only see an authenticated [`Client`].
//! - Each line may grant pools by name or glob, for reading and writing, and set quotas
//!   (`read=vni-* write=vni-a sessions=10 refs=1000 rate=50`): [`crate::grants`] parses and
//!   decides, [`require_token`] refuses a pool outside the grants (403) and a client over its rate
//!   (429, [`crate::quota`]).
//! - With tokens, durable holder names are namespaced by the client ([`Client::holder`]) and
//!   sessions belong to the client that opened them, so one client cannot release another's
//!   references.
//!
//! Presented tokens are hashed and compared with every configured digest in constant time
//! (`subtle`), without stopping at a match, so timing tells nothing about which digest is close.
//! Tokens are never logged, never put in an error or a metric label: an error names the client
//! (not a secret) or says that the token was not recognised.

use std::collections::HashSet;
use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use axum::extract::{MatchedPath, RawPathParams, Request, State};
use axum::http::{header, HeaderValue, Method, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::RequestExt;
use subtle::ConstantTimeEq;

use crate::error::ApiError;
use crate::grants::{pool_access, Policy, OPTIONS};
use crate::quota::Rate;
use crate::AppState;

/// What a client may do. Each scope includes the ones before it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Scope {
    /// Pools list and show, get, lookup, list bindings, watch, the OpenAPI document, metrics.
    Read,
    /// + acquire, release, client sessions (open, keep alive, end).
    Allocate,
    /// + create and delete pools, sweep.
    Admin,
}

impl Scope {
    pub fn as_str(self) -> &'static str {
        match self {
            Scope::Read => "read",
            Scope::Allocate => "allocate",
            Scope::Admin => "admin",
        }
    }

    fn parse(s: &str) -> Option<Scope> {
        match s {
            "read" => Some(Scope::Read),
            "allocate" => Some(Scope::Allocate),
            "admin" => Some(Scope::Admin),
            _ => None,
        }
    }
}

impl fmt::Display for Scope {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// An authenticated client: its name (from the tokens file), scope, pool grants and quotas. Put
/// in the request's extensions by [`require_token`].
#[derive(Clone, Debug)]
pub struct Client {
    pub name: Arc<str>,
    pub scope: Scope,
    /// Pools it may read and write, and its quotas (everything, none: a line without options).
    pub policy: Arc<Policy>,
    /// Its request-rate bucket (`rate=` in the tokens file), shared by all its requests.
    pub rate: Option<Arc<Rate>>,
}

/// Separates a client's name from its own holder name in the store (`NAME/HOLDER`). Client names
/// cannot contain it, so the first segment always tells whose reference it is.
pub const HOLDER_SEPARATOR: char = '/';

impl Client {
    /// A client with every pool granted and no quota.
    pub fn new(name: &str, scope: Scope) -> Client {
        Client { name: name.into(), scope, policy: Arc::new(Policy::default()), rate: None }
    }

    /// Whether this client acts on every client's sessions (lists them all, ends any): an
    /// administrator whose tokens-file line grants no pools by name (no `read=`, no `write=`),
    /// that is, one that may administer every pool. Every other client lists and ends only the
    /// sessions it opened: an administrator restricted to some pools could otherwise end a
    /// session holding references in pools outside its grants.
    pub fn administers_all(&self) -> bool {
        self.scope == Scope::Admin && !self.policy.restricted
    }

    /// The durable holder name `holder` of this client stands for in the store.
    pub fn holder(&self, holder: &str) -> String {
        format!("{}{HOLDER_SEPARATOR}{holder}", self.name)
    }
}

/// A SHA-256 digest of a token.
type Digest = [u8; 32];

fn sha256(token: &[u8]) -> Digest {
    let d = ring::digest::digest(&ring::digest::SHA256, token);
    let mut out = [0u8; 32];
    out.copy_from_slice(d.as_ref());
    out
}

/// The configured clients. `Debug` shows names and scopes only.
#[derive(Clone, Default)]
pub struct Tokens {
    entries: Vec<(Digest, Client)>,
}

impl fmt::Debug for Tokens {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_list()
            .entries(self.entries.iter().map(|(_, c)| format!("{} ({})", c.name, c.scope)))
            .finish()
    }
}

/// Tokens shorter than this are refused in `file:` entries (a guessable token is no token).
pub const MIN_TOKEN_BYTES: usize = 16;

const FORMAT: &str = "each line is `NAME SCOPE sha256:HEX [OPTION...]` or `NAME SCOPE \
     file:PATH [OPTION...]` (NAME [a-z0-9][a-z0-9._-]{0,62}, SCOPE read|allocate|admin, OPTION \
     read=POOLS write=POOLS sessions=N refs=N pools=N rate=N burst=N connections=N watches=N; \
     # starts a comment)";

fn valid_name(name: &str) -> bool {
    let b = name.as_bytes();
    !b.is_empty()
        && b.len() <= 63
        && (b[0].is_ascii_lowercase() || b[0].is_ascii_digit())
        && b.iter().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || b"._-".contains(c))
}

fn parse_hex(s: &str) -> Option<Digest> {
    if s.len() != 64 {
        return None;
    }
    let mut out = [0u8; 32];
    for (i, pair) in s.as_bytes().chunks(2).enumerate() {
        let hi = (pair[0] as char).to_digit(16)?;
        let lo = (pair[1] as char).to_digit(16)?;
        out[i] = (hi * 16 + lo) as u8;
    }
    Some(out)
}

impl Tokens {
    /// Reads the tokens file at `path` (`file:` paths are relative to its directory). Errors are
    /// one line naming the file (and line) and what is wrong, never a token.
    pub fn load(path: &Path) -> Result<Tokens, String> {
        crate::secret_files::check(path, crate::secret_files::Kind::TokensFile)?;
        let text = std::fs::read_to_string(path)
            .map_err(|e| format!("cannot read the tokens file {}: {e}", path.display()))?;
        let dir = path.parent().unwrap_or(Path::new("."));
        Self::parse(&text, dir).map_err(|e| format!("tokens file {}: {e}", path.display()))
    }

    /// Parses a tokens file's text; `file:` paths are relative to `dir`.
    pub fn parse(text: &str, dir: &Path) -> Result<Tokens, String> {
        let mut entries: Vec<(Digest, Client)> = Vec::new();
        let mut names = HashSet::new();
        for (i, raw) in text.lines().enumerate() {
            let n = i + 1;
            let line = raw.split('#').next().unwrap_or("").trim();
            if line.is_empty() {
                continue;
            }
            let fields: Vec<&str> = line.split_whitespace().collect();
            let [name, scope, secret, ref options @ ..] = fields[..] else {
                return Err(format!(
                    "line {n}: {} fields, expected at least 3: {FORMAT}",
                    fields.len()
                ));
            };
            let policy = Policy::parse(options)
                .map_err(|e| format!("line {n}: client {name:?}: {e} ({OPTIONS})"))?;
            if !valid_name(name) {
                return Err(format!("line {n}: invalid client name {name:?}: {FORMAT}"));
            }
            if !names.insert(name.to_string()) {
                return Err(format!("line {n}: client {name:?} is named twice"));
            }
            let scope = Scope::parse(scope).ok_or_else(|| {
                format!("line {n}: invalid scope {scope:?}: one of read, allocate, admin")
            })?;
            let digest = if let Some(hex) = secret.strip_prefix("sha256:") {
                parse_hex(hex).ok_or_else(|| {
                    format!("line {n}: sha256: needs 64 hex digits (the SHA-256 of the token)")
                })?
            } else if let Some(file) = secret.strip_prefix("file:") {
                let file = dir.join(file);
                let token = read_token_file(&file).map_err(|e| format!("line {n}: {e}"))?;
                sha256(token.as_bytes())
            } else {
                // Not shown: it may be a token pasted by mistake.
                return Err(format!(
                    "line {n}: the third field must start with sha256: or file: (its value is \
                     not shown); {FORMAT}"
                ));
            };
            if entries.iter().any(|(d, _)| bool::from(d.ct_eq(&digest))) {
                return Err(format!("line {n}: client {name:?} has the same token as another"));
            }
            let rate = policy.rate.map(|(r, b)| Arc::new(Rate::new(r, b)));
            entries.push((
                digest,
                Client { name: name.into(), scope, policy: Arc::new(policy), rate },
            ));
        }
        if entries.is_empty() {
            return Err(format!("no client is configured: {FORMAT}"));
        }
        Ok(Tokens { entries })
    }

    /// The client whose token `presented` is, if any. Every digest is compared, in constant
    /// time each.
    pub fn authenticate(&self, presented: &str) -> Option<&Client> {
        let digest = sha256(presented.as_bytes());
        let mut found = None;
        for (d, c) in &self.entries {
            if bool::from(d.ct_eq(&digest)) {
                found = Some(c);
            }
        }
        found
    }

    /// Configured clients.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }
}

/// A token from a file: its content without one trailing newline (`\n` or `\r\n`).
fn read_token_file(path: &PathBuf) -> Result<String, String> {
    crate::secret_files::check(path, crate::secret_files::Kind::TokenFile)?;
    let text = std::fs::read_to_string(path)
        .map_err(|e| format!("cannot read the token file {}: {e}", path.display()))?;
    let token = text.strip_suffix('\n').unwrap_or(&text);
    let token = token.strip_suffix('\r').unwrap_or(token);
    if token.len() < MIN_TOKEN_BYTES {
        return Err(format!(
            "the token in {} is {} bytes: at least {MIN_TOKEN_BYTES} (e.g. `openssl rand -hex 32`)",
            path.display(),
            token.len()
        ));
    }
    if token.chars().any(|c| c.is_whitespace() || c.is_control()) {
        return Err(format!(
            "the token in {} contains whitespace or control characters (it must fit in an \
             `Authorization: Bearer` header)",
            path.display()
        ));
    }
    Ok(token.to_string())
}

/// What a route needs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Access {
    /// No token: liveness and readiness probes (kubelets and load balancers send none).
    Open,
    /// A token of at least this scope.
    Needs(Scope),
}

/// The scope `method` on the route template `route` needs (`None` route: no route matched, which
/// still needs a token, so that probing paths without one learns nothing). Unknown routes need
/// `admin`: a route added without a decision here is closed, not open.
pub fn required(method: &Method, route: Option<&str>) -> Access {
    match route {
        None => Access::Needs(Scope::Read),
        Some(r) => classify(method, r).unwrap_or(Access::Needs(Scope::Admin)),
    }
}

/// The decision for the routes this module knows; `None` for any other (a test checks that
/// every route of the router is known).
pub fn classify(method: &Method, route: &str) -> Option<Access> {
    let read_only = *method == Method::GET || *method == Method::HEAD;
    Some(match route {
        "/healthz" | "/readyz" => Access::Open,
        "/metrics" | "/v1/openapi.json" | "/v1/version" => Access::Needs(Scope::Read),
        "/v1/pools" | "/v1/pools/{pool}" if read_only => Access::Needs(Scope::Read),
        "/v1/pools" | "/v1/pools/{pool}" | "/v1/pools/{pool}/sweep" => Access::Needs(Scope::Admin),
        "/v1/pools/{pool}/keys/{*key}"
        | "/v1/pools/{pool}/ids/{id}"
        | "/v1/pools/{pool}/bindings"
        | "/v1/pools/{pool}/watch" => Access::Needs(Scope::Read),
        // The sessions list: an unrestricted administrator's shows every client's, anyone
        // else's its own (`handlers::list_sessions`).
        "/v1/sessions" if read_only => Access::Needs(Scope::Allocate),
        "/v1/pools/{pool}/acquire"
        | "/v1/pools/{pool}/release"
        | "/v1/sessions"
        | "/v1/sessions/{id}"
        | "/v1/sessions/{id}/keepalive" => Access::Needs(Scope::Allocate),
        _ => return None,
    })
}

/// 401: no token, or one that names no client. `WWW-Authenticate` says how to authenticate
/// (RFC 6750), with `error="invalid_token"` when a token was presented.
fn unauthenticated(presented: bool) -> Response {
    let (msg, challenge) = if presented {
        (
            "the bearer token is not one this service knows",
            r#"Bearer realm="idalloc", error="invalid_token""#,
        )
    } else {
        ("this endpoint needs `Authorization: Bearer TOKEN`", r#"Bearer realm="idalloc""#)
    };
    let mut resp = ApiError::new(StatusCode::UNAUTHORIZED, "unauthenticated", msg).into_response();
    resp.headers_mut().insert(header::WWW_AUTHENTICATE, HeaderValue::from_static(challenge));
    resp
}

/// The bearer token of a request, if it has one (`Authorization: Bearer TOKEN`, scheme
/// case-insensitive). `Err` if the header is present but not a bearer token.
fn bearer(req: &Request) -> Result<Option<&str>, ()> {
    let Some(v) = req.headers().get(header::AUTHORIZATION) else { return Ok(None) };
    let v = v.to_str().map_err(|_| ())?;
    let (scheme, token) = v.split_once(' ').ok_or(())?;
    if !scheme.eq_ignore_ascii_case("bearer") {
        return Err(());
    }
    let token = token.trim();
    if token.is_empty() {
        return Err(());
    }
    Ok(Some(token))
}

/// The middleware: with tokens configured, authenticates the request and checks its scope; the
/// [`Client`] goes into the request's extensions. Without tokens, everything passes.
pub async fn require_token(
    State(st): State<Arc<AppState>>,
    mut req: Request,
    next: Next,
) -> Response {
    let Some(tokens) = st.config.tokens.as_ref() else { return next.run(req).await };
    let route = req.extensions().get::<MatchedPath>().map(|m| m.as_str().to_string());
    let need = match required(req.method(), route.as_deref()) {
        Access::Open => return next.run(req).await,
        Access::Needs(s) => s,
    };
    let client = match bearer(&req) {
        Ok(Some(token)) => match tokens.authenticate(token) {
            Some(c) => c.clone(),
            None => return unauthenticated(true),
        },
        Ok(None) => return unauthenticated(false),
        Err(()) => return unauthenticated(true),
    };
    let audited = |mut resp: Response, c: &Client| {
        resp.extensions_mut().insert(crate::audit::AuditClient(c.name.clone()));
        resp
    };
    if let Some(refused) = crate::quota::check_rate(&client) {
        return audited(refused, &client);
    }
    if client.scope < need {
        let what = format!("{} {}", req.method(), route.as_deref().unwrap_or("this route"));
        let refused = ApiError::new(
            StatusCode::FORBIDDEN,
            "forbidden",
            format!(
                "client {:?} has scope {}; {what} needs scope {need}",
                &*client.name, client.scope
            ),
        );
        return audited(refused.into_response(), &client);
    }
    // The pool grants: the pool the path names, for reading or writing.
    if let Some(access) = route.as_deref().and_then(|r| pool_access(req.method(), r)) {
        let params = req.extract_parts::<RawPathParams>().await;
        let pool = params
            .ok()
            .and_then(|p| p.iter().find(|(k, _)| *k == "pool").map(|(_, v)| v.to_string()));
        if let Some(pool) = pool {
            if let Err(why) = client.policy.check(&client.name, &pool, access) {
                let refused = ApiError::new(StatusCode::FORBIDDEN, "forbidden", why);
                return audited(refused.into_response(), &client);
            }
        }
    }
    req.extensions_mut().insert(client.clone());
    audited(next.run(req).await, &client)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Mode 0600, as a token file must be.
    fn private(path: &Path) {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600)).expect("chmod");
    }

    fn hex(d: &Digest) -> String {
        d.iter().map(|b| format!("{b:02x}")).collect()
    }

    #[test]
    fn a_known_digest_of_the_empty_token() {
        // The SHA-256 of the empty string (FIPS 180-2 test vector), so `sha256:` lines written
        // with `printf %s TOKEN | sha256sum` match what the service computes.
        assert_eq!(
            hex(&sha256(b"")),
            "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"
        );
    }

    #[test]
    fn parses_both_forms_and_authenticates_by_token() {
        let dir = tempfile::tempdir().expect("dir");
        std::fs::write(dir.path().join("b.token"), "bbbbbbbbbbbbbbbbbbbb\n").expect("write");
        private(&dir.path().join("b.token"));
        let a = "aaaaaaaaaaaaaaaaaaaa";
        let text = format!(
            "# clients\n\nalpha read sha256:{}  # a comment\nbeta admin file:b.token\n",
            hex(&sha256(a.as_bytes()))
        );
        let t = Tokens::parse(&text, dir.path()).expect("parse");
        assert_eq!(t.len(), 2);
        let alpha = t.authenticate(a).expect("alpha");
        assert_eq!((&*alpha.name, alpha.scope), ("alpha", Scope::Read));
        let beta = t.authenticate("bbbbbbbbbbbbbbbbbbbb").expect("beta");
        assert_eq!((&*beta.name, beta.scope), ("beta", Scope::Admin));
        assert!(t.authenticate("bbbbbbbbbbbbbbbbbbbb\n").is_none());
        assert!(t.authenticate("").is_none());
        assert!(!format!("{t:?}").contains("aaaa"), "{t:?}");
    }

    #[test]
    fn bad_files_are_refused_with_the_line_and_never_the_secret() {
        let dir = tempfile::tempdir().expect("dir");
        std::fs::write(dir.path().join("short"), "abc").expect("write");
        private(&dir.path().join("short"));
        std::fs::write(dir.path().join("open"), "abcdefghijklmnopqrstuvwxyz").expect("write");
        {
            use std::os::unix::fs::PermissionsExt;
            let mode = std::fs::Permissions::from_mode(0o666);
            std::fs::set_permissions(dir.path().join("open"), mode).expect("chmod");
        }
        let h = hex(&sha256(b"x"));
        let cases: Vec<(String, &str)> = vec![
            ("alpha read".into(), "line 1: 2 fields"),
            (format!("alpha read sha256:{h} refs=0"), "line 1: client \"alpha\": invalid refs"),
            (format!("alpha read sha256:{h} pools=x"), "line 1: client \"alpha\": invalid pools"),
            (format!("alpha read sha256:{h} colour=red"), "unknown option \"colour\""),
            (format!("Alpha read sha256:{h}"), "invalid client name \"Alpha\""),
            (format!("a/b read sha256:{h}"), "invalid client name \"a/b\""),
            (format!("alpha root sha256:{h}"), "invalid scope \"root\""),
            ("alpha read sha256:abc".into(), "64 hex digits"),
            ("alpha read hunter2-secret-token".into(), "its value is not shown"),
            ("alpha read file:short".into(), "3 bytes: at least 16"),
            ("alpha read file:missing".into(), "cannot read the token file"),
            (
                "alpha read file:open".into(),
                "writable by anyone: refusing to use it; run `chmod 600",
            ),
            (
                format!("alpha read sha256:{h}\nalpha admin sha256:{h}"),
                "line 2: client \"alpha\" is named twice",
            ),
            (
                format!("alpha read sha256:{h}\nbeta admin sha256:{h}"),
                "line 2: client \"beta\" has the same token",
            ),
            ("# nothing\n".into(), "no client is configured"),
        ];
        for (text, want) in cases {
            let e = Tokens::parse(&text, dir.path()).expect_err(&text);
            assert!(e.contains(want), "{text:?}: {e}");
            assert!(!e.contains("hunter2"), "{e}");
        }
    }

    #[test]
    fn scopes_per_route_and_unknown_routes_closed() {
        use Access::*;
        let get = Method::GET;
        let post = Method::POST;
        let del = Method::DELETE;
        let put = Method::PUT;
        let cases = [
            (&get, Some("/healthz"), Open),
            (&get, Some("/readyz"), Open),
            (&get, Some("/metrics"), Needs(Scope::Read)),
            (&get, Some("/v1/openapi.json"), Needs(Scope::Read)),
            (&get, Some("/v1/pools"), Needs(Scope::Read)),
            (&post, Some("/v1/pools"), Needs(Scope::Admin)),
            (&get, Some("/v1/pools/{pool}"), Needs(Scope::Read)),
            (&del, Some("/v1/pools/{pool}"), Needs(Scope::Admin)),
            (&post, Some("/v1/pools/{pool}/sweep"), Needs(Scope::Admin)),
            (&post, Some("/v1/pools/{pool}/acquire"), Needs(Scope::Allocate)),
            (&post, Some("/v1/pools/{pool}/release"), Needs(Scope::Allocate)),
            (&get, Some("/v1/pools/{pool}/keys/{*key}"), Needs(Scope::Read)),
            (&get, Some("/v1/pools/{pool}/ids/{id}"), Needs(Scope::Read)),
            (&get, Some("/v1/pools/{pool}/bindings"), Needs(Scope::Read)),
            (&get, Some("/v1/pools/{pool}/watch"), Needs(Scope::Read)),
            (&post, Some("/v1/sessions"), Needs(Scope::Allocate)),
            (&get, Some("/v1/sessions"), Needs(Scope::Allocate)),
            (&del, Some("/v1/sessions/{id}"), Needs(Scope::Allocate)),
            (&put, Some("/v1/sessions/{id}/keepalive"), Needs(Scope::Allocate)),
            (&get, Some("/v1/some-new-route"), Needs(Scope::Admin)),
            (&get, None, Needs(Scope::Read)),
        ];
        for (m, r, want) in cases {
            assert_eq!(required(m, r), want, "{m} {r:?}");
        }
        assert!(Scope::Read < Scope::Allocate && Scope::Allocate < Scope::Admin);
    }

    #[test]
    fn holders_are_namespaced_by_client() {
        let c = Client::new("alpha", Scope::Allocate);
        assert_eq!(c.holder("node-1"), "alpha/node-1");
        // Another client's full holder name, passed by this one, lands in this one's namespace.
        assert_eq!(c.holder("beta/node-1"), "alpha/beta/node-1");
    }
}
