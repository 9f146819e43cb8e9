//! Draws `docs/scale-memory.svg`: peak resident memory per binding of the
//! commands measured for docs/scale.md, against the pool's size, from a CSV of measurements.
//!
//! ```text
//! cargo run --release -p idalloc-bench --example scale_memory_plot -- docs/scale-memory.csv docs/scale-memory.svg
//! ```
//!
//! CSV columns: `what,store,bindings,peak_kib` (a header line first). One bar per row: the peak
//! divided by the bindings, in bytes. A flat process (bounded memory) shows as bars that shrink
//! tenfold from one size to the next; a process that holds the pool as bars of the same length.

use idalloc_bench::plot::{bars_svg, Bar};

/// One measured row.
struct Row {
    what: String,
    store: String,
    bindings: u64,
    peak_kib: f64,
}

fn parse(csv: &str) -> Result<Vec<Row>, String> {
    let mut rows = Vec::new();
    for (n, line) in csv.lines().enumerate().skip(1) {
        if line.trim().is_empty() {
            continue;
        }
        let f: Vec<&str> = line.split(',').map(str::trim).collect();
        let [what, store, bindings, peak] = f[..] else {
            return Err(format!(
                "line {}: want 4 fields (what,store,bindings,peak_kib), got {line:?}",
                n + 1
            ));
        };
        let bindings: u64 =
            bindings.parse().map_err(|e| format!("line {}: bindings {bindings:?}: {e}", n + 1))?;
        if bindings == 0 {
            return Err(format!("line {}: bindings must be above 0", n + 1));
        }
        let peak_kib: f64 =
            peak.parse().map_err(|e| format!("line {}: peak_kib {peak:?}: {e}", n + 1))?;
        rows.push(Row { what: what.into(), store: store.into(), bindings, peak_kib });
    }
    Ok(rows)
}

fn size(n: u64) -> String {
    match n {
        n if n >= 1_000_000 && n % 1_000_000 == 0 => format!("{}M", n / 1_000_000),
        n if n >= 1_000 && n % 1_000 == 0 => format!("{}k", n / 1_000),
        n => n.to_string(),
    }
}

fn main() -> Result<(), String> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [csv, svg] = &args[..] else {
        return Err("usage: scale_memory_plot IN.csv OUT.svg".into());
    };
    let text = std::fs::read_to_string(csv).map_err(|e| format!("reading {csv}: {e}"))?;
    let colours = ["#4e79a7", "#f28e2b", "#59a14f", "#e15759", "#76b7b2", "#b07aa1"];
    let mut kinds: Vec<(String, String)> = Vec::new();
    let bars: Vec<Bar> = parse(&text)?
        .into_iter()
        .map(|r| {
            let kind = (r.what.clone(), r.store.clone());
            let i = kinds.iter().position(|k| *k == kind).unwrap_or_else(|| {
                kinds.push(kind);
                kinds.len() - 1
            });
            Bar {
                label: format!("{} ({}), {} bindings", r.what, r.store, size(r.bindings)),
                value: r.peak_kib * 1024.0 / r.bindings as f64,
                colour: colours[i % colours.len()],
                targets: Vec::new(),
            }
        })
        .collect();
    let chart = bars_svg(
        "Peak resident memory per binding (lower at larger pools = bounded)",
        "bytes per binding (peak RSS / bindings)",
        &bars,
    );
    std::fs::write(svg, chart).map_err(|e| format!("writing {svg}: {e}"))?;
    println!("wrote {svg} ({} bars)", bars.len());
    Ok(())
}
