//! One leg's process as the protocol sees it: lines to its stdin, events from its stdout, a
//! request answered result by result, and every way that can go wrong ([`Fault`]).

use std::path::Path;
use std::process::ExitStatus;
use std::time::{Duration, Instant};
use tokio::io::{AsyncWriteExt, BufReader, Lines};
use tokio::process::{Child, ChildStdin, ChildStdout};

use crate::legs::progress::Progress;
use crate::legs::protocol::{self, ErrorEvent, Event, LineProblem, PromptResult, Ready, Request};
use crate::legs::record::LegName;
use crate::legs::record::{RequestKind, RequestRecord};
use crate::legs::spec::{battery_row, BatteryPlan};
use crate::legs::watchdog::Phase;
use crate::unit::WatchdogCfg;

/// Why a phase stopped early (before it becomes a [`LegFailure`] with the stderr tail).
#[derive(Debug)]
pub(super) enum Fault {
    Exited(Option<ExitStatus>),
    BadLine(String, LineProblem),
    ErrorEvent(ErrorEvent),
    Protocol(String),
    Io(String),
    /// SIGINT, SIGTERM or SIGHUP reached the orchestrator (util/interrupt.rs).
    Interrupted(&'static str),
    /// Nothing on stdout for longer than the progress deadline ([`Pace`]).
    Stalled {
        silent_s: f64,
        bound_s: f64,
        longest_s: f64,
    },
}

impl Fault {
    /// The failure's stable kind and its whole sentence, for the `leg` leg in `phase`.
    pub fn describe(&self, leg: LegName, phase: Phase, wd: &WatchdogCfg) -> (&'static str, String) {
        match self {
            Fault::Exited(s) => (
                "exited",
                format!("the {leg} leg {} during {phase}", describe_status(*s)),
            ),
            Fault::BadLine(line, problem) => (
                "malformed_line",
                format!(
                    "the {leg} leg printed a line on stdout during {phase} that is {problem}: {:?} (stdout is for protocol lines only; logs go to stderr)",
                    crate::util::fmt::clip(line, 300)
                ),
            ),
            Fault::ErrorEvent(e) => (
                "error_event",
                format!(
                    "the {leg} leg sent an error event during {phase}: code {:?}: {}",
                    e.code, e.message
                ),
            ),
            Fault::Protocol(m) => (
                "protocol",
                format!("the {leg} leg broke the protocol during {phase}: it {m}"),
            ),
            Fault::Io(m) => (
                "protocol",
                format!("reading the {leg} leg's stdout failed during {phase}: {m}"),
            ),
            Fault::Interrupted(sig) => (
                "interrupted",
                format!("the run was interrupted by {sig} during the {leg} leg's {phase}; the leg's process group was stopped"),
            ),
            Fault::Stalled {
                silent_s,
                bound_s,
                longest_s,
            } => (
                "stalled",
                format!(
                    "the {leg} leg sent nothing for {silent_s:.1} s during {phase}, past its progress deadline of {bound_s:.1} s (max of [watchdog] stall_min_s {:.0} s and stall_factor {} x its slowest interval between events so far, {longest_s:.3} s): it was stopped, deadlocked or swapping; raise stall_min_s or stall_factor if it legitimately pauses that long",
                    wd.stall_min_s, wd.stall_factor
                ),
            ),
        }
    }
}

/// A phase's future under its deadline, cut short by SIGINT/SIGTERM/SIGHUP.
pub(super) async fn bounded<T>(
    deadline: Duration,
    fut: impl std::future::Future<Output = Result<T, Fault>>,
) -> Result<Result<T, Fault>, tokio::time::error::Elapsed> {
    tokio::select! {
        r = tokio::time::timeout(deadline, fut) => r,
        sig = crate::util::interrupt::wait() => Ok(Err(Fault::Interrupted(sig))),
    }
}

/// The leg's own pace: the longest interval between its events while it answers requests
/// (from a request sent to its first event, and from each event to the next). Once one is
/// known, the leg must not fall silent for max(`min_s`, `factor` x the longest): a stopped,
/// deadlocked or swapping leg is named in minutes, not at its phase's deadline of an hour.
#[derive(Debug, Clone)]
pub(super) struct Pace {
    last: Instant,
    longest: Option<f64>,
    factor: f64,
    min_s: f64,
}

impl Pace {
    pub fn new(factor: f64, min_s: f64) -> Pace {
        Pace {
            last: Instant::now(),
            longest: None,
            factor,
            min_s,
        }
    }

    /// How long the leg may now stay silent; None until its pace is known.
    pub fn bound(&self) -> Option<f64> {
        self.longest.map(|l| (l * self.factor).max(self.min_s))
    }

    fn restart(&mut self) {
        self.last = Instant::now();
    }

    fn event(&mut self) {
        let gap = self.last.elapsed().as_secs_f64();
        self.longest = Some(self.longest.map_or(gap, |l| l.max(gap)));
        self.last = Instant::now();
    }
}

pub(super) fn status_code(s: ExitStatus) -> i32 {
    use std::os::unix::process::ExitStatusExt;
    s.code().unwrap_or_else(|| 128 + s.signal().unwrap_or(0))
}

pub(super) fn describe_status(s: Option<ExitStatus>) -> String {
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

pub(super) struct LegProcess {
    pub child: Child,
    pub stdin: Option<ChildStdin>,
    pub stdout: Lines<BufReader<ChildStdout>>,
    pub pace: Pace,
}

impl LegProcess {
    pub async fn send(&mut self, line: &str) -> Result<(), Fault> {
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

    pub(super) async fn next_event(&mut self) -> Result<Event, Fault> {
        match self.stdout.next_line().await {
            Ok(Some(line)) => {
                let line = line.trim_end_matches('\r').to_string();
                protocol::parse_event(&line).map_err(|p| Fault::BadLine(line, p))
            }
            Ok(None) => Err(Fault::Exited(self.reap_briefly().await)),
            Err(e) => Err(Fault::Io(e.to_string())),
        }
    }

    /// The next event of a request, under the progress deadline once the pace is known.
    async fn next_paced(&mut self) -> Result<Event, Fault> {
        let ev = match self.pace.bound() {
            None => self.next_event().await,
            Some(bound) => {
                let wait = crate::legs::watchdog::seconds(bound);
                match tokio::time::timeout(wait, self.next_event()).await {
                    Ok(ev) => ev,
                    Err(_) => {
                        return Err(Fault::Stalled {
                            silent_s: self.pace.last.elapsed().as_secs_f64(),
                            bound_s: bound,
                            longest_s: self.pace.longest.unwrap_or(0.0),
                        })
                    }
                }
            }
        };
        self.pace.event();
        ev
    }

    pub async fn await_ready(&mut self) -> Result<Ready, Fault> {
        match self.next_event().await? {
            Event::Ready(r) => Ok(*r),
            Event::Error(e) => Err(Fault::ErrorEvent(e)),
            other => Err(Fault::Protocol(format!(
                "sent {} before ready",
                other.describe()
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
        let req = Request::Generate {
            id,
            prompts,
            max_tokens,
            ignore_eos,
            batch,
        };
        self.send(&req.line()).await?;
        self.pace.restart();
        let mut results: Vec<Option<PromptResult>> = vec![None; prompts.len()];
        loop {
            match self.next_paced().await? {
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
                        other.describe()
                    )))
                }
            }
        }
    }
}

pub(super) async fn run_passes(
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
                RequestKind::BatchFirstToken => format!("{tag}{pass}-b{batch}n1"),
            };
            let sent = plan.prompts_for(batch);
            let (mut results, wall_s) = p
                .request(&id, &sent, max_tokens, plan.ignore_eos, batch, prog)
                .await?;
            // A batch larger than the battery ran its prompts over again: each result names
            // its battery prompt, and which repeat of it.
            for r in &mut results {
                (r.index, r.copy) = battery_row(r.index, plan.prompts.len());
            }
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
