"""vLLM 0.26.0's log-prob structures -> the figures the oracle reports (no vllm import here, so
the conversion is unit-tested on any machine with objects shaped like vLLM's).

Shapes, from the v0.26.0 sources:
- `RequestOutput.prompt_logprobs` (vllm/outputs.py; built in vllm/v1/engine/logprobs.py
  `_update_prompt_logprobs` and vllm/logprobs.py `create_prompt_logprobs`): one entry per
  prompt token; entry 0 is `None` (nothing predicts the first token), entry t >= 1 is a dict
  `{token_id: Logprob}` for the distribution after tokens[:t]: the prompt's own token t first
  (always, whatever its rank), then the top-k (`append_logprobs_for_next_position`; a token
  that is both keeps one key). With `SamplingParams.flat_logprobs` it is a `FlatLogprobs`, a
  sequence whose items are the same dicts. `Logprob.logprob` is the value: a log-probability
  in vLLM's default `logprobs_mode="raw_logprobs"` (log_softmax in float32 of the model's
  logits, vllm/v1/worker/gpu/sample/logprob.py `compute_token_logprobs`), a raw logit widened
  to float32 in "raw_logits".
- `CompletionOutput.logprobs` (sampled positions): a list of such dicts, no `None` entry.
"""

from __future__ import annotations

from typing import Any


def _value(lp: Any) -> float:
    """A `Logprob` (its .logprob) or a bare number."""
    return float(getattr(lp, "logprob", lp))


def top2_gap(chosen: int, logprobs: dict[int, float]) -> tuple[float | None, int | None]:
    """The gap between the two best log-probs of a position, and the best token other than the
    one chosen (the runner-up): None where vLLM returned fewer than two."""
    ranked = sorted(logprobs.items(), key=lambda kv: (-kv[1], kv[0]))
    if len(ranked) < 2:
        return None, None
    others = [t for t, _ in ranked if t != chosen]
    return ranked[0][1] - ranked[1][1], (others[0] if others else None)


def argmax_and_gap(forced: int, scores: dict[int, float]) -> tuple[int, float]:
    """One position: the greedy choice among the returned tokens (the lowest id among equal
    best values, as torch.argmax breaks ties) and best value - the forced token's value. A
    per-position shift (log-softmax) cancels in the difference, so log-probs give the logit gap.
    Raises KeyError when the forced token is not among the scores."""
    best = max(scores.values())
    argmax = min(t for t, v in scores.items() if v == best)
    return argmax, best - scores[forced]


def verified_from_prompt_logprobs(prompt_len: int, forced: list[int], prompt_logprobs: Any) -> tuple[list[int],
                                                                                                      list[float]]:
    """Teacher forcing read off the prompt log-probs of the one prompt `prompt + forced`:
    position j (the distribution after prompt + forced[:j]) is entry prompt_len + j, whose
    prompt token is forced[j]. Returns (argmax, gap) per forced position; raises RuntimeError,
    naming the position, where vLLM's answer does not have that shape."""
    n = prompt_len + len(forced)
    if prompt_logprobs is None:
        raise RuntimeError("vLLM returned no prompt log-probs for a verify request (prompt_logprobs was set)")
    if len(prompt_logprobs) != n:
        raise RuntimeError(f"vLLM returned prompt log-probs for {len(prompt_logprobs)} positions of a "
                           f"{n}-token prompt ({prompt_len} prompt + {len(forced)} forced)")
    argmax: list[int] = []
    gap: list[float] = []
    for j, f in enumerate(forced):
        entry = prompt_logprobs[prompt_len + j]
        scores = {int(t): _value(lp) for t, lp in (entry or {}).items()}
        if f not in scores:
            raise RuntimeError(f"vLLM's prompt log-probs at forced position {j} (prompt position "
                               f"{prompt_len + j}) lack the forced token {f}: got tokens {sorted(scores)}")
        a, g = argmax_and_gap(f, scores)
        argmax.append(a)
        gap.append(g)
    return argmax, gap
