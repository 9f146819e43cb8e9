//! Opening a watch stream costs the store O(1), not O(pool), and many streams opened at once
//! share one read. Each new stream used to read every ID record of the pool
//! for read-your-writes: 1,000 agents on 10,000 bindings were 10 million records sent by etcd.
//! Counted in store requests and records, never in time. And read-your-writes still holds: a
//! write that returned before a stream opened is in its snapshot, even while the service's own
//! watch of the pool is held back.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use axum::body::Body;
use axum::http::Request as HttpRequest;
use futures::StreamExt;
use idalloc::store::embedded::EmbeddedStore;
use idalloc::store::{Store, StoreResult};
use idalloc::{Allocator, PoolSpec};
use idalloc_server::{router, AppState, Config};
use idalloc_testkit::hooked::{Answer, Hook, HookedStore, Kind, Request, Response};
use idalloc_testkit::hooks::freezable;
use tokio::sync::Semaphore;
use tower::ServiceExt;

/// Counts reads and the records they return, and holds each read of a range's newest change
/// (`newest_first`) until the test lets it through.
struct Gate {
    gets: AtomicU64,
    returned: AtomicU64,
    newest_reads: AtomicU64,
    newest_permits: Semaphore,
}

#[async_trait::async_trait]
impl<S: Store> Hook<S> for Gate {
    async fn before(&self, _inner: &Arc<S>, req: Request) -> StoreResult<Request> {
        if let Request::Get(g) = &req {
            self.gets.fetch_add(1, Ordering::SeqCst);
            if g.newest_first {
                self.newest_reads.fetch_add(1, Ordering::SeqCst);
                if let Ok(p) = self.newest_permits.acquire().await {
                    p.forget();
                }
            }
        }
        Ok(req)
    }

    async fn after(&self, _inner: &Arc<S>, _kind: Kind, result: Answer) -> Answer {
        if let Ok(Response::Get(r)) = &result {
            self.returned.fetch_add(r.kvs.len() as u64, Ordering::SeqCst);
        }
        result
    }
}

impl Gate {
    fn new() -> Gate {
        Gate {
            gets: AtomicU64::new(0),
            returned: AtomicU64::new(0),
            newest_reads: AtomicU64::new(0),
            newest_permits: Semaphore::new(0),
        }
    }

    fn reset(&self) {
        for c in [&self.gets, &self.returned, &self.newest_reads] {
            c.store(0, Ordering::SeqCst);
        }
    }
}

type Inner = HookedStore<Arc<EmbeddedStore>, idalloc_testkit::hooks::FreezeWatches>;

/// A service on a memory store holding a pool `p` of `bindings` bindings, behind the gate; the
/// bare store too, for writes the service does not see coming.
struct Setup {
    raw: Arc<EmbeddedStore>,
    store: Arc<HookedStore<Arc<Inner>, Gate>>,
    frozen: Arc<Inner>,
    st: Arc<AppState>,
    app: axum::Router,
}

async fn setup(bindings: usize) -> Setup {
    let raw = Arc::new(EmbeddedStore::memory());
    let frozen = Arc::new(freezable(raw.clone()));
    let store = Arc::new(HookedStore::with_hook(frozen.clone(), Gate::new()));
    let bare: Arc<dyn Store> = raw.clone();
    let writer = Allocator::from_arc(bare, Default::default()).expect("allocator");
    writer.init_pool(&PoolSpec::new("p", 1, 1 << 24)).await.expect("init");
    let pool = writer.pool("p").await.expect("pool");
    let keys: Vec<String> = (0..bindings).map(|i| format!("node-{i:05}")).collect();
    for r in pool.acquire_many_durable(&keys, "h").await {
        r.expect("prefill");
    }
    let dyn_store: Arc<dyn Store> = store.clone();
    let alloc = Allocator::from_arc(dyn_store.clone(), Default::default()).expect("allocator");
    let st = AppState::new(alloc, dyn_store, "idalloc", Config::default(), None).expect("state");
    let app = router(st.clone());
    Setup { raw, store, frozen, st, app }
}

/// Opens a stream on `p` and reads it up to its `synced` event: the keys of its `upsert`s.
async fn open_and_read_snapshot(app: axum::Router) -> Vec<String> {
    let req = HttpRequest::get("/v1/pools/p/watch").body(Body::empty()).expect("request");
    let resp = app.oneshot(req).await.expect("response");
    assert_eq!(resp.status(), 200);
    let mut body = resp.into_body().into_data_stream();
    let mut text = String::new();
    while !text.contains("event: synced") {
        let chunk = body.next().await.expect("the stream ended before synced").expect("chunk");
        text.push_str(std::str::from_utf8(&chunk).expect("utf-8"));
    }
    text.lines()
        .filter_map(|l| l.strip_prefix("data: "))
        .filter_map(|d| serde_json::from_str::<serde_json::Value>(d).ok())
        .filter_map(|v| v.get("key").and_then(|k| k.as_str()).map(str::to_string))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn streams_opened_at_once_share_one_read_of_one_record() {
    const STREAMS: usize = 40;
    const BINDINGS: usize = 2_000;
    let s = setup(BINDINGS).await;
    // A first stream opens the pool in the service (its listing is not what is measured).
    s.store.hook().newest_permits.add_permits(1);
    assert_eq!(open_and_read_snapshot(s.app.clone()).await.len(), BINDINGS);
    s.store.hook().reset();

    let streams: Vec<_> =
        (0..STREAMS).map(|_| tokio::spawn(open_and_read_snapshot(s.app.clone()))).collect();
    // Every stream has arrived: waiting for the shared read, or (old code) each reading itself.
    while s.st.streams_opening("p") < STREAMS
        && s.store.hook().gets.load(Ordering::SeqCst) < STREAMS as u64
    {
        tokio::time::sleep(std::time::Duration::from_millis(5)).await;
    }
    s.store.hook().newest_permits.add_permits(STREAMS);
    for t in streams {
        assert_eq!(t.await.expect("stream").len(), BINDINGS, "a whole snapshot");
    }
    let h = s.store.hook();
    let (gets, returned) = (h.gets.load(Ordering::SeqCst), h.returned.load(Ordering::SeqCst));
    // The first to arrive started a read; the others arrived after it started, so they share
    // the next one: 2 reads of at most one record each, whatever the number of streams.
    assert_eq!(h.newest_reads.load(Ordering::SeqCst), 2, "{gets} reads for {STREAMS} streams");
    assert_eq!(gets, 2, "{gets} reads for {STREAMS} streams");
    assert!(returned <= 2, "{STREAMS} streams made the store send {returned} records");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_write_that_returned_before_the_stream_opened_is_in_its_snapshot() {
    let s = setup(50).await;
    s.store.hook().newest_permits.add_permits(1);
    assert_eq!(open_and_read_snapshot(s.app.clone()).await.len(), 50);
    // The service's watch of the pool is held back, so its cache cannot know of this write.
    s.frozen.hook().freeze(true);
    let bare: Arc<dyn Store> = s.raw.clone();
    let writer = Allocator::from_arc(bare, Default::default()).expect("allocator");
    let pool = writer.pool("p").await.expect("pool");
    pool.acquire_durable("written-before", "h").await.expect("write");
    let stream = tokio::spawn(open_and_read_snapshot(s.app.clone()));
    // The stream reads the pool's newest change only after it arrived...
    while s.store.hook().newest_reads.load(Ordering::SeqCst) < 2 {
        tokio::time::sleep(std::time::Duration::from_millis(5)).await;
    }
    s.store.hook().newest_permits.add_permits(1);
    // ... and then waits for the cache to reach it, which happens once the watch moves again.
    while s.st.streams_opening("p") > 0 {
        tokio::time::sleep(std::time::Duration::from_millis(5)).await;
    }
    s.frozen.hook().freeze(false);
    let keys = stream.await.expect("stream");
    assert_eq!(keys.len(), 51);
    assert!(keys.iter().any(|k| k == "written-before"), "the write is missing from the snapshot");
}
