//! Why the token gate refuses a leg: one variant a refusal, whose Display is the whole sentence
//! with its hint.

use serde::{Deserialize, Serialize};
use std::fmt;
use std::path::PathBuf;

use super::exact::Mismatch;
use super::forced::ForcedTally;
use crate::legs::record::LegName;
use crate::util::fmt::{capitalise_first, fmt_num};

/// Why a leg's tokens are refused. Display is the whole sentence.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(tag = "refusal", rename_all = "snake_case")]
pub enum TokenReason {
    /// Rows held to exact match differ from the golden.
    TokenMismatch {
        leg: LegName,
        summary: String,
        golden: PathBuf,
        mismatches: Vec<Mismatch>,
        /// Why these rows are held to exact match.
        #[serde(default)]
        exact_because: Option<String>,
        /// The GPU the golden was captured on and the one the leg ran on, where both are known
        /// (`versions.gpu` of the golden's capture and of the leg's ready) and differ.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        other_gpu: Option<Box<(String, String)>>,
        /// Where the golden is the leg's own: the teacher-forced check at these batch sizes,
        /// which did not pass them either (absent in records before it was run).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        forced: Option<Box<ForcedTally>>,
    },
    /// Teacher-forced positions beyond the tolerance, not finite, or not judgeable, or batch
    /// sizes the leg did not verify.
    ForcedMismatch {
        leg: LegName,
        golden: PathBuf,
        tally: Box<ForcedTally>,
        /// The free-running tally at the same batch sizes, with first divergences (not gating).
        free_running: String,
    },
    NoGolden {
        leg: LegName,
        device: String,
        dtype: String,
    },
}

impl fmt::Display for TokenReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            TokenReason::TokenMismatch {
                leg,
                summary,
                golden,
                mismatches,
                exact_because,
                other_gpu,
                forced,
            } => {
                write!(
                    f,
                    "The {leg} leg's tokens do not match the golden {}: {summary}; its timings are printed but refused.",
                    golden.display()
                )?;
                for m in mismatches {
                    write!(f, " {}: {m}.", capitalise_first(leg.as_str()))?;
                }
                let because = exact_because.as_deref().unwrap_or("the unit's rule");
                match (forced.as_deref(), widest_tie(mismatches)) {
                    (Some(t), _) => own_forced_sentence(f, *leg, because, mismatches, t),
                    (None, Some(widest)) => write!(
                        f,
                        " Hint: these rows are held to exact match ({because}), and each first difference named is the golden's runner-up, at golden margins of at most {}: a near-tie decided the other way. A correct implementation does that when the order of its sums changes from one load to the next (code compiled and tuned afresh in each process: vLLM's torch.compile output does it on Nemotron-H, docs/ORACLE.md), and so does a bug that moves the logits a little; to tell them apart, capture the golden again and rerun with the capture's compile cache (vLLM: the VLLM_CACHE_ROOT it wrote), under which a correct implementation reproduces its golden, and bisect from the first position named if it still differs.",
                        fmt_num(widest)
                    ),
                    (None, None) => write!(
                        f,
                        " Hint: these rows are held to exact match ({because}), so any difference is a correctness bug to bisect, from the first position named."
                    ),
                }?;
                match other_gpu.as_deref() {
                    Some((golden_gpu, leg_gpu)) => write!(
                        f,
                        " The golden was captured on an {golden_gpu} and this leg ran on an {leg_gpu}: an implementation picks its kernels per GPU, so its sums may run in another order here; capture a golden on this GPU (python3 -m oracle capture, docs/ORACLE.md) to hold the leg to exact match on it."
                    ),
                    None => Ok(()),
                }
            }
            TokenReason::ForcedMismatch {
                leg,
                golden,
                tally,
                free_running,
            } => forced_sentence(f, *leg, golden, tally, free_running),
            TokenReason::NoGolden { leg, device, dtype } => write!(
                f,
                "No [[golden]] in the unit applies to the {leg} leg (device {device}, dtype {dtype}), so its tokens could not be checked and its timings are refused. Hint: capture a golden on this device and dtype and add a [[golden]] entry for it."
            ),
        }
    }
}

/// The widest golden margin among `mismatches` when every one of them is the leg taking the
/// golden's runner-up where the golden records a margin (a tie broken the other way); None when
/// any is not, or there are none.
fn widest_tie(mismatches: &[Mismatch]) -> Option<f64> {
    let ties = !mismatches.is_empty()
        && mismatches
            .iter()
            .all(|m| m.got.is_some() && m.got == m.runner_up && m.margin.is_some());
    ties.then(|| {
        mismatches
            .iter()
            .filter_map(|m| m.margin)
            .fold(0.0, f64::max)
    })
}

/// The hint of a leg off its own golden that the teacher-forced check did not pass either.
fn own_forced_sentence(
    f: &mut fmt::Formatter<'_>,
    leg: LegName,
    because: &str,
    mismatches: &[Mismatch],
    t: &ForcedTally,
) -> fmt::Result {
    let ties = match widest_tie(mismatches) {
        Some(w) => format!(
            "each first difference named is the golden's runner-up, at golden margins of at most {}, ",
            fmt_num(w)
        ),
        None => String::new(),
    };
    write!(
        f,
        " Fed the golden's tokens at those batch sizes, as rows off their own golden are judged, it did not pass either: {}.",
        t.summary()
    )?;
    failed_positions(f, leg, t)?;
    write!(
        f,
        " Hint: these rows are held to exact match ({because}); {ties}an implementation that compiles and tunes its kernels afresh in each process (vLLM's torch.compile on Nemotron-H, docs/ORACLE.md) may part from its golden at near-ties, so such rows are judged by teacher forcing as another implementation's are, and a position beyond the tolerance there is a bug to bisect at that prompt, position and batch; a batch size not verified must be answered (verify, docs/PROTOCOL.md)."
    )
}

/// Each failing prompt's worst position, then each batch size not verified.
fn failed_positions(f: &mut fmt::Formatter<'_>, leg: LegName, t: &ForcedTally) -> fmt::Result {
    let who = capitalise_first(leg.as_str());
    for p in &t.failures {
        write!(f, " {who}: {p}.")?;
    }
    for u in &t.unverified {
        write!(f, " Not verified: {u}.")?;
    }
    Ok(())
}

fn forced_sentence(
    f: &mut fmt::Formatter<'_>,
    leg: LegName,
    golden: &std::path::Path,
    t: &ForcedTally,
    free_running: &str,
) -> fmt::Result {
    if t.failures.is_empty() {
        write!(
            f,
            "The {leg} leg's tokens could not be judged by teacher forcing against the golden {}: {}; its timings are printed but refused.",
            golden.display(),
            t.unverified.join("; ")
        )?;
    } else {
        write!(
            f,
            "The {leg} leg, fed the golden {}'s tokens, chose others where rounding does not explain it: {}; its timings are printed but refused.",
            golden.display(),
            t.summary()
        )?;
        failed_positions(f, leg, t)?;
    }
    write!(
        f,
        " Free-running, not gating: {free_running}. Hint: a position where the leg's gap plus the golden's margin exceeds the tolerance (two sides' rounding at the logits' magnitude, docs/GATES.md) is not rounding but a bug to bisect at that prompt, position and batch; a non-finite gap is NaN or infinity in the leg's logits; a leg that did not verify must answer verify (docs/PROTOCOL.md) at every battery batch size."
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mismatch(prompt: &str, got: u32, runner_up: u32, margin: f64) -> Mismatch {
        Mismatch {
            prompt: prompt.into(),
            pass: 0,
            batch: 1,
            position: 3,
            got: Some(got),
            want: 7,
            margin: Some(margin),
            runner_up: Some(runner_up),
        }
    }

    fn exact_refusal(mismatches: Vec<Mismatch>) -> String {
        refusal_on(mismatches, None)
    }

    fn refusal_on(mismatches: Vec<Mismatch>, other_gpu: Option<(&str, &str)>) -> String {
        TokenReason::TokenMismatch {
            leg: LegName::Oracle,
            summary: "TOKEN MATCH: 1305/2560".into(),
            golden: "golden.json".into(),
            mismatches,
            exact_because: Some("same implementation at batch 1".into()),
            other_gpu: other_gpu.map(|(g, l)| Box::new((g.into(), l.into()))),
            forced: None,
        }
        .to_string()
    }

    #[test]
    fn an_exact_refusal_names_the_two_gpus_where_the_golden_came_from_another() {
        // nemotron-h-8b's oracle on an H100 at c2600e8b, against a golden captured on an H200.
        let ties = || vec![mismatch("p1", 74346, 74346, 0.0625)];
        let other = refusal_on(ties(), Some(("NVIDIA H200", "NVIDIA H100 80GB HBM3")));
        assert!(
            other.contains("The golden was captured on an NVIDIA H200 and this leg ran on an NVIDIA H100 80GB HBM3"),
            "{other}"
        );
        assert!(other.contains("capture a golden on this GPU"), "{other}");
        assert!(!exact_refusal(ties()).contains("captured on an"));
        // The record keeps the pair, and a record without it (older, or one GPU) reads as None.
        let r = TokenReason::TokenMismatch {
            leg: LegName::Oracle,
            summary: String::new(),
            golden: "g.json".into(),
            mismatches: vec![],
            exact_because: None,
            other_gpu: None,
            forced: None,
        };
        let json = serde_json::to_string(&r).unwrap();
        assert!(!json.contains("other_gpu"), "{json}");
        let back: TokenReason = serde_json::from_str(&json).unwrap();
        assert!(matches!(
            back,
            TokenReason::TokenMismatch {
                other_gpu: None,
                ..
            }
        ));
    }

    #[test]
    fn an_exact_refusal_whose_differences_are_all_the_goldens_runner_up_says_so() {
        // nemotron-h-8b's oracle at 2ee0cb1: every prompt parted where vLLM took its own
        // golden's runner-up, at margins of 0 and one bf16 step.
        let ties = exact_refusal(vec![
            mismatch("p1", 74346, 74346, 0.0625),
            mismatch("p3", 105096, 105096, 0.0),
        ]);
        assert!(ties.contains("each first difference named is the golden's runner-up, at golden margins of at most 0.06250"), "{ties}");
        // And how to tell a correct implementation's reordered sums from a bug (session 28).
        assert!(
            ties.contains("rerun with the capture's compile cache"),
            "{ties}"
        );
        assert!(
            !ties.contains("any difference is a correctness bug"),
            "{ties}"
        );
        // One difference that is not the runner-up, or has no margin, is not a tie: a bug.
        for odd in [mismatch("p4", 51890, 99, 0.0625), {
            let mut m = mismatch("p4", 51890, 51890, 0.0);
            m.margin = None;
            m
        }] {
            let bug = exact_refusal(vec![mismatch("p1", 74346, 74346, 0.0625), odd]);
            assert!(
                bug.contains("any difference is a correctness bug to bisect"),
                "{bug}"
            );
            assert!(!bug.contains("near-tie decided the other way"), "{bug}");
        }
        assert!(exact_refusal(vec![]).contains("correctness bug"));
    }
}
