"""Triton autotuning pinned across processes: the oracle's kernel choices as a file.

vLLM's Mamba-2 prefill (its SSD kernels) runs Triton kernels whose launch configuration is chosen
by timing each candidate in the process that first calls them. Two loads of the same model can
choose differently, sum in another order, and part at a near-tie: the oracle then misses a
golden it captured itself (docs/ORACLE.md). A unit's `triton_pins` option names a JSON file of
Triton's own autotuning results (its `*.autotune.json` cache entries, keyed as Triton keys them:
its version, the GPU target, the kernel's source, the tuning key and the candidate configs), so
every process of the unit runs the same configurations:

- `capture` writes the file from what its process tuned (where the file is missing) and adds
  any kernel tuned afresh later;
- `serve` applies it and reports, in `ready.features.triton_autotune`, which kernels it pinned
  and which it had to tune afresh (a Triton or vLLM upgrade, another GPU architecture).

The mechanism is Triton's: TRITON_CACHE_MANAGER names `PinnedAutotuneCache`, a FileCacheManager
that serves a pinned entry in place of its cache's and logs each autotuning entry it serves or
stores, one JSON line each, to the file in LLM_BENCH_TRITON_LOG (a file, so the multi-process
engine core's tuning is seen too). The pins are read from LLM_BENCH_TRITON_PINS.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

PINS_ENV = "LLM_BENCH_TRITON_PINS"
LOG_ENV = "LLM_BENCH_TRITON_LOG"
MANAGER_ENV = "TRITON_CACHE_MANAGER"
MANAGER = "oracle.kernel_pins:PinnedAutotuneCache"
SUFFIX = ".autotune.json"
SCHEMA = 1


class PinsError(Exception):
    """A pins file that cannot be used; the message names the file and the fix."""


def load_pins(path: str | os.PathLike) -> dict[str, str]:
    """The pinned entries of a pins file: `<cache key>/<file name>` -> the entry's JSON text."""
    p = Path(path)
    try:
        doc = json.loads(p.read_text())
    except OSError as e:
        raise PinsError(f"cannot read Triton pins {p}: {e.strerror or e}") from e
    except json.JSONDecodeError as e:
        raise PinsError(f"Triton pins {p} is not JSON ({e}); fix: capture the unit's golden again, "
                        "which writes it") from e
    entries = doc.get("entries") if isinstance(doc, dict) else None
    if not isinstance(doc, dict) or doc.get("schema") != SCHEMA or not isinstance(entries, dict):
        raise PinsError(f"Triton pins {p} is not a schema-{SCHEMA} pins file (an object with \"entries\"); "
                        "fix: capture the unit's golden again, which writes it")
    out = {}
    for name, entry in entries.items():
        if not (isinstance(name, str) and name.endswith(SUFFIX) and "/" in name and isinstance(entry, dict)):
            raise PinsError(f"Triton pins {p}: entry {name!r} is not `<cache key>/<kernel>{SUFFIX}` with an "
                            "object; fix: capture the unit's golden again, which writes it")
        out[name] = json.dumps(entry)
    return out


def pins_document(entries: dict[str, str], versions: dict) -> str:
    """A pins file's text: the entries (sorted, one per line for readable diffs) and the versions
    they were tuned under."""
    head = json.dumps({"schema": SCHEMA, "what": "Triton autotuning results of the oracle's kernels "
                       "(oracle/kernel_pins.py, docs/ORACLE.md)", "versions": versions}, indent=2)
    rows = ",\n".join(f"    {json.dumps(k)}: {json.dumps(json.loads(v), sort_keys=True)}"
                      for k, v in sorted(entries.items()))
    return head[:-2] + ',\n  "entries": {\n' + rows + "\n  }\n}\n"


def read_log(path: str | os.PathLike) -> tuple[dict[str, str], dict[str, str]]:
    """(pinned, tuned) from a log: entry name -> JSON text, each as last logged. A missing log
    reads as nothing logged (no Triton kernel was autotuned)."""
    pinned: dict[str, str] = {}
    tuned: dict[str, str] = {}
    try:
        lines = Path(path).read_text().splitlines()
    except FileNotFoundError:
        return pinned, tuned
    for line in lines:
        try:
            ev = json.loads(line)
        except json.JSONDecodeError:
            continue  # a line cut by a crash mid-write
        if ev.get("event") == "pinned":
            pinned[ev["entry"]] = ev["data"]
        elif ev.get("event") == "tuned":
            tuned[ev["entry"]] = ev["data"]
    return pinned, tuned


def kernel_of(entry: str) -> str:
    """`<key>/_chunk_scan_fwd_kernel.autotune.json` -> `_chunk_scan_fwd_kernel`."""
    return entry.rsplit("/", 1)[-1][: -len(SUFFIX)]


def summary(pins_path: str | None, log_path: str) -> dict:
    """What a process pinned and tuned afresh, for `ready.features.triton_autotune`."""
    pinned, tuned = read_log(log_path)
    out: dict = {"pinned": sorted(kernel_of(e) for e in pinned),
                 "tuned": sorted(kernel_of(e) for e in tuned)}
    if pins_path:
        out["pins"] = str(pins_path)
        try:
            out["pins_sha256"] = hashlib.sha256(Path(pins_path).read_bytes()).hexdigest()
        except OSError:
            out["pins_sha256"] = None
    return out


def _log(event: str, entry: str, data: str) -> None:
    path = os.environ.get(LOG_ENV)
    if not path:
        return
    # One write of one line in append mode: whole lines from several processes.
    with open(path, "a") as f:
        f.write(json.dumps({"event": event, "entry": entry, "data": data}) + "\n")


_PINS: dict[str, dict[str, str]] = {}


def _pins() -> dict[str, str]:
    path = os.environ.get(PINS_ENV)
    if not path:
        return {}
    if path not in _PINS:
        _PINS[path] = load_pins(path) if Path(path).exists() else {}
    return _PINS[path]


def _manager_class():
    from triton.runtime.cache import FileCacheManager

    class PinnedAutotuneCache(FileCacheManager):
        """Triton's file cache, but an autotuning entry found in the pins is served from them."""

        def get_file(self, filename):
            if filename.endswith(SUFFIX):
                entry = f"{self.key}/{filename}"
                data = _pins().get(entry)
                if data is not None:
                    # Written over whatever the cache held, so the pin wins over a result an
                    # earlier process on this machine tuned.
                    path = super().put(data, filename, binary=False)
                    _log("pinned", entry, data)
                    return path
            return super().get_file(filename)

        def put(self, data, filename, binary=True):
            path = super().put(data, filename, binary)
            if filename.endswith(SUFFIX):
                _log("tuned", f"{self.key}/{filename}", data if isinstance(data, str) else data.decode())
            return path

    return PinnedAutotuneCache


def __getattr__(name: str):
    # Triton imports `PinnedAutotuneCache` by name (TRITON_CACHE_MANAGER); defined on first use so
    # that importing this module needs no Triton.
    if name == "PinnedAutotuneCache":
        cls = _manager_class()
        globals()[name] = cls
        return cls
    raise AttributeError(name)


def install(pins_path: str | None, log_path: str) -> None:
    """Point this process's Triton (and its children's) at the pinned cache; before any Triton
    kernel is tuned. A TRITON_CACHE_MANAGER of the caller's own is an error, not overridden."""
    current = os.environ.get(MANAGER_ENV)
    if current not in (None, "", MANAGER):
        raise PinsError(f"{MANAGER_ENV}={current} is set, and the unit's triton_pins needs {MANAGER}; "
                        f"fix: unset {MANAGER_ENV}, or drop triton_pins from the unit's [oracle.options]")
    if pins_path and Path(pins_path).exists():
        load_pins(pins_path)  # a broken file fails the load here, with its name
    os.environ[MANAGER_ENV] = MANAGER
    os.environ[LOG_ENV] = str(log_path)
    if pins_path:
        os.environ[PINS_ENV] = str(pins_path)
    else:
        os.environ.pop(PINS_ENV, None)
    # vLLM turns Triton's autotuning cache on (TRITON_CACHE_AUTOTUNING=1) unless told otherwise;
    # without it Triton never asks the cache, and nothing could be pinned.
    os.environ["TRITON_CACHE_AUTOTUNING"] = "1"
