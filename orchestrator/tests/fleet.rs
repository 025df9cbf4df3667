//! `orchestrator fleet`: `--local` on a host of fake GPUs (`--gpus`: GPU indices this machine does
//! not have, so the leases are real and the legs are tests/fake_leg.py on the CPU), and `--slurm`
//! through a fake `sbatch` that records its argument vectors. The real Slurm test is
//! scripts/slurm-test.sh.

mod common;

use serde_json::Value;
use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::Command;

const BIN: &str = env!("CARGO_BIN_EXE_orchestrator");

const PROMPTS: [&[u32]; 2] = [&[1, 2, 3], &[4, 5]];

/// A unit `name` in `root/name/` whose legs are the fake, each wrapped so that every `serve`
/// appends "start|end NANOS UNIT ARGS" to `trace` (ARGS hold `--device cuda:N`). The legs sleep a
/// second before starting, so that runs on two GPUs overlap.
fn traced_unit(root: &Path, name: &str, trace: &Path, device: &str) -> PathBuf {
    let d = root.join(name);
    common::write_fake_unit(&d, &PROMPTS, "", "");
    let fake = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fake_leg.py");
    for leg in ["engine", "python"] {
        let p = d.join(format!("{leg}-traced.sh"));
        std::fs::write(
            &p,
            format!(
                "#!/bin/sh\ncase \"$*\" in *serve*) echo \"start $(date +%s%N) {name} $*\" >> {t}; sleep 1;; esac\n\
                 python3 {f} --backend=cuda \"$@\"\nrc=$?\n\
                 case \"$*\" in *serve*) echo \"end $(date +%s%N) {name} $*\" >> {t};; esac\nexit $rc\n",
                t = trace.display(),
                f = fake.display()
            ),
        )
        .unwrap();
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o755)).unwrap();
    }
    std::fs::write(
        d.join("unit.toml"),
        format!(
            r#"name = "{name}"
model = "model"
[battery]
prompts = "prompts.json"
max_tokens = 8
warmup = 1
repeat = 2
batch_sizes = [1]
[[golden]]
file = "golden.json"
[engine]
binary = "{}"
device = "{device}"
block_size = 16
num_blocks = 64
[oracle]
backend = "transformers"
python = "{}"
device = "cuda"
[watchdog]
load_s = 30
warmup_s = 30
battery_s = 30
shutdown_s = 10
grace_s = 1
"#,
            d.join("engine-traced.sh").display(),
            d.join("python-traced.sh").display()
        ),
    )
    .unwrap();
    d.join("unit.toml")
}

/// Runs `cmd` in a process group of its own; past `limit_s` the whole group is killed and the
/// test fails (a unit waiting for a lease forever must fail the test, not hang it).
fn output_within(cmd: &mut Command, limit_s: u64) -> std::process::Output {
    use std::os::unix::process::CommandExt;
    let child = cmd
        .process_group(0)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let pid = child.id() as i32;
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || tx.send(child.wait_with_output()));
    match rx.recv_timeout(std::time::Duration::from_secs(limit_s)) {
        Ok(out) => out.unwrap(),
        Err(_) => {
            // SAFETY: signals the process group this test started.
            unsafe { libc::kill(-pid, libc::SIGKILL) };
            let out = rx.recv().unwrap().unwrap();
            panic!(
                "the fleet had not ended after {limit_s} s; killed it. stderr:\n{}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
    }
}

fn read_json(p: &Path) -> Value {
    serde_json::from_str(&std::fs::read_to_string(p).unwrap()).unwrap()
}

/// Every `serve` in the trace: (unit, device, start, end).
fn intervals(trace: &Path) -> Vec<(String, String, u128, u128)> {
    let text = std::fs::read_to_string(trace).unwrap();
    let mut open: BTreeMap<(String, String), Vec<u128>> = BTreeMap::new();
    let mut out = vec![];
    for l in text.lines() {
        let f: Vec<&str> = l.split_whitespace().collect();
        let t: u128 = f[1].parse().unwrap();
        let dev = f
            .iter()
            .position(|x| *x == "--device")
            .map(|i| f[i + 1].to_string())
            .unwrap();
        let key = (f[2].to_string(), dev);
        match f[0] {
            "start" => open.entry(key).or_default().push(t),
            _ => {
                let s = open
                    .get_mut(&key)
                    .and_then(Vec::pop)
                    .expect("an end after its start");
                out.push((key.0, key.1, s, t));
            }
        }
    }
    assert!(
        open.values().all(Vec::is_empty),
        "every serve ended: {open:?}"
    );
    out
}

#[test]
fn local_places_one_unit_per_free_gpu_and_never_two_on_one() {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path();
    let trace = root.join("trace");
    let names = ["ua", "ub", "uc", "ud"];
    let units: Vec<PathBuf> = names
        .iter()
        .map(|n| traced_unit(root, n, &trace, "cuda:0"))
        .collect();
    let locks = root.join("locks");
    // GPU 2 is held by a job that is not the fleet's: no unit may go there.
    let _foreign = orchestrator::legs::lease::Lease::acquire(
        orchestrator::legs::lease::LeaseTarget::Gpu(2),
        &locks,
        false,
        "a foreign job",
        true,
    )
    .unwrap();
    let out = output_within(
        Command::new(BIN)
            .arg("fleet")
            .args(&units)
            .args(["--local", "--gpus", "0,1,2", "--records-dir"])
            .arg(root.join("records"))
            .arg("--lock-dir")
            .arg(&locks)
            .env_remove("LLM_BENCH_PYTHON")
            .env_remove("LLM_BENCH_HOST_GPUS"),
        120,
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{stdout}\n{stderr}");
    assert!(
        stderr.contains("gpu2 is busy (its lease is held by pid")
            && stderr.contains("for a foreign job"),
        "{stderr}"
    );
    assert!(stdout.contains("fleet: 4 run(s)"), "{stdout}");

    // Every unit completed, with a record of the GPU it was placed on.
    let mut gpu_of = BTreeMap::new();
    for n in names {
        let dir = root.join("records").join(n);
        let recs: Vec<PathBuf> = std::fs::read_dir(&dir)
            .unwrap()
            .flatten()
            .map(|e| e.path())
            .filter(|p| p.extension().is_some_and(|x| x == "json"))
            .collect();
        assert_eq!(recs.len(), 1, "{n}: {recs:?}\n{stderr}");
        let rec = read_json(&recs[0]);
        assert_eq!(rec["exit_status"], 0, "{n}: {}", rec["refusals"]);
        let target = rec["lease"]["target"].as_str().unwrap().to_string();
        assert!(target == "gpu0" || target == "gpu1", "{n} on {target}");
        let k = &target[3..];
        assert_eq!(
            rec["unit"]["config"]["engine"]["device"],
            format!("cuda:{k}")
        );
        assert_eq!(
            rec["unit"]["config"]["oracle"]["device"],
            format!("cuda:{k}")
        );
        // The record says which of the host's other GPUs were busy: the foreign job's always.
        let nb = rec["lease"]["neighbours"].as_array().unwrap();
        let gpu2 = nb.iter().find(|x| x["gpu"] == 2).expect("gpu2 watched");
        assert_eq!(gpu2["busy"], true);
        assert_eq!(gpu2["busy_looks"], gpu2["looks"]);
        assert!(
            gpu2["seen"][0]
                .as_str()
                .unwrap()
                .contains("for a foreign job"),
            "{gpu2}"
        );
        assert!(nb.iter().all(|x| x["gpu"] != k.parse::<u32>().unwrap()));
        gpu_of.insert(n.to_string(), format!("cuda:{k}"));
    }
    let used: BTreeSet<&String> = gpu_of.values().collect();
    assert_eq!(used.len(), 2, "both free GPUs were used: {gpu_of:?}");

    // The legs ran where the records say, and no two units' legs ever overlapped on one GPU,
    // while units on the two GPUs did run at the same time.
    let iv = intervals(&trace);
    assert_eq!(iv.len(), 8, "two legs per unit: {iv:?}");
    let mut parallel = false;
    for (i, a) in iv.iter().enumerate() {
        assert_eq!(a.1, gpu_of[&a.0], "{a:?}");
        for b in &iv[i + 1..] {
            let overlap = a.2 < b.3 && b.2 < a.3;
            if a.0 != b.0 && a.1 == b.1 {
                assert!(!overlap, "two units on {} at once: {a:?} {b:?}", a.1);
            }
            parallel |= overlap && a.1 != b.1;
        }
    }
    assert!(parallel, "no two units ran at the same time: {iv:?}");
}

#[test]
fn local_refuses_gpu_units_without_gpus_and_bad_gpu_lists() {
    let tmp = tempfile::tempdir().unwrap();
    let u = traced_unit(tmp.path(), "ua", &tmp.path().join("trace"), "cuda:0");
    let run = |gpus: &str| {
        Command::new(BIN)
            .args(["fleet", u.to_str().unwrap(), "--local", "--gpus", gpus])
            .output()
            .unwrap()
    };
    let out = run("");
    assert_eq!(out.status.code(), Some(2));
    let e = String::from_utf8_lossy(&out.stderr);
    assert!(
        e.contains(
            "1 unit(s) run on a GPU (ua) but this host has none that NVML counts; pass --gpus"
        ),
        "{e}"
    );
    let out = run("0,x");
    assert_eq!(out.status.code(), Some(2));
    let e = String::from_utf8_lossy(&out.stderr);
    assert!(
        e.contains("--gpus \"0,x\": \"x\" is not a GPU index"),
        "{e}"
    );
}

/// A fake `sbatch` on PATH: appends its argv to `argv.log` and prints the next job id.
fn fake_sbatch(dir: &Path, fail: bool) -> String {
    let bin = dir.join("bin");
    std::fs::create_dir_all(&bin).unwrap();
    let log = dir.join("argv.log");
    let body = if fail {
        "echo 'sbatch: error: invalid partition specified: nope' >&2; exit 1".to_string()
    } else {
        format!(
            "echo \"$*\" >> {l}; n=$(wc -l < {l}); echo \"$((40 + n));cluster\"",
            l = log.display()
        )
    };
    let p = bin.join("sbatch");
    std::fs::write(&p, format!("#!/bin/sh\n{body}\n")).unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o755)).unwrap();
    format!(
        "{}:{}",
        bin.display(),
        std::env::var("PATH").unwrap_or_default()
    )
}

#[test]
fn slurm_prints_the_scripts_and_submits_the_report_after_the_arrays() {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path();
    let trace = root.join("trace");
    let g = traced_unit(root, "gu", &trace, "cuda:0");
    let c = traced_unit(root, "cu", &trace, "cpu");
    let records = root.join("shared/records");
    let fleet = |extra: &[&str], path: &str| {
        Command::new(BIN)
            .arg("fleet")
            .args([&g, &c])
            .args([
                "--slurm",
                "--partition",
                "gpu",
                "--repeat",
                "2",
                "--records-dir",
            ])
            .arg(&records)
            .args(extra)
            .env("PATH", path)
            .output()
            .unwrap()
    };
    let path = fake_sbatch(root, false);
    let out = fleet(&[], &path);
    assert_eq!(out.status.code(), Some(0));
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(text.matches("#!/bin/bash").count(), 3, "{text}");
    assert!(
        !root.join("argv.log").exists(),
        "nothing submitted without --submit"
    );
    let gpu = &text[..text.find("# ==== job 2").unwrap()];
    assert!(gpu.contains("#SBATCH --array=0-1\n#SBATCH --ntasks=1\n#SBATCH --gres=gpu:1\n"));
    assert!(gpu.contains("# task 1: gu, repeat 2\n"), "{gpu}");
    assert!(gpu.contains("--gpu \"$gpu\""));
    let cpu = &text[text.find("# ==== job 2").unwrap()..text.find("# ==== job 3").unwrap()];
    assert!(
        cpu.contains("#SBATCH --exclusive") && !cpu.contains("--gres"),
        "{cpu}"
    );
    assert!(cpu.contains("#SBATCH --partition=gpu"));

    let out = fleet(&["--submit"], &path);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let argv = std::fs::read_to_string(root.join("argv.log")).unwrap();
    let lines: Vec<&str> = argv.lines().collect();
    assert_eq!(lines.len(), 3, "{argv}");
    assert!(lines[0].starts_with("--parsable /") && lines[0].ends_with("/gpu.sbatch"));
    assert!(lines[1].ends_with("/cpu.sbatch"));
    assert!(
        lines[2].starts_with("--parsable --dependency=afterany:41:42 /")
            && lines[2].ends_with("/report.sbatch"),
        "{argv}"
    );
    assert!(
        stdout.contains("submitted job 41: array of 2 GPU task(s): gu"),
        "{stdout}"
    );
    assert!(
        stdout.contains("submitted job 43: orchestrator report over"),
        "{stdout}"
    );
    assert!(stdout.contains("after job(s) 41, 42"), "{stdout}");
    // The scripts lie in the job directory beside the records, as submitted.
    let report = lines[2].rsplit(' ').next().unwrap();
    let script = std::fs::read_to_string(report).unwrap();
    assert!(script.contains(&format!(
        "report --records-dir {} --out {}",
        records.display(),
        root.join("shared/BENCHMARKS.md").display()
    )));
    assert!(Path::new(report).starts_with(root.join("shared/fleet")));

    let out = fleet(&["--submit"], &fake_sbatch(&root.join("failing"), true));
    assert_eq!(out.status.code(), Some(2));
    let e = String::from_utf8_lossy(&out.stderr);
    assert!(
        e.contains("failed (exit status: 1): sbatch: error: invalid partition specified: nope; run `orchestrator fleet` without --submit"),
        "{e}"
    );
}
