//! The network configuration on stdin and its `ipam` section, checked whole before anything is
//! opened, so that a bad configuration writes nothing. Pure: no I/O but reading `token_file`
//! happens later, in the backend.

use std::collections::BTreeSet;
use std::net::IpAddr;

use idalloc::PoolSpec;
use ipnet::IpNet;
use serde_json::{Map, Value};

use crate::addr::Subnet;
use crate::cni::{code, CniError};

/// The keys of the `ipam` section (anything else is refused with code 2, naming it).
const IPAM_KEYS: [&str; 15] = [
    "type",
    "pool",
    "subnet",
    "gateway",
    "exclude",
    "ranges",
    "routes",
    "dns",
    "servers",
    "token_file",
    "ca_file",
    "store",
    "node",
    "prefix",
    "timeout",
];
/// The keys of one entry of `ranges`.
const RANGE_KEYS: [&str; 4] = ["pool", "subnet", "gateway", "exclude"];

/// One address range: a pool over one subnet.
#[derive(Clone, Debug)]
pub struct Range {
    pub subnet: Subnet,
    pub spec: PoolSpec,
    pub gateway: Option<IpAddr>,
}

/// How to reach idalloc.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Reach {
    /// `idalloc serve` replicas, with an optional token file and CA bundle.
    Servers { urls: Vec<String>, token_file: Option<String>, ca_file: Option<String> },
    /// A store URL, as the CLI takes (`etcd://…`, `file:…`).
    Store(String),
}

/// The parts of the network configuration the plugin uses.
#[derive(Clone, Debug)]
pub struct NetConf {
    pub cni_version: String,
    pub name: String,
    pub ranges: Vec<Range>,
    pub routes: Vec<Value>,
    pub dns: Option<Value>,
    pub reach: Reach,
    /// The holder of this node's references (`node`; default: the host name).
    pub node: Option<String>,
    /// The store prefix (`prefix`; default the library's).
    pub prefix: Option<String>,
    /// Bound on one request, in milliseconds (`timeout`, default 5000).
    pub timeout_ms: u64,
    /// GC's `cni.dev/valid-attachments`: `(containerID, ifname)`.
    pub valid_attachments: Option<BTreeSet<(String, String)>>,
    /// Addresses the runtime asks for (`runtimeConfig.ips`, `args.cni.ips`): hints.
    pub requested: Vec<IpAddr>,
    /// CHECK's `prevResult` addresses.
    pub prev_ips: Option<Vec<IpAddr>>,
}

fn invalid(msg: impl Into<String>, details: impl Into<String>) -> CniError {
    CniError::new(code::INVALID_CONFIG, msg, details)
}

/// Reads the config's `cniVersion` only (for the version check and the error object).
pub fn version_of(stdin: &[u8]) -> Option<String> {
    let v: Value = serde_json::from_slice(stdin).ok()?;
    v.get("cniVersion")?.as_str().map(str::to_string)
}

/// Parses the JSON on stdin.
pub fn parse_json(stdin: &[u8]) -> Result<Map<String, Value>, CniError> {
    match serde_json::from_slice::<Value>(stdin) {
        Ok(Value::Object(m)) => Ok(m),
        Ok(other) => Err(CniError::new(
            code::DECODING,
            "network configuration is not a JSON object",
            format!("got {}", kind(&other)),
        )),
        Err(e) => Err(CniError::new(
            code::DECODING,
            "cannot decode the network configuration",
            e.to_string(),
        )),
    }
}

fn kind(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

fn string(m: &Map<String, Value>, key: &str, at: &str) -> Result<Option<String>, CniError> {
    match m.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) => Ok(Some(s.clone())),
        Some(v) => Err(invalid(format!("{at}{key} must be a string"), format!("got {}", kind(v)))),
    }
}

fn strings(m: &Map<String, Value>, key: &str, at: &str) -> Result<Vec<String>, CniError> {
    match m.get(key) {
        None | Some(Value::Null) => Ok(Vec::new()),
        Some(Value::Array(a)) => a
            .iter()
            .map(|v| {
                v.as_str().map(str::to_string).ok_or_else(|| {
                    invalid(format!("{at}{key} must list strings"), format!("got {}", kind(v)))
                })
            })
            .collect(),
        Some(v) => {
            Err(invalid(format!("{at}{key} must be a list of strings"), format!("got {}", kind(v))))
        }
    }
}

fn unknown_keys(m: &Map<String, Value>, allowed: &[&str], at: &str) -> Result<(), CniError> {
    match m.iter().find(|(k, _)| !allowed.contains(&k.as_str())) {
        Some((k, v)) => Err(CniError::new(
            code::UNSUPPORTED_FIELD,
            format!("unsupported field {at}{k}: {v}"),
            format!("{at} keys are {}", allowed.join(", ")),
        )),
        None => Ok(()),
    }
}

/// The CNI network name rule (`^[a-zA-Z0-9][a-zA-Z0-9_.-]*$`); it never holds `/`, which
/// separates the parts of an attachment's key.
fn validate_name(name: &str) -> Result<(), CniError> {
    let ok = name.chars().next().is_some_and(|c| c.is_ascii_alphanumeric())
        && name.chars().all(|c| c.is_ascii_alphanumeric() || "_.-".contains(c));
    if ok {
        Ok(())
    } else {
        Err(invalid(
            format!("invalid network name {name:?}"),
            "a network name starts with a letter or digit, followed by letters, digits, '_', '.' \
             or '-'",
        ))
    }
}

fn range(m: &Map<String, Value>, at: &str) -> Result<Range, CniError> {
    let pool = string(m, "pool", at)?
        .ok_or_else(|| invalid(format!("{at}pool is missing"), "name the idalloc pool"))?;
    let subnet_text = string(m, "subnet", at)?.ok_or_else(|| {
        invalid(format!("{at}subnet is missing"), "give a CIDR, e.g. 10.1.2.0/24")
    })?;
    let subnet = Subnet::parse(&subnet_text).map_err(|e| invalid(format!("{at}subnet"), e))?;
    let gateway = match string(m, "gateway", at)? {
        Some(g) => {
            let ip: IpAddr = g
                .parse()
                .map_err(|_| invalid(format!("{at}gateway {g:?} is not an address"), ""))?;
            Some(ip)
        }
        None => Some(subnet.address(1)),
    };
    let mut reserved = Vec::new();
    if let Some(gw) = gateway {
        let id = subnet.id_of(gw).ok_or_else(|| {
            invalid(
                format!("{at}gateway {gw} is not a usable address of subnet {subnet_text}"),
                "the gateway lies inside the subnet, not its network or broadcast address",
            )
        })?;
        reserved.push((id, id));
    }
    for e in strings(m, "exclude", at)? {
        if let Some(r) = subnet.id_range_of(&e).map_err(|m| invalid(format!("{at}exclude"), m))? {
            reserved.push(r);
        }
    }
    let spec = subnet.spec(&pool, &reserved);
    spec.validate().map_err(|e| {
        invalid(format!("{at}pool {pool:?} cannot be made from {subnet_text}"), e.to_string())
    })?;
    Ok(Range { subnet, spec, gateway })
}

/// Parses and checks the whole configuration.
pub fn parse(m: &Map<String, Value>) -> Result<NetConf, CniError> {
    let cni_version = string(m, "cniVersion", "")?
        .ok_or_else(|| CniError::new(code::DECODING, "cniVersion is missing", ""))?;
    let name = string(m, "name", "")?
        .ok_or_else(|| invalid("network name is missing", "the configuration's \"name\""))?;
    validate_name(&name)?;
    let ipam = match m.get("ipam") {
        Some(Value::Object(o)) => o,
        _ => return Err(invalid("ipam section is missing or not an object", "")),
    };
    unknown_keys(ipam, &IPAM_KEYS, "ipam.")?;
    let mut ranges = Vec::new();
    match ipam.get("ranges") {
        Some(Value::Array(list)) => {
            if ipam.contains_key("subnet") || ipam.contains_key("pool") {
                return Err(invalid(
                    "ipam has both ranges and pool/subnet",
                    "give one range as pool + subnet, or several as ranges",
                ));
            }
            for (i, r) in list.iter().enumerate() {
                let at = format!("ipam.ranges[{i}].");
                let Value::Object(o) = r else {
                    return Err(invalid(format!("{at} is not an object"), ""));
                };
                unknown_keys(o, &RANGE_KEYS, &at)?;
                ranges.push(range(o, &at)?);
            }
        }
        Some(v) => return Err(invalid("ipam.ranges must be a list", format!("got {}", kind(v)))),
        None => ranges.push(range(ipam, "ipam.")?),
    }
    if ranges.is_empty() {
        return Err(invalid("ipam.ranges is empty", "give at least one range"));
    }
    let mut pools = BTreeSet::new();
    if let Some(r) = ranges.iter().find(|r| !pools.insert(r.spec.name().to_string())) {
        return Err(invalid(format!("pool {:?} is named by two ranges", r.spec.name()), ""));
    }
    let routes = match ipam.get("routes") {
        None | Some(Value::Null) => Vec::new(),
        Some(Value::Array(a)) => {
            for r in a {
                let dst = r.get("dst").and_then(Value::as_str).unwrap_or_default();
                if dst.parse::<IpNet>().is_err() {
                    return Err(invalid(format!("ipam.routes: bad dst in {r}"), "dst is a CIDR"));
                }
                if let Some(gw) = r.get("gw") {
                    if gw.as_str().and_then(|g| g.parse::<IpAddr>().ok()).is_none() {
                        return Err(invalid(format!("ipam.routes: bad gw in {r}"), ""));
                    }
                }
            }
            a.clone()
        }
        Some(v) => return Err(invalid("ipam.routes must be a list", format!("got {}", kind(v)))),
    };
    let dns = match ipam.get("dns") {
        None | Some(Value::Null) => None,
        Some(d @ Value::Object(_)) => Some(d.clone()),
        Some(v) => return Err(invalid("ipam.dns must be an object", format!("got {}", kind(v)))),
    };
    let servers = strings(ipam, "servers", "ipam.")?;
    let store = string(ipam, "store", "ipam.")?;
    let reach = match (servers.is_empty(), store) {
        (false, None) => Reach::Servers {
            urls: servers,
            token_file: string(ipam, "token_file", "ipam.")?,
            ca_file: string(ipam, "ca_file", "ipam.")?,
        },
        (true, Some(s)) => {
            idalloc::store::url::store_url(&s).map_err(|e| invalid("ipam.store", e))?;
            Reach::Store(s)
        }
        _ => {
            return Err(invalid(
                "ipam needs exactly one of servers and store",
                "servers: [\"https://idalloc:7379\"] for a cluster, or store: \"file:/var/lib/\
                 idalloc/ipam.redb\" (or etcd://…) for one host",
            ))
        }
    };
    let node = string(ipam, "node", "ipam.")?;
    if let Some(n) = &node {
        idalloc::pool::validate_durable_holder(n)
            .map_err(|e| invalid("ipam.node", e.to_string()))?;
    }
    let prefix = string(ipam, "prefix", "ipam.")?;
    let timeout_ms = match ipam.get("timeout") {
        None => 5000,
        Some(v) => v
            .as_u64()
            .filter(|t| (1..=600_000).contains(t))
            .ok_or_else(|| invalid(format!("ipam.timeout {v}"), "milliseconds, 1 to 600000"))?,
    };
    let valid_attachments = match m.get("cni.dev/valid-attachments") {
        None | Some(Value::Null) => None,
        Some(Value::Array(a)) => Some(
            a.iter()
                .map(|v| {
                    let id = v.get("containerID").and_then(Value::as_str);
                    let ifname = v.get("ifname").and_then(Value::as_str);
                    match (id, ifname) {
                        (Some(i), Some(f)) => Ok((i.to_string(), f.to_string())),
                        _ => Err(invalid(
                            format!("cni.dev/valid-attachments: bad entry {v}"),
                            "each entry has containerID and ifname",
                        )),
                    }
                })
                .collect::<Result<_, _>>()?,
        ),
        Some(v) => {
            return Err(invalid(
                "cni.dev/valid-attachments must be a list",
                format!("got {}", kind(v)),
            ))
        }
    };
    let mut requested = Vec::new();
    let lists = [
        m.get("runtimeConfig").and_then(|r| r.get("ips")),
        m.get("args").and_then(|a| a.get("cni")).and_then(|c| c.get("ips")),
    ];
    for v in lists.into_iter().flatten() {
        for ip in v.as_array().into_iter().flatten() {
            let s = ip.as_str().unwrap_or_default();
            let addr = s.split('/').next().unwrap_or_default();
            let parsed = addr
                .parse::<IpAddr>()
                .map_err(|_| invalid(format!("requested address {ip} is not an address"), ""))?;
            requested.push(parsed);
        }
    }
    let prev_ips = match m.get("prevResult") {
        None | Some(Value::Null) => None,
        Some(p) => Some(
            p.get("ips")
                .and_then(Value::as_array)
                .into_iter()
                .flatten()
                .filter_map(|i| i.get("address").and_then(Value::as_str))
                .filter_map(|a| a.parse::<IpNet>().ok().map(|n| n.addr()))
                .collect(),
        ),
    };
    Ok(NetConf {
        cni_version,
        name,
        ranges,
        routes,
        dns,
        reach,
        node,
        prefix,
        timeout_ms,
        valid_attachments,
        requested,
        prev_ips,
    })
}

/// The key of an attachment: what the spec says identifies it, network name, container ID and
/// interface name, joined by `/` (none of the three can hold one).
pub fn attachment_key(network: &str, container_id: &str, ifname: &str) -> String {
    format!("{network}/{container_id}/{ifname}")
}

/// The `(container ID, interface)` of a key of `network`, or `None` for another network's key.
pub fn parse_key<'a>(network: &str, key: &'a str) -> Option<(&'a str, &'a str)> {
    let rest = key.strip_prefix(network)?.strip_prefix('/')?;
    rest.split_once('/')
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn conf(ipam: Value) -> Result<NetConf, CniError> {
        let v = json!({"cniVersion": "1.0.0", "name": "net1", "type": "bridge", "ipam": ipam});
        parse(v.as_object().unwrap())
    }

    #[test]
    fn a_subnet_becomes_a_pool_of_its_usable_hosts() {
        let c = conf(json!({"type": "idalloc-ipam", "pool": "net1", "subnet": "10.1.2.0/24",
            "exclude": ["10.1.2.200/29", "10.1.2.9"], "store": "file:/tmp/x.redb"}))
        .unwrap();
        let spec = &c.ranges[0].spec;
        assert_eq!((spec.min(), spec.max()), (1, 254));
        assert_eq!(spec.reserved(), &[(1, 1), (9, 9), (200, 207)]);
        assert_eq!(c.ranges[0].gateway.unwrap().to_string(), "10.1.2.1");
    }

    #[test]
    fn bad_configurations_name_what_is_wrong() {
        let base = json!({"type": "idalloc-ipam", "pool": "p", "subnet": "10.1.2.0/24",
            "store": "file:/tmp/x"});
        let with = |k: &str, v: Value| {
            let mut b = base.clone();
            b[k] = v;
            conf(b).unwrap_err()
        };
        assert_eq!(with("colour", json!("red")).code, code::UNSUPPORTED_FIELD);
        assert!(with("colour", json!("red")).msg.contains("ipam.colour: \"red\""));
        assert!(with("gateway", json!("10.9.9.9")).msg.contains("10.9.9.9"));
        assert!(with("exclude", json!(["10.9.0.0/16"])).details.contains("not inside"));
        assert!(with("servers", json!(["http://x:1"])).msg.contains("exactly one"));
        assert!(with("store", json!("ftp:x")).details.contains("accepted stores"));
        assert!(with("node", json!("lease:x")).details.contains("lease:"));
        assert!(with("pool", json!("Bad Name")).details.contains("Bad Name"));
        let e = with("exclude", json!(["10.1.2.0/24"]));
        assert!(e.details.contains("at least one ID"), "{e:?}");
    }

    #[test]
    fn keys_round_trip() {
        let k = attachment_key("net1", "abc", "eth0");
        assert_eq!(parse_key("net1", &k), Some(("abc", "eth0")));
        assert_eq!(parse_key("net", &k), None);
        assert_eq!(parse_key("net1", "net10/abc/eth0"), None);
    }
}
