// A closed stdout or stderr must never panic a command: every line goes through util/term.rs.
#![deny(clippy::print_stdout, clippy::print_stderr)]

use clap::{Parser, Subcommand};
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use orchestrator::clock::{self, Said};
use orchestrator::compare;
use orchestrator::gates::clock::ClockCfg;
use orchestrator::gates::idle::GpuIdleCheck;
use orchestrator::legs::lease::{self, LeaseTarget};
use orchestrator::numbers::regress::{self, Thresholds};
use orchestrator::render;
use orchestrator::report;
use orchestrator::run::{self, RunOptions};
use orchestrator::unit::preflight;
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
            code(o.exit_status)
        }
        Err(e) => {
            sayln!("orchestrator: {e}");
            code(run::EXIT_ERROR)
        }
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

fn main() -> ExitCode {
    match Cli::parse().cmd {
        Cmd::Run {
            unit,
            records_dir,
            lock_dir,
            no_wait,
            python,
            quiet,
        } => run_cmd(
            &unit,
            &RunOptions {
                records_dir,
                lock_dir,
                no_wait,
                python,
                quiet,
            },
        ),
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
