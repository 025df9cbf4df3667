"""The leg protocol (docs/PROTOCOL.md): request parsing/validation and event writing.

Kept free of torch/vLLM imports so it can be unit-tested and reused by every backend.
"""

from __future__ import annotations

import json
import os
import sys
import threading
from dataclasses import dataclass
from typing import Any, TextIO

# Error codes (docs/PROTOCOL.md, table under `error`).
MALFORMED = "malformed_request"
BAD_TOKEN = "bad_token"
EMPTY_PROMPT = "empty_prompt"
TOO_LONG = "too_long"
OVER_CAPACITY = "over_capacity"
LOAD_FAILED = "load_failed"
INTERNAL = "internal"

# Every field each request may carry. Any other is refused (malformed_request, naming it), never
# ignored: a field the leg does not know would change what the orchestrator believes it asked
# for (docs/PROTOCOL.md, "Unknown fields").
REQUEST_FIELDS = {
    "generate": {"type", "id", "prompts", "max_tokens", "ignore_eos", "batch"},
    "verify": {"type", "id", "prompts", "forced", "batch"},
    "shutdown": {"type"},
}


class ProtocolError(Exception):
    """A request-level error that becomes one `error` event."""

    def __init__(self, code: str, message: str, req_id: str | None = None, fatal: bool = False):
        super().__init__(message)
        self.code = code
        self.message = message
        self.req_id = req_id
        self.fatal = fatal

    def event(self) -> dict:
        ev: dict[str, Any] = {"type": "error", "code": self.code, "message": self.message, "fatal": self.fatal}
        if self.req_id is not None:
            ev["id"] = self.req_id
        return ev


@dataclass
class GenerateRequest:
    id: str
    prompts: list[list[int]]
    max_tokens: int
    ignore_eos: bool
    batch: int


@dataclass
class VerifyRequest:
    """Teacher forcing (docs/PROTOCOL.md `verify`): feed `forced[i]` after `prompts[i]`."""

    id: str
    prompts: list[list[int]]
    forced: list[list[int]]
    batch: int


@dataclass
class Limits:
    """What a backend can accept; used to validate a whole request before it starts."""

    vocab_size: int
    max_model_len: int
    # Tokens the KV pool holds (None: no pool, e.g. transformers).
    kv_capacity_tokens: int | None = None


REQUEST_TYPES = ("generate", "verify", "shutdown")


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def parse_line(line: str) -> dict:
    """One stdin line -> a message dict with a known type, or ProtocolError(malformed)."""
    try:
        msg = json.loads(line)
    except json.JSONDecodeError as e:
        snippet = line.strip()[:80]
        raise ProtocolError(MALFORMED, f"request line is not JSON ({e.msg} at column {e.colno}): {snippet!r}; "
                            "fix: send one JSON object per line") from None
    if not isinstance(msg, dict):
        raise ProtocolError(MALFORMED, f"request must be a JSON object, got {type(msg).__name__}; "
                            "fix: send {\"type\": ...} objects")
    req_id = msg.get("id") if isinstance(msg.get("id"), str) else None
    t = msg.get("type")
    if t is None:
        raise ProtocolError(MALFORMED, "request has no \"type\" field; fix: add \"type\": \"generate\", "
                            "\"verify\" or \"shutdown\"", req_id)
    if t not in REQUEST_TYPES:
        raise ProtocolError(MALFORMED, f"unknown request type {t!r}; the oracle accepts "
                            + ", ".join(f"\"{r}\"" for r in REQUEST_TYPES), req_id)
    unknown = sorted(set(msg) - REQUEST_FIELDS[t])
    if unknown:
        raise ProtocolError(MALFORMED, f"{t} request has unknown field(s) {', '.join(map(repr, unknown))}; "
                            "fix: send only the fields docs/PROTOCOL.md defines for it", req_id)
    return msg


def _request_id(msg: dict, kind: str) -> str:
    req_id = msg.get("id")
    if not isinstance(req_id, str):
        raise ProtocolError(MALFORMED, f"{kind} needs \"id\": a string" +
                            ("" if "id" not in msg else f", got {type(req_id).__name__}"))
    return req_id


def _token_lists(msg: dict, name: str, problems: list[str], non_empty_rows: bool = False) -> None:
    """Append to `problems` what is wrong with msg[name] as a non-empty list of lists of integers."""
    rows = msg.get(name)
    if name not in msg:
        problems.append(f"missing \"{name}\" (a list of lists of token ids)")
        return
    if not isinstance(rows, list) or not rows:
        problems.append(f"\"{name}\" must be a non-empty list of lists of integers")
        return
    for i, p in enumerate(rows):
        if not isinstance(p, list):
            problems.append(f"{name}[{i}] is a {type(p).__name__}, not a list of integers")
            return
        if non_empty_rows and not p:
            problems.append(f"{name}[{i}] is empty (each needs at least one token id)")
            return
        bad = next((j for j, t in enumerate(p) if not _is_int(t)), None)
        if bad is not None:
            problems.append(f"{name}[{i}][{bad}] = {p[bad]!r} is not an integer")
            return


def _scalars(msg: dict, fields: tuple, problems: list[str]) -> None:
    for name, check, want in fields:
        if name not in msg:
            problems.append(f"missing \"{name}\" ({want})")
        elif not check(msg[name]):
            problems.append(f"\"{name}\" must be {want}, got {msg[name]!r}")


_BATCH = ("batch", lambda v: _is_int(v) and v >= 1, "an integer >= 1")


def parse_generate(msg: dict) -> GenerateRequest:
    """Check presence and types of every generate field (malformed_request otherwise)."""
    req_id = _request_id(msg, "generate")
    problems: list[str] = []
    _token_lists(msg, "prompts", problems)
    _scalars(msg, (
        ("max_tokens", lambda v: _is_int(v) and v >= 1, "an integer >= 1"),
        ("ignore_eos", lambda v: isinstance(v, bool), "a boolean"),
        _BATCH,
    ), problems)
    if problems:
        raise ProtocolError(MALFORMED, "malformed generate request: " + "; ".join(problems), req_id)
    return GenerateRequest(req_id, msg["prompts"], msg["max_tokens"], msg["ignore_eos"], msg["batch"])


def parse_verify(msg: dict) -> VerifyRequest:
    """Check presence and types of every verify field (malformed_request otherwise). An empty
    forced row is malformed, as max_tokens 0 is for generate."""
    req_id = _request_id(msg, "verify")
    problems: list[str] = []
    _token_lists(msg, "prompts", problems)
    _token_lists(msg, "forced", problems, non_empty_rows=True)
    _scalars(msg, (_BATCH,), problems)
    if not problems and len(msg["forced"]) != len(msg["prompts"]):
        problems.append(f"\"forced\" has {len(msg['forced'])} rows for {len(msg['prompts'])} prompts "
                        "(one row of forced tokens per prompt)")
    if problems:
        raise ProtocolError(MALFORMED, "malformed verify request: " + "; ".join(problems), req_id)
    return VerifyRequest(req_id, msg["prompts"], msg["forced"], msg["batch"])


def validate(req: GenerateRequest | VerifyRequest, limits: Limits) -> None:
    """Validate every prompt before any starts (so an error means no result was sent). A verify
    request is validated as a generate with max_tokens = len(forced[i]) per prompt, and its
    forced ids must be in the vocabulary too."""
    forced = req.forced if isinstance(req, VerifyRequest) else None
    for i, p in enumerate(req.prompts):
        if not p:
            raise ProtocolError(EMPTY_PROMPT, f"prompt {i} has no tokens; fix: send at least one token id", req.id)
        _check_vocab(req.id, f"prompt {i}", p, limits.vocab_size, "tokenize for this model")
        if forced is not None:
            _check_vocab(req.id, f"forced {i}", forced[i], limits.vocab_size,
                         "force tokens of this model's vocabulary (a golden of another model?)")
        new = len(forced[i]) if forced is not None else req.max_tokens
        what = f"{len(forced[i])} forced tokens" if forced is not None else f"max_tokens {req.max_tokens}"
        need = len(p) + new
        if need > limits.max_model_len:
            raise ProtocolError(
                TOO_LONG,
                f"prompt {i}: {len(p)} prompt tokens + {what} = {need} exceeds the model's maximum context "
                f"{limits.max_model_len}; fix: shorten the prompt or " +
                ("force fewer tokens" if forced is not None else "lower max_tokens"),
                req.id,
            )
        if limits.kv_capacity_tokens is not None and need > limits.kv_capacity_tokens:
            raise ProtocolError(
                OVER_CAPACITY,
                f"prompt {i} needs {need} KV tokens but the whole pool holds {limits.kv_capacity_tokens}; "
                "fix: give the leg a bigger KV pool (gpu_memory_utilization / kv_cache_memory_bytes)",
                req.id,
            )


def _check_vocab(req_id: str, row: str, tokens: list[int], vocab: int, fix: str) -> None:
    for j, t in enumerate(tokens):
        if t < 0 or t >= vocab:
            raise ProtocolError(
                BAD_TOKEN,
                f"{row}, position {j}: token id {t} is outside the vocabulary [0, {vocab}) (vocab {vocab}); "
                f"fix: {fix}",
                req_id,
            )


class Emitter:
    """Writes protocol events, one JSON object per line, to the protocol stream only."""

    def __init__(self, stream: TextIO):
        self._stream = stream
        self._lock = threading.Lock()

    def emit(self, event: dict) -> None:
        line = json.dumps(event, separators=(",", ":"), allow_nan=False)
        with self._lock:
            self._stream.write(line + "\n")
            self._stream.flush()


def claim_stdout() -> TextIO:
    """Reserve the real stdout for protocol lines and send everything else to stderr.

    Duplicates fd 1 to a private descriptor for the protocol, then points fd 1 (and
    sys.stdout) at stderr, so prints from libraries, C extensions and child processes (vLLM's
    engine core inherits fd 1) can never corrupt the protocol stream.
    """
    sys.stdout.flush()
    proto_fd = os.dup(1)
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    return os.fdopen(proto_fd, "w", encoding="utf-8", buffering=1)
