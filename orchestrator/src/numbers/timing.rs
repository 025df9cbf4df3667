//! The timing recipe of docs/PROTOCOL.md, applied identically to both legs' battery requests:
//! per output token = (elapsed(max_tokens=N) - elapsed(max_tokens=1)) / (N - 1), per prompt per
//! repeat; every sample is kept, the table shows medians. At each batch size above 1 the same
//! recipe splits the batch's wall time: its prefill = wall(max_tokens=1), its decode step =
//! (wall(max_tokens=N) - wall(max_tokens=1)) / (N - 1), one figure per repeat.

use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

use crate::legs::record::{LegRecord, RequestKind};

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Sample {
    pub prompt: usize,
    pub pass: u32,
    pub s: f64,
}

#[derive(Debug, Clone, Serialize, Deserialize, Default)]
pub struct Timings {
    /// Seconds per output token, one per prompt per repeat.
    pub per_token_s: Vec<Sample>,
    /// elapsed(max_tokens=1) at batch 1: prefill plus the first token, one per prompt per repeat.
    pub ttft_s: Vec<Sample>,
    /// Output tokens per second of the max_tokens=N requests, by batch size (1 included): one
    /// figure per repeat, total new tokens / the request's wall_s.
    pub throughput_tok_s: BTreeMap<u32, Vec<f64>>,
    /// By batch size above 1, one figure per repeat: wall_s of the max_tokens=1 request, every
    /// prompt of the batch prefilled to its first token.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub batch_prefill_s: BTreeMap<u32, Vec<f64>>,
    /// By batch size above 1, one figure per repeat: (wall_s(max_tokens=N) -
    /// wall_s(max_tokens=1)) / (the most tokens any of its rows produced - 1), the time of one
    /// decode step of the whole batch.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub batch_step_s: BTreeMap<u32, Vec<f64>>,
}

impl Timings {
    pub fn from_leg(leg: &LegRecord) -> Timings {
        let mut t = Timings::default();
        let reqs: Vec<_> = leg.battery_requests().collect();
        for r in &reqs {
            if r.kind == RequestKind::FirstToken {
                for res in &r.results {
                    t.ttft_s.push(Sample {
                        prompt: res.index,
                        pass: r.pass,
                        s: res.elapsed_s,
                    });
                }
            }
            if matches!(r.kind, RequestKind::Decode | RequestKind::Batch) && r.wall_s > 0.0 {
                let toks: usize = r.results.iter().map(|x| x.tokens.len()).sum();
                t.throughput_tok_s
                    .entry(r.batch)
                    .or_default()
                    .push(toks as f64 / r.wall_s);
            }
        }
        for n in reqs.iter().filter(|r| r.kind == RequestKind::Batch) {
            let Some(one) = reqs.iter().find(|r| {
                r.kind == RequestKind::BatchFirstToken && r.pass == n.pass && r.batch == n.batch
            }) else {
                continue;
            };
            t.batch_prefill_s
                .entry(n.batch)
                .or_default()
                .push(one.wall_s);
            let produced = n.results.iter().map(|x| x.tokens.len()).max().unwrap_or(0);
            if produced >= 2 && n.wall_s > 0.0 {
                t.batch_step_s
                    .entry(n.batch)
                    .or_default()
                    .push((n.wall_s - one.wall_s) / (produced - 1) as f64);
            }
        }
        for n in reqs.iter().filter(|r| r.kind == RequestKind::Decode) {
            let Some(one) = reqs
                .iter()
                .find(|r| r.kind == RequestKind::FirstToken && r.pass == n.pass)
            else {
                continue;
            };
            for res in &n.results {
                let Some(first) = one.results.iter().find(|x| x.index == res.index) else {
                    continue;
                };
                // With ignore_eos = false a prompt may stop early: divide by what it produced.
                let produced = res.tokens.len();
                if produced >= 2 {
                    t.per_token_s.push(Sample {
                        prompt: res.index,
                        pass: n.pass,
                        s: (res.elapsed_s - first.elapsed_s) / (produced - 1) as f64,
                    });
                }
            }
        }
        t
    }
}

/// The median of the samples' seconds.
pub fn median_of(samples: &[Sample]) -> Option<f64> {
    ::stats::median(&samples.iter().map(|s| s.s).collect::<Vec<_>>())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gates::testing::record;
    use crate::legs::protocol::PromptResult;
    use crate::legs::record::RequestRecord;
    use crate::legs::watchdog::Phase;

    fn request(
        kind: RequestKind,
        pass: u32,
        batch: u32,
        wall_s: f64,
        produced: &[usize],
    ) -> RequestRecord {
        RequestRecord {
            id: format!("r{pass}-{batch}"),
            phase: Phase::Battery,
            pass,
            kind,
            batch,
            max_tokens: produced.iter().copied().max().unwrap_or(0) as u32,
            wall_s,
            results: produced
                .iter()
                .enumerate()
                .map(|(index, &n)| PromptResult {
                    id: format!("r{pass}"),
                    index,
                    tokens: vec![7; n],
                    elapsed_s: wall_s,
                    ttft_s: None,
                    copy: 0,
                })
                .collect(),
        }
    }

    #[test]
    fn a_batch_splits_into_its_prefill_and_its_decode_step_per_repeat() {
        use RequestKind::{Batch, BatchFirstToken};
        let mut leg = record("engine");
        leg.requests = vec![
            // A warm-up pass is never timed.
            RequestRecord {
                phase: Phase::Warmup,
                ..request(BatchFirstToken, 0, 8, 9.0, &[1, 1])
            },
            request(BatchFirstToken, 0, 8, 0.1, &[1, 1]),
            request(Batch, 0, 8, 0.4, &[4, 4]),
            // A row that stopped early does not shorten the step: the longest row counts.
            request(BatchFirstToken, 1, 8, 0.2, &[1, 1]),
            request(Batch, 1, 8, 0.8, &[2, 4]),
            // Batch 32 of pass 0 has no max_tokens=1 request to subtract: throughput only.
            request(Batch, 0, 32, 1.0, &[4, 4]),
        ];
        let t = Timings::from_leg(&leg);
        assert_eq!(t.batch_prefill_s.get(&8), Some(&vec![0.1, 0.2]));
        let step = &t.batch_step_s[&8];
        assert_eq!(step.len(), 2);
        assert!((step[0] - 0.1).abs() < 1e-12, "{step:?}");
        assert!((step[1] - 0.2).abs() < 1e-12, "{step:?}");
        assert!(!t.batch_step_s.contains_key(&32));
        assert!(!t.batch_prefill_s.contains_key(&32));
        assert_eq!(t.throughput_tok_s[&32], vec![8.0]);
    }
}
