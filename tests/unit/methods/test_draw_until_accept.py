"""draw_until_accept (ALGORITHMS.md §3.2(b)) on the tiny random Llama: batches of full samples until
``accept`` of them score >= the threshold or the budget B is drawn; the answer and the reported counts."""

from __future__ import annotations

import pytest

from srd_worker.errors import ConfigError
from srd_worker.methods.registry import build_method
from tests.doubles import HashReward
from tests.unit.methods.test_methods import run_to_end

pytestmark = pytest.mark.unit

BASE = {"max_new_tokens": 12, "batch": 3, "budget": 9}


def _check(method, states):
    """The invariants every finished item holds, whatever the rewards were."""
    p = method.params
    for s in states:
        res = method.result(s)
        rewards = res["rewards"]
        assert all(c["finish"] is not None for c in s["candidates"]) and None not in rewards
        accepted = [i for i, r in enumerate(rewards) if r >= p.threshold]
        assert res["drawn"] == len(rewards) and res["accepted"] == len(accepted)
        # it stopped at the first batch that brought enough accepted samples, or at the budget
        assert len(accepted) >= p.accept or res["drawn"] == p.budget
        before = rewards[: res["drawn"] - p.batch] if res["drawn"] > p.batch else []
        assert sum(r >= p.threshold for r in before) < p.accept
        assert res["samples_to_first_accept"] == (accepted[0] + 1 if accepted else None)
        pool = accepted or list(range(len(rewards)))
        best = max(rewards[i] for i in pool)
        assert res["chosen"] == next(i for i in pool if rewards[i] == best)  # the earliest on ties
        assert res["response"] == s["candidates"][res["chosen"]]["text"]
        assert s["ledger"]["rm_calls"] == res["drawn"]  # each sample scored once, when finished


@pytest.mark.parametrize("threshold", [-1.0, 0.5, 0.9, 2.0])
def test_batches_until_accepted_or_the_budget_is_spent(tiny_engine, threshold):
    method = build_method("draw_until_accept", {**BASE, "threshold": threshold})
    states = run_to_end(method, tiny_engine, HashReward())
    _check(method, states)
    drawn = [method.result(s)["drawn"] for s in states]
    if threshold < 0:  # every sample is accepted: one batch
        assert drawn == [3] * len(states)
    if threshold > 1:  # none ever is (HashReward's scores lie in [0, 1)): the whole budget, best of all
        assert drawn == [9] * len(states)
        assert all(method.result(s)["samples_to_first_accept"] is None for s in states)


def test_more_accepted_samples_wanted_and_chunked_drafting(tiny_engine):
    method = build_method(
        "draw_until_accept", {**BASE, "threshold": 0.3, "accept": 2, "chunk_tokens": 5, "budget": 8}
    )
    states = run_to_end(method, tiny_engine, HashReward())
    _check(method, states)
    assert max(method.result(s)["drawn"] for s in states) <= 8  # the last batch is cut to the budget


def test_the_first_batch_is_best_of_ns_draws(tiny_engine):
    """Candidate i is drawn with the seed of candidate i in round 0, so the first batch equals Best-of-N's
    candidates (whole budget in one call, the same sampling parameters)."""
    dua = build_method("draw_until_accept", {**BASE, "threshold": -1.0})
    bon = build_method("best_of_n", {"max_new_tokens": 12, "n": 3})
    a = run_to_end(dua, tiny_engine, HashReward())
    b = run_to_end(bon, tiny_engine, HashReward())
    assert [[c["text"] for c in s["candidates"]] for s in a] == [
        [c["text"] for c in s["candidates"]] for s in b
    ]
    assert [dua.result(s)["response"] for s in a] == [bon.result(s)["response"] for s in b]


def test_refusals():
    with pytest.raises(ConfigError, match="needs a reward threshold"):
        build_method("draw_until_accept", {})
    with pytest.raises(ConfigError, match="batch \\(8\\) must not exceed budget \\(4\\)"):
        build_method("draw_until_accept", {"threshold": 0.5, "batch": 8, "budget": 4})
    with pytest.raises(ConfigError, match="must be >= 1"):
        build_method("draw_until_accept", {"threshold": 0.5, "accept": 0})
    with pytest.raises(ConfigError, match="expects a finite number"):
        build_method("draw_until_accept", {"threshold": "nan"})
