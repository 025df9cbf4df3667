//! The token gate over recorded legs: which rule judged which rows, and the words it used.

use super::*;
use crate::legs::record::RequestKind;
use crate::legs::verified::{Differ, VerifiedRow, VerifyRecord};

fn golden() -> Golden {
    exact::tests::golden()
}

fn with_ready(mut leg: LegRecord, ready: serde_json::Value) -> LegRecord {
    leg.ready = Some(serde_json::from_value(ready).unwrap());
    leg
}

#[test]
fn a_device_that_is_no_device_kind_falls_back_to_the_units() {
    let unit = Unit::parse(
        std::path::Path::new("/u/unit.toml"),
        "name = \"u\"\nmodel = \"m\"\n[battery]\nprompts = \"p.json\"\n\
         [[golden]]\nfile = \"g.json\"\ndevice = \"cuda\"\ndtype = \"bfloat16\"\n\
         [engine]\ndevice = \"cuda:0\"\n[oracle]\nbackend = \"vllm\"\n",
    )
    .unwrap();
    let named = with_ready(
        leg(vec![]),
        serde_json::json!({"type": "ready", "load_s": 1.0, "kv": null,
            "features": {"device": "NVIDIA H200", "dtype": "bfloat16"}}),
    );
    assert_eq!(
        leg_device_dtype(&unit, &named),
        ("cuda:0".to_string(), "bfloat16".to_string())
    );
    let cpu = with_ready(
        leg(vec![]),
        serde_json::json!({"type": "ready", "load_s": 1.0, "kv": null,
            "features": {"device": "cpu", "dtype": "float32"}}),
    );
    assert_eq!(leg_device_dtype(&unit, &cpu).0, "cpu");
}

#[test]
fn golden_config_compares_env_members_but_never_the_visible_gpu() {
    let mut g = golden();
    g.capture.resolved = serde_json::from_value(serde_json::json!({
        "seed": 0, "engine": "multi-process",
        "env": {"CUDA_VISIBLE_DEVICES": null, "VLLM_ENABLE_V1_MULTIPROCESSING": null,
                "VLLM_ATTENTION_BACKEND": null}}))
    .unwrap();
    let ready = |engine: &str, mp: &str, attn: serde_json::Value| {
        with_ready(
            leg(vec![]),
            serde_json::json!({"type": "ready", "load_s": 1.0, "kv": null,
                "resolved": {"seed": 0.0, "engine": engine,
                    "env": {"CUDA_VISIBLE_DEVICES": "0", "VLLM_ENABLE_V1_MULTIPROCESSING": mp,
                            "VLLM_ATTENTION_BACKEND": attn}}}),
        )
    };
    let keys = |rec: &LegRecord, ignore: &[&str]| -> Vec<String> {
        let ignore: Vec<String> = ignore.iter().map(|s| s.to_string()).collect();
        golden_config::diffs(rec, &g, &ignore)
            .into_iter()
            .map(|d| d.key)
            .collect()
    };
    let mp_off = ready("in-process", "0", serde_json::Value::Null);
    assert_eq!(keys(&mp_off, &[]), vec!["engine", "env"]);
    // Only the named member of env is ignored; another member still counts.
    assert!(keys(&mp_off, &["engine", "env.VLLM_ENABLE_V1_MULTIPROCESSING"]).is_empty());
    let attn = ready("in-process", "0", "FLASH_ATTN".into());
    assert_eq!(
        keys(&attn, &["engine", "env.VLLM_ENABLE_V1_MULTIPROCESSING"]),
        vec!["env"]
    );
    // The same config on another visible GPU: no difference.
    let same = ready("multi-process", "x", serde_json::Value::Null);
    assert_eq!(
        keys(&same, &["env.VLLM_ENABLE_V1_MULTIPROCESSING"]),
        Vec::<String>::new()
    );
}

#[test]
fn other_gpu_is_the_goldens_and_the_legs_where_both_are_known_and_differ() {
    let mut g = golden();
    let on = |gpu: Option<&str>| {
        let versions = gpu.map_or(serde_json::json!({}), |n| serde_json::json!({"gpu": n}));
        with_ready(
            leg(vec![]),
            serde_json::json!({"type": "ready", "load_s": 1.0, "kv": null, "versions": versions}),
        )
    };
    let h100 = on(Some("NVIDIA H100 80GB HBM3"));
    assert_eq!(other_gpu(&g, &h100), None, "the golden names no GPU");
    g.capture
        .versions
        .insert("gpu".into(), serde_json::json!("NVIDIA H200"));
    assert_eq!(
        other_gpu(&g, &h100),
        Some(("NVIDIA H200".into(), "NVIDIA H100 80GB HBM3".into()))
    );
    assert_eq!(other_gpu(&g, &on(Some("NVIDIA H200"))), None);
    assert_eq!(other_gpu(&g, &on(None)), None, "the leg names no GPU");
}

fn leg(rows: Vec<(u32, Vec<Vec<u32>>)>) -> LegRecord {
    let rows = rows.into_iter().map(|(pass, toks)| (pass, 1, toks));
    crate::gates::testing::battery("engine", rows.collect())
}

/// The gate over a CPU unit (golden: transformers, cpu, float32; batch sizes 1 and 4) with
/// `engine` and a transformers oracle that reproduced the golden.
fn judge(engine: LegRecord) -> Vec<GateResult> {
    judge_with(engine, vec![vec![1, 2, 3, 4], vec![5, 6, 7, 8]], "")
}

/// As [`judge`], the oracle's tokens `oracle_tokens`, `golden_extra` added to the golden's
/// entry.
fn judge_with(
    engine: LegRecord,
    oracle_tokens: Vec<Vec<u32>>,
    golden_extra: &str,
) -> Vec<GateResult> {
    judge_oracle(
        engine,
        oracle_tokens,
        vec![verified(4, vec![])],
        golden_extra,
        None,
    )
}

/// As [`judge_with`], the oracle verifying as `oracle_verify` says, and the golden's margin
/// at p0's position 2 `p0_margin` where given.
fn judge_oracle(
    engine: LegRecord,
    oracle_tokens: Vec<Vec<u32>>,
    oracle_verify: Vec<VerifyRecord>,
    golden_extra: &str,
    p0_margin: Option<f64>,
) -> Vec<GateResult> {
    // The tolerance grows with the model's depth, read from its config.json.
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir(dir.path().join("m")).unwrap();
    std::fs::write(
        dir.path().join("m/config.json"),
        r#"{"num_hidden_layers": 2}"#,
    )
    .unwrap();
    let unit = Unit::parse(
        &dir.path().join("unit.toml"),
        &format!("name = \"u\"\nmodel = \"m\"\n[battery]\nprompts = \"p.json\"\nmax_tokens = 4\nbatch_sizes = [1, 4]\n\
         [[golden]]\nfile = \"g.json\"\n{golden_extra}\n[oracle]\nbackend = \"transformers\"\n"),
    )
    .unwrap();
    let mut g = golden();
    g.capture.backend = Some("transformers".into());
    g.outputs[1].margins = Some(vec![Some(0.5); 4]);
    if let Some(m) = p0_margin {
        g.outputs[0].margins.as_mut().unwrap()[2] = Some(m);
    }
    let goldens = std::collections::BTreeMap::from([(PathBuf::from("g.json"), g)]);
    let ready = |backend: &str| {
        serde_json::json!({"load_s": 1.0, "kv": null,
            "features": {"backend": backend, "device": "cpu", "dtype": "float32"}})
    };
    let ok = vec![vec![1, 2, 3, 4], vec![5, 6, 7, 8]];
    let mut oracle = with_ready(leg(vec![(0, oracle_tokens)]), ready("transformers"));
    oracle.leg = LegName::Oracle;
    oracle.verify = oracle_verify;
    let mut engine = with_ready(engine, ready("cpu"));
    engine
        .requests
        .extend(leg(vec![(0, ok)]).requests.into_iter().map(|mut r| {
            r.batch = 4;
            r.kind = RequestKind::Batch;
            r
        }));
    let ids = vec!["p0".to_string(), "p1".to_string()];
    TokenGate.judge(&GateInput {
        unit: &unit,
        goldens: &goldens,
        prompt_ids: &ids,
        engine: &engine,
        oracle: &oracle,
        kv_resize: None,
    })
}

fn verified(batch: u32, differ: Vec<Differ>) -> VerifyRecord {
    let row = |index, differ| VerifiedRow {
        index,
        path: "decode".into(),
        positions: 4,
        differ,
        scale: Some(vec![Some(3.0); 4]),
        copy: 0,
    };
    VerifyRecord {
        id: format!("v-b{batch}"),
        batch,
        wall_s: 0.1,
        rows: vec![row(0, differ), row(1, vec![])],
    }
}

#[test]
fn another_implementation_is_teacher_forced_and_its_own_exact_at_batch_1() {
    let mut e = leg(vec![(0, vec![vec![1, 2, 9, 9], vec![5, 6, 7, 8]])]);
    e.verify = vec![verified(1, vec![]), verified(4, vec![])];
    let v = judge(e);
    assert_eq!(v.len(), 2, "{v:?}");
    let s = &v[0].sentence;
    assert!(!v[0].is_refused(), "{s}");
    assert!(
        s.starts_with("TOKEN MATCH (teacher-forced): 16/16 positions over 2 prompt(s) at batch(es) [1, 4] (path decode); 0 agree within tolerance; free-running, not gating: TOKEN MATCH: 14/16 over 2 prompt(s) (full rows=3, short rows=0), first divergences: p0 at 2 against g.json"),
        "{s}"
    );
    let o = &v[1].sentence;
    assert!(
        o.starts_with("TOKEN MATCH: 8/8 over 2 prompt(s) (full rows=2, short rows=0) at batch [1] (exact: g.json was captured by the same implementation (transformers) on cpu in float32, and these rows ran at batch 1); TOKEN MATCH (teacher-forced): 8/8 positions"),
        "{o}"
    );
}

#[test]
fn a_position_beyond_the_tolerance_is_refused_naming_it() {
    let mut e = leg(vec![(0, vec![vec![1, 2, 3, 4], vec![5, 6, 7, 8]])]);
    // p0 position 1: golden margin 1.0, so any other token is far beyond float32 rounding.
    e.verify = vec![
        verified(1, vec![]),
        verified(4, vec![Differ(1, 7, Some(1e-6))]),
    ];
    let v = judge(e);
    assert!(v[0].is_refused());
    let s = &v[0].sentence;
    assert!(
        s.contains("Engine: prompt p0 position 1 (batch 4, path decode): the leg's argmax 7, the golden's token 2; leg gap 1.000e-6 + golden margin 1.000 = 1.000 > tolerance")
            && s.contains("its timings are printed but refused"),
        "{s}"
    );
}

#[test]
fn a_prompt_the_unit_names_wrong_in_the_golden_holds_only_the_goldens_own_implementation() {
    let wrong = "wrong = [{ prompt = \"p0\", reason = \"the oracle starts p0 from stale state\" }]";
    let far = || {
        let mut e = leg(vec![(0, vec![vec![1, 2, 3, 4], vec![5, 6, 7, 8]])]);
        e.verify = vec![
            verified(1, vec![]),
            verified(4, vec![Differ(1, 7, Some(1e-6))]),
        ];
        e
    };
    // Without the entry the engine's p0 is beyond the tolerance (as above); with it, p0 is
    // left out of the engine's teacher forcing and said so.
    assert!(judge_with(far(), vec![vec![1, 2, 3, 4], vec![5, 6, 7, 8]], "")[0].is_refused());
    let v = judge_with(far(), vec![vec![1, 2, 9, 9], vec![5, 6, 7, 8]], wrong);
    let s = &v[0].sentence;
    assert!(!v[0].is_refused(), "{s}");
    assert!(
        s.contains("8/8 positions over 2 prompt(s)")
            && s.contains("not judged, the unit naming the golden wrong there: p0 (the oracle starts p0 from stale state)"),
        "{s}"
    );
    // The golden's own implementation (the oracle, at batch 1) is still held to p0.
    assert!(v[1].is_refused(), "{}", v[1].sentence);
    assert!(v[1].sentence.contains("p0"), "{}", v[1].sentence);
}

#[test]
fn rows_off_their_own_golden_are_judged_by_teacher_forcing() {
    let engine = || {
        let mut e = leg(vec![(0, vec![vec![1, 2, 3, 4], vec![5, 6, 7, 8]])]);
        e.verify = vec![verified(1, vec![]), verified(4, vec![])];
        e
    };
    // The oracle parts from its own golden at p0's position 2, taking token 9 where the
    // golden's margin is 0 (a true tie): fed the golden's tokens at batch 1 it would have
    // chosen 9 there by a gap of 0, within any tolerance. So it passes, and says how.
    let off = vec![vec![1, 2, 9, 9], vec![5, 6, 7, 8]];
    let tie = |gap: f64| {
        vec![
            verified(1, vec![Differ(2, 9, Some(gap))]),
            verified(4, vec![]),
        ]
    };
    let v = judge_oracle(engine(), off.clone(), tie(0.0), "", Some(0.0));
    let o = &v[1].sentence;
    assert!(!v[1].is_refused(), "{o}");
    assert!(
        o.contains("TOKEN MATCH: 6/8 over 2 prompt(s) (full rows=1, short rows=0) at batch [1] (exact: g.json was captured by the same implementation (transformers) on cpu in float32, and these rows ran at batch 1), not its own golden's tokens bit for bit (first divergences: p0 at 2), so judged as another implementation is: TOKEN MATCH (teacher-forced): 7/8 positions over 2 prompt(s) at batch(es) [1] (path decode); 1 agree within tolerance"),
        "{o}"
    );
    // Where that gap is beyond the tolerance, the exact refusal stands and names the
    // teacher-forced position too.
    let v = judge_oracle(engine(), off.clone(), tie(1.0), "", Some(0.0));
    let o = &v[1].sentence;
    assert!(v[1].is_refused(), "{o}");
    assert!(
        o.contains("The oracle leg's tokens do not match the golden g.json")
            && o.contains("Fed the golden's tokens at those batch sizes, as rows off their own golden are judged, it did not pass either")
            && o.contains("Oracle: prompt p0 position 2 (batch 1, path decode): the leg's argmax 9, the golden's token 3; leg gap 1.000 + golden margin 0 = 1.000 > tolerance"),
        "{o}"
    );
    // A run that did not verify the oracle at batch 1 (before this rule) is refused, naming
    // the batch size not verified.
    let v = judge_oracle(engine(), off, vec![verified(4, vec![])], "", Some(0.0));
    assert!(v[1].is_refused());
    assert!(
        v[1].sentence.contains("Not verified: batch 1: no answer"),
        "{}",
        v[1].sentence
    );
    // An oracle that reproduced its golden passes on the exact match alone.
    let same = vec![vec![1, 2, 3, 4], vec![5, 6, 7, 8]];
    let v = judge_oracle(engine(), same, tie(1.0), "", Some(0.0));
    assert!(!v[1].is_refused(), "{}", v[1].sentence);
    assert!(!v[1].sentence.contains("not its own golden"));
}

#[test]
fn a_leg_that_did_not_verify_is_refused_as_not_judged() {
    let e = leg(vec![(0, vec![vec![1, 2, 3, 4], vec![5, 6, 7, 8]])]);
    let v = judge(e);
    assert!(v[0].is_refused());
    assert!(
        v[0].sentence.starts_with("The engine leg's tokens could not be judged by teacher forcing against the golden g.json: batch 1: no answer (never asked, or the leg did not reply); batch 4: no answer"),
        "{}",
        v[0].sentence
    );
}
