//! Chaos on a real 3-member etcd cluster (docs/chaos.md).
//!
//! Several `chaos-client` processes (one holder each) acquire and release durable references on a
//! small shared key set while this test kills (SIGKILL) and restarts etcd members one at a time —
//! the leader included — freezes members (SIGSTOP/SIGCONT), and kills and restarts client
//! processes. Afterwards it checks, from the clients' histories and raw store scans:
//! - G1 on every scan taken during and after the run;
//! - per key, that the combined history is linearizable against the model of `idalloc_chaos::model`,
//!   ending in the state the final scan found (so an acquire that returned and was never released
//!   is still bound to its ID, and nothing leaked);
//! - errors are only `Unavailable`, and only during a leader fault (plus a grace for the election);
//! - no client panicked or hung, and every client run that was not killed exited cleanly;
//! - beside the recorded durable calls, every client sends bursts of concurrent single-key session
//!   calls, which the allocator coalesces (`chaos_client.rs`, `--burst-tasks`): the
//!   scans check them for G1 with the rest, each client checks its own holds, and the run fails
//!   if none was answered.
//!
//! Member pauses alternate, pass by pass of the fault cycle, between shorter and longer than the
//! clients' request timeout (DESIGN §11: a request frozen in a paused member is retried elsewhere and
//! applied late). `CHAOS_SECS` sets the chaos duration (default 60; docs/chaos.md has the long run),
//! `CHAOS_PAUSE_MAX_MS` the longest pause.
//!
//! The same run, shorter (`CHAOS_SECURE_SECS`, default 20), on a locked-down etcd: one
//! member with TLS and client-certificate authentication, auth enabled with 2 s tokens, and clients
//! that connect as the restricted `idalloc` user whose role covers only its prefix. Its faults are
//! restarts of the member (every token it issued is gone after one), pauses shorter and longer than
//! the request timeout, and client kills; every fault of a single member is a leader fault.

mod common;

use std::path::Path;
use std::time::Duration;

use common::{run_chaos, Target};
use idalloc::store::etcd::EtcdOptions;
use idalloc_testkit::etcd::{etcd_or_skip, EtcdCluster};
use idalloc_testkit::secure::{SecureEtcd, SecureSpec};

/// One etcd member with TLS, client certificates and user authentication (short tokens).
impl Target for SecureEtcd {
    fn members(&self) -> usize {
        1
    }
    fn endpoints(&self) -> Vec<String> {
        vec![self.endpoint()]
    }
    fn prefix_root(&self) -> &'static str {
        SecureEtcd::PREFIX
    }
    fn client_args(&self, dir: &Path) -> Vec<String> {
        let password = dir.join("etcd-password");
        std::fs::write(&password, format!("{}\n", SecureEtcd::PASSWORD)).expect("password file");
        let pki = self.pki();
        let p = |p: &Path| p.to_str().expect("utf-8 path").to_string();
        vec![
            "--cacert".into(),
            p(&pki.ca),
            "--cert".into(),
            p(&pki.client.cert),
            "--key".into(),
            p(&pki.client.key),
            "--user".into(),
            SecureEtcd::USER.into(),
            "--password-file".into(),
            p(&password),
        ]
    }
    fn observer_options(&self) -> EtcdOptions {
        let mut eo = self.options(Some(SecureEtcd::user_auth()));
        eo.request_timeout = Duration::from_secs(3);
        eo.connect_timeout = Duration::from_secs(1);
        eo
    }
    async fn leader(&self) -> Option<usize> {
        Some(0)
    }
    fn kill_member(&mut self, _i: usize) -> Result<(), String> {
        self.kill();
        Ok(())
    }
    async fn restart_member(&mut self, _i: usize) -> Result<(), String> {
        self.restart().await
    }
    fn pause_member(&mut self, _i: usize) -> Result<(), String> {
        self.pause()
    }
    fn resume_member(&mut self, _i: usize) -> Result<(), String> {
        self.resume()
    }
    fn dir(&self) -> &Path {
        SecureEtcd::dir(self)
    }
}

fn skip_without_etcd() -> bool {
    !etcd_or_skip("the chaos test")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chaos_on_a_3_member_etcd_cluster_is_linearizable() {
    if skip_without_etcd() {
        return;
    }
    let chaos_secs: u64 =
        std::env::var("CHAOS_SECS").ok().and_then(|s| s.parse().ok()).unwrap_or(60);
    let cluster = EtcdCluster::start_fast(3).await.expect("3-member etcd cluster");
    // A fixed cycle, so every kind happens in every run of a minute or more.
    let cycle = [
        "kill-leader",
        "kill-client",
        "pause-follower",
        "kill-follower",
        "kill-client",
        "pause-leader",
    ];
    let mut cluster = cluster;
    run_chaos(&mut cluster, chaos_secs, &cycle).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chaos_on_a_secured_etcd_with_expiring_tokens_is_linearizable() {
    if skip_without_etcd() {
        return;
    }
    let chaos_secs: u64 =
        std::env::var("CHAOS_SECURE_SECS").ok().and_then(|s| s.parse().ok()).unwrap_or(20);
    let spec =
        SecureSpec { tls: true, client_cert_auth: true, auth: true, auth_token_ttl: Some(2) };
    let etcd = SecureEtcd::start(spec).await.expect("secured etcd");
    let cycle = ["kill-leader", "kill-client", "pause-leader", "kill-client"];
    let mut etcd = etcd;
    run_chaos(&mut etcd, chaos_secs, &cycle).await;
}
