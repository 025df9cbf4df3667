//! The teacher-forced tally: a leg's `verify` answers (legs/verified.rs) against the golden it
//! was forced with. A position passes when the leg's argmax is the golden's token, or when the
//! leg's gap plus the golden's own margin there is within the tolerance of the dtypes at the
//! logits' magnitude (tolerance.rs). Grand totals over every verified batch size, so a leg that
//! agreed at batch 1 and not at batch 8 cannot pass.

use serde::{Deserialize, Serialize};
use std::fmt;

use super::tolerance::{self, Dtype};
use crate::legs::verified::{Differ, VerifyRecord};
use crate::legs::LegName;
use crate::legs::LegRecord;
use crate::unit::{Golden, GoldenOutput};
use crate::util::fmt::fmt_num;

/// Where a position's scale (the largest |logit|, which sets the rounding step) came from.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ScaleFrom {
    /// The leg's own report.
    Own,
    /// The other leg's report at the same prompt and position (the leg reported none).
    Leg(LegName),
    /// The golden's record.
    Golden,
}

impl fmt::Display for ScaleFrom {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ScaleFrom::Own => f.write_str("the leg's own scale"),
            ScaleFrom::Leg(l) => write!(f, "the {l} leg's scale at this position"),
            ScaleFrom::Golden => f.write_str("the golden's scale"),
        }
    }
}

/// How one position was judged.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "judged", rename_all = "snake_case")]
pub enum Judged {
    /// Another token, but gap + margin within the tolerance: rounding.
    Within,
    /// gap + margin above the tolerance: not rounding.
    Over,
    /// The leg's logits there were not finite (a null gap).
    NotFinite,
    /// No honest judgment: the reason (no scale anywhere, no golden margin, unknown dtype).
    CannotJudge { why: String },
}

/// A position where the leg's choice is not the golden's token.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Position {
    pub prompt: String,
    pub batch: u32,
    pub path: String,
    pub position: usize,
    pub argmax: u32,
    pub golden: u32,
    pub gap: Option<f64>,
    pub margin: Option<f64>,
    pub scale: Option<f64>,
    pub scale_from: Option<ScaleFrom>,
    pub tolerance: Option<f64>,
    /// The dtypes the tolerance was taken in (leg, golden).
    pub dtypes: Option<(Dtype, Dtype)>,
    /// The model's layers, which the tolerance grows with.
    #[serde(default)]
    pub layers: Option<u32>,
    #[serde(flatten)]
    pub judged: Judged,
}

impl Position {
    /// How bad: non-finite first, then unjudgeable, then by how far gap + margin exceeds the
    /// tolerance (a ratio; within tolerance below 1).
    fn badness(&self) -> f64 {
        match &self.judged {
            Judged::NotFinite => f64::INFINITY,
            Judged::CannotJudge { .. } => f64::MAX,
            Judged::Within | Judged::Over => match (self.gap, self.margin, self.tolerance) {
                (Some(g), Some(m), Some(t)) if t > 0.0 => (g + m) / t,
                _ => f64::MAX,
            },
        }
    }

    pub fn passes(&self) -> bool {
        self.judged == Judged::Within
    }

    fn sum(&self) -> Option<f64> {
        Some(self.gap? + self.margin?)
    }

    /// "tolerance 0.216 (1.25 u sqrt(2L) |logit| per side: bfloat16 and bfloat16, L = 16,
    /// |logit| 3.906, the leg's own scale)".
    fn tolerance_words(&self) -> String {
        match (
            self.tolerance,
            self.scale,
            self.dtypes,
            self.scale_from,
            self.layers,
        ) {
            (Some(t), Some(s), Some((l, g)), Some(from), Some(layers)) => {
                format!(
                    "tolerance {} ({} u sqrt(2L) |logit| per side: {l} and {g}, L = {layers}, |logit| {}, {from})",
                    fmt_num(t),
                    tolerance::C,
                    fmt_num(s)
                )
            }
            _ => "no tolerance".into(),
        }
    }
}

impl fmt::Display for Position {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "prompt {} position {} (batch {}, path {}): the leg's argmax {}, the golden's token {}",
            self.prompt, self.position, self.batch, self.path, self.argmax, self.golden
        )?;
        let num = |x: Option<f64>| x.map(fmt_num).unwrap_or_else(|| "none".into());
        match &self.judged {
            Judged::NotFinite => write!(
                f,
                "; the leg's logits there are not finite (gap null), golden margin {}",
                num(self.margin)
            ),
            Judged::CannotJudge { why } => write!(
                f,
                "; leg gap {}, golden margin {}: cannot be judged, because {why}",
                num(self.gap),
                num(self.margin)
            ),
            Judged::Within | Judged::Over => write!(
                f,
                "; leg gap {} + golden margin {} = {} {} {}",
                num(self.gap),
                num(self.margin),
                num(self.sum()),
                if self.passes() { "<=" } else { ">" },
                self.tolerance_words()
            ),
        }
    }
}

/// A leg's teacher-forced grand totals.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ForcedTally {
    pub batches: Vec<u32>,
    pub prompts: usize,
    /// Positions verified, over every prompt and batch size.
    pub positions: u64,
    /// Positions where the leg's argmax is the golden's token.
    pub agree: u64,
    /// Positions with another token, gap + margin within the tolerance.
    pub within: u64,
    /// The worst failing position of each failing prompt (over all its batch sizes).
    pub failures: Vec<Position>,
    /// The passing position closest to its tolerance (for the pass text).
    pub closest: Option<Position>,
    /// Batch sizes the leg gave no answer for, each with why.
    pub unverified: Vec<String>,
    /// The code paths the leg verified with ("decode", "prefill").
    pub paths: Vec<String>,
    /// Prompts left out because the unit names the golden wrong there, each with its reason.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub not_judged: Vec<String>,
}

impl ForcedTally {
    pub fn passed(&self) -> bool {
        self.positions > 0 && self.failures.is_empty() && self.unverified.is_empty()
    }

    fn batch_list(&self) -> String {
        let b: Vec<String> = self.batches.iter().map(u32::to_string).collect();
        format!("[{}]", b.join(", "))
    }

    /// `TOKEN MATCH (teacher-forced): a/b positions over n prompt(s) at batch(es) [..]; k agree
    /// within tolerance`.
    pub fn summary(&self) -> String {
        format!(
            "TOKEN MATCH (teacher-forced): {}/{} positions over {} prompt(s) at batch(es) {} (path {}); {} agree within tolerance",
            self.agree,
            self.positions,
            self.prompts,
            self.batch_list(),
            if self.paths.is_empty() { "none".into() } else { self.paths.join(", ") },
            self.within
        ) + &self.not_judged_words()
    }

    /// `; not judged: p0, where the golden is wrong (reason)`, or nothing.
    fn not_judged_words(&self) -> String {
        if self.not_judged.is_empty() {
            return String::new();
        }
        format!(
            "; not judged, the unit naming the golden wrong there: {}",
            self.not_judged.join("; ")
        )
    }

    /// The summary, and the closest call when one was needed.
    pub fn pass_text(&self) -> String {
        match &self.closest {
            Some(c) => format!("{} (the closest: {c})", self.summary()),
            None => self.summary(),
        }
    }
}

/// What the tally needs besides the leg.
pub struct ForcedInput<'a> {
    pub prompt_ids: &'a [String],
    pub golden: &'a Golden,
    pub max_tokens: u32,
    /// The leg's compute dtype and the golden's, as they spell them.
    pub leg_dtype: &'a str,
    pub golden_dtype: &'a str,
    /// The battery batch sizes judged by teacher forcing.
    pub batches: &'a [u32],
    /// The other leg, whose scale stands in where this leg reports none.
    pub other: Option<&'a LegRecord>,
    /// The model's `num_hidden_layers` (config.json), which the tolerance grows with.
    pub layers: Option<u32>,
    /// Prompts whose golden output the unit names wrong ([[golden]] `wrong`): not judged.
    pub wrong: &'a [crate::unit::WrongOutput],
}

/// The other leg's scale at (prompt index, position), preferring the same batch size.
fn other_scale(other: Option<&LegRecord>, batch: u32, index: usize, j: usize) -> Option<f64> {
    let recs = &other?.verify;
    let at = |r: &VerifyRecord| {
        r.rows
            .iter()
            .find(|row| row.index == index)
            .and_then(|row| row.scale_at(j))
    };
    let same = recs.iter().filter(|r| r.batch == batch).find_map(at);
    same.or_else(|| recs.iter().find_map(at))
}

/// One differing position, judged.
fn judge_one(
    inp: &ForcedInput,
    leg: &LegRecord,
    rec: &VerifyRecord,
    row_scale: Option<f64>,
    out: &GoldenOutput,
    index: usize,
    d: &Differ,
) -> Position {
    let Differ(j, argmax, gap) = *d;
    let margin = out
        .margins
        .as_ref()
        .and_then(|m| m.get(j).copied().flatten());
    let golden_scale = out
        .scales
        .as_ref()
        .and_then(|s| s.get(j).copied().flatten());
    let (scale, scale_from) = match (row_scale, other_scale(inp.other, rec.batch, index, j)) {
        (Some(s), _) => (Some(s), Some(ScaleFrom::Own)),
        (None, Some(s)) => (Some(s), inp.other.map(|o| ScaleFrom::Leg(o.leg))),
        (None, None) => (golden_scale, golden_scale.map(|_| ScaleFrom::Golden)),
    };
    let dtypes = Dtype::parse(inp.leg_dtype).zip(Dtype::parse(inp.golden_dtype));
    let tol = scale
        .zip(dtypes)
        .zip(inp.layers)
        .map(|((s, (l, g)), layers)| tolerance::tolerance(l, g, layers, s));
    let judged = match (gap, margin, tol) {
        (None, _, _) => Judged::NotFinite,
        (_, None, _) => Judged::CannotJudge {
            why: "the golden records no margin there".into(),
        },
        (_, _, None) if inp.layers.is_none() => Judged::CannotJudge {
            why: "the model's config.json gives no num_hidden_layers, which the tolerance grows with".into(),
        },
        (_, _, None) if dtypes.is_none() => Judged::CannotJudge {
            why: format!(
                "the dtypes (leg {:?}, golden {:?}) are not ones the tolerance knows",
                inp.leg_dtype, inp.golden_dtype
            ),
        },
        (_, _, None) => Judged::CannotJudge {
            why: format!(
                "no scale is known there: the {} leg reports none (path {}), and neither the other leg nor the golden has one at this position",
                leg.leg, rec.rows.iter().find(|r| r.index == index).map_or("?", |r| r.path.as_str())
            ),
        },
        (Some(g), Some(m), Some(t)) if g.is_finite() && g + m <= t => Judged::Within,
        _ => Judged::Over,
    };
    Position {
        prompt: inp.prompt_ids.get(index).cloned().unwrap_or_default(),
        batch: rec.batch,
        path: String::new(),
        position: j,
        argmax,
        golden: out.tokens.get(j).copied().unwrap_or(0),
        gap,
        margin,
        scale,
        scale_from,
        tolerance: tol,
        dtypes,
        layers: inp.layers,
        judged,
    }
}

/// The leg's teacher-forced grand totals against the golden.
pub fn tally(leg: &LegRecord, inp: &ForcedInput) -> ForcedTally {
    let n_prompts = inp.prompt_ids.len();
    let mut t = ForcedTally {
        batches: inp.batches.to_vec(),
        prompts: n_prompts,
        ..Default::default()
    };
    let mut worst: Vec<Option<Position>> = vec![None; n_prompts];
    for &b in inp.batches {
        let Some(rec) = leg.verify.iter().rev().find(|r| r.batch == b) else {
            let why = match &leg.failure {
                Some(f) => format!("batch {b}: no answer (the leg failed in phase {})", f.phase),
                None => format!("batch {b}: no answer (never asked, or the leg did not reply)"),
            };
            t.unverified.push(why);
            continue;
        };
        for row in &rec.rows {
            let (Some(id), true) = (inp.prompt_ids.get(row.index), row.index < n_prompts) else {
                continue;
            };
            let Some(out) = inp.golden.output(id) else {
                continue;
            };
            if let Some(w) = inp.wrong.iter().find(|w| &w.prompt == id) {
                let words = format!("{} ({})", w.prompt, w.reason);
                if !t.not_judged.contains(&words) {
                    t.not_judged.push(words);
                }
                continue;
            }
            if !t.paths.contains(&row.path) {
                t.paths.push(row.path.clone());
            }
            let n = out.tokens.len().min(inp.max_tokens as usize);
            t.positions += n as u64;
            let mut disagree = 0u64;
            for d in row.differ.iter().filter(|d| d.0 < n) {
                if out.tokens[d.0] == d.1 && d.2.is_some() {
                    continue; // the golden's token, whatever gap it came with
                }
                disagree += 1;
                let mut p = judge_one(inp, leg, rec, row.scale_at(d.0), out, row.index, d);
                p.path = row.path.clone();
                if p.passes() {
                    t.within += 1;
                    if t.closest.as_ref().is_none_or(|c| p.badness() > c.badness()) {
                        t.closest = Some(p);
                    }
                } else {
                    let slot = &mut worst[row.index];
                    if slot.as_ref().is_none_or(|w| p.badness() > w.badness()) {
                        *slot = Some(p);
                    }
                }
            }
            t.agree += n as u64 - disagree;
        }
    }
    t.failures = worst.into_iter().flatten().collect();
    t
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::legs::verified::VerifiedRow;
    use crate::unit::{GoldenCapture, GoldenOutput};

    fn golden(margins: [f64; 4]) -> Golden {
        Golden {
            schema: 1,
            max_tokens: 4,
            ignore_eos: true,
            capture: GoldenCapture {
                backend: Some("vllm".into()),
                versions: Default::default(),
                dtype: Some("bfloat16".into()),
                device: Some("cuda".into()),
                resolved: Default::default(),
            },
            outputs: ["p0", "p1"]
                .iter()
                .map(|id| GoldenOutput {
                    id: id.to_string(),
                    tokens: vec![10, 11, 12, 13],
                    margins: Some(margins.iter().map(|m| Some(*m)).collect()),
                    runner_up: None,
                    scales: None,
                })
                .collect(),
        }
    }

    /// A leg whose verify at each batch size in `batches` agrees everywhere except `differ`
    /// (on prompt p0), reporting `scale` at every position.
    fn leg(name: LegName, batches: &[u32], differ: Vec<Differ>, scale: Option<f64>) -> LegRecord {
        let spec = crate::legs::spec::LegSpec {
            leg: name,
            argv: vec![],
            cwd: ".".into(),
            env: vec![],
            log_path: "x".into(),
            sampler: Default::default(),
            lease_fd: None,
        };
        let mut r = LegRecord::new(&spec);
        for &b in batches {
            let row = |index: usize, differ: Vec<Differ>| VerifiedRow {
                index,
                path: "decode".into(),
                positions: 4,
                differ,
                scale: Some(vec![scale; 4]),
                copy: 0,
            };
            r.verify.push(VerifyRecord {
                id: format!("v-b{b}"),
                batch: b,
                wall_s: 0.1,
                rows: vec![row(0, differ.clone()), row(1, vec![])],
            });
            if scale.is_none() {
                for row in &mut r.verify.last_mut().unwrap().rows {
                    row.scale = None;
                    row.path = "prefill".into();
                }
            }
        }
        r
    }

    fn ids() -> Vec<String> {
        vec!["p0".into(), "p1".into()]
    }

    fn input<'a>(
        g: &'a Golden,
        ids: &'a [String],
        other: Option<&'a LegRecord>,
    ) -> ForcedInput<'a> {
        ForcedInput {
            prompt_ids: ids,
            golden: g,
            max_tokens: 4,
            leg_dtype: "bfloat16",
            golden_dtype: "bfloat16",
            batches: &[1, 8],
            other,
            layers: Some(16),
            wrong: &[],
        }
    }

    #[test]
    fn a_clean_leg_passes_with_every_position_agreeing() {
        let g = golden([0.5; 4]);
        let ids = ids();
        let t = tally(
            &leg(LegName::Engine, &[1, 8], vec![], Some(3.0)),
            &input(&g, &ids, None),
        );
        assert!(t.passed(), "{t:?}");
        assert_eq!(
            t.pass_text(),
            "TOKEN MATCH (teacher-forced): 16/16 positions over 2 prompt(s) at batch(es) [1, 8] (path decode); 0 agree within tolerance"
        );
    }

    #[test]
    fn rounding_passes_and_a_gap_over_the_tolerance_is_named() {
        // Tolerance at |logit| 3, 16 layers: 1.25 * sqrt(32) * 3 * 2 * 2^-8 = 0.1657.
        let g = golden([0.5, 0.0625, 0.5, 0.5]);
        let ids = ids();
        let near = leg(
            LegName::Engine,
            &[1, 8],
            vec![Differ(1, 99, Some(0.0625))],
            Some(3.0),
        );
        let t = tally(&near, &input(&g, &ids, None));
        assert!(t.passed(), "{t:?}");
        assert_eq!((t.agree, t.within), (14, 2));
        assert!(
            t.pass_text().ends_with("(the closest: prompt p0 position 1 (batch 1, path decode): the leg's argmax 99, the golden's token 11; leg gap 0.06250 + golden margin 0.06250 = 0.1250 <= tolerance 0.1657 (1.25 u sqrt(2L) |logit| per side: bfloat16 and bfloat16, L = 16, |logit| 3.000, the leg's own scale))"),
            "{}",
            t.pass_text()
        );
        let far = leg(
            LegName::Engine,
            &[1, 8],
            vec![Differ(1, 99, Some(0.25))],
            Some(3.0),
        );
        let t = tally(&far, &input(&g, &ids, None));
        assert!(!t.passed());
        assert_eq!(
            t.failures.len(),
            1,
            "one failing prompt, its worst position"
        );
        let s = t.failures[0].to_string();
        assert!(
            s.contains("prompt p0 position 1") && s.contains("0.3125 > tolerance 0.1657"),
            "{s}"
        );
    }

    #[test]
    fn a_large_golden_margin_refuses_another_token_even_at_a_small_gap() {
        let g = golden([0.5; 4]);
        let ids = ids();
        let l = leg(
            LegName::Engine,
            &[1, 8],
            vec![Differ(2, 7, Some(0.0))],
            Some(3.0),
        );
        let t = tally(&l, &input(&g, &ids, None));
        assert!(!t.passed());
        assert!(
            t.failures[0]
                .to_string()
                .contains("leg gap 0 + golden margin 0.5000 = 0.5000 >"),
            "{}",
            t.failures[0]
        );
    }

    #[test]
    fn non_finite_logits_and_missing_batches_are_refused() {
        let g = golden([0.5; 4]);
        let ids = ids();
        let nan = leg(LegName::Engine, &[1], vec![Differ(3, 0, None)], Some(3.0));
        let t = tally(&nan, &input(&g, &ids, None));
        assert!(!t.passed());
        assert!(
            t.failures[0].to_string().contains("not finite"),
            "{}",
            t.failures[0]
        );
        assert_eq!(
            t.unverified,
            vec!["batch 8: no answer (never asked, or the leg did not reply)"]
        );
    }

    #[test]
    fn a_leg_without_scale_borrows_the_other_legs_or_cannot_be_judged() {
        let g = golden([0.0625; 4]);
        let ids = ids();
        let oracle = leg(
            LegName::Oracle,
            &[1, 8],
            vec![Differ(0, 5, Some(0.0625))],
            None,
        );
        let engine = leg(LegName::Engine, &[1, 8], vec![], Some(3.0));
        let t = tally(&oracle, &input(&g, &ids, Some(&engine)));
        assert!(t.passed(), "{t:?}");
        assert_eq!(
            t.closest.as_ref().unwrap().scale_from,
            Some(ScaleFrom::Leg(LegName::Engine))
        );
        let t = tally(&oracle, &input(&g, &ids, None));
        assert!(!t.passed());
        let s = t.failures[0].to_string();
        assert!(s.contains("cannot be judged, because no scale is known there: the oracle leg reports none (path prefill)"), "{s}");
    }
}
