//! `serve`: runs the HTTP service of `idalloc-server` on the store the global flags name.

use std::time::Duration;

use idalloc::{Allocator, AllocatorOptions, RetryPolicy};
use idalloc_server::{AppState, Config};

use crate::cli::ServeArgs;
use crate::fail::Failure;
use crate::open::{self, Settings};

/// Attempts per store request: `--timeout` is split over them, as for every other command.
const ATTEMPTS: u32 = 3;

pub async fn run(settings: &Settings, a: &ServeArgs) -> Result<u8, Failure> {
    // The recorder first, so the library registers its metric descriptions with it.
    let metrics = idalloc_server::install_prometheus().map_err(Failure::runtime)?;
    let opened = open::open_store(settings, true).await?;
    let store = opened.store;
    let opts = AllocatorOptions {
        prefix: settings.prefix.clone(),
        request_timeout: settings.attempt_timeout(),
        retry: RetryPolicy {
            max_attempts: ATTEMPTS,
            initial_backoff: Duration::from_millis(50),
            max_backoff: Duration::from_millis(500),
        },
        sweep_interval: Some(a.sweep_interval),
        ..AllocatorOptions::default()
    };
    let alloc = Allocator::from_arc(store.clone(), opts)
        .map_err(|e| Failure::usage(format!("--prefix: {e}")))?;
    let config = Config {
        max_body_bytes: a.max_body,
        probe_timeout: settings.timeout,
        maintenance_interval: a.sweep_interval,
        drain_timeout: a.drain_timeout,
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
    // --listen asked for port 0.
    crate::commands::Out { json: false }.text(&format!("listening on {addr}\n"))?;
    idalloc_server::serve(state, listener, idalloc_server::shutdown_signal())
        .await
        .map_err(|e| Failure::runtime(format!("serving: {e}")))?;
    // Stops background work. Client sessions' leases are left to their TTL (see `serve --help`).
    let _ = alloc.close().await;
    Ok(0)
}
