//! The token gate: each leg's tokens against the golden that applies to it. Where the golden is
//! the leg's own implementation on its device and dtype at batch 1, or marked exact, the
//! free-running tokens must match exactly (exact.rs); everywhere else the leg is fed the
//! golden's tokens after its battery and each position where it would have chosen another token
//! is judged against the rounding two correct implementations can differ by (forced.rs,
//! tolerance.rs). Rows that do not reproduce their own golden bit for bit are judged that way
//! too: an implementation that compiles and tunes afresh in each process sums in another order
//! than its golden's process did (docs/GATES.md). rule.rs says which rule applies at which
//! battery batch size; reason.rs words the refusals.

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
    /// Where the golden is the leg's own and its rows there do not match it exactly: the
    /// teacher-forced tally at the exact batch sizes, which then decides them.
    own_forced: Option<ForcedTally>,
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
            match &self.own_forced {
                Some(f) => parts.push(format!(
                    "{}{at} (exact: {because}), not its own golden's tokens bit for bit (first divergences: {}), so judged as another implementation is: {}",
                    t.summary(),
                    t.divergences(),
                    f.pass_text()
                )),
                None => parts.push(format!("{}{at} (exact: {because})", t.summary())),
            }
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
        // Rows off their own golden pass only if the teacher-forced check passes them.
        let own_forced_passed = j.own_forced.as_ref().is_some_and(ForcedTally::passed);
        if let Some((t, because)) = j
            .exact
            .as_ref()
            .filter(|(t, _)| !t.passed() && !own_forced_passed)
        {
            let reason = TokenReason::TokenMismatch {
                leg,
                summary: t.summary(),
                golden: j.file.clone(),
                mismatches: t.mismatches.clone(),
                exact_because: Some(because.clone()),
                other_gpu: other_gpu(golden, rec).map(Box::new),
                forced: j.own_forced.clone().map(Box::new),
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
    let forced_at = |batches: &[u32]| {
        forced::tally(
            rec,
            &ForcedInput {
                prompt_ids: ids,
                golden,
                max_tokens: n,
                leg_dtype: &leg_dtype,
                golden_dtype: &golden_dtype,
                batches,
                other: Some(other),
                layers: unit.model_layers(),
                // A golden's own implementation is held to every prompt of it.
                wrong: if rules.own { &[] } else { &gref.wrong },
            },
        )
    };
    let exact = (!rules.exact.is_empty()).then(|| exact::tally(rec, ids, golden, n, &rules.exact));
    // Rows that match their own golden need no teacher-forced judgement; only rows off it get one.
    let own_forced = exact
        .as_ref()
        .filter(|t| rules.own && !t.passed())
        .map(|_| forced_at(&rules.exact));
    Judged {
        exact: exact.map(|t| (t, rules.exact_because.clone().unwrap_or_default())),
        own_forced,
        forced: (!rules.forced.is_empty()).then(|| forced_at(&rules.forced)),
        free: exact::tally(rec, ids, golden, n, &rules.forced),
        free_all_batches: rule::battery_batches(unit),
        file,
    }
}

#[cfg(test)]
mod tests;
