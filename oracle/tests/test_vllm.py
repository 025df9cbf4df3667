"""The vLLM oracle on a GPU (skipped cleanly where vllm or CUDA is absent)."""

import importlib.util

import pytest
from conftest import GOLDENS, unit_golden, unit_prompts

if importlib.util.find_spec("vllm") is None:
    pytest.skip("vllm is not installed (GPU-box only)", allow_module_level=True)
torch = pytest.importorskip("torch")
if not torch.cuda.is_available():
    pytest.skip("no CUDA device", allow_module_level=True)

NEAR_TIE = 0.05  # a divergence at a golden margin below this is a near-tie, not a bug


def test_vllm_serves_tiny_llama_like_the_golden(leg_factory):
    unit = "tiny-llama"
    golden, prompts = unit_golden(unit), unit_prompts(unit)
    leg = leg_factory(["--backend", "vllm", "--model", str(GOLDENS / unit / "model"), "--dtype", "float32",
                       "--gpu-memory-utilization", "0.2", "--max-model-len", "512", "--max-num-seqs", "4"])
    ready = leg.read(timeout=600)
    assert ready["type"] == "ready", f"{ready}\n{leg.stderr()[-4000:]}"
    kv = ready["kv"]
    assert kv["capacity_tokens"] == kv["block_size"] * kv["num_blocks"] > 0
    assert ready["features"]["backend"] == "vllm" and ready["versions"]["vllm"] == "0.26.0"
    assert ready["resolved"]["max_num_seqs"] == 4 and ready["resolved"]["max_model_len"] == 512
    toks = [p["tokens"] for p in prompts]
    for batch in (1, 4):
        results, done = leg.generate(f"b{batch}", toks, 32, batch)
        assert done is not None, results
        for i, o in enumerate(golden["outputs"]):
            got, want = results[i]["tokens"], o["tokens"]
            assert len(got) == 32
            k = next((k for k in range(32) if got[k] != want[k]), None)
            assert k is None or o["margins"][k] < NEAR_TIE, f"{o['id']} diverges at {k} (margin {o['margins'][k]})"
    results, _ = leg.generate("big", toks, 32, 5)
    assert results["type"] == "error" and results["code"] == "over_capacity"
    leg.send({"type": "shutdown"})
    assert leg.read(timeout=120) is None
    assert leg.close(timeout=120) == 0
