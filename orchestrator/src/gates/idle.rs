//! The idle gate: before each leg, the leased GPU must have no compute process on it and little
//! memory in use, or the leg does not start (someone else's kernels would be timed with ours).
//! It runs through [`crate::legs::lease::IdleCheck`]; the GPU is reached through the
//! [`crate::legs::sampler::Gpu`] trait, so tests play the process table.

use std::fmt;
use std::time::{Duration, Instant};

use crate::legs::lease::{IdleCheck, Lease, LeaseTarget};
use crate::legs::sampler::{self, Gpu, GpuProc};

/// A process on the GPU, as the refusal names it.
#[derive(Debug, Clone, PartialEq)]
pub struct NamedProc {
    pub pid: u32,
    pub name: String,
    pub mib: Option<u64>,
}

impl fmt::Display for NamedProc {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.mib {
            Some(m) => write!(f, "pid {} ({}, {m} MiB)", self.pid, self.name),
            None => write!(f, "pid {} ({}, memory not reported)", self.pid, self.name),
        }
    }
}

/// Why the GPU is not idle. Display is the whole sentence.
#[derive(Debug, Clone, PartialEq)]
pub enum IdleRefusal {
    ComputeProcesses {
        gpu: u32,
        procs: Vec<NamedProc>,
        used_mib: Option<u64>,
    },
    MemoryInUse {
        gpu: u32,
        used_mib: u64,
        max_mib: u64,
    },
}

impl fmt::Display for IdleRefusal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            IdleRefusal::ComputeProcesses {
                gpu,
                procs,
                used_mib,
            } => {
                let list: Vec<String> = procs.iter().map(ToString::to_string).collect();
                write!(
                    f,
                    "GPU {gpu} is not idle: {} compute process(es) on it: {}",
                    procs.len(),
                    list.join("; ")
                )?;
                if let Some(u) = used_mib {
                    write!(f, " ({u} MiB in use)")?;
                }
                write!(
                    f,
                    ". Hint: wait for them or stop them (they are not this run's); a leg timed beside another process measures both."
                )
            }
            IdleRefusal::MemoryInUse {
                gpu,
                used_mib,
                max_mib,
            } => write!(
                f,
                "GPU {gpu} is not idle: {used_mib} MiB of its memory is in use against [lease] idle_max_used_mib = {max_mib}, with no compute process to name (another container, or a driver-held allocation). Hint: check nvidia-smi on the host; raise idle_max_used_mib only if that memory is known to be inert."
            ),
        }
    }
}

/// The verdict on one look at the GPU: Ok with what was checked, or the refusal.
pub fn judge(
    gpu: u32,
    procs: &[GpuProc],
    used_bytes: Option<u64>,
    max_mib: u64,
    name: impl Fn(u32) -> String,
) -> Result<String, IdleRefusal> {
    let used_mib = used_bytes.map(|b| b >> 20);
    let compute: Vec<NamedProc> = procs
        .iter()
        .filter(|p| p.compute)
        .map(|p| NamedProc {
            pid: p.pid,
            name: name(p.pid),
            mib: p.used_bytes.map(|b| b >> 20),
        })
        .collect();
    if !compute.is_empty() {
        return Err(IdleRefusal::ComputeProcesses {
            gpu,
            procs: compute,
            used_mib,
        });
    }
    match used_mib {
        Some(u) if u > max_mib => Err(IdleRefusal::MemoryInUse {
            gpu,
            used_mib: u,
            max_mib,
        }),
        Some(u) => Ok(format!(
            "GPU {gpu} idle: no compute process, {u} MiB in use (ceiling {max_mib} MiB)"
        )),
        None => Ok(format!(
            "GPU {gpu} idle: no compute process (memory in use not reported)"
        )),
    }
}

/// The NVML idle check; `open` is `sampler::nvml::open`, or a fake in tests.
pub struct GpuIdleCheck {
    pub max_used_mib: u64,
    pub open: fn(u32) -> Result<Box<dyn Gpu>, String>,
    /// How long a busy GPU is given to settle before the refusal: the driver frees a killed
    /// process's memory a moment after it dies, so the previous leg's straggler, just killed,
    /// must not refuse the next leg.
    pub settle: Duration,
}

impl GpuIdleCheck {
    pub fn nvml(max_used_mib: u64) -> GpuIdleCheck {
        GpuIdleCheck {
            max_used_mib,
            open: sampler::nvml::open,
            settle: Duration::from_secs(5),
        }
    }
}

impl IdleCheck for GpuIdleCheck {
    fn check(&self, lease: &Lease) -> Result<String, String> {
        let LeaseTarget::Gpu(n) = lease.target else {
            return Ok("not applicable: no GPU (the run holds the cpu lease)".into());
        };
        let mut g = match (self.open)(n) {
            Ok(g) => g,
            Err(why) => return Ok(format!("not applicable: no GPU ({why})")),
        };
        let start = Instant::now();
        loop {
            let procs = g.processes();
            let used = g.state().used_bytes;
            match judge(
                n,
                &procs,
                used,
                self.max_used_mib,
                crate::util::procfs::process_name,
            ) {
                Ok(s) => return Ok(s),
                Err(r) if start.elapsed() >= self.settle => return Err(r.to_string()),
                Err(_) => std::thread::sleep(Duration::from_millis(250)),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::legs::sampler::{FakeGpu, GpuState};

    fn proc(pid: u32, mib: u64, compute: bool) -> GpuProc {
        GpuProc {
            pid,
            used_bytes: Some(mib << 20),
            compute,
        }
    }

    fn name(pid: u32) -> String {
        format!("proc{pid}")
    }

    #[test]
    fn an_idle_gpu_passes_with_the_figures() {
        let ok = judge(0, &[], Some(500 << 20), 1024, name).unwrap();
        assert!(ok.contains("500 MiB in use (ceiling 1024 MiB)"), "{ok}");
        // A graphics-only process (a display server) is not compute work.
        assert!(judge(0, &[proc(7, 20, false)], Some(20 << 20), 1024, name).is_ok());
    }

    #[test]
    fn compute_processes_are_named_with_pid_name_and_mib() {
        let e = judge(
            1,
            &[proc(40514, 22986, true), proc(9, 100, false)],
            Some(24_000 << 20),
            1024,
            name,
        )
        .unwrap_err()
        .to_string();
        assert!(
            e.starts_with("GPU 1 is not idle: 1 compute process(es)"),
            "{e}"
        );
        assert!(e.contains("pid 40514 (proc40514, 22986 MiB)"), "{e}");
        assert!(!e.contains("pid 9 "), "{e}");
    }

    #[test]
    fn memory_over_the_ceiling_without_processes_is_refused() {
        let e = judge(0, &[], Some(4892 << 20), 1024, name).unwrap_err();
        assert_eq!(
            e,
            IdleRefusal::MemoryInUse {
                gpu: 0,
                used_mib: 4892,
                max_mib: 1024
            }
        );
    }

    fn busy_gpu(_: u32) -> Result<Box<dyn Gpu>, String> {
        Ok(Box::new(FakeGpu {
            states: vec![GpuState {
                used_bytes: Some(3000 << 20),
                ..Default::default()
            }],
            procs: vec![proc(std::process::id(), 2900, true)],
            ..Default::default()
        }))
    }

    fn no_gpu(_: u32) -> Result<Box<dyn Gpu>, String> {
        Err("NVML is not available (test)".into())
    }

    #[test]
    fn the_check_refuses_through_the_lease_seam_and_says_when_there_is_no_gpu() {
        let dir = tempfile::tempdir().unwrap();
        let lease = Lease::acquire(LeaseTarget::Gpu(0), dir.path(), false, "t", true).unwrap();
        let busy = GpuIdleCheck {
            max_used_mib: 1024,
            open: busy_gpu,
            settle: Duration::ZERO,
        };
        let e = busy.check(&lease).unwrap_err();
        // The fake names this test process, which /proc can see.
        assert!(e.contains(&format!("pid {} (", std::process::id())), "{e}");
        assert!(e.contains("2900 MiB"), "{e}");
        let none = GpuIdleCheck {
            max_used_mib: 1024,
            open: no_gpu,
            settle: Duration::ZERO,
        };
        assert_eq!(
            none.check(&lease).unwrap(),
            "not applicable: no GPU (NVML is not available (test))"
        );
    }
}
