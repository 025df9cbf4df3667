#!/usr/bin/env python3
"""The closing table of scripts/ab-bench.sh: for each model, each figure of `engine bench` as
each build's median over its rounds, and every build after the first as a ratio against the
first, judged against the rounds' own spread (a difference smaller than the larger of the two
builds' spreads over their rounds is not told apart from drift).

    scripts/ab-summary.py RUNS   (RUNS: ab-bench's runs.tsv, one line per run that succeeded:
                                  model, build label, run number, its JSON)
"""

import json
import statistics
import sys


def figures(j):
    """(name, unit, value, lower is better) for each figure of one `engine bench` JSON."""
    out = [("per output token", "ms", j["per_output_token_s"] * 1e3, True)]
    for row in j.get("per_output_token_by_prompt_len", []):
        out.append((f"per output token at {row['prompt_len']}", "ms", row["median_s"] * 1e3, True))
    out.append((f"ttft({j['ttft_prompt_len']})", "ms", j["ttft_s"] * 1e3, True))
    phases = j.get("batch_phases", {})
    for b, tps in sorted(j.get("batches", {}).items(), key=lambda kv: int(kv[0])):
        out.append((f"throughput at batch {b}", "tok/s", tps, False))
        if b in phases:
            out.append((f"prefill at batch {b}", "ms", phases[b]["prefill_s"] * 1e3, True))
            out.append((f"decode step at batch {b}", "ms", phases[b]["step_s"] * 1e3, True))
    return out


def spread(values):
    """(max - min) / median over the rounds; None for one round."""
    if len(values) < 2:
        return None
    return (max(values) - min(values)) / statistics.median(values)


def num(v):
    return f"{v:.4g}" if v < 1000 else f"{v:.0f}"


def cell(values, unit):
    m = statistics.median(values)
    s = spread(values)
    return f"{num(m)} {unit}" + (f" ({len(values)} rounds, spread {s:.1%})" if s is not None else "")


def verdict(base, other, lower_better):
    """The ratio of other's median to base's, in words, judged by their spreads."""
    ratio = statistics.median(other) / statistics.median(base)
    faster = ratio < 1 if lower_better else ratio > 1
    by = max(ratio, 1 / ratio)
    words = "same" if ratio == 1 else f"{by:.3f}x {'faster' if faster else 'slower'}"
    s = [spread(base), spread(other)]
    if None in s:
        return f"{ratio:.4f}x: {words} (one round: no spread to judge it by)"
    noise = max(s)
    if abs(ratio - 1) <= noise:
        return f"{ratio:.4f}x: within the rounds' {noise:.1%} spread"
    return f"{ratio:.4f}x: {words}, beyond the rounds' {noise:.1%} spread"


def main(path):
    runs = {}  # model -> label -> [figures of each run]
    for line in open(path):
        model, label, _, file = line.rstrip("\n").split("\t")
        try:
            f = figures(json.load(open(file)))
        except OSError as e:
            print(f"ab-summary: cannot read {file} ({e.strerror}); left out", file=sys.stderr)
            continue
        except (ValueError, KeyError, TypeError) as e:
            print(f"ab-summary: {file} is not an engine bench JSON ({e!r}); left out", file=sys.stderr)
            continue
        runs.setdefault(model, {}).setdefault(label, []).append(f)
    for model, builds in runs.items():
        labels = list(builds)
        base = labels[0]
        print(f"== {model}: each build's median over its rounds"
              + (f"; against {base}" if len(labels) > 1 else ""))
        print("| figure | " + " | ".join(labels) + " |")
        print("| --- |" + " --- |" * len(labels))
        for name, unit, _, lower in builds[base][0]:
            def values(label):
                return [v for f in builds[label] for (n, _, v, _) in f if n == name]
            row = [cell(values(base), unit)]
            for label in labels[1:]:
                v = values(label)
                row.append(f"{cell(v, unit)}; {verdict(values(base), v, lower)}" if v else "-")
            print(f"| {name} | " + " | ".join(row) + " |")


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    main(sys.argv[1])
