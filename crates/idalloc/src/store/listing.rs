//! Whole listings with a bound on each page, not on the listing.
//!
//! A listing of a million records takes a thousand pages or more, and how long it takes depends
//! on the pool, the store and the machine's load. A timeout around the whole listing therefore
//! either cuts off big pools that are making progress (`list` and `gc` failed at 1M bindings on
//! a loaded machine: the 100 s of one request attempt ran out while pages kept coming) or is too
//! loose to tell a hung store. What tells a hung store from a big range is a *page* that does not
//! come, as the cache's follower already found (`feed.rs`). So here each page's read (each round
//! trip: a page may take several when windows are empty) gets the bound and the retries a single
//! request gets ([`crate::RetryPolicy`], the crate's one backoff, `retry.rs`), and a listing that
//! makes progress runs as long as it takes.
//!
//! A retry reads the same page again, from where the listing stands (the [`Pages`] cursor only
//! moves once a read has returned), at the listing's revision: never from page 1. If the store
//! compacted that revision away meanwhile, the listing cannot go on consistently; the collecting
//! form ([`BoundedPages::fold`]) starts over at a new revision, a bounded number of times, and
//! says so in the log; the page-by-page form returns the `Compacted` error with the listing's
//! position, for callers that have already handed pages on (streamed output) and must decide.
//!
//! [`Pages`] stays the plain, unbounded reader; this wraps it.

use std::time::Duration;

use futures::future::BoxFuture;
use tracing::warn;

use super::{KeyRange, KeyValue, Pages, Revision, Store, StoreError, StoreResult};
use crate::allocator::RetryPolicy;
use crate::retry::Backoff;

/// How each page of a [`BoundedPages`] listing is bounded and retried.
#[derive(Clone, Debug)]
pub struct PageBound {
    /// Bound on one attempt at one page (`None`: the store's own bounds only). A page that does
    /// not come within it counts as [`StoreError::Unavailable`], which is retried.
    pub timeout: Option<Duration>,
    /// Attempts per page and the waits between them. Only `Unavailable` is retried; each page
    /// starts with a fresh schedule, so a long listing is never cut off by the sum of its pages.
    pub retry: RetryPolicy,
    /// Times a collecting listing ([`BoundedPages::fold`]) starts over at a new revision after
    /// the store compacted its revision away.
    pub restarts: u32,
}

impl Default for PageBound {
    /// The store's own bounds per page, [`RetryPolicy::default`]'s retries, and 3 restarts.
    fn default() -> Self {
        PageBound { timeout: None, retry: RetryPolicy::default(), restarts: 3 }
    }
}

/// What each read of a listing waits for first; what it returns is held until the read's answer
/// (retries included). The allocator's bulk turns (`allocator/turns.rs`): a page of a thousand
/// records costs etcd as much as a bulk txn, so it takes turns with them.
pub(crate) type Gate<'a> = Box<dyn Fn() -> BoxFuture<'a, Box<dyn Send + 'a>> + Send + Sync + 'a>;

/// A listing of one range at one revision, read page by page with each page bounded and retried
/// as [`PageBound`] says. Errors name the listing ([`BoundedPages::named`]), the page and the
/// key it starts at.
pub struct BoundedPages<'a, S: Store + ?Sized> {
    store: &'a S,
    range: KeyRange,
    page: i64,
    keys_only: bool,
    bound: PageBound,
    what: String,
    /// The revision asked for ([`BoundedPages::at_revision`]; 0: the first read's).
    revision: Revision,
    pages: Pages<'a, S>,
    /// Pages handed out since the listing (re)started.
    read: u64,
    /// Records handed out since the listing (re)started.
    records: u64,
    gate: Option<Gate<'a>>,
}

impl<'a, S: Store + ?Sized> BoundedPages<'a, S> {
    /// Pages of at most `page` records of `range`, at the revision of the first read.
    pub fn new(store: &'a S, range: &KeyRange, page: i64, bound: PageBound) -> Self {
        BoundedPages {
            store,
            range: range.clone(),
            page,
            keys_only: false,
            bound,
            what: format!("{range:?}"),
            revision: 0,
            pages: Pages::at(store, range, page, 0),
            read: 0,
            records: 0,
            gate: None,
        }
    }

    /// Waits for `gate` before each read ([`Gate`]).
    pub(crate) fn gated(mut self, gate: Gate<'a>) -> Self {
        self.gate = Some(gate);
        self
    }

    /// Names the listing in errors and logs (`pool "p"`); the range's keys by default.
    pub fn named(mut self, what: impl Into<String>) -> Self {
        self.what = what.into();
        self
    }

    /// Reads record names only (values come back empty): [`Pages::keys_only`].
    pub fn keys_only(mut self) -> Self {
        self.keys_only = true;
        self.pages = self.fresh(self.revision);
        self
    }

    /// Pages of at most `page` records instead of the size given to [`BoundedPages::new`].
    pub fn page_size(mut self, page: i64) -> Self {
        self.page = page;
        self.pages = self.fresh(self.revision);
        self
    }

    /// Reads every page at `revision` instead of the first read's (several ranges read at one
    /// revision: the `check` audit). A compaction of it cannot be started over from, so
    /// [`BoundedPages::fold`] returns the `Compacted` error as it is.
    pub fn at_revision(mut self, revision: Revision) -> Self {
        self.revision = revision;
        self.pages = self.fresh(revision);
        self.bound.restarts = 0;
        self
    }

    /// The revision the pages are read at (0 before the first read).
    pub fn revision(&self) -> Revision {
        self.pages.revision()
    }

    /// Pages handed out so far (since the last restart).
    pub fn pages_read(&self) -> u64 {
        self.read
    }

    fn fresh(&self, revision: Revision) -> Pages<'a, S> {
        let pages = Pages::at(self.store, &self.range, self.page, revision);
        if self.keys_only {
            pages.keys_only()
        } else {
            pages
        }
    }

    /// The next non-empty page, in key order; `None` when the range is exhausted. Each read
    /// (a page may take several: empty windows) is bounded by [`PageBound::timeout`] and
    /// retried on `Unavailable` from the same window. The error of a read that never came names
    /// the listing, the page and where it starts.
    pub async fn next_page(&mut self) -> StoreResult<Option<Vec<KeyValue>>> {
        loop {
            match self.next_read().await? {
                Some(kvs) if kvs.is_empty() => {}
                Some(kvs) => {
                    self.read += 1;
                    self.records += kvs.len() as u64;
                    return Ok(Some(kvs));
                }
                None => return Ok(None),
            }
        }
    }

    /// One bounded, retried read ([`Pages::next_read`]).
    async fn next_read(&mut self) -> StoreResult<Option<Vec<KeyValue>>> {
        let _turn = match &self.gate {
            Some(gate) => Some(gate().await),
            None => None,
        };
        let mut backoff = Backoff::new(&self.bound.retry);
        loop {
            let attempt = match self.bound.timeout {
                None => self.pages.next_read().await,
                Some(t) => match tokio::time::timeout(t, self.pages.next_read()).await {
                    Ok(r) => r,
                    Err(_) => Err(StoreError::Unavailable(format!("no answer within {t:?}"))),
                },
            };
            match attempt {
                Err(e) if backoff.retry(&e).await => {}
                Err(e) => return Err(self.explain(e, backoff.attempt())),
                ok => return ok,
            }
        }
    }

    /// Where the listing stood when a page failed, for its error.
    fn position(&self) -> String {
        let from = self.pages.next_key().map(String::from_utf8_lossy).unwrap_or_default();
        format!(
            "page {} (from key {from:?}, at revision {}; {} records in {} pages before it)",
            self.read + 1,
            self.pages.revision(),
            self.records,
            self.read
        )
    }

    fn explain(&self, e: StoreError, attempts: u32) -> StoreError {
        match e {
            StoreError::Unavailable(m) => StoreError::Unavailable(format!(
                "listing {}: {} failed {attempts} time(s), the last: {m}",
                self.what,
                self.position()
            )),
            StoreError::Compacted { requested, compact_revision } => {
                warn!(listing = %self.what, position = %self.position(), compact_revision,
                    "the listing's revision was compacted away");
                StoreError::Compacted { requested, compact_revision }
            }
            other => other,
        }
    }

    /// Starts the listing over from its first page, at the revision of its next read (after its
    /// revision was compacted away).
    pub fn restart(&mut self) {
        self.revision = 0;
        self.pages = self.fresh(0);
        self.read = 0;
        self.records = 0;
    }

    /// Folds every page into one value, in key order, starting over from `init()` at a new
    /// revision when the listing's revision is compacted away (at most
    /// [`PageBound::restarts`] times). Returns the value and the revision it is valid at.
    pub async fn fold<T>(
        mut self,
        init: impl Fn() -> T,
        mut step: impl FnMut(&mut T, Vec<KeyValue>),
    ) -> StoreResult<(T, Revision)> {
        let mut acc = init();
        let mut restarts = 0;
        loop {
            match self.next_page().await {
                Ok(Some(kvs)) => step(&mut acc, kvs),
                Ok(None) => return Ok((acc, self.revision())),
                Err(StoreError::Compacted { compact_revision, .. })
                    if restarts < self.bound.restarts =>
                {
                    restarts += 1;
                    warn!(listing = %self.what, compact_revision, restarts,
                        "the store compacted the listing's revision; starting over at a new one");
                    self.restart();
                    acc = init();
                }
                Err(StoreError::Compacted { requested, compact_revision })
                    if self.bound.restarts > 0 =>
                {
                    return Err(StoreError::Unavailable(format!(
                        "listing {}: the store compacted the listing's revision {requested} \
                         away (to {compact_revision}) {} time(s) before it could finish; \
                         compaction runs faster than the range can be read",
                        self.what,
                        restarts + 1
                    )))
                }
                Err(e) => return Err(e),
            }
        }
    }

    /// Every record of the range, in key order, and the revision they are valid at: [`fold`]
    /// into one `Vec` ([`super::list_all`] with a bound per page).
    ///
    /// [`fold`]: BoundedPages::fold
    pub async fn collect(self) -> StoreResult<(Vec<KeyValue>, Revision)> {
        self.fold(Vec::new, |all, kvs| all.extend(kvs)).await
    }
}
