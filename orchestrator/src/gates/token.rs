//! The token gate: each leg's tokens against the golden that applies to it. Where the golden is
//! the leg's own implementation on its device and dtype at batch 1, or marked exact, the
//! free-running tokens must match exactly (exact.rs); everywhere else the leg is fed the
//! golden's tokens after its battery and each position where it would have chosen another token
//! is judged against the rounding two correct implementations can differ by (forced.rs,
//! tolerance.rs). rule.rs says which rule applies at which battery batch size; reason.rs words
//! the refusals.

pub mod exact;
pub mod forced;
pub mod reason;
pub mod rule;
pub mod tolerance;

use std::path::PathBuf;

use super::{golden_config, Gate, GateInput, GateResult, Scope};
use crate::legs::record::{LegName, LegRecord};
use crate::unit::{Golden, Unit};
use exact::TokenTally;
use forced::{ForcedInput, ForcedTally};
pub use reason::TokenReason;

/// The device and dtype a leg ran with: what it reported, else what the unit asked for.
pub fn leg_device_dtype(unit: &Unit, leg: &LegRecord) -> (String, String) {
    let c = &unit.config;
    let (dev, dt) = match leg.leg {
        LegName::Engine => (c.engine.device.as_str(), "float32"),
        LegName::Oracle => (c.oracle.device.as_str(), c.oracle.dtype.as_str()),
    };
    let ready = leg.ready.as_ref();
    // A device the goldens cannot be matched by (e.g. a GPU's name) falls back to the unit's.
    let reported = ready
        .and_then(|r| r.device())
        .filter(|d| matches!(crate::unit::device_kind(d), "cpu" | "cuda"));
    (
        reported.unwrap_or(dev).to_string(),
        ready.and_then(|r| r.dtype()).unwrap_or(dt).to_string(),
    )
}

/// The golden (path as written in the unit, and content) that applies to a leg.
pub fn golden_for<'a>(
    input: &'a GateInput,
    leg: &LegRecord,
) -> Result<(PathBuf, &'a Golden), TokenReason> {
    let (device, dtype) = leg_device_dtype(input.unit, leg);
    input
        .unit
        .golden_for(&device, &dtype)
        .and_then(|g| {
            input
                .goldens
                .get(&g.file)
                .map(|gold| (g.file.clone(), gold))
        })
        .ok_or(TokenReason::NoGolden {
            leg: leg.leg,
            device,
            dtype,
        })
}

pub struct TokenGate;

impl Gate for TokenGate {
    fn name(&self) -> &'static str {
        "token"
    }

    /// Wrong tokens (or none checked) make the leg's timings not a measure of the model.
    fn scope(&self, leg: Option<LegName>) -> Scope {
        Scope::figures_of(leg)
    }

    fn judge(&self, input: &GateInput) -> Vec<GateResult> {
        [LegName::Engine, LegName::Oracle]
            .into_iter()
            .flat_map(|leg| self.judge_leg(input, leg))
            .collect()
    }
}

/// `[1, 8]`.
fn batch_list(b: &[u32]) -> String {
    let v: Vec<String> = b.iter().map(u32::to_string).collect();
    format!("[{}]", v.join(", "))
}

/// One leg's tallies under its rules.
struct Judged {
    file: PathBuf,
    exact: Option<(TokenTally, String)>,
    forced: Option<ForcedTally>,
    /// The free-running tally at the teacher-forced batch sizes (information only).
    free: TokenTally,
    /// Every battery batch size.
    free_all_batches: Vec<u32>,
}

impl Judged {
    fn free_words(&self) -> String {
        format!(
            "{}, first divergences: {}",
            self.free.summary(),
            self.free.divergences()
        )
    }

    /// What was checked, as the pass (or not-applicable) text says it.
    fn text(&self) -> String {
        let mut parts = vec![];
        let mixed = self.exact.is_some() && self.forced.is_some();
        if let Some((t, because)) = &self.exact {
            let at = if mixed {
                format!(" at batch {}", batch_list(&self.exact_batches()))
            } else {
                String::new()
            };
            parts.push(format!("{}{at} (exact: {because})", t.summary()));
        }
        if let Some(t) = &self.forced {
            parts.push(format!(
                "{}; free-running, not gating: {}",
                t.pass_text(),
                self.free_words()
            ));
        }
        format!("{} against {}", parts.join("; "), self.file.display())
    }

    fn exact_batches(&self) -> Vec<u32> {
        let forced = self
            .forced
            .as_ref()
            .map(|t| t.batches.clone())
            .unwrap_or_default();
        let mut all: Vec<u32> = self.free_all_batches.clone();
        all.retain(|b| !forced.contains(b));
        all
    }
}

impl TokenGate {
    fn judge_leg(&self, input: &GateInput, leg: LegName) -> Vec<GateResult> {
        let rec = input.leg(leg);
        if !rec.measured() {
            return vec![GateResult::not_applicable(
                self,
                Some(leg),
                format!("the {leg} leg did not complete its battery"),
            )];
        }
        let (file, golden) = match golden_for(input, rec) {
            Ok(g) => g,
            Err(r) => return vec![GateResult::refused(self, Some(leg), &r)],
        };
        let j = judge_tallies(input, rec, file, golden);
        // The oracle is judged against its golden only if it ran the golden's config.
        let c = &input.unit.config;
        let diffs = if leg == LegName::Oracle {
            golden_config::diffs(rec, golden, &c.gates.golden_config_ignore)
        } else {
            vec![]
        };
        if !diffs.is_empty() {
            let keys: Vec<&str> = diffs.iter().map(|d| d.key.as_str()).collect();
            return vec![GateResult::not_applicable(
                self,
                Some(leg),
                format!(
                    "{}, but the golden was captured under another oracle config (differing keys: {}), so the oracle-vs-golden check does not apply",
                    j.text(),
                    keys.join(", ")
                ),
            )];
        }
        let mut out = vec![];
        if let Some((t, because)) = j.exact.as_ref().filter(|(t, _)| !t.passed()) {
            let reason = TokenReason::TokenMismatch {
                leg,
                summary: t.summary(),
                golden: j.file.clone(),
                mismatches: t.mismatches.clone(),
                exact_because: Some(because.clone()),
                other_gpu: other_gpu(golden, rec).map(Box::new),
            };
            out.push(GateResult::refused(self, Some(leg), &reason));
        }
        if let Some(t) = j.forced.as_ref().filter(|t| !t.passed()) {
            let reason = TokenReason::ForcedMismatch {
                leg,
                golden: j.file.clone(),
                tally: Box::new(t.clone()),
                free_running: j.free_words(),
            };
            out.push(GateResult::refused(self, Some(leg), &reason));
        }
        if out.is_empty() {
            out.push(GateResult::pass(self, Some(leg), j.text()));
        }
        out
    }
}

/// The golden's capture GPU and the leg's (each's `versions.gpu`), where both are known and
/// differ.
fn other_gpu(golden: &Golden, leg: &LegRecord) -> Option<(String, String)> {
    let golden_gpu = golden.capture.versions.get("gpu")?.as_str()?;
    let leg_gpu = leg.ready.as_ref()?.versions.get("gpu")?.as_str()?;
    (golden_gpu != leg_gpu).then(|| (golden_gpu.to_string(), leg_gpu.to_string()))
}

/// The leg's tallies under the rules that apply to it.
fn judge_tallies(input: &GateInput, rec: &LegRecord, file: PathBuf, golden: &Golden) -> Judged {
    let unit = input.unit;
    let c = &unit.config;
    let gref = unit
        .config
        .golden
        .iter()
        .find(|g| g.file == file)
        .expect("golden_for found this entry");
    let rules = rule::rules(unit, gref, golden, rec);
    let n = c.battery.max_tokens;
    let ids = input.prompt_ids;
    let (_, leg_dtype) = leg_device_dtype(unit, rec);
    let golden_dtype = golden.capture.dtype.clone().unwrap_or(gref.dtype.clone());
    let other = match rec.leg {
        LegName::Engine => input.oracle,
        LegName::Oracle => input.engine,
    };
    Judged {
        exact: (!rules.exact.is_empty()).then(|| {
            (
                exact::tally(rec, ids, golden, n, &rules.exact),
                rules.exact_because.clone().unwrap_or_default(),
            )
        }),
        forced: (!rules.forced.is_empty()).then(|| {
            forced::tally(
                rec,
                &ForcedInput {
                    prompt_ids: ids,
                    golden,
                    max_tokens: n,
                    leg_dtype: &leg_dtype,
                    golden_dtype: &golden_dtype,
                    batches: &rules.forced,
                    other: Some(other),
                    layers: unit.model_layers(),
                    // A golden's own implementation is held to every prompt of it.
                    wrong: if rules.own { &[] } else { &gref.wrong },
                },
            )
        }),
        free: exact::tally(rec, ids, golden, n, &rules.forced),
        free_all_batches: rule::battery_batches(unit),
        file,
    }
}

#[cfg(test)]
mod tests {
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
        let goldens = std::collections::BTreeMap::from([(PathBuf::from("g.json"), g)]);
        let ready = |backend: &str| {
            serde_json::json!({"load_s": 1.0, "kv": null,
                "features": {"backend": backend, "device": "cpu", "dtype": "float32"}})
        };
        let ok = vec![vec![1, 2, 3, 4], vec![5, 6, 7, 8]];
        let mut oracle = with_ready(leg(vec![(0, oracle_tokens)]), ready("transformers"));
        oracle.leg = LegName::Oracle;
        oracle.verify = vec![verified(4, vec![])];
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
        let wrong =
            "wrong = [{ prompt = \"p0\", reason = \"the oracle starts p0 from stale state\" }]";
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
}
