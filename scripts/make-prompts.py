#!/usr/bin/env python3
"""A unit's prompts.json: seeded random token ids of mixed lengths, in a model's vocabulary.

    python3 scripts/make-prompts.py --model llama-3.2-1b --out goldens/llama-3.2-1b/prompts.json

The model's config comes from scripts/make-checkpoint.py (the same names). Ids are drawn
uniformly from the ordinary tokens: where the special ids (bos, eos, pad) sit at the top of the
vocabulary, 0 up to (not including) the lowest of them, which for Llama 3 (specials from 128000)
and Qwen2.5 (specials from 151643; ids above 151664 are padding rows) leaves out every special
and reserved id; where they sit at the bottom (Nemotron-H: pad 0, bos 1, eos 2), from above the
highest of them to vocab_size. The stream
is seeded by (seed, model), so the same command always writes the same bytes.
"""
import argparse
import hashlib
import importlib.util
import json
import os
import random
import sys

LENGTHS = [5, 17, 60, 130, 250, 500, 750, 1000]


def models():
    here = os.path.dirname(os.path.abspath(__file__))
    spec = importlib.util.spec_from_file_location("make_checkpoint", os.path.join(here, "make-checkpoint.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod.MODELS


def ordinary_range(cfg):
    """[lo, hi): the ids clear of every special one (module docstring)."""
    eos = cfg.get("eos_token_id")
    eos = eos if isinstance(eos, list) else [eos]
    vocab = cfg["vocab_size"]
    specials = [i for i in [cfg.get("bos_token_id"), cfg.get("pad_token_id")] + eos if isinstance(i, int)]
    if specials and max(specials) < vocab // 2:
        return max(specials) + 1, vocab
    return 0, min([vocab] + [i for i in specials if i > 0])


def prompts(cfg, model, seed, lengths):
    lo, hi = ordinary_range(cfg)
    rng = random.Random(int.from_bytes(hashlib.sha256(f"{seed}:{model}".encode()).digest()[:8], "little"))
    return [{"id": f"p{k}", "tokens": [rng.randrange(lo, hi) for _ in range(n)]} for k, n in enumerate(lengths)]


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", required=True, choices=sorted(models()))
    ap.add_argument("--out", required=True)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--lengths", default=",".join(map(str, LENGTHS)), help="comma-separated prompt lengths")
    a = ap.parse_args()
    cfg = models()[a.model][0]
    lengths = [int(x) for x in a.lengths.split(",")]
    ps = prompts(cfg, a.model, a.seed, lengths)
    made_by = f"scripts/make-prompts.py --model {a.model} --seed {a.seed} --lengths {','.join(map(str, lengths))}"
    # One prompt per line: diffs stay readable.
    lines = [f'  {json.dumps(p, separators=(", ", ": "))}' for p in ps]
    lo, hi = ordinary_range(cfg)
    # The key's name is kept for the prompts already committed; a range that does not start at
    # 0 says so in its own key.
    span = f'"ordinary_ids_below": {hi}' if lo == 0 else f'"ordinary_ids": [{lo}, {hi}]'
    text = '{"schema": 1, "made_by": ' + json.dumps(made_by) + ', ' + span + ', "prompts": [\n' + ",\n".join(lines) + "\n]}\n"
    json.loads(text)
    with open(a.out, "w") as f:
        f.write(text)
    print(f"{a.out}: {len(ps)} prompts, lengths {lengths}, ids in [{lo}, {hi})", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
