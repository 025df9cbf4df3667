//! How far two correct implementations' logits can disagree, from the dtype and the logits'
//! magnitude: the token gate's tolerance for a teacher-forced position (docs/GATES.md derives
//! it; this is the one place its constant lives).
//!
//! At a position, let `t` be the golden's token and `a != t` the leg's argmax. The leg's gap is
//! `G = l_a - l_t >= 0`; the golden's margin is `M = g_t - g_r >= 0` with `g_r` its best other
//! logit, so `M <= g_t - g_a`. With the exact logits `f` and each side's computed difference of
//! two logits off from the exact one by at most `D` (`D_leg`, `D_golden`):
//! `G <= (f_a - f_t) + D_leg` and `M <= (f_t - f_a) + D_golden`, so **`G + M <= D_leg + D_golden`**.
//! A position whose `G + M` is larger than that cannot be rounding: it is refused.
//!
//! `D` per side follows from the dtype, the model's depth and the logits' magnitude:
//! **`D = C u sqrt(2L) scale`**, `u = 2^-p` the unit roundoff of a `p`-bit significand (bf16
//! 2^-8, f32 2^-24), `L` the model's layers, `scale` the largest |logit| there. Each of the L
//! layers rounds its two sublayer outputs into the residual stream: 2L roundings, each a
//! relative error of at most `u`, independent between two implementations that reduce in
//! different orders, so they add in quadrature and leave the last hidden state off by about
//! `u sqrt(2L)` relative; each logit projects it, so it moves by about `u sqrt(2L) scale`.
//! `C` is one constant for every unit, fitted once to what the H200 showed (engine verify
//! against vLLM's bf16 goldens, 2026-12-01, docs/GATES.md): the clean legs reach `G + M` of
//! 0.45 (Qwen2.5-0.5B), 0.91 (Llama-3.2-1B) and 2.08 (Llama-3.1-8B) times `u sqrt(2L) scale`,
//! so two sides need `C >= 1.04`; the subtlest planted fault (rope_shift on Qwen2.5-0.5B)
//! reaches 3.2, so `C < 1.6` still refuses it. `C = 1.25` leaves about 20% on each side. A
//! model whose upstream error is larger needs `C` raised, and a clean leg refused just beyond
//! the tolerance is the sign; a faulty leg passed just inside it, the sign to lower it.

use serde::{Deserialize, Serialize};
use std::fmt;

/// One side's error in units of `u sqrt(2L) scale` (see above): the tolerance's one constant.
pub const C: f64 = 1.25;

/// A floating-point format by its significand.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Dtype {
    Bfloat16,
    Float16,
    Float32,
    Float64,
}

impl Dtype {
    /// "bfloat16", "bf16", "float32", "fp32", ... (as legs and goldens spell them).
    pub fn parse(s: &str) -> Option<Dtype> {
        match s.trim().to_ascii_lowercase().trim_start_matches("torch.") {
            "bfloat16" | "bf16" => Some(Dtype::Bfloat16),
            "float16" | "fp16" | "f16" | "half" => Some(Dtype::Float16),
            "float32" | "fp32" | "f32" | "float" => Some(Dtype::Float32),
            "float64" | "fp64" | "f64" | "double" => Some(Dtype::Float64),
            _ => None,
        }
    }

    /// Bits of significand, the implicit one included (bf16 8, f32 24).
    pub fn significand_bits(self) -> i32 {
        match self {
            Dtype::Bfloat16 => 8,
            Dtype::Float16 => 11,
            Dtype::Float32 => 24,
            Dtype::Float64 => 53,
        }
    }

    /// The unit roundoff, 2^-p.
    pub fn unit_roundoff(self) -> f64 {
        (2f64).powi(-self.significand_bits())
    }

    /// One step of this format at |x|: `2^(e - p + 1)` for |x| in `[2^e, 2^(e+1))`; at 0 (or a
    /// non-finite x), the step at 1.
    pub fn ulp(self, x: f64) -> f64 {
        let x = x.abs();
        let e = if x.is_finite() && x > 0.0 {
            // The binary exponent, exactly (x.log2() may round up just below a power of two).
            ((x.to_bits() >> 52) & 0x7ff) as i32 - 1023
        } else {
            0
        };
        (2f64).powi(e - self.significand_bits() + 1)
    }
}

impl fmt::Display for Dtype {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Dtype::Bfloat16 => "bfloat16",
            Dtype::Float16 => "float16",
            Dtype::Float32 => "float32",
            Dtype::Float64 => "float64",
        })
    }
}

/// The largest `G + M` two correct implementations of an `layers`-layer model can reach at
/// logits of magnitude `scale`: `C u sqrt(2L) scale` per side, in each side's dtype.
pub fn tolerance(leg: Dtype, golden: Dtype, layers: u32, scale: f64) -> f64 {
    let depth = (2.0 * f64::from(layers.max(1))).sqrt();
    C * depth * scale.abs() * (leg.unit_roundoff() + golden.unit_roundoff())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn steps_follow_the_significand_and_the_binade() {
        let bf = Dtype::Bfloat16;
        assert_eq!(bf.ulp(2.0), 1.0 / 64.0);
        assert_eq!(bf.ulp(3.99), 1.0 / 64.0);
        assert_eq!(bf.ulp(-4.0), 1.0 / 32.0);
        assert_eq!(bf.ulp(1.0), 1.0 / 128.0);
        assert_eq!(Dtype::Float32.ulp(2.5), (2f64).powi(-22));
        assert_eq!(bf.ulp(0.0), 1.0 / 128.0);
        assert_eq!(Dtype::parse("torch.bfloat16"), Some(bf));
        assert_eq!(Dtype::parse("float32"), Some(Dtype::Float32));
        assert_eq!(Dtype::parse("int8"), None);
    }

    /// What the H200 showed (engine verify against vLLM's bf16 goldens, 2026-12-01): every
    /// clean leg's worst `G + M` falls within, the subtlest planted fault's beyond.
    #[test]
    fn the_measured_bf16_disagreements_are_told_from_a_fault() {
        let bf = Dtype::Bfloat16;
        // (layers, scale, G + M) of each clean unit's worst position.
        for (unit, layers, scale, g_plus_m) in [
            ("qwen2.5-0.5b", 24, 2.59375, 0.0 + 0.03125),
            ("llama-3.2-1b", 16, 3.90625, 0.03125 + 0.046875),
            ("llama-3.1-8b", 32, 5.78125, 0.28125 + 0.09375),
        ] {
            let t = tolerance(bf, bf, layers, scale);
            assert!(g_plus_m <= t, "{unit}: {g_plus_m} > {t}");
        }
        // rope_shift on Qwen2.5-0.5B: gap 0.234 at |logit| 2.70, the golden's margin 0 there.
        assert!(0.234375 > tolerance(bf, bf, 24, 2.703125));
        // The form: twice the depth's square root, twice the tolerance; float32 is 2^16 finer.
        let t = tolerance(bf, bf, 8, 3.0);
        assert!((tolerance(bf, bf, 32, 3.0) - 2.0 * t).abs() < 1e-12);
        assert_eq!(
            tolerance(Dtype::Float32, Dtype::Float32, 8, 3.0),
            t / 65536.0
        );
    }
}
