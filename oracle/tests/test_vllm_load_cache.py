"""Whether the vLLM oracle's load compiled torch.compile's output or loaded it from a cache
(`features.load_cache`), without vLLM or a GPU: the worker probe reads vLLM's compilation
counters, and load_cache_of turns them into the state the orchestrator's load axis names."""

import sys
import types
from types import SimpleNamespace

from oracle.backends.vllm_backend import _probe_worker, load_cache_of


def counts(compiled=0, loaded=0, aot_compiled=0, aot_loaded=0):
    return {"num_inductor_compiles": compiled, "num_compiled_artifacts_loaded": loaded,
            "num_aot_compiles": aot_compiled, "num_aot_artifacts_loaded": aot_loaded}


def test_a_load_is_warm_only_when_no_graph_was_compiled():
    d = "/c/torch_compile_cache/ab/rank_0_0/backbone"
    cold = load_cache_of(counts(compiled=3), "VLLM_COMPILE", d)
    assert cold["state"] == "cold"
    assert cold["detail"] == f"torch.compile: 3 graph(s) compiled afresh, none loaded from the compile cache ({d})"
    warm = load_cache_of(counts(loaded=3), "VLLM_COMPILE", d)
    assert warm["state"] == "warm" and "3 graph(s) loaded" in warm["detail"], warm
    assert load_cache_of(counts(aot_loaded=1), "VLLM_COMPILE", None)["state"] == "warm"
    partial = load_cache_of(counts(compiled=1, loaded=2), "VLLM_COMPILE", d)
    assert partial["state"] == "partial" and "1 compiled afresh" in partial["detail"], partial
    assert load_cache_of(counts(aot_compiled=1), "VLLM_COMPILE", None)["state"] == "cold"


def test_eager_vllm_compiles_nothing_and_unread_counters_report_nothing():
    assert load_cache_of(counts(), "NONE", None)["state"] == "none"
    assert load_cache_of(None, "NONE", None)["state"] == "none"
    assert load_cache_of(counts(), "VLLM_COMPILE", None)["state"] == "none"
    assert load_cache_of(None, "VLLM_COMPILE", None) is None


def test_the_worker_probe_reads_the_counters_of_its_own_process(monkeypatch):
    counter = SimpleNamespace(**counts(compiled=0, loaded=5), num_backend_compilations=7)
    for name, mod in (("vllm", types.ModuleType("vllm")),
                      ("vllm.compilation", types.ModuleType("vllm.compilation")),
                      ("vllm.compilation.counter", types.ModuleType("vllm.compilation.counter"))):
        monkeypatch.setitem(sys.modules, name, mod)
    sys.modules["vllm.compilation.counter"].compilation_counter = counter
    comp = SimpleNamespace(local_cache_dir="/c/x/rank_0_0/backbone", cache_dir="/c/x")
    worker = SimpleNamespace(model_runner=SimpleNamespace(attn_groups=[], kv_caches=[]),
                             vllm_config=SimpleNamespace(compilation_config=comp))
    out = _probe_worker(worker)
    assert out["compile_counts"] == counts(loaded=5)
    assert out["compile_cache_dir"] == "/c/x/rank_0_0/backbone"
    assert load_cache_of(out["compile_counts"], "VLLM_COMPILE", out["compile_cache_dir"])["state"] == "warm"
    # A worker without the config: the counters still, and no directory to name.
    out = _probe_worker(SimpleNamespace(model_runner=SimpleNamespace(attn_groups=[], kv_caches=[])))
    assert out["compile_counts"] == counts(loaded=5) and out["compile_cache_dir"] is None


def test_counters_that_cannot_be_read_are_named_among_the_probes_errors(monkeypatch):
    monkeypatch.setitem(sys.modules, "vllm.compilation.counter", None)  # import fails
    out = _probe_worker(SimpleNamespace(model_runner=SimpleNamespace(attn_groups=[], kv_caches=[])))
    assert "compile_counts" not in out
    assert any(e.startswith("compilation counter: ") for e in out["errors"]), out["errors"]
