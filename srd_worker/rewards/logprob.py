"""A reward read from the policy's own log-probabilities: its confidence in what it wrote.

For a question q and a (partial) response r of tokens t_1..t_m, the reward is the geometric-mean token
probability of r under the policy, teacher-forced after a chat prompt that asks q:

    R(q, r) = exp( (1/m) · Σ_i log p(t_i | prompt(q), t_<i) )        ∈ (0, 1]

(the mean token log-probability, mapped by exp so the scale is bounded: the ranking is the mean
logprob's). An empty response has no evidence and scores 0, below every non-empty one.

It costs one teacher-forced pass over prompt + response per scoring (``engine.logprobs``; prefix caching
makes it a suffix pass on vLLM and with the transformers engine's KV reuse) and needs no second model.
What it is: a confidence signal, the "mean token logprob" that self-certainty papers compare with; what
it is not: a verifier (a fluent wrong answer scores high). Its AUROC for correct vs wrong responses is
measured in ``docs/PERFORMANCE.md`` (``benchmarks/real_text.py``).

The prompt is the question as one user turn under the engine's chat template, not the task's own prompt
(a reward sees the question text only, ``rewards/base.py``), so the probabilities are those of the same
response under a plain prompt; on the tasks whose prompt is the question plus an answer-format line the
two differ by that line.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from srd_worker.engines.base import Engine
from srd_worker.errors import RewardError
from srd_worker.rewards.base import scoring_engine


class MeanLogprobReward:
    """exp(mean token logprob) of each response under ``engine``'s model (module docstring)."""

    name = "logprob"

    def __init__(self, engine: Engine, *, batch_size: int = 16) -> None:
        self.engine = scoring_engine(engine, self.name, batch_size)
        self.batch_size = batch_size

    def score(self, prompts: Sequence[str], responses: Sequence[str]) -> list[float]:
        if len(prompts) != len(responses):
            raise RewardError(f"got {len(prompts)} prompts but {len(responses)} responses")
        tok = self.engine.tokenizer
        pairs: list[tuple[list[int], list[int]]] = []
        for i, (q, r) in enumerate(zip(prompts, responses, strict=True)):
            prefix = list(tok.chat_prompt_ids([{"role": "user", "content": q}], add_generation_prompt=True))
            cont = list(tok.encode(r)) if r else []
            if len(prefix) + len(cont) > self.engine.max_context:
                raise RewardError(
                    f"item {i}: prompt + response are {len(prefix) + len(cont)} tokens, more than the "
                    f"engine's context of {self.engine.max_context}"
                )
            pairs.append((prefix, cont))
        scores: list[float] = [0.0] * len(pairs)
        todo = [i for i, (_, cont) in enumerate(pairs) if cont]  # an empty response scores 0
        for start in range(0, len(todo), self.batch_size):
            chunk = todo[start : start + self.batch_size]
            out = self.engine.logprobs([pairs[i] for i in chunk])
            if len(out) != len(chunk):
                raise RewardError(f"engine returned {len(out)} logprob rows for {len(chunk)} responses")
            for i, row in zip(chunk, out, strict=True):
                if len(row) != len(pairs[i][1]):
                    raise RewardError(
                        f"engine returned {len(row)} logprobs for a response of {len(pairs[i][1])} tokens"
                    )
                scores[i] = math.exp(sum(row) / len(row))
        return scores
