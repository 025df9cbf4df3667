//! `orchestrator fleet UNIT...`: many units at once, each still one `orchestrator run` on one
//! leased GPU (or on the CPU, with the host to itself). Through Slurm (`slurm`: a job array whose
//! tasks write their records into one shared directory, then a dependent job that runs
//! `orchestrator report` over it), or on the GPUs of one host (`local`: one unit per free GPU).
//! docs/FLEET.md.

pub mod local;
pub mod slurm;

use std::fmt;
use std::path::{Path, PathBuf};

use crate::legs::placement::{self, PlacementError};
use crate::unit::{Unit, UnitError};
use crate::util::term::{out, outln, sayln};

/// A unit as the fleet places it.
#[derive(Debug, Clone, PartialEq)]
pub struct FleetUnit {
    /// The unit file, absolute: a Slurm task or a child run may start in another directory.
    pub path: PathBuf,
    pub name: String,
    /// Runs on one GPU (else on the CPU).
    pub gpu: bool,
    pub project_root: PathBuf,
    /// The engine binary the unit names, absolute.
    pub engine_binary: PathBuf,
    /// The unit's `[lease] lock_dir` and `idle_max_used_mib`: where `--local` looks for held
    /// leases, and how much memory in use still counts as an idle GPU.
    pub lock_dir: PathBuf,
    pub idle_max_used_mib: u64,
}

/// One run of the fleet: a unit, and which of its repeats this is (1-based).
#[derive(Debug, Clone, PartialEq)]
pub struct Task {
    pub unit: FleetUnit,
    pub repeat: u32,
}

/// Why the fleet did not start, or stopped. Display is the whole sentence.
#[derive(Debug)]
pub enum FleetError {
    Unit(UnitError),
    NoProject {
        unit: PathBuf,
    },
    /// Units from two checkouts: one orchestrator, one project tree per fleet.
    TwoProjects {
        a: PathBuf,
        b: PathBuf,
    },
    RepeatZero,
    /// A path or value an `#SBATCH` line cannot carry.
    Unsafe {
        what: &'static str,
        value: String,
    },
    NoOrchestrator {
        why: String,
    },
    Write {
        path: PathBuf,
        error: std::io::Error,
    },
    /// `sbatch` could not run, failed, or printed no job id.
    Sbatch {
        argv: Vec<String>,
        detail: String,
    },
    /// `--local` with GPU units and no GPU to place them on.
    NoGpus {
        units: Vec<String>,
    },
    /// `--gpus` is not a list of indices.
    BadGpus {
        value: String,
        why: String,
    },
    Placement(PlacementError),
    Spawn {
        what: String,
        error: std::io::Error,
    },
}

impl fmt::Display for FleetError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            FleetError::Unit(e) => write!(f, "{e}"),
            FleetError::NoProject { unit } => write!(
                f,
                "{} is not inside a git checkout of the project; fleet runs units of one checkout (its orchestrator and engine binaries, its tree in every record): pass units under the project's goldens/",
                unit.display()
            ),
            FleetError::TwoProjects { a, b } => write!(
                f,
                "the units come from two checkouts ({} and {}); one fleet runs one checkout's binaries and tree, so run one fleet per checkout",
                a.display(),
                b.display()
            ),
            FleetError::RepeatZero => write!(f, "--repeat 0 runs nothing; give 1 or more"),
            FleetError::Unsafe { what, value } => write!(
                f,
                "the {what} {value:?} has a space, quote, backslash, dollar or control character, which an #SBATCH line cannot carry; give one without (for a path, a symlink will do)"
            ),
            FleetError::NoOrchestrator { why } => write!(
                f,
                "cannot tell where this orchestrator binary is ({why}); run it by its path, e.g. target/release/orchestrator"
            ),
            FleetError::Write { path, error } => write!(
                f,
                "cannot write {} ({error}); pass --records-dir a writable directory",
                path.display()
            ),
            FleetError::Sbatch { argv, detail } => write!(
                f,
                "`{}` {detail}; run `orchestrator fleet` without --submit to see the script, and check that Slurm's client works here (`sinfo`)",
                argv.join(" ")
            ),
            FleetError::NoGpus { units } => write!(
                f,
                "{} unit(s) run on a GPU ({}) but this host has none that NVML counts; pass --gpus 0,1,... to name them, or run CPU units",
                units.len(),
                units.join(", ")
            ),
            FleetError::BadGpus { value, why } => write!(
                f,
                "--gpus {value:?}: {why}; give the GPUs' indices on this host, like 0,1,3"
            ),
            FleetError::Placement(e) => write!(f, "{e}"),
            FleetError::Spawn { what, error } => write!(f, "cannot start {what} ({error})"),
        }
    }
}

impl std::error::Error for FleetError {}

/// Loads and checks each unit file (parsing only: each task's own preflight checks the rest).
pub fn load_units(paths: &[PathBuf]) -> Result<Vec<FleetUnit>, FleetError> {
    let mut out: Vec<FleetUnit> = vec![];
    for p in paths {
        let unit = Unit::load(p).map_err(FleetError::Unit)?;
        let root = crate::unit::preflight::find_project_root(&unit.dir)
            .ok_or_else(|| FleetError::NoProject { unit: p.clone() })?;
        if let Some(first) = out.first() {
            if first.project_root != root {
                return Err(FleetError::TwoProjects {
                    a: first.project_root.clone(),
                    b: root,
                });
            }
        }
        out.push(FleetUnit {
            path: unit.path.clone(),
            name: unit.config.name.clone(),
            gpu: placement::is_gpu_unit(&unit.config),
            engine_binary: std::path::absolute(unit.engine_binary(&root))
                .unwrap_or_else(|_| unit.engine_binary(&root)),
            project_root: root,
            lock_dir: unit.config.lease.lock_dir.clone(),
            idle_max_used_mib: unit.config.lease.idle_max_used_mib,
        });
    }
    Ok(out)
}

/// Each unit `repeat` times, in the order given (unit by unit).
pub fn tasks(units: &[FleetUnit], repeat: u32) -> Result<Vec<Task>, FleetError> {
    if repeat == 0 {
        return Err(FleetError::RepeatZero);
    }
    Ok(units
        .iter()
        .flat_map(|u| {
            (1..=repeat).map(|r| Task {
                unit: u.clone(),
                repeat: r,
            })
        })
        .collect())
}

/// The records directory: the one given, else `<project>/reports/records`, made absolute.
pub fn records_dir(given: Option<&Path>, project_root: &Path) -> PathBuf {
    let d = given
        .map(Path::to_path_buf)
        .unwrap_or_else(|| project_root.join("reports/records"));
    std::path::absolute(&d).unwrap_or(d)
}

/// This orchestrator binary, absolute (a task runs the same one, on whichever node).
pub fn this_orchestrator() -> Result<PathBuf, FleetError> {
    std::env::current_exe().map_err(|e| FleetError::NoOrchestrator { why: e.to_string() })
}

/// `s` as one shell word: plain when it is all safe characters, else single-quoted.
pub fn sh_word(s: &str) -> String {
    let safe = !s.is_empty()
        && s.chars()
            .all(|c| c.is_ascii_alphanumeric() || "/._-+=:,@%".contains(c));
    if safe {
        s.to_string()
    } else {
        format!("'{}'", s.replace('\'', "'\\''"))
    }
}

/// `orchestrator fleet` as the command line gives it.
#[derive(Debug, Clone, Default)]
pub struct FleetCmd {
    pub units: Vec<PathBuf>,
    /// Slurm (else the local host's GPUs).
    pub slurm: bool,
    pub submit: bool,
    pub partition: Option<String>,
    pub account: Option<String>,
    pub time: Option<String>,
    pub records_dir: Option<PathBuf>,
    pub out: Option<PathBuf>,
    pub repeat: u32,
    pub gpus: Option<String>,
    pub lock_dir: Option<PathBuf>,
    pub python: Option<String>,
}

/// Runs the command; its exit status. Slurm: 0 printed or submitted, 2 refused. Local: the
/// worst of its runs' statuses (0 every gate passed, 1 some record has refusals, 2 some run
/// measured nothing), 2 refused.
pub fn command(c: &FleetCmd) -> i32 {
    let r = if c.slurm {
        slurm_command(c)
    } else {
        local_command(c)
    };
    r.unwrap_or_else(|e| {
        sayln!("orchestrator fleet: {e}");
        2
    })
}

/// `<records dir>/../fleet/<stamp>`: the scripts and Slurm's output, or the local runs' logs.
fn job_dir(records: &Path) -> PathBuf {
    records
        .parent()
        .unwrap_or(records)
        .join("fleet")
        .join(crate::util::time::utc_stamp(std::time::SystemTime::now()))
}

fn slurm_command(c: &FleetCmd) -> Result<i32, FleetError> {
    let units = load_units(&c.units)?;
    let tasks = tasks(&units, c.repeat)?;
    let records = records_dir(c.records_dir.as_deref(), &units[0].project_root);
    let out = c
        .out
        .clone()
        .unwrap_or_else(|| records.parent().unwrap_or(&records).join("BENCHMARKS.md"));
    let o = slurm::SlurmOptions {
        partition: c.partition.clone(),
        account: c.account.clone(),
        time: c.time.clone(),
        report_out: std::path::absolute(&out).unwrap_or(out),
        orchestrator: this_orchestrator()?,
        python: c.python.clone().or_else(|| {
            std::env::var("LLM_BENCH_PYTHON")
                .ok()
                .filter(|s| !s.is_empty())
        }),
        lock_dir: c
            .lock_dir
            .as_ref()
            .map(|l| std::path::absolute(l).unwrap_or_else(|_| l.clone())),
        job_dir: job_dir(&records),
        records_dir: records,
    };
    let plan = slurm::plan(&tasks, &o)?;
    if !c.submit {
        out!("{}", slurm::render(&plan, &o));
        return Ok(0);
    }
    for s in slurm::submit(&plan, &o, "sbatch")? {
        outln!(
            "submitted job {}: {} ({})",
            s.id,
            s.what,
            s.script.display()
        );
    }
    Ok(0)
}

fn local_command(c: &FleetCmd) -> Result<i32, FleetError> {
    let units = load_units(&c.units)?;
    let tasks = tasks(&units, c.repeat)?;
    let records = records_dir(c.records_dir.as_deref(), &units[0].project_root);
    let gpus = match &c.gpus {
        Some(s) => placement::parse_gpu_list(s).map_err(|why| FleetError::BadGpus {
            value: s.clone(),
            why,
        })?,
        None => placement::host_gpus().map_err(FleetError::Placement)?,
    };
    let o = local::LocalOptions {
        gpus,
        lock_dir: c.lock_dir.clone(),
        orchestrator: this_orchestrator()?,
        python: c.python.clone(),
        log_dir: job_dir(&records),
        records_dir: records,
        poll: std::time::Duration::from_millis(500),
        open: crate::legs::sampler::nvml::open,
    };
    let done = local::run(&tasks, &o)?;
    outln!("fleet: {} run(s)", done.len());
    for f in &done {
        outln!("- {}", f.line());
    }
    Ok(local::exit_status(&done))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shell_words_quote_what_needs_it() {
        assert_eq!(sh_word("/a/b-c_1.toml"), "/a/b-c_1.toml");
        assert_eq!(sh_word("a b"), "'a b'");
        assert_eq!(sh_word("it's"), "'it'\\''s'");
        assert_eq!(sh_word(""), "''");
    }

    #[test]
    fn units_load_absolute_with_their_device_and_repeat_expands_them() {
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
        let units = load_units(&[root.join("goldens/tiny-llama/unit.toml")]).unwrap();
        let u = &units[0];
        assert_eq!(u.name, "tiny-llama");
        assert!(!u.gpu, "tiny-llama's engine runs on the CPU");
        assert!(u.path.is_absolute() && u.engine_binary.is_absolute());
        assert!(u.engine_binary.ends_with("target/release/engine"));
        let t = tasks(&units, 3).unwrap();
        assert_eq!(
            t.iter().map(|t| t.repeat).collect::<Vec<_>>(),
            vec![1, 2, 3]
        );
        assert!(matches!(tasks(&units, 0), Err(FleetError::RepeatZero)));
        let e = load_units(&[root.join("goldens/nope/unit.toml")]).unwrap_err();
        assert!(e.to_string().contains("cannot read the unit file"), "{e}");
    }
}
