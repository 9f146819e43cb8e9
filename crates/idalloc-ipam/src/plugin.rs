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

/// The holder of addresses imported from Whereabouts (`import-whereabouts`): Whereabouts does
/// not record nodes, so imported addresses are held by this name until their attachment's DEL.
pub const IMPORT_HOLDER: &str = "whereabouts-import";

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
            Ok(pool) => {
                // The node's reference, and the import's if the address came from Whereabouts.
                for holder in [node, IMPORT_HOLDER] {
                    pool.release(&key, holder).await.map_err(|e| from_idalloc(&e))?;
                }
            }
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

/// One Whereabouts allocation: the address and the attachment that holds it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Imported {
    pub ip: IpAddr,
    pub container_id: String,
    pub ifname: String,
}

/// Whereabouts' name part for a range (`normalizeRange` in its `pkg/storage/kubernetes/ipam.go`):
/// `:` and `/` become `-`, after a `0` is added to a range that ends with `:`.
pub fn whereabouts_range_name(range: &str) -> String {
    let mut r = range.to_string();
    if r.ends_with(':') {
        r.push('0');
    }
    r.replace([':', '/'], "-")
}

/// Whether the `IPPool` named `name` with `spec.range` `range` belongs to Whereabouts network
/// `network`: Whereabouts names a network's pools `NETWORK-RANGE`, and a node slice's
/// `NETWORK-NODE-RANGE` (`IPPoolName`).
fn whereabouts_pool_of(name: &str, range: &str, network: &str) -> bool {
    let range = whereabouts_range_name(range);
    name.strip_prefix(network)
        .and_then(|rest| rest.strip_prefix('-'))
        .is_some_and(|rest| rest == range || rest.ends_with(&format!("-{range}")))
}

/// The allocations of Whereabouts `IPPool` resources (`kubectl get ippools.whereabouts.cni.cncf.io
/// -A -o json`: a list, or one pool) whose `spec.range` lies in one of `conf`'s subnets: the
/// network's pool, and its node slices' pools (`node_slice_size`), whose range is a slice of
/// it. With `network`, only the pools Whereabouts named for that `network_name`.
///
/// The format is Whereabouts' (`pkg/api/whereabouts.cni.cncf.io/v1alpha1/ippool_types.go`,
/// `toIPReservationList` in `pkg/storage/kubernetes/ipam.go`): `spec.allocations` maps the
/// decimal offset of an address from the IP of `spec.range` (as `net.ParseCIDR` reads it: the
/// range as written, which Whereabouts stores as the network address) to `{"id": container ID,
/// "podref": "namespace/pod", "ifname"}`. Entries without `ifname` (Whereabouts before it
/// recorded interfaces) take `default_ifname`.
pub fn whereabouts_allocations(
    conf: &NetConf,
    doc: &Value,
    default_ifname: &str,
    network: Option<&str>,
) -> Result<Vec<Imported>, String> {
    let items: Vec<&Value> = match doc.get("items").and_then(Value::as_array) {
        Some(items) => items.iter().collect(),
        None => vec![doc],
    };
    let mut out = Vec::new();
    for item in items {
        let name = item["metadata"]["name"].as_str().unwrap_or("(unnamed)");
        let range = item["spec"]["range"]
            .as_str()
            .ok_or_else(|| format!("IPPool {name} has no spec.range"))?;
        let net: ipnet::IpNet =
            range.parse().map_err(|_| format!("IPPool {name}: range {range:?} is not a CIDR"))?;
        if !conf.ranges.iter().any(|r| r.subnet.net.contains(&net)) {
            continue;
        }
        if network.is_some_and(|n| !whereabouts_pool_of(name, range, n)) {
            continue;
        }
        let Some(allocs) = item["spec"]["allocations"].as_object() else { continue };
        let base = match net.addr() {
            IpAddr::V4(v) => u128::from(u32::from(v)),
            IpAddr::V6(v) => u128::from(v),
        };
        for (offset, a) in allocs {
            let off: u64 = offset.parse().map_err(|_| {
                format!("IPPool {name}: allocation key {offset:?} is not a decimal offset")
            })?;
            let ip = base.checked_add(u128::from(off)).and_then(|n| {
                if net.addr().is_ipv6() {
                    Some(IpAddr::V6(n.into()))
                } else {
                    u32::try_from(n).ok().map(|n| IpAddr::V4(n.into()))
                }
            });
            let ip = ip.filter(|ip| net.contains(ip)).ok_or_else(|| {
                format!("IPPool {name}: allocation offset {off} lies outside range {range}")
            })?;
            let container_id = a["id"]
                .as_str()
                .ok_or_else(|| format!("IPPool {name}: allocation {offset} has no id"))?
                .to_string();
            let ifname = match a["ifname"].as_str() {
                Some(i) if !i.is_empty() => i.to_string(),
                _ => default_ifname.to_string(),
            };
            out.push(Imported { ip, container_id, ifname });
        }
    }
    Ok(out)
}

/// Binds every allocation of `list` to its own address as a durable binding of
/// [`IMPORT_HOLDER`], so no running pod's address changes. Returns how many were bound; an
/// address that is taken by another attachment, or outside every range, is an error naming it
/// (what was bound before stays: the import is idempotent, run it again once fixed).
pub async fn import(conf: &NetConf, list: &[Imported]) -> Result<usize, CniError> {
    let backend = Backend::open(conf).await.map_err(from_open)?;
    if !matches!(backend, Backend::Store(_)) {
        backend.close().await;
        return Err(CniError::new(
            code::INVALID_CONFIG,
            "import-whereabouts needs ipam.store",
            "the import binds each address to its own ID, which needs the store directly: give a \
             configuration with store: etcd://… (the same etcd serve uses, and its prefix)",
        ));
    }
    let mut n = 0;
    let mut out = Ok(());
    'all: for r in &conf.ranges {
        let pool = match backend.ensure_pool(&r.spec).await {
            Ok(p) => p,
            Err(e) => {
                out = Err(from_idalloc(&e));
                break;
            }
        };
        for a in list.iter().filter(|a| r.subnet.net.contains(&a.ip)) {
            let key = attachment_key(&conf.name, &a.container_id, &a.ifname);
            let Some(want) = r.subnet.id_of(a.ip) else {
                out = Err(CniError::new(
                    code::INVALID_CONFIG,
                    format!("{} of {key} is not a usable address of {}", a.ip, r.subnet.net),
                    "",
                ));
                break 'all;
            };
            match pool.acquire(&key, IMPORT_HOLDER, Some(want)).await {
                Ok((id, _)) if id == want => n += 1,
                Ok((id, _)) => {
                    let _ = pool.release(&key, IMPORT_HOLDER).await;
                    out = Err(CniError::new(
                        code::INVALID_CONFIG,
                        format!(
                            "{} of {key} is taken (reserved, or bound to another attachment); \
                             it would get {}",
                            a.ip,
                            r.subnet.address(id)
                        ),
                        "nothing was bound for it; free or un-exclude the address and run again",
                    ));
                    break 'all;
                }
                Err(e) => {
                    out = Err(from_idalloc(&e));
                    break 'all;
                }
            }
        }
    }
    backend.close().await;
    out.map(|_| n)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn conf(subnet: &str) -> NetConf {
        let v = json!({"cniVersion": "1.0.0", "name": "net", "ipam": {"type": "idalloc-ipam",
            "pool": "p", "subnet": subnet, "store": "file:/tmp/unused.redb"}});
        let Some(m) = v.as_object() else { unreachable!("a JSON object") };
        match config::parse(m) {
            Ok(c) => c,
            Err(e) => panic!("{}: {}", e.msg, e.details),
        }
    }

    #[test]
    fn pool_names_follow_whereabouts_normalize_range() {
        assert_eq!(whereabouts_range_name("10.27.0.0/24"), "10.27.0.0-24");
        assert_eq!(whereabouts_range_name("fd00:1::/64"), "fd00-1---64");
        assert!(whereabouts_pool_of("net-10.27.0.0-24", "10.27.0.0/24", "net"));
        assert!(whereabouts_pool_of("net-node-3-10.27.0.64-28", "10.27.0.64/28", "net"));
        assert!(!whereabouts_pool_of("other-10.27.0.0-24", "10.27.0.0/24", "net"));
        assert!(!whereabouts_pool_of("net-10.27.0.0-24", "10.27.0.0/16", "net"));
    }

    #[test]
    fn ipv6_offsets_count_from_the_range_and_stay_inside_it() {
        let c = conf("fd00:1::/64");
        let doc = json!({"apiVersion": "whereabouts.cni.cncf.io/v1alpha1", "kind": "IPPool",
            "metadata": {"name": "fd00-1---64", "namespace": "kube-system"},
            "spec": {"range": "fd00:1::/64", "allocations": {
                "10": {"id": "c1", "podref": "ns/a", "ifname": "net2"},
                "18446744073709551615": {"id": "c2", "podref": "ns/b"}}}});
        let mut got = whereabouts_allocations(&c, &doc, "net1", None).unwrap_or_default();
        got.sort_by_key(|a| a.ip);
        let ips: Vec<String> = got.iter().map(|a| a.ip.to_string()).collect();
        assert_eq!(ips, ["fd00:1::a", "fd00:1::ffff:ffff:ffff:ffff"]);
        assert_eq!((got[0].ifname.as_str(), got[1].ifname.as_str()), ("net2", "net1"));
        // An offset past a /120's end is refused, naming it.
        let small = conf("fd00:1::/120");
        let doc = json!({"metadata": {"name": "x"}, "spec": {"range": "fd00:1::/120",
            "allocations": {"256": {"id": "c", "podref": "ns/c"}}}});
        let e = whereabouts_allocations(&small, &doc, "net1", None).unwrap_err();
        assert!(e.contains("256") && e.contains("outside"), "{e}");
    }
}
