//! The fleet chart of docs/scale.md: time until all agents are synced
//! (cold start) and restored (restart storm) against the number of agents, one panel per pool
//! size, one line per phase and mode (direct agents, agents through `serve`), with the 30 s
//! target. Drawn from a CSV kept by hand (`docs/scale-fleet.csv`) rather than from one bench run:
//! the figures come from several `--fleet` runs (direct and through serve, by different people,
//! each at its own load), and a series is added by adding its rows.
//!
//! ```sh
//! cargo run -p idalloc-bench --example scale_fleet [-- CSV SVG]
//! ```

use crate::plot::svg_open;
use crate::scale_chart::{panel_against, Series, Target};

/// One measured time: `mode` (`direct` or `serve`), agents, bindings before the fleet came,
/// `phase` (`cold start` or `restart storm`), seconds until the last agent was done, and how many
/// agents gave up (then the time is of those that did not).
#[derive(Clone, Debug, PartialEq)]
pub struct Point {
    pub mode: Mode,
    pub agents: u64,
    pub bindings: u64,
    pub phase: Phase,
    pub secs: f64,
    pub failed: u64,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    Direct,
    Serve,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Phase {
    ColdStart,
    Storm,
}

/// The lines, in legend order: label, colour, what they hold.
const LINES: [(&str, &str, Phase, Mode); 4] = [
    ("cold start, direct agents", "#1f77b4", Phase::ColdStart, Mode::Direct),
    ("restart storm, direct agents", "#d62728", Phase::Storm, Mode::Direct),
    ("cold start, through serve", "#9ecae1", Phase::ColdStart, Mode::Serve),
    ("restart storm, through serve", "#ff9896", Phase::Storm, Mode::Serve),
];

/// Parses `mode,agents,bindings,phase,all_done_s,failed` lines (a header line and `#` comments
/// are skipped). A malformed line is an error naming it and what is allowed.
pub fn parse(csv: &str) -> Result<Vec<Point>, String> {
    let mut out = Vec::new();
    for (i, line) in csv.lines().enumerate() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') || line.starts_with("mode,") {
            continue;
        }
        let bad = |why: &str| format!("line {}: {line:?}: {why}", i + 1);
        let f: Vec<&str> = line.split(',').map(str::trim).collect();
        let [mode, agents, bindings, phase, secs, failed] = f[..] else {
            return Err(bad("expected mode,agents,bindings,phase,all_done_s,failed"));
        };
        let mode = match mode {
            "direct" => Mode::Direct,
            "serve" => Mode::Serve,
            _ => return Err(bad("mode is `direct` or `serve`")),
        };
        let phase = match phase {
            "cold start" => Phase::ColdStart,
            "restart storm" => Phase::Storm,
            _ => return Err(bad("phase is `cold start` or `restart storm`")),
        };
        let count = |v: &str, what: &str| {
            v.parse::<u64>().map_err(|_| bad(&format!("{what} is not a whole number")))
        };
        let (agents, bindings, failed) =
            (count(agents, "agents")?, count(bindings, "bindings")?, count(failed, "failed")?);
        let secs = secs.parse::<f64>().map_err(|_| bad("all_done_s is not a number"))?;
        if agents == 0 || !secs.is_finite() || secs < 0.0 {
            return Err(bad("agents must be > 0 and all_done_s a number >= 0"));
        }
        out.push(Point { mode, agents, bindings, phase, secs, failed });
    }
    Ok(out)
}

/// The chart: one panel per pool size (in the order first seen), agents on a log axis, seconds
/// from 0, the 30 s target dashed. A line's points are its rows in agent order; when a series has
/// two rows for one size and count (a before and an after), the later row wins.
pub fn svg(title: &str, points: &[Point]) -> String {
    let mut sizes: Vec<u64> = Vec::new();
    for p in points {
        if !sizes.contains(&p.bindings) {
            sizes.push(p.bindings);
        }
    }
    let (pw, ph) = (420.0, 300.0 + 14.0 * 2.0);
    let w = pw * sizes.len().max(1) as f64;
    let mut s = svg_open(w, ph + 60.0, w / 2.0, title);
    for (n, size) in sizes.iter().enumerate() {
        let series: Vec<Series> = LINES
            .iter()
            .map(|&(label, colour, phase, mode)| {
                let mut pts: Vec<(f64, f64)> = Vec::new();
                for p in points
                    .iter()
                    .filter(|p| p.bindings == *size && p.phase == phase && p.mode == mode)
                {
                    let x = p.agents as f64;
                    pts.retain(|(a, _)| *a != x);
                    pts.push((x, p.secs));
                }
                pts.sort_by(|a, b| a.0.total_cmp(&b.0));
                Series { label, colour, points: pts }
            })
            .collect();
        let target = Target { label: "target ≤ 30 s".into(), value: 30.0 };
        s.push_str(&panel_against(
            pw * n as f64,
            30.0,
            &format!("a pool of {size} bindings"),
            "agents",
            "seconds until all are done",
            &series,
            &[target],
        ));
    }
    let failed: u64 = points.iter().map(|p| p.failed).sum();
    if failed > 0 {
        s.push_str(&format!(
            "<text x=\"10\" y=\"{:.0}\" font-size=\"10\">Where agents gave up (docs/scale.md \
             says how many), a point is the time of those that did not.</text>\n",
            ph + 50.0
        ));
    }
    s.push_str("</svg>\n");
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    const CSV: &str = "# a comment\n\
        mode,agents,bindings,phase,all_done_s,failed\n\
        direct,100,10000,cold start,20.3,0\n\
        direct,300,10000,cold start,76.0,158\n\
        direct,100,10000,restart storm,178.1,0\n\
        direct,100,10000,restart storm,44.6,0\n\
        serve,100,10000,cold start,12.0,0\n\
        direct,100,100000,cold start,9.5,0\n";

    #[test]
    fn rows_parse_and_bad_ones_are_named() {
        let p = parse(CSV).expect("parses");
        assert_eq!(p.len(), 6);
        assert_eq!(
            p[1],
            Point {
                mode: Mode::Direct,
                agents: 300,
                bindings: 10000,
                phase: Phase::ColdStart,
                secs: 76.0,
                failed: 158
            }
        );
        for (bad, says) in [
            ("local,1,1,cold start,1,0", "mode is"),
            ("direct,1,1,warm start,1,0", "phase is"),
            ("direct,x,1,cold start,1,0", "agents is not"),
            ("direct,1,1,cold start,-1,0", ">= 0"),
            ("direct,1,1,cold start", "expected"),
        ] {
            let e = parse(bad).expect_err(bad);
            assert!(e.contains(bad) && e.contains(says), "{e}");
        }
    }

    #[test]
    fn one_panel_per_pool_size_both_modes_and_the_later_row_wins() {
        let svg = svg("t", &parse(CSV).expect("parses"));
        assert_eq!(svg.matches("a pool of 10000 bindings").count(), 1);
        assert_eq!(svg.matches("a pool of 100000 bindings").count(), 1);
        assert_eq!(svg.matches("target ≤ 30 s").count(), 2);
        assert!(svg.contains("restart storm, through serve"), "the serve lines have a legend");
        assert!(svg.contains(r#"data-value="44.6""#) && !svg.contains(r#"data-value="178.1""#));
        assert!(svg.contains(r#"data-value="12""#), "the serve point is drawn");
        assert!(svg.contains("gave up"), "a run with failed agents is flagged");
        assert!(!svg.contains("NaN"));
    }
}
