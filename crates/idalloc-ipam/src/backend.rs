//! How the plugin reaches idalloc: a store opened directly (`store`, one host) or `idalloc serve`
//! replicas through the client crate (`servers`, clusters). One small surface for both, so the
//! verbs do not care which.

use std::sync::Arc;
use std::time::Duration;

use idalloc::store::url::{open, OpenOptions};
use idalloc::{Allocator, AllocatorOptions, Binding, PoolSpec, RetryPolicy};
use idalloc_client::{Client, ClientOptions};

use crate::config::{NetConf, Reach};

/// An opened connection to idalloc.
pub enum Backend {
    Store(Allocator),
    Serve(Client),
}

/// One pool on a [`Backend`].
pub enum PoolHandle {
    Store(idalloc::Pool),
    Serve(idalloc_client::Pool),
}

/// Why the backend could not be opened (an unreadable token or CA file is the configuration's
/// fault; the rest is idalloc's).
pub enum OpenError {
    Config(String),
    Idalloc(idalloc::Error),
    Store(idalloc::store::StoreError),
}

impl Backend {
    /// Opens what `conf` names, with its timeout.
    pub async fn open(conf: &NetConf) -> Result<Backend, OpenError> {
        let timeout = Duration::from_millis(conf.timeout_ms);
        match &conf.reach {
            Reach::Store(url) => {
                // The file store is owned by one process at a time: concurrent execs queue.
                let opts = OpenOptions::builder()
                    .etcd_timeout((timeout / 3).max(Duration::from_millis(1)))
                    .lock_timeout(timeout.max(Duration::from_secs(30)))
                    .build()
                    .map_err(OpenError::Store)?;
                let store: Arc<dyn idalloc::store::Store> =
                    open(url, &opts).await.map_err(OpenError::Store)?;
                let retry = RetryPolicy::builder()
                    .max_attempts(3)
                    .initial_backoff(Duration::from_millis(50))
                    .max_backoff(Duration::from_millis(500));
                let mut ao = AllocatorOptions::builder()
                    .request_timeout((timeout / 3).max(Duration::from_millis(1)))
                    .retry(retry.build().map_err(OpenError::Idalloc)?)
                    .lazy_view(true);
                if let Some(p) = &conf.prefix {
                    ao = ao.prefix(p.clone());
                }
                let ao = ao.build().map_err(OpenError::Idalloc)?;
                Allocator::from_arc(store, ao).map(Backend::Store).map_err(OpenError::Idalloc)
            }
            Reach::Servers { urls, token_file, ca_file } => {
                let token = match token_file {
                    Some(f) => Some(
                        std::fs::read_to_string(f)
                            .map_err(|e| {
                                OpenError::Config(format!(
                                    "ipam.token_file {f:?}: cannot read: {e}"
                                ))
                            })?
                            .trim()
                            .to_string(),
                    ),
                    None => None,
                };
                let mut builder =
                    reqwest::Client::builder().connect_timeout(timeout.min(Duration::from_secs(5)));
                if let Some(f) = ca_file {
                    let pem = std::fs::read(f).map_err(|e| {
                        OpenError::Config(format!("ipam.ca_file {f:?}: cannot read: {e}"))
                    })?;
                    for cert in reqwest::Certificate::from_pem_bundle(&pem).map_err(|e| {
                        OpenError::Config(format!("ipam.ca_file {f:?}: not PEM certificates: {e}"))
                    })? {
                        builder = builder.add_root_certificate(cert);
                    }
                }
                let http = builder
                    .build()
                    .map_err(|e| OpenError::Config(format!("cannot build an HTTP client: {e}")))?;
                let mut opts = ClientOptions::builder()
                    .request_timeout(timeout)
                    .attempts(4)
                    .backoff_base(Duration::from_millis(50))
                    .backoff_max(Duration::from_millis(500))
                    .lazy_view(true)
                    .http(http);
                if let Some(t) = token {
                    opts = opts.token(t);
                }
                let opts = opts.build().map_err(OpenError::Idalloc)?;
                Client::new(urls, opts).map(Backend::Serve).map_err(OpenError::Idalloc)
            }
        }
    }

    /// The pool of `spec`, created if absent; `RangeMismatch` if it exists and differs.
    pub async fn ensure_pool(&self, spec: &PoolSpec) -> idalloc::Result<PoolHandle> {
        match self {
            Backend::Store(a) => a.ensure_pool(spec).await.map(PoolHandle::Store),
            Backend::Serve(c) => c.ensure_pool(spec).await.map(PoolHandle::Serve),
        }
    }

    /// The pool `name` (`PoolNotFound` if there is none), without creating it.
    pub async fn pool(&self, name: &str) -> idalloc::Result<PoolHandle> {
        match self {
            Backend::Store(a) => a.pool(name).await.map(PoolHandle::Store),
            Backend::Serve(c) => c.pool(name).await.map(PoolHandle::Serve),
        }
    }

    /// Ends the connection (no session lease is ever granted: every reference is durable).
    pub async fn close(self) {
        match self {
            Backend::Store(a) => {
                let _ = a.close().await;
            }
            Backend::Serve(c) => {
                let _ = c.close().await;
            }
        }
    }
}

impl PoolHandle {
    /// `holder`'s durable reference to `key`, preferring `hint` (a key already bound keeps its
    /// ID either way): the ID, and whether the binding is new.
    pub async fn acquire(
        &self,
        key: &str,
        holder: &str,
        hint: Option<u64>,
    ) -> idalloc::Result<(u64, bool)> {
        let a = match (self, hint) {
            (PoolHandle::Store(p), Some(h)) => p.acquire_durable_with_hint(key, holder, h).await?,
            (PoolHandle::Store(p), None) => p.acquire_durable(key, holder).await?,
            (PoolHandle::Serve(p), Some(h)) => p.acquire_durable_with_hint(key, holder, h).await?,
            (PoolHandle::Serve(p), None) => p.acquire_durable(key, holder).await?,
        };
        Ok((a.id, a.new))
    }

    /// Drops `holder`'s reference to `key` (a no-op if it has none).
    pub async fn release(&self, key: &str, holder: &str) -> idalloc::Result<()> {
        match self {
            PoolHandle::Store(p) => p.release_durable(key, holder).await.map(|_| ()),
            PoolHandle::Serve(p) => p.release_durable(key, holder).await.map(|_| ()),
        }
    }

    /// The ID bound to `key`, read from the store.
    pub async fn get(&self, key: &str) -> idalloc::Result<Option<u64>> {
        match self {
            PoolHandle::Store(p) => p.get_consistent(key).await,
            PoolHandle::Serve(p) => p.get_consistent(key).await,
        }
    }

    /// Every binding with its holders.
    pub async fn list(&self) -> idalloc::Result<Vec<Binding>> {
        match self {
            PoolHandle::Store(p) => p.list().await,
            PoolHandle::Serve(p) => p.list().await,
        }
    }
}
