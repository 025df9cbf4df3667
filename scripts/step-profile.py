#!/usr/bin/env python3
"""One decode step's kernels, each timed alone, from Nsight Compute's raw CSV (scripts/step-profile.sh
makes it): the last complete step (an `embed_gather` through the step's argmax), its kernels grouped
by name and bytes read, each group's calls, microseconds, DRAM read rate and share of the step, and
what those bytes take at the copy rate.

    step-profile.py NCU_CSV [--copy-tbs 4.26]

ncu serialises the kernels it profiles, so these are the kernels alone: launch, ramp and drain
included, no overlap with their neighbours. The step in its CUDA graph (ENGINE_PROFILE=step) is
faster by what programmatic dependent launch overlaps; the difference is that overlap."""
import argparse
import csv
import io
import sys

NAME, TIME, READ = "Kernel Name", "gpu__time_duration.sum", "dram__bytes_read.sum"
# ncu writes its units as "ns" or "nsecond", "byte" or "Kbyte", depending on version and options.
TIME_UNITS = {"ns": 1e-3, "nsecond": 1e-3, "us": 1.0, "usecond": 1.0, "ms": 1e3, "msecond": 1e3,
              "s": 1e6, "second": 1e6}
BYTE_UNITS = {"byte": 1.0, "Kbyte": 1e3, "KB": 1e3, "Mbyte": 1e6, "MB": 1e6, "Gbyte": 1e9, "GB": 1e9}
STEP_START = "embed_gather"
STEP_ENDS = ("argmax_final", "argmax_rows")


def kernels(text):
    """(name, microseconds, bytes read) of every profiled kernel, in launch order. The CSV may be
    interleaved with ncu's ==PROF== lines and the program's own output: the table starts at the
    header that names the kernel, and its second row gives the units."""
    rows = list(csv.reader(io.StringIO(text)))
    at = next((i for i, r in enumerate(rows) if NAME in r and TIME in r and READ in r), None)
    if at is None:
        raise ValueError(f"no ncu table with the columns {NAME!r}, {TIME!r} and {READ!r}: "
                         "profile with --csv --page raw --metrics " + f"{TIME},{READ}")
    head, units = rows[at], rows[at + 1]
    n, t, b = head.index(NAME), head.index(TIME), head.index(READ)
    try:
        tu, bu = TIME_UNITS[units[t]], BYTE_UNITS[units[b]]
    except KeyError as e:
        raise ValueError(f"unknown unit {e} in the units row {units[t]!r}, {units[b]!r}") from None
    num = lambda s: float(s.replace(",", ""))
    # Rows of another width are the program's own output, between ncu's rows.
    return [(r[n].split("(")[0], num(r[t]) * tu, num(r[b]) * bu)
            for r in rows[at + 2:] if len(r) == len(head)]


def last_step(ks):
    """The kernels of the last complete decode step: from an embed_gather to the first argmax
    after it."""
    starts = [i for i, k in enumerate(ks) if k[0] == STEP_START]
    for s in reversed(starts):
        end = next((j for j in range(s + 1, len(ks)) if ks[j][0] in STEP_ENDS), None)
        if end is not None and not any(k[0] == STEP_START for k in ks[s + 1:end]):
            return ks[s:end + 1]
    raise ValueError("no complete decode step (embed_gather ... argmax) among the profiled kernels: "
                     "profile more launches (ncu --launch-count)")


def table(step, copy_tbs=None):
    """Markdown: one row per (kernel, bytes read), the costliest first, and the step's totals."""
    groups = {}  # (name, first bytes) -> [calls, us, bytes]; one matrix shape a group
    for name, us, by in step:
        key = next((k for k, g in groups.items()
                    if k[0] == name and abs(g[2] / g[0] - by) <= max(0.01 * by, 1e6)), (name, by))
        g = groups.setdefault(key, [0, 0.0, 0.0])
        g[0] += 1
        g[1] += us
        g[2] += by
    total_us = sum(us for _, us, _ in step)
    total_by = sum(by for _, _, by in step)
    lines = ["| kernel | MB read each | calls | us each | us in the step | TB/s | share |",
             "| --- | --- | --- | --- | --- | --- | --- |"]
    for (name, _), (calls, us, by) in sorted(groups.items(), key=lambda kv: -kv[1][1]):
        rate = by / us / 1e6 if us else 0.0
        lines.append(f"| {name} | {by / calls / 1e6:.1f} | {calls} | {us / calls:.2f} | {us:.1f} | "
                     f"{rate:.2f} | {100 * us / total_us:.1f}% |")
    lines.append(f"\nstep: {len(step)} kernels, {total_us / 1e3:.3f} ms alone, "
                 f"{total_by / 1e6:.1f} MB read")
    if copy_tbs:
        lines.append(f"those bytes at the copy rate ({copy_tbs} TB/s): "
                     f"{total_by / (copy_tbs * 1e12) * 1e3:.3f} ms")
    return "\n".join(lines)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("csv")
    ap.add_argument("--copy-tbs", type=float, help="the device's copy rate, TB/s (engine bench prints it)")
    a = ap.parse_args()
    try:
        print(table(last_step(kernels(open(a.csv, encoding="utf-8", errors="replace").read())), a.copy_tbs))
    except (OSError, ValueError) as e:
        sys.exit(f"step-profile.py: {a.csv}: {e}")


if __name__ == "__main__":
    main()
