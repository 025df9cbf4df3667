#!/usr/bin/env bash
# `engine bench` of several builds on several models, one after the other in one place, each
# line labelled: what a change gains is read against the build before it, measured beside it.
#
#   scripts/ab-bench.sh [--out DIR] [--rounds N] [--same-picks] [--ckpt DIR] MODELS BUILDS [-- BENCH_ARGS...]
#
# MODELS  comma-separated: a directory with config.json, or a scripts/make-checkpoint.py model
#         name (its random-weight checkpoint is made under --ckpt unless it is there already).
# BUILDS  comma-separated directories, each holding an `engine` binary (scripts/stage-gpu.sh's
#         .gpu, or a copy of another commit's); a build's label is its directory's name, with
#         as many parent directories as it takes to tell apart two directories of one name
#         (s44/main, s46/main: their runs are never merged as rounds of one build; one directory
#         named twice is one build, run twice, e.g. first and last to see drift). The
#         `engine` may be a two-line script that sets a switch and execs a binary, so that one
#         build's settings (ENGINE_NO_PDL, a throwaway build's experiment) run as builds of their own.
# --rounds  the builds' order is run N times over (A B A B for 2), so that drift over a call
#           shows as a difference between rounds rather than between builds (default 1).
# --same-picks  every run of a model after its first takes the first's GEMV choices
#           (ENGINE_GEMV_TUNING, docs/ENGINE.md) instead of tuning its own: a build with other
#           kernel sources tunes afresh, and near draws falling the other way move a per-token
#           figure by about 1%. The step path of batches 2-8 (the GEMVs or cuBLAS, timed at
#           load) is taken from that run too. It hides what a change to the GEMV kernels does to
#           the choices: measure such a change without it as well.
# --out   where each run's JSON and stderr go (default .gpu-run/ab-<UTC stamp>).
# --ckpt  where named checkpoints are made (default /tmp/ckpt).
# BENCH_ARGS  `engine bench`'s own options (default: --device cuda:0 --max-batch 32 --batch 8,32
#             --prompt-lens 16,1000 --repeat 3).
#
# Prints one line per run: MODEL LABEL #N: the engine's summary (per output token overall and by
# prompt length, first token, throughput by batch with its prefill and decode step, share of the
# bandwidth floor); on CUDA a second line, indented, with the kernel the load-time tuning chose
# for each GEMV shape at batch 1 and at batches 2-8 (c2: the CUDA cores at two warps per row, t4:
# the tensor cores at four per tile) and the path batches 2-8 run with its two times, and with
# --same-picks which run's they are. Then, for each model, a table of each figure as each build's
# median over its rounds, every build after the first as a ratio against it, judged by the larger
# of the two builds' spreads over their rounds (scripts/ab-summary.py; with one round there is no
# spread to judge by, and it says so).
# Exit status 1 when a run failed (the others still run), 2 on bad arguments.
set -uo pipefail
cd "$(dirname "$0")/.."

out="" rounds=1 ckpt=/tmp/ckpt same_picks=0
usage() { sed -n '2,/^set -uo/p' "$0" | sed -e '$d' -e 's/^# \{0,1\}//'; }
while [ $# -gt 0 ]; do
    case $1 in
        --out) out=${2:?--out needs a value}; shift 2 ;;
        --rounds) rounds=${2:?--rounds needs a value}; shift 2 ;;
        --same-picks) same_picks=1; shift ;;
        --ckpt) ckpt=${2:?--ckpt needs a value}; shift 2 ;;
        -h | --help) usage; exit 0 ;;
        --) break ;;
        -*) echo "ab-bench.sh: unknown option $1 (--help lists them)" >&2; exit 2 ;;
        *) break ;;
    esac
done
if [ $# -lt 2 ] || [ "$1" = -- ] || [ "$2" = -- ]; then
    echo "ab-bench.sh: needs MODELS and BUILDS (--help says what they are)" >&2
    exit 2
fi
IFS=, read -r -a models <<<"$1"
IFS=, read -r -a builds <<<"$2"
shift 2
if [ "${1:-}" = -- ]; then
    shift
    bench_args=("$@")
elif [ $# -gt 0 ]; then
    echo "ab-bench.sh: unexpected $1 (bench options go after --)" >&2
    exit 2
else
    bench_args=(--device cuda:0 --max-batch 32 --batch 8,32 --prompt-lens 16,1000 --repeat 3)
fi
case $rounds in '' | *[!0-9]* | 0) echo "ab-bench.sh: --rounds must be a positive integer, not $rounds" >&2; exit 2 ;; esac
for b in "${builds[@]}"; do
    [ -x "$b/engine" ] || { echo "ab-bench.sh: $b/engine is not an executable engine build" >&2; exit 2; }
done
# Each build's label: the last parts of its real path, one (its directory's name) unless
# another directory's label is the same, then one more for each of them until none is.
canon=() depth=() labels=()
for b in "${builds[@]}"; do canon+=("$(cd "$b" && pwd -P)") depth+=(1); done
tail_of() { awk -F/ -v d="$2" '{ s = $NF; for (i = NF - 1; i > NF - d && i > 1; i--) s = $i "/" s; print s }' <<<"$1"; }
while :; do
    for k in "${!canon[@]}"; do labels[k]=$(tail_of "${canon[k]}" "${depth[k]}"); done
    clash=()
    for ((i = 0; i < ${#canon[@]}; i++)); do
        for ((j = 0; j < i; j++)); do
            if [ "${labels[i]}" = "${labels[j]}" ] && [ "${canon[i]}" != "${canon[j]}" ]; then
                clash+=("$i" "$j")
            fi
        done
    done
    [ ${#clash[@]} = 0 ] && break
    # A path shorter than the depth asked for keeps its whole self, so distinct paths part.
    for k in $(printf '%s\n' "${clash[@]}" | sort -u); do depth[k]=$((depth[k] + 1)); done
done
out=${out:-.gpu-run/ab-$(date -u +%Y%m%dT%H%M%SZ)}
mkdir -p "$out"
runs=$out/runs.tsv
: >"$runs"

# The GEMV tuning's choices in a bench JSON, on one line; nothing where it has none (the CPU).
# With a pinned file ($2, run $3's), whether the run took its choices from it.
tuning() {
    python3 - "$@" <<'PY'
import json, sys
try:
    features = json.load(open(sys.argv[1]))["features"]
    t = features["gemv_tuning"]
    shapes = t["shapes"]
except (OSError, ValueError, KeyError, TypeError):
    sys.exit(0)
paths = features.get("step_paths") or {}
short = {"cuda_cores": "c", "tensor_cores": "t"}
k = lambda c: "".join(f"{short.get(w, w)}{n}" for w, n in c.items())
line = "  gemv (batch 1/2-8): " + ", ".join(
    f"{s['role']} {s['rows']}x{s['cols']} {k(s['batch_1'])}/{k(s['batched'])}" for s in shapes)
def whose(d):
    if len(sys.argv) <= 2:
        return ""
    if d.get("pinned") == sys.argv[2]:
        return f" (#{sys.argv[3]}'s)"
    return " (its own: this build does not read ENGINE_GEMV_TUNING)"
line += whose(t)
if isinstance(paths.get("timing"), dict):
    p = paths["timing"]
    line += (f"; batches 2-{p['batch']} on {paths['batched']} (gemv {p['gemv_ms']:.3f}, "
             f"cublas {p['blas_ms']:.3f} ms){whose(paths)}")
    for field, name in (("gemv_uncaptured", "gemv"), ("blas_uncaptured", "cublas")):
        if p.get(field):
            line += f"; the {name} step was timed without its graph: {p[field]}"
print(line)
PY
}

status=0
for model in "${models[@]}"; do
    if [ -f "$model/config.json" ]; then
        dir=$model
    else
        dir=$ckpt/$model
        if [ ! -f "$dir/config.json" ]; then
            echo "== making $dir (scripts/make-checkpoint.py --model $model)"
            if ! python3 scripts/make-checkpoint.py --model "$model" --out "$dir" >"$out/checkpoint-$model.log" 2>&1; then
                echo "ab-bench.sh: could not make $model's checkpoint; see $out/checkpoint-$model.log:" >&2
                tail -n 3 "$out/checkpoint-$model.log" >&2
                status=1
                continue
            fi
        fi
    fi
    name=$(basename "$dir")
    # goldens/<unit>/model reads as the unit.
    [ "$name" = model ] && name=$(basename "$(dirname "$dir")")
    n=0 pin="" pin_n=""
    for ((r = 1; r <= rounds; r++)); do
        for k in "${!builds[@]}"; do
            b=${builds[k]} label=${labels[k]}
            n=$((n + 1))
            file=$out/$name-${label//\//+}-$n
            pinned=()
            [ -n "$pin" ] && pinned=(env "ENGINE_GEMV_TUNING=$pin")
            if "${pinned[@]}" "$b/engine" bench --model "$dir" "${bench_args[@]}" >"$file.json" 2>"$file.err"; then
                echo "$name $label #$n: $(grep '^per output token' "$file.err")"
                printf '%s\t%s\t%s\t%s\n' "$name" "$label" "$n" "$file.json" >>"$runs"
                if [ -n "$pin" ]; then
                    tuning "$file.json" "$pin" "$pin_n"
                else
                    choices=$(tuning "$file.json")
                    [ -n "$choices" ] && echo "$choices"
                    if [ -n "$choices" ] && [ "$same_picks" = 1 ]; then
                        pin=$(realpath "$file.json") pin_n=$n
                    fi
                fi
            else
                echo "$name $label #$n: FAILED (exit $?): $(tail -n 1 "$file.err")"
                status=1
            fi
        done
    done
done
[ -s "$runs" ] && python3 scripts/ab-summary.py "$runs"
echo "== JSON and logs under $out"
exit $status
