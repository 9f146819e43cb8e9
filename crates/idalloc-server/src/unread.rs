//! `Connection: close` on answers given before the request body was read.
//!
//! Refusals (401, 403, 413, 404, 405) are answered without reading the body. hyper then reads
//! once more, and if the rest of the body has not arrived yet it closes the connection after the
//! answer, without saying so in the answer. A client that keeps connections alive (ureq, Python's
//! `http.client`, every HTTP library with a pool) puts the connection back and its next request
//! fails with "peer disconnected". The secured-service test saw this in 2 of 14 whole-suite runs
//! under load. Saying `Connection: close` whenever the body was left unread lets the client open a
//! new connection instead. HTTP/2 has no such header (hyper strips it) and needs none: a stream
//! is reset, never the connection.

use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};

use axum::body::{Body, Bytes, HttpBody};
use axum::extract::Request;
use axum::http::{header, HeaderValue};
use axum::middleware::Next;
use axum::response::Response;
use http_body::{Frame, SizeHint};

/// The middleware: see the module docs.
pub async fn close_if_body_unread(req: Request, next: Next) -> Response {
    let (parts, body) = req.into_parts();
    if body.is_end_stream() {
        return next.run(Request::from_parts(parts, body)).await;
    }
    let read = Arc::new(AtomicBool::new(false));
    let body = Body::new(Tracked { inner: body, read: Arc::clone(&read) });
    let mut resp = next.run(Request::from_parts(parts, body)).await;
    if !read.load(Ordering::Acquire) {
        resp.headers_mut().insert(header::CONNECTION, HeaderValue::from_static("close"));
    }
    resp
}

/// A request body that notes when it has been read to its end.
struct Tracked {
    inner: Body,
    read: Arc<AtomicBool>,
}

impl HttpBody for Tracked {
    type Data = Bytes;
    type Error = axum::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, axum::Error>>> {
        let polled = Pin::new(&mut self.inner).poll_frame(cx);
        if matches!(polled, Poll::Ready(None)) || self.inner.is_end_stream() {
            self.read.store(true, Ordering::Release);
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}
