"""Shared helpers for the oracle tests: a protocol client for `python -m oracle serve`."""

from __future__ import annotations

import json
import os
import select
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

# tiny-nemotron-h: the Nemotron-H hybrid (Mamba-2 mixers, attention and MLP blocks), whose
# transformers cache carries conv and SSM states beside the attention K/V.
UNITS = ["tiny-llama", "tiny-qwen", "tiny-qwen3", "tiny-nemotron-h"]
GOLDENS = ROOT / "goldens"


def load_json(path: Path):
    return json.loads(Path(path).read_text())


def unit_prompts(unit: str) -> list[dict]:
    return load_json(GOLDENS / unit / "prompts.json")["prompts"]


def unit_golden(unit: str) -> dict:
    return load_json(GOLDENS / unit / "golden.json")


class Leg:
    """A `python -m oracle serve` child. Every stdout line must be one JSON object with a
    "type" (the protocol's transport rule); read() fails the test otherwise."""

    def __init__(self, args: list[str], tmp_path: Path, env: dict | None = None):
        self.stderr_path = tmp_path / f"leg-{time.monotonic_ns()}.stderr"
        self._err = open(self.stderr_path, "wb")
        self.proc = subprocess.Popen([sys.executable, "-m", "oracle", "serve", *args], cwd=ROOT,
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self._err,
                                     env={**os.environ, **(env or {})})
        self._buf = b""
        self.lines: list[str] = []

    def stderr(self) -> str:
        return self.stderr_path.read_text(errors="replace")

    def read(self, timeout: float = 120.0) -> dict | None:
        """Next event, or None at end of stdout."""
        deadline = time.monotonic() + timeout
        fd = self.proc.stdout.fileno()
        while b"\n" not in self._buf:
            left = deadline - time.monotonic()
            if left <= 0:
                raise AssertionError(f"no event within {timeout}s; stderr:\n{self.stderr()[-3000:]}")
            ready, _, _ = select.select([fd], [], [], left)
            if not ready:
                continue
            chunk = os.read(fd, 65536)
            if not chunk:
                assert not self._buf, f"partial line at end of stdout: {self._buf!r}"
                return None
            self._buf += chunk
        line, self._buf = self._buf.split(b"\n", 1)
        text = line.decode("utf-8")
        self.lines.append(text)
        try:
            ev = json.loads(text)
        except json.JSONDecodeError:
            raise AssertionError(f"stdout carried a non-JSON line: {text!r}") from None
        assert isinstance(ev, dict) and isinstance(ev.get("type"), str), f"not a protocol event: {text!r}"
        return ev

    def send(self, msg) -> None:
        line = msg if isinstance(msg, str) else json.dumps(msg)
        self.proc.stdin.write(line.encode() + b"\n")
        self.proc.stdin.flush()

    def generate(self, req_id: str, prompts, max_tokens: int, batch: int, ignore_eos: bool = True):
        """Send one generate; return ({index: result event}, done event) or the error event."""
        self.send({"type": "generate", "id": req_id, "prompts": prompts, "max_tokens": max_tokens,
                   "ignore_eos": ignore_eos, "batch": batch})
        results = {}
        while True:
            ev = self.read()
            assert ev is not None, f"leg exited mid-request; stderr:\n{self.stderr()[-3000:]}"
            if ev["type"] == "error":
                assert not results, "an error after results: requests must be validated before they start"
                return ev, None
            assert ev["id"] == req_id, ev
            if ev["type"] == "done":
                return results, ev
            assert ev["type"] == "result", ev
            assert ev["index"] not in results, f"index {ev['index']} reported twice"
            results[ev["index"]] = ev

    def close(self, timeout: float = 60.0) -> int:
        try:
            if self.proc.stdin and not self.proc.stdin.closed:
                self.proc.stdin.close()
        except BrokenPipeError:
            pass
        try:
            rc = self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            raise AssertionError("leg did not exit after end of stdin") from None
        self._err.close()
        return rc


@pytest.fixture
def leg_factory(tmp_path):
    legs = []

    def make(args, env=None):
        leg = Leg(args, tmp_path, env)
        legs.append(leg)
        return leg

    yield make
    for leg in legs:
        if leg.proc.poll() is None:
            leg.proc.kill()
            leg.proc.wait()
