//! A small hand-written SVG line chart of ratio history: one line per speed axis, one point
//! per tree, filled where the point is gated and hollow where a gate refused it, on a log scale
//! (ratios span orders of magnitude, and 2x slower must look as far from parity as 2x faster).
//! Every coordinate is printed with fixed decimals, so the same points give the same bytes.

use crate::render::svg::esc;
/// One line of the chart.
pub struct Series {
    pub name: String,
    /// Per point (tree, in order): the ratio and whether it is gated; None where not measured.
    pub points: Vec<Option<(f64, bool)>>,
}

const PALETTE: [&str; 6] = [
    "#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b",
];
const W: f64 = 640.0;
const H: f64 = 300.0;
const LEFT: f64 = 70.0;
const RIGHT: f64 = 200.0;
const TOP: f64 = 30.0;
const BOTTOM: f64 = 40.0;

fn label(r: f64) -> String {
    format!("{}x", crate::util::fmt::fmt_num(r))
}

/// A gridline's label: "0.2x", "1x", "500x".
fn tick(r: f64) -> String {
    let s = format!("{r:.4}");
    format!("{}x", s.trim_end_matches('0').trim_end_matches('.'))
}

/// Where the plot lies and how a tree index and a ratio map to a point on it.
struct Frame {
    trees: usize,
    /// The log10 range drawn.
    lo: f64,
    hi: f64,
    pw: f64,
    ph: f64,
}

impl Frame {
    fn x(&self, i: usize) -> f64 {
        if self.trees == 1 {
            LEFT + self.pw / 2.0
        } else {
            LEFT + self.pw * i as f64 / (self.trees - 1) as f64
        }
    }
    fn y(&self, r: f64) -> f64 {
        TOP + self.ph * (self.hi - r.log10()) / (self.hi - self.lo)
    }
}

/// The chart, or None when no series has a positive ratio to draw.
pub fn ratio_history(title: &str, trees: &[String], series: &[Series]) -> Option<String> {
    let logs: Vec<f64> = series
        .iter()
        .flat_map(|s| s.points.iter().flatten())
        .filter(|(r, _)| *r > 0.0 && r.is_finite())
        .map(|(r, _)| r.log10())
        .collect();
    if logs.is_empty() || trees.is_empty() {
        return None;
    }
    let (mut lo, mut hi) = logs
        .iter()
        .fold((f64::MAX, f64::MIN), |(a, b), &x| (a.min(x), b.max(x)));
    // Parity (1x) is always on the chart: it is what a reader measures a ratio against.
    lo = lo.min(0.0);
    hi = hi.max(0.0);
    let pad = ((hi - lo) * 0.1).max(0.05);
    let f = Frame {
        trees: trees.len(),
        lo: lo - pad,
        hi: hi + pad,
        pw: W - LEFT - RIGHT,
        ph: H - TOP - BOTTOM,
    };
    let mut s = format!(
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{W:.0}\" height=\"{H:.0}\" viewBox=\"0 0 {W:.0} {H:.0}\" font-family=\"sans-serif\" font-size=\"11\">\n"
    );
    s.push_str(&format!(
        "<rect x=\"0\" y=\"0\" width=\"{W:.0}\" height=\"{H:.0}\" fill=\"white\"/>\n<text x=\"{LEFT:.1}\" y=\"18.0\" font-size=\"13\">{}</text>\n",
        esc(title)
    ));
    s.push_str(&format!(
        "<rect x=\"{LEFT:.1}\" y=\"{TOP:.1}\" width=\"{:.1}\" height=\"{:.1}\" fill=\"none\" stroke=\"#999\"/>\n",
        f.pw, f.ph
    ));
    grid(&mut s, &f, trees);
    for (n, se) in series.iter().enumerate() {
        line(&mut s, &f, n, se);
    }
    let ly = TOP + 8.0 + 16.0 * series.len() as f64;
    s.push_str(&format!(
        "<circle cx=\"{:.1}\" cy=\"{ly:.1}\" r=\"3.5\" fill=\"white\" stroke=\"#333\" stroke-width=\"1.5\"/>\n<text x=\"{:.1}\" y=\"{:.1}\">hollow: refused</text>\n</svg>\n",
        W - RIGHT + 21.0,
        W - RIGHT + 36.0,
        ly + 4.0
    ));
    Some(s)
}

/// Gridlines at 1, 2 and 5 times each power of ten in range, labelled, parity dashed; the trees
/// along the bottom.
fn grid(s: &mut String, f: &Frame, trees: &[String]) {
    let mut k = f.lo.floor() as i32;
    while f64::from(k) <= f.hi {
        for m in [1.0, 2.0, 5.0] {
            let r = m * 10f64.powi(k);
            if r.log10() < f.lo || r.log10() > f.hi {
                continue;
            }
            let yy = f.y(r);
            let dash = if r == 1.0 {
                " stroke-dasharray=\"4 3\""
            } else {
                ""
            };
            s.push_str(&format!(
                "<line x1=\"{LEFT:.1}\" y1=\"{yy:.1}\" x2=\"{:.1}\" y2=\"{yy:.1}\" stroke=\"#ccc\"{dash}/>\n<text x=\"{:.1}\" y=\"{:.1}\" text-anchor=\"end\">{}</text>\n",
                LEFT + f.pw,
                LEFT - 6.0,
                yy + 4.0,
                tick(r)
            ));
        }
        k += 1;
    }
    for (i, t) in trees.iter().enumerate() {
        s.push_str(&format!(
            "<text x=\"{:.1}\" y=\"{:.1}\" text-anchor=\"middle\">{}</text>\n",
            f.x(i),
            TOP + f.ph + 16.0,
            esc(t)
        ));
    }
    s.push_str(&format!(
        "<text x=\"{:.1}\" y=\"{:.1}\" text-anchor=\"middle\">tree, oldest first; ratio ours/oracle, log scale</text>\n",
        LEFT + f.pw / 2.0,
        H - 6.0
    ));
}

/// Series `n`: its line, its points (hollow where refused) and its legend entry.
fn line(s: &mut String, f: &Frame, n: usize, se: &Series) {
    let c = PALETTE[n % PALETTE.len()];
    let pts: Vec<(usize, f64, bool)> = se
        .points
        .iter()
        .enumerate()
        .filter_map(|(i, p)| {
            p.filter(|(r, _)| *r > 0.0 && r.is_finite())
                .map(|(r, g)| (i, r, g))
        })
        .collect();
    if pts.len() > 1 {
        let d: Vec<String> = pts
            .iter()
            .map(|(i, r, _)| format!("{:.1},{:.1}", f.x(*i), f.y(*r)))
            .collect();
        s.push_str(&format!(
            "<polyline points=\"{}\" fill=\"none\" stroke=\"{c}\" stroke-width=\"1.5\"/>\n",
            d.join(" ")
        ));
    }
    for (i, r, gated) in &pts {
        let fill = if *gated { c } else { "white" };
        s.push_str(&format!(
            "<circle cx=\"{:.1}\" cy=\"{:.1}\" r=\"3.5\" fill=\"{fill}\" stroke=\"{c}\" stroke-width=\"1.5\"><title>{}: {}{}</title></circle>\n",
            f.x(*i),
            f.y(*r),
            esc(&se.name),
            label(*r),
            if *gated { "" } else { " (refused)" }
        ));
    }
    let ly = TOP + 8.0 + 16.0 * n as f64;
    s.push_str(&format!(
        "<line x1=\"{:.1}\" y1=\"{ly:.1}\" x2=\"{:.1}\" y2=\"{ly:.1}\" stroke=\"{c}\" stroke-width=\"1.5\"/>\n<text x=\"{:.1}\" y=\"{:.1}\">{}</text>\n",
        W - RIGHT + 12.0,
        W - RIGHT + 30.0,
        W - RIGHT + 36.0,
        ly + 4.0,
        esc(&se.name)
    ));
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parity_is_drawn_and_refused_points_are_hollow() {
        let trees: Vec<String> = ["a", "b", "c"].iter().map(|s| s.to_string()).collect();
        let s = ratio_history(
            "u",
            &trees,
            &[Series {
                name: "per token".into(),
                points: vec![Some((2.0, true)), None, Some((4.0, false))],
            }],
        )
        .unwrap();
        assert!(s.contains("stroke-dasharray"), "1x is in range and dashed");
        assert!(s.contains("fill=\"white\" stroke=\"#1f77b4\""), "{s}");
        assert!(s.contains("4.000x (refused)"), "{s}");
        assert_eq!(
            s.matches("<circle").count(),
            3,
            "two points and the legend's"
        );
        assert!(ratio_history("u", &trees, &[]).is_none());
    }
}
