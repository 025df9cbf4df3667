"""Goldens: `capture` reproduces the committed goldens, and our greedy loop agrees with
transformers' own `generate` (an independent implementation)."""

import json
from types import SimpleNamespace

import pytest
from conftest import GOLDENS, UNITS, unit_golden, unit_prompts

from oracle.capture import capture


@pytest.mark.parametrize("unit", UNITS)
def test_recapture_reproduces_golden(unit, tmp_path):
    out = tmp_path / "golden.json"
    rc = capture(SimpleNamespace(unit=str(GOLDENS / unit / "unit.toml"), golden=str(out), check=False, batch=1))
    assert rc == 0
    new, old = json.loads(out.read_text()), unit_golden(unit)
    assert [o["id"] for o in new["outputs"]] == [p["id"] for p in unit_prompts(unit)]
    assert [o["tokens"] for o in new["outputs"]] == [o["tokens"] for o in old["outputs"]]
    assert new["capture"]["resolved"] == old["capture"]["resolved"]
    assert new["max_tokens"] == 32 and new["ignore_eos"] is True and new["schema"] == 1
    for o in new["outputs"]:
        assert len(o["tokens"]) == len(o["margins"]) == len(o["runner_up"]) == 32
        assert all(m >= 0 for m in o["margins"])
        # The runner-up is never the token taken, and is a token of the vocabulary.
        assert all(r != t and 0 <= r < new["capture"]["resolved"]["vocab_size"]
                   for r, t in zip(o["runner_up"], o["tokens"]))
    # The tiny units are built so that no greedy step is a near-tie.
    assert new["capture"]["min_margin"] >= 1e-3
    # The margin is a difference of two float32 logits: another CPU sums them in another order
    # (torch picks AVX2 or AVX-512 kernels by the CPU), which moved tiny-llama's from 0.005247 to
    # 0.005258 on an AVX-512 Xeon with every token unchanged. 2% of it is far below any change
    # of model or computation and far above that noise.
    assert new["capture"]["min_margin"] == pytest.approx(old["capture"]["min_margin"], rel=2e-2)


def test_capture_check_mode_detects_a_changed_golden(tmp_path, capsys):
    unit = "tiny-qwen"
    g = unit_golden(unit)
    g["outputs"][3]["tokens"][5] ^= 1  # corrupt one token
    bad = tmp_path / "golden.json"
    bad.write_text(json.dumps(g))
    rc = capture(SimpleNamespace(unit=str(GOLDENS / unit / "unit.toml"), golden=str(bad), check=True, batch=1))
    assert rc == 1
    summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert summary["matched"] == len(g["outputs"]) - 1
    assert summary["load_cache"]["state"] == "none"  # transformers: nothing compiled at load
    assert json.loads(bad.read_text()) == g, "--check must not write"


@pytest.mark.parametrize("unit", UNITS)
def test_golden_equals_transformers_generate(unit):
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(GOLDENS / unit / "model"), dtype=torch.float32).eval()
    model.generation_config.eos_token_id = None  # ignore EOS without touching logits
    model.generation_config.pad_token_id = 0
    golden = {o["id"]: o["tokens"] for o in unit_golden(unit)["outputs"]}
    with torch.inference_mode():
        for p in unit_prompts(unit):
            ids = torch.tensor([p["tokens"]])
            # An explicit mask: without one, generate masks every id equal to pad_token_id.
            out = model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False, max_new_tokens=32)
            assert out[0, len(p["tokens"]):].tolist() == golden[p["id"]], p["id"]


@pytest.mark.parametrize("unit", UNITS)
def test_golden_equals_full_recompute(unit):
    """The golden (prefill, then one token per pass over the cache) equals greedy decoding by a
    full forward pass over prompt + tokens so far at every step, with no cache at all: for the
    hybrid this pins the Mamba conv/SSM state carried from the chunked prefill scan into the
    one-token recurrent step (two code paths in transformers) to the one-pass result."""
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(GOLDENS / unit / "model"), dtype=torch.float32).eval()
    golden = {o["id"]: o for o in unit_golden(unit)["outputs"]}
    with torch.inference_mode():
        for p in unit_prompts(unit):
            ids, margins = list(p["tokens"]), []
            for _ in range(len(golden[p["id"]]["tokens"])):
                logits = model(torch.tensor([ids]), use_cache=False).logits[0, -1].float()
                top = torch.topk(logits, 2).values
                margins.append(float(top[0] - top[1]))
                ids.append(int(torch.argmax(logits)))
            assert ids[len(p["tokens"]):] == golden[p["id"]]["tokens"], p["id"]
            # The same logits up to f32 rounding (one long pass vs single-token steps).
            assert margins == pytest.approx(golden[p["id"]]["margins"], abs=1e-4), p["id"]


def test_vllm_top2_gap_names_the_runner_up_not_the_token_taken():
    from oracle.backends.vllm_backend import top2_gap

    assert top2_gap(7, {7: -0.1, 3: -0.6}) == (pytest.approx(0.5), 3)
    # A tie: greedy took 9, so the runner-up is 4 whichever vLLM listed first.
    assert top2_gap(9, {4: -0.7, 9: -0.7}) == (0.0, 4)
    assert top2_gap(5, {5: -0.2}) == (None, None)


def test_reference_capture_under_another_dtype_names_its_file(tmp_path, capsys):
    unit = "tiny-llama"
    args = dict(unit=str(GOLDENS / unit / "unit.toml"), check=False, batch=1, backend=None, device="cpu",
                dtype="bfloat16")
    # Without --golden it would land on the unit's golden: refused, nothing written.
    assert capture(SimpleNamespace(golden=None, **args)) == 2
    assert "--golden" in capsys.readouterr().err
    out = tmp_path / "reference-cpu-bf16.json"
    assert capture(SimpleNamespace(golden=str(out), **args)) == 0
    ref = json.loads(out.read_text())
    assert ref["capture"]["dtype"] == "bfloat16"
    assert ref["capture"]["resolved"]["dtype"] == "bfloat16"
    assert "--dtype bfloat16" in ref["capture"]["command"] and str(out) in ref["capture"]["command"]
    assert [len(o["tokens"]) for o in ref["outputs"]] == [32] * len(unit_prompts(unit))
