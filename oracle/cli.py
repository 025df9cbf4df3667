"""Command line: `python -m oracle serve|check|capture` (docs/ORACLE.md)."""

from __future__ import annotations

import argparse
import os

from oracle.backends import BACKENDS, DTYPES

# vLLM options: flag -> (type, help). Each is passed to vllm.LLM under its snake_case name
# and echoed in `resolved`; unit.toml's [oracle.options] uses the same snake_case keys.
VLLM_OPTIONS = {
    "gpu-memory-utilization": (float, "fraction of GPU memory vLLM may use (vLLM default 0.92)"),
    "max-model-len": (int, "context length (default: the model's)"),
    "max-num-batched-tokens": (int, "tokens per scheduler step"),
    "max-num-seqs": (int, "sequences in flight at once; a request's batch may not exceed it"),
    "block-size": (int, "KV block size in tokens"),
    "num-gpu-blocks-override": (int, "KV pool size in blocks (overrides profiling)"),
    "kv-cache-memory-bytes": (int, "KV pool size in bytes (overrides gpu_memory_utilization)"),
    "attention-backend": (str, "e.g. FLASH_ATTN, TRITON_ATTN, FLASHINFER (default: vLLM's choice)"),
    "seed": (int, "vLLM seed (default 0)"),
}
OPTION_KEYS = ["enforce_eager", "enable_prefix_caching"] + [k.replace("-", "_") for k in VLLM_OPTIONS]


def _add_model_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--backend", required=True, choices=BACKENDS)
    p.add_argument("--model", required=True, help="checkpoint directory (config.json + safetensors)")
    p.add_argument("--device", help="transformers: cpu (default) or cuda[:N]; vllm: cuda (the visible GPU)")
    p.add_argument("--dtype", choices=DTYPES,
                   help="transformers default float32; vllm default: the checkpoint's dtype ('auto')")
    g = p.add_argument_group("vllm options (rejected for --backend transformers)")
    g.add_argument("--enforce-eager", action="store_const", const=True, default=None,
                   help="disable torch.compile and CUDA graphs (default: off, graphs on, as a user runs vLLM)")
    g.add_argument("--enable-prefix-caching", action="store_const", const=True, default=None,
                   help="vLLM prefix caching (default: off here, unlike vLLM: the battery repeats identical "
                        "prompts, and skipped prefills would not compare like with like)")
    for flag, (typ, help_) in VLLM_OPTIONS.items():
        g.add_argument(f"--{flag}", type=typ, default=None, help=help_)


def options_from_args(args) -> dict:
    return {k: getattr(args, k) for k in OPTION_KEYS if getattr(args, k, None) is not None}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m oracle", description="The oracle leg (docs/ORACLE.md).")
    sub = ap.add_subparsers(dest="cmd", required=True)

    ps = sub.add_parser("serve", help="speak docs/PROTOCOL.md on stdin/stdout")
    _add_model_args(ps)

    pc = sub.add_parser("check", help="preflight: one `ok|FAIL` line per postcondition")
    pc.add_argument("--backend", required=True, choices=BACKENDS)

    pg = sub.add_parser("capture", help="write a unit's golden.json with its oracle configuration")
    pg.add_argument("--unit", required=True, help="goldens/<unit>/unit.toml")
    pg.add_argument("--golden", help="output file (default: the [[golden]] entry matching the oracle's device/dtype)")
    pg.add_argument("--check", action="store_true",
                    help="do not write: compare with the existing golden and exit 1 on any difference in tokens")
    pg.add_argument("--batch", type=int, default=1, help="batch of the capture request (default 1)")
    pg.add_argument("--backend", choices=BACKENDS,
                    help="a reference under another backend than the unit's [oracle] (its options are then "
                         "not passed); needs --golden, and the unit's gates do not read the file")
    pg.add_argument("--device", help="as --backend: another device (cpu, cuda, cuda:N)")
    pg.add_argument("--dtype", choices=DTYPES, help="as --backend: another dtype")

    args = ap.parse_args(argv)
    # Nothing here loads from a hub; make sure a missing local file fails fast instead of
    # trying the network (the GPU box has none).
    for var in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"):
        os.environ.setdefault(var, "1")
    os.environ.setdefault("VLLM_NO_USAGE_STATS", "1")
    os.environ.setdefault("DO_NOT_TRACK", "1")

    if args.cmd == "serve":
        from oracle.serve import serve

        args.options = options_from_args(args)
        return serve(args)
    if args.cmd == "check":
        from oracle.check import check

        return check(args.backend)
    if args.cmd == "capture":
        from oracle.capture import capture

        return capture(args)
    return 2
