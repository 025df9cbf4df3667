"""Backends behind the leg protocol. Each is imported lazily (the transformers backend never
imports vllm)."""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from oracle.protocol import GenerateRequest, Limits, VerifyRequest

BACKENDS = ("transformers", "vllm")
DTYPES = ("float32", "bfloat16", "float16")


class LoadError(Exception):
    """The model could not be loaded; becomes `load_failed`. The message names cause and fix."""


@dataclass
class SeqResult:
    index: int
    tokens: list[int]
    elapsed_s: float
    ttft_s: float | None = None
    # top-1 minus top-2 logit (or log-prob) per new position; filled only when asked for.
    margins: list[float] | None = None
    # per new position, the best token other than the one chosen (the golden's runner-up), so a
    # mismatch at a near-tie can be told from a wrong token there; filled with the margins.
    runner_up: list[int | None] | None = None


OnResult = Callable[[SeqResult], None]


@dataclass
class VerifyResult:
    """One prompt of a `verify` (docs/PROTOCOL.md `verified`): per forced position, the backend's
    greedy choice, logit(argmax) - logit(forced), the largest |logit| (None where unknown), and
    which code path produced the logits."""

    index: int
    argmax: list[int]
    gap: list[float]
    scale: list[float] | None
    path: str


OnVerified = Callable[[VerifyResult], None]


@dataclass
class ModelInfo:
    """What the oracle reads from config.json itself (independent of either library)."""

    path: Path
    config: dict
    architecture: str
    vocab_size: int
    max_position_embeddings: int | None
    eos_ids: list[int]
    config_sha256: str
    weight_files: list[str] = field(default_factory=list)


def read_model_dir(path: str) -> ModelInfo:
    p = Path(path)
    if not p.is_dir():
        raise LoadError(f"model directory {path!r} does not exist (or is not a directory); "
                        "fix: pass --model DIR holding config.json and *.safetensors")
    cfg_path = p / "config.json"
    if not cfg_path.is_file():
        raise LoadError(f"{cfg_path} is missing; fix: point --model at a Hugging Face checkpoint directory")
    raw = cfg_path.read_bytes()
    try:
        cfg = json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise LoadError(f"{cfg_path} is not valid JSON ({e}); fix: restore the file from the checkpoint") from None
    if not isinstance(cfg, dict):
        raise LoadError(f"{cfg_path} must hold a JSON object, got {type(cfg).__name__}")
    archs = cfg.get("architectures") or []
    arch = archs[0] if isinstance(archs, list) and archs else cfg.get("model_type", "?")
    text_cfg = cfg.get("text_config") if isinstance(cfg.get("text_config"), dict) else cfg
    vocab = text_cfg.get("vocab_size")
    if not isinstance(vocab, int) or vocab <= 0:
        raise LoadError(f"{cfg_path} has no valid vocab_size ({vocab!r}); fix: restore config.json")
    eos = text_cfg.get("eos_token_id", cfg.get("eos_token_id"))
    eos_ids = [eos] if isinstance(eos, int) else [e for e in (eos or []) if isinstance(e, int)]
    weights = sorted(f.name for f in p.iterdir() if f.name.endswith(".safetensors") or f.name.endswith(".bin"))
    if not weights:
        raise LoadError(f"{p} has no *.safetensors weight files; fix: point --model at a complete checkpoint")
    return ModelInfo(
        path=p.resolve(),
        config=cfg,
        architecture=str(arch),
        vocab_size=vocab,
        max_position_embeddings=text_cfg.get("max_position_embeddings"),
        eos_ids=eos_ids,
        config_sha256=hashlib.sha256(raw).hexdigest(),
        weight_files=weights,
    )


class Backend:
    """One loaded model. Subclasses fill the ready fields and implement generate()."""

    name = "?"
    limits: Limits

    def ready_fields(self) -> dict[str, Any]:
        """kv, features, versions, resolved, pids (the rest of `ready` is added by serve)."""
        raise NotImplementedError

    def generate(self, req: GenerateRequest, on_result: OnResult, margins: bool = False) -> None:
        """Run req; call on_result once per prompt, in completion order. Timing follows
        docs/PROTOCOL.md (batch 1: from this prompt's prefill; batch N: from request start)."""
        raise NotImplementedError

    def check_request(self, req: GenerateRequest | VerifyRequest) -> None:
        """What only this backend refuses beyond docs/PROTOCOL.md's validation: raise a
        ProtocolError (called before any prompt of req starts)."""

    def verify(self, req: VerifyRequest, on_verified: OnVerified) -> None:
        """Teacher-force req (already validated); call on_verified once per prompt, in completion
        order, up to req.batch prompts in flight as generate has them."""
        raise NotImplementedError

    def close(self) -> None:
        pass


def descendants(pid: int | None = None) -> list[int]:
    """All live descendants of pid (default: this process), by scanning /proc (no psutil)."""
    root = os.getpid() if pid is None else pid
    children: dict[int, list[int]] = {}
    try:
        entries = os.listdir("/proc")
    except OSError:
        return []
    for e in entries:
        if not e.isdigit():
            continue
        try:
            with open(f"/proc/{e}/stat") as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue  # raced with an exiting process
        children.setdefault(ppid, []).append(int(e))
    out, stack = [], [root]
    while stack:
        for c in children.get(stack.pop(), []):
            out.append(c)
            stack.append(c)
    return sorted(out)


def load_backend(name: str, model: str, device: str | None, dtype: str | None, options: dict) -> Backend:
    info = read_model_dir(model)
    if name == "transformers":
        from oracle.backends.transformers_backend import TransformersBackend

        return TransformersBackend(info, device or "cpu", dtype or "float32", options)
    if name == "vllm":
        from oracle.backends.vllm_backend import VllmBackend

        return VllmBackend(info, device or "cuda", dtype, options)
    raise LoadError(f"unknown backend {name!r}; choose one of {', '.join(BACKENDS)}")
