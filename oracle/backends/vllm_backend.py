"""The vLLM oracle (pinned vllm==0.26.0), offline and token-only.

Written against the v0.26.0 sources (vllm/entrypoints/llm.py, offline_utils.py,
v1/engine/llm_engine.py, v1/engine/core.py, config/cache.py, config/compilation.py):
- `LLM(model=DIR, skip_tokenizer_init=True, ...)`; prompts as {"prompt_token_ids": [...]};
  SamplingParams(temperature=0, max_tokens, ignore_eos, detokenize=False).
- Requests are added with the public `LLM.enqueue` and the engine is driven with
  `llm.llm_engine.step()`, exactly as `LLM.generate`'s own `_run_engine` loop does, so vLLM
  schedules them together (continuous batching), while we see each request finish: its
  elapsed time is taken when the step that finished it returns. Batch N keeps up to N
  requests in flight, admitting the next prompt as one finishes.
- `verify` scores prompt + forced as one prompt's log-probs (SamplingParams.prompt_logprobs,
  the prefill path; docs/ORACLE.md says why not the decode step), through the same loop.
- KV figures come from `vllm_config.cache_config` (num_gpu_blocks, block_size,
  kv_cache_size_tokens), which vLLM fills in both the in-process and the multi-process
  engine (core.py `_initialize_kv_caches`, core_client.py `_apply_ready_response`).
Every introspection is defensive: what cannot be read is listed in features.degraded,
never a crash.
"""

from __future__ import annotations

import enum
import importlib.util
import os
import signal
import time
from collections import deque
from typing import Any

from oracle.backends import Backend, LoadError, ModelInfo, OnResult, OnVerified, SeqResult, VerifyResult, descendants
from oracle.backends.vllm_logprobs import top2_gap, verified_from_prompt_logprobs
from oracle.protocol import TOO_LONG, GenerateRequest, Limits, ProtocolError, VerifyRequest

PINNED = "0.26.0"
# verify: top-k of the prompt log-probs besides the forced token (vLLM's max_logprobs is 20). The
# argmax is the best of them; k > 1 only so a tie at the top resolves to the lowest id.
VERIFY_TOPK = 4
_ENV_RECORDED = ("VLLM_ENABLE_V1_MULTIPROCESSING", "VLLM_USE_FLASHINFER_SAMPLER", "VLLM_USE_V2_MODEL_RUNNER",
                 "VLLM_ATTENTION_BACKEND", "CUDA_VISIBLE_DEVICES")
# Recorded only where set, so that goldens captured before they were recorded still compare equal
# with a run that leaves them unset: inductor's deterministic mode changes the kernels vLLM's
# torch.compile generates, and so the sums (docs/ORACLE.md).
_ENV_RECORDED_WHEN_SET = ("TORCHINDUCTOR_DETERMINISTIC",)


def recorded_env(environ) -> dict:
    """The environment a capture or run records (its `resolved.env`, compared with a golden's)."""
    env = {k: environ.get(k) for k in _ENV_RECORDED}
    env.update({k: environ[k] for k in _ENV_RECORDED_WHEN_SET if k in environ})
    return env


def _name(v: Any) -> Any:
    """Enum -> its name, torch.dtype -> 'bfloat16', else unchanged (JSON-friendly)."""
    if isinstance(v, enum.Enum):  # before int: CompilationMode is an IntEnum
        return v.name
    if v is None or isinstance(v, (bool, int, float, str)):
        return v
    s = str(v)
    return s[6:] if s.startswith("torch.") else s


def _probe_worker(worker) -> dict:
    """Runs inside each worker (via LLM.collective_rpc, in-process or in the engine core
    process): which attention backends were chosen and how many bytes the KV tensors hold."""
    out: dict = {"attention": [], "kv_bytes": None, "gpu": None, "errors": []}
    try:
        import torch

        out["gpu"] = torch.cuda.get_device_name()
    except Exception as e:  # noqa: BLE001
        out["errors"].append(f"gpu name: {type(e).__name__}: {e}")
    runner = getattr(worker, "model_runner", None)
    if runner is None:
        out["errors"].append("worker has no model_runner")
        return out
    try:
        for groups in getattr(runner, "attn_groups", []) or []:
            for g in groups if isinstance(groups, (list, tuple)) else [groups]:
                b = getattr(g, "backend", None)
                name = b.get_name() if b is not None and hasattr(b, "get_name") else None
                if name and name not in out["attention"]:
                    out["attention"].append(name)
    except Exception as e:  # noqa: BLE001
        out["errors"].append(f"attn_groups: {type(e).__name__}: {e}")
    try:
        seen, total = set(), 0
        for t in getattr(runner, "kv_caches", []) or []:
            ts = t if isinstance(t, (list, tuple)) else [t]
            for x in ts:
                key = x.untyped_storage().data_ptr()  # layers may share one allocation
                if key not in seen:
                    seen.add(key)
                    total += x.untyped_storage().nbytes()
        out["kv_bytes"] = total or None
    except Exception as e:  # noqa: BLE001
        out["errors"].append(f"kv_caches: {type(e).__name__}: {e}")
    try:
        # Per process, so read where the model was compiled (the engine core's process).
        from vllm.compilation.counter import compilation_counter

        out["compile_counts"] = {k: getattr(compilation_counter, k) for k in _COMPILED + _LOADED}
    except Exception as e:  # noqa: BLE001
        out["errors"].append(f"compilation counter: {type(e).__name__}: {e}")
    comp = getattr(getattr(worker, "vllm_config", None), "compilation_config", None)
    out["compile_cache_dir"] = getattr(comp, "local_cache_dir", None) or getattr(comp, "cache_dir", None)
    return out


# vLLM's compilation counters (vllm/compilation/counter.py) of graphs its torch.compile compiled
# in this process, and of graphs it loaded from its compile cache (VLLM_CACHE_ROOT) instead.
_COMPILED = ("num_inductor_compiles", "num_aot_compiles")
_LOADED = ("num_compiled_artifacts_loaded", "num_aot_artifacts_loaded")


def load_cache_of(counts: dict | None, compile_mode: str | None, cache_dir: str | None) -> dict | None:
    """`features.load_cache` (docs/PROTOCOL.md): whether vLLM's torch.compile output came from a
    cache an earlier process left (a warm load runs no compile, and the kernels the cache holds,
    docs/ORACLE.md) or was compiled afresh. None where the counters could not be read."""
    if compile_mode == "NONE":
        return {"state": "none", "detail": "compilation mode NONE: vLLM compiles nothing"}
    if counts is None:
        return None
    compiled = sum(int(counts.get(k) or 0) for k in _COMPILED)
    loaded = sum(int(counts.get(k) or 0) for k in _LOADED)
    where = f" ({cache_dir})" if cache_dir else ""
    if compiled and loaded:
        return {"state": "partial", "detail": f"torch.compile: {loaded} graph(s) loaded from the compile cache"
                                              f"{where}, {compiled} compiled afresh"}
    if loaded:
        return {"state": "warm", "detail": f"torch.compile: {loaded} graph(s) loaded from the compile cache{where}, "
                                           "none compiled"}
    if compiled:
        return {"state": "cold", "detail": f"torch.compile: {compiled} graph(s) compiled afresh, none loaded from "
                                           f"the compile cache{where}"}
    return {"state": "none", "detail": "torch.compile compiled and loaded no graph"}


# Which GPU the orchestrator's lease holds (docs/PROTOCOL.md, the leg's environment).
LEASED_GPU_ENV = "LLM_BENCH_LEASED_GPU"
# The option that sizes the pool in blocks: named in ready.kv.resize_option, so that the
# orchestrator's kv gate can resize this leg through its own options.
RESIZE_OPTION = "num_gpu_blocks_override"


def visible_gpu(device: str, environ) -> str | None:
    """The CUDA_VISIBLE_DEVICES to set before CUDA starts, or None to leave it: vLLM runs on "the
    visible GPU", so the leased GPU (LLM_BENCH_LEASED_GPU, set by the orchestrator) is made the
    visible one; outside a run, `--device cuda:N` does it unless the caller already chose."""
    leased = environ.get(LEASED_GPU_ENV)
    if leased is not None:
        return leased
    if ":" in device and "CUDA_VISIBLE_DEVICES" not in environ:
        return device.split(":", 1)[1]
    return None


class VllmBackend(Backend):
    name = "vllm"

    def __init__(self, info: ModelInfo, device: str, dtype: str | None, options: dict):
        self.info = info
        self.options = dict(options)
        self.degraded: list[str] = []
        if not device.startswith("cuda"):
            raise LoadError(f"--backend vllm runs on a GPU; device {device!r} is not cuda[:N]")
        visible = visible_gpu(device, os.environ)
        if visible is not None:
            # Must happen before torch initialises CUDA: vLLM uses the first visible device.
            os.environ["CUDA_VISIBLE_DEVICES"] = visible
        # Offline box: never reach for a hub; usage stats off (set here only when unset).
        for var, val in (("HF_HUB_OFFLINE", "1"), ("TRANSFORMERS_OFFLINE", "1"), ("VLLM_NO_USAGE_STATS", "1"),
                         ("DO_NOT_TRACK", "1")):
            os.environ.setdefault(var, val)
        # The engine core in this process unless the caller chose: measured on an H200 with a
        # Llama-3.2-1B config it is the faster mode on every axis (docs/ORACLE.md), so the
        # comparison is against vLLM at its best, and one process is one pid to account for.
        os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
        if "VLLM_USE_FLASHINFER_SAMPLER" not in os.environ and importlib.util.find_spec("flashinfer") is None:
            # flashinfer is not installed (not in the GPU-box pack): use vLLM's PyTorch sampler.
            os.environ["VLLM_USE_FLASHINFER_SAMPLER"] = "0"
        self.env = recorded_env(os.environ)

        try:
            import torch
            import vllm
            from vllm import LLM, SamplingParams
        except ImportError as e:
            raise LoadError(f"cannot import vllm ({e}); fix: install vllm=={PINNED} (oracle/requirements-vllm.txt, "
                            "or the GPU-box pack) and run `python -m oracle check --backend vllm`") from e
        self.torch, self.vllm, self.SamplingParams = torch, vllm, SamplingParams
        if vllm.__version__ != PINNED:
            raise LoadError(f"vllm {vllm.__version__} is installed, the oracle is pinned to {PINNED}; "
                            f"fix: pip install vllm=={PINNED}")
        if not torch.cuda.is_available():
            raise LoadError(f"torch {torch.__version__} sees no CUDA device; fix: run on the GPU box "
                            "(check CUDA_VISIBLE_DEVICES and the driver)")

        kwargs: dict[str, Any] = {
            "model": str(info.path),
            "skip_tokenizer_init": True,  # token ids in, token ids out
            "dtype": dtype or "auto",
            "enforce_eager": bool(self.options.get("enforce_eager", False)),  # default: graphs on
            "seed": self.options.get("seed", 0),
            # Identical prompts repeat across warm-up and timed passes; with prefix caching vLLM
            # would skip their prefill and the comparison with an engine without it would lie.
            "enable_prefix_caching": bool(self.options.get("enable_prefix_caching", False)),
            # EOS ids come from config.json for both oracles; don't pull sampling defaults from
            # generation_config.json (we pass explicit SamplingParams anyway).
            "generation_config": "vllm",
        }
        for key in ("gpu_memory_utilization", "max_model_len", "max_num_batched_tokens", "max_num_seqs",
                    "block_size", "num_gpu_blocks_override", "kv_cache_memory_bytes", "attention_backend"):
            if self.options.get(key) is not None:
                kwargs[key] = self.options[key]
        unknown = set(self.options) - set(kwargs) - {"enforce_eager", "seed", "enable_prefix_caching"}
        if unknown:
            raise LoadError(f"unknown vllm options {sorted(unknown)}; see `python -m oracle serve --help`")
        self.requested = {k: v for k, v in kwargs.items() if k != "model"}
        try:
            self.llm = LLM(**kwargs)
        except Exception as e:  # noqa: BLE001 (vLLM raises many types; all are a load failure)
            raise LoadError(f"vllm.LLM({', '.join(f'{k}={v!r}' for k, v in self.requested.items())}) failed: "
                            f"{type(e).__name__}: {e} (the engine core's traceback, if any, is in this leg's "
                            "stderr log)") from e
        self._introspect()

    # -- introspection -------------------------------------------------------------------------
    def _get(self, path: str, default=None):
        """Follow a dotted attribute path from self.llm; record a miss in degraded."""
        obj = self.llm
        for part in path.split("."):
            try:
                obj = getattr(obj, part)
            except AttributeError:
                self.degraded.append(f"introspection: llm.{path} not found (vLLM {self.vllm.__version__})")
                return default
        return obj

    def _introspect(self) -> None:
        vc = self._get("llm_engine.vllm_config")
        cache = getattr(vc, "cache_config", None)
        model_cfg = getattr(vc, "model_config", None)
        sched = getattr(vc, "scheduler_config", None)
        comp = getattr(vc, "compilation_config", None)
        self.vc = vc

        probe: dict = {}
        try:
            res = self.llm.collective_rpc(_pickled_probe())
            probe = res[0] if res else {}
            for err in probe.get("errors", []):
                self.degraded.append(f"introspection: worker {err}")
        except Exception as e:  # noqa: BLE001
            self.degraded.append(f"introspection: collective_rpc probe failed ({type(e).__name__}: {e})")
        self.attention = probe.get("attention") or []
        self.gpu_name = probe.get("gpu")
        self.compile_counts = probe.get("compile_counts")
        self.compile_cache_dir = probe.get("compile_cache_dir")
        if not self.attention:
            self.degraded.append("introspection: attention backend unknown")

        block_size = getattr(cache, "block_size", None)
        num_blocks = getattr(cache, "num_gpu_blocks", None)
        self.max_model_len = getattr(model_cfg, "max_model_len", None) or self.info.max_position_embeddings
        self.kv: dict | None = None
        if isinstance(block_size, int) and isinstance(num_blocks, int):
            cap = block_size * num_blocks
            kv_bytes = probe.get("kv_bytes")
            if kv_bytes is None:
                kv_bytes = self._kv_bytes_formula(model_cfg, vc, cache, num_blocks * block_size)
            self.kv = {"block_size": block_size, "num_blocks": num_blocks, "capacity_tokens": cap, "bytes": kv_bytes,
                       "resize_option": RESIZE_OPTION}
            reported = getattr(cache, "kv_cache_size_tokens", None)
            if isinstance(reported, int) and reported != cap:
                self.kv["vllm_reported_tokens"] = reported  # hybrid models: group-aware figure
        else:
            self.degraded.append(f"introspection: KV pool unknown (block_size={block_size!r}, "
                                 f"num_gpu_blocks={num_blocks!r})")
        self.max_batch = getattr(sched, "max_num_seqs", None)
        cg_mode = getattr(comp, "cudagraph_mode", None)
        self.cuda_graphs = cg_mode is not None and _name(cg_mode) != "NONE"
        sizes = getattr(comp, "cudagraph_capture_sizes", None) or []
        self.compile = {
            "mode": _name(getattr(comp, "mode", None)),
            "cudagraph_mode": _name(cg_mode),
            "cudagraph_capture_sizes": [min(sizes), max(sizes), len(sizes)] if sizes and self.cuda_graphs else None,
        }
        multiproc = self.env.get("VLLM_ENABLE_V1_MULTIPROCESSING")
        self.engine_mode = "in-process" if multiproc == "0" else "multi-process"
        try:
            self.v2_runner = bool(vc.use_v2_model_runner)
        except Exception:  # noqa: BLE001
            self.v2_runner = None
        self.limits = Limits(vocab_size=self.info.vocab_size, max_model_len=int(self.max_model_len),
                             kv_capacity_tokens=self.kv["capacity_tokens"] if self.kv else None)
        self.resolved = {
            "backend": "vllm",
            "device": "cuda",
            "dtype": _name(getattr(model_cfg, "dtype", None)),
            "architecture": self.info.architecture,
            "model_config_sha256": self.info.config_sha256,
            "max_model_len": self.max_model_len,
            "vocab_size": self.info.vocab_size,
            "eos_token_ids": sorted(self.info.eos_ids),
            "enforce_eager": bool(getattr(model_cfg, "enforce_eager", self.requested["enforce_eager"])),
            "gpu_memory_utilization": getattr(cache, "gpu_memory_utilization", None),
            "max_num_batched_tokens": getattr(sched, "max_num_batched_tokens", None),
            "max_num_seqs": self.max_batch,
            "block_size": block_size,
            "num_gpu_blocks_override": getattr(cache, "num_gpu_blocks_override", None),
            "kv_cache_memory_bytes": getattr(cache, "kv_cache_memory_bytes", None),
            "attention_backend": self.attention[0] if len(self.attention) == 1 else (self.attention or None),
            "attention_backend_requested": self.options.get("attention_backend"),
            "seed": getattr(model_cfg, "seed", self.requested["seed"]),
            "enable_prefix_caching": getattr(cache, "enable_prefix_caching", None),
            "compile_mode": self.compile["mode"],
            "cudagraph_mode": self.compile["cudagraph_mode"],
            "engine": self.engine_mode,
            "v2_model_runner": self.v2_runner,
            "skip_tokenizer_init": True,
            "generation_config": "vllm",
            "env": self.env,
        }

    def _kv_bytes_formula(self, model_cfg, vc, cache, tokens: int) -> int | None:
        """2 (K and V) x layers x KV heads x head size x element bytes x tokens."""
        try:
            par = vc.parallel_config
            layers = model_cfg.get_num_layers(par)
            heads = model_cfg.get_num_kv_heads(par)
            head = model_cfg.get_head_size()
            cdt = getattr(cache, "cache_dtype", "auto")
            elem = (self.torch.empty((), dtype=model_cfg.dtype).element_size() if cdt in (None, "auto")
                    else (1 if "fp8" in str(cdt) else 2))
            self.degraded.append("introspection: KV bytes computed from the model shape, not read from the pool")
            return 2 * layers * heads * head * elem * tokens
        except Exception as e:  # noqa: BLE001
            self.degraded.append(f"introspection: KV bytes unknown ({type(e).__name__}: {e})")
            return None

    # -- ready -----------------------------------------------------------------------------------
    def ready_fields(self) -> dict:
        from oracle import versions

        # device "cpu" here: this process may own no CUDA context (multi-process engine), so
        # the GPU name comes from the worker probe and the driver from /proc.
        v = versions.collect(self.torch, "cpu")
        v["vllm"] = self.vllm.__version__
        drv = versions.nvidia_driver()
        if drv:
            v["driver"] = drv
        if self.gpu_name:
            v["gpu"] = self.gpu_name
        features = {
            "backend": "vllm",
            "dtype": self.resolved["dtype"],
            "device": "cuda",
            "cuda_graphs": self.cuda_graphs,
            "kernels": [f"attention:{a}" for a in self.attention],
            "attention_backend": self.resolved["attention_backend"],
            "compile_mode": self.compile["mode"],
            "cudagraph_mode": self.compile["cudagraph_mode"],
            "cudagraph_capture_sizes": self.compile["cudagraph_capture_sizes"],
            "engine": self.engine_mode,
            "degraded": list(self.degraded),
        }
        load_cache = load_cache_of(self.compile_counts, self.compile["mode"], self.compile_cache_dir)
        if load_cache is not None:  # else degraded says why
            features["load_cache"] = load_cache
        return {
            "kv": self.kv,
            "features": features,
            "versions": v,
            "resolved": self.resolved,
            "pids": descendants(),  # the engine core (multi-process mode) and compile workers
        }

    # -- generation --------------------------------------------------------------------------------
    def _drive(self, prompts: list[list[int]], params, batch: int, on_finished) -> None:
        """Keep up to `batch` requests in flight, the next admitted as one finishes, and step the
        engine as LLM.generate's own loop does; on_finished(index, output, now, t0, m0) for each
        finished request, `now` taken when the step that finished it returned."""
        engine = self.llm.llm_engine
        pending = deque(enumerate(prompts))
        inflight: dict[str, tuple[int, float, float]] = {}  # request id -> (index, t0, monotonic t0)
        t_req, mono_req = time.perf_counter(), time.monotonic()

        def admit() -> None:
            while pending and len(inflight) < batch:
                i, p = pending.popleft()
                t0, m0 = (time.perf_counter(), time.monotonic()) if batch == 1 else (t_req, mono_req)
                rid = self.llm.enqueue([{"prompt_token_ids": list(p)}], params, use_tqdm=False)[0]
                inflight[rid] = (i, t0, m0)

        admit()
        while inflight:
            # step() returns once this step's sampled ids are on the host, so no extra sync
            # (and none from this process: in multi-process mode it owns no CUDA context).
            outs = engine.step()
            now = time.perf_counter()
            for o in outs:
                key = _match_request(o.request_id, inflight)
                if not getattr(o, "finished", False) or key is None:
                    continue
                i, t0, m0 = inflight.pop(key)
                on_finished(i, o, now, t0, m0)
            admit()
            if inflight and not outs and not engine.has_unfinished_requests():
                raise RuntimeError(f"vLLM reports no unfinished requests but {len(inflight)} never finished")

    def generate(self, req: GenerateRequest, on_result: OnResult, margins: bool = False) -> None:
        sp: dict[str, Any] = {"temperature": 0.0, "max_tokens": req.max_tokens, "ignore_eos": req.ignore_eos,
                              "detokenize": False}
        if not req.ignore_eos and self.info.eos_ids:
            # No tokenizer, so vLLM knows no EOS id: stop at config.json's ids (the token is kept).
            sp["stop_token_ids"] = list(self.info.eos_ids)
        if margins:
            sp["logprobs"] = 2  # raw log-probs of the top 2 (their gap equals the logit gap)

        def finished(i: int, o, now: float, t0: float, m0: float) -> None:
            comp = o.outputs[0]
            ttft = None
            metrics = getattr(o, "metrics", None)  # only when vLLM's stats logging is on
            first = getattr(metrics, "first_token_ts", 0.0) if metrics is not None else 0.0
            if first and first > m0:  # engine-core timestamps are time.monotonic()
                ttft = first - m0
            gaps = runner_up = None
            if margins:
                gaps, runner_up = [], []
                for chosen, pos in zip(comp.token_ids, comp.logprobs or []):
                    gap, other = top2_gap(chosen, {t: lp.logprob for t, lp in (pos or {}).items()})
                    gaps.append(gap)
                    runner_up.append(other)
            on_result(SeqResult(i, list(comp.token_ids), now - t0, ttft, gaps, runner_up))

        self._drive(req.prompts, self.SamplingParams(**sp), req.batch, finished)

    # -- verify (teacher forcing) ------------------------------------------------------------------
    def check_request(self, req: GenerateRequest | VerifyRequest) -> None:
        """vLLM takes a prompt only below max_model_len (one slot stays for a generated token:
        vllm/v1/engine/input_processor.py `_validate_prompt_len`), and verify sends
        prompt + forced as one prompt, so a row filling the context exactly cannot be scored."""
        if not isinstance(req, VerifyRequest):
            return
        for i, (p, f) in enumerate(zip(req.prompts, req.forced)):
            n = len(p) + len(f)
            if n >= self.limits.max_model_len:
                raise ProtocolError(
                    TOO_LONG,
                    f"prompt {i}: {len(p)} prompt tokens + {len(f)} forced tokens = {n} fill vLLM's whole context "
                    f"(max_model_len {self.limits.max_model_len}); the vLLM oracle scores forced tokens as the "
                    f"prompt log-probs of one {n}-token prompt, and vLLM accepts a prompt only below max_model_len; "
                    f"fix: start the leg with --max-model-len {n + 1} or more, or force one token fewer",
                    req.id,
                )

    def verify(self, req: VerifyRequest, on_verified: OnVerified) -> None:
        """Prefill path: each prompt + its forced row is one request with prompt log-probs (the
        forced token's own log-prob is always returned beside the top-k) and max_tokens 1, up to
        req.batch in flight as generate has them. Log-probs only, so scale is unknown (None)."""
        params = self.SamplingParams(temperature=0.0, max_tokens=1, ignore_eos=True, detokenize=False,
                                     prompt_logprobs=VERIFY_TOPK)
        rows = [list(p) + list(f) for p, f in zip(req.prompts, req.forced)]

        def finished(i: int, o, now: float, t0: float, m0: float) -> None:
            argmax, gap = verified_from_prompt_logprobs(len(req.prompts[i]), req.forced[i],
                                                        getattr(o, "prompt_logprobs", None))
            on_verified(VerifyResult(i, argmax, gap, None, "prefill"))

        self._drive(rows, params, req.batch, finished)

    def close(self) -> None:
        """Shut the engine down and make sure no child process is left behind."""
        core = getattr(getattr(self, "llm", None), "llm_engine", None)
        core = getattr(core, "engine_core", None)
        if core is not None and hasattr(core, "shutdown"):
            try:
                core.shutdown()
            except Exception:  # noqa: BLE001 (we reap the children below either way)
                pass
        kids = descendants()
        for sig in (signal.SIGTERM, signal.SIGKILL):
            if not kids:
                break
            for pid in kids:
                try:
                    os.kill(pid, sig)
                except ProcessLookupError:
                    pass
            deadline = time.monotonic() + 5
            while time.monotonic() < deadline:
                kids = [p for p in kids if os.path.exists(f"/proc/{p}") and not _is_zombie(p)]
                if not kids:
                    break
                time.sleep(0.1)


def _pickled_probe() -> bytes:
    """_probe_worker as cloudpickle bytes, by value: vLLM's run_method() unpickles bytes in the
    worker, and bytes cross the multi-process engine's msgspec channel, where a plain function
    is refused unless VLLM_ALLOW_INSECURE_SERIALIZATION=1 (seen on the GPU box)."""
    import sys

    import cloudpickle

    mod = sys.modules[__name__]
    cloudpickle.register_pickle_by_value(mod)  # the engine core need not import `oracle`
    try:
        return cloudpickle.dumps(_probe_worker)
    finally:
        cloudpickle.unregister_pickle_by_value(mod)


def _match_request(external: str, inflight: dict) -> str | None:
    """enqueue() returns vLLM's internal id ("<n>-<8 random chars>", input_processor.py
    assign_request_id), while RequestOutput.request_id is the external "<n>"."""
    if external in inflight:
        return external
    return next((k for k in inflight if k.startswith(external + "-")), None)


def _is_zombie(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            if f.read().rsplit(")", 1)[1].split()[0] == "Z":
                try:
                    os.waitpid(pid, os.WNOHANG)  # reap our own zombie child
                except ChildProcessError:
                    pass
                return True
    except OSError:
        return True
    return False
