//! What a compute backend provides to the scheduler. The scheduler (`generate`) owns the block
//! tables and decides what runs when; a backend owns the weights and the KV storage and runs
//! forward passes, choosing each next token greedily.

use crate::error::Result;
use crate::kv::{BlockTable, PoolShape};

/// One sequence's next position in a decode step.
pub struct DecodeItem<'a> {
    /// The token at `position` (the one chosen last step).
    pub token: u32,
    pub position: usize,
    pub table: &'a BlockTable,
}

/// What a verify pass (teacher forcing, docs/PROTOCOL.md `verify`) learns at one position: the
/// greedy choice, and how far the forced token's logit is below it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Scored {
    /// The greedy choice (ties to the lowest id).
    pub argmax: u32,
    /// logit(argmax) - logit(forced), in the backend's logits dtype: >= 0; 0 where the forced
    /// token is the argmax or ties with it; NaN where the logits are.
    pub gap: f32,
    /// The largest absolute logit (NaN where a logit is NaN): the magnitude that sets the
    /// rounding noise of `gap`.
    pub scale: f32,
}

impl Scored {
    /// One position's score from its logits.
    pub fn of(logits: &[f32], forced: u32) -> Self {
        let argmax = argmax(logits);
        let scale = logits.iter().fold(0.0f32, |m, &v| {
            if m.is_nan() || v.is_nan() {
                f32::NAN
            } else {
                m.max(v.abs())
            }
        });
        Self {
            argmax,
            gap: logits[argmax as usize] - logits[forced as usize],
            scale,
        }
    }
}

pub trait Backend {
    /// Runs the prompt through the model at positions `0..tokens.len()`, writing its K and V into
    /// `table`'s blocks, and returns the greedy next token.
    fn prefill(&mut self, tokens: &[u32], table: &BlockTable) -> Result<u32>;

    /// One token for each item, all in one forward pass; returns the greedy next token of each.
    fn decode(&mut self, items: &[DecodeItem<'_>]) -> Result<Vec<u32>>;

    /// As [`Backend::prefill`], through the same computation, and scores the next-token
    /// distribution against `next`, the first forced token.
    fn prefill_scored(&mut self, tokens: &[u32], table: &BlockTable, next: u32) -> Result<Scored>;

    /// As [`Backend::decode`], through the same step, and scores each item's next-token
    /// distribution against `forced[i]`, the token the next step feeds in its place.
    fn decode_scored(&mut self, items: &[DecodeItem<'_>], forced: &[u32]) -> Result<Vec<Scored>>;

    /// [`Backend::prefill`] of the prompts the scheduler admits together (one admission round):
    /// each one's greedy next token. A backend may run their rows through the model together
    /// (CUDA: one pass of several prompts, cuda/plan.rs `prefill_passes`); this default runs
    /// them one after the other.
    fn prefill_many(&mut self, seqs: &[(&[u32], &BlockTable)]) -> Result<Vec<u32>> {
        seqs.iter().map(|(t, b)| self.prefill(t, b)).collect()
    }

    /// [`Backend::prefill_scored`] of prompts admitted together, through the computation
    /// [`Backend::prefill_many`] runs: `next[i]` is prompt i's first forced token.
    fn prefill_many_scored(
        &mut self,
        seqs: &[(&[u32], &BlockTable)],
        next: &[u32],
    ) -> Result<Vec<Scored>> {
        seqs.iter()
            .zip(next)
            .map(|((t, b), &n)| self.prefill_scored(t, b, n))
            .collect()
    }

    fn pool(&self) -> PoolShape;

    /// The `features` object of the `ready` event (docs/PROTOCOL.md).
    fn features(&self) -> serde_json::Value;
}

/// The greedy token of each vocabulary-long row of `logits`.
pub fn argmax_rows(logits: &[f32], vocab: usize) -> Vec<u32> {
    logits.chunks_exact(vocab).map(argmax).collect()
}

/// Each vocabulary-long row of `logits` scored against its forced token.
pub fn score_rows(logits: &[f32], vocab: usize, forced: &[u32]) -> Vec<Scored> {
    logits
        .chunks_exact(vocab)
        .zip(forced)
        .map(|(l, &f)| Scored::of(l, f))
        .collect()
}

/// The index of the largest value; the lowest index wins a tie, as `torch.argmax` does.
pub fn argmax(values: &[f32]) -> u32 {
    let mut best = 0;
    for (i, &v) in values.iter().enumerate() {
        if v > values[best] {
            best = i;
        }
    }
    best as u32
}

#[cfg(test)]
mod tests {
    use super::Scored;

    #[test]
    fn a_score_is_the_gap_below_the_argmax_and_the_largest_magnitude() {
        let l = [1.0, 3.0, -4.5, 3.0, 2.5];
        let s = Scored::of(&l, 4);
        assert_eq!((s.argmax, s.gap, s.scale), (1, 0.5, 4.5));
        assert_eq!(Scored::of(&l, 1).gap, 0.0);
        // A tie with the argmax is no gap, though the argmax is the lower id.
        assert_eq!(
            Scored::of(&l, 3),
            Scored {
                argmax: 1,
                gap: 0.0,
                scale: 4.5
            }
        );
        let nan = Scored::of(&[0.5, f32::NAN, 1.0], 0);
        assert!(nan.scale.is_nan());
        assert!(Scored::of(&[f32::NAN, f32::NAN], 1).gap.is_nan());
    }

    #[test]
    fn argmax_lowest_index_wins_ties() {
        assert_eq!(super::argmax(&[1.0, 3.0, 3.0, 2.0]), 1);
        assert_eq!(super::argmax(&[-1.0, -1.0]), 0);
        assert_eq!(super::argmax(&[0.0, 0.5, 0.25]), 1);
    }
}
