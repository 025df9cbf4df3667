#!/usr/bin/env python3
"""Write the tiny random-weight fixture checkpoints and their prompts.

    python scripts/make-tiny-checkpoints.py [--only UNIT] [--root goldens]

For each unit this writes goldens/<unit>/model/ (transformers `save_pretrained`),
goldens/<unit>/prompts.json and goldens/<unit>/unit.toml. Everything is seeded, so a
re-run on the same torch/transformers versions reproduces the same bytes.

The weights are random but deliberately *sharp*: every tensor (biases and norm weights
included, which transformers would otherwise initialise to 0 / 1 and so let a loader that
skips them pass) is drawn with a large std, so greedy tokens are far from ties and a wrong
kernel changes them. After writing, the script runs greedy decoding in float32 on the CPU
over the prompts and prints the minimum top-2 logit margin and how varied the outputs are;
it exits non-zero when the margin is below --min-margin or an output collapses to one
token, so a bad seed cannot slip in. The golden itself is captured by
`python -m oracle capture` (see docs/ORACLE.md), not here.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
from pathlib import Path

import torch
from transformers import (
    LlamaConfig,
    LlamaForCausalLM,
    Qwen2Config,
    Qwen2ForCausalLM,
    Qwen3Config,
    Qwen3ForCausalLM,
)

MAX_TOKENS = 32
# Prompt lengths: a single token, a short one, exactly one KV block (16), one token past a
# block, a few blocks, and a long one (~100) that spans 7 blocks.
PROMPT_LENGTHS = [1, 5, 11, 16, 17, 40, 64, 100]
BLOCK_SIZE = 16
BATCH = 4


def llama_config() -> LlamaConfig:
    return LlamaConfig(
        vocab_size=512,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=3,
        num_attention_heads=4,
        num_key_value_heads=2,  # GQA: 2 query heads per KV head
        head_dim=16,
        max_position_embeddings=512,
        rms_norm_eps=1e-5,
        # llama3 frequency scaling. With head_dim 16, theta 1e4 and an original context of
        # 32 the 8 rotary wavelengths are ~6, 20, 63, 199, ... tokens: one stays as is
        # (< 32/4), one is smoothed (between 8 and 32), six are divided by the factor, so
        # all three branches of the scaling are exercised.
        rope_parameters={
            "rope_type": "llama3",
            "rope_theta": 10000.0,
            "factor": 8.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 32,
        },
        tie_word_embeddings=False,
        bos_token_id=1,
        eos_token_id=[2, 7],  # a list on purpose: loaders must accept int or list
        attention_bias=False,
        mlp_bias=False,
    )


def qwen2_config() -> Qwen2Config:
    return Qwen2Config(
        vocab_size=500,  # not a power of two on purpose
        hidden_size=64,
        intermediate_size=160,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=256,
        rms_norm_eps=1e-6,
        rope_parameters={"rope_type": "default", "rope_theta": 1000000.0},
        tie_word_embeddings=True,
        use_sliding_window=False,
        bos_token_id=1,
        eos_token_id=3,
    )


def qwen3_config() -> Qwen3Config:
    return Qwen3Config(
        vocab_size=384,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=32,  # explicit and != hidden / heads (16)
        max_position_embeddings=256,
        rms_norm_eps=1e-6,
        rope_parameters={"rope_type": "default", "rope_theta": 1000000.0},
        tie_word_embeddings=False,
        use_sliding_window=False,
        attention_bias=False,
        bos_token_id=1,
        eos_token_id=2,
    )


# unit name -> (model class, config factory, save dtype, save kwargs, weight std, seed, prompt seed, description)
UNITS = {
    "tiny-llama": dict(
        cls=LlamaForCausalLM,
        config=llama_config,
        dtype=torch.float32,
        save={"max_shard_size": "1GB"},  # one model.safetensors
        std=0.35,
        seed=5,  # chosen: min top-2 margin 5.2e-3, no collapse (seeds 1-7 tried)
        description="Random-weight LlamaForCausalLM (GQA 4/2, head_dim 16, llama3 RoPE scaling, untied, "
        "two EOS ids), float32, one safetensors file. Made by scripts/make-tiny-checkpoints.py.",
    ),
    "tiny-qwen": dict(
        cls=Qwen2ForCausalLM,
        config=qwen2_config,
        dtype=torch.bfloat16,
        save={"max_shard_size": "40KB"},  # several shards + model.safetensors.index.json
        std=0.35,
        seed=4,  # chosen: min top-2 margin 1.1e-2 (seed 2 gave 3e-4)
        description="Random-weight Qwen2ForCausalLM (q/k/v biases, GQA 4/2, tied embeddings), bfloat16, "
        "sharded. Made by scripts/make-tiny-checkpoints.py.",
    ),
    "tiny-qwen3": dict(
        cls=Qwen3ForCausalLM,
        config=qwen3_config,
        dtype=torch.float16,
        save={"max_shard_size": "1GB"},
        std=0.35,
        seed=3,  # min top-2 margin 8.3e-3
        description="Random-weight Qwen3ForCausalLM (per-head q/k RMSNorm, head_dim 32 != hidden/heads, "
        "GQA 4/2, untied), float16, one safetensors file. Made by scripts/make-tiny-checkpoints.py.",
    ),
}


def randomize(model: torch.nn.Module, std: float, seed: int) -> None:
    """Re-draw every parameter from a private generator, in sorted name order, so the result
    depends only on the seed (not on transformers' init order)."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in sorted(model.named_parameters(), key=lambda kv: kv[0]):
            if name.endswith("norm.weight"):
                # RMSNorm gains around 1, but not 1, so a loader that drops them is caught.
                vals = 1.0 + 0.2 * torch.randn(p.shape, generator=gen)
            elif name.endswith(".bias"):
                vals = 0.5 * torch.randn(p.shape, generator=gen)
            else:
                vals = std * torch.randn(p.shape, generator=gen)
            p.copy_(vals.to(p.dtype))


def make_prompts(vocab: int, seed: int) -> list[dict]:
    gen = torch.Generator().manual_seed(seed)
    out = []
    for i, n in enumerate(PROMPT_LENGTHS):
        toks = torch.randint(0, vocab, (n,), generator=gen).tolist()
        out.append({"id": f"p{i}", "tokens": toks})
    return out


def greedy_stats(model_dir: Path, prompts: list[dict]) -> tuple[float, list[int]]:
    """Greedy f32 decode (full recompute, deliberately independent of the oracle's cached
    loop) -> (min top-2 margin, distinct tokens per output)."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    model.eval()
    min_margin, distinct = float("inf"), []
    with torch.inference_mode():
        for p in prompts:
            ids = list(p["tokens"])
            new = []
            for _ in range(MAX_TOKENS):
                logits = model(torch.tensor([ids])).logits[0, -1].float()
                top = torch.topk(logits, 2).values
                min_margin = min(min_margin, float(top[0] - top[1]))
                t = int(torch.argmax(logits))
                new.append(t)
                ids.append(t)
            distinct.append(len(set(new)))
    return min_margin, distinct


def unit_toml(name: str, description: str) -> str:
    longest = max(PROMPT_LENGTHS)
    per_seq_blocks = -(-(longest + MAX_TOKENS) // BLOCK_SIZE)
    # batch 4 x (longest prompt + 32), rounded up to whole blocks, with headroom.
    num_blocks = max(64, 2 * BATCH * per_seq_blocks)
    return f"""name = "{name}"
model = "model"
description = "{description}"

[battery]
prompts = "prompts.json"
max_tokens = {MAX_TOKENS}
ignore_eos = true
warmup = 1
repeat = 2
batch_sizes = [1, {BATCH}]

[[golden]]
file = "golden.json"
device = "cpu"
dtype = "float32"

[engine]
binary = "target/release/engine"
device = "cpu"
block_size = {BLOCK_SIZE}
num_blocks = {num_blocks}
max_batch = {BATCH}

[oracle]
backend = "transformers"
python = "python3"
device = "cpu"
dtype = "float32"
"""


def write_unit(root: Path, name: str, spec: dict, min_margin_required: float) -> bool:
    unit_dir = root / name
    model_dir = unit_dir / "model"
    if model_dir.exists():
        shutil.rmtree(model_dir)  # stale shards from an older layout must not linger
    model_dir.mkdir(parents=True)

    config = spec["config"]()
    torch.manual_seed(spec["seed"])
    model = spec["cls"](config)
    randomize(model, spec["std"], spec["seed"])
    model = model.to(spec["dtype"])
    model.save_pretrained(model_dir, **spec["save"])
    # generation_config.json is not part of the contract (EOS comes from config.json).
    (model_dir / "generation_config.json").unlink(missing_ok=True)

    prompts = make_prompts(config.vocab_size, 1000 + spec["seed"])
    # One prompt per line: readable diffs, still plain JSON.
    lines = ",\n".join("  " + json.dumps(p) for p in prompts)
    (unit_dir / "prompts.json").write_text('{"schema": 1, "prompts": [\n' + lines + "\n]}\n")
    (unit_dir / "unit.toml").write_text(unit_toml(name, spec["description"]))

    margin, distinct = greedy_stats(model_dir, prompts)
    size = sum(f.stat().st_size for f in model_dir.iterdir())
    files = sorted(f.name for f in model_dir.iterdir())
    print(
        f"{name}: {size / 1e6:.2f} MB in {files}; min top-2 margin {margin:.4g}; "
        f"distinct tokens per 32-token output {distinct}",
        file=sys.stderr,
    )
    ok = True
    if margin < min_margin_required:
        print(f"  FAIL {name}: min margin {margin:.3g} < {min_margin_required}; fix: change its seed", file=sys.stderr)
        ok = False
    if min(distinct) < 3:
        print(f"  FAIL {name}: an output collapses to < 3 distinct tokens; fix: change its seed or std", file=sys.stderr)
        ok = False
    return ok


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--root", default=str(Path(__file__).resolve().parent.parent / "goldens"))
    ap.add_argument("--only", choices=sorted(UNITS), action="append")
    ap.add_argument("--min-margin", type=float, default=1e-3)
    args = ap.parse_args()
    torch.set_num_threads(max(1, torch.get_num_threads()))
    ok = True
    for name in args.only or sorted(UNITS):
        ok &= write_unit(Path(args.root), name, UNITS[name], args.min_margin)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
