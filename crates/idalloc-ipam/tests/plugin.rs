//! The plugin as a runtime runs it, on a file store (one host): ADD/DEL/CHECK/GC/STATUS,
//! restore by hint (on the store and through `idalloc serve`), a node's release, IPv6 and dual
//! stack, and the errors with their codes.

mod common;

use common::{exec, exec_env, netconf, BIN};
use serde_json::{json, Value};

struct Host {
    _dir: tempfile::TempDir,
    store: String,
    path: std::path::PathBuf,
}

fn host() -> Host {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("ipam.redb");
    Host { store: format!("file:{}", path.display()), path, _dir: dir }
}

fn v4(h: &Host, node: &str) -> Value {
    netconf(
        "1.1.0",
        "net1",
        json!({"type": "idalloc-ipam", "pool": "net1", "subnet": "10.22.0.0/24",
               "exclude": ["10.22.0.2/31"], "store": h.store, "node": node,
               "routes": [{"dst": "0.0.0.0/0"}], "dns": {"nameservers": ["10.22.0.53"]}}),
    )
}

#[test]
fn add_is_idempotent_del_frees_and_del_of_unknown_succeeds() {
    let h = host();
    let conf = v4(&h, "n1");
    let a = exec("ADD", "c1", "eth0", &conf);
    let addr = a.addresses();
    assert_eq!(addr.len(), 1);
    assert!(addr[0].starts_with("10.22.0.") && addr[0].ends_with("/24"), "{addr:?}");
    // Gateway, network, broadcast and excluded addresses are never given.
    for never in ["10.22.0.0/24", "10.22.0.1/24", "10.22.0.2/24", "10.22.0.3/24", "10.22.0.255/24"]
    {
        assert_ne!(addr[0], never);
    }
    assert_eq!(a.json["ips"][0]["gateway"], "10.22.0.1");
    assert_eq!(a.json["routes"], json!([{"dst": "0.0.0.0/0"}]));
    assert_eq!(a.json["dns"]["nameservers"][0], "10.22.0.53");
    assert_eq!(a.json["cniVersion"], "1.1.0");
    assert!(a.json["ips"][0].get("version").is_none(), "1.x results have no ips[].version");
    assert_eq!(exec("ADD", "c1", "eth0", &conf).addresses(), addr, "ADD twice: same address");
    let other = exec("ADD", "c1", "net1", &conf).addresses();
    assert_ne!(other, addr, "another interface of the container is another attachment");

    let mut check = conf.clone();
    check["prevResult"] = a.json.clone();
    assert!(exec("CHECK", "c1", "eth0", &check).ok, "CHECK of a living attachment passes");
    let del = exec("DEL", "c1", "eth0", &conf);
    assert!(del.ok && del.json.is_null(), "{del:?}");
    assert_eq!(exec("CHECK", "c1", "eth0", &check).err_code(), 101, "CHECK after DEL fails");
    assert!(exec("DEL", "c1", "eth0", &conf).ok, "DEL is idempotent");
    assert!(exec("DEL", "never-added", "eth0", &conf).ok, "DEL of an unknown attachment");
}

#[test]
fn results_follow_the_config_version() {
    let h = host();
    let mut conf = v4(&h, "n1");
    conf["cniVersion"] = json!("0.4.0");
    let a = exec("ADD", "c1", "eth0", &conf);
    assert_eq!(a.json["cniVersion"], "0.4.0");
    assert_eq!(a.json["ips"][0]["version"], "4", "0.4.0 results carry ips[].version");
    conf["cniVersion"] = json!("1.0.0");
    assert_eq!(exec("ADD", "c2", "eth0", &conf).json["cniVersion"], "1.0.0");
    let v = exec_env(&[("CNI_COMMAND", "VERSION")], r#"{"cniVersion":"1.0.0"}"#);
    assert!(v.ok);
    assert_eq!(
        v.json,
        json!({"cniVersion": "1.0.0", "supportedVersions": ["0.4.0", "1.0.0", "1.1.0"]})
    );
}

#[test]
fn every_address_of_a_small_subnet_is_distinct_then_exhausted_writes_nothing() {
    let h = host();
    // /28: 14 usable hosts, minus the gateway and the excluded .2-.3: 11 addresses.
    let conf = netconf(
        "1.0.0",
        "small",
        json!({"type": "idalloc-ipam", "pool": "small", "subnet": "10.23.0.0/28",
               "exclude": ["10.23.0.2", "10.23.0.3"], "store": h.store, "node": "n1"}),
    );
    let handles: Vec<_> = (0..11)
        .map(|i| {
            let conf = conf.clone();
            std::thread::spawn(move || exec("ADD", &format!("c{i}"), "eth0", &conf))
        })
        .collect();
    let mut seen: Vec<String> =
        handles.into_iter().map(|t| t.join().expect("thread").addresses()[0].clone()).collect();
    seen.sort();
    seen.dedup();
    assert_eq!(seen.len(), 11, "11 concurrent ADDs, 11 distinct addresses: {seen:?}");
    let full = exec("ADD", "c11", "eth0", &conf);
    assert_eq!(full.err_code(), 100, "{full:?}");
    assert!(full.json["details"].as_str().unwrap_or_default().contains("small"), "{full:?}");
    // The failed ADD bound nothing: freeing one address lets exactly one more in.
    assert!(exec("DEL", "c0", "eth0", &conf).ok);
    assert!(exec("ADD", "c11", "eth0", &conf).ok);
    assert_eq!(exec("ADD", "c12", "eth0", &conf).err_code(), 100);
}

#[test]
fn gc_frees_exactly_the_attachments_not_listed_and_only_this_nodes() {
    let h = host();
    let n1 = v4(&h, "n1");
    let n2 = v4(&h, "n2");
    let keep = exec("ADD", "keep", "eth0", &n1).addresses();
    let gone = exec("ADD", "gone", "eth0", &n1).addresses();
    let gone2 = exec("ADD", "keep", "eth1", &n1).addresses();
    let elsewhere = exec("ADD", "elsewhere", "eth0", &n2).addresses();
    let mut gc = n1.clone();
    gc["cni.dev/valid-attachments"] = json!([{"containerID": "keep", "ifname": "eth0"}]);
    let out = exec_env(&[("CNI_COMMAND", "GC"), ("CNI_PATH", "/usr/lib/cni")], &gc.to_string());
    assert!(out.ok && out.json.is_null(), "{out:?}");
    // ADD again answers the address an attachment holds, or a new one if it held none.
    assert_eq!(exec("ADD", "keep", "eth0", &n1).addresses(), keep, "listed: kept");
    assert_eq!(exec("ADD", "elsewhere", "eth0", &n2).addresses(), elsewhere, "other node: kept");
    let mut check = n1.clone();
    check["prevResult"] = json!({"cniVersion": "1.1.0", "ips": [{"address": gone[0]}]});
    assert_eq!(exec("CHECK", "gone", "eth0", &check).err_code(), 101, "not listed: freed");
    check["prevResult"] = json!({"cniVersion": "1.1.0", "ips": [{"address": gone2[0]}]});
    assert_eq!(exec("CHECK", "keep", "eth1", &check).err_code(), 101, "other interface: freed");
    // Without the list nothing is freed (a GC that cannot tell what is valid must not guess).
    let missing = exec_env(&[("CNI_COMMAND", "GC"), ("CNI_PATH", "/x")], &n1.to_string());
    assert_eq!(missing.err_code(), 7);
    // GC is 1.1.0's: an older config is refused.
    let mut old = gc.clone();
    old["cniVersion"] = json!("1.0.0");
    assert_eq!(
        exec_env(&[("CNI_COMMAND", "GC"), ("CNI_PATH", "/x")], &old.to_string()).err_code(),
        1
    );
}

fn release_node(conf: &Value, node: &str) -> Value {
    let dir = tempfile::tempdir().expect("tempdir");
    let file = dir.path().join("net.conflist");
    let list = json!({"cniVersion": conf["cniVersion"], "name": conf["name"],
                      "plugins": [{"type": "bridge", "ipam": conf["ipam"]}]});
    std::fs::write(&file, list.to_string()).expect("write conflist");
    let out = std::process::Command::new(BIN)
        .args(["release-node", node, "--config"])
        .arg(&file)
        .output()
        .expect("run release-node");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    serde_json::from_slice(&out.stdout).expect("release-node prints JSON")
}

#[test]
fn a_released_node_frees_its_addresses_and_a_restarted_runtime_gets_its_address_back() {
    let h = host();
    let n1 = v4(&h, "n1");
    let n2 = v4(&h, "n2");
    let a = exec("ADD", "a", "eth0", &n1).addresses();
    exec("ADD", "b", "eth0", &n1).addresses();
    let other = exec("ADD", "c", "eth0", &n2).addresses();
    assert_eq!(release_node(&n1, "n1")["released"], 2);
    let mut check = n1.clone();
    check["prevResult"] = json!({"cniVersion": "1.1.0", "ips": [{"address": a[0]}]});
    assert_eq!(exec("CHECK", "a", "eth0", &check).err_code(), 101, "n1's addresses are free");
    check["prevResult"] = json!({"cniVersion": "1.1.0", "ips": [{"address": other[0]}]});
    assert!(exec("CHECK", "c", "eth0", &check).ok, "n2's address stays");
    // The container kept its address while its record was freed: the runtime's ADD asks for it
    // (runtimeConfig.ips, the "ips" capability) and gets it back, as it is still free.
    let mut again = n1.clone();
    again["runtimeConfig"] = json!({"ips": [a[0]]});
    assert_eq!(exec("ADD", "a", "eth0", &again).addresses(), a);
    // CNI_ARGS IP= is a hint too.
    let b_addr = "10.22.0.200";
    let out = exec_env(
        &[
            ("CNI_COMMAND", "ADD"),
            ("CNI_CONTAINERID", "b"),
            ("CNI_NETNS", "/x"),
            ("CNI_IFNAME", "eth0"),
            ("CNI_PATH", "/x"),
            ("CNI_ARGS", &format!("IgnoreUnknown=1;IP={b_addr}")),
        ],
        &n1.to_string(),
    );
    assert_eq!(out.addresses(), vec![format!("{b_addr}/24")]);
}

/// Restore by hint through `idalloc serve`: a node's records are freed (`idalloc gc --holder`)
/// while its containers keep their addresses; the restarted runtime's ADDs ask for them
/// (`runtimeConfig.ips`) and get each one back, and an address another attachment took meanwhile
/// is not given twice.
#[test]
fn a_restarted_runtime_gets_its_addresses_back_through_serve() {
    let h = host();
    let bin = idalloc_testkit::serve::workspace_bin();
    let serve =
        idalloc_testkit::serve::Serve::start(&bin.to_string_lossy(), &["--store", &h.store], &[]);
    let conf = netconf(
        "1.1.0",
        "served",
        json!({"type": "idalloc-ipam", "pool": "served", "subnet": "10.23.0.0/24",
               "servers": [serve.http("")], "node": "n1"}),
    );
    let before: Vec<String> = (0..4)
        .map(|i| exec("ADD", &format!("c{i}"), "eth0", &conf).addresses()[0].clone())
        .collect();
    let out = std::process::Command::new(&bin)
        .args(["--server", &serve.http(""), "gc", "--holder", "n1", "served"])
        .output()
        .expect("run idalloc gc --holder");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    // Another node's container takes c3's address first (the hint of c3 cannot be granted).
    let mut other = conf.clone();
    other["ipam"]["node"] = json!("n2");
    other["runtimeConfig"] = json!({"ips": [before[3]]});
    assert_eq!(exec("ADD", "x", "eth0", &other).addresses(), vec![before[3].clone()]);
    for (i, addr) in before.iter().enumerate() {
        let mut again = conf.clone();
        again["runtimeConfig"] = json!({"ips": [addr]});
        let got = exec("ADD", &format!("c{i}"), "eth0", &again).addresses();
        if i < 3 {
            assert_eq!(&got, &vec![addr.clone()], "c{i} gets its address back");
        } else {
            assert_ne!(&got, &vec![addr.clone()], "taken meanwhile: another address");
        }
    }
}

#[test]
fn ipv6_slash_64_and_dual_stack() {
    let h = host();
    let v6 = netconf(
        "1.0.0",
        "v6net",
        json!({"type": "idalloc-ipam", "pool": "v6", "subnet": "fd00:22::/64", "store": h.store,
               "node": "n1"}),
    );
    let a = exec("ADD", "c1", "eth0", &v6);
    let addr = a.addresses();
    assert!(addr[0].starts_with("fd00:22::") && addr[0].ends_with("/64"), "{addr:?}");
    assert_eq!(a.json["ips"][0]["gateway"], "fd00:22::1");
    let dual = netconf(
        "0.4.0",
        "dual",
        json!({"type": "idalloc-ipam", "store": h.store, "node": "n1", "ranges": [
            {"pool": "dual-v4", "subnet": "10.24.0.0/16"},
            {"pool": "dual-v6", "subnet": "fd00:24::/64", "gateway": "fd00:24::fffe"}]}),
    );
    let d = exec("ADD", "c1", "eth0", &dual);
    let addrs = d.addresses();
    assert_eq!(addrs.len(), 2, "{d:?}");
    assert!(addrs[0].starts_with("10.24.") && addrs[1].starts_with("fd00:24::"), "{addrs:?}");
    assert_eq!(d.json["ips"][1]["version"], "6");
    assert_eq!(d.json["ips"][1]["gateway"], "fd00:24::fffe");
    assert_eq!(exec("ADD", "c1", "eth0", &dual).addresses(), addrs);
    assert!(exec("DEL", "c1", "eth0", &dual).ok);
    let mut check = dual.clone();
    check["prevResult"] = d.json.clone();
    assert_eq!(exec("CHECK", "c1", "eth0", &check).err_code(), 101);
}

#[test]
fn a_dual_stack_add_that_fails_in_one_pool_leaves_nothing_in_the_other() {
    let h = host();
    let dual = |v4: &str| {
        netconf(
            "1.0.0",
            "dual",
            json!({"type": "idalloc-ipam", "store": h.store, "node": "n1", "ranges": [
                {"pool": "d4", "subnet": v4}, {"pool": "d6", "subnet": "fd00:25::/126"}]}),
        )
    };
    // d6 (/126) has 2 usable addresses after its gateway.
    assert!(exec("ADD", "a", "eth0", &dual("10.25.0.0/24")).ok);
    assert!(exec("ADD", "b", "eth0", &dual("10.25.0.0/24")).ok);
    assert_eq!(exec("ADD", "c", "eth0", &dual("10.25.0.0/24")).err_code(), 100);
    let only_v4 = netconf(
        "1.0.0",
        "dual",
        json!({"type": "idalloc-ipam", "store": h.store, "node": "n1", "pool": "d4",
               "subnet": "10.25.0.0/24"}),
    );
    let mut check = only_v4.clone();
    check["prevResult"] = json!({"ips": []});
    assert_eq!(exec("CHECK", "c", "eth0", &check).err_code(), 101, "c's v4 address was given back");
    // A pool that exists with another subnet is a configuration error (7), nothing written.
    let changed = exec("ADD", "d", "eth0", &dual("10.25.0.0/23"));
    assert_eq!(changed.err_code(), 7, "{changed:?}");
    assert!(changed.json["details"].as_str().unwrap_or_default().contains("d4"), "{changed:?}");
}

#[test]
fn unreachable_idalloc_is_try_again_later_and_status_not_available() {
    // A port nobody listens on: bind one, note it, close it.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .expect("bind")
        .local_addr()
        .expect("addr")
        .port();
    let conf = netconf(
        "1.1.0",
        "net1",
        json!({"type": "idalloc-ipam", "pool": "net1", "subnet": "10.26.0.0/24", "node": "n1",
               "servers": [format!("http://127.0.0.1:{port}")], "timeout": 300}),
    );
    for verb in ["ADD", "DEL"] {
        let out = exec(verb, "c1", "eth0", &conf);
        assert_eq!(out.err_code(), 11, "{verb}: {out:?}");
        assert_eq!(out.code, Some(1));
    }
    let st = exec_env(&[("CNI_COMMAND", "STATUS"), ("CNI_PATH", "/x")], &conf.to_string());
    assert_eq!(st.err_code(), 50, "{st:?}");
    let mut etcd = conf.clone();
    etcd["ipam"].as_object_mut().expect("ipam").remove("servers");
    etcd["ipam"]["store"] = json!(format!("etcd://127.0.0.1:{port}"));
    assert_eq!(exec("ADD", "c1", "eth0", &etcd).err_code(), 11);
    let h = host();
    let ok = v4(&h, "n1");
    assert!(exec_env(&[("CNI_COMMAND", "STATUS"), ("CNI_PATH", "/x")], &ok.to_string()).ok);
}

/// Every verb, with each kind of bad input: the spec's error object (cniVersion, code, msg,
/// details), exit status 1, and no store file created.
#[test]
fn conformance_bad_input_gives_the_spec_error_and_writes_nothing() {
    let h = host();
    let good = v4(&h, "n1");
    let full_env = |cmd: &'static str| {
        vec![
            ("CNI_COMMAND", cmd),
            ("CNI_CONTAINERID", "c1"),
            ("CNI_NETNS", "/x"),
            ("CNI_IFNAME", "eth0"),
            ("CNI_PATH", "/x"),
        ]
    };
    let with = |k: &str, v: Value| {
        let mut c = good.clone();
        c[k] = v;
        c.to_string()
    };
    let with_ipam = |k: &str, v: Value| {
        let mut c = good.clone();
        c["ipam"][k] = v;
        c.to_string()
    };
    let cases: Vec<(&str, String, u64)> = vec![
        ("malformed JSON", "{\"cniVersion\": ".to_string(), 6),
        ("not an object", "[1,2]".to_string(), 6),
        (
            "no cniVersion",
            {
                let mut c = good.clone();
                c.as_object_mut().unwrap().remove("cniVersion");
                c.to_string()
            },
            6,
        ),
        ("unknown cniVersion", with("cniVersion", json!("0.3.1")), 1),
        ("future cniVersion", with("cniVersion", json!("9.0.0")), 1),
        ("no ipam", with("ipam", Value::Null), 7),
        ("unknown ipam key", with_ipam("rangeStart", json!("10.22.0.5")), 2),
        ("bad subnet", with_ipam("subnet", json!("10.22.0.0/33")), 7),
        ("gateway outside", with_ipam("gateway", json!("10.99.0.1")), 7),
        ("both store and servers", with_ipam("servers", json!(["http://127.0.0.1:1"])), 7),
        ("bad store URL", with_ipam("store", json!("ftp://x")), 7),
        ("bad network name", with("name", json!("no/slash")), 7),
    ];
    for cmd in ["ADD", "DEL", "CHECK", "GC", "STATUS"] {
        for (what, stdin, code) in &cases {
            let out = exec_env(&full_env(cmd), stdin);
            // GC and STATUS on a 1.1.0 config; on a config without a known version, 1 comes
            // first for them only if the version is readable: the code is the same either way.
            assert_eq!(out.err_code(), *code, "{cmd} with {what}: {out:?}");
            assert_eq!(out.code, Some(1), "{cmd} with {what}: exit status");
            for k in ["cniVersion", "msg", "details"] {
                assert!(out.json[k].is_string(), "{cmd} with {what}: no {k}: {out:?}");
            }
        }
        // Every required variable missing: code 4, the names in the message.
        let out = exec_env(&[("CNI_COMMAND", cmd)], &good.to_string());
        assert_eq!(out.err_code(), 4, "{cmd} without its variables: {out:?}");
        assert!(out.json["msg"].as_str().unwrap_or_default().contains("CNI_PATH"), "{out:?}");
        let mut bad_id = full_env(cmd);
        bad_id[1] = ("CNI_CONTAINERID", "-bad");
        if matches!(cmd, "ADD" | "DEL" | "CHECK") {
            assert_eq!(exec_env(&bad_id, &good.to_string()).err_code(), 4, "{cmd} bad ID");
        }
    }
    let none = exec_env(&[], &good.to_string());
    assert_eq!(none.err_code(), 4, "no CNI_COMMAND: {none:?}");
    assert_eq!(exec_env(&[("CNI_COMMAND", "FROB")], &good.to_string()).err_code(), 4);
    // CHECK is 0.4.0's and GC/STATUS 1.1.0's: older configs are refused with code 1.
    let old = with("cniVersion", json!("1.0.0"));
    for cmd in ["GC", "STATUS"] {
        assert_eq!(exec_env(&full_env(cmd), &old).err_code(), 1, "{cmd} on 1.0.0");
    }
    assert!(!h.path.exists(), "a refused invocation created the store file");
    // VERSION answers whatever the config says (that is how a runtime learns what to send).
    let v = exec_env(&[("CNI_COMMAND", "VERSION")], "{\"cniVersion\":\"0.3.1\"}");
    assert!(v.ok && v.json["supportedVersions"].is_array(), "{v:?}");
}

#[test]
fn release_node_refuses_bad_arguments() {
    let out = std::process::Command::new(BIN).args(["frob"]).output().expect("run");
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("release-node"));
}

fn import(conf: &Value, pools: &Value, extra: &[&str]) -> std::process::Output {
    let dir = tempfile::tempdir().expect("tempdir");
    let (file, input) = (dir.path().join("net.conf"), dir.path().join("ippools.json"));
    std::fs::write(&file, conf.to_string()).expect("write conf");
    std::fs::write(&input, pools.to_string()).expect("write ippools");
    std::process::Command::new(BIN)
        .arg("import-whereabouts")
        .arg(&input)
        .arg("--config")
        .arg(&file)
        .args(extra)
        .output()
        .expect("run import-whereabouts")
}

#[test]
fn whereabouts_allocations_import_as_bindings_so_no_address_changes() {
    let h = host();
    let conf = netconf(
        "1.0.0",
        "macvlan-net",
        json!({"type": "idalloc-ipam", "pool": "wa", "subnet": "10.27.0.0/24", "store": h.store,
               "node": "n1"}),
    );
    // `kubectl get ippools.whereabouts.cni.cncf.io -A -o json` as Whereabouts writes it
    // (pkg/storage/kubernetes/ipam.go): a pool per network and range named NETWORK-RANGE, a
    // node slice's named NETWORK-NODE-RANGE; allocations keyed by the decimal offset from the
    // range's address; `ifname` absent in records of older versions.
    let pool = |name: &str, range: &str, allocations: Value| {
        json!({"apiVersion": "whereabouts.cni.cncf.io/v1alpha1", "kind": "IPPool",
               "metadata": {"creationTimestamp": "2026-11-30T09:12:44Z", "generation": 7,
                            "name": name, "namespace": "kube-system", "resourceVersion": "48113",
                            "uid": "8a4b0c8e-52a4-4f0e-9a55-0d5bb2f3c6a1"},
               "spec": {"allocations": allocations, "range": range}})
    };
    let pools = json!({"apiVersion": "v1", "kind": "List", "metadata": {"resourceVersion": ""},
        "items": [
        pool("macvlan-net-10.27.0.0-24", "10.27.0.0/24", json!({
            "5": {"id": "podA", "podref": "default/a", "ifname": "net1"},
            "77": {"id": "podB", "podref": "default/b"}})),
        // A node slice (node_slice_size): offsets count from the slice's address.
        pool("macvlan-net-node1-10.27.0.64-28", "10.27.0.64/28", json!({
            "3": {"id": "podS", "podref": "default/s", "ifname": "net1"}})),
        // Another Whereabouts network on the same range (network_name): not this one's.
        pool("other-net-10.27.0.0-24", "10.27.0.0/24", json!({
            "200": {"id": "podO", "podref": "default/o", "ifname": "net1"}})),
        pool("macvlan-net-10.99.0.0-24", "10.99.0.0/24", json!({
            "9": {"id": "elsewhere", "podref": "default/x", "ifname": "net1"}}))]});
    let out = import(&conf, &pools, &["--network-name", "macvlan-net"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let answer: Value = serde_json::from_slice(&out.stdout).expect("JSON");
    assert_eq!(answer["imported"], 3);
    let mut check = conf.clone();
    check["prevResult"] = json!({"ips": [{"address": "10.27.0.67/24"}]});
    assert!(exec("CHECK", "podS", "net1", &check).ok, "the node slice's .64 + 3");
    check["prevResult"] = json!({"ips": []});
    assert_eq!(exec("CHECK", "podO", "net1", &check).err_code(), 101, "other network skipped");
    // The imported attachments keep their addresses (what their runtime's ADD or CHECK asks)...
    check["prevResult"] = json!({"ips": [{"address": "10.27.0.77/24"}]});
    assert!(exec("CHECK", "podB", "net1", &check).ok, "podB holds .77 without an ADD");
    assert_eq!(exec("ADD", "podA", "net1", &conf).addresses(), vec!["10.27.0.5/24"]);
    // ...new attachments never get them...
    for i in 0..20 {
        let a = exec("ADD", &format!("new{i}"), "net1", &conf).addresses();
        assert!(
            !["10.27.0.5/24", "10.27.0.77/24", "10.27.0.67/24"].contains(&a[0].as_str()),
            "{a:?}"
        );
    }
    // ...and the pod's DEL frees them (the import's reference and the node's).
    assert!(exec("DEL", "podA", "net1", &conf).ok);
    assert!(exec("DEL", "podB", "net1", &conf).ok);
    check["prevResult"] = json!({"ips": [{"address": "10.27.0.5/24"}]});
    assert_eq!(exec("CHECK", "podA", "net1", &check).err_code(), 101);
    check["prevResult"] = json!({"ips": [{"address": "10.27.0.77/24"}]});
    assert_eq!(exec("CHECK", "podB", "net1", &check).err_code(), 101);
    // An allocation whose address another attachment holds is refused, naming it.
    let taken = exec("ADD", "holder", "net1", &conf).addresses()[0].clone();
    let offset = taken.trim_end_matches("/24").rsplit('.').next().expect("offset").to_string();
    let clash = json!({"metadata": {"name": "x"}, "spec": {"range": "10.27.0.0/24",
        "allocations": {offset: {"id": "podC", "podref": "default/c", "ifname": "net1"}}}});
    let out = import(&conf, &clash, &[]);
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains(taken.trim_end_matches("/24")) && err.contains("taken"), "{err}");
    check["prevResult"] = json!({"ips": []});
    assert_eq!(exec("CHECK", "podC", "net1", &check).err_code(), 101, "nothing bound for podC");
}
