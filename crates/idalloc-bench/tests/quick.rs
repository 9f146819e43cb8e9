//! Runs the harness in quick mode against real etcd (started by the harness) so it never rots, and
//! checks what can honestly be checked: the report and plot exist, every contender appears in every
//! scenario, nothing failed, and round trips per operation are what each protocol prescribes.
//! Speed is never asserted.

use idalloc_bench::contender::Kind;
use idalloc_bench::stats::Run;
use idalloc_bench::{run, Config};

fn ok<'a>(what: &str, r: &'a Result<Run, String>) -> &'a Run {
    match r {
        Ok(r) => r,
        Err(e) => panic!("{what} failed: {e}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn quick_mode_reports_every_contender_with_expected_round_trips() {
    if !idalloc_testkit::etcd::etcd_or_skip("the benchmark harness check") {
        return;
    }
    let cfg = Config::quick();
    let report = run(&cfg).await;

    // New keys: every contender at every concurrency, no failure, exact round trips.
    for &c in &cfg.concurrency {
        for kind in Kind::ALL {
            let (_, _, r) = report
                .new_keys
                .iter()
                .find(|(cc, k, _)| *cc == c && *k == kind)
                .unwrap_or_else(|| panic!("{} missing at concurrency {c}", kind.name()));
            let r = ok(&format!("{} new keys c={c}", kind.name()), r);
            assert!(r.ops > 0, "{} did no operation at concurrency {c}", kind.name());
            assert_eq!(r.failures, 0, "{} had failures at concurrency {c}", kind.name());
            if kind == Kind::Idalloc && c > 1 {
                // Concurrent single-key acquires of one process are coalesced: at
                // most one round trip per key, fewer when calls overlap.
                let x = r.rt_per_op();
                assert!(x > 0.0 && x <= 1.0, "idalloc round trips/op at c={c}: {x}");
                continue;
            }
            let expected = match kind {
                Kind::Idalloc | Kind::Ceiling => 1.0,
                Kind::Cilium => 7.0, // one node: no lock contention, no lost create
                Kind::Contiv => 2.0, // one node, serialized: read + CAS, never lost
            };
            assert_eq!(r.rt_per_op(), expected, "{} round trips/op at c={c}", kind.name());
        }
    }
    let rt = |list: &[(Kind, Result<Run, String>)], k: Kind| {
        let (_, r) = list.iter().find(|(kk, _)| *kk == k).expect("contender present");
        ok(k.name(), r).rt_per_op()
    };
    // idalloc's 8 tasks are coalesced: at most one round trip per key.
    assert!(rt(&report.bound, Kind::Idalloc) <= 1.0);
    assert_eq!(rt(&report.bound, Kind::Ceiling), 1.0);
    assert_eq!(rt(&report.bound, Kind::Cilium), 4.0);
    assert_eq!(rt(&report.bound, Kind::Contiv), 1.0);
    assert!(rt(&report.release, Kind::Idalloc) <= 1.0);
    assert_eq!(rt(&report.release, Kind::Ceiling), 1.0);
    assert_eq!(rt(&report.release, Kind::Cilium), 1.0);
    assert_eq!(rt(&report.release, Kind::Contiv), 2.0);

    for (n, k, r) in &report.existing {
        assert!(ok(&format!("{} with {n} existing", k.name()), r).ops > 0);
    }
    assert_eq!(report.existing.len(), cfg.existing.len() * 2);
    assert_eq!(report.overlap.len(), 3);
    for (k, r) in &report.overlap {
        let (run, consistent) = r.as_ref().unwrap_or_else(|e| panic!("{} overlap: {e}", k.name()));
        assert!(*consistent, "{}: nodes disagree on a binding", k.name());
        assert_eq!(
            run.ops + run.failures,
            (cfg.overlap_nodes * cfg.overlap_keys) as u64,
            "{}: every acquire is accounted for",
            k.name()
        );
        if *k == Kind::Idalloc {
            assert_eq!(run.failures, 0, "idalloc acquires never give up here");
            assert!(run.rt_per_op() >= 1.0);
        }
    }
    let (n, _, requests) = report.sync.as_ref().expect("initial sync ran");
    assert_eq!(*n, cfg.sync_bindings);
    // At least one page per 1000 bindings, and the watch.
    assert!(*requests > (*n as u64).div_ceil(1000), "sync requests: {requests}");
    for (label, c, r) in &report.embedded {
        let r = ok(&format!("embedded {label} c={c}"), r);
        assert!(r.ops > 0);
        let x = r.rt_per_op();
        if *c == 1 {
            assert_eq!(x, 1.0, "embedded {label}: one txn per new key");
        } else {
            assert!(x > 0.0 && x <= 1.0, "embedded {label} c={c}: coalesced, {x}");
        }
    }
    // The batched etcd ceiling and restart restoration ran (every key got its old ID
    // back: `restore` checks it).
    match &report.batched_ceiling {
        Some((n, Ok(rate))) => assert!(*n == cfg.cli_keys && *rate > 0.0),
        other => panic!("batched ceiling: {other:?}"),
    }
    match &report.restore {
        Some((n, Ok((secs, _)))) => assert!(*n == cfg.restore_keys && *secs > 0.0),
        other => panic!("restore: {other:?}"),
    }
    assert_eq!(report.micro.bindings, cfg.micro_bindings);
    assert_eq!(report.micro.picks.len(), 6);

    let md = report.markdown("benchmarks.svg");
    for k in Kind::ALL {
        assert!(md.contains(k.name()), "report names {}", k.name());
    }
    for heading in [
        "## Targets",
        "## New keys",
        "bound by another node",
        "last holder",
        "Contiv degradation",
        "overlapping key set",
        "Micro-benchmarks",
        "## Scale",
        "## Embedded store",
        "## Batching",
    ] {
        assert!(md.contains(heading), "report has a section {heading:?}");
    }
    assert!(md.contains("logical cores") && md.contains("load average"));
    // Both pages list every embedded run: the full page with its store, the batching page (file
    // store only) without.
    let rows = |page: &str, lead: &str| page.lines().filter(|l| l.starts_with(lead)).count();
    assert_eq!(rows(&md, "| file (redb") + rows(&md, "| memory |"), report.embedded.len());
    let bmd = report.batching_markdown(Some("b.svg"));
    assert!(
        bmd.contains("## File store")
            && bmd.contains("![keys per second against each target](b.svg)")
    );
    let file_runs = report.embedded.iter().filter(|(l, _, _)| l.starts_with("file")).count();
    assert_eq!(rows(&bmd, "| 1 |") + rows(&bmd, "| 64 |"), file_runs);
    let bsvg = report.batching_svg();
    assert!(bsvg.starts_with("<svg") && bsvg.trim_end().ends_with("</svg>"));
    assert_eq!(bsvg.matches(r#"class="bar""#).count(), 6, "one bar per rate with a target");
    let svg = report.svg();
    assert!(svg.starts_with("<svg") && svg.trim_end().ends_with("</svg>"));
    for k in Kind::ALL {
        assert!(
            svg.contains(&format!("data-name=\"{}\"", k.name())),
            "plot has a line for {}",
            k.name()
        );
    }
}
