//! The kv gate: the two paged pools must hold the same number of tokens (within a tolerance of
//! blocks), or the memory axes compare unlike things. The run resizes one leg first
//! (`[gates] kv_match`); this gate judges the pools as they finally were.

use super::{Gate, GateInput, GateResult, Refusal, Verdict};
use crate::legs::leg::LegName;
use crate::legs::protocol::Kv;

/// Pools within `tolerance_blocks` of the larger block size count as the same.
pub fn matched(a: &Kv, b: &Kv, tolerance_blocks: u64) -> bool {
    let slack = tolerance_blocks * a.block_size.max(b.block_size);
    a.capacity_tokens.abs_diff(b.capacity_tokens) <= slack
}

/// Blocks of `block_size` needed to hold at least `capacity_tokens`.
pub fn blocks_for(capacity_tokens: u64, block_size: u64) -> u64 {
    capacity_tokens.div_ceil(block_size.max(1))
}

pub struct KvGate;

impl Gate for KvGate {
    fn name(&self) -> &'static str {
        "kv"
    }

    fn judge(&self, input: &GateInput) -> Vec<GateResult> {
        let tol = input.unit.config.gates.kv_tolerance_blocks;
        let mut missing = vec![];
        for leg in [LegName::Engine, LegName::Oracle] {
            match input.leg(leg).ready.as_ref() {
                None => missing.push(format!("the {leg} leg never became ready")),
                Some(r) if r.kv.is_none() => missing.push(format!(
                    "the {leg} leg has no paged pool ({})",
                    r.no_kv_reason()
                )),
                _ => {}
            }
        }
        let verdict = if !missing.is_empty() {
            Verdict::NotApplicable {
                reason: missing.join("; "),
            }
        } else {
            let e = input
                .engine
                .ready
                .as_ref()
                .and_then(|r| r.kv.clone())
                .expect("checked above");
            let o = input
                .oracle
                .ready
                .as_ref()
                .and_then(|r| r.kv.clone())
                .expect("checked above");
            if matched(&e, &o, tol) {
                let how = input
                    .kv_resize
                    .map(|r| format!(", after {r}"))
                    .unwrap_or_default();
                Verdict::Pass {
                    text: format!(
                        "both pools hold the same tokens within {tol} block(s): engine {} ({} x {}), oracle {} ({} x {}){how}",
                        e.capacity_tokens, e.num_blocks, e.block_size, o.capacity_tokens, o.num_blocks, o.block_size
                    ),
                }
            } else {
                Verdict::Refused {
                    refusal: Refusal::KvUnmatched {
                        engine: Box::new(e),
                        oracle: Box::new(o),
                        tolerance_blocks: tol,
                        resized: input.kv_resize.map(str::to_string),
                    },
                }
            }
        };
        vec![GateResult::new(self.name(), None, verdict)]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn kv(bs: u64, n: u64) -> Kv {
        Kv {
            block_size: bs,
            num_blocks: n,
            capacity_tokens: bs * n,
            bytes: None,
            extra: Default::default(),
        }
    }

    #[test]
    fn within_one_block_of_the_larger_size() {
        assert!(matched(&kv(16, 64), &kv(16, 65), 1));
        assert!(!matched(&kv(16, 64), &kv(16, 66), 1));
        assert!(matched(&kv(16, 33), &kv(512, 1), 1));
        assert_eq!(blocks_for(1000, 16), 63);
        assert_eq!(blocks_for(1024, 16), 64);
    }
}
