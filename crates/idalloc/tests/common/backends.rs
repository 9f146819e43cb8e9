//! The backends a test set runs on, from one source: each backend's store and key prefix
//! ([`env`]), and [`on_backends!`], which turns one `async fn test(backend: Backend)` into one
//! `#[tokio::test]` per backend (modules `memory`, `file`, `etcd`, `secure_etcd`).
//!
//! Time: the embedded backends run on tokio's paused clock (TTL waits are instant and
//! deterministic); etcd's leases expire in real time, which a paused clock cannot advance, so the
//! etcd backends run in real time.

use std::any::Any;
use std::sync::Arc;
use std::time::Duration;

use idalloc::layout::Layout;
use idalloc::store::embedded::{EmbeddedOptions, EmbeddedStore};
use idalloc::store::Store;
use idalloc::{Allocator, AllocatorOptions};
use idalloc_testkit::etcd::{connect_test_store, test_etcd_endpoint, unique_prefix};

use super::layout;

#[derive(Clone, Copy, Debug)]
pub enum Backend {
    Memory,
    File,
    Etcd,
    /// An etcd of its own with mutual TLS, user authentication with 2 s tokens, and a user whose
    /// role covers only `idalloc-secure/` (docs/guide/security.md).
    SecureEtcd,
}

pub struct Env {
    pub store: Arc<dyn Store>,
    pub layout: Layout,
    /// What must outlive the store: the etcd server or the file's temp dir.
    pub _guard: Box<dyn Any + Send>,
}

/// The backend's store and a prefix of the test's own, or `None` if the test is skipped (no
/// etcd outside CI).
pub async fn env(backend: Backend) -> Option<Env> {
    match backend {
        Backend::Memory => Some(Env {
            store: Arc::new(EmbeddedStore::memory()),
            layout: layout(),
            _guard: Box::new(()),
        }),
        Backend::File => {
            let dir = tempfile::tempdir().expect("temp dir");
            let store =
                EmbeddedStore::open(dir.path().join("store.redb"), EmbeddedOptions::default())
                    .await
                    .expect("open file store");
            Some(Env { store: Arc::new(store), layout: layout(), _guard: Box::new(dir) })
        }
        Backend::Etcd => {
            let etcd = test_etcd_endpoint().await?;
            let store = connect_test_store(&etcd.endpoint()).await.expect("connect");
            let prefix = String::from_utf8(unique_prefix()).expect("utf8");
            let layout = Layout::new(prefix.trim_end_matches('/')).expect("prefix");
            Some(Env { store: Arc::new(store), layout, _guard: Box::new(etcd) })
        }
        Backend::SecureEtcd => {
            use idalloc_testkit::secure::{SecureEtcd, SecureSpec};
            if !idalloc_testkit::etcd::etcd_or_skip("the secure-etcd backend") {
                return None;
            }
            let spec = SecureSpec {
                tls: true,
                client_cert_auth: true,
                auth: true,
                auth_token_ttl: Some(2),
            };
            let etcd = SecureEtcd::start(spec).await.unwrap_or_else(|e| panic!("{e}"));
            let opts = etcd.options(Some(SecureEtcd::user_auth()));
            let store = idalloc::store::etcd::EtcdStore::connect(opts).await.expect("connect");
            let layout = Layout::new(format!("{}alloc", SecureEtcd::PREFIX)).expect("prefix");
            Some(Env { store: Arc::new(store), layout, _guard: Box::new(etcd) })
        }
    }
}

/// An allocator named `holder` on a backend's store under its prefix, with the given session TTL
/// (no seed: these tests do not depend on which free ID a pick takes).
pub fn allocator_on(
    store: Arc<dyn Store>,
    l: &Layout,
    holder: &str,
    session_ttl: Duration,
) -> Allocator {
    let opts = AllocatorOptions::builder()
        .prefix(l.prefix().to_string())
        .holder(holder.to_string())
        .session_ttl(session_ttl)
        .build()
        .unwrap();
    Allocator::from_arc(store, opts).expect("allocator")
}

/// `on_backends!([Memory, Etcd], [test_a, test_b])`: for each backend listed, a module of one
/// `#[tokio::test]` per test, calling `test_a(Backend::Memory)` and so on (the embedded backends
/// on the paused clock). Test files that include `common` without running a set on backends leave
/// it unused.
#[allow(unused_macros)]
macro_rules! on_backends {
    ([$($backend:ident),* $(,)?], $tests:tt) => {
        $(on_backends!(@backend $backend, $tests);)*
    };
    (@backend Memory, $tests:tt) => { on_backends!(@mod memory, Memory, (start_paused = true), $tests); };
    (@backend File, $tests:tt) => { on_backends!(@mod file, File, (start_paused = true), $tests); };
    (@backend Etcd, $tests:tt) => { on_backends!(@mod etcd, Etcd, (), $tests); };
    (@backend SecureEtcd, $tests:tt) => { on_backends!(@mod secure_etcd, SecureEtcd, (), $tests); };
    (@mod $module:ident, $backend:ident, $clock:tt, [$($name:ident),* $(,)?]) => {
        mod $module {
            $(#[tokio::test $clock]
            async fn $name() {
                super::$name(super::Backend::$backend).await
            })*
        }
    };
}
#[allow(unused_imports)]
pub(crate) use on_backends;
