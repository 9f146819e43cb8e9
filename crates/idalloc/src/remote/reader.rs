//! Direct reads of a remote store: the bounded request every remote read goes through, the spec
//! read, and [`RemoteReader`] (one-shot answers without a view).

use std::sync::Arc;
use std::time::Duration;

use crate::error::{Error, Result};
use crate::layout::{IdRecord, Layout};
use crate::pool::{validate_key, PoolSpec};
use crate::store::{GetRequest, KeyValue, Store};

use super::cluster::Cluster;
use super::options::RemoteOptions;
use super::space::{check_overlap, id_space, Spaces};
use super::validate::{validate_entry, validate_remote_name, Validator};

/// One bounded read of a remote store.
async fn read_remote(
    name: &str,
    what: &str,
    store: &dyn Store,
    req: GetRequest,
    t: Duration,
) -> Result<Vec<KeyValue>> {
    match tokio::time::timeout(t, store.get(req)).await {
        Ok(Ok(r)) => Ok(r.kvs),
        Ok(Err(e)) => Err(match Error::from(e) {
            Error::Unavailable { reason, retryable, source } => Error::Unavailable {
                reason: format!("remote {name:?}: {what}: {reason}"),
                retryable,
                source,
            },
            other => other,
        }),
        Err(_) => {
            Err(Error::unavailable(format!("remote {name:?}: {what}: no answer within {t:?}")))
        }
    }
}

/// Reads the spec record of pool `pool` in remote `name` (one round trip).
pub(super) async fn read_spec(
    name: &str,
    pool: &str,
    store: &dyn Store,
    layout: &Layout,
    t: Duration,
) -> Result<(PoolSpec, KeyValue)> {
    let req = GetRequest::key(layout.pool_spec_key(pool));
    let kvs = read_remote(name, &format!("reading pool {pool:?}"), store, req, t).await?;
    let Some(kv) = kvs.into_iter().next() else {
        return Err(Error::PoolNotFound { pool: format!("{pool}\" in remote \"{name}") });
    };
    let spec = PoolSpec::from_json(&kv.value).map_err(|e| {
        Error::corrupt(
            format!("remote {name:?}: {}", String::from_utf8_lossy(&kv.key)),
            format!("the spec of pool {pool:?} is unreadable: {e}"),
        )
    })?;
    Ok((spec, kv))
}

/// Direct reads of a remote pool, for a process that answers one lookup and exits (the CLI's
/// `get`/`lookup --remote`): the spec is read and checked as by [`crate::Pool::watch_remote`]
/// (overlap refused), then each question reads only the records it needs (1 or 2 round trips),
/// instead of listing the whole remote pool into a view. The same validation applies: an answer
/// outside the remote's ID space, or refused by a validator, is no answer.
pub struct RemoteReader {
    name: Arc<str>,
    store: Arc<dyn Store>,
    layout: Layout,
    spec: PoolSpec,
    validators: Vec<Validator>,
    timeout: Duration,
}

impl RemoteReader {
    /// Reads remote `name`'s spec of `local`'s pool (one round trip) and refuses it if its ID
    /// space meets any of `others` (the local pool's and other remotes').
    pub async fn open(
        name: &str,
        local: &PoolSpec,
        store: Arc<dyn Store>,
        opts: &RemoteOptions,
        others: &Spaces,
    ) -> Result<RemoteReader> {
        validate_remote_name(name)?;
        let layout = Layout::new(&opts.prefix)?;
        let (spec, _) =
            read_spec(name, local.name(), &*store, &layout, opts.request_timeout).await?;
        check_overlap(name, &spec, others)?;
        Ok(RemoteReader {
            name: Arc::from(name),
            store,
            layout,
            spec,
            validators: opts.validators.clone(),
            timeout: opts.request_timeout,
        })
    }

    /// As a [`Cluster`].
    pub fn cluster(&self) -> Cluster {
        Cluster::Remote(self.name.clone())
    }

    /// The remote pool's spec, as read when the reader was opened.
    pub fn spec(&self) -> &PoolSpec {
        &self.spec
    }

    /// The remote pool's ID space.
    pub fn space(&self) -> (u64, u64) {
        id_space(&self.spec)
    }

    /// The key bound to `id` in the remote pool (one round trip).
    pub async fn key_of(&self, id: u64) -> Result<Option<String>> {
        let space = self.space();
        if id < space.0 || id > space.1 {
            return Ok(None);
        }
        let req = GetRequest::key(self.layout.id_key(self.spec.name(), id));
        let kvs = read_remote(&self.name, "reading an ID", &*self.store, req, self.timeout).await?;
        Ok(kvs.first().and_then(|kv| match IdRecord::decode(&kv.value) {
            Some(IdRecord::Bound(k)) if validate_entry(space, &self.validators, id, &k).is_ok() => {
                Some(k)
            }
            _ => None,
        }))
    }

    /// The ID bound to `key` in the remote pool: its key record names the ID, and the ID record
    /// must say `key` (two round trips; the ID record is what a view would show).
    pub async fn get(&self, key: &str) -> Result<Option<u64>> {
        validate_key(key)?;
        let req = GetRequest::key(self.layout.key_key(self.spec.name(), key));
        let kvs = read_remote(&self.name, "reading a key", &*self.store, req, self.timeout).await?;
        let Some(id) = kvs.first().and_then(|kv| crate::layout::parse_id_value(&kv.value)) else {
            return Ok(None);
        };
        Ok(self.key_of(id).await?.filter(|k| k == key).map(|_| id))
    }
}
