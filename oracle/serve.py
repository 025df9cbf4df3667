"""`serve`: one loaded backend behind the leg protocol on stdin/stdout (docs/PROTOCOL.md)."""

from __future__ import annotations

import math
import os
import sys
import time
import traceback
from typing import Callable

import oracle
from oracle.backends import Backend, LoadError, SeqResult, VerifyResult, load_backend
from oracle.protocol import (
    INTERNAL,
    LOAD_FAILED,
    OVER_CAPACITY,
    Emitter,
    GenerateRequest,
    ProtocolError,
    VerifyRequest,
    claim_stdout,
    parse_generate,
    parse_line,
    parse_verify,
    validate,
)

EXIT_LOAD_FAILED = 2
EXIT_INTERNAL = 3


def log(msg: str) -> None:
    print(f"[oracle] {msg}", file=sys.stderr, flush=True)


class Leg:
    """A loaded backend plus the request handling that serve and capture share, so a golden
    and a served run cannot take different code paths."""

    def __init__(self, backend: Backend, emit: Callable[[dict], None]):
        self.backend = backend
        self.emit = emit

    def _validate(self, req: GenerateRequest | VerifyRequest) -> None:
        validate(req, self.backend.limits)
        max_batch = getattr(self.backend, "max_batch", None)
        if max_batch is not None and req.batch > max_batch:
            raise ProtocolError(OVER_CAPACITY, f"batch {req.batch} exceeds the {max_batch} sequences this leg was "
                                f"started for (max_num_seqs); fix: restart it with --max-num-seqs >= {req.batch}",
                                req.id)
        self.backend.check_request(req)

    def handle_generate(self, msg: dict | GenerateRequest, t_read: float, margins: bool = False) -> list[SeqResult]:
        req = msg if isinstance(msg, GenerateRequest) else parse_generate(msg)
        self._validate(req)
        results: list[SeqResult] = []

        def on_result(r: SeqResult) -> None:
            ev = {"type": "result", "id": req.id, "index": r.index, "tokens": r.tokens, "elapsed_s": r.elapsed_s}
            if r.ttft_s is not None:
                ev["ttft_s"] = r.ttft_s
            self.emit(ev)
            results.append(r)

        self.backend.generate(req, on_result, margins=margins)
        if len(results) != len(req.prompts):
            raise RuntimeError(f"backend returned {len(results)} results for {len(req.prompts)} prompts")
        self.emit({"type": "done", "id": req.id, "wall_s": time.perf_counter() - t_read,
                   "tokens": sum(len(r.tokens) for r in results)})
        return results

    def handle_verify(self, msg: dict | VerifyRequest, t_read: float) -> list[VerifyResult]:
        """Teacher forcing (docs/PROTOCOL.md `verify`): one `verified` per prompt, then `done`."""
        req = msg if isinstance(msg, VerifyRequest) else parse_verify(msg)
        self._validate(req)
        results: list[VerifyResult] = []

        def on_verified(r: VerifyResult) -> None:
            n = len(req.forced[r.index])
            if not len(r.argmax) == len(r.gap) == n or (r.scale is not None and len(r.scale) != n):
                raise RuntimeError(f"backend verified prompt {r.index} with {len(r.argmax)} argmax, {len(r.gap)} gap "
                                   f"values for {n} forced tokens")
            bad = next((j for j, g in enumerate(r.gap + (r.scale or [])) if not math.isfinite(g)), None)
            if bad is not None:
                what = "gap" if bad < n else "scale"
                raise RuntimeError(f"non-finite {what} at prompt {r.index}, position {bad % n}: the {r.path} "
                                   "logits hold NaN or infinity")
            self.emit({"type": "verified", "id": req.id, "index": r.index, "argmax": r.argmax, "gap": r.gap,
                       "scale": r.scale, "path": r.path})
            results.append(r)

        self.backend.verify(req, on_verified)
        if len(results) != len(req.prompts):
            raise RuntimeError(f"backend verified {len(results)} prompts of {len(req.prompts)}")
        self.emit({"type": "done", "id": req.id, "wall_s": time.perf_counter() - t_read,
                   "tokens": sum(len(f) for f in req.forced)})
        return results


def ready_event(backend: Backend) -> dict:
    fields = backend.ready_fields()
    me = os.getpid()
    children = [p for p in fields.pop("pids", []) if p != me]
    return {"type": "ready", "load_s": oracle.seconds_since_start(), **fields, "pid": me, "pids": [me] + children}


def serve(args) -> int:
    emitter = Emitter(claim_stdout())
    try:
        backend = load_backend(args.backend, args.model, args.device, args.dtype, args.options)
    except LoadError as e:
        emitter.emit(ProtocolError(LOAD_FAILED, str(e), fatal=True).event())
        return EXIT_LOAD_FAILED
    except Exception as e:  # noqa: BLE001 (the orchestrator must get the cause, not a silent exit)
        traceback.print_exc(file=sys.stderr)
        emitter.emit(ProtocolError(LOAD_FAILED, f"loading {args.model} with {args.backend} failed: "
                                   f"{type(e).__name__}: {e}", fatal=True).event())
        return EXIT_LOAD_FAILED
    try:
        emitter.emit(ready_event(backend))
        leg = Leg(backend, emitter.emit)
        for raw in sys.stdin.buffer:
            t_read = time.perf_counter()
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError:
                emitter.emit(ProtocolError("malformed_request", "request line is not UTF-8").event())
                continue
            if not line.strip():
                continue  # a blank line carries no request
            msg = None
            try:
                msg = parse_line(line)
                if msg["type"] == "shutdown":
                    break
                if msg["type"] == "verify":
                    leg.handle_verify(msg, t_read)
                else:
                    leg.handle_generate(msg, t_read)
            except ProtocolError as e:
                emitter.emit(e.event())
            except Exception as e:  # noqa: BLE001 (anything else is fatal, with its cause)
                traceback.print_exc(file=sys.stderr)
                rid = msg.get("id") if isinstance(msg, dict) and isinstance(msg.get("id"), str) else None
                what = "verification" if isinstance(msg, dict) and msg.get("type") == "verify" else "generation"
                emitter.emit(ProtocolError(INTERNAL, f"{what} failed: {type(e).__name__}: {e}", rid,
                                           fatal=True).event())
                return EXIT_INTERNAL
        return 0
    except Exception as e:  # noqa: BLE001
        traceback.print_exc(file=sys.stderr)
        emitter.emit(ProtocolError(INTERNAL, f"{type(e).__name__}: {e}", fatal=True).event())
        return EXIT_INTERNAL
    finally:
        try:
            backend.close()
        except Exception:  # noqa: BLE001 (shutting down; the exit status already says what happened)
            traceback.print_exc(file=sys.stderr)
