//! The token gate end to end over tests/fake_leg.py: a teacher-forced leg passes when it agrees
//! with the golden or differs within the dtype's rounding, and is refused, naming the position,
//! when its gap plus the golden's margin is beyond it, when its logits are not finite, or when it
//! does not answer verify; the golden's own implementation is held to exact match at batch 1;
//! `--legs engine` runs the engine alone. Each test writes into its own temporary directory.

mod common;

use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

const BIN: &str = env!("CARGO_BIN_EXE_orchestrator");
const PROMPTS: [&[u32]; 3] = [&[1, 2, 3], &[4, 5], &[6, 7, 8, 9]];

/// A fake unit (batch sizes 1 and 2, 8 tokens) whose golden margin at prompt 0's position 5 is
/// `margin_p0_5` (0.5 elsewhere).
fn unit(engine_args: &str, oracle_args: &str, margin_p0_5: f64) -> tempfile::TempDir {
    unit_at(engine_args, oracle_args, margin_p0_5, "[1, 2]")
}

fn unit_at(
    engine_args: &str,
    oracle_args: &str,
    margin_p0_5: f64,
    batch_sizes: &str,
) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let engine = common::write_fake_unit(d, &PROMPTS, engine_args, oracle_args);
    let path = d.join("golden.json");
    let mut g: Value = serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    g["outputs"][0]["margins"][5] = margin_p0_5.into();
    std::fs::write(&path, g.to_string()).unwrap();
    std::fs::write(
        d.join("unit.toml"),
        format!(
            "name = \"fake\"\nmodel = \"model\"\n[battery]\nprompts = \"prompts.json\"\nmax_tokens = 8\n\
             warmup = 0\nrepeat = 1\nbatch_sizes = {batch_sizes}\n[[golden]]\nfile = \"golden.json\"\n\
             [engine]\nbinary = \"{}\"\nblock_size = 16\nnum_blocks = 64\n[oracle]\nbackend = \"transformers\"\n\
             [watchdog]\nload_s = 20\nwarmup_s = 20\nbattery_s = 20\nverify_s = 20\nshutdown_s = 5\ngrace_s = 1\n",
            engine.display()
        ),
    )
    .unwrap();
    dir
}

fn run(d: &Path, extra: &[&str]) -> (Output, Value) {
    let out = Command::new(BIN)
        .arg("run")
        .arg(d.join("unit.toml"))
        .args(["--records-dir", &d.join("records").display().to_string()])
        .args(["--lock-dir", &d.join("locks").display().to_string()])
        .args(["--python", &d.join("python.sh").display().to_string()])
        .args(extra)
        .output()
        .unwrap();
    let json: Vec<PathBuf> = std::fs::read_dir(d.join("records/fake"))
        .map(|rd| rd.flatten().map(|e| e.path()).collect())
        .unwrap_or_default();
    let json = json
        .into_iter()
        .find(|p| p.extension().is_some_and(|x| x == "json"))
        .unwrap_or_else(|| panic!("no record\n{}", text(&out)));
    let rec = serde_json::from_str(&std::fs::read_to_string(json).unwrap()).unwrap();
    (out, rec)
}

fn text(o: &Output) -> String {
    format!(
        "status {:?}\n--- stdout\n{}\n--- stderr\n{}",
        o.status.code(),
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

/// The gate's verdicts on `leg`: (verdict, sentence) each.
fn token(rec: &Value, leg: &str) -> Vec<(String, String)> {
    rec["gates"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|g| g["gate"] == "token" && g["leg"] == leg)
        .map(|g| {
            (
                g["verdict"].as_str().unwrap().to_string(),
                g["sentence"].as_str().unwrap().to_string(),
            )
        })
        .collect()
}

#[test]
fn a_gap_within_the_dtypes_rounding_passes_and_one_beyond_it_is_refused_naming_the_position() {
    // The golden's own margin there is 0: its top two tied. float32 at |logit| 3, one layer:
    // 1.25 * sqrt(2) * 3 * 2 * 2^-24 = 6.3e-7.
    let d = unit("--fault=wrong-tokens --gap=1e-7", "", 0.0);
    let (out, rec) = run(d.path(), &[]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    let v = token(&rec, "engine");
    assert_eq!(v[0].0, "pass", "{v:?}");
    assert!(
        v[0].1.starts_with("TOKEN MATCH (teacher-forced): 46/48 positions over 3 prompt(s) at batch(es) [1, 2] (path decode); 2 agree within tolerance (the closest: prompt p0 position 5 (batch 1, path decode): the leg's argmax 68, the golden's token 67; leg gap 1.000e-7 + golden margin 0 = 1.000e-7 <= tolerance 6.322e-7"),
        "{v:?}"
    );
    let d = unit("--fault=wrong-tokens --gap=1e-5", "", 0.0);
    let (out, rec) = run(d.path(), &[]);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    let v = token(&rec, "engine");
    assert_eq!(v[0].0, "refused", "{v:?}");
    assert!(
        v[0].1.contains("Engine: prompt p0 position 5 (batch 1, path decode): the leg's argmax 68, the golden's token 67; leg gap 1.000e-5 + golden margin 0 = 1.000e-5 > tolerance 6.322e-7 (1.25 u sqrt(2L) |logit| per side: float32 and float32, L = 1, |logit| 3.000, the leg's own scale)"),
        "{v:?}"
    );
}

#[test]
fn another_token_where_the_golden_was_sure_is_refused_at_any_gap() {
    let d = unit("--fault=wrong-tokens --gap=0", "", 0.5);
    let (out, rec) = run(d.path(), &[]);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    let v = token(&rec, "engine");
    assert!(
        v[0].1
            .contains("leg gap 0 + golden margin 0.5000 = 0.5000 > tolerance"),
        "{v:?}"
    );
}

#[test]
fn non_finite_logits_are_refused() {
    let d = unit("--fault=nan-verify", "", 0.5);
    let (out, rec) = run(d.path(), &[]);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    let v = token(&rec, "engine");
    assert!(
        v[0].1.contains("Engine: prompt p0 position 5 (batch 1, path decode): the leg's argmax 68, the golden's token 67; the leg's logits there are not finite (gap null)"),
        "{v:?}"
    );
}

#[test]
fn a_leg_that_does_not_answer_verify_is_refused_twice_and_named() {
    let d = unit("--fault=no-verify", "", 0.5);
    let (out, rec) = run(d.path(), &[]);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    let v = token(&rec, "engine");
    assert!(
        v[0].1.starts_with("The engine leg's tokens could not be judged by teacher forcing against the golden golden.json: batch 1: no answer (the leg failed in phase verify); batch 2: no answer (the leg failed in phase verify)"),
        "{v:?}"
    );
    let leg = rec["gates"]
        .as_array()
        .unwrap()
        .iter()
        .find(|g| g["gate"] == "leg" && g["leg"] == "engine")
        .unwrap();
    assert!(
        leg["sentence"]
            .as_str()
            .unwrap()
            .contains("failed in phase verify")
            && leg["sentence"]
                .as_str()
                .unwrap()
                .contains("malformed_request"),
        "{leg}"
    );
    // The battery ran: its timings are kept (and marked refused).
    assert!(rec["axes"][0]["ours"].as_f64().unwrap() > 0.0);
}

#[test]
fn the_goldens_own_implementation_off_its_golden_is_judged_by_teacher_forcing() {
    // The oracle reports the golden's backend: exact at batch 1, teacher-forced at batch 2; its
    // free-running tokens differ at prompt 0's position 5. Fed the golden's tokens at batch 1,
    // it takes the other token there by a gap of 0 where the golden's margin is 0: a tie, so
    // its rows pass, and the record says they left their own golden.
    let d = unit("", "--backend=fake --fault=wrong-tokens --gap=0", 0.0);
    let (out, rec) = run(d.path(), &[]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    let v = token(&rec, "oracle");
    assert_eq!(v.len(), 1, "{v:?}");
    assert!(
        v[0].1.starts_with("TOKEN MATCH: 21/24 over 3 prompt(s) (full rows=2, short rows=0) at batch [1] (exact: golden.json was captured by the same implementation (fake) on cpu in float32, and these rows ran at batch 1), not its own golden's tokens bit for bit (first divergences: p0 at 5), so judged as another implementation is: TOKEN MATCH (teacher-forced)"),
        "{v:?}"
    );
    // A gap beyond the tolerance there is refused: the exact mismatch and the teacher-forced
    // position both named.
    let d = unit("", "--backend=fake --fault=wrong-tokens --gap=1", 0.0);
    let (out, rec) = run(d.path(), &[]);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    let v = token(&rec, "oracle");
    assert!(
        v[0].1.starts_with("The oracle leg's tokens do not match the golden golden.json: TOKEN MATCH: 21/24 over 3 prompt(s) (full rows=2, short rows=0)")
            && v[0].1.contains("Fed the golden's tokens at those batch sizes, as rows off their own golden are judged, it did not pass either")
            && v[0].1.contains("Oracle: prompt p0 position 5 (batch 1")
            && v[0].1.contains("Hint: these rows are held to exact match (golden.json was captured by the same implementation (fake) on cpu in float32, and these rows ran at batch 1)"),
        "{v:?}"
    );
}

#[test]
fn a_leg_without_scale_borrows_the_other_legs_and_alone_cannot_be_judged() {
    let d = unit("--fault=wrong-tokens --gap=1e-7 --scale=none", "", 0.0);
    let (out, rec) = run(d.path(), &[]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    let v = token(&rec, "engine");
    assert!(
        v[0].1.contains(
            "(1.25 u sqrt(2L) |logit| per side: float32 and float32, L = 1, |logit| 3.000, the oracle leg's scale at this position)"
        ),
        "{v:?}"
    );
    // The engine alone: no other leg to borrow from, the golden records none.
    let d = unit("--fault=wrong-tokens --gap=1e-6 --scale=none", "", 0.0);
    let (out, rec) = run(d.path(), &["--legs", "engine"]);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    let v = token(&rec, "engine");
    assert!(
        v[0].1.contains("cannot be judged, because no scale is known there: the engine leg reports none (path decode), and neither the other leg nor the golden has one at this position"),
        "{v:?}"
    );
}

#[test]
fn one_leg_alone_runs_and_the_gates_that_need_the_other_say_why_not() {
    let d = unit("", "", 0.5);
    let (out, rec) = run(d.path(), &["--legs", "engine"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    assert_eq!(
        rec["legs"]["oracle"]["not_run"],
        "orchestrator run --legs engine"
    );
    assert!(rec["legs"]["oracle"]["phases"]
        .as_array()
        .unwrap()
        .is_empty());
    assert_eq!(token(&rec, "engine")[0].0, "pass");
    for (gate, leg) in [("token", Value::from("oracle")), ("kv", Value::Null)] {
        let g = rec["gates"]
            .as_array()
            .unwrap()
            .iter()
            .find(|g| g["gate"] == gate && g["leg"] == leg)
            .unwrap();
        assert_eq!(g["verdict"], "not_applicable", "{g}");
        assert!(
            g["reason"]
                .as_str()
                .unwrap()
                .contains("the oracle leg was not run (orchestrator run --legs engine)"),
            "{g}"
        );
    }
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        stdout.contains("host: the oracle leg was not run (orchestrator run --legs engine)"),
        "{stdout}"
    );
}

#[test]
fn a_batch_larger_than_the_battery_runs_its_prompts_over_again_and_each_row_names_its_prompt() {
    // Three prompts at batch 8: the request holds eight sequences, the battery's in turn; each
    // row names its battery prompt (index) and repeat (copy), in the battery's results and in
    // the teacher-forced verify alike, and the gate judges every row against its prompt.
    let d = unit_at("--fault=wrong-tokens --gap=1e-7", "", 0.0, "[1, 8]");
    let (out, rec) = run(d.path(), &[]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    let engine = &rec["legs"]["engine"];
    let rows = |v: &Value| -> Vec<(u64, u64)> {
        v.as_array()
            .unwrap()
            .iter()
            .map(|r| {
                (
                    r["index"].as_u64().unwrap(),
                    r["copy"].as_u64().unwrap_or(0),
                )
            })
            .collect()
    };
    let want = vec![
        (0, 0),
        (1, 0),
        (2, 0),
        (0, 1),
        (1, 1),
        (2, 1),
        (0, 2),
        (1, 2),
    ];
    let batch8 = engine["requests"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["kind"] == "batch" && r["batch"] == 8)
        .expect("a batch-8 request");
    assert_eq!(rows(&batch8["results"]), want);
    // Every copy of a prompt got that prompt's tokens (the fake plants its fault by the
    // request's index 0, so prompt 0's copies differ there).
    let toks = |i: usize| batch8["results"][i]["tokens"].clone();
    assert_eq!((toks(1), toks(2)), (toks(4), toks(5)));
    assert_ne!(toks(0), toks(3));
    let verify8 = engine["verify"]
        .as_array()
        .unwrap()
        .iter()
        .find(|v| v["batch"] == 8)
        .expect("a batch-8 verify");
    assert_eq!(rows(&verify8["rows"]), want);
    // Prompt 0's planted difference, within tolerance, in each of its three rows at batch 8.
    let v = token(&rec, "engine");
    assert!(v.iter().all(|(verdict, _)| verdict == "pass"), "{v:?}");
    let sentence = &v[0].1;
    assert!(
        sentence.contains("over 3 prompt(s)"),
        "the gate counts the battery's prompts: {sentence}"
    );
}
