//! A replica of Cilium v1.6's allocator protocol on etcd, step by step, for comparison.
//!
//! It follows the seed `000_1244da94bdccc523.txt` (Cilium v1.6.12 `pkg/allocator/allocator.go`;
//! "seed line N" below) for the allocator's steps, and Cilium v1.6's etcd backend
//! (`pkg/kvstore/allocator`, not in the seed) for how each backend call maps to etcd requests:
//! - layout under `cilium/state/identities/v1/`: master `id/<ID>` = key (no lease), slave
//!   `value/<key>/<node>` = ID on the node's session lease, lock `locks/<key>/<lease>`;
//! - `Lock` is etcd's `concurrency.Mutex` on a lease-backed session: one txn that creates our lock
//!   key if absent and reads the prefix; we own the lock when our key has the lowest create revision,
//!   else we watch the prefix and re-read it after each delete (the standard etcd mutex);
//! - `GetIfLocked` is a txn guarded by the lock key that reads the first `value/<key>/` key;
//!   `Get`/`GetNoCache` a plain prefix read; `AllocateIDIfLocked` a create-only txn on the master
//!   key guarded by the lock; `AcquireReference` is `UpdateIfDifferentIfLocked`: a get of the slave
//!   key, then a put on the lease guarded by the lock; `Release` deletes the slave key.
//!
//! New key: lock, get, get, create master, get slave, put slave, unlock = 7 round trips. A key that
//! another node bound (known from the watch-fed cache): lock, get slave, put slave, unlock = 4.
//!
//! Deliberate differences from Cilium, all in Cilium's favour or neutral: no 20 QPS client-side
//! rate limit (Cilium's etcd client is rate-limited by default); the ID pool is picked from the
//! cache without Cilium's idpool bookkeeping; lock-key GC (`RunLocksGC`) is not run.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::StreamExt;
use idalloc::layout::{enc, encode_id, parse_id_value};
use idalloc::store::{
    Compare, CompareOp, CompareTarget, GetRequest, KeyRange, Store, TxnOp, TxnRequest, WatchEvent,
    WatchMessage,
};
use rand::Rng;

use crate::contender::{err, first_get, Counted, Node, RANGE, SESSION_TTL};

const BASE: &str = "cilium/state/identities/v1/";

/// seed line 47: `maxAllocAttempts = 16`.
const MAX_ALLOC_ATTEMPTS: u32 = 16;

/// seed lines 287-290: exponential backoff from 20 ms, factor 2, between failed attempts.
const BACKOFF_MIN: Duration = Duration::from_millis(20);

/// The watch-fed view of master keys (Cilium's `mainCache`) plus the IDs in use (its `idPool`).
#[derive(Default)]
struct Cache {
    by_key: HashMap<String, u64>,
    used: HashSet<u64>,
}

/// One Cilium agent.
pub struct CiliumNode {
    store: Counted,
    node: String,
    lease: i64,
    cache: Arc<Mutex<Cache>>,
    /// seed line 126: `localKeys`, the keys this node uses with their refcounts.
    local: Mutex<HashMap<String, (u64, u64)>>,
    /// seed lines 477-478: `slaveKeysMutex`, held from after the first read to the end of
    /// `lockedAllocate`, and during `Release` (seed line 710).
    slave_keys: tokio::sync::Mutex<()>,
    retries: AtomicU64,
    watch_task: tokio::task::JoinHandle<()>,
}

/// A held etcd mutex: our lock key and its create revision.
struct Lock {
    key: Vec<u8>,
    rev: i64,
}

fn id_key(id: u64) -> Vec<u8> {
    format!("{BASE}id/{id}").into_bytes()
}
fn value_prefix(key: &str) -> Vec<u8> {
    format!("{BASE}value/{}/", enc(key)).into_bytes()
}
fn lock_prefix(key: &str) -> Vec<u8> {
    format!("{BASE}locks/{}/", enc(key)).into_bytes()
}
fn parse_id_key(k: &[u8]) -> Option<u64> {
    let s = std::str::from_utf8(k).ok()?;
    s.strip_prefix(BASE)?.strip_prefix("id/")?.parse().ok()
}

impl CiliumNode {
    pub async fn start(store: Counted, index: usize) -> Result<Self, String> {
        let lease = store
            .lease_grant(SESSION_TTL.as_secs() as i64)
            .await
            .map_err(|e| err("cilium session", e))?
            .id;
        // ListAndWatch of master keys (seed line 243): list, then watch from the next revision.
        let prefix = format!("{BASE}id/").into_bytes();
        let (kvs, rev) = idalloc::store::list_all(&*store, &KeyRange::prefix(prefix.clone()), 1000)
            .await
            .map_err(|e| err("cilium list", e))?;
        let cache = Arc::new(Mutex::new(Cache::default()));
        {
            let mut c = cache.lock().map_err(|_| "cilium cache poisoned".to_string())?;
            for kv in kvs {
                if let Some(id) = parse_id_key(&kv.key) {
                    c.used.insert(id);
                    c.by_key.insert(String::from_utf8_lossy(&kv.value).into_owned(), id);
                }
            }
        }
        let mut watch = store
            .watch(KeyRange::prefix(prefix), rev + 1)
            .await
            .map_err(|e| err("cilium watch", e))?;
        let c2 = cache.clone();
        let watch_task = tokio::spawn(async move {
            while let Some(Ok(WatchMessage::Events(evs))) = watch.next().await {
                let Ok(mut c) = c2.lock() else { return };
                for ev in evs {
                    let Some(id) = parse_id_key(&ev.kv().key) else { continue };
                    match ev {
                        WatchEvent::Put(kv) => {
                            c.used.insert(id);
                            c.by_key.insert(String::from_utf8_lossy(&kv.value).into_owned(), id);
                        }
                        WatchEvent::Delete(_) => {
                            c.used.remove(&id);
                            c.by_key.retain(|_, v| *v != id);
                        }
                    }
                }
            }
        });
        Ok(CiliumNode {
            store,
            node: format!("node{index}"),
            lease,
            cache,
            local: Mutex::new(HashMap::new()),
            slave_keys: tokio::sync::Mutex::new(()),
            retries: AtomicU64::new(0),
            watch_task,
        })
    }

    fn cached(&self, key: &str) -> Option<u64> {
        self.cache.lock().ok()?.by_key.get(key).copied()
    }

    /// The compare that makes a request "IfLocked": our lock key still exists as created.
    fn held(lock: &Lock) -> Compare {
        Compare::new(
            KeyRange::key(lock.key.clone()),
            CompareOp::Equal,
            CompareTarget::CreateRevision(lock.rev),
        )
    }

    /// `backend.Lock` (seed line 461): etcd's lease-backed mutex on `locks/<key>/`.
    async fn lock(&self, key: &str) -> Result<Lock, String> {
        let pfx = lock_prefix(key);
        let mut mine = pfx.clone();
        mine.extend_from_slice(format!("{:x}", self.lease).as_bytes());
        let req = TxnRequest::new()
            .when([Compare::absent(mine.clone())])
            .and_then([
                TxnOp::put_on_lease(mine.clone(), "", self.lease),
                TxnOp::get(GetRequest::prefix(pfx.clone())),
            ])
            .or_else([TxnOp::get_key(mine.clone()), TxnOp::get(GetRequest::prefix(pfx.clone()))]);
        let resp = self.store.txn(req).await.map_err(|e| err("cilium lock", e))?;
        let rev = if resp.succeeded {
            resp.revision
        } else {
            first_get(&resp.responses)
                .and_then(|g| g.kvs.first())
                .map(|kv| kv.create_revision)
                .ok_or("cilium lock: own lock key vanished")?
        };
        let owner_rev = |kvs: &[idalloc::store::KeyValue]| {
            kvs.iter().map(|kv| kv.create_revision).min().unwrap_or(rev)
        };
        let holders = resp.responses.iter().rev().find_map(|r| match r {
            idalloc::store::OpResponse::Get(g) => Some(g.kvs.clone()),
            _ => None,
        });
        if owner_rev(holders.as_deref().unwrap_or(&[])) == rev {
            return Ok(Lock { key: mine, rev });
        }
        // Wait for the earlier holders' keys to go (waitDeletes): watch, re-read after deletes.
        let mut watch = self
            .store
            .watch(KeyRange::prefix(pfx.clone()), resp.revision + 1)
            .await
            .map_err(|e| err("cilium lock watch", e))?;
        loop {
            match watch.next().await {
                Some(Ok(WatchMessage::Events(evs))) => {
                    if evs.iter().any(|e| matches!(e, WatchEvent::Delete(_))) {
                        let g = self
                            .store
                            .get(GetRequest::prefix(pfx.clone()))
                            .await
                            .map_err(|e| err("cilium lock wait", e))?;
                        if owner_rev(&g.kvs) == rev {
                            return Ok(Lock { key: mine, rev });
                        }
                    }
                }
                other => return Err(format!("cilium lock wait: watch ended: {other:?}")),
            }
        }
    }

    /// `lock.Unlock()` (seed line 466, deferred): delete our lock key.
    async fn unlock(&self, lock: Lock) -> Result<(), String> {
        self.store
            .txn(TxnRequest::new().and_then([TxnOp::delete(lock.key)]))
            .await
            .map_err(|e| err("cilium unlock", e))?;
        Ok(())
    }

    /// The first `value/<key>/` slave key's ID, guarded by the lock (`GetIfLocked`) or not.
    async fn get_slave(&self, key: &str, lock: Option<&Lock>) -> Result<u64, String> {
        let read = GetRequest::prefix(value_prefix(key)).with_limit(1);
        let kvs = match lock {
            Some(l) => {
                let resp = self
                    .store
                    .txn(TxnRequest::new().when([Self::held(l)]).and_then([TxnOp::get(read)]))
                    .await
                    .map_err(|e| err("cilium GetIfLocked", e))?;
                if !resp.succeeded {
                    return Err("cilium GetIfLocked: lock lost".into());
                }
                first_get(&resp.responses).map(|g| g.kvs.clone()).unwrap_or_default()
            }
            None => self.store.get(read).await.map_err(|e| err("cilium Get", e))?.kvs,
        };
        Ok(kvs.first().and_then(|kv| parse_id_value(&kv.value)).unwrap_or(0))
    }

    /// `AcquireReference` = `UpdateIfDifferentIfLocked` of the slave key: get, then put on the
    /// session lease if different, guarded by the lock.
    async fn acquire_reference(&self, id: u64, key: &str, lock: &Lock) -> Result<(), String> {
        let mut slave = value_prefix(key);
        slave.extend_from_slice(self.node.as_bytes());
        let cur = self
            .store
            .get(GetRequest::key(slave.clone()))
            .await
            .map_err(|e| err("cilium slave get", e))?;
        let want = encode_id(id);
        if cur.kvs.first().is_some_and(|kv| kv.value == want && kv.lease == self.lease) {
            return Ok(());
        }
        let resp = self
            .store
            .txn(
                TxnRequest::new()
                    .when([Self::held(lock)])
                    .and_then([TxnOp::put_on_lease(slave, want, self.lease)]),
            )
            .await
            .map_err(|e| err("cilium slave put", e))?;
        if resp.succeeded {
            Ok(())
        } else {
            Err("cilium slave put: lock lost".into())
        }
    }

    /// seed lines 421-429: `selectAvailableID`, a random ID the local pool thinks free.
    fn select_available_id(&self) -> Option<u64> {
        let c = self.cache.lock().ok()?;
        let local: HashSet<u64> = self.local.lock().ok()?.values().map(|(id, _)| *id).collect();
        let mut rng = rand::rng();
        (0..1000)
            .map(|_| rng.random_range(RANGE.0..=RANGE.1))
            .find(|id| !c.used.contains(id) && !local.contains(id))
    }

    /// seed lines 457-586: `lockedAllocate`. Returns (id, is_new).
    async fn locked_allocate(&self, key: &str) -> Result<u64, String> {
        let lock = self.lock(key).await?; // seed line 461
        let result = self.locked_steps(key, &lock).await;
        let unlocked = self.unlock(lock).await; // seed line 466 (defer lock.Unlock())
        let id = result?;
        unlocked?;
        Ok(id)
    }

    async fn locked_steps(&self, key: &str, lock: &Lock) -> Result<u64, String> {
        // seed lines 470 and 662-668: GetIfLocked, from the main cache or the kvstore.
        let mut value = match self.cached(key) {
            Some(id) => id,
            None => self.get_slave(key, Some(lock)).await?,
        };
        let _slave_keys = self.slave_keys.lock().await; // seed lines 477-478
        if value == 0 {
            // seed lines 483-490: a locally known key whose master vanished is re-created (not
            // exercised by the benchmark: keys are fresh or bound).
            value = self.local_id(key).unwrap_or(0);
        }
        if value != 0 {
            // seed lines 498-512: reuse the global ID, add our slave key.
            self.acquire_reference(value, key, lock).await?; // seed line 501
            self.local_use(key, value);
            return Ok(value);
        }
        // seed line 515: pick a free ID locally.
        let id = self.select_available_id().ok_or("cilium: no more available IDs")?;
        // seed line 542: GetNoCache, "check that this key has not been allocated in the cluster".
        if self.get_slave(key, None).await? != 0 {
            return Err(format!("cilium: found master key after proceeding for {key}"));
        }
        // seed line 552: AllocateIDIfLocked, create-only master key.
        let resp = self
            .store
            .txn(
                TxnRequest::new()
                    .when([Compare::absent(id_key(id)), Self::held(lock)])
                    .and_then([TxnOp::put(id_key(id), key.as_bytes().to_vec())]),
            )
            .await
            .map_err(|e| err("cilium AllocateIDIfLocked", e))?;
        if !resp.succeeded {
            return Err(format!("cilium: unable to allocate ID {id} for key {key}"));
        }
        if let Ok(mut c) = self.cache.lock() {
            c.used.insert(id); // seed line 561: idPool.Use
        }
        self.acquire_reference(id, key, lock).await?; // seed line 563
        self.local_use(key, id);
        Ok(id)
    }

    fn local_id(&self, key: &str) -> Option<u64> {
        self.local.lock().ok()?.get(key).map(|(id, _)| *id)
    }

    fn local_use(&self, key: &str, id: u64) {
        if let Ok(mut l) = self.local.lock() {
            l.entry(key.to_string()).or_insert((id, 0)).1 += 1;
        }
    }
}

#[async_trait::async_trait]
impl Node for CiliumNode {
    /// seed lines 588-660: `Allocate`.
    async fn acquire(&self, key: &str) -> Result<u64, String> {
        let mut backoff = BACKOFF_MIN;
        let mut last = String::new();
        for attempt in 0..MAX_ALLOC_ATTEMPTS {
            // seed lines 618-622: a key in local use costs nothing.
            if let Ok(mut l) = self.local.lock() {
                if let Some(e) = l.get_mut(key) {
                    e.1 += 1;
                    return Ok(e.0);
                }
            }
            match self.locked_allocate(key).await {
                Ok(id) => return Ok(id),
                Err(e) => last = e,
            }
            if attempt + 1 < MAX_ALLOC_ATTEMPTS {
                self.retries.fetch_add(1, Ordering::Relaxed);
                tokio::time::sleep(backoff).await; // seed line 654: boff.Wait
                backoff *= 2;
            }
        }
        Err(format!("cilium: {MAX_ALLOC_ATTEMPTS} attempts failed, last: {last}"))
    }

    /// seed lines 699-729: `Release`; the last local use deletes this node's slave key. The master
    /// key stays until the operator's GC (`RunGC`) finds no slave key.
    async fn release(&self, key: &str) -> Result<(), String> {
        let _slave_keys = self.slave_keys.lock().await; // seed line 710
        let last = {
            let mut l = self.local.lock().map_err(|_| "cilium local keys poisoned")?;
            match l.get_mut(key) {
                Some(e) if e.1 > 1 => {
                    e.1 -= 1;
                    false
                }
                Some(_) => {
                    l.remove(key);
                    true
                }
                None => return Ok(()),
            }
        };
        if last {
            let mut slave = value_prefix(key);
            slave.extend_from_slice(self.node.as_bytes());
            self.store
                .txn(TxnRequest::new().and_then([TxnOp::delete(slave)])) // seed line 725
                .await
                .map_err(|e| err("cilium release", e))?;
        }
        Ok(())
    }

    async fn knows(&self, keys: &[String]) -> bool {
        keys.iter().all(|k| self.cached(k).is_some())
    }
    fn retries(&self) -> u64 {
        self.retries.load(Ordering::Relaxed)
    }
    fn store(&self) -> &Counted {
        &self.store
    }
    async fn close(&self) {
        self.watch_task.abort();
        let _ = self.store.lease_revoke(self.lease).await;
    }
}
