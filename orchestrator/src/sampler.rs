//! Samplers that run beside a leg. Today: peak host memory (RSS) of the leg's process tree,
//! polled with sysinfo. Issue 5 adds the NVML sampler here, behind the same start/stop shape.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;
use sysinfo::{Pid, ProcessRefreshKind, ProcessesToUpdate, System};

/// Polls the RSS of a process tree on its own thread until stopped; keeps the peak.
pub struct HostMemSampler {
    stop: Arc<AtomicBool>,
    handle: Option<JoinHandle<HostMemSummary>>,
}

#[derive(Debug, Clone, Default, serde::Serialize, serde::Deserialize)]
pub struct HostMemSummary {
    /// Largest sum of RSS over the leg's process tree seen in one poll, in bytes.
    pub peak_rss_bytes: u64,
    pub samples: u64,
    pub period_ms: u64,
}

impl HostMemSampler {
    pub fn start(root: u32, period: Duration) -> HostMemSampler {
        let stop = Arc::new(AtomicBool::new(false));
        let flag = stop.clone();
        let handle = std::thread::Builder::new()
            .name(format!("hostmem-{root}"))
            .spawn(move || {
                let mut sys = System::new();
                let mut s = HostMemSummary {
                    period_ms: period.as_millis() as u64,
                    ..Default::default()
                };
                while !flag.load(Ordering::Relaxed) {
                    let rss = tree_rss(&mut sys, root);
                    s.samples += 1;
                    s.peak_rss_bytes = s.peak_rss_bytes.max(rss);
                    std::thread::sleep(period);
                }
                s
            })
            .expect("spawning a sampler thread");
        HostMemSampler {
            stop,
            handle: Some(handle),
        }
    }

    pub fn finish(mut self) -> HostMemSummary {
        self.stop.store(true, Ordering::Relaxed);
        self.handle
            .take()
            .and_then(|h| h.join().ok())
            .unwrap_or_default()
    }
}

impl Drop for HostMemSampler {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

/// Sum of RSS of `root` and all its descendants.
fn tree_rss(sys: &mut System, root: u32) -> u64 {
    sys.refresh_processes_specifics(
        ProcessesToUpdate::All,
        true,
        ProcessRefreshKind::nothing().with_memory(),
    );
    let procs = sys.processes();
    let root = Pid::from_u32(root);
    let mut total = 0;
    for (pid, p) in procs {
        // Walk up the parent chain; trees are shallow, and the depth bound guards against cycles.
        let mut cur = Some(*pid);
        for _ in 0..64 {
            match cur {
                Some(c) if c == root => {
                    total += p.memory();
                    break;
                }
                Some(c) => cur = procs.get(&c).and_then(|q| q.parent()),
                None => break,
            }
        }
    }
    total
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sees_its_own_process() {
        let s = HostMemSampler::start(std::process::id(), Duration::from_millis(10));
        std::thread::sleep(Duration::from_millis(60));
        let sum = s.finish();
        assert!(sum.samples >= 1);
        assert!(sum.peak_rss_bytes > 1 << 20, "{sum:?}");
    }
}
