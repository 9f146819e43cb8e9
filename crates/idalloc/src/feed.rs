//! Following one key range of a store (DESIGN §6): list it at one revision, watch from the next,
//! resume from the last seen revision when the stream breaks, re-list when that revision was
//! compacted away (or when asked to). The one watch loop of the crate: the local pool's cache
//! (`sync.rs`) and every remote view (`remote.rs`) are fed by it.
//!
//! The loop knows nothing about pools or caches. It hands what it reads to a [`Sink`] — a complete
//! listing, or a batch of watch events — and tells it when the store could not be reached. What a
//! listing or an event means (diffing it against a view, validating it, repairing held keys) is
//! the sink's business, so that part stays plain code that tests can drive without a store.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use tokio::sync::Notify;
use tracing::{debug, warn};

use crate::backoff::{Backoff, FullJitter};
use crate::store::{
    GetRequest, KeyRange, KeyValue, Pages, Revision, Store, StoreError, StoreResult, WatchEvent,
    WatchMessage,
};

/// Waits between retries of a page, a watch or a probe: full jitter from 50 ms, doubling to 2 s
/// (`backoff.rs`; the same steps as the old plain doubling, which had no jitter and made every
/// follower that failed at one instant retry at the same instants).
const RECONNECT: FullJitter =
    FullJitter { base: Duration::from_millis(50), cap: Duration::from_secs(2) };

/// The sink is gone (its owner was dropped): the follower stops.
#[derive(Debug)]
pub(crate) struct Gone;

/// What a follower feeds. Every call returns `Err(Gone)` once the owner of the view is gone.
pub(crate) trait Sink: Send + Sync + 'static {
    /// The store revision the view reflects; the watch resumes right after it.
    fn revision(&self) -> Result<Revision, Gone>;

    /// A page of a listing was read (listings of big ranges take a while: this tells progress
    /// from a hang). Counts pages, never resets: a failing retry must not look like progress.
    fn list_page(&self) {}

    /// What a listing builds while its pages arrive (a listing of 1M records is
    /// applied as it is read, never held whole as `KeyValue`s by a sink that can do better).
    type Listing: Send;

    /// A listing starts; the range holds about `records` records.
    fn begin_listing(&self, records: usize) -> Self::Listing;

    /// The next records of the listing, in key order. Called between `begin_listing` and
    /// `listed`, each record once: a page that fails is read again and the listing goes on from
    /// there (same revision, so the pages already applied stay valid); only a listing whose
    /// revision was compacted meanwhile is dropped and started again at a new revision.
    fn listing_page(&self, listing: &mut Self::Listing, kvs: Vec<KeyValue>);

    /// Every page of a listing is in; [`Sink::listed`] comes next. Applying a big listing is
    /// local work that takes a while (and cannot hang on the store): whoever waits for the view
    /// must not take that time for a stalled listing.
    fn applying(&self) {}

    /// The listing is complete, at `revision`: the view becomes exactly this.
    fn listed(&self, listing: Self::Listing, revision: Revision) -> Result<(), Gone>;

    /// Watch events, in store order, all after the view's revision.
    fn watched(&self, events: &[WatchEvent]) -> Result<(), Gone>;

    /// The store could not be reached (a listing, a watch or a probe failed, or the stream
    /// broke). The follower keeps retrying with back-off.
    fn unreachable(&self, _error: &StoreError) {}
}

/// A request to re-list, shared between a follower and whoever may ask for one.
#[derive(Debug, Default)]
pub(crate) struct Relist {
    forced: AtomicBool,
    notify: Notify,
}

impl Relist {
    /// Re-list at the next opportunity (interrupts a running watch).
    pub(crate) fn request(&self) {
        self.forced.store(true, Ordering::Release);
        self.notify.notify_one();
    }
}

/// How a follower reads its range.
#[derive(Clone)]
pub(crate) struct FeedConfig {
    pub store: Arc<dyn Store>,
    pub range: KeyRange,
    /// Keys per page when listing.
    pub page: i64,
    /// Re-list (rather than resume the watch) after the store was unreachable, so the view's
    /// catching up is one exact difference and one `Synced`.
    pub relist_after_outage: bool,
    /// While watching, check every this long that the store still answers. A paused server
    /// (SIGSTOP, a hung VM) keeps its TCP connections open and sends nothing, so a watch alone
    /// cannot tell it from a quiet one.
    pub probe: Option<Duration>,
    /// Bound on each page of a listing, each watch creation and each probe (`None`: the store's
    /// own bounds only).
    pub request_timeout: Option<Duration>,
    /// Seed of the retry waits' jitter: drawn from a seeded allocator's generator so that a
    /// simulation seed replays the same waits, from the OS otherwise (`backoff.rs`).
    pub jitter_seed: u64,
}

/// What a failed page of a listing leaves of it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum AfterFailedPage {
    /// Read the same page again and go on: the pages applied so far are of the listing's
    /// revision, which the store still has.
    Resume,
    /// The listing's revision was compacted away: its pages cannot be completed at it. Drop
    /// them and list again from the first page at a new revision.
    Restart,
}

/// A listing that failed at page k used to start again at page 1, so a storm
/// that times out pages (100 agents listing behind each other) read every page before k again
/// and again (etcd sent 371 MB for 200 MB of listings). Every page is read at the listing's one
/// revision, so what was applied stays right as long as that revision is readable.
fn after_failed_page(error: &StoreError) -> AfterFailedPage {
    match error {
        StoreError::Compacted { .. } => AfterFailedPage::Restart,
        _ => AfterFailedPage::Resume,
    }
}

async fn bounded<T>(
    timeout: Option<Duration>,
    fut: impl std::future::Future<Output = StoreResult<T>>,
) -> StoreResult<T> {
    match timeout {
        None => fut.await,
        Some(t) => match tokio::time::timeout(t, fut).await {
            Ok(r) => r,
            Err(_) => Err(StoreError::Unavailable(format!("no answer within {t:?}"))),
        },
    }
}

/// Lists `range` at one revision with the crate's one paging scheme ([`Pages`]: windows sized
/// from the keys read so far, `store/window.rs`), so a listing of n records costs O(n) on every
/// store. This used to split big prefix ranges at decimal digits after the prefix, a second
/// scheme for the same job that only fitted decimal IDs and still counted 3.6 records per record
/// returned at 10k and 7.7 at 200k.
///
/// `timeout` bounds each page, not the listing: a listing of a million records takes many
/// pages, and what tells a hung store from a big range is a page that does not come.
///
/// The records go to `on_records` page by page as they are read, in key order (the second
/// argument, a size hint for the whole range, is 0: paged reads do not count): the listing is
/// never collected here.
///
/// On an error `pages` is where the listing stopped (a page's read changes nothing until it
/// succeeds, and a timeout drops the read before it could): calling this again with the same
/// `pages` resumes at the page that failed.
async fn list_range<S: Store + ?Sized>(
    pages: &mut Pages<'_, S>,
    timeout: Option<Duration>,
    on_page: impl Fn(),
    mut on_records: impl FnMut(Vec<KeyValue>, usize),
) -> StoreResult<Revision> {
    while let Some(kvs) = bounded(timeout, pages.next_page()).await? {
        on_records(kvs, 0);
        on_page();
    }
    Ok(pages.revision())
}

/// Runs until the sink is gone.
pub(crate) async fn follow<S: Sink>(cfg: FeedConfig, relist: Arc<Relist>, sink: S) {
    let store = cfg.store.clone();
    let mut backoff = Backoff::new(RECONNECT, cfg.jitter_seed);
    let mut need_list = true;
    loop {
        let forced = relist.forced.swap(false, Ordering::AcqRel);
        if need_list || forced {
            let mut pages = Pages::at(&*store, &cfg.range, cfg.page, 0);
            let mut listing = None;
            let rev = loop {
                let mut read = false;
                let listed = list_range(
                    &mut pages,
                    cfg.request_timeout,
                    || sink.list_page(),
                    |kvs, hint| {
                        let l = listing.get_or_insert_with(|| sink.begin_listing(hint));
                        sink.listing_page(l, kvs);
                        read = true;
                    },
                )
                .await;
                if read {
                    backoff.progressed();
                }
                match listed {
                    Ok(rev) => break rev,
                    Err(e) => {
                        let next = after_failed_page(&e);
                        warn!(range = ?cfg.range, error = %e, ?next, "listing page failed; retrying");
                        if next == AfterFailedPage::Restart {
                            pages = Pages::at(&*store, &cfg.range, cfg.page, 0);
                            listing = None;
                        }
                        sink.unreachable(&e);
                        tokio::time::sleep(backoff.failed()).await;
                    }
                }
            };
            let listing = listing.unwrap_or_else(|| sink.begin_listing(0));
            sink.applying();
            if sink.listed(listing, rev).is_err() {
                return;
            }
            need_list = false;
            backoff.progressed();
        }

        let Ok(at) = sink.revision() else {
            return;
        };
        // The watch starts AT the view's revision, not after it, and what it replays of that
        // revision is skipped (the view has it). A store accepts a watch from its compaction
        // revision but may have dropped a delete made at exactly that revision (etcd 3.4.23 once
        // its compaction has run, and the embedded store; newer etcd keeps it: conformance case
        // `watch_from_the_compaction_revision_of_a_delete`). Watching from `at + 1` after a
        // compaction at `at + 1` would then miss that delete and show a binding that is gone;
        // from `at`, such a compaction is refused as compacted and re-listed, right on either.
        let start = at.max(1);
        let mut stream =
            match bounded(cfg.request_timeout, store.watch(cfg.range.clone(), start)).await {
                Ok(s) => s,
                Err(StoreError::Compacted { .. }) => {
                    need_list = true;
                    continue;
                }
                Err(e) => {
                    warn!(range = ?cfg.range, error = %e, "watch failed; retrying");
                    sink.unreachable(&e);
                    need_list |= cfg.relist_after_outage;
                    tokio::time::sleep(backoff.failed()).await;
                    continue;
                }
            };
        backoff.progressed();
        let mut probe = cfg.probe.map(|p| {
            let mut i = tokio::time::interval_at(tokio::time::Instant::now() + p, p);
            i.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            i
        });
        loop {
            // `biased`: a fixed polling order keeps simulation runs reproducible from their seed.
            let msg = tokio::select! {
                biased;
                m = stream.next() => m,
                _ = relist.notify.notified() => { need_list = true; break; }
                _ = async {
                    match probe.as_mut() {
                        Some(p) => { p.tick().await; }
                        None => std::future::pending::<()>().await,
                    }
                } => {
                    let req = GetRequest::new(cfg.range.clone()).count_only();
                    let t = cfg.request_timeout.or(cfg.probe);
                    match bounded(t, store.get(req)).await {
                        Ok(_) => continue,
                        Err(e) => {
                            debug!(range = ?cfg.range, error = %e, "probe failed; reconnecting");
                            sink.unreachable(&e);
                            need_list |= cfg.relist_after_outage;
                            break;
                        }
                    }
                }
            };
            match msg {
                Some(Ok(WatchMessage::Events(mut events))) => {
                    events.retain(|e| e.kv().mod_revision > at);
                    if !events.is_empty() && sink.watched(&events).is_err() {
                        return;
                    }
                }
                Some(Ok(WatchMessage::Compacted { compact_revision })) => {
                    debug!(range = ?cfg.range, compact_revision, "watch compacted; re-listing");
                    need_list = true;
                    break;
                }
                Some(Err(e)) => {
                    debug!(range = ?cfg.range, error = %e, "watch stream broke; resuming");
                    sink.unreachable(&e);
                    need_list |= cfg.relist_after_outage;
                    break;
                }
                None => {
                    need_list |= cfg.relist_after_outage;
                    break;
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;
    use std::sync::atomic::AtomicUsize;
    use std::sync::Mutex;

    use super::*;
    use crate::hooked::{Hook, HookedStore, Request};
    use crate::store::embedded::EmbeddedStore;
    use crate::store::{StoreResult, TxnOp, TxnRequest};

    /// A follower of `prefix` in `store`, pages of 10, no probe, no bound on a page, seed 1.
    fn test_config(store: Arc<dyn Store>, prefix: &str) -> FeedConfig {
        FeedConfig {
            store,
            range: KeyRange::prefix(prefix),
            page: 10,
            relist_after_outage: false,
            probe: None,
            request_timeout: None,
            jitter_seed: 1,
        }
    }

    /// Over a real store: in the gap between the follower's first listing and its first watch,
    /// key `b` is deleted and the store compacted at exactly that delete's revision.
    struct Gap {
        armed: AtomicBool,
    }

    #[async_trait::async_trait]
    impl Hook<EmbeddedStore> for Gap {
        async fn before(&self, inner: &Arc<EmbeddedStore>, req: Request) -> StoreResult<Request> {
            if matches!(req, Request::Watch { .. }) && self.armed.swap(false, Ordering::SeqCst) {
                let r = inner.txn(TxnRequest::new().and_then([TxnOp::delete("p/b")])).await?;
                inner.compact(r.revision).await?;
            }
            Ok(req)
        }
    }

    #[derive(Default)]
    struct View {
        keys: Mutex<BTreeMap<Vec<u8>, Vec<u8>>>,
        rev: Mutex<Revision>,
        listings: AtomicUsize,
        /// Records the last complete listing held, duplicates included (the map above would
        /// hide a page applied twice).
        listed_records: AtomicUsize,
    }

    struct ViewSink(Arc<View>);

    impl Sink for ViewSink {
        fn revision(&self) -> Result<Revision, Gone> {
            Ok(*self.0.rev.lock().expect("lock"))
        }
        type Listing = Vec<KeyValue>;
        fn begin_listing(&self, _: usize) -> Vec<KeyValue> {
            Vec::new()
        }
        fn listing_page(&self, listing: &mut Vec<KeyValue>, kvs: Vec<KeyValue>) {
            listing.extend(kvs);
        }
        fn listed(&self, kvs: Vec<KeyValue>, revision: Revision) -> Result<(), Gone> {
            *self.0.keys.lock().expect("lock") =
                kvs.iter().map(|kv| (kv.key.clone(), kv.value.clone())).collect();
            *self.0.rev.lock().expect("lock") = revision;
            self.0.listed_records.store(kvs.len(), Ordering::SeqCst);
            self.0.listings.fetch_add(1, Ordering::SeqCst);
            Ok(())
        }
        fn watched(&self, events: &[WatchEvent]) -> Result<(), Gone> {
            let mut keys = self.0.keys.lock().expect("lock");
            for e in events {
                match e {
                    WatchEvent::Put(kv) => keys.insert(kv.key.clone(), kv.value.clone()),
                    WatchEvent::Delete(kv) => keys.remove(&kv.key),
                };
                *self.0.rev.lock().expect("lock") = e.kv().mod_revision;
            }
            Ok(())
        }
    }

    /// Regression (found by the remote-view simulation): the follower watched from the listing's
    /// revision + 1; after a compaction at exactly that revision the embedded store accepted the
    /// watch but had dropped the delete made there (etcd 3.4 replays it), and the view kept the
    /// deleted key forever.
    #[tokio::test(start_paused = true)]
    async fn a_delete_compacted_away_right_after_the_listing_is_not_lost() {
        let inner = EmbeddedStore::memory();
        inner
            .txn(TxnRequest::new().and_then([TxnOp::put("p/a", "1"), TxnOp::put("p/b", "2")]))
            .await
            .expect("seed");
        let store = Arc::new(HookedStore::with_hook(inner, Gap { armed: AtomicBool::new(true) }));
        let view = Arc::new(View::default());
        let cfg = FeedConfig { request_timeout: None, ..test_config(store.clone(), "p/") };
        let task = tokio::spawn(follow(cfg, Arc::default(), ViewSink(view.clone())));
        for _ in 0..100 {
            tokio::time::sleep(Duration::from_millis(10)).await;
            if view.listings.load(Ordering::SeqCst) >= 2 {
                break;
            }
        }
        task.abort();
        let keys: Vec<Vec<u8>> = view.keys.lock().expect("lock").keys().cloned().collect();
        assert_eq!(keys, vec![b"p/a".to_vec()], "the deleted key must be gone from the view");
        assert_eq!(view.listings.load(Ordering::SeqCst), 2, "the compacted watch re-lists");
    }

    /// Records the range, limit and revision of every `get`, and sleeps `delay` before each.
    #[derive(Default)]
    struct Gets {
        seen: Mutex<Vec<(KeyRange, i64, Revision)>>,
        delay: Duration,
    }

    #[async_trait::async_trait]
    impl Hook<EmbeddedStore> for Gets {
        async fn before(&self, _: &Arc<EmbeddedStore>, req: Request) -> StoreResult<Request> {
            if let Request::Get(g) = &req {
                self.seen.lock().expect("lock").push((g.range.clone(), g.limit, g.revision));
                tokio::time::sleep(self.delay).await;
            }
            Ok(req)
        }
    }

    /// IDs `1..=n` as `p/id/<id>`, with records just outside the prefix on both sides.
    async fn ids(n: u64) -> EmbeddedStore {
        let inner = EmbeddedStore::memory();
        let mut ops = Vec::new();
        for id in 1..=n {
            ops.push(TxnOp::put(format!("p/id/{id}"), format!("k{id}")));
            if ops.len() == 100 || id == n {
                let txn = TxnRequest::new().and_then(std::mem::take(&mut ops));
                inner.txn(txn).await.expect("fill");
            }
        }
        let outside = [TxnOp::put("p/id.", "x"), TxnOp::put("p/ic", "x")];
        inner.txn(TxnRequest::new().and_then(outside)).await.expect("fill");
        inner
    }

    /// The follower's listing is the crate's one paging scheme: every record once, in key
    /// order, every read at the first one's revision, each read's window holding about a page
    /// (counted here exactly, as etcd counts: at most 3 records per record returned).
    #[tokio::test]
    async fn a_listing_reads_windows_of_about_a_page_at_one_revision() {
        let inner = ids(3000).await;
        let range = KeyRange::prefix("p/id/");
        let (want, _) = crate::store::list_all(&inner, &range, 1000).await.expect("plain");
        assert_eq!(want.len(), 3000);
        let store = HookedStore::with_hook(inner.clone(), Gets::default());
        let pages = AtomicUsize::new(0);
        let mut got = Vec::new();
        let mut deliveries = 0;
        let rev = list_range(
            &mut Pages::at(&store, &range, 10, 0),
            None,
            || {
                pages.fetch_add(1, Ordering::SeqCst);
            },
            |kvs, _| {
                got.extend(kvs);
                deliveries += 1;
            },
        )
        .await
        .expect("listing");
        assert!(deliveries >= 90, "handed over a page at a time, not collected: {deliveries}");
        let keys = |v: &[KeyValue]| v.iter().map(|kv| kv.key.clone()).collect::<Vec<_>>();
        assert_eq!(keys(&got), keys(&want), "same records, in key order");
        assert!(pages.load(Ordering::SeqCst) >= 300, "progress after every page");
        let gets = store.hook().seen.lock().expect("lock").clone();
        let mut counted = 0;
        for (i, (r, limit, at)) in gets.iter().enumerate() {
            assert!(i == 0 || *at == rev, "read {i} at {at}, not at the listing's {rev}");
            assert!(*limit <= 10, "pages of the listing's size");
            let c = inner.get(GetRequest::new(r.clone()).count_only()).await.expect("count");
            counted += c.count;
        }
        assert!(counted <= 3 * 3000, "the reads counted {counted} records to return 3000");
    }

    /// The request timeout bounds each page of a listing, not the whole of it.
    /// A store that takes 50 ms a page lists 2,000 records in pages of 10 in about 10 s; with a
    /// 1 s bound on the whole listing (the old code) it never completed.
    #[tokio::test(start_paused = true)]
    async fn a_slow_big_listing_is_bounded_page_by_page() {
        let hook = Gets { delay: Duration::from_millis(50), ..Gets::default() };
        let store = Arc::new(HookedStore::with_hook(ids(2000).await, hook));
        let view = Arc::new(View::default());
        let cfg = FeedConfig {
            request_timeout: Some(Duration::from_secs(1)),
            ..test_config(store.clone(), "p/id/")
        };
        let task = tokio::spawn(follow(cfg, Arc::default(), ViewSink(view.clone())));
        for _ in 0..120 {
            tokio::time::sleep(Duration::from_secs(1)).await;
            if view.listings.load(Ordering::SeqCst) >= 1 {
                break;
            }
        }
        task.abort();
        assert_eq!(view.listings.load(Ordering::SeqCst), 1, "listed within two minutes");
        assert_eq!(view.keys.lock().expect("lock").len(), 2000);
    }

    /// Fails the `fail_at`-th `get` (1-based) once: with `Unavailable`, or with `compact` by
    /// writing one more record and compacting the store at it first, so that the store itself
    /// refuses the read at the listing's revision as `Compacted`. Records every `get`'s revision.
    struct FailPage {
        fail_at: usize,
        compact: bool,
        seen: Mutex<Vec<Revision>>,
    }

    impl FailPage {
        fn at(fail_at: usize, compact: bool) -> FailPage {
            FailPage { fail_at, compact, seen: Mutex::default() }
        }
    }

    #[async_trait::async_trait]
    impl Hook<EmbeddedStore> for FailPage {
        async fn before(&self, inner: &Arc<EmbeddedStore>, req: Request) -> StoreResult<Request> {
            if let Request::Get(g) = &req {
                let n = {
                    let mut seen = self.seen.lock().expect("lock");
                    seen.push(g.revision);
                    seen.len()
                };
                if n == self.fail_at && self.compact {
                    let put = TxnRequest::new().and_then([TxnOp::put("p/id/99999", "k99999")]);
                    let r = inner.txn(put).await?;
                    inner.compact(r.revision).await?;
                } else if n == self.fail_at {
                    return Err(StoreError::Unavailable(format!("read {n} fails once")));
                }
            }
            Ok(req)
        }
    }

    /// Follows `p/id/` of 2,000 records in pages of 10 until the first listing is complete;
    /// the revisions of every read, and the view.
    async fn listed_through(hook: FailPage) -> (Vec<Revision>, Arc<View>) {
        let store = Arc::new(HookedStore::with_hook(ids(2000).await, hook));
        let view = Arc::new(View::default());
        let cfg = FeedConfig { request_timeout: None, ..test_config(store.clone(), "p/id/") };
        let task = tokio::spawn(follow(cfg, Arc::default(), ViewSink(view.clone())));
        for _ in 0..600 {
            tokio::time::sleep(Duration::from_millis(100)).await;
            if view.listings.load(Ordering::SeqCst) >= 1 {
                break;
            }
        }
        task.abort();
        let seen = store.hook().seen.lock().expect("lock").clone();
        (seen, view)
    }

    /// A listing whose page k fails goes on at page k, at its revision. The old
    /// follower started again at page 1: 49 reads more here (pages 1..k again).
    #[tokio::test(start_paused = true)]
    async fn a_listing_whose_page_fails_resumes_at_that_page() {
        let (clean, _) = listed_through(FailPage::at(usize::MAX, false)).await;
        assert!(clean.len() >= 200, "pages of 10 of 2,000 records: {} reads", clean.len());
        let k = 50;
        let (seen, view) = listed_through(FailPage::at(k, false)).await;
        assert_eq!(view.listings.load(Ordering::SeqCst), 1, "the listing completed");
        assert_eq!(
            seen.len(),
            clean.len() + 1,
            "only the failed page is read again (the old code read pages 1..{k} again)"
        );
        let rev = seen[1];
        assert!(seen[1..].iter().all(|r| *r == rev), "every page at the listing's revision");
        assert_eq!(view.listed_records.load(Ordering::SeqCst), 2000, "each record applied once");
        assert_eq!(view.keys.lock().expect("lock").len(), 2000);
    }

    /// A listing whose revision was compacted while a page was due cannot be completed at it:
    /// its pages are dropped and it starts again at page 1 at a new revision, which has the
    /// record written meanwhile, and no record of the dropped pages twice.
    #[tokio::test(start_paused = true)]
    async fn a_listing_whose_revision_was_compacted_starts_over_at_a_new_one() {
        let k = 50;
        let (seen, view) = listed_through(FailPage::at(k, true)).await;
        assert_eq!(view.listings.load(Ordering::SeqCst), 1, "the listing completed");
        assert_eq!(seen[k], 0, "the read after the compacted one starts a new listing");
        assert!(seen[k + 1] > seen[k - 1], "at a newer revision");
        assert_eq!(view.listed_records.load(Ordering::SeqCst), 2001, "each record once");
        assert!(view.keys.lock().expect("lock").contains_key(b"p/id/99999".as_slice()));
    }

    #[test]
    fn only_a_compacted_revision_restarts_a_listing() {
        let compacted = StoreError::Compacted { requested: 5, compact_revision: 9 };
        assert_eq!(after_failed_page(&compacted), AfterFailedPage::Restart);
        for e in [
            StoreError::Unavailable("timeout".into()),
            StoreError::FutureRevision { requested: 9, current: 5 },
            StoreError::ResponseTooLarge("5 MB".into()),
        ] {
            assert_eq!(after_failed_page(&e), AfterFailedPage::Resume, "{e}");
        }
    }

    /// A small range is read whole, page after page (`p/id/299` and `p/id/2990`..`2999`), and
    /// handed over as it is read.
    #[tokio::test]
    async fn a_small_prefix_listing_is_every_record_of_it() {
        let store = ids(3000).await;
        let mut few = Vec::new();
        list_range(
            &mut Pages::at(&store, &KeyRange::prefix("p/id/299"), 10, 0),
            None,
            || {},
            |kvs, _| few.extend(kvs),
        )
        .await
        .expect("small");
        assert_eq!(few.len(), 11);
    }
}
