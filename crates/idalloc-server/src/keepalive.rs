//! Finding peers that vanished without closing their connections (their host died, a cable was
//! pulled, a NAT forgot the flow): no FIN ever arrives, so without probes such a connection and
//! its watch slot stay taken until the idle timeout at best, and a watch stream, which is never
//! idle, for as long as the kernel keeps retrying unacknowledged writes (about 15 minutes).
//!
//! Two probes, one setting ([`crate::limits::Limits::keepalive`]): TCP keepalive on every
//! accepted socket (HTTP/1 and HTTP/2, plain and TLS), and HTTP/2 PING frames (which also cross
//! proxies that answer TCP keepalive themselves).

use std::time::Duration;

/// The TCP keepalive of one setting `every`: the first probe after `every` without traffic,
/// then one every third of it (at least 1 s), and the connection is dropped after
/// [`PROBES`] unanswered probes. So a vanished peer is found within [`give_up_after`].
pub fn tcp_params(every: Duration) -> socket2::TcpKeepalive {
    let ka = socket2::TcpKeepalive::new().with_time(every);
    #[cfg(any(
        target_os = "linux",
        target_os = "android",
        target_os = "macos",
        target_os = "freebsd"
    ))]
    let ka = ka.with_interval(probe_interval(every)).with_retries(PROBES);
    ka
}

/// Unanswered keepalive probes after which the kernel drops a connection.
pub const PROBES: u32 = 3;

/// The time between keepalive probes: a third of the setting, at least 1 s.
pub fn probe_interval(every: Duration) -> Duration {
    (every / 3).max(Duration::from_secs(1))
}

/// The longest a vanished peer's connection survives, idle or with writes unacknowledged:
/// `every` plus [`PROBES`] probe intervals. Also the socket's `TCP_USER_TIMEOUT` (Linux), which
/// ends a connection whose sent data stays unacknowledged this long (a watch stream to a dead
/// host is never idle, so keepalive alone would not probe it).
pub fn give_up_after(every: Duration) -> Duration {
    every + probe_interval(every) * PROBES
}

/// Sets the keepalive of `every` (none: nothing) on an accepted socket. Failing to set it is
/// not fatal to the connection: the caller logs it.
pub fn tune(tcp: &tokio::net::TcpStream, every: Option<Duration>) -> std::io::Result<()> {
    let Some(every) = every else { return Ok(()) };
    let sock = socket2::SockRef::from(tcp);
    sock.set_tcp_keepalive(&tcp_params(every))?;
    #[cfg(any(target_os = "linux", target_os = "android"))]
    sock.set_tcp_user_timeout(Some(give_up_after(every)))?;
    Ok(())
}

/// How long an HTTP/2 connection waits for the answer to its PING before it closes.
pub fn ping_timeout(every: Duration) -> Duration {
    probe_interval(every) * PROBES
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_vanished_peer_is_given_up_after_the_setting_and_three_probes() {
        let s = Duration::from_secs;
        assert_eq!(probe_interval(s(30)), s(10));
        assert_eq!(give_up_after(s(30)), s(60));
        assert_eq!(ping_timeout(s(30)), s(30));
        // Short settings keep a 1 s floor between probes.
        assert_eq!(probe_interval(s(2)), s(1));
        assert_eq!(give_up_after(s(2)), s(5));
    }

    /// The socket options as the kernel reports them on the server's side of an accepted
    /// connection (not the client's), read back with getsockopt.
    #[tokio::test]
    async fn an_accepted_socket_carries_the_keepalive_and_user_timeout() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("addr");
        let client = tokio::net::TcpStream::connect(addr).await.expect("connect");
        let (accepted, _) = listener.accept().await.expect("accept");
        let sock = socket2::SockRef::from(&accepted);
        assert!(!sock.keepalive().expect("SO_KEEPALIVE"), "off before tune");
        tune(&accepted, None).expect("none");
        assert!(!sock.keepalive().expect("SO_KEEPALIVE"), "none leaves it off");
        tune(&accepted, Some(Duration::from_secs(45))).expect("tune");
        assert!(sock.keepalive().expect("SO_KEEPALIVE"));
        #[cfg(target_os = "linux")]
        {
            assert_eq!(sock.tcp_keepalive_time().expect("TCP_KEEPIDLE"), Duration::from_secs(45));
            assert_eq!(
                sock.tcp_keepalive_interval().expect("TCP_KEEPINTVL"),
                Duration::from_secs(15)
            );
            assert_eq!(sock.tcp_keepalive_retries().expect("TCP_KEEPCNT"), PROBES);
            assert_eq!(
                sock.tcp_user_timeout().expect("TCP_USER_TIMEOUT"),
                Some(Duration::from_secs(90))
            );
        }
        drop(client);
    }
}
