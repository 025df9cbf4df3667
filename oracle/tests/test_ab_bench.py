"""scripts/ab-bench.sh: every build on every model in the order asked, each line labelled with
the engine's own summary, a failing build named while the others still run, and bad arguments
refused before anything runs. Runs the real engine (target/release, built by scripts/test) on
tiny-llama on the CPU."""

import json
import os
import subprocess

import pytest
from conftest import ROOT

ENGINE = ROOT / "target" / "release" / "engine"
SCRIPT = ROOT / "scripts" / "ab-bench.sh"
TINY = ["--prompt-lens", "4,20", "--max-tokens", "3", "--repeat", "1", "--batch", "2",
        "--batch-tokens", "2", "--ttft-len", "8"]


def build(tmp_path, name, engine_text=None):
    d = tmp_path / name
    d.mkdir()
    if engine_text is None:
        (d / "engine").symlink_to(ENGINE)
    else:
        (d / "engine").write_text(engine_text)
        (d / "engine").chmod(0o755)
    return d


def run(*args):
    return subprocess.run(["bash", str(SCRIPT), *map(str, args)], cwd=ROOT, capture_output=True,
                          text=True, timeout=300)


def run_lines(r):
    """The runs' lines, without the summary tables and the closing line."""
    return [l for l in r.stdout.splitlines()
            if not l.startswith(("==", "|")) and not l.startswith("  gemv")]


def summary(r, model):
    """The summary table of `model`, as {figure: [cells]}."""
    out, inside = {}, False
    for l in r.stdout.splitlines():
        if l.startswith("== "):
            inside = l.startswith(f"== {model}:")
        elif inside and l.startswith("| ") and not l.startswith(("| figure", "| ---")):
            cells = [c.strip() for c in l.strip("|").split(" | ")]
            out[cells[0]] = cells[1:]
    return out


@pytest.fixture
def engine():
    if not ENGINE.exists():
        pytest.skip("target/release/engine is not built (scripts/test builds it)")


def test_builds_run_in_turn_for_each_round_each_line_labelled(engine, tmp_path):
    a, b = build(tmp_path, "a"), build(tmp_path, "b")
    out = tmp_path / "out"
    r = run("--out", out, "--rounds", "2", "goldens/tiny-llama/model", f"{a},{b}", "--", *TINY)
    assert r.returncode == 0, r.stdout + r.stderr
    lines = run_lines(r)
    assert [l.split(":")[0] for l in lines] == [
        "tiny-llama a #1", "tiny-llama b #2", "tiny-llama a #3", "tiny-llama b #4"]
    for line in lines:
        assert "per output token" in line and "by prompt length 4:" in line, line
    for n, label in enumerate(["a", "b", "a", "b"], 1):
        j = json.loads((out / f"tiny-llama-{label}-{n}.json").read_text())
        assert [row["prompt_len"] for row in j["per_output_token_by_prompt_len"]] == [4, 20]
    # Then each figure over the rounds, b against a.
    t = summary(r, "tiny-llama")
    assert list(t) == ["per output token", "per output token at 4", "per output token at 20",
                       "ttft(8)", "throughput at batch 2", "prefill at batch 2",
                       "decode step at batch 2"], r.stdout
    for figure, (a_cell, b_cell) in t.items():
        assert "(2 rounds, spread " in a_cell and "x: " in b_cell, (figure, a_cell, b_cell)


def test_a_failing_build_is_named_and_the_others_still_run(engine, tmp_path):
    good = build(tmp_path, "good")
    bad = build(tmp_path, "bad", "#!/bin/sh\necho 'engine: no CUDA device' >&2\nexit 3\n")
    r = run("--out", tmp_path / "out", "goldens/tiny-llama/model", f"{bad},{good}", "--", *TINY)
    assert r.returncode == 1, r.stdout + r.stderr
    assert "tiny-llama bad #1: FAILED (exit 3): engine: no CUDA device" in r.stdout
    assert "tiny-llama good #2: per output token" in r.stdout


def test_bad_arguments_are_refused_before_anything_runs(tmp_path):
    r = run("goldens/tiny-llama/model")
    assert r.returncode == 2 and "needs MODELS and BUILDS" in r.stderr
    (tmp_path / "empty").mkdir()
    r = run("goldens/tiny-llama/model", tmp_path / "empty")
    assert r.returncode == 2 and "is not an executable engine build" in r.stderr
    r = run("--rounds", "0", "goldens/tiny-llama/model", tmp_path / "empty")
    assert r.returncode == 2 and "--rounds must be a positive integer" in r.stderr
    r = run("goldens/tiny-llama/model", tmp_path / "empty", "--batch", "8")
    assert r.returncode == 2 and "bench options go after --" in r.stderr
    assert not os.listdir(tmp_path / "empty")


def test_the_gemv_tuning_choices_follow_a_cuda_runs_summary(tmp_path):
    # A stand-in for a CUDA build: its summary line on stderr, a JSON with the tuning's choices.
    tuning = {"shapes": [
        {"role": "norm", "rows": 6144, "cols": 4096, "batch_1": {"cuda_cores": 2},
         "batched": {"tensor_cores": 4}},
        {"role": "residual", "rows": 2560, "cols": 9728, "batch_1": {"cuda_cores": 4},
         "batched": {"tensor_cores": 4}}]}
    cuda = build(tmp_path, "cuda", "#!/bin/sh\necho 'per output token 1.000 ms' >&2\n"
                 f"echo '{json.dumps({'features': {'gemv_tuning': tuning}})}'\n")
    r = run("--out", tmp_path / "out", "goldens/tiny-llama/model", cuda)
    assert r.returncode == 0, r.stdout + r.stderr
    assert r.stdout.splitlines()[:2] == [
        "tiny-llama cuda #1: per output token 1.000 ms",
        "  gemv (batch 1/2-8): norm 6144x4096 c2/t4, residual 2560x9728 c4/t4"]
    # Its JSON has no bench figures: left out of the summary, and said.
    assert "is not an engine bench JSON" in r.stderr and "== tiny-llama:" not in r.stdout



def test_same_picks_runs_every_later_build_on_the_first_runs_gemv_choices(tmp_path):
    # Stand-ins for CUDA builds that say which choices file they were given and, as the engine
    # does, name it in gemv_tuning.pinned; "old" predates ENGINE_GEMV_TUNING and ignores it.
    shapes = json.dumps([{"role": "norm", "rows": 6144, "cols": 4096,
                          "batch_1": {"cuda_cores": 2}, "batched": {"tensor_cores": 4}}])
    timing = '"timing": {"batch": 8, "gemv_ms": 6.387, "blas_ms": 6.2876, "key": "k"}'
    def standin(name, reads_it):
        pinned = ', "pinned": "$ENGINE_GEMV_TUNING"' if reads_it else ""
        def features(pinned):
            return (f'{{"features": {{"gemv_tuning": {{"shapes": {shapes}{pinned}}}, '
                    f'"step_paths": {{"batched": "gemv", {timing}{pinned}}}}}}}')
        text = ("#!/bin/sh\necho \"per output token 1.000 ms, given ${ENGINE_GEMV_TUNING:-none}\" >&2\n"
                "if [ -n \"$ENGINE_GEMV_TUNING\" ]; then\n"
                f"cat <<EOF\n{features(pinned)}\nEOF\n"
                "else\n"
                f"cat <<EOF\n{features('')}\nEOF\n"
                "fi\n")
        return build(tmp_path, name, text)
    a, b, old = standin("a", True), standin("b", True), standin("old", False)
    out = tmp_path / "out"
    r = run("--out", out, "--rounds", "2", "--same-picks", "goldens/tiny-llama/model",
            f"{a},{b},{old}")
    assert r.returncode == 0, r.stdout + r.stderr
    first = (out / "tiny-llama-a-1.json").resolve()
    lines = [l for l in r.stdout.splitlines() if not l.startswith(("==", "|"))]
    choices = "  gemv (batch 1/2-8): norm 6144x4096 c2/t4"
    path = "; batches 2-8 on gemv (gemv 6.387, cublas 6.288 ms)"
    own = " (its own: this build does not read ENGINE_GEMV_TUNING)"
    assert lines[:6] == [
        "tiny-llama a #1: per output token 1.000 ms, given none",
        choices + path,
        f"tiny-llama b #2: per output token 1.000 ms, given {first}",
        f"{choices} (#1's){path} (#1's)",
        f"tiny-llama old #3: per output token 1.000 ms, given {first}",
        f"{choices}{own}{path}{own}",
    ]
    assert lines[6:8] == [f"tiny-llama a #4: per output token 1.000 ms, given {first}",
                          f"{choices} (#1's){path} (#1's)"]
    # Without it each run tunes its own.
    r = run("--out", tmp_path / "out2", "goldens/tiny-llama/model", f"{a},{b}")
    assert r.returncode == 0, r.stdout + r.stderr
    assert "given none" in r.stdout.splitlines()[2], r.stdout


def bench(per_token_ms, tps, prefill_ms):
    return json.dumps({"per_output_token_s": per_token_ms / 1e3, "ttft_s": 0.01,
                       "ttft_prompt_len": 512, "batches": {"8": tps},
                       "batch_phases": {"8": {"prefill_s": prefill_ms / 1e3, "step_s": 0.005}}})


def test_the_summary_judges_each_build_against_the_first_by_the_rounds_spread(tmp_path):
    # "slow" is 10% slower per token, its throughput 1% lower, its prefill the same; "steady"
    # differs by nothing. A stand-in's figures alternate between its rounds by a counter file.
    def standin(name, figures):
        n = tmp_path / f"{name}.n"
        text = (f"#!/bin/sh\nc=$(cat {n} 2>/dev/null || echo 0); echo $((c + 1)) > {n}\n"
                "echo 'per output token' >&2\n"
                f"if [ $((c % 2)) = 0 ]; then echo '{figures[0]}'; else echo '{figures[1]}'; fi\n")
        return build(tmp_path, name, text)
    a = standin("a", [bench(5.0, 1000, 100), bench(5.1, 1000, 102)])
    slow = standin("slow", [bench(5.5, 990, 101), bench(5.6, 990, 101)])
    r = run("--out", tmp_path / "out", "--rounds", "2", "goldens/tiny-llama/model", f"{a},{slow}")
    assert r.returncode == 0, r.stdout + r.stderr
    t = summary(r, "tiny-llama")
    assert t["per output token"] == [
        "5.05 ms (2 rounds, spread 2.0%)",
        "5.55 ms (2 rounds, spread 1.8%); 1.0990x: 1.099x slower, beyond the rounds' 2.0% spread"]
    # 1% lower throughput: a's rounds held it exactly, slow's too, so the 1% counts.
    assert t["throughput at batch 8"][1].endswith("0.9900x: 1.010x slower, beyond the rounds' 0.0% spread")
    # The prefill moved 2% between a's rounds: slow's 101 ms is within that.
    assert t["prefill at batch 8"][1].endswith("within the rounds' 2.0% spread"), t
    # One round has no spread to judge by.
    r = run("--out", tmp_path / "out1", "goldens/tiny-llama/model", f"{a},{slow}")
    assert summary(r, "tiny-llama")["per output token"][1].endswith(
        "(one round: no spread to judge it by)"), r.stdout
