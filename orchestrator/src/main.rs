// A closed stdout or stderr must never panic a command: every line goes through util/term.rs.
#![deny(clippy::print_stdout, clippy::print_stderr)]

use clap::{Parser, Subcommand};
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use orchestrator::clock::{self, Said};
use orchestrator::compare;
use orchestrator::fleet;
use orchestrator::gates::clock::ClockCfg;
use orchestrator::gates::idle::GpuIdleCheck;
use orchestrator::legs::lease::{self, LeaseTarget};
use orchestrator::numbers::regress::{self, Thresholds};
use orchestrator::render;
use orchestrator::report;
use orchestrator::run::{self, RunOptions};
use orchestrator::unit::{preflight, LegChoice};
use orchestrator::util::term::{out, outln, sayln};

/// Runs the engine and an oracle over one unit, gates the result, writes a record and a table.
#[derive(Parser)]
#[command(name = "orchestrator", version)]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Preflight, lease, both legs, gates, record and table.
    /// Exit 0: every gate passed; 1: record written with refusals; 2: nothing measured.
    Run {
        /// goldens/<unit>/unit.toml
        unit: PathBuf,
        /// Where records go (default <project root>/reports/records); <dir>/<unit>/ is used.
        #[arg(long)]
        records_dir: Option<PathBuf>,
        /// Lock directory for the lease (default [lease] lock_dir, /tmp/llm-bench-locks).
        #[arg(long)]
        lock_dir: Option<PathBuf>,
        /// Fail at once if the lease is held, instead of waiting.
        #[arg(long)]
        no_wait: bool,
        /// Interpreter for the oracle (default env LLM_BENCH_PYTHON, then [oracle] python).
        #[arg(long)]
        python: Option<String>,
        /// No progress lines on stderr.
        #[arg(long, short)]
        quiet: bool,
        /// Which legs to run: "engine", "oracle" or "both". With one, the gates that need the
        /// other say "not applicable" and why (a planted-fault run needs only the engine).
        #[arg(long, default_value = "both", value_parser = LegChoice::parse)]
        legs: LegChoice,
        /// Timed passes over the battery, instead of the unit's [battery] repeat (the record's
        /// unit configuration says what ran; `compare` refuses records that differ in it).
        #[arg(long)]
        repeat: Option<u32>,
        /// Untimed warm-up passes, instead of the unit's [battery] warmup.
        #[arg(long)]
        warmup: Option<u32>,
        /// Run a GPU unit on GPU N of this host: its engine's cuda:N, its lease, its sampler
        /// (as `fleet` places units; docs/FLEET.md).
        #[arg(long)]
        gpu: Option<u32>,
    },
    /// Preflight alone: unit, prompts, model, goldens, engine binary, `python -m oracle check`.
    Check {
        unit: PathBuf,
        #[arg(long)]
        python: Option<String>,
    },
    /// Writes BENCHMARKS.md (and charts/<unit>.svg beside it) from the records alone.
    /// Exit 0: written from every record; 1: written, but some files were not records it can
    /// read (each named); 2: nothing written.
    Report {
        /// Default <project root>/reports/records.
        #[arg(long)]
        records_dir: Option<PathBuf>,
        /// Default <project root>/reports/BENCHMARKS.md.
        #[arg(long)]
        out: Option<PathBuf>,
    },
    /// Did HEAD make us slower than BASE? Each of BASE and HEAD is a record file, a tree-hash
    /// prefix (its latest record per unit), `latest` or `previous` (per unit, the latest record
    /// of the tree before the latest one's). Exit 0: nothing gated regressed; 1: something
    /// gated is SLOWER; 2: error, or records that are not like-for-like (docs/REPORT.md).
    Compare {
        base: String,
        head: String,
        /// Default <project root>/reports/records.
        #[arg(long)]
        records_dir: Option<PathBuf>,
        /// Smallest change of a median, in percent, called FASTER or SLOWER.
        #[arg(long, default_value_t = 3.0)]
        min_effect_pct: f64,
        /// Mann-Whitney p-value below which a change is significant.
        #[arg(long, default_value_t = 0.05)]
        alpha: f64,
        /// Compare records from different GPUs, drivers, oracle versions or unit configurations.
        #[arg(long)]
        allow_different_hosts: bool,
        #[arg(long, value_enum, default_value_t = Format::Table)]
        format: Format,
    },
    /// Many units at once, each one `run` on one GPU (or on the CPU): through Slurm (a job array
    /// and a report job after it) or on this host's GPUs, one unit per free GPU (docs/FLEET.md).
    /// Exit with --slurm: 0 printed or submitted, 2 refused; with --local: the worst of its
    /// runs' statuses (0, 1, 2).
    Fleet(FleetArgs),
    /// Runs CMD under the same lease as `run`; its exit status is passed through.
    Lease {
        /// GPU index to lease (default: GPU 0 if the machine has one, else the "cpu" lease).
        #[arg(long)]
        gpu: Option<u32>,
        #[arg(long, default_value = "/tmp/llm-bench-locks")]
        lock_dir: PathBuf,
        #[arg(long)]
        no_wait: bool,
        /// The idle gate's ceiling on GPU memory in use before the job (MiB).
        #[arg(long, default_value_t = 1024)]
        idle_max_used_mib: u64,
        #[arg(last = true, required = true)]
        command: Vec<String>,
    },
    /// The GPU clock state on its own: sample a GPU, or judge two saved series with the clock gate.
    Clock {
        #[command(subcommand)]
        cmd: ClockCmd,
    },
    /// The planted-fault evidence (scripts/fault-table.sh runs these around the runs).
    Faults {
        #[command(subcommand)]
        cmd: FaultsCmd,
    },
}

#[derive(Subcommand)]
enum FaultsCmd {
    /// The engine faults (ENGINE_FAULT) that apply to a unit, each with why; the last line
    /// lists them, comma-separated. Exit 2 when the unit or its model cannot be read.
    Plan { unit: PathBuf },
    /// The fault table from the records of engine-only runs under DIR (one clean run and one
    /// per fault, per unit), in Markdown. Exit 0: every fault that changed the model refused and
    /// every clean leg passed; 1: otherwise; 2: no record.
    Table {
        dir: PathBuf,
        /// Also write the table to this file.
        #[arg(long)]
        out: Option<PathBuf>,
    },
}

/// `orchestrator fleet`'s arguments.
#[derive(clap::Args)]
struct FleetArgs {
    /// goldens/<unit>/unit.toml, one or more.
    #[arg(required = true)]
    units: Vec<PathBuf>,
    /// Print an sbatch script per job (a job array per kind of unit, then a report job).
    #[arg(long, required_unless_present = "local", conflicts_with = "local")]
    slurm: bool,
    /// Run the units here, in parallel, one per free GPU of this host.
    #[arg(long)]
    local: bool,
    /// Submit the jobs (sbatch --parsable) and print their ids, instead of printing the scripts.
    #[arg(long, requires = "slurm")]
    submit: bool,
    #[arg(long, requires = "slurm")]
    partition: Option<String>,
    #[arg(long, requires = "slurm")]
    account: Option<String>,
    /// Each job's time limit, as sbatch takes it (1:00:00).
    #[arg(long, requires = "slurm")]
    time: Option<String>,
    /// The shared records directory (default <project root>/reports/records).
    #[arg(long)]
    records_dir: Option<PathBuf>,
    /// The report job's BENCHMARKS.md (default: beside the records directory).
    #[arg(long, requires = "slurm")]
    out: Option<PathBuf>,
    /// Runs of each unit.
    #[arg(long, default_value_t = 1)]
    repeat: u32,
    /// The GPUs to place on, as 0,1,3 (default: every GPU NVML counts).
    #[arg(long, requires = "local")]
    gpus: Option<String>,
    /// Lock directory for the leases (default each unit's [lease] lock_dir).
    #[arg(long)]
    lock_dir: Option<PathBuf>,
    /// Interpreter for the oracle (default env LLM_BENCH_PYTHON, then [oracle] python).
    #[arg(long)]
    python: Option<String>,
}

#[derive(Subcommand)]
enum ClockCmd {
    /// Samples the GPU (every process on it) for S seconds into a series file (JSON lines,
    /// gzip-compressed when it ends in .gz) and prints its summary. Observes only. Exit 2 when
    /// there is no GPU to sample.
    Sample {
        #[arg(long)]
        seconds: f64,
        #[arg(long, default_value_t = 0)]
        gpu: u32,
        #[arg(long)]
        out: PathBuf,
        /// NVML poll period.
        #[arg(long, default_value_t = 20)]
        period_ms: u64,
    },
    /// The clock gate on two series (from `clock sample` or a run's
    /// <stem>.<leg>.samples.jsonl.gz, .jsonl in older records), with the default thresholds. Exit 0: comparable; 1: one reason per line; 2: unreadable or
    /// no GPU data.
    Compare {
        a: PathBuf,
        b: PathBuf,
        /// Points of per-token time per point of SM clock (as [gates] clock_basis).
        #[arg(long, default_value_t = 1.0)]
        basis: f64,
    },
}

#[derive(Clone, Copy, clap::ValueEnum)]
enum Format {
    Table,
    Json,
    Markdown,
}

/// reports/<leaf> under the project root holding the working directory (else under it).
fn reports_path(leaf: &str) -> PathBuf {
    let cwd = std::env::current_dir().unwrap_or_else(|_| PathBuf::from("."));
    orchestrator::util::git::project_root(&cwd)
        .unwrap_or(cwd)
        .join("reports")
        .join(leaf)
}

fn code(c: i32) -> ExitCode {
    ExitCode::from(c.clamp(0, 255) as u8)
}

/// A clock command's stdout and exit status, or its error on stderr and exit 2.
fn said(what: &str, r: Result<Said, String>) -> ExitCode {
    match r {
        Ok(s) => {
            out!("{}", s.out);
            code(s.exit)
        }
        Err(e) => {
            sayln!("orchestrator {what}: {e}");
            code(2)
        }
    }
}

fn run_cmd(unit: &Path, opts: &RunOptions) -> ExitCode {
    orchestrator::util::interrupt::install();
    match run::run(unit, opts) {
        Ok(o) => {
            for w in &o.warnings {
                sayln!("orchestrator: {w}");
            }
            out!("{}", o.summary);
            // A signal while the summary was printed counts as one after the record was
            // written (run/files.rs said_interrupted looked last before it); one after this
            // last look ends the process in the handler, with the same words.
            orchestrator::util::interrupt::finishing();
            let late = o.exit_status != run::EXIT_ERROR
                && orchestrator::util::interrupt::pending().inspect(|sig| {
                    sayln!(
                        "orchestrator: interrupted by {sig} after the record was written; exit status 2"
                    )
                })
                .is_some();
            code(if late { run::EXIT_ERROR } else { o.exit_status })
        }
        Err(e) => {
            sayln!("orchestrator: {e}");
            code(run::EXIT_ERROR)
        }
    }
}

fn fleet_cmd(a: FleetArgs) -> fleet::FleetCmd {
    fleet::FleetCmd {
        units: a.units,
        slurm: a.slurm,
        submit: a.submit,
        partition: a.partition,
        account: a.account,
        time: a.time,
        records_dir: a.records_dir,
        out: a.out,
        repeat: a.repeat,
        gpus: a.gpus,
        lock_dir: a.lock_dir,
        python: a.python,
    }
}

fn check_cmd(unit: &Path, python: Option<&str>) -> ExitCode {
    orchestrator::util::interrupt::install();
    let (report, checked) = preflight::preflight(unit, python, false);
    for l in &report.lines {
        outln!("{l}");
    }
    if checked.is_some() {
        outln!("preflight passed: {}", unit.display());
        code(0)
    } else {
        outln!(
            "preflight FAILED: {} check(s) failed",
            report.failures.len()
        );
        code(run::EXIT_ERROR)
    }
}

fn report_cmd(records: &Path, out: &Path) -> ExitCode {
    match report::report(records, out) {
        Ok(o) => {
            for p in &o.written {
                outln!("wrote {}", p.display());
            }
            for p in &o.removed {
                outln!(
                    "removed {} (a chart these records no longer draw)",
                    p.display()
                );
            }
            for r in &o.rejected {
                sayln!("orchestrator report: {r}");
            }
            code(if o.rejected.is_empty() { 0 } else { 1 })
        }
        Err(e) => {
            sayln!("orchestrator report: {e}");
            code(2)
        }
    }
}

fn compare_cmd(
    base: &str,
    head: &str,
    records: &Path,
    t: &Thresholds,
    allow: bool,
    format: Format,
) -> ExitCode {
    let (rejected, result) = compare::run(base, head, records, t, allow);
    for r in &rejected {
        sayln!("orchestrator compare: {r}");
    }
    match result {
        Ok(c) => {
            match format {
                Format::Table => out!("{}", render::compare::terminal(&c)),
                Format::Markdown => out!("{}", render::compare::markdown(&c)),
                Format::Json => outln!(
                    "{}",
                    serde_json::to_string_pretty(&c).expect("a comparison serializes")
                ),
            }
            code(c.exit_status)
        }
        Err(e) => {
            sayln!("orchestrator compare: {e}");
            code(regress::EXIT_ERROR)
        }
    }
}

fn faults_cmd(cmd: FaultsCmd) -> ExitCode {
    use orchestrator::faults;
    let r = match &cmd {
        FaultsCmd::Plan { unit } => faults::plan_command(unit),
        FaultsCmd::Table { dir, out } => faults::table(dir).and_then(|s| match out {
            Some(p) => std::fs::write(p, &s.out)
                .map(|()| s)
                .map_err(|e| format!("cannot write {} ({e})", p.display())),
            None => Ok(s),
        }),
    };
    match r {
        Ok(s) => {
            out!("{}", s.out);
            code(s.exit)
        }
        Err(e) => {
            sayln!("orchestrator faults: {e}");
            code(2)
        }
    }
}

fn main() -> ExitCode {
    match Cli::parse().cmd {
        Cmd::Run {
            unit,
            records_dir,
            lock_dir,
            no_wait,
            python,
            quiet,
            legs,
            repeat,
            warmup,
            gpu,
        } => run_cmd(
            &unit,
            &RunOptions {
                records_dir,
                lock_dir,
                no_wait,
                python,
                quiet,
                legs,
                repeat,
                warmup,
                gpu,
            },
        ),
        Cmd::Fleet(a) => code(fleet::command(&fleet_cmd(a))),
        Cmd::Check { unit, python } => check_cmd(&unit, python.as_deref()),
        Cmd::Report { records_dir, out } => report_cmd(
            &records_dir.unwrap_or_else(|| reports_path("records")),
            &out.unwrap_or_else(|| reports_path("BENCHMARKS.md")),
        ),
        Cmd::Compare {
            base,
            head,
            records_dir,
            min_effect_pct,
            alpha,
            allow_different_hosts,
            format,
        } => compare_cmd(
            &base,
            &head,
            &records_dir.unwrap_or_else(|| reports_path("records")),
            &Thresholds {
                min_effect: min_effect_pct / 100.0,
                alpha,
                ..Thresholds::default()
            },
            allow_different_hosts,
            format,
        ),
        Cmd::Lease {
            gpu,
            lock_dir,
            no_wait,
            idle_max_used_mib,
            command,
        } => code(lease::run_job(
            LeaseTarget::choose(gpu),
            &lock_dir,
            !no_wait,
            &command,
            &GpuIdleCheck::nvml(idle_max_used_mib),
        )),
        Cmd::Clock {
            cmd:
                ClockCmd::Sample {
                    seconds,
                    gpu,
                    out,
                    period_ms,
                },
        } => said("clock sample", clock::sample(seconds, gpu, &out, period_ms)),
        Cmd::Faults { cmd } => faults_cmd(cmd),
        Cmd::Clock {
            cmd: ClockCmd::Compare { a, b, basis },
        } => said(
            "clock compare",
            clock::compare(
                &a,
                &b,
                &ClockCfg {
                    basis,
                    ..ClockCfg::default()
                },
            ),
        ),
    }
}
