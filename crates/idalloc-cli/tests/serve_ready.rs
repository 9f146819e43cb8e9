//! `/readyz` checks that the service can write its prefix, not only read it: a
//! real `serve` connected to an auth-enabled etcd as a user whose role only reads the prefix is
//! not ready, and says why; the same service as a read-write user is ready. Every process is
//! stopped by its PID.

mod common;

use std::process::Command;
use std::time::Duration;

use common::{plain_agent, request};
use idalloc_testkit::etcd::etcd_or_skip;
use idalloc_testkit::secure::{SecureEtcd, SecureSpec};
use idalloc_testkit::serve::Serve;

fn bin() -> &'static str {
    env!("CARGO_BIN_EXE_idalloc")
}

const READER: &str = "reader";
const READER_PASSWORD: &str = "reader-test-password";

/// `etcdctl … ARGS` as root.
fn etcdctl(etcd: &SecureEtcd, args: &[&str]) {
    let root = format!("root:{}", SecureEtcd::ROOT_PASSWORD);
    let out = Command::new("etcdctl")
        .args(["--endpoints", &etcd.endpoint(), "--user", &root])
        .args(args)
        .output()
        .expect("run etcdctl");
    assert!(out.status.success(), "etcdctl {args:?}: {}", String::from_utf8_lossy(&out.stderr));
}

#[test]
fn readyz_fails_with_the_reason_when_the_store_user_cannot_write() {
    if !etcd_or_skip("the readiness test") {
        return;
    }
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
    let spec = SecureSpec { auth: true, ..SecureSpec::default() };
    let etcd = rt.block_on(SecureEtcd::start(spec)).unwrap_or_else(|e| panic!("{e}"));
    etcdctl(&etcd, &["role", "add", "reads-only"]);
    etcdctl(
        &etcd,
        &["role", "grant-permission", "reads-only", "read", SecureEtcd::PREFIX, "--prefix"],
    );
    etcdctl(&etcd, &["user", "add", &format!("{READER}:{READER_PASSWORD}")]);
    etcdctl(&etcd, &["user", "grant-role", READER, "reads-only"]);

    let prefix = format!("{}ready", SecureEtcd::PREFIX);
    let agent = plain_agent(Duration::from_secs(30));
    let readyz = |user: &str| {
        let s = Serve::start(
            bin(),
            &[
                "--endpoints",
                &etcd.endpoint(),
                "--user",
                user,
                "--prefix",
                &prefix,
                "--timeout",
                "3s",
            ],
            &[],
        );
        let r = request(&agent, "GET", &s.http("/readyz"), None, None).expect("readyz");
        // Its reads work: the service is up, only its writes are refused.
        let pools = request(&agent, "GET", &s.http("/v1/pools"), None, None).expect("pools");
        (r, pools.status)
    };

    let (rw, pools) = readyz(&format!("{}:{}", SecureEtcd::USER, SecureEtcd::PASSWORD));
    assert_eq!((rw.status, pools), (200, 200), "{}", rw.text);
    assert_eq!(rw.body["status"], "ready");

    let (ro, pools) = readyz(&format!("{READER}:{READER_PASSWORD}"));
    assert_eq!(pools, 200, "the read-only user reads");
    assert_eq!(ro.status, 503, "{}", ro.text);
    assert_eq!(ro.body["kind"], "access_denied", "{}", ro.text);
    let msg = ro.body["message"].as_str().expect("message");
    assert!(msg.contains("permission denied") && msg.contains("readwrite"), "{msg}");
    assert!(msg.contains(&prefix), "names the prefix: {msg}");
    assert!(!msg.contains(READER_PASSWORD), "{msg}");

    // The probe wrote nothing, anywhere under the prefix.
    let root = rt.block_on(etcd.root_store()).expect("root store");
    let all = rt
        .block_on(idalloc::store::Store::get(
            &root,
            idalloc::store::GetRequest::prefix(prefix.clone().into_bytes()),
        ))
        .expect("get");
    assert!(all.kvs.is_empty(), "{:?}", all.kvs);
}
