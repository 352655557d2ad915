"""k-curves from one run: hand-computed estimators, and the seeded-prefix property on the tiny Llama."""

from __future__ import annotations

import itertools
import math

import pytest

from srd_worker.reports import kcurves
from srd_worker.reports.kcurves import best_index, best_of_k, k_curve, pass_at_k, vote_at_k, vote_index


def cand(answer, correct, reward=None):
    return {"answer": answer, "correct": correct, "reward": reward}


def test_pass_at_k_matches_the_definition():
    # n=5, c=2: P(at least one correct in a random 2-subset) = 1 - C(3,2)/C(5,2) = 1 - 3/10
    assert pass_at_k(5, 2, 2) == pytest.approx(0.7)
    assert pass_at_k(5, 0, 3) == 0.0 and pass_at_k(5, 4, 2) == 1.0 and pass_at_k(4, 1, 1) == 0.25
    with pytest.raises(ValueError):
        pass_at_k(3, 1, 4)


def _brute(cands, k, fn):
    subsets = list(itertools.combinations(range(len(cands)), k))
    return sum(1.0 if cands[fn(cands, s)]["correct"] else 0.0 for s in subsets) / len(subsets)


CANDS = [
    cand("4", False, 0.2),
    cand("7", True, 0.9),
    cand("4", False, 0.5),
    cand(None, False, 0.95),
    cand("7", True, 0.1),
    cand("4", False, 0.4),
]


@pytest.mark.parametrize("k", range(1, 7))
def test_best_of_k_closed_form_equals_enumeration(k):
    assert best_of_k(CANDS, k) == pytest.approx(_brute(CANDS, k, best_index))


def test_votes_worked_example():
    # all six: "4" has 3 votes vs "7" 2 → wrong; weighted: "4" 1.1 vs "7" 1.0 → wrong
    assert vote_index(CANDS, range(6)) == 0
    # {1,2,4}: "7" (2 votes) beats "4" → correct; weighted 1.0 vs 0.5 → correct
    assert CANDS[vote_index(CANDS, [1, 2, 4])]["correct"]
    # {1,2,5}: "4" 2 votes wins unweighted; weighted "7" 0.9 vs "4" 0.9 → tie → first seen ("7", index 1)
    assert vote_index(CANDS, [1, 2, 5]) == 2 and vote_index(CANDS, [1, 2, 5], weighted=True) == 1
    assert vote_index(CANDS, [3]) == 3  # nobody answered: lowest index
    assert vote_at_k(CANDS, 6) == 0.0
    assert vote_at_k(CANDS, 1) == pytest.approx(2 / 6)  # k=1 is plain sampling accuracy
    assert vote_at_k(CANDS, 3) == pytest.approx(_brute(CANDS, 3, vote_index))


def test_sampled_subsets_are_reproducible_and_close(monkeypatch):
    big = [cand(str(i % 3), i % 3 == 0, i / 20) for i in range(20)]
    exact = vote_at_k(big, 10)
    monkeypatch.setattr(kcurves, "EXACT_SUBSETS", 10)
    a, b = vote_at_k(big, 10, seed=1), vote_at_k(big, 10, seed=1)
    assert a == b and abs(a - exact) < 0.06
    assert not k_curve([{"candidates": big}], [10])[0].exact


def test_k_curve_means_over_problems():
    recs = [
        {"candidates": CANDS},
        {"candidates": [cand("1", True, 0.3)] * 6},
        {"candidates": [cand("1", None)] * 6},  # ungraded: left out
        {"error": "boom", "candidates": CANDS},
    ]
    curve = k_curve(recs)
    assert [p.k for p in curve] == list(range(1, 7)) and all(p.problems == 2 for p in curve)
    assert curve[0].pass_at_k == pytest.approx((2 / 6 + 1) / 2)
    assert curve[5].best_of == pytest.approx((0.0 + 1.0) / 2)  # the 0.95 candidate has no answer: wrong
    assert curve[5].best_of == pytest.approx((best_of_k(CANDS, 6) + 1) / 2)
    no_rewards = k_curve([{"candidates": [cand("1", True)] * 3}])
    assert no_rewards[0].best_of is None and no_rewards[0].majority == 1.0


@pytest.mark.e2e
def test_first_k_candidates_of_a_run_at_n_are_a_run_at_k(tiny_engine):
    """Best-of-k on the first k candidates of a run at n equals a separate run at n=k."""
    from srd_worker.methods.base import StepContext
    from srd_worker.methods.registry import build_method
    from srd_worker.rewards.arithmetic import ArithmeticReward
    from srd_worker.runner import build_record
    from srd_worker.tasks.base import Item
    from srd_worker.tasks.gsm8k import GSM8KTask

    task = GSM8KTask()
    items = [Item("a", "What is 3 + 4?", "7"), Item("b", "Compute 6 * 7.", "42")]

    def run(n):
        method = build_method("best_of_n", {"n": n, "max_new_tokens": 20, "chunk_tokens": 10})
        ctx = StepContext(tiny_engine, ArithmeticReward(), 5, extract_answer=task.extract_answer)
        states = [
            method.init_state(it.id, it.question, tiny_engine.tokenizer.chat_prompt_ids(task.messages(it)))
            for it in items
        ]
        while active := [s for s in states if not method.done(s)]:
            method.step(active, ctx)
        return [
            build_record(method, task, it, i, s) for i, (it, s) in enumerate(zip(items, states, strict=True))
        ]

    big = run(5)
    for k in (2, 3):
        small = run(k)
        for rb, rs in zip(big, small, strict=True):
            head = rb["candidates"][:k]
            assert [c["text"] for c in head] == [c["text"] for c in rs["candidates"]]
            chosen = best_index(head, range(k))
            assert head[chosen]["text"] == rs["response"] and chosen == rs["extra"]["chosen"]
            assert head[chosen]["reward"] == rs["reward"]
    assert not math.isnan(best_of_k(big[0]["candidates"], 3))
