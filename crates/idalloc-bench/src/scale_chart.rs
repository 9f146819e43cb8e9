//! The chart of a `--scale` run on etcd (`docs/scale-etcd.svg`), drawn from the
//! figures the run measured. Three panels against bindings (log axis, since the sizes go 10k …
//! millions): the sync time of a new process (with the 1M target), memory (the new process's and
//! etcd's), and bytes per binding (etcd's database, etcd's resident memory, the new process's).
//! Per-binding figures that stay flat are what "linear" looks like; a rising line is the
//! superlinear part.
//!
//! Plain SVG written by hand like the other charts of the harness (`plot.rs`): a few dozen lines
//! a diff can review.

use std::fmt::Write;

use crate::plot::{nice_ceiling, svg_open};
use crate::scale::EtcdScale;

/// One line of a panel.
#[derive(Clone, Debug, PartialEq)]
pub struct Series {
    pub label: &'static str,
    pub colour: &'static str,
    /// (bindings, value); points whose value is not finite or is negative are left out.
    pub points: Vec<(f64, f64)>,
}

/// A horizontal reference (a target) at `value`, labelled.
#[derive(Clone, Debug, PartialEq)]
pub struct Target {
    pub label: String,
    pub value: f64,
}

/// Width and height of one panel, and its margins.
const PW: f64 = 420.0;
const PH: f64 = 300.0;
const ML: f64 = 60.0;
const MR: f64 = 20.0;
const MT: f64 = 40.0;
const MB: f64 = 90.0;

fn usable(v: f64) -> bool {
    v.is_finite() && v >= 0.0
}

/// Bindings as the axis labels them (10k, 1M, 2.5M).
fn short(n: f64) -> String {
    if n >= 1e6 {
        format!("{}M", (n / 1e5).round() / 10.0)
    } else if n >= 1e3 {
        format!("{}k", (n / 1e2).round() / 10.0)
    } else {
        format!("{n}")
    }
}

/// One panel with its top-left corner at `left`, `top`, against bindings.
pub fn panel(
    left: f64,
    top: f64,
    title: &str,
    unit: &str,
    series: &[Series],
    targets: &[Target],
) -> String {
    panel_against(left, top, title, "bindings", unit, series, targets)
}

/// [`panel`] against `axis` (what the x values count: bindings, agents), log scale.
pub fn panel_against(
    left: f64,
    top: f64,
    title: &str,
    axis: &str,
    unit: &str,
    series: &[Series],
    targets: &[Target],
) -> String {
    let xs: Vec<f64> =
        series.iter().flat_map(|s| s.points.iter().map(|p| p.0)).filter(|x| *x > 0.0).collect();
    let (xmin, xmax) = xs.iter().fold((f64::MAX, 0.0f64), |(lo, hi), x| (lo.min(*x), hi.max(*x)));
    let (lmin, lmax) = if xs.is_empty() {
        (0.0, 1.0)
    } else {
        (xmin.log10(), xmax.log10().max(xmin.log10() + 1.0))
    };
    let ytop = series
        .iter()
        .flat_map(|s| s.points.iter().map(|p| p.1))
        .chain(targets.iter().map(|t| t.value))
        .filter(|v| usable(*v))
        .fold(0.0, f64::max);
    let ymax = nice_ceiling(ytop.max(1e-9));
    let (x0, x1) = (left + ML, left + PW - MR);
    let (y0, y1) = (top + PH - MB, top + MT);
    let px = |x: f64| x0 + (x.log10() - lmin) / (lmax - lmin) * (x1 - x0);
    let py = |v: f64| y0 - v / ymax * (y0 - y1);
    let mut s = String::new();
    let _ = writeln!(
        s,
        r#"<text x="{:.1}" y="{:.1}" text-anchor="middle" font-size="13">{}</text>"#,
        (x0 + x1) / 2.0,
        top + 24.0,
        esc(title)
    );
    for i in 0..=4 {
        let v = ymax * i as f64 / 4.0;
        let y = py(v);
        let _ = writeln!(
            s,
            r##"<line x1="{x0:.1}" y1="{y:.1}" x2="{x1:.1}" y2="{y:.1}" stroke="#eee"/><text x="{:.1}" y="{:.1}" text-anchor="end" font-size="10">{}</text>"##,
            x0 - 4.0,
            y + 3.0,
            trim(v)
        );
    }
    let mut ticks: Vec<f64> = xs.clone();
    ticks.sort_by(f64::total_cmp);
    ticks.dedup();
    for x in &ticks {
        let _ = writeln!(
            s,
            r##"<line x1="{0:.1}" y1="{y1:.1}" x2="{0:.1}" y2="{y0:.1}" stroke="#eee"/><text x="{0:.1}" y="{1:.1}" text-anchor="middle" font-size="10">{2}</text>"##,
            px(*x),
            y0 + 14.0,
            short(*x)
        );
    }
    let _ = writeln!(
        s,
        r##"<line x1="{x0:.1}" y1="{y0:.1}" x2="{x1:.1}" y2="{y0:.1}" stroke="#000"/><line x1="{x0:.1}" y1="{y0:.1}" x2="{x0:.1}" y2="{y1:.1}" stroke="#000"/><text x="{:.1}" y="{:.1}" text-anchor="middle" font-size="11">{} (log scale); {}</text>"##,
        (x0 + x1) / 2.0,
        y0 + 30.0,
        esc(axis),
        esc(unit)
    );
    for t in targets.iter().filter(|t| usable(t.value)) {
        let y = py(t.value);
        let _ = writeln!(
            s,
            r##"<line class="target" x1="{x0:.1}" y1="{y:.1}" x2="{x1:.1}" y2="{y:.1}" stroke="#000" stroke-dasharray="4 3"/><text x="{:.1}" y="{:.1}" text-anchor="end" font-size="10">{}</text>"##,
            x1,
            y - 4.0,
            esc(&t.label)
        );
    }
    for (i, ser) in series.iter().enumerate() {
        let pts: Vec<(f64, f64)> =
            ser.points.iter().copied().filter(|(x, v)| *x > 0.0 && usable(*v)).collect();
        let path: Vec<String> =
            pts.iter().map(|(x, v)| format!("{:.1},{:.1}", px(*x), py(*v))).collect();
        let _ = writeln!(
            s,
            r#"<polyline fill="none" stroke="{}" stroke-width="2" points="{}"/>"#,
            ser.colour,
            path.join(" ")
        );
        for (x, v) in &pts {
            let _ = writeln!(
                s,
                r#"<circle class="point" data-value="{v}" cx="{:.1}" cy="{:.1}" r="3" fill="{}"/><text x="{:.1}" y="{:.1}" font-size="9" fill="{}">{}</text>"#,
                px(*x),
                py(*v),
                ser.colour,
                px(*x) + 4.0,
                py(*v) - 4.0,
                ser.colour,
                trim(*v)
            );
        }
        let ly = y0 + 46.0 + 14.0 * i as f64;
        let _ = writeln!(
            s,
            r#"<line x1="{x0:.1}" y1="{ly:.1}" x2="{:.1}" y2="{ly:.1}" stroke="{}" stroke-width="2"/><text x="{:.1}" y="{:.1}" font-size="10">{}</text>"#,
            x0 + 18.0,
            ser.colour,
            x0 + 24.0,
            ly + 3.0,
            esc(ser.label)
        );
    }
    s
}

/// A value as a label: no decimals from 100, one below, two below 1.
fn trim(v: f64) -> String {
    if v >= 100.0 {
        format!("{v:.0}")
    } else if v >= 1.0 {
        format!("{v:.1}")
    } else {
        format!("{v:.2}")
    }
}

fn esc(s: &str) -> String {
    s.replace('&', "&amp;").replace('<', "&lt;").replace('>', "&gt;")
}

/// The whole chart of a run's figures (one etcd setting, several sizes).
pub fn svg(runs: &[EtcdScale]) -> String {
    let first = |e: &EtcdScale| e.sync.first().map(|(_, f)| f.clone()).unwrap_or_default();
    let at = |f: &dyn Fn(&EtcdScale) -> f64| -> Vec<(f64, f64)> {
        runs.iter().map(|e| (e.n as f64, f(e))).collect()
    };
    let mb = |b: u64| b as f64 / 1048576.0;
    let per = |b: u64, n: u64| b as f64 / n.max(1) as f64;
    let sync = [
        Series {
            label: "sync of a new process (wall)",
            colour: "#1f77b4",
            points: at(&|e| first(e).sync_secs),
        },
        Series {
            label: "CPU of the process + etcd during it",
            colour: "#ff7f0e",
            points: at(&|e| first(e).cpu_self + first(e).cpu_etcd),
        },
    ];
    let memory = [
        Series {
            label: "new process: resident after sync",
            colour: "#1f77b4",
            points: at(&|e| mb(first(e).rss_after)),
        },
        Series {
            label: "new process: peak",
            colour: "#9ecae1",
            points: at(&|e| mb(first(e).rss_peak)),
        },
        Series {
            label: "etcd: resident after the syncs",
            colour: "#d62728",
            points: at(&|e| mb(e.etcd_synced.rss)),
        },
    ];
    let bytes = [
        Series { label: "etcd database", colour: "#2ca02c", points: at(&|e| per(e.db_bytes, e.n)) },
        Series {
            label: "etcd resident (after the syncs)",
            colour: "#d62728",
            points: at(&|e| per(e.etcd_synced.rss, e.n)),
        },
        Series {
            label: "new process resident",
            colour: "#1f77b4",
            points: at(&|e| per(first(e).rss_after, e.n)),
        },
    ];
    let setting = runs.first().map_or("default", |e| e.setting.as_str());
    let (w, h) = (3.0 * PW, PH + 40.0);
    let mut s = svg_open(
        w,
        h,
        w / 2.0,
        &format!("A 24-bit pool on one etcd 3.4 member (etcd setting: {setting})"),
    );
    s.push_str(&panel(
        0.0,
        30.0,
        "sync of a new process",
        "seconds",
        &sync,
        &[Target { label: "target ≤ 10 s at 1M".into(), value: 10.0 }],
    ));
    s.push_str(&panel(PW, 30.0, "resident memory", "MB", &memory, &[]));
    s.push_str(&panel(2.0 * PW, 30.0, "bytes per binding", "bytes", &bytes, &[]));
    s.push_str("</svg>\n");
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    fn circles(svg: &str) -> Vec<(f64, f64, String)> {
        svg.split(r#"<circle class="point" data-value=""#)
            .skip(1)
            .map(|c| {
                let num = |after: &str| -> f64 {
                    let r = &c[c.find(after).expect(after) + after.len()..];
                    r[..r.find('"').expect("quote")].parse().expect("number")
                };
                (num(r#"cx=""#), num(r#"cy=""#), c[..c.find('"').expect("quote")].to_string())
            })
            .collect()
    }

    #[test]
    fn points_sit_on_a_log_axis_of_bindings_and_a_linear_axis_from_zero() {
        let s = Series {
            label: "x",
            colour: "#000",
            points: vec![(1e4, 10.0), (1e6, 20.0), (1e5, f64::NAN)],
        };
        let svg = panel(0.0, 0.0, "t", "u", &[s], &[]);
        let c = circles(&svg);
        assert_eq!(c.len(), 2, "the NaN point is left out");
        let (x0, x1, y0, y1) = (ML, PW - MR, PH - MB, MT);
        // 10k at the left end, 1M at the right end (two decades).
        assert!((c[0].0 - x0).abs() < 0.1 && (c[1].0 - x1).abs() < 0.1, "{c:?}");
        // The axis ends at 20 (nice ceiling): 10 halfway up, 20 at the top.
        assert!((c[0].1 - (y0 + y1) / 2.0).abs() < 0.1 && (c[1].1 - y1).abs() < 0.1, "{c:?}");
        assert!(!svg.contains("NaN"));
    }

    #[test]
    fn a_target_above_every_point_still_fits_the_axis() {
        let s = Series { label: "x", colour: "#000", points: vec![(1e4, 1.0), (1e6, 6.7)] };
        let svg = panel(0.0, 0.0, "t", "u", &[s], &[Target { label: "≤ 10".into(), value: 10.0 }]);
        let at = svg.find(r#"class="target""#).expect("a target line");
        let y: f64 = {
            let r = &svg[at..];
            let r = &r[r.find(r#"y1=""#).expect("y1") + 4..];
            r[..r.find('"').expect("quote")].parse().expect("number")
        };
        assert!((y - MT).abs() < 0.1, "10 is the axis top: {y}");
    }

    #[test]
    fn axis_labels_name_bindings_shortly() {
        assert_eq!(short(10_000.0), "10k");
        assert_eq!(short(1_000_000.0), "1M");
        assert_eq!(short(2_500_000.0), "2.5M");
    }
}
