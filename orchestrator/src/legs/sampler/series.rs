//! A leg's series as the samplers write it beside the record: one JSON object per line, each
//! tagged by `kind` (docs/RECORD.md), gzip-compressed (the series of one GPU run is megabytes
//! of JSON, and records are committed). Both the compressed and the older plain form read.

use flate2::read::GzDecoder;
use flate2::write::GzEncoder;
use flate2::Compression;
use serde::{Deserialize, Serialize};
use std::io::{Read, Write};
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

impl Row {
    /// A GPU poll of `sm_mhz` with nothing else reported (tests fill in what they need).
    #[cfg(test)]
    pub fn poll(t_us: u64, phase: &str, sm_mhz: Option<u32>) -> Row {
        Row::Gpu {
            t_us,
            phase: phase.into(),
            sm_mhz,
            mem_mhz: None,
            power_mw: None,
            temp_c: None,
            throttle: None,
            persistence: None,
            used_bytes: None,
            procs: None,
        }
    }
}

/// Writes the series, never over an existing file: gzip-compressed when the file name ends in
/// `.gz` (a run's series: `<stem>.<leg>.samples.jsonl.gz`), else plain JSON lines.
pub fn write_series(path: &Path, rows: &[Row]) -> std::io::Result<()> {
    let file = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(path)?;
    let f = std::io::BufWriter::new(file);
    if path.extension().is_some_and(|x| x == "gz") {
        let mut z = GzEncoder::new(f, Compression::default());
        write_rows(&mut z, rows)?;
        z.finish()?.flush()
    } else {
        let mut f = f;
        write_rows(&mut f, rows)?;
        f.flush()
    }
}

fn write_rows(w: &mut impl Write, rows: &[Row]) -> std::io::Result<()> {
    for r in rows {
        serde_json::to_writer(&mut *w, r)?;
        w.write_all(b"\n")?;
    }
    Ok(())
}

/// Reads a series in either form: gzip-compressed (told by its first bytes, whatever its name)
/// or plain JSON lines (records written before the series were compressed, `clock sample`).
pub fn read_series(path: &Path) -> Result<Vec<Row>, String> {
    let cannot = |e: std::io::Error| {
        format!(
            "cannot read the series {} ({e}); pass a file written by `orchestrator clock sample` or a run's <stem>.<leg>.samples.jsonl.gz (.jsonl before they were compressed)",
            path.display()
        )
    };
    let bytes = std::fs::read(path).map_err(cannot)?;
    let mut text = String::new();
    if bytes.starts_with(&[0x1f, 0x8b]) {
        GzDecoder::new(bytes.as_slice()).read_to_string(&mut text)
    } else {
        bytes.as_slice().read_to_string(&mut text)
    }
    .map_err(cannot)?;
    text.lines()
        .enumerate()
        .filter(|(_, l)| !l.trim().is_empty())
        .map(|(i, l)| {
            serde_json::from_str(l)
                .map_err(|e| format!("{} line {}: not a series row ({e})", path.display(), i + 1))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_compressed_and_a_plain_series_read_back_the_same_rows() {
        let dir = tempfile::tempdir().unwrap();
        let rows: Vec<Row> = (0..500u64)
            .map(|i| Row::Host {
                t_us: 1_000_000 + i * 100_000,
                phase: "battery".into(),
                rss_bytes: 300 << 20,
            })
            .collect();
        let (gz, plain) = (dir.path().join("s.jsonl.gz"), dir.path().join("s.jsonl"));
        write_series(&gz, &rows).unwrap();
        write_series(&plain, &rows).unwrap();
        let (zb, pb) = (std::fs::read(&gz).unwrap(), std::fs::read(&plain).unwrap());
        assert!(zb.starts_with(&[0x1f, 0x8b]), "gzip magic");
        assert!(pb.starts_with(b"{\"kind\":\"host\""));
        assert!(
            zb.len() * 10 < pb.len(),
            "{} vs {} bytes",
            zb.len(),
            pb.len()
        );
        assert_eq!(read_series(&gz).unwrap(), rows);
        assert_eq!(read_series(&plain).unwrap(), rows);
        // Never over an existing series.
        assert!(write_series(&gz, &rows).is_err());
    }
}
