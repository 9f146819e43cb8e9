//! The cost-per-binding chart of docs/scale.md: a listing command's cost per
//! binding against the pool's size, one line per store and command, from a CSV measured by hand
//! (the commands are on the page). Linear cost is a flat line; the target is the 10k point × 1.5
//! at 1M, drawn as a dashed line per series' start.
//!
//! Written beside `plot.rs` (same plain-SVG style) rather than in the bench's run: the figures
//! come from CLI runs against filled stores, not from a bench scenario.

use std::fmt::Write;

use crate::plot::svg_open;

/// One measured point: `store` (`etcd`, `file`), `command` (`list`, `check`, …), pool size in
/// bindings, and the cost per binding in µs.
#[derive(Clone, Debug, PartialEq)]
pub struct Point {
    pub store: String,
    pub command: String,
    pub bindings: u64,
    pub micros: f64,
}

/// Parses `store,command,bindings,micros_per_binding` lines (a header line and `#` comments are
/// skipped). A malformed line is an error naming it.
pub fn parse(csv: &str) -> Result<Vec<Point>, String> {
    let mut out = Vec::new();
    for (i, line) in csv.lines().enumerate() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') || line.starts_with("store,") {
            continue;
        }
        let f: Vec<&str> = line.split(',').map(str::trim).collect();
        let bad = |why: &str| format!("line {}: {line:?}: {why}", i + 1);
        let [store, command, bindings, micros] = f[..] else {
            return Err(bad("expected store,command,bindings,micros_per_binding"));
        };
        let bindings = bindings.parse::<u64>().map_err(|_| bad("bindings is not a count"))?;
        let micros = micros.parse::<f64>().map_err(|_| bad("micros is not a number"))?;
        if bindings == 0 || !micros.is_finite() || micros < 0.0 {
            return Err(bad("bindings must be > 0 and micros >= 0"));
        }
        out.push(Point { store: store.into(), command: command.into(), bindings, micros });
    }
    Ok(out)
}

const COLOURS: [&str; 8] =
    ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#17becf"];

/// The chart: x is the pool size on a log scale, y the cost per binding from 0. Each series is a
/// polyline with its points marked; its dashed line is 1.5 × its smallest pool's cost.
pub fn svg(title: &str, points: &[Point]) -> String {
    let mut series: Vec<(String, Vec<&Point>)> = Vec::new();
    for p in points {
        let name = format!("{} {}", p.store, p.command);
        match series.iter_mut().find(|(n, _)| *n == name) {
            Some((_, v)) => v.push(p),
            None => series.push((name, vec![p])),
        }
    }
    for (_, v) in &mut series {
        v.sort_by_key(|p| p.bindings);
    }
    let (w, h, ml, mr, mt, mb) = (780.0, 440.0, 70.0, 170.0, 44.0, 50.0);
    let lo = points.iter().map(|p| p.bindings).min().unwrap_or(1).max(1) as f64;
    let hi = points.iter().map(|p| p.bindings).max().unwrap_or(10).max(2) as f64;
    let (lx0, lx1) = (lo.log10().floor(), hi.log10().ceil().max(lo.log10().floor() + 1.0));
    let top = points.iter().map(|p| p.micros * 1.5).fold(1.0, f64::max);
    let vmax = crate::plot::nice_ceiling(top);
    let px = |b: f64| ml + (b.log10() - lx0) / (lx1 - lx0) * (w - ml - mr);
    let py = |v: f64| h - mb - v / vmax * (h - mt - mb);
    let mut s = svg_open(w, h, (w - mr + ml) / 2.0, title);
    for i in 0..=5 {
        let v = vmax * i as f64 / 5.0;
        let y = py(v);
        let _ = writeln!(
            s,
            r##"<line x1="{ml}" y1="{y:.1}" x2="{:.1}" y2="{y:.1}" stroke="#eee"/><text x="{:.1}" y="{:.1}" text-anchor="end">{v}</text>"##,
            w - mr,
            ml - 6.0,
            y + 4.0
        );
    }
    let mut decade = lx0;
    while decade <= lx1 {
        let x = px(10f64.powf(decade));
        let label = match 10u64.pow(decade as u32) {
            n if n >= 1_000_000 => format!("{}M", n / 1_000_000),
            n if n >= 1_000 => format!("{}k", n / 1_000),
            n => n.to_string(),
        };
        let _ = writeln!(
            s,
            r##"<line x1="{x:.1}" y1="{mt}" x2="{x:.1}" y2="{:.1}" stroke="#eee"/><text x="{x:.1}" y="{:.1}" text-anchor="middle">{label}</text>"##,
            h - mb,
            h - mb + 16.0
        );
        decade += 1.0;
    }
    let _ = writeln!(
        s,
        r#"<text x="{:.1}" y="{:.1}" text-anchor="middle">bindings in the pool (log scale)</text>"#,
        (ml + w - mr) / 2.0,
        h - 12.0
    );
    let _ = writeln!(
        s,
        r#"<text x="16" y="{:.1}" transform="rotate(-90 16 {:.1})" text-anchor="middle">µs per binding</text>"#,
        (mt + h - mb) / 2.0,
        (mt + h - mb) / 2.0
    );
    for (i, (name, pts)) in series.iter().enumerate() {
        let c = COLOURS[i % COLOURS.len()];
        let coords: Vec<String> = pts
            .iter()
            .map(|p| format!("{:.1},{:.1}", px(p.bindings as f64), py(p.micros)))
            .collect();
        let _ = writeln!(
            s,
            r#"<polyline class="series" data-name="{name}" points="{}" fill="none" stroke="{c}" stroke-width="2"/>"#,
            coords.join(" ")
        );
        for p in pts {
            let _ = writeln!(
                s,
                r#"<circle cx="{:.1}" cy="{:.1}" r="3" fill="{c}"/>"#,
                px(p.bindings as f64),
                py(p.micros)
            );
        }
        if let (Some(first), Some(last)) = (pts.first(), pts.last()) {
            let y = py(first.micros * 1.5);
            let _ = writeln!(
                s,
                r#"<line class="target" x1="{:.1}" y1="{y:.1}" x2="{:.1}" y2="{y:.1}" stroke="{c}" stroke-dasharray="4 4"/>"#,
                px(first.bindings as f64),
                px(last.bindings as f64)
            );
        }
        let ly = mt + 10.0 + 18.0 * i as f64;
        let _ = writeln!(
            s,
            r#"<line x1="{:.1}" y1="{ly:.1}" x2="{:.1}" y2="{ly:.1}" stroke="{c}" stroke-width="2"/><text x="{:.1}" y="{:.1}">{name}</text>"#,
            w - mr + 12.0,
            w - mr + 32.0,
            w - mr + 38.0,
            ly + 4.0
        );
    }
    let _ = writeln!(
        s,
        r#"<text x="{:.1}" y="{:.1}" font-size="10">dashed: 1.5 × the smallest pool</text>"#,
        w - mr + 12.0,
        mt + 14.0 + 18.0 * series.len() as f64
    );
    s.push_str("</svg>\n");
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_series_is_one_line_with_its_target() {
        let csv = "store,command,bindings,micros_per_binding\n# a comment\n\
                   etcd,list,10000,30\netcd,list,1000000,33\nfile,list,1000000,12\nfile,list,10000,10\n";
        let pts = parse(csv).expect("parse");
        assert_eq!(pts.len(), 4);
        let s = svg("t", &pts);
        assert_eq!(s.matches(r#"class="series""#).count(), 2);
        assert_eq!(s.matches(r#"class="target""#).count(), 2);
        assert!(s.contains(r#"data-name="file list""#) && s.trim_end().ends_with("</svg>"));
        // The file series is drawn in size order whatever the CSV's order: its first x is left.
        let line = s.lines().find(|l| l.contains(r#"data-name="file list""#)).expect("file line");
        let xs: Vec<f64> = line
            .split("points=\"")
            .nth(1)
            .and_then(|r| r.split('"').next())
            .map(|p| p.split(' ').filter_map(|xy| xy.split(',').next()?.parse().ok()).collect())
            .unwrap_or_default();
        assert!(xs.len() == 2 && xs[0] < xs[1], "{xs:?}");
    }

    #[test]
    fn a_malformed_line_is_named() {
        let e = parse("etcd,list,ten,3\n").expect_err("bad count");
        assert!(e.contains("line 1") && e.contains("ten"), "{e}");
        assert!(parse("etcd,list,10\n").is_err());
        assert!(parse("etcd,list,10,-1\n").is_err());
    }
}
