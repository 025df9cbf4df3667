//! Nothing outlives the orchestrator: a child it started (the job of `lease -- CMD`, a leg, the
//! oracle's check) dies with it, even under `kill -9`, with the child's own children, and the
//! lease is free once they are gone; SIGINT and SIGTERM end it with a message and exit 2.

use std::path::Path;
use std::process::{Child, Command, Stdio};
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
