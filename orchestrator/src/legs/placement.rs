//! Where a run runs on a host of many GPUs: `run --gpu N` puts a GPU unit on GPU N (its engine's
//! `cuda:N`, its lease, its sampler and idle check), and while it runs the host's other GPUs are
//! watched, so that its record says which of them were busy beside it (their lease held, or a
//! compute process on them). `orchestrator fleet --local` places units this way (docs/FLEET.md).

use serde::{Deserialize, Serialize};
use std::collections::BTreeSet;
use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::legs::lease::LeaseTarget;
use crate::legs::sampler::Gpu;
use crate::unit::{parse_device, UnitFile};

/// The host's GPU indices for the fleet and the neighbours watch: a comma list (`fleet --local`
/// sets it for its runs to the GPUs it places on). Unset: every GPU NVML counts.
pub const HOST_GPUS_ENV: &str = "LLM_BENCH_HOST_GPUS";

/// Why a unit cannot be placed on a GPU. Display is the whole sentence.
#[derive(Debug, Clone, PartialEq)]
pub enum PlacementError {
    /// `--gpu` on a unit whose legs run on the CPU.
    CpuUnit { unit: String, device: String },
    /// `LLM_BENCH_HOST_GPUS` is not a list of indices.
    BadHostGpus { value: String },
}

impl fmt::Display for PlacementError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            PlacementError::CpuUnit { unit, device } => write!(
                f,
                "unit {unit} runs its engine on {device:?}, not on a GPU, so --gpu cannot place it; drop --gpu (a CPU unit takes the \"cpu\" lease) or set engine.device = \"cuda:0\" in its unit.toml"
            ),
            PlacementError::BadHostGpus { value } => write!(
                f,
                "{HOST_GPUS_ENV}={value:?} is not a comma-separated list of GPU indices; set it like \"0,1,2,3\" or unset it to use every GPU NVML counts"
            ),
        }
    }
}

impl std::error::Error for PlacementError {}

/// Whether the unit runs on a GPU: its engine on `cuda[:N]` (what `place_on_gpu` moves).
pub fn is_gpu_unit(cfg: &UnitFile) -> bool {
    matches!(parse_device(&cfg.engine.device), Ok(Some(_)))
}

/// Puts a GPU unit on GPU `gpu`: the engine's device becomes `cuda:{gpu}`, the lease (and with it
/// the sampler, the idle check and the oracle's LLM_BENCH_LEASED_GPU) GPU `gpu`, and an oracle on
/// CUDA `cuda:{gpu}` (the transformers backend takes its GPU from `--device`; vLLM makes the
/// leased GPU the visible one whatever the index). The record keeps the configuration as placed.
pub fn place_on_gpu(cfg: &mut UnitFile, gpu: u32) -> Result<(), PlacementError> {
    if !matches!(parse_device(&cfg.engine.device), Ok(Some(_))) {
        return Err(PlacementError::CpuUnit {
            unit: cfg.name.clone(),
            device: cfg.engine.device.clone(),
        });
    }
    cfg.engine.device = format!("cuda:{gpu}");
    cfg.lease.gpu = Some(gpu);
    if cfg.oracle.device.starts_with("cuda") {
        cfg.oracle.device = format!("cuda:{gpu}");
    }
    Ok(())
}

/// Parses "0,1,3" (spaces allowed); Err on anything else.
pub fn parse_gpu_list(s: &str) -> Result<Vec<u32>, String> {
    let mut v = vec![];
    for part in s.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        let n: u32 = part
            .parse()
            .map_err(|_| format!("{part:?} is not a GPU index"))?;
        if !v.contains(&n) {
            v.push(n);
        }
    }
    Ok(v)
}

/// The host's GPUs: `LLM_BENCH_HOST_GPUS` if set, else 0..N for the N GPUs NVML counts (none
/// where there is no driver).
pub fn host_gpus() -> Result<Vec<u32>, PlacementError> {
    if let Ok(v) = std::env::var(HOST_GPUS_ENV) {
        return parse_gpu_list(&v).map_err(|_| PlacementError::BadHostGpus { value: v });
    }
    let n = nvml_wrapper::Nvml::init()
        .and_then(|n| n.device_count())
        .unwrap_or(0);
    Ok((0..n).collect())
}

/// The holders in /proc/locks: (inode, pid) of each granted FLOCK write lock.
fn parse_proc_locks(text: &str) -> Vec<(u64, u32)> {
    text.lines()
        .filter_map(|l| {
            let mut f = l.split_whitespace().skip(1);
            let kind = f.next()?;
            // "->" marks a waiter, not a holder.
            if kind != "FLOCK" {
                return None;
            }
            let (_, rw, pid, dev_ino) = (f.next()?, f.next()?, f.next()?, f.next()?);
            if rw != "WRITE" {
                return None;
            }
            let ino = dev_ino.rsplit(':').next()?.parse().ok()?;
            Some((ino, pid.parse().ok()?))
        })
        .collect()
}

/// Who holds `target`'s lease in `lock_dir`, read without touching the lock (from /proc/locks and
/// the holder's own note in the lock file); None when it is free. A probe that took the lock,
/// however briefly, could make a `--no-wait` run fail for nothing.
pub fn lease_holder(lock_dir: &Path, target: &LeaseTarget) -> Option<String> {
    let path = lock_dir.join(format!("{}.lock", target.name()));
    let ino = {
        use std::os::unix::fs::MetadataExt;
        std::fs::metadata(&path).ok()?.ino()
    };
    let note = std::fs::read_to_string(&path).unwrap_or_default();
    let locks = parse_proc_locks(&std::fs::read_to_string("/proc/locks").ok()?);
    // By inode alone: on an overlay file system /proc/locks and stat may disagree on the device.
    let held = locks.iter().any(|&(i, _)| i == ino);
    held.then(|| {
        let s = note.trim();
        if s.is_empty() {
            "another process (it has not written its name yet)".to_string()
        } else {
            s.lines().collect::<Vec<_>>().join(", ")
        }
    })
}

/// Another GPU of the host, as watched during a run.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Neighbour {
    pub gpu: u32,
    /// Busy at one look or more: its lease held, or a compute process on it.
    pub busy: bool,
    /// How many times it was looked at, and at how many of them it was busy.
    pub looks: u32,
    pub busy_looks: u32,
    /// What was seen on it, each distinct description once, in order of first sight.
    pub seen: Vec<String>,
}

impl Neighbour {
    /// "gpu2 busy at 3 of 5 looks (lease held by pid 7, for orchestrator run x)" or "gpu1 idle".
    pub fn sentence(&self) -> String {
        if self.busy {
            format!(
                "gpu{} busy at {} of {} looks ({})",
                self.gpu,
                self.busy_looks,
                self.looks,
                self.seen.join("; ")
            )
        } else {
            format!("gpu{} idle at all {} looks", self.gpu, self.looks)
        }
    }
}

/// What the watch looks at: the lock directory's leases, and the GPUs through `open`
/// (`sampler::nvml::open`, or a fake in tests).
#[derive(Clone)]
pub struct Watch {
    pub lock_dir: PathBuf,
    pub gpus: Vec<u32>,
    pub open: fn(u32) -> Result<Box<dyn Gpu>, String>,
    pub period: Duration,
}

fn look(w: &Watch, gpu: u32, opened: &mut Option<Box<dyn Gpu>>) -> Vec<String> {
    let mut seen = vec![];
    if let Some(h) = lease_holder(&w.lock_dir, &LeaseTarget::Gpu(gpu)) {
        seen.push(format!("lease held by {h}"));
    }
    if opened.is_none() {
        *opened = (w.open)(gpu).ok();
    }
    if let Some(g) = opened.as_mut() {
        let compute: Vec<_> = g.processes().into_iter().filter(|p| p.compute).collect();
        if !compute.is_empty() {
            let pids: Vec<String> = compute.iter().map(|p| p.pid.to_string()).collect();
            seen.push(format!(
                "{} compute process(es): pid {}",
                compute.len(),
                pids.join(", ")
            ));
        }
    }
    seen
}

/// A running watch of the other GPUs; `finish` stops it and returns what it saw.
pub struct Neighbours {
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<Vec<Neighbour>>>,
}

impl Neighbours {
    /// Watches every GPU of `w.gpus` but `own`, once now and then every `w.period`, until
    /// `finish` (which takes one last look).
    pub fn start(w: Watch, own: Option<u32>) -> Neighbours {
        let stop = Arc::new(AtomicBool::new(false));
        let flag = stop.clone();
        let thread = std::thread::spawn(move || {
            let others: Vec<u32> = w.gpus.iter().copied().filter(|g| Some(*g) != own).collect();
            let mut out: Vec<Neighbour> = others
                .iter()
                .map(|&gpu| Neighbour {
                    gpu,
                    busy: false,
                    looks: 0,
                    busy_looks: 0,
                    seen: vec![],
                })
                .collect();
            let mut handles: Vec<Option<Box<dyn Gpu>>> = others.iter().map(|_| None).collect();
            loop {
                let last = flag.load(Ordering::SeqCst);
                for (n, h) in out.iter_mut().zip(handles.iter_mut()) {
                    let seen = look(&w, n.gpu, h);
                    n.looks += 1;
                    if !seen.is_empty() {
                        n.busy = true;
                        n.busy_looks += 1;
                    }
                    for s in seen {
                        if !n.seen.contains(&s) {
                            n.seen.push(s);
                        }
                    }
                }
                if last || others.is_empty() {
                    return out;
                }
                let t = Instant::now();
                while t.elapsed() < w.period && !flag.load(Ordering::SeqCst) {
                    std::thread::sleep(Duration::from_millis(50).min(w.period));
                }
            }
        });
        Neighbours {
            stop,
            thread: Some(thread),
        }
    }

    pub fn finish(mut self) -> Vec<Neighbour> {
        self.stop.store(true, Ordering::SeqCst);
        self.thread
            .take()
            .and_then(|t| t.join().ok())
            .unwrap_or_default()
    }
}

/// The GPUs that were busy, for a line of the run's output; None when there were no others.
pub fn summary(n: &[Neighbour]) -> Option<String> {
    if n.is_empty() {
        return None;
    }
    let busy: BTreeSet<u32> = n.iter().filter(|x| x.busy).map(|x| x.gpu).collect();
    Some(if busy.is_empty() {
        format!(
            "the host's other GPUs ({}) were idle throughout",
            n.iter()
                .map(|x| format!("gpu{}", x.gpu))
                .collect::<Vec<_>>()
                .join(", ")
        )
    } else {
        n.iter()
            .map(Neighbour::sentence)
            .collect::<Vec<_>>()
            .join("; ")
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::legs::lease::Lease;
    use crate::legs::sampler::{FakeGpu, GpuProc};
    use crate::unit::Unit;

    const UNIT: &str = "name = \"u\"\nmodel = \"m\"\n[battery]\nprompts = \"p.json\"\n[[golden]]\nfile = \"g.json\"\n[engine]\ndevice = \"cuda:0\"\n[oracle]\nbackend = \"transformers\"\ndevice = \"cuda\"\n";

    #[test]
    fn a_gpu_unit_is_placed_and_a_cpu_unit_refused() {
        let mut u = Unit::parse(Path::new("/u/unit.toml"), UNIT).unwrap().config;
        assert!(is_gpu_unit(&u));
        place_on_gpu(&mut u, 3).unwrap();
        assert_eq!(
            (
                u.engine.device.as_str(),
                u.lease.gpu,
                u.oracle.device.as_str()
            ),
            ("cuda:3", Some(3), "cuda:3")
        );
        let mut c = Unit::parse(
            Path::new("/u/unit.toml"),
            &UNIT.replace("device = \"cuda:0\"", "device = \"cpu\""),
        )
        .unwrap()
        .config;
        assert!(!is_gpu_unit(&c));
        let e = place_on_gpu(&mut c, 1).unwrap_err().to_string();
        assert!(e.starts_with("unit u runs its engine on \"cpu\""), "{e}");
        assert!(e.contains("drop --gpu"), "{e}");
    }

    #[test]
    fn gpu_lists_parse_and_refuse() {
        assert_eq!(parse_gpu_list(" 0, 2,2,5 ").unwrap(), vec![0, 2, 5]);
        assert!(parse_gpu_list("0,x").is_err());
    }

    #[test]
    fn proc_locks_holders_are_granted_flock_writes_only() {
        let t = "1: FLOCK  ADVISORY  WRITE 16812 fe:00:5382534 0 EOF\n\
                 1: -> FLOCK  ADVISORY  WRITE 16900 fe:00:5382534 0 EOF\n\
                 2: FLOCK  ADVISORY  READ 16812 fe:00:10133507 0 EOF\n\
                 3: POSIX  ADVISORY  WRITE 17009 fe:00:5537910 0 EOF\n";
        assert_eq!(parse_proc_locks(t), vec![(5_382_534, 16812)]);
    }

    #[test]
    fn a_held_lease_is_seen_without_being_taken_and_a_free_one_is_not() {
        let dir = tempfile::tempdir().unwrap();
        assert_eq!(lease_holder(dir.path(), &LeaseTarget::Gpu(1)), None);
        let l = Lease::acquire(LeaseTarget::Gpu(1), dir.path(), false, "unit A", true).unwrap();
        let h = lease_holder(dir.path(), &LeaseTarget::Gpu(1)).unwrap();
        assert!(h.contains("for unit A"), "{h}");
        // Looking did not take it: a no-wait taker still finds it held by A.
        let e = Lease::acquire(LeaseTarget::Gpu(1), dir.path(), false, "B", true).unwrap_err();
        assert!(e.to_string().contains("unit A"), "{e}");
        drop(l);
        assert_eq!(lease_holder(dir.path(), &LeaseTarget::Gpu(1)), None);
    }

    fn gpu_with_a_process(i: u32) -> Result<Box<dyn Gpu>, String> {
        let procs = if i == 2 {
            vec![GpuProc {
                pid: 4242,
                used_bytes: None,
                compute: true,
            }]
        } else {
            vec![]
        };
        Ok(Box::new(FakeGpu {
            procs,
            ..Default::default()
        }))
    }

    #[test]
    fn the_watch_names_leased_and_computing_neighbours_and_skips_its_own_gpu() {
        let dir = tempfile::tempdir().unwrap();
        let _l = Lease::acquire(LeaseTarget::Gpu(1), dir.path(), false, "unit B", true).unwrap();
        let w = Watch {
            lock_dir: dir.path().to_path_buf(),
            gpus: vec![0, 1, 2, 3],
            open: gpu_with_a_process,
            period: Duration::from_millis(10),
        };
        let n = Neighbours::start(w, Some(0));
        std::thread::sleep(Duration::from_millis(60));
        let n = n.finish();
        assert_eq!(n.iter().map(|x| x.gpu).collect::<Vec<_>>(), vec![1, 2, 3]);
        assert!(n[0].busy && n[0].busy_looks == n[0].looks && n[0].looks >= 2);
        assert!(n[0].seen[0].contains("for unit B"), "{:?}", n[0].seen);
        assert_eq!(
            n[1].seen,
            vec!["1 compute process(es): pid 4242".to_string()]
        );
        assert!(!n[2].busy);
        let s = summary(&n).unwrap();
        assert!(
            s.contains("gpu1 busy at") && s.contains("gpu3 idle at all"),
            "{s}"
        );
        assert_eq!(summary(&[]), None);
    }
}
