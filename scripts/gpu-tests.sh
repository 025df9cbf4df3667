#!/usr/bin/env bash
# The engine's GPU tests and a CUDA smoke benchmark, on a machine with an NVIDIA GPU and no
# Rust toolchain, from binaries staged by scripts/stage-gpu.sh:
#   scripts/gpu-tests.sh [STAGED_DIR (default .gpu)] [LOG_DIR (default gpu-logs)]
set -uo pipefail
cd "$(dirname "$0")/.."
dir=${1:-.gpu}
logs=${2:-gpu-logs}
mkdir -p "$logs"
export ENGINE_REPO_ROOT=$PWD ENGINE_BIN=$PWD/$dir/engine ENGINE_REQUIRE_GPU=1 LLM_BENCH_REQUIRE_NVRTC=1
fail=0
for t in engine-lib cuda protocol load_errors golden; do
    echo "== test $t"
    if ! "$dir/test-$t" --test-threads 1 --nocapture 2>&1 | tee "$logs/test-$t.log" | grep -E "^test |test result|diverges|tokens equal|panicked"; then
        :
    fi
    grep -q "test result: ok" "$logs/test-$t.log" || { echo "FAILED: $t"; fail=1; }
done
echo "== bench tiny-llama on cuda:0"
"$dir/engine" bench --model goldens/tiny-llama/model --device cuda:0 --prompt-lens 16,64,200 \
    --ttft-len 256 --batch 4 --batch-tokens 64 --repeat 3 >"$logs/bench-tiny.json" || fail=1
exit $fail
