//! `orchestrator clock sample` and `clock compare`: the GPU clock state on its own, on saved
//! series (a run's `<stem>.<leg>.samples.jsonl.gz`, `.jsonl` in older records, or what
//! `clock sample` wrote), judged by the clock gate with its default thresholds.

use std::fmt::Write as _;
use std::path::Path;
use std::time::Duration;

use crate::gates::clock::{compare as judge, median_offset_pct, pass_text, ClockCfg, ClockSide};
use crate::legs::sampler::summary::summarize;
use crate::legs::sampler::{nvml, read_series, GpuSummary, LegSampler, Row, SamplerSpec};
use crate::numbers::explain::explain;

/// What a command says on stdout, and its exit status.
pub struct Said {
    pub out: String,
    pub exit: i32,
}

/// Samples GPU `gpu` (every process on it) for `seconds`, writes the series to `out` and says
/// its summary and the sampler's own cost. Exit 0; Err (exit 2) when there is no GPU to sample.
pub fn sample(seconds: f64, gpu: u32, out: &Path, nvml_period_ms: u64) -> Result<Said, String> {
    if !(seconds.is_finite() && seconds > 0.0 && seconds <= crate::unit::MAX_DEADLINE_S) {
        return Err(format!(
            "--seconds {seconds}: give a positive number of seconds, at most {} (a week)",
            crate::unit::MAX_DEADLINE_S
        ));
    }
    if !(1..=60_000).contains(&nvml_period_ms) {
        return Err(format!(
            "--period-ms {nvml_period_ms}: give 1 to 60000 (0 would poll in a busy loop)"
        ));
    }
    let spec = SamplerSpec {
        gpu: Some(gpu),
        nvml_period_ms,
        host_period_ms: 100,
        series: Some(out.to_path_buf()),
    };
    // Opened here rather than in the sampler, so that "no GPU" is said once, as this error.
    let g = nvml::open(gpu).map_err(|why| format!("{why}; nothing was sampled"))?;
    let s = LegSampler::start_with("sample", None, &spec, Ok(g));
    s.phase.set("sample");
    std::thread::sleep(Duration::from_secs_f64(seconds.max(0.0)));
    let done = s.finish();
    let mut text = String::new();
    let Some(p) = &done.report.series else {
        // The sampler has said why the series could not be written.
        return Ok(Said { out: text, exit: 2 });
    };
    let _ = writeln!(text, "series: {}", p.display());
    if let Some(sum) = &done.report.summary {
        let _ = writeln!(text, "{sum}");
    }
    let _ = writeln!(
        text,
        "sampler cost: {:.3} s CPU over {:.1} s ({:.2}% of one core)",
        done.report.cpu_s,
        done.report.wall_s,
        done.report.cpu_share * 100.0
    );
    Ok(Said { out: text, exit: 0 })
}

/// A saved series as a gate side: its leg label, boot id and summary (Err: no GPU data).
fn load_side(path: &Path) -> Result<(String, Option<String>, GpuSummary), String> {
    let rows = read_series(path)?;
    let (leg, boot, no_gpu) = match rows.first() {
        Some(Row::Meta {
            leg,
            boot_id,
            no_gpu,
            ..
        }) => (leg.clone(), boot_id.clone(), no_gpu.clone()),
        _ => {
            return Err(format!(
                "{} does not start with a meta line; it is not a series this tool wrote",
                path.display()
            ))
        }
    };
    if let Some(why) = no_gpu {
        return Err(format!(
            "{}: not applicable: no GPU ({why})",
            path.display()
        ));
    }
    Ok((leg, boot, summarize(&rows)))
}

/// Both summaries, the median offset and what it could explain, then `comparable: ...` (exit 0)
/// or `NOT comparable: n reason(s)` and one reason per line (exit 1). Err (exit 2): a file
/// cannot be read or holds no GPU data.
pub fn compare(a: &Path, b: &Path, cfg: &ClockCfg) -> Result<Said, String> {
    let load = |p: &Path| {
        load_side(p).map(|(leg, boot, sum)| {
            // Two series of one kind of leg ("sample") are told apart by file name.
            let name = p.file_name().map(|n| n.to_string_lossy().into_owned());
            (format!("{leg} ({})", name.unwrap_or_default()), boot, sum)
        })
    };
    let (sa, sb) = (load(a)?, load(b)?);
    fn side(s: &(String, Option<String>, GpuSummary)) -> ClockSide<'_> {
        ClockSide {
            leg: s.0.clone(),
            boot_id: s.1.as_deref(),
            summary: &s.2,
        }
    }
    let (x, y) = (side(&sa), side(&sb));
    let mut out = format!("{}: {}\n{}: {}\n", x.leg, x.summary, y.leg, y.summary);
    if let Some(off) = median_offset_pct(x.summary, y.summary) {
        let _ = writeln!(out, "median_offset_pct {off:.3}");
        let _ = writeln!(out, "{}", explain(off, cfg.basis, None).sentence);
    }
    let reasons = judge(&x, &y, cfg);
    for n in crate::gates::clock::notes(&x, &y, cfg) {
        let _ = writeln!(out, "note: {n}");
    }
    if reasons.is_empty() {
        let _ = writeln!(out, "comparable: {}", pass_text(&x, &y));
        return Ok(Said { out, exit: 0 });
    }
    let _ = writeln!(out, "NOT comparable: {} reason(s)", reasons.len());
    for r in &reasons {
        let _ = writeln!(out, "{r}");
    }
    Ok(Said { out, exit: 1 })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gates::clock::tests::{series, BOOT};

    #[test]
    fn compare_command_reads_two_series_files() {
        let dir = tempfile::tempdir().unwrap();
        let write = |name: &str, rows: Vec<Row>| {
            let p = dir.path().join(name);
            let mut all = vec![Row::Meta {
                leg: "sample".into(),
                gpu: None,
                no_gpu: None,
                boot_id: Some(BOOT.into()),
                nvml_period_ms: 20,
                host_period_ms: 100,
            }];
            all.extend(rows);
            crate::legs::sampler::write_series(&p, &all).unwrap();
            p
        };
        let a = write("a.jsonl", series(|_| 1980, 0, true, 200));
        // A run's series is compressed; clock compare reads either form.
        let b = write("b.jsonl.gz", series(|_| 1980, 0, true, 200));
        let c = write("c.jsonl", series(|_| 1980, 0x4, false, 10));
        let cfg = ClockCfg::default();
        let code = |r: Result<Said, String>| r.map_or(2, |s| s.exit);
        assert_eq!(code(compare(&a, &b, &cfg)), 0);
        assert_eq!(code(compare(&a, &c, &cfg)), 1);
        assert_eq!(code(compare(&a, &dir.path().join("none"), &cfg)), 2);
    }
}
