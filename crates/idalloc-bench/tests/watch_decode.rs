//! What it costs an `idalloc-client` view to take in a watch stream's snapshot,
//! against a real `idalloc serve` (memory store), counted as the bytes the client process
//! allocates while its view syncs (this test binary installs the bench's counting allocator).
//!
//! The fleet benchmark through `serve` found the agents' process spending about 12 µs of CPU per
//! binding of each snapshot, 78% of it in `memmove`: the SSE parser (`eventsource-stream` 0.2)
//! copied the rest of its buffer at every line, so a chunk of n lines cost O(n²) bytes copied
//! (each copy a fresh allocation). A linear parser allocates a few times the snapshot's bytes.

use std::time::Duration;

use idalloc::PoolSpec;
use idalloc_client::{Client, ClientOptions};
use idalloc_testkit::serve::Serve;

/// Counts heap bytes (`idalloc_bench::heap`).
#[global_allocator]
static HEAP: idalloc_bench::heap::Counting = idalloc_bench::heap::Counting;

const BINDINGS: usize = 20_000;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_views_sync_allocates_a_few_times_the_snapshot_not_a_copy_per_line() {
    idalloc_bench::heap::installed();
    let bin = idalloc_testkit::serve::workspace_bin();
    let serve = Serve::start(&bin.to_string_lossy(), &["--store", "memory:"], &[]);
    let url = serve.http("");
    let opts = || ClientOptions::builder().session_ttl(Duration::from_secs(120)).build().unwrap();

    // BINDINGS keys held by a session of another client (it stays open through the test).
    let filler = Client::new([&url], opts()).expect("client");
    let pool = filler.ensure_pool(&PoolSpec::new("p", 1, 1_000_000)).await.expect("pool");
    let session = filler.session(Duration::from_secs(120)).await.expect("session");
    let keys: Vec<String> = (0..BINDINGS).map(|i| format!("node-{i:06}/identity")).collect();
    let got = session.acquire_many(&pool, &keys).await.expect("fill");
    assert_eq!(got.len(), BINDINGS);

    // A new client's view: the snapshot arrives in whatever chunks the connection gives.
    let agent = Client::new([&url], opts()).expect("agent client");
    let (view, allocated) = idalloc_bench::heap::allocated(async {
        let view = agent.pool("p").await.expect("open");
        view.wait_synced().await.expect("synced");
        view
    })
    .await;
    let allocated = allocated.expect("the counting allocator is installed");
    assert_eq!(view.snapshot().len(), BINDINGS, "the view holds every binding");
    assert_eq!(view.get("node-000007/identity"), Some(got[7].id));

    // The snapshot as sent: `event: upsert`, `data: {"id":..,"key":..,"revision":..}`, a blank
    // line; about 80 bytes a binding with these keys.
    let per_binding = allocated as f64 / BINDINGS as f64;
    eprintln!("view sync: {allocated} bytes allocated, {per_binding:.0} per binding");
    // The linear parser and the view: about 1 KB a binding (the event's strings, the JSON
    // decode, the listing and the view's two maps, the HTTP buffers). A copy of the rest of
    // the chunk at every line is hundreds of KB a binding at this size.
    assert!(
        per_binding < 4_000.0,
        "{per_binding:.0} bytes allocated per binding of the snapshot ({allocated} in all): \
         the stream's bytes are copied again per line"
    );
    drop(session);
}
