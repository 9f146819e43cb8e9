//! Which HTTP version a new connection speaks, decided without consuming a byte of it.
//!
//! hyper-util's auto (HTTP/1 + HTTP/2) builder reads the client's first bytes to look for the
//! 24-byte HTTP/2 preface and hands them back to hyper through a rewind buffer. hyper's first read
//! then returns those few bytes, and its next `reserve(8 KiB)` on a buffer still holding them
//! doubles the read buffer to 16 KiB, on every HTTP/1 connection for its whole life: with thousands
//! of idle watch streams that was a third of the memory per subscriber.
//!
//! Here the decision is made before hyper sees the connection, and hyper then gets the bare
//! stream and its HTTP/1 or HTTP/2 connection type alone:
//! - **plain TCP**: the first bytes are *peeked* (`MSG_PEEK`), so they stay in the kernel's buffer
//!   for hyper's own first read. Anything that is not a prefix of the preface is HTTP/1 as soon as
//!   one differing byte arrives (an HTTP/1 request line never starts with `PRI *`).
//! - **TLS**: the handshake already said it by ALPN: `h2` is HTTP/2, anything else (or no ALPN)
//!   HTTP/1, as browsers, curl and the usual client libraries expect.
//!
//! [`classify`] is the pure rule; [`Negotiate`] is the small trait both listeners' IO types
//! implement, so that `conn.rs` serves either without knowing which.

use std::future::Future;
use std::io;
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::TcpStream;
use tokio_rustls::server::TlsStream;

/// What a client sends first on an HTTP/2 connection with prior knowledge (RFC 9113 §3.4).
pub const H2_PREFACE: &[u8; 24] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

/// The HTTP version a connection speaks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Protocol {
    Http1,
    Http2,
}

/// What the first bytes of a connection say.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Sniffed {
    /// Decided.
    Is(Protocol),
    /// Every byte so far matches the HTTP/2 preface, which is not complete yet (or nothing came).
    NeedMore,
}

/// The protocol of a connection whose first bytes are `first` (as many as have arrived): HTTP/2
/// once the whole preface is there, HTTP/1 at the first byte that leaves it.
pub fn classify(first: &[u8]) -> Sniffed {
    let n = first.len().min(H2_PREFACE.len());
    if first[..n] != H2_PREFACE[..n] {
        Sniffed::Is(Protocol::Http1)
    } else if n == H2_PREFACE.len() {
        Sniffed::Is(Protocol::Http2)
    } else {
        Sniffed::NeedMore
    }
}

/// The waits between two peeks of a preface that arrived in pieces: 1 ms doubling up to 100 ms.
/// A peek returns at once while the bytes it saw are still unread, so waiting for *more* bytes
/// can only be done by waiting; real HTTP/2 clients send the preface in one write, so this path
/// is for odd or hostile clients only, and the caller bounds it by the header timeout.
pub fn next_wait(wait: Duration) -> Duration {
    (wait * 2).clamp(Duration::from_millis(1), Duration::from_millis(100))
}

/// A listener's IO type that can say its protocol before hyper reads from it.
pub trait Negotiate: AsyncRead + AsyncWrite + Unpin + Send + 'static {
    /// The connection's protocol, without consuming any of its bytes; `None` when the client
    /// closed before its first bytes said. May wait for the client: bound it by a timeout.
    fn protocol(&self) -> impl Future<Output = io::Result<Option<Protocol>>> + Send;
}

impl Negotiate for TcpStream {
    async fn protocol(&self) -> io::Result<Option<Protocol>> {
        let mut first = [0u8; H2_PREFACE.len()];
        let mut wait = Duration::ZERO;
        loop {
            let n = self.peek(&mut first).await?;
            if n == 0 {
                return Ok(None);
            }
            match classify(&first[..n]) {
                Sniffed::Is(p) => return Ok(Some(p)),
                Sniffed::NeedMore => {
                    wait = next_wait(wait);
                    tokio::time::sleep(wait).await;
                }
            }
        }
    }
}

impl Negotiate for TlsStream<TcpStream> {
    async fn protocol(&self) -> io::Result<Option<Protocol>> {
        Ok(Some(match self.get_ref().1.alpn_protocol() {
            Some(b"h2") => Protocol::Http2,
            _ => Protocol::Http1,
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_whole_preface_is_http2_and_any_other_byte_http1() {
        assert_eq!(classify(H2_PREFACE), Sniffed::Is(Protocol::Http2));
        let mut longer = H2_PREFACE.to_vec();
        longer.extend_from_slice(b"\x00\x00\x12\x04");
        assert_eq!(classify(&longer), Sniffed::Is(Protocol::Http2));
        for request in [&b"GET / HTTP/1.1\r\n"[..], b"POST /v1/pools", b"G", b"PUT", b"PRI / "] {
            assert_eq!(classify(request), Sniffed::Is(Protocol::Http1), "{request:?}");
        }
        // One byte off at the very end.
        let mut off = *H2_PREFACE;
        off[23] = b'x';
        assert_eq!(classify(&off), Sniffed::Is(Protocol::Http1));
    }

    #[test]
    fn a_partial_preface_or_nothing_needs_more() {
        for n in 0..H2_PREFACE.len() {
            assert_eq!(classify(&H2_PREFACE[..n]), Sniffed::NeedMore, "{n} bytes");
        }
    }

    #[test]
    fn waits_between_peeks_double_from_1_ms_to_100_ms() {
        let mut w = Duration::ZERO;
        let mut seen = Vec::new();
        for _ in 0..10 {
            w = next_wait(w);
            seen.push(w.as_millis());
        }
        assert_eq!(seen, [1, 2, 4, 8, 16, 32, 64, 100, 100, 100]);
    }

    /// Real sockets: the peeked bytes are still there for the reader that comes after, and a
    /// preface sent in two pieces is recognised once the second arrives.
    #[tokio::test]
    async fn peeking_consumes_nothing_and_waits_for_a_split_preface() {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("addr");

        let mut c = TcpStream::connect(addr).await.expect("connect");
        let (s, _) = listener.accept().await.expect("accept");
        c.write_all(b"GET / HTTP/1.1\r\n\r\n").await.expect("write");
        assert_eq!(s.protocol().await.expect("peek"), Some(Protocol::Http1));
        let mut s = s;
        let mut got = [0u8; 18];
        s.read_exact(&mut got).await.expect("read");
        assert_eq!(&got, b"GET / HTTP/1.1\r\n\r\n");

        let mut c2 = TcpStream::connect(addr).await.expect("connect");
        let (s2, _) = listener.accept().await.expect("accept");
        c2.write_all(&H2_PREFACE[..10]).await.expect("write");
        let sniff = tokio::spawn(async move { (s2.protocol().await, s2) });
        tokio::time::sleep(Duration::from_millis(50)).await;
        c2.write_all(&H2_PREFACE[10..]).await.expect("write");
        let (p, mut s2) = sniff.await.expect("task");
        assert_eq!(p.expect("peek"), Some(Protocol::Http2));
        let mut got = [0u8; 24];
        s2.read_exact(&mut got).await.expect("read");
        assert_eq!(&got, H2_PREFACE);

        let c3 = TcpStream::connect(addr).await.expect("connect");
        let (s3, _) = listener.accept().await.expect("accept");
        drop(c3);
        assert_eq!(s3.protocol().await.expect("peek"), None, "closed before a byte");
        drop(c);
    }
}
