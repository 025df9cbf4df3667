//! `orchestrator fleet --slurm`: sbatch scripts for a fleet. GPU units go into one job array whose
//! tasks ask for one GPU each (`--gres=gpu:1`), CPU units into another whose tasks have the node
//! to themselves (`--exclusive`); each task runs `orchestrator run` on its unit and writes the
//! record into the shared records directory. A last job, submitted with
//! `--dependency=afterany:` the arrays, runs `orchestrator report` over that directory. The
//! scripts name every path absolutely and check on the node that the binaries are there.

use std::path::{Path, PathBuf};
use std::process::Command;

use super::{sh_word, FleetError, Task};

#[derive(Debug, Clone, Default)]
pub struct SlurmOptions {
    pub partition: Option<String>,
    pub account: Option<String>,
    /// Each job's time limit, as sbatch takes it ("30", "1:00:00").
    pub time: Option<String>,
    pub records_dir: PathBuf,
    /// The report job's BENCHMARKS.md.
    pub report_out: PathBuf,
    pub orchestrator: PathBuf,
    /// The oracle's interpreter the tasks export as LLM_BENCH_PYTHON, when given.
    pub python: Option<String>,
    pub lock_dir: Option<PathBuf>,
    /// Where the scripts and Slurm's output files go (on a file system the nodes share).
    pub job_dir: PathBuf,
}

/// One sbatch script.
#[derive(Debug, Clone, PartialEq)]
pub struct Job {
    /// The script's file name under the job directory.
    pub file: String,
    pub script: String,
    /// What it runs, for the lines printed at submission.
    pub what: String,
}

/// The arrays (GPU, CPU: those that have tasks), then the report job that waits for them.
#[derive(Debug, Clone, PartialEq)]
pub struct Plan {
    pub arrays: Vec<Job>,
    pub report: Job,
}

fn check(what: &'static str, value: &str) -> Result<(), FleetError> {
    if value
        .chars()
        .any(|c| c.is_whitespace() || c.is_control() || "'\"\\$`".contains(c))
    {
        return Err(FleetError::Unsafe {
            what,
            value: value.to_string(),
        });
    }
    Ok(())
}

/// The `#SBATCH` lines every job shares.
fn common_directives(o: &SlurmOptions, root: &Path, out: &str) -> String {
    let mut s = String::new();
    for (k, v) in [
        ("partition", &o.partition),
        ("account", &o.account),
        ("time", &o.time),
    ] {
        if let Some(v) = v {
            s.push_str(&format!("#SBATCH --{k}={v}\n"));
        }
    }
    s.push_str(&format!(
        "#SBATCH --chdir={}\n#SBATCH --output={}/{out}\n",
        root.display(),
        o.job_dir.display()
    ));
    s
}

/// The shell lines that stop the task with a sentence when `var`'s file is not an executable.
fn require_executable(var: &str, task: &str) -> String {
    format!(
        "if [ ! -x \"${var}\" ]; then\n    echo \"{task} on $(hostname): ${var} is not an executable file on this node; put the project, built (cargo build --release), on a file system the nodes share, or build it at the same path on each node\" >&2\n    exit 2\nfi\n"
    )
}

const GPU_CHOICE: &str = r#"# The GPU Slurm gave this task, by the node's numbering (SLURM_STEP_GPUS / SLURM_JOB_GPUS, set
# where gres.conf names the GPUs' device files).
gpu=${SLURM_STEP_GPUS:-${SLURM_JOB_GPUS:-}}
gpu=${gpu%%,*}
if [ -z "$gpu" ]; then
    echo "fleet task $task on $(hostname): Slurm named no GPU for this task (SLURM_JOB_GPUS is unset); declare the GPUs in gres.conf (Name=gpu File=/dev/nvidia[0-7]) and ask --gres=gpu:1" >&2
    exit 2
fi
if command -v nvidia-smi >/dev/null && [ "$(nvidia-smi -L | wc -l)" -eq 1 ]; then
    # The devices are constrained (cgroup): the task sees its GPU alone, as GPU 0, to CUDA and NVML.
    gpu=0
else
    # Every GPU of the node is visible: address ours by the node's own (PCI bus) numbering, the
    # one NVML uses, so that the lease, the idle check and the sampler watch the GPU that runs.
    unset CUDA_VISIBLE_DEVICES
    export CUDA_DEVICE_ORDER=PCI_BUS_ID
fi
"#;

fn array_job(tasks: &[&Task], gpu: bool, o: &SlurmOptions) -> Job {
    let kind = if gpu { "gpu" } else { "cpu" };
    let root = &tasks[0].unit.project_root;
    let mut s = format!(
        "#!/bin/bash\n# Written by `orchestrator fleet --slurm` (docs/FLEET.md): {} {} task(s), each one\n# `orchestrator run` of one unit, its record written into {}.\n",
        tasks.len(),
        kind.to_uppercase(),
        o.records_dir.display()
    );
    s.push_str(&format!(
        "#SBATCH --job-name=llm-bench-{kind}\n#SBATCH --array=0-{}\n#SBATCH --ntasks=1\n",
        tasks.len() - 1
    ));
    s.push_str(if gpu {
        "#SBATCH --gres=gpu:1\n"
    } else {
        "# A CPU unit has the node to itself: a benchmark beside another job would time both.\n#SBATCH --exclusive\n"
    });
    s.push_str(&common_directives(o, root, "%x-%A_%a.out"));
    s.push_str("set -euo pipefail\n");
    s.push_str(&format!(
        "orchestrator={}\nrecords={}\nunits=(\n",
        sh_word(&o.orchestrator.display().to_string()),
        sh_word(&o.records_dir.display().to_string())
    ));
    let n = tasks
        .iter()
        .filter(|t| t.unit.name == tasks[0].unit.name)
        .count();
    for (i, t) in tasks.iter().enumerate() {
        s.push_str(&format!(
            "    {} # task {i}: {}{}\n",
            sh_word(&t.unit.path.display().to_string()),
            t.unit.name,
            if n > 1 {
                format!(", repeat {}", t.repeat)
            } else {
                String::new()
            }
        ));
    }
    s.push_str(")\nengines=(\n");
    for t in tasks {
        s.push_str(&format!(
            "    {}\n",
            sh_word(&t.unit.engine_binary.display().to_string())
        ));
    }
    s.push_str(")\ntask=${SLURM_ARRAY_TASK_ID:?this script is a Slurm job array: submit it with sbatch}\nunit=${units[$task]}\nengine=${engines[$task]}\n");
    s.push_str(&require_executable("orchestrator", "fleet task $task"));
    s.push_str(&require_executable("engine", "fleet task $task"));
    s.push_str("if [ ! -r \"$unit\" ]; then\n    echo \"fleet task $task on $(hostname): cannot read $unit on this node; the project must be on a file system the nodes share\" >&2\n    exit 2\nfi\n");
    let mut args = String::from("run \"$unit\" --records-dir \"$records\"");
    if let Some(p) = &o.python {
        s.push_str(&format!("export LLM_BENCH_PYTHON={}\n", sh_word(p)));
    }
    if let Some(l) = &o.lock_dir {
        args.push_str(&format!(
            " --lock-dir {}",
            sh_word(&l.display().to_string())
        ));
    }
    if gpu {
        s.push_str(GPU_CHOICE);
        args.push_str(" --gpu \"$gpu\"");
        s.push_str("echo \"fleet task $task on $(hostname), GPU $gpu: $unit\" >&2\n");
    } else {
        s.push_str("echo \"fleet task $task on $(hostname): $unit\" >&2\n");
    }
    s.push_str(&format!("exec \"$orchestrator\" {args}\n"));
    let names: Vec<String> = tasks
        .iter()
        .map(|t| t.unit.name.clone())
        .collect::<std::collections::BTreeSet<_>>()
        .into_iter()
        .collect();
    Job {
        file: format!("{kind}.sbatch"),
        script: s,
        what: format!(
            "array of {} {} task(s): {}",
            tasks.len(),
            kind.to_uppercase(),
            names.join(", ")
        ),
    }
}

fn report_job(root: &Path, o: &SlurmOptions) -> Job {
    let mut s = String::from("#!/bin/bash\n# Written by `orchestrator fleet --slurm` (docs/FLEET.md): BENCHMARKS.md from every record in the\n# records directory, once the fleet's arrays have ended (submitted with --dependency=afterany:).\n#SBATCH --job-name=llm-bench-report\n#SBATCH --ntasks=1\n#SBATCH --cpus-per-task=1\n");
    s.push_str(&common_directives(o, root, "%x-%j.out"));
    s.push_str(&format!(
        "set -euo pipefail\norchestrator={}\n",
        sh_word(&o.orchestrator.display().to_string())
    ));
    s.push_str(&require_executable("orchestrator", "fleet report"));
    s.push_str(&format!(
        "exec \"$orchestrator\" report --records-dir {} --out {}\n",
        sh_word(&o.records_dir.display().to_string()),
        sh_word(&o.report_out.display().to_string())
    ));
    Job {
        file: "report.sbatch".into(),
        script: s,
        what: format!(
            "orchestrator report over {} into {}",
            o.records_dir.display(),
            o.report_out.display()
        ),
    }
}

/// The fleet's jobs. Err where a path cannot go into an `#SBATCH` line.
pub fn plan(tasks: &[Task], o: &SlurmOptions) -> Result<Plan, FleetError> {
    let Some(first) = tasks.first() else {
        return Err(FleetError::RepeatZero);
    };
    check(
        "project directory",
        &first.unit.project_root.display().to_string(),
    )?;
    check("job directory", &o.job_dir.display().to_string())?;
    for (what, v) in [
        ("partition", &o.partition),
        ("account", &o.account),
        ("time limit", &o.time),
    ] {
        if let Some(v) = v {
            check(what, v)?;
        }
    }
    let gpu: Vec<&Task> = tasks.iter().filter(|t| t.unit.gpu).collect();
    let cpu: Vec<&Task> = tasks.iter().filter(|t| !t.unit.gpu).collect();
    let mut arrays = vec![];
    if !gpu.is_empty() {
        arrays.push(array_job(&gpu, true, o));
    }
    if !cpu.is_empty() {
        arrays.push(array_job(&cpu, false, o));
    }
    Ok(Plan {
        arrays,
        report: report_job(&first.unit.project_root, o),
    })
}

/// The scripts for review, each under a line saying how it would be submitted.
pub fn render(plan: &Plan, o: &SlurmOptions) -> String {
    let n = plan.arrays.len() + 1;
    let mut s = String::new();
    for (i, j) in plan.arrays.iter().enumerate() {
        s.push_str(&format!(
            "# ==== job {} of {n}: {}/{}, submitted as `sbatch --parsable {}`\n{}\n",
            i + 1,
            o.job_dir.display(),
            j.file,
            j.file,
            j.script
        ));
    }
    s.push_str(&format!(
        "# ==== job {n} of {n}: {}/{}, submitted as `sbatch --parsable --dependency=afterany:<the array job ids> {}`\n{}",
        o.job_dir.display(),
        plan.report.file,
        plan.report.file,
        plan.report.script
    ));
    s
}

/// A submitted job: its id and what it runs.
#[derive(Debug, Clone, PartialEq)]
pub struct Submitted {
    pub id: String,
    pub what: String,
    pub script: PathBuf,
}

fn sbatch(argv: Vec<String>) -> Result<String, FleetError> {
    let out = Command::new(&argv[0])
        .args(&argv[1..])
        .output()
        .map_err(|e| FleetError::Sbatch {
            argv: argv.clone(),
            detail: format!("could not be run ({e})"),
        })?;
    let stdout = String::from_utf8_lossy(&out.stdout);
    if !out.status.success() {
        return Err(FleetError::Sbatch {
            argv,
            detail: format!(
                "failed ({}): {}",
                out.status,
                String::from_utf8_lossy(&out.stderr).trim()
            ),
        });
    }
    // --parsable prints "ID" or "ID;CLUSTER".
    let id = stdout.trim().split(';').next().unwrap_or("").to_string();
    if id.is_empty() || !id.chars().all(|c| c.is_ascii_digit()) {
        return Err(FleetError::Sbatch {
            argv,
            detail: format!("printed {:?}, not a job id", stdout.trim()),
        });
    }
    Ok(id)
}

/// Writes the scripts into the job directory and submits them: the arrays, then the report job
/// after them. `sbatch_cmd` is the sbatch to run ("sbatch" from PATH).
pub fn submit(
    plan: &Plan,
    o: &SlurmOptions,
    sbatch_cmd: &str,
) -> Result<Vec<Submitted>, FleetError> {
    std::fs::create_dir_all(&o.job_dir).map_err(|error| FleetError::Write {
        path: o.job_dir.clone(),
        error,
    })?;
    std::fs::create_dir_all(&o.records_dir).map_err(|error| FleetError::Write {
        path: o.records_dir.clone(),
        error,
    })?;
    let write = |j: &Job| -> Result<PathBuf, FleetError> {
        let p = o.job_dir.join(&j.file);
        std::fs::write(&p, &j.script).map_err(|error| FleetError::Write {
            path: p.clone(),
            error,
        })?;
        Ok(p)
    };
    let mut done: Vec<Submitted> = vec![];
    for j in &plan.arrays {
        let p = write(j)?;
        let argv = vec![
            sbatch_cmd.to_string(),
            "--parsable".into(),
            p.display().to_string(),
        ];
        let id = sbatch(argv).map_err(|e| already(e, &done))?;
        done.push(Submitted {
            id,
            what: j.what.clone(),
            script: p,
        });
    }
    let p = write(&plan.report)?;
    let ids: Vec<&str> = done.iter().map(|s| s.id.as_str()).collect();
    let argv = vec![
        sbatch_cmd.to_string(),
        "--parsable".into(),
        format!("--dependency=afterany:{}", ids.join(":")),
        p.display().to_string(),
    ];
    let id = sbatch(argv).map_err(|e| already(e, &done))?;
    done.push(Submitted {
        id,
        what: format!("{} after job(s) {}", plan.report.what, ids.join(", ")),
        script: p,
    });
    Ok(done)
}

/// A failed submission names the jobs that were already submitted (to scancel or to keep).
fn already(e: FleetError, done: &[Submitted]) -> FleetError {
    match e {
        FleetError::Sbatch { argv, detail } if !done.is_empty() => FleetError::Sbatch {
            argv,
            detail: format!(
                "{detail} (job(s) {} were already submitted: scancel them, or run `orchestrator report` yourself when they end)",
                done.iter().map(|s| s.id.as_str()).collect::<Vec<_>>().join(", ")
            ),
        },
        e => e,
    }
}
