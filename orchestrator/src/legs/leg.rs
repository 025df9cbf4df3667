//! One leg in flight: a child process speaking docs/PROTOCOL.md, started from an argument vector
//! in a process group of its own, driven through load, warm-up, battery and shutdown, each phase
//! under its watchdog deadline. Everything it did is kept in its [`LegRecord`].

use std::process::Stdio;
use std::time::{Duration, Instant};
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::Command;

use crate::legs::process::{
    bounded, describe_status, run_passes, status_code, tail_lines, Fault, LegProcess, Pace,
};
use crate::legs::progress::Progress;
use crate::legs::protocol::{Ready, Request};
use crate::legs::record::{LegFailure, LegRecord, PhaseTime, PriorStart};
use crate::legs::sampler::{LegSampler, SamplerSpec};
use crate::legs::spec::{BatteryPlan, LegSpec};
use crate::legs::watchdog::{self, Phase, WatchdogKill};
use crate::unit::WatchdogCfg;
use crate::util::child::{self, GroupGuard};
use crate::util::interrupt;
use crate::util::procfs::{process_name, stat_state_pgid};
use crate::util::term::sayln;

mod verify;

/// A leg in flight: its process (while alive) and everything recorded so far.
pub struct LegRun {
    pub record: LegRecord,
    proc: Option<LegProcess>,
    pgid: Option<i32>,
    /// Kills the leg's process group if the orchestrator dies (util/child.rs).
    guard: Option<GroupGuard>,
    sampler: Option<LegSampler>,
    sampler_spec: SamplerSpec,
    started: Instant,
    /// When the current phase began, for the watchdog's "ran for" figure.
    phase_started: Instant,
    wd: WatchdogCfg,
    quiet: bool,
}

impl LegRun {
    /// Starts the leg. A spawn failure is recorded as a load failure, not returned.
    pub fn spawn(spec: &LegSpec, wd: &WatchdogCfg, quiet: bool) -> LegRun {
        let record = LegRecord::new(spec);
        let mut run = LegRun {
            record,
            proc: None,
            pgid: None,
            guard: None,
            sampler: None,
            sampler_spec: spec.sampler.clone(),
            started: Instant::now(),
            phase_started: Instant::now(),
            wd: wd.clone(),
            quiet,
        };
        let log = match std::fs::OpenOptions::new()
            .create_new(true)
            .write(true)
            .open(&spec.log_path)
        {
            Ok(f) => f,
            Err(e) => {
                run.record.failure = Some(LegFailure {
                    phase: Phase::Load,
                    kind: "spawn_failed".into(),
                    message: format!(
                        "the {} leg's log {} could not be created ({e}); check --records-dir is writable",
                        spec.leg,
                        spec.log_path.display()
                    ),
                    stderr_tail: vec![],
                });
                return run;
            }
        };
        let mut cmd = Command::new(&spec.argv[0]);
        cmd.args(&spec.argv[1..])
            .current_dir(&spec.cwd)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::from(log))
            // Its own group, so the watchdog's killpg reaches everything the leg started.
            .process_group(0)
            .kill_on_drop(false);
        for (k, v) in &spec.env {
            cmd.env(k, v);
        }
        // Dies with the orchestrator, and holds the lease's lock until it is gone.
        child::tie_async(&mut cmd, spec.lease_fd);
        match cmd.spawn() {
            Ok(mut child) => {
                let pid = child.id().unwrap_or(0);
                let stdin = child.stdin.take();
                let stdout = child.stdout.take().expect("stdout was piped");
                run.pgid = Some(pid as i32);
                run.guard = GroupGuard::start(pid as i32).ok();
                let sampler = LegSampler::start(spec.leg.as_str(), Some(pid), &spec.sampler);
                sampler.phase.set(Phase::Load.as_str());
                run.sampler = Some(sampler);
                run.proc = Some(LegProcess {
                    child,
                    stdin,
                    stdout: BufReader::new(stdout).lines(),
                    pace: Pace::new(wd.stall_factor, wd.stall_min_s),
                });
            }
            Err(e) => {
                run.record.failure = Some(LegFailure {
                    phase: Phase::Load,
                    kind: "spawn_failed".into(),
                    message: format!(
                        "the {} leg could not be started: {:?} ({e}); check the binary or interpreter path (orchestrator check UNIT names it)",
                        spec.leg, spec.argv[0]
                    ),
                    stderr_tail: vec![],
                });
            }
        }
        run
    }

    pub fn failed(&self) -> bool {
        self.record.failure.is_some()
    }

    pub fn ready(&self) -> Option<&Ready> {
        self.record.ready.as_ref()
    }

    /// Waits for `ready` under the load deadline.
    pub async fn load(&mut self) -> bool {
        let Some(p) = self.proc.as_mut() else {
            return false;
        };
        let prog = Progress::start(self.record.leg.as_str(), "load", 0, self.quiet);
        let deadline = Phase::Load.deadline(&self.wd);
        self.phase_started = self.started; // load counts from the process start
        let r = bounded(deadline, p.await_ready()).await;
        match self.settle(Phase::Load, deadline, r).await {
            Some(ready) => {
                let note = format!("ready (load_s {:.2} reported by the leg)", ready.load_s);
                if let Some(s) = &self.sampler {
                    s.announce(&ready.pids);
                }
                self.record.ready = Some(ready);
                let el = prog.finish(&note);
                self.record.phases.push(PhaseTime {
                    phase: Phase::Load,
                    elapsed_s: el,
                    ok: true,
                });
                true
            }
            None => {
                let el = prog.finish("FAILED");
                self.record.phases.push(PhaseTime {
                    phase: Phase::Load,
                    elapsed_s: el,
                    ok: false,
                });
                false
            }
        }
    }

    /// Warm-up passes, then the battery `repeat` times, all over this one load.
    pub async fn run_battery(&mut self, plan: &BatteryPlan) -> bool {
        for (phase, passes) in [(Phase::Warmup, plan.warmup), (Phase::Battery, plan.repeat)] {
            if passes == 0 {
                continue;
            }
            self.mark(phase);
            let Some(p) = self.proc.as_mut() else {
                return false;
            };
            let total = plan.prompts_per_pass() * passes as usize;
            let mut prog =
                Progress::start(self.record.leg.as_str(), phase.as_str(), total, self.quiet);
            let deadline = phase.deadline(&self.wd);
            self.phase_started = Instant::now();
            let mut done = vec![];
            let r = bounded(
                deadline,
                run_passes(p, plan, phase, passes, &mut done, &mut prog),
            )
            .await;
            self.record.requests.append(&mut done);
            let ok = self.settle(phase, deadline, r).await.is_some();
            let el = prog.finish(if ok { "done" } else { "FAILED" });
            self.record.phases.push(PhaseTime {
                phase,
                elapsed_s: el,
                ok,
            });
            if !ok {
                return false;
            }
        }
        true
    }

    /// Sends `shutdown`, waits for the exit under the shutdown deadline, then names and kills
    /// stragglers. Also the clean-up after a failure (then the group was killed already).
    pub async fn shutdown(&mut self) {
        self.mark(Phase::Shutdown);
        if let Some(p) = self.proc.take() {
            self.stop(p).await;
        }
        // The samplers stop once the leg has exited, so the series covers its shutdown.
        if let Some(s) = self.sampler.take() {
            let done = s.finish();
            self.record.host_mem = done.host_mem;
            self.record.sampler = done.report;
        }
        let announced: Vec<u32> = self
            .record
            .ready
            .as_ref()
            .map(|r| r.pids.clone())
            .unwrap_or_default();
        // GPU side first: a process still holding memory is named with its MiB before the
        // host-side reap kills it anonymously.
        self.reap_gpu(&announced);
        if let Some(pgid) = self.pgid.take() {
            let found = watchdog::reap_stragglers(pgid, &announced);
            for s in &found {
                if !self.quiet {
                    sayln!(
                        "[{}] straggler: pid {} ({}) outlived its leg; killed",
                        self.record.leg,
                        s.pid,
                        s.command
                    );
                }
            }
            self.record.stragglers.extend(found);
        }
        // Its group is empty now: the guard goes without killing anything.
        if let Some(g) = self.guard.take() {
            g.release();
        }
    }

    /// The shutdown phase proper: the request, then the exit under the deadline.
    async fn stop(&mut self, mut p: LegProcess) {
        let prog = Progress::start(self.record.leg.as_str(), "shutdown", 0, self.quiet);
        // Interrupted: the leg still gets its shutdown, but only the grace period for it.
        let was_interrupted = interrupt::pending().is_some();
        let deadline = match was_interrupted {
            true => watchdog::seconds(self.wd.grace_s).min(Phase::Shutdown.deadline(&self.wd)),
            false => Phase::Shutdown.deadline(&self.wd),
        };
        let started = Instant::now();
        // A leg that already died fails the send; its exit status is collected below.
        let _ = p.send(&Request::Shutdown.line()).await;
        p.stdin = None; // end of stdin means shutdown too
        let r = tokio::select! {
            r = tokio::time::timeout(deadline, p.child.wait()) => r.map_err(|_| ()),
            _ = interrupt::wait(), if !was_interrupted => Err(()),
        };
        let outcome = match r {
            Ok(Ok(status)) => {
                self.record.exit_status = Some(status_code(status));
                if status.success() {
                    "exited 0".to_string()
                } else {
                    let msg = format!(
                        "the {} leg {} after shutdown (the protocol asks for 0)",
                        self.record.leg,
                        describe_status(Some(status))
                    );
                    self.fail(Phase::Shutdown, "exited", msg);
                    format!("FAILED: {}", describe_status(Some(status)))
                }
            }
            Ok(Err(e)) => {
                self.fail(
                    Phase::Shutdown,
                    "protocol",
                    format!("waiting for the {} leg failed: {e}", self.record.leg),
                );
                "FAILED".into()
            }
            Err(()) if interrupt::pending().is_some() => {
                let sig = interrupt::pending().unwrap_or("a signal");
                self.halt(Phase::Shutdown, Fault::Interrupted(sig)).await;
                "stopped: the run was interrupted".into()
            }
            Err(()) => {
                self.watchdog_kill(Phase::Shutdown, deadline, started).await;
                let status = tokio::time::timeout(Duration::from_secs(5), p.child.wait()).await;
                if let Ok(Ok(s)) = status {
                    self.record.exit_status = Some(status_code(s));
                }
                "killed by the watchdog".into()
            }
        };
        let el = prog.finish(&outcome);
        self.record.phases.push(PhaseTime {
            phase: Phase::Shutdown,
            elapsed_s: el,
            ok: !outcome.starts_with("FAILED")
                && !outcome.starts_with("killed")
                && !outcome.starts_with("stopped"),
        });
    }

    /// Names and kills each of the leg's processes still on the leased GPU (when NVML can say).
    fn reap_gpu(&mut self, announced: &[u32]) {
        let (Some(pgid), Some(gpu)) = (self.pgid, self.sampler_spec.gpu) else {
            return;
        };
        let Ok(mut g) = crate::legs::sampler::nvml::open(gpu) else {
            return;
        };
        // `seen` were the leg's when the sampler saw them (group, descendant or announced);
        // one that left the group since (setsid) is still the leg's worker.
        let seen = self.record.sampler.gpu_pids_seen.clone();
        let is_leg = |pid: u32| {
            pid as i32 == pgid
                || announced.contains(&pid)
                || seen.contains(&pid)
                || matches!(stat_state_pgid(pid as i32), Some((_, pg)) if pg == pgid)
        };
        let found = watchdog::reap_gpu_stragglers(g.as_mut(), is_leg, process_name);
        for s in &found {
            if !self.quiet {
                sayln!(
                    "[{}] GPU straggler: pid {} ({}) still held {} MiB after its leg; killed",
                    self.record.leg,
                    s.pid,
                    s.name,
                    s.mib.map_or("?".into(), |m| m.to_string())
                );
            }
        }
        self.record.gpu_stragglers.extend(found);
        self.record.gpu_checked = true;
    }

    /// Tells the samplers the leg entered `phase`.
    fn mark(&self, phase: Phase) {
        if let Some(s) = &self.sampler {
            s.phase.set(phase.as_str());
        }
    }

    /// Turns a phase's outcome into its value, or records the failure and stops the group.
    async fn settle<T>(
        &mut self,
        phase: Phase,
        deadline: Duration,
        r: Result<Result<T, Fault>, tokio::time::error::Elapsed>,
    ) -> Option<T> {
        match r {
            Ok(Ok(v)) => Some(v),
            Ok(Err(fault)) => {
                self.halt(phase, fault).await;
                self.collect_exit().await;
                None
            }
            Err(_) => {
                self.watchdog_kill(phase, deadline, self.phase_started)
                    .await;
                self.collect_exit().await;
                None
            }
        }
    }

    /// Records why the phase stopped and stops the whole group: the leg cannot be trusted to
    /// shut down now. A stall is also the watchdog's (`record.watchdog`).
    async fn halt(&mut self, phase: Phase, fault: Fault) {
        let leg = self.record.leg;
        let (kind, msg) = fault.describe(leg, phase, &self.wd);
        let signals = match self.pgid {
            Some(pgid) => {
                // A stopped (SIGSTOP) group takes no TERM until it runs again.
                watchdog::signal_group(pgid, libc::SIGCONT);
                watchdog::term_then_kill(pgid, watchdog::seconds(self.wd.grace_s)).await
            }
            None => vec![],
        };
        if let Fault::Stalled {
            silent_s, bound_s, ..
        } = fault
        {
            self.record.watchdog = Some(WatchdogKill {
                phase,
                deadline_s: bound_s,
                ran_s: silent_s,
                signals,
            });
        }
        if !self.quiet && matches!(kind, "stalled" | "interrupted") {
            sayln!("[{leg}] {msg}");
        }
        self.fail(phase, kind, msg);
    }

    async fn collect_exit(&mut self) {
        if let Some(p) = self.proc.as_mut() {
            if let Ok(Ok(s)) = tokio::time::timeout(Duration::from_secs(5), p.child.wait()).await {
                self.record.exit_status = Some(status_code(s));
            }
            p.stdin = None;
        }
        // Nothing more is read from it; shutdown() only reaps stragglers now.
        self.proc = None;
    }

    async fn watchdog_kill(&mut self, phase: Phase, deadline: Duration, started: Instant) {
        let leg = self.record.leg;
        let grace = watchdog::seconds(self.wd.grace_s);
        let signals = match self.pgid {
            Some(pgid) => watchdog::term_then_kill(pgid, grace).await,
            None => vec![],
        };
        let ran_s = started.elapsed().as_secs_f64();
        let kill = WatchdogKill {
            phase,
            deadline_s: deadline.as_secs_f64(),
            ran_s,
            signals: signals.clone(),
        };
        let msg = format!(
            "the watchdog stopped the {leg} leg in phase {phase} after {ran_s:.1} s (deadline {:.1} s; sent {}); raise [watchdog] {phase}_s in the unit if the phase legitimately needs longer",
            deadline.as_secs_f64(),
            if signals.is_empty() { "nothing, the group was gone".to_string() } else { signals.join(" then ") }
        );
        if !self.quiet {
            sayln!("[{leg}] {msg}");
        }
        self.record.watchdog = Some(kill);
        self.fail(phase, "watchdog", msg);
    }

    fn fail(&mut self, phase: Phase, kind: &str, message: String) {
        if self.record.failure.is_some() {
            return; // the first failure is the cause; later ones are consequences
        }
        self.record.failure = Some(LegFailure {
            phase,
            kind: kind.into(),
            message,
            stderr_tail: tail_lines(&self.record.log, 12),
        });
    }

    /// Stops this start of the leg (after `ready`, for a kv resize) and returns what it was.
    pub async fn stop_for_restart(mut self, reason: String) -> PriorStart {
        self.shutdown().await;
        PriorStart {
            argv: self.record.argv.clone(),
            log: self.record.log.clone(),
            ready: self.record.ready.clone(),
            reason,
            stragglers: self.record.stragglers.clone(),
            exit_status: self.record.exit_status,
            gpu_stragglers: self.record.gpu_stragglers.clone(),
            sampler: self.record.sampler.clone(),
        }
    }

    pub fn into_record(self) -> LegRecord {
        self.record
    }
}
