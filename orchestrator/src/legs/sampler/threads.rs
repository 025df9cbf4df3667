//! The sampler threads: the NVML poll (clocks, power, throttle, persistence, memory, and the
//! driver's utilization buffer) and the host-memory poll, each on a fixed grid, each measuring
//! its own CPU time; and which processes count as the leg's.

use std::collections::BTreeSet;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use super::gpu::Gpu;
use super::host::{self, thread_cpu_s};
use super::series::{ProcMem, Row};
use super::ThreadCost;

/// Microseconds since the epoch: the clock NVML stamps its utilization samples with.
pub fn now_us() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_micros() as u64)
        .unwrap_or(0)
}

/// The leg's phase as the orchestrator last marked it, shared with the sampler threads. Marks
/// are kept with their times so that samples the driver stamped earlier (the utilization
/// buffer is read in batches) are attributed to the phase they really fell in.
#[derive(Debug, Clone, Default)]
pub struct PhaseMarker(Arc<Mutex<Vec<(u64, String)>>>);

impl PhaseMarker {
    pub fn set(&self, phase: &str) {
        if let Ok(mut v) = self.0.lock() {
            v.push((now_us(), phase.to_string()));
        }
    }
    pub fn marks(&self) -> Vec<(u64, String)> {
        self.0.lock().map(|v| v.clone()).unwrap_or_default()
    }
    /// The phase in force at `t_us` ("start" before the first mark).
    pub fn at(&self, t_us: u64) -> String {
        phase_at(&self.marks(), t_us)
    }
}

fn phase_at(marks: &[(u64, String)], t_us: u64) -> String {
    marks
        .iter()
        .rev()
        .find(|(t, _)| *t <= t_us)
        .map(|(_, p)| p.clone())
        .unwrap_or_else(|| "start".into())
}

/// Which processes are the leg's: its process group (pgid = the leg's pid), the leg's
/// descendants, and the pids it announced in `ready.pids` (a server may start a process in a
/// session of its own). None: every process (`clock sample`, which watches the whole GPU).
#[derive(Debug, Clone, Default)]
pub struct LegPids {
    pub root: Option<u32>,
    pub announced: Arc<Mutex<Vec<u32>>>,
}

impl LegPids {
    pub fn belongs(&self, pid: u32) -> bool {
        let Some(root) = self.root else {
            return true;
        };
        if pid == root
            || self
                .announced
                .lock()
                .map(|v| v.contains(&pid))
                .unwrap_or(false)
        {
            return true;
        }
        if matches!(crate::util::procfs::stat_state_pgid(pid as i32), Some((_, pg)) if pg == root as i32)
        {
            return true;
        }
        // A descendant that left the group: walk up the parents (bounded against cycles).
        let mut cur = pid;
        for _ in 0..64 {
            match crate::util::procfs::parent_of(cur) {
                Some(p) if p == root => return true,
                Some(p) if p > 1 => cur = p,
                _ => return false,
            }
        }
        false
    }
}

pub(super) struct GpuOut {
    pub rows: Vec<Row>,
    pub cost: ThreadCost,
    pub seen: BTreeSet<u32>,
}

pub(super) struct HostOut {
    pub rows: Vec<Row>,
    pub cost: ThreadCost,
    pub peak: u64,
    pub samples: u64,
}

/// Sleeps to the next tick of a fixed grid, so a slow poll does not stretch the period.
fn sleep_until(next: &mut Instant, period: Duration) {
    *next += period;
    let now = Instant::now();
    if *next > now {
        std::thread::sleep(*next - now);
    } else {
        *next = now; // fell behind: do not burst to catch up
    }
}

/// The utilization samples the driver's buffer holds after `since` (advanced past them), each
/// with the phase it fell in; Err where the buffer is unsupported.
fn drain(g: &mut dyn Gpu, since: &mut u64, phase: &PhaseMarker) -> Result<Vec<Row>, String> {
    let v = g.utilization_samples(*since)?;
    let marks = phase.marks();
    Ok(v.into_iter()
        .map(|(t, pct)| {
            if t > *since {
                *since = t;
            }
            Row::Util {
                t_us: t,
                phase: phase_at(&marks, t),
                pct,
                source: "buffer".into(),
            }
        })
        .collect())
}

/// One poll of the device, with the leg's processes on it when `procs` (noted in `seen`).
fn poll(
    g: &mut dyn Gpu,
    t_us: u64,
    phase: String,
    procs: Option<(&LegPids, &mut BTreeSet<u32>)>,
) -> Row {
    let s = g.state();
    let procs = procs.map(|(pids, seen)| {
        g.processes()
            .into_iter()
            .filter(|p| pids.belongs(p.pid))
            .map(|p| {
                seen.insert(p.pid);
                ProcMem {
                    pid: p.pid,
                    bytes: p.used_bytes.unwrap_or(0),
                }
            })
            .collect()
    });
    Row::Gpu {
        t_us,
        phase,
        sm_mhz: s.sm_mhz,
        mem_mhz: s.mem_mhz,
        power_mw: s.power_mw,
        temp_c: s.temp_c,
        throttle: s.throttle,
        persistence: s.persistence,
        used_bytes: s.used_bytes,
        procs,
    }
}

pub(super) fn gpu_loop(
    mut g: Box<dyn Gpu>,
    period: Duration,
    stop: &AtomicBool,
    phase: &PhaseMarker,
    pids: &LegPids,
) -> GpuOut {
    let t0 = Instant::now();
    let c0 = thread_cpu_s();
    let mut rows = vec![];
    let mut seen = BTreeSet::new();
    // The buffer is read only for samples after the leg started; reading it every ~200 ms
    // keeps the call count low (it holds seconds of samples).
    let mut since = now_us();
    let period_ms = period.as_millis().max(1) as u64;
    let util_every = (200 / period_ms).max(1);
    let procs_every = (100 / period_ms).max(1);
    let mut buffer_ok = true;
    let mut polls = 0u64;
    let mut next = Instant::now();
    loop {
        let stopping = stop.load(Ordering::Relaxed);
        let t_us = now_us();
        let cur = phase_at(&phase.marks(), t_us);
        let procs = (polls % procs_every == 0).then_some((pids, &mut seen));
        rows.push(poll(g.as_mut(), t_us, cur.clone(), procs));
        if buffer_ok && (polls % util_every == 0 || stopping) {
            match drain(g.as_mut(), &mut since, phase) {
                Ok(v) => rows.extend(v),
                Err(_) => buffer_ok = false, // fall back to polling, below
            }
        }
        if !buffer_ok {
            if let Some(pct) = g.utilization_now() {
                rows.push(Row::Util {
                    t_us,
                    phase: cur,
                    pct,
                    source: "poll".into(),
                });
            }
        }
        polls += 1;
        if stopping {
            break;
        }
        sleep_until(&mut next, period);
    }
    GpuOut {
        rows,
        cost: ThreadCost {
            thread: "nvml".into(),
            cpu_s: thread_cpu_s() - c0,
            wall_s: t0.elapsed().as_secs_f64(),
            polls,
        },
        seen,
    }
}

pub(super) fn host_loop(
    root: u32,
    period: Duration,
    stop: &AtomicBool,
    phase: &PhaseMarker,
) -> HostOut {
    let t0 = Instant::now();
    let c0 = thread_cpu_s();
    let mut sys = sysinfo::System::new();
    let mut out = HostOut {
        rows: vec![],
        cost: ThreadCost::default(),
        peak: 0,
        samples: 0,
    };
    let mut next = Instant::now();
    while !stop.load(Ordering::Relaxed) {
        let rss = host::tree_rss(&mut sys, root);
        let t_us = now_us();
        out.rows.push(Row::Host {
            t_us,
            phase: phase.at(t_us),
            rss_bytes: rss,
        });
        out.samples += 1;
        out.peak = out.peak.max(rss);
        sleep_until(&mut next, period);
    }
    out.cost = ThreadCost {
        thread: "host".into(),
        cpu_s: thread_cpu_s() - c0,
        wall_s: t0.elapsed().as_secs_f64(),
        polls: out.samples,
    };
    out
}
