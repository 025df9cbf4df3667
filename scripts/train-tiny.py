#!/usr/bin/env python3
"""Trains goldens/tiny-trained (a small byte-level Llama with sharp logits), or with
--arch nemotron-h goldens/tiny-trained-h (the same for the Nemotron-H hybrid).

Random-weight models have nearly flat logits, so a bf16 engine and a bf16 oracle diverge at
near-ties that say nothing about either. A model trained even briefly on real text has large
top-2 gaps, so its greedy tokens must agree exactly across correct implementations.

    python3 scripts/train-tiny.py --out goldens/tiny-trained [--minutes 8] [--seed 0]
    python3 scripts/train-tiny.py --arch nemotron-h --out goldens/tiny-trained-h --minutes 2

Corpus: the Python standard library's own .py sources (whatever interpreter runs this script;
the corpus is named in the model's TRAINING.md), as bytes; the vocabulary is the 256 byte values,
so no tokenizer is needed anywhere. Deterministic for a given corpus, seed and step count
(torch.use_deterministic_algorithms); the step count is bounded by --minutes and --max-steps.
Writes the model with save_pretrained (float32, one file) and prompts.json: byte prompts taken
from held-out files.
"""
import argparse
import glob
import json
import os
import random
import sys
import sysconfig
import time


def corpus(seed):
    root = sysconfig.get_paths()["stdlib"]
    files = sorted(glob.glob(os.path.join(root, "*.py")))
    rng = random.Random(seed)
    rng.shuffle(files)
    held_out = files[:8]
    train = files[8:]
    data = b"".join(open(f, "rb").read() for f in train)
    return root, train, held_out, data


def nemotron_h_config():
    """A byte-level Nemotron-H with every block kind: M-M*-M-M*- (Mamba-2 mixers of 8 heads x 32,
    2 groups, state 32, conv 4; attention 4/2 x 32 without RoPE; relu2 MLPs of 384)."""
    from transformers import NemotronHConfig

    pattern = "M-M*-M-M*-"
    kinds = {"M": "linear_attention", "*": "full_attention", "-": "mlp"}
    return NemotronHConfig(
        vocab_size=256,
        hidden_size=128,
        layers_block_type=[kinds[c] for c in pattern],
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=32,
        intermediate_size=384,
        mlp_hidden_act="relu2",
        mamba_num_heads=8,
        mamba_head_dim=32,
        n_groups=2,
        ssm_state_size=32,
        conv_kernel=4,
        chunk_size=64,
        max_position_embeddings=1024,
        layer_norm_epsilon=1e-5,
        tie_word_embeddings=False,
        bos_token_id=None,
        eos_token_id=0,  # NUL never occurs in the corpus, so generation never stops early
        pad_token_id=None,
        num_logits_to_keep=1,
    )


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True)
    ap.add_argument("--minutes", type=float, default=8.0)
    ap.add_argument("--max-steps", type=int, default=100000)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--device", default=None)
    ap.add_argument("--arch", choices=["llama", "nemotron-h"], default="llama")
    a = ap.parse_args()

    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(a.seed)
    device = a.device or ("cuda" if torch.cuda.is_available() else "cpu")
    root, train, held_out, data = corpus(a.seed)
    print(f"corpus: {len(train)} files, {len(data) / 1e6:.1f} MB from {root}", file=sys.stderr)
    cfg = nemotron_h_config() if a.arch == "nemotron-h" else LlamaConfig(
        vocab_size=256,
        hidden_size=128,
        intermediate_size=384,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=32,
        max_position_embeddings=1024,
        rms_norm_eps=1e-5,
        rope_theta=10000.0,
        tie_word_embeddings=False,
        bos_token_id=None,
        eos_token_id=0,  # NUL never occurs in the corpus, so generation never stops early
        pad_token_id=None,
    )
    if a.arch == "nemotron-h":
        from transformers import NemotronHForCausalLM as Model
    else:
        Model = LlamaForCausalLM
    model = Model(cfg).to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3, betas=(0.9, 0.95), weight_decay=0.01)
    buf = torch.tensor(list(data), dtype=torch.long)
    seq, batch = 256, 32
    g = torch.Generator().manual_seed(a.seed)
    started = time.time()
    step, loss_ema = 0, None
    while step < a.max_steps and time.time() - started < a.minutes * 60:
        idx = torch.randint(0, len(buf) - seq - 1, (batch,), generator=g)
        x = torch.stack([buf[i:i + seq] for i in idx]).to(device)
        out = model(input_ids=x, labels=x)
        opt.zero_grad(set_to_none=True)
        out.loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        # Cosine-free schedule: constant after a short warm-up, decayed in the last 20%.
        frac = (time.time() - started) / (a.minutes * 60)
        for pg in opt.param_groups:
            pg["lr"] = 3e-3 * min(1.0, (step + 1) / 50) * (1.0 if frac < 0.8 else max(0.1, (1 - frac) / 0.2))
        opt.step()
        step += 1
        loss_ema = out.loss.item() if loss_ema is None else 0.98 * loss_ema + 0.02 * out.loss.item()
        if step % 50 == 0:
            print(f"step {step}: loss {loss_ema:.3f} nats/byte, {time.time() - started:.0f} s", file=sys.stderr)
    model = model.to("cpu").float().eval()
    mdir = os.path.join(a.out, "model")
    os.makedirs(mdir, exist_ok=True)
    model.save_pretrained(mdir, safe_serialization=True)
    # Prompts: byte strings from held-out files, of mixed lengths (1 token to ~600).
    rng = random.Random(a.seed + 1)
    prompts = []
    lengths = [1, 7, 16, 33, 64, 120, 250, 600]
    for k, n in enumerate(lengths):
        text = open(held_out[k % len(held_out)], "rb").read()
        start = rng.randrange(0, max(1, len(text) - n))
        prompts.append({"id": f"p{k}", "tokens": list(text[start:start + n])})
    with open(os.path.join(a.out, "prompts.json"), "w") as f:
        json.dump({"schema": 1, "prompts": prompts}, f, indent=1)
    with open(os.path.join(a.out, "TRAINING.md"), "w") as f:
        f.write(
            f"# {os.path.basename(os.path.normpath(a.out))}\n\nA byte-level {cfg.architectures[0] if cfg.architectures else type(model).__name__} "
            f"({sum(p.numel() for p in model.parameters())} parameters) trained by "
            f"`scripts/train-tiny.py --arch {a.arch} --seed {a.seed} --minutes {a.minutes}` on "
            f"{device} for {step} steps of {batch}x{seq} bytes; final loss {loss_ema:.3f} nats/byte.\n\n"
            f"Corpus: {len(train)} .py files of the Python {sys.version.split()[0]} standard library "
            f"({root}); prompts come from {len(held_out)} held-out files.\n"
        )
    print(f"saved {mdir} after {step} steps, loss {loss_ema:.3f}", file=sys.stderr)


if __name__ == "__main__":
    main()
