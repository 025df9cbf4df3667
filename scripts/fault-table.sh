#!/usr/bin/env bash
# The planted-fault table (issue 17): for each unit, one clean engine-only run and one per
# engine fault that applies to it (`orchestrator faults plan`), each with ENGINE_FAULT set
# (docs/ENGINE.md) and its record under OUT/records (never reports/records), then the table
# from those records (`orchestrator faults table`): OUT/fault-table.md, also on stdout.
#
#   scripts/fault-table.sh --bin target/release --out /tmp/faults goldens/tiny-llama/unit.toml ...
#
# --bin DIR     where `orchestrator` is (the units' engine.binary is what runs the engine)
# --out DIR     OUT/records, OUT/logs/<unit>.<fault>.log (each run's stdout and stderr), the table
# --engine PATH copy PATH to target/release/engine first, where the units name their engine (as
#               scripts/gpu-run.sh --bin does; e.g. .gpu/engine from scripts/stage-gpu.sh)
# --lock-dir D  the lease's lock directory (default: the units' own)
# --faults A,B  only these faults (still only where they apply)
# --repeat N    timed passes per run (default 1: the token gate needs one; the timings are not
#               the table's), passed as `orchestrator run --repeat N --warmup 1`
# --clean-only / --no-clean  run only the clean run, or every run but it (to split a unit's runs
#               over several calls; the table takes each unit's latest clean run under OUT)
# Exit 0: every fault that changed the model was refused and no clean leg was; 1: otherwise, or
# a run left no record (named); 2: bad arguments or no record at all.
set -u

die() { echo "fault-table: $*" >&2; exit 2; }

BIN="" OUT="" LOCK="" ONLY="" REPEAT=1 CLEAN=1 FAULTED=1 ENGINE=""
while [ $# -gt 0 ]; do
    case "$1" in
        --bin) BIN="${2:-}"; shift 2 ;;
        --out) OUT="${2:-}"; shift 2 ;;
        --lock-dir) LOCK="${2:-}"; shift 2 ;;
        --engine) ENGINE="${2:-}"; shift 2 ;;
        --faults) ONLY="${2:-}"; shift 2 ;;
        --repeat) REPEAT="${2:-}"; shift 2 ;;
        --clean-only) FAULTED=0; shift ;;
        --no-clean) CLEAN=0; shift ;;
        -h|--help) sed -n '2,/^set -u/p' "$0" | sed -e '$d' -e 's/^# \{0,1\}//'; exit 0 ;;
        --*) die "unknown option $1 (see --help)" ;;
        *) break ;;
    esac
done
[ -n "$BIN" ] && [ -n "$OUT" ] || die "--bin DIR and --out DIR are required (see --help)"
[ $# -gt 0 ] || die "name at least one unit (goldens/<unit>/unit.toml)"
ORCH="$BIN/orchestrator"
[ -x "$ORCH" ] || die "$ORCH is not an executable (build it: cargo build --release -p orchestrator)"
mkdir -p "$OUT/records" "$OUT/logs" || die "cannot create $OUT"
root=$(cd "$(dirname "$0")/.." && pwd)
if [ -n "$ENGINE" ]; then
    [ -x "$ENGINE" ] || die "--engine $ENGINE is not an executable"
    mkdir -p "$root/target/release"
    if ! cmp -s "$ENGINE" "$root/target/release/engine"; then
        cp "$ENGINE" "$root/target/release/engine.tmp" &&
            mv "$root/target/release/engine.tmp" "$root/target/release/engine" ||
            die "cannot copy $ENGINE to $root/target/release/engine"
        echo "[fault-table] engine: copied $ENGINE to $root/target/release/engine" >&2
    fi
fi
[ -x "$root/target/release/engine" ] &&
    echo "[fault-table] engine: $root/target/release/engine, sha256 $(sha256sum "$root/target/release/engine" | cut -c1-16)" >&2

missing=()
# One engine-only run; $1 unit, $2 its name, $3 the fault ("" for clean).
run_one() {
    local unit="$1" name="$2" fault="$3" tag="${3:-clean}" log rc rec
    log="$OUT/logs/$name.$tag.log"
    local args=(run "$unit" --legs engine --records-dir "$OUT/records" --quiet
        --repeat "$REPEAT" --warmup 1)
    [ -n "$LOCK" ] && args+=(--lock-dir "$LOCK")
    if [ -n "$fault" ]; then
        ENGINE_FAULT="$fault" "$ORCH" "${args[@]}" >"$log" 2>&1
    else
        env -u ENGINE_FAULT "$ORCH" "${args[@]}" >"$log" 2>&1
    fi
    rc=$?
    rec=$(sed -n 's/^record: //p' "$log" | tail -1)
    if [ -z "$rec" ]; then
        missing+=("$name $tag (exit $rc; see $log)")
        echo "[fault-table] $name $tag: exit $rc, NO RECORD (see $log)" >&2
    else
        echo "[fault-table] $name $tag: exit $rc, record $rec" >&2
    fi
}

for unit in "$@"; do
    [ -f "$unit" ] || die "$unit is not a file"
    name=$(basename "$(dirname "$unit")")
    plan=$("$ORCH" faults plan "$unit") || die "cannot plan the faults of $unit"
    printf '%s\n' "$plan" | sed '$d' | sed "s/^/[fault-table] $name: /" >&2
    faults=$(printf '%s\n' "$plan" | tail -1)
    [ "$CLEAN" = 1 ] && run_one "$unit" "$name" ""
    [ "$FAULTED" = 1 ] || continue
    for f in ${faults//,/ }; do
        if [ -n "$ONLY" ] && [[ ",$ONLY," != *",$f,"* ]]; then
            continue
        fi
        run_one "$unit" "$name" "$f"
    done
done

"$ORCH" faults table "$OUT/records" --out "$OUT/fault-table.md"
rc=$?
if [ ${#missing[@]} -gt 0 ]; then
    echo
    echo "Runs that left no record (not in the table):"
    printf -- '- %s\n' "${missing[@]}"
    [ $rc -eq 0 ] && rc=1
fi
echo "table: $OUT/fault-table.md" >&2
exit $rc
