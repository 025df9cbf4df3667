"""The vLLM oracle's `verify` without vLLM: its prompt log-probs, built here the way vLLM 0.26.0
builds them, converted to argmax and gap; and the request it sends, driven through a fake
engine. (The real thing on a GPU: test_vllm.py.)

How vLLM 0.26.0 fills `RequestOutput.prompt_logprobs` (read in its sources):
- the worker gathers, per prompt position t >= 1, the scores of [prompt token t, top-k ids of
  the row after tokens[:t]] and the rank of the prompt token (the count of scores >= its own):
  vllm/v1/worker/gpu/sample/logprob.py `compute_topk_scores` (model runner V2), vllm/v1/sample/
  sampler.py `gather_logprobs` (V1); scores are float32 log_softmax in the default logprobs_mode;
- vllm/v1/engine/logprobs.py `_update_prompt_logprobs` turns each row into a position with
  vllm/logprobs.py `append_logprobs_for_next_position`: `{token_id: Logprob(logprob, rank,
  decoded_token)}`, ranks chained (prompt token's rank, 1, 2, ..., k), so a prompt token that is
  also in the top-k keeps one key (the later); `create_prompt_logprobs` starts the list with
  `None`, or makes a `FlatLogprobs` when `flat_logprobs` is set.
"""

import itertools
from dataclasses import dataclass, field
from types import SimpleNamespace

import pytest

torch = pytest.importorskip("torch")

from oracle.backends import VerifyResult  # noqa: E402
from oracle.backends.vllm_backend import VERIFY_TOPK, VllmBackend  # noqa: E402
from oracle.backends.vllm_logprobs import argmax_and_gap, verified_from_prompt_logprobs  # noqa: E402
from oracle.protocol import TOO_LONG, GenerateRequest, Limits, ProtocolError, VerifyRequest  # noqa: E402

VOCAB = 50


@dataclass
class Logprob:  # vllm/logprobs.py
    logprob: float
    rank: int | None = None
    decoded_token: str | None = None


@dataclass
class FlatLogprobs:  # vllm/logprobs.py, the parts a reader uses
    start_indices: list = field(default_factory=list)
    end_indices: list = field(default_factory=list)
    token_ids: list = field(default_factory=list)
    logprobs: list = field(default_factory=list)
    ranks: list = field(default_factory=list)

    def append(self, pos):
        self.start_indices.append(len(self.logprobs))
        for t, lp in (pos or {}).items():
            self.token_ids.append(t)
            self.logprobs.append(lp.logprob)
            self.ranks.append(lp.rank)
        self.end_indices.append(len(self.logprobs))

    def append_fast(self, token_ids, logprobs, ranks):  # keeps duplicates, as vLLM's does
        self.start_indices.append(len(self.logprobs))
        for t, lp, r in zip(token_ids, logprobs, ranks):
            self.token_ids.append(t)
            self.logprobs.append(lp)
            self.ranks.append(r)
        self.end_indices.append(len(self.logprobs))

    def __len__(self):
        return len(self.start_indices)

    def __getitem__(self, i):
        return {self.token_ids[k]: Logprob(self.logprobs[k], self.ranks[k])
                for k in range(self.start_indices[i], self.end_indices[i])}


def fake_logits(prefix: list[int]) -> torch.Tensor:
    """A deterministic 'model': the next-token logits after prefix."""
    g = torch.Generator().manual_seed(hash(tuple(prefix)) % (2**31))
    return torch.randn(VOCAB, generator=g) * 3


def prompt_logprobs_like_vllm(tokens: list[int], k: int, flat: bool = False, rows=None):
    """RequestOutput.prompt_logprobs for `tokens`, as vLLM 0.26.0 assembles it."""
    out = FlatLogprobs() if flat else []
    out.append(None)
    for t in range(1, len(tokens)):
        logits = rows[t - 1] if rows is not None else fake_logits(tokens[:t])
        lp = torch.log_softmax(logits.float(), dim=-1)
        target = tokens[t]
        ids = [target] + torch.topk(lp, k).indices.tolist()
        values = [float(lp[i]) for i in ids]
        rank = int((lp >= lp[target]).sum())
        ranks = list(itertools.chain((rank,), range(1, k + 1)))
        if flat:
            out.append_fast(ids, values, ranks)
        else:
            out.append({i: Logprob(v, r) for i, v, r in zip(ids, values, ranks)})
    return out


def expected(prompt, forced):
    """argmax (lowest id on ties) and logit(argmax) - logit(forced) from the full logits."""
    argmax, gap = [], []
    for j, f in enumerate(forced):
        row = fake_logits(prompt + forced[:j])
        a = int(torch.argmax(row))
        argmax.append(a)
        gap.append(float(row[a] - row[f]))
    return argmax, gap


@pytest.mark.parametrize("flat", [False, True])
def test_prompt_logprobs_give_the_argmax_and_the_logit_gap(flat):
    prompt = [3, 14, 15, 9]
    own = []  # the fake model's own greedy tokens: forced = argmax everywhere
    for _ in range(6):
        own.append(int(torch.argmax(fake_logits(prompt + own))))
    other = [7, 7, 41, 0, 22, 13]
    for forced in (own, other):
        plp = prompt_logprobs_like_vllm(prompt + forced, VERIFY_TOPK, flat)
        argmax, gap = verified_from_prompt_logprobs(len(prompt), forced, plp)
        want_argmax, want_gap = expected(prompt, forced)
        assert argmax == want_argmax
        # log-softmax shifts a row by one constant: the log-prob gap is the logit gap.
        assert gap == pytest.approx(want_gap, abs=1e-5)
    assert verified_from_prompt_logprobs(len(prompt), own, prompt_logprobs_like_vllm(prompt + own, 1, flat)) == (
        own, [0.0] * len(own))
    assert all(g > 0 for g, a, f in zip(gap, argmax, other) if a != f)


def test_forced_token_outside_the_top_k_is_still_scored():
    # The prompt token's own score is column 0 of every row: rank 50 of 50 still comes back.
    row = torch.arange(VOCAB, dtype=torch.float32)  # token 0 is the worst, 49 the best
    plp = prompt_logprobs_like_vllm([5, 0], 1, rows=[row])
    assert plp[1][0].rank == VOCAB and set(plp[1]) == {0, 49}
    assert verified_from_prompt_logprobs(1, [0], plp) == ([49], [pytest.approx(49.0, abs=1e-4)])


def test_ties_go_to_the_lowest_id_whatever_order_vllm_lists_them():
    # torch.topk may list tied tokens in any order; greedy takes the lowest id.
    assert argmax_and_gap(9, {9: -0.5, 3: -0.5, 4: -2.0}) == (3, 0.0)
    assert argmax_and_gap(4, {9: -0.5, 3: -0.5, 4: -2.0}) == (3, 1.5)
    assert argmax_and_gap(3, {3: -0.25}) == (3, 0.0)


def test_answers_of_the_wrong_shape_are_named():
    plp = prompt_logprobs_like_vllm([1, 2, 3], 2)
    with pytest.raises(RuntimeError, match="for 3 positions of a 4-token prompt"):
        verified_from_prompt_logprobs(2, [3, 4], plp)
    with pytest.raises(RuntimeError, match="no prompt log-probs"):
        verified_from_prompt_logprobs(2, [3], None)
    plp[2] = {k: v for k, v in plp[2].items() if k != 3}
    with pytest.raises(RuntimeError, match="forced position 0 .prompt position 2. lack the forced token 3"):
        verified_from_prompt_logprobs(2, [3], plp)


class FakeEngine:
    """LLM.enqueue + llm_engine.step() as vLLM 0.26.0 has them: enqueue returns internal ids
    "<n>-<8 chars>", outputs carry the external "<n>"; each step finishes one request."""

    def __init__(self):
        self.waiting = []
        self.n = 0
        self.max_inflight = 0
        self.params = []
        self.llm_engine = self

    def enqueue(self, prompts, params, use_tqdm=False):
        assert use_tqdm is False and len(prompts) == 1
        self.params.append(params)
        self.waiting.append((str(self.n), prompts[0]["prompt_token_ids"], params))
        self.n += 1
        self.max_inflight = max(self.max_inflight, len(self.waiting))
        return [f"{self.n - 1}-abcdefgh"]

    def step(self):
        if not self.waiting:
            return []
        rid, tokens, params = self.waiting.pop(-1)  # the newest first: completion order != index order
        k = getattr(params, "prompt_logprobs", None)
        plp = prompt_logprobs_like_vllm(tokens, k) if k is not None else None
        unfinished = SimpleNamespace(request_id="999", finished=False, outputs=[])
        own = [int(torch.argmax(fake_logits(tokens)))]
        return [unfinished, SimpleNamespace(request_id=rid, finished=True, prompt_logprobs=plp,
                                            outputs=[SimpleNamespace(token_ids=own, logprobs=None)])]

    def has_unfinished_requests(self):
        return bool(self.waiting)


def fake_backend(max_model_len=64):
    b = VllmBackend.__new__(VllmBackend)
    b.llm = FakeEngine()
    b.SamplingParams = SimpleNamespace  # keeps the keyword arguments as attributes
    b.limits = Limits(vocab_size=VOCAB, max_model_len=max_model_len, kv_capacity_tokens=None)
    b.info = SimpleNamespace(eos_ids=[2])
    return b


def test_generate_shares_the_loop_and_its_batch_limit():
    b = fake_backend()
    prompts = [[1, 2], [3], [4, 5, 6]]
    got = []
    b.generate(GenerateRequest("g", prompts, 1, True, 2), got.append)
    assert b.llm.max_inflight == 2
    p = b.llm.params[0]
    assert (p.max_tokens, p.temperature, p.ignore_eos, p.detokenize) == (1, 0.0, True, False)
    assert not hasattr(p, "prompt_logprobs") and not hasattr(p, "stop_token_ids")
    assert sorted(r.index for r in got) == [0, 1, 2]
    for r in got:
        assert r.tokens == [int(torch.argmax(fake_logits(prompts[r.index])))] and r.elapsed_s > 0


def test_verify_sends_prompt_plus_forced_with_prompt_logprobs_batch_at_a_time():
    b = fake_backend()
    prompts = [[1, 2, 3], [4], [5, 6], [7, 8, 9, 10], [11]]
    forced = [[12, 13], [14, 15, 16], [17], [18, 19], [20, 21]]
    got: list[VerifyResult] = []
    b.verify(VerifyRequest("v", prompts, forced, 2), got.append)
    assert b.llm.max_inflight == 2  # never more in flight than the request's batch
    p = b.llm.params[0]
    assert (p.max_tokens, p.temperature, p.ignore_eos, p.detokenize, p.prompt_logprobs) == (1, 0.0, True, False,
                                                                                            VERIFY_TOPK)
    assert sorted(r.index for r in got) == list(range(5)) and [r.index for r in got] != list(range(5))
    for r in got:
        want_argmax, want_gap = expected(prompts[r.index], forced[r.index])
        assert r.path == "prefill" and r.scale is None
        assert r.argmax == want_argmax and r.gap == pytest.approx(want_gap, abs=1e-5)


def test_a_row_filling_vllms_whole_context_is_too_long_with_the_fix():
    b = fake_backend(max_model_len=8)
    b.check_request(VerifyRequest("v", [[1, 2, 3]], [[4, 5, 6, 7]], 1))  # 7 tokens: one slot left
    with pytest.raises(ProtocolError) as e:
        b.check_request(VerifyRequest("v", [[1], [1, 2, 3]], [[2], [4, 5, 6, 7, 8]], 1))
    assert e.value.code == TOO_LONG and e.value.req_id == "v"
    assert "prompt 1: 3 prompt tokens + 5 forced tokens = 8" in e.value.message
    assert "--max-model-len 9" in e.value.message
