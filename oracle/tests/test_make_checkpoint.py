"""scripts/make-checkpoint.py's Nemotron-H path: the 8B can't be built here, so a --shrink'd
variant of the same config (every layer of the real pattern, real per-head sizes) is built and
must load into transformers with every tensor used, the Mamba parameters as documented, and a
forward pass that is finite and whose cached decode equals full recompute."""

import json
import math
import subprocess
import sys

import pytest
from conftest import ROOT

SCRIPT = ROOT / "scripts" / "make-checkpoint.py"


def run(*args):
    return subprocess.run([sys.executable, str(SCRIPT), *args], cwd=ROOT, capture_output=True, text=True,
                          check=True)


def test_nemotron_h_8b_config_is_transformers_loadable():
    from transformers import NemotronHConfig

    raw = run("--model", "nemotron-h-8b", "--config-only").stdout
    cfg = json.loads(raw)
    # transformers' own JSON encoding of the infinity, not a bare Infinity (invalid JSON).
    assert cfg["time_step_limit"] == [0.0, {"__float__": "Infinity"}] and "Infinity," not in raw
    assert len(cfg["layers_block_type"]) == 52
    assert {k: cfg["layers_block_type"].count(k) for k in set(cfg["layers_block_type"])} == {
        "linear_attention": 24, "mlp": 24, "full_attention": 4}
    listing = run("--list").stdout
    assert "nemotron-h-8b: NemotronHForCausalLM, 8.101B parameters" in listing


@pytest.fixture(scope="module")
def small(tmp_path_factory):
    out = tmp_path_factory.mktemp("nh") / "ckpt"
    run("--model", "nemotron-h-8b", "--shrink", "64", "--out", str(out), "--device", "cpu")
    return out


def test_shrunk_nemotron_h_loads_with_every_tensor_and_sane_mamba_parameters(small):
    import torch
    import torch.nn.functional as F
    from safetensors import safe_open
    from transformers import AutoModelForCausalLM

    cfg = json.loads((small / "config.json").read_text())
    assert cfg["hidden_size"] == 64 and cfg["mamba_num_heads"] == 2 and cfg["num_attention_heads"] == 1
    assert cfg["layers_block_type"] == json.loads(run("--model", "nemotron-h-8b", "--config-only").stdout)[
        "layers_block_type"]
    with safe_open(str(small / "model.safetensors"), "pt") as f:
        names = set(f.keys())
        stored = {n: f.get_tensor(n) for n in names}
    # NVIDIA's names: backbone.*, which transformers maps to model.* on load.
    assert "backbone.embeddings.weight" in names and "backbone.norm_f.weight" in names and "lm_head.weight" in names
    assert all(n.startswith("backbone.") or n == "lm_head.weight" for n in names)
    assert all(t.dtype == torch.bfloat16 for t in stored.values())

    model, info = AutoModelForCausalLM.from_pretrained(str(small), dtype=torch.float32, output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"] and not info["mismatched_keys"], info
    assert model.config.time_step_limit[1] == math.inf
    state = model.state_dict()
    assert len(state) == len(names)
    for n, t in stored.items():  # loaded as stored (no init pass overwrote A_log / D / dt_bias)
        assert torch.equal(state[n.replace("backbone.", "model.", 1)].to(torch.bfloat16), t), n
    for layer in model.model.layers:
        if layer.block_type != "linear_attention":
            continue
        m = layer.mixer
        heads = cfg["mamba_num_heads"]
        want_a = torch.log(torch.arange(1, heads + 1, dtype=torch.float64)).to(torch.bfloat16).float()
        assert torch.equal(m.A_log.detach(), want_a)
        assert torch.equal(m.D.detach(), torch.ones(heads))
        dt = F.softplus(m.dt_bias.detach().double())
        assert ((dt > cfg["time_step_min"] * 0.99) & (dt < cfg["time_step_max"] * 1.01)).all(), dt

    model.eval()
    gen = torch.Generator().manual_seed(0)
    ids = torch.randint(3, cfg["vocab_size"], (1, 40), generator=gen).tolist()[0]
    with torch.inference_mode():
        assert torch.isfinite(model(torch.tensor([ids]), use_cache=False).logits).all()
        full, seq = [], list(ids)
        for _ in range(4):
            t = int(model(torch.tensor([seq]), use_cache=False).logits[0, -1].argmax())
            full.append(t)
            seq.append(t)
        out = model(torch.tensor([ids]), use_cache=True, logits_to_keep=1)
        cached = []
        for _ in range(4):
            t = int(out.logits[0, -1].argmax())
            cached.append(t)
            out = model(torch.tensor([[t]]), past_key_values=out.past_key_values, use_cache=True, logits_to_keep=1)
    assert cached == full


@pytest.mark.parametrize("model,params", [("llama-3.2-3b", "3.213B"), ("qwen3-4b", "4.022B"),
                                          ("mistral-7b-v0.3", "7.248B")])
def test_issue_19_shapes_load_into_transformers_with_every_tensor(model, params, tmp_path):
    """The three shapes issue 19 adds: the real parameter count, and a --shrink'd build that
    transformers loads with no key missing, unexpected or misshapen (Qwen3's q/k norms too)."""
    import torch
    from transformers import AutoModelForCausalLM

    assert f"{model}: " in run("--list").stdout and f"{params} parameters" in run("--list").stdout
    out = tmp_path / "ckpt"
    run("--model", model, "--shrink", "32", "--out", str(out), "--device", "cpu")
    m, info = AutoModelForCausalLM.from_pretrained(str(out), dtype=torch.float32, output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"] and not info["mismatched_keys"], info
    with torch.inference_mode():
        logits = m(torch.tensor([[5, 6, 7]])).logits
    assert torch.isfinite(logits).all()
