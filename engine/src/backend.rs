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

pub trait Backend {
    /// Runs the prompt through the model at positions `0..tokens.len()`, writing its K and V into
    /// `table`'s blocks, and returns the greedy next token.
    fn prefill(&mut self, tokens: &[u32], table: &BlockTable) -> Result<u32>;

    /// One token for each item, all in one forward pass; returns the greedy next token of each.
    fn decode(&mut self, items: &[DecodeItem<'_>]) -> Result<Vec<u32>>;

    fn pool(&self) -> PoolShape;

    /// The `features` object of the `ready` event (docs/PROTOCOL.md).
    fn features(&self) -> serde_json::Value;
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
    #[test]
    fn argmax_lowest_index_wins_ties() {
        assert_eq!(super::argmax(&[1.0, 3.0, 3.0, 2.0]), 1);
        assert_eq!(super::argmax(&[-1.0, -1.0]), 0);
        assert_eq!(super::argmax(&[0.0, 0.5, 0.25]), 1);
    }
}
