//! The store conformance suite against the embedded store, in memory and on a file.
//! Every case runs on tokio's paused clock, so the lease-expiry cases are instant and
//! deterministic. etcd is the reference (`conformance_etcd.rs` runs the same cases there).

mod embedded {
    use std::sync::Arc;

    use idalloc::store::embedded::{EmbeddedOptions, EmbeddedStore};
    use idalloc_testkit::conformance::{Need, TestStore};

    /// A fresh in-memory store per case (so `Need::Exclusive` is always met).
    async fn memory_factory(_need: Need) -> Option<TestStore> {
        Some(TestStore::new(Arc::new(EmbeddedStore::memory()), b"/t/".to_vec()))
    }

    /// A fresh store file in a temp dir per case; the dir lives as long as the store.
    async fn file_factory(_need: Need) -> Option<TestStore> {
        let dir = tempfile::tempdir().expect("temp dir");
        let store = EmbeddedStore::open(dir.path().join("store.redb"), EmbeddedOptions::default())
            .await
            .expect("open store file");
        Some(TestStore::new(Arc::new(store), b"/t/".to_vec()).with_guard(dir))
    }

    idalloc_testkit::conformance_tests!(memory, memory_factory, paused_time = true);
    idalloc_testkit::conformance_tests!(file, file_factory, paused_time = true);
}
