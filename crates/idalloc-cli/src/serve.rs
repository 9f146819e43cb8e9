//! `serve`: runs the HTTP service of `idalloc-server` on the store the global flags name.

use std::time::Duration;

use idalloc::{Allocator, AllocatorOptions};
use idalloc_server::auth::Tokens;
use idalloc_server::tls::{TlsFiles, TlsReloader};
use idalloc_server::{AppState, Config};

use crate::cli::ServeArgs;
use crate::fail::Failure;
use crate::open::{self, Settings};

/// Attempts per store request: `--timeout` is split over them, as for every other command.
const ATTEMPTS: u32 = 3;

/// Whether the service may listen on `addr` with this protection. Loopback: always. Elsewhere:
/// TLS (else tokens travel in clear) and client authentication (tokens or client certificates,
/// else anyone who reaches the port can delete pools), unless `insecure` says the operator knows.
fn check_listen(
    addr: std::net::SocketAddr,
    tls: bool,
    client_auth: bool,
    insecure: bool,
) -> Result<(), String> {
    if addr.ip().is_loopback() || insecure || (tls && client_auth) {
        return Ok(());
    }
    let missing = match (tls, client_auth) {
        (false, false) => {
            "without TLS (--tls-cert/--tls-key) and without client authentication \
             (--auth-tokens or --client-ca)"
        }
        (false, true) => {
            "without TLS (--tls-cert/--tls-key): tokens would cross the network in \
             clear"
        }
        _ => {
            "without client authentication (--auth-tokens or --client-ca): anyone who reaches \
             it could allocate, release and delete pools"
        }
    };
    Err(format!(
        "--listen {addr} is not a loopback address: refusing to serve on it {missing}; add them, \
         or pass --insecure-listen if this network is trusted"
    ))
}

/// The connection and request limits of the flags; a zero timeout is refused.
fn limits(a: &ServeArgs) -> Result<idalloc_server::limits::Limits, Failure> {
    for (flag, d) in [
        ("--header-timeout", a.header_timeout),
        ("--idle-timeout", a.idle_timeout),
        ("--body-timeout", a.body_timeout),
    ] {
        if d.is_zero() {
            return Err(Failure::usage(format!("{flag} 0: a timeout above zero, such as 10s")));
        }
    }
    let mut l = idalloc_server::limits::Limits::default();
    if let Some(n) = a.max_connections {
        l.max_connections = n as usize;
    }
    l.header_timeout = a.header_timeout;
    l.idle_timeout = a.idle_timeout;
    l.body_timeout = a.body_timeout;
    l.max_requests = a.max_requests as usize;
    l.max_requests_per_client = a.max_requests_per_client as usize;
    l.max_connections_per_client = a.max_connections_per_client.map(|n| n as usize);
    l.max_watches_per_client = a.max_watches_per_client as usize;
    l.keepalive = (!a.keepalive.is_zero()).then_some(a.keepalive);
    Ok(l)
}

/// The listening line as a JSON log line on stdout, in the shape of the JSON logs on stderr
/// (`timestamp`, `level`, `fields.message`, `fields.addr`, `target`).
fn listening_json(addr: std::net::SocketAddr) {
    let stdout = tracing_subscriber::fmt().json().with_writer(std::io::stdout).finish();
    tracing::subscriber::with_default(stdout, || {
        tracing::info!(target: "idalloc::serve", %addr, "listening on {addr}");
    });
}

/// Runs the service; `json_logs`: `--log-format json`.
pub async fn run(settings: &Settings, a: &ServeArgs, json_logs: bool) -> Result<u8, Failure> {
    // Configuration errors first, before anything connects: each names its file.
    let tokens = a.auth_tokens.as_deref().map(Tokens::load).transpose().map_err(Failure::usage)?;
    let tls = match (&a.tls_cert, &a.tls_key) {
        (Some(cert), Some(key)) => Some(
            TlsReloader::new(TlsFiles {
                cert: cert.clone(),
                key: key.clone(),
                client_ca: a.client_ca.clone(),
            })
            .map_err(Failure::usage)?,
        ),
        _ => None,
    };
    check_listen(
        a.listen,
        tls.is_some(),
        tokens.is_some() || a.client_ca.is_some(),
        a.insecure_listen,
    )
    .map_err(Failure::usage)?;
    if a.insecure_listen
        && !a.listen.ip().is_loopback()
        && !(tls.is_some() && (tokens.is_some() || a.client_ca.is_some()))
    {
        crate::fail::say(&format!(
            "warning: --insecure-listen: serving {} without TLS and client authentication",
            a.listen
        ));
    }
    // The recorder first, so the library registers its metric descriptions with it.
    let metrics = idalloc_server::install_prometheus().map_err(Failure::runtime)?;
    let opened = open::open_store(settings, true).await?;
    let store = opened.store;
    let opts = {
        let mut o = AllocatorOptions::default();
        o.prefix = settings.prefix.clone();
        o.request_timeout = settings.attempt_timeout();
        o.retry.max_attempts = ATTEMPTS;
        o.retry.initial_backoff = Duration::from_millis(50);
        o.retry.max_backoff = Duration::from_millis(500);
        o.sweep_interval = Some(a.sweep_interval);
        o.bulk_in_flight = a.bulk_in_flight as usize;
        // Client sessions are named in the namespace durable holders may not use.
        o.holder = Some(idalloc_server::sessions::service_holder());
        o
    };
    let alloc = Allocator::from_arc(store.clone(), opts)
        .map_err(|e| Failure::usage(format!("--prefix: {e}")))?;
    let config = Config {
        max_body_bytes: a.max_body,
        probe_timeout: settings.timeout,
        maintenance_interval: a.sweep_interval,
        drain_timeout: a.drain_timeout,
        shutdown_delay: a.shutdown_delay,
        tokens,
        limits: limits(a)?,
        watch_history: a.watch_history as usize,
        watch_wake_budget: a.watch_wake_budget,
        ..Config::default()
    };
    let state = AppState::new(alloc.clone(), store, &settings.prefix, config, Some(metrics))
        .map_err(|e| Failure::usage(format!("--prefix: {e}")))?;
    let listener = tokio::net::TcpListener::bind(a.listen)
        .await
        .map_err(|e| Failure::runtime(format!("cannot listen on {}: {e}", a.listen)))?;
    let addr = listener
        .local_addr()
        .map_err(|e| Failure::runtime(format!("cannot read the listening address: {e}")))?;
    // One line on stdout that scripts (and the tests) can wait for: the real address, also when
    // --listen asked for port 0. Under --log-format json it is a log line like every other (with
    // an `addr` field), so that a collector reading both streams gets JSON only.
    if json_logs {
        listening_json(addr);
    } else {
        crate::commands::Out::plain().text(&format!("listening on {addr}\n"))?;
    }
    let served = match tls {
        Some(tls) => {
            idalloc_server::serve_tls(state, listener, tls, idalloc_server::shutdown_signal()).await
        }
        None => idalloc_server::serve(state, listener, idalloc_server::shutdown_signal()).await,
    };
    served.map_err(|e| Failure::runtime(format!("serving: {e}")))?;
    // Stops background work. Client sessions' leases are left to their TTL (see `serve --help`).
    let _ = alloc.close().await;
    Ok(0)
}

#[cfg(test)]
mod tests {
    use super::check_listen;

    #[test]
    fn non_loopback_needs_tls_and_client_auth_or_the_explicit_flag() {
        let lo: std::net::SocketAddr = "127.0.0.1:7379".parse().expect("addr");
        let lo6: std::net::SocketAddr = "[::1]:7379".parse().expect("addr");
        let any: std::net::SocketAddr = "0.0.0.0:7379".parse().expect("addr");
        let ten: std::net::SocketAddr = "10.1.2.3:7379".parse().expect("addr");
        for addr in [lo, lo6] {
            assert!(check_listen(addr, false, false, false).is_ok());
        }
        for addr in [any, ten] {
            assert!(check_listen(addr, true, true, false).is_ok());
            assert!(check_listen(addr, false, false, true).is_ok());
            let e = check_listen(addr, false, false, false).expect_err("plain");
            assert!(e.contains(&addr.to_string()) && e.contains("--insecure-listen"), "{e}");
            assert!(e.contains("without TLS") && e.contains("client authentication"), "{e}");
            let e = check_listen(addr, false, true, false).expect_err("tokens in clear");
            assert!(e.contains("in clear"), "{e}");
            let e = check_listen(addr, true, false, false).expect_err("TLS, no auth");
            assert!(e.contains("--auth-tokens or --client-ca"), "{e}");
        }
    }
}
