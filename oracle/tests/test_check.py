"""`python -m oracle check`: one ok/FAIL line per postcondition, a missing package named."""

import importlib.util
import os
import subprocess
import sys

import pytest
from conftest import ROOT


def run_check(backend, env=None):
    p = subprocess.run([sys.executable, "-m", "oracle", "check", "--backend", backend], cwd=ROOT,
                       capture_output=True, text=True, timeout=300, env={**os.environ, **(env or {})})
    lines = p.stdout.strip().splitlines()
    for line in lines[:-1]:
        assert line.startswith("ok ") or line.startswith("FAIL "), line
        if line.startswith("FAIL "):
            assert "; fix: " in line, line
    return p.returncode, lines


def test_transformers_check_passes_here():
    rc, lines = run_check("transformers")
    assert rc == 0, lines
    assert any(line.startswith("ok torch importable") for line in lines)


def test_missing_package_is_named(tmp_path):
    # A sitecustomize that makes `transformers` unimportable, as on a machine without it.
    (tmp_path / "sitecustomize.py").write_text(
        "import sys\n"
        "class _Hide:\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        "        if name == 'transformers' or name.startswith('transformers.'):\n"
        "            raise ModuleNotFoundError(f'No module named {name!r}', name=name)\n"
        "sys.meta_path.insert(0, _Hide())\n")
    rc, lines = run_check("transformers", {"PYTHONPATH": str(tmp_path)})
    assert rc == 1
    fails = [line for line in lines if line.startswith("FAIL ")]
    assert len(fails) == 1 and fails[0].startswith("FAIL transformers importable:"), lines
    assert "transformers" in lines[-1] and "1 failed" in lines[-1]


@pytest.mark.skipif(importlib.util.find_spec("vllm") is not None, reason="vllm is installed here")
def test_vllm_check_names_vllm_when_absent():
    rc, lines = run_check("vllm")
    assert rc == 1
    assert any(line.startswith("FAIL vllm importable:") and "vllm" in line for line in lines), lines
    assert "vllm importable" in lines[-1]
