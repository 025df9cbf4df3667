#!/usr/bin/env python3
"""A unit's prompts.json: seeded random token ids of mixed lengths, in a model's vocabulary.

    python3 scripts/make-prompts.py --model llama-3.2-1b --out goldens/llama-3.2-1b/prompts.json

The model's config comes from scripts/make-checkpoint.py (the same names). Ids are drawn
uniformly from the ordinary tokens: 0 up to (not including) the lowest of vocab_size,
bos_token_id and the eos ids, which for Llama 3 (specials from 128000) and Qwen2.5 (specials from
151643; ids above 151664 are padding rows) leaves out every special and reserved id. The stream
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


def ordinary_limit(cfg):
    eos = cfg.get("eos_token_id")
    eos = eos if isinstance(eos, list) else [eos]
    ids = [cfg["vocab_size"], cfg.get("bos_token_id")] + eos
    return min(i for i in ids if isinstance(i, int) and i > 0)


def prompts(cfg, model, seed, lengths):
    limit = ordinary_limit(cfg)
    rng = random.Random(int.from_bytes(hashlib.sha256(f"{seed}:{model}".encode()).digest()[:8], "little"))
    return [{"id": f"p{k}", "tokens": [rng.randrange(limit) for _ in range(n)]} for k, n in enumerate(lengths)]


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
    text = '{"schema": 1, "made_by": ' + json.dumps(made_by) + ', "ordinary_ids_below": ' + str(ordinary_limit(cfg)) + ', "prompts": [\n' + ",\n".join(lines) + "\n]}\n"
    json.loads(text)
    with open(a.out, "w") as f:
        f.write(text)
    print(f"{a.out}: {len(ps)} prompts, lengths {lengths}, ids below {ordinary_limit(cfg)}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
