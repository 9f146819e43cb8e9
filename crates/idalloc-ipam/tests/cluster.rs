//! 4 simulated nodes × 100 concurrent ADDs through two `idalloc serve` replicas on a 3-member
//! etcd cluster, with one replica and one etcd member killed mid-way: every address distinct,
//! every DEL frees, and `idalloc check` finds nothing wrong and nothing left afterwards. ADDs and
//! DELs answered "try again later" (11) are retried, as a runtime does; any other error fails.

mod common;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use idalloc_testkit::etcd::{etcd_or_skip, EtcdCluster};
use idalloc_testkit::serve::{workspace_bin, Serve};
use serde_json::{json, Value};

const NODES: usize = 4;
const PER_NODE: usize = 100;
/// Plugin execs in flight per node.
const WORKERS: usize = 10;

/// Runs `verb` until it answers something other than "try again later"; at most 20 tries.
fn until_settled(verb: &str, cid: &str, conf: &Value) -> common::Out {
    for _ in 0..20 {
        let out = common::exec(verb, cid, "eth0", conf);
        if out.ok || out.json["code"] != 11 {
            return out;
        }
        std::thread::sleep(std::time::Duration::from_millis(200));
    }
    common::exec(verb, cid, "eth0", conf)
}

fn idalloc(store: &str, prefix: &str, args: &[&str]) -> std::process::Output {
    std::process::Command::new(workspace_bin())
        .args(["--store", store, "--prefix", prefix, "--timeout", "5s"])
        .args(args)
        .output()
        .expect("run idalloc")
}

#[test]
fn four_nodes_add_concurrently_through_two_replicas_while_a_replica_and_a_member_die() {
    if !etcd_or_skip("the IPAM cluster test") {
        return;
    }
    let rt = tokio::runtime::Runtime::new().expect("runtime");
    let mut cluster = rt.block_on(EtcdCluster::start(3)).expect("etcd cluster");
    let store = cluster.endpoints().join(",");
    let prefix = "ipam-cluster-test";
    let bin = workspace_bin();
    let bin = bin.to_string_lossy();
    let global = ["--store", &store, "--prefix", prefix, "--timeout", "3s"];
    let replicas = Arc::new(Mutex::new(vec![
        Some(Serve::start(&bin, &global, &[])),
        Some(Serve::start(&bin, &global, &[])),
    ]));
    let servers: Vec<String> =
        replicas.lock().expect("replicas").iter().flatten().map(|s| s.http("")).collect();
    let conf = |node: usize| {
        common::netconf(
            "1.0.0",
            "clusternet",
            json!({"type": "idalloc-ipam", "pool": "cluster-net", "subnet": "10.40.0.0/22",
                   "servers": servers, "node": format!("node-{node}"), "timeout": 3000}),
        )
    };
    let done = Arc::new(AtomicUsize::new(0));
    let addrs = Arc::new(Mutex::new(Vec::new()));
    std::thread::scope(|s| {
        for node in 0..NODES {
            for w in 0..WORKERS {
                let (conf, done, addrs) = (conf(node), done.clone(), addrs.clone());
                s.spawn(move || {
                    for i in (w..PER_NODE).step_by(WORKERS) {
                        let cid = format!("n{node}-c{i}");
                        let out = until_settled("ADD", &cid, &conf);
                        let a = out.addresses();
                        addrs.lock().expect("addrs").push((cid, a[0].clone()));
                        done.fetch_add(1, Ordering::SeqCst);
                    }
                });
            }
        }
        // Mid-way: kill a replica (SIGKILL) and an etcd member.
        while done.load(Ordering::SeqCst) < NODES * PER_NODE / 3 {
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        if let Some(mut r) = replicas.lock().expect("replicas")[0].take() {
            r.kill9();
        }
        cluster.kill_member(2).expect("kill member");
    });
    let addrs = addrs.lock().expect("addrs").clone();
    assert_eq!(addrs.len(), NODES * PER_NODE);
    let mut distinct: Vec<&String> = addrs.iter().map(|(_, a)| a).collect();
    distinct.sort();
    distinct.dedup();
    assert_eq!(distinct.len(), NODES * PER_NODE, "two attachments got one address");

    // Attachments answer their address again (every tenth is asked), then DEL frees each.
    std::thread::scope(|s| {
        for chunk in addrs.chunks(addrs.len() / (NODES * WORKERS) + 1) {
            let conf = &conf;
            s.spawn(move || {
                for (cid, a) in chunk {
                    let node: usize = cid[1..]
                        .split('-')
                        .next()
                        .and_then(|n| n.parse().ok())
                        .expect("node of cid");
                    let c = conf(node);
                    if cid.ends_with('0') {
                        assert_eq!(until_settled("ADD", cid, &c).addresses(), vec![a.clone()]);
                    }
                    let del = until_settled("DEL", cid, &c);
                    assert!(del.ok, "DEL {cid}: {del:?}");
                }
            });
        }
    });
    let live = cluster.endpoints()[..2].join(",");
    let check = idalloc(&live, prefix, &["check", "cluster-net"]);
    assert!(check.status.success(), "idalloc check: {}", String::from_utf8_lossy(&check.stdout));
    let list = idalloc(&live, prefix, &["--json", "list", "cluster-net"]);
    let listed: Value = serde_json::from_slice(&list.stdout).expect("list JSON");
    assert_eq!(listed["bindings"], json!([]), "addresses leaked: {listed}");
}
