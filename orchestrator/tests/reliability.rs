//! Issue 16: a run's record is never lost, nothing outlives the orchestrator, no input panics.
//! Nothing it started (the job of `lease -- CMD`, a leg, the oracle's check) outlives it, even
//! under `kill -9`, and the lease is free once they are gone; SIGINT and SIGTERM end any phase
//! with a message and exit 2, keeping what was measured; two queued runs each keep their record;
//! a closed stdout or stderr costs nothing; a stopped leg is named by its progress deadline.
//! The legs are tests/fake_leg.py, so every test takes seconds.

mod common;

use serde_json::Value;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

const BIN: &str = env!("CARGO_BIN_EXE_orchestrator");

fn alive(pid: i32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(s) => {
            let state = s[s.rfind(')').unwrap() + 2..].chars().next().unwrap();
            state != 'Z' && state != 'X'
        }
        Err(_) => false,
    }
}

/// The pids whose environment holds `marker` (every process of one test carries it).
fn marked(marker: &str) -> Vec<i32> {
    let needle = format!("LLM_BENCH_TEST_MARK={marker}");
    let mut v = vec![];
    for e in std::fs::read_dir("/proc").unwrap().flatten() {
        let Some(pid) = e.file_name().to_str().and_then(|s| s.parse::<i32>().ok()) else {
            continue;
        };
        if let Ok(env) = std::fs::read(format!("/proc/{pid}/environ")) {
            if env.split(|&b| b == 0).any(|kv| kv == needle.as_bytes()) && alive(pid) {
                v.push(pid);
            }
        }
    }
    v
}

fn wait_until(limit: Duration, mut f: impl FnMut() -> bool) -> bool {
    let t = Instant::now();
    while t.elapsed() < limit {
        if f() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(25));
    }
    f()
}

fn lease_cmd(locks: &Path, marker: &str, job: &[&str]) -> Command {
    let mut c = Command::new(BIN);
    c.arg("lease")
        .arg("--lock-dir")
        .arg(locks)
        .arg("--")
        .args(job)
        .env("LLM_BENCH_TEST_MARK", marker)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    c
}

fn lease_is_free(locks: &Path) -> bool {
    Command::new(BIN)
        .args(["lease", "--no-wait", "--lock-dir"])
        .arg(locks)
        .args(["--", "true"])
        .stderr(Stdio::null())
        .status()
        .unwrap()
        .success()
}

fn kill(child: &Child, sig: i32) {
    // SAFETY: a signal to a process this test started.
    unsafe { libc::kill(child.id() as i32, sig) };
}

/// `kill -9` of `orchestrator lease -- sleep 30` left `sleep` running and the lease free at
/// once. Now the job and its own children die with the orchestrator, and the lease is free
/// once they are gone.
#[test]
fn kill_9_of_a_lease_takes_its_job_and_the_jobs_children_along() {
    let tmp = tempfile::tempdir().unwrap();
    let locks = tmp.path().join("locks");
    let marker = format!("lease-kill9-{}", std::process::id());
    let mut orch = lease_cmd(&locks, &marker, &["sh", "-c", "sleep 30 & sleep 30; wait"])
        .spawn()
        .unwrap();
    // The orchestrator, the job's shell, its two sleeps and the guard.
    assert!(
        wait_until(Duration::from_secs(10), || marked(&marker).len() >= 4),
        "{:?}",
        marked(&marker)
    );
    assert!(
        !lease_is_free(&locks),
        "the lease is held while the job runs"
    );
    kill(&orch, libc::SIGKILL);
    let _ = orch.wait();
    assert!(
        wait_until(Duration::from_secs(5), || marked(&marker).is_empty()),
        "outlived the orchestrator: {:?}",
        marked(&marker)
            .iter()
            .map(|p| std::fs::read_to_string(format!("/proc/{p}/cmdline")).unwrap_or_default())
            .collect::<Vec<_>>()
    );
    assert!(wait_until(Duration::from_secs(5), || lease_is_free(&locks)));
}

/// SIGTERM to `orchestrator lease` is passed on to the job, whose status comes back.
#[test]
fn sigterm_to_a_lease_is_passed_on_to_the_job() {
    let tmp = tempfile::tempdir().unwrap();
    let locks = tmp.path().join("locks");
    let marker = format!("lease-term-{}", std::process::id());
    let orch = lease_cmd(&locks, &marker, &["sleep", "30"])
        .spawn()
        .unwrap();
    assert!(wait_until(Duration::from_secs(10), || marked(&marker)
        .len()
        >= 3));
    kill(&orch, libc::SIGTERM);
    let out = orch.wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(128 + libc::SIGTERM), "{err}");
    assert!(err.contains("SIGTERM: passed on to the job"), "{err}");
    assert!(wait_until(Duration::from_secs(5), || marked(&marker).is_empty()));
    assert!(lease_is_free(&locks));
}

/// A lease job that leaves a process behind: it is named and killed, not left holding the lease.
#[test]
fn what_a_lease_job_leaves_behind_is_named_and_killed() {
    let tmp = tempfile::tempdir().unwrap();
    let locks = tmp.path().join("locks");
    let marker = format!("lease-left-{}", std::process::id());
    let out = lease_cmd(
        &locks,
        &marker,
        &["sh", "-c", "sleep 30 >/dev/null 2>&1 & exit 3"],
    )
    .output()
    .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(3), "{err}");
    assert!(err.contains("outlived the job; killed"), "{err}");
    assert!(wait_until(Duration::from_secs(5), || marked(&marker).is_empty()));
    assert!(lease_is_free(&locks));
}

const PROMPTS: [&[u32]; 3] = [&[1, 2, 3], &[4, 5], &[6, 7, 8, 9]];

/// A unit over the fake leg in a temporary directory; each process it starts carries `marker`.
struct Fixture {
    dir: tempfile::TempDir,
    marker: String,
}

impl Fixture {
    fn new(name: &str, engine_args: &str, oracle_args: &str, extra: &str) -> Fixture {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        let engine = common::write_fake_unit(d, &PROMPTS, engine_args, oracle_args);
        std::fs::write(d.join("unit.toml"), common::fake_unit_toml(&engine, extra)).unwrap();
        Fixture {
            dir,
            marker: format!("{name}-{}", std::process::id()),
        }
    }

    fn path(&self, p: &str) -> PathBuf {
        self.dir.path().join(p)
    }

    fn cmd(&self, sub: &str) -> Command {
        let mut c = Command::new(BIN);
        c.arg(sub).arg(self.path("unit.toml"));
        if sub == "run" {
            c.arg("--records-dir")
                .arg(self.path("records"))
                .arg("--lock-dir")
                .arg(self.path("locks"));
        }
        c.arg("--python")
            .arg(self.path("python.sh"))
            .env("LLM_BENCH_TEST_MARK", &self.marker)
            .stdin(Stdio::null());
        c
    }

    fn records(&self) -> Vec<Value> {
        json_files(&self.path("records/fake"))
            .iter()
            .map(|p| serde_json::from_str(&std::fs::read_to_string(p).unwrap()).unwrap())
            .collect()
    }

    /// Waits until one of the run's files (under records/fake) holds `text`.
    fn wait_for_log(&self, suffix: &str, text: &str) {
        assert!(
            wait_until(Duration::from_secs(30), || {
                files(&self.path("records/fake")).iter().any(|p| {
                    p.to_string_lossy().ends_with(suffix)
                        && std::fs::read_to_string(p).is_ok_and(|t| t.contains(text))
                })
            }),
            "no {suffix} with {text:?}"
        );
    }

    fn gone(&self) -> bool {
        wait_until(Duration::from_secs(5), || marked(&self.marker).is_empty())
    }
}

fn files(dir: &Path) -> Vec<PathBuf> {
    std::fs::read_dir(dir)
        .map(|rd| rd.flatten().map(|e| e.path()).collect())
        .unwrap_or_default()
}

fn json_files(dir: &Path) -> Vec<PathBuf> {
    files(dir)
        .into_iter()
        .filter(|p| p.extension().is_some_and(|x| x == "json"))
        .collect()
}

fn text(o: &Output) -> String {
    format!(
        "status {:?}\n--- stdout\n{}\n--- stderr\n{}",
        o.status.code(),
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

/// Issue item 1: with the lease held, two runs started at once each measured, then one failed
/// "cannot write the record ... (already exists)" (exit 2) and the other wrote its failure
/// record under that name, pointing at the first one's logs. The stem is now claimed under the
/// lease and the lease held until the record is on disk.
#[test]
fn two_runs_queued_behind_a_held_lease_each_keep_their_record() {
    let f = Fixture::new("queue", "", "", "");
    let locks = f.path("locks");
    let mut holder = lease_cmd(&locks, &f.marker, &["sleep", "2"])
        .spawn()
        .unwrap();
    assert!(wait_until(Duration::from_secs(10), || !lease_is_free(
        &locks
    )));
    let runs: Vec<Child> = (0..2)
        .map(|_| {
            f.cmd("run")
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn()
                .unwrap()
        })
        .collect();
    let outs: Vec<Output> = runs
        .into_iter()
        .map(|c| c.wait_with_output().unwrap())
        .collect();
    assert!(holder.wait().unwrap().success());
    for o in &outs {
        assert_eq!(o.status.code(), Some(0), "{}", text(o));
    }
    let recs = f.records();
    assert_eq!(recs.len(), 2, "one record per run");
    let logs: Vec<&str> = recs
        .iter()
        .map(|r| r["legs"]["engine"]["log"].as_str().unwrap())
        .collect();
    assert_ne!(logs[0], logs[1], "each record names its own logs");
    for r in &recs {
        assert_eq!(r["exit_status"], 0);
        assert!(
            r["legs"]["engine"]["failure"].is_null(),
            "{}",
            r["legs"]["engine"]
        );
    }
    assert!(f.gone());
}

/// Reads `n` bytes of a child's pipe, then closes it: a reader like `| head -c n`.
fn read_then_close(mut pipe: impl Read, n: usize) {
    let mut buf = vec![0u8; n];
    let _ = pipe.read_exact(&mut buf);
}

/// Issue item 2: `orchestrator run UNIT 2>&1 >/dev/null | head -12` exited 101 ("failed
/// printing to stderr: Broken pipe"), wrote no record, and left the oracle leg running. Now
/// the run goes on and the record is written, whichever stream is closed.
#[test]
fn a_closed_stderr_or_stdout_costs_no_record() {
    for stream in ["stderr", "stdout"] {
        let f = Fixture::new(&format!("closed-{stream}"), "", "", "");
        let mut c = f.cmd("run");
        let (so, se) = if stream == "stderr" {
            (Stdio::null(), Stdio::piped())
        } else {
            (Stdio::piped(), Stdio::null())
        };
        let mut child = c.stdout(so).stderr(se).spawn().unwrap();
        if let Some(e) = child.stderr.take() {
            read_then_close(e, 100);
        }
        if let Some(o) = child.stdout.take() {
            read_then_close(o, 10);
        }
        let st = child.wait().unwrap();
        assert_eq!(st.code(), Some(0), "closed {stream}");
        let recs = f.records();
        assert_eq!(recs.len(), 1, "closed {stream}: the record is written");
        assert_eq!(recs[0]["exit_status"], 0);
        assert!(f.gone(), "closed {stream}");
    }
}

fn signal(child: &Child, sig: i32) {
    kill(child, sig);
}

/// SIGINT during preflight exited with no message and left `python -m oracle check` running.
#[test]
fn sigint_during_preflight_stops_the_oracle_check_and_says_so() {
    let f = Fixture::new("int-preflight", "", "--fault=check-slow", "");
    for sub in ["run", "check"] {
        let child = f
            .cmd(sub)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        // The fake check runs under the marker: wait for it.
        assert!(wait_until(Duration::from_secs(10), || marked(&f.marker)
            .iter()
            .any(|&p| cmdline(p).contains("oracle check"))));
        signal(&child, libc::SIGINT);
        let out = child.wait_with_output().unwrap();
        let all = text(&out);
        assert_eq!(out.status.code(), Some(2), "{sub}: {all}");
        assert!(
            all.contains("SIGINT during the oracle check"),
            "{sub}: {all}"
        );
        assert!(
            f.gone(),
            "{sub}: the oracle check outlived the orchestrator"
        );
    }
    assert!(f.records().is_empty());
}

/// SIGTERM while waiting for the lease: a message, exit 2, nothing run.
#[test]
fn sigterm_while_waiting_for_the_lease_says_so() {
    let f = Fixture::new("term-lease", "", "", "");
    let locks = f.path("locks");
    let mut holder = lease_cmd(&locks, &f.marker, &["sleep", "30"])
        .spawn()
        .unwrap();
    assert!(wait_until(Duration::from_secs(10), || !lease_is_free(
        &locks
    )));
    let child = f
        .cmd("run")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    std::thread::sleep(Duration::from_millis(1500));
    signal(&child, libc::SIGTERM);
    let out = child.wait_with_output().unwrap();
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
    assert!(
        text(&out).contains("interrupted by SIGTERM while waiting for the cpu lease"),
        "{}",
        text(&out)
    );
    kill(&holder, libc::SIGTERM);
    let _ = holder.wait();
    assert!(f.gone());
}

/// Interrupted before anything was measured: no record, and the run's logs are not left beside
/// the records (where `report` and git saw them) but kept in `.unrecorded/`.
#[test]
fn an_interrupt_before_any_measurement_leaves_no_record_and_no_stray_logs() {
    let f = Fixture::new("int-first-leg", "", "--fault=hang-generate", "");
    let child = f
        .cmd("run")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    f.wait_for_log(".oracle.log", "hanging on purpose");
    signal(&child, libc::SIGINT);
    let out = child.wait_with_output().unwrap();
    let all = text(&out);
    assert_eq!(out.status.code(), Some(2), "{all}");
    assert!(all.contains("interrupted by SIGINT"), "{all}");
    assert!(all.contains(".unrecorded"), "{all}");
    assert!(f.gone());
    let names: Vec<String> = files(&f.path("records/fake"))
        .iter()
        .map(|p| p.file_name().unwrap().to_string_lossy().into_owned())
        .collect();
    assert_eq!(names, vec![".unrecorded".to_string()], "{names:?}");
    let kept = files(&f.path("records/fake/.unrecorded"));
    assert!(
        kept.iter()
            .any(|p| p.to_string_lossy().ends_with(".oracle.log")),
        "{kept:?}"
    );
    // report reads records only, never .unrecorded/.
    let rep = Command::new(BIN)
        .args(["report", "--records-dir"])
        .arg(f.path("records"))
        .arg("--out")
        .arg(f.path("BENCHMARKS.md"))
        .output()
        .unwrap();
    assert_eq!(rep.status.code(), Some(0), "{}", text(&rep));
}

/// Issue item 5 for `run`: after `kill -9` of the orchestrator, the leg kept running unleased.
/// Now it dies with it, the lease is free, and the next run in the directory moves the dead
/// run's files to `.unrecorded/`.
#[test]
fn kill_9_of_a_run_takes_its_leg_along_and_the_next_run_sweeps_its_files() {
    let f = Fixture::new("run-kill9", "--fault=hang-generate", "", "");
    let mut child = f
        .cmd("run")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    f.wait_for_log(".engine.log", "hanging on purpose");
    kill(&child, libc::SIGKILL);
    let _ = child.wait();
    assert!(
        f.gone(),
        "{:?}",
        marked(&f.marker)
            .iter()
            .map(|&p| cmdline(p))
            .collect::<Vec<_>>()
    );
    assert!(wait_until(Duration::from_secs(5), || lease_is_free(
        &f.path("locks")
    )));
    // The next run sweeps the dead one's files, then runs (its engine hangs: interrupt it).
    let child = f
        .cmd("run")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    f.wait_for_log(".oracle.log", "fake leg pid");
    assert!(wait_until(Duration::from_secs(10), || {
        files(&f.path("records/fake/.unrecorded"))
            .iter()
            .any(|p| p.to_string_lossy().ends_with(".engine.log"))
    }));
    signal(&child, libc::SIGINT);
    let out = child.wait_with_output().unwrap();
    assert!(text(&out).contains("moved the files of"), "{}", text(&out));
    assert!(f.gone());
}

/// A SIGSTOPped leg ran past 425 s with no watchdog firing (battery deadline 3,600 s). Once a
/// leg's pace is known, falling silent for max(stall_min_s, stall_factor x its slowest interval)
/// stops it with a named failure.
#[test]
fn a_stopped_leg_is_named_and_killed_by_its_progress_deadline() {
    let f = Fixture::new(
        "stall",
        "--fault=sigstop-later",
        "",
        "stall_min_s = 1.5\nstall_factor = 10",
    );
    let t = Instant::now();
    let out = f.cmd("run").output().unwrap();
    assert!(t.elapsed() < Duration::from_secs(15), "{:?}", t.elapsed());
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    let rec = &f.records()[0];
    let failure = &rec["legs"]["engine"]["failure"];
    assert_eq!(failure["kind"], "stalled", "{failure}");
    let msg = failure["message"].as_str().unwrap();
    assert!(
        msg.contains("sent nothing for") && msg.contains("progress deadline"),
        "{msg}"
    );
    assert!(rec["legs"]["engine"]["watchdog"]["signals"]
        .as_array()
        .unwrap()
        .iter()
        .any(|s| s == "TERM"));
    assert!(f.gone());
}

fn cmdline(pid: i32) -> String {
    std::fs::read(format!("/proc/{pid}/cmdline"))
        .map(|b| String::from_utf8_lossy(&b).replace('\0', " "))
        .unwrap_or_default()
}

/// SIGINT after the legs (during the gates or the record's writing) was ignored and the run
/// ended 0. Now the measured record is still written, says it was interrupted, and the run
/// ends 2 with a message. The engine leg (second) leaves a helper that signals the orchestrator
/// the moment the leg has exited.
#[test]
fn sigint_after_the_legs_keeps_the_record_and_ends_2() {
    // The helper needs the CPU between the leg's exit and the orchestrator's; on a loaded
    // machine it may get it only after, and then says so in the leg's log (fake_leg.py LATE):
    // such a run tests nothing and is run again. Any other run is judged.
    let late = "the orchestrator had exited before the signal";
    let (f, out) = (0..5)
        .map(|_| {
            let f = Fixture::new("int-gates", "--fault=sigint-after-exit", "", "");
            let out = f.cmd("run").output().unwrap();
            (f, out)
        })
        .find(|(f, out)| {
            if out.status.code() != Some(0) {
                return true;
            }
            // The helper writes after the orchestrator is gone: give it a moment.
            let log = || {
                f.records()
                    .first()
                    .and_then(|r| r["legs"]["engine"]["log"].as_str().map(str::to_string))
                    .and_then(|p| std::fs::read_to_string(f.path("records/fake").join(p)).ok())
                    .unwrap_or_default()
            };
            let until = Instant::now() + Duration::from_secs(3);
            while Instant::now() < until && !log().contains(late) {
                std::thread::sleep(Duration::from_millis(20));
            }
            !log().contains(late)
        })
        .expect("in five runs the helper never signalled before the orchestrator exited");
    let all = text(&out);
    assert_eq!(out.status.code(), Some(2), "{all}");
    assert!(all.contains("interrupted by SIGINT"), "{all}");
    let recs = f.records();
    assert_eq!(recs.len(), 1, "{all}");
    // Both legs were measured whole; the record says when the signal came, unless it came
    // after the record was on disk (then only the exit status and the message say so).
    assert!(
        recs[0]["legs"]["engine"]["failure"].is_null(),
        "{}",
        recs[0]["legs"]["engine"]
    );
    if let Some(how) = recs[0]["interrupted"].as_str() {
        assert!(how.contains("after the legs"), "{how}");
        assert_eq!(recs[0]["exit_status"], 2);
    } else {
        assert!(all.contains("after the record was written"), "{all}");
    }
    assert!(f.gone());
}

/// Inputs that passed `check` and then panicked `run` (a watchdog of 1e300 s, exit 101 with the
/// oracle leg left running), or were accepted silently (a sampler busy-looping a core, a name
/// with a newline, max_batch 0, a golden in float64, prompt ids outside the vocabulary, a
/// golden cut shorter than max_tokens), each refused by `check` and `run` with a named error.
#[test]
fn hostile_inputs_are_named_by_check_and_run() {
    let set = |d: &Path, from: &str, to: &str| {
        let p = d.join("unit.toml");
        let t = std::fs::read_to_string(&p).unwrap();
        assert!(t.contains(from), "{from}");
        std::fs::write(&p, t.replacen(from, to, 1)).unwrap();
    };
    type Edit = Box<dyn Fn(&Path)>;
    let cases: Vec<(&str, Edit, &str)> = vec![
        (
            "battery_s",
            Box::new(move |d| set(d, "battery_s = 20", "battery_s = 1e300")),
            "watchdog.battery_s = ",
        ),
        (
            "grace_s",
            Box::new(move |d| set(d, "grace_s = 1", "grace_s = 1e300")),
            "watchdog.grace_s = ",
        ),
        (
            "host_period_ms",
            Box::new(move |d| set(d, "[watchdog]", "[sampler]\nhost_period_ms = 0\n[watchdog]")),
            "sampler.host_period_ms = 0",
        ),
        (
            "name",
            Box::new(move |d| set(d, "name = \"fake\"", "name = \"a\\nb\"")),
            "not usable as a directory name",
        ),
        (
            "max_batch",
            Box::new(move |d| set(d, "num_blocks = 64", "num_blocks = 64\nmax_batch = 0")),
            "engine.max_batch = 0",
        ),
        (
            "float64",
            Box::new(move |d| {
                set(
                    d,
                    "file = \"golden.json\"",
                    "file = \"golden.json\"\ndtype = \"float64\"",
                )
            }),
            "golden[0].dtype = \"float64\"",
        ),
        (
            "vocabulary",
            Box::new(|d: &Path| {
                let p = d.join("prompts.json");
                let t = std::fs::read_to_string(&p).unwrap();
                std::fs::write(&p, t.replacen("[1,2,3]", "[1,2,5000]", 1)).unwrap();
            }),
            "outside the model's vocabulary [0, 1000)",
        ),
        (
            "short golden",
            Box::new(|d: &Path| {
                let p = d.join("golden.json");
                let mut g: Value =
                    serde_json::from_str(&std::fs::read_to_string(&p).unwrap()).unwrap();
                g["outputs"][0]["tokens"]
                    .as_array_mut()
                    .unwrap()
                    .truncate(5);
                std::fs::write(&p, g.to_string()).unwrap();
            }),
            "holds 5 token(s) but battery.max_tokens = 8",
        ),
    ];
    for (what, edit, said) in cases {
        let f = Fixture::new(&format!("input-{what}"), "", "", "");
        std::fs::write(
            f.path("model/config.json"),
            r#"{"architectures": ["LlamaForCausalLM"], "num_hidden_layers": 1, "vocab_size": 1000}"#,
        )
        .unwrap();
        edit(f.dir.path());
        for sub in ["check", "run"] {
            let out = f.cmd(sub).output().unwrap();
            let all = text(&out);
            assert_eq!(out.status.code(), Some(2), "{what}, {sub}: {all}");
            assert!(all.contains(said), "{what}, {sub}: {all}");
        }
        assert!(f.records().is_empty(), "{what}");
        assert!(f.gone(), "{what}");
    }
}
