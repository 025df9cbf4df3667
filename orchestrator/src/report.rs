//! `orchestrator report`: reads every record under the records directory and writes
//! BENCHMARKS.md and its charts (render/report.rs draws them). The output depends only on the
//! records, so the same records give the same bytes.

use std::path::{Path, PathBuf};

use crate::record::archive::{self, Rejected};
use crate::render::report::{render, CHARTS_DIR};

/// What `report` did, for the CLI to print.
pub struct Outcome {
    pub written: Vec<PathBuf>,
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
    if !r.charts.is_empty() {
        let cd = dir.join(CHARTS_DIR);
        std::fs::create_dir_all(&cd)
            .map_err(|e| format!("cannot create {} ({e})", cd.display()))?;
        for (name, svg) in &r.charts {
            let p = cd.join(name);
            write(&p, svg)?;
            written.push(p);
        }
    }
    write(out, &r.markdown)?;
    written.insert(0, out.to_path_buf());
    Ok(Outcome { written, rejected })
}
