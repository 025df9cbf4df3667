//! `orchestrator fleet --local`: the units on the GPUs of one host, in parallel, one per free GPU.
//! Each task is a child `orchestrator run UNIT --gpu N`, which takes GPU N's lease and runs its
//! idle check before each leg as any run does: the lease, not this scheduler, is what keeps two
//! units off one GPU. The scheduler only places: it starts a task on a GPU that none of its own
//! tasks holds, whose lease nobody holds, and which the idle check would pass. CPU units run after
//! the GPU units, one at a time (a CPU benchmark beside anything else times both).

use std::collections::{BTreeSet, VecDeque};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use super::{FleetError, Task};
use crate::gates::idle;
use crate::legs::lease::LeaseTarget;
use crate::legs::placement::{self, HOST_GPUS_ENV};
use crate::legs::sampler::Gpu;
use crate::util::term::sayln;

#[derive(Clone)]
pub struct LocalOptions {
    /// The GPUs to place on (their indices on this host).
    pub gpus: Vec<u32>,
    pub records_dir: PathBuf,
    /// Overrides each unit's `[lease] lock_dir`.
    pub lock_dir: Option<PathBuf>,
    pub orchestrator: PathBuf,
    pub python: Option<String>,
    /// Each task's output (its `orchestrator run`'s stdout and stderr) goes to a log here.
    pub log_dir: PathBuf,
    pub poll: Duration,
    /// `sampler::nvml::open`, or a fake in tests.
    pub open: fn(u32) -> Result<Box<dyn Gpu>, String>,
}

/// A task that ended.
#[derive(Debug, Clone, PartialEq)]
pub struct Finished {
    pub unit: String,
    pub repeat: u32,
    pub gpu: Option<u32>,
    /// `orchestrator run`'s exit status (0 every gate passed, 1 refusals, 2 nothing measured).
    pub status: i32,
    pub seconds: f64,
    pub log: PathBuf,
    /// The record, as the run named it on its last `record:` line.
    pub record: Option<PathBuf>,
}

impl Finished {
    pub fn line(&self) -> String {
        let what = match self.status {
            0 => "every gate passed".to_string(),
            1 => "a record with refusals".to_string(),
            s => format!("exit {s}, nothing measured or no record: see the log"),
        };
        format!(
            "{} (repeat {}){}: {what}, {:.1} s; {}",
            self.unit,
            self.repeat,
            on(self.gpu),
            self.seconds,
            match &self.record {
                Some(r) => format!("record {}", r.display()),
                None => format!("log {}", self.log.display()),
            }
        )
    }
}

fn on(gpu: Option<u32>) -> String {
    gpu.map(|g| format!(" on gpu{g}")).unwrap_or_default()
}

fn lock_dir(t: &Task, o: &LocalOptions) -> PathBuf {
    o.lock_dir
        .clone()
        .unwrap_or_else(|| t.unit.lock_dir.clone())
}

/// Why GPU `gpu` cannot take `t` now (its lease is held, or it is not idle); None when it can.
fn busy(gpu: u32, t: &Task, o: &LocalOptions) -> Option<String> {
    if let Some(h) = placement::lease_holder(&lock_dir(t, o), &LeaseTarget::Gpu(gpu)) {
        return Some(format!("its lease is held by {h}"));
    }
    let mut g = (o.open)(gpu).ok()?;
    let procs = g.processes();
    let used = g.state().used_bytes;
    idle::judge(
        gpu,
        &procs,
        used,
        t.unit.idle_max_used_mib,
        crate::util::procfs::process_name,
    )
    .err()
    .map(|r| r.to_string())
}

struct Running {
    task: Task,
    gpu: Option<u32>,
    child: Child,
    start: Instant,
    log: PathBuf,
}

fn spawn(t: &Task, gpu: Option<u32>, o: &LocalOptions) -> Result<Running, FleetError> {
    let log = o.log_dir.join(format!(
        "{}-{}{}.log",
        t.unit.name,
        t.repeat,
        on(gpu).replace(" on ", "-")
    ));
    let file = std::fs::File::create(&log).map_err(|error| FleetError::Write {
        path: log.clone(),
        error,
    })?;
    let err = file.try_clone().map_err(|error| FleetError::Write {
        path: log.clone(),
        error,
    })?;
    let mut cmd = Command::new(&o.orchestrator);
    cmd.arg("run")
        .arg(&t.unit.path)
        .arg("--records-dir")
        .arg(&o.records_dir)
        .arg("--lock-dir")
        .arg(lock_dir(t, o))
        .env(
            HOST_GPUS_ENV,
            o.gpus
                .iter()
                .map(u32::to_string)
                .collect::<Vec<_>>()
                .join(","),
        )
        .current_dir(&t.unit.project_root)
        .stdin(Stdio::null())
        .stdout(file)
        .stderr(err);
    if let Some(g) = gpu {
        cmd.arg("--gpu").arg(g.to_string());
    }
    if let Some(p) = &o.python {
        cmd.arg("--python").arg(p);
    }
    // Nothing outlives the orchestrator (util/child.rs): a fleet killed takes its runs with it.
    crate::util::child::tie(&mut cmd, None);
    let child = cmd.spawn().map_err(|error| FleetError::Spawn {
        what: format!("{} run {}", o.orchestrator.display(), t.unit.path.display()),
        error,
    })?;
    sayln!(
        "[fleet] {} (repeat {}){}: started, log {}",
        t.unit.name,
        t.repeat,
        on(gpu),
        log.display()
    );
    Ok(Running {
        task: t.clone(),
        gpu,
        child,
        start: Instant::now(),
        log,
    })
}

/// The path on the run's last `record: PATH` line.
fn record_in(log: &Path) -> Option<PathBuf> {
    let text = std::fs::read_to_string(log).ok()?;
    text.lines()
        .rev()
        .find_map(|l| l.strip_prefix("record: "))
        .map(|p| PathBuf::from(p.trim()))
}

fn finished(r: Running, status: std::process::ExitStatus) -> Finished {
    use std::os::unix::process::ExitStatusExt;
    let f = Finished {
        unit: r.task.unit.name.clone(),
        repeat: r.task.repeat,
        gpu: r.gpu,
        status: status
            .code()
            .unwrap_or_else(|| 128 + status.signal().unwrap_or(0)),
        seconds: r.start.elapsed().as_secs_f64(),
        record: record_in(&r.log),
        log: r.log,
    };
    sayln!("[fleet] {}", f.line());
    f
}

fn wait(mut r: Running) -> Result<Finished, FleetError> {
    let st = r.child.wait().map_err(|error| FleetError::Spawn {
        what: format!("waiting for {}", r.task.unit.name),
        error,
    })?;
    Ok(finished(r, st))
}

/// Runs every task: the GPU units spread over `o.gpus`, one per GPU at a time, then the CPU
/// units one by one. Returns each task's end in the order they ended.
pub fn run(tasks: &[Task], o: &LocalOptions) -> Result<Vec<Finished>, FleetError> {
    let mut gq: VecDeque<&Task> = tasks.iter().filter(|t| t.unit.gpu).collect();
    let cq: Vec<&Task> = tasks.iter().filter(|t| !t.unit.gpu).collect();
    if !gq.is_empty() && o.gpus.is_empty() {
        let names: BTreeSet<String> = gq.iter().map(|t| t.unit.name.clone()).collect();
        return Err(FleetError::NoGpus {
            units: names.into_iter().collect(),
        });
    }
    std::fs::create_dir_all(&o.log_dir).map_err(|error| FleetError::Write {
        path: o.log_dir.clone(),
        error,
    })?;
    let mut done = vec![];
    let mut running: Vec<Running> = vec![];
    let mut said_busy: BTreeSet<u32> = BTreeSet::new();
    while !gq.is_empty() || !running.is_empty() {
        let mut still = vec![];
        for mut r in running {
            match r.child.try_wait() {
                Ok(Some(st)) => done.push(finished(r, st)),
                Ok(None) => still.push(r),
                Err(_) => done.push(wait(r)?),
            }
        }
        running = still;
        for &gpu in &o.gpus {
            let Some(t) = gq.front() else { break };
            if running.iter().any(|r| r.gpu == Some(gpu)) {
                continue;
            }
            if let Some(why) = busy(gpu, t, o) {
                if said_busy.insert(gpu) {
                    sayln!("[fleet] gpu{gpu} is busy ({why}); no unit goes there until it is free");
                }
                continue;
            }
            said_busy.remove(&gpu);
            running.push(spawn(t, Some(gpu), o)?);
            gq.pop_front();
        }
        if !gq.is_empty() || !running.is_empty() {
            std::thread::sleep(o.poll);
        }
    }
    for t in cq {
        done.push(wait(spawn(t, None, o)?)?);
    }
    Ok(done)
}

/// The fleet's exit status: the worst of its runs' (0, 1 or 2).
pub fn exit_status(done: &[Finished]) -> i32 {
    done.iter().map(|f| f.status.clamp(0, 2)).max().unwrap_or(0)
}
