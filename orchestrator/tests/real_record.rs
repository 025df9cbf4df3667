//! `report` and `compare` read the records `orchestrator run` really writes, not only the
//! synthetic ones: two runs of the fake legs (tests/fake_leg.py), one clean and one whose
//! engine gives wrong tokens, then both commands over them.

mod common;

use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::Command;

const BIN: &str = env!("CARGO_BIN_EXE_orchestrator");

/// A unit whose legs are the fake, with two prompts; `engine_args` go to the engine's fake.
fn unit(d: &Path, engine_args: &str) {
    common::write_fake_unit(d, &[&[1, 2, 3], &[4, 5]], engine_args, "");
    std::fs::write(
        d.join("unit.toml"),
        format!(
            "name = \"fake\"\nmodel = \"model\"\n[battery]\nprompts = \"prompts.json\"\nmax_tokens = 8\nwarmup = 0\nrepeat = 2\n[[golden]]\nfile = \"golden.json\"\n[engine]\nbinary = \"{}\"\nblock_size = 16\nnum_blocks = 64\n[oracle]\nbackend = \"transformers\"\n",
            d.join("engine.sh").display()
        ),
    )
    .unwrap();
}

fn run(d: &Path, records: &Path) -> i32 {
    Command::new(BIN)
        .arg("run")
        .arg(d.join("unit.toml"))
        .arg("--records-dir")
        .arg(records)
        .arg("--lock-dir")
        .arg(d.join("locks"))
        .arg("--python")
        .arg(d.join("python.sh"))
        .arg("-q")
        .output()
        .unwrap()
        .status
        .code()
        .unwrap()
}

fn records(dir: &Path) -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = std::fs::read_dir(dir.join("fake"))
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|x| x == "json"))
        .collect();
    v.sort();
    v
}

#[test]
fn report_and_compare_read_what_run_writes() {
    let tmp = tempfile::tempdir().unwrap();
    let recs = tmp.path().join("records");
    let d = tmp.path().join("unit");
    unit(&d, "");
    assert_eq!(run(&d, &recs), 0);
    // The same unit file (so the records are like-for-like), now with an engine that errs.
    unit(&d, "--fault=wrong-tokens");
    // One second apart at least, so the two records' stamps and creation times differ.
    std::thread::sleep(std::time::Duration::from_millis(1100));
    assert_eq!(run(&d, &recs), 1);
    let rs = records(&recs);
    assert_eq!(rs.len(), 2, "{rs:?}");

    let out = tmp.path().join("BENCHMARKS.md");
    let o = Command::new(BIN)
        .arg("report")
        .arg("--records-dir")
        .arg(&recs)
        .arg("--out")
        .arg(&out)
        .output()
        .unwrap();
    assert_eq!(
        o.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
    let md = std::fs::read_to_string(&out).unwrap();
    // The latest run's engine gave wrong tokens: no speed number, and the token gate named.
    assert!(
        md.contains("**No speed number, by the unit's own rule.** The rule that refused: the token gate (engine leg)"),
        "{md}"
    );
    assert!(md.contains("(refused)"), "{md}");

    // The clean record against itself.
    let o = Command::new(BIN)
        .arg("compare")
        .arg(&rs[0])
        .arg(&rs[0])
        .args(["--format", "json"])
        .output()
        .unwrap();
    assert_eq!(
        o.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
    let v: Value = serde_json::from_slice(&o.stdout).unwrap();
    let rows = v["units"][0]["rows"].as_array().unwrap();
    assert!(rows.len() >= 6, "{v}");
    // Identical samples: no change, p = 1; a few noisy samples may still leave the interval
    // too wide for SAME, but never FASTER or SLOWER.
    for r in rows {
        assert_eq!(
            (r["change"].as_f64(), r["p"].as_f64()),
            (Some(1.0), Some(1.0)),
            "{r}"
        );
        assert!(r["verdict"] == "SAME" || r["verdict"] == "AMBIGUOUS", "{r}");
    }
    // Clean against wrong tokens: the head's engine is refused, so nothing is judged.
    let o = Command::new(BIN)
        .arg("compare")
        .arg(&rs[0])
        .arg(&rs[1])
        .args(["--format", "json"])
        .output()
        .unwrap();
    let v: Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(o.status.code(), Some(0), "{v}");
    let rows = v["units"][0]["rows"].as_array().unwrap();
    assert!(rows.iter().all(|r| r["verdict"] == "UNGATED"), "{v}");
}
