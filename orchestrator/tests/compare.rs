//! `orchestrator compare` on synthetic records with known shifts: every verdict and exit code
//! is asserted. Each test writes its records into its own temporary directory.

mod synth;

use serde_json::Value;
use std::path::Path;
use std::process::{Command, Output};
use synth::Synth;

const BIN: &str = env!("CARGO_BIN_EXE_orchestrator");

fn compare(dir: &Path, base: &str, head: &str, extra: &[&str]) -> (Output, Value) {
    let out = Command::new(BIN)
        .args(["compare", base, head, "--records-dir"])
        .arg(dir)
        .args(["--format", "json"])
        .args(extra)
        .output()
        .unwrap();
    let v = serde_json::from_slice(&out.stdout).unwrap_or(Value::Null);
    (out, v)
}

fn text(o: &Output) -> String {
    format!(
        "status {:?}\n--- stdout\n{}\n--- stderr\n{}",
        o.status.code(),
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

/// (axis, measure) -> verdict, for the only unit compared.
fn verdicts(v: &Value) -> Vec<(String, String, String)> {
    v["units"][0]["rows"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| {
            (
                r["axis"].as_str().unwrap().to_string(),
                r["measure"].as_str().unwrap().to_string(),
                r["verdict"].as_str().unwrap().to_string(),
            )
        })
        .collect()
}

fn all(v: &Value, measure: Option<&str>) -> Vec<String> {
    verdicts(v)
        .into_iter()
        .filter(|(_, m, _)| measure.is_none_or(|x| x == m))
        .map(|(_, _, v)| v)
        .collect()
}

const BASE_TREE: &str = "aaaaaaaa11111111";
const HEAD_TREE: &str = "bbbbbbbb22222222";

fn pair(dir: &Path, head: impl FnOnce(&mut Synth)) {
    let mut b = Synth::new("u", BASE_TREE, "2026-11-01T00:00:00Z");
    b.noise = 0.01;
    b.write(dir);
    let mut h = Synth::new("u", HEAD_TREE, "2026-11-02T00:00:00Z");
    h.noise = 0.01;
    head(&mut h);
    h.write(dir);
}

#[test]
fn no_shift_is_same_everywhere_and_exits_0() {
    let d = tempfile::tempdir().unwrap();
    // The same seed plants the same samples: the head is the base, byte for byte in its figures.
    pair(d.path(), |_| {});
    let (o, v) = compare(d.path(), "previous", "latest", &[]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    let vs = all(&v, None);
    assert_eq!(vs.len(), 8, "four axes, ours and ours/oracle each: {vs:?}");
    assert!(vs.iter().all(|x| x == "SAME"), "{vs:?}");
    assert_eq!(v["exit_status"], 0);
}

#[test]
fn one_percent_noise_is_same_and_exits_0() {
    let d = tempfile::tempdir().unwrap();
    pair(d.path(), |h| h.seed = 2);
    let (o, v) = compare(d.path(), "previous", "latest", &[]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    let vs = all(&v, None);
    assert!(vs.iter().all(|x| x == "SAME"), "{vs:?}\n{}", text(&o));
}

#[test]
fn prompts_of_very_different_length_are_compared_prompt_by_prompt() {
    // Twenty prompts whose times span 1x to 5.75x, as time to first token does over prompts of
    // 5 to 1,000 tokens, with 1% noise: taken as one pool, each side's median could sit anywhere
    // in that span and no interval would rule out a 3% change. Prompt by prompt it is SAME.
    let d = tempfile::tempdir().unwrap();
    let wide = |s: &mut Synth| {
        s.prompts = 20;
        s.repeat = 1;
        s.spread = 0.25;
    };
    let mut b = Synth::new("u", BASE_TREE, "2026-11-01T00:00:00Z");
    b.noise = 0.01;
    wide(&mut b);
    b.write(d.path());
    let mut h = Synth::new("u", HEAD_TREE, "2026-11-02T00:00:00Z");
    h.noise = 0.01;
    h.seed = 2;
    wide(&mut h);
    h.write(d.path());
    let (o, v) = compare(d.path(), "previous", "latest", &[]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    let rows = v["units"][0]["rows"].as_array().unwrap();
    let ttft = rows
        .iter()
        .find(|r| r["axis"] == "time to first token" && r["measure"] == "ours")
        .unwrap();
    assert_eq!(ttft["verdict"], "SAME", "{ttft}");
    // The medians shown are the records' own, in seconds, not the per-prompt scale.
    let shown = ttft["base_median"].as_f64().unwrap();
    assert!(shown > 0.05 && shown < 0.05 * 5.75, "{ttft}");

    // The same records with a 10% slower engine on every prompt: SLOWER, the change about 1.10.
    let d = tempfile::tempdir().unwrap();
    b.write(d.path());
    h.engine_scale = 1.10;
    h.write(d.path());
    let (o, v) = compare(d.path(), "previous", "latest", &[]);
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
    let rows = v["units"][0]["rows"].as_array().unwrap();
    // (Throughput has one sample per repeat, one repeat here: too few to call.)
    let timed =
        |r: &&Value| r["measure"] == "ours" && !r["axis"].as_str().unwrap().contains("throughput");
    for r in rows.iter().filter(timed) {
        assert_eq!(r["verdict"], "SLOWER", "{r}");
        let c = r["change"].as_f64().unwrap();
        assert!((c - 1.10).abs() < 0.02, "{r}");
    }
}

#[test]
fn ten_percent_slower_is_slower_in_ours_and_in_the_ratio_and_exits_1() {
    let d = tempfile::tempdir().unwrap();
    pair(d.path(), |h| {
        h.seed = 2;
        h.engine_scale = 1.10;
    });
    let (o, v) = compare(d.path(), BASE_TREE, "bbbbbbbb", &[]);
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
    let vs = verdicts(&v);
    assert!(
        vs.iter().all(|(_, _, x)| x == "SLOWER"),
        "every axis moved 10% the wrong way: {vs:?}"
    );
    let r = &v["units"][0]["rows"][0];
    let change = r["change"].as_f64().unwrap();
    assert!((change - 1.10).abs() < 0.02, "{r}");
    let [lo, hi] = [
        r["interval"][0].as_f64().unwrap(),
        r["interval"][1].as_f64().unwrap(),
    ];
    assert!(lo < change && change < hi && lo > 1.03, "{r}");
    assert!(r["p"].as_f64().unwrap() < 0.05, "{r}");
}

#[test]
fn a_batch_prefill_and_decode_step_are_judged_per_repeat_and_absent_ones_are_skipped() {
    let d = tempfile::tempdir().unwrap();
    let mut b = Synth::new("u", BASE_TREE, "2026-11-01T00:00:00Z");
    b.batch_phases = true;
    b.write(d.path());
    let mut h = Synth::new("u", HEAD_TREE, "2026-11-02T00:00:00Z");
    (h.batch_phases, h.seed, h.engine_scale) = (true, 2, 1.10);
    h.write(d.path());
    let (o, v) = compare(d.path(), BASE_TREE, "bbbbbbbb", &[]);
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
    let vs = verdicts(&v);
    for axis in ["prefill, batch 4", "decode step, batch 4"] {
        for measure in ["ours", "ours/oracle"] {
            assert!(
                vs.contains(&(axis.into(), measure.into(), "SLOWER".into())),
                "{axis} {measure}: {vs:?}"
            );
        }
    }
    // A base from before the split (no such samples) still compares the rest, the head's
    // new rows named but never called faster or slower.
    let d = tempfile::tempdir().unwrap();
    Synth::new("u", BASE_TREE, "2026-11-01T00:00:00Z").write(d.path());
    let mut h = Synth::new("u", HEAD_TREE, "2026-11-02T00:00:00Z");
    h.batch_phases = true;
    h.write(d.path());
    let (o, v) = compare(d.path(), BASE_TREE, "bbbbbbbb", &[]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    let (new, old): (Vec<_>, Vec<_>) = verdicts(&v)
        .into_iter()
        .partition(|(axis, _, _)| axis.contains("batch 4") && !axis.contains("throughput"));
    assert_eq!(new.len(), 4, "{new:?}");
    assert!(new.iter().all(|(_, _, x)| x == "AMBIGUOUS"), "{new:?}");
    assert!(old.iter().all(|(_, _, x)| x == "SAME"), "{old:?}");
    let rows = v["units"][0]["rows"].as_array().unwrap();
    let why = rows
        .iter()
        .find(|r| r["axis"] == "decode step, batch 4")
        .unwrap();
    assert!(
        why["why"]
            .as_str()
            .unwrap()
            .contains("base has 0 sample(s)"),
        "{why}"
    );
}

#[test]
fn ten_percent_faster_is_faster_and_exits_0() {
    let d = tempfile::tempdir().unwrap();
    pair(d.path(), |h| h.engine_scale = 0.90);
    let (o, v) = compare(d.path(), "previous", "latest", &[]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    assert!(all(&v, None).iter().all(|x| x == "FASTER"), "{v}");
}

#[test]
fn a_refused_axis_is_shown_but_never_called_slower() {
    let d = tempfile::tempdir().unwrap();
    pair(d.path(), |h| {
        h.engine_scale = 1.10;
        h.token_refused = true;
    });
    let (o, v) = compare(d.path(), "previous", "latest", &[]);
    assert_eq!(
        o.status.code(),
        Some(0),
        "nothing gated regressed: {}",
        text(&o)
    );
    let rows = v["units"][0]["rows"].as_array().unwrap();
    for r in rows {
        assert_eq!(r["verdict"], "UNGATED", "{r}");
        let why = r["why"].as_str().unwrap();
        assert!(
            why.contains("the token gate (engine leg) refused") && why.ends_with('.'),
            "{why}"
        );
        // The figures, 10% worse, are still there to read.
        assert!((r["change"].as_f64().unwrap() - 1.0).abs() > 0.05, "{r}");
    }
}

#[test]
fn a_kv_refusal_leaves_the_speed_axes_gated() {
    let d = tempfile::tempdir().unwrap();
    pair(d.path(), |h| {
        h.engine_scale = 1.10;
        h.kv_refused = true;
    });
    let (o, v) = compare(d.path(), "previous", "latest", &[]);
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
    assert!(all(&v, Some("ours")).iter().all(|x| x == "SLOWER"), "{v}");
}

#[test]
fn a_different_gpu_is_refused_naming_it_unless_allowed() {
    let d = tempfile::tempdir().unwrap();
    pair(d.path(), |h| {
        h.seed = 2;
        h.gpu = "NVIDIA A100-SXM4-80GB".into();
        // The other machine is twice as slow for both legs: the ratio does not move.
        h.machine_scale = 2.0;
    });
    let (o, v) = compare(d.path(), "previous", "latest", &[]);
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    let refused = v["units"][0]["refused"].as_str().unwrap();
    assert!(
        refused.contains("GPU (base NVIDIA H200, head NVIDIA A100-SXM4-80GB)")
            && refused.contains("--allow-different-hosts"),
        "{refused}"
    );
    assert!(v["units"][0]["rows"].as_array().unwrap().is_empty());

    // Allowed: our absolute figures are not judged across GPUs, and the ratio is not judged
    // either, because the oracle's own figure moved (the machine is twice as slow for it too):
    // a ratio over a moved oracle is what issue 17 saw report changes that never happened.
    let (o, v) = compare(d.path(), "previous", "latest", &["--allow-different-hosts"]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    assert!(all(&v, None).iter().all(|x| x == "UNGATED"), "{v}");
    let rows = v["units"][0]["rows"].as_array().unwrap();
    let why = |measure: &str| {
        rows.iter().find(|r| r["measure"] == measure).unwrap()["why"]
            .as_str()
            .unwrap()
            .to_string()
    };
    assert!(
        why("ours").contains("the records are not like for like for our absolute figures: the GPU differs (base NVIDIA H200, head NVIDIA A100-SXM4-80GB)"),
        "{}",
        why("ours")
    );
    assert!(
        why("ours/oracle").contains("the oracle's own figure moved +99.0%")
            && why("ours/oracle").contains("while ours moved +100."),
        "{}",
        why("ours/oracle")
    );
    assert!(v["units"][0]["notes"][0]
        .as_str()
        .unwrap()
        .contains("--allow-different-hosts was given"));
}

#[test]
fn a_different_oracle_version_or_unit_configuration_is_refused() {
    let d = tempfile::tempdir().unwrap();
    pair(d.path(), |h| {
        h.vllm = "0.27.0".into();
        h.repeat = 5;
    });
    let (o, v) = compare(d.path(), "previous", "latest", &[]);
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    let refused = v["units"][0]["refused"].as_str().unwrap();
    assert!(
        refused.contains("oracle version of vllm (base 0.26.0, head 0.27.0)")
            && refused.contains("unit configuration key battery.repeat (base 4, head 5)"),
        "{refused}"
    );
}

#[test]
fn thresholds_are_printed_and_configurable() {
    let d = tempfile::tempdir().unwrap();
    pair(d.path(), |h| {
        h.seed = 2;
        h.engine_scale = 1.10;
    });
    // With a 20% minimum effect a 10% change is no longer SLOWER.
    let (o, v) = compare(d.path(), "previous", "latest", &["--min-effect-pct", "20"]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    assert_eq!(v["thresholds"]["min_effect"], 0.2);
    assert!(!all(&v, None).iter().any(|x| x == "SLOWER"), "{v}");
    let out = Command::new(BIN)
        .args(["compare", "previous", "latest", "--records-dir"])
        .arg(d.path())
        .output()
        .unwrap();
    let s = String::from_utf8_lossy(&out.stdout);
    assert!(
        s.contains("at least 3% with a Mann-Whitney p below 0.05") && s.contains("SLOWER"),
        "{s}"
    );
    assert!(s.contains("Exit 1: a gated figure is SLOWER."), "{s}");
    let md = Command::new(BIN)
        .args([
            "compare",
            "previous",
            "latest",
            "--format",
            "markdown",
            "--records-dir",
        ])
        .arg(d.path())
        .output()
        .unwrap();
    let md = String::from_utf8_lossy(&md.stdout);
    assert!(
        md.contains("| per output token | ours |") && md.contains("| SLOWER |"),
        "{md}"
    );
}

#[test]
fn record_paths_and_tree_prefixes_resolve_and_bad_specs_exit_2() {
    let d = tempfile::tempdir().unwrap();
    pair(d.path(), |h| h.engine_scale = 1.10);
    let base = std::fs::read_dir(d.path().join("u"))
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .find(|p| p.to_string_lossy().contains("aaaaaaaa"))
        .unwrap();
    let (o, v) = compare(d.path(), base.to_str().unwrap(), "bbbb", &[]);
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
    assert_eq!(v["units"][0]["base"]["tree"], BASE_TREE);
    assert_eq!(v["units"][0]["head"]["tree"], HEAD_TREE);
    let (o, _) = compare(d.path(), "cccc", "latest", &[]);
    assert_eq!(o.status.code(), Some(2));
    assert!(
        String::from_utf8_lossy(&o.stderr).contains("BASE: tree cccc names no record"),
        "{}",
        text(&o)
    );
}

#[test]
fn an_unreadable_record_is_named_and_the_others_still_compared() {
    let d = tempfile::tempdir().unwrap();
    pair(d.path(), |h| h.seed = 2);
    std::fs::write(d.path().join("u/broken.json"), "{\"schema\": 1,").unwrap();
    let (o, v) = compare(d.path(), "previous", "latest", &[]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    assert!(
        String::from_utf8_lossy(&o.stderr)
            .contains("u/broken.json was not read: it is not valid JSON"),
        "{}",
        text(&o)
    );
    assert_eq!(v["units"].as_array().unwrap().len(), 1);
}

#[test]
fn previous_is_the_tree_before_the_latest_even_after_a_rerun() {
    let d = tempfile::tempdir().unwrap();
    pair(d.path(), |h| h.engine_scale = 1.10);
    // The head tree run again: `previous` must still be the base tree, not this rerun's twin.
    let mut again = Synth::new("u", HEAD_TREE, "2026-11-03T00:00:00Z");
    again.noise = 0.01;
    again.engine_scale = 1.10;
    again.seed = 3;
    again.write(d.path());
    let (o, v) = compare(d.path(), "previous", "latest", &[]);
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
    assert_eq!(v["units"][0]["base"]["tree"], BASE_TREE);
    assert_eq!(v["units"][0]["head"]["created_utc"], "2026-11-03T00:00:00Z");
}

#[test]
fn a_unit_only_one_side_has_is_named_and_not_compared() {
    let d = tempfile::tempdir().unwrap();
    pair(d.path(), |_| {});
    Synth::new("w", HEAD_TREE, "2026-11-02T00:00:00Z").write(d.path());
    let (o, v) = compare(d.path(), "previous", "latest", &[]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    assert_eq!(v["units"].as_array().unwrap().len(), 1);
    assert_eq!(
        v["unpaired"][0],
        "Unit w has a record in HEAD (w/20261102T000000Z-bbbbbbbb.json) and none in BASE, so it is not compared."
    );
}

#[test]
fn an_oracle_that_moved_with_the_host_probe_leaves_the_ratio_unjudged_and_says_so() {
    let d = tempfile::tempdir().unwrap();
    let (probe, clock) = (Some(40.0), Some(1980.0));
    let mut b = Synth::new("u", BASE_TREE, "2026-11-01T00:00:00Z");
    (b.noise, b.probe_ms, b.engine_sm_mhz) = (0.01, probe, clock);
    b.write(d.path());
    // The head ran on a slower host: the host-bound oracle 41% slower, the probe 38% slower,
    // our GPU-bound engine unchanged.
    let mut h = Synth::new("u", HEAD_TREE, "2026-11-02T00:00:00Z");
    (h.noise, h.seed, h.engine_sm_mhz) = (0.01, 2, clock);
    (h.oracle_scale, h.probe_ms) = (1.41, Some(55.2));
    h.write(d.path());
    let (o, v) = compare(d.path(), "previous", "latest", &[]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    assert!(all(&v, Some("ours")).iter().all(|x| x == "SAME"), "{v}");
    let rows = v["units"][0]["rows"].as_array().unwrap();
    let r = rows
        .iter()
        .find(|r| r["measure"] == "ours/oracle" && r["axis"] == "per output token")
        .unwrap();
    assert_eq!(r["verdict"], "UNGATED", "{r}");
    let why = r["why"].as_str().unwrap();
    assert!(
        why.contains("the oracle's own figure moved +40.3%")
            && why.contains("while ours moved +0.")
            && why.contains(
                "the host probe moved +38.0% (40.00 -> 55.20 ms): the host, not our code"
            ),
        "{why}"
    );
    // Without a probe that moved, the sentence says the oracle moved on its own.
    let d = tempfile::tempdir().unwrap();
    b.write(d.path());
    h.probe_ms = probe;
    h.write(d.path());
    let (_, v) = compare(d.path(), "previous", "latest", &[]);
    let why = v["units"][0]["rows"][1]["why"]
        .as_str()
        .unwrap()
        .to_string();
    assert!(
        why.contains(
            "the host probe moved +0.0% (40.00 -> 40.00 ms), so the oracle moved on its own"
        ),
        "{why}"
    );
}

#[test]
fn an_engine_clock_that_moved_leaves_our_figures_unjudged_and_the_ratio_judged() {
    let d = tempfile::tempdir().unwrap();
    let mut b = Synth::new("u", BASE_TREE, "2026-11-01T00:00:00Z");
    (b.noise, b.engine_sm_mhz) = (0.01, Some(1980.0));
    b.write(d.path());
    let mut h = Synth::new("u", HEAD_TREE, "2026-11-02T00:00:00Z");
    (h.noise, h.seed, h.engine_sm_mhz, h.engine_scale) = (0.01, 2, Some(1755.0), 1.10);
    h.write(d.path());
    let (o, v) = compare(d.path(), "previous", "latest", &[]);
    assert_eq!(
        o.status.code(),
        Some(1),
        "the ratio is gated and SLOWER: {}",
        text(&o)
    );
    assert!(
        all(&v, Some("ours/oracle")).iter().all(|x| x == "SLOWER"),
        "{v}"
    );
    let rows = v["units"][0]["rows"].as_array().unwrap();
    // (Throughput has one sample per repeat, one repeat here: too few to call.)
    let timed =
        |r: &&Value| r["measure"] == "ours" && !r["axis"].as_str().unwrap().contains("throughput");
    for r in rows.iter().filter(timed) {
        assert_eq!(r["verdict"], "UNGATED", "{r}");
        assert!(
            r["why"].as_str().unwrap().contains(
                "the engine leg's median SM clock moved from 1980 to 1755 MHz (-11.36%, beyond 1%)"
            ),
            "{r}"
        );
    }
}

/// A fleet's records: the unit ran both trees on two kinds of GPU, the A100 twice as slow for
/// both legs. Each class is compared with itself (the H200's head is 10% slower, the A100's is
/// not), never across: a mixed pair would call everything on the A100 SLOWER.
#[test]
fn records_from_two_host_classes_are_compared_within_each_class() {
    let d = tempfile::tempdir().unwrap();
    let write = |tree: &str, day: u32, gpu: &str, scale: f64, slower: bool| {
        let mut s = Synth::new("u", tree, &format!("2026-11-0{day}T00:00:00Z"));
        s.noise = 0.01;
        s.gpu = gpu.into();
        s.machine_scale = scale;
        if slower {
            s.seed = 2;
            s.engine_scale = 1.10;
        }
        s.write(d.path());
    };
    const A100: &str = "NVIDIA A100-SXM4-80GB";
    write(BASE_TREE, 1, "NVIDIA H200", 1.0, false);
    write(BASE_TREE, 2, A100, 2.0, false);
    write(HEAD_TREE, 3, "NVIDIA H200", 1.0, true);
    write(HEAD_TREE, 4, A100, 2.0, false);
    let (o, v) = compare(d.path(), "previous", "latest", &[]);
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
    let units = v["units"].as_array().unwrap();
    assert_eq!(units.len(), 2, "{v}");
    let on = |gpu: &str| {
        units
            .iter()
            .find(|u| {
                u["host"]
                    .as_str()
                    .unwrap()
                    .starts_with(&format!("GPU {gpu},"))
            })
            .unwrap()
    };
    let (h200, a100) = (on("NVIDIA H200"), on(A100));
    for (u, base_day, head_day) in [(h200, "01", "03"), (a100, "02", "04")] {
        assert!(u["refused"].is_null(), "{u}");
        assert_eq!(
            u["base"]["created_utc"],
            format!("2026-11-{base_day}T00:00:00Z")
        );
        assert_eq!(
            u["head"]["created_utc"],
            format!("2026-11-{head_day}T00:00:00Z")
        );
        assert!(
            u["host"]
                .as_str()
                .unwrap()
                .ends_with(", host x86 (16 cores)"),
            "{u}"
        );
        assert!(
            u["notes"].as_array().unwrap().iter().any(|n| n
                .as_str()
                .unwrap()
                .contains("has records from 2 host classes")),
            "{u}"
        );
    }
    let ours = |u: &Value| -> Vec<String> {
        u["rows"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|r| r["measure"] == "ours")
            .map(|r| r["verdict"].as_str().unwrap().to_string())
            .collect()
    };
    assert!(ours(h200).iter().all(|x| x == "SLOWER"), "{h200}");
    assert!(!ours(a100).iter().any(|x| x == "SLOWER"), "{a100}");
    assert!(v["unpaired"].as_array().unwrap().is_empty(), "{v}");

    // The A100 has not run the head tree yet: the H200 is compared; the A100's latest record,
    // of the base tree, has no base of its own class and is said so, not paired across.
    std::fs::remove_file(d.path().join("u/20261104T000000Z-bbbbbbbb.json")).unwrap();
    let (o, v) = compare(d.path(), "previous", "latest", &[]);
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
    assert_eq!(v["units"].as_array().unwrap().len(), 1, "{v}");
    assert!(v["units"][0]["host"]
        .as_str()
        .unwrap()
        .starts_with("GPU NVIDIA H200,"));
    assert_eq!(
        v["unpaired"][0],
        "Unit u on NVIDIA A100-SXM4-80GB, driver 580.65.06, host x86 (16 cores) has a record in HEAD (u/20261102T000000Z-aaaaaaaa.json) and none on that host class in BASE, so it is not compared there."
    );
}
