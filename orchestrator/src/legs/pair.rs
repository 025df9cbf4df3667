//! Both legs of one run under one lease: the idle check before each, the first leg run whole,
//! the second loaded and, if its KV pool differs from the first's, restarted once sized to
//! match (`[gates] kv_match`; the kv gate judges the result), then its battery. Each leg is
//! preceded by the host probe (host_probe.rs) and followed, before its shutdown, by the verify
//! phase the caller plans (the token gate's teacher forcing). `--legs` runs one leg alone; the
//! other's record says why it was not run. SIGINT, SIGTERM or SIGHUP stops the running leg (its
//! failure says so) and starts no other.

use std::path::{Path, PathBuf};

use crate::legs::host_probe;
use crate::legs::lease::{IdleCheck, Lease, LeaseTarget};
use crate::legs::leg::LegRun;
use crate::legs::placement::{self, Neighbour, Neighbours, Watch};
use crate::legs::protocol::{blocks_for, Kv};
use crate::legs::record::{LegFailure, LegName, LegRecord};
use crate::legs::spec::{lease_target, leg_spec, BatteryPlan, LegSpec, Resize};
use crate::legs::verified::VerifyPlan;
use crate::legs::watchdog::Phase;
use crate::unit::preflight::Checked;
use crate::unit::{KvMatch, LegChoice};
use crate::util::interrupt;
use crate::util::term::sayln;

/// Both legs as they ran, and what ran around them.
pub struct Pair {
    pub engine: LegRecord,
    pub oracle: LegRecord,
    /// The kv gate's resize, in words, when one was done.
    pub kv_resize: Option<String>,
    /// What the idle check said before each leg.
    pub idle_checks: Vec<String>,
    /// The lease held: its target and lock file.
    pub lease: LeaseTarget,
    pub lease_path: PathBuf,
    /// The host's other GPUs as watched while the lease was held (placement.rs).
    pub neighbours: Vec<Neighbour>,
    /// The signal that interrupted the run (the running leg was stopped, no other started).
    pub interrupted: Option<&'static str>,
}

impl Pair {
    /// Either leg completed its battery: there are numbers to record.
    pub fn measured(&self) -> bool {
        self.engine.measured() || self.oracle.measured()
    }
}

/// How the lease is taken.
pub struct LeaseOptions<'a> {
    pub lock_dir: &'a Path,
    pub wait: bool,
}

/// Which legs run, and what each is asked to verify after its battery.
pub struct LegOptions<'a> {
    pub legs: LegChoice,
    /// The verify plan for a leg that completed its battery (its record holds `ready`); a plan
    /// with no batch size skips the phase.
    pub verify: &'a dyn Fn(&LegRecord) -> VerifyPlan,
}

/// Takes the run's lease, waiting for it unless `wait` is false; Err says why not (busy, a
/// lock directory that cannot be written, or SIGINT/SIGTERM/SIGHUP while waiting).
pub fn take_lease(checked: &Checked, lease: &LeaseOptions, quiet: bool) -> Result<Lease, String> {
    let unit = &checked.unit;
    let held = Lease::acquire(
        lease_target(unit),
        lease.lock_dir,
        lease.wait,
        &format!(
            "orchestrator run {} ({})",
            unit.config.name,
            unit.path.display()
        ),
        quiet,
    )
    .map_err(|e| e.to_string())?;
    if !quiet {
        sayln!(
            "[lease] holding the {} lease ({})",
            held.target.name(),
            held.path.display()
        );
    }
    Ok(held)
}

/// Runs both legs under `held`, each tied to the orchestrator and holding the lease's lock,
/// while the host's other GPUs are watched (their leases in `lock_dir`). SIGINT, SIGTERM or
/// SIGHUP stops the running leg (its failure says so) and starts no other; `Pair::interrupted`
/// names the signal. Err: the async runtime could not start, or the host's GPUs not be listed.
pub fn run(
    checked: &Checked,
    stem: &Path,
    held: &Lease,
    lock_dir: &Path,
    legs: &LegOptions,
    quiet: bool,
    idle: &dyn IdleCheck,
) -> Result<Pair, String> {
    let c = checked.unit.config.battery.clone();
    let ctx = Ctx {
        checked,
        stem,
        plan: BatteryPlan {
            prompts: checked.prompts.iter().map(|p| p.tokens.clone()).collect(),
            max_tokens: c.max_tokens,
            ignore_eos: c.ignore_eos,
            warmup: c.warmup,
            repeat: c.repeat,
            batch_sizes: c.batch_sizes,
        },
        quiet,
        lease: held,
        idle,
        legs,
    };
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| format!("cannot start the async runtime: {e}"))?;
    let watch = Neighbours::start(
        Watch {
            lock_dir: lock_dir.to_path_buf(),
            gpus: placement::host_gpus().map_err(|e| e.to_string())?,
            open: crate::legs::sampler::nvml::open,
            period: std::time::Duration::from_secs(1),
        },
        match held.target {
            LeaseTarget::Gpu(n) => Some(n),
            LeaseTarget::Cpu => None,
        },
    );
    let pair = rt.block_on(ctx.legs());
    let neighbours = watch.finish();
    Ok(Pair { neighbours, ..pair })
}

/// A leg left out of the run (`--legs`): no failure, nothing measured, and why.
fn not_run(spec: &LegSpec, why: String) -> LegRecord {
    LegRecord {
        not_run: Some(why),
        ..LegRecord::new(spec)
    }
}

/// A leg that was never started: the idle check refused it (`idle`), or the run was
/// interrupted before it (`interrupted`).
fn not_started(spec: &LegSpec, kind: &str, why: String) -> LegRecord {
    LegRecord {
        failure: Some(LegFailure {
            phase: Phase::Load,
            kind: kind.into(),
            message: why,
            stderr_tail: vec![],
        }),
        ..LegRecord::new(spec)
    }
}

struct Ctx<'a> {
    checked: &'a Checked,
    stem: &'a Path,
    plan: BatteryPlan,
    quiet: bool,
    lease: &'a Lease,
    idle: &'a dyn IdleCheck,
    legs: &'a LegOptions<'a>,
}

impl Ctx<'_> {
    fn spec(&self, leg: LegName, resize: Option<&Resize>, suffix: &str) -> LegSpec {
        LegSpec {
            lease_fd: Some(self.lease.fd()),
            ..leg_spec(
                self.checked,
                leg,
                self.stem,
                &self.lease.target,
                resize,
                suffix,
            )
        }
    }

    /// The idle check before a leg; Err(kind, why): the leg must not start.
    fn idle_ok(&self, leg: LegName, notes: &mut Vec<String>) -> Result<(), (&'static str, String)> {
        if let Some(sig) = interrupt::pending() {
            return Err((
                "interrupted",
                format!("the run was interrupted by {sig} before the {leg} leg started"),
            ));
        }
        match self.idle.check(self.lease) {
            Ok(s) => {
                notes.push(format!("before the {leg} leg: {s}"));
                Ok(())
            }
            Err(s) => {
                notes.push(format!("before the {leg} leg: refused: {s}"));
                Err(("idle", s))
            }
        }
    }

    /// The host probe, timed just before a leg starts.
    fn probe(&self, leg: LegName) -> host_probe::HostProbe {
        let p = host_probe::probe();
        if !self.quiet {
            sayln!("[{leg}] {}", p.sentence());
        }
        p
    }

    /// The battery and, when it completed, the verify phase; then the shutdown.
    async fn battery_verify_shutdown(&self, run: &mut LegRun) {
        if !run.failed() && run.run_battery(&self.plan).await {
            let plan = (self.legs.verify)(&run.record);
            run.verify(&plan).await;
        }
        run.shutdown().await;
    }

    async fn full_leg(&self, leg: LegName, notes: &mut Vec<String>) -> LegRecord {
        let spec = self.spec(leg, None, "");
        if let Err((kind, why)) = self.idle_ok(leg, notes) {
            return not_started(&spec, kind, why);
        }
        let probe = self.probe(leg);
        let wd = &self.checked.unit.config.watchdog;
        let mut run = LegRun::spawn(&spec, wd, self.quiet);
        run.record.host_probe = Some(probe);
        run.load().await;
        self.battery_verify_shutdown(&mut run).await;
        run.into_record()
    }

    /// The second leg: load, and if its pool differs from the first leg's, restart it sized to
    /// match (once), then the battery.
    async fn resizable_leg(
        &self,
        leg: LegName,
        target: Option<&Kv>,
        notes: &mut Vec<String>,
    ) -> (LegRecord, Option<String>) {
        let spec = self.spec(leg, None, "");
        if let Err((kind, why)) = self.idle_ok(leg, notes) {
            return (not_started(&spec, kind, why), None);
        }
        let unit = &self.checked.unit.config;
        let wd = &unit.watchdog;
        let probe = self.probe(leg);
        let mut run = LegRun::spawn(&spec, wd, self.quiet);
        run.record.host_probe = Some(probe.clone());
        let mut resize_note = None;
        if run.load().await {
            let mine = run.ready().and_then(|r| r.kv.clone());
            if let (Some(t), Some(m)) = (target, mine) {
                if !m.within(t, unit.gates.kv_tolerance_blocks) && interrupt::pending().is_none() {
                    let resize = Resize {
                        blocks: blocks_for(t.tokens(), m.tokens_per_block()),
                        option: m.resize_option().map(str::to_string),
                    };
                    let note = resize_note_for(leg, &resize, &m, t);
                    if !self.quiet {
                        sayln!("[{leg}] kv: {note}");
                    }
                    resize_note = Some(note.clone());
                    if leg == LegName::Engine || resize.option.is_some() {
                        let prior = run.stop_for_restart(note).await;
                        let spec2 = self.spec(leg, Some(&resize), "-resized");
                        run = LegRun::spawn(&spec2, wd, self.quiet);
                        run.record.host_probe = Some(probe.clone());
                        run.record.prior_starts.push(prior);
                        run.load().await;
                    }
                }
            }
        }
        self.battery_verify_shutdown(&mut run).await;
        (run.into_record(), resize_note)
    }

    async fn legs(&self) -> Pair {
        let kv_match = self.checked.unit.config.gates.kv_match;
        let mut notes = vec![];
        // The leg that gets resized runs second, once the other's pool is known.
        let (first, second) = match kv_match {
            KvMatch::Oracle => (LegName::Engine, LegName::Oracle),
            KvMatch::Engine | KvMatch::Off => (LegName::Oracle, LegName::Engine),
        };
        let runs = |leg: LegName| match leg {
            LegName::Engine => self.legs.legs.engine(),
            LegName::Oracle => self.legs.legs.oracle(),
        };
        let absent = |leg: LegName| not_run(&self.spec(leg, None, ""), self.legs.legs.why_not());
        let a = if runs(first) {
            self.full_leg(first, &mut notes).await
        } else {
            absent(first)
        };
        let target = if kv_match == KvMatch::Off {
            None
        } else {
            a.ready.as_ref().and_then(|r| r.kv.clone())
        };
        let (b, kv_resize) = if runs(second) {
            self.resizable_leg(second, target.as_ref(), &mut notes)
                .await
        } else {
            (absent(second), None)
        };
        let (engine, oracle) = if first == LegName::Engine {
            (a, b)
        } else {
            (b, a)
        };
        // Interrupted only if a leg was: a signal after the last leg's end is the run's to judge.
        let stopped = [&engine, &oracle]
            .iter()
            .any(|l| l.failure.as_ref().is_some_and(|f| f.kind == "interrupted"));
        Pair {
            engine,
            oracle,
            kv_resize,
            idle_checks: notes,
            lease: self.lease.target.clone(),
            lease_path: self.lease.path.clone(),
            neighbours: vec![],
            interrupted: interrupt::pending().filter(|_| stopped),
        }
    }
}

/// The resize in words: which leg restarts with what (or why it cannot), and why.
fn resize_note_for(leg: LegName, resize: &Resize, mine: &Kv, target: &Kv) -> String {
    let blocks = resize.blocks;
    let (other, first) = match leg {
        LegName::Engine => (LegName::Oracle, format!("restarting the engine with --num-blocks {blocks}")),
        LegName::Oracle => match &resize.option {
            Some(o) => (LegName::Engine, format!("restarting the oracle with {o} = {blocks}")),
            None => (
                LegName::Engine,
                "trying to restart the oracle, whose ready.kv names no resize_option (the option that sizes its pool), so it was not restarted".into(),
            ),
        },
    };
    format!(
        "{first} (it first held {}; the {other} holds {} tokens)",
        mine.describe(),
        target.tokens()
    )
}
