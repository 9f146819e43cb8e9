//! Writes `docs/benchmarks/scale-cost.svg` from `docs/benchmarks/scale-cost.csv` (a listing command's
//! cost per binding against the pool's size; the figures and how they were measured are in
//! docs/benchmarks/scale.md, "Linear cost").
//!
//! ```sh
//! cargo run -p idalloc-bench --example scale_cost [-- CSV SVG]
//! ```

fn main() -> Result<(), String> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let csv = args.first().map_or("docs/benchmarks/scale-cost.csv", String::as_str);
    let out = args.get(1).map_or("docs/benchmarks/scale-cost.svg", String::as_str);
    let text = std::fs::read_to_string(csv).map_err(|e| format!("{csv}: {e}"))?;
    let points = idalloc_bench::costplot::parse(&text).map_err(|e| format!("{csv}: {e}"))?;
    let title = "Listing cost per binding (CPU of the CLI + etcd; build and load in docs/benchmarks/scale.md)";
    std::fs::write(out, idalloc_bench::costplot::svg(title, &points))
        .map_err(|e| format!("{out}: {e}"))?;
    println!("{out}: {} points", points.len());
    Ok(())
}
