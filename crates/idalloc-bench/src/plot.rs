//! A horizontal bar chart in plain SVG, for pages whose figures are a handful of rates, each with
//! its own targets (the batching page states every target as a ratio to another bar, so
//! the chart draws each target where it falls on the same axis as the bars).
//!
//! Hand-written rather than a plotting crate: the output is a few dozen lines of SVG that a diff
//! can review, and the full page's line chart (`Report::svg`) is written the same way.

use std::fmt::Write;

/// One bar: a measured rate and the targets that apply to it (label, value on the same axis).
#[derive(Clone, Debug, PartialEq)]
pub struct Bar {
    pub label: String,
    pub value: f64,
    pub colour: &'static str,
    pub targets: Vec<(String, f64)>,
}

/// The smallest 1, 2, 2.5 or 5 × 10^k at or above `v` (axis ends on a round figure that fifths
/// divide evenly, and the largest bar fills at least 40 % of it).
pub fn nice_ceiling(v: f64) -> f64 {
    let p = 10f64.powf(v.max(1.0).log10().floor());
    for m in [1.0, 2.0, 2.5, 5.0, 10.0] {
        if m * p >= v {
            return m * p;
        }
    }
    10.0 * p
}

/// Escapes text for an SVG text node.
fn esc(s: &str) -> String {
    s.replace('&', "&amp;").replace('<', "&lt;").replace('>', "&gt;")
}

/// The opening of a chart: the `<svg>` element, a white background and the title centred on
/// `title_x` (shared by every chart of the harness; close it with `</svg>`).
pub fn svg_open(w: f64, h: f64, title_x: f64, title: &str) -> String {
    let mut s = String::new();
    let _ = writeln!(
        s,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" viewBox="0 0 {w} {h}" font-family="sans-serif" font-size="12">"#
    );
    let _ = writeln!(s, r#"<rect width="{w}" height="{h}" fill="white"/>"#);
    let _ = writeln!(
        s,
        r#"<text x="{title_x}" y="22" text-anchor="middle" font-size="14">{}</text>"#,
        esc(title)
    );
    s
}

/// `bars` against one linear axis from 0, in `unit`. A target is a black tick across its bar with
/// its label under the bar; a bar that falls short of a target is drawn in grey beyond its end,
/// so a missed target reads as a gap. Values that are not finite or are negative are drawn as 0.
pub fn bars_svg(title: &str, unit: &str, bars: &[Bar]) -> String {
    let clean = |v: f64| if v.is_finite() && v > 0.0 { v } else { 0.0 };
    let (w, ml, mr, mt, row, bh) = (780.0, 290.0, 30.0, 44.0, 46.0, 20.0);
    let h = mt + row * bars.len() as f64 + 40.0;
    let top = bars
        .iter()
        .flat_map(|b| std::iter::once(b.value).chain(b.targets.iter().map(|t| t.1)))
        .map(clean)
        .fold(1.0, f64::max);
    let vmax = nice_ceiling(top);
    let (x0, x1) = (ml, w - mr);
    let px = |v: f64| x0 + clean(v) / vmax * (x1 - x0);
    let mut s = svg_open(w, h, w / 2.0, title);
    let axis_y = mt + row * bars.len() as f64;
    for i in 0..=5 {
        let v = vmax * i as f64 / 5.0;
        let x = px(v);
        let _ = writeln!(
            s,
            r##"<line x1="{x:.1}" y1="{mt}" x2="{x:.1}" y2="{axis_y}" stroke="#eee"/><text x="{x:.1}" y="{:.1}" text-anchor="middle">{v:.0}</text>"##,
            axis_y + 16.0
        );
    }
    let _ = writeln!(
        s,
        r#"<text x="{}" y="{:.1}" text-anchor="middle">{}</text>"#,
        (x0 + x1) / 2.0,
        axis_y + 34.0,
        esc(unit)
    );
    for (i, b) in bars.iter().enumerate() {
        let y = mt + row * i as f64;
        let end = px(b.value);
        let _ = writeln!(
            s,
            r#"<text x="{:.1}" y="{:.1}" text-anchor="end">{}</text>"#,
            x0 - 8.0,
            y + bh * 0.7,
            esc(&b.label)
        );
        let short = b.targets.iter().map(|t| t.1).fold(0.0, f64::max);
        if px(short) > end {
            let _ = writeln!(
                s,
                r##"<rect x="{end:.1}" y="{y:.1}" width="{:.1}" height="{bh}" fill="#e6e6e6"/>"##,
                px(short) - end
            );
        }
        let _ = writeln!(
            s,
            r#"<rect class="bar" data-value="{:.0}" x="{x0}" y="{y:.1}" width="{:.1}" height="{bh}" fill="{}"/><text x="{:.1}" y="{:.1}">{:.0}</text>"#,
            clean(b.value),
            end - x0,
            b.colour,
            end + 4.0,
            y + bh * 0.7,
            clean(b.value)
        );
        for (label, v) in &b.targets {
            let x = px(*v);
            let _ = writeln!(
                s,
                r##"<line class="target" x1="{x:.1}" y1="{:.1}" x2="{x:.1}" y2="{:.1}" stroke="#000" stroke-width="2"/><text x="{x:.1}" y="{:.1}" text-anchor="middle" font-size="10">{}</text>"##,
                y - 3.0,
                y + bh + 3.0,
                y + bh + 14.0,
                esc(label)
            );
        }
    }
    s.push_str("</svg>\n");
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn axis_ends_on_a_round_figure_at_or_above_the_largest_value() {
        for (v, want) in [
            (0.5, 1.0),
            (1.0, 1.0),
            (1.1, 2.0),
            (17_307.0, 20_000.0),
            (22_340.0, 25_000.0),
            (51_000.0, 100_000.0),
        ] {
            assert_eq!(nice_ceiling(v), want, "for {v}");
        }
    }

    fn bar(label: &str, value: f64, targets: &[(&str, f64)]) -> Bar {
        Bar {
            label: label.into(),
            value,
            colour: "#1f77b4",
            targets: targets.iter().map(|(l, v)| (l.to_string(), *v)).collect(),
        }
    }

    /// The x coordinate of the first `<line class="target"` after `from` in `svg`.
    fn target_x(svg: &str, from: usize) -> f64 {
        let at = svg[from..].find(r#"class="target" x1=""#).expect("a target line") + from;
        let rest = &svg[at + r#"class="target" x1=""#.len()..];
        rest[..rest.find('"').expect("closing quote")].parse().expect("a number")
    }

    #[test]
    fn bars_and_targets_share_one_axis_and_a_short_bar_shows_its_gap() {
        let svg = bars_svg(
            "t",
            "keys/s",
            &[
                bar("met", 800.0, &[("≥ 400", 400.0)]),
                bar("missed <&>", 200.0, &[("≥ 600", 600.0)]),
            ],
        );
        // The axis ends at 1,000: a bar of 800 is 80 % of the plot's width, its target 40 %.
        let (x0, x1) = (290.0, 750.0);
        assert!(svg.contains(&format!(
            r#"data-value="800" x="{x0}" y="44.0" width="{:.1}""#,
            0.8 * (x1 - x0)
        )));
        let first = target_x(&svg, 0);
        assert!((first - (x0 + 0.4 * (x1 - x0))).abs() < 0.1, "target at {first}");
        let second = target_x(&svg, svg.find("missed").expect("second bar"));
        assert!((second - (x0 + 0.6 * (x1 - x0))).abs() < 0.1, "target at {second}");
        // Only the missed bar has a grey gap, from its end (20 %) to its target (60 %).
        assert_eq!(svg.matches("#e6e6e6").count(), 1);
        assert!(svg.contains(&format!(
            r##"x="{:.1}" y="90.0" width="{:.1}" height="20" fill="#e6e6e6""##,
            x0 + 0.2 * (x1 - x0),
            0.4 * (x1 - x0)
        )));
        assert!(svg.contains("missed &lt;&amp;&gt;"), "labels are escaped");
    }

    #[test]
    fn a_failed_figure_is_drawn_as_zero_not_as_garbage() {
        let svg = bars_svg("t", "u", &[bar("nan", f64::NAN, &[]), bar("neg", -5.0, &[])]);
        assert_eq!(svg.matches(r#"data-value="0""#).count(), 2);
        assert!(!svg.contains("NaN") && !svg.contains("inf"));
    }
}
