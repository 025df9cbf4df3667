"""`check`: the oracle leg's preflight. One line per postcondition on stdout:

    ok <what>: <detail>
    FAIL <what>: <detail>; fix: <hint>

then a summary line; exit status 1 when anything failed, naming it. Nothing here loads a
model, so it takes seconds (importing vllm takes most of them).
"""

from __future__ import annotations

import ctypes
import glob
import importlib
import os
import re
import subprocess
import sys
import sysconfig
from pathlib import Path

from oracle.backends.vllm_backend import PINNED as VLLM_PINNED

REQ = Path(__file__).resolve().parent / "requirements.txt"
MIN_PYTHON = (3, 11)  # tomllib
# vLLM 0.26 / torch 2.11+cu130 link CUDA 13: the runtime and cuBLAS/cuBLASLt.
CUDA_LIBS = {"libcudart": "libcudart.so.13", "libcublas": "libcublas.so.13", "libcublasLt": "libcublasLt.so.13"}


def pinned() -> dict[str, str]:
    pins = {}
    for line in REQ.read_text().splitlines():
        m = re.match(r"\s*([A-Za-z0-9_.-]+)==([^\s#;]+)", line)
        if m:
            pins[m.group(1).lower()] = m.group(2)
    return pins


def public(version: str) -> str:
    """'2.11.0+cu130' -> '2.11.0' (pip's == ignores the local label too)."""
    return version.split("+", 1)[0]


class Report:
    def __init__(self):
        self.failed: list[str] = []

    def ok(self, what: str, detail: str) -> None:
        print(f"ok {what}: {detail}", flush=True)

    def fail(self, what: str, detail: str, fix: str) -> None:
        self.failed.append(what)
        print(f"FAIL {what}: {detail}; fix: {fix}", flush=True)


def _import(rep: Report, name: str, want: str | None, fix: str):
    try:
        mod = importlib.import_module(name)
    except Exception as e:  # noqa: BLE001 (ImportError, or a broken install raising anything)
        rep.fail(f"{name} importable", f"package {name} cannot be imported ({type(e).__name__}: {e})", fix)
        return None
    ver = getattr(mod, "__version__", "?")
    if want is not None and public(ver) != want:
        rep.fail(f"{name} version", f"{name} {ver} is installed, the pin is {want}", fix)
    else:
        rep.ok(f"{name} importable", f"{name} {ver}" + (f" (pin {want})" if want else ""))
    return mod


def _lib_candidates(soname: str) -> list[str]:
    """Where torch/vLLM find CUDA libraries: the nvidia-* wheels' lib dirs, then the loader."""
    found = []
    for sp in {p for p in sys.path if p.endswith("site-packages")} | {sysconfig.get_paths()["purelib"]}:
        found += sorted(glob.glob(os.path.join(sp, "nvidia", "*", "lib", soname)))
        found += sorted(glob.glob(os.path.join(sp, "nvidia", "cu*", "lib", soname)))
    try:
        out = subprocess.run(["ldconfig", "-p"], capture_output=True, text=True, timeout=10).stdout
        found += [line.split("=>")[-1].strip() for line in out.splitlines() if soname in line]
    except (OSError, subprocess.SubprocessError):
        pass
    found.append(soname)  # LD_LIBRARY_PATH / default search
    return list(dict.fromkeys(found))


def _check_lib(rep: Report, name: str, soname: str) -> None:
    errors = []
    for cand in _lib_candidates(soname):
        try:
            ctypes.CDLL(cand)
            rep.ok(f"{name} loadable", cand)
            return
        except OSError as e:
            errors.append(str(e))
    rep.fail(f"{name} loadable", f"{soname} not found or not loadable ({errors[-1] if errors else 'no candidates'})",
             "install the CUDA 13 runtime wheels torch uses (pip install torch==2.11.0 from the cu130 index brings "
             "nvidia-cuda-runtime and nvidia-cublas), or add the CUDA 13 lib dir to LD_LIBRARY_PATH")


def check(backend: str) -> int:
    rep = Report()
    pins = pinned()
    setup_fix = "run scripts/setup-python (installs oracle/requirements.txt into the project venv)"

    py = sys.version_info
    if py[:2] >= MIN_PYTHON:
        rep.ok("python version", f"{sys.version.split()[0]} at {sys.executable}")
    else:
        rep.fail("python version", f"{sys.version.split()[0]} is older than {MIN_PYTHON[0]}.{MIN_PYTHON[1]}",
                 "use python3.11 or newer")

    torch = _import(rep, "torch", pins.get("torch"), f"pip install torch=={pins.get('torch')} ({setup_fix})")
    _import(rep, "transformers", pins.get("transformers"),
            f"pip install transformers=={pins.get('transformers')} ({setup_fix})")
    _import(rep, "safetensors", None, f"pip install safetensors ({setup_fix})")

    if backend == "vllm":
        _import(rep, "vllm", VLLM_PINNED,
                f"pip install vllm=={VLLM_PINNED} (oracle/requirements-vllm.txt); offline GPU box: unpack the "
                "pack from /work/shared/gpu-box and put it on PYTHONPATH")
        if torch is None:
            rep.fail("torch sees CUDA", "torch is not importable", "fix torch first")
        elif not torch.cuda.is_available():
            rep.fail("torch sees CUDA", f"torch {torch.__version__} (CUDA build {torch.version.cuda}) sees no GPU",
                     "run on the GPU machine; check nvidia-smi, the driver and CUDA_VISIBLE_DEVICES")
        else:
            rep.ok("torch sees CUDA", f"{torch.cuda.device_count()} device(s), {torch.cuda.get_device_name(0)}, "
                   f"CUDA {torch.version.cuda}")
        inc = sysconfig.get_paths().get("include", "")
        header = Path(inc) / "Python.h"
        if header.is_file():
            rep.ok("Python development headers", str(header))
        else:
            rep.fail("Python development headers", f"{header} is missing (Triton compiles C against it at run "
                     "time and then fails far from the cause)",
                     f"apt-get install python{py.major}.{py.minor}-dev (or the distribution's python3-dev)")
        for name, soname in CUDA_LIBS.items():
            _check_lib(rep, name, soname)

    if rep.failed:
        print(f"check --backend {backend}: {len(rep.failed)} failed: {', '.join(rep.failed)}", flush=True)
        return 1
    print(f"check --backend {backend}: all postconditions hold", flush=True)
    return 0
