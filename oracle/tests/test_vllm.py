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


def test_vllm_verify_through_prompt_logprobs(leg_factory):
    """verify on the real vLLM (prefill path, docs/ORACLE.md): its own tokens come back as its
    argmax with gap 0 at batch 1 and 4; other tokens give the gaps of the model run by
    transformers on the CPU; a row that fills the context exactly is too_long, one less fits."""
    from test_verify_transformers import independent_logits, verify

    unit = "tiny-llama"
    prompts = [p["tokens"] for p in unit_prompts(unit)]
    leg = leg_factory(["--backend", "vllm", "--model", str(GOLDENS / unit / "model"), "--dtype", "float32",
                       "--gpu-memory-utilization", "0.2", "--max-model-len", "512", "--max-num-seqs", "4"])
    ready = leg.read(timeout=600)
    assert ready["type"] == "ready", f"{ready}\n{leg.stderr()[-4000:]}"
    gen, _ = leg.generate("g", prompts, 32, 1)
    own = [gen[i]["tokens"] for i in range(len(prompts))]
    for batch in (1, 4):
        results, done = verify(leg, f"v{batch}", prompts, own, batch)
        assert done is not None and done["tokens"] == 32 * len(prompts), results
        for i, f in enumerate(own):
            r = results[i]
            assert r["path"] == "prefill" and r["scale"] is None
            # fp32 prefill and decode logits differ by ~1e-5; the unit's smallest margin is 5e-3.
            assert r["argmax"] == f, f"prompt {i} at batch {batch}"
            assert r["gap"] == [0.0] * 32
    # Other tokens: each prompt forced with the next prompt's output.
    other = own[1:] + own[:1]
    results, done = verify(leg, "x", prompts, other, 4)
    assert done is not None, results
    for i, (p, f) in enumerate(zip(prompts, other)):
        logits = independent_logits(unit, p, f)
        for j, t in enumerate(f):
            row = logits[j]
            top2 = row.topk(2).values
            assert results[i]["gap"][j] == pytest.approx(float(row.max() - row[t]), abs=1e-3), (i, j)
            if float(top2[0] - top2[1]) > 1e-3:
                assert results[i]["argmax"][j] == int(row.argmax()), (i, j)
    # The context edge: vLLM takes a prompt only below max_model_len.
    err, _ = verify(leg, "edge", [[1] * 500], [[2] * 12], 1)
    assert err["type"] == "error" and err["code"] == "too_long" and "--max-model-len 513" in err["message"]
    results, done = verify(leg, "edge", [[1] * 500], [[2] * 11], 1)
    assert done is not None and len(results[0]["gap"]) == 11, results
    err, _ = verify(leg, "big", prompts, own, 5)
    assert err["type"] == "error" and err["code"] == "over_capacity"
    leg.send({"type": "shutdown"})
    assert leg.read(timeout=120) is None
    assert leg.close(timeout=120) == 0
