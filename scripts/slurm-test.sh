#!/usr/bin/env bash
# The fleet against a real Slurm (docs/FLEET.md): starts a single-node CPU-only Slurm
# (scripts/slurm-local.sh), submits `orchestrator fleet goldens/tiny-llama/unit.toml
# goldens/tiny-qwen/unit.toml --slurm --submit` into a temporary records directory, waits for the
# job array and the report job, checks that the report job's BENCHMARKS.md names both units with
# their records, and stops the daemons (unless they were already running).
# Needs the release binaries (cargo build --release) and LLM_BENCH_PYTHON (scripts/setup-python).
# Exit 0: passed, or skipped because Slurm cannot be installed here (said on a SKIPPED line);
# 1: failed (why, with the jobs' output); 2: not set up.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)
limit_s=${LLM_BENCH_SLURM_TEST_TIMEOUT_S:-900}
units=(goldens/tiny-llama/unit.toml goldens/tiny-qwen/unit.toml)
names=(tiny-llama tiny-qwen)

say() { printf 'slurm-test: %s\n' "$*" >&2; }
fail() { say "FAILED: $*"; exit 1; }

for b in orchestrator engine; do
    [ -x "target/release/$b" ] || { say "target/release/$b is missing; run cargo build --release first"; exit 2; }
done
[ -n "${LLM_BENCH_PYTHON:-}" ] || { say "LLM_BENCH_PYTHON is not set; export it (scripts/setup-python prints it)"; exit 2; }

t0=$(date +%s)
dir=${LLM_BENCH_SLURM_DIR:-/tmp/llm-bench-slurm}
was_running=no
if [ -s "$dir/slurmctld.pid" ] && kill -0 "$(cat "$dir/slurmctld.pid")" 2>/dev/null; then
    was_running=yes
fi
status=0
started=$(scripts/slurm-local.sh start) || status=$?
if [ "$status" -eq 3 ]; then
    echo "SKIPPED: the Slurm fleet test: scripts/slurm-local.sh can neither install nor start Slurm and munge here (it said why above)"
    exit 0
elif [ "$status" -ne 0 ]; then
    fail "scripts/slurm-local.sh start exited $status (above)"
fi
eval "$started"
tmp=$(mktemp -d /tmp/llm-bench-slurm-test.XXXXXX)
ids=()
cleanup() {
    [ "${#ids[@]}" -gt 0 ] && scancel "${ids[@]}" 2>/dev/null || true
    [ "$was_running" = yes ] || scripts/slurm-local.sh stop || true
}
trap cleanup EXIT

say "submitting the fleet (${names[*]}), records into $tmp/records"
out=$(target/release/orchestrator fleet "${units[@]}" --slurm --submit \
    --records-dir "$tmp/records" --lock-dir "$tmp/locks" --time 20:00) \
    || fail "orchestrator fleet --submit exited $?"
echo "$out" >&2
mapfile -t ids < <(sed -n 's/^submitted job \([0-9]*\):.*/\1/p' <<<"$out")
[ "${#ids[@]}" -eq 2 ] || fail "expected 2 submitted jobs (the CPU array and the report), got ${#ids[@]}"
report_id=${ids[1]}

# Bounded wait: until none of the jobs is queued or running.
while [ -n "$(squeue -h -j "$(IFS=,; echo "${ids[*]}")" 2>/dev/null)" ]; do
    if [ $(($(date +%s) - t0)) -ge "$limit_s" ]; then
        squeue >&2 || true
        tail -n 20 "$tmp"/fleet/*/*.out >&2 2>/dev/null || true
        fail "the fleet's jobs (${ids[*]}) had not ended after ${limit_s} s (LLM_BENCH_SLURM_TEST_TIMEOUT_S); their output is above"
    fi
    sleep 3
done
ids_done=("${ids[@]}")
ids=()

logs=("$tmp"/fleet/*/*.out)
state() { scontrol show job "$1" 2>/dev/null | sed -n 's/.*JobState=\([A-Z_]*\).*/\1/p' | sort | uniq -c | tr -s ' ' | paste -sd, -; }
say "array job ${ids_done[0]}: $(state "${ids_done[0]}"); report job $report_id: $(state "$report_id")"
report_state=$(scontrol show job "$report_id" | sed -n 's/.*JobState=\([A-Z_]*\).*/\1/p')
if [ "$report_state" != COMPLETED ]; then
    tail -n 30 "${logs[@]}" >&2 || true
    fail "the report job $report_id ended $report_state, not COMPLETED (the jobs' output is above)"
fi
md=$tmp/BENCHMARKS.md
[ -s "$md" ] || fail "the report job wrote no $md"
for n in "${names[@]}"; do
    rec=$(ls "$tmp/records/$n/"*.json 2>/dev/null | head -n 1)
    [ -n "$rec" ] || { tail -n 30 "${logs[@]}" >&2 || true; fail "no record of $n under $tmp/records/$n (the tasks' output is above)"; }
    grep -q "^## $n\$" "$md" || fail "BENCHMARKS.md has no section for $n"
    grep -q "Latest run: record \`$n/$(basename "$rec")\`" "$md" \
        || fail "BENCHMARKS.md's $n section does not name its record $n/$(basename "$rec")"
done
grep -q "^Units: tiny-llama, tiny-qwen\.$" "$md" || fail "BENCHMARKS.md does not list both units"
grep -E "^(## |Latest run:)" "$md" >&2
say "passed in $(($(date +%s) - t0)) s: both units ran as Slurm array tasks and the report job's BENCHMARKS.md names their records ($root/${units[0]}, $root/${units[1]})"
rm -rf "$tmp"
