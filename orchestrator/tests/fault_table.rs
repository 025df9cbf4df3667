//! scripts/fault-table.sh end to end on the CPU: the real engine (target/release/engine) with
//! each planted fault (ENGINE_FAULT) on tiny-llama and tiny-qwen, engine leg only, then the
//! table. Every fault must be refused and both clean legs must pass. Where the release engine
//! is missing the test says why and returns, unless CI=true, where that is a failure.

mod real_engine;

use std::path::Path;
use std::process::Command;

#[test]
fn every_planted_fault_is_refused_and_no_clean_leg_on_the_cpu() {
    let Some((root, _)) = real_engine::release_engine("the fault table") else {
        return;
    };
    let tmp = tempfile::tempdir().unwrap();
    let bin = Path::new(env!("CARGO_BIN_EXE_orchestrator"))
        .parent()
        .unwrap();
    let out = Command::new(root.join("scripts/fault-table.sh"))
        .arg("--bin")
        .arg(bin)
        .arg("--out")
        .arg(tmp.path().join("out"))
        .arg("--lock-dir")
        .arg(tmp.path().join("locks"))
        .arg(root.join("goldens/tiny-llama/unit.toml"))
        .arg(root.join("goldens/tiny-qwen/unit.toml"))
        .env_remove("ENGINE_FAULT")
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{stdout}\n{stderr}");
    let table = std::fs::read_to_string(tmp.path().join("out/fault-table.md")).unwrap();
    assert_eq!(table, stdout, "the table on stdout is the file");
    for (unit, faults) in [
        (
            "tiny-llama",
            &["rope_shift", "norm_skip", "attn_scale_d", "kv_group"][..],
        ),
        (
            "tiny-qwen",
            &[
                "rope_shift",
                "norm_skip",
                "attn_scale_d",
                "kv_group",
                "drop_bias",
            ][..],
        ),
    ] {
        assert!(
            table.contains(&format!(
                "| none (clean) | {unit} | pass | - | - | - | ok: clean, passed |"
            )),
            "{table}"
        );
        for f in faults {
            let row = table
                .lines()
                .find(|l| l.starts_with(&format!("| {f} | {unit} |")))
                .unwrap_or_else(|| panic!("no row for {f} on {unit}:\n{table}"));
            assert!(
                row.contains("| refused (teacher-forced) |") && row.ends_with("| ok: refused |"),
                "{row}"
            );
        }
    }
    assert!(
        table.contains(
            "9 faulted run(s): 9 refused, 0 without effect, 0 not refused; 2 clean run(s) passed"
        ),
        "{table}"
    );
    // Nothing went to the repository's records.
    assert!(stderr.contains("/out/records/tiny-llama/"), "{stderr}");
}
