//! The task that keeps a pool's [`View`] following the service's watch stream, across failures
//! and replicas: one stream per pool per client, however many [`crate::Pool`] handles share it.
//!
//! It resumes with `Last-Event-ID` (the last revision the view has all of) on the endpoint that
//! answers, so a failover to another replica loses and repeats nothing when that replica's
//! history reaches back that far; when it does not (410 `gone`: the replica is new, or this
//! client was away too long) it lists afresh, and the view swaps the listing in with only the
//! differences as events (`view.rs`). A stream ended by the service for lagging resumes from the
//! revision it names. A stream that brings no byte for `watch_idle_timeout` (the service sends a
//! comment every 15 s) is taken as dead: a replica that vanished without closing its connections.
//!
//! **Re-subscribing after a stream broke waits a random time in `[0, backoff_base]`**
//! (`resubscribe_delay`), and so does a fresh listing asked for by the service. A replica that
//! dies breaks every agent's stream on it at the same instant; without the wait every one of them
//! opened its stream on the next replica in that same instant (the transport tries each endpoint
//! once without waiting), and a replica whose history does not reach back answers each with a
//! whole snapshot. The view keeps answering meanwhile and the stream resumes
//! where it was, so the wait costs freshness, not events.
//!
//! Only weak references: the task ends once every handle on the pool is dropped.

use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use futures::{Stream, StreamExt};
use idalloc::Event;
use reqwest::Method;
use sse_stream::SseByteStream;
use tokio::sync::{broadcast, watch};
use tracing::{debug, warn};

use crate::options::ClientOptions;
use crate::transport::{delay, describe, encode_segment, steps, Transport};
use crate::view::{parse, Msg, View};

/// What the handles of one pool share with its watch task.
pub(crate) struct Feed {
    pub view: Mutex<View>,
    pub events: broadcast::Sender<Event>,
    pub synced: watch::Sender<bool>,
}

impl Feed {
    pub fn new(buffer: usize) -> Feed {
        Feed {
            view: Mutex::new(View::default()),
            events: broadcast::channel(buffer.max(1)).0,
            synced: watch::channel(false).0,
        }
    }

    pub fn view(&self) -> std::sync::MutexGuard<'_, View> {
        self.view.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// How a stream ended.
enum End {
    /// The transport failed or the stream ended: the next attempt goes to the next endpoint.
    /// `streamed`: the stream had opened (so the backoff starts over).
    Failed { why: String, streamed: bool },
    /// The service asked for a fresh listing (410, or the pool was deleted or re-created).
    Relist,
    /// The service ended the stream for lagging; resume from where the view is.
    Resume,
    /// Every handle is gone.
    Stop,
}

/// The wait before the next stream. `attempt`: streams that failed to open since the last one
/// that opened, 0 when an open stream just broke (or the service asked for a fresh listing):
/// then anywhere in `[0, backoff_base]` (the module docs say why); after failed opens the
/// transport's schedule ([`delay`]: the other endpoints at once, then full-jitter backoff).
/// `unit` is a uniform draw in `[0, 1]`. Pure, so the schedule is tested without sleeping.
pub(crate) fn resubscribe_delay(
    opts: &ClientOptions,
    attempt: u32,
    endpoints: usize,
    unit: f64,
) -> Duration {
    if attempt == 0 {
        steps(opts).wait(0, unit)
    } else {
        delay(opts, attempt, endpoints, None, unit)
    }
}

/// Follows pool `pool` until `feed` is dropped.
pub(crate) async fn follow(t: Arc<Transport>, pool: String, feed: Weak<Feed>) {
    let path = format!("/v1/pools/{}/watch", encode_segment(&pool, false));
    let mut attempt: u32 = 0;
    loop {
        let Some(f) = feed.upgrade() else { return };
        let resume = f.view().resume_from();
        f.view().opening(resume.is_some());
        drop(f);
        let i = t.current();
        let end = stream_once(&t, i, &path, resume, &feed).await;
        let wait = match end {
            End::Stop => return,
            End::Relist => {
                if let Some(f) = feed.upgrade() {
                    f.view().forget_revision();
                }
                attempt = 0;
                resubscribe_delay(&t.opts, 0, t.endpoints.len(), rand::random::<f64>())
            }
            End::Resume => {
                attempt = 0;
                Duration::ZERO
            }
            End::Failed { why, streamed } => {
                debug!(pool, endpoint = %t.endpoints[i], why, "watch stream failed, failing over");
                attempt = if streamed { 0 } else { attempt.saturating_add(1) };
                t.advance(i);
                resubscribe_delay(&t.opts, attempt, t.endpoints.len(), rand::random::<f64>())
            }
        };
        if !wait.is_zero() {
            tokio::time::sleep(wait).await;
        }
    }
}

/// One watch stream on endpoint `i`, until it ends.
async fn stream_once(
    t: &Transport,
    i: usize,
    path: &str,
    resume: Option<i64>,
    feed: &Weak<Feed>,
) -> End {
    let mut rb = t.request(i, Method::GET, path).header("accept", "text/event-stream");
    if let Some(r) = resume {
        rb = rb.header("last-event-id", r.to_string());
    }
    let resp = match tokio::time::timeout(t.opts.request_timeout, rb.send()).await {
        Err(_) => return failed("no answer within the request timeout".into(), false),
        Ok(Err(e)) => return failed(describe(&e), false),
        Ok(Ok(r)) => r,
    };
    match resp.status().as_u16() {
        200 => {}
        410 => return End::Relist,
        s => {
            let body = resp.text().await.unwrap_or_default();
            if s != 503 {
                warn!(status = s, body, "watch refused");
            }
            return failed(format!("HTTP {s}: {body}"), false);
        }
    }
    let bytes = Box::pin(resp.bytes_stream());
    let mut events = SseByteStream::new(Box::pin(idle_limited(bytes, t.opts.watch_idle_timeout)));
    loop {
        let ev = match events.next().await {
            None => return failed("the stream ended".into(), true),
            Some(Err(e)) => return failed(e.to_string(), true),
            Some(Ok(ev)) => ev,
        };
        // An event without a name is a `message` (the SSE default), which this client ignores.
        let (name, data) = (ev.event.as_deref().unwrap_or("message"), ev.data.as_deref());
        let msg = match parse(name, data.unwrap_or_default()) {
            Ok(m) => m,
            Err(e) => {
                warn!(error = e, "unreadable watch event; re-opening the stream");
                return failed(e, true);
            }
        };
        let Some(f) = feed.upgrade() else { return End::Stop };
        let end = match msg {
            Msg::Gone => Some(End::Relist),
            Msg::Lagged { .. } => Some(End::Resume),
            _ => None,
        };
        let published = f.view().apply(msg, ev.id.as_deref().unwrap_or_default());
        for e in published {
            if matches!(e, Event::Synced) {
                f.synced.send_replace(true);
            }
            // No subscriber is not an error.
            let _ = f.events.send(e);
        }
        if let Some(end) = end {
            return end;
        }
    }
}

fn failed(why: String, streamed: bool) -> End {
    End::Failed { why, streamed }
}

/// An error of the byte stream: the transport's, or silence for too long.
#[derive(Debug)]
enum StreamError {
    Transport(String),
    Idle(Duration),
}

impl std::error::Error for StreamError {}

impl std::fmt::Display for StreamError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            StreamError::Transport(e) => f.write_str(e),
            StreamError::Idle(d) => write!(f, "nothing received for {d:?}"),
        }
    }
}

/// `bytes`, ending with an error once no chunk arrives for `idle`.
fn idle_limited(
    bytes: impl Stream<Item = reqwest::Result<bytes::Bytes>> + Unpin,
    idle: Duration,
) -> impl Stream<Item = Result<bytes::Bytes, StreamError>> {
    futures::stream::unfold((bytes, false), move |(mut s, done)| async move {
        if done {
            return None;
        }
        match tokio::time::timeout(idle, s.next()).await {
            Err(_) => Some((Err(StreamError::Idle(idle)), (s, true))),
            Ok(None) => None,
            Ok(Some(Err(e))) => Some((Err(StreamError::Transport(describe(&e))), (s, true))),
            Ok(Some(Ok(b))) => Some((Ok(b), (s, false))),
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn opts() -> ClientOptions {
        ClientOptions {
            backoff_base: Duration::from_millis(100),
            backoff_max: Duration::from_secs(2),
            ..ClientOptions::default()
        }
    }

    /// A stream that broke (every agent of a dead replica at once) waits a
    /// random time of up to the first step before it re-subscribes; before, attempt 1 of 2
    /// endpoints waited nothing at all, so every agent arrived at the other replica together.
    #[test]
    fn a_broken_stream_resubscribes_after_a_random_wait_of_up_to_the_first_step() {
        let o = opts();
        assert_eq!(resubscribe_delay(&o, 0, 2, 0.0), Duration::ZERO);
        assert_eq!(resubscribe_delay(&o, 0, 2, 0.5), Duration::from_millis(50));
        assert_eq!(resubscribe_delay(&o, 0, 2, 1.0), Duration::from_millis(100));
        assert_eq!(resubscribe_delay(&o, 0, 1, 1.0), Duration::from_millis(100), "one endpoint");
    }

    /// A stream that could not be opened moves on to the next endpoint at once, then backs off
    /// with full jitter once every endpoint failed (the transport's schedule).
    #[test]
    fn failed_opens_follow_the_transports_schedule() {
        let o = opts();
        assert_eq!(resubscribe_delay(&o, 1, 2, 0.9), Duration::ZERO, "the other replica at once");
        assert_eq!(resubscribe_delay(&o, 2, 2, 1.0), Duration::from_millis(100));
        assert_eq!(resubscribe_delay(&o, 2, 2, 0.0), Duration::ZERO, "full jitter");
        assert_eq!(resubscribe_delay(&o, 40, 2, 1.0), Duration::from_secs(2), "capped");
    }
}
