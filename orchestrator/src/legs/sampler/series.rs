//! A leg's series as the samplers write it beside the record: one JSON object per line, each
//! tagged by `kind` (docs/RECORD.md).

use serde::{Deserialize, Serialize};
use std::io::Write;
use std::path::Path;

use super::gpu::GpuInfo;

/// A process's GPU memory in one poll.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ProcMem {
    pub pid: u32,
    pub bytes: u64,
}

/// One line of a series file.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Row {
    /// The first line: what was sampled, and on which boot.
    Meta {
        leg: String,
        gpu: Option<GpuInfo>,
        /// Why there is no GPU data, when there is none.
        no_gpu: Option<String>,
        boot_id: Option<String>,
        nvml_period_ms: u64,
        host_period_ms: u64,
    },
    /// The orchestrator entered `phase` at `t_us`.
    Phase { t_us: u64, phase: String },
    /// One NVML poll. `procs` (the leg's processes holding GPU memory) is polled less often
    /// than the clocks, so it is absent on most rows.
    Gpu {
        t_us: u64,
        phase: String,
        sm_mhz: Option<u32>,
        mem_mhz: Option<u32>,
        power_mw: Option<u32>,
        temp_c: Option<u32>,
        throttle: Option<u64>,
        persistence: Option<bool>,
        used_bytes: Option<u64>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        procs: Option<Vec<ProcMem>>,
    },
    /// One utilization sample: `source` "buffer" (the driver's sample buffer, stamped by the
    /// driver) or "poll" (the instantaneous reading, where the buffer is unsupported).
    Util {
        t_us: u64,
        phase: String,
        pct: u32,
        source: String,
    },
    /// Host RSS of the leg's process tree.
    Host {
        t_us: u64,
        phase: String,
        rss_bytes: u64,
    },
    /// A sampler thread's own cost, written when it stops.
    Cost {
        thread: String,
        cpu_s: f64,
        wall_s: f64,
        polls: u64,
    },
}

impl Row {
    pub fn t_us(&self) -> Option<u64> {
        match self {
            Row::Phase { t_us, .. }
            | Row::Gpu { t_us, .. }
            | Row::Util { t_us, .. }
            | Row::Host { t_us, .. } => Some(*t_us),
            _ => None,
        }
    }
}

pub fn write_series(path: &Path, rows: &[Row]) -> std::io::Result<()> {
    let mut f = std::io::BufWriter::new(
        std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(path)?,
    );
    for r in rows {
        serde_json::to_writer(&mut f, r)?;
        f.write_all(b"\n")?;
    }
    f.flush()
}

pub fn read_series(path: &Path) -> Result<Vec<Row>, String> {
    let text = std::fs::read_to_string(path).map_err(|e| {
        format!(
            "cannot read the series {} ({e}); pass a file written by `orchestrator clock sample` or a run's <stem>.<leg>.samples.jsonl",
            path.display()
        )
    })?;
    text.lines()
        .enumerate()
        .filter(|(_, l)| !l.trim().is_empty())
        .map(|(i, l)| {
            serde_json::from_str(l)
                .map_err(|e| format!("{} line {}: not a series row ({e})", path.display(), i + 1))
        })
        .collect()
}
