#!/usr/bin/env bash
# The GPU runbook: on a box with an NVIDIA GPU, the project tree, vLLM and prebuilt (or built)
# binaries, run every GPU unit against vLLM and regenerate reports/BENCHMARKS.md.
#
#   scripts/gpu-run.sh [--units a,b,...] [--steps checkpoint,golden,run,report] [--out DIR]
#                      [--bin DIR] [--python PY] [--site DIR] [--legs both|engine|oracle]
#                      [--stop-after SECONDS]
#
# Per unit, in order, each step idempotent and skipped when its output exists:
#   checkpoint  goldens/<u>/model/ for a unit named after a scripts/make-checkpoint.py model
#               (random weights, real config); a fresh one is checked against
#               goldens/<u>/checkpoint.sha256, or that file is written (commit it).
#   golden      every [[golden]] file of the unit that is missing:
#               python3 -m oracle capture --unit goldens/<u>/unit.toml (vLLM, bf16, the unit's
#               [oracle] configuration, recorded in the golden's capture block).
#   run         orchestrator run goldens/<u>/unit.toml (the record goes to reports/records/<u>/),
#               both legs starting cold: LLM_BENCH_KERNEL_CACHE, VLLM_CACHE_ROOT and
#               TRITON_CACHE_DIR point at empty directories of this run's own, removed after it,
#               so the load axis compares two cold first starts wherever the box's caches stand.
# then, once:
#   report      orchestrator report (reports/BENCHMARKS.md).
#
# --units     default: every unit whose [engine] device is cuda:N, in name order.
# --steps     default: all four; e.g. --steps checkpoint,golden to prepare, then --steps run,report,
#             so that each call stays under a wall-clock limit.
# --out       where each step's full log goes (default .gpu-run/<UTC stamp>, ignored by git).
# --bin       a directory holding prebuilt `engine` and `orchestrator` (e.g. .gpu from
#             scripts/stage-gpu.sh): the engine is copied to target/release/engine, where the units
#             name it. Default: target/release/ as cargo built it.
# --python    the interpreter with torch, transformers and (on PYTHONPATH) vLLM (default python3).
# --site      vLLM's unpacked pack, put first on PYTHONPATH (default /tmp/site; "" for none).
# --legs      the run step's legs (orchestrator run --legs; default both), e.g. `engine` for
#             an engine-only run (a planted fault, or a speed check without vLLM).
# --stop-after  start no further unit once SECONDS have passed since the script began, so that a
#             caller with a wall-clock limit (a GPU lease's 600 s a call) gets the summary and
#             tree.tgz of the units that finished instead of a unit killed half-way: the summary
#             names the units not started and the --units value that runs them. A unit takes
#             about 1.5 (tiny) to 4 (8B, vLLM's load included) minutes on an H200; on an H100 with
#             both legs cold, 3.5 (tiny-trained-h) and 5 (nemotron-h-8b).
#
# The orchestrator records the tree of the files it ran (tracked, and untracked ones git does not
# ignore, less reports/), whatever HEAD names; the log says when the two differ. A plain copy of
# the tree without .git gets a repository here: `git init` and one commit of the copy as received (what
# .gitignore ignores left out), so the record's tree id equals main's for an unmodified copy of
# main. On later calls, changes to that copy (other than this script's own outputs: records,
# goldens, checkpoint.sha256, BENCHMARKS.md) are committed on top, so the tree follows the code.
#
# What a call made that belongs in the repository (records, goldens, checkpoint.sha256,
# BENCHMARKS.md and charts) is also copied under OUT/tree/ at its path in the repository, and packed
# into OUT/tree.tgz, again each time a step adds to it: a call killed by its wall-clock limit
# half-way through a unit still leaves the records of the units before it in OUT/tree.tgz.
#
# Exit status: 0 every step ran and every run passed every gate; 1 every step ran, but some
# record holds refusals (or report rejected a file); 2 a step failed (its log is named); 3 no step
# failed, but --stop-after left units not started (named). A failing unit does not stop the others.
set -uo pipefail
cd "$(dirname "$0")/.."
root=$PWD

units_arg="" steps_arg="checkpoint,golden,run,report" out="" bin="" py=python3 site=/tmp/site legs=both
stop_after=""
while [ $# -gt 0 ]; do
    case $1 in
        --units) units_arg=${2:?--units needs a value}; shift 2 ;;
        --steps) steps_arg=${2:?--steps needs a value}; shift 2 ;;
        --out) out=${2:?--out needs a value}; shift 2 ;;
        --bin) bin=${2:?--bin needs a value}; shift 2 ;;
        --python) py=${2:?--python needs a value}; shift 2 ;;
        --site) site=${2?--site needs a value}; shift 2 ;;
        --legs) legs=${2:?--legs needs a value}; shift 2 ;;
        --stop-after) stop_after=${2:?--stop-after needs a value}; shift 2 ;;
        -h | --help) sed -n '2,/^set -uo/p' "$0" | sed -e '$d' -e 's/^# \{0,1\}//'; exit 0 ;;
        *) echo "gpu-run.sh: unknown argument $1 (--help lists them)" >&2; exit 2 ;;
    esac
done

if [ -n "$stop_after" ] && ! [[ $stop_after =~ ^[0-9]+$ ]]; then
    echo "gpu-run.sh: --stop-after takes whole seconds, not '$stop_after'" >&2
    exit 2
fi
stamp() { date -u +%Y-%m-%dT%H:%M:%SZ; }
log() { echo "== $(stamp) $*"; }
[ -n "$out" ] || out=.gpu-run/$(date -u +%Y%m%dT%H%M%SZ)
mkdir -p "$out" || { echo "gpu-run.sh: cannot create $out" >&2; exit 2; }
out=$(cd "$out" && pwd)

declare -A want=()
IFS=, read -r -a steps <<<"$steps_arg"
for s in "${steps[@]}"; do
    case $s in
        checkpoint | golden | run | report) want[$s]=1 ;;
        *) echo "gpu-run.sh: unknown step $s (checkpoint, golden, run, report)" >&2; exit 2 ;;
    esac
done

# The environment of every step (the oracle sets some of these itself when unset).
export PYTHONPATH="${site:+$site:}$root" VLLM_USE_FLASHINFER_SAMPLER=0 HF_HUB_OFFLINE=1 \
    TRANSFORMERS_OFFLINE=1 VLLM_NO_USAGE_STATS=1 DO_NOT_TRACK=1 PYTHONUNBUFFERED=1
# The units' [oracle] python is "python3"; LLM_BENCH_PYTHON overrides it for the oracle leg.
export LLM_BENCH_PYTHON=$py

# --- binaries --------------------------------------------------------------------------------
orch=$root/target/release/orchestrator
if [ -n "$bin" ]; then
    for b in engine orchestrator; do
        [ -x "$bin/$b" ] || { echo "gpu-run.sh: $bin/$b is missing or not executable" >&2; exit 2; }
    done
    mkdir -p target/release
    if ! cmp -s "$bin/engine" target/release/engine; then
        cp "$bin/engine" target/release/engine.tmp && mv target/release/engine.tmp target/release/engine
        log "engine: copied $bin/engine to target/release/engine"
    fi
    orch=$(cd "$bin" && pwd)/orchestrator
fi
[ -x "$orch" ] || {
    echo "gpu-run.sh: no orchestrator at $orch: cargo build --release, or pass --bin DIR" >&2
    exit 2
}

# --- the repository the record's tree id comes from --------------------------------------------
marker=.git/llm-bench-gpu-run
gitc() { git -c user.name=gpu-run -c user.email=gpu-run@localhost -c commit.gpgsign=false "$@"; }
# New untracked files, less this script's own outputs (they are results, not the code that ran).
new_inputs() {
    git ls-files --others --exclude-standard -z |
        grep -zv -e '^reports/' -e '^goldens/[^/]*/golden[^/]*\.json$' -e '^goldens/[^/]*/checkpoint\.sha256$'
}
if [ "$(git rev-parse --show-toplevel 2>/dev/null)" != "$root" ]; then
    log "git: $root is not a git checkout; making one of the tree as it is here"
    git init -q . && touch "$marker" || { echo "gpu-run.sh: git init failed" >&2; exit 2; }
    case $out/ in "$root"/*) echo "/${out#"$root"/}/" >>.git/info/exclude ;; esac
    gitc add -A && gitc commit -q -m "gpu-run.sh: the tree as copied to $(hostname)" ||
        { echo "gpu-run.sh: git commit failed" >&2; exit 2; }
elif [ -e "$marker" ]; then
    gitc add -u
    new_inputs | gitc add --pathspec-from-file=- --pathspec-file-nul 2>/dev/null
    if ! git diff --cached --quiet; then
        gitc commit -q -m "gpu-run.sh: changes to the copied tree" && log "git: committed changes to the copied tree"
    fi
fi
# The records name the tree of the files as they are (record.rs working_tree), which a checkout's
# HEAD need not describe (a stale .git shipped with the copy, or uncommitted edits): say so.
changed=$(git status --porcelain -- . ':(exclude)reports' | wc -l)
if [ "$changed" -eq 0 ]; then
    log "git: tree $(git rev-parse 'HEAD^{tree}') (commit $(git rev-parse --short HEAD))"
else
    log "git: $changed path(s) differ from HEAD $(git rev-parse --short HEAD); the records name the tree of the files as they are"
fi

# --- units -------------------------------------------------------------------------------------
# name<TAB>gpu?<TAB>golden files (space-separated), one line per unit, from the unit files.
unit_table=$("$py" - <<'PY'
import pathlib, tomllib
for p in sorted(pathlib.Path("goldens").glob("*/unit.toml")):
    d = tomllib.loads(p.read_text())
    gpu = d.get("engine", {}).get("device", "cpu").startswith("cuda")
    files = " ".join(g["file"] for g in d.get("golden", []))
    print(f"{p.parent.name}\t{int(gpu)}\t{files}")
PY
) || { echo "gpu-run.sh: cannot read the unit files with $py" >&2; exit 2; }
declare -A is_unit=() is_gpu=() goldens_of=()
while IFS=$'\t' read -r name gpu files; do
    is_unit[$name]=1 is_gpu[$name]=$gpu goldens_of[$name]=$files
done <<<"$unit_table"
units=()
if [ -n "$units_arg" ]; then
    IFS=, read -r -a units <<<"$units_arg"
    for u in "${units[@]}"; do
        [ -n "${is_unit[$u]:-}" ] || { echo "gpu-run.sh: no unit goldens/$u/unit.toml" >&2; exit 2; }
    done
else
    while IFS=$'\t' read -r name gpu _; do
        [ "$gpu" = 1 ] || continue
        units+=("$name")
    done <<<"$unit_table"
fi
checkpoint_models=$("$py" scripts/make-checkpoint.py --list | cut -d: -f1)
log "units: ${units[*]}; steps: ${steps_arg}; logs: $out"

failed=0 refused=0
declare -A result=() mdfile=()
note() { result[$1]="${result[$1]:-}$2; "; }
# What this call made that belongs in the repository is also copied to $out/tree/<same path>,
# so a caller that only gets $out back can lay it over its checkout and commit it.
collect() {
    local f rel
    for f in "$@"; do
        rel=${f#"$root"/}
        [ -f "$root/$rel" ] || continue
        mkdir -p "$out/tree/$(dirname "$rel")" && cp -p "$root/$rel" "$out/tree/$rel"
    done
    pack_tree
}
# $out/tree as one file, replaced whole: a transfer that keeps only a few files, or shallow paths,
# still gets them, and a call killed later keeps what was packed here.
pack_tree() {
    [ -d "$out/tree" ] || return 0
    tar czf "$out/tree.tgz.part" -C "$out" tree && mv -f "$out/tree.tgz.part" "$out/tree.tgz"
}

step_checkpoint() {
    local u=$1 dir=goldens/$1/model sums=goldens/$1/checkpoint.sha256 lg=$out/$1.checkpoint.log
    if ! grep -qx "$u" <<<"$checkpoint_models"; then
        if compgen -G "$dir/*.safetensors" >/dev/null; then note "$u" "checkpoint: committed"; return 0; fi
        log "$u checkpoint: FAILED: $dir has no safetensors and make-checkpoint.py has no model $u"
        note "$u" "checkpoint FAILED"; return 1
    fi
    if [ -e "$dir/.complete" ]; then note "$u" "checkpoint: present"; return 0; fi
    log "$u checkpoint: making $dir (log $lg)"
    if ! "$py" scripts/make-checkpoint.py --model "$u" --out "$dir" >"$lg" 2>&1; then
        log "$u checkpoint: FAILED (tail of $lg):"; tail -n 5 "$lg"; note "$u" "checkpoint FAILED"; return 1
    fi
    tail -n 1 "$lg"
    if [ -f "$sums" ]; then
        if (cd "$dir" && sha256sum --quiet -c "$root/$sums") >>"$lg" 2>&1; then
            log "$u checkpoint: matches $sums"
        else
            log "$u checkpoint: FAILED: the bytes differ from $sums (a golden captured on the pinned checkpoint does not apply); see $lg"
            note "$u" "checkpoint FAILED (sha256)"; return 1
        fi
    else
        (cd "$dir" && sha256sum -- *.safetensors *.json | grep -v generation_config) >"$sums"
        log "$u checkpoint: wrote $sums: commit it, with the golden"
        collect "$sums"
    fi
    note "$u" "checkpoint: made"
}

step_golden() {
    local u=$1 f missing=() lg=$out/$1.capture.log
    for f in ${goldens_of[$u]}; do [ -f "goldens/$u/$f" ] || missing+=("$f"); done
    if [ ${#missing[@]} -eq 0 ]; then note "$u" "golden: present"; return 0; fi
    # capture writes the [[golden]] entry matching the oracle's device and dtype.
    log "$u golden: capturing ${missing[*]} with the unit's oracle (log $lg)"
    if ! "$py" -m oracle capture --unit "goldens/$u/unit.toml" >"$lg" 2>&1; then
        log "$u golden: FAILED (tail of $lg):"; tail -n 8 "$lg"; note "$u" "golden FAILED"; return 1
    fi
    for f in "${missing[@]}"; do
        [ -f "goldens/$u/$f" ] || { log "$u golden: FAILED: capture did not write $f"; note "$u" "golden FAILED"; return 1; }
    done
    grep -E 'min top-2 margin|wrote' "$lg"
    for f in "${missing[@]}"; do collect "goldens/$u/$f"; done
    note "$u" "golden: captured (commit it)"
}

step_run() {
    local u=$1 lg=$out/$1.run.log rc caches
    log "$u run: orchestrator run goldens/$u/unit.toml (log $lg)"
    # Both legs' first starts are cold: fresh compile caches for this run alone (the engine's
    # kernels and tunings, vLLM's torch.compile and Triton's), removed after it; the box's own
    # caches are neither read nor touched.
    caches=$(mktemp -d "${TMPDIR:-/tmp}/gpu-run-caches.XXXXXX") || { log "$u run: FAILED: no temporary directory"; return 1; }
    LLM_BENCH_KERNEL_CACHE=$caches/engine VLLM_CACHE_ROOT=$caches/vllm TRITON_CACHE_DIR=$caches/triton \
        "$orch" run "goldens/$u/unit.toml" --python "$py" --legs "$legs" >"$lg" 2>&1
    rc=$?
    rm -rf "$caches"
    mdfile[$u]=$(sed -n 's/^table:  //p' "$lg" | tail -n 1)
    [ -n "${mdfile[$u]}" ] && collect "${mdfile[$u]%.md}".*
    case $rc in
        0) log "$u run: no gate refused (${mdfile[$u]})"; note "$u" "run: no refusal" ;;
        1) log "$u run: recorded WITH REFUSALS (${mdfile[$u]})"; note "$u" "run: refusals"; refused=1 ;;
        *) log "$u run: FAILED, exit $rc (tail of $lg):"; tail -n 12 "$lg"; note "$u" "run FAILED (exit $rc)"; return 1 ;;
    esac
}

left=()
for u in "${units[@]}"; do
    if [ -n "$stop_after" ] && [ "$SECONDS" -ge "$stop_after" ]; then
        left+=("$u")
        note "$u" "not started: ${SECONDS} s had passed (--stop-after $stop_after)"
        continue
    fi
    ok=1
    if [ -n "${want[checkpoint]:-}" ] && ! step_checkpoint "$u"; then ok=0; fi
    if [ $ok = 1 ] && [ -n "${want[golden]:-}" ] && ! step_golden "$u"; then ok=0; fi
    if [ $ok = 1 ] && [ -n "${want[run]:-}" ] && ! step_run "$u"; then ok=0; fi
    [ $ok = 1 ] || { failed=1; log "$u: stopped here; the other units go on"; }
done

if [ -n "${want[report]:-}" ]; then
    log "report: orchestrator report (log $out/report.log)"
    "$orch" report >"$out/report.log" 2>&1
    rc=$?
    [ $rc -le 1 ] && collect reports/BENCHMARKS.md reports/charts/*.svg
    case $rc in
        0) log "report: $(tail -n 1 "$out/report.log")" ;;
        1) log "report: written, but some files were not read (see $out/report.log)"; refused=1 ;;
        *) log "report: FAILED (tail of $out/report.log):"; tail -n 5 "$out/report.log"; failed=1 ;;
    esac
fi

echo
echo "== summary ($(stamp)); logs in $out"
for u in "${units[@]}"; do
    echo "-- $u: ${result[$u]:-nothing done}"
    md=${mdfile[$u]:-}
    [ -n "$md" ] && [ -f "$md" ] || continue
    echo "   record: $md"
    # The table, then the gate verdicts and the clock's explanation.
    grep -E '^\|' "$md" | sed 's/^/   /'
    sed -n '/^## GPU and host sampling/,$p' "$md" |
        grep -E '^- (clock:|engine:|oracle:|so |before the|pass|not applicable|\*\*REFUSED)' | sed 's/^/   /'
done
if [ -d "$out/tree" ]; then
    echo "-- to keep: $out/tree/ (and $out/tree.tgz) holds this call's records, goldens, checksums and BENCHMARKS.md at their paths in the repository; tar xzf --strip-components 1 at the repository root restores them"
fi
if [ ${#left[@]} -gt 0 ]; then
    echo "-- not started (--stop-after $stop_after): ${left[*]}; run them with --units $(IFS=,; echo "${left[*]}")"
fi
if [ $failed = 1 ]; then exit 2; fi
if [ ${#left[@]} -gt 0 ]; then exit 3; fi
if [ $refused = 1 ]; then exit 1; fi
exit 0
