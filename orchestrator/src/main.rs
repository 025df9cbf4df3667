use clap::{Parser, Subcommand};
use std::path::PathBuf;
use std::process::ExitCode;

use orchestrator::lease::{self, LeaseTarget, NoIdleCheck};
use orchestrator::preflight;
use orchestrator::run::{self, RunOptions};

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
    /// Runs CMD under the same lease as `run`; its exit status is passed through.
    Lease {
        /// GPU index to lease (default: GPU 0 if the machine has one, else the "cpu" lease).
        #[arg(long)]
        gpu: Option<u32>,
        #[arg(long, default_value = "/tmp/llm-bench-locks")]
        lock_dir: PathBuf,
        #[arg(long)]
        no_wait: bool,
        #[arg(last = true, required = true)]
        command: Vec<String>,
    },
}

fn code(c: i32) -> ExitCode {
    ExitCode::from(c.clamp(0, 255) as u8)
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match cli.cmd {
        Cmd::Run {
            unit,
            records_dir,
            lock_dir,
            no_wait,
            python,
            quiet,
        } => code(run::run(
            &unit,
            &RunOptions {
                records_dir,
                lock_dir,
                no_wait,
                python,
                quiet,
            },
        )),
        Cmd::Check { unit, python } => {
            let (report, checked) = preflight::preflight(&unit, python.as_deref(), false);
            for l in &report.lines {
                println!("{l}");
            }
            if checked.is_some() {
                println!("preflight passed: {}", unit.display());
                code(0)
            } else {
                println!(
                    "preflight FAILED: {} check(s) failed",
                    report.failures.len()
                );
                code(run::EXIT_ERROR)
            }
        }
        Cmd::Lease {
            gpu,
            lock_dir,
            no_wait,
            command,
        } => code(lease::run_job(
            LeaseTarget::choose(gpu),
            &lock_dir,
            !no_wait,
            &command,
            &NoIdleCheck,
        )),
    }
}
