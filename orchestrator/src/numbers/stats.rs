//! The statistics `compare` rests on: the ratio of two medians with a bootstrap confidence
//! interval, and the Mann-Whitney U rank test. Both are distribution-free, because timing
//! samples are skewed (a slow outlier is common, a fast one is not) and rarely normal.

use statrs::distribution::{ContinuousCDF, Normal};

use ::stats::median;

/// SplitMix64: a small, fixed generator, so the same samples always give the same interval
/// (docs/REPORT.md promises byte-identical output from the same records).
struct SplitMix64(u64);

impl SplitMix64 {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    fn below(&mut self, n: usize) -> usize {
        // The modulo bias is below 2^-50 for the sample counts a battery has.
        (self.next() % n as u64) as usize
    }
}

pub const BOOTSTRAP_SEED: u64 = 0x5EED_0007;
pub const BOOTSTRAP_RESAMPLES: usize = 2000;

/// median(head) / median(base), and a percentile-bootstrap interval for it at `level` (0.95):
/// each side resampled with replacement on its own, `BOOTSTRAP_RESAMPLES` times, fixed seed.
/// None when either side is empty or a median is not positive.
pub fn ratio_of_medians(base: &[f64], head: &[f64], level: f64) -> Option<(f64, f64, f64)> {
    let (mb, mh) = (median(base)?, median(head)?);
    if mb <= 0.0 || mh <= 0.0 {
        return None;
    }
    let mut rng = SplitMix64(BOOTSTRAP_SEED);
    let mut draw = |xs: &[f64], buf: &mut Vec<f64>| {
        buf.clear();
        buf.extend((0..xs.len()).map(|_| xs[rng.below(xs.len())]));
        median(buf).unwrap_or(f64::NAN)
    };
    let (mut bb, mut hb) = (Vec::new(), Vec::new());
    let mut ratios: Vec<f64> = (0..BOOTSTRAP_RESAMPLES)
        .map(|_| {
            let b = draw(base, &mut bb);
            let h = draw(head, &mut hb);
            h / b
        })
        .filter(|r| r.is_finite())
        .collect();
    if ratios.is_empty() {
        return None;
    }
    ratios.sort_by(f64::total_cmp);
    let q = |p: f64| {
        let i = (p * (ratios.len() - 1) as f64).round() as usize;
        ratios[i.min(ratios.len() - 1)]
    };
    let tail = (1.0 - level) / 2.0;
    Some((mh / mb, q(tail), q(1.0 - tail)))
}

#[derive(Debug, Clone, Copy, PartialEq)]
pub struct MannWhitney {
    /// U of the first sample (`a`): the number of (a, b) pairs with a > b, ties counting half.
    pub u: f64,
    pub z: f64,
    /// Two-sided p-value, normal approximation with tie correction and continuity correction.
    pub p: f64,
}

/// The Mann-Whitney U test of `a` against `b`. None when either sample is empty.
pub fn mann_whitney(a: &[f64], b: &[f64]) -> Option<MannWhitney> {
    let (n1, n2) = (a.len(), b.len());
    if n1 == 0 || n2 == 0 {
        return None;
    }
    let mut all: Vec<(f64, bool)> = a
        .iter()
        .map(|&x| (x, true))
        .chain(b.iter().map(|&x| (x, false)))
        .collect();
    all.sort_by(|x, y| x.0.total_cmp(&y.0));
    let n = all.len();
    let (mut rank_a, mut ties) = (0.0, 0.0);
    let mut i = 0;
    while i < n {
        let mut j = i;
        while j + 1 < n && all[j + 1].0 == all[i].0 {
            j += 1;
        }
        // Tied values share the average of the ranks they span (1-based).
        let avg = (i + j) as f64 / 2.0 + 1.0;
        let t = (j - i + 1) as f64;
        ties += t * t * t - t;
        rank_a += avg * all[i..=j].iter().filter(|x| x.1).count() as f64;
        i = j + 1;
    }
    let (f1, f2, nf) = (n1 as f64, n2 as f64, n as f64);
    let u = rank_a - f1 * (f1 + 1.0) / 2.0;
    let mean = f1 * f2 / 2.0;
    let var = f1 * f2 / 12.0 * ((nf + 1.0) - ties / (nf * (nf - 1.0)).max(1.0));
    if var <= 0.0 {
        // Every value tied: no evidence of any difference.
        return Some(MannWhitney { u, z: 0.0, p: 1.0 });
    }
    let d = u - mean;
    let z = (d.abs() - 0.5).max(0.0).copysign(d) / var.sqrt();
    let normal = Normal::new(0.0, 1.0).expect("the standard normal is valid");
    let p = (2.0 * (1.0 - normal.cdf(z.abs()))).min(1.0);
    Some(MannWhitney { u, z, p })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mann_whitney_matches_a_hand_computed_case() {
        // a = 1,2,3 and b = 4,5,6: every a below every b, U = 0, mean 4.5, var 5.25,
        // z = -(4.5 - 0.5)/sqrt(5.25) = -1.7457, p = 0.0809 (the textbook normal approximation).
        let m = mann_whitney(&[1.0, 2.0, 3.0], &[4.0, 5.0, 6.0]).unwrap();
        assert_eq!(m.u, 0.0);
        assert!((m.z + 1.7457).abs() < 1e-3, "{m:?}");
        assert!((m.p - 0.0809).abs() < 1e-3, "{m:?}");
    }

    #[test]
    fn the_smallest_p_per_sample_count_is_what_docs_report_md_states() {
        let p = |n: usize| {
            let a: Vec<f64> = (0..n).map(|i| i as f64).collect();
            let b: Vec<f64> = (0..n).map(|i| (i + n) as f64).collect();
            mann_whitney(&a, &b).unwrap().p
        };
        assert!((p(2) - 0.245).abs() < 1e-3, "{}", p(2));
        assert!((p(3) - 0.081).abs() < 1e-3, "{}", p(3));
        assert!((p(4) - 0.030).abs() < 1e-3, "{}", p(4));
    }

    #[test]
    fn ties_shrink_the_variance_and_all_ties_give_p_one() {
        // a = 1,1,2 and b = 2,3,3: ranks 1.5,1.5,3.5 | 3.5,5.5,5.5; U = 6.5 - 6 = 0.5;
        // ties: three groups of 2 -> sum(t^3 - t) = 18; var = 9/12 * (7 - 18/30) = 4.8.
        let m = mann_whitney(&[1.0, 1.0, 2.0], &[2.0, 3.0, 3.0]).unwrap();
        assert_eq!(m.u, 0.5);
        assert!(
            (m.z - (-(4.5 - 0.5 - 0.5) / 4.8f64.sqrt())).abs() < 1e-9,
            "{m:?}"
        );
        let m = mann_whitney(&[2.0, 2.0], &[2.0, 2.0]).unwrap();
        assert_eq!((m.u, m.p), (2.0, 1.0));
        assert!(mann_whitney(&[], &[1.0]).is_none());
    }

    #[test]
    fn bootstrap_interval_is_fixed_and_brackets_a_clear_shift() {
        let base: Vec<f64> = (0..15).map(|i| 1.0 + 0.001 * i as f64).collect();
        let head: Vec<f64> = base.iter().map(|x| x * 1.1).collect();
        let (r, lo, hi) = ratio_of_medians(&base, &head, 0.95).unwrap();
        assert!((r - 1.1).abs() < 1e-12);
        assert!(
            lo > 1.09 && hi < 1.11 && lo <= r && r <= hi,
            "{lo} {r} {hi}"
        );
        assert_eq!(
            ratio_of_medians(&base, &head, 0.95),
            Some((r, lo, hi)),
            "the fixed seed makes the interval repeatable"
        );
        assert!(ratio_of_medians(&[], &head, 0.95).is_none());
    }
}
