//! The test-only fault injector (docs/ENGINE.md): `ENGINE_FAULT=<name>[,<name>...]`, read once
//! at start, plants a known bug in both backends so that the token gate can be shown to refuse
//! it, and a known slowdown so that `compare` can be shown to see it. Never for measurements: a
//! leg with a fault says so in `ready.features.fault` and on stderr.

use std::time::{Duration, Instant};

use crate::config::ModelConfig;
use crate::error::{Error, Result};
use crate::weights::Checkpoint;

/// The environment variable that plants faults.
pub const ENV: &str = "ENGINE_FAULT";

/// A bug a real engine has had (or, for `SlowStep`, a regression), planted on purpose.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Fault {
    /// Each decode step rotates its token's q and k at position p + 1 instead of p (a position
    /// counter one ahead after prefill); prefill is right.
    RopeShift,
    /// Layer `num_layers / 2`'s input RMSNorm weight is ignored (taken as ones).
    NormSkip,
    /// Attention scores are scaled by 1/d instead of 1/sqrt(d).
    AttnScaleD,
    /// Query head h reads KV head (h / group + 1) % num_kv_heads instead of h / group.
    KvGroup,
    /// The q/k/v biases (Qwen2) are dropped.
    DropBias,
    /// Attention yields NaN for query positions >= 512 (this engine's own past bug).
    NanPast512,
    /// After each decode step, a wait of 5% of the step's own duration.
    SlowStep,
}

impl Fault {
    pub const ALL: [Fault; 7] = [
        Self::RopeShift,
        Self::NormSkip,
        Self::AttnScaleD,
        Self::KvGroup,
        Self::DropBias,
        Self::NanPast512,
        Self::SlowStep,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Self::RopeShift => "rope_shift",
            Self::NormSkip => "norm_skip",
            Self::AttnScaleD => "attn_scale_d",
            Self::KvGroup => "kv_group",
            Self::DropBias => "drop_bias",
            Self::NanPast512 => "nan_past_512",
            Self::SlowStep => "slow_step",
        }
    }

    /// What the fault does, for the log.
    pub fn what(self) -> &'static str {
        match self {
            Self::RopeShift => "decode steps rotate q and k at position p + 1",
            Self::NormSkip => "layer num_layers/2's input RMSNorm weight taken as ones",
            Self::AttnScaleD => "attention scores scaled by 1/d instead of 1/sqrt(d)",
            Self::KvGroup => "query head h reads KV head (h/group + 1) % num_kv_heads",
            Self::DropBias => "q/k/v biases dropped",
            Self::NanPast512 => "attention yields NaN for query positions >= 512",
            Self::SlowStep => "a wait of 5% of each decode step's duration after it",
        }
    }

    /// Why the fault cannot be planted in this model, if it cannot.
    fn inapplicable(self, cfg: &ModelConfig) -> Option<String> {
        match self {
            Self::DropBias if !cfg.qkv_bias => Some(format!(
                "{} has no q/k/v biases to drop (attention_bias is off; Qwen2 has them)",
                cfg.architecture.hf_name()
            )),
            Self::RopeShift if cfg.hybrid.is_some() => Some(format!(
                "{} has no RoPE: its attention layers take no positions",
                cfg.architecture.hf_name()
            )),
            Self::KvGroup if cfg.num_kv_heads < 2 => Some(format!(
                "the model has {} KV head, so no query head can read the wrong one",
                cfg.num_kv_heads
            )),
            _ => None,
        }
    }
}

/// The planted faults: a set, in [`Fault::ALL`]'s order; empty for a clean build.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Faults(Vec<Fault>);

impl Faults {
    /// Parses `ENGINE_FAULT`'s value: names separated by commas (spaces around them allowed;
    /// empty: none).
    pub fn parse(spec: &str) -> Result<Self> {
        let mut set = Vec::new();
        for name in spec.split(',').map(str::trim).filter(|n| !n.is_empty()) {
            let fault = Fault::ALL
                .into_iter()
                .find(|f| f.name() == name)
                .ok_or_else(|| Error::UnknownFault { name: name.into() })?;
            if !set.contains(&fault) {
                set.push(fault);
            }
        }
        set.sort();
        Ok(Self(set))
    }

    /// Refuses a fault that this model cannot have.
    pub fn check(&self, cfg: &ModelConfig) -> Result<()> {
        for &f in &self.0 {
            if let Some(reason) = f.inapplicable(cfg) {
                return Err(Error::FaultDoesNotApply {
                    fault: f.name(),
                    reason,
                });
            }
        }
        Ok(())
    }

    pub fn has(&self, f: Fault) -> bool {
        self.0.contains(&f)
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    pub fn names(&self) -> Vec<&'static str> {
        self.0.iter().map(|f| f.name()).collect()
    }

    pub fn iter(&self) -> impl Iterator<Item = Fault> + '_ {
        self.0.iter().copied()
    }

    /// Refuses a weight fault that would leave this checkpoint's numbers unchanged: random-weight
    /// checkpoints are made as transformers initialises a model (norm weights ones, biases zeros),
    /// and "ignoring" a ones norm or "dropping" a zero bias computes the clean model, so a token
    /// gate that passed it would prove nothing. Seen on the H200 (2026-12-01): `norm_skip` on the
    /// random Llama-3.2-1B and `drop_bias` on the random Qwen2.5-0.5B gave the clean logits.
    pub fn check_weights(&self, cfg: &ModelConfig, ckpt: &Checkpoint) -> Result<()> {
        let refuse = |fault: Fault, reason: String| Error::FaultDoesNotApply {
            fault: fault.name(),
            reason,
        };
        if let Some(l) = self.skipped_norm_layer(cfg) {
            let norm = if cfg.hybrid.is_some() {
                "norm"
            } else {
                "input_layernorm"
            };
            let name = format!("model.layers.{l}.{norm}.weight");
            if ckpt.get(&name)?.to_f32().iter().all(|&w| w == 1.0) {
                return Err(refuse(
                    Fault::NormSkip,
                    format!("{name} is all ones, so taking it as ones changes nothing"),
                ));
            }
        }
        if self.has(Fault::DropBias) {
            let zero = (0..cfg.num_layers)
                .flat_map(|l| {
                    ["q", "k", "v"].map(|p| format!("model.layers.{l}.self_attn.{p}_proj.bias"))
                })
                .try_fold(true, |zero, name| {
                    Ok::<_, Error>(zero && ckpt.get(&name)?.to_f32().iter().all(|&b| b == 0.0))
                })?;
            if zero {
                return Err(refuse(
                    Fault::DropBias,
                    "every q/k/v bias of the checkpoint is zero, so dropping them changes nothing"
                        .into(),
                ));
            }
        }
        Ok(())
    }

    /// The layer whose input norm `norm_skip` ignores, when planted.
    pub fn skipped_norm_layer(&self, cfg: &ModelConfig) -> Option<usize> {
        self.has(Fault::NormSkip).then_some(cfg.num_layers / 2)
    }

    /// The attention scale for `head_dim`: 1/sqrt(d), or 1/d with `attn_scale_d`.
    pub fn attention_scale(&self, head_dim: usize) -> f32 {
        if self.has(Fault::AttnScaleD) {
            1.0 / head_dim as f32
        } else {
            1.0 / (head_dim as f32).sqrt()
        }
    }

    /// How far ahead a decode step rotates its token: 1 with `rope_shift`.
    pub fn decode_rope_shift(&self) -> usize {
        usize::from(self.has(Fault::RopeShift))
    }

    /// With `slow_step`: after a decode step that began at `started`, waits 5% of its duration.
    pub fn after_step(&self, started: Instant) {
        if self.has(Fault::SlowStep) {
            pad(started, SLOW_STEP_SHARE);
        }
    }
}

/// The share of a step's duration `slow_step` adds.
pub const SLOW_STEP_SHARE: f64 = 0.05;

/// Spins until `share` of the time since `started` has passed again: a sleep is too coarse for
/// steps of a millisecond.
fn pad(started: Instant, share: f64) {
    let step = started.elapsed();
    let until = Instant::now() + Duration::from_secs_f64(step.as_secs_f64() * share);
    while Instant::now() < until {
        std::hint::spin_loop();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tiny(arch: &str, bias: bool, kv_heads: usize) -> ModelConfig {
        ModelConfig::parse(
            &serde_json::json!({
                "architectures": [arch], "hidden_size": 64, "intermediate_size": 128,
                "num_hidden_layers": 3, "num_attention_heads": 4, "num_key_value_heads": kv_heads,
                "rms_norm_eps": 1e-5, "vocab_size": 100, "max_position_embeddings": 64,
                "attention_bias": bias,
            })
            .to_string(),
        )
        .unwrap()
    }

    #[test]
    fn names_parse_in_any_order_and_unknown_ones_are_named_with_the_valid_ones() {
        let f = Faults::parse(" slow_step,rope_shift , rope_shift,").unwrap();
        assert_eq!(f.names(), ["rope_shift", "slow_step"]);
        assert!(Faults::parse("").unwrap().is_empty());
        for fault in Fault::ALL {
            assert!(Faults::parse(fault.name()).unwrap().has(fault));
        }
        let e = Faults::parse("rope_shift,ropeshift")
            .unwrap_err()
            .to_string();
        assert!(e.contains("\"ropeshift\""), "{e}");
        for fault in Fault::ALL {
            assert!(e.contains(fault.name()), "{e} lacks {}", fault.name());
        }
    }

    #[test]
    fn faults_that_do_not_apply_are_refused() {
        let drop = Faults::parse("drop_bias").unwrap();
        let e = drop
            .check(&tiny("LlamaForCausalLM", false, 2))
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("drop_bias") && e.contains("no q/k/v biases"),
            "{e}"
        );
        assert!(drop.check(&tiny("Qwen2ForCausalLM", true, 2)).is_ok());
        let kv = Faults::parse("kv_group").unwrap();
        assert!(kv.check(&tiny("LlamaForCausalLM", false, 1)).is_err());
        assert!(kv.check(&tiny("LlamaForCausalLM", false, 2)).is_ok());
    }

    #[test]
    fn switches_follow_the_faults() {
        let clean = Faults::default();
        let all = Faults::parse("rope_shift,norm_skip,attn_scale_d").unwrap();
        let cfg = tiny("LlamaForCausalLM", false, 2);
        assert_eq!(clean.attention_scale(16), 0.25);
        assert_eq!(all.attention_scale(16), 1.0 / 16.0);
        assert_eq!((clean.decode_rope_shift(), all.decode_rope_shift()), (0, 1));
        assert_eq!(clean.skipped_norm_layer(&cfg), None);
        assert_eq!(all.skipped_norm_layer(&cfg), Some(1));
    }

    #[test]
    fn slow_step_waits_a_twentieth_of_the_step() {
        let started = Instant::now();
        std::thread::sleep(Duration::from_millis(40));
        let step = started.elapsed();
        Faults::parse("slow_step").unwrap().after_step(started);
        let total = started.elapsed();
        assert!(
            total >= step + step.mul_f64(SLOW_STEP_SHARE),
            "{total:?} after a {step:?} step"
        );
    }
}
