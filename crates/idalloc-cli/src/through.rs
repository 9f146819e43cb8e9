//! Commands through `idalloc serve` (`--server URL[,URL…]`, env `IDALLOC_SERVER`): the same
//! commands, output and exit codes as on a store, asked of the service with `idalloc-client`.
//!
//! Why: a file store belongs to one process, so with `serve` running on it (the systemd unit)
//! every local command would wait for the file lock and fail; and on etcd, agents and operators
//! should not each need etcd credentials. The service decides every write, so a command here
//! opens nothing and holds nothing: `acquire` and `release` are durable references of `--holder`,
//! as on a store.
//!
//! Commands that need the store itself (`check`, `gc`, `serve`) and `--remote` reads refuse with
//! exit 2 naming what to do instead. TLS: `--cacert`, `--cert`, `--key` and
//! `--insecure-skip-tls-verify` (the flags of an etcd store) apply to the service; a bearer token
//! comes from `--token-file` (env `IDALLOC_TOKEN_FILE`).

use std::path::Path;
use std::time::Duration;

use idalloc::PoolSpec;
use idalloc_client::{Client, ClientOptions};

use crate::cli::{Cli, Command, PoolCommand};
use crate::commands::{self, Out, StatusReport};
use crate::fail::Failure;
use crate::print;
use crate::render::Usage;

/// How the CLI reaches the service.
pub struct Server {
    pub client: Client,
    /// The endpoints as given (for `status`).
    pub endpoints: Vec<String>,
    http: reqwest::Client,
    timeout: Duration,
}

/// The bearer token of `--token-file`, read as every client of the service reads it
/// ([`idalloc_client::env::read_token_file`]); the message names the flag.
pub fn read_token(path: &Path) -> Result<String, Failure> {
    idalloc_client::env::read_token_file(path)
        .map_err(|e| Failure::usage(format!("--token-file: {e}")))
}

/// The flag that gave the file an error of [`idalloc_client::env::http_client_builder`] is about.
fn tls_flag(e: &idalloc::Error) -> &'static str {
    match e {
        idalloc::Error::InvalidInput { what, .. } => match what.as_str() {
            "CA file" => "--cacert",
            "client certificate" => "--cert",
            "client key" => "--key",
            _ => "--cacert/--cert/--key",
        },
        _ => "--cacert/--cert/--key",
    }
}

/// The HTTP client with the TLS flags ([`idalloc_client::env::http_client_builder`]): `--cacert`
/// replaces the system's roots (as for etcd), `--cert`/`--key` are the client certificate for a
/// service with `--client-ca`, and `--insecure-skip-tls-verify` turns verification off.
fn http_client(cli: &Cli, timeout: Duration) -> Result<reqwest::Client, Failure> {
    let identity = match (&cli.etcd.cert, &cli.etcd.key) {
        (Some(cert), Some(key)) => Some((cert.as_path(), key.as_path())),
        (None, None) => None,
        _ => return Err(Failure::usage("--cert and --key go together: give both or neither")),
    };
    let mut b =
        idalloc_client::env::http_client_builder(cli.etcd.cacert.as_deref(), identity, timeout)
            .map_err(|e| Failure::usage(format!("{}: {e}", tls_flag(&e))))?;
    if cli.etcd.insecure_skip_tls_verify {
        crate::fail::say(
            "warning: --insecure-skip-tls-verify: the service's certificate is not verified \
             (anyone on the path can impersonate it and read the token)",
        );
        b = b.danger_accept_invalid_certs(true);
    }
    b.build().map_err(|e| Failure::usage(format!("cannot build the HTTP client: {e}")))
}

impl Server {
    /// The client of `endpoints` with the command line's token, TLS and `--timeout`: 3 attempts
    /// of a third of it each, over the endpoints in turn, as the store's requests are bounded.
    pub fn new(cli: &Cli, endpoints: &[String]) -> Result<Server, Failure> {
        let attempt = (cli.timeout / 3).max(Duration::from_millis(50));
        let token = cli.token_file.as_deref().map(read_token).transpose()?;
        let http = http_client(cli, attempt)?;
        let opts = {
            let mut o = ClientOptions::default();
            o.token = token;
            o.request_timeout = attempt;
            o.attempts = 3;
            o.backoff_base = Duration::from_millis(50);
            o.backoff_max = Duration::from_millis(500);
            // One-shot commands: no watch unless the command watches.
            o.lazy_view = true;
            o.http = Some(http.clone());
            o
        };
        let client =
            Client::new(endpoints, opts).map_err(|e| Failure::usage(format!("--server: {e}")))?;
        Ok(Server { client, endpoints: endpoints.to_vec(), http, timeout: cli.timeout })
    }
}

/// Why a command does not run through the service, or `None` if it does.
pub fn refusal(command: &Command) -> Option<&'static str> {
    match command {
        Command::Check(_) => Some(
            "check reads the store's records itself: run it with --store (or the etcd flags) \
             where the store is reachable, not through --server",
        ),
        Command::Gc(a) if a.holder.is_none() => Some(
            "gc is done by idalloc serve itself every --sweep-interval; to sweep now, run gc \
             with --store where the store is reachable, not through --server (gc --holder \
             does run through --server)",
        ),
        Command::Serve(_) => {
            Some("serve opens the store itself: give it --store (or the etcd flags), not --server")
        }
        Command::Upgrade(_) => Some(
            "upgrade reads and writes the store's cluster version itself: run it with --store \
             (or the etcd flags), not through --server",
        ),
        Command::Get(a) if a.remote.any() => Some(REMOTE),
        Command::Lookup(a) if a.remote.any() => Some(REMOTE),
        Command::List(a) if a.remote.any() => Some(REMOTE),
        Command::Watch(a) if a.remote.any() => Some(REMOTE),
        _ => None,
    }
}

const REMOTE: &str =
    "--remote reads other clusters' stores: run it with --store, not through --server";

/// Runs `cli.command` through the service.
pub async fn run(cli: &Cli, endpoints: &[String]) -> Result<u8, Failure> {
    if let Some(why) = refusal(&cli.command) {
        return Err(Failure::usage(why));
    }
    let server = Server::new(cli, endpoints)?;
    let out = Out { format: cli.format()?, no_headers: cli.no_headers };
    let result = dispatch(cli, &server, out).await;
    match result {
        Err(f) if f.code == crate::fail::NOT_FOUND => {
            let names = server
                .client
                .list_pools()
                .await
                .map(|specs| specs.iter().map(|s| s.name().to_string()).collect::<Vec<_>>());
            Err(commands::suggest_pool(&cli.command, f, names.ok()))
        }
        r => r,
    }
}

async fn usage_of(server: &Server, name: &str) -> Result<Usage, Failure> {
    let u = server.client.pool_usage(name).await?;
    Ok(Usage { spec: u.spec, bound: u.bound, quarantined: u.quarantined })
}

async fn dispatch(cli: &Cli, server: &Server, out: Out) -> Result<u8, Failure> {
    let client = &server.client;
    match &cli.command {
        Command::Pool(PoolCommand::Create(a)) => {
            let spec = commands::build_spec(a)?;
            client.init_pool(&spec).await?;
            print::pool_ready(&spec, out)?;
            Ok(0)
        }
        Command::Pool(PoolCommand::List) => {
            let specs = client.list_pools().await?;
            let mut usages = Vec::with_capacity(specs.len());
            for spec in specs {
                usages.push(usage_of(server, spec.name()).await?);
            }
            print::pools(&usages, &[], out)?;
            Ok(0)
        }
        Command::Pool(PoolCommand::Show(p)) => {
            let u = usage_of(server, &p.pool).await?;
            print::pool(&u, out)?;
            Ok(0)
        }
        Command::Pool(PoolCommand::Resize(a)) => {
            let reserved = commands::resize_reserved(a)?;
            let spec =
                client.resize_pool(&a.name, a.range.min, a.range.max, reserved.as_deref()).await?;
            print::pool_resized(&spec, out)?;
            Ok(0)
        }
        Command::Pool(PoolCommand::Delete(a)) => {
            if !client.delete_pool(&a.name, a.force).await? {
                return Err(Failure::not_found(format!("pool {:?} not found", a.name)));
            }
            print::pool_deleted(&a.name, out)?;
            Ok(0)
        }
        Command::Acquire(a) => {
            let holder = commands::holder_of(&a.holder);
            idalloc::pool::validate_durable_holder(&holder)
                .map_err(|e| Failure::usage(format!("--holder: {e}")))?;
            let pool = match a.range {
                Some(r) => client.ensure_pool(&PoolSpec::new(a.pool.clone(), r.min, r.max)).await?,
                None => client.pool(&a.pool).await?,
            };
            if let Some(from) = &a.from {
                let call = |chunk: Vec<String>| {
                    let pool = pool.clone();
                    let holder = holder.clone();
                    async move {
                        match pool.acquire_many_durable(&chunk, &holder).await {
                            Ok(got) => got.into_iter().map(Ok).collect(),
                            // One answer for the whole chunk: every key of it failed with it.
                            Err(e) => chunk.iter().map(|_| Err(e.clone())).collect(),
                        }
                    }
                };
                return crate::batch::acquire_from_with(
                    &a.pool,
                    from,
                    &holder,
                    a.concurrency.into(),
                    out,
                    call,
                )
                .await
                .map(|_| 0);
            }
            let key = a.key.as_deref().unwrap_or_default();
            let got = pool.acquire_durable(key, &holder).await?;
            print::acquired(&a.pool, key, &got, &holder, out)?;
            Ok(0)
        }
        Command::Release(a) => {
            let holder = commands::holder_of(&a.holder);
            idalloc::pool::validate_durable_holder(&holder)
                .map_err(|e| Failure::usage(format!("--holder: {e}")))?;
            // A pool that does not exist holds nothing: a no-op, as on a store.
            let pool = match client.pool(&a.pool).await {
                Ok(p) => Some(p),
                Err(idalloc::Error::PoolNotFound { .. }) => None,
                Err(e) => return Err(e.into()),
            };
            if let Some(from) = &a.from {
                let call = |chunk: Vec<String>| {
                    let pool = pool.clone();
                    let holder = holder.clone();
                    async move {
                        match &pool {
                            // One request for the chunk, as acquire --from sends.
                            Some(p) => match p.release_many_durable(&chunk, &holder).await {
                                Ok(got) => got.into_iter().map(Ok).collect(),
                                // One answer for the whole chunk: every key of it failed with it.
                                Err(e) => chunk.iter().map(|_| Err(e.clone())).collect(),
                            },
                            None => chunk
                                .iter()
                                .map(|_| Ok(idalloc::Released { held: false, reclaimed: false }))
                                .collect(),
                        }
                    }
                };
                return crate::batch::release_from_with(
                    &a.pool,
                    from,
                    &holder,
                    a.concurrency.into(),
                    out,
                    call,
                )
                .await
                .map(|_| 0);
            }
            let key = a.key.as_deref().unwrap_or_default();
            idalloc::pool::validate_key(key)?;
            let r = match &pool {
                Some(p) => p.release_durable(key, &holder).await?,
                None => idalloc::Released { held: false, reclaimed: false },
            };
            print::released(&a.pool, key, &holder, r, out)?;
            Ok(0)
        }
        Command::Get(a) => {
            idalloc::pool::validate_key(&a.key)?;
            let pool = client.pool(&a.pool).await?;
            print::id_of(&a.pool, &a.key, pool.get_consistent(&a.key).await?, out)
        }
        Command::Lookup(a) => {
            let pool = client.pool(&a.pool).await?;
            print::key_of(&a.pool, a.id, pool.key_of_consistent(a.id).await?, out)
        }
        Command::List(a) => {
            let pool = client.pool(&a.pool).await?;
            let bindings = pool.list().await?;
            crate::list::print_all(&bindings, &a.pool, &crate::list::Filter::of(a), out).await
        }
        Command::Watch(w) => {
            let pool = client.pool(&w.pool).await?;
            crate::watch::follow_client(&pool, w, out).await.map(|_| 0)
        }
        Command::Status => status(cli, server, out).await,
        Command::Complete(_) => {
            let specs = client.list_pools().await?;
            print::completions(specs.iter().map(|s| s.name()))
        }
        Command::Version => {
            let answer = match client.server_version().await {
                Ok(v) => Ok(format!(
                    "idalloc serve {} (git {}, api {}, layout {}){}",
                    v.version,
                    v.git_sha,
                    v.api,
                    v.layout,
                    v.store.map(|s| format!(", store {s}")).unwrap_or_default()
                )),
                Err(e) => Err(e.to_string()),
            };
            crate::version::print(Some(answer), out)
        }
        Command::Gc(a) if a.holder.is_some() => gc_holder(server, a, out).await,
        Command::Check(_)
        | Command::Gc(_)
        | Command::Serve(_)
        | Command::Upgrade(_)
        | Command::Completions(_)
        | Command::Options
        | Command::Man(_) => Err(Failure::usage("this command does not run through --server")),
    }
}

/// `gc --holder` through the service: its pools (or the one named), each read a page at a time.
async fn gc_holder(server: &Server, a: &crate::cli::GcArgs, out: Out) -> Result<u8, Failure> {
    let holder = a.holder.as_deref().unwrap_or_default();
    idalloc::pool::validate_durable_holder(holder)
        .map_err(|e| Failure::usage(format!("--holder: {e}")))?;
    let names = match &a.pool {
        Some(p) => vec![p.clone()],
        None => server.client.list_pools().await?.iter().map(|s| s.name().to_string()).collect(),
    };
    let mut reports = Vec::new();
    for name in names {
        let pool = server.client.pool(&name).await?;
        let dropped = crate::release_holder::through_server(&pool, holder, a.dry_run).await?;
        reports.push(crate::release_holder::PoolReport { pool: name, dropped });
    }
    crate::release_holder::print(holder, a.dry_run, &reports, out)?;
    Ok(0)
}

/// `status` of the service: its `/readyz` (ready, the store's revision) and its pools.
async fn status(cli: &Cli, server: &Server, out: Out) -> Result<u8, Failure> {
    let endpoint = server.endpoints.join(",");
    let first = server.endpoints.first().map(|e| e.trim_end_matches('/')).unwrap_or_default();
    let mut req = server.http.get(format!("{first}/readyz")).timeout(server.timeout);
    if let Some(path) = &cli.token_file {
        req = req.bearer_auth(read_token(path)?);
    }
    let (revision, error, code) = match req.send().await {
        Ok(r) => {
            let status = r.status().as_u16();
            match r.json::<serde_json::Value>().await {
                Ok(v) if status == 200 => (v["revision"].as_i64(), None, crate::fail::OK),
                Ok(v) => (
                    None,
                    Some(format!(
                        "idalloc serve is not ready ({status}): {}",
                        v["message"].as_str().unwrap_or("no reason given")
                    )),
                    crate::fail::UNAVAILABLE,
                ),
                Err(e) => (
                    None,
                    Some(format!("idalloc serve answered {status} without JSON: {e}")),
                    crate::fail::UNAVAILABLE,
                ),
            }
        }
        Err(e) => (
            None,
            Some(format!("no answer from {first}/readyz within {:?}: {e}", server.timeout)),
            crate::fail::UNAVAILABLE,
        ),
    };
    let (pools, list_error) = if error.is_none() {
        match server.client.list_pools().await {
            Ok(specs) => (Some(specs.iter().map(|s| s.name().to_string()).collect()), None),
            Err(e) => (None, Some(Failure::from(e))),
        }
    } else {
        (None, None)
    };
    let code = match &list_error {
        Some(f) if code == crate::fail::OK => f.code,
        _ => code,
    };
    let report = StatusReport {
        kind: "server",
        endpoint,
        prefix: "(the server's)".to_string(),
        reachable: error.is_none(),
        revision,
        pools,
        broken: Vec::new(),
        error: error.or(list_error.map(|f| f.message)),
    };
    report.print(out)?;
    Ok(code)
}
