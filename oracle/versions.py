"""Versions of everything that shapes the oracle's numbers (ready.versions, golden capture)."""

from __future__ import annotations

import platform
import re
import shutil
import subprocess

import oracle


def nvidia_driver() -> str | None:
    """The NVIDIA kernel driver version, from /proc (no subprocess) or nvidia-smi."""
    try:
        with open("/proc/driver/nvidia/version") as f:
            m = re.search(r"Kernel Module(?: for \S+)?\s+([0-9][0-9.]+)", f.read())
            if m:
                return m.group(1)
    except OSError:
        pass
    smi = shutil.which("nvidia-smi")
    if smi:
        try:
            out = subprocess.run([smi, "--query-gpu=driver_version", "--format=csv,noheader"],
                                 capture_output=True, text=True, timeout=10)
            if out.returncode == 0 and out.stdout.strip():
                return out.stdout.strip().splitlines()[0]
        except (OSError, subprocess.SubprocessError):
            pass
    return None


def collect(torch_mod=None, device: str = "cpu") -> dict[str, str]:
    v: dict[str, str] = {"oracle": oracle.__version__, "python": platform.python_version()}
    if torch_mod is not None:
        v["torch"] = torch_mod.__version__
        if torch_mod.version.cuda:
            v["cuda"] = torch_mod.version.cuda
    try:
        import transformers

        v["transformers"] = transformers.__version__
    except ImportError:
        pass
    if device.startswith("cuda") and torch_mod is not None:
        drv = nvidia_driver()
        if drv:
            v["driver"] = drv
        try:
            v["gpu"] = torch_mod.cuda.get_device_name(torch_mod.device(device))
        except Exception:  # noqa: BLE001 (a name is nice to have, never worth failing for)
            pass
    return v
