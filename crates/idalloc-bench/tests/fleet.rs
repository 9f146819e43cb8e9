//! The fleet benchmark at a tiny size against a real etcd, so it never rots:
//! every phase ran, every agent synced and restored every key with its previous ID, no call
//! failed, the churn and the probe did work and etcd's counters moved. Speed is never asserted,
//! nor work in a window shorter than what measures it (a 50 ms probe step, a 10 ms CPU tick).
//! Direct agents (each its own etcd client) and agents through real `idalloc serve` replicas.

use std::time::Duration;

use idalloc_bench::fleet::{run, FleetOptions, FleetRun};
use idalloc_bench::fleet_serve::ServeMode;

fn tiny_shape(close: bool, serve: Option<ServeMode>) -> FleetOptions {
    FleetOptions {
        keys: 5,
        churn: Duration::from_secs(2),
        close,
        jitter: Duration::from_millis(50),
        serve,
        ..FleetOptions::new(4, 60)
    }
}

async fn tiny_run(o: &FleetOptions) -> FleetRun {
    match run(o).await {
        Ok(r) => r,
        Err(e) => panic!("fleet run failed: {e}"),
    }
}

/// What every run must show, direct or through serve: every phase without a failed call or a
/// changed ID, every agent synced, every key acquired and restored, and work done.
fn check_common(r: &FleetRun, storm_phases: &[&str]) {
    let names: Vec<&str> = r.phases.iter().map(|p| p.name).collect();
    let mut want = vec!["cold start", "hold (acquire + fan-out)"];
    want.extend_from_slice(storm_phases);
    want.push("churn");
    assert_eq!(names, want);
    for p in &r.phases {
        assert_eq!(p.failed, 0, "{}: failed calls: {:?}", p.name, p.errors);
        assert_eq!(p.changed, 0, "{}: IDs changed", p.name);
        assert!(p.load.grpc() > 0.0, "{}: etcd counted no request", p.name);
    }
    let phase = |n: &str| r.phase(n).unwrap_or_else(|| panic!("no phase {n}"));
    assert_eq!(phase("cold start").ok, 4, "every agent synced");
    assert_eq!(phase("hold (acquire + fan-out)").ok, 20, "every agent acquired its keys");
    assert_eq!(phase("restart storm").ok, 20, "every key restored");
    assert!(phase("churn").ok > 0, "churn acquired nothing");
    // The probe steps every 50 ms and a tiny storm may be over sooner, so the probe is checked
    // over the run (the 2 s churn alone spans dozens of steps), not within the storm.
    let probe_ok: usize = r.phases.iter().map(|p| p.probe.ok).sum();
    assert!(probe_ok > 0, "the probe acquired nothing in the whole run");
}

async fn tiny(close: bool) {
    if !idalloc_testkit::etcd::etcd_or_skip("the fleet benchmark check") {
        return;
    }
    let r = tiny_run(&tiny_shape(close, None)).await;
    check_common(&r, &["restart storm"]);
    let phase = |n: &str| r.phase(n).unwrap_or_else(|| panic!("no phase {n}"));
    // After a close, a sweep reclaimed every agent key before the restart: the IDs came back
    // only through the hints (without them the 0 IDs changed above fails).
    assert_eq!(phase("restart storm").swept, if close { 20 } else { 0 }, "bindings swept");
    // Each agent watches the pool: etcd has at least one watcher per agent (and the probe's).
    assert!(
        phase("cold start").load.watchers() >= 4.0,
        "watchers: {}",
        phase("cold start").load.watchers()
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

/// Agents through `serve` replicas: every restarted agent (a new client, a new session) gets its
/// keys back with their IDs, also when replica 0 is killed at the storm's start; etcd sees one
/// watcher per replica, not one per agent.
async fn tiny_through_serve(replicas: usize, kill_replica: bool) {
    if !idalloc_testkit::etcd::etcd_or_skip("the through-serve fleet check") {
        return;
    }
    let mode = ServeMode {
        bin: idalloc_testkit::serve::workspace_bin(),
        replicas,
        kill_replica,
        views: true,
    };
    let r = tiny_run(&tiny_shape(false, Some(mode))).await;
    check_common(&r, &["restart storm", "storm sync (views)"]);
    let phase = |n: &str| r.phase(n).unwrap_or_else(|| panic!("no phase {n}"));
    assert_eq!(phase("storm sync (views)").ok, 4, "every restarted agent synced again");
    // The agents watch through the replicas: at most one etcd watch stream per replica for the
    // pool (and its spec), never one per agent (4 agents + the probe would be 5 or more).
    let watchers = phase("cold start").load.watchers();
    assert!(watchers >= 1.0 && watchers <= 2.0 * replicas as f64, "etcd watchers: {watchers}");
    // CPU time comes from /proc in 10 ms ticks, which a tiny storm may not fill: checked over
    // the run (start-up, the agents' syncs and the 2 s churn all go through the replicas).
    let serve_cpu: f64 = r.phases.iter().map(|p| p.load.serve_cpu()).sum();
    assert!(serve_cpu > 0.0, "no serve CPU counted in the whole run");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tiny_fleet_through_one_serve_restores_every_key_after_a_crash_storm() {
    tiny_through_serve(1, false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tiny_fleet_through_two_serves_restores_every_key_with_one_killed() {
    tiny_through_serve(2, true).await;
}
