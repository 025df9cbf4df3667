//! Signals at random moments, and runs at once. A run over the fake legs gets SIGINT, SIGTERM,
//! SIGHUP or SIGKILL after a random delay (in preflight, waiting for the lease, in a leg, in the
//! gates or the record's writing, or after it ended); then nothing of it may be left running,
//! the lease must be free, every record whole, and a run that said it kept a record must have.
//! Then several runs of one unit at once, one of them signalled.

use std::path::Path;
use std::process::Child;
use std::time::Duration;

use crate::tally::{self, check_orphans, End, Ran, Tally};
use crate::{check_recorded, clip, judge_orchestrator, orchestrator, Rng};

const SIGNALS: [i32; 4] = [libc::SIGINT, libc::SIGTERM, libc::SIGHUP, libc::SIGKILL];

/// Where the signal is aimed: the fake legs' options and an optional lease holder.
const SETUPS: &[(&str, &str, &str, bool)] = &[
    ("plain", "", "", false),
    ("plain", "", "", false),
    ("engine hangs", "--fault=hang-generate", "", false),
    ("slow oracle check", "", "--fault=check-slow", false),
    ("lease held", "", "", true),
    ("engine stops itself", "--fault=sigstop-later", "", false),
    (
        "engine signals the run after its exit",
        "--fault=sigint-after-exit",
        "",
        false,
    ),
];

fn run_cmd(d: &Path, marker: &str) -> std::process::Command {
    let mut c = orchestrator(marker);
    c.arg("run")
        .arg(d.join("unit.toml"))
        .arg("--records-dir")
        .arg(d.join("records"))
        .arg("--lock-dir")
        .arg(d.join("locks"))
        .arg("--python")
        .arg(d.join("python.sh"));
    c
}

fn lease_free(locks: &Path) -> bool {
    let out = std::process::Command::new(crate::BIN)
        .args(["lease", "--no-wait", "--lock-dir"])
        .arg(locks)
        .args(["--", "true"])
        .output();
    out.is_ok_and(|o| o.status.success())
}

fn hold_lease(locks: &Path, marker: &str, secs: &str) -> Child {
    orchestrator(marker)
        .args(["lease", "--lock-dir"])
        .arg(locks)
        .args(["--", "sleep", secs])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap()
}

/// How a signalled run ended: killed (SIGKILL), finished before the signal, or exit 2 saying
/// it was interrupted.
fn judge_signalled(r: &Ran, sig: i32) -> End {
    if let Some(c) = r.crashed() {
        return End::Panic(c);
    }
    if r.status.is_none() {
        return End::Hang(clip(&r.text(), 300));
    }
    if sig == libc::SIGKILL && r.signal() == Some(libc::SIGKILL) {
        return End::Accepted;
    }
    // The signal came before the orchestrator had installed its handler (its first
    // milliseconds, before it said or started anything): the default action ended it.
    if r.signal() == Some(sig) && r.text().is_empty() {
        return End::Accepted;
    }
    match r.code() {
        Some(0) | Some(1) => End::Accepted,
        Some(2) if r.text().contains("interrupted") || r.text().contains("SIG") => End::Named,
        _ => judge_orchestrator(r),
    }
}

pub fn run(rng: &mut Rng, t: &mut Tally) {
    for i in 0..36 {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        let (what, e, o, held) = *rng.pick(SETUPS);
        crate::units::write_unit(d, e, o);
        let marker = format!("hostile-signal-{}-{i}", std::process::id());
        let holder = held.then(|| hold_lease(&d.join("locks"), &marker, "1.5"));
        let sig = *rng.pick(&SIGNALS);
        let delay = Duration::from_millis(rng.below(1800) as u64);
        let r = tally::run(run_cmd(d, &marker), Duration::from_secs(60), |pid| {
            std::thread::sleep(delay);
            // SAFETY: a signal to the orchestrator this attempt started.
            unsafe { libc::kill(pid as i32, sig) };
        });
        if let Some(mut h) = holder {
            let _ = h.wait();
        }
        let how = format!("{what}, signal {sig} after {} ms", delay.as_millis());
        let end = judge_signalled(&r, sig);
        let recs = tally::records(t, "signals", &d.join("records/fake"));
        if sig != libc::SIGKILL {
            check_recorded(t, "signals", &r, 0, &recs);
        }
        t.add("signals", &how, end);
        check_orphans(t, "signals", &marker);
        if !lease_free(&d.join("locks")) {
            t.orphaned("signals", &[format!("the lease is still held after {how}")]);
        }
    }
}

/// Three runs of one unit at once on one lease, one of them signalled at a random moment:
/// each that measured keeps its own record.
pub fn concurrent(rng: &mut Rng, t: &mut Tally) {
    for i in 0..4 {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        crate::units::write_unit(d, "", "");
        let marker = format!("hostile-concurrent-{}-{i}", std::process::id());
        let victim = rng.below(3);
        let sig = *rng.pick(&SIGNALS);
        let delay = Duration::from_millis(rng.below(4000) as u64);
        let handles: Vec<_> = (0..3)
            .map(|k| {
                let c = run_cmd(d, &marker);
                std::thread::spawn(move || {
                    tally::run(c, Duration::from_secs(90), |pid| {
                        if k == victim {
                            std::thread::sleep(delay);
                            // SAFETY: a signal to a run this attempt started.
                            unsafe { libc::kill(pid as i32, sig) };
                        }
                    })
                })
            })
            .collect();
        let ran: Vec<Ran> = handles.into_iter().map(|h| h.join().unwrap()).collect();
        let recs = tally::records(t, "concurrent", &d.join("records/fake"));
        let kept = ran
            .iter()
            .filter(|r| {
                matches!(r.code(), Some(0) | Some(1))
                    || r.stderr.contains("keeps what was measured")
            })
            .count();
        if kept != recs.len() {
            t.torn(
                "concurrent",
                format!(
                    "{kept} run(s) kept a record, {} record(s) written",
                    recs.len()
                ),
            );
        }
        for (k, r) in ran.iter().enumerate() {
            let end = if k == victim {
                judge_signalled(r, sig)
            } else {
                judge_orchestrator(r)
            };
            t.add(
                "concurrent",
                &format!("run {k} of 3, signal {sig} to run {victim}"),
                end,
            );
        }
        check_orphans(t, "concurrent", &marker);
    }
}
