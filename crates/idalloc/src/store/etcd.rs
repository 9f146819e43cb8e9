//! [`Store`] over a real etcd cluster (etcd ≥ 3.4), through the `etcd-client` crate.
//!
//! The mapping is deliberately thin: the trait's types mirror etcd's protobuf messages, so each
//! method is one etcd RPC (plus, only on some error paths, one extra look-up to fill in the
//! revision numbers of [`StoreError::Compacted`] / [`StoreError::FutureRevision`], which etcd's
//! error messages do not carry).
//!
//! Two rules hold for every call, because the allocator's guarantee G6 ("never a hang") depends
//! on them:
//! - every request is bounded by [`EtcdOptions::request_timeout`], twice over: tonic's per-request
//!   timeout, and a `tokio::time::timeout` around the whole call (tonic's only covers the wait for
//!   response headers, and a balanced channel with no reachable endpoint waits forever for one to
//!   become ready);
//! - connecting is lazy: [`EtcdStore::connect`] does not touch the network (except to
//!   authenticate, when a user is configured), so an unreachable endpoint shows up as
//!   [`StoreError::Unavailable`] on the first request, within the timeouts.
//!
//! Security (DESIGN §12, docs/guide/security.md): `https://` endpoints with a CA, a client certificate
//! and key ([`EtcdTls`]); a user and password ([`EtcdAuth`]), whose token etcd-client renews when
//! etcd says it expired or is unknown (after `--auth-token-ttl` idle seconds, or an etcd
//! restart). A refusal (TLS, credentials, permissions) is [`StoreError::Access`], not
//! `Unavailable`: when a store that never had an answer times out, the `diagnose` module probes the
//! endpoints to name the cause. Passwords never appear in `Debug` output or errors.
//!
//! About 900 lines of code because the mapping to etcd-client and the error classification
//! (timeouts, access refusals, compaction, the revisions etcd's messages leave out) must agree call
//! by call; TLS setup and the failure diagnosis are already their own files (`tls.rs`,
//! `diagnose.rs`).

mod diagnose;
mod tls;

pub use tls::EtcdTls;

use std::future::Future;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use etcd_client::{
    Client, Compare as EtcdCompare, CompareOp as EtcdCompareOp, ConnectOptions, DeleteOptions,
    EventType, GetOptions, PutOptions, SortOrder, SortTarget, Txn, TxnOp as EtcdTxnOp,
    TxnOpResponse, WatchOptions,
};
use futures::StreamExt;

use self::diagnose::Finding;
use self::tls::Target;
use super::{
    AccessCause, Compare, CompareOp, CompareTarget, GetRequest, GetResponse, KeyRange, KeyValue,
    Lease, LeaseId, OpResponse, Revision, Store, StoreError, StoreResult, TxnOp, TxnRequest,
    TxnResponse, WatchEvent, WatchMessage, WatchStream,
};

/// How to reach etcd: [`EtcdOptions::builder`], or [`EtcdOptions::new`] and field assignments.
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct EtcdOptions {
    /// Client URLs, e.g. `http://127.0.0.1:2379`. At least one.
    pub endpoints: Vec<String>,
    /// Bound on establishing a TCP connection to one endpoint.
    pub connect_timeout: Duration,
    /// Bound on every request, from sending it to having its whole answer (for a watch: until
    /// etcd confirmed the watch was created).
    pub request_timeout: Duration,
    /// HTTP/2 ping interval, so that a dead connection under a long-lived watch is noticed (the
    /// watch then yields [`StoreError::Unavailable`]) instead of waiting silently forever.
    pub keep_alive_interval: Duration,
    /// How long to wait for a ping's answer before declaring the connection dead.
    pub keep_alive_timeout: Duration,
    /// TLS settings. `None` with `https://` endpoints: the system's trust store, no client
    /// certificate. With TLS settings every endpoint must be `https://`.
    pub tls: Option<EtcdTls>,
    /// A user to authenticate as (etcd with `auth enable`).
    pub auth: Option<EtcdAuth>,
}

/// An etcd user and password. The password is kept out of `Debug` output.
#[derive(Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct EtcdAuth {
    pub user: String,
    pub password: Password,
}

impl EtcdAuth {
    /// A user and its password (a [`Password`] or a string).
    pub fn new(user: impl Into<String>, password: impl Into<Password>) -> Self {
        EtcdAuth { user: user.into(), password: password.into() }
    }
}

impl std::fmt::Debug for EtcdAuth {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EtcdAuth")
            .field("user", &self.user)
            .field("password", &self.password)
            .finish()
    }
}

/// A secret that is shown as `<redacted>` by `Debug` and has no `Display`, so that it cannot end
/// up in a log line, an error message or `status` output by accident.
#[derive(Clone, PartialEq, Eq)]
pub struct Password(String);

impl Password {
    pub fn new(secret: impl Into<String>) -> Self {
        Password(secret.into())
    }
    /// The secret itself, for the one place that sends it to etcd.
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl From<String> for Password {
    fn from(secret: String) -> Self {
        Password(secret)
    }
}

impl From<&str> for Password {
    fn from(secret: &str) -> Self {
        Password(secret.to_string())
    }
}

impl std::fmt::Debug for Password {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("<redacted>")
    }
}

impl EtcdOptions {
    /// Options with the given endpoints and defaults suited to a LAN cluster (connect 3 s,
    /// requests 5 s, pings every 10 s with a 5 s timeout).
    pub fn new(endpoints: impl IntoIterator<Item = impl Into<String>>) -> Self {
        EtcdOptions {
            endpoints: endpoints.into_iter().map(Into::into).collect(),
            connect_timeout: Duration::from_secs(3),
            request_timeout: Duration::from_secs(5),
            keep_alive_interval: Duration::from_secs(10),
            keep_alive_timeout: Duration::from_secs(5),
            tls: None,
            auth: None,
        }
    }

    /// A builder starting from [`EtcdOptions::new`]`(endpoints)`.
    ///
    /// ```
    /// use std::time::Duration;
    /// use idalloc::store::etcd::EtcdOptions;
    /// let opts = EtcdOptions::builder(["http://127.0.0.1:2379"])
    ///     .request_timeout(Duration::from_secs(2))
    ///     .build()?;
    /// assert_eq!(opts.endpoints, ["http://127.0.0.1:2379"]);
    /// assert!(EtcdOptions::builder(Vec::<String>::new()).build().is_err());
    /// # Ok::<(), idalloc::store::StoreError>(())
    /// ```
    pub fn builder(endpoints: impl IntoIterator<Item = impl Into<String>>) -> EtcdOptionsBuilder {
        EtcdOptionsBuilder { opts: EtcdOptions::new(endpoints) }
    }

    /// Checks the options without connecting: at least one endpoint, none empty, all or none
    /// `https://` (all with TLS settings), a non-empty user name, positive durations.
    /// [`EtcdStore::connect`] runs the same check.
    pub fn validate(&self) -> StoreResult<()> {
        if self.endpoints.is_empty() {
            return Err(StoreError::InvalidRequest(
                "no etcd endpoints given: at least one client URL such as http://127.0.0.1:2379 \
                 is required"
                    .into(),
            ));
        }
        if let Some(bad) = self.endpoints.iter().find(|e| e.trim().is_empty()) {
            return Err(StoreError::InvalidRequest(format!(
                "etcd endpoint {bad:?} is empty: expected a client URL such as http://127.0.0.1:2379"
            )));
        }
        let https = self.endpoints.iter().filter(|e| e.starts_with("https://")).count();
        if https > 0 && https < self.endpoints.len() {
            let plain = self.endpoints.iter().find(|e| !e.starts_with("https://"));
            return Err(StoreError::InvalidRequest(format!(
                "etcd endpoints mix https:// and plain {plain:?}: use https:// for every member"
            )));
        }
        if let Some(tls) = &self.tls {
            if let Some(plain) = self.endpoints.iter().find(|e| !e.starts_with("https://")) {
                let what = if tls.insecure_skip_verify {
                    "--insecure-skip-tls-verify"
                } else {
                    "TLS settings (--cacert, --cert, --key)"
                };
                return Err(StoreError::InvalidRequest(format!(
                    "etcd endpoint {plain:?} is not https:// but {what} were given: use \
                     https://HOST:PORT"
                )));
            }
        }
        if let Some(auth) = &self.auth {
            if auth.user.trim().is_empty() {
                return Err(StoreError::InvalidRequest(
                    "the etcd user name is empty: give a user name (--user NAME)".into(),
                ));
            }
        }
        for (name, value) in [
            ("connect_timeout", self.connect_timeout),
            ("request_timeout", self.request_timeout),
            ("keep_alive_interval", self.keep_alive_interval),
            ("keep_alive_timeout", self.keep_alive_timeout),
        ] {
            if value.is_zero() {
                return Err(StoreError::InvalidRequest(format!(
                    "etcd option {name} is 0: it must be a positive duration"
                )));
            }
        }
        Ok(())
    }
}

/// Builds [`EtcdOptions`]; every setter sets the field of the same name.
#[derive(Clone, Debug)]
#[must_use]
pub struct EtcdOptionsBuilder {
    opts: EtcdOptions,
}

impl EtcdOptionsBuilder {
    /// [`EtcdOptions::connect_timeout`].
    pub fn connect_timeout(mut self, timeout: Duration) -> Self {
        self.opts.connect_timeout = timeout;
        self
    }
    /// [`EtcdOptions::request_timeout`].
    pub fn request_timeout(mut self, timeout: Duration) -> Self {
        self.opts.request_timeout = timeout;
        self
    }
    /// [`EtcdOptions::keep_alive_interval`].
    pub fn keep_alive_interval(mut self, interval: Duration) -> Self {
        self.opts.keep_alive_interval = interval;
        self
    }
    /// [`EtcdOptions::keep_alive_timeout`].
    pub fn keep_alive_timeout(mut self, timeout: Duration) -> Self {
        self.opts.keep_alive_timeout = timeout;
        self
    }
    /// [`EtcdOptions::tls`].
    pub fn tls(mut self, tls: Option<EtcdTls>) -> Self {
        self.opts.tls = tls;
        self
    }
    /// [`EtcdOptions::auth`].
    pub fn auth(mut self, auth: Option<EtcdAuth>) -> Self {
        self.opts.auth = auth;
        self
    }
    /// The options, checked by [`EtcdOptions::validate`].
    pub fn build(self) -> StoreResult<EtcdOptions> {
        self.opts.validate()?;
        Ok(self.opts)
    }
}

/// A [`Store`] backed by an etcd cluster. Cheap to share behind an `Arc`; all methods take `&self`
/// and may run concurrently (the underlying gRPC channel multiplexes them).
#[derive(Clone)]
pub struct EtcdStore {
    client: Client,
    request_timeout: Duration,
    diag: Arc<Diagnosis>,
}

/// What the store needs to explain a failure: the endpoints, the TLS configs to replay a
/// handshake with, the user (named in refusals), and whether etcd has ever answered.
struct Diagnosis {
    targets: Vec<Target>,
    tls: Option<Arc<rustls::ClientConfig>>,
    permissive: Option<Arc<rustls::ClientConfig>>,
    budget: Duration,
    user: Option<String>,
    answered: AtomicBool,
}

impl Diagnosis {
    fn endpoints(&self) -> String {
        self.targets.iter().map(|t| t.url.as_str()).collect::<Vec<_>>().join(",")
    }

    /// Probes every endpoint (see [`diagnose`]) and turns an `Unavailable` into the refusal it
    /// really is, or adds what each endpoint showed. Only until etcd has answered once.
    async fn explain(&self, failure: Failure) -> Failure {
        let Failure::Unavailable(msg) = failure else { return failure };
        if self.answered.load(Ordering::Relaxed) {
            return Failure::Unavailable(msg);
        }
        let probes = self
            .targets
            .iter()
            .map(|t| diagnose::probe(t, self.tls.as_ref(), self.permissive.as_ref(), self.budget));
        let findings = futures::future::join_all(probes).await;
        let mut seen = Vec::new();
        for f in findings {
            match f {
                Finding::Refused { endpoint, cause, detail } => {
                    return Failure::Access { endpoint: Some(endpoint), cause, detail }
                }
                Finding::Unreachable { endpoint, detail } => {
                    seen.push(format!("{endpoint}: {detail}"))
                }
                Finding::Fine => {}
            }
        }
        if seen.is_empty() {
            Failure::Unavailable(msg)
        } else {
            Failure::Unavailable(format!("{msg} ({})", seen.join("; ")))
        }
    }
}

impl std::fmt::Debug for EtcdStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EtcdStore")
            .field("endpoints", &self.diag.endpoints())
            .field("user", &self.diag.user)
            .field("request_timeout", &self.request_timeout)
            .finish()
    }
}

impl EtcdStore {
    /// Creates a client for `options.endpoints`. Does not wait for a connection (see the module
    /// docs), except to authenticate when `options.auth` is set: an unreachable cluster is
    /// reported by the first request, as [`StoreError::Unavailable`]. Fails with
    /// [`StoreError::InvalidRequest`] on bad options (no endpoint, a malformed URL, a zero
    /// timeout, an unreadable certificate file), and with [`StoreError::Access`] when the
    /// credentials are refused.
    pub async fn connect(options: EtcdOptions) -> StoreResult<Self> {
        options.validate()?;
        let targets =
            options.endpoints.iter().map(|e| Target::parse(e)).collect::<StoreResult<Vec<_>>>()?;
        let https = options.endpoints.iter().all(|e| e.starts_with("https://"));
        let tls_settings = options.tls.clone().or_else(|| https.then(EtcdTls::default));
        let insecure = tls_settings.as_ref().is_some_and(|t| t.insecure_skip_verify);
        if insecure {
            tracing::warn!(
                endpoints = ?options.endpoints,
                "TLS server verification is OFF (insecure_skip_tls_verify): anyone on the path \
                 can impersonate etcd; use this for testing only"
            );
        }
        let loaded = tls_settings.as_ref().map(tls::load).transpose()?;
        let mut connect = ConnectOptions::new()
            .with_connect_timeout(options.connect_timeout)
            .with_timeout(options.request_timeout)
            .with_keep_alive(options.keep_alive_interval, options.keep_alive_timeout)
            .with_keep_alive_while_idle(false);
        if let Some(auth) = &options.auth {
            // etcd-client re-authenticates and retries once when etcd answers "invalid auth
            // token" (the token expired after --auth-token-ttl, or etcd restarted).
            connect = connect
                .with_user(auth.user.clone(), auth.password.expose().to_string())
                .with_auto_token_refresh(true);
        }
        if let (Some(l), false) = (&loaded, insecure) {
            connect = connect.with_tls(l.tonic.clone());
        }
        let diag = Arc::new(Diagnosis {
            targets: targets.clone(),
            tls: loaded.map(|l| l.rustls),
            permissive: tls::permissive(),
            budget: options.connect_timeout.min(options.request_timeout),
            user: options.auth.as_ref().map(|a| a.user.clone()),
            answered: AtomicBool::new(false),
        });
        let endpoints = options.endpoints.clone();
        // `insecure` implies TLS settings, hence a loaded config.
        let insecure_config = if insecure { diag.tls.clone() } else { None };
        let connecting = async {
            if let Some(config) = insecure_config {
                let channel = tls::InsecureChannel {
                    targets,
                    config,
                    connect_timeout: options.connect_timeout,
                    request_timeout: options.request_timeout,
                    keep_alive: (options.keep_alive_interval, options.keep_alive_timeout),
                };
                Client::connect_with_balanced_channel(&endpoints, Some(connect), channel).await
            } else {
                Client::connect(&endpoints, Some(connect)).await
            }
        };
        // `Client::connect` only builds a lazy balanced channel (no network without auth), but
        // it is async, so bound it anyway; with a user it authenticates, over the network.
        let bound = options.connect_timeout.max(options.request_timeout);
        let failure = match tokio::time::timeout(bound, connecting).await {
            Ok(Ok(client)) => {
                if options.auth.is_some() {
                    diag.answered.store(true, Ordering::Relaxed);
                }
                return Ok(EtcdStore { client, request_timeout: options.request_timeout, diag });
            }
            Ok(Err(etcd_client::Error::InvalidUri(_) | etcd_client::Error::InvalidArgs(_))) => {
                return Err(StoreError::InvalidRequest(format!(
                    "bad etcd endpoints {:?}",
                    options.endpoints
                )))
            }
            Ok(Err(e)) => classify(e),
            Err(_) => Failure::Unavailable(format!(
                "connecting to etcd at {} took longer than {bound:?}",
                diag.endpoints()
            )),
        };
        Err(match diag.explain(failure).await {
            Failure::Access { endpoint, cause, detail } => {
                access_error(&diag, endpoint, cause, detail)
            }
            Failure::Invalid(m) => StoreError::InvalidRequest(m),
            other => {
                StoreError::Unavailable(format!("connecting to etcd: {}", failure_text(other)))
            }
        })
    }

    /// Runs one request under the request timeout, mapping a timeout to `Unavailable` (or, before
    /// etcd ever answered, to the refusal the endpoints' probe finds).
    ///
    /// `send` makes the request afresh each time it is called: a request that never left this
    /// client, because the connection to the member the channel chose could not be made, is sent
    /// again at once (see [`never_sent`]), up to [`UNSENT_RESENDS`] times within the same timeout.
    /// Why here and not in the caller's back-off: tonic's balanced channel keeps a dead member in
    /// its set, and that member looks ready (its failed reconnect is handed to the next request as
    /// an instant error) and idle, so the power-of-two-choices balancer prefers it. Four back-off
    /// attempts could all land on it while two members were healthy (the chaos run saw a
    /// `release` fail with "tcp connect error" while only a follower was down). Re-sending is safe
    /// for every request, txns included, because nothing reached etcd.
    async fn bounded<T, F>(&self, what: &str, mut send: impl FnMut() -> F) -> Result<T, Failure>
    where
        F: Future<Output = Result<T, etcd_client::Error>>,
    {
        let attempts = async {
            let mut resends = 0;
            loop {
                match send().await {
                    Err(e) if resends < UNSENT_RESENDS && never_sent(&e) => {
                        resends += 1;
                        tracing::debug!(what, resends, error = %e, "etcd member unreachable; re-sending");
                        // A breath, so that a cluster with every member down is not spun on.
                        tokio::time::sleep(Duration::from_millis(u64::from(resends))).await;
                    }
                    r => return r,
                }
            }
        };
        let failure = match tokio::time::timeout(self.request_timeout, attempts).await {
            Ok(Ok(v)) => {
                self.diag.answered.store(true, Ordering::Relaxed);
                return Ok(v);
            }
            Ok(Err(e)) => classify(e),
            Err(_) => Failure::Unavailable(format!(
                "etcd {what} did not answer within {:?}",
                self.request_timeout
            )),
        };
        Err(self.diag.explain(failure).await)
    }

    /// Turns a classified failure into the trait's error, looking up the revision numbers that
    /// etcd's error messages leave out (only on these rare error paths).
    async fn resolve(&self, failure: Failure, ctx: ErrCtx) -> StoreError {
        match failure {
            Failure::Compacted => StoreError::Compacted {
                requested: ctx.revision,
                compact_revision: self.compact_revision_hint(ctx.revision, &ctx.key).await,
            },
            Failure::Future => StoreError::FutureRevision {
                requested: ctx.revision,
                current: self.current_revision(&ctx.key).await,
            },
            Failure::LeaseNotFound => StoreError::LeaseNotFound(ctx.lease),
            Failure::Invalid(m) => StoreError::InvalidRequest(m),
            Failure::Unavailable(m) => StoreError::Unavailable(m),
            Failure::TooLarge(m) => StoreError::ResponseTooLarge(m),
            Failure::Access { endpoint, cause, detail } => {
                access_error(&self.diag, endpoint, cause, detail)
            }
        }
    }

    /// The current revision, or 0 if it cannot be read (used only to enrich an error).
    async fn current_revision(&self, key: &[u8]) -> Revision {
        let send = || {
            let mut kv = self.client.kv_client();
            let key = probe_key(key);
            async move { kv.get(key, Some(GetOptions::new().with_count_only())).await }
        };
        match self.bounded("get", send).await {
            Ok(resp) => resp.header().map_or(0, |h| h.revision()),
            Err(_) => 0,
        }
    }

    /// The oldest revision still available, found by asking for a watch at `requested` (etcd's
    /// watch reports the compaction point; reads do not). 0 if it cannot be found out.
    async fn compact_revision_hint(&self, requested: Revision, key: &[u8]) -> Revision {
        let lookup = || async move {
            let mut watch = self.client.watch_client();
            let opts = WatchOptions::new().with_start_revision(requested);
            let mut stream = watch.watch(probe_key(key), Some(opts)).await?;
            while let Some(resp) = stream.message().await? {
                if resp.compact_revision() > 0 {
                    return Ok(resp.compact_revision());
                }
                if !resp.events().is_empty() || resp.canceled() {
                    break;
                }
            }
            Ok(0)
        };
        self.bounded("watch", lookup).await.unwrap_or(0)
    }
}

/// What went wrong, before the context (which revision, which lease) is known.
#[derive(Debug)]
enum Failure {
    Unavailable(String),
    Invalid(String),
    TooLarge(String),
    Compacted,
    Future,
    LeaseNotFound,
    /// A refusal; `endpoint` when a probe knows which member refused.
    Access {
        endpoint: Option<String>,
        cause: AccessCause,
        detail: String,
    },
}

fn failure_text(f: Failure) -> String {
    match f {
        Failure::Unavailable(m) | Failure::Invalid(m) => m,
        Failure::Access { cause, detail, .. } => format!("{cause}: {detail}"),
        other => format!("{other:?}"),
    }
}

/// Builds [`StoreError::Access`], naming the user (never the password) and how to fix it.
fn access_error(
    diag: &Diagnosis,
    endpoint: Option<String>,
    cause: AccessCause,
    detail: String,
) -> StoreError {
    let endpoint = endpoint.unwrap_or_else(|| diag.endpoints());
    let detail = match (cause, &diag.user) {
        (AccessCause::Permission, Some(user)) => format!(
            "user {user:?} lacks a role for this request ({detail}); idalloc needs readwrite on \
             its prefix, see docs/guide/security.md"
        ),
        (AccessCause::Permission, None) => format!("{detail} (no user given: --user)"),
        (AccessCause::Authentication, Some(user)) => format!("user {user:?}: {detail}"),
        _ => detail,
    };
    StoreError::Access { endpoint, cause, detail }
}

/// The request's revision and lease, to name them in errors.
#[derive(Default, Clone)]
struct ErrCtx {
    revision: Revision,
    lease: LeaseId,
    /// A key the request touched: the look-ups that enrich an error read that key, so that a
    /// user whose role covers only idalloc's prefix is not refused (nothing outside the prefix
    /// is ever read).
    key: Vec<u8>,
}

/// Sorts an etcd-client error into the trait's error kinds. etcd reports its own errors as gRPC
/// statuses whose message is the `etcdserver: ...` / `mvcc: ...` text, which is stable across
/// etcd 3.x; the transport reports the rest.
fn classify(e: etcd_client::Error) -> Failure {
    use tonic::Code;
    match e {
        etcd_client::Error::GRpcStatus(status) => {
            let msg = status.message();
            if let Some(access) = access_failure(status.code(), msg) {
                access
            } else if msg.contains("required revision has been compacted") {
                Failure::Compacted
            } else if msg.contains("required revision is a future revision") {
                Failure::Future
            } else if msg.contains("requested lease not found") {
                Failure::LeaseNotFound
            } else if msg.contains("message length too large") {
                // tonic's own limit on a response it receives (4 MiB by default): the read asked
                // for too much at once, which is neither a bad request nor an outage.
                Failure::TooLarge(format!("etcd's answer: {msg}"))
            } else if msg.contains("too many operations in txn")
                || msg.contains("duplicate key given in txn request")
                || msg.contains("request is too large")
                || msg.contains("larger than max")
            {
                Failure::Invalid(format!("etcd rejected the request: {msg}"))
            } else {
                match status.code() {
                    Code::InvalidArgument
                    | Code::OutOfRange
                    | Code::FailedPrecondition
                    | Code::ResourceExhausted => {
                        Failure::Invalid(format!("etcd rejected the request: {msg}"))
                    }
                    code => Failure::Unavailable(format!("etcd error ({code:?}): {msg}")),
                }
            }
        }
        etcd_client::Error::InvalidArgs(m) => Failure::Invalid(m),
        etcd_client::Error::InvalidUri(u) => Failure::Invalid(format!("invalid etcd URI: {u}")),
        other => Failure::Unavailable(format!("etcd: {other}")),
    }
}

/// How many times [`EtcdStore::bounded`] re-sends a request that never left this client. With one
/// member of three down and the balancer preferring it (it looks idle), all of 16 tries land on it
/// with probability (2/3)^16 ≈ 0.15%, and the caller's back-off multiplies that again; with every
/// member down the request fails after these tries (milliseconds), as before.
const UNSENT_RESENDS: u32 = 16;

/// True if `e` says the request was never sent: the channel could not connect to the member it
/// chose (tonic marks such failures with [`tonic::ConnectError`] in the status's source chain).
/// A timeout, a reset connection or any answer from etcd is not this: the request may have been
/// applied.
fn never_sent(e: &etcd_client::Error) -> bool {
    let etcd_client::Error::GRpcStatus(status) = e else { return false };
    if status.code() != tonic::Code::Unavailable {
        return false;
    }
    let mut source: Option<&(dyn std::error::Error + 'static)> = std::error::Error::source(status);
    while let Some(err) = source {
        if err.is::<tonic::ConnectError>() {
            return true;
        }
        source = err.source();
    }
    false
}

/// The key an error look-up reads: the request's own key, or (for requests without one, such as
/// a compaction, which needs root anyway) the lowest key.
fn probe_key(key: &[u8]) -> Vec<u8> {
    if key.is_empty() {
        vec![0u8]
    } else {
        key.to_vec()
    }
}

/// etcd's refusals: wrong credentials, no credentials, no permission. Matched on etcd's stable
/// `etcdserver: ...` texts (api/v3rpc/rpctypes) as well as the code, because etcd answers several
/// of them with `InvalidArgument` or `FailedPrecondition`.
fn access_failure(code: tonic::Code, msg: &str) -> Option<Failure> {
    let auth = |detail: String| {
        Some(Failure::Access { endpoint: None, cause: AccessCause::Authentication, detail })
    };
    if code == tonic::Code::PermissionDenied || msg.contains("permission denied") {
        return Some(Failure::Access {
            endpoint: None,
            cause: AccessCause::Permission,
            detail: msg.to_string(),
        });
    }
    if msg.contains("user name is empty") {
        return auth(format!("etcd requires a user and none was given: --user NAME ({msg})"));
    }
    if msg.contains("authentication is not enabled") {
        return auth(format!("a user was given but etcd has authentication disabled ({msg})"));
    }
    if msg.contains("invalid user ID or password")
        || msg.contains("authentication failed")
        || msg.contains("user name not found")
    {
        return auth(format!("wrong user name or password ({msg})"));
    }
    if code == tonic::Code::Unauthenticated || msg.contains("invalid auth token") {
        return auth(format!(
            "etcd refused the authentication token even after \
                             re-authenticating ({msg})"
        ));
    }
    None
}

fn etcd_op(op: CompareOp) -> EtcdCompareOp {
    match op {
        CompareOp::Equal => EtcdCompareOp::Equal,
        CompareOp::NotEqual => EtcdCompareOp::NotEqual,
        CompareOp::Less => EtcdCompareOp::Less,
        CompareOp::Greater => EtcdCompareOp::Greater,
    }
}

fn etcd_compare(c: &Compare) -> EtcdCompare {
    let key = c.range.key.clone();
    let op = etcd_op(c.op);
    let cmp = match &c.target {
        CompareTarget::Value(v) => EtcdCompare::value(key, op, v.clone()),
        CompareTarget::CreateRevision(r) => EtcdCompare::create_revision(key, op, *r),
        CompareTarget::ModRevision(r) => EtcdCompare::mod_revision(key, op, *r),
        CompareTarget::Version(v) => EtcdCompare::version(key, op, *v),
        CompareTarget::Lease(l) => EtcdCompare::lease(key, op, *l),
    };
    if c.range.range_end.is_empty() {
        cmp
    } else {
        cmp.with_range(c.range.range_end.clone())
    }
}

fn get_options(req: &GetRequest) -> GetOptions {
    let mut opts = GetOptions::new().with_limit(req.limit).with_revision(req.revision);
    if !req.range.range_end.is_empty() {
        opts = opts.with_range(req.range.range_end.clone());
    }
    if req.keys_only {
        opts = opts.with_keys_only();
    }
    if req.count_only {
        opts = opts.with_count_only();
    }
    if req.newest_first {
        opts = opts.with_sort(SortTarget::Mod, SortOrder::Descend);
    }
    opts
}

fn delete_options(range: &KeyRange) -> DeleteOptions {
    if range.range_end.is_empty() {
        DeleteOptions::new()
    } else {
        DeleteOptions::new().with_range(range.range_end.clone())
    }
}

fn etcd_txn(req: &TxnRequest) -> Txn {
    let ops = |ops: &[TxnOp]| -> Vec<EtcdTxnOp> {
        ops.iter()
            .map(|op| match op {
                TxnOp::Get(g) => EtcdTxnOp::get(g.range.key.clone(), Some(get_options(g))),
                TxnOp::Put(p) => EtcdTxnOp::put(
                    p.key.clone(),
                    p.value.clone(),
                    Some(PutOptions::new().with_lease(p.lease)),
                ),
                TxnOp::Delete(r) => EtcdTxnOp::delete(r.key.clone(), Some(delete_options(r))),
                TxnOp::Txn(t) => EtcdTxnOp::txn(etcd_txn(t)),
            })
            .collect()
    };
    Txn::new()
        .when(req.compare.iter().map(etcd_compare).collect::<Vec<_>>())
        .and_then(ops(&req.success))
        .or_else(ops(&req.failure))
}

/// The first lease named by a put anywhere in the txn tree, and the first non-zero read
/// revision: what the errors `LeaseNotFound` and `Compacted`/`FutureRevision` refer to.
fn txn_ctx(req: &TxnRequest) -> ErrCtx {
    fn walk(req: &TxnRequest, ctx: &mut ErrCtx) {
        for op in req.success.iter().chain(&req.failure) {
            match op {
                TxnOp::Put(p) if ctx.lease == 0 => ctx.lease = p.lease,
                TxnOp::Get(g) if ctx.revision == 0 => {
                    ctx.revision = g.revision;
                    ctx.key = g.range.key.clone();
                }
                TxnOp::Txn(t) => walk(t, ctx),
                _ => {}
            }
        }
    }
    let mut ctx = ErrCtx::default();
    walk(req, &mut ctx);
    ctx
}

fn key_value(kv: &etcd_client::KeyValue) -> KeyValue {
    KeyValue {
        key: kv.key().to_vec(),
        value: kv.value().to_vec(),
        create_revision: kv.create_revision(),
        mod_revision: kv.mod_revision(),
        version: kv.version(),
        lease: kv.lease(),
    }
}

fn get_response(resp: &etcd_client::GetResponse) -> GetResponse {
    GetResponse {
        kvs: resp.kvs().iter().map(key_value).collect(),
        count: resp.count(),
        more: resp.more(),
        revision: resp.header().map_or(0, |h| h.revision()),
    }
}

/// Maps a txn response. `revision` is the outer txn's header revision, used for nested txns too:
/// the trait promises "the revision after the txn" there, and the outer header is the one etcd
/// documents as authoritative for the whole txn.
fn txn_response(resp: &etcd_client::TxnResponse, revision: Revision) -> TxnResponse {
    let responses = resp
        .op_responses()
        .iter()
        .map(|r| match r {
            TxnOpResponse::Get(g) => OpResponse::Get(get_response(g)),
            TxnOpResponse::Put(_) => OpResponse::Put,
            TxnOpResponse::Delete(d) => OpResponse::Delete { deleted: d.deleted() },
            TxnOpResponse::Txn(t) => OpResponse::Txn(txn_response(t, revision)),
        })
        .collect();
    TxnResponse { succeeded: resp.succeeded(), responses, revision }
}

/// One watch response as zero or one message: `None` for responses that carry nothing for the
/// caller (the "created" confirmation, progress notifications).
fn watch_message(resp: &etcd_client::WatchResponse) -> Option<Result<WatchMessage, StoreError>> {
    if resp.compact_revision() > 0 {
        return Some(Ok(WatchMessage::Compacted { compact_revision: resp.compact_revision() }));
    }
    if resp.canceled() {
        return Some(Err(StoreError::Unavailable(format!(
            "etcd canceled the watch: {}",
            if resp.cancel_reason().is_empty() { "no reason given" } else { resp.cancel_reason() }
        ))));
    }
    if resp.events().is_empty() {
        return None;
    }
    let events = resp
        .events()
        .iter()
        .filter_map(|ev| {
            let kv = key_value(ev.kv()?);
            // `event_type` only panics on a type etcd 3.x never sends (0 and 1 are all it has).
            Some(match ev.event_type() {
                EventType::Put => WatchEvent::Put(kv),
                EventType::Delete => WatchEvent::Delete(kv),
            })
        })
        .collect();
    Some(Ok(WatchMessage::Events(events)))
}

impl EtcdStore {
    /// Opens an etcd watch and reads its first answer (the creation confirmation, or a refusal).
    async fn open_watch(
        &self,
        range: &KeyRange,
        start_revision: Revision,
    ) -> StoreResult<(etcd_client::WatchStream, Option<etcd_client::WatchResponse>)> {
        let mut opts = WatchOptions::new().with_start_revision(start_revision);
        if !range.range_end.is_empty() {
            opts = opts.with_range(range.range_end.clone());
        }
        let open = || async {
            let mut client = self.client.watch_client();
            let (key, opts) = (range.key.clone(), opts.clone());
            let mut stream = client.watch(key, Some(opts)).await?;
            let first = stream.message().await?;
            Ok((stream, first))
        };
        match self.bounded("watch", open).await {
            Ok(v) => Ok(v),
            Err(f) => Err(self
                .resolve(f, ErrCtx { revision: start_revision, lease: 0, key: range.key.clone() })
                .await),
        }
    }
}

/// State of a watch stream: the etcd stream (its request half keeps the watch open; dropping the
/// whole state resets the HTTP/2 stream, which makes etcd drop the watcher), a response read
/// while waiting for the creation confirmation, and whether the stream has ended.
struct WatchState {
    stream: etcd_client::WatchStream,
    pending: Option<etcd_client::WatchResponse>,
    done: bool,
}

#[async_trait::async_trait]
impl Store for EtcdStore {
    /// etcd's `Status` of the member that answers: "etcd VERSION".
    async fn server_version(&self) -> StoreResult<Option<String>> {
        let send = || {
            let mut m = self.client.maintenance_client();
            async move { m.status().await }
        };
        match self.bounded("status", send).await {
            Ok(resp) => Ok(Some(format!("etcd {}", resp.version()))),
            Err(f) => Err(self.resolve(f, ErrCtx { revision: 0, lease: 0, key: Vec::new() }).await),
        }
    }

    async fn txn(&self, req: TxnRequest) -> StoreResult<TxnResponse> {
        let send = || {
            let mut kv = self.client.kv_client();
            let txn = etcd_txn(&req);
            async move { kv.txn(txn).await }
        };
        match self.bounded("txn", send).await {
            Ok(resp) => {
                let revision = resp.header().map_or(0, |h| h.revision());
                Ok(txn_response(&resp, revision))
            }
            Err(f) => Err(self.resolve(f, txn_ctx(&req)).await),
        }
    }

    async fn get(&self, req: GetRequest) -> StoreResult<GetResponse> {
        let send = || {
            let mut kv = self.client.kv_client();
            let (key, options) = (req.range.key.clone(), get_options(&req));
            async move { kv.get(key, Some(options)).await }
        };
        match self.bounded("get", send).await {
            Ok(resp) => Ok(get_response(&resp)),
            Err(f) => Err(self
                .resolve(f, ErrCtx { revision: req.revision, lease: 0, key: req.range.key.clone() })
                .await),
        }
    }

    async fn lease_grant(&self, ttl: i64) -> StoreResult<Lease> {
        let send = || {
            let mut lease = self.client.lease_client();
            async move { lease.grant(ttl, None).await }
        };
        match self.bounded("lease grant", send).await {
            Ok(resp) if resp.error().is_empty() => Ok(Lease { id: resp.id(), ttl: resp.ttl() }),
            Ok(resp) => Err(StoreError::InvalidRequest(format!(
                "etcd refused a lease of {ttl} s: {}",
                resp.error()
            ))),
            Err(f) => Err(self.resolve(f, ErrCtx::default()).await),
        }
    }

    /// etcd-client's `keep_alive` opens the keep-alive stream and already does one round (sends
    /// a renewal, reads the answer) but does not hand out the TTL of that answer; so a second
    /// renewal on the same stream reads it. Both renewals are idempotent (each resets the TTL).
    async fn lease_keep_alive(&self, id: LeaseId) -> StoreResult<Option<i64>> {
        let send = || async move {
            let mut lease = self.client.lease_client();
            let (mut keeper, mut stream) = match lease.keep_alive(id).await {
                Ok(pair) => pair,
                // etcd answers TTL <= 0 for an unknown lease; etcd-client turns that into this.
                Err(etcd_client::Error::LeaseKeepAliveError(m)) if m.contains("not found") => {
                    return Ok(None)
                }
                Err(e) => return Err(e),
            };
            keeper.keep_alive().await?;
            match stream.message().await? {
                Some(resp) if resp.ttl() > 0 => Ok(Some(resp.ttl())),
                Some(_) => Ok(None),
                None => Err(etcd_client::Error::LeaseKeepAliveError(
                    "keep-alive stream closed without an answer".into(),
                )),
            }
        };
        match self.bounded("lease keep-alive", send).await {
            Ok(ttl) => Ok(ttl),
            Err(Failure::LeaseNotFound) => Ok(None),
            Err(f) => {
                Err(self.resolve(f, ErrCtx { revision: 0, lease: id, key: Vec::new() }).await)
            }
        }
    }

    async fn lease_revoke(&self, id: LeaseId) -> StoreResult<bool> {
        let send = || {
            let mut lease = self.client.lease_client();
            async move { lease.revoke(id).await }
        };
        match self.bounded("lease revoke", send).await {
            Ok(_) => Ok(true),
            Err(Failure::LeaseNotFound) => Ok(false),
            Err(f) => {
                Err(self.resolve(f, ErrCtx { revision: 0, lease: id, key: Vec::new() }).await)
            }
        }
    }

    /// Opens the watch and waits for etcd's "created" confirmation before returning, so that a
    /// watch from revision 0 ("from now on") sees every write made after this call returned.
    async fn watch(&self, range: KeyRange, start_revision: Revision) -> StoreResult<WatchStream> {
        let (mut stream, mut first) = self.open_watch(&range, start_revision).await?;
        // etcd checks a watch's token only when the watch is created, and answers a stale one
        // with a cancelled watch (reason "invalid auth token", or "permission denied" on some
        // 3.x versions), not with an error status, so etcd-client does not renew it.
        let refusal = |first: &Option<etcd_client::WatchResponse>| {
            first.as_ref().filter(|r| r.canceled()).and_then(|r| {
                let reason = r.cancel_reason();
                if reason.contains("invalid auth token") {
                    Some((AccessCause::Authentication, reason.to_string()))
                } else if reason.contains("permission denied") {
                    Some((AccessCause::Permission, reason.to_string()))
                } else {
                    None
                }
            })
        };
        if refusal(&first).is_some() && self.diag.user.is_some() {
            // Renew once and retry: a real lack of permission is refused again.
            drop(stream);
            if let Err(f) = self.bounded("authenticate", || self.client.refresh_token()).await {
                return Err(self.resolve(f, ErrCtx::default()).await);
            }
            (stream, first) = self.open_watch(&range, start_revision).await?;
        }
        if let Some((cause, reason)) = refusal(&first) {
            return Err(access_error(&self.diag, None, cause, format!("watch: {reason}")));
        }
        // A bare creation confirmation carries nothing; anything else is kept for the stream.
        let pending = first.filter(|r| {
            !(r.created() && r.events().is_empty() && r.compact_revision() == 0 && !r.canceled())
        });
        let state = WatchState { stream, pending, done: false };
        let stream = futures::stream::unfold(state, |mut st| async move {
            if st.done {
                return None;
            }
            loop {
                let resp = match st.pending.take() {
                    Some(r) => r,
                    None => match st.stream.message().await {
                        Ok(Some(r)) => r,
                        Ok(None) => {
                            st.done = true;
                            return Some((
                                Err(StoreError::Unavailable("etcd closed the watch stream".into())),
                                st,
                            ));
                        }
                        Err(e) => {
                            st.done = true;
                            let msg = match classify(e) {
                                Failure::Unavailable(m) | Failure::Invalid(m) => m,
                                other => format!("watch failed: {other:?}"),
                            };
                            return Some((Err(StoreError::Unavailable(msg)), st));
                        }
                    },
                };
                match watch_message(&resp) {
                    None => continue,
                    Some(item) => {
                        // A compaction notice or a cancellation ends the watch.
                        st.done = !matches!(item, Ok(WatchMessage::Events(_)));
                        return Some((item, st));
                    }
                }
            }
        });
        Ok(stream.boxed())
    }

    async fn compact(&self, revision: Revision) -> StoreResult<()> {
        let send = || {
            let mut kv = self.client.kv_client();
            async move { kv.compact(revision, None).await }
        };
        match self.bounded("compact", send).await {
            Ok(_) => Ok(()),
            Err(f) => Err(self.resolve(f, ErrCtx { revision, lease: 0, key: Vec::new() }).await),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A too-large answer was labelled "invalid store request" (a bug in the
    /// caller). It is its own failure, which `list_all` answers with smaller pages.
    #[test]
    fn a_too_large_answer_is_not_an_invalid_request() {
        let status = tonic::Status::out_of_range(
            "Error, decoded message length too large: found 11489866 bytes, the limit is: 4194304 bytes",
        );
        match classify(etcd_client::Error::GRpcStatus(status)) {
            Failure::TooLarge(m) => assert!(m.contains("found 11489866 bytes"), "{m}"),
            _ => panic!("expected TooLarge"),
        }
        let status =
            tonic::Status::invalid_argument("etcdserver: too many operations in txn request");
        assert!(matches!(classify(etcd_client::Error::GRpcStatus(status)), Failure::Invalid(_)));
    }

    #[tokio::test]
    async fn bad_options_are_rejected_with_the_offending_value() {
        let err = EtcdStore::connect(EtcdOptions::new(Vec::<String>::new())).await.unwrap_err();
        assert!(
            matches!(err, StoreError::InvalidRequest(ref m) if m.contains("no etcd endpoints"))
        );
        let mut opts = EtcdOptions::new(["http://127.0.0.1:1"]);
        opts.request_timeout = Duration::ZERO;
        let err = EtcdStore::connect(opts).await.unwrap_err();
        assert!(matches!(err, StoreError::InvalidRequest(ref m) if m.contains("request_timeout")));
    }

    /// Nothing listens on the port: the store must not hang, and must say Unavailable.
    #[tokio::test]
    async fn unreachable_endpoint_is_unavailable_not_a_hang() {
        // A port nobody listens on, held by a socket bound to it but not listening (connections
        // are refused), so that no other process can take it and listen there during the test.
        let held = tokio::net::TcpSocket::new_v4()
            .and_then(|s| s.bind(([127, 0, 0, 1], 0).into()).map(|()| s))
            .unwrap();
        let port = held.local_addr().unwrap().port();
        let mut opts = EtcdOptions::new([format!("http://127.0.0.1:{port}")]);
        opts.connect_timeout = Duration::from_millis(200);
        opts.request_timeout = Duration::from_millis(500);
        let store = EtcdStore::connect(opts).await.unwrap();
        let outer = Duration::from_secs(30);
        let res = tokio::time::timeout(outer, store.get(GetRequest::key("k"))).await;
        assert!(matches!(res, Ok(Err(StoreError::Unavailable(_)))), "got {res:?}");
        let res = tokio::time::timeout(outer, store.watch(KeyRange::key("k"), 0)).await;
        assert!(
            matches!(res, Ok(Err(StoreError::Unavailable(_)))),
            "watch: got {:?}",
            res.map(|r| r.is_ok())
        );
        let res = tokio::time::timeout(outer, store.lease_keep_alive(1)).await;
        assert!(matches!(res, Ok(Err(StoreError::Unavailable(_)))), "got {res:?}");
    }

    #[test]
    fn etcd_error_messages_map_to_store_errors() {
        let status =
            |code, msg: &str| etcd_client::Error::GRpcStatus(tonic::Status::new(code, msg));
        use tonic::Code;
        assert!(matches!(
            classify(status(
                Code::InvalidArgument,
                "etcdserver: too many operations in txn request"
            )),
            Failure::Invalid(_)
        ));
        assert!(matches!(
            classify(status(
                Code::InvalidArgument,
                "etcdserver: duplicate key given in txn request"
            )),
            Failure::Invalid(_)
        ));
        assert!(matches!(
            classify(status(Code::InvalidArgument, "etcdserver: request is too large")),
            Failure::Invalid(_)
        ));
        assert!(matches!(
            classify(status(
                Code::OutOfRange,
                "etcdserver: mvcc: required revision has been compacted"
            )),
            Failure::Compacted
        ));
        assert!(matches!(
            classify(status(
                Code::OutOfRange,
                "etcdserver: mvcc: required revision is a future revision"
            )),
            Failure::Future
        ));
        assert!(matches!(
            classify(status(Code::NotFound, "etcdserver: requested lease not found")),
            Failure::LeaseNotFound
        ));
        assert!(matches!(
            classify(status(Code::Unavailable, "etcdserver: leader changed")),
            Failure::Unavailable(_)
        ));
        assert!(matches!(
            classify(status(Code::DeadlineExceeded, "context deadline exceeded")),
            Failure::Unavailable(_)
        ));
    }
}
