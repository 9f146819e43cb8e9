//! A [`Store`] wrapper that injects faults, reproducibly from a seed.
//!
//! The allocator must keep its guarantees (DESIGN.md §2) on an unreliable store: requests that
//! never arrive, responses lost after the store committed, slow answers, failing keep-alives,
//! and partitions. [`FaultStore`] produces exactly those, deciding each request's fate from a
//! seeded PRNG so that a failing simulation seed replays the same faults. Delays use
//! `tokio::time::sleep`, so paused-time tests stay instantaneous and deterministic.
//!
//! Each request draws the same number of random values whatever its kind and fate, so the
//! decisions depend only on the seed and the order of requests.

use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use futures::StreamExt;
use tokio::sync::watch;

use idalloc::store::{Store, StoreError, StoreResult, WatchStream};

use crate::hooked::{send, Answer, Hook, HookedStore, Kind, Request, Response};

/// Probabilities (each in `0.0..=1.0`) of each fault, per request.
#[derive(Clone, Debug, PartialEq)]
pub struct FaultConfig {
    /// Delay the request by a uniform random time in `0..=max_delay` before sending it.
    pub delay: f64,
    /// The longest injected delay.
    pub max_delay: Duration,
    /// Fail with `Unavailable` without sending: the store is untouched.
    pub fail_before_send: f64,
    /// Send the request (it takes effect), then fail with `Unavailable` as if the response was
    /// lost: the case that forces callers to be idempotent.
    pub lose_response: f64,
    /// Additionally fail keep-alives (before sending) with this probability, to exercise session
    /// lease loss.
    pub fail_keep_alive: f64,
}

impl Default for FaultConfig {
    /// No faults at all (`max_delay` 100 ms, in case `delay` is raised later).
    fn default() -> Self {
        FaultConfig {
            delay: 0.0,
            max_delay: Duration::from_millis(100),
            fail_before_send: 0.0,
            lose_response: 0.0,
            fail_keep_alive: 0.0,
        }
    }
}

impl FaultConfig {
    /// Checks every probability is in `0.0..=1.0`.
    pub fn validate(&self) -> StoreResult<()> {
        for (name, p) in [
            ("delay", self.delay),
            ("fail_before_send", self.fail_before_send),
            ("lose_response", self.lose_response),
            ("fail_keep_alive", self.fail_keep_alive),
        ] {
            if !(0.0..=1.0).contains(&p) {
                return Err(StoreError::InvalidRequest(format!(
                    "fault probability {name} = {p} is outside 0.0..=1.0"
                )));
            }
        }
        Ok(())
    }
}

/// splitmix64: tiny, fast, good enough to decide faults, and no dependency.
#[derive(Clone, Debug)]
struct SplitMix64(u64);

impl SplitMix64 {
    fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in `[0, 1)`.
    fn next_f64(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }
}

struct State {
    rng: SplitMix64,
    config: FaultConfig,
    fail_next: u64,
}

/// What happens to one request.
struct Fate {
    delay: Duration,
    fail_before_send: bool,
    lose_response: bool,
}

/// The [`Hook`] of a [`FaultStore`]: the seeded PRNG, the fault probabilities and the partition
/// switch.
pub struct Faults {
    state: Mutex<State>,
    partitioned: watch::Sender<bool>,
}

/// Wraps a store and injects faults (see the module docs). Besides the random faults of its
/// [`FaultConfig`], tests can force failures with [`FaultStore::fail_next`] and cut the store
/// off with [`FaultStore::partition`].
pub type FaultStore<S> = HookedStore<S, Faults>;

impl<S: Store> FaultStore<S> {
    /// Wraps `inner`; faults follow `config`, decided by a PRNG seeded with `seed`. Fails with
    /// `InvalidRequest` if a probability is outside `0.0..=1.0`.
    pub fn new(inner: S, seed: u64, config: FaultConfig) -> StoreResult<Self> {
        config.validate()?;
        let (partitioned, _) = watch::channel(false);
        Ok(HookedStore::with_hook(
            inner,
            Faults {
                state: Mutex::new(State { rng: SplitMix64(seed), config, fail_next: 0 }),
                partitioned,
            },
        ))
    }

    /// Replaces the fault probabilities (the PRNG continues its sequence).
    pub fn set_config(&self, config: FaultConfig) -> StoreResult<()> {
        config.validate()?;
        self.hook().lock().config = config;
        Ok(())
    }

    /// The next `n` requests fail with `Unavailable` before being sent (on top of random
    /// faults).
    pub fn fail_next(&self, n: u64) {
        self.hook().lock().fail_next = n;
    }

    /// While on, every request fails with `Unavailable` (not sent) and every open watch stream
    /// breaks with `Err(Unavailable)`. A request already sent when the partition starts takes
    /// effect but its response is lost.
    pub fn partition(&self, on: bool) {
        self.hook().partitioned.send_replace(on);
    }
}

impl Faults {
    fn lock(&self) -> MutexGuard<'_, State> {
        // The state is a PRNG and counters: always consistent, even after a panic elsewhere.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn is_partitioned(&self) -> bool {
        *self.partitioned.borrow()
    }

    fn fate(&self, keep_alive: bool) -> StoreResult<Fate> {
        if self.is_partitioned() {
            return Err(StoreError::Unavailable("injected fault: store partitioned".into()));
        }
        let mut st = self.lock();
        // Always five draws, so later decisions do not depend on this request's kind or fate.
        let (d, dv, f, l, k) = (
            st.rng.next_f64(),
            st.rng.next_f64(),
            st.rng.next_f64(),
            st.rng.next_f64(),
            st.rng.next_f64(),
        );
        if st.fail_next > 0 {
            st.fail_next -= 1;
            return Err(StoreError::Unavailable("injected fault: fail_next".into()));
        }
        let c = &st.config;
        let delay = if d < c.delay { c.max_delay.mul_f64(dv) } else { Duration::ZERO };
        Ok(Fate {
            delay,
            fail_before_send: f < c.fail_before_send || (keep_alive && k < c.fail_keep_alive),
            lose_response: l < c.lose_response,
        })
    }

    /// Ends `stream` with `Err(Unavailable)` as soon as a partition starts.
    fn breakable(&self, stream: WatchStream) -> WatchStream {
        let rx = self.partitioned.subscribe();
        futures::stream::unfold(Some((stream, rx)), |state| async move {
            let (mut stream, mut rx) = state?;
            let cut = async {
                if rx.wait_for(|on| *on).await.is_err() {
                    // The FaultStore is gone: no partition can start any more.
                    std::future::pending::<()>().await;
                }
            };
            tokio::select! {
                biased;
                _ = cut => Some((
                    Err(StoreError::Unavailable("injected fault: partition broke the watch".into())),
                    None,
                )),
                item = stream.next() => item.map(|m| (m, Some((stream, rx)))),
            }
        })
        .boxed()
    }
}

#[async_trait::async_trait]
impl<S: Store> Hook<S> for Faults {
    /// One decision per request, drawn before it is sent, covers both sides: whether it is sent
    /// at all, and whether its answer is lost.
    async fn call(&self, inner: &Arc<S>, req: Request) -> Answer {
        let fate = self.fate(req.kind() == Kind::LeaseKeepAlive)?;
        if !fate.delay.is_zero() {
            tokio::time::sleep(fate.delay).await;
        }
        if fate.fail_before_send || self.is_partitioned() {
            return Err(StoreError::Unavailable("injected fault: request not sent".into()));
        }
        let result = send(&**inner, req).await;
        if fate.lose_response || self.is_partitioned() {
            return Err(StoreError::Unavailable("injected fault: response lost".into()));
        }
        match result {
            Ok(Response::Watch(stream)) => Ok(Response::Watch(self.breakable(stream))),
            other => other,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use idalloc::store::embedded::EmbeddedStore;
    use idalloc::store::{GetRequest, KeyRange, Revision, TxnOp, TxnRequest, WatchMessage};

    fn put(k: &str) -> TxnRequest {
        TxnRequest::new().and_then([TxnOp::put(k, "v")])
    }

    fn faulty(seed: u64, config: FaultConfig) -> FaultStore<EmbeddedStore> {
        FaultStore::new(EmbeddedStore::memory(), seed, config).unwrap()
    }

    async fn rev(s: &impl Store) -> Revision {
        s.get(GetRequest::key("x")).await.unwrap().revision
    }

    fn unavailable<T: std::fmt::Debug>(r: StoreResult<T>) -> bool {
        matches!(r, Err(StoreError::Unavailable(_)))
    }

    #[tokio::test]
    async fn no_faults_by_default() {
        let s = faulty(1, FaultConfig::default());
        for i in 0..50 {
            s.txn(put(&format!("k{i}"))).await.unwrap();
        }
        assert_eq!(rev(s.inner()).await, 51);
    }

    #[tokio::test]
    async fn fail_before_send_leaves_the_store_untouched() {
        let s = faulty(1, FaultConfig { fail_before_send: 1.0, ..Default::default() });
        assert!(unavailable(s.txn(put("a")).await));
        assert!(unavailable(s.lease_grant(10).await));
        assert_eq!(rev(s.inner()).await, 1);
        assert_eq!(s.inner().lease_revoke(1).await, Ok(false), "no lease was granted");
    }

    #[tokio::test]
    async fn lose_response_applies_the_request_but_reports_unavailable() {
        let s = faulty(1, FaultConfig { lose_response: 1.0, ..Default::default() });
        assert!(unavailable(s.txn(put("a")).await));
        let r = s.inner().get(GetRequest::key("a")).await.unwrap();
        assert_eq!((r.count, r.revision), (1, 2), "the write happened");
    }

    #[tokio::test]
    async fn fail_keep_alive_fails_only_keep_alives() {
        let s = faulty(1, FaultConfig { fail_keep_alive: 1.0, ..Default::default() });
        let l = s.lease_grant(10).await.unwrap();
        assert!(unavailable(s.lease_keep_alive(l.id).await));
        s.txn(put("a")).await.unwrap();
        assert_eq!(s.inner().lease_keep_alive(l.id).await, Ok(Some(10)), "lease itself is fine");
    }

    #[tokio::test(start_paused = true)]
    async fn delay_waits_on_tokio_clock_within_max_delay() {
        let max = Duration::from_secs(5);
        let s = faulty(7, FaultConfig { delay: 1.0, max_delay: max, ..Default::default() });
        let mut delayed = 0;
        for i in 0..20 {
            let start = tokio::time::Instant::now();
            s.txn(put(&format!("k{i}"))).await.unwrap();
            let took = start.elapsed();
            assert!(took <= max, "delay {took:?} over max");
            if took > Duration::ZERO {
                delayed += 1;
            }
        }
        assert!(delayed >= 19, "almost every request is delayed (got {delayed})");
        assert_eq!(rev(s.inner()).await, 21, "delayed requests still apply");
    }

    #[tokio::test]
    async fn fail_next_fails_exactly_n_requests() {
        let s = faulty(1, FaultConfig::default());
        s.fail_next(2);
        assert!(unavailable(s.txn(put("a")).await));
        assert!(unavailable(s.get(GetRequest::key("a")).await));
        s.txn(put("b")).await.unwrap();
        assert_eq!(rev(s.inner()).await, 2, "only the third request reached the store");
    }

    #[tokio::test]
    async fn partition_fails_requests_and_breaks_watches_until_healed() {
        let s = faulty(1, FaultConfig::default());
        let mut w = s.watch(KeyRange::prefix("p/"), 0).await.unwrap();
        s.txn(put("p/a")).await.unwrap();
        assert!(matches!(w.next().await, Some(Ok(WatchMessage::Events(e))) if e.len() == 1));
        s.partition(true);
        assert!(matches!(w.next().await, Some(Err(StoreError::Unavailable(_)))));
        assert!(w.next().await.is_none(), "broken stream ends");
        assert!(unavailable(s.txn(put("p/b")).await));
        assert!(unavailable(s.watch(KeyRange::prefix("p/"), 0).await.map(|_| ())));
        assert_eq!(rev(s.inner()).await, 2);
        s.partition(false);
        s.txn(put("p/b")).await.unwrap();
        let mut w = s.watch(KeyRange::prefix("p/"), 2).await.unwrap();
        assert!(matches!(w.next().await, Some(Ok(WatchMessage::Events(e))) if e.len() == 2));
    }

    #[tokio::test]
    async fn same_seed_same_faults_different_seed_different_faults() {
        let config =
            FaultConfig { fail_before_send: 0.3, lose_response: 0.3, ..Default::default() };
        async fn outcomes(seed: u64, config: FaultConfig) -> Vec<bool> {
            let s = faulty(seed, config);
            let mut out = Vec::new();
            for i in 0..64 {
                out.push(s.txn(put(&format!("k{i}"))).await.is_ok());
            }
            out
        }
        let a = outcomes(42, config.clone()).await;
        assert_eq!(a, outcomes(42, config.clone()).await);
        assert_ne!(a, outcomes(43, config).await);
        assert!(a.iter().any(|ok| *ok) && a.iter().any(|ok| !*ok));
    }

    #[test]
    fn probabilities_outside_unit_interval_are_rejected() {
        let bad = FaultConfig { lose_response: 1.5, ..Default::default() };
        let err = FaultStore::new(EmbeddedStore::memory(), 1, bad.clone()).err();
        assert!(
            matches!(err, Some(StoreError::InvalidRequest(m)) if m.contains("lose_response = 1.5"))
        );
        let s = faulty(1, FaultConfig::default());
        assert!(s.set_config(FaultConfig { delay: f64::NAN, ..Default::default() }).is_err());
        assert!(s.set_config(bad).is_err());
    }
}
