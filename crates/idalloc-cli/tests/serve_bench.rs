//! The HTTP-vs-library benchmark (`idalloc-bench --serve-only`) runs end to end in a tiny size, so
//! the harness never rots: the real `serve` binary of this build on a private etcd, both sides do
//! their operations without failures, and the cached lookups answer. Speed is not asserted here
//! (figures come from release builds, docs/benchmarks/serve.md).

use std::path::Path;
use std::time::Duration;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_serve_benchmark_runs_and_both_sides_succeed() {
    if !idalloc_testkit::etcd::etcd_on_path() {
        assert!(std::env::var_os("CI").is_none(), "etcd must be on PATH in CI");
        return;
    }
    let bin = Path::new(env!("CARGO_BIN_EXE_idalloc"));
    let f = idalloc_bench::serve::run(bin, Duration::from_millis(300), &[1, 8]).await;
    assert!(f.errors.is_empty(), "{:?}", f.errors);
    assert_eq!(f.rows.iter().map(|r| r.clients).collect::<Vec<_>>(), [1, 8]);
    for r in &f.rows {
        assert!(r.library.ops > 0 && r.http.ops > 0, "{r:?}");
        assert_eq!((r.library.failures, r.http.failures), (0, 0), "{r:?}");
    }
    assert_eq!(f.lookups.len(), 2);
    for (c, r) in &f.lookups {
        assert!(r.ops > 0 && r.failures == 0, "{c} clients: {r:?}");
    }
    assert!(f.ratio(8).is_some());
    assert!(f.markdown().contains("| 8 |"), "{}", f.markdown());
}
