//! The exact tally: a leg's free-running tokens against the golden, as grand totals over every
//! battery repeat at the batch sizes asked for, so a leg that matched once and diverged later
//! cannot pass. The rule where the golden was captured by the same implementation on the same
//! device and dtype at batch 1, and for units whose golden is marked exact (rule.rs); for every
//! other leg it is recorded as information, with each prompt's first divergence.

use serde::{Deserialize, Serialize};
use std::fmt;

use crate::legs::record::{LegRecord, RequestKind};
use crate::unit::Golden;
use crate::util::fmt::fmt_num;

/// The first difference of a failing prompt (its earliest position over all its rows).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Mismatch {
    pub prompt: String,
    /// Which request showed it first: battery pass and batch size.
    pub pass: u32,
    pub batch: u32,
    pub position: usize,
    /// None: the leg stopped before this position.
    pub got: Option<u32>,
    pub want: u32,
    /// The golden's top-2 margin there, where it records one.
    pub margin: Option<f64>,
    /// The golden's best other token there, where the golden records it.
    #[serde(default)]
    pub runner_up: Option<u32>,
}

impl fmt::Display for Mismatch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let got = match self.got {
            Some(t) => format!("got {t}"),
            None => "got nothing (the leg stopped early)".into(),
        };
        write!(
            f,
            "prompt {} first differs at position {} (repeat {}, batch {}): {got}, golden {}",
            self.prompt,
            self.position,
            self.pass + 1,
            self.batch,
            self.want
        )?;
        match (self.margin, self.runner_up) {
            (Some(m), Some(r)) => write!(
                f,
                " (golden margin {}; its runner-up there is {r}{})",
                fmt_num(m),
                if self.got == Some(r) {
                    ", the token the leg took"
                } else {
                    ", not the token the leg took"
                }
            ),
            (Some(m), None) => write!(f, " (golden margin {})", fmt_num(m)),
            (None, _) => write!(f, " (no margin recorded there)"),
        }
    }
}

/// Grand totals of one leg's free-running rows against one golden.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct TokenTally {
    /// Positions matched before each row's first difference, summed over rows.
    pub matched: u64,
    /// Golden positions compared, summed over rows.
    pub expected: u64,
    /// Distinct prompts compared.
    pub prompts: usize,
    /// Rows (prompt x repeat x batch size) equal to the golden.
    pub full_rows: u64,
    /// Rows that stopped before the golden did (what they produced may still match).
    pub short_rows: u64,
    pub rows: u64,
    /// The first mismatch per failing prompt (earliest position over all its rows).
    pub mismatches: Vec<Mismatch>,
}

impl TokenTally {
    pub fn passed(&self) -> bool {
        self.rows > 0 && self.full_rows == self.rows && self.matched == self.expected
    }

    /// The reference report's wording.
    pub fn summary(&self) -> String {
        format!(
            "TOKEN MATCH: {}/{} over {} prompt(s) (full rows={}, short rows={})",
            self.matched, self.expected, self.prompts, self.full_rows, self.short_rows
        )
    }

    /// Each failing prompt's first divergence, "p0 at 12, p3 at 40" (none: "none").
    pub fn divergences(&self) -> String {
        if self.mismatches.is_empty() {
            return "none".into();
        }
        let v: Vec<String> = self
            .mismatches
            .iter()
            .map(|m| format!("{} at {}", m.prompt, m.position))
            .collect();
        v.join(", ")
    }
}

/// Compares every max_tokens=N battery row of `leg` at the batch sizes `batches` with
/// `golden`.
pub fn tally(
    leg: &LegRecord,
    prompt_ids: &[String],
    golden: &Golden,
    max_tokens: u32,
    batches: &[u32],
) -> TokenTally {
    let mut t = TokenTally {
        prompts: prompt_ids.len(),
        ..Default::default()
    };
    let mut first: Vec<Option<Mismatch>> = vec![None; prompt_ids.len()];
    for req in leg.battery_requests().filter(|r| {
        matches!(r.kind, RequestKind::Decode | RequestKind::Batch) && batches.contains(&r.batch)
    }) {
        for res in &req.results {
            let Some(id) = prompt_ids.get(res.index) else {
                continue;
            };
            let Some(out) = golden.output(id) else {
                continue;
            };
            let want = &out.tokens[..out.tokens.len().min(max_tokens as usize)];
            let got = &res.tokens;
            let prefix = want.iter().zip(got).take_while(|(a, b)| a == b).count();
            t.rows += 1;
            t.expected += want.len() as u64;
            t.matched += prefix as u64;
            if got.as_slice() == want {
                t.full_rows += 1;
                continue;
            }
            if got.len() < want.len() {
                t.short_rows += 1;
            }
            // A row longer than the golden differs at the golden's end: report the golden's last
            // position as the place (there is no golden token beyond it).
            let position = prefix.min(want.len().saturating_sub(1));
            let m = Mismatch {
                prompt: id.clone(),
                pass: req.pass,
                batch: req.batch,
                position,
                got: got.get(position).copied(),
                want: want.get(position).copied().unwrap_or(0),
                margin: out
                    .margins
                    .as_ref()
                    .and_then(|m| m.get(position).copied().flatten()),
                runner_up: out
                    .runner_up
                    .as_ref()
                    .and_then(|r| r.get(position).copied().flatten()),
            };
            let slot = &mut first[res.index];
            if slot.as_ref().is_none_or(|s| m.position < s.position) {
                *slot = Some(m);
            }
        }
    }
    t.mismatches = first.into_iter().flatten().collect();
    t
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::unit::{GoldenCapture, GoldenOutput};

    pub(crate) fn golden() -> Golden {
        Golden {
            schema: 1,
            max_tokens: 4,
            ignore_eos: true,
            capture: GoldenCapture {
                backend: None,
                versions: Default::default(),
                dtype: None,
                device: None,
                resolved: Default::default(),
            },
            outputs: vec![
                GoldenOutput {
                    id: "p0".into(),
                    tokens: vec![1, 2, 3, 4],
                    margins: Some(vec![Some(1.0), Some(1.0), Some(0.0001), Some(1.0)]),
                    runner_up: None,
                    scales: None,
                },
                GoldenOutput {
                    id: "p1".into(),
                    tokens: vec![5, 6, 7, 8],
                    margins: None,
                    runner_up: None,
                    scales: None,
                },
            ],
        }
    }

    fn leg(rows: Vec<(u32, u32, Vec<Vec<u32>>)>) -> LegRecord {
        crate::gates::testing::battery("engine", rows)
    }

    fn ids() -> Vec<String> {
        vec!["p0".into(), "p1".into()]
    }

    #[test]
    fn all_rows_match_text_is_exact() {
        let l = leg(vec![
            (0, 1, vec![vec![1, 2, 3, 4], vec![5, 6, 7, 8]]),
            (1, 1, vec![vec![1, 2, 3, 4], vec![5, 6, 7, 8]]),
        ]);
        let t = tally(&l, &ids(), &golden(), 4, &[1]);
        assert!(t.passed());
        assert_eq!(
            t.summary(),
            "TOKEN MATCH: 16/16 over 2 prompt(s) (full rows=4, short rows=0)"
        );
        assert_eq!(t.divergences(), "none");
    }

    #[test]
    fn a_second_repeat_that_diverges_fails_the_grand_total() {
        let l = leg(vec![
            (0, 1, vec![vec![1, 2, 3, 4], vec![5, 6, 7, 8]]),
            (1, 1, vec![vec![1, 2, 9, 9], vec![5, 6, 7]]),
        ]);
        let t = tally(&l, &ids(), &golden(), 4, &[1]);
        assert!(!t.passed());
        assert_eq!(
            t.summary(),
            "TOKEN MATCH: 13/16 over 2 prompt(s) (full rows=2, short rows=1)"
        );
        assert_eq!(t.mismatches.len(), 2);
        let m0 = &t.mismatches[0];
        assert_eq!(
            (m0.prompt.as_str(), m0.position, m0.got, m0.want, m0.pass),
            ("p0", 2, Some(9), 3, 1)
        );
        assert!(
            m0.to_string().ends_with("(golden margin 0.0001000)"),
            "{m0}"
        );
        let m1 = &t.mismatches[1];
        assert_eq!((m1.position, m1.got, m1.margin), (3, None, None));
        assert!(m1.to_string().contains("stopped early"), "{m1}");
        assert_eq!(t.divergences(), "p0 at 2, p1 at 3");
    }

    #[test]
    fn a_mismatch_names_the_goldens_runner_up_and_whether_the_leg_took_it() {
        let mut g = golden();
        g.outputs[0].runner_up = Some(vec![Some(5), Some(5), Some(9), Some(5)]);
        let at_2 = |token: u32| {
            let rows = vec![(0, 1, vec![vec![1, 2, token, 4], vec![5, 6, 7, 8]])];
            let t = tally(&leg(rows), &ids(), &g, 4, &[1]);
            assert_eq!(t.mismatches.len(), 1);
            t.mismatches[0].to_string()
        };
        assert!(at_2(9).ends_with("its runner-up there is 9, the token the leg took)"));
        assert!(at_2(0).ends_with("its runner-up there is 9, not the token the leg took)"));
    }

    #[test]
    fn only_the_batch_sizes_asked_for_are_tallied() {
        let l = leg(vec![
            (0, 1, vec![vec![1, 2, 3, 4], vec![5, 6, 7, 8]]),
            (0, 8, vec![vec![7, 2, 3, 4], vec![5, 6, 7, 8]]),
        ]);
        assert!(tally(&l, &ids(), &golden(), 4, &[1]).passed());
        let t = tally(&l, &ids(), &golden(), 4, &[1, 8]);
        assert_eq!(
            t.summary(),
            "TOKEN MATCH: 12/16 over 2 prompt(s) (full rows=3, short rows=0)"
        );
        assert_eq!(t.mismatches[0].batch, 8);
    }

    #[test]
    fn golden_longer_than_battery_compares_only_max_tokens() {
        let l = leg(vec![(0, 1, vec![vec![1, 2], vec![5, 6]])]);
        let t = tally(&l, &ids(), &golden(), 2, &[1]);
        assert!(t.passed());
        assert_eq!(
            t.summary(),
            "TOKEN MATCH: 4/4 over 2 prompt(s) (full rows=2, short rows=0)"
        );
    }

    #[test]
    fn no_rows_never_passes() {
        let l = leg(vec![]);
        assert!(!tally(&l, &ids(), &golden(), 4, &[1]).passed());
    }
}
