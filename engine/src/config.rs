//! The model's `config.json`, mirrored as a serde struct and resolved into what the engine computes
//! with. Field names are Hugging Face's; both the transformers-4 and transformers-5 spellings of
//! RoPE and dtype are accepted.

use std::path::Path;

use serde::Deserialize;

use crate::error::{Error, Result};
use crate::hybrid::{Block, Hybrid, NemotronHConfig};

/// The architectures the engine implements (`architectures[0]` in `config.json`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Architecture {
    Llama,
    Mistral,
    Qwen2,
    Qwen3,
    /// The Mamba-2 / attention / MLP hybrid (hybrid.rs).
    NemotronH,
}

impl Architecture {
    pub const SUPPORTED: &'static [&'static str] = &[
        "LlamaForCausalLM",
        "MistralForCausalLM",
        "Qwen2ForCausalLM",
        "Qwen3ForCausalLM",
        "NemotronHForCausalLM",
    ];

    fn from_hf(name: &str) -> Option<Self> {
        Some(match name {
            "LlamaForCausalLM" => Self::Llama,
            "MistralForCausalLM" => Self::Mistral,
            "Qwen2ForCausalLM" => Self::Qwen2,
            "Qwen3ForCausalLM" => Self::Qwen3,
            "NemotronHForCausalLM" => Self::NemotronH,
            _ => return None,
        })
    }

    pub fn hf_name(self) -> &'static str {
        match self {
            Self::Llama => "LlamaForCausalLM",
            Self::Mistral => "MistralForCausalLM",
            Self::Qwen2 => "Qwen2ForCausalLM",
            Self::Qwen3 => "Qwen3ForCausalLM",
            Self::NemotronH => "NemotronHForCausalLM",
        }
    }
}

/// `eos_token_id` is an int in some checkpoints and a list in others (Llama 3).
#[derive(Debug, Clone, Deserialize)]
#[serde(untagged)]
pub enum OneOrMany {
    One(u32),
    Many(Vec<u32>),
}

/// `config.json` as written by transformers. Unknown fields are ignored: real configs carry many
/// that do not change the computation (tokenizer ids, `use_cache`, ...).
#[derive(Debug, Clone, Deserialize)]
pub struct HfConfig {
    #[serde(default)]
    pub architectures: Vec<String>,
    pub model_type: Option<String>,
    pub hidden_size: usize,
    pub intermediate_size: usize,
    pub num_hidden_layers: usize,
    pub num_attention_heads: usize,
    pub num_key_value_heads: Option<usize>,
    pub head_dim: Option<usize>,
    pub rms_norm_eps: f64,
    pub vocab_size: usize,
    #[serde(default)]
    pub tie_word_embeddings: Option<bool>,
    pub eos_token_id: Option<OneOrMany>,
    pub max_position_embeddings: Option<usize>,
    /// transformers 4 spelling.
    pub torch_dtype: Option<String>,
    /// transformers 5 spelling.
    pub dtype: Option<String>,
    pub rope_theta: Option<f64>,
    pub rope_scaling: Option<serde_json::Value>,
    /// transformers 5 spelling: theta and scaling in one object.
    pub rope_parameters: Option<serde_json::Value>,
    pub attention_bias: Option<bool>,
    pub mlp_bias: Option<bool>,
    pub hidden_act: Option<String>,
    pub sliding_window: Option<serde_json::Value>,
    pub use_sliding_window: Option<bool>,
}

/// How rotary frequencies are derived from `rope_theta`.
#[derive(Debug, Clone, PartialEq)]
pub enum RopeScaling {
    Default,
    Linear {
        factor: f64,
    },
    Llama3 {
        factor: f64,
        low_freq_factor: f64,
        high_freq_factor: f64,
        original_max_position_embeddings: f64,
    },
}

#[derive(Debug, Clone, PartialEq)]
pub struct Rope {
    pub theta: f64,
    pub scaling: RopeScaling,
}

/// The resolved configuration: every default applied, every check done.
#[derive(Debug, Clone)]
pub struct ModelConfig {
    pub architecture: Architecture,
    pub hidden_size: usize,
    pub intermediate_size: usize,
    pub num_layers: usize,
    pub num_heads: usize,
    pub num_kv_heads: usize,
    pub head_dim: usize,
    pub rms_norm_eps: f32,
    pub vocab_size: usize,
    pub tie_word_embeddings: bool,
    pub eos_token_ids: Vec<u32>,
    pub max_position_embeddings: usize,
    pub dtype: String,
    pub rope: Rope,
    /// Biases on q, k and v (Qwen2 always; Llama when `attention_bias`).
    pub qkv_bias: bool,
    /// Bias on o_proj (Llama's `attention_bias`; Qwen2 has none).
    pub o_bias: bool,
    pub mlp_bias: bool,
    /// Per-head RMSNorm on q and k before RoPE (Qwen3).
    pub qk_norm: bool,
    /// The layer kinds and Mamba-2 sizes of a hybrid (Nemotron-H); `None` for the Llama family,
    /// whose every layer is attention + SwiGLU MLP.
    pub hybrid: Option<Hybrid>,
}

impl ModelConfig {
    pub fn load(model_dir: &Path) -> Result<Self> {
        let path = model_dir.join("config.json");
        let text = std::fs::read_to_string(&path).map_err(|e| Error::Load {
            message: format!(
                "cannot read {}: {e}; the model directory must hold the config.json that \
                 transformers' save_pretrained writes",
                path.display()
            ),
        })?;
        Self::parse(&text).map_err(|e| match e {
            Error::Load { message } => Error::Load {
                message: format!("{}: {message}", path.display()),
            },
            other => other,
        })
    }

    pub fn parse(text: &str) -> Result<Self> {
        let invalid = |e: serde_json::Error| Error::Load {
            message: format!("config.json is not a valid model config: {e}"),
        };
        let v: serde_json::Value = serde_json::from_str(text).map_err(invalid)?;
        if v["architectures"][0] == Architecture::NemotronH.hf_name() {
            let hf: NemotronHConfig = serde_json::from_value(v).map_err(invalid)?;
            return hf.resolve();
        }
        let hf: HfConfig = serde_json::from_value(v).map_err(invalid)?;
        Self::from_hf(&hf)
    }

    pub fn from_hf(hf: &HfConfig) -> Result<Self> {
        let load = |message: String| Error::Load { message };
        let arch_name = hf.architectures.first().ok_or_else(|| {
            load(format!(
                "config.json has no `architectures`; supported: {}",
                Architecture::SUPPORTED.join(", ")
            ))
        })?;
        let architecture = Architecture::from_hf(arch_name).ok_or_else(|| {
            load(format!(
                "unknown architecture {arch_name:?}; this engine implements {}",
                Architecture::SUPPORTED.join(", ")
            ))
        })?;
        if architecture == Architecture::NemotronH {
            return Err(load(
                "NemotronHForCausalLM's config has its own fields; read it with \
                 ModelConfig::parse"
                    .into(),
            ));
        }
        if hf.num_attention_heads == 0 || hf.hidden_size == 0 || hf.num_hidden_layers == 0 {
            return Err(load(
                "hidden_size, num_hidden_layers and num_attention_heads must be positive".into(),
            ));
        }
        check_sizes(hf)?;
        let num_kv_heads = hf.num_key_value_heads.unwrap_or(hf.num_attention_heads);
        if num_kv_heads == 0 || hf.num_attention_heads % num_kv_heads != 0 {
            return Err(load(format!(
                "num_attention_heads ({}) must be a multiple of num_key_value_heads ({num_kv_heads})",
                hf.num_attention_heads
            )));
        }
        let head_dim = match hf.head_dim {
            Some(d) => d,
            None => {
                if hf.hidden_size % hf.num_attention_heads != 0 {
                    return Err(load(format!(
                        "hidden_size ({}) is not divisible by num_attention_heads ({}) and \
                         config.json gives no head_dim",
                        hf.hidden_size, hf.num_attention_heads
                    )));
                }
                hf.hidden_size / hf.num_attention_heads
            }
        };
        if head_dim % 2 != 0 {
            return Err(load(format!("head_dim {head_dim} must be even for RoPE")));
        }
        if let Some(act) = &hf.hidden_act {
            if act != "silu" {
                return Err(load(format!(
                    "hidden_act {act:?} is not implemented; the engine computes SwiGLU with silu"
                )));
            }
        }
        if hf.use_sliding_window == Some(true) {
            return Err(load(
                "use_sliding_window = true is not implemented; the engine attends over the \
                 whole context"
                    .into(),
            ));
        }
        // Mistral states its window in `sliding_window`; a window the context never reaches
        // changes nothing, so only the unit's context bound matters and it is checked per request.
        let max_position_embeddings = hf.max_position_embeddings.unwrap_or(4096);
        if architecture == Architecture::Mistral {
            if let Some(w) = hf.sliding_window.as_ref().and_then(|v| v.as_u64()) {
                if (w as usize) < max_position_embeddings {
                    return Err(load(format!(
                        "sliding_window {w} is smaller than max_position_embeddings \
                         {max_position_embeddings}; sliding-window attention is not implemented"
                    )));
                }
            }
        }
        let rope = resolve_rope(hf)?;
        let dtype = hf
            .dtype
            .clone()
            .or_else(|| hf.torch_dtype.clone())
            .unwrap_or_else(|| "float32".into());
        let attention_bias = hf.attention_bias.unwrap_or(false);
        let (qkv_bias, o_bias) = match architecture {
            Architecture::Qwen2 => (true, false),
            _ => (attention_bias, attention_bias),
        };
        let eos_token_ids = match &hf.eos_token_id {
            None => vec![],
            Some(OneOrMany::One(id)) => vec![*id],
            Some(OneOrMany::Many(ids)) => ids.clone(),
        };
        Ok(Self {
            architecture,
            hidden_size: hf.hidden_size,
            intermediate_size: hf.intermediate_size,
            num_layers: hf.num_hidden_layers,
            num_heads: hf.num_attention_heads,
            num_kv_heads,
            head_dim,
            rms_norm_eps: hf.rms_norm_eps as f32,
            vocab_size: hf.vocab_size,
            // Absent means the model class's default, which is false for all four families.
            tie_word_embeddings: hf.tie_word_embeddings.unwrap_or(false),
            eos_token_ids,
            max_position_embeddings,
            dtype,
            rope,
            qkv_bias,
            o_bias,
            mlp_bias: hf.mlp_bias.unwrap_or(false),
            qk_norm: architecture == Architecture::Qwen3,
            hybrid: None,
        })
    }

    pub fn q_dim(&self) -> usize {
        self.num_heads * self.head_dim
    }

    pub fn kv_dim(&self) -> usize {
        self.num_kv_heads * self.head_dim
    }

    /// Layers that keep K and V in the paged pool: every layer of the Llama family, the
    /// attention layers of a hybrid.
    pub fn kv_layers(&self) -> usize {
        match &self.hybrid {
            None => self.num_layers,
            Some(h) => h.count(Block::Attention),
        }
    }
}

/// The largest size any one dimension of config.json may state: far above every real model
/// (vocabularies of 256K, hidden sizes of 16K), low enough that no product of two sizes
/// overflows, so a hostile config is refused here instead of wrapping in an allocation.
pub const MAX_DIM: usize = 1 << 24;

/// Sizes are positive and bounded, `rms_norm_eps` a positive number (a negative or zero
/// epsilon loads but divides by zero, or by a negative, on an all-zero row).
fn check_sizes(hf: &HfConfig) -> Result<()> {
    let load = |message: String| Error::Load { message };
    if hf.num_attention_heads * hf.head_dim.unwrap_or(1) > MAX_DIM {
        return Err(load(format!(
            "num_attention_heads x head_dim = {} x {} exceeds {MAX_DIM}",
            hf.num_attention_heads,
            hf.head_dim.unwrap_or(1)
        )));
    }
    check_dims(
        &[
            ("hidden_size", Some(hf.hidden_size)),
            ("intermediate_size", Some(hf.intermediate_size)),
            ("num_attention_heads", Some(hf.num_attention_heads)),
            ("num_key_value_heads", hf.num_key_value_heads),
            ("head_dim", hf.head_dim),
            ("vocab_size", Some(hf.vocab_size)),
            ("num_hidden_layers", Some(hf.num_hidden_layers)),
            ("max_position_embeddings", hf.max_position_embeddings),
        ],
        hf.rms_norm_eps,
    )
}

/// Every size in `sizes` is positive and at most [`MAX_DIM`] (absent ones are not checked), and
/// the norm's epsilon a positive number (a negative or zero epsilon loads but divides by zero,
/// or by a negative, on an all-zero row).
pub(crate) fn check_dims(sizes: &[(&str, Option<usize>)], eps: f64) -> Result<()> {
    let load = |message: String| Error::Load { message };
    for &(key, v) in sizes {
        if let Some(v) = v {
            if v == 0 || v > MAX_DIM {
                return Err(load(format!(
                    "{key} = {v} is outside [1, {MAX_DIM}]; config.json is not a model's \
                     configuration (save_pretrained writes the sizes of the tensors it saves)"
                )));
            }
        }
    }
    if !(eps.is_finite() && eps > 0.0 && (eps as f32) > 0.0) {
        return Err(load(format!(
            "rms_norm_eps = {eps} must be a positive number (RMSNorm divides by \
             sqrt(mean(x^2) + eps)); Llama checkpoints use 1e-5 or 1e-6"
        )));
    }
    Ok(())
}

fn num(v: &serde_json::Value, key: &str) -> Option<f64> {
    v.get(key).and_then(|x| x.as_f64())
}

/// RoPE as transformers 4 (`rope_theta` + `rope_scaling`) or 5 (`rope_parameters`) spells it.
fn resolve_rope(hf: &HfConfig) -> Result<Rope> {
    let load = |message: String| Error::Load { message };
    let params = hf.rope_parameters.as_ref().filter(|v| !v.is_null());
    let scaling = hf.rope_scaling.as_ref().filter(|v| !v.is_null());
    let theta = params
        .and_then(|p| num(p, "rope_theta"))
        .or(hf.rope_theta)
        .unwrap_or(10000.0);
    if !(theta.is_finite() && theta > 0.0) {
        return Err(load(format!(
            "rope_theta = {theta} must be a positive number (Llama uses 10000 or 500000)"
        )));
    }
    let Some(spec) = params.or(scaling) else {
        return Ok(Rope {
            theta,
            scaling: RopeScaling::Default,
        });
    };
    let kind = spec
        .get("rope_type")
        .or_else(|| spec.get("type"))
        .and_then(|t| t.as_str())
        .unwrap_or("default");
    let need = |key: &str| {
        num(spec, key).ok_or_else(|| {
            load(format!(
                "RoPE type {kind:?} needs a numeric {key:?} in its parameters"
            ))
        })
    };
    let scaling = match kind {
        "default" => RopeScaling::Default,
        "linear" => RopeScaling::Linear {
            factor: need("factor")?,
        },
        "llama3" => RopeScaling::Llama3 {
            factor: need("factor")?,
            low_freq_factor: need("low_freq_factor")?,
            high_freq_factor: need("high_freq_factor")?,
            original_max_position_embeddings: need("original_max_position_embeddings")?,
        },
        other => {
            return Err(load(format!(
                "unknown RoPE type {other:?}; this engine implements default, linear and llama3"
            )))
        }
    };
    Ok(Rope { theta, scaling })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn base() -> serde_json::Value {
        serde_json::json!({
            "architectures": ["LlamaForCausalLM"],
            "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
            "num_attention_heads": 4, "num_key_value_heads": 2, "rms_norm_eps": 1e-5,
            "vocab_size": 100, "eos_token_id": [1, 2], "torch_dtype": "bfloat16",
            "rope_theta": 500000.0,
        })
    }

    fn parse(v: serde_json::Value) -> Result<ModelConfig> {
        ModelConfig::parse(&v.to_string())
    }

    #[test]
    fn llama_defaults_resolve() {
        let c = parse(base()).unwrap();
        assert_eq!(c.head_dim, 16);
        assert_eq!(c.num_kv_heads, 2);
        assert_eq!(c.eos_token_ids, vec![1, 2]);
        assert_eq!(c.dtype, "bfloat16");
        assert_eq!(c.rope.theta, 500000.0);
        assert_eq!(c.rope.scaling, RopeScaling::Default);
        assert!(!c.qkv_bias && !c.qk_norm && !c.tie_word_embeddings);
    }

    #[test]
    fn transformers4_llama3_scaling() {
        let mut v = base();
        v["rope_scaling"] = serde_json::json!({"rope_type": "llama3", "factor": 32.0,
            "low_freq_factor": 1.0, "high_freq_factor": 4.0,
            "original_max_position_embeddings": 8192});
        let c = parse(v).unwrap();
        assert!(matches!(c.rope.scaling, RopeScaling::Llama3 { factor, .. } if factor == 32.0));
    }

    #[test]
    fn transformers5_rope_parameters() {
        let mut v = base();
        v.as_object_mut().unwrap().remove("rope_theta");
        v["rope_parameters"] = serde_json::json!({"rope_type": "linear", "factor": 2.0,
            "rope_theta": 1000.0});
        v["dtype"] = "float16".into();
        let c = parse(v).unwrap();
        assert_eq!(c.rope.theta, 1000.0);
        assert_eq!(c.rope.scaling, RopeScaling::Linear { factor: 2.0 });
        assert_eq!(c.dtype, "float16");
    }

    #[test]
    fn legacy_type_key_is_accepted() {
        let mut v = base();
        v["rope_scaling"] = serde_json::json!({"type": "linear", "factor": 4.0});
        assert_eq!(
            parse(v).unwrap().rope.scaling,
            RopeScaling::Linear { factor: 4.0 }
        );
    }

    #[test]
    fn unknown_rope_type_is_named() {
        let mut v = base();
        v["rope_scaling"] = serde_json::json!({"rope_type": "yarn", "factor": 4.0});
        let e = parse(v).unwrap_err().to_string();
        assert!(e.contains("unknown RoPE type \"yarn\""), "{e}");
    }

    #[test]
    fn unknown_architecture_is_named() {
        let mut v = base();
        v["architectures"] = serde_json::json!(["GPT2LMHeadModel"]);
        let e = parse(v).unwrap_err().to_string();
        assert!(
            e.contains("unknown architecture \"GPT2LMHeadModel\"")
                && e.contains("Qwen3ForCausalLM"),
            "{e}"
        );
    }

    #[test]
    fn qwen_families() {
        let mut v = base();
        v["architectures"] = serde_json::json!(["Qwen2ForCausalLM"]);
        v["eos_token_id"] = 7.into();
        let c = parse(v.clone()).unwrap();
        assert!(c.qkv_bias && !c.o_bias && !c.qk_norm);
        assert_eq!(c.eos_token_ids, vec![7]);
        v["architectures"] = serde_json::json!(["Qwen3ForCausalLM"]);
        v["head_dim"] = 32.into();
        let c = parse(v).unwrap();
        assert!(c.qk_norm && !c.qkv_bias);
        assert_eq!((c.head_dim, c.q_dim(), c.kv_dim()), (32, 128, 64));
    }

    #[test]
    fn a_non_positive_epsilon_or_theta_is_refused() {
        for eps in [-1.0, 0.0, 1e-50] {
            let mut v = base();
            v["rms_norm_eps"] = eps.into();
            let e = parse(v).unwrap_err().to_string();
            assert!(
                e.contains("rms_norm_eps = ") && e.contains("positive"),
                "{e}"
            );
        }
        let mut v = base();
        v["rope_theta"] = (-5.0).into();
        assert!(parse(v)
            .unwrap_err()
            .to_string()
            .contains("rope_theta = -5"));
    }

    #[test]
    fn sizes_beyond_any_model_are_refused_before_anything_is_sized_by_them() {
        for (key, v) in [
            ("num_hidden_layers", 1u64 << 31),
            ("vocab_size", 1 << 40),
            ("hidden_size", 1 << 25),
            ("max_position_embeddings", 1 << 60),
        ] {
            let mut c = base();
            c[key] = v.into();
            let e = parse(c).unwrap_err().to_string();
            assert!(e.contains(&format!("{key} = {v} is outside")), "{e}");
        }
        let mut c = base();
        c["vocab_size"] = 0.into();
        assert!(parse(c).unwrap_err().to_string().contains("vocab_size = 0"));
    }

    #[test]
    fn gqa_must_divide() {
        let mut v = base();
        v["num_key_value_heads"] = 3.into();
        assert!(parse(v).unwrap_err().to_string().contains("multiple"));
    }
}
