//! The verbs: what ADD, DEL, CHECK, GC and STATUS do with a parsed configuration. The key of an
//! attachment is `network/containerID/ifname`; the holder is the node; every reference is
//! durable, so an address lives until its attachment is deleted, garbage-collected, or its node
//! is released (`idalloc-ipam release-node`).

use std::net::IpAddr;

use idalloc::Error;
use serde_json::{json, Value};

use crate::backend::{Backend, OpenError, PoolHandle};
use crate::cni::{self, code, CniError, Command, Invocation};
use crate::config::{self, attachment_key, NetConf};

/// The CNI error for a library or service error: unavailable is "try again later" (11), an
/// exhausted pool is this plugin's code 100, a pool that exists with another spec and any other
/// refused input is an invalid configuration (7).
pub fn from_idalloc(e: &Error) -> CniError {
    match e {
        Error::Unavailable { .. } => {
            CniError::new(code::TRY_AGAIN_LATER, "idalloc is unavailable", e.to_string())
        }
        Error::Exhausted { .. } => {
            CniError::new(code::EXHAUSTED, "no free address in the pool", e.to_string())
        }
        Error::RangeMismatch { .. } => CniError::new(
            code::INVALID_CONFIG,
            "the pool exists with another subnet or exclusions",
            e.to_string(),
        ),
        Error::InvalidInput { .. } | Error::PoolNotFound { .. } | Error::AccessDenied { .. } => {
            CniError::new(code::INVALID_CONFIG, "idalloc refused the request", e.to_string())
        }
        _ => CniError::new(code::INTERNAL, "idalloc failed", e.to_string()),
    }
}

fn from_open(e: OpenError) -> CniError {
    use idalloc::store::StoreError;
    match e {
        OpenError::Config(m) => CniError::new(code::INVALID_CONFIG, "bad ipam configuration", m),
        OpenError::Idalloc(e) => from_idalloc(&e),
        OpenError::Store(e @ StoreError::InvalidRequest(_)) => {
            CniError::new(code::INVALID_CONFIG, "cannot open the store", e.to_string())
        }
        OpenError::Store(e @ StoreError::Corrupt { .. }) => {
            CniError::new(code::INTERNAL, "cannot open the store", e.to_string())
        }
        OpenError::Store(e) => {
            CniError::new(code::TRY_AGAIN_LATER, "cannot open the store", e.to_string())
        }
    }
}

/// This host's name, the default node.
pub fn host_name() -> Option<String> {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .ok()
        .or_else(|| std::env::var("HOSTNAME").ok())
        .map(|s| s.trim().to_string())
        .filter(|s| !s.is_empty())
}

/// The node (holder) of `conf`.
pub fn node_of(conf: &NetConf) -> Result<String, CniError> {
    conf.node.clone().or_else(host_name).ok_or_else(|| {
        CniError::new(code::INVALID_CONFIG, "no node name", "set ipam.node: the host has no name")
    })
}

/// Runs one invocation: `Some(result)` to print on success, `None` for verbs without output.
pub async fn run(inv: &Invocation, stdin: &[u8]) -> Result<Option<Value>, CniError> {
    if inv.command == Command::Version {
        return Ok(Some(cni::version_answer(config::version_of(stdin).as_deref())));
    }
    let raw = config::parse_json(stdin)?;
    let version = match raw.get("cniVersion").and_then(Value::as_str) {
        Some(v) => v.to_string(),
        None => return Err(CniError::new(code::DECODING, "cniVersion is missing", "")),
    };
    cni::check_version(&version, inv.command)?;
    let conf = config::parse(&raw)?;
    let node = node_of(&conf)?;
    let backend = Backend::open(&conf).await.map_err(from_open)?;
    let out = match inv.command {
        Command::Add => add(&backend, &conf, inv, &node).await.map(Some),
        Command::Del => del(&backend, &conf, inv, &node).await.map(|_| None),
        Command::Check => check(&backend, &conf, inv).await.map(|_| None),
        Command::Gc => gc(&backend, &conf, &node).await.map(|_| None),
        Command::Status => status(&backend, &conf).await.map(|_| None),
        Command::Version => Ok(None),
    };
    backend.close().await;
    out
}

/// The preferred ID in `range` for this ADD: an address the runtime asked for
/// (`runtimeConfig.ips`, `args.cni.ips`, `CNI_ARGS` `IP=`) that lies in the range.
fn hint(conf: &NetConf, inv: &Invocation, subnet: &crate::addr::Subnet) -> Option<u64> {
    let from_args = inv
        .args
        .iter()
        .filter(|(k, _)| k == "IP")
        .flat_map(|(_, v)| v.split(','))
        .filter_map(|a| a.split('/').next().and_then(|a| a.parse::<IpAddr>().ok()));
    conf.requested.iter().copied().chain(from_args).find_map(|ip| subnet.id_of(ip))
}

async fn add(
    backend: &Backend,
    conf: &NetConf,
    inv: &Invocation,
    node: &str,
) -> Result<Value, CniError> {
    let key = attachment_key(&conf.name, &inv.container_id, &inv.ifname);
    let mut done: Vec<(PoolHandle, bool)> = Vec::new();
    let mut ips = Vec::new();
    for r in &conf.ranges {
        let step = async {
            let pool = backend.ensure_pool(&r.spec).await?;
            let (id, new) = pool.acquire(&key, node, hint(conf, inv, &r.subnet)).await?;
            Ok::<_, Error>((pool, id, new))
        };
        match step.await {
            Ok((pool, id, fresh)) => {
                let ip = r.subnet.address(id);
                let mut entry = json!({"address": format!("{ip}/{}", r.subnet.net.prefix_len())});
                if let Some(gw) = r.gateway {
                    entry["gateway"] = json!(gw.to_string());
                }
                if conf.cni_version == "0.4.0" {
                    entry["version"] = json!(if ip.is_ipv6() { "6" } else { "4" });
                }
                ips.push(entry);
                done.push((pool, fresh));
            }
            Err(e) => {
                // One range failed: give back what this ADD bound in the others, so that a
                // failed ADD leaves nothing behind (an address held before stays held).
                for (pool, fresh) in &done {
                    if *fresh {
                        let _ = pool.release(&key, node).await;
                    }
                }
                return Err(from_idalloc(&e));
            }
        }
    }
    let mut result = json!({"cniVersion": conf.cni_version, "ips": ips});
    if !conf.routes.is_empty() {
        result["routes"] = Value::Array(conf.routes.clone());
    }
    if let Some(dns) = &conf.dns {
        result["dns"] = dns.clone();
    }
    Ok(result)
}

async fn del(
    backend: &Backend,
    conf: &NetConf,
    inv: &Invocation,
    node: &str,
) -> Result<(), CniError> {
    let key = attachment_key(&conf.name, &inv.container_id, &inv.ifname);
    for r in &conf.ranges {
        match backend.pool(r.spec.name()).await {
            Ok(pool) => pool.release(&key, node).await.map_err(|e| from_idalloc(&e))?,
            Err(Error::PoolNotFound { .. }) => {}
            Err(e) => return Err(from_idalloc(&e)),
        }
    }
    Ok(())
}

async fn check(backend: &Backend, conf: &NetConf, inv: &Invocation) -> Result<(), CniError> {
    let key = attachment_key(&conf.name, &inv.container_id, &inv.ifname);
    for r in &conf.ranges {
        let pool = backend.pool(r.spec.name()).await.map_err(|e| from_idalloc(&e))?;
        let Some(id) = pool.get(&key).await.map_err(|e| from_idalloc(&e))? else {
            return Err(CniError::new(
                code::CHECK_FAILED,
                format!("attachment {key} holds no address in pool {}", r.spec.name()),
                "it was deleted, garbage-collected, or its node was released",
            ));
        };
        let ip = r.subnet.address(id);
        if let Some(prev) = &conf.prev_ips {
            if !prev.contains(&ip) {
                return Err(CniError::new(
                    code::CHECK_FAILED,
                    format!("attachment {key} holds {ip}, which its previous result lacks"),
                    format!("previous result addresses: {prev:?}"),
                ));
            }
        }
    }
    Ok(())
}

async fn gc(backend: &Backend, conf: &NetConf, node: &str) -> Result<(), CniError> {
    let Some(valid) = &conf.valid_attachments else {
        return Err(CniError::new(
            code::INVALID_CONFIG,
            "GC needs cni.dev/valid-attachments",
            "without the list of valid attachments nothing can be freed safely",
        ));
    };
    for r in &conf.ranges {
        let pool = match backend.pool(r.spec.name()).await {
            Ok(p) => p,
            Err(Error::PoolNotFound { .. }) => continue,
            Err(e) => return Err(from_idalloc(&e)),
        };
        let bindings = pool.list().await.map_err(|e| from_idalloc(&e))?;
        for b in bindings {
            let Some((cid, ifname)) = config::parse_key(&conf.name, &b.key) else { continue };
            // Only this node's: the runtime lists the attachments of its own node.
            if !b.holders.iter().any(|h| h == node)
                || valid.contains(&(cid.to_string(), ifname.to_string()))
            {
                continue;
            }
            pool.release(&b.key, node).await.map_err(|e| from_idalloc(&e))?;
        }
    }
    Ok(())
}

async fn status(backend: &Backend, conf: &NetConf) -> Result<(), CniError> {
    for r in &conf.ranges {
        match backend.pool(r.spec.name()).await {
            Ok(_) | Err(Error::PoolNotFound { .. }) => {}
            Err(e) => {
                return Err(CniError::new(
                    code::NOT_AVAILABLE,
                    "idalloc is not reachable",
                    e.to_string(),
                ))
            }
        }
    }
    Ok(())
}

/// Releases every reference `node` holds in the pools of `conf` (a node that is gone): returns
/// the number released.
pub async fn release_node(conf: &NetConf, node: &str) -> Result<usize, CniError> {
    let backend = Backend::open(conf).await.map_err(from_open)?;
    let mut n = 0;
    let mut out = Ok(());
    'ranges: for r in &conf.ranges {
        let pool = match backend.pool(r.spec.name()).await {
            Ok(p) => p,
            Err(Error::PoolNotFound { .. }) => continue,
            Err(e) => {
                out = Err(from_idalloc(&e));
                break;
            }
        };
        let bindings = match pool.list().await {
            Ok(b) => b,
            Err(e) => {
                out = Err(from_idalloc(&e));
                break;
            }
        };
        for b in bindings.iter().filter(|b| b.holders.iter().any(|h| h == node)) {
            if let Err(e) = pool.release(&b.key, node).await {
                out = Err(from_idalloc(&e));
                break 'ranges;
            }
            n += 1;
        }
    }
    backend.close().await;
    out.map(|_| n)
}
