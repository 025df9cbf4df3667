//! The timeline picture beside each record (`<stem>.timeline.svg`): per leg, the SM clock and
//! the GPU utilization over time, the phases shaded, and the run's refusals written under it.
//! Hand-written SVG: a few rectangles and polylines do not justify a plotting dependency.

use crate::render::svg::esc;
use std::fmt::Write as _;
use std::path::Path;

use crate::legs::sampler::{self, Row};
use crate::legs::LegRecord;

const W: f64 = 1000.0;
const PANEL_H: f64 = 220.0;
const LEFT: f64 = 60.0;
const RIGHT: f64 = 50.0;
const TOP: f64 = 30.0;
const PLOT_H: f64 = 160.0;
/// Enough points for a 1000-pixel-wide line; longer series are thinned by a stride.
const MAX_POINTS: usize = 2000;

fn phase_colour(p: &str) -> &'static str {
    match p {
        "load" => "#e6eef8",
        "warmup" => "#fdf3d8",
        "battery" => "#e2f3e2",
        "shutdown" => "#f6e3e3",
        _ => "#eeeeee",
    }
}

fn thin<T: Copy>(v: &[T]) -> Vec<T> {
    let stride = v.len().div_ceil(MAX_POINTS).max(1);
    v.iter().step_by(stride).copied().collect()
}

/// Draws one leg's panel at vertical offset `y0`.
fn panel(svg: &mut String, y0: f64, title: &str, rows: &[Row], no_gpu: Option<&str>) {
    let t0 = rows.iter().filter_map(Row::t_us).min().unwrap_or(0);
    let t1 = rows.iter().filter_map(Row::t_us).max().unwrap_or(t0);
    let span = ((t1 - t0) as f64 / 1e6).max(1e-3);
    let pw = W - LEFT - RIGHT;
    let x = |t: u64| LEFT + (t.saturating_sub(t0) as f64 / 1e6) / span * pw;
    let top = y0 + TOP;
    let _ = writeln!(
        svg,
        r##"<text x="{LEFT}" y="{}" font-size="13" font-weight="bold">{}</text>"##,
        y0 + 18.0,
        esc(title)
    );
    // Phases, shaded from each mark to the next (the last to the end of the series).
    let marks = sampler::summary::phase_marks(rows);
    for (i, (t, p)) in marks.iter().enumerate() {
        let end = marks.get(i + 1).map_or(t1, |m| m.0);
        let (xa, xb) = (x(*t), x(end));
        let _ = writeln!(
            svg,
            r##"<rect x="{xa:.1}" y="{top}" width="{:.1}" height="{PLOT_H}" fill="{}"/><text x="{:.1}" y="{}" font-size="10" fill="#555">{}</text>"##,
            (xb - xa).max(0.5),
            phase_colour(p),
            xa + 2.0,
            top + 11.0,
            esc(p)
        );
    }
    let _ = writeln!(
        svg,
        r##"<rect x="{LEFT}" y="{top}" width="{pw}" height="{PLOT_H}" fill="none" stroke="#999"/>"##
    );
    let sm: Vec<(u64, f64)> = rows
        .iter()
        .filter_map(|r| match r {
            Row::Gpu {
                t_us,
                sm_mhz: Some(m),
                ..
            } => Some((*t_us, f64::from(*m))),
            _ => None,
        })
        .collect();
    let util: Vec<(u64, f64)> = rows
        .iter()
        .filter_map(|r| match r {
            Row::Util { t_us, pct, .. } => Some((*t_us, f64::from(*pct))),
            _ => None,
        })
        .collect();
    if sm.is_empty() && util.is_empty() {
        let _ = writeln!(
            svg,
            r##"<text x="{}" y="{}" font-size="12" fill="#a00">no GPU data: {}</text>"##,
            LEFT + 10.0,
            top + PLOT_H / 2.0,
            esc(no_gpu.unwrap_or("nothing was sampled"))
        );
    }
    let sm_max = sm.iter().map(|p| p.1).fold(0.0, f64::max).max(1.0) * 1.1;
    let y_sm = |m: f64| top + PLOT_H - m / sm_max * PLOT_H;
    let y_util = |u: f64| top + PLOT_H - u / 100.0 * PLOT_H;
    for (pts, colour, y) in [
        (&sm, "#1f5fbf", &y_sm as &dyn Fn(f64) -> f64),
        (&util, "#e07b00", &y_util as &dyn Fn(f64) -> f64),
    ] {
        if pts.is_empty() {
            continue;
        }
        let line: Vec<String> = thin(pts)
            .iter()
            .map(|&(t, v)| format!("{:.1},{:.1}", x(t), y(v)))
            .collect();
        let _ = writeln!(
            svg,
            r##"<polyline fill="none" stroke="{colour}" stroke-width="1.2" points="{}"/>"##,
            line.join(" ")
        );
    }
    axis_labels(svg, top, sm_max, span);
}

/// Axes: MHz on the left, percent on the right, seconds below.
fn axis_labels(svg: &mut String, top: f64, sm_max: f64, span: f64) {
    let _ = writeln!(
        svg,
        r##"<text x="{}" y="{}" font-size="10" text-anchor="end" fill="#1f5fbf">{:.0} MHz</text><text x="{}" y="{}" font-size="10" text-anchor="end" fill="#1f5fbf">0</text>"##,
        LEFT - 4.0,
        top + 10.0,
        sm_max,
        LEFT - 4.0,
        top + PLOT_H
    );
    let _ = writeln!(
        svg,
        r##"<text x="{}" y="{}" font-size="10" fill="#e07b00">100%</text><text x="{}" y="{}" font-size="10" fill="#e07b00">0%</text>"##,
        W - RIGHT + 4.0,
        top + 10.0,
        W - RIGHT + 4.0,
        top + PLOT_H
    );
    let _ = writeln!(
        svg,
        r##"<text x="{LEFT}" y="{}" font-size="10">0 s</text><text x="{}" y="{}" font-size="10" text-anchor="end">{span:.1} s</text>"##,
        top + PLOT_H + 14.0,
        W - RIGHT,
        top + PLOT_H + 14.0
    );
}

/// Wraps `s` at spaces into lines of at most `n` characters.
fn wrap(s: &str, n: usize) -> Vec<String> {
    let mut out = vec![];
    let mut line = String::new();
    for w in s.split_whitespace() {
        if !line.is_empty() && line.len() + 1 + w.len() > n {
            out.push(std::mem::take(&mut line));
        }
        if !line.is_empty() {
            line.push(' ');
        }
        line.push_str(w);
    }
    if !line.is_empty() {
        out.push(line);
    }
    out
}

/// The picture for the legs (each from its series file), with the refusals under it.
pub fn render(legs: &[(&str, Vec<Row>, Option<String>)], refusals: &[String]) -> String {
    let notes: Vec<String> = refusals.iter().flat_map(|r| wrap(r, 150)).collect();
    let h = legs.len() as f64 * PANEL_H + 40.0 + notes.len() as f64 * 14.0;
    let mut svg = format!(
        r##"<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{h}" viewBox="0 0 {W} {h}" font-family="sans-serif">
<rect width="{W}" height="{h}" fill="white"/>
"##
    );
    for (i, (leg, rows, no_gpu)) in legs.iter().enumerate() {
        panel(
            &mut svg,
            i as f64 * PANEL_H,
            &format!("{leg} leg: SM clock (MHz, blue), GPU utilization (%, orange); phases shaded"),
            rows,
            no_gpu.as_deref(),
        );
    }
    let mut y = legs.len() as f64 * PANEL_H + 20.0;
    let head = if refusals.is_empty() {
        "No refusals.".to_string()
    } else {
        format!("Refusals ({}):", refusals.len())
    };
    let _ = writeln!(
        svg,
        r##"<text x="10" y="{y}" font-size="12" font-weight="bold">{}</text>"##,
        esc(&head)
    );
    for n in &notes {
        y += 14.0;
        let _ = writeln!(
            svg,
            r##"<text x="10" y="{y}" font-size="10" fill="#a00">{}</text>"##,
            esc(n)
        );
    }
    svg.push_str("</svg>\n");
    svg
}

/// Reads each leg's series (a leg without one gets an empty panel saying why; a series named
/// relative is read under `dir`) and writes the picture to `path`, never over an existing file.
pub fn write(
    path: &Path,
    dir: &Path,
    legs: &[&LegRecord],
    refusals: &[String],
) -> std::io::Result<()> {
    let data: Vec<(&str, Vec<Row>, Option<String>)> = legs
        .iter()
        .map(|l| {
            let rows = l
                .sampler
                .series
                .as_deref()
                .and_then(|p| sampler::read_series(&dir.join(p)).ok())
                .unwrap_or_default();
            (l.leg.as_str(), rows, l.sampler.no_gpu.clone())
        })
        .collect();
    crate::record::write_new_atomic(path, render(&data, refusals).as_bytes())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_picture_has_both_legs_phases_lines_and_refusals() {
        let mut rows = vec![Row::Phase {
            t_us: 0,
            phase: "load".into(),
        }];
        rows.push(Row::Phase {
            t_us: 500_000,
            phase: "battery".into(),
        });
        for i in 0..50u64 {
            rows.push(Row::poll(i * 20_000, "battery", Some(1980)));
            rows.push(Row::Util {
                t_us: i * 20_000,
                phase: "battery".into(),
                pct: 50,
                source: "buffer".into(),
            });
        }
        let svg = render(
            &[
                ("engine", rows, None),
                ("oracle", vec![], Some("NVML is not available <x>".into())),
            ],
            &["The GPU was busy in only 6.31% of the engine leg's battery window".into()],
        );
        assert!(svg.starts_with("<svg") && svg.ends_with("</svg>\n"));
        assert_eq!(svg.matches("<polyline").count(), 2, "{svg}");
        assert!(svg.contains(phase_colour("battery")) && svg.contains(phase_colour("load")));
        assert!(svg.contains("no GPU data: NVML is not available &lt;x&gt;"));
        assert!(svg.contains("Refusals (1):") && svg.contains("6.31%"));
    }
}
