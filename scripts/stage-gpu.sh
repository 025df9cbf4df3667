#!/usr/bin/env bash
# Builds the release binaries and the engine's test executables here, strips them, and stages
# them in .gpu/ (ignored by git) for a GPU box that has no Rust toolchain. glibc matches on the
# project's H200 box, so the binaries run there unchanged. Then, on the box, from the repo root:
#   scripts/gpu-tests.sh .gpu
# Stage from the checkout whose copy the box runs in: some CPU tests in test-engine-lib find
# goldens/ through the path cargo compiled them at (CARGO_MANIFEST_DIR), so binaries built in
# another checkout (a git worktree) fail there while the GPU tests pass.
set -euo pipefail
cd "$(dirname "$0")/.."
out=.gpu
rm -rf "$out" && mkdir -p "$out"
cargo build --release --workspace >&2
# `cargo test --no-run` prints each test executable's path.
cargo test --release -p engine --no-run --message-format=json 2>/dev/null \
    | python3 -c '
import json, sys
for line in sys.stdin:
    m = json.loads(line)
    if m.get("reason") == "compiler-artifact" and m.get("executable") and m["profile"]["test"]:
        t = m["target"]
        name = "engine-lib" if t["kind"] == ["lib"] else t["name"]
        if t["kind"] in (["lib"], ["test"]):
            print(name, m["executable"])
' | while read -r name exe; do
    cp "$exe" "$out/test-$name"
done
for bin in engine orchestrator; do
    [ -f "target/release/$bin" ] && cp "target/release/$bin" "$out/"
done
strip "$out"/* 2>/dev/null || true
ls -la "$out" >&2
