//! `orchestrator report`: reads every record under the records directory and writes
//! BENCHMARKS.md and its charts (render/report.rs draws them). The output depends only on the
//! records, so the same records give the same bytes; a chart an earlier report drew that these
//! records no longer do (a unit whose records now come from two host classes draws one chart per
//! class instead of `<unit>.svg`) is removed, so the charts directory holds what BENCHMARKS.md
//! shows.

use std::path::{Path, PathBuf};

use crate::record::archive::{self, Rejected};
use crate::render::report::{render, CHARTS_DIR};

/// What `report` did, for the CLI to print.
pub struct Outcome {
    pub written: Vec<PathBuf>,
    /// Charts (`.svg`) in the charts directory that this report did not draw.
    pub removed: Vec<PathBuf>,
    pub rejected: Vec<Rejected>,
}

/// Reads `records_dir`, writes `out` and its charts beside it (`charts/<unit>.svg`).
pub fn report(records_dir: &Path, out: &Path) -> Result<Outcome, String> {
    let (records, rejected) = archive::load_dir(records_dir)?;
    let r = render(&records, &rejected);
    let dir = out.parent().unwrap_or(Path::new("."));
    let write = |p: &Path, bytes: &str| {
        std::fs::write(p, bytes).map_err(|e| format!("cannot write {} ({e})", p.display()))
    };
    std::fs::create_dir_all(dir).map_err(|e| format!("cannot create {} ({e})", dir.display()))?;
    let mut written = vec![];
    let cd = dir.join(CHARTS_DIR);
    if !r.charts.is_empty() {
        std::fs::create_dir_all(&cd)
            .map_err(|e| format!("cannot create {} ({e})", cd.display()))?;
        for (name, svg) in &r.charts {
            let p = cd.join(name);
            write(&p, svg)?;
            written.push(p);
        }
    }
    let removed = remove_stale_charts(&cd, &written)?;
    write(out, &r.markdown)?;
    written.insert(0, out.to_path_buf());
    Ok(Outcome {
        written,
        removed,
        rejected,
    })
}

/// Removes the `.svg` files in `charts` other than `drawn`; other files are left alone.
fn remove_stale_charts(charts: &Path, drawn: &[PathBuf]) -> Result<Vec<PathBuf>, String> {
    let entries = match std::fs::read_dir(charts) {
        Ok(e) => e,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(vec![]),
        Err(e) => return Err(format!("cannot read {} ({e})", charts.display())),
    };
    let mut stale: Vec<PathBuf> = entries
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "svg") && !drawn.contains(p))
        .collect();
    stale.sort();
    for p in &stale {
        std::fs::remove_file(p).map_err(|e| format!("cannot remove {} ({e})", p.display()))?;
    }
    Ok(stale)
}
