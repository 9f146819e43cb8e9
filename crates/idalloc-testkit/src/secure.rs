//! Test helpers for a locked-down etcd: certificates made at run time, and a
//! single etcd member with TLS, client-certificate authentication and/or user authentication.
//!
//! Kept apart from [`crate::etcd`] (the plain launcher) on purpose: it has its own process
//! handling so that the two can move independently. Nothing here is committed as a file: the
//! certificates are generated with `rcgen` into the server's temporary directory, which is
//! removed (after the process is killed by its PID) when the [`SecureEtcd`] is dropped.
//!
//! The auth setup is the one docs/guide/security.md tells operators to make: a `root` user (required by
//! `auth enable`), and an `idalloc` user whose role `idalloc` has readwrite on
//! [`SecureEtcd::PREFIX`] only.

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, KeyPair,
    KeyUsagePurpose, SanType,
};

use idalloc::store::etcd::{EtcdAuth, EtcdOptions, EtcdStore, EtcdTls};
use idalloc::store::{GetRequest, Store};

const START_TIMEOUT: Duration = Duration::from_secs(30);

/// One certificate and its key, as PEM files.
#[derive(Clone, Debug)]
pub struct CertFiles {
    pub cert: PathBuf,
    pub key: PathBuf,
}

/// Every certificate the security tests use, generated into one directory.
#[derive(Clone, Debug)]
pub struct TestPki {
    /// The CA that signed the server and the good client certificates.
    pub ca: PathBuf,
    /// Another CA, which signed nothing the server knows: a "wrong CA" for clients, and the
    /// signer of [`TestPki::stranger`].
    pub other_ca: PathBuf,
    /// The server's certificate, for 127.0.0.1 and localhost.
    pub server: CertFiles,
    /// A valid client certificate (CN `idalloc`).
    pub client: CertFiles,
    /// A client certificate signed by the right CA that expired in 2001.
    pub expired_client: CertFiles,
    /// A client certificate signed by [`TestPki::other_ca`].
    pub stranger: CertFiles,
}

fn err<E: std::fmt::Display>(what: &str) -> impl Fn(E) -> String + '_ {
    move |e| format!("{what}: {e}")
}

struct Ca {
    cert: rcgen::Certificate,
    key: KeyPair,
}

fn make_ca(name: &str) -> Result<Ca, String> {
    let mut params = CertificateParams::new(Vec::<String>::new()).map_err(err("CA params"))?;
    params.distinguished_name.push(DnType::CommonName, name);
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
    let key = KeyPair::generate().map_err(err("CA key"))?;
    let cert = params.self_signed(&key).map_err(err("CA certificate"))?;
    Ok(Ca { cert, key })
}

fn leaf(
    ca: &Ca,
    cn: &str,
    server: bool,
    expired: bool,
) -> Result<(rcgen::Certificate, KeyPair), String> {
    let mut params = CertificateParams::new(Vec::<String>::new()).map_err(err("params"))?;
    params.distinguished_name.push(DnType::CommonName, cn);
    if server {
        params.subject_alt_names = vec![
            SanType::IpAddress(std::net::IpAddr::from([127, 0, 0, 1])),
            SanType::DnsName("localhost".try_into().map_err(err("SAN"))?),
        ];
        params.extended_key_usages =
            vec![ExtendedKeyUsagePurpose::ServerAuth, ExtendedKeyUsagePurpose::ClientAuth];
    } else {
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
    }
    params.key_usages = vec![KeyUsagePurpose::DigitalSignature, KeyUsagePurpose::KeyEncipherment];
    // Strict verifiers (Python 3.13's default X.509 checks) want it on every non-root certificate.
    params.use_authority_key_identifier_extension = true;
    if expired {
        params.not_before = rcgen::date_time_ymd(2000, 1, 1);
        params.not_after = rcgen::date_time_ymd(2001, 1, 1);
    }
    let key = KeyPair::generate().map_err(err("key"))?;
    let cert = params.signed_by(&key, &ca.cert, &ca.key).map_err(err("certificate"))?;
    Ok((cert, key))
}

fn write(dir: &Path, name: &str, text: &str) -> Result<PathBuf, String> {
    let path = dir.join(name);
    std::fs::write(&path, text).map_err(|e| format!("writing {}: {e}", path.display()))?;
    // Private, as the service requires of its key (and harmless for certificates).
    {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600))
            .map_err(|e| format!("chmod {}: {e}", path.display()))?;
    }
    Ok(path)
}

fn write_pair(
    dir: &Path,
    name: &str,
    (cert, key): (rcgen::Certificate, KeyPair),
) -> Result<CertFiles, String> {
    Ok(CertFiles {
        cert: write(dir, &format!("{name}.crt"), &cert.pem())?,
        key: write(dir, &format!("{name}.key"), &key.serialize_pem())?,
    })
}

impl TestPki {
    /// Generates every certificate into `dir`.
    pub fn generate(dir: &Path) -> Result<TestPki, String> {
        let ca = make_ca("idalloc test CA")?;
        let other = make_ca("some other CA")?;
        Ok(TestPki {
            ca: write(dir, "ca.crt", &ca.cert.pem())?,
            other_ca: write(dir, "other-ca.crt", &other.cert.pem())?,
            server: write_pair(dir, "server", leaf(&ca, "etcd", true, false)?)?,
            client: write_pair(dir, "client", leaf(&ca, "idalloc", false, false)?)?,
            expired_client: write_pair(dir, "expired", leaf(&ca, "idalloc", false, true)?)?,
            stranger: write_pair(dir, "stranger", leaf(&other, "idalloc", false, false)?)?,
        })
    }

    /// TLS settings trusting the right CA and presenting the valid client certificate.
    pub fn client_tls(&self) -> EtcdTls {
        EtcdTls::default()
            .with_ca(self.ca.clone())
            .with_identity(self.client.cert.clone(), self.client.key.clone())
    }
}

/// How the etcd is locked down.
#[derive(Clone, Copy, Debug, Default)]
pub struct SecureSpec {
    /// Serve clients over TLS only (`https://`).
    pub tls: bool,
    /// With `tls`: require a client certificate signed by the CA (`--client-cert-auth`).
    pub client_cert_auth: bool,
    /// Enable authentication with the `root` and `idalloc` users (see the module docs).
    pub auth: bool,
    /// `--auth-token-ttl` in seconds (etcd's default is 300).
    pub auth_token_ttl: Option<u64>,
}

/// What a role may do on a prefix ([`SecureEtcd::add_user`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Grant {
    Read,
    Write,
    ReadWrite,
}

/// A single etcd member, locked down as its [`SecureSpec`] says, on free loopback ports.
/// Killed by its PID and its files removed on drop.
#[derive(Debug)]
pub struct SecureEtcd {
    spec: SecureSpec,
    pki: TestPki,
    client_port: u16,
    peer_port: u16,
    child: Option<Child>,
    // Dropped after `child` is killed (see Drop).
    dir: tempfile::TempDir,
}

fn free_port() -> Result<u16, String> {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .map_err(|e| format!("no free port: {e}"))
}

impl SecureEtcd {
    /// The key prefix the `idalloc` user may read and write (its role covers nothing else).
    pub const PREFIX: &'static str = "idalloc-secure/";
    /// The restricted user.
    pub const USER: &'static str = "idalloc";
    /// Its password (test only).
    pub const PASSWORD: &'static str = "idalloc-test-password";
    /// The root user's password (test only).
    pub const ROOT_PASSWORD: &'static str = "root-test-password";

    /// Starts etcd (from `PATH`) as `spec` says, sets up the users if `spec.auth`, and waits until
    /// it answers. Retries with new ports if a port was taken in between.
    pub async fn start(spec: SecureSpec) -> Result<SecureEtcd, String> {
        let mut last = String::new();
        for _ in 0..3 {
            match Self::try_start(spec).await {
                Ok(s) => return Ok(s),
                Err(e) => last = e,
            }
        }
        Err(format!("the secured etcd did not start after 3 attempts: {last}"))
    }

    async fn try_start(spec: SecureSpec) -> Result<SecureEtcd, String> {
        let dir = tempfile::Builder::new()
            .prefix("idalloc-secure-etcd-")
            .tempdir()
            .map_err(err("temp dir"))?;
        let pki = TestPki::generate(dir.path())?;
        let mut etcd = SecureEtcd {
            spec,
            pki,
            client_port: free_port()?,
            peer_port: free_port()?,
            child: None,
            dir,
        };
        etcd.spawn()?;
        // Users are set up before auth is enabled, as an administrator would.
        etcd.wait_ready(false).await?;
        if spec.auth {
            etcd.enable_auth().await?;
        }
        Ok(etcd)
    }

    /// Starts the process. On a restart the data directory exists, and etcd ignores the
    /// `--initial-cluster*` flags.
    fn spawn(&mut self) -> Result<(), String> {
        let client = self.endpoint();
        let peer = format!("http://127.0.0.1:{}", self.peer_port);
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.log_path())
            .map_err(err("etcd log"))?;
        let mut cmd = Command::new("etcd");
        cmd.arg("--name")
            .arg("secure")
            .arg("--data-dir")
            .arg(self.dir.path().join("data"))
            .args(["--listen-client-urls", &client, "--advertise-client-urls", &client])
            .args(["--listen-peer-urls", &peer, "--initial-advertise-peer-urls", &peer])
            .arg("--initial-cluster")
            .arg(format!("secure={peer}"))
            .args(["--initial-cluster-state", "new"])
            .args(["--heartbeat-interval", "50", "--election-timeout", "500"]);
        if self.spec.tls {
            cmd.arg("--cert-file")
                .arg(&self.pki.server.cert)
                .arg("--key-file")
                .arg(&self.pki.server.key);
            if self.spec.client_cert_auth {
                cmd.arg("--client-cert-auth").arg("--trusted-ca-file").arg(&self.pki.ca);
            }
        }
        if let Some(ttl) = self.spec.auth_token_ttl {
            cmd.arg("--auth-token-ttl").arg(ttl.to_string());
        }
        let child = cmd
            .stdin(Stdio::null())
            .stdout(log.try_clone().map_err(err("etcd log"))?)
            .stderr(log)
            .spawn()
            .map_err(|e| format!("cannot run etcd (is it on PATH?): {e}"))?;
        self.child = Some(child);
        Ok(())
    }

    fn log_path(&self) -> PathBuf {
        self.dir.path().join("etcd.log")
    }

    fn log_tail(&self) -> String {
        let text = std::fs::read_to_string(self.log_path()).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(20)..].join("\n")
    }

    /// The client URL: `https://127.0.0.1:PORT` with TLS, else `http://...`.
    pub fn endpoint(&self) -> String {
        let scheme = if self.spec.tls { "https" } else { "http" };
        format!("{scheme}://127.0.0.1:{}", self.client_port)
    }

    /// The certificates (generated whether or not the server uses TLS).
    pub fn pki(&self) -> &TestPki {
        &self.pki
    }

    /// The spec it was started with.
    pub fn spec(&self) -> SecureSpec {
        self.spec
    }

    /// TLS settings a good client uses (`None` without TLS).
    pub fn client_tls(&self) -> Option<EtcdTls> {
        self.spec.tls.then(|| self.pki.client_tls())
    }

    /// The restricted user's credentials.
    pub fn user_auth() -> EtcdAuth {
        EtcdAuth::new(Self::USER, Self::PASSWORD)
    }

    /// Options for a good client, authenticating as `auth` (if any), with loopback timeouts.
    pub fn options(&self, auth: Option<EtcdAuth>) -> EtcdOptions {
        let mut opts = EtcdOptions::new([self.endpoint()]);
        opts.connect_timeout = Duration::from_secs(3);
        opts.request_timeout = Duration::from_secs(5);
        opts.tls = self.client_tls();
        opts.auth = auth;
        opts
    }

    fn root_options(&self) -> EtcdOptions {
        let auth = self.spec.auth.then(|| EtcdAuth::new("root", Self::ROOT_PASSWORD));
        let mut opts = self.options(auth);
        opts.connect_timeout = Duration::from_millis(500);
        opts.request_timeout = Duration::from_secs(1);
        opts
    }

    /// A store connected as root (when auth is on): for a test's setup and its checks.
    pub async fn root_store(&self) -> Result<EtcdStore, String> {
        EtcdStore::connect(self.root_options()).await.map_err(|e| format!("root client: {e}"))
    }

    async fn wait_ready(&mut self, authenticated: bool) -> Result<(), String> {
        let deadline = Instant::now() + START_TIMEOUT;
        let mut opts = self.root_options();
        if !authenticated {
            opts.auth = None;
        }
        loop {
            let last = match EtcdStore::connect(opts.clone()).await {
                Ok(store) => match store.get(GetRequest::key("idalloc-ready-probe")).await {
                    Ok(_) => return Ok(()),
                    Err(e) => e.to_string(),
                },
                Err(e) => e.to_string(),
            };
            let exited = self.child.as_mut().is_none_or(|c| !matches!(c.try_wait(), Ok(None)));
            if exited {
                return Err(format!("etcd exited; log tail:\n{}", self.log_tail()));
            }
            if Instant::now() > deadline {
                return Err(format!(
                    "etcd at {} did not answer within {START_TIMEOUT:?} ({last}); log tail:\n{}",
                    self.endpoint(),
                    self.log_tail()
                ));
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// etcd-client options of the tests' administrative client: short timeouts, and the test
    /// CA and client certificate when the member serves TLS.
    fn admin_options(&self) -> Result<etcd_client::ConnectOptions, String> {
        let mut opts = etcd_client::ConnectOptions::new()
            .with_connect_timeout(Duration::from_secs(2))
            .with_timeout(Duration::from_secs(5));
        if self.spec.tls {
            let ca = std::fs::read(&self.pki.ca).map_err(err("CA"))?;
            let cert = std::fs::read(&self.pki.client.cert).map_err(err("client cert"))?;
            let key = std::fs::read(&self.pki.client.key).map_err(err("client key"))?;
            opts = opts.with_tls(
                etcd_client::TlsOptions::new()
                    .ca_certificate(etcd_client::Certificate::from_pem(ca))
                    .identity(etcd_client::Identity::from_pem(cert, key)),
            );
        }
        Ok(opts)
    }

    /// etcdctl's `user add root`, `role add idalloc`, `role grant-permission idalloc readwrite
    /// PREFIX --prefix`, `user add idalloc`, `user grant-role idalloc idalloc`, `auth enable`.
    async fn enable_auth(&mut self) -> Result<(), String> {
        let opts = self.admin_options()?;
        let mut c = etcd_client::Client::connect([self.endpoint()], Some(opts))
            .await
            .map_err(err("admin client"))?;
        let perm = etcd_client::Permission::read_write(Self::PREFIX).with_prefix();
        let setup = async {
            c.user_add("root", Self::ROOT_PASSWORD, None).await?;
            c.role_add("root").await?;
            c.user_grant_role("root", "root").await?;
            c.role_add("idalloc").await?;
            c.role_grant_permission("idalloc", perm).await?;
            c.user_add(Self::USER, Self::PASSWORD, None).await?;
            c.user_grant_role(Self::USER, "idalloc").await?;
            c.auth_enable().await?;
            Ok::<_, etcd_client::Error>(())
        };
        tokio::time::timeout(Duration::from_secs(20), setup)
            .await
            .map_err(|_| "setting up etcd users timed out".to_string())?
            .map_err(err("setting up etcd users"))?;
        self.wait_ready(true).await
    }

    /// Adds user `user` with password `password` and a role of the same name granting `grants`
    /// (each a prefix and what the role may do there), as root: etcdctl's `role add`,
    /// `role grant-permission … --prefix`, `user add`, `user grant-role`. For tests of users with
    /// less than readwrite (a read-only user).
    pub async fn add_user(
        &self,
        user: &str,
        password: &str,
        grants: &[(&str, Grant)],
    ) -> Result<(), String> {
        let opts = self.admin_options()?.with_user("root", Self::ROOT_PASSWORD);
        let mut c = etcd_client::Client::connect([self.endpoint()], Some(opts))
            .await
            .map_err(err("root client"))?;
        let setup = async {
            c.role_add(user).await?;
            for (prefix, grant) in grants {
                let perm = match grant {
                    Grant::Read => etcd_client::Permission::read(*prefix),
                    Grant::Write => etcd_client::Permission::write(*prefix),
                    Grant::ReadWrite => etcd_client::Permission::read_write(*prefix),
                };
                c.role_grant_permission(user, perm.with_prefix()).await?;
            }
            c.user_add(user, password, None).await?;
            c.user_grant_role(user, user).await?;
            Ok::<_, etcd_client::Error>(())
        };
        tokio::time::timeout(Duration::from_secs(20), setup)
            .await
            .map_err(|_| format!("adding etcd user {user:?} timed out"))?
            .map_err(err("adding an etcd user"))
    }

    /// Kills etcd (by PID) and starts it again on the same data and ports, then waits until it
    /// answers (as root when auth is on). Every token it had issued is gone after this.
    /// Retried while its port is taken (see [`crate::etcd`]'s restart of a member).
    pub async fn restart(&mut self) -> Result<(), String> {
        use crate::etcd::{port_was_taken, RESTART_ATTEMPTS, RESTART_PAUSE};
        let mut attempt = 1;
        loop {
            self.kill();
            self.spawn()?;
            match self.wait_ready(self.spec.auth).await {
                Err(e) if port_was_taken(&e) && attempt < RESTART_ATTEMPTS => {
                    attempt += 1;
                    tokio::time::sleep(RESTART_PAUSE).await
                }
                done => return done,
            }
        }
    }

    /// The directory of its data, certificates and log (kept as evidence by failing tests).
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// Freezes etcd with SIGSTOP (a long GC pause, a hung VM): connections stay open, nothing is
    /// answered. [`SecureEtcd::resume`] undoes it; a drop kills it anyway.
    pub fn pause(&self) -> Result<(), String> {
        self.signal("STOP")
    }

    /// Lets a paused etcd run again (SIGCONT).
    pub fn resume(&self) -> Result<(), String> {
        self.signal("CONT")
    }

    fn signal(&self, sig: &str) -> Result<(), String> {
        let pid = self.child.as_ref().ok_or("etcd is not running")?.id();
        let ok = Command::new("kill")
            .args([format!("-{sig}"), pid.to_string()])
            .status()
            .map_err(|e| format!("cannot run kill: {e}"))?
            .success();
        if ok {
            Ok(())
        } else {
            Err(format!("kill -{sig} {pid} failed"))
        }
    }

    /// Kills etcd by its PID and reaps it.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

impl Drop for SecureEtcd {
    fn drop(&mut self) {
        self.kill();
    }
}
