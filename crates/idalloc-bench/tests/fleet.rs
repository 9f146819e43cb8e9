//! The fleet benchmark (issue 21 item 4) at a tiny size against a real etcd, so it never rots:
//! every phase ran, every agent synced and restored every key with its previous ID, no call
//! failed, the churn and the probe did work and etcd's counters moved. Speed is never asserted.

use std::time::Duration;

use idalloc_bench::fleet::{run, FleetOptions};

async fn tiny(close: bool) {
    if !idalloc_testkit::etcd::etcd_or_skip("the fleet benchmark check") {
        return;
    }
    let o = FleetOptions {
        keys: 5,
        churn: Duration::from_secs(2),
        close,
        jitter: Duration::from_millis(50),
        ..FleetOptions::new(4, 60)
    };
    let r = match run(&o).await {
        Ok(r) => r,
        Err(e) => panic!("fleet run failed: {e}"),
    };
    let names: Vec<&str> = r.phases.iter().map(|p| p.name).collect();
    assert_eq!(names, ["cold start", "hold (acquire + fan-out)", "restart storm", "churn"]);
    for p in &r.phases {
        assert_eq!(p.failed, 0, "{}: failed calls: {:?}", p.name, p.errors);
        assert_eq!(p.changed, 0, "{}: IDs changed", p.name);
        assert!(p.load.grpc > 0.0, "{}: etcd counted no request", p.name);
    }
    let phase = |n: &str| r.phase(n).unwrap_or_else(|| panic!("no phase {n}"));
    assert_eq!(phase("cold start").ok, 4, "every agent synced");
    assert_eq!(phase("hold (acquire + fan-out)").ok, 20, "every agent acquired its keys");
    assert_eq!(phase("restart storm").ok, 20, "every key restored");
    // After a close, a sweep reclaimed every agent key before the restart: the IDs came back
    // only through the hints (without them the 0 IDs changed above fails).
    assert_eq!(phase("restart storm").swept, if close { 20 } else { 0 }, "bindings swept");
    assert!(phase("churn").ok > 0, "churn acquired nothing");
    assert!(phase("restart storm").probe.ok > 0, "the probe acquired nothing during the storm");
    // Each agent watches the pool: etcd has at least one watcher per agent (and the probe's).
    assert!(
        phase("cold start").load.watchers >= 4.0,
        "watchers: {}",
        phase("cold start").load.watchers
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tiny_fleet_restores_every_key_after_a_crash_storm() {
    tiny(false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tiny_fleet_restores_every_key_after_a_close_storm() {
    tiny(true).await;
}
