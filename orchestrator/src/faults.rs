//! `orchestrator faults`: the planted-fault evidence (issue 17). `plan UNIT` names the engine
//! faults (docs/ENGINE.md, `ENGINE_FAULT`) that apply to a unit's model and battery; `table
//! DIR` reads the records of engine-only runs of each unit, one clean and one per fault, and
//! writes the table: fault, unit, token verdict, worst position, gap, tolerance, and whether the
//! gate did its job (every fault refused, no clean leg refused). scripts/fault-table.sh runs
//! both around the runs. A fault that leaves every verified logit and every token exactly as
//! the clean run's planted nothing on that checkpoint (e.g. a norm weight taken as ones where
//! the weights are ones): the table says so instead of calling it a miss.

use serde_json::Value;
use std::collections::BTreeMap;
use std::path::Path;

use crate::unit::{load_prompts, Unit};
use crate::util::fmt::fmt_num;

/// The correctness faults, in docs/ENGINE.md's order (slow_step is a timing fault: `compare`'s).
pub const FAULTS: [&str; 6] = [
    "rope_shift",
    "norm_skip",
    "attn_scale_d",
    "kv_group",
    "drop_bias",
    "nan_past_512",
];

/// What a command prints and its exit status.
pub struct Said {
    pub out: String,
    pub exit: i32,
}

/// A fault's name, and why it applies (Ok) or does not (Err).
pub type Applies = (&'static str, Result<String, String>);

/// The faults that apply to `unit`, each with why (or why not): drop_bias needs q/k/v biases
/// (Qwen2), kv_group two KV heads, nan_past_512 a query position of 512 or more (a prompt of
/// length L with max_tokens N reaches position L + N - 2).
pub fn plan(unit_path: &Path) -> Result<Vec<Applies>, String> {
    let unit = Unit::load(unit_path).map_err(|e| e.to_string())?;
    let cfg_path = unit.model_dir().join("config.json");
    let cfg: Value = std::fs::read_to_string(&cfg_path)
        .ok()
        .and_then(|t| serde_json::from_str(&t).ok())
        .ok_or_else(|| format!("{} is missing or not JSON; make the checkpoint first (scripts/gpu-run.sh makes the GPU units')", cfg_path.display()))?;
    let prompts = load_prompts(&unit.prompts_path()).map_err(|e| e.to_string())?;
    let n = unit.config.battery.max_tokens as usize;
    let longest = prompts.iter().map(|p| p.tokens.len()).max().unwrap_or(0);
    let reach = (longest + n).saturating_sub(2);
    let arch = cfg["architectures"][0]
        .as_str()
        .unwrap_or("unknown")
        .to_string();
    let kv_heads = cfg["num_key_value_heads"]
        .as_u64()
        .or_else(|| cfg["num_attention_heads"].as_u64())
        .unwrap_or(1);
    Ok(FAULTS
        .iter()
        .map(|&f| {
            let r = match f {
                "drop_bias" if arch != "Qwen2ForCausalLM" => {
                    Err(format!("{arch} has no q/k/v biases (Qwen2 has)"))
                }
                "kv_group" if kv_heads < 2 => Err(format!("{kv_heads} KV head")),
                "nan_past_512" if reach < 512 => Err(format!(
                    "the longest prompt ({longest}) with max_tokens {n} reaches query position {reach} < 512"
                )),
                "nan_past_512" => Ok(format!(
                    "the longest prompt ({longest}) with max_tokens {n} reaches query position {reach}"
                )),
                _ => Ok(arch.clone()),
            };
            (f, r)
        })
        .collect())
}

/// One engine-only run as the table reads it.
struct Run {
    unit: String,
    created: String,
    /// The faults the engine reported planted (`ready.features.fault`), joined; "" when clean.
    fault: String,
    token: Vec<Value>,
    leg: Vec<Value>,
    /// What must differ from the clean run if the fault planted anything.
    fingerprint: Value,
}

fn read_run(path: &Path) -> Option<Run> {
    let v: Value = serde_json::from_str(&std::fs::read_to_string(path).ok()?).ok()?;
    let e = &v["legs"]["engine"];
    let mut fault: Vec<&str> = e["ready"]["features"]["fault"]
        .as_array()
        .map(|a| a.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default();
    fault.sort_unstable();
    let gates = |name: &str| -> Vec<Value> {
        v["gates"]
            .as_array()
            .map(|a| {
                a.iter()
                    .filter(|g| g["gate"] == name && g["leg"] == "engine")
                    .cloned()
                    .collect()
            })
            .unwrap_or_default()
    };
    let tokens: Vec<&Value> = e["requests"]
        .as_array()
        .map(|a| a.iter().filter(|r| r["phase"] == "battery").collect())
        .unwrap_or_default();
    let tokens: Vec<Value> = tokens
        .iter()
        .flat_map(|r| r["results"].as_array().cloned().unwrap_or_default())
        .map(|x| x["tokens"].clone())
        .collect();
    Some(Run {
        unit: v["unit"]["name"].as_str()?.to_string(),
        created: v["created_utc"].as_str().unwrap_or("").to_string(),
        fault: fault.join(","),
        token: gates("token"),
        leg: gates("leg"),
        fingerprint: serde_json::json!({"verify": logits(&e["verify"]), "tokens": tokens}),
    })
}

/// What a leg's verify answers say of its logits: per request its batch size and rows (argmax,
/// gap and scale where they differ), without its id or wall time, which differ run to run.
fn logits(verify: &Value) -> Value {
    let v: Vec<Value> = verify
        .as_array()
        .map(|a| {
            a.iter()
                .map(|r| serde_json::json!({"batch": r["batch"], "rows": r["rows"]}))
                .collect()
        })
        .unwrap_or_default();
    Value::Array(v)
}

/// The worst teacher-forced position of a refusal: not finite, then not judgeable, then the
/// largest (gap + margin) / tolerance.
fn worst(failures: &[Value]) -> Option<&Value> {
    let rank = |p: &Value| match p["judged"].as_str() {
        Some("not_finite") => f64::INFINITY,
        Some("cannot_judge") => f64::MAX,
        _ => {
            let (g, m, t) = (
                p["gap"].as_f64(),
                p["margin"].as_f64(),
                p["tolerance"].as_f64(),
            );
            match (g, m, t) {
                (Some(g), Some(m), Some(t)) if t > 0.0 => (g + m) / t,
                _ => f64::MAX,
            }
        }
    };
    failures.iter().max_by(|a, b| rank(a).total_cmp(&rank(b)))
}

/// (verdict, worst position, gap, tolerance) of a run's token gate on the engine.
fn token_cells(run: &Run) -> [String; 4] {
    let dash = || "-".to_string();
    let Some(g) = run
        .token
        .iter()
        .find(|g| g["verdict"] == "refused")
        .or(run.token.first())
    else {
        return ["no token verdict".into(), dash(), dash(), dash()];
    };
    let r = &g["refusal"];
    match (g["verdict"].as_str(), r["refusal"].as_str()) {
        (Some("refused"), Some("forced_mismatch")) => {
            let fails = r["tally"]["failures"]
                .as_array()
                .cloned()
                .unwrap_or_default();
            let Some(p) = worst(&fails) else {
                let why = r["tally"]["unverified"][0]
                    .as_str()
                    .unwrap_or("not verified");
                return ["refused (not verified)".into(), why.into(), dash(), dash()];
            };
            let num = |x: &Value| x.as_f64().map(fmt_num).unwrap_or_else(dash);
            let what = match p["judged"].as_str() {
                Some("not_finite") => "refused (not finite)",
                Some("cannot_judge") => "refused (cannot judge)",
                _ => "refused (teacher-forced)",
            };
            [
                what.into(),
                format!(
                    "{} @ {} (batch {}): {} for {}",
                    p["prompt"].as_str().unwrap_or("?"),
                    p["position"],
                    p["batch"],
                    p["argmax"],
                    p["golden"]
                ),
                if p["judged"] == "not_finite" {
                    "not finite".into()
                } else {
                    num(&p["gap"])
                },
                num(&p["tolerance"]),
            ]
        }
        (Some("refused"), Some("token_mismatch")) => {
            let m = &r["mismatches"][0];
            [
                "refused (exact)".into(),
                format!(
                    "{} @ {} (batch {}): {} for {}",
                    m["prompt"].as_str().unwrap_or("?"),
                    m["position"],
                    m["batch"],
                    m["got"],
                    m["want"]
                ),
                "-".into(),
                "exact".into(),
            ]
        }
        (Some(v), _) => [v.replace('_', " "), dash(), dash(), dash()],
        _ => ["unreadable".into(), dash(), dash(), dash()],
    }
}

fn json_files(dir: &Path, out: &mut Vec<std::path::PathBuf>) {
    let Ok(rd) = std::fs::read_dir(dir) else {
        return;
    };
    for e in rd.flatten() {
        let p = e.path();
        let hidden = p
            .file_name()
            .is_some_and(|n| n.to_string_lossy().starts_with('.'));
        if p.is_dir() {
            json_files(&p, out);
        } else if p.extension().is_some_and(|x| x == "json") && !hidden {
            out.push(p);
        }
    }
}

/// Per unit: its latest clean run, and its latest run of each fault.
type Units = BTreeMap<String, (Option<Run>, BTreeMap<String, Run>)>;

fn collect(dir: &Path) -> Units {
    let mut files = vec![];
    json_files(dir, &mut files);
    let mut runs: Vec<Run> = files.iter().filter_map(|f| read_run(f)).collect();
    runs.sort_by(|a, b| (&a.unit, &a.created).cmp(&(&b.unit, &b.created)));
    let mut units: Units = BTreeMap::new();
    for r in runs {
        let u = units.entry(r.unit.clone()).or_default();
        if r.fault.is_empty() {
            u.0 = Some(r);
        } else {
            u.1.insert(r.fault.clone(), r);
        }
    }
    units
}

/// Whether the gate did its job on this run, in words, and whether that is a failure.
fn outcome(run: &Run, clean: Option<&Run>) -> (String, bool) {
    let refused = |gs: &[Value]| gs.iter().any(|g| g["verdict"] == "refused");
    // The engine refuses to plant a fault its checkpoint would make a no-op (a norm weight of
    // ones, zero biases: docs/ENGINE.md): that run measured nothing and missed nothing.
    let inapplicable = run.leg.iter().any(|g| {
        g["sentence"]
            .as_str()
            .is_some_and(|s| s.contains("does not apply to this model"))
    });
    if !run.fault.is_empty() && inapplicable {
        return (
            "no effect: the engine would not plant it on this checkpoint (it does not apply: its leg's load error says why)".into(),
            false,
        );
    }
    match (run.fault.is_empty(), refused(&run.token), refused(&run.leg)) {
        (true, false, false) => ("ok: clean, passed".into(), false),
        (true, true, _) => ("FAIL: the clean leg's tokens were refused".into(), true),
        (true, false, true) => ("FAIL: the clean leg failed (leg gate)".into(), true),
        (false, true, _) => ("ok: refused".into(), false),
        (false, false, true) => ("ok: refused by the leg gate (the leg failed)".into(), false),
        (false, false, false) => match clean {
            None => ("FAIL: not refused, and no clean run to compare".into(), true),
            Some(c) if c.fingerprint == run.fingerprint => (
                "no effect: every verified logit and token equal the clean run's (nothing planted on this checkpoint)".into(),
                false,
            ),
            Some(_) => ("FAIL: not refused".into(), true),
        },
    }
}

const HEADER: &str = "| fault | unit | token verdict | worst position (prompt @ position (batch): argmax for golden) | gap | tolerance | outcome |\n| --- | --- | --- | --- | --- | --- | --- |\n";

/// The table over the records under `dir`. Exit 0: every fault refused (or without effect) and
/// every clean leg passed; 1: otherwise; Err: no record.
pub fn table(dir: &Path) -> Result<Said, String> {
    let units = collect(dir);
    if units.is_empty() {
        return Err(format!("no run record under {}", dir.display()));
    }
    let mut out = String::from(HEADER);
    let (mut refused, mut no_effect, mut missed, mut clean_ok, mut clean_bad) = (0, 0, 0, 0, 0);
    for (unit, (clean, faulted)) in &units {
        // The faults in docs/ENGINE.md's order, any other after them.
        let mut faults: Vec<&Run> = faulted.values().collect();
        let order = |r: &Run| {
            FAULTS
                .iter()
                .position(|f| *f == r.fault)
                .unwrap_or(FAULTS.len())
        };
        faults.sort_by_key(|r| (order(r), r.fault.clone()));
        let rows = clean.iter().chain(faults);
        for run in rows {
            let [verdict, pos, gap, tol] = token_cells(run);
            let (what, failed) = outcome(run, clean.as_ref());
            match (run.fault.is_empty(), failed, what.starts_with("no effect")) {
                (true, false, _) => clean_ok += 1,
                (true, true, _) => clean_bad += 1,
                (false, true, _) => missed += 1,
                (false, false, true) => no_effect += 1,
                (false, false, false) => refused += 1,
            }
            let fault = if run.fault.is_empty() {
                "none (clean)"
            } else {
                &run.fault
            };
            out.push_str(&format!(
                "| {fault} | {unit} | {verdict} | {pos} | {gap} | {tol} | {what} |\n"
            ));
        }
        if clean.is_none() {
            clean_bad += 1;
            out.push_str(&format!(
                "| none (clean) | {unit} | - | - | - | - | FAIL: no clean run of this unit |\n"
            ));
        }
    }
    let bad = missed + clean_bad;
    out.push_str(&format!(
        "\n{} faulted run(s): {refused} refused, {no_effect} without effect, {missed} not refused; {} clean run(s) passed, {clean_bad} refused or missing.\n{}\n",
        refused + no_effect + missed,
        clean_ok,
        if bad == 0 {
            "Exit 0: every planted fault that changed the model was refused and no clean leg was."
        } else {
            "Exit 1: a planted fault was not refused, or a clean leg was refused (or missing)."
        }
    ));
    Ok(Said {
        out,
        exit: i32::from(bad > 0),
    })
}

/// `faults plan UNIT`: one line per fault, `apply NAME (why)` or `skip NAME (why)`; the names
/// that apply also on stdout's last line, comma-separated, for the script.
pub fn plan_command(unit: &Path) -> Result<Said, String> {
    let p = plan(unit)?;
    let mut out = String::new();
    for (f, r) in &p {
        match r {
            Ok(why) => out.push_str(&format!("apply {f} ({why})\n")),
            Err(why) => out.push_str(&format!("skip {f} ({why})\n")),
        }
    }
    let apply: Vec<&str> = p
        .iter()
        .filter(|(_, r)| r.is_ok())
        .map(|(f, _)| *f)
        .collect();
    out.push_str(&format!("{}\n", apply.join(",")));
    Ok(Said { out, exit: 0 })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn record(dir: &Path, name: &str, fault: &[&str], token: Value, tokens: Value) {
        let d = dir.join("u");
        std::fs::create_dir_all(&d).unwrap();
        let features = if fault.is_empty() {
            json!({})
        } else {
            json!({"fault": fault})
        };
        let rec = json!({
            "schema": 1, "created_utc": name, "unit": {"name": "u"},
            "legs": {"engine": {"ready": {"features": features},
                "requests": [{"phase": "battery", "results": [{"tokens": tokens}]}]}},
            "gates": [token, {"gate": "leg", "leg": "engine", "verdict": "pass"}]
        });
        std::fs::write(d.join(format!("{name}.json")), rec.to_string()).unwrap();
    }

    fn pass() -> Value {
        json!({"gate": "token", "leg": "engine", "verdict": "pass"})
    }

    #[test]
    fn the_table_names_the_worst_position_and_judges_each_run() {
        let d = tempfile::tempdir().unwrap();
        record(d.path(), "1", &[], pass(), json!([1, 2, 3]));
        let refused = json!({"gate": "token", "leg": "engine", "verdict": "refused",
            "refusal": {"refusal": "forced_mismatch", "tally": {"failures": [
                {"prompt": "p0", "position": 3, "batch": 1, "argmax": 9, "golden": 4, "gap": 0.5,
                 "margin": 0.0, "tolerance": 0.25, "judged": "over"},
                {"prompt": "p1", "position": 7, "batch": 8, "argmax": 2, "golden": 5, "gap": 2.0,
                 "margin": 0.1, "tolerance": 0.25, "judged": "over"}]}}});
        record(d.path(), "2", &["kv_group"], refused, json!([1, 9, 9]));
        record(d.path(), "3.0", &["norm_skip"], pass(), json!([1, 2, 3]));
        let s = table(d.path()).unwrap();
        assert_eq!(s.exit, 0, "{}", s.out);
        assert!(
            s.out
                .contains("| none (clean) | u | pass | - | - | - | ok: clean, passed |"),
            "{}",
            s.out
        );
        assert!(
            s.out.contains("| kv_group | u | refused (teacher-forced) | p1 @ 7 (batch 8): 2 for 5 | 2.000 | 0.2500 | ok: refused |"),
            "{}",
            s.out
        );
        assert!(
            s.out
                .contains("| norm_skip | u | pass | - | - | - | no effect: every verified logit"),
            "{}",
            s.out
        );
        // A fault that changed the tokens and passed is the gate's failure.
        record(d.path(), "4", &["rope_shift"], pass(), json!([1, 2, 4]));
        let s = table(d.path()).unwrap();
        assert_eq!(s.exit, 1, "{}", s.out);
        assert!(
            s.out
                .contains("| rope_shift | u | pass | - | - | - | FAIL: not refused |"),
            "{}",
            s.out
        );
        assert!(
            s.out
                .contains("3 faulted run(s): 1 refused, 1 without effect, 1 not refused"),
            "{}",
            s.out
        );
    }

    #[test]
    fn a_refused_clean_leg_fails_the_table() {
        let d = tempfile::tempdir().unwrap();
        let refused = json!({"gate": "token", "leg": "engine", "verdict": "refused",
            "refusal": {"refusal": "token_mismatch", "mismatches": [
                {"prompt": "p2", "position": 0, "batch": 1, "got": 7, "want": 8}]}});
        record(d.path(), "1", &[], refused, json!([1]));
        let s = table(d.path()).unwrap();
        assert_eq!(s.exit, 1);
        assert!(s.out.contains("| none (clean) | u | refused (exact) | p2 @ 0 (batch 1): 7 for 8 | - | exact | FAIL: the clean leg's tokens were refused |"), "{}", s.out);
    }
}
