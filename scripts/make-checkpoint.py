#!/usr/bin/env python3
"""Random-weight checkpoints whose config.json is, field for field, a real model's.

No model hub is reachable from the GPU box, so the 1B- and 8B-class units time real shapes on
seeded random weights: right for speed (decode reads every byte the same way), wrong for
token-exactness (random logits are nearly flat; see goldens/tiny-trained for that).

    python3 scripts/make-checkpoint.py --model llama-3.2-1b --out /tmp/ckpt/llama-3.2-1b
    python3 scripts/make-checkpoint.py --list

Weights: normal(0, initializer_range) for every matrix, ones for norms, zeros for biases (as
transformers initialises them), drawn per tensor from a generator seeded with (seed, name), in
bf16, sharded the way the real checkpoint is (one file, or ~5 GB shards with an index).
Idempotent: a complete checkpoint at --out is left alone.
"""
import argparse
import hashlib
import json
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

# name -> (config, shard size in bytes or None for one file)
MODELS = {
    "llama-3.2-1b": (LLAMA_3_2_1B, None),
    "llama-3.1-8b": (LLAMA_3_1_8B, 5_000_000_000),
    "qwen2.5-0.5b": (QWEN2_5_0_5B, None),
}


def tensors(cfg):
    """(name, shape, kind) for every tensor, in the order the real checkpoints store them."""
    h, i = cfg["hidden_size"], cfg["intermediate_size"]
    heads, kvh = cfg["num_attention_heads"], cfg["num_key_value_heads"]
    d = cfg.get("head_dim") or h // heads
    bias = cfg["architectures"][0] == "Qwen2ForCausalLM"
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


def make(torch, cfg, name, shape, kind, seed, device):
    if kind == "norm":
        return torch.ones(shape, dtype=torch.bfloat16)
    if kind == "bias":
        return torch.zeros(shape, dtype=torch.bfloat16)
    key = int.from_bytes(hashlib.sha256(f"{seed}:{name}".encode()).digest()[:8], "little")
    g = torch.Generator(device=device).manual_seed(key)
    t = torch.randn(shape, generator=g, device=device, dtype=torch.float32)
    return (t * cfg["initializer_range"]).to(torch.bfloat16).cpu()


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
    a = ap.parse_args()
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
                "made by scripts/make-checkpoint.py because no model hub is reachable.\n")
    open(os.path.join(a.out, ".complete"), "w").close()
    print(f"{a.out}: {a.model}, {total / 1e9:.2f} GB in {n} file(s), {time.time() - started:.1f} s",
          file=sys.stderr)
    return 0


def _numel(shape):
    p = 1
    for s in shape:
        p *= s
    return p


if __name__ == "__main__":
    sys.exit(main())
