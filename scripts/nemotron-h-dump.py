#!/usr/bin/env python3
"""Dump a Nemotron-H (NemotronHForCausalLM) forward pass layer by layer, for debugging another
implementation against transformers.

    python3 scripts/nemotron-h-dump.py --model goldens/tiny-nemotron-h/model --tokens 1,2,3
    python3 scripts/nemotron-h-dump.py --model DIR --prompts goldens/tiny-nemotron-h/prompts.json --id p4 \\
        --decode 8 --out dump.json

Full recompute (one forward pass over all the tokens, no cache), float32 by default, on the CPU
by default. For the LAST position it prints:
  - `embed`: the embedding row (the first block's input),
  - per block i (M Mamba-2 mixer, * attention, - MLP, E MoE): the hidden state after the block's
    residual add, i.e. h_i = h_{i-1} + mixer(norm(h_{i-1})), with its RMS, max |x| and the first
    --show values,
  - `norm_f`: the final RMSNorm's output (the lm_head's input),
  - the top-5 logits (id, logit).
The block outputs are taken by forward hooks on model.model.layers[i], not from
`output_hidden_states`: in transformers 5.17 that tuple's last entry is the output of norm_f,
not of the last block.

--decode N then runs N greedy steps the way a server does: one prefill pass over the tokens
with a cache (step 0, path "prefill"), then one token per pass over the cache (path "decode",
Mamba's one-token recurrent update instead of the chunked scan); for each step it prints the
token taken, the top-2 margin (top-1 minus top-2 logit), the runner-up, and the largest
|logit difference| against a full recompute of the same step (prompt + tokens so far, no cache).

--out FILE writes everything as JSON instead, with the full last-position vectors (embed, each
block's hidden state, norm_f) as lists of floats in place of the summaries.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

KIND_LETTER = {"linear_attention": "M", "full_attention": "*", "mlp": "-", "moe": "E"}


def parse_tokens(a) -> list[int]:
    if a.tokens is not None:
        try:
            toks = [int(t) for t in a.tokens.split(",") if t.strip()]
        except ValueError:
            sys.exit(f"--tokens {a.tokens!r}: expected comma-separated integers, e.g. 1,2,3")
    else:
        prompts = json.loads(Path(a.prompts).read_text())["prompts"]
        match = [p for p in prompts if p["id"] == a.id]
        if not match:
            sys.exit(f"{a.prompts} has no prompt with id {a.id!r} (ids: {[p['id'] for p in prompts]})")
        toks = list(match[0]["tokens"])
    if not toks:
        sys.exit("no tokens given")
    return toks


def summary(v, show: int) -> dict:
    return {
        "rms": float(v.pow(2).mean().sqrt()),
        "max_abs": float(v.abs().max()),
        "sum": float(v.sum()),
        "head": [round(float(x), 6) for x in v[:show]],
    }


def top_k(logits, k: int) -> list[list]:
    vals, ids = logits.topk(k)
    return [[int(i), float(v)] for v, i in zip(vals, ids)]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", required=True, help="checkpoint directory (config.json + safetensors)")
    src = ap.add_mutually_exclusive_group(required=True)
    src.add_argument("--tokens", help="comma-separated token ids, e.g. 1,2,3")
    src.add_argument("--prompts", help="a unit's prompts.json (with --id)")
    ap.add_argument("--id", help="the prompt id in --prompts, e.g. p4")
    ap.add_argument("--decode", type=int, default=0, metavar="N", help="also run N greedy steps with the cache")
    ap.add_argument("--out", help="write JSON (full vectors) to this file instead of printing summaries")
    ap.add_argument("--show", type=int, default=8, help="values of each vector printed (default 8)")
    ap.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"])
    ap.add_argument("--device", default="cpu", help="cpu (default) or cuda[:N]")
    a = ap.parse_args()
    if a.prompts and not a.id:
        ap.error("--prompts needs --id")
    tokens = parse_tokens(a)

    import torch
    import transformers
    from transformers import AutoModelForCausalLM

    transformers.logging.set_verbosity_error()
    device = torch.device(a.device)
    model = AutoModelForCausalLM.from_pretrained(a.model, dtype=getattr(torch, a.dtype)).to(device).eval()
    cfg = model.config
    if cfg.model_type != "nemotron_h":
        print(f"note: model_type is {cfg.model_type!r}, not 'nemotron_h'; dumping its layers anyway",
              file=sys.stderr)
    vocab = cfg.vocab_size
    bad = [t for t in tokens if not 0 <= t < vocab]
    if bad:
        sys.exit(f"token ids {bad} are outside the vocabulary (0..{vocab - 1})")
    base = model.model
    layers = list(base.layers)
    kinds = [getattr(l, "block_type", "?") for l in layers]

    captured: dict[str, object] = {}

    def keep(key):
        def hook(_module, _inputs, out):
            t = out[0] if isinstance(out, tuple) else out
            captured[key] = t[0, -1].detach().float().cpu()
        return hook

    handles = [base.embeddings.register_forward_hook(keep("embed")),
               base.norm_f.register_forward_hook(keep("norm_f"))]
    handles += [l.register_forward_hook(keep(f"layer{i}")) for i, l in enumerate(layers)]
    with torch.inference_mode():
        logits = model(torch.tensor([tokens], device=device), use_cache=False).logits[0, -1].float().cpu()
    for h in handles:
        h.remove()

    pattern = "".join(KIND_LETTER.get(k, "?") for k in kinds)
    doc = {
        "model": str(a.model),
        "dtype": a.dtype,
        "device": str(device),
        "versions": {"torch": torch.__version__, "transformers": transformers.__version__},
        "pattern": pattern,
        "tokens": tokens,
        "position": len(tokens) - 1,
        "embed": captured["embed"],
        "layers": [{"index": i, "kind": k, "hidden": captured[f"layer{i}"]} for i, k in enumerate(kinds)],
        "norm_f": captured["norm_f"],
        "top5": top_k(logits, 5),
    }

    if a.decode > 0:
        steps = []
        with torch.inference_mode():
            out = model(input_ids=torch.tensor([tokens], device=device), use_cache=True, logits_to_keep=1)
            cache, ids = out.past_key_values, list(tokens)
            for step in range(a.decode):
                row = out.logits[0, -1].float().cpu()
                ref = model(torch.tensor([ids], device=device), use_cache=False,
                            logits_to_keep=1).logits[0, -1].float().cpu()
                top = row.topk(2)
                tok = int(row.argmax())
                runner = [int(i) for i in top.indices]
                steps.append({
                    "step": step,
                    "path": "prefill" if step == 0 else "decode",
                    "token": tok,
                    "margin": float(top.values[0] - top.values[1]),
                    "runner_up": runner[1] if runner[0] == tok else runner[0],
                    "recompute_token": int(ref.argmax()),
                    "max_abs_diff_vs_recompute": float((row - ref).abs().max()),
                })
                ids.append(tok)
                if step + 1 < a.decode:
                    out = model(input_ids=torch.tensor([[tok]], device=device), past_key_values=cache,
                                use_cache=True, logits_to_keep=1)
                    cache = out.past_key_values
        doc["decode"] = steps

    if a.out:
        full = dict(doc)
        full["embed"] = doc["embed"].tolist()
        full["norm_f"] = doc["norm_f"].tolist()
        full["layers"] = [{**l, "hidden": l["hidden"].tolist()} for l in doc["layers"]]
        Path(a.out).write_text(json.dumps(full, indent=1) + "\n")
        print(f"wrote {a.out}", file=sys.stderr)
        return 0

    print(f"model {a.model}  pattern {pattern}  {a.dtype} {device}  "
          f"{len(tokens)} tokens, last position {len(tokens) - 1}")

    def line(name, v):
        s = summary(v, a.show)
        head = " ".join(f"{x:+.6f}" for x in s["head"])
        print(f"{name:<21} rms {s['rms']:<11.6g} max|x| {s['max_abs']:<11.6g} [{head} ...]")

    line("embed", doc["embed"])
    for l in doc["layers"]:
        line(f"{l['index']:>2} {KIND_LETTER.get(l['kind'], '?')} {l['kind']}", l["hidden"])
    line("norm_f", doc["norm_f"])
    print("top5 " + "  ".join(f"{i}:{v:.6f}" for i, v in doc["top5"]))
    for s in doc.get("decode", []):
        flag = "" if s["token"] == s["recompute_token"] else f"  MISMATCH recompute {s['recompute_token']}"
        print(f"step {s['step']:>3} {s['path']:<7} token {s['token']:<7} margin {s['margin']:<10.6f} "
              f"runner-up {s['runner_up']:<7} |diff vs recompute| {s['max_abs_diff_vs_recompute']:.3g}{flag}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
