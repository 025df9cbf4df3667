"""scripts/gpu-run.sh's --stop-after: no unit is started once the time is up, the summary names
the units left and how to run them, and the exit status says so; a bad value is refused before
anything runs. The orchestrator is a stand-in that records its calls and takes a few seconds (the
real one's run is tested in orchestrator/tests); the engine is the built one, so gpu-run.sh has
nothing to copy over it."""

import os
import subprocess
import sys

import pytest
from conftest import ROOT

ENGINE = ROOT / "target" / "release" / "engine"
SCRIPT = ROOT / "scripts" / "gpu-run.sh"


@pytest.fixture
def bindir(tmp_path):
    if not ENGINE.exists():
        pytest.skip("target/release/engine is not built (scripts/test builds it)")
    d = tmp_path / "bin"
    d.mkdir()
    (d / "engine").symlink_to(ENGINE)
    orch = d / "orchestrator"
    orch.write_text('#!/bin/sh\necho "$2" >>"$FAKE_LOG"\n'
                    'for d in "$LLM_BENCH_KERNEL_CACHE" "$VLLM_CACHE_ROOT" "$TRITON_CACHE_DIR"; do\n'
                    '  echo "$d $(ls -A "$d" 2>/dev/null | wc -l)" >>"$FAKE_LOG.env"; mkdir -p "$d"; touch "$d/x"\n'
                    'done\nsleep 4\nexit 0\n')
    orch.chmod(0o755)
    return d


def run(tmp_path, *args):
    log = tmp_path / "calls"
    r = subprocess.run(
        ["bash", str(SCRIPT), "--steps", "run", "--units", "tiny-llama,tiny-qwen3",
         "--out", str(tmp_path / "out"), "--python", sys.executable, *map(str, args)],
        cwd=ROOT, capture_output=True, text=True, timeout=120,
        env={**os.environ, "FAKE_LOG": str(log)})
    calls = log.read_text().split() if log.exists() else []
    return r, calls


def test_no_unit_starts_after_the_time_is_up_and_the_summary_names_the_rest(bindir, tmp_path):
    r, calls = run(tmp_path, "--bin", bindir, "--stop-after", "3")
    assert r.returncode == 3, r.stdout + r.stderr
    assert calls == ["goldens/tiny-llama/unit.toml"]
    assert "-- tiny-qwen3: not started: " in r.stdout, r.stdout
    assert ("-- not started (--stop-after 3): tiny-qwen3; run them with --units tiny-qwen3"
            in r.stdout), r.stdout


def test_without_it_every_unit_runs(bindir, tmp_path):
    r, calls = run(tmp_path, "--bin", bindir)
    assert r.returncode == 0, r.stdout + r.stderr
    assert calls == ["goldens/tiny-llama/unit.toml", "goldens/tiny-qwen3/unit.toml"]
    assert "not started" not in r.stdout


def test_a_value_that_is_not_whole_seconds_is_refused_before_anything_runs(bindir, tmp_path):
    r, calls = run(tmp_path, "--bin", bindir, "--stop-after", "soon")
    assert r.returncode == 2
    assert "--stop-after takes whole seconds, not 'soon'" in r.stderr
    assert calls == []


def test_each_run_starts_both_legs_on_empty_caches_of_its_own_and_removes_them(bindir, tmp_path):
    r, calls = run(tmp_path, "--bin", bindir)
    assert r.returncode == 0, r.stdout + r.stderr
    seen = [line.split() for line in (tmp_path / "calls.env").read_text().splitlines()]
    dirs = [d for d, _ in seen]
    # Three caches a run (engine, vLLM, Triton), two runs: six directories, none shared.
    assert len(dirs) == 6 and len(set(dirs)) == 6, seen
    assert all(n == "0" for _, n in seen), f"a cache was not empty: {seen}"
    assert all(not os.path.exists(d) for d in dirs), "a run's caches outlived it"
    home = os.path.expanduser("~")
    assert not any(d.startswith(os.path.join(home, ".cache")) for d in dirs)


def test_a_call_killed_in_a_later_unit_keeps_the_records_of_the_units_before_it(bindir, tmp_path):
    """A GPU lease kills its command at a wall-clock limit; the records a unit wrote before
    that must come back in OUT/tree.tgz, which used to be packed only at the very end."""
    d = bindir
    tag = f"gpu-run-test-{os.getpid()}"
    # The first unit writes a record and prints its table's path, as `orchestrator run` does;
    # the second hangs until the call is killed.
    (d / "orchestrator").write_text(
        '#!/bin/sh\nu=$(basename "$(dirname "$2")")\n'
        '[ "$u" = tiny-qwen3 ] && exec sleep 30\n'
        f'f="$PWD/reports/records/$u/{tag}"; mkdir -p "$(dirname "$f")"\n'
        'echo table >"$f.md"; echo "{}" >"$f.json"; echo "table:  $f.md"; exit 1\n')
    out = tmp_path / "out"
    made = [ROOT / "reports" / "records" / "tiny-llama" / f"{tag}.{ext}" for ext in ("md", "json")]
    had_dir = made[0].parent.exists()
    try:
        r = subprocess.run(
            ["timeout", "-s", "KILL", "8", "bash", str(SCRIPT), "--steps", "run",
             "--units", "tiny-llama,tiny-qwen3", "--out", str(out), "--bin", str(d),
             "--python", sys.executable],
            cwd=ROOT, capture_output=True, text=True, timeout=60)
        # Killed: 137, or -9 where `timeout` went down with its command's process group.
        assert r.returncode in (137, -9), r.stdout + r.stderr
        assert "== summary" not in r.stdout, "the call was to be killed before its end"
        listed = subprocess.run(["tar", "tzf", str(out / "tree.tgz")], capture_output=True,
                                text=True, check=True).stdout.split()
        assert f"tree/reports/records/tiny-llama/{tag}.md" in listed, listed
        assert f"tree/reports/records/tiny-llama/{tag}.json" in listed, listed
        assert not (out / "tree.tgz.part").exists()
    finally:
        for f in made:
            f.unlink(missing_ok=True)
        if not had_dir and made[0].parent.exists():
            made[0].parent.rmdir()
