#!/usr/bin/env python3
"""How far each leg's greedy tokens stay on a reference's (e.g. transformers in float32, captured
by `python -m oracle capture ... --backend transformers --dtype float32 --golden FILE`), and the
reference's own top-2 margin where each leg leaves it: a leg that leaves at a margin near 0 took
the other side of a near-tie; one that leaves where the exact model was sure is the less exact.

  scripts/reference-distance.py REFERENCE.json NAME=FILE [NAME=FILE ...]

FILE: a golden (golden.json's format) or the output of `engine generate` (`id: t1,t2,...` lines).
"""
import json
import sys


def tokens(path):
    text = open(path).read()
    if text.lstrip().startswith("{"):
        return {o["id"]: o["tokens"] for o in json.loads(text)["outputs"]}
    out = {}
    for line in text.splitlines():
        if ":" in line:
            pid, ids = line.split(":", 1)
            out[pid.strip()] = [int(t) for t in ids.split(",") if t.strip()]
    return out


def main(argv):
    if len(argv) < 2 or any("=" not in a for a in argv[1:]):
        sys.exit(__doc__)
    ref = {o["id"]: o for o in json.load(open(argv[0]))["outputs"]}
    legs = [(a.split("=", 1)[0], tokens(a.split("=", 1)[1])) for a in argv[1:]]
    total = {name: 0 for name, _ in legs}
    worst = {name: 0.0 for name, _ in legs}
    n = 0
    for pid, r in ref.items():
        want, margins = r["tokens"], r.get("margins") or []
        n += len(want)
        cells = []
        for name, got in legs:
            if pid not in got:
                sys.exit(f"{name} has no prompt {pid}")
            at = next((i for i, (a, b) in enumerate(zip(got[pid], want)) if a != b), None)
            kept = len(want) if at is None else at
            total[name] += kept
            if at is None:
                cells.append(f"{name} {kept:3d} (never leaves)")
            else:
                m = margins[at] if at < len(margins) and margins[at] is not None else float("nan")
                worst[name] = max(worst[name], m)
                cells.append(f"{name} {kept:3d} (reference margin there {m:.4f})")
        print(f"{pid}: " + ", ".join(cells))
    for name, _ in legs:
        print(f"{name}: {total[name]}/{n} tokens equal the reference before each prompt's first "
              f"divergence; the largest reference margin where it leaves: {worst[name]:.4f}")


if __name__ == "__main__":
    main(sys.argv[1:])
