//! The record archive as `report` and `compare` read it: every `*.json` under the records
//! directory, parsed into a tolerant view that holds only what they need. Fields the readers do
//! not use are ignored and most have defaults, so records written by a later orchestrator of
//! the same schema (with more fields) still read; a record of a newer schema, or one that is not
//! a record at all, is rejected with its file named and the others are still read.

use serde::Deserialize;
use serde_json::{Map, Value};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use crate::gates::{stored_scope, Scope};
use crate::legs::LegName;
use crate::numbers::axes::Axis;
use crate::numbers::noise::LegNoise;
pub use crate::record::legstate::{ClockView, ProbeView, SamplerView, SummaryView};
use crate::record::SCHEMA;

#[derive(Debug, Clone, Deserialize)]
pub struct RecordView {
    pub schema: u32,
    #[serde(default)]
    pub created_utc: String,
    /// The orchestrator that wrote it: what its known errata are (`errata`).
    #[serde(default)]
    pub orchestrator_version: String,
    pub unit: UnitView,
    pub project: ProjectView,
    #[serde(default)]
    pub host: HostView,
    #[serde(default)]
    pub legs: LegsView,
    #[serde(default)]
    pub timings: TimingsPair,
    #[serde(default)]
    pub gates: Vec<GateView>,
    pub axes: Vec<Axis>,
    #[serde(default)]
    pub refusals: Vec<String>,
    /// What the idle check said before each leg.
    #[serde(default)]
    pub lease: LeaseView,
    /// The clock gate's explainable-gap statement (`sentence`), where both legs had clocks.
    #[serde(default)]
    pub clock_explain: Option<ClockExplainView>,
}

#[derive(Debug, Clone, Default, Deserialize)]
pub struct LeaseView {
    #[serde(default)]
    pub idle_checks: Vec<String>,
}

#[derive(Debug, Clone, Default, Deserialize)]
pub struct ClockExplainView {
    #[serde(default)]
    pub sentence: String,
}

#[derive(Debug, Clone, Deserialize)]
pub struct UnitView {
    pub name: String,
    /// The parsed unit with every default filled in, kept as JSON: `compare` diffs it key by key.
    #[serde(default)]
    pub config: Value,
}

#[derive(Debug, Clone, Deserialize)]
pub struct ProjectView {
    pub tree: String,
    #[serde(default)]
    pub commit: String,
    #[serde(default)]
    pub dirty: bool,
}

#[derive(Debug, Clone, Default, Deserialize)]
pub struct HostView {
    #[serde(default)]
    pub hostname: String,
    #[serde(default)]
    pub cpu_model: String,
    #[serde(default)]
    pub cores: Option<u64>,
    /// Filled by the NVML sampler (issue 5); read by key name so its exact shape may evolve.
    #[serde(default)]
    pub gpu: Value,
}

#[derive(Debug, Clone, Default, Deserialize)]
pub struct LegsView {
    #[serde(default)]
    pub engine: LegView,
    #[serde(default)]
    pub oracle: LegView,
}

#[derive(Debug, Clone, Default, Deserialize)]
pub struct LegView {
    #[serde(default)]
    pub ready: Option<ReadyView>,
    /// The host probe timed before the leg (records from orchestrator 0.4.0 on).
    #[serde(default)]
    pub host_probe: Option<ProbeView>,
    #[serde(default)]
    pub sampler: SamplerView,
    /// Why the leg was not run (`run --legs`), when it was not.
    #[serde(default)]
    pub not_run: Option<String>,
}

#[derive(Debug, Clone, Default, Deserialize)]
pub struct ReadyView {
    #[serde(default)]
    pub features: Map<String, Value>,
    #[serde(default)]
    pub versions: Map<String, Value>,
}

#[derive(Debug, Clone, Default, Deserialize)]
pub struct TimingsPair {
    #[serde(default)]
    pub engine: TimingsView,
    #[serde(default)]
    pub oracle: TimingsView,
}

#[derive(Debug, Clone, Default, Deserialize)]
pub struct SampleView {
    #[serde(default)]
    pub prompt: usize,
    #[serde(default)]
    pub pass: u32,
    pub s: f64,
}

#[derive(Debug, Clone, Default, Deserialize)]
pub struct TimingsView {
    #[serde(default)]
    pub per_token_s: Vec<SampleView>,
    #[serde(default)]
    pub ttft_s: Vec<SampleView>,
    /// JSON object keys are strings: "1", "4".
    #[serde(default)]
    pub throughput_tok_s: BTreeMap<String, Vec<f64>>,
    /// By batch size above 1 (records from orchestrator 0.5.0 on): the batch's prefill and its
    /// decode step, one figure per repeat.
    #[serde(default)]
    pub batch_prefill_s: BTreeMap<u32, Vec<f64>>,
    #[serde(default)]
    pub batch_step_s: BTreeMap<u32, Vec<f64>>,
}

impl TimingsView {
    /// The leg's A/A noise, as `LegNoise::of` reads it from a run's own timings.
    pub fn noise(&self) -> LegNoise {
        LegNoise::new(
            self.per_token_s.iter().map(|x| (x.pass, x.s)),
            self.ttft_s.iter().map(|x| (x.pass, x.s)),
            self.throughput_tok_s
                .iter()
                .filter_map(|(b, v)| b.parse::<u32>().ok().map(|b| (b, v.clone()))),
        )
        .with_batch_phases(&self.batch_prefill_s, &self.batch_step_s)
    }
}

#[derive(Debug, Clone, Deserialize)]
pub struct GateView {
    pub gate: String,
    #[serde(default)]
    pub leg: Option<String>,
    pub verdict: String,
    /// The gate's reason, tagged by `refusal` (`token_mismatch`, `kv_unmatched`, ...).
    #[serde(default)]
    pub refusal: Option<Value>,
    #[serde(default)]
    pub sentence: String,
    /// What the refusal withholds, where the record stores it (see [`GateView::withholds`]).
    #[serde(default)]
    pub scope: Option<Scope>,
}

impl GateView {
    pub fn refused(&self) -> bool {
        self.verdict == "refused"
    }
    /// "the token gate (engine leg)": who refused, for a sentence.
    pub fn who(&self) -> String {
        match &self.leg {
            Some(l) => format!("the {} gate ({l} leg)", self.gate),
            None => format!("the {} gate", self.gate),
        }
    }
    /// What the refusal withholds: as stored, or, in a record written before scopes were
    /// stored, what this orchestrator's gate of that name withholds.
    pub fn withholds(&self) -> Scope {
        self.scope
            .clone()
            .unwrap_or_else(|| stored_scope(&self.gate, self.leg_name()))
    }
    fn leg_name(&self) -> Option<LegName> {
        match self.leg.as_deref() {
            Some("engine") => Some(LegName::Engine),
            Some("oracle") => Some(LegName::Oracle),
            _ => None,
        }
    }
}

/// A record read from the archive, with the file it came from.
#[derive(Debug, Clone)]
pub struct Stored {
    pub path: PathBuf,
    /// The path relative to the records directory, for printing (stable across checkouts).
    pub name: String,
    pub rec: RecordView,
}

/// A file under the records directory that is not a readable record, and why.
#[derive(Debug, Clone, PartialEq)]
pub struct Rejected {
    pub name: String,
    pub why: String,
}

impl std::fmt::Display for Rejected {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} was not read: {}", self.name, self.why)
    }
}

/// Parses one record; Err is the reason in words (the caller names the file).
pub fn parse(text: &str) -> Result<RecordView, String> {
    let v: Value =
        serde_json::from_str(text).map_err(|e| format!("it is not valid JSON ({e})."))?;
    let schema = match v.get("schema") {
        Some(Value::Number(n)) => n.as_u64(),
        _ => None,
    };
    match schema {
        None => {
            return Err(
                "it has no numeric `schema` field, so it is not a run record this orchestrator can read."
                    .into(),
            )
        }
        Some(s) if s > u64::from(SCHEMA) => {
            return Err(format!(
                "it is a schema {s} record and this orchestrator reads schema {SCHEMA} at most; read it with a newer orchestrator."
            ))
        }
        Some(0) => return Err("schema 0 is not a schema any orchestrator wrote.".into()),
        Some(_) => {}
    }
    let mut rec: RecordView = serde_json::from_value(v)
        .map_err(|e| format!("it is not a schema {SCHEMA} record ({e})."))?;
    errata(&mut rec);
    Ok(rec)
}

/// Figures a released orchestrator is known to have got wrong, withdrawn as they are read (the
/// record itself is never rewritten): the axis keeps its row, with no figure and the reason.
fn errata(rec: &mut RecordView) {
    if rec.orchestrator_version == "0.1.0" {
        for a in rec
            .axes
            .iter_mut()
            .filter(|a| a.axis.starts_with("peak host memory"))
        {
            a.ours = None;
            a.oracle = None;
            a.ratio = None;
            a.words = "withdrawn".into();
            a.note = Some(
                "orchestrator 0.1.0 summed the memory of every thread as if each were a process (a leg with 16 threads read as 16 times its size); fixed in 0.2.0"
                    .into(),
            );
        }
    }
}

pub fn load_file(path: &Path, root: &Path) -> Result<Stored, Rejected> {
    let name = path
        .strip_prefix(root)
        .unwrap_or(path)
        .display()
        .to_string();
    let text = std::fs::read_to_string(path).map_err(|e| Rejected {
        name: name.clone(),
        why: format!("it could not be read ({e})."),
    })?;
    match parse(&text) {
        Ok(rec) => Ok(Stored {
            path: path.to_path_buf(),
            name,
            rec,
        }),
        Err(why) => Err(Rejected { name, why }),
    }
}

fn walk(dir: &Path, out: &mut Vec<PathBuf>) -> std::io::Result<()> {
    for e in std::fs::read_dir(dir)? {
        let p = e?.path();
        // Dot names are never records: a record being written is a dot-file temporary
        // (record::write_new_atomic), and `.unrecorded/` holds runs without one (record/claim.rs).
        if p.file_name()
            .is_some_and(|n| n.to_string_lossy().starts_with('.'))
        {
            continue;
        }
        if p.is_dir() {
            walk(&p, out)?;
        } else if p.extension().is_some_and(|x| x == "json") {
            out.push(p);
        }
    }
    Ok(())
}

/// Every record under `root`, ordered by (unit, creation time, file name) so that iteration
/// never depends on the directory's order; and every file that was rejected, by name.
pub fn load_dir(root: &Path) -> Result<(Vec<Stored>, Vec<Rejected>), String> {
    let mut files = vec![];
    walk(root, &mut files)
        .map_err(|e| format!("cannot read the records directory {} ({e})", root.display()))?;
    files.sort();
    let (mut ok, mut bad) = (vec![], vec![]);
    for f in files {
        match load_file(&f, root) {
            Ok(s) => ok.push(s),
            Err(r) => bad.push(r),
        }
    }
    ok.sort_by(|a, b| {
        (&a.rec.unit.name, &a.rec.created_utc, &a.name).cmp(&(
            &b.rec.unit.name,
            &b.rec.created_utc,
            &b.name,
        ))
    });
    Ok((ok, bad))
}

/// Records grouped by unit, each group oldest first.
pub fn by_unit(records: &[Stored]) -> BTreeMap<String, Vec<&Stored>> {
    let mut m: BTreeMap<String, Vec<&Stored>> = BTreeMap::new();
    for r in records {
        m.entry(r.rec.unit.name.clone()).or_default().push(r);
    }
    m
}

fn str_at<'a>(v: &'a Value, keys: &[&str]) -> Option<&'a str> {
    let v = match v {
        // A list of GPUs: the first describes the leased one in a one-GPU lease.
        Value::Array(a) => a.first()?,
        v => v,
    };
    keys.iter()
        .find_map(|k| v.get(*k).and_then(Value::as_str))
        .filter(|s| !s.is_empty())
}

impl RecordView {
    /// The GPU's name, or the CPU's when the run had no GPU (the CPU then is the device that ran).
    pub fn device_name(&self) -> String {
        match str_at(&self.host.gpu, &["name", "gpu", "model", "product"]) {
            Some(g) => g.to_string(),
            None if self.host.gpu.is_string() => self.host.gpu.as_str().unwrap_or("").into(),
            None => format!("no GPU (CPU: {})", self.host.cpu_model),
        }
    }
    pub fn driver(&self) -> String {
        str_at(&self.host.gpu, &["driver", "driver_version"])
            .unwrap_or("none")
            .to_string()
    }
    /// "Xeon (16 cores)": the host's CPU, as its class counts it (record/class.rs).
    pub fn host_cpu(&self) -> String {
        let model = if self.host.cpu_model.is_empty() {
            "unrecorded"
        } else {
            &self.host.cpu_model
        };
        match self.host.cores {
            Some(n) => format!("{model} ({n} cores)"),
            None => model.to_string(),
        }
    }
    /// The oracle's backend as the leg reported it, else as the unit asked for it.
    pub fn oracle_name(&self) -> String {
        self.legs
            .oracle
            .ready
            .as_ref()
            .and_then(|r| r.features.get("backend").and_then(Value::as_str))
            .or_else(|| {
                self.unit
                    .config
                    .get("oracle")
                    .and_then(|o| o.get("backend"))
                    .and_then(Value::as_str)
            })
            .unwrap_or("unknown")
            .to_string()
    }
    /// The oracle leg's `versions`, as `key value` pairs in key order.
    pub fn oracle_versions(&self) -> BTreeMap<String, String> {
        self.legs
            .oracle
            .ready
            .as_ref()
            .map(|r| {
                r.versions
                    .iter()
                    .map(|(k, v)| {
                        let s = v
                            .as_str()
                            .map(str::to_string)
                            .unwrap_or_else(|| v.to_string());
                        (k.clone(), s)
                    })
                    .collect()
            })
            .unwrap_or_default()
    }
    /// "vllm 0.26.0": the oracle's own version where the leg gave one, else every version it gave.
    pub fn oracle_label(&self) -> String {
        let name = self.oracle_name();
        let vs = self.oracle_versions();
        match vs.get(&name) {
            Some(v) => format!("{name} {v}"),
            None if vs.is_empty() => format!("{name} (version not reported)"),
            None => format!(
                "{name} ({})",
                vs.iter()
                    .map(|(k, v)| format!("{k} {v}"))
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
        }
    }
    /// The refused gates that concern `axis`: those whose scope names its kind (each gate
    /// states what its refusal withholds, gates/scope.rs). With `engine_only`, refusals of the
    /// oracle leg are left out (our absolute figures do not depend on the oracle's tokens).
    pub fn refusals_for(&self, axis: &Axis, engine_only: bool) -> Vec<&GateView> {
        self.gates
            .iter()
            .filter(|g| g.refused())
            .filter(|g| !(engine_only && g.leg_name() == Some(LegName::Oracle)))
            .filter(|g| axis.concerned_by(&g.withholds()))
            .collect()
    }
    /// Whether `axis` is gated: no refusal concerns it and neither leg's figures are marked
    /// refused on it (the marks are the record's own verdict; the gates say why).
    pub fn gated(&self, axis: &Axis, engine_only: bool) -> bool {
        let marked = axis.ours_refused || (!engine_only && axis.oracle_refused);
        !marked && self.refusals_for(axis, engine_only).is_empty()
    }
    pub fn tree8(&self) -> &str {
        &self.project.tree[..self.project.tree.len().min(8)]
    }
    /// What the tree id stands for, when the files differed from the commit: from orchestrator
    /// 0.3.0 on, the tree of the files as they ran; before, the commit's tree, which then does
    /// not describe the binary. (`short`: for a table cell.)
    pub fn tree_note(&self, short: bool) -> &'static str {
        let before_0_3 = matches!(self.orchestrator_version.as_str(), "0.1.0" | "0.2.0");
        match (self.project.dirty, before_0_3, short) {
            (false, _, _) => "",
            (true, false, true) => " (uncommitted)",
            (true, false, false) => " (uncommitted files: the tree is theirs, as they ran)",
            (true, true, true) => " (dirty)",
            (true, true, false) => " (dirty: the tree does not describe the binary)",
        }
    }
    pub fn commit8(&self) -> &str {
        &self.project.commit[..self.project.commit.len().min(8)]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIN: &str = r#"{"schema": 1, "unit": {"name": "u"}, "project": {"tree": "abc"},
        "axes": [], "some_future_field": {"x": 1}}"#;

    #[test]
    fn unknown_fields_are_ignored_and_missing_optional_ones_default() {
        let r = parse(MIN).unwrap();
        assert_eq!(r.unit.name, "u");
        assert_eq!(r.device_name(), "no GPU (CPU: )");
        assert_eq!(r.oracle_label(), "unknown (version not reported)");
    }

    #[test]
    fn future_schema_malformed_and_not_json_are_rejected_in_words() {
        let e = parse(&MIN.replace("\"schema\": 1", "\"schema\": 2")).unwrap_err();
        assert!(e.contains("schema 2 record") && e.ends_with('.'), "{e}");
        let e = parse(r#"{"schema": 1, "unit": {"name": "u"}}"#).unwrap_err();
        assert!(e.contains("missing field `project`"), "{e}");
        let e = parse("{").unwrap_err();
        assert!(e.starts_with("it is not valid JSON"), "{e}");
        let e = parse(r#"{"unit": {}}"#).unwrap_err();
        assert!(e.contains("no numeric `schema`"), "{e}");
    }

    #[test]
    fn a_refusal_concerns_the_axes_its_scope_names_stored_or_derived() {
        let axis = |name: &str, better: &str| serde_json::json!({"axis": name, "unit": "s", "better": better, "ratio": 2.0});
        let rec = |gate: serde_json::Value| {
            let text = serde_json::json!({"schema": 1, "unit": {"name": "u"},
                "project": {"tree": "t"}, "gates": [gate],
                "axes": [axis("per output token, warm", "lower"), axis("KV pool", "neither")]})
            .to_string();
            parse(&text).unwrap()
        };
        let concerned = |r: &RecordView| -> Vec<String> {
            r.axes
                .iter()
                .filter(|a| !r.refusals_for(a, false).is_empty())
                .map(|a| a.axis.clone())
                .collect()
        };
        // Written before scopes were stored: the kv gate's refusal concerns the pool only.
        let old = rec(
            serde_json::json!({"gate": "kv", "leg": null, "verdict": "refused",
            "refusal": {"refusal": "kv_unmatched"}, "sentence": "s"}),
        );
        assert_eq!(concerned(&old), vec!["KV pool"]);
        // A stored scope is read as it is, whatever the gate's name.
        let new = rec(serde_json::json!({"gate": "some_later_gate", "leg": null,
            "verdict": "refused", "refusal": {"refusal": "x"}, "sentence": "s",
            "scope": {"timings_of": [], "axes": "speed"}}));
        assert_eq!(concerned(&new), vec!["per output token, warm"]);
        // A gate this orchestrator does not know, with no scope: every axis.
        let unknown = rec(serde_json::json!({"gate": "some_later_gate", "leg": null,
            "verdict": "refused", "sentence": "s"}));
        assert_eq!(concerned(&unknown).len(), 2);
    }

    #[test]
    fn a_dirty_trees_meaning_depends_on_the_writer() {
        let mut r = parse(MIN).unwrap();
        assert_eq!(r.tree_note(false), "");
        r.project.dirty = true;
        for (version, says) in [
            ("0.2.0", "does not describe the binary"),
            ("0.3.0", "the tree is theirs"),
        ] {
            r.orchestrator_version = version.into();
            assert!(r.tree_note(false).contains(says), "{version}");
        }
    }

    #[test]
    fn gpu_fields_are_read_by_name_whatever_the_shape() {
        let mut r = parse(MIN).unwrap();
        r.host.gpu = serde_json::json!({"name": "NVIDIA H200", "driver_version": "580.1"});
        assert_eq!(
            (r.device_name(), r.driver()),
            ("NVIDIA H200".into(), "580.1".into())
        );
        r.host.gpu = serde_json::json!([{"gpu": "A100", "driver": "550"}]);
        assert_eq!((r.device_name(), r.driver()), ("A100".into(), "550".into()));
    }
}
