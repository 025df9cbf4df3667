//! The timing recipe of docs/PROTOCOL.md, applied identically to both legs' battery requests:
//! per output token = (elapsed(max_tokens=N) - elapsed(max_tokens=1)) / (N - 1), per prompt per
//! repeat; every sample is kept, the table shows medians.

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
