//! What a leg answered to `verify` (teacher forcing), as the leg record keeps it, compactly: per
//! prompt only the positions where its choice differs from the forced token (the others agreed,
//! gap 0), and the logits' scale at every position (the token gate reads the other leg's scale
//! where a leg cannot report its own).

use serde::{Deserialize, Serialize};

use crate::legs::protocol::Verified;

/// What the verify phase asks for.
#[derive(Debug, Clone, Default)]
pub struct VerifyPlan {
    pub prompts: Vec<Vec<u32>>,
    /// The tokens to feed, one list per prompt (the golden's, cut to the battery's max_tokens).
    pub forced: Vec<Vec<u32>>,
    /// The battery batch sizes to verify at; empty: no verify phase.
    pub batches: Vec<u32>,
}

/// A position where the leg's greedy choice is not the forced token: (position, the leg's
/// argmax, gap = logit(argmax) - logit(forced), None where the leg's logits were not finite).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Differ(pub usize, pub u32, pub Option<f64>);

/// One prompt of one verify request, as the record keeps it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct VerifiedRow {
    pub index: usize,
    /// Which code path produced the logits ("decode": the timed step; "prefill": one pass).
    pub path: String,
    /// Positions verified (the forced tokens fed).
    pub positions: usize,
    /// Every position whose argmax differs from the forced token or whose gap is not 0: the
    /// rest agreed with gap 0.
    pub differ: Vec<Differ>,
    /// The largest |logit| per position (an entry None: not finite); None where the leg cannot
    /// know it (vLLM returns log-probs of the top-k only).
    pub scale: Option<Vec<Option<f64>>>,
    /// Which repeat of its prompt this row is, where the request ran the battery over again to
    /// fill a larger batch (as the battery's results: protocol.rs `PromptResult::copy`).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub copy: u32,
}

fn is_zero(v: &u32) -> bool {
    *v == 0
}

impl VerifiedRow {
    pub fn of(v: &Verified, forced: &[u32]) -> VerifiedRow {
        let differ = (0..v.argmax.len().max(v.gap.len()))
            .filter_map(|j| {
                let a = v.argmax.get(j).copied().unwrap_or(u32::MAX);
                let g = v.gap.get(j).copied().flatten();
                let agrees = forced.get(j) == Some(&a) && g == Some(0.0);
                (!agrees).then_some(Differ(j, a, g))
            })
            .collect();
        VerifiedRow {
            index: v.index,
            path: v.path.clone(),
            positions: v.argmax.len(),
            differ,
            scale: v.scale.clone(),
            copy: 0,
        }
    }

    /// The leg's scale at `position`, when it reported a finite one.
    pub fn scale_at(&self, position: usize) -> Option<f64> {
        self.scale.as_ref()?.get(position).copied().flatten()
    }
}

/// One verify request: its batch size and each prompt's row, in prompt order.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct VerifyRecord {
    pub id: String,
    pub batch: u32,
    pub wall_s: f64,
    pub rows: Vec<VerifiedRow>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_row_keeps_only_the_positions_that_differ() {
        let v = Verified {
            id: "v".into(),
            index: 2,
            argmax: vec![5, 7, 0, 9],
            gap: vec![Some(0.0), Some(0.125), None, Some(0.0)],
            scale: Some(vec![Some(3.0), Some(3.5), None, Some(2.0)]),
            path: "decode".into(),
        };
        let r = VerifiedRow::of(&v, &[5, 6, 1, 9]);
        assert_eq!(
            r.differ,
            vec![Differ(1, 7, Some(0.125)), Differ(2, 0, None)]
        );
        assert_eq!(
            (r.positions, r.scale_at(1), r.scale_at(2)),
            (4, Some(3.5), None)
        );
        assert_eq!(
            serde_json::to_string(&r.differ).unwrap(),
            "[[1,7,0.125],[2,0,null]]"
        );
    }
}
