"""`capture`: run a unit's oracle configuration over its prompts and write golden.json.

It goes through serve's own `Leg.handle_generate` (same validation, same decoding loop), asking
the backend for top-2 margins as well, so a golden and a served run cannot disagree by
construction.
"""

from __future__ import annotations

import dataclasses
import datetime
import json
import os
import sys
import tempfile
import time
from pathlib import Path

from oracle.backends import LoadError, load_backend
from oracle.protocol import GenerateRequest, ProtocolError
from oracle.serve import Leg
from oracle.unit import UnitError, load_unit


def log(msg: str) -> None:
    print(f"[capture] {msg}", file=sys.stderr, flush=True)


def format_golden(doc: dict) -> str:
    """JSON with one output per line: readable diffs, still plain JSON."""
    head = {k: v for k, v in doc.items() if k != "outputs"}
    text = json.dumps(head, indent=2, sort_keys=False)
    rows = ",\n".join("    " + json.dumps(o) for o in doc["outputs"])
    return text[:-2] + ',\n  "outputs": [\n' + rows + "\n  ]\n}\n"


def write_atomic(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        os.unlink(tmp)
        raise


def capture(args) -> int:
    try:
        unit = load_unit(args.unit)
    except UnitError as e:
        log(f"FAIL {e}")
        return 2
    override = {k: v for k, v in (("backend", getattr(args, "backend", None)),
                                  ("device", getattr(args, "device", None)),
                                  ("dtype", getattr(args, "dtype", None))) if v}
    if override:
        # A reference, not the unit's golden: it must go where the gates will not take it for one.
        if not args.golden:
            log("FAIL --backend/--device/--dtype capture a reference, not the unit's golden; "
                "fix: name its file with --golden (e.g. goldens/<unit>/reference-cuda-f32.json)")
            return 2
        if override.get("backend", unit.backend) != unit.backend:
            unit = dataclasses.replace(unit, options={})
        unit = dataclasses.replace(unit, **override)
    log(f"unit {unit.name}: {unit.backend} on {unit.device} {unit.dtype}, options {unit.options}, "
        f"{len(unit.prompts)} prompts x {unit.max_tokens} tokens, ignore_eos={unit.ignore_eos}")
    try:
        golden_path = Path(args.golden) if args.golden else unit.golden_for(unit.device, unit.dtype)
    except UnitError as e:
        log(f"FAIL {e}")
        return 2
    try:
        backend = load_backend(unit.backend, str(unit.model), unit.device, unit.dtype, unit.options)
    except LoadError as e:
        log(f"FAIL load_failed: {e}")
        return 2
    try:
        ready = backend.ready_fields()
        leg = Leg(backend, lambda ev: None)  # events are not needed here; results come back
        req = GenerateRequest("capture", [p["tokens"] for p in unit.prompts], unit.max_tokens, unit.ignore_eos,
                              args.batch)
        t = time.perf_counter()
        try:
            results = leg.handle_generate(req, t, margins=True)
        except ProtocolError as e:
            log(f"FAIL {e.code}: {e.message}")
            return 2
        log(f"generated in {time.perf_counter() - t:.2f} s")
    finally:
        backend.close()

    by_index = {r.index: r for r in results}
    outputs = []
    for i, p in enumerate(unit.prompts):
        r = by_index[i]
        margins = [round(m, 6) if m is not None else None for m in r.margins] if r.margins is not None else None
        outputs.append({"id": p["id"], "tokens": r.tokens, "margins": margins, "runner_up": r.runner_up})
    all_m = [m for o in outputs for m in (o["margins"] or []) if m is not None]
    min_margin = min(all_m) if all_m else None
    doc = {
        "schema": 1,
        "max_tokens": unit.max_tokens,
        "ignore_eos": unit.ignore_eos,
        "capture": {
            "backend": unit.backend,
            "versions": ready["versions"],
            "dtype": ready["features"]["dtype"],
            "device": ready["resolved"].get("device", unit.device),
            "resolved": ready["resolved"],
            "features": ready["features"],
            "generation": {"max_tokens": unit.max_tokens, "ignore_eos": unit.ignore_eos, "batch": args.batch,
                           "temperature": 0, "prompts": len(unit.prompts)},
            "margins": ("top-1 minus top-2 float32 logit" if unit.backend == "transformers"
                        else "top-1 minus top-2 log-probability (vLLM logprobs=2, raw)"),
            "min_margin": min_margin,
            "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
            "command": " ".join(["python -m oracle capture --unit", str(args.unit)]
                                + [f"--{k} {v}" for k, v in override.items()]
                                + ([f"--golden {args.golden}"] if override else [])),
        },
        "outputs": outputs,
    }
    log(f"min top-2 margin {min_margin}")

    if args.check:
        try:
            old = json.loads(golden_path.read_text())
        except (OSError, json.JSONDecodeError) as e:
            log(f"FAIL cannot read {golden_path} to compare: {e}")
            return 2
        old_tokens = {o["id"]: o["tokens"] for o in old.get("outputs", [])}
        same = sum(1 for o in outputs if old_tokens.get(o["id"]) == o["tokens"])
        diff_keys = sorted(k for k in set(old.get("capture", {}).get("resolved", {})) | set(ready["resolved"])
                           if old.get("capture", {}).get("resolved", {}).get(k) != ready["resolved"].get(k))
        log(f"{same}/{len(outputs)} prompts match {golden_path}" +
            (f"; resolved config differs in {diff_keys}" if diff_keys else "; resolved config identical"))
        # Whether this process compiled afresh or loaded an earlier one's compile: what decides
        # whether a near-tie can land the other way (docs/ORACLE.md).
        print(json.dumps({"golden": str(golden_path), "matched": same, "prompts": len(outputs),
                          "resolved_diff": diff_keys, "min_margin": min_margin,
                          "load_cache": ready["features"].get("load_cache")}))
        return 0 if same == len(outputs) and len(old_tokens) == len(outputs) else 1

    write_atomic(golden_path, format_golden(doc))
    log(f"wrote {golden_path}")
    print(str(golden_path))
    return 0
