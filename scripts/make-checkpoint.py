#!/usr/bin/env python3
"""Random-weight checkpoints whose config.json is, field for field, a real model's.

No model hub is reachable from the GPU box, so the 1B- and 8B-class units time real shapes on
seeded random weights: right for speed (decode reads every byte the same way), wrong for
token-exactness (random logits are nearly flat; see goldens/tiny-trained for that).

    python3 scripts/make-checkpoint.py --model llama-3.2-1b --out /tmp/ckpt/llama-3.2-1b
    python3 scripts/make-checkpoint.py --list

    python3 scripts/make-checkpoint.py --model llama-3.1-8b --config-only   # config.json to stdout
    python3 scripts/make-checkpoint.py --model nemotron-h-8b --shrink 32 --out /tmp/nh-small

Weights: mean 0, standard deviation initializer_range for every matrix, ones for norms, zeros
for biases (as transformers initialises them), in bf16, sharded the way the real checkpoint is
(one file, or ~5 GB shards named model-0000N-of-0000M.safetensors with an index).
Nemotron-H (NemotronHForCausalLM: Mamba-2 mixers, attention and relu2 MLP blocks) is stored as
NVIDIA's checkpoints are, under `backbone.` (transformers maps it to `model.` on load); its
Mamba-2 parameters are not drawn like matrices but set as transformers' NemotronH initialises
them, so the random model runs in the regime a trained one does instead of blowing up or
freezing: A_log = log(1..heads) (decay rates 1..heads), D = 1, dt_bias = inverse softplus of
a dt log-uniform in [time_step_min, time_step_max] floored at time_step_floor (the uniforms
from the same integer hash as the matrices, the formula in float64 on the CPU, so the same
bits anywhere), conv1d bias zero, the gated norm's gain one.

--shrink F makes a scaled-down variant of a model's config to test the code path (a checkpoint
in seconds that transformers must load): hidden_size, intermediate_size, vocab_size and the
head counts (attention, key/value, Mamba) divided by F (at least 1, the Mamba group count cut to
divide the Mamba heads); per-head sizes (head_dim, mamba_head_dim, ssm_state_size), the conv
kernel, the chunk size and the layer pattern are kept. Not a unit's checkpoint.

The numbers are the same bits on any device: element i of tensor `name` is a function of
(seed, name, i) alone, computed with exact integer arithmetic (a 32-bit integer hash, lowbias32,
kept below 2**49 so no int64 op overflows) and one float32 multiply, then rounded to bf16. Each
value is an Irwin-Hall sum of four 16-bit uniforms (approximately normal, bounded at +-3.46
sigma). torch's own CUDA generator would not do: its stream depends on the GPU's SM count, so a
checkpoint made on another GPU (or on the CPU) would not be the one a golden was captured on.
So the files are byte-identical wherever they are made, and goldens/<unit>/checkpoint.sha256
can pin them. On a GPU the numbers are drawn on the GPU (an 8B checkpoint in seconds, plus the
disk write); on the CPU they take minutes.
Idempotent: a complete checkpoint at --out (its .complete marker) is left alone.
"""
import argparse
import hashlib
import json
import math
import os
import sys
import time

LLAMA_3_2_1B = {
    "architectures": ["LlamaForCausalLM"],
    "attention_bias": False,
    "attention_dropout": 0.0,
    "bos_token_id": 128000,
    "eos_token_id": 128001,
    "head_dim": 64,
    "hidden_act": "silu",
    "hidden_size": 2048,
    "initializer_range": 0.02,
    "intermediate_size": 8192,
    "max_position_embeddings": 131072,
    "mlp_bias": False,
    "model_type": "llama",
    "num_attention_heads": 32,
    "num_hidden_layers": 16,
    "num_key_value_heads": 8,
    "pretraining_tp": 1,
    "rms_norm_eps": 1e-05,
    "rope_scaling": {
        "factor": 32.0,
        "high_freq_factor": 4.0,
        "low_freq_factor": 1.0,
        "original_max_position_embeddings": 8192,
        "rope_type": "llama3",
    },
    "rope_theta": 500000.0,
    "tie_word_embeddings": True,
    "torch_dtype": "bfloat16",
    "transformers_version": "4.45.0.dev0",
    "use_cache": True,
    "vocab_size": 128256,
}

LLAMA_3_1_8B = {
    "architectures": ["LlamaForCausalLM"],
    "attention_bias": False,
    "attention_dropout": 0.0,
    "bos_token_id": 128000,
    "eos_token_id": 128001,
    "hidden_act": "silu",
    "hidden_size": 4096,
    "initializer_range": 0.02,
    "intermediate_size": 14336,
    "max_position_embeddings": 131072,
    "mlp_bias": False,
    "model_type": "llama",
    "num_attention_heads": 32,
    "num_hidden_layers": 32,
    "num_key_value_heads": 8,
    "pretraining_tp": 1,
    "rms_norm_eps": 1e-05,
    "rope_scaling": {
        "factor": 8.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": 8192,
        "rope_type": "llama3",
    },
    "rope_theta": 500000.0,
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
    "transformers_version": "4.43.0.dev0",
    "use_cache": True,
    "vocab_size": 128256,
}

QWEN2_5_0_5B = {
    "architectures": ["Qwen2ForCausalLM"],
    "attention_dropout": 0.0,
    "bos_token_id": 151643,
    "eos_token_id": 151643,
    "hidden_act": "silu",
    "hidden_size": 896,
    "initializer_range": 0.02,
    "intermediate_size": 4864,
    "max_position_embeddings": 32768,
    "max_window_layers": 24,
    "model_type": "qwen2",
    "num_attention_heads": 14,
    "num_hidden_layers": 24,
    "num_key_value_heads": 2,
    "rms_norm_eps": 1e-06,
    "rope_theta": 1000000.0,
    "sliding_window": 32768,
    "tie_word_embeddings": True,
    "torch_dtype": "bfloat16",
    "transformers_version": "4.40.1",
    "use_cache": True,
    "use_sliding_window": False,
    "vocab_size": 151936,
}

NEMOTRON_H_KINDS = {"M": "linear_attention", "*": "full_attention", "-": "mlp", "E": "moe"}


def _pattern(p):
    """transformers' hybrid_override_pattern letters -> the layers_block_type list."""
    return [NEMOTRON_H_KINDS[c] for c in p]


# nvidia/Nemotron-H-8B-Base-8K's config.json as transformers 5.17 writes it (layers_block_type
# instead of hybrid_override_pattern; time_step_limit's infinity in transformers' JSON encoding
# {"__float__": "Infinity"}, which its loader turns back into float("inf")), field for field.
NEMOTRON_H_8B = {
    "architectures": ["NemotronHForCausalLM"],
    "attention_bias": False,
    "attention_dropout": 0.0,
    "bos_token_id": 1,
    "chunk_size": 128,
    "conv_kernel": 4,
    "dtype": "bfloat16",
    "eos_token_id": 2,
    "expand": 2,
    "head_dim": 128,
    "hidden_dropout": 0.0,
    "hidden_size": 4096,
    "initializer_range": 0.02,
    "intermediate_size": 21504,
    "layer_norm_epsilon": 1e-05,
    # 52 layers: 24 Mamba-2, 24 MLP, 4 attention.
    "layers_block_type": _pattern("M-M-M-M*-M-M-M-M-M*-M-M-M-M-M*-M-M-M-M-M*-M-M-M-M-M-"),
    "mamba_head_dim": 64,
    "mamba_hidden_act": "silu",
    "mamba_num_heads": 128,
    "mamba_proj_bias": False,
    "mamba_ssm_cache_dtype": "float32",
    "max_position_embeddings": 8192,
    "mlp_bias": False,
    "mlp_hidden_act": "relu2",
    "model_type": "nemotron_h",
    "moe_intermediate_size": 7688,
    "moe_latent_size": None,
    "moe_shared_expert_intermediate_size": 7688,
    "moe_shared_expert_overlap": True,
    "mtp_layers_block_type": ["full_attention", "moe"],
    "n_group": 1,
    "n_groups": 8,
    "n_routed_experts": 8,
    "n_shared_experts": 1,
    "norm_topk_prob": True,
    "num_attention_heads": 32,
    "num_experts_per_tok": 2,
    "num_key_value_heads": 8,
    "num_logits_to_keep": 1,
    "num_nextn_predict_layers": 0,
    "pad_token_id": 0,
    "rescale_prenorm_residual": True,
    "residual_in_fp32": False,
    "routed_scaling_factor": 1.0,
    "sliding_window": None,
    "ssm_state_size": 128,
    "tie_word_embeddings": False,
    "time_step_floor": 0.0001,
    "time_step_limit": [0.0, {"__float__": "Infinity"}],
    "time_step_max": 0.1,
    "time_step_min": 0.001,
    "topk_group": 1,
    "transformers_version": "5.17.0",
    "use_bias": False,
    "use_cache": True,
    "use_conv_bias": True,
    "use_mamba_kernels": True,
    "vocab_size": 131072,
}

# Issue 19's shapes nobody tuned for: config.json of meta-llama/Llama-3.2-3B, Qwen/Qwen3-4B and
# mistralai/Mistral-7B-v0.3, field for field as their repositories hold them (the compute
# fields; torch_dtype bf16).
LLAMA_3_2_3B = {
    "architectures": ["LlamaForCausalLM"],
    "attention_bias": False,
    "attention_dropout": 0.0,
    "bos_token_id": 128000,
    "eos_token_id": 128001,
    "head_dim": 128,
    "hidden_act": "silu",
    "hidden_size": 3072,
    "initializer_range": 0.02,
    "intermediate_size": 8192,
    "max_position_embeddings": 131072,
    "mlp_bias": False,
    "model_type": "llama",
    "num_attention_heads": 24,
    "num_hidden_layers": 28,
    "num_key_value_heads": 8,
    "pretraining_tp": 1,
    "rms_norm_eps": 1e-05,
    "rope_scaling": {
        "factor": 32.0,
        "high_freq_factor": 4.0,
        "low_freq_factor": 1.0,
        "original_max_position_embeddings": 8192,
        "rope_type": "llama3",
    },
    "rope_theta": 500000.0,
    "tie_word_embeddings": True,
    "torch_dtype": "bfloat16",
    "transformers_version": "4.45.0.dev0",
    "use_cache": True,
    "vocab_size": 128256,
}

QWEN3_4B = {
    "architectures": ["Qwen3ForCausalLM"],
    "attention_bias": False,
    "attention_dropout": 0.0,
    "bos_token_id": 151643,
    "eos_token_id": 151645,
    "head_dim": 128,
    "hidden_act": "silu",
    "hidden_size": 2560,
    "initializer_range": 0.02,
    "intermediate_size": 9728,
    "max_position_embeddings": 40960,
    "max_window_layers": 36,
    "model_type": "qwen3",
    "num_attention_heads": 32,
    "num_hidden_layers": 36,
    "num_key_value_heads": 8,
    "rms_norm_eps": 1e-06,
    "rope_scaling": None,
    "rope_theta": 1000000,
    "sliding_window": None,
    "tie_word_embeddings": True,
    "torch_dtype": "bfloat16",
    "transformers_version": "4.51.0",
    "use_cache": True,
    "use_sliding_window": False,
    "vocab_size": 151936,
}

MISTRAL_7B_V0_3 = {
    "architectures": ["MistralForCausalLM"],
    "attention_dropout": 0.0,
    "bos_token_id": 1,
    "eos_token_id": 2,
    "hidden_act": "silu",
    "hidden_size": 4096,
    "initializer_range": 0.02,
    "intermediate_size": 14336,
    "max_position_embeddings": 32768,
    "model_type": "mistral",
    "num_attention_heads": 32,
    "num_hidden_layers": 32,
    "num_key_value_heads": 8,
    "rms_norm_eps": 1e-05,
    "rope_theta": 1000000.0,
    "sliding_window": None,
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
    "transformers_version": "4.42.0.dev0",
    "use_cache": True,
    "vocab_size": 32768,
}

# name -> (config, shard size in bytes or None for one file)
MODELS = {
    "llama-3.2-1b": (LLAMA_3_2_1B, None),
    "llama-3.1-8b": (LLAMA_3_1_8B, 5_000_000_000),
    "qwen2.5-0.5b": (QWEN2_5_0_5B, None),
    "nemotron-h-8b": (NEMOTRON_H_8B, 5_000_000_000),
    "llama-3.2-3b": (LLAMA_3_2_3B, 5_000_000_000),
    "qwen3-4b": (QWEN3_4B, 5_000_000_000),
    "mistral-7b-v0.3": (MISTRAL_7B_V0_3, 5_000_000_000),
}


def shrink(cfg, f):
    """A scaled-down copy of cfg for testing the code path (module docstring, --shrink)."""
    c = json.loads(json.dumps(cfg))

    def div(key):
        c[key] = max(1, c[key] // f)

    for key in ("hidden_size", "intermediate_size", "vocab_size"):
        div(key)
    if "head_dim" not in c:  # Llama/Qwen2 derive it from hidden / heads: keep it
        c["head_dim"] = cfg["hidden_size"] // cfg["num_attention_heads"]
    div("num_key_value_heads")
    heads = max(1, cfg["num_attention_heads"] // f)
    c["num_attention_heads"] = heads - heads % c["num_key_value_heads"] or c["num_key_value_heads"]
    if "mamba_num_heads" in c:
        div("mamba_num_heads")
        g = min(c["n_groups"], c["mamba_num_heads"])
        while c["mamba_num_heads"] % g:
            g -= 1
        c["n_groups"] = g
    return c


def nemotron_h_tensors(cfg):
    """NemotronHForCausalLM's tensors under NVIDIA's `backbone.` prefix, layer by layer, each
    layer's names sorted (as save_pretrained writes them)."""
    h, vocab = cfg["hidden_size"], cfg["vocab_size"]
    heads, kvh, d = cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["head_dim"]
    mh, md, groups, state = cfg["mamba_num_heads"], cfg["mamba_head_dim"], cfg["n_groups"], cfg["ssm_state_size"]
    d_inner = mh * md
    conv_dim = d_inner + 2 * groups * state
    out = [("backbone.embeddings.weight", (vocab, h), "w")]
    for l, kind in enumerate(cfg["layers_block_type"]):
        p = f"backbone.layers.{l}"
        layer = [(f"{p}.norm.weight", (h,), "norm")]
        if kind == "linear_attention":
            m = f"{p}.mixer"
            layer += [
                (f"{m}.A_log", (mh,), "a_log"),
                (f"{m}.D", (mh,), "ones"),
                (f"{m}.dt_bias", (mh,), "dt_bias"),
                (f"{m}.conv1d.weight", (conv_dim, 1, cfg["conv_kernel"]), "w"),
                # in_proj's rows: z (d_inner) | x B C (conv_dim) | dt (heads)
                (f"{m}.in_proj.weight", (d_inner + conv_dim + mh, h), "w"),
                (f"{m}.norm.weight", (d_inner,), "norm"),  # the gated group RMSNorm
                (f"{m}.out_proj.weight", (h, d_inner), "w"),
            ]
            if cfg["use_conv_bias"]:
                layer.append((f"{m}.conv1d.bias", (conv_dim,), "bias"))
            if cfg["use_bias"]:
                layer += [(f"{m}.in_proj.bias", (d_inner + conv_dim + mh,), "bias"),
                          (f"{m}.out_proj.bias", (h,), "bias")]
        elif kind == "full_attention":
            # transformers' NemotronHAttention has no biases whatever attention_bias says.
            layer += [
                (f"{p}.mixer.q_proj.weight", (heads * d, h), "w"),
                (f"{p}.mixer.k_proj.weight", (kvh * d, h), "w"),
                (f"{p}.mixer.v_proj.weight", (kvh * d, h), "w"),
                (f"{p}.mixer.o_proj.weight", (h, heads * d), "w"),
            ]
        elif kind == "mlp":
            i = cfg["intermediate_size"]
            layer += [(f"{p}.mixer.up_proj.weight", (i, h), "w"), (f"{p}.mixer.down_proj.weight", (h, i), "w")]
            if cfg["mlp_bias"]:
                layer += [(f"{p}.mixer.up_proj.bias", (i,), "bias"), (f"{p}.mixer.down_proj.bias", (h,), "bias")]
        else:
            raise SystemExit(f"layer {l}: block type {kind!r} is not supported here (no MoE)")
        out += sorted(layer)
    out.append(("backbone.norm_f.weight", (h,), "norm"))
    if not cfg["tie_word_embeddings"]:
        out.append(("lm_head.weight", (vocab, h), "w"))
    return out


def tensors(cfg):
    """(name, shape, kind) for every tensor, in the order the real checkpoints store them."""
    if cfg["architectures"][0] == "NemotronHForCausalLM":
        return nemotron_h_tensors(cfg)
    h, i = cfg["hidden_size"], cfg["intermediate_size"]
    heads, kvh = cfg["num_attention_heads"], cfg["num_key_value_heads"]
    d = cfg.get("head_dim") or h // heads
    bias = cfg["architectures"][0] == "Qwen2ForCausalLM"
    qk_norm = cfg["architectures"][0] == "Qwen3ForCausalLM"
    out = [("model.embed_tokens.weight", (cfg["vocab_size"], h), "w")]
    for l in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{l}"
        out += [
            (f"{p}.input_layernorm.weight", (h,), "norm"),
            (f"{p}.mlp.down_proj.weight", (h, i), "w"),
            (f"{p}.mlp.gate_proj.weight", (i, h), "w"),
            (f"{p}.mlp.up_proj.weight", (i, h), "w"),
            (f"{p}.post_attention_layernorm.weight", (h,), "norm"),
            (f"{p}.self_attn.k_proj.weight", (kvh * d, h), "w"),
            (f"{p}.self_attn.o_proj.weight", (h, heads * d), "w"),
            (f"{p}.self_attn.q_proj.weight", (heads * d, h), "w"),
            (f"{p}.self_attn.v_proj.weight", (kvh * d, h), "w"),
        ]
        if qk_norm:
            out += [
                (f"{p}.self_attn.k_norm.weight", (d,), "norm"),
                (f"{p}.self_attn.q_norm.weight", (d,), "norm"),
            ]
        if bias:
            out += [
                (f"{p}.self_attn.q_proj.bias", (heads * d,), "bias"),
                (f"{p}.self_attn.k_proj.bias", (kvh * d,), "bias"),
                (f"{p}.self_attn.v_proj.bias", (kvh * d,), "bias"),
            ]
    out.append(("model.norm.weight", (h,), "norm"))
    if not cfg["tie_word_embeddings"]:
        out.append(("lm_head.weight", (cfg["vocab_size"], h), "w"))
    return out


M32 = 0xFFFFFFFF
# std of an Irwin-Hall sum of four uniforms on 0..65535: sqrt(4 * (65536**2 - 1) / 12).
IH4_STD = ((65536**2 - 1) / 3) ** 0.5
CHUNK = 1 << 24  # elements per step on the CPU; 1 << 27 on a GPU


def _mul32(torch, x, c):
    """(x * c) mod 2**32 for x < 2**32 in int64, with no intermediate above 2**49."""
    lo, hi = c & 0xFFFF, c >> 16
    return (x * lo + (((x * hi) & 0xFFFF) << 16)) & M32


def _hash32(torch, x):
    """lowbias32 (Chris Wellons' 32-bit integer hash) on int64 holding values below 2**32."""
    x = x ^ (x >> 16)
    x = _mul32(torch, x, 0x7FEB352D)
    x = x ^ (x >> 15)
    x = _mul32(torch, x, 0x846CA68B)
    return x ^ (x >> 16)


def tensor_key(seed, name):
    return int.from_bytes(hashlib.sha256(f"{seed}:{name}".encode()).digest()[:4], "little")


def draw(torch, n, key, std, device):
    """n bf16 values, mean 0 and standard deviation std; the same bits on every device."""
    out = torch.empty(n, dtype=torch.bfloat16, device=device)
    chunk = CHUNK if device == "cpu" else CHUNK * 8
    scale = torch.tensor(std / IH4_STD, dtype=torch.float32, device=device)
    for start in range(0, n, chunk):
        m = min(chunk, n - start)
        i = torch.arange(start, start + m, dtype=torch.int64, device=device)
        # Two 32-bit hashes per element: of (2i + key) and (2i + 1 + key), mod 2**32.
        a = _hash32(torch, (2 * i + key) & M32)
        b = _hash32(torch, (2 * i + 1 + key) & M32)
        s = (a & 0xFFFF) + (a >> 16) + (b & 0xFFFF) + (b >> 16) - 2 * 65535
        # |s| <= 131070 < 2**24: exact in float32; one multiply, one rounding to bf16.
        out[start:start + m] = (s.to(torch.float32) * scale).to(torch.bfloat16)
        del i, a, b, s
    return out


def uniform(torch, n, key):
    """n float64 uniforms in [0, 1) on the CPU, one lowbias32 hash of (i + key) each."""
    i = torch.arange(n, dtype=torch.int64)
    return _hash32(torch, (i + key) & M32).to(torch.float64) / 2.0**32


def make(torch, cfg, name, shape, kind, seed, device):
    if kind in ("norm", "ones"):
        return torch.ones(shape, dtype=torch.bfloat16)
    if kind == "bias":
        return torch.zeros(shape, dtype=torch.bfloat16)
    if kind == "a_log":  # A = -exp(A_log) = -1, -2, ..., -heads (transformers' init)
        return torch.log(torch.arange(1, shape[0] + 1, dtype=torch.float64)).to(torch.bfloat16)
    if kind == "dt_bias":  # transformers' NemotronH init, with our own uniforms
        lo, hi = math.log(cfg["time_step_min"]), math.log(cfg["time_step_max"])
        dt = torch.exp(uniform(torch, shape[0], tensor_key(seed, name)) * (hi - lo) + lo)
        dt = dt.clamp(min=cfg["time_step_floor"])
        return (dt + torch.log(-torch.expm1(-dt))).to(torch.bfloat16)  # inverse softplus
    t = draw(torch, _numel(shape), tensor_key(seed, name), cfg["initializer_range"], device)
    return t.reshape(shape).cpu()


def complete(out):
    marker = os.path.join(out, ".complete")
    return os.path.exists(marker)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", choices=sorted(MODELS))
    ap.add_argument("--out")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--device", default=None, help="where to draw the numbers (default: cuda if present)")
    ap.add_argument("--list", action="store_true", help="list the models and exit")
    ap.add_argument("--config-only", action="store_true",
                    help="print the model's config.json on stdout and exit (no torch needed)")
    ap.add_argument("--shrink", type=int, default=1, metavar="F",
                    help="a scaled-down variant, widths and head counts divided by F, to test the code path")
    a = ap.parse_args()
    if a.shrink < 1:
        ap.error("--shrink must be >= 1")
    if a.config_only:
        if not a.model:
            ap.error("--config-only needs --model")
        cfg = MODELS[a.model][0]
        json.dump(shrink(cfg, a.shrink) if a.shrink > 1 else cfg, sys.stdout, indent=2)
        print()
        return 0
    if a.list:
        for k, (cfg, _) in sorted(MODELS.items()):
            n = sum(_numel(s) for _, s, _ in tensors(cfg))
            print(f"{k}: {cfg['architectures'][0]}, {n / 1e9:.3f}B parameters")
        return 0
    if not a.model or not a.out:
        ap.error("--model and --out are required")
    if complete(a.out):
        print(f"{a.out}: already complete", file=sys.stderr)
        return 0
    import torch
    from safetensors.torch import save_file

    device = a.device or ("cuda" if torch.cuda.is_available() else "cpu")
    cfg, shard_bytes = MODELS[a.model]
    if a.shrink > 1:
        cfg = shrink(cfg, a.shrink)
    os.makedirs(a.out, exist_ok=True)
    started = time.time()
    specs = tensors(cfg)
    # Group into shards in storage order.
    shards, cur, size = [], [], 0
    for spec in specs:
        b = _numel(spec[1]) * 2
        if shard_bytes and cur and size + b > shard_bytes:
            shards.append(cur)
            cur, size = [], 0
        cur.append(spec)
        size += b
    shards.append(cur)
    n = len(shards)
    weight_map, total = {}, 0
    for k, group in enumerate(shards):
        fname = "model.safetensors" if n == 1 else f"model-{k + 1:05d}-of-{n:05d}.safetensors"
        data = {nm: make(torch, cfg, nm, shape, kind, a.seed, device) for nm, shape, kind in group}
        total += sum(t.numel() * 2 for t in data.values())
        save_file(data, os.path.join(a.out, fname), metadata={"format": "pt"})
        for nm in data:
            weight_map[nm] = fname
        print(f"{fname}: {len(data)} tensors", file=sys.stderr)
    if n > 1:
        with open(os.path.join(a.out, "model.safetensors.index.json"), "w") as f:
            json.dump({"metadata": {"total_size": total}, "weight_map": weight_map}, f, indent=2)
    with open(os.path.join(a.out, "config.json"), "w") as f:
        json.dump(cfg, f, indent=2)
    with open(os.path.join(a.out, "generation_config.json"), "w") as f:
        json.dump({"bos_token_id": cfg["bos_token_id"], "eos_token_id": cfg["eos_token_id"],
                   "do_sample": False}, f, indent=2)
    with open(os.path.join(a.out, "RANDOM_WEIGHTS.txt"), "w") as f:
        f.write(f"Random weights (seed {a.seed}) with {a.model}'s real config.json; "
                "made by scripts/make-checkpoint.py because no model hub is reachable. "
                "The same bits on any device (drawn here on " + device + ").\n")
        if a.shrink > 1:
            f.write(f"Scaled down by --shrink {a.shrink} (widths and head counts / {a.shrink}): "
                    "a test of the code path, not the real model's shapes.\n")
    open(os.path.join(a.out, ".complete"), "w").close()
    shrunk = f" (shrunk by {a.shrink})" if a.shrink > 1 else ""
    print(f"{a.out}: {a.model}{shrunk}, {total / 1e9:.2f} GB in {n} file(s), {time.time() - started:.1f} s",
          file=sys.stderr)
    return 0


def _numel(shape):
    p = 1
    for s in shape:
        p *= s
    return p


if __name__ == "__main__":
    sys.exit(main())
