#!/usr/bin/env python3
"""Write the tiny random-weight fixture checkpoints and their prompts.

    python scripts/make-tiny-checkpoints.py [--only UNIT] [--root goldens]

For each unit this writes goldens/<unit>/model/ (transformers `save_pretrained`),
goldens/<unit>/prompts.json and goldens/<unit>/unit.toml. Everything is seeded, so a
re-run on the same torch/transformers versions reproduces the same bytes.

The weights are random but deliberately *sharp*: every tensor (biases and norm weights
included, which transformers would otherwise initialise to 0 / 1 and so let a loader that
skips them pass) is drawn with a large std, so greedy tokens are far from ties and a wrong
kernel changes them (tiny-nemotron-h's Mamba-2 parameters are drawn in their own ranges:
see nemotron_h_param). After writing, the script runs greedy decoding in float32 on the CPU
over the prompts and prints the minimum top-2 logit margin and how varied the outputs are;
it exits non-zero when the margin is below --min-margin or an output collapses to one
token, so a bad seed cannot slip in. The golden itself is captured by
`python -m oracle capture` (see docs/ORACLE.md), not here.
"""

from __future__ import annotations

import argparse
import json
import math
import shutil
import sys
from pathlib import Path

import torch
from transformers import (
    LlamaConfig,
    LlamaForCausalLM,
    NemotronHConfig,
    NemotronHForCausalLM,
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


# Nemotron-H's layer pattern letters (transformers' hybrid_override_pattern): M a Mamba-2 mixer,
# * attention (no RoPE in Nemotron-H), - an MLP (relu2, no gate), E a MoE (not used here).
NEMOTRON_H_KINDS = {"M": "linear_attention", "*": "full_attention", "-": "mlp", "E": "moe"}
NEMOTRON_H_PATTERN = "M-M*-M*-"  # every supported kind at least twice, M and - three times


def nemotron_h_config() -> NemotronHConfig:
    return NemotronHConfig(
        vocab_size=448,
        hidden_size=64,
        layers_block_type=[NEMOTRON_H_KINDS[c] for c in NEMOTRON_H_PATTERN],
        # Mamba-2 mixer: d_inner = heads x head_dim = 128 (= 2 x hidden, the usual expand),
        # 2 groups of B/C (4 heads per group), conv over x|B|C of 128 + 2*2*16 = 192 channels,
        # in_proj 64 -> z 128 | xBC 192 | dt 8 = 328.
        mamba_num_heads=8,
        mamba_head_dim=16,
        n_groups=2,
        ssm_state_size=16,
        conv_kernel=4,
        # 16, so the prompts of 17..100 tokens cross 1..6 SSM chunk boundaries in the chunked
        # prefill scan (and 16 itself fills exactly one chunk).
        chunk_size=16,
        num_attention_heads=4,
        num_key_value_heads=2,  # GQA: 2 query heads per KV head
        head_dim=16,
        intermediate_size=128,
        mlp_hidden_act="relu2",
        use_conv_bias=True,
        # in_proj/out_proj biases: off, as in every released Nemotron-H (the 8B included), so
        # the fixture's tensors are exactly the real model's kinds; conv1d.bias (non-zero here)
        # still makes a loader read a Mamba bias.
        use_bias=False,
        mlp_bias=False,
        attention_bias=False,
        tie_word_embeddings=False,
        layer_norm_epsilon=1e-5,
        max_position_embeddings=256,
        bos_token_id=1,
        # A list, as tiny-llama's. 59 is an ordinary token to these random weights, but the
        # golden emits it in 5 of the 8 outputs, first at steps 4..20, and never in the other 3:
        # with ignore_eos = false, sequences of one batch stop at different steps (so a hybrid
        # engine must free and reuse their Mamba states mid-batch). (Valid for seed 32.)
        eos_token_id=[2, 59],
        pad_token_id=0,
        num_nextn_predict_layers=0,
    )


# Nemotron-H's Mamba-2 parameters are not plain weights, and the blanket std-0.35 draw of
# randomize() is wrong for them:
# - A_log: A = -exp(A_log) is the per-head decay rate. N(0, 0.35) would be survivable, but we
#   want the spread transformers' init gives (A_log = log(1..heads)): |A| log-uniform in [1, 8],
#   so with dt in ~[0.008, 0.55] some heads forget within a few tokens and some (small dt x |A|)
#   carry state across chunk boundaries and from the prefill into decode.
# - dt_bias: dt = softplus(in_proj's dt row + dt_bias). transformers' mixer clamps dt at
#   time_step_min (0.001) in the chunked prefill scan but NOT in the one-token decode step
#   (mamba2_selective_state_update has no clamp), so a dt near or below 0.001 would make the
#   two paths of the very same model disagree. dt_bias is therefore drawn so that
#   softplus(dt_bias) is log-uniform in [0.01, 0.5], and the dt rows of in_proj are drawn with
#   a small std (DT_ROW_STD: about 0.25 in dt before the softplus, the input being
#   RMS-normalised) so that softplus(dt) stays well above 0.001 for every token;
#   write_unit checks the minimum over all prompts and generated tokens (MIN_DT).
# - D (the skip connection x * D): around 1 as in real models, but not exactly 1 (1 + 0.35 N),
#   so a loader that leaves it at 1 or 0 changes tokens.
# - norm_f.weight (the final norm, which randomize() does not recognise as a norm by name) and
#   mixer.norm.weight (the gated group RMSNorm): gains around 1, like every other norm.
# conv1d (std 0.35 over 4 taps, bias 0.5 N) and everything else keep randomize()'s draws.
# Checked on seed 32: all activations finite; the residual stream's RMS grows to ~20-70 (the
# relu2 MLPs square std-0.35 projections) while every block still matters: skipping any one
# block changes 163-251 of the 256 golden tokens, and so does setting D to 1, A_log to
# log(1..8), dt_bias to 0, the conv bias to 0, the gated norm's gains to 1 or its groups to one,
# or swapping the two B groups; a chunk size of 4 or 128 instead of 16 changes none (the scan's
# result does not depend on it), nor does dropping the dt clamp (no dt is near it).
DT_RANGE = (0.01, 0.5)
DT_ROW_STD = 0.25 / 8  # hidden 64: 0.25 / sqrt(64)
MIN_DT = 0.003  # 3 x time_step_min


def nemotron_h_param(name: str, p: torch.nn.Parameter, std: float, gen: torch.Generator, cfg) -> torch.Tensor | None:
    if name.endswith("mixer.A_log"):
        u = torch.rand(p.shape, generator=gen, dtype=torch.float64)
        return u * math.log(8.0)  # |A| = exp(A_log), log-uniform in [1, 8]
    if name.endswith("mixer.dt_bias"):
        lo, hi = math.log(DT_RANGE[0]), math.log(DT_RANGE[1])
        dt = torch.exp(lo + (hi - lo) * torch.rand(p.shape, generator=gen, dtype=torch.float64))
        return dt + torch.log(-torch.expm1(-dt))  # inverse softplus: softplus(dt_bias) = dt
    if name.endswith("mixer.D"):
        return 1.0 + std * torch.randn(p.shape, generator=gen)
    if name.endswith("norm_f.weight"):
        return 1.0 + 0.2 * torch.randn(p.shape, generator=gen)
    if name.endswith("mixer.in_proj.weight"):
        w = std * torch.randn(p.shape, generator=gen)
        d_inner = cfg.mamba_num_heads * cfg.mamba_head_dim
        dt0 = d_inner + d_inner + 2 * cfg.n_groups * cfg.ssm_state_size  # rows: z | x B C | dt
        assert p.shape[0] == dt0 + cfg.mamba_num_heads, (name, p.shape)
        w[dt0:] *= DT_ROW_STD / std
        return w
    return None


# unit name -> (model class, config factory, save dtype, save kwargs, weight std, optional per-parameter
# draw (see randomize), seed, description); the prompt seed is 1000 + seed.
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
    "tiny-nemotron-h": dict(
        cls=NemotronHForCausalLM,
        config=nemotron_h_config,
        dtype=torch.float32,
        save={"max_shard_size": "1GB"},
        std=0.35,
        param=nemotron_h_param,
        # chosen over seeds 1-60: min top-2 margin 1.98e-2, 19-24 distinct tokens per output,
        # min Mamba dt 7.8e-3 (the next best margins: seed 9 9.9e-3, seed 15 9.5e-3)
        seed=32,
        description="Random-weight NemotronHForCausalLM hybrid, layers M-M*-M*- (3 Mamba-2 mixers: 8 heads x 16, "
        "2 B/C groups, state 16, conv 4 with bias, gated group RMSNorm, SSM chunk 16 so prompts cross chunk "
        "boundaries in the prefill scan; 2 attention layers without RoPE, GQA 4/2, head_dim 16; 3 relu2 MLPs), "
        "untied, two EOS ids, float32, one safetensors file (backbone.* names). The KV pool holds the 2 attention "
        "layers' K/V only; the Mamba conv and SSM states are per sequence. Made by scripts/make-tiny-checkpoints.py.",
    ),
}


def randomize(model: torch.nn.Module, std: float, seed: int, param=None) -> None:
    """Re-draw every parameter from a private generator, in sorted name order, so the result
    depends only on the seed (not on transformers' init order). `param(name, p, std, gen,
    config)` may return a unit's own draw for a parameter (None: the default below)."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in sorted(model.named_parameters(), key=lambda kv: kv[0]):
            special = param(name, p, std, gen, model.config) if param is not None else None
            if special is not None:
                vals = special
            elif name.endswith("norm.weight"):
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


def greedy_stats(model_dir: Path, prompts: list[dict]) -> tuple[float, list[int], float | None]:
    """Greedy f32 decode (full recompute, deliberately independent of the oracle's cached
    loop) -> (min top-2 margin, distinct tokens per output, min Mamba dt or None). The last is
    the smallest softplus(dt + dt_bias) of any Mamba-2 mixer over every prompt and generated
    token (None for a model without one), measured before the prefill scan's clamp."""
    import torch.nn.functional as F
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    model.eval()
    dts: list[float] = []

    def watch(mixer):
        def hook(_module, _inputs, out):
            dt = F.softplus(out[..., -mixer.num_heads:] + mixer.dt_bias)
            dts.append(float(dt.min()))
        return hook

    mixers = [m for m in model.modules() if hasattr(m, "dt_bias") and hasattr(m, "in_proj")]
    for m in mixers:
        m.in_proj.register_forward_hook(watch(m))
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
    return min_margin, distinct, (min(dts) if mixers else None)


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
    randomize(model, spec["std"], spec["seed"], spec.get("param"))
    model = model.to(spec["dtype"])
    model.save_pretrained(model_dir, **spec["save"])
    # generation_config.json is not part of the contract (EOS comes from config.json).
    (model_dir / "generation_config.json").unlink(missing_ok=True)

    prompts = make_prompts(config.vocab_size, 1000 + spec["seed"])
    # One prompt per line: readable diffs, still plain JSON.
    lines = ",\n".join("  " + json.dumps(p) for p in prompts)
    (unit_dir / "prompts.json").write_text('{"schema": 1, "prompts": [\n' + lines + "\n]}\n")
    (unit_dir / "unit.toml").write_text(unit_toml(name, spec["description"]))

    margin, distinct, min_dt = greedy_stats(model_dir, prompts)
    size = sum(f.stat().st_size for f in model_dir.iterdir())
    files = sorted(f.name for f in model_dir.iterdir())
    print(
        f"{name}: {size / 1e6:.2f} MB in {files}; min top-2 margin {margin:.4g}; "
        f"distinct tokens per 32-token output {distinct}"
        + ("" if min_dt is None else f"; min Mamba dt {min_dt:.4g}"),
        file=sys.stderr,
    )
    ok = True
    if min_dt is not None and min_dt < MIN_DT:
        print(f"  FAIL {name}: a Mamba dt of {min_dt:.3g} < {MIN_DT}: the prefill scan (clamped at "
              "time_step_min) and the decode step (not clamped) could disagree; fix: change dt_bias or the seed",
              file=sys.stderr)
        ok = False
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
