#!/usr/bin/env bash
# One GPU-box session of evidence, from the repo root, with binaries staged in .gpu/
# (scripts/stage-gpu.sh) and vLLM unpacked into /tmp/site (../shared/gpu-box/README.md):
#   scripts/gpu-session.sh OUTDIR
# 1. trains goldens/tiny-trained and captures its goldens with vLLM and transformers in bf16;
# 2. runs the engine's GPU tests (the trained unit's bf16 golden must match exactly);
# 3. makes the Llama-3.2-1B-config random checkpoint and benchmarks our engine against vLLM on the
#    same prompts: CUDA graphs on (multi-process and in-process engine core) and eager.
# Everything it writes goes under OUTDIR; it prints a short summary last.
set -uo pipefail
cd "$(dirname "$0")/.."
out=${1:?OUTDIR}
mkdir -p "$out"
export PYTHONPATH=/tmp/site:$PWD VLLM_USE_FLASHINFER_SAMPLER=0 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 \
    VLLM_NO_USAGE_STATS=1 PYTHONUNBUFFERED=1
log() { echo "== $(date +%T) $*"; }

log "train tiny-trained"
[ -f goldens/tiny-trained/model/model.safetensors ] ||
    python3 scripts/train-tiny.py --out goldens/tiny-trained --max-steps 6000 --minutes 2 2>&1 |
    grep -E "corpus|step (2000|4000|6000)|saved" || true
log "capture: vLLM bf16 (the oracle's golden)"
python3 -m oracle capture --unit goldens/tiny-trained/unit.toml >"$out/capture-vllm.log" 2>&1 ||
    tail -5 "$out/capture-vllm.log"
sed -e 's/^backend = "vllm"/backend = "transformers"/' -e '/^\[oracle.options\]/,$d' \
    goldens/tiny-trained/unit.toml >goldens/tiny-trained/unit-transformers.toml
log "capture: transformers bf16 on the GPU (cross-check)"
python3 -m oracle capture --unit goldens/tiny-trained/unit-transformers.toml \
    --golden goldens/tiny-trained/golden-cuda-bf16-transformers.json >"$out/capture-hf.log" 2>&1 ||
    tail -5 "$out/capture-hf.log"
rm -f goldens/tiny-trained/unit-transformers.toml

log "engine GPU tests"
ENGINE_REPO_ROOT=$PWD ENGINE_BIN=$PWD/.gpu/engine ENGINE_REQUIRE_GPU=1 \
    .gpu/test-cuda --test-threads 1 --nocapture >"$out/test-cuda.log" 2>&1
grep -E "diverges|tokens equal|test result|panicked" "$out/test-cuda.log"

ck=/tmp/ckpt/llama-3.2-1b
log "1B checkpoint"
python3 scripts/make-checkpoint.py --model llama-3.2-1b --out $ck 2>&1 | tail -1
log "engine bench 1B"
.gpu/engine bench --model $ck --device cuda:0 >"$out/engine-1b.json" 2>"$out/engine-1b.err"
tail -1 "$out/engine-1b.err"
vopts=(--dtype bfloat16 --gpu-memory-utilization 0.5 --max-model-len 4096 --max-num-seqs 8 --seed 0)
for mode in graphs-mp graphs-inproc eager-inproc; do
    log "vLLM 1B: $mode"
    extra=()
    envs=()
    # Explicit both ways: the oracle's own default is in-process (docs/ORACLE.md).
    case $mode in
        *inproc) envs=(VLLM_ENABLE_V1_MULTIPROCESSING=0) ;;
        *mp) envs=(VLLM_ENABLE_V1_MULTIPROCESSING=1) ;;
    esac
    case $mode in eager*) extra=(--enforce-eager) ;; esac
    env "${envs[@]}" timeout 400 python3 scripts/oracle-bench.py --model $ck --label "$mode" \
        --log "$out/vllm-1b-$mode.log" --tokens-out "$out/vllm-1b-$mode.tokens.json" \
        --prompts-out /tmp/prompts-1b.json -- "${vopts[@]}" "${extra[@]}" >"$out/vllm-1b-$mode.json" ||
        tail -5 "$out/vllm-1b-$mode.log"
done
log "engine tokens on the same prompts"
.gpu/engine generate --model $ck --device cuda:0 --prompts /tmp/prompts-1b.json --max-tokens 32 \
    --ignore-eos >"$out/engine-1b.tokens.txt" 2>/dev/null
python3 - "$out" <<'PY'
import json, sys, glob, os
out = sys.argv[1]
eng = json.load(open(f"{out}/engine-1b.json"))
print(f"engine: {eng['per_output_token_s']*1e3:.3f} ms/token, ttft {eng['ttft_s']*1e3:.2f} ms, "
      f"b8 {eng['batch_throughput_tok_s']:.0f} tok/s, load {eng['load_s']:.2f} s, floor {eng.get('floor_s',0)*1e3:.3f} ms "
      f"({eng.get('fraction_of_floor',0)*100:.0f}%)")
ours = [list(map(int, l.split(": ")[1].split(","))) for l in open(f"{out}/engine-1b.tokens.txt")]
for f in sorted(glob.glob(f"{out}/vllm-1b-*.json")):
    if f.endswith(".tokens.json"):
        continue
    try:
        v = json.load(open(f))
    except Exception as e:
        print(os.path.basename(f), "unreadable:", e); continue
    t = json.load(open(f.replace(".json", ".tokens.json")))["tokens"]
    same = sum(a == b for x, y in zip(ours, t) for a, b in zip(x, y))
    kv = v.get("kv") or {}
    print(f"{v['label']}: {v['per_output_token_s']*1e3:.3f} ms/token (by len { {k: round(x*1e3,3) for k,x in v['per_output_token_by_len_s'].items()} }), "
          f"ttft {v['ttft_s']*1e3:.2f} ms, b8 {v['batch_throughput_tok_s']:.0f} tok/s, load {v['load_s']:.1f} s, "
          f"kv {kv.get('num_blocks')}x{kv.get('block_size')}={kv.get('capacity_tokens')}; "
          f"tokens equal to ours {same}/{sum(map(len, t))}; graphs {v['features'].get('cuda_graphs')}")
PY
tar czf "$out/tiny-trained.tgz" goldens/tiny-trained
