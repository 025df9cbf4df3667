//! The Nemotron-H hybrid's `config.json` (`NemotronHForCausalLM`, transformers' `nemotron_h`),
//! mirrored as a serde struct and resolved into a [`ModelConfig`] with its [`Hybrid`] part: which
//! block each layer is (Mamba-2 mixer, attention, MLP) and the Mamba-2 mixer's sizes. Both
//! spellings of the layer pattern are read: `hybrid_override_pattern` ("M-M*-", the original
//! checkpoints) and `layers_block_type` (what transformers 5 writes).

pub mod cpu;
pub mod mamba;

use serde::Deserialize;

use crate::config::{check_dims, Architecture, ModelConfig, OneOrMany, Rope, RopeScaling, MAX_DIM};
use crate::error::{Error, Result};

/// What one decoder block computes after its RMSNorm (the residual is added after each).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Block {
    /// The Mamba-2 mixer (`M`, `linear_attention`, legacy `mamba`).
    Mamba,
    /// Causal multi-head attention without RoPE (`*`, `full_attention`, legacy `attention`).
    Attention,
    /// The squared-ReLU MLP (`-`, `mlp`).
    Mlp,
}

/// The Mamba-2 mixer's sizes and constants, as transformers' `NemotronHMamba2Mixer` reads them.
#[derive(Debug, Clone, PartialEq)]
pub struct Mamba {
    pub num_heads: usize,
    pub head_dim: usize,
    /// The SSM state size N per head and channel (`ssm_state_size`).
    pub d_state: usize,
    /// B and C are shared by `num_heads / n_groups` heads each; the gated norm is per group.
    pub n_groups: usize,
    pub conv_kernel: usize,
    /// The chunk length of transformers' and vLLM's chunked prefill scan; the engine's scan is
    /// sequential, so it only reports it.
    pub chunk_size: usize,
    /// The lower bound transformers' chunked (prefill) scan clamps dt to; its one-token decode
    /// step does not clamp (`NemotronHMamba2Mixer.time_step_limit = (time_step_min, inf)`).
    pub time_step_min: f32,
    pub conv_bias: bool,
    /// Biases on in_proj and out_proj (`use_bias`).
    pub proj_bias: bool,
    /// The dtype the SSM state is kept in (`mamba_ssm_cache_dtype`).
    pub ssm_cache_dtype: String,
    /// The gated RMSNorm's epsilon (`layer_norm_epsilon`, as every norm of the model).
    pub eps: f32,
}

impl Mamba {
    /// Channels of the gated output: `num_heads x head_dim`.
    pub fn inner(&self) -> usize {
        self.num_heads * self.head_dim
    }

    /// Channels through the causal conv: x, B and C.
    pub fn conv_dim(&self) -> usize {
        self.inner() + 2 * self.n_groups * self.d_state
    }

    /// in_proj's output: gate z, then x B C, then dt per head.
    pub fn in_proj_dim(&self) -> usize {
        self.inner() + self.conv_dim() + self.num_heads
    }

    /// f32 values one sequence's state holds in one Mamba layer: the conv window (the last
    /// `conv_kernel - 1` inputs of each conv channel) and the SSM state.
    pub fn state_len(&self) -> usize {
        self.conv_dim() * (self.conv_kernel - 1) + self.inner() * self.d_state
    }
}

#[derive(Debug, Clone, PartialEq)]
pub struct Hybrid {
    pub blocks: Vec<Block>,
    pub mamba: Mamba,
}

impl Hybrid {
    pub fn count(&self, kind: Block) -> usize {
        self.blocks.iter().filter(|b| **b == kind).count()
    }

    /// The `features.hybrid` object of `ready` (docs/PROTOCOL.md): the pattern, the layer
    /// counts, the state's dtype and how a backend scans a prompt.
    pub fn features(&self, scan: &str) -> serde_json::Value {
        serde_json::json!({
            "pattern": self.pattern(),
            "mamba_layers": self.count(Block::Mamba),
            "attention_layers": self.count(Block::Attention),
            "mlp_layers": self.count(Block::Mlp),
            "ssm_state_dtype": "float32",
            "scan": scan,
            "rope": "none",
        })
    }

    /// The pattern as `hybrid_override_pattern` spells it.
    pub fn pattern(&self) -> String {
        self.blocks
            .iter()
            .map(|b| match b {
                Block::Mamba => 'M',
                Block::Attention => '*',
                Block::Mlp => '-',
            })
            .collect()
    }
}

/// `config.json` of `NemotronHForCausalLM` as transformers 5.17 writes it (and the original
/// checkpoints' older names where transformers still reads them). Unknown fields are ignored.
#[derive(Debug, Clone, Deserialize)]
pub struct NemotronHConfig {
    pub hidden_size: usize,
    pub vocab_size: usize,
    pub layers_block_type: Option<Vec<String>>,
    pub hybrid_override_pattern: Option<String>,
    pub num_hidden_layers: Option<usize>,
    pub num_attention_heads: usize,
    pub num_key_value_heads: Option<usize>,
    pub head_dim: Option<usize>,
    pub intermediate_size: usize,
    pub mlp_hidden_act: Option<String>,
    pub mlp_bias: Option<bool>,
    pub mamba_num_heads: usize,
    pub mamba_head_dim: usize,
    pub mamba_hidden_act: Option<String>,
    #[serde(alias = "mamba_n_groups")]
    pub n_groups: Option<usize>,
    pub ssm_state_size: usize,
    #[serde(alias = "mamba_d_conv")]
    pub conv_kernel: Option<usize>,
    #[serde(alias = "mamba_chunk_size")]
    pub chunk_size: Option<usize>,
    #[serde(alias = "mamba_dt_min")]
    pub time_step_min: Option<f64>,
    #[serde(alias = "mamba_conv_bias")]
    pub use_conv_bias: Option<bool>,
    pub use_bias: Option<bool>,
    pub mamba_ssm_cache_dtype: Option<String>,
    pub layer_norm_epsilon: Option<f64>,
    pub tie_word_embeddings: Option<bool>,
    pub eos_token_id: Option<OneOrMany>,
    pub max_position_embeddings: Option<usize>,
    pub torch_dtype: Option<String>,
    pub dtype: Option<String>,
    pub num_nextn_predict_layers: Option<usize>,
    pub residual_in_fp32: Option<bool>,
}

fn load(message: String) -> Error {
    Error::Load { message }
}

/// One layer's kind from either spelling; MoE is named and refused.
fn block(name: &str, layer: usize) -> Result<Block> {
    Ok(match name {
        "M" | "linear_attention" | "mamba" => Block::Mamba,
        "*" | "full_attention" | "attention" => Block::Attention,
        "-" | "mlp" => Block::Mlp,
        "E" | "moe" => {
            return Err(load(format!(
                "layer {layer} is a mixture-of-experts block ({name:?}); the engine implements \
                 the Mamba-2, attention and MLP blocks of Nemotron-H, not MoE (Nemotron-3 Nano)"
            )))
        }
        other => {
            return Err(load(format!(
                "layer {layer} has the unknown block type {other:?}; Nemotron-H layers are M \
                 (linear_attention), * (full_attention) or - (mlp)"
            )))
        }
    })
}

impl NemotronHConfig {
    pub fn resolve(&self) -> Result<ModelConfig> {
        let blocks: Vec<Block> =
            match (&self.layers_block_type, &self.hybrid_override_pattern) {
                (Some(list), _) => list
                    .iter()
                    .enumerate()
                    .map(|(i, b)| block(b, i))
                    .collect::<Result<_>>()?,
                (None, Some(p)) => p
                    .chars()
                    .enumerate()
                    .map(|(i, c)| block(&c.to_string(), i))
                    .collect::<Result<_>>()?,
                (None, None) => return Err(load(
                    "config.json has neither layers_block_type nor hybrid_override_pattern, so \
                     the layers' kinds are unknown; transformers 5 writes layers_block_type"
                        .into(),
                )),
            };
        if blocks.is_empty() {
            return Err(load(
                "the layer pattern is empty: the model has no layers".into(),
            ));
        }
        if let Some(n) = self.num_hidden_layers {
            if n != blocks.len() {
                return Err(load(format!(
                    "num_hidden_layers = {n} but the layer pattern has {} layers; transformers \
                     takes the pattern's length, so num_hidden_layers is stale",
                    blocks.len()
                )));
            }
        }
        if self.num_nextn_predict_layers.unwrap_or(0) > 0 {
            return Err(load(format!(
                "num_nextn_predict_layers = {}: multi-token prediction (MTP) layers are not \
                 implemented; a checkpoint with them can be run with num_nextn_predict_layers = 0",
                self.num_nextn_predict_layers.unwrap_or(0)
            )));
        }
        for (key, act, want) in [
            ("mlp_hidden_act", &self.mlp_hidden_act, "relu2"),
            ("mamba_hidden_act", &self.mamba_hidden_act, "silu"),
        ] {
            if let Some(a) = act {
                if a != want {
                    return Err(load(format!(
                        "{key} {a:?} is not implemented; Nemotron-H uses {want:?}"
                    )));
                }
            }
        }
        if self.residual_in_fp32 == Some(true) {
            return Err(load(
                "residual_in_fp32 = true is not implemented (transformers' nemotron_h ignores \
                 it too); the residual stream is kept in the compute dtype"
                    .into(),
            ));
        }
        let num_kv_heads = self.num_key_value_heads.unwrap_or(self.num_attention_heads);
        let head_dim = self
            .head_dim
            .unwrap_or(self.hidden_size / self.num_attention_heads.max(1));
        let mamba = Mamba {
            num_heads: self.mamba_num_heads,
            head_dim: self.mamba_head_dim,
            d_state: self.ssm_state_size,
            n_groups: self.n_groups.unwrap_or(8),
            conv_kernel: self.conv_kernel.unwrap_or(4),
            chunk_size: self.chunk_size.unwrap_or(128),
            time_step_min: self.time_step_min.unwrap_or(0.001) as f32,
            conv_bias: self.use_conv_bias.unwrap_or(true),
            proj_bias: self.use_bias.unwrap_or(false),
            ssm_cache_dtype: self
                .mamba_ssm_cache_dtype
                .clone()
                .unwrap_or_else(|| "float32".into()),
            eps: self.layer_norm_epsilon.unwrap_or(1e-5) as f32,
        };
        let eps = self.layer_norm_epsilon.unwrap_or(1e-5);
        check_dims(
            &[
                ("hidden_size", Some(self.hidden_size)),
                ("vocab_size", Some(self.vocab_size)),
                ("intermediate_size", Some(self.intermediate_size)),
                ("num_attention_heads", Some(self.num_attention_heads)),
                ("num_key_value_heads", Some(num_kv_heads)),
                ("head_dim", Some(head_dim)),
                ("mamba_num_heads", Some(mamba.num_heads)),
                ("mamba_head_dim", Some(mamba.head_dim)),
                ("ssm_state_size", Some(mamba.d_state)),
                ("n_groups", Some(mamba.n_groups)),
                ("conv_kernel", Some(mamba.conv_kernel)),
                ("chunk_size", Some(mamba.chunk_size)),
                ("layers", Some(blocks.len())),
                ("max_position_embeddings", self.max_position_embeddings),
            ],
            eps,
        )?;
        for (what, a, b) in [
            (
                "num_attention_heads x head_dim",
                self.num_attention_heads,
                head_dim,
            ),
            (
                "mamba_num_heads x mamba_head_dim",
                mamba.num_heads,
                mamba.head_dim,
            ),
            ("n_groups x ssm_state_size", mamba.n_groups, mamba.d_state),
        ] {
            if a * b > MAX_DIM {
                return Err(load(format!("{what} = {a} x {b} exceeds {MAX_DIM}")));
            }
        }
        if mamba.inner() * mamba.d_state > MAX_DIM * 64 {
            return Err(load(format!(
                "an SSM state of {} x {} values per layer is beyond any model",
                mamba.inner(),
                mamba.d_state
            )));
        }
        if self.num_attention_heads % num_kv_heads != 0 {
            return Err(load(format!(
                "num_attention_heads ({}) must be a multiple of num_key_value_heads \
                 ({num_kv_heads})",
                self.num_attention_heads
            )));
        }
        if mamba.num_heads % mamba.n_groups != 0 {
            return Err(load(format!(
                "mamba_num_heads ({}) must be a multiple of n_groups ({}): each group's B and C \
                 serve mamba_num_heads / n_groups heads",
                mamba.num_heads, mamba.n_groups
            )));
        }
        if mamba.conv_kernel < 2 {
            return Err(load(format!(
                "conv_kernel = {} leaves the causal conv no past to see; Nemotron-H uses 4",
                mamba.conv_kernel
            )));
        }
        if !(mamba.time_step_min.is_finite() && mamba.time_step_min >= 0.0) {
            return Err(load(format!(
                "time_step_min = {} must be a number >= 0 (the lower bound of dt)",
                mamba.time_step_min
            )));
        }
        let eos_token_ids = match &self.eos_token_id {
            None => vec![],
            Some(OneOrMany::One(id)) => vec![*id],
            Some(OneOrMany::Many(ids)) => ids.clone(),
        };
        Ok(ModelConfig {
            architecture: Architecture::NemotronH,
            hidden_size: self.hidden_size,
            intermediate_size: self.intermediate_size,
            num_layers: blocks.len(),
            num_heads: self.num_attention_heads,
            num_kv_heads,
            head_dim,
            rms_norm_eps: eps as f32,
            vocab_size: self.vocab_size,
            tie_word_embeddings: self.tie_word_embeddings.unwrap_or(false),
            eos_token_ids,
            max_position_embeddings: self.max_position_embeddings.unwrap_or(4096),
            dtype: self
                .dtype
                .clone()
                .or_else(|| self.torch_dtype.clone())
                .unwrap_or_else(|| "float32".into()),
            // No RoPE: transformers' NemotronHAttention takes position_ids and never uses them.
            rope: Rope {
                theta: 10000.0,
                scaling: RopeScaling::Default,
            },
            qkv_bias: false,
            o_bias: false,
            mlp_bias: self.mlp_bias.unwrap_or(false),
            qk_norm: false,
            hybrid: Some(Hybrid { blocks, mamba }),
        })
    }
}

/// Every tensor a Nemotron-H config implies, by the name transformers saves it under, with its
/// shape. Attention has no biases whatever `attention_bias` says (transformers builds q/k/v/o
/// without them).
pub fn expected_tensors(cfg: &ModelConfig, h: &Hybrid) -> Vec<(String, Vec<usize>)> {
    let (d, m) = (cfg.hidden_size, &h.mamba);
    let mut t = vec![(
        "model.embeddings.weight".to_string(),
        vec![cfg.vocab_size, d],
    )];
    for (l, b) in h.blocks.iter().enumerate() {
        let p = format!("model.layers.{l}");
        let mut add = |name: &str, shape: Vec<usize>| t.push((format!("{p}.{name}"), shape));
        add("norm.weight", vec![d]);
        match b {
            Block::Mamba => {
                add("mixer.in_proj.weight", vec![m.in_proj_dim(), d]);
                add("mixer.conv1d.weight", vec![m.conv_dim(), 1, m.conv_kernel]);
                if m.conv_bias {
                    add("mixer.conv1d.bias", vec![m.conv_dim()]);
                }
                for name in ["mixer.dt_bias", "mixer.A_log", "mixer.D"] {
                    add(name, vec![m.num_heads]);
                }
                add("mixer.norm.weight", vec![m.inner()]);
                add("mixer.out_proj.weight", vec![d, m.inner()]);
                if m.proj_bias {
                    add("mixer.in_proj.bias", vec![m.in_proj_dim()]);
                    add("mixer.out_proj.bias", vec![d]);
                }
            }
            Block::Attention => {
                add("mixer.q_proj.weight", vec![cfg.q_dim(), d]);
                add("mixer.k_proj.weight", vec![cfg.kv_dim(), d]);
                add("mixer.v_proj.weight", vec![cfg.kv_dim(), d]);
                add("mixer.o_proj.weight", vec![d, cfg.q_dim()]);
            }
            Block::Mlp => {
                add("mixer.up_proj.weight", vec![cfg.intermediate_size, d]);
                add("mixer.down_proj.weight", vec![d, cfg.intermediate_size]);
                if cfg.mlp_bias {
                    add("mixer.up_proj.bias", vec![cfg.intermediate_size]);
                    add("mixer.down_proj.bias", vec![d]);
                }
            }
        }
    }
    t.push(("model.norm_f.weight".into(), vec![d]));
    if !cfg.tie_word_embeddings {
        t.push(("lm_head.weight".into(), vec![cfg.vocab_size, d]));
    }
    t
}

#[cfg(test)]
mod tests {
    use crate::config::ModelConfig;
    use crate::hybrid::Block;

    const REAL_8B: &str = include_str!("../../tests/data/nemotron-h-8b-config.json");

    #[test]
    fn the_8b_config_as_transformers_writes_it_resolves() {
        let c = ModelConfig::parse(REAL_8B).unwrap();
        let h = c.hybrid.as_ref().unwrap();
        assert_eq!(c.num_layers, 52);
        assert_eq!(
            (
                h.count(Block::Mamba),
                h.count(Block::Attention),
                h.count(Block::Mlp)
            ),
            (24, 4, 24)
        );
        assert_eq!(
            h.pattern(),
            "M-M-M-M*-M-M-M-M-M*-M-M-M-M-M*-M-M-M-M-M*-M-M-M-M-M-"
        );
        let m = &h.mamba;
        assert_eq!(
            (m.num_heads, m.head_dim, m.d_state, m.n_groups),
            (128, 64, 128, 8)
        );
        assert_eq!((m.conv_kernel, m.chunk_size), (4, 128));
        assert_eq!(
            (m.inner(), m.conv_dim(), m.in_proj_dim()),
            (8192, 10240, 18560)
        );
        assert_eq!(m.time_step_min, 0.001);
        assert!(m.conv_bias && !m.proj_bias);
        assert_eq!((c.num_heads, c.num_kv_heads, c.head_dim), (32, 8, 128));
        assert_eq!((c.intermediate_size, c.rms_norm_eps), (21504, 1e-5));
        assert!(!c.tie_word_embeddings);
        assert_eq!(c.kv_layers(), 4);
    }

    fn edit(f: impl FnOnce(&mut serde_json::Value)) -> String {
        let mut v: serde_json::Value = serde_json::from_str(REAL_8B).unwrap();
        f(&mut v);
        v.to_string()
    }

    #[test]
    fn the_pattern_spelling_reads_the_same_layers() {
        let c = ModelConfig::parse(REAL_8B).unwrap();
        let pattern = c.hybrid.as_ref().unwrap().pattern();
        let text = edit(|v| {
            let o = v.as_object_mut().unwrap();
            o.remove("layers_block_type");
            o.insert("hybrid_override_pattern".into(), pattern.clone().into());
            o.insert("num_hidden_layers".into(), 52.into());
        });
        let p = ModelConfig::parse(&text).unwrap();
        assert_eq!(p.hybrid, c.hybrid);
    }

    #[test]
    fn moe_mtp_and_other_activations_are_refused_by_name() {
        let e = |t: String| ModelConfig::parse(&t).unwrap_err().to_string();
        let moe = e(edit(|v| v["layers_block_type"][1] = "moe".into()));
        assert!(
            moe.contains("layer 1 is a mixture-of-experts block"),
            "{moe}"
        );
        let mtp = e(edit(|v| v["num_nextn_predict_layers"] = 1.into()));
        assert!(mtp.contains("multi-token prediction (MTP)"), "{mtp}");
        let act = e(edit(|v| v["mlp_hidden_act"] = "silu".into()));
        assert!(
            act.contains("mlp_hidden_act \"silu\" is not implemented"),
            "{act}"
        );
        let stale = e(edit(|v| v["num_hidden_layers"] = 50.into()));
        assert!(stale.contains("num_hidden_layers = 50"), "{stale}");
        let groups = e(edit(|v| v["n_groups"] = 3.into()));
        assert!(groups.contains("multiple of n_groups (3)"), "{groups}");
        let none = e(edit(|v| {
            v.as_object_mut().unwrap().remove("layers_block_type");
        }));
        assert!(
            none.contains("neither layers_block_type nor hybrid_override_pattern"),
            "{none}"
        );
    }
}
