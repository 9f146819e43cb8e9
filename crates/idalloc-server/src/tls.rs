//! TLS on the service's listener: rustls with ring (no system OpenSSL), optional
//! client-certificate verification, and certificate reload without a restart.
//!
//! [`TlsListener`] is an `axum::serve::Listener`: a background task accepts TCP connections and
//! runs each handshake in its own task (bounded by [`HANDSHAKE_TIMEOUT`]), so a slow or silent
//! client never holds up the others, and hands finished TLS streams to axum. Everything else
//! (routing, graceful shutdown) is the plain listener's code path.
//!
//! [`TlsReloader`] holds the current `ServerConfig`; each new connection takes the config in
//! force when it arrives. [`TlsReloader::reload`] re-reads the files (on SIGHUP, or when their
//! modification times change) and swaps the config only if everything loads: a half-written
//! rotation keeps the old certificate serving and logs why.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};
use std::time::{Duration, SystemTime};

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::server::WebPkiClientVerifier;
use rustls::{RootCertStore, ServerConfig};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;
use tokio::task::AbortHandle;
use tokio_rustls::server::TlsStream;
use tokio_rustls::TlsAcceptor;
use tracing::{debug, info, warn};

/// A client that has not finished its handshake after this long is dropped.
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// The files of the listener's TLS setup.
#[derive(Clone, Debug)]
pub struct TlsFiles {
    /// The server's certificate chain (PEM; leaf first).
    pub cert: PathBuf,
    /// Its private key (PEM: PKCS#8, PKCS#1 or SEC1).
    pub key: PathBuf,
    /// With a CA file, clients must present a certificate it signed (mutual TLS): others are
    /// refused in the handshake.
    pub client_ca: Option<PathBuf>,
}

fn read_certs(what: &str, path: &Path) -> Result<Vec<CertificateDer<'static>>, String> {
    let bytes = std::fs::read(path)
        .map_err(|e| format!("cannot read the {what} {}: {e}", path.display()))?;
    let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_slice_iter(&bytes)
        .collect::<Result<_, _>>()
        .map_err(|e| format!("the {what} {} is not PEM certificates: {e}", path.display()))?;
    if certs.is_empty() {
        return Err(format!(
            "the {what} {} holds no certificate (expected PEM `BEGIN CERTIFICATE` blocks)",
            path.display()
        ));
    }
    Ok(certs)
}

fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

impl TlsFiles {
    /// Loads the files into a rustls server config. Errors are one line naming the file (and the
    /// flag it came from).
    pub fn load(&self) -> Result<Arc<ServerConfig>, String> {
        let certs = read_certs("certificate (--tls-cert)", &self.cert)?;
        crate::secret_files::check(&self.key, crate::secret_files::Kind::TlsKey)
            .map_err(|e| format!("--tls-key: {e}"))?;
        let key_bytes = std::fs::read(&self.key).map_err(|e| {
            format!("cannot read the private key (--tls-key) {}: {e}", self.key.display())
        })?;
        let key = PrivateKeyDer::from_pem_slice(&key_bytes).map_err(|e| {
            format!(
                "the private key (--tls-key) {} is not a PEM private key: {e}",
                self.key.display()
            )
        })?;
        let builder = ServerConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()
            .map_err(|e| format!("TLS setup: {e}"))?;
        let builder = match &self.client_ca {
            None => builder.with_no_client_auth(),
            Some(ca) => {
                let mut roots = RootCertStore::empty();
                for c in read_certs("client CA (--client-ca)", ca)? {
                    roots.add(c).map_err(|e| {
                        format!("the client CA (--client-ca) {}: {e}", ca.display())
                    })?;
                }
                let verifier =
                    WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider())
                        .build()
                        .map_err(|e| {
                            format!("the client CA (--client-ca) {}: {e}", ca.display())
                        })?;
                builder.with_client_cert_verifier(verifier)
            }
        };
        let mut config = builder.with_single_cert(certs, key).map_err(|e| {
            format!(
                "the certificate {} and key {} do not make a usable pair: {e}",
                self.cert.display(),
                self.key.display()
            )
        })?;
        config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
        Ok(Arc::new(config))
    }

    /// The modification times of the files (None where unreadable): a change means a rotation.
    fn stamps(&self) -> Vec<Option<SystemTime>> {
        let mut files = vec![&self.cert, &self.key];
        files.extend(self.client_ca.as_ref());
        files.into_iter().map(|f| std::fs::metadata(f).and_then(|m| m.modified()).ok()).collect()
    }
}

/// The config new connections get, and how to reload it.
pub struct TlsReloader {
    files: TlsFiles,
    current: RwLock<(Arc<ServerConfig>, Vec<Option<SystemTime>>)>,
}

impl TlsReloader {
    /// Loads the files once (an error here stops the service from starting).
    pub fn new(files: TlsFiles) -> Result<Arc<TlsReloader>, String> {
        let stamps = files.stamps();
        let config = files.load()?;
        Ok(Arc::new(TlsReloader { files, current: RwLock::new((config, stamps)) }))
    }

    pub fn files(&self) -> &TlsFiles {
        &self.files
    }

    fn current(&self) -> Arc<ServerConfig> {
        self.current.read().unwrap_or_else(|p| p.into_inner()).0.clone()
    }

    /// Re-reads the files; on success new connections use them (open ones keep theirs). On
    /// failure the old config stays.
    pub fn reload(&self) -> Result<(), String> {
        let stamps = self.files.stamps();
        let config = self.files.load()?;
        *self.current.write().unwrap_or_else(|p| p.into_inner()) = (config, stamps);
        Ok(())
    }

    /// Whether a file's modification time changed since the last (re)load.
    fn changed(&self) -> bool {
        self.files.stamps() != self.current.read().unwrap_or_else(|p| p.into_inner()).1
    }

    /// Reloads on SIGHUP and when the files change (checked every `poll`), until the task is
    /// aborted. Logs the outcome; never logs key material. The SIGHUP handler is installed
    /// before this returns (so a SIGHUP right after start reloads instead of killing the
    /// process); call it inside the runtime.
    pub fn watch(self: Arc<Self>, poll: Duration) -> impl std::future::Future<Output = ()> {
        #[cfg(unix)]
        let mut hup = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup()).ok();
        async move {
            loop {
                #[cfg(unix)]
                let why = tokio::select! {
                    _ = async {
                        match hup.as_mut() {
                            Some(h) => { h.recv().await; }
                            None => std::future::pending::<()>().await,
                        }
                    } => "SIGHUP",
                    _ = tokio::time::sleep(poll) => {
                        if !self.changed() { continue; }
                        "the files changed"
                    }
                };
                #[cfg(not(unix))]
                let why = {
                    tokio::time::sleep(poll).await;
                    if !self.changed() {
                        continue;
                    }
                    "the files changed"
                };
                match self.reload() {
                    Ok(()) => {
                        info!(cert = %self.files.cert.display(), "TLS certificate reloaded ({why})")
                    }
                    Err(e) => warn!(
                        "TLS reload ({why}) failed, still serving the previous certificate: {e}"
                    ),
                }
            }
        }
    }
}

/// A TCP listener that hands axum TLS streams whose handshake is done.
pub struct TlsListener {
    rx: mpsc::Receiver<(TlsStream<TcpStream>, SocketAddr)>,
    local: SocketAddr,
    task: AbortHandle,
}

impl TlsListener {
    /// `keepalive`: as [`crate::limits::Limits::keepalive`], set on every accepted socket.
    pub fn new(
        tcp: TcpListener,
        tls: Arc<TlsReloader>,
        keepalive: Option<Duration>,
    ) -> std::io::Result<TlsListener> {
        let local = tcp.local_addr()?;
        let (tx, rx) = mpsc::channel(64);
        let task = tokio::spawn(accept_loop(tcp, tls, keepalive, tx)).abort_handle();
        Ok(TlsListener { rx, local, task })
    }
}

impl Drop for TlsListener {
    fn drop(&mut self) {
        // Stops accepting (and closes the port) when axum lets go of the listener.
        self.task.abort();
    }
}

async fn accept_loop(
    tcp: TcpListener,
    tls: Arc<TlsReloader>,
    keepalive: Option<Duration>,
    tx: mpsc::Sender<(TlsStream<TcpStream>, SocketAddr)>,
) {
    loop {
        let (stream, peer) = match tcp.accept().await {
            Ok(x) => x,
            Err(e) => {
                // Out of file descriptors and the like: back off as axum's own listener does.
                warn!(error = %e, "accept failed");
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        // No Nagle delay (as for plain HTTP: `serve`).
        let _ = stream.set_nodelay(true);
        if let Err(e) = crate::keepalive::tune(&stream, keepalive) {
            warn!(error = %e, "cannot set TCP keepalive on a connection");
        }
        let acceptor = TlsAcceptor::from(tls.current());
        let tx = tx.clone();
        tokio::spawn(async move {
            match tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(stream)).await {
                Ok(Ok(s)) => {
                    let _ = tx.send((s, peer)).await;
                }
                // A client's mistake (plain HTTP, wrong CA, no certificate): not the service's.
                Ok(Err(e)) => debug!(%peer, error = %e, "TLS handshake failed"),
                Err(_) => debug!(%peer, "TLS handshake timed out"),
            }
        });
    }
}

impl axum::serve::Listener for TlsListener {
    type Io = TlsStream<TcpStream>;
    type Addr = SocketAddr;

    async fn accept(&mut self) -> (Self::Io, Self::Addr) {
        match self.rx.recv().await {
            Some(x) => x,
            // The accept task ended (it only does when aborted): accept nothing more.
            None => std::future::pending().await,
        }
    }

    fn local_addr(&self) -> std::io::Result<Self::Addr> {
        Ok(self.local)
    }
}
