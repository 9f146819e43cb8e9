//! Naming the cause when etcd cannot be reached at all.
//!
//! etcd-client's balanced channel hides why an endpoint is unusable: a wrong CA, a rejected client
//! certificate or a plain-text client talking to a TLS port all look like "no endpoint is ready",
//! i.e. a request that times out. When a store that has never had an answer fails that way, each
//! endpoint is probed directly: a TCP connection, then the TLS handshake with the same
//! certificates (or, for an `http://` endpoint, a handshake that accepts anything, to see whether
//! the port speaks TLS), then one read so that a client certificate the server rejects after a
//! TLS 1.3 handshake is seen too. A definite cause becomes [`StoreError::Access`]; anything else
//! keeps the request's own error, with what the probe saw added.
//!
//! The probe runs only on the error path and only until the store has answered once (after that, a
//! failure is an outage, not a misconfiguration), so it costs nothing in normal operation and
//! does not slow down failover while a member is paused.

use std::sync::Arc;
use std::time::Duration;

use rustls::{AlertDescription, CertificateError, ClientConfig};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio_rustls::TlsConnector;

use super::tls::Target;
use crate::store::AccessCause;

/// What a probe of one endpoint found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Finding {
    /// A definite reason why this client cannot use the endpoint.
    Refused { endpoint: String, cause: AccessCause, detail: String },
    /// Not reachable (refused, no route, silent): an outage, retryable.
    Unreachable { endpoint: String, detail: String },
    /// The endpoint looks fine at this level.
    Fine,
}

/// The HTTP/2 client preface and an empty SETTINGS frame: what a gRPC client sends first. A
/// server that accepted our TLS client answers with its own SETTINGS frame.
const H2_PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n\x00\x00\x00\x04\x00\x00\x00\x00\x00";

/// How long [`probe`] waits before it probes again to confirm a closed connection.
const CONFIRM_PAUSE: Duration = Duration::from_millis(200);

/// Probes `target` within `budget` (twice that when confirming). `tls` is the client's rustls
/// config for `https://` endpoints; `permissive` the accept-anything config for `http://` ones.
///
/// A connection the server closed in or right after the handshake is what a plain-text etcd or a
/// rejected client sees, and also what a member that is being killed or restarted does to a
/// client. Naming a misconfiguration ([`Finding::Refused`], which callers do not retry) from one
/// such close turned an outage into a permanent error: the secured chaos run under load saw a
/// client started while etcd's only member was being killed exit with "does not speak TLS".
/// So a close is confirmed by a second probe: a misconfiguration closes again, a dying member is
/// gone by then (unreachable) or answers.
pub(super) async fn probe(
    target: &Target,
    tls: Option<&Arc<ClientConfig>>,
    permissive: Option<&Arc<ClientConfig>>,
    budget: Duration,
) -> Finding {
    let (first, closed) = probe_once(target, tls, permissive, budget).await;
    if !closed {
        return first;
    }
    tokio::time::sleep(CONFIRM_PAUSE).await;
    probe_once(target, tls, permissive, budget).await.0
}

/// True if `e` is the server closing the connection (an end of file or a reset), not a TLS
/// verdict.
fn is_close(e: &std::io::Error) -> bool {
    rustls_error(e).is_none()
        && matches!(
            e.kind(),
            std::io::ErrorKind::UnexpectedEof | std::io::ErrorKind::ConnectionReset
        )
}

/// One probe: the finding, and whether it rests on the server closing the connection.
async fn probe_once(
    target: &Target,
    tls: Option<&Arc<ClientConfig>>,
    permissive: Option<&Arc<ClientConfig>>,
    budget: Duration,
) -> (Finding, bool) {
    let endpoint = target.url.clone();
    let https = target.url.starts_with("https://");
    let mut closed = false;
    let work = async {
        let tcp = match target.tcp(budget).await {
            Ok(s) => s,
            Err(detail) => return Finding::Unreachable { endpoint: endpoint.clone(), detail },
        };
        let name = match target.server_name() {
            Ok(n) => n,
            Err(detail) => {
                return Finding::Refused {
                    endpoint: endpoint.clone(),
                    cause: AccessCause::Tls,
                    detail,
                }
            }
        };
        if !https {
            // Does the plain-text endpoint speak TLS? A server hello (any certificate) says yes.
            let Some(config) = permissive else { return Finding::Fine };
            return match TlsConnector::from(config.clone()).connect(name, tcp).await {
                Ok(_) => Finding::Refused {
                    endpoint: endpoint.clone(),
                    cause: AccessCause::Tls,
                    detail: "the server speaks TLS but the endpoint is plain http://: use \
                             https:// (with --cacert, and --cert/--key if it asks for a client \
                             certificate)"
                        .into(),
                },
                Err(e) => match rustls_error(&e) {
                    Some(rustls::Error::AlertReceived(_)) => Finding::Refused {
                        endpoint: endpoint.clone(),
                        cause: AccessCause::Tls,
                        detail: "the server speaks TLS but the endpoint is plain http://: use \
                                 https://"
                            .into(),
                    },
                    _ => Finding::Fine,
                },
            };
        }
        let Some(config) = tls else { return Finding::Fine };
        let mut stream = match TlsConnector::from(config.clone()).connect(name, tcp).await {
            Ok(s) => s,
            Err(e) => {
                closed = is_close(&e);
                return Finding::Refused {
                    endpoint: endpoint.clone(),
                    cause: AccessCause::Tls,
                    detail: handshake_failure(&e, &target.host),
                };
            }
        };
        // With TLS 1.3 the server checks our certificate after our side of the handshake is
        // done: its verdict arrives with the first read.
        if let Err(e) = stream.write_all(H2_PREFACE).await {
            closed = is_close(&e);
            return Finding::Refused {
                endpoint: endpoint.clone(),
                cause: AccessCause::Tls,
                detail: after_handshake(&e),
            };
        }
        let mut buf = [0u8; 64];
        match stream.read(&mut buf).await {
            Ok(0) => {
                closed = true;
                Finding::Refused {
                    endpoint: endpoint.clone(),
                    cause: AccessCause::Tls,
                    detail: "the server closed the connection right after the TLS handshake \
                             (does it want a client certificate, --cert/--key?)"
                        .into(),
                }
            }
            Ok(_) => Finding::Fine,
            Err(e) => {
                closed = is_close(&e);
                Finding::Refused {
                    endpoint: endpoint.clone(),
                    cause: AccessCause::Tls,
                    detail: after_handshake(&e),
                }
            }
        }
    };
    match tokio::time::timeout(budget, work).await {
        Ok(f) => (f, closed),
        Err(_) => (
            Finding::Unreachable { endpoint, detail: format!("no answer within {budget:?}") },
            false,
        ),
    }
}

fn rustls_error(e: &std::io::Error) -> Option<&rustls::Error> {
    e.get_ref().and_then(|inner| inner.downcast_ref::<rustls::Error>())
}

/// Why our side of the handshake failed, in the words of the flags that fix it.
fn handshake_failure(e: &std::io::Error, host: &str) -> String {
    match rustls_error(e) {
        Some(rustls::Error::InvalidCertificate(c)) => match c {
            CertificateError::UnknownIssuer => "the server's certificate is not signed by a \
                trusted CA (--cacert / trusted-ca-file)"
                .into(),
            CertificateError::Expired | CertificateError::ExpiredContext { .. } => {
                "the server's certificate has expired".into()
            }
            CertificateError::NotValidYet | CertificateError::NotValidYetContext { .. } => {
                "the server's certificate is not valid yet (check the clocks)".into()
            }
            CertificateError::NotValidForName | CertificateError::NotValidForNameContext { .. } => {
                format!("the server's certificate is not valid for the host {host:?}")
            }
            other => format!("the server's certificate was rejected: {other:?}"),
        },
        Some(rustls::Error::AlertReceived(alert)) => alert_text(*alert),
        Some(rustls::Error::InvalidMessage(_))
        | Some(rustls::Error::InappropriateMessage { .. }) => {
            "the server does not speak TLS on this port: use http://, or check the port".into()
        }
        Some(other) => format!("TLS handshake failed: {other}"),
        // A plain-text etcd answers a ClientHello by closing the connection; whether the client
        // then reads an end of file or a reset (the server closed with our hello unread) depends
        // on timing: both are the same cause (a test saw the reset once, under load).
        None if matches!(
            e.kind(),
            std::io::ErrorKind::UnexpectedEof | std::io::ErrorKind::ConnectionReset
        ) =>
        {
            "the server closed the connection during the TLS handshake: it does not speak TLS on \
             this port (use http://), or it refused this client"
                .into()
        }
        None => format!("TLS handshake failed: {e}"),
    }
}

fn after_handshake(e: &std::io::Error) -> String {
    match rustls_error(e) {
        Some(rustls::Error::AlertReceived(alert)) => alert_text(*alert),
        _ => format!("the TLS connection failed right after the handshake: {e}"),
    }
}

/// A TLS alert from the server, read as the reason it refused us.
fn alert_text(alert: AlertDescription) -> String {
    match alert {
        AlertDescription::CertificateRequired => {
            "the server requires a client certificate (--cert and --key)".into()
        }
        AlertDescription::BadCertificate
        | AlertDescription::CertificateExpired
        | AlertDescription::CertificateRevoked
        | AlertDescription::CertificateUnknown
        | AlertDescription::UnsupportedCertificate
        | AlertDescription::UnknownCA
        | AlertDescription::AccessDenied => format!(
            "the server rejected the client certificate (--cert/--key: expired, or not signed \
             by a CA the server trusts): TLS alert {alert:?}"
        ),
        other => format!("the server aborted the TLS handshake: TLS alert {other:?}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A plain-text server closing on our hello reads as an end of file or as a reset, by timing:
    /// both name the same cause.
    #[test]
    fn eof_and_reset_in_the_handshake_both_say_the_server_does_not_speak_tls() {
        for kind in [std::io::ErrorKind::UnexpectedEof, std::io::ErrorKind::ConnectionReset] {
            let text = handshake_failure(&std::io::Error::from(kind), "127.0.0.1");
            assert!(text.contains("does not speak TLS"), "{kind:?}: {text}");
        }
        let other = handshake_failure(&std::io::Error::from(std::io::ErrorKind::TimedOut), "h");
        assert!(!other.contains("does not speak TLS"), "{other}");
    }

    /// A server that closes our handshake once and is then gone (a member being killed) is an
    /// outage, not "does not speak TLS"; one that closes every handshake (a plain-text etcd) is
    /// still named. Found by the secured chaos run: a client started during a kill exited with
    /// the TLS refusal.
    #[tokio::test]
    async fn a_close_in_the_handshake_is_named_only_when_a_second_probe_sees_it_again() {
        let config = crate::store::etcd::tls::permissive().expect("a TLS client config");
        let probe_of = |port: u16| {
            let target = Target::parse(&format!("https://127.0.0.1:{port}")).expect("target");
            let config = config.clone();
            async move { probe(&target, Some(&config), None, Duration::from_secs(5)).await }
        };
        // Closes every connection after reading the hello: what a plain-text server does.
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let port = listener.local_addr().expect("addr").port();
        let plain = tokio::spawn(async move {
            loop {
                let Ok((mut s, _)) = listener.accept().await else { return };
                let mut buf = [0u8; 512];
                let _ = s.read(&mut buf).await;
            }
        });
        match probe_of(port).await {
            Finding::Refused { detail, .. } => assert!(detail.contains("does not speak TLS")),
            other => panic!("a server closing every handshake must be named, got {other:?}"),
        }
        plain.abort();

        // Closes one connection, then stops listening: a member being killed.
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let port = listener.local_addr().expect("addr").port();
        let dying = tokio::spawn(async move {
            if let Ok((mut s, _)) = listener.accept().await {
                let mut buf = [0u8; 512];
                let _ = s.read(&mut buf).await;
            }
            drop(listener);
        });
        match probe_of(port).await {
            Finding::Unreachable { .. } => {}
            other => panic!("a member gone after one close is an outage, got {other:?}"),
        }
        let _ = dying.await;
    }
}
