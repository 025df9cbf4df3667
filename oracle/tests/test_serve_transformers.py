"""The transformers oracle through the protocol: `python -m oracle serve` as a child process."""

import json
import os

import pytest
from conftest import UNITS, GOLDENS, unit_golden, unit_prompts

READY_KEYS = {"type", "load_s", "kv", "features", "versions", "resolved", "pid", "pids"}


def start(leg_factory, unit, *extra):
    leg = leg_factory(["--backend", "transformers", "--model", str(GOLDENS / unit / "model"), "--device", "cpu",
                       "--dtype", "float32", *extra])
    ready = leg.read()
    assert ready is not None and ready["type"] == "ready", f"{ready}\n{leg.stderr()[-3000:]}"
    return leg, ready


def check_ready(ready, leg):
    assert READY_KEYS <= set(ready), READY_KEYS - set(ready)
    assert ready["pid"] == leg.proc.pid and ready["pid"] in ready["pids"]
    assert 0 < ready["load_s"] < 600
    assert ready["kv"] is None and ready["features"]["kv"].startswith("none:")
    f = ready["features"]
    assert f["backend"] == "transformers" and f["dtype"] == "float32" and f["device"] == "cpu"
    assert f["degraded"] == [] and f["cuda_graphs"] is False
    assert f["load_cache"]["state"] == "none", f["load_cache"]  # eager: its load is the same each time
    assert {"python", "torch", "transformers"} <= set(ready["versions"])
    assert ready["resolved"]["dtype"] == "float32"


@pytest.mark.parametrize("unit", UNITS)
def test_reproduces_golden_at_batch_1_and_4(leg_factory, unit):
    """Every prompt's 32 tokens equal the golden, one at a time and 4 in flight; then the EOS
    stop rule and a clean exit on shutdown."""
    golden, prompts = unit_golden(unit), unit_prompts(unit)
    want = {o["id"]: o["tokens"] for o in golden["outputs"]}
    leg, ready = start(leg_factory, unit)
    check_ready(ready, leg)
    # The golden was captured under the configuration this leg resolves to.
    assert ready["resolved"] == golden["capture"]["resolved"]

    toks = [p["tokens"] for p in prompts]
    for batch in (1, 4):
        results, done = leg.generate(f"b{batch}", toks, golden["max_tokens"], batch)
        assert done is not None, results
        assert sorted(results) == list(range(len(prompts)))
        for i, p in enumerate(prompts):
            assert results[i]["tokens"] == want[p["id"]], f"{unit} {p['id']} at batch {batch}"
            assert 0 < results[i]["ttft_s"] <= results[i]["elapsed_s"]
        assert done["tokens"] == sum(len(r["tokens"]) for r in results.values())
        assert done["wall_s"] >= max(r["elapsed_s"] for r in results.values())

    # ignore_eos=false: stop at the first EOS id of config.json, EOS included.
    eos = ready["resolved"]["eos_token_ids"]
    cut = [(i, next((k for k, t in enumerate(want[p["id"]]) if t in eos), None)) for i, p in enumerate(prompts)]
    results, done = leg.generate("eos", toks, golden["max_tokens"], 4, ignore_eos=False)
    for i, k in cut:
        full = want[prompts[i]["id"]]
        assert results[i]["tokens"] == (full if k is None else full[: k + 1])

    leg.send({"type": "shutdown"})
    assert leg.read() is None
    assert leg.close() == 0


def test_errors_keep_the_leg_serving(leg_factory):
    leg, ready = start(leg_factory, "tiny-llama")
    vocab, max_len = ready["resolved"]["vocab_size"], ready["resolved"]["max_model_len"]
    bad_lines = [
        ("this is not json", "malformed_request", None),
        (json.dumps({"id": "x"}), "malformed_request", "x"),
        (json.dumps({"type": "frobnicate", "id": "y"}), "malformed_request", "y"),
        (json.dumps({"type": "generate", "id": "m", "prompts": [[1]], "max_tokens": 2, "batch": 1}),
         "malformed_request", "m"),
        (json.dumps({"type": "generate", "id": "t", "prompts": [[1], [5, vocab]], "max_tokens": 2,
                     "ignore_eos": True, "batch": 1}), "bad_token", "t"),
        (json.dumps({"type": "generate", "id": "e", "prompts": [[1], []], "max_tokens": 2,
                     "ignore_eos": True, "batch": 2}), "empty_prompt", "e"),
        (json.dumps({"type": "generate", "id": "l", "prompts": [[1] * (max_len - 3)], "max_tokens": 4,
                     "ignore_eos": True, "batch": 1}), "too_long", "l"),
    ]
    for line, code, rid in bad_lines:
        leg.send(line)
        ev = leg.read()
        assert ev["type"] == "error" and ev["code"] == code, (line, ev)
        assert ev["fatal"] is False and ev["message"]
        assert ev.get("id") == rid
    # bad_token names prompt, position, id and vocab
    leg.send(json.dumps({"type": "generate", "id": "t2", "prompts": [[-3]], "max_tokens": 1, "ignore_eos": True,
                         "batch": 1}))
    err = leg.read()
    assert err["code"] == "bad_token" and "prompt 0" in err["message"] and "position 0" in err["message"]
    assert "-3" in err["message"] and str(vocab) in err["message"]
    # ... and the leg still serves: exactly max_model_len fits.
    results, done = leg.generate("ok", [[1] * (max_len - 4)], 4, 1)
    assert done is not None and len(results[0]["tokens"]) == 4
    assert leg.close() == 0  # end of stdin is a shutdown
    assert all(json.loads(line)["type"] for line in leg.lines)


def _load_fails(leg_factory, model, *extra):
    leg = leg_factory(["--backend", "transformers", "--model", str(model), *extra])
    ev = leg.read()
    assert ev is not None and ev["type"] == "error", ev
    assert ev["code"] == "load_failed" and ev["fatal"] is True
    assert leg.read() is None, "nothing may follow a fatal error"
    rc = leg.close()
    assert rc != 0
    return ev


def test_load_failed_missing_dir(leg_factory, tmp_path):
    ev = _load_fails(leg_factory, tmp_path / "nope")
    assert "does not exist" in ev["message"] and "nope" in ev["message"]


def test_load_failed_corrupt_config(leg_factory, tmp_path):
    d = tmp_path / "m"
    d.mkdir()
    (d / "config.json").write_text("{\"architectures\": [\"LlamaForCausalLM\"], ")
    (d / "model.safetensors").write_bytes(b"")
    ev = _load_fails(leg_factory, d)
    assert "config.json" in ev["message"] and "not valid JSON" in ev["message"]


def test_load_failed_truncated_weights(leg_factory, tmp_path):
    src = GOLDENS / "tiny-llama" / "model"
    d = tmp_path / "m"
    d.mkdir()
    (d / "config.json").write_bytes((src / "config.json").read_bytes())
    data = (src / "model.safetensors").read_bytes()
    (d / "model.safetensors").write_bytes(data[: len(data) // 2])
    ev = _load_fails(leg_factory, d)
    assert "transformers could not load" in ev["message"]


def test_vllm_options_refused_by_transformers(leg_factory):
    ev = _load_fails(leg_factory, GOLDENS / "tiny-llama" / "model", "--enforce-eager", "--max-num-seqs", "4")
    assert "enforce_eager" in ev["message"] and "vllm only" in ev["message"]
