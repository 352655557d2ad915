"""End to end: a best-of-n run on the tiny random Llama whose responses are degenerate arithmetic (the
issue-19 text: a 320-digit number, ``+ 1 = 2``) finishes every item with a reward for each candidate."""

from __future__ import annotations

import math

import pytest

from srd_worker.engines.base import Generation
from srd_worker.methods.base import StepContext
from srd_worker.methods.registry import build_method
from srd_worker.rewards.arithmetic import ArithmeticReward
from tests.doubles import run_to_done

HOSTILE = ["9" * 320 + " + 1 = 2. ", "1/" + "7" * 5000 + " = 0 ", "(" * 300 + "10^{10^{10}} = 1000! "]


class HostileEngine:
    """The tiny engine, with each generation's tokens replaced by the tokens of a hostile text."""

    def __init__(self, inner):
        self.inner = inner
        self.name, self.capabilities = inner.name, inner.capabilities
        self.tokenizer, self.max_context = inner.tokenizer, inner.max_context
        self.calls = 0

    def generate(self, requests):
        out = []
        for req in requests:
            ids = self.tokenizer.encode(HOSTILE[self.calls % len(HOSTILE)])[: req.params.max_new_tokens]
            self.calls += 1
            logprobs = [0.0] * len(ids) if req.params.logprobs else None
            out.append(Generation(ids, self.tokenizer.decode(ids), "eos", logprobs))
        return out

    def logprobs(self, pairs):
        return self.inner.logprobs(pairs)


@pytest.mark.e2e
def test_best_of_n_finishes_with_hostile_responses(tiny_engine):
    engine = HostileEngine(tiny_engine)
    method = build_method("best_of_n", {"n": 3, "max_new_tokens": 2000, "chunk_tokens": 2000})
    ctx = StepContext(engine, ArithmeticReward(), 0, extract_answer=lambda t: None)
    states = [
        method.init_state(f"q{i}", q, engine.tokenizer.chat_prompt_ids([{"role": "user", "content": q}]))
        for i, q in enumerate(["What is 3 + 4?", "Compute 6 * 7."])
    ]
    run_to_done(method, states, ctx, 20)
    for s in states:
        res = method.result(s)
        assert len(res["rewards"]) == 3
        assert all(isinstance(r, float) and math.isfinite(r) and 0 < r < 1 for r in res["rewards"])
    assert engine.calls >= 6
    assert any(
        "9" * 320 in r
        for s in states
        for r in method.result(s).get("responses", [method.result(s)["response"]])
    )
