//! Deadlines per phase, killing a leg's whole process group, and finding stragglers.
//!
//! A leg runs in its own process group (pgid = the leg's pid), so one `killpg` reaches every
//! process it started unless one of them left the group on purpose; those are caught through the
//! `pids` the leg announced in `ready`.

use serde::{Deserialize, Serialize};
use std::time::Duration;

use crate::unit::WatchdogCfg;
use crate::util::procfs::{command_line, group_members, is_alive};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Phase {
    Load,
    Warmup,
    Battery,
    /// The token gate's teacher-forced pass, after the battery: untimed, outside every window
    /// that feeds an axis.
    Verify,
    Shutdown,
}

impl Phase {
    pub fn as_str(self) -> &'static str {
        match self {
            Phase::Load => "load",
            Phase::Warmup => "warmup",
            Phase::Battery => "battery",
            Phase::Verify => "verify",
            Phase::Shutdown => "shutdown",
        }
    }

    pub fn deadline(self, cfg: &WatchdogCfg) -> Duration {
        let s = match self {
            Phase::Load => cfg.load_s,
            Phase::Warmup => cfg.warmup_s,
            Phase::Battery => cfg.battery_s,
            Phase::Verify => cfg.verify_s,
            Phase::Shutdown => cfg.shutdown_s,
        };
        seconds(s)
    }
}

/// A unit's seconds as a duration, never panicking: preflight bounds them to
/// [`crate::unit::MAX_DEADLINE_S`], and a value that got past it anyway is clamped there.
pub fn seconds(s: f64) -> Duration {
    Duration::try_from_secs_f64(s.min(crate::unit::MAX_DEADLINE_S))
        .unwrap_or(Duration::from_secs(0))
}

impl std::fmt::Display for Phase {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// What the watchdog did when a phase ran past its deadline.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct WatchdogKill {
    pub phase: Phase,
    pub deadline_s: f64,
    /// How long the phase had run when it was stopped.
    pub ran_s: f64,
    /// The signals sent to the group, in order ("TERM", then "KILL" if it did not go).
    pub signals: Vec<String>,
}

/// A process of a leg still alive after the leg's shutdown.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Straggler {
    pub pid: i32,
    pub command: String,
    pub killed: bool,
}

/// A process of a leg still holding GPU memory after the leg's shutdown (the GPU side of the
/// straggler gate): the reference report's "PID 40514, 22,986 MiB, the EngineCore".
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct GpuStraggler {
    pub pid: u32,
    pub name: String,
    /// None where the driver does not account memory per process.
    pub mib: Option<u64>,
    pub killed: bool,
}

/// The processes in `procs` (a GPU's process table) that are the leg's, per `is_leg`.
pub fn gpu_stragglers(
    procs: &[crate::legs::sampler::GpuProc],
    is_leg: impl Fn(u32) -> bool,
) -> Vec<(u32, Option<u64>)> {
    procs
        .iter()
        .filter(|p| is_leg(p.pid))
        .map(|p| (p.pid, p.used_bytes.map(|b| b >> 20)))
        .collect()
}

/// Names and SIGKILLs every process of the leg still on the GPU. Only live processes are
/// killed: a pid seen during the leg that has since gone is not signalled (it may be reused).
pub fn reap_gpu_stragglers(
    gpu: &mut dyn crate::legs::sampler::Gpu,
    is_leg: impl Fn(u32) -> bool,
    name: impl Fn(u32) -> String,
) -> Vec<GpuStraggler> {
    gpu_stragglers(&gpu.processes(), is_leg)
        .into_iter()
        .map(|(pid, mib)| GpuStraggler {
            pid,
            name: name(pid),
            mib,
            killed: is_alive(pid as i32) && signal_pid(pid as i32, libc::SIGKILL),
        })
        .collect()
}

pub fn signal_group(pgid: i32, sig: i32) -> bool {
    // SAFETY: killpg has no memory-safety preconditions; a stale pgid just fails with ESRCH.
    unsafe { libc::killpg(pgid, sig) == 0 }
}

fn signal_pid(pid: i32, sig: i32) -> bool {
    // SAFETY: as above.
    unsafe { libc::kill(pid, sig) == 0 }
}

/// TERM the group, wait up to `grace` for it to empty, then KILL it. Returns the signals sent.
pub async fn term_then_kill(pgid: i32, grace: Duration) -> Vec<String> {
    let mut sent = vec![];
    if signal_group(pgid, libc::SIGTERM) {
        sent.push("TERM".to_string());
    }
    let start = std::time::Instant::now();
    while start.elapsed() < grace {
        if group_members(pgid).is_empty() {
            return sent;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    if signal_group(pgid, libc::SIGKILL) {
        sent.push("KILL".to_string());
    }
    sent
}

/// After a leg's shutdown: every live process of its group, plus any announced pid that is still
/// alive (it may have left the group), is a straggler. Each is named, then killed.
pub fn reap_stragglers(pgid: i32, announced: &[u32]) -> Vec<Straggler> {
    let mut pids = group_members(pgid);
    for &p in announced {
        let p = p as i32;
        if p != pgid && is_alive(p) && !pids.contains(&p) {
            pids.push(p);
        }
    }
    let mut out = vec![];
    for pid in pids {
        let command = command_line(pid);
        let killed = signal_pid(pid, libc::SIGKILL);
        out.push(Straggler {
            pid,
            command,
            killed,
        });
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::legs::sampler::{FakeGpu, GpuProc};

    #[test]
    fn a_leg_process_left_on_the_gpu_is_named_with_its_mib_and_killed() {
        let mut child = std::process::Command::new("sleep")
            .arg("30")
            .spawn()
            .unwrap();
        let pid = child.id();
        let mut gpu = FakeGpu {
            procs: vec![
                GpuProc {
                    pid,
                    used_bytes: Some(22_986 << 20),
                    compute: true,
                },
                // Someone else's process is not this leg's straggler, and is left alone.
                GpuProc {
                    pid: 1,
                    used_bytes: Some(100 << 20),
                    compute: true,
                },
            ],
            ..Default::default()
        };
        let found = reap_gpu_stragglers(&mut gpu, |p| p == pid, |_| "EngineCore".into());
        assert_eq!(
            found,
            vec![GpuStraggler {
                pid,
                name: "EngineCore".into(),
                mib: Some(22_986),
                killed: true
            }]
        );
        use std::os::unix::process::ExitStatusExt;
        assert_eq!(child.wait().unwrap().signal(), Some(libc::SIGKILL));
        // None of the leg's processes on the GPU: nothing to report.
        assert!(gpu_stragglers(&gpu.procs, |p| p == 999_999).is_empty());
    }
}
