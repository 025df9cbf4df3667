"""The Hugging Face transformers reference oracle (cpu or cuda), greedy, no KV pool.

`verify` (teacher forcing) runs this very loop with the forced token appended instead of the
argmax: the prefill gives position 0, each later position one single-token pass over the cache
(`path` "decode"), so a forced row equal to the generated tokens reproduces generate's logits
bit for bit.

Decoding is our own loop over `model(...)` with a per-sequence DynamicCache: prefill the whole
prompt in one forward pass, then one token per pass, argmax over float32 logits (the lowest
index wins ties, as torch.argmax does). EOS never alters logits: with ignore_eos the loop simply
does not stop at it.

Batch N: up to N sequences are in flight, each with its own cache, stepped round-robin one
token at a time; a finished one is replaced by the next prompt. There is no padding, so every
forward pass has exactly the shapes it has at batch 1 and the tokens are bit-identical to
batch 1 (left-padded batched generate is not). The price: no throughput gain from batching;
the transformers oracle is a correctness reference, vLLM is the speed oracle.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from oracle.backends import Backend, LoadError, ModelInfo, OnResult, OnVerified, SeqResult, VerifyResult
from oracle.protocol import GenerateRequest, Limits, VerifyRequest

NO_KV = "none: transformers has no paged pool"


@dataclass
class _Seq:
    index: int
    prompt: list[int]
    t0: float
    cache: object = None
    tokens: list[int] = field(default_factory=list)
    margins: list[float] = field(default_factory=list)
    runner_up: list[int] = field(default_factory=list)
    ttft: float | None = None
    # verify: the tokens to feed, and per position argmax, gap and max |logit|
    forced: list[int] | None = None
    argmax: list[int] = field(default_factory=list)
    gap: list[float] = field(default_factory=list)
    scale: list[float] = field(default_factory=list)


class TransformersBackend(Backend):
    name = "transformers"

    def __init__(self, info: ModelInfo, device: str, dtype: str, options: dict):
        if options:
            raise LoadError(f"options {sorted(options)} apply to --backend vllm only; "
                            "fix: drop them from [oracle.options] for the transformers oracle")
        import torch
        from transformers import AutoModelForCausalLM

        self.torch = torch
        self.info = info
        if device != "cpu" and not device.startswith("cuda"):
            raise LoadError(f"device {device!r} is not cpu or cuda[:N]")
        if device.startswith("cuda") and not torch.cuda.is_available():
            raise LoadError(f"device {device} requested but torch {torch.__version__} sees no CUDA device; "
                            "fix: use --device cpu or a CUDA build of torch on a GPU machine")
        self.device = torch.device(device)
        self.dtype_name = dtype
        tdtype = getattr(torch, dtype)
        try:
            model = AutoModelForCausalLM.from_pretrained(str(info.path), dtype=tdtype)
        except Exception as e:  # noqa: BLE001 (any loader failure is a load_failed with its cause)
            raise LoadError(f"transformers could not load {info.path} ({type(e).__name__}: {e}); "
                            "fix: check config.json and the safetensors files") from e
        self.model = model.to(self.device).eval()
        cfg = self.model.config
        self.attn = getattr(cfg, "_attn_implementation", None) or "unknown"
        max_len = info.max_position_embeddings or getattr(cfg, "max_position_embeddings", None)
        if not isinstance(max_len, int):
            raise LoadError("config.json has no max_position_embeddings; the oracle cannot check too_long")
        self.eos = set(info.eos_ids)
        self.limits = Limits(vocab_size=info.vocab_size, max_model_len=max_len)
        # One tiny forward so lazy initialisation (kernels, allocator) is inside load_s.
        with torch.inference_mode():
            self.model(torch.tensor([[0]], device=self.device), use_cache=True)
        self._sync()

    # -- ready -------------------------------------------------------------------------------
    def ready_fields(self) -> dict:
        from oracle import versions

        torch = self.torch
        return {
            "kv": None,
            "features": {
                "backend": "transformers",
                "dtype": self.dtype_name,
                "device": str(self.device),
                "cuda_graphs": False,
                "kernels": [f"attention:{self.attn}"],
                "attention_backend": self.attn,
                "compile_mode": None,
                # machine-dependent, so here and not in `resolved` (which a golden is compared on)
                "torch_threads": torch.get_num_threads(),
                "kv": NO_KV,
                "load_cache": {"state": "none", "detail": "eager PyTorch: nothing compiled or timed at load"},
                "degraded": [],
            },
            "versions": versions.collect(torch, str(self.device)),
            "resolved": {
                "backend": "transformers",
                "device": self.device.type,  # cpu / cuda: the golden must not depend on the GPU index
                "dtype": self.dtype_name,
                "architecture": self.info.architecture,
                "model_config_sha256": self.info.config_sha256,
                "attn_implementation": self.attn,
                "max_model_len": self.limits.max_model_len,
                "vocab_size": self.info.vocab_size,
                "eos_token_ids": sorted(self.eos),
                "batching": "round-robin, one cache per sequence, no padding (tokens identical to batch 1)",
                "greedy": "argmax of float32 logits, lowest id on ties",
            },
            "pids": [],  # no child processes
        }

    # -- generation ----------------------------------------------------------------------------
    def _sync(self) -> None:
        if self.device.type == "cuda":
            self.torch.cuda.synchronize(self.device)

    def _step(self, seq: _Seq, want_margins: bool) -> int:
        """One forward pass (the prompt's prefill, then one token over the cache); appends and
        returns the token fed next: the argmax, or with seq.forced the forced token."""
        torch = self.torch
        ids = seq.prompt if not seq.tokens else seq.tokens[-1:]
        inp = torch.tensor([ids], dtype=torch.long, device=self.device)
        out = self.model(input_ids=inp, past_key_values=seq.cache, use_cache=True, logits_to_keep=1)
        seq.cache = out.past_key_values
        logits = out.logits[0, -1].float()
        tok = int(torch.argmax(logits))  # first maximal index: lowest id wins ties
        if seq.forced is not None:
            forced = seq.forced[len(seq.tokens)]
            # Both logits come from one widened row: the same token gives exactly 0.
            seq.argmax.append(tok)
            seq.gap.append(float(logits[tok] - logits[forced]))
            seq.scale.append(float(logits.abs().max()))
            tok = forced
        if want_margins:
            top = torch.topk(logits, 2)
            seq.margins.append(float(top.values[0] - top.values[1]))
            # On a tie topk may list either first; the runner-up is the one argmax did not take.
            ids = [int(i) for i in top.indices]
            seq.runner_up.append(ids[1] if ids[0] == tok else ids[0])
        seq.tokens.append(tok)
        return tok

    def generate(self, req: GenerateRequest, on_result: OnResult, margins: bool = False) -> None:
        torch = self.torch
        pending = list(enumerate(req.prompts))
        pending.reverse()  # pop() from the end takes prompts in order
        active: list[_Seq] = []
        self._sync()
        t_req = time.perf_counter()
        with torch.inference_mode():
            while pending or active:
                while pending and len(active) < req.batch:
                    i, p = pending.pop()
                    # batch 1: the clock starts at this prompt's prefill; batch N: at the request.
                    t0 = time.perf_counter() if req.batch == 1 else t_req
                    active.append(_Seq(index=i, prompt=list(p), t0=t0))
                for seq in list(active):
                    tok = self._step(seq, margins)
                    self._sync()
                    now = time.perf_counter()
                    if seq.ttft is None:
                        seq.ttft = now - seq.t0
                    stop = len(seq.tokens) >= req.max_tokens or (not req.ignore_eos and tok in self.eos)
                    if stop:
                        active.remove(seq)
                        seq.cache = None  # free it before the next prompt starts
                        on_result(SeqResult(seq.index, seq.tokens, now - seq.t0, seq.ttft,
                                            seq.margins if margins else None,
                                            seq.runner_up if margins else None))

    def verify(self, req: VerifyRequest, on_verified: OnVerified) -> None:
        """generate's round-robin loop with the forced tokens fed: EOS never stops a row."""
        torch = self.torch
        pending = list(enumerate(zip(req.prompts, req.forced)))
        pending.reverse()
        active: list[_Seq] = []
        with torch.inference_mode():
            while pending or active:
                while pending and len(active) < req.batch:
                    i, (p, f) = pending.pop()
                    active.append(_Seq(index=i, prompt=list(p), t0=0.0, forced=list(f)))
                for seq in list(active):
                    self._step(seq, False)
                    if len(seq.tokens) >= len(seq.forced):
                        active.remove(seq)
                        seq.cache = None
                        on_verified(VerifyResult(seq.index, seq.argmax, seq.gap, seq.scale, "decode"))
