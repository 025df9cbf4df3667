//! One leg: a child process speaking docs/PROTOCOL.md, started from an argument vector in a
//! process group of its own, driven through load, warm-up, battery and shutdown, each phase under
//! its watchdog deadline. Everything it did is kept in a [`LegRecord`].

use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};
use std::process::{ExitStatus, Stdio};
use std::time::{Duration, Instant};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader, Lines};
use tokio::process::{Child, ChildStdin, ChildStdout, Command};

use crate::legs::progress::Progress;
use crate::legs::protocol::{self, ErrorEvent, Event, LineProblem, PromptResult, Ready};
use crate::legs::sampler::{HostMemSummary, LegSampler, SamplerReport, SamplerSpec};
use crate::legs::watchdog::{self, GpuStraggler, Phase, Straggler, WatchdogKill};
use crate::unit::WatchdogCfg;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Hash, PartialOrd, Ord)]
#[serde(rename_all = "lowercase")]
pub enum LegName {
    Engine,
    Oracle,
}

impl LegName {
    pub fn as_str(self) -> &'static str {
        match self {
            LegName::Engine => "engine",
            LegName::Oracle => "oracle",
        }
    }
}

impl std::fmt::Display for LegName {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// How to start a leg.
#[derive(Debug, Clone)]
pub struct LegSpec {
    pub leg: LegName,
    pub argv: Vec<String>,
    pub cwd: PathBuf,
    pub env: Vec<(String, String)>,
    pub log_path: PathBuf,
    /// What to sample while it runs, and where the series goes.
    pub sampler: SamplerSpec,
}

/// What each pass over the battery asks for.
#[derive(Debug, Clone)]
pub struct BatteryPlan {
    pub prompts: Vec<Vec<u32>>,
    pub max_tokens: u32,
    pub ignore_eos: bool,
    pub warmup: u32,
    pub repeat: u32,
    pub batch_sizes: Vec<u32>,
}

impl BatteryPlan {
    /// The requests of one pass: the timing recipe's max_tokens=1 and max_tokens=N at batch 1,
    /// then max_tokens=N at each batch size above 1.
    fn pass(&self) -> Vec<(RequestKind, u32, u32)> {
        let mut v = vec![
            (RequestKind::FirstToken, 1, 1),
            (RequestKind::Decode, self.max_tokens, 1),
        ];
        let mut sizes: Vec<u32> = self
            .batch_sizes
            .iter()
            .copied()
            .filter(|&b| b > 1)
            .collect();
        sizes.sort_unstable();
        sizes.dedup();
        for b in sizes {
            v.push((RequestKind::Batch, self.max_tokens, b));
        }
        v
    }

    fn prompts_per_pass(&self) -> usize {
        self.pass().len() * self.prompts.len()
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RequestKind {
    /// max_tokens = 1 at batch 1: the recipe's subtrahend and the time to first token.
    FirstToken,
    /// max_tokens = N at batch 1.
    Decode,
    /// max_tokens = N at batch > 1: throughput.
    Batch,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct RequestRecord {
    pub id: String,
    pub phase: Phase,
    /// 0-based pass number within its phase.
    pub pass: u32,
    pub kind: RequestKind,
    pub batch: u32,
    pub max_tokens: u32,
    pub wall_s: f64,
    /// One per prompt, in prompt order.
    pub results: Vec<PromptResult>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct LegFailure {
    pub phase: Phase,
    /// A stable name: spawn_failed, exited, watchdog, malformed_line, error_event, protocol.
    pub kind: String,
    /// The whole explanation, quoting the offending line or event.
    pub message: String,
    /// The last lines of the leg's stderr log.
    pub stderr_tail: Vec<String>,
}

impl std::fmt::Display for LegFailure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}", self.message)?;
        if !self.stderr_tail.is_empty() {
            write!(f, "; the last lines of its stderr:")?;
            for l in &self.stderr_tail {
                write!(f, "\n    | {l}")?;
            }
        }
        Ok(())
    }
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct PhaseTime {
    pub phase: Phase,
    pub elapsed_s: f64,
    pub ok: bool,
}

/// An earlier start of this leg, stopped after `ready` so the kv gate could resize the pool.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct PriorStart {
    pub argv: Vec<String>,
    pub log: PathBuf,
    pub ready: Option<Ready>,
    pub reason: String,
    pub stragglers: Vec<Straggler>,
    pub exit_status: Option<i32>,
    #[serde(default)]
    pub gpu_stragglers: Vec<GpuStraggler>,
    #[serde(default)]
    pub sampler: SamplerReport,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct LegRecord {
    pub leg: LegName,
    pub argv: Vec<String>,
    pub log: PathBuf,
    pub ready: Option<Ready>,
    pub phases: Vec<PhaseTime>,
    pub requests: Vec<RequestRecord>,
    pub watchdog: Option<WatchdogKill>,
    pub stragglers: Vec<Straggler>,
    /// Exit code, or 128 + signal number when killed by a signal.
    pub exit_status: Option<i32>,
    pub failure: Option<LegFailure>,
    pub host_mem: HostMemSummary,
    /// The GPU and host samplers' summary, series file and own cost.
    #[serde(default)]
    pub sampler: SamplerReport,
    /// Its processes still holding GPU memory after its shutdown (named, killed).
    #[serde(default)]
    pub gpu_stragglers: Vec<GpuStraggler>,
    /// The GPU's process table was read after its shutdown: without it, an empty
    /// `gpu_stragglers` means "not checked", never "none".
    #[serde(default)]
    pub gpu_checked: bool,
    /// Starts before this one (a kv resize restarts the leg).
    #[serde(default)]
    pub prior_starts: Vec<PriorStart>,
}

impl LegRecord {
    /// The battery completed: there are numbers to report.
    pub fn measured(&self) -> bool {
        self.phases
            .iter()
            .any(|p| p.phase == Phase::Battery && p.ok)
    }

    pub fn battery_requests(&self) -> impl Iterator<Item = &RequestRecord> {
        self.requests.iter().filter(|r| r.phase == Phase::Battery)
    }
}

/// Why a phase stopped early (before it becomes a [`LegFailure`] with the stderr tail).
#[derive(Debug)]
enum Fault {
    Exited(Option<ExitStatus>),
    BadLine(String, LineProblem),
    ErrorEvent(ErrorEvent),
    Protocol(String),
    Io(String),
}

fn status_code(s: ExitStatus) -> i32 {
    use std::os::unix::process::ExitStatusExt;
    s.code().unwrap_or_else(|| 128 + s.signal().unwrap_or(0))
}

fn describe_status(s: Option<ExitStatus>) -> String {
    use std::os::unix::process::ExitStatusExt;
    match s {
        Some(s) if s.code().is_some() => format!("exited with status {}", s.code().unwrap_or(0)),
        Some(s) => format!("was killed by signal {}", s.signal().unwrap_or(0)),
        None => "closed its stdout".to_string(),
    }
}

/// The last `n` lines of a log file (the leg's stderr).
pub fn tail_lines(path: &Path, n: usize) -> Vec<String> {
    let Ok(bytes) = std::fs::read(path) else {
        return vec![];
    };
    let text = String::from_utf8_lossy(&bytes);
    let lines: Vec<&str> = text.lines().filter(|l| !l.trim().is_empty()).collect();
    lines[lines.len().saturating_sub(n)..]
        .iter()
        .map(|l| l.to_string())
        .collect()
}

struct LegProcess {
    child: Child,
    stdin: Option<ChildStdin>,
    stdout: Lines<BufReader<ChildStdout>>,
}

impl LegProcess {
    async fn send(&mut self, line: &str) -> Result<(), Fault> {
        let Some(stdin) = self.stdin.as_mut() else {
            return Err(Fault::Protocol("stdin already closed".into()));
        };
        let r = async {
            stdin.write_all(line.as_bytes()).await?;
            stdin.flush().await
        }
        .await;
        match r {
            Ok(()) => Ok(()),
            // The leg died: report how, not the broken pipe.
            Err(_) => Err(Fault::Exited(self.reap_briefly().await)),
        }
    }

    async fn reap_briefly(&mut self) -> Option<ExitStatus> {
        tokio::time::timeout(Duration::from_secs(2), self.child.wait())
            .await
            .ok()
            .and_then(Result::ok)
    }

    async fn next_event(&mut self) -> Result<Event, Fault> {
        match self.stdout.next_line().await {
            Ok(Some(line)) => {
                let line = line.trim_end_matches('\r').to_string();
                protocol::parse_event(&line).map_err(|p| Fault::BadLine(line, p))
            }
            Ok(None) => Err(Fault::Exited(self.reap_briefly().await)),
            Err(e) => Err(Fault::Io(e.to_string())),
        }
    }

    async fn await_ready(&mut self) -> Result<Ready, Fault> {
        match self.next_event().await? {
            Event::Ready(r) => Ok(*r),
            Event::Error(e) => Err(Fault::ErrorEvent(e)),
            other => Err(Fault::Protocol(format!(
                "sent {} before ready",
                event_name(&other)
            ))),
        }
    }

    async fn request(
        &mut self,
        id: &str,
        prompts: &[Vec<u32>],
        max_tokens: u32,
        ignore_eos: bool,
        batch: u32,
        prog: &mut Progress,
    ) -> Result<(Vec<PromptResult>, f64), Fault> {
        self.send(&protocol::generate_line(
            id, prompts, max_tokens, ignore_eos, batch,
        ))
        .await?;
        let mut results: Vec<Option<PromptResult>> = vec![None; prompts.len()];
        loop {
            match self.next_event().await? {
                Event::Result(r) if r.id == id => {
                    let i = r.index;
                    match results.get_mut(i) {
                        None => {
                            return Err(Fault::Protocol(format!(
                            "sent a result for index {i} of request {id:?}, which has {} prompt(s)",
                            prompts.len()
                        )))
                        }
                        Some(Some(_)) => {
                            return Err(Fault::Protocol(format!(
                                "sent two results for index {i} of request {id:?}"
                            )))
                        }
                        Some(slot) => *slot = Some(r),
                    }
                    prog.tick(1);
                }
                Event::Done(d) if d.id == id => {
                    let missing: Vec<usize> = results
                        .iter()
                        .enumerate()
                        .filter(|(_, r)| r.is_none())
                        .map(|(i, _)| i)
                        .collect();
                    if !missing.is_empty() {
                        return Err(Fault::Protocol(format!(
                            "sent done for request {id:?} without results for index(es) {missing:?}"
                        )));
                    }
                    return Ok((results.into_iter().flatten().collect(), d.wall_s));
                }
                Event::Error(e) => return Err(Fault::ErrorEvent(e)),
                other => {
                    return Err(Fault::Protocol(format!(
                        "sent {} while request {id:?} was being answered",
                        event_name(&other)
                    )))
                }
            }
        }
    }
}

fn event_name(e: &Event) -> String {
    match e {
        Event::Ready(_) => "a ready event".into(),
        Event::Result(r) => format!("a result for request {:?}", r.id),
        Event::Done(d) => format!("done for request {:?}", d.id),
        Event::Error(_) => "an error event".into(),
    }
}

/// A leg in flight: its process (while alive) and everything recorded so far.
pub struct LegRun {
    pub record: LegRecord,
    proc: Option<LegProcess>,
    pgid: Option<i32>,
    sampler: Option<LegSampler>,
    sampler_spec: SamplerSpec,
    started: Instant,
    /// When the current phase began, for the watchdog's "ran for" figure.
    phase_started: Instant,
    wd: WatchdogCfg,
    quiet: bool,
}

impl LegRecord {
    /// The record of a leg that has not started yet.
    pub fn new(spec: &LegSpec) -> Self {
        LegRecord {
            leg: spec.leg,
            argv: spec.argv.clone(),
            log: spec.log_path.clone(),
            ready: None,
            phases: vec![],
            requests: vec![],
            watchdog: None,
            stragglers: vec![],
            exit_status: None,
            failure: None,
            host_mem: HostMemSummary::default(),
            sampler: SamplerReport::default(),
            gpu_stragglers: vec![],
            gpu_checked: false,
            prior_starts: vec![],
        }
    }
}

impl LegRun {
    /// Starts the leg. A spawn failure is recorded as a load failure, not returned.
    pub fn spawn(spec: &LegSpec, wd: &WatchdogCfg, quiet: bool) -> LegRun {
        let record = LegRecord::new(spec);
        let mut run = LegRun {
            record,
            proc: None,
            pgid: None,
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
        match cmd.spawn() {
            Ok(mut child) => {
                let pid = child.id().unwrap_or(0);
                let stdin = child.stdin.take();
                let stdout = child.stdout.take().expect("stdout was piped");
                run.pgid = Some(pid as i32);
                watchdog::register_group(pid as i32);
                let sampler = LegSampler::start(spec.leg.as_str(), Some(pid), &spec.sampler);
                sampler.phase.set(Phase::Load.as_str());
                run.sampler = Some(sampler);
                run.proc = Some(LegProcess {
                    child,
                    stdin,
                    stdout: BufReader::new(stdout).lines(),
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
        let r = tokio::time::timeout(deadline, p.await_ready()).await;
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
            let r = tokio::time::timeout(
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
        if let Some(mut p) = self.proc.take() {
            let prog = Progress::start(self.record.leg.as_str(), "shutdown", 0, self.quiet);
            let deadline = Phase::Shutdown.deadline(&self.wd);
            let started = Instant::now();
            // A leg that already died fails the send; its exit status is collected below.
            let _ = p.send(protocol::SHUTDOWN_LINE).await;
            p.stdin = None; // end of stdin means shutdown too
            let r = tokio::time::timeout(deadline, p.child.wait()).await;
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
                Err(_) => {
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
                ok: !outcome.starts_with("FAILED") && !outcome.starts_with("killed"),
            });
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
        if let (Some(pgid), Some(gpu)) = (self.pgid, self.sampler_spec.gpu) {
            if let Ok(mut g) = crate::legs::sampler::nvml::open(gpu) {
                // `seen` were the leg's when the sampler saw them (group, descendant or
                // announced); one that left the group since (setsid) is still the leg's worker.
                let seen = self.record.sampler.gpu_pids_seen.clone();
                let is_leg = |pid: u32| {
                    pid as i32 == pgid
                        || announced.contains(&pid)
                        || seen.contains(&pid)
                        || matches!(crate::util::procfs::stat_state_pgid(pid as i32), Some((_, pg)) if pg == pgid)
                };
                let found = watchdog::reap_gpu_stragglers(
                    g.as_mut(),
                    is_leg,
                    crate::util::procfs::process_name,
                );
                for s in &found {
                    if !self.quiet {
                        eprintln!(
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
        }
        if let Some(pgid) = self.pgid.take() {
            let found = watchdog::reap_stragglers(pgid, &announced);
            watchdog::unregister_group(pgid);
            for s in &found {
                if !self.quiet {
                    eprintln!(
                        "[{}] straggler: pid {} ({}) outlived its leg; killed",
                        self.record.leg, s.pid, s.command
                    );
                }
            }
            self.record.stragglers.extend(found);
        }
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
        let leg = self.record.leg;
        match r {
            Ok(Ok(v)) => Some(v),
            Ok(Err(fault)) => {
                let (kind, msg) = match fault {
                    Fault::Exited(s) => (
                        "exited",
                        format!("the {leg} leg {} during {phase}", describe_status(s)),
                    ),
                    Fault::BadLine(line, problem) => (
                        "malformed_line",
                        format!(
                            "the {leg} leg printed a line on stdout during {phase} that is {problem}: {:?} (stdout is for protocol lines only; logs go to stderr)",
                            crate::util::fmt::clip(&line, 300)
                        ),
                    ),
                    Fault::ErrorEvent(e) => (
                        "error_event",
                        format!(
                            "the {leg} leg sent an error event during {phase}: code {:?}: {}",
                            e.code, e.message
                        ),
                    ),
                    Fault::Protocol(m) => ("protocol", format!("the {leg} leg broke the protocol during {phase}: it {m}")),
                    Fault::Io(m) => ("protocol", format!("reading the {leg} leg's stdout failed during {phase}: {m}")),
                };
                // The leg cannot be trusted to shut down now: stop the whole group.
                if let Some(pgid) = self.pgid {
                    let grace = Duration::from_secs_f64(self.wd.grace_s);
                    watchdog::term_then_kill(pgid, grace).await;
                }
                self.fail(phase, kind, msg);
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
        let grace = Duration::from_secs_f64(self.wd.grace_s);
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
            eprintln!("[{leg}] {msg}");
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

async fn run_passes(
    p: &mut LegProcess,
    plan: &BatteryPlan,
    phase: Phase,
    passes: u32,
    done: &mut Vec<RequestRecord>,
    prog: &mut Progress,
) -> Result<(), Fault> {
    let tag = match phase {
        Phase::Warmup => "w",
        _ => "r",
    };
    for pass in 0..passes {
        for (kind, max_tokens, batch) in plan.pass() {
            let id = match kind {
                RequestKind::FirstToken => format!("{tag}{pass}-n1"),
                RequestKind::Decode => format!("{tag}{pass}-n{max_tokens}"),
                RequestKind::Batch => format!("{tag}{pass}-b{batch}"),
            };
            let (results, wall_s) = p
                .request(&id, &plan.prompts, max_tokens, plan.ignore_eos, batch, prog)
                .await?;
            done.push(RequestRecord {
                id,
                phase,
                pass,
                kind,
                batch,
                max_tokens,
                wall_s,
                results,
            });
        }
    }
    Ok(())
}
