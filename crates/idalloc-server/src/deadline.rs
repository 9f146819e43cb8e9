//! A total deadline on a request body.
//!
//! tower-http's `TimeoutBody` bounds the wait for each next piece of a body, so a client that
//! sends one byte every few seconds keeps its request (and its request slot, and its connection
//! busy, so never evicted as idle) for as long as it likes: a 1 MiB body at a byte per 5 s is
//! two months. [`DeadlineBody`] bounds the whole body instead: it must arrive within the deadline
//! of the request's head, however it is cut up. Past it, reading the body fails and the request
//! is refused (400 `invalid_input`, the message naming the deadline).

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use axum::body::Bytes;
use http_body::{Body, Frame, SizeHint};
use tokio::time::{Instant, Sleep};

/// The error a body past its deadline fails with (its `Display` names the deadline).
#[derive(Debug)]
pub struct BodyDeadline(pub Duration);

impl std::fmt::Display for BodyDeadline {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "the request body did not arrive whole within {:?} (--body-timeout, a deadline for \
             the whole body)",
            self.0
        )
    }
}

impl std::error::Error for BodyDeadline {}

/// `inner`, failing with [`BodyDeadline`] once `deadline` has passed since it was made.
pub struct DeadlineBody<B> {
    inner: B,
    sleep: Pin<Box<Sleep>>,
    deadline: Duration,
}

impl<B> DeadlineBody<B> {
    /// The deadline runs from now (the request's head has been read).
    pub fn new(inner: B, deadline: Duration) -> Self {
        let sleep = Box::pin(tokio::time::sleep_until(Instant::now() + deadline));
        DeadlineBody { inner, sleep, deadline }
    }
}

impl<B> Body for DeadlineBody<B>
where
    B: Body<Data = Bytes> + Unpin,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    type Data = Bytes;
    type Error = Box<dyn std::error::Error + Send + Sync>;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        let this = self.get_mut();
        if let Poll::Ready(frame) = Pin::new(&mut this.inner).poll_frame(cx) {
            return Poll::Ready(frame.map(|f| f.map_err(Into::into)));
        }
        match this.sleep.as_mut().poll(cx) {
            Poll::Ready(()) => Poll::Ready(Some(Err(Box::new(BodyDeadline(this.deadline))))),
            Poll::Pending => Poll::Pending,
        }
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use futures::StreamExt;
    use http_body_util::BodyExt;

    /// A body that sends a byte every 100 ms (each well within any per-piece timeout) fails at
    /// the deadline of the whole body, before its end.
    #[tokio::test(start_paused = true)]
    async fn a_trickled_body_fails_at_the_total_deadline() {
        let bytes = futures::stream::iter(0..1000).then(|_| async {
            tokio::time::sleep(Duration::from_millis(100)).await;
            Ok::<_, std::io::Error>(Frame::data(Bytes::from_static(b"x")))
        });
        let body = http_body_util::StreamBody::new(Box::pin(bytes));
        let mut body = DeadlineBody::new(body, Duration::from_secs(2));
        let mut got = 0;
        let err = loop {
            match body.frame().await {
                Some(Ok(_)) => got += 1,
                Some(Err(e)) => break e,
                None => panic!("the whole body arrived: {got} bytes"),
            }
        };
        assert!(err.to_string().contains("--body-timeout"), "{err}");
        assert!((15..=20).contains(&got), "{got} bytes before the deadline of 2 s at 10/s");

        // A body that arrives in time passes whole.
        let whole = http_body_util::Full::new(Bytes::from_static(b"abc"));
        let body = DeadlineBody::new(whole, Duration::from_secs(2));
        let got = body.collect().await.expect("in time").to_bytes();
        assert_eq!(&got[..], b"abc");
    }
}
