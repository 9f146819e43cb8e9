//! Writes `docs/scale-fleet.svg` from `docs/scale-fleet.csv` (time until
//! all agents are synced and restored against the number of agents, direct and through `serve`;
//! the figures and how they were measured are in docs/scale.md, "Fleet").
//!
//! ```sh
//! cargo run -p idalloc-bench --example scale_fleet [-- CSV SVG]
//! ```

fn main() -> Result<(), String> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let csv = args.first().map_or("docs/scale-fleet.csv", String::as_str);
    let out = args.get(1).map_or("docs/scale-fleet.svg", String::as_str);
    let text = std::fs::read_to_string(csv).map_err(|e| format!("{csv}: {e}"))?;
    let points = idalloc_bench::fleetplot::parse(&text).map_err(|e| format!("{csv}: {e}"))?;
    let title =
        "Fleet on one etcd: time until all agents are synced / restored (loads in docs/scale.md)";
    std::fs::write(out, idalloc_bench::fleetplot::svg(title, &points))
        .map_err(|e| format!("{out}: {e}"))?;
    println!("{out}: {} points", points.len());
    Ok(())
}
