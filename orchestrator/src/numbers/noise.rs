//! A/A noise: how much a leg disagrees with itself. Each timed pass over the battery (a
//! *repeat*, all over one load) gives one figure per axis: the median over the prompts of the
//! per-token times (or times to first token) of that pass, or that pass's throughput at a batch
//! size. The *spread* of a leg on an axis is (max - min) / median of those per-repeat figures,
//! in percent. A ratio between the legs whose gap is inside the legs' own spread does not
//! separate them. Computed from the timings alone, so it reads the same from any record.

use std::collections::BTreeMap;

use crate::numbers::timing::Timings;
use crate::util::fmt::fmt_num;
use ::stats::median;

/// One axis of one leg: its per-repeat figures in pass order and their spread.
#[derive(Debug, Clone, PartialEq)]
pub struct Spread {
    pub per_repeat: Vec<f64>,
    pub median: f64,
    /// (max - min) / median x 100.
    pub spread_pct: f64,
}

/// The spread of per-repeat figures; None with fewer than two (no repeat to disagree with).
pub fn spread(per_repeat: Vec<f64>) -> Option<Spread> {
    if per_repeat.len() < 2 || per_repeat.iter().any(|x| !x.is_finite()) {
        return None;
    }
    let m = median(&per_repeat)?;
    let lo = per_repeat.iter().copied().fold(f64::INFINITY, f64::min);
    let hi = per_repeat.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    (m > 0.0).then(|| Spread {
        median: m,
        spread_pct: (hi - lo) / m * 100.0,
        per_repeat,
    })
}

/// Per pass (in pass order), the median of that pass's samples.
pub fn per_pass_medians(samples: impl IntoIterator<Item = (u32, f64)>) -> Vec<f64> {
    let mut by: BTreeMap<u32, Vec<f64>> = BTreeMap::new();
    for (pass, s) in samples {
        by.entry(pass).or_default().push(s);
    }
    by.values().filter_map(|v| median(v)).collect()
}

/// A leg's A/A noise on each timing axis.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct LegNoise {
    pub per_token: Option<Spread>,
    pub ttft: Option<Spread>,
    /// By batch size.
    pub throughput: BTreeMap<u32, Spread>,
    /// By batch size above 1: the batch's prefill, and its decode step.
    pub batch_prefill: BTreeMap<u32, Spread>,
    pub batch_step: BTreeMap<u32, Spread>,
}

type ByBatch<'a> = &'a BTreeMap<u32, Vec<f64>>;

fn spreads(by_batch: ByBatch) -> BTreeMap<u32, Spread> {
    by_batch
        .iter()
        .filter_map(|(b, v)| spread(v.clone()).map(|s| (*b, s)))
        .collect()
}

impl LegNoise {
    pub fn new(
        per_token: impl IntoIterator<Item = (u32, f64)>,
        ttft: impl IntoIterator<Item = (u32, f64)>,
        throughput: impl IntoIterator<Item = (u32, Vec<f64>)>,
    ) -> LegNoise {
        LegNoise {
            per_token: spread(per_pass_medians(per_token)),
            ttft: spread(per_pass_medians(ttft)),
            throughput: throughput
                .into_iter()
                .filter_map(|(b, v)| spread(v).map(|s| (b, s)))
                .collect(),
            ..LegNoise::default()
        }
    }

    /// With the spreads of each batch's prefill and decode step (per-repeat figures by batch).
    pub fn with_batch_phases(mut self, prefill: ByBatch, step: ByBatch) -> LegNoise {
        self.batch_prefill = spreads(prefill);
        self.batch_step = spreads(step);
        self
    }

    pub fn of(t: &Timings) -> LegNoise {
        LegNoise::new(
            t.per_token_s.iter().map(|s| (s.pass, s.s)),
            t.ttft_s.iter().map(|s| (s.pass, s.s)),
            t.throughput_tok_s.iter().map(|(b, v)| (*b, v.clone())),
        )
        .with_batch_phases(&t.batch_prefill_s, &t.batch_step_s)
    }

    /// "per output token 2.310 / 2.330 ms (spread 0.87%); ..." or why there is none.
    pub fn sentence(&self, leg: &str) -> String {
        let mut parts = vec![];
        let times = |s: &Spread| {
            s.per_repeat
                .iter()
                .map(|x| fmt_num(x * 1e3))
                .collect::<Vec<_>>()
                .join(" / ")
        };
        if let Some(s) = &self.per_token {
            parts.push(format!(
                "per output token {} ms over {} repeats (spread {:.2}%)",
                times(s),
                s.per_repeat.len(),
                s.spread_pct
            ));
        }
        if let Some(s) = &self.ttft {
            parts.push(format!(
                "time to first token {} ms (spread {:.2}%)",
                times(s),
                s.spread_pct
            ));
        }
        for (b, s) in &self.throughput {
            parts.push(format!(
                "throughput at batch {b} {} tok/s (spread {:.2}%)",
                s.per_repeat
                    .iter()
                    .map(|x| fmt_num(*x))
                    .collect::<Vec<_>>()
                    .join(" / "),
                s.spread_pct
            ));
        }
        for (phase, by_batch) in [
            ("prefill", &self.batch_prefill),
            ("decode step", &self.batch_step),
        ] {
            for (b, s) in by_batch {
                parts.push(format!(
                    "{phase} at batch {b} {} ms (spread {:.2}%)",
                    times(s),
                    s.spread_pct
                ));
            }
        }
        if parts.is_empty() {
            format!("{leg}: no A/A figure (fewer than two completed repeats)")
        } else {
            format!("{leg}: {}", parts.join("; "))
        }
    }
}

/// Each leg's A/A noise in a sentence, then "so" whether the per-token gap beats it.
pub fn lines(engine: &LegNoise, oracle: &LegNoise, ratio: Option<f64>) -> Vec<String> {
    let mut v = vec![engine.sentence("engine"), oracle.sentence("oracle")];
    v.extend(verdict(ratio, engine, oracle).map(|s| format!("so {s}")));
    v
}

/// Whether the per-token ratio's gap stands outside both legs' own spread, in words; None
/// without a ratio or a spread for either leg.
pub fn verdict(ratio: Option<f64>, engine: &LegNoise, oracle: &LegNoise) -> Option<String> {
    let r = ratio?;
    let (e, o) = (engine.per_token.as_ref()?, oracle.per_token.as_ref()?);
    let gap = (r - 1.0).abs() * 100.0;
    let widest = e.spread_pct.max(o.spread_pct);
    Some(if gap > widest {
        format!(
            "the per-token gap between the legs ({gap:.2}%) is larger than either leg's spread over its repeats (engine {:.2}%, oracle {:.2}%).",
            e.spread_pct, o.spread_pct
        )
    } else {
        format!(
            "the per-token gap between the legs ({gap:.2}%) is within a leg's own spread over its repeats (engine {:.2}%, oracle {:.2}%): the ratio does not separate the legs.",
            e.spread_pct, o.spread_pct
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spread_is_range_over_median_of_per_pass_medians() {
        // Two prompts, three passes: per-pass medians 2.0, 2.2, 2.1 (ms).
        let pt = [
            (0, 1.9e-3),
            (0, 2.1e-3),
            (1, 2.2e-3),
            (1, 2.2e-3),
            (2, 2.0e-3),
            (2, 2.2e-3),
        ];
        let n = LegNoise::new(pt, [], [(8, vec![100.0, 110.0]), (1, vec![50.0])]);
        let s = n.per_token.clone().unwrap();
        assert_eq!(s.per_repeat.len(), 3);
        assert!((s.median - 2.1e-3).abs() < 1e-12);
        assert!((s.spread_pct - 0.2 / 2.1 * 100.0).abs() < 1e-9, "{s:?}");
        // One repeat has nothing to disagree with.
        assert!(n.ttft.is_none());
        assert_eq!(n.throughput.keys().copied().collect::<Vec<_>>(), vec![8]);
        let line = n.sentence("engine");
        assert!(
            line.starts_with(
                "engine: per output token 2.000 / 2.200 / 2.100 ms over 3 repeats (spread 9.52%)"
            ),
            "{line}"
        );
        assert!(
            line.contains("throughput at batch 8 100.0 / 110.0 tok/s (spread 9.52%)"),
            "{line}"
        );
        assert_eq!(
            LegNoise::default().sentence("oracle"),
            "oracle: no A/A figure (fewer than two completed repeats)"
        );
    }

    #[test]
    fn verdict_says_whether_the_gap_beats_the_noise() {
        let leg = |a: f64, b: f64| LegNoise::new([(0, a), (1, b)], [], []);
        let (e, o) = (leg(1.0, 1.02), leg(2.0, 2.01));
        // Spreads: engine ~1.98%, oracle ~0.50%.
        let out = verdict(Some(0.5), &e, &o).unwrap();
        assert!(out.contains("(50.00%) is larger than"), "{out}");
        let within = verdict(Some(1.01), &e, &o).unwrap();
        assert!(within.contains("within a leg's own spread"), "{within}");
        assert!(verdict(None, &e, &o).is_none());
        assert!(verdict(Some(1.0), &e, &LegNoise::default()).is_none());
    }
}
