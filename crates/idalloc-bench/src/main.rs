//! `cargo run --release -p idalloc-bench -- [--quick] [--out docs/benchmarks.md] [--cli PATH]`
//!
//! Runs every scenario (see the crate docs) and writes the Markdown report to `--out` and the plot
//! next to it (same name, `.svg`). Needs `etcd` on `PATH`. The CLI scenario uses `--cli`, else
//! `$IDALLOC_CLI`, else `target/release/idalloc` if it exists.

use std::path::PathBuf;

use idalloc_bench::{run, Config};

fn usage(msg: &str) -> String {
    format!("{msg}\nusage: idalloc-bench [--quick | --micro-only | --embedded-only] [--out FILE.md] [--cli PATH-TO-idalloc]")
}

#[tokio::main(flavor = "multi_thread")]
async fn main() -> Result<(), String> {
    let mut quick = false;
    let mut out = PathBuf::from("docs/benchmarks.md");
    let mut cli: Option<PathBuf> = std::env::var_os("IDALLOC_CLI").map(PathBuf::from);
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        match a.as_str() {
            "--quick" => quick = true,
            // Micro-benchmarks alone, at full size, printed (for profiling a missed target).
            "--micro-only" => {
                let cfg = Config::full();
                let mut m = idalloc_bench::micro::Micro::default();
                idalloc_bench::micro::cache(cfg.micro_bindings, cfg.micro_iters, &mut m);
                idalloc_bench::micro::picks(cfg.micro_iters, &mut m);
                idalloc_bench::micro::escaping(cfg.micro_iters, &mut m);
                println!("{m:#?}");
                return Ok(());
            }
            // idalloc on the embedded stores alone (file at 1 and 64 tasks, memory at 64), printed:
            // for before/after comparisons of the embedded store (docs/store-benchmarks.md).
            "--embedded-only" => {
                let cfg = Config::full();
                let dir = tempfile::tempdir().map_err(|e| format!("temp dir: {e}"))?;
                println!("| store | tasks | ops | ops/s | p50 ms | p99 ms | round trips/op |");
                println!("|---|---:|---:|---:|---:|---:|---:|");
                for (label, file, c) in
                    [("file", true, 1), ("file", true, 64), ("memory", false, 64)]
                {
                    let d = file.then_some(dir.path());
                    let r = idalloc_bench::scenarios::embedded(d, c, cfg.run).await?.finish();
                    let ms = |d: std::time::Duration| d.as_secs_f64() * 1000.0;
                    println!(
                        "| {label} | {c} | {} | {:.0} | {:.2} | {:.2} | {:.2} |",
                        r.ops,
                        r.throughput(),
                        ms(r.percentile(0.5)),
                        ms(r.percentile(0.99)),
                        r.rt_per_op()
                    );
                }
                return Ok(());
            }
            "--out" => out = args.next().ok_or_else(|| usage("--out needs a file name"))?.into(),
            "--cli" => cli = Some(args.next().ok_or_else(|| usage("--cli needs a path"))?.into()),
            other => return Err(usage(&format!("unknown argument {other:?}"))),
        }
    }
    if !idalloc_testkit::etcd::etcd_on_path() {
        return Err("etcd is not on PATH: the benchmark starts its own etcd".into());
    }
    let mut cfg = if quick { Config::quick() } else { Config::full() };
    cfg.cli = cli.or_else(|| Some(PathBuf::from("target/release/idalloc")));
    let report = run(&cfg).await;
    let svg = out.with_extension("svg");
    let svg_name =
        svg.file_name().map_or("benchmarks.svg".into(), |n| n.to_string_lossy().into_owned());
    std::fs::write(&out, report.markdown(&svg_name))
        .map_err(|e| format!("writing {}: {e}", out.display()))?;
    std::fs::write(&svg, report.svg()).map_err(|e| format!("writing {}: {e}", svg.display()))?;
    for t in report.targets() {
        println!("{t}");
    }
    println!("wrote {} and {} in {:.0} s", out.display(), svg.display(), report.wall_secs);
    Ok(())
}
