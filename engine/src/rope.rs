//! Rotary position embedding in the Hugging Face convention: `inv_freq` computed in f32 as
//! transformers does, the angle `position * inv_freq[i]` shared by dimensions `i` and
//! `i + head_dim/2` (`rotate_half`, not interleaved pairs).

use crate::config::{Rope, RopeScaling};

/// The per-pair inverse frequencies, `head_dim / 2` of them, with scaling applied.
pub fn inv_freq(rope: &Rope, head_dim: usize) -> Vec<f32> {
    let base = rope.theta as f32;
    let half = head_dim / 2;
    let plain = (0..half).map(|i| {
        // transformers: 1 / (base ** (arange(0, dim, 2).float() / dim)), all in f32.
        let exponent = (2 * i) as f32 / head_dim as f32;
        1.0 / base.powf(exponent)
    });
    match rope.scaling {
        RopeScaling::Default => plain.collect(),
        RopeScaling::Linear { factor } => plain.map(|f| f / factor as f32).collect(),
        RopeScaling::Llama3 {
            factor,
            low_freq_factor,
            high_freq_factor,
            original_max_position_embeddings: old_ctx,
        } => {
            // In f32 throughout, as transformers computes it on its f32 tensor.
            let (factor, low, high, old_ctx) = (
                factor as f32,
                low_freq_factor as f32,
                high_freq_factor as f32,
                old_ctx as f32,
            );
            let low_freq_wavelen = old_ctx / low;
            let high_freq_wavelen = old_ctx / high;
            plain
                .map(|f| {
                    let wavelen = 2.0 * std::f32::consts::PI / f;
                    if wavelen < high_freq_wavelen {
                        f
                    } else if wavelen > low_freq_wavelen {
                        f / factor
                    } else {
                        let smooth = (old_ctx / wavelen - low) / (high - low);
                        (1.0 - smooth) * f / factor + smooth * f
                    }
                })
                .collect()
        }
    }
}

/// Rotates one head's vector in place for `position`.
pub fn apply(x: &mut [f32], inv_freq: &[f32], position: usize) {
    let half = inv_freq.len();
    debug_assert_eq!(x.len(), 2 * half);
    let p = position as f32;
    for i in 0..half {
        let angle = p * inv_freq[i];
        let (sin, cos) = angle.sin_cos();
        let (a, b) = (x[i], x[i + half]);
        // [a, b] * cos + [-b, a] * sin
        x[i] = a * cos - b * sin;
        x[i + half] = b * cos + a * sin;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rope(scaling: RopeScaling) -> Rope {
        Rope {
            theta: 500000.0,
            scaling,
        }
    }

    #[test]
    fn default_frequencies() {
        let f = inv_freq(&rope(RopeScaling::Default), 8);
        assert_eq!(f.len(), 4);
        assert_eq!(f[0], 1.0);
        let expected = 1.0 / 500000f64.powf(0.25);
        assert!((f[1] as f64 - expected).abs() < 1e-7);
    }

    #[test]
    fn llama3_keeps_high_scales_low_and_smooths_between() {
        // Llama 3.1's settings on head_dim 128: the first pairs are untouched, the last are
        // divided by the factor, and the ones in between are blended.
        let plain = inv_freq(&rope(RopeScaling::Default), 128);
        let scaled = inv_freq(
            &rope(RopeScaling::Llama3 {
                factor: 8.0,
                low_freq_factor: 1.0,
                high_freq_factor: 4.0,
                original_max_position_embeddings: 8192.0,
            }),
            128,
        );
        assert_eq!(scaled[0], plain[0]);
        assert_eq!(scaled[63], plain[63] / 8.0);
        let mid = (0..64)
            .find(|&i| scaled[i] != plain[i] && scaled[i] != plain[i] / 8.0)
            .expect("some frequencies are smoothed");
        assert!(scaled[mid] < plain[mid] && scaled[mid] > plain[mid] / 8.0);
    }

    #[test]
    fn rotation_preserves_norm_and_is_identity_at_zero() {
        let f = inv_freq(&rope(RopeScaling::Default), 8);
        let v: Vec<f32> = (0..8).map(|i| i as f32 - 3.5).collect();
        let mut x = v.clone();
        apply(&mut x, &f, 0);
        assert_eq!(x, v);
        apply(&mut x, &f, 17);
        let n0: f32 = v.iter().map(|a| a * a).sum();
        let n1: f32 = x.iter().map(|a| a * a).sum();
        assert!((n0 - n1).abs() < 1e-4);
        // rotate_half pairs dimension 0 with dimension 4: at position 1 with frequency 1,
        // x0' = x0 cos 1 - x4 sin 1.
        let mut y = v.clone();
        apply(&mut y, &f, 1);
        assert!((y[0] - (v[0] * 1f32.cos() - v[4] * 1f32.sin())).abs() < 1e-6);
    }
}
