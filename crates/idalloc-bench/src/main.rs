//! `cargo run --release -p idalloc-bench -- [--quick] [--out docs/benchmarks/protocol.md] [--cli PATH]`
//!
//! `--micro-only [--out docs/benchmarks/lookups.md]`: the in-process micro-benchmarks alone,
//! printed; with `--out`, the cache lookups and their targets written there.
//!
//! `--serve-only`: `idalloc serve` over HTTP against the library on one etcd, written
//! to `--out` (default `docs/benchmarks/serve.md`); needs the release `idalloc` binary
//! (`cargo build --release -p idalloc-cli`, or `--cli PATH`).
//!
//! `--fanout-only`: the service's watch fan-out alone (SSE subscribers on one pool of a release
//! `idalloc serve`), printed, and written to `--out` if given. `--serve-only` runs it too, after
//! the HTTP-against-library table, into the same page.
//!
//! `--fleet [--agents N,..] [--bindings B,..] ...`: the fleet of N agents on one pool
//! (cold start, restart storm, churn), see `idalloc_bench::fleet`.
//!
//! `--batching-only`: the batching, coalescing, file-store and restoration figures, written
//! to `--out` (default `docs/benchmarks/batching.md`) with their chart next to it (`.svg`); needs
//! the release `idalloc` binary like `--serve-only`.
//!
//! `--scale 10000,1000000[,10000000] [--scale-cache 1000000] [--scale-pages 1000,10000]
//! [--scale-dir target/tmp-bench] [--out FILE.md]`: pools of 1M and 10M bindings on
//! etcd and the cache's memory per binding (`src/scale.rs`); `--scale-cache` alone runs only the
//! cache part. `--scale-etcd "default;--snapshot-count=10000"` runs every size under each etcd
//! setting (flags and environment variables), `--scale-phases` also splits a sync's time into
//! listing and apply, `--scale-svg FILE` draws the first setting's figures.
//!
//! Runs every scenario (see the crate docs) and writes the Markdown report to `--out` and the plot
//! next to it (same name, `.svg`). Needs `etcd` on `PATH`. The CLI scenario uses `--cli`, else
//! `$IDALLOC_CLI`, else `target/release/idalloc` if it exists.

use std::path::PathBuf;

use idalloc_bench::{run, Config};

/// Counts heap bytes during memory measurements (`idalloc_bench::heap`).
#[global_allocator]
static HEAP: idalloc_bench::heap::Counting = idalloc_bench::heap::Counting;

/// A comma-separated list of numbers (`10000,1000000`).
fn list<T: std::str::FromStr>(arg: Option<String>, flag: &str) -> Result<Vec<T>, String> {
    let arg =
        arg.ok_or_else(|| usage(&format!("{flag} needs a comma-separated list of numbers")))?;
    arg.split(',')
        .map(|x| x.trim().parse().map_err(|_| usage(&format!("{flag}: {x:?} is not a number"))))
        .collect()
}

fn usage(msg: &str) -> String {
    format!("{msg}\nusage: idalloc-bench [--quick | --micro-only | --embedded-only | --remote-only | --serve-only | --fanout-only | --batching-only | --coalescing-only [RUNS] | --scale SIZES [--scale-cache SIZES] [--scale-pages SIZES] [--scale-dir DIR] [--scale-etcd SETTINGS] [--scale-phases] [--scale-svg FILE]] [--out FILE.md] [--cli PATH-TO-idalloc]")
}

#[tokio::main(flavor = "multi_thread")]
async fn main() -> Result<(), String> {
    idalloc_bench::heap::installed();
    let mut quick = false;
    let mut remote_only = false;
    let mut serve_only = false;
    let mut fanout_only = false;
    let mut batching_only = false;
    let mut micro_only = false;
    let mut scale: Option<Vec<u64>> = None;
    let mut scale_cache: Vec<u64> = Vec::new();
    let mut scale_pages: Vec<i64> = vec![1000];
    let mut scale_dir = PathBuf::from("target/tmp-bench");
    let mut scale_etcd = Vec::new();
    let mut scale_phases = false;
    let mut scale_svg: Option<PathBuf> = None;
    let mut out: Option<PathBuf> = None;
    let mut cli: Option<PathBuf> = std::env::var_os("IDALLOC_CLI").map(PathBuf::from);
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        match a.as_str() {
            "--quick" => quick = true,
            // The fleet of N agents on one pool (idalloc_bench::fleet), with its own flags.
            "--fleet" => return idalloc_bench::fleet::main(args.collect()).await,
            // Micro-benchmarks alone, at full size, printed (for profiling a missed target); with
            // --out, the cache lookups and their targets also written there.
            "--micro-only" => micro_only = true,
            // Remote-view figures alone, written to --out.
            "--remote-only" => remote_only = true,
            // HTTP service against the library, written to --out.
            "--serve-only" => serve_only = true,
            // The watch fan-out alone, printed (and written to --out if given).
            "--fanout-only" => fanout_only = true,
            // The batching scenarios alone (batching, coalescing, restoration), written to --out.
            "--batching-only" => batching_only = true,
            // idalloc on the embedded stores alone (file at 1 and 64 tasks, memory at 64), printed:
            // for before/after comparisons of the embedded store (docs/benchmarks/store.md).
            "--embedded-only" => {
                let cfg = Config::full();
                let dir = tempfile::tempdir().map_err(|e| format!("temp dir: {e}"))?;
                println!(
                    "| store | tasks | ops | ops/s | p50 ms | p99 ms | round trips/op | CPU µs/op |"
                );
                println!("|---|---:|---:|---:|---:|---:|---:|---:|");
                for (label, file, c) in
                    [("file", true, 1), ("file", true, 64), ("memory", false, 64)]
                {
                    let d = file.then_some(dir.path());
                    // CPU of the whole process (store, allocator and tasks), which the load on a
                    // shared machine moves much less than wall-clock figures.
                    let cpu0 = idalloc_bench::stats::CpuSample::now(false, None);
                    let r = idalloc_bench::scenarios::embedded(d, c, cfg.run).await?.finish();
                    let cpu = cpu0.split_to(
                        idalloc_bench::stats::CpuSample::now(false, None),
                        r.ops as usize,
                        r.secs,
                    );
                    println!(
                        "| {label} | {c} | {} | {:.0} | {} | {} | {:.2} | {:.0} |",
                        r.ops,
                        r.throughput(),
                        idalloc_bench::stats::ms(r.percentile(0.5)),
                        idalloc_bench::stats::ms(r.percentile(0.99)),
                        r.rt_per_op(),
                        cpu.client * 1e6 / r.ops.max(1) as f64
                    );
                }
                return Ok(());
            }
            // The batched ceiling over keys per txn × txns in flight, printed (how its best shape
            // was chosen: docs/benchmarks/findings.md, the 8× target).
            "--ceiling-sweep" => {
                let n: usize = std::env::var("IDALLOC_SWEEP_KEYS")
                    .ok()
                    .and_then(|v| v.parse().ok())
                    .unwrap_or(50_000);
                // IDALLOC_SWEEP="PER:GROUPS:INFLIGHT:HOIST:LEASED:WATCH,…" (1/0 flags) restricts the grid.
                let grid: Vec<idalloc_bench::batched::Shape> = match std::env::var("IDALLOC_SWEEP")
                {
                    Ok(v) => v
                        .split(',')
                        .filter_map(|p| {
                            let f: Vec<usize> =
                                p.split(':').filter_map(|x| x.parse().ok()).collect();
                            (f.len() == 6).then(|| idalloc_bench::batched::Shape {
                                keys_per_txn: f[0],
                                groups: f[1],
                                inflight: f[2],
                                hoist: f[3] == 1,
                                leased: f[4] == 1,
                                watch: f[5] == 1,
                            })
                        })
                        .collect(),
                    Err(_) => [25, 50, 100, 124]
                        .into_iter()
                        .flat_map(|per| {
                            [1, 2, 4, 8, 16, 64].map(|inflight| idalloc_bench::batched::Shape {
                                keys_per_txn: per,
                                groups: 1,
                                inflight,
                                hoist: false,
                                leased: false,
                                watch: false,
                            })
                        })
                        .collect(),
                };
                println!("| keys/group | groups | in flight | hoisted | leased | watch | keys/s | client µs/key | etcd µs/key | wall s |");
                println!("|---:|---:|---:|---|---|---|---:|---:|---:|---:|");
                for s in grid {
                    let (rate, cpu) = idalloc_bench::batched::batched_ceiling(n, s).await?;
                    let (c, e) = cpu.per_key_us();
                    println!(
                        "| {} | {} | {} | {} | {} | {} | {rate:.0} | {c:.1} | {e:.1} | {:.2} |",
                        s.keys_per_txn, s.groups, s.inflight, s.hoist, s.leased, s.watch, cpu.wall
                    );
                }
                return Ok(());
            }
            // The coalescing figure alone, `N` times (default 3): new keys at concurrency
            // 64, idalloc (coalesced single-key acquires) and the one-key-per-txn etcd ceiling back
            // to back, printed with the ratio, the CPU per op and the load average of each pair.
            "--coalescing-only" => {
                let runs: usize = match args.next() {
                    Some(n) => n.parse().map_err(|_| usage("--coalescing-only takes a count"))?,
                    None => 3,
                };
                return coalescing(runs).await;
            }
            // Scale (src/scale.rs): bindings on etcd per run, and cache sizes for the memory part.
            "--scale" => scale = Some(list(args.next(), "--scale")?),
            "--scale-cache" => {
                scale_cache = list(args.next(), "--scale-cache")?;
                scale.get_or_insert_with(Vec::new);
            }
            "--scale-pages" => scale_pages = list(args.next(), "--scale-pages")?,
            "--scale-dir" => {
                scale_dir = args.next().ok_or_else(|| usage("--scale-dir needs a path"))?.into()
            }
            "--scale-etcd" => {
                let text = args.next().ok_or_else(|| usage("--scale-etcd needs settings"))?;
                scale_etcd =
                    idalloc_bench::scale::EtcdSetting::parse_list(&text).map_err(|e| usage(&e))?;
            }
            "--scale-phases" => scale_phases = true,
            "--scale-svg" => {
                scale_svg =
                    Some(args.next().ok_or_else(|| usage("--scale-svg needs a file name"))?.into())
            }
            // The scale run's fresh processes (memory measured without the parent's allocations).
            "--scale-child-cache" => {
                let n = list::<u64>(args.next(), "--scale-child-cache")?;
                let dense = args.next().as_deref() == Some("dense");
                return idalloc_bench::scale::cache_memory_child(
                    n.first().copied().unwrap_or(0),
                    dense,
                )
                .await;
            }
            "--scale-child-sync" => {
                let url = args.next().ok_or_else(|| usage("--scale-child-sync needs a URL"))?;
                let page = list::<i64>(args.next(), "--scale-child-sync")?;
                let pid =
                    args.next().ok_or_else(|| usage("--scale-child-sync needs etcd's PID"))?;
                return idalloc_bench::scale::sync_child(
                    &url,
                    page.first().copied().unwrap_or(1000),
                    &pid,
                )
                .await;
            }
            "--scale-child-phases" => {
                let url = args.next().ok_or_else(|| usage("--scale-child-phases needs a URL"))?;
                let page = list::<i64>(args.next(), "--scale-child-phases")?;
                let pid =
                    args.next().ok_or_else(|| usage("--scale-child-phases needs etcd's PID"))?;
                return idalloc_bench::scale_phases::phases_child(
                    &url,
                    page.first().copied().unwrap_or(1000),
                    &pid,
                )
                .await;
            }
            "--out" => {
                out = Some(args.next().ok_or_else(|| usage("--out needs a file name"))?.into())
            }
            "--cli" => cli = Some(args.next().ok_or_else(|| usage("--cli needs a path"))?.into()),
            other => return Err(usage(&format!("unknown argument {other:?}"))),
        }
    }
    if let Some(sizes) = scale {
        let cmd: Vec<String> = std::env::args().skip(1).collect();
        let cmd = format!("cargo run --release -p idalloc-bench -- {}", cmd.join(" "));
        let run = idalloc_bench::scale::ScaleRun {
            etcd_sizes: sizes,
            cache_sizes: scale_cache,
            dir: scale_dir,
            pages: scale_pages,
            settings: scale_etcd,
            phases: scale_phases,
            out,
            svg: scale_svg,
        };
        return idalloc_bench::scale::run(&run, &cmd).await;
    }
    if micro_only {
        let cfg = Config::full();
        let mut m = idalloc_bench::micro::Micro::default();
        idalloc_bench::micro::cache(cfg.micro_bindings, cfg.micro_iters, &mut m);
        idalloc_bench::micro::picks(cfg.micro_iters, &mut m);
        idalloc_bench::micro::escaping(cfg.micro_iters, &mut m);
        println!("{m:#?}");
        for t in m.ratio_targets() {
            println!("{t}");
        }
        if let Some(out) = out {
            let text = format!(
                "# Cached lookups: benchmark figures\n\nGenerated by `cargo run --release -p idalloc-bench -- --micro-only --out {}` on {} ({} logical cores, {}; load average {} at the end, shared with other workloads). Do not edit by hand.\n\n{}",
                out.display(),
                idalloc_bench::stats::utc_now(),
                idalloc_bench::stats::cores(),
                idalloc_bench::stats::cpu_model(),
                idalloc_bench::stats::load_average(),
                m.cache_markdown(cfg.micro_iters)
            );
            std::fs::write(&out, text).map_err(|e| format!("writing {}: {e}", out.display()))?;
            println!("wrote {}", out.display());
        }
        return Ok(());
    }
    if !idalloc_testkit::etcd::etcd_on_path() {
        return Err("etcd is not on PATH: the benchmark starts its own etcd".into());
    }
    let mut cfg = if quick { Config::quick() } else { Config::full() };
    if serve_only || fanout_only {
        let bin = cli.unwrap_or_else(|| PathBuf::from("target/release/idalloc"));
        if !bin.is_file() {
            return Err(format!(
                "{} does not exist: build it with `cargo build --release -p idalloc-cli` or give --cli PATH",
                bin.display()
            ));
        }
        let (when, load) = (idalloc_bench::stats::utc_now(), idalloc_bench::stats::load_average());
        let mut body = String::new();
        let mut errors = Vec::new();
        if serve_only {
            let f = idalloc_bench::serve::run(&bin, cfg.run, &cfg.concurrency).await;
            println!("{}", f.target());
            body.push_str(&f.markdown());
            errors.extend(f.errors);
        }
        let fan_load = idalloc_bench::stats::load_average();
        let f = idalloc_bench::fanout::run(&bin, cfg.run).await;
        for t in f.targets() {
            println!("{t}");
        }
        body.push_str(&format!("\n(Load average {fan_load} when the fan-out started.)\n"));
        body.push_str(&f.markdown());
        errors.extend(f.errors);
        let out = match (serve_only, out) {
            (_, Some(o)) => Some(o),
            (true, None) => Some(PathBuf::from("docs/benchmarks/serve.md")),
            (false, None) => None,
        };
        let flag = if serve_only { "--serve-only" } else { "--fanout-only" };
        let text = format!(
            "# `idalloc serve`: HTTP against the library, and the watch fan-out\n\nGenerated by `cargo build --release -p idalloc-cli && cargo run --release -p idalloc-bench -- {flag}` on {when} ({} logical cores, {}; load average {load} at the start, shared with other workloads; {}). Runs of {:.1} s per row. Do not edit by hand.\n{body}",
            idalloc_bench::stats::cores(),
            idalloc_bench::stats::cpu_model(),
            idalloc_bench::stats::etcd_version(),
            cfg.run.as_secs_f64(),
        );
        match out {
            Some(out) => {
                std::fs::write(&out, text)
                    .map_err(|e| format!("writing {}: {e}", out.display()))?;
                println!("wrote {}", out.display());
            }
            None => println!("{text}"),
        }
        return if errors.is_empty() { Ok(()) } else { Err(errors.join("; ")) };
    }
    if batching_only {
        let out = out.unwrap_or_else(|| PathBuf::from("docs/benchmarks/batching.md"));
        cfg.cli = cli.or_else(|| Some(PathBuf::from("target/release/idalloc")));
        let report = idalloc_bench::run_batching(&cfg).await;
        let svg = out.with_extension("svg");
        let svg_name = svg.file_name().map(|n| n.to_string_lossy().into_owned());
        std::fs::write(&out, report.batching_markdown(svg_name.as_deref()))
            .map_err(|e| format!("writing {}: {e}", out.display()))?;
        std::fs::write(&svg, report.batching_svg())
            .map_err(|e| format!("writing {}: {e}", svg.display()))?;
        for t in report.batching_targets() {
            println!("{t}");
        }
        println!("wrote {} in {:.0} s", out.display(), report.wall_secs);
        return Ok(());
    }
    let out = out.unwrap_or_else(|| PathBuf::from("docs/benchmarks/protocol.md"));
    if remote_only {
        let f = idalloc_bench::remote::run(
            cfg.sync_bindings,
            cfg.remote_lookup_bindings,
            cfg.micro_iters,
        )
        .await;
        let text = format!(
            "# Remote views: benchmark figures\n\nGenerated by `cargo run --release -p idalloc-bench -- --remote-only --out docs/benchmarks/remote.md` on {} ({} logical cores, {}; load average {} at the start, shared with other workloads). Do not edit by hand.\n{}",
            idalloc_bench::stats::utc_now(), idalloc_bench::stats::cores(), idalloc_bench::stats::cpu_model(), idalloc_bench::stats::load_average(), f.markdown()
        );
        std::fs::write(&out, text).map_err(|e| format!("writing {}: {e}", out.display()))?;
        println!("wrote {}", out.display());
        return if f.errors.is_empty() { Ok(()) } else { Err(f.errors.join("; ")) };
    }
    cfg.cli = cli.or_else(|| Some(PathBuf::from("target/release/idalloc")));
    let report = run(&cfg).await;
    let svg = out.with_extension("svg");
    let svg_name =
        svg.file_name().map_or("protocol.svg".into(), |n| n.to_string_lossy().into_owned());
    std::fs::write(&out, report.markdown(&svg_name))
        .map_err(|e| format!("writing {}: {e}", out.display()))?;
    std::fs::write(&svg, report.svg()).map_err(|e| format!("writing {}: {e}", svg.display()))?;
    for t in report.targets() {
        println!("{t}");
    }
    println!("wrote {} and {} in {:.0} s", out.display(), svg.display(), report.wall_secs);
    Ok(())
}

/// `--coalescing-only`: see its argument above.
async fn coalescing(runs: usize) -> Result<(), String> {
    use idalloc_bench::contender::Kind;
    if !idalloc_testkit::etcd::etcd_on_path() {
        return Err("etcd is not on PATH: the benchmark starts its own etcd".into());
    }
    let cfg = Config::full();
    println!("| run | contender | ops/s | p50 ms | p99 ms | round trips/op | client µs/op | etcd µs/op | idalloc / ceiling | load average |");
    println!("|---:|---|---:|---:|---:|---:|---:|---:|---:|---|");
    for i in 1..=runs {
        let mut rates = Vec::new();
        for kind in [Kind::Idalloc, Kind::Ceiling] {
            let (r, cpu) = idalloc_bench::scenarios::new_keys_cpu(kind, 64, cfg.run).await?;
            let r = r.finish();
            let (client, etcd) = cpu.per_key_us();
            rates.push(r.throughput());
            let ratio = match rates.as_slice() {
                [a, b] => format!("{:.2}×", a / b),
                _ => String::new(),
            };
            println!(
                "| {i} | {} | {:.0} | {} | {} | {:.3} | {client:.0} | {etcd:.0} | {ratio} | {} |",
                kind.name(),
                r.throughput(),
                idalloc_bench::stats::ms(r.percentile(0.5)),
                idalloc_bench::stats::ms(r.percentile(0.99)),
                r.rt_per_op(),
                idalloc_bench::stats::load_average()
            );
        }
    }
    Ok(())
}
