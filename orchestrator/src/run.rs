//! `orchestrator run`: preflight, lease, both legs (with the kv gate's resize), gates, record,
//! table. Returns the exit status: 0 every gate passed, 1 a record with refusals, 2 nothing
//! measured.

use std::path::{Path, PathBuf};
use std::time::SystemTime;

use crate::gates::clock;
use crate::gates::idle::GpuIdleCheck;
use crate::gates::{self, kv, GateInput};
use crate::legs::lease::{IdleCheck, Lease, LeaseTarget};
use crate::legs::leg::{BatteryPlan, LegFailure, LegName, LegRecord, LegRun, LegSpec};
use crate::legs::sampler::SamplerSpec;
use crate::legs::watchdog::Phase;
use crate::numbers::axes as table;
use crate::numbers::noise::{self, LegNoise};
use crate::numbers::timing::Timings;
use crate::record::{
    self, BinaryInfo, HostInfo, LeaseInfo, LegTimings, Legs, ProjectInfo, Record, UnitInfo,
};
use crate::render::table as render_table;
use crate::unit::preflight::{self, Checked};
use crate::unit::{KvMatch, OracleBackend, Unit};

#[derive(Debug, Clone, Default)]
pub struct RunOptions {
    /// Default: <project root>/reports/records.
    pub records_dir: Option<PathBuf>,
    /// Default: [lease] lock_dir.
    pub lock_dir: Option<PathBuf>,
    pub no_wait: bool,
    pub python: Option<String>,
    pub quiet: bool,
}

pub const EXIT_PASS: i32 = 0;
pub const EXIT_REFUSED: i32 = 1;
pub const EXIT_ERROR: i32 = 2;

/// The engine's argv; `num_blocks` overrides the unit's pool size (the kv gate's resize).
pub fn engine_argv(unit: &Unit, binary: &Path, num_blocks: Option<u64>) -> Vec<String> {
    let e = &unit.config.engine;
    let mut v = vec![
        binary.display().to_string(),
        "serve".into(),
        "--model".into(),
        unit.model_dir().display().to_string(),
        "--device".into(),
        e.device.clone(),
    ];
    if let Some(b) = e.block_size {
        v.extend(["--block-size".into(), b.to_string()]);
    }
    match (num_blocks.or(e.num_blocks), e.kv_cache_memory) {
        (Some(n), _) => v.extend(["--num-blocks".into(), n.to_string()]),
        (None, Some(bytes)) => v.extend(["--kv-cache-memory".into(), bytes.to_string()]),
        (None, None) => {}
    }
    if let Some(m) = e.max_batch {
        v.extend(["--max-batch".into(), m.to_string()]);
    }
    v.extend(e.args.iter().cloned());
    v
}

/// The oracle's argv: `[oracle.options]` snake_case keys become `--kebab-case VALUE` flags (a
/// true boolean a bare flag, false omitted), as `python -m oracle serve --help` lists them.
pub fn oracle_argv(unit: &Unit, python: &str, blocks_override: Option<u64>) -> Vec<String> {
    let o = &unit.config.oracle;
    let mut v = vec![
        python.to_string(),
        "-m".into(),
        "oracle".into(),
        "serve".into(),
        "--backend".into(),
        o.backend.as_str().into(),
        "--model".into(),
        unit.model_dir().display().to_string(),
        "--device".into(),
        o.device.clone(),
        "--dtype".into(),
        o.dtype.clone(),
    ];
    let mut opts = o.options.clone();
    if let Some(n) = blocks_override {
        opts.insert(
            "num_gpu_blocks_override".into(),
            toml::Value::Integer(n as i64),
        );
    }
    for (k, val) in &opts {
        let flag = format!("--{}", k.replace('_', "-"));
        match val {
            toml::Value::Boolean(true) => v.push(flag),
            toml::Value::Boolean(false) => {}
            toml::Value::String(s) => v.extend([flag, s.clone()]),
            other => v.extend([flag, other.to_string()]),
        }
    }
    v
}

fn lease_target(unit: &Unit) -> LeaseTarget {
    if let Some(n) = unit.config.lease.gpu {
        return LeaseTarget::Gpu(n);
    }
    match crate::unit::parse_device(&unit.config.engine.device) {
        Ok(Some(n)) => LeaseTarget::Gpu(n),
        _ => LeaseTarget::Cpu,
    }
}

/// A leg that was never started (the idle check refused it).
fn not_started(spec: &LegSpec, why: String) -> LegRecord {
    LegRecord {
        failure: Some(LegFailure {
            phase: Phase::Load,
            kind: "idle".into(),
            message: why,
            stderr_tail: vec![],
        }),
        ..LegRecord::new(spec)
    }
}

struct Legs2 {
    engine: LegRecord,
    oracle: LegRecord,
    kv_resize: Option<String>,
    idle_checks: Vec<String>,
}

struct Ctx<'a> {
    checked: &'a Checked,
    stem: &'a Path,
    plan: BatteryPlan,
    quiet: bool,
    lease: &'a Lease,
    idle: &'a dyn IdleCheck,
}

impl Ctx<'_> {
    fn spec(&self, leg: LegName, resize: Option<u64>, suffix: &str) -> LegSpec {
        let c = self.checked;
        let argv = match leg {
            LegName::Engine => engine_argv(&c.unit, &c.engine_binary, resize),
            LegName::Oracle => oracle_argv(&c.unit, &c.python, resize),
        };
        let mut log = self.stem.as_os_str().to_owned();
        log.push(format!(".{leg}{suffix}.log"));
        let mut series = self.stem.as_os_str().to_owned();
        series.push(format!(".{leg}{suffix}.samples.jsonl"));
        let sc = &c.unit.config.sampler;
        let sampler = SamplerSpec {
            gpu: match self.lease.target {
                LeaseTarget::Gpu(n) => Some(n),
                LeaseTarget::Cpu => None,
            },
            nvml_period_ms: sc.nvml_period_ms,
            host_period_ms: sc.host_period_ms,
            series: Some(PathBuf::from(series)),
        };
        let mut env = vec![(
            "PYTHONPATH".to_string(),
            preflight::pythonpath(&c.project_root),
        )];
        // vLLM takes "the visible GPU": make that the leased one. (The engine names its GPU in
        // --device cuda:N, which a narrowed CUDA_VISIBLE_DEVICES would renumber.)
        if let (LegName::Oracle, OracleBackend::Vllm, LeaseTarget::Gpu(n)) =
            (leg, c.unit.config.oracle.backend, &self.lease.target)
        {
            env.push(("CUDA_VISIBLE_DEVICES".into(), n.to_string()));
        }
        LegSpec {
            leg,
            argv,
            cwd: c.project_root.clone(),
            env,
            log_path: PathBuf::from(log),
            sampler,
        }
    }

    /// The idle check before a leg; Err: the leg must not start.
    fn idle_ok(&self, leg: LegName, notes: &mut Vec<String>) -> Result<(), String> {
        match self.idle.check(self.lease) {
            Ok(s) => {
                notes.push(format!("before the {leg} leg: {s}"));
                Ok(())
            }
            Err(s) => {
                notes.push(format!("before the {leg} leg: refused: {s}"));
                Err(s)
            }
        }
    }

    async fn full_leg(&self, leg: LegName, notes: &mut Vec<String>) -> LegRecord {
        let spec = self.spec(leg, None, "");
        if let Err(why) = self.idle_ok(leg, notes) {
            return not_started(&spec, why);
        }
        let wd = &self.checked.unit.config.watchdog;
        let mut run = LegRun::spawn(&spec, wd, self.quiet);
        if run.load().await {
            run.run_battery(&self.plan).await;
        }
        run.shutdown().await;
        run.into_record()
    }

    /// The second leg: load, and if its pool differs from the first leg's, restart it sized to
    /// match (once), then the battery.
    async fn resizable_leg(
        &self,
        leg: LegName,
        target: Option<&crate::legs::protocol::Kv>,
        notes: &mut Vec<String>,
    ) -> (LegRecord, Option<String>) {
        let spec = self.spec(leg, None, "");
        if let Err(why) = self.idle_ok(leg, notes) {
            return (not_started(&spec, why), None);
        }
        let unit = &self.checked.unit.config;
        let wd = &unit.watchdog;
        let mut run = LegRun::spawn(&spec, wd, self.quiet);
        let mut resize_note = None;
        if run.load().await {
            let mine = run.ready().and_then(|r| r.kv.clone());
            if let (Some(t), Some(m)) = (target, mine) {
                if !kv::matched(t, &m, unit.gates.kv_tolerance_blocks) {
                    let blocks = kv::blocks_for(t.capacity_tokens, m.block_size);
                    let (how, flag) = match leg {
                        LegName::Engine => ("the engine", format!("--num-blocks {blocks}")),
                        LegName::Oracle => {
                            ("the oracle", format!("num_gpu_blocks_override = {blocks}"))
                        }
                    };
                    let other = match leg {
                        LegName::Engine => LegName::Oracle,
                        LegName::Oracle => LegName::Engine,
                    };
                    let note = format!(
                        "restarting {how} with {flag} (it first held {} tokens in {} blocks of {}; the {other} holds {} tokens)",
                        m.capacity_tokens, m.num_blocks, m.block_size, t.capacity_tokens
                    );
                    if !self.quiet {
                        eprintln!("[{leg}] kv: {note}");
                    }
                    let prior = run.stop_for_restart(note.clone()).await;
                    let spec2 = self.spec(leg, Some(blocks), "-resized");
                    run = LegRun::spawn(&spec2, wd, self.quiet);
                    run.record.prior_starts.push(prior);
                    resize_note = Some(note);
                    run.load().await;
                }
            }
        }
        if !run.failed() {
            run.run_battery(&self.plan).await;
        }
        run.shutdown().await;
        (run.into_record(), resize_note)
    }

    async fn legs(&self) -> Legs2 {
        let kv_match = self.checked.unit.config.gates.kv_match;
        let mut notes = vec![];
        // The leg that gets resized runs second, once the other's pool is known.
        let (first, second) = match kv_match {
            KvMatch::Oracle => (LegName::Engine, LegName::Oracle),
            KvMatch::Engine | KvMatch::Off => (LegName::Oracle, LegName::Engine),
        };
        let a = self.full_leg(first, &mut notes).await;
        let target = if kv_match == KvMatch::Off {
            None
        } else {
            a.ready.as_ref().and_then(|r| r.kv.clone())
        };
        let (b, kv_resize) = self
            .resizable_leg(second, target.as_ref(), &mut notes)
            .await;
        let (engine, oracle) = if first == LegName::Engine {
            (a, b)
        } else {
            (b, a)
        };
        Legs2 {
            engine,
            oracle,
            kv_resize,
            idle_checks: notes,
        }
    }
}

/// Resolves on SIGINT or SIGTERM with the signal's name (never, if handlers cannot be installed).
async fn interrupted() -> &'static str {
    use tokio::signal::unix::{signal, SignalKind};
    let (Ok(mut int), Ok(mut term)) = (
        signal(SignalKind::interrupt()),
        signal(SignalKind::terminate()),
    ) else {
        return std::future::pending().await;
    };
    tokio::select! {
        _ = int.recv() => "SIGINT",
        _ = term.recv() => "SIGTERM",
    }
}

pub fn run(unit_path: &Path, opts: &RunOptions) -> i32 {
    let (report, checked) = preflight::preflight(unit_path, opts.python.as_deref(), !opts.quiet);
    let Some(checked) = checked else {
        eprintln!("orchestrator: preflight failed, nothing was run:");
        for f in &report.failures {
            eprintln!("  {f}");
        }
        return EXIT_ERROR;
    };
    let idle = GpuIdleCheck::nvml(checked.unit.config.lease.idle_max_used_mib);
    match run_checked(&checked, opts, &idle) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("orchestrator: {e}");
            EXIT_ERROR
        }
    }
}

/// The run after preflight; Err means nothing was recorded.
pub fn run_checked(
    checked: &Checked,
    opts: &RunOptions,
    idle: &dyn IdleCheck,
) -> Result<i32, String> {
    let unit = &checked.unit;
    let cfg = &unit.config;
    let project = ProjectInfo::read(&checked.project_root);
    let records_root = opts
        .records_dir
        .clone()
        .unwrap_or_else(|| checked.project_root.join("reports/records"));
    let dir = records_root.join(&cfg.name);
    std::fs::create_dir_all(&dir).map_err(|e| {
        format!(
            "cannot create the records directory {} ({e}); pass --records-dir a writable directory",
            dir.display()
        )
    })?;
    let created = SystemTime::now();
    let stem = record::choose_stem(&dir, &crate::util::time::utc_stamp(created), &project.tree);

    let lock_dir = opts
        .lock_dir
        .clone()
        .unwrap_or_else(|| cfg.lease.lock_dir.clone());
    let lease = Lease::acquire(
        lease_target(unit),
        &lock_dir,
        !opts.no_wait,
        &format!("orchestrator run {} ({})", cfg.name, unit.path.display()),
        opts.quiet,
    )
    .map_err(|e| e.to_string())?;
    if !opts.quiet {
        eprintln!(
            "[lease] holding the {} lease ({})",
            lease.target.name(),
            lease.path.display()
        );
    }

    let plan = BatteryPlan {
        prompts: checked.prompts.iter().map(|p| p.tokens.clone()).collect(),
        max_tokens: cfg.battery.max_tokens,
        ignore_eos: cfg.battery.ignore_eos,
        warmup: cfg.battery.warmup,
        repeat: cfg.battery.repeat,
        batch_sizes: cfg.battery.batch_sizes.clone(),
    };
    let ctx = Ctx {
        checked,
        stem: &stem,
        plan,
        quiet: opts.quiet,
        lease: &lease,
        idle,
    };
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| format!("cannot start the async runtime: {e}"))?;
    let legs = rt.block_on(async {
        tokio::select! {
            legs = ctx.legs() => Ok(legs),
            sig = interrupted() => Err(sig),
        }
    });
    drop(lease);
    let legs = legs.map_err(|sig| {
        let killed = crate::legs::watchdog::kill_live_groups();
        format!(
            "interrupted by {sig}: killed the running leg's process group(s) {killed:?}; no record was written"
        )
    })?;

    let ids: Vec<String> = checked.prompts.iter().map(|p| p.id.clone()).collect();
    let input = GateInput {
        unit,
        goldens: &checked.goldens,
        prompt_ids: &ids,
        engine: &legs.engine,
        oracle: &legs.oracle,
        kv_resize: legs.kv_resize.as_deref(),
    };
    let verdicts = gates::judge_all(&input);
    let te = Timings::from_leg(&legs.engine);
    let to = Timings::from_leg(&legs.oracle);
    let axes = table::axes(&legs.engine, &legs.oracle, &te, &to, &verdicts);
    let clock_explain = clock_explain(&legs.engine, &legs.oracle, &axes, &cfg.gates);
    let refusals: Vec<String> = verdicts
        .iter()
        .filter_map(|g| g.refusal().map(ToString::to_string))
        .collect();
    let measured = legs.engine.measured() || legs.oracle.measured();
    let code = if !measured {
        EXIT_ERROR
    } else if refusals.is_empty() {
        EXIT_PASS
    } else {
        EXIT_REFUSED
    };

    let json_path = PathBuf::from(format!("{}.json", stem.display()));
    // Records are committed and read on other machines: the files beside the record are named
    // relative to its directory, the unit and the engine binary relative to the project root.
    let root = &checked.project_root;
    let rec = Record {
        schema: record::SCHEMA,
        created_utc: crate::util::time::utc_now_iso(),
        orchestrator_version: env!("CARGO_PKG_VERSION").into(),
        command: std::env::args().collect(),
        unit: UnitInfo {
            name: cfg.name.clone(),
            path: relative(&unit.path, root),
            config: cfg.clone(),
        },
        project: project.clone(),
        engine_binary: BinaryInfo {
            path: relative(&checked.engine_binary, root),
            sha256: record::sha256_file(&checked.engine_binary),
        },
        host: {
            let mut h = HostInfo::read();
            h.gpu = [&legs.engine, &legs.oracle]
                .iter()
                .find_map(|l| l.sampler.gpu.as_ref())
                .and_then(|g| serde_json::to_value(g).ok());
            h
        },
        lease: LeaseInfo {
            target: lease_target(unit).name(),
            path: lock_dir.join(format!("{}.lock", lease_target(unit).name())),
            idle_checks: legs.idle_checks.clone(),
        },
        legs: Legs {
            engine: beside_record(&legs.engine, &dir),
            oracle: beside_record(&legs.oracle, &dir),
        },
        timings: LegTimings {
            engine: te,
            oracle: to,
        },
        gates: verdicts.clone(),
        kv_resize: legs.kv_resize.clone(),
        axes: axes.clone(),
        refusals: refusals.clone(),
        clock_explain: clock_explain.clone(),
        timeline: None,
        exit_status: code,
    };
    // The picture goes beside the record; the record names it, so it is drawn first.
    let svg_path = PathBuf::from(format!("{}.timeline.svg", stem.display()));
    let mut rec = rec;
    match crate::render::timeline::write(&svg_path, &[&legs.engine, &legs.oracle], &refusals) {
        Ok(()) => rec.timeline = Some(relative(&svg_path, &dir)),
        Err(e) => eprintln!(
            "orchestrator: cannot draw the timeline {} ({e}); the record is written without it",
            svg_path.display()
        ),
    }
    rec.write(&json_path)
        .map_err(|e| format!("cannot write the record {} ({e})", json_path.display()))?;

    let md_path = PathBuf::from(format!("{}.md", stem.display()));
    let md = markdown(&rec, &json_path);
    record::write_new_atomic(&md_path, md.as_bytes())
        .map_err(|e| format!("cannot write {} ({e})", md_path.display()))?;

    println!(
        "{} on tree {}{}: engine vs {} oracle",
        cfg.name,
        &project.tree[..project.tree.len().min(12)],
        if project.dirty {
            " (uncommitted files)"
        } else {
            ""
        },
        cfg.oracle.backend.as_str()
    );
    println!("{}", render_table::ratio_terminal(&axes));
    for g in &verdicts {
        let tag = match g.verdict {
            gates::Verdict::Pass { .. } => "pass",
            gates::Verdict::NotApplicable { .. } => "n/a ",
            gates::Verdict::Refused { .. } => "REFUSED",
        };
        let leg = g.leg.map(|l| format!(" ({l})")).unwrap_or_default();
        println!("{tag} {}{leg}: {}", g.gate, g.sentence);
    }
    for l in [&legs.engine, &legs.oracle] {
        println!("{}", sampler_line(l));
    }
    if let Some(x) = &clock_explain {
        println!("clock: {}", x.sentence);
    }
    for l in noise_lines(&rec) {
        println!("A/A noise: {l}");
    }
    for l in &rec.lease.idle_checks {
        println!("idle: {l}");
    }
    if !refusals.is_empty() {
        println!("\nRefusals ({}):", refusals.len());
        for r in &refusals {
            println!("- {r}");
        }
    }
    println!(
        "\nrecord: {}\ntable:  {}",
        json_path.display(),
        md_path.display()
    );
    if let Some(t) = &rec.timeline {
        println!("timeline: {}", dir.join(t).display());
    }
    Ok(code)
}

/// `p` relative to `base` when it lies under it, else unchanged.
fn relative(p: &Path, base: &Path) -> PathBuf {
    p.strip_prefix(base)
        .map(Path::to_path_buf)
        .unwrap_or_else(|_| p.to_path_buf())
}

/// The leg as the record keeps it: its log and series files named relative to the record's
/// directory (they lie beside it).
fn beside_record(l: &LegRecord, dir: &Path) -> LegRecord {
    let mut l = l.clone();
    l.log = relative(&l.log, dir);
    l.sampler.series = l.sampler.series.map(|p| relative(&p, dir));
    for p in &mut l.prior_starts {
        p.log = relative(&p.log, dir);
        p.sampler.series = p.sampler.series.take().map(|s| relative(&s, dir));
    }
    l
}

/// Each leg's A/A noise (the spread of its repeats), then whether the per-token gap beats it.
pub fn noise_lines(rec: &Record) -> Vec<String> {
    let e = LegNoise::of(&rec.timings.engine);
    let o = LegNoise::of(&rec.timings.oracle);
    let ratio = rec
        .axes
        .iter()
        .find(|x| x.axis.starts_with("per output token"))
        .and_then(|x| x.ratio);
    let mut v = vec![e.sentence("engine"), o.sentence("oracle")];
    v.extend(noise::verdict(ratio, &e, &o).map(|s| format!("so {s}")));
    v
}

/// One line per leg: its sampler summary, or why there is none, and what sampling cost.
fn sampler_line(l: &LegRecord) -> String {
    let s = &l.sampler;
    let what = match (&s.summary, &s.no_gpu) {
        (Some(sum), _) => sum.to_string(),
        (None, Some(why)) => format!("no GPU data: {why}"),
        (None, None) => "not sampled".into(),
    };
    format!(
        "sampler ({}): {what}; boot {}; peak host memory {} MB; sampler cost {:.3} s CPU over {:.1} s ({:.2}% of one core){}",
        l.leg,
        s.boot_id.as_deref().unwrap_or("unknown"),
        l.host_mem.peak_rss_bytes / 1_000_000,
        s.cpu_s,
        s.wall_s,
        s.cpu_share * 100.0,
        s.series
            .as_ref()
            .map(|p| format!("; series {}", p.display()))
            .unwrap_or_default()
    )
}

/// What a clock offset could explain of the per-token ratio, when both legs have clocks.
fn clock_explain(
    engine: &LegRecord,
    oracle: &LegRecord,
    axes: &[table::Axis],
    gates: &crate::unit::GatesCfg,
) -> Option<clock::ClockExplain> {
    let (a, b) = (
        engine.sampler.summary.as_ref()?,
        oracle.sampler.summary.as_ref()?,
    );
    let off = clock::median_offset_pct(a, b)?;
    let ratio = axes
        .iter()
        .find(|x| x.axis.starts_with("per output token"))
        .and_then(|x| x.ratio);
    Some(clock::explain(off, gates.clock_basis, ratio))
}

fn markdown(rec: &Record, json_path: &Path) -> String {
    let mut s = format!(
        "# {}: engine vs {} oracle\n\nTree `{}`{}, commit `{}`, host {} ({}, {} cores). Record: `{}`.\n\n",
        rec.unit.name,
        rec.unit.config.oracle.backend.as_str(),
        rec.project.tree,
        if rec.project.dirty { " (uncommitted files: the tree is theirs)" } else { "" },
        rec.project.commit,
        rec.host.hostname,
        rec.host.cpu_model,
        rec.host.cores,
        json_path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default()
    );
    s.push_str(&render_table::ratio_markdown(&rec.axes));
    if let Some(t) = &rec.timeline {
        let name = t
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        s.push_str(&format!(
            "\n![timeline: SM clock and utilization of both legs]({name})\n"
        ));
    }
    s.push_str("\n## GPU and host sampling\n\n");
    for l in [&rec.legs.engine, &rec.legs.oracle] {
        s.push_str(&format!("- {}\n", sampler_line(l)));
    }
    if let Some(x) = &rec.clock_explain {
        s.push_str(&format!("- clock: {}\n", x.sentence));
    }
    s.push_str("\n## A/A noise (each leg's spread over its repeats)\n\n");
    for l in noise_lines(rec) {
        s.push_str(&format!("- {l}\n"));
    }
    s.push_str("\n## Idle checks (before each leg)\n\n");
    if rec.lease.idle_checks.is_empty() {
        s.push_str("- none recorded\n");
    }
    for l in &rec.lease.idle_checks {
        s.push_str(&format!("- {}\n", l.replace('\n', " ")));
    }
    s.push_str("\n## Gates\n\n");
    for g in &rec.gates {
        let tag = match g.verdict {
            gates::Verdict::Pass { .. } => "pass",
            gates::Verdict::NotApplicable { .. } => "not applicable",
            gates::Verdict::Refused { .. } => "**REFUSED**",
        };
        let leg = g.leg.map(|l| format!(" ({l})")).unwrap_or_default();
        s.push_str(&format!(
            "- {tag}, {}{leg}: {}\n",
            g.gate,
            g.sentence.replace('\n', " ")
        ));
    }
    let not_applicable = rec
        .gates
        .iter()
        .filter(|g| matches!(g.verdict, gates::Verdict::NotApplicable { .. }))
        .count();
    if rec.refusals.is_empty() && not_applicable > 0 {
        // Not applicable is not a pass: say what was not checked rather than "every gate passed".
        s.push_str(&format!(
            "\nNo gate refused; {not_applicable} verdict(s) above are not applicable, so what they check was not checked.\n"
        ));
    } else if rec.refusals.is_empty() {
        s.push_str("\nEvery gate passed: every number above is gated.\n");
    } else {
        s.push_str(&format!("\n## Refusals ({})\n\n", rec.refusals.len()));
        for r in &rec.refusals {
            s.push_str(&format!("- {}\n", r.replace('\n', " ")));
        }
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    const UNIT: &str = r#"
name = "t"
model = "model"
[battery]
prompts = "prompts.json"
[[golden]]
file = "golden.json"
[engine]
device = "cuda:1"
block_size = 16
kv_cache_memory = 1000000
[oracle]
backend = "vllm"
device = "cuda"
dtype = "bfloat16"
[oracle.options]
enforce_eager = true
seed = 0
gpu_memory_utilization = 0.3
attention_backend = "FLASH_ATTN"
"#;

    #[test]
    fn argv_follow_the_legs_command_lines() {
        let u = Unit::parse(Path::new("/u/unit.toml"), UNIT).unwrap();
        let e = engine_argv(&u, Path::new("/r/engine"), None).join(" ");
        assert_eq!(e, "/r/engine serve --model /u/model --device cuda:1 --block-size 16 --kv-cache-memory 1000000");
        // A kv resize replaces the byte budget by a block count.
        let e = engine_argv(&u, Path::new("/r/engine"), Some(40)).join(" ");
        assert!(e.ends_with("--block-size 16 --num-blocks 40"), "{e}");
        let o = oracle_argv(&u, "py", Some(99)).join(" ");
        assert_eq!(
            o,
            "py -m oracle serve --backend vllm --model /u/model --device cuda --dtype bfloat16 \
             --attention-backend FLASH_ATTN --enforce-eager --gpu-memory-utilization 0.3 \
             --num-gpu-blocks-override 99 --seed 0"
        );
        assert_eq!(lease_target(&u), LeaseTarget::Gpu(1));
    }
}
