"""`verify` (teacher forcing, docs/PROTOCOL.md) through `python -m oracle serve` with the
transformers backend, checked against the model run independently in this process."""

import json
import random

import pytest
from conftest import GOLDENS, unit_prompts

from test_serve_transformers import start


def verify(leg, req_id, prompts, forced, batch):
    """Send one verify; return ({index: verified event}, done event) or (error event, None)."""
    leg.send({"type": "verify", "id": req_id, "prompts": prompts, "forced": forced, "batch": batch})
    results = {}
    while True:
        ev = leg.read()
        assert ev is not None, f"leg exited mid-request; stderr:\n{leg.stderr()[-3000:]}"
        if ev["type"] == "error":
            assert not results, "an error after verified events: requests must be validated before they start"
            return ev, None
        assert ev["id"] == req_id, ev
        if ev["type"] == "done":
            return results, ev
        assert ev["type"] == "verified", ev
        assert ev["index"] not in results, f"index {ev['index']} reported twice"
        assert set(ev) == {"type", "id", "index", "argmax", "gap", "scale", "path"}, ev
        results[ev["index"]] = ev
    return results, None


def check_shape(results, done, forced):
    assert sorted(results) == list(range(len(forced)))
    assert done["tokens"] == sum(len(f) for f in forced) and done["wall_s"] > 0
    for i, f in enumerate(forced):
        r = results[i]
        assert r["path"] == "decode"
        assert len(r["argmax"]) == len(r["gap"]) == len(r["scale"]) == len(f)
        for a, g, s, t in zip(r["argmax"], r["gap"], r["scale"], f):
            assert g >= 0 and s > 0
            assert (g == 0) == (a == t), (a, g, t)  # no exact ties in these random-weight models


@pytest.mark.parametrize("unit", ["tiny-llama", "tiny-qwen", "tiny-nemotron-h"])
def test_forcing_the_legs_own_tokens_gives_its_argmax_and_zero_gap(leg_factory, unit):
    leg, _ = start(leg_factory, unit)
    toks = [p["tokens"] for p in unit_prompts(unit)]
    gen, _ = leg.generate("g", toks, 24, 1)
    own = [gen[i]["tokens"] for i in range(len(toks))]
    by_batch = {}
    for batch in (1, 3):
        results, done = verify(leg, f"v{batch}", toks, own, batch)
        assert done is not None, results
        check_shape(results, done, own)
        for i, f in enumerate(own):
            assert results[i]["argmax"] == f, f"{unit} prompt {i} at batch {batch}"
            assert results[i]["gap"] == [0.0] * len(f)
        by_batch[batch] = [results[i] for i in range(len(toks))]
    # Round-robin batching has the shapes of batch 1: the same figures, bit for bit.
    assert by_batch[1] == [{**r, "id": "v1"} for r in by_batch[3]]
    assert leg.close() == 0


def independent_logits(unit, prompt, forced):
    """One forward pass over prompt + forced with transformers in this process: row j is the
    next-token logits after prompt + forced[:j] (float32, like the leg)."""
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(GOLDENS / unit / "model"), dtype=torch.float32).eval()
    with torch.inference_mode():
        out = model(input_ids=torch.tensor([prompt + forced]))
    return out.logits[0, len(prompt) - 1: len(prompt) - 1 + len(forced)].float()


# tiny-nemotron-h: the forced tokens must move the Mamba conv and SSM states of each row's own
# cache exactly as the one pass over prompt + forced does (two rows interleaved at batch 2).
@pytest.mark.parametrize("unit", ["tiny-llama", "tiny-nemotron-h"])
def test_forcing_other_tokens_gives_the_models_logit_difference(leg_factory, unit):
    leg, ready = start(leg_factory, unit)
    vocab = ready["resolved"]["vocab_size"]
    rng = random.Random(17)
    toks = [p["tokens"] for p in unit_prompts(unit)][:3]
    forced = [[rng.randrange(vocab) for _ in range(12)] for _ in toks]
    results, done = verify(leg, "x", toks, forced, 2)
    assert done is not None, results
    check_shape(results, done, forced)
    positive = 0
    for i, (p, f) in enumerate(zip(toks, forced)):
        logits = independent_logits(unit, p, f)
        r = results[i]
        for j, t in enumerate(f):
            row = logits[j]
            top2 = row.topk(2).values
            want_gap = float(row.max() - row[t])
            # Incremental decoding (the leg) and one pass (here) differ by f32 rounding only.
            assert r["gap"][j] == pytest.approx(want_gap, abs=1e-4), (i, j)
            assert r["scale"][j] == pytest.approx(float(row.abs().max()), rel=1e-5, abs=1e-5), (i, j)
            if float(top2[0] - top2[1]) > 1e-4:
                assert r["argmax"][j] == int(row.argmax()), (i, j)
            positive += r["gap"][j] > 0
    # Random tokens are almost never the model's choice: the gaps above were not all zero.
    assert positive >= len(toks) * 12 - 2
    assert leg.close() == 0


def test_malformed_verify_requests_get_named_errors_and_the_leg_keeps_serving(leg_factory):
    leg, ready = start(leg_factory, "tiny-llama")
    vocab, max_len = ready["resolved"]["vocab_size"], ready["resolved"]["max_model_len"]
    good = {"type": "verify", "id": "ok", "prompts": [[1, 2], [3]], "forced": [[4, 5], [6]], "batch": 2}
    cases = [
        ({k: v for k, v in good.items() if k != "forced"}, "malformed_request", "forced"),
        ({**good, "forced": [[4, 5]]}, "malformed_request", "1 rows for 2 prompts"),
        ({**good, "forced": [[4, 5], []]}, "malformed_request", "forced[1] is empty"),
        ({**good, "forced": [[4, 5], [6.0]]}, "malformed_request", "forced[1][0]"),
        ({**good, "batch": 0}, "malformed_request", "batch"),
        ({**good, "forced": [[4, 5], [6, vocab]]}, "bad_token", f"forced 1, position 1: token id {vocab}"),
        ({**good, "prompts": [[1, 2], [-1]]}, "bad_token", "prompt 1, position 0"),
        ({**good, "prompts": [[1, 2], []]}, "empty_prompt", "prompt 1"),
        ({**good, "prompts": [[1] * (max_len - 1), [3]]}, "too_long", f"2 forced tokens = {max_len + 1}"),
    ]
    for msg, code, says in cases:
        leg.send(json.dumps(msg))
        ev = leg.read()
        assert ev["type"] == "error" and ev["code"] == code, (msg, ev)
        assert says in ev["message"], (says, ev["message"])
        assert ev["fatal"] is False and ev.get("id") == "ok"
    # ... and the leg still verifies, also a row that fills the context exactly.
    results, done = verify(leg, "ok", [[1] * (max_len - 2), [3]], [[4, 5], [6]], 2)
    assert done is not None and done["tokens"] == 3, results
    assert leg.close() == 0
