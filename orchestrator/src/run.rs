//! `orchestrator run`: one run, stage by stage (docs/LAYOUT.md). Preflight (unit/), both legs
//! under the lease (legs/), the gates (gates/), the figures (numbers/), the record and the files
//! beside it (record/, render/). Printing is the caller's: the outcome carries the summary.

use std::path::{Path, PathBuf};
use std::time::SystemTime;

use crate::gates::{self, GateInput, GateResult};
use crate::legs::lease::IdleCheck;
use crate::legs::pair::{self, LeaseOptions, Pair};
use crate::numbers::axes::axes;
use crate::numbers::explain::clock_explain;
use crate::numbers::timing::Timings;
use crate::record::claim::Claim;
use crate::record::write::{relative, write_new_atomic};
use crate::record::{Findings, LegTimings, ProjectInfo, Record};
use crate::render;
use crate::unit::preflight::{self, Checked};
use crate::util::interrupt;
use crate::util::term::sayln;
use crate::util::time::utc_stamp;

#[derive(Debug, Clone, Default)]
pub struct RunOptions {
    /// Default: <project root>/reports/records.
    pub records_dir: Option<PathBuf>,
    /// Default: [lease] lock_dir.
    pub lock_dir: Option<PathBuf>,
    pub no_wait: bool,
    pub python: Option<String>,
    pub quiet: bool,
}

pub const EXIT_PASS: i32 = 0;
pub const EXIT_REFUSED: i32 = 1;
pub const EXIT_ERROR: i32 = 2;

/// What a run that wrote a record ends with.
#[derive(Debug)]
pub struct Outcome {
    /// 0 every gate passed, 1 a record with refusals, 2 nothing measured.
    pub exit_status: i32,
    /// What `orchestrator run` prints on stdout (render/run.rs).
    pub summary: String,
    /// What went wrong without stopping the run (a timeline that could not be drawn).
    pub warnings: Vec<String>,
    pub record: PathBuf,
}

/// Preflight, then the run. Err: nothing was recorded, and why (exit 2).
pub fn run(unit_path: &Path, opts: &RunOptions) -> Result<Outcome, String> {
    let (report, checked) = preflight::preflight(unit_path, opts.python.as_deref(), !opts.quiet);
    if let Some(f) = report.failures.iter().find(|f| f.check == "interrupted") {
        return Err(format!("interrupted during preflight: {}", f.message));
    }
    let Some(checked) = checked else {
        let lines: Vec<String> = report.failures.iter().map(|f| format!("  {f}")).collect();
        return Err(format!(
            "preflight failed, nothing was run:\n{}",
            lines.join("\n")
        ));
    };
    let idle = gates::idle::GpuIdleCheck::nvml(checked.unit.config.lease.idle_max_used_mib);
    run_checked(&checked, opts, &idle)
}

/// The run after preflight; Err means nothing was recorded.
pub fn run_checked(
    checked: &Checked,
    opts: &RunOptions,
    idle: &dyn IdleCheck,
) -> Result<Outcome, String> {
    let cfg = &checked.unit.config;
    let project = ProjectInfo::read(&checked.project_root);
    let records_root = opts
        .records_dir
        .clone()
        .unwrap_or_else(|| checked.project_root.join("reports/records"));
    let dir = records_root.join(&cfg.name);
    std::fs::create_dir_all(&dir).map_err(|e| {
        format!(
            "cannot create the records directory {} ({e}); pass --records-dir a writable directory",
            dir.display()
        )
    })?;
    let lock_dir = opts.lock_dir.as_ref().unwrap_or(&cfg.lease.lock_dir);
    let lease = LeaseOptions {
        lock_dir,
        wait: !opts.no_wait,
    };
    // The stem is claimed under the lease, and the lease is held until the record is on disk.
    let held = pair::take_lease(checked, &lease, opts.quiet)?;
    let stamp = utc_stamp(SystemTime::now());
    let (claim, swept) = Claim::take(&dir, &stamp, &project.tree).map_err(|e| {
        format!(
            "cannot claim a record name in {} ({e}); pass --records-dir a writable directory",
            dir.display()
        )
    })?;
    if !opts.quiet {
        swept.iter().for_each(|s| sayln!("[record] {s}"));
    }
    let legs = match pair::run(checked, &claim.stem(), &held, opts.quiet, idle) {
        Ok(legs) => legs,
        Err(e) => return Err(unrecorded(claim, e)),
    };
    if let (Some(sig), false) = (legs.interrupted, legs.measured()) {
        let why = format!(
            "interrupted by {sig}: the running leg was stopped before anything was measured"
        );
        return Err(unrecorded(claim, why));
    }
    let mut rec = Record::assemble(checked, project, &legs, &dir, findings(checked, &legs));
    if let (None, Some(sig)) = (&rec.interrupted, interrupt::pending()) {
        rec.interrupted = Some(format!(
            "by {sig} after the legs, while the gates judged them"
        ));
    }
    let interrupted = rec.interrupted.clone();
    if interrupted.is_some() {
        rec.exit_status = EXIT_ERROR;
    }
    let mut out = write(rec, claim, &dir, &stamp)?;
    if let Some(how) = interrupted {
        out.warnings.push(format!(
            "interrupted {how}; the record {} keeps what was measured (exit status 2)",
            out.record.display()
        ));
    }
    drop(held);
    if let Some(sig) = interrupt::pending().filter(|_| out.exit_status != EXIT_ERROR) {
        out.warnings.push(format!(
            "interrupted by {sig} after the record was written; exit status 2"
        ));
        out.exit_status = EXIT_ERROR;
    }
    Ok(out)
}

/// The run ends without a record: its files go to `.unrecorded/` (record/claim.rs), and the
/// error says where.
fn unrecorded(claim: Claim, why: String) -> String {
    match claim.discard() {
        Some(to) => format!(
            "{why}; no record was written (its logs are in {})",
            to.display()
        ),
        None => format!("{why}; no record was written"),
    }
}

/// The gates' verdicts on the pair, the timings, the axes and the clock's explainable gap.
fn findings(checked: &Checked, legs: &Pair) -> Findings {
    let ids: Vec<String> = checked.prompts.iter().map(|p| p.id.clone()).collect();
    let verdicts = gates::judge_all(&GateInput {
        unit: &checked.unit,
        goldens: &checked.goldens,
        prompt_ids: &ids,
        engine: &legs.engine,
        oracle: &legs.oracle,
        kv_resize: legs.kv_resize.as_deref(),
    });
    let timings = LegTimings {
        engine: Timings::from_leg(&legs.engine),
        oracle: Timings::from_leg(&legs.oracle),
    };
    let axes = axes(
        &legs.engine,
        &legs.oracle,
        &timings.engine,
        &timings.oracle,
        &verdicts,
    );
    let measured = legs.engine.measured() || legs.oracle.measured();
    let exit_status = if !measured {
        EXIT_ERROR
    } else if verdicts.iter().any(GateResult::is_refused) {
        EXIT_REFUSED
    } else {
        EXIT_PASS
    };
    Findings {
        clock_explain: clock_explain(
            &legs.engine,
            &legs.oracle,
            &axes,
            &checked.unit.config.gates,
        ),
        gates: verdicts,
        timings,
        axes,
        exit_status,
    }
}

/// The timeline picture (the record names it, so it is drawn first), the record, and its
/// Markdown beside it. A record name taken after all (by a run that did not claim it) never
/// costs the measurement: the record goes to the next free name; the files it names stay.
fn write(mut rec: Record, claim: Claim, dir: &Path, stamp: &str) -> Result<Outcome, String> {
    let mut warnings = vec![];
    let svg_path = PathBuf::from(format!("{}.timeline.svg", claim.stem().display()));
    match render::timeline::write(
        &svg_path,
        dir,
        &[&rec.legs.engine, &rec.legs.oracle],
        &rec.refusals,
    ) {
        Ok(()) => rec.timeline = Some(relative(&svg_path, dir)),
        Err(e) => warnings.push(format!(
            "cannot draw the timeline {} ({e}); the record is written without it",
            svg_path.display()
        )),
    }
    let mut claim = claim;
    let json_path = loop {
        let json_path = PathBuf::from(format!("{}.json", claim.stem().display()));
        match rec.write(&json_path) {
            Ok(()) => break json_path,
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
                let (next, _) = Claim::take(dir, stamp, &rec.project.tree)
                    .map_err(|e| unrecorded_after(&json_path, e))?;
                warnings.push(format!(
                    "{e}; the record is written as {}.json instead",
                    next.stem().display()
                ));
                claim = next;
            }
            Err(e) => return Err(unrecorded(claim, unrecorded_after(&json_path, e))),
        }
    };
    let md_path = PathBuf::from(format!("{}.md", claim.stem().display()));
    let md = render::run::markdown(&rec, &json_path);
    if let Err(e) = write_new_atomic(&md_path, md.as_bytes()) {
        warnings.push(format!(
            "cannot write {} ({e}); the record {} is written",
            md_path.display(),
            json_path.display()
        ));
    }
    Ok(Outcome {
        exit_status: rec.exit_status,
        summary: render::run::terminal(&rec, dir, &json_path, &md_path),
        warnings,
        record: json_path,
    })
}

fn unrecorded_after(json_path: &Path, e: std::io::Error) -> String {
    format!("cannot write the record {} ({e})", json_path.display())
}
