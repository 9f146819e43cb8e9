//! TLS to etcd: loading the CA, client certificate and key; the rustls configuration shared by
//! the connection and by the handshake diagnosis; and the test-only channel that skips server
//! verification.
//!
//! Why two TLS stacks: verified connections go through tonic's own TLS (etcd-client's `tls`
//! feature), which keeps etcd-client's balanced channel over every endpoint. tonic can neither
//! skip verification nor tell *why* a handshake failed (its balanced channel just never becomes
//! ready), so the same certificates are also loaded into a plain rustls [`ClientConfig`] that
//! [`super::diagnose`] uses to replay a failed handshake and name its cause, and that the
//! `insecure_skip_tls_verify` channel uses with a verifier that accepts any server certificate.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use etcd_client::{Certificate, Identity, TlsOptions};
use futures::future::BoxFuture;
use hyper_util::rt::TokioIo;
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::crypto::CryptoProvider;
use rustls::{ClientConfig, DigitallySignedStruct, RootCertStore, SignatureScheme};
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer, ServerName, UnixTime};
use tokio::net::TcpStream;
use tokio_rustls::client::TlsStream;
use tokio_rustls::TlsConnector;

use crate::store::{StoreError, StoreResult};

/// TLS settings for etcd, as etcdctl takes them (`--cacert`, `--cert`, `--key`,
/// `--insecure-skip-tls-verify`). Paths, not contents: they are read by
/// [`super::EtcdStore::connect`], and every error names the file.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct EtcdTls {
    /// PEM file of the CA(s) that signed the etcd server certificates. `None`: the system's
    /// trust store.
    pub ca_file: Option<PathBuf>,
    /// PEM client certificate (chain), for etcd's `--client-cert-auth`. Needs `key_file`.
    pub cert_file: Option<PathBuf>,
    /// PEM private key of `cert_file` (PKCS#8, PKCS#1 or SEC1).
    pub key_file: Option<PathBuf>,
    /// TESTING ONLY: accept any server certificate. The connection is still encrypted, but anyone
    /// on the path can impersonate etcd and read every request (and the password).
    pub insecure_skip_verify: bool,
}

impl EtcdTls {
    /// Verify etcd's certificates with the CA(s) in `ca_file` (PEM).
    pub fn with_ca(mut self, ca_file: impl Into<PathBuf>) -> Self {
        self.ca_file = Some(ca_file.into());
        self
    }
    /// Present a client certificate (PEM chain) and its private key.
    pub fn with_identity(
        mut self,
        cert_file: impl Into<PathBuf>,
        key_file: impl Into<PathBuf>,
    ) -> Self {
        self.cert_file = Some(cert_file.into());
        self.key_file = Some(key_file.into());
        self
    }
    /// TESTING ONLY: [`EtcdTls::insecure_skip_verify`].
    pub fn with_insecure_skip_verify(mut self, skip: bool) -> Self {
        self.insecure_skip_verify = skip;
        self
    }
}

/// The loaded form of [`EtcdTls`].
pub(super) struct LoadedTls {
    /// For etcd-client's (tonic's) verified channel.
    pub tonic: TlsOptions,
    /// The same trust and identity for rustls: the diagnosis and the insecure channel.
    pub rustls: Arc<ClientConfig>,
}

fn read(what: &str, path: &Path) -> StoreResult<Vec<u8>> {
    std::fs::read(path).map_err(|e| {
        StoreError::InvalidRequest(format!(
            "cannot read the etcd {what} file {}: {e}",
            path.display()
        ))
    })
}

fn certificates(what: &str, path: &Path, pem: &[u8]) -> StoreResult<Vec<CertificateDer<'static>>> {
    let certs =
        CertificateDer::pem_slice_iter(pem).collect::<Result<Vec<_>, _>>().map_err(|e| {
            StoreError::InvalidRequest(format!(
                "the etcd {what} file {} is not valid PEM: {e}",
                path.display()
            ))
        })?;
    if certs.is_empty() {
        return Err(StoreError::InvalidRequest(format!(
            "the etcd {what} file {} holds no PEM certificate (-----BEGIN CERTIFICATE-----)",
            path.display()
        )));
    }
    Ok(certs)
}

/// The crypto provider: ring, so that no system library is needed to build or run.
pub(super) fn provider() -> Arc<CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// Reads and checks the files of `tls`; fails with [`StoreError::InvalidRequest`] naming the file
/// and what is wrong with it.
pub(super) fn load(tls: &EtcdTls) -> StoreResult<LoadedTls> {
    let mut tonic = TlsOptions::new();
    let provider = provider();
    let builder = ClientConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .map_err(|e| StoreError::InvalidRequest(format!("TLS setup failed: {e}")))?;
    let builder = if tls.insecure_skip_verify {
        builder.dangerous().with_custom_certificate_verifier(Arc::new(AcceptAnyServer(provider)))
    } else {
        let mut roots = RootCertStore::empty();
        match &tls.ca_file {
            Some(path) => {
                let pem = read("CA (--cacert)", path)?;
                for cert in certificates("CA (--cacert)", path, &pem)? {
                    roots.add(cert).map_err(|e| {
                        StoreError::InvalidRequest(format!(
                            "the etcd CA file {} holds a certificate that cannot be a trust \
                             anchor: {e}",
                            path.display()
                        ))
                    })?;
                }
                tonic = tonic.ca_certificate(Certificate::from_pem(pem));
            }
            None => {
                let found = rustls_native_certs::load_native_certs();
                roots.add_parsable_certificates(found.certs);
                tonic = tonic.with_native_roots();
            }
        }
        builder.with_root_certificates(roots)
    };
    let mut config = match (&tls.cert_file, &tls.key_file) {
        (Some(cert_path), Some(key_path)) => {
            let cert_pem = read("client certificate (--cert)", cert_path)?;
            let key_pem = read("client key (--key)", key_path)?;
            let certs = certificates("client certificate (--cert)", cert_path, &cert_pem)?;
            let key = PrivateKeyDer::from_pem_slice(&key_pem).map_err(|e| {
                StoreError::InvalidRequest(format!(
                    "the etcd client key file {} holds no usable PEM private key: {e}",
                    key_path.display()
                ))
            })?;
            tonic = tonic.identity(Identity::from_pem(cert_pem, key_pem));
            builder.with_client_auth_cert(certs, key).map_err(|e| {
                StoreError::InvalidRequest(format!(
                    "the etcd client certificate {} and key {} do not go together: {e}",
                    cert_path.display(),
                    key_path.display()
                ))
            })?
        }
        (None, None) => builder.with_no_client_auth(),
        (Some(c), None) => {
            return Err(StoreError::InvalidRequest(format!(
                "an etcd client certificate ({}) needs its key too (--key / key-file)",
                c.display()
            )))
        }
        (None, Some(k)) => {
            return Err(StoreError::InvalidRequest(format!(
                "an etcd client key ({}) needs its certificate too (--cert / cert-file)",
                k.display()
            )))
        }
    };
    config.alpn_protocols = vec![b"h2".to_vec()];
    Ok(LoadedTls { tonic, rustls: Arc::new(config) })
}

/// A rustls config that accepts any server certificate and offers no client certificate: used
/// by the diagnosis to find out whether a plain-text endpoint actually speaks TLS. `None` only if
/// the crypto provider supports no default TLS version (ring supports both).
pub(super) fn permissive() -> Option<Arc<ClientConfig>> {
    let provider = provider();
    let builder =
        ClientConfig::builder_with_provider(provider.clone()).with_safe_default_protocol_versions();
    builder.ok().map(|b| {
        Arc::new(
            b.dangerous()
                .with_custom_certificate_verifier(Arc::new(AcceptAnyServer(provider)))
                .with_no_client_auth(),
        )
    })
}

/// Accepts every server certificate, but still checks the handshake signatures (so the peer
/// must hold the key of the certificate it shows). `--insecure-skip-tls-verify` only.
#[derive(Debug)]
struct AcceptAnyServer(Arc<CryptoProvider>);

impl ServerCertVerifier for AcceptAnyServer {
    fn verify_server_cert(
        &self,
        _end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp_response: &[u8],
        _now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.signature_verification_algorithms.supported_schemes()
    }
}

/// Host, port and TLS server name of an endpoint URL.
#[derive(Clone, Debug)]
pub(super) struct Target {
    pub url: String,
    pub host: String,
    pub port: u16,
}

impl Target {
    /// Parses `http[s]://host[:port][/]` (port 2379 if missing, as etcdctl).
    pub fn parse(url: &str) -> StoreResult<Target> {
        let uri: http::Uri = url.parse().map_err(|e| {
            StoreError::InvalidRequest(format!("etcd endpoint {url:?} is not a URL: {e}"))
        })?;
        let host = uri.host().ok_or_else(|| {
            StoreError::InvalidRequest(format!("etcd endpoint {url:?} names no host"))
        })?;
        let host = host.trim_start_matches('[').trim_end_matches(']').to_string();
        Ok(Target { url: url.to_string(), host, port: uri.port_u16().unwrap_or(2379) })
    }

    pub fn server_name(&self) -> Result<ServerName<'static>, String> {
        ServerName::try_from(self.host.clone())
            .map_err(|e| format!("{:?} is not a valid TLS server name: {e}", self.host))
    }

    pub async fn tcp(&self, timeout: Duration) -> Result<TcpStream, String> {
        // Resolved apart from the connect, so that a name that does not resolve is said to be
        // a DNS failure, not a connection that failed.
        let connect = async {
            let addrs: Vec<std::net::SocketAddr> =
                tokio::net::lookup_host((self.host.as_str(), self.port))
                    .await
                    .map_err(|e| {
                        std::io::Error::other(format!(
                            "cannot resolve {} (DNS lookup failed: {e})",
                            self.host
                        ))
                    })?
                    .collect();
            TcpStream::connect(&addrs[..]).await
        };
        match tokio::time::timeout(timeout, connect).await {
            Ok(Err(e)) if e.kind() == std::io::ErrorKind::Other => Err(e.to_string()),
            Ok(Ok(s)) => Ok(s),
            Ok(Err(e)) => Err(format!("cannot connect: {e}")),
            Err(_) => Err(format!("cannot connect within {timeout:?}")),
        }
    }
}

/// The tonic connector of the insecure channel: TCP then TLS (any server certificate) to the
/// endpoints in turn, starting after the one used last, so a dead member is skipped on reconnect.
#[derive(Clone)]
struct FailoverTls {
    targets: Arc<Vec<Target>>,
    next: Arc<AtomicUsize>,
    config: Arc<ClientConfig>,
    connect_timeout: Duration,
}

impl tower::Service<http::Uri> for FailoverTls {
    type Response = TokioIo<TlsStream<TcpStream>>;
    type Error = std::io::Error;
    type Future = BoxFuture<'static, Result<Self::Response, Self::Error>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, _uri: http::Uri) -> Self::Future {
        let this = self.clone();
        Box::pin(async move {
            let n = this.targets.len();
            let start = this.next.fetch_add(1, Ordering::Relaxed);
            let mut errors = Vec::new();
            for i in 0..n {
                let target = &this.targets[(start + i) % n];
                let attempt = async {
                    let tcp = target.tcp(this.connect_timeout).await?;
                    let name = target.server_name()?;
                    TlsConnector::from(this.config.clone())
                        .connect(name, tcp)
                        .await
                        .map_err(|e| format!("TLS handshake failed: {e}"))
                };
                match tokio::time::timeout(this.connect_timeout, attempt).await {
                    Ok(Ok(stream)) => {
                        this.next.store((start + i) % n, Ordering::Relaxed);
                        return Ok(TokioIo::new(stream));
                    }
                    Ok(Err(e)) => errors.push(format!("{}: {e}", target.url)),
                    Err(_) => errors.push(format!(
                        "{}: no TLS connection within {:?}",
                        target.url, this.connect_timeout
                    )),
                }
            }
            Err(std::io::Error::other(errors.join("; ")))
        })
    }
}

/// Builds the `insecure_skip_tls_verify` channel for etcd-client: one HTTP/2 connection at a
/// time through [`FailoverTls`] (etcd-client's endpoint list is ignored: tonic would wrap it in
/// its own, verifying TLS).
pub(super) struct InsecureChannel {
    pub targets: Vec<Target>,
    pub config: Arc<ClientConfig>,
    pub connect_timeout: Duration,
    pub request_timeout: Duration,
    pub keep_alive: (Duration, Duration),
}

impl etcd_client::BalancedChannelBuilder for InsecureChannel {
    type Error = etcd_client::Error;

    fn balanced_channel(
        self,
        buffer_size: usize,
    ) -> Result<(etcd_client::Channel, tokio::sync::mpsc::Sender<EndpointChange>), Self::Error>
    {
        use tower::ServiceExt;
        let first = self
            .targets
            .first()
            .ok_or_else(|| etcd_client::Error::InvalidArgs("empty endpoints".into()))?;
        // The authority tonic puts in requests; the connection itself is made by FailoverTls.
        let authority = format!("http://{}:{}", authority_host(&first.host), first.port);
        let endpoint = tonic::transport::Endpoint::from_shared(authority)
            .map_err(|e| etcd_client::Error::InvalidArgs(e.to_string()))?
            .connect_timeout(self.connect_timeout)
            .timeout(self.request_timeout)
            .http2_keep_alive_interval(self.keep_alive.0)
            .keep_alive_timeout(self.keep_alive.1)
            .keep_alive_while_idle(false);
        let connector = FailoverTls {
            targets: Arc::new(self.targets),
            next: Arc::new(AtomicUsize::new(0)),
            config: self.config,
            connect_timeout: self.connect_timeout,
        };
        let channel = endpoint
            .connect_with_connector_lazy(connector)
            .map_err(|e| -> tower::BoxError { Box::new(e) });
        // etcd-client sends its endpoints here; they are not needed, so drain them.
        let (tx, mut rx) = tokio::sync::mpsc::channel(buffer_size.max(1));
        tokio::spawn(async move { while rx.recv().await.is_some() {} });
        Ok((etcd_client::Channel::Custom(tower::util::BoxCloneSyncService::new(channel)), tx))
    }
}

type EndpointChange = tonic::transport::channel::Change<http::Uri, tonic::transport::Endpoint>;

fn authority_host(host: &str) -> String {
    if host.contains(':') {
        format!("[{host}]")
    } else {
        host.to_string()
    }
}
