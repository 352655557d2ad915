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


# ---- hand-worked cases that pin each rule (mutation testing: docs/MUTANTS.md) ------------------------------
def test_unscored_and_nan_rewards_rank_last():
    nan = float("nan")
    cands = [cand("1", True, None), cand("2", False, 0.2), cand("3", True, nan), cand("4", True, 0.7)]
    assert best_index(cands, range(4)) == 3  # the highest float reward
    assert best_index(cands, [0, 1, 2]) == 1  # the only scored one beats None and NaN
    assert best_index(cands, [0, 2]) == 0  # both unscored: a tie, the lowest index
    assert best_index([cand("1", True, 1), cand("2", True, 0.5)], [0, 1]) == 0  # an int reward counts too
    # Best-of-2 of (unscored correct, scored wrong): the scored one is always chosen
    assert best_of_k([cand("1", True, None), cand("2", False, 0.1)], 2) == 0.0
    assert best_of_k([cand("1", True, None), cand("2", False, 0.1)], 1) == 0.5
    # below a negative reward too (the logprob reward is always negative): unscored is not a score of 0
    assert best_index([cand("1", True, None), cand("2", False, -2.5)], [0, 1]) == 1
    assert best_index([cand("1", True, nan), cand("2", False, -math.inf)], [0, 1]) == 0  # a tie at -inf
    assert best_of_k([cand("1", True, None), cand("2", False, -0.1)], 2) == 0.0


def test_vote_skips_candidates_without_an_answer_and_weighs_rewards():
    # an unanswered candidate does not vote, and does not stop the count: "b" has two votes to one
    cands = [cand(None, False, 0.9), cand("a", False, 0.1), cand("b", True, 0.1), cand("b", True, 0.1)]
    assert vote_index(cands, range(4)) == 2
    # weighted: the reward sums decide, not the counts ("a" 0.2 from two votes, "b" 0.5 from one)
    w = [cand("a", False, 0.1), cand("a", False, 0.1), cand("b", True, 0.5)]
    assert vote_index(w, range(3)) == 0 and vote_index(w, range(3), weighted=True) == 2
    # an unscored vote weighs nothing: not minus infinity (which would sink "a"'s 0.3), not 1
    assert (
        vote_index(
            [cand("a", True, None), cand("a", True, 0.3), cand("b", False, 0.2)], range(3), weighted=True
        )
        == 0
    )
    assert vote_index([cand("a", False, None), cand("b", True, 0.5)], range(2), weighted=True) == 1
    # the largest sum wins however small the margin: 1e-20 beats 0.0 seen first
    assert vote_index([cand("a", False, 0.0), cand("b", True, 1e-20)], range(2), weighted=True) == 1


def test_weighted_majority_at_k_by_hand():
    w = [cand("a", False, 0.1), cand("a", False, 0.1), cand("b", True, 0.5)]
    # k=2: {0,1} "a" wrong; {0,2} and {1,2} "b" 0.5 > "a" 0.1, right; unweighted those two tie → "a"
    assert vote_at_k(w, 2, weighted=True) == pytest.approx(2 / 3) and vote_at_k(w, 2) == 0.0
    assert vote_at_k(w, 3, weighted=True) == 1.0 and vote_at_k(w, 3) == 0.0


def test_sampled_subsets_are_drawn_without_replacement(monkeypatch):
    monkeypatch.setattr(kcurves, "EXACT_SUBSETS", 0)  # always sample
    # the only 2-subset of 2 candidates is both: a tie, the first seen ("a", correct) wins every time;
    # a draw with replacement would also give {1, 1}, a wrong vote
    assert vote_at_k([cand("a", True), cand("b", False)], 2) == 1.0


def test_exactly_exact_subsets_are_still_enumerated(monkeypatch):
    # n=5, k=2: C(5, 2) = 10 subsets. A pair's majority is its lower index (same answer, or a tie to the
    # first seen); only candidate 1 is right and it is the lower index of 3 pairs: exactly 3/10
    cands = [cand(str(i), i == 1) for i in range(5)]
    monkeypatch.setattr(kcurves, "EXACT_SUBSETS", 10)
    assert vote_at_k(cands, 2) == pytest.approx(0.3)
    curve = k_curve([{"candidates": cands}])
    assert [p.exact for p in curve] == [True] * 5
    monkeypatch.setattr(kcurves, "EXACT_SUBSETS", 9)
    assert [p.exact for p in k_curve([{"candidates": cands}])] == [True, False, False, True, True]


def test_k_curve_keeps_only_ks_in_range():
    recs = [{"candidates": [cand("1", True, 0.5)] * 4}]
    assert [p.k for p in k_curve(recs, [0, 1, 3, 4, 5])] == [1, 3, 4]
    assert [p.k for p in k_curve(recs, [2])] == [2]


def test_k_curve_by_hand_with_weighted_majority():
    w = [cand("a", False, 0.1), cand("a", False, 0.1), cand("b", True, 0.5)]
    right = [cand("c", True, 0.3)] * 3
    curve = k_curve([{"candidates": w}, {"candidates": right}])
    # per problem of w, k = 1, 2, 3: pass@k 1/3, 1 - C(2,2)/C(3,2) = 2/3, 1; majority 1/3, 0, 0;
    # Best-of-k (b ranks first: chosen in C(2, k-1)/C(3, k) of the subsets) 1/3, 2/3, 1; weighted 1/3, 2/3, 1
    third, two = 1 / 3, 2 / 3
    expected = [(third, third, third, third), (two, 0, two, two), (1, 0, 1, 1)]
    assert len(curve) == 3
    for p, (pk, maj, bo, wm) in zip(curve, expected, strict=True):
        assert p.problems == 2 and p.exact
        assert p.pass_at_k == pytest.approx((pk + 1) / 2) and p.majority == pytest.approx((maj + 1) / 2)
        assert p.best_of == pytest.approx((bo + 1) / 2) and p.weighted_majority == pytest.approx((wm + 1) / 2)
        assert set(p.ci) == {"pass_at_k", "majority", "best_of", "weighted_majority"}
    assert curve[1].to_dict()["weighted_majority"] == pytest.approx(5 / 6)
    assert curve[1].to_dict()["ci"]["best_of"] == curve[1].ci["best_of"]


def test_weighted_majority_is_left_out_for_negative_rewards():
    # the logprob reward (mean token logprob) and RM logits are negative: two votes of -1 would sum below
    # one vote of -1.5 and the lone answer would win, so the curve gives no weighted majority
    w = [cand("a", True, -1.0), cand("a", True, -1.0), cand("b", False, -1.5)]
    assert vote_index(w, range(3), weighted=True) == 2  # what the sum would pick
    curve = k_curve([{"candidates": w}, {"candidates": [cand("c", True, 0.3)] * 3}])
    assert all(p.weighted_majority is None and "weighted_majority" not in p.ci for p in curve)
    assert all(p.best_of is not None and p.majority is not None for p in curve)  # the rest stays
    nan = float("nan")  # an unscorable candidate (NaN) weighs 0 and does not stop the curve
    ok = k_curve([{"candidates": [cand("a", True, 0.2), cand("b", False, nan)]}])
    assert ok[0].weighted_majority is not None


def test_k_curve_passes_its_seed_to_the_votes_and_the_intervals(monkeypatch):
    from srd_worker.reports.stats import bootstrap_ci

    monkeypatch.setattr(kcurves, "EXACT_SUBSETS", 10)  # C(8, 4) = 70 subsets: the votes are sampled
    problems = [
        [cand(str((i * j) % 3), (i * j) % 3 == 0, 0.1 * ((i + j) % 5)) for i in range(8)] for j in range(1, 7)
    ]
    recs = [{"candidates": c} for c in problems]
    (point,) = k_curve(recs, [4], seed=3)
    maj = [vote_at_k(c, 4, seed=3) for c in problems]
    wmaj = [vote_at_k(c, 4, weighted=True, seed=3) for c in problems]
    assert point.majority == pytest.approx(sum(maj) / 6)
    assert point.weighted_majority == pytest.approx(sum(wmaj) / 6)
    ci = bootstrap_ci(maj, seed=3)
    assert point.ci["majority"] == (ci.low, ci.high)
    ci = bootstrap_ci(wmaj, seed=3)
    assert point.ci["weighted_majority"] == (ci.low, ci.high)
    # the default seed is 0 (the report builder calls k_curve without one); seed 3 gives other numbers
    assert k_curve(recs, [4]) == k_curve(recs, [4], seed=0) != [point]


def test_pass_at_k_equals_counting_subsets():
    # every k-subset of n candidates of which the first c are right: the share holding a right one
    for n in range(1, 7):
        for c in range(n + 1):
            for k in range(1, n + 1):
                subsets = list(itertools.combinations(range(n), k))
                share = sum(1 for s in subsets if min(s) < c) / len(subsets)
                assert pass_at_k(n, c, k) == pytest.approx(share), (n, c, k)
    # n - c == k: exactly one k-subset misses every right answer, 1 - 1/C(5, 2)
    assert pass_at_k(5, 3, 2) == pytest.approx(0.9)
    for bad_k in (0, -1, 6):
        with pytest.raises(ValueError):
            pass_at_k(5, 2, bad_k)


def test_k_curve_without_every_reward_has_no_reward_metrics():
    # one unscored candidate is enough: Best-of-k and the weighted vote need every candidate scored
    recs = [
        {"candidates": [cand("1", True, 0.5), cand("2", False, None)]},
        {"candidates": [cand("1", True, 0.2)] * 2},
    ]
    for p in k_curve(recs):
        assert p.best_of is None and p.weighted_majority is None
        assert set(p.ci) == {"pass_at_k", "majority"}
    # k=1: (1/2 + 1) / 2 for both metrics that remain
    assert k_curve(recs)[0].majority == pytest.approx(0.75) == k_curve(recs)[0].pass_at_k
