#!/usr/bin/env bash
# One decode step of a model, kernel by kernel, on the GPU box: each kernel of the step timed
# alone by Nsight Compute (ncu serialises them) beside the step's own time in its CUDA graph
# (ENGINE_PROFILE=step), so the difference is what programmatic dependent launch overlaps and
# each kernel's rate says how far it is from the copy rate (docs/ENGINE.md, session 14).
#   scripts/step-profile.sh MODEL_DIR [ENGINE (default target/release/engine)] [OUT (default step-profile)]
# Batch 1, a 16-token prompt; OUT/ncu.csv keeps ncu's raw table. Leaves the clocks alone
# (--clock-control none). Needs ncu (Nsight Compute) on PATH or in /usr/local/cuda/bin.
set -uo pipefail
cd "$(dirname "$0")/.."
model=${1:?usage: scripts/step-profile.sh MODEL_DIR [ENGINE] [OUT]}
engine=${2:-target/release/engine}
out=${3:-step-profile}
ncu=$(command -v ncu || echo /usr/local/cuda/bin/ncu)
[ -x "$ncu" ] || { echo "step-profile.sh: ncu not found (Nsight Compute)" >&2; exit 2; }
[ -f "$model/config.json" ] || { echo "step-profile.sh: $model has no config.json" >&2; exit 2; }
mkdir -p "$out"
prompt=1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16
gen() { "$engine" generate --model "$model" --device cuda:0 --prompt "$prompt" --ignore-eos "$@"; }
# A first run fills the kernel, GEMV, GEMM and step-path caches, so the profiled run times no tuning.
gen --max-tokens 8 >/dev/null 2>"$out/warm.log" || { tail -3 "$out/warm.log" >&2; exit 1; }
ENGINE_PROFILE=step gen --max-tokens 64 2>&1 >/dev/null | grep "step profile"
# Prefill and three decode steps; NCU_LAUNCHES (default 1000) must cover prefill's kernels and
# two steps' (a Nemotron-H step is 184). The table comes on stdout, between the program's lines.
"$ncu" --clock-control none --graph-profiling node --csv --page raw \
    --metrics gpu__time_duration.sum,dram__bytes_read.sum \
    -k regex:'gemv|attention|rmsnorm|argmax|embed|mamba|relu2|swiglu' --launch-count "${NCU_LAUNCHES:-1000}" \
    "$engine" generate --model "$model" --device cuda:0 --prompt "$prompt" --max-tokens 4 --ignore-eos \
    >"$out/ncu.csv" 2>"$out/ncu.err" || { tail -5 "$out/ncu.err" >&2; exit 1; }
python3 scripts/step-profile.py "$out/ncu.csv"
