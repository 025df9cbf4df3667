//! Samplers that run beside each leg, each on a thread of its own so that watching a leg never
//! sits on its critical path: the GPU through NVML (clocks, power, temperature, throttle
//! reasons, persistence, per-process memory, and utilization from the driver's own sample
//! buffer) and host memory of the leg's process tree through sysinfo. The orchestrator marks the
//! leg's phases on a shared [`PhaseMarker`]; every row carries the phase it fell in. The series
//! is kept beside the record as gzip-compressed JSON lines (`<stem>.<leg>.samples.jsonl.gz`,
//! docs/RECORD.md; series.rs), the summary goes into the leg record, and the threads' own CPU
//! time is measured and reported.
//!
//! No NVML (no GPU, no driver) is said once, and the GPU gates then say "not applicable: no GPU".

pub mod gpu;
pub mod host;
pub mod nvml;
pub mod series;
pub mod summary;
mod threads;

use crate::util::term::sayln;
use serde::{Deserialize, Serialize};
use std::collections::BTreeSet;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

pub use gpu::{FakeGpu, Gpu, GpuInfo, GpuProc, GpuState};
pub use host::{thread_cpu_s, HostMemSummary};
pub use series::{read_series, write_series, ProcMem, Row};
pub use summary::GpuSummary;
use threads::{gpu_loop, host_loop, GpuOut, HostOut};
pub use threads::{now_us, LegPids, PhaseMarker};

/// How to sample a leg ([sampler] in the unit, docs/UNIT.md).
#[derive(Debug, Clone)]
pub struct SamplerSpec {
    /// The leased GPU; None: host memory only (a CPU lease).
    pub gpu: Option<u32>,
    pub nvml_period_ms: u64,
    pub host_period_ms: u64,
    /// Where the series goes; None: kept in memory only.
    pub series: Option<PathBuf>,
}

impl Default for SamplerSpec {
    fn default() -> Self {
        SamplerSpec {
            gpu: None,
            nvml_period_ms: 20,
            host_period_ms: 100,
            series: None,
        }
    }
}

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct ThreadCost {
    pub thread: String,
    pub cpu_s: f64,
    pub wall_s: f64,
    pub polls: u64,
}

/// What the samplers saw during one leg, as the record keeps it.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct SamplerReport {
    /// The series file, when one was written.
    pub series: Option<PathBuf>,
    pub gpu: Option<GpuInfo>,
    /// Why there is no GPU data ("no GPU leased", "NVML is not available (...)").
    pub no_gpu: Option<String>,
    pub boot_id: Option<String>,
    pub nvml_period_ms: u64,
    pub host_period_ms: u64,
    pub summary: Option<GpuSummary>,
    /// The samplers' own CPU time, per thread and in all; `cpu_share` is cpu_s over the leg's
    /// wall time (0.01 = one percent of one core).
    pub cost: Vec<ThreadCost>,
    pub cpu_s: f64,
    pub wall_s: f64,
    pub cpu_share: f64,
    /// Every pid of the leg seen holding GPU memory: the GPU straggler check looks for these.
    pub gpu_pids_seen: Vec<u32>,
}

/// The samplers of one leg, running until [`LegSampler::finish`].
pub struct LegSampler {
    leg: String,
    spec: SamplerSpec,
    stop: Arc<AtomicBool>,
    gpu_thread: Option<JoinHandle<GpuOut>>,
    host_thread: Option<JoinHandle<HostOut>>,
    pub phase: PhaseMarker,
    pub pids: LegPids,
    info: Option<GpuInfo>,
    no_gpu: Option<String>,
    boot_id: Option<String>,
    started: Instant,
}

/// What finishing a sampler gives back: the report, the host summary and the rows themselves.
pub struct Sampled {
    pub report: SamplerReport,
    pub host_mem: HostMemSummary,
    pub rows: Vec<Row>,
}

impl LegSampler {
    /// Starts sampling the leg whose process (and group) is `root`, on the GPU the spec names.
    pub fn start(leg: &str, root: Option<u32>, spec: &SamplerSpec) -> LegSampler {
        let gpu = match spec.gpu {
            Some(i) => nvml::open(i),
            None => Err("no GPU leased (the run holds the cpu lease)".into()),
        };
        LegSampler::start_with(leg, root, spec, gpu)
    }

    /// As [`LegSampler::start`], on a GPU the caller opened (tests pass a [`FakeGpu`]).
    pub fn start_with(
        leg: &str,
        root: Option<u32>,
        spec: &SamplerSpec,
        gpu: Result<Box<dyn Gpu>, String>,
    ) -> LegSampler {
        let stop = Arc::new(AtomicBool::new(false));
        let phase = PhaseMarker::default();
        let pids = LegPids {
            root,
            announced: Arc::default(),
        };
        let (info, no_gpu) = match &gpu {
            Ok(g) => (Some(g.info()), None),
            Err(e) => (None, Some(e.clone())),
        };
        // Said once per process, not once per leg: the record says it per leg anyway.
        static SAID: AtomicBool = AtomicBool::new(false);
        if let Some(why) = &no_gpu {
            if !SAID.swap(true, Ordering::Relaxed) {
                sayln!("[sampler] no GPU data: {why}; GPU gates will say not applicable");
            }
        }
        let gpu_thread = gpu.ok().map(|g| {
            let (stop, phase, pids) = (stop.clone(), phase.clone(), pids.clone());
            let period = Duration::from_millis(spec.nvml_period_ms.max(1));
            std::thread::Builder::new()
                .name(format!("nvml-{leg}"))
                .spawn(move || gpu_loop(g, period, &stop, &phase, &pids))
                .expect("spawning the NVML sampler thread")
        });
        let host_thread = root.map(|root| {
            let (stop, phase) = (stop.clone(), phase.clone());
            let period = Duration::from_millis(spec.host_period_ms.max(1));
            std::thread::Builder::new()
                .name(format!("hostmem-{leg}"))
                .spawn(move || host_loop(root, period, &stop, &phase))
                .expect("spawning the host memory sampler thread")
        });
        LegSampler {
            leg: leg.to_string(),
            spec: spec.clone(),
            stop,
            gpu_thread,
            host_thread,
            phase,
            pids,
            info,
            no_gpu,
            boot_id: crate::util::procfs::boot_id(),
            started: Instant::now(),
        }
    }

    /// The pids the leg announced in `ready.pids`, so their GPU memory counts as the leg's.
    pub fn announce(&self, pids: &[u32]) {
        if let Ok(mut v) = self.pids.announced.lock() {
            v.extend_from_slice(pids);
        }
    }

    /// Why there is no GPU data, if there is none.
    pub fn no_gpu(&self) -> Option<&str> {
        self.no_gpu.as_deref()
    }

    /// Stops the threads, writes the series (when the spec names a file) and summarizes.
    pub fn finish(mut self) -> Sampled {
        self.stop.store(true, Ordering::Relaxed);
        let wall_s = self.started.elapsed().as_secs_f64();
        let g = self.gpu_thread.take().and_then(|h| h.join().ok());
        let h = self.host_thread.take().and_then(|h| h.join().ok());
        let mut rows = vec![Row::Meta {
            leg: self.leg.clone(),
            gpu: self.info.clone(),
            no_gpu: self.no_gpu.clone(),
            boot_id: self.boot_id.clone(),
            nvml_period_ms: self.spec.nvml_period_ms,
            host_period_ms: self.spec.host_period_ms,
        }];
        let mut body: Vec<Row> = self
            .phase
            .marks()
            .into_iter()
            .map(|(t_us, phase)| Row::Phase { t_us, phase })
            .collect();
        let mut cost = vec![];
        let mut seen = BTreeSet::new();
        let mut host_mem = HostMemSummary {
            period_ms: self.spec.host_period_ms,
            ..Default::default()
        };
        if let Some(g) = g {
            body.extend(g.rows);
            cost.push(g.cost);
            seen = g.seen;
        }
        if let Some(h) = h {
            body.extend(h.rows);
            cost.push(h.cost);
            host_mem.peak_rss_bytes = h.peak;
            host_mem.samples = h.samples;
        }
        // Stable: rows of one thread keep their order where two share a timestamp.
        body.sort_by_key(|r| r.t_us().unwrap_or(0));
        rows.extend(body);
        rows.extend(cost.iter().map(|c| Row::Cost {
            thread: c.thread.clone(),
            cpu_s: c.cpu_s,
            wall_s: c.wall_s,
            polls: c.polls,
        }));
        let mut series = None;
        if let Some(path) = &self.spec.series {
            match write_series(path, &rows) {
                Ok(()) => series = Some(path.clone()),
                Err(e) => sayln!(
                    "[{}] sampler: cannot write the series {} ({e}); the summary is still recorded",
                    self.leg,
                    path.display()
                ),
            }
        }
        let cpu_s: f64 = cost.iter().map(|c| c.cpu_s).sum();
        let report = SamplerReport {
            series,
            gpu: self.info.clone(),
            no_gpu: self.no_gpu.clone(),
            boot_id: self.boot_id.clone(),
            nvml_period_ms: self.spec.nvml_period_ms,
            host_period_ms: self.spec.host_period_ms,
            summary: self.info.as_ref().map(|_| summary::summarize(&rows)),
            cost,
            cpu_s,
            wall_s,
            cpu_share: if wall_s > 0.0 { cpu_s / wall_s } else { 0.0 },
            gpu_pids_seen: seen.into_iter().collect(),
        };
        Sampled {
            report,
            host_mem,
            rows,
        }
    }
}

impl Drop for LegSampler {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fake(util: Vec<(u64, u32)>) -> Box<dyn Gpu> {
        Box::new(FakeGpu {
            info: GpuInfo {
                index: 0,
                name: Some("Fake H200".into()),
                ..Default::default()
            },
            states: vec![GpuState {
                sm_mhz: Some(1980),
                mem_mhz: Some(3201),
                power_mw: Some(120_000),
                temp_c: Some(40),
                throttle: Some(0),
                persistence: Some(true),
                used_bytes: Some(5 << 30),
            }],
            util,
            procs: vec![GpuProc {
                pid: std::process::id(),
                used_bytes: Some(3 << 30),
                compute: true,
            }],
            ..Default::default()
        })
    }

    #[test]
    fn a_leg_is_sampled_by_phase_written_and_read_back() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("x.engine.samples.jsonl");
        let spec = SamplerSpec {
            gpu: Some(0),
            nvml_period_ms: 5,
            host_period_ms: 10,
            series: Some(path.clone()),
        };
        let t = now_us();
        // Busy in the battery, which starts ~30 ms in: the buffer is stamped by the "driver".
        let util: Vec<(u64, u32)> = (0..100).map(|i| (t + 40_000 + i * 1000, 80)).collect();
        let me = std::process::id();
        let s = LegSampler::start_with("engine", Some(me), &spec, Ok(fake(util)));
        s.phase.set("load");
        std::thread::sleep(Duration::from_millis(30));
        s.phase.set("battery");
        std::thread::sleep(Duration::from_millis(150));
        s.phase.set("shutdown");
        std::thread::sleep(Duration::from_millis(20));
        let done = s.finish();
        let r = &done.report;
        assert_eq!(r.series.as_deref(), Some(path.as_path()));
        assert_eq!(r.gpu_pids_seen, vec![me]);
        assert!(done.host_mem.peak_rss_bytes > 0);
        assert!(
            r.cost.iter().any(|c| c.thread == "nvml" && c.polls > 5),
            "{:?}",
            r.cost
        );
        let sum = r.summary.as_ref().unwrap();
        assert_eq!(sum.window, "battery");
        assert_eq!(sum.busy_fraction, Some(1.0), "{sum:?}");
        assert_eq!(sum.peak_gpu_mem_bytes, Some(3 << 30));
        assert_eq!(sum.sm_mhz.as_ref().unwrap().median, 1980.0);
        let back = read_series(&path).unwrap();
        // Cost rows hold CPU seconds, which serde_json reads back only to within an ulp.
        let no_cost = |v: &[Row]| -> Vec<Row> {
            v.iter()
                .filter(|r| !matches!(r, Row::Cost { .. }))
                .cloned()
                .collect()
        };
        assert_eq!(no_cost(&back), no_cost(&done.rows));
        assert_eq!(back.len(), done.rows.len());
        assert!(matches!(back[0], Row::Meta { .. }));
        assert!(back
            .iter()
            .any(|r| matches!(r, Row::Util { phase, .. } if phase == "battery")));
    }

    #[test]
    fn no_gpu_is_said_and_host_memory_still_sampled() {
        let spec = SamplerSpec {
            host_period_ms: 10,
            ..Default::default()
        };
        let s = LegSampler::start("engine", Some(std::process::id()), &spec);
        assert!(s.no_gpu().unwrap().contains("no GPU leased"));
        std::thread::sleep(Duration::from_millis(40));
        let done = s.finish();
        assert!(done.report.summary.is_none());
        assert!(done.host_mem.samples >= 1);
        assert!(done.host_mem.peak_rss_bytes > 1 << 20);
    }
}
