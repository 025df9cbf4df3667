//! The files of one run: the timeline picture, the record and its Markdown, written under the
//! run's claimed stem (record/claim.rs); or, for a run without a record, its files moved to
//! `.unrecorded/`; and what an interrupted run says.

use std::path::{Path, PathBuf};

use super::Outcome;
use crate::record::claim::Claim;
use crate::record::write::{relative, write_new_atomic};
use crate::record::Record;
use crate::render;
use crate::util::interrupt;

/// The timeline picture (the record names it, so it is drawn first), the record, and its
/// Markdown beside it. A record name taken after all (by a run that did not claim it) never
/// costs the measurement: the record goes to the next free name; the files it names stay.
pub(super) fn write(
    mut rec: Record,
    claim: Claim,
    dir: &Path,
    stamp: &str,
) -> Result<Outcome, String> {
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
                let (next, _) = Claim::take(dir, stamp, &rec.project.tree, true)
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

/// An interrupted run's outcome says so, and ends 2: the record's own `interrupted`, or a
/// signal that came after the record was on disk.
pub(super) fn said_interrupted(mut out: Outcome, interrupted: Option<String>) -> Outcome {
    if let Some(how) = interrupted {
        out.warnings.push(format!(
            "interrupted {how}; the record {} keeps what was measured (exit status 2)",
            out.record.display()
        ));
    } else if let Some(sig) = interrupt::pending() {
        out.warnings.push(format!(
            "interrupted by {sig} after the record was written; exit status 2"
        ));
        out.exit_status = super::EXIT_ERROR;
    }
    out
}

/// The run ends without a record: its files go to `.unrecorded/` (record/claim.rs), and the
/// error says where.
pub(super) fn unrecorded(claim: Claim, why: String) -> String {
    match claim.discard() {
        Some(to) => format!(
            "{why}; no record was written (its logs are in {})",
            to.display()
        ),
        None => format!("{why}; no record was written"),
    }
}
