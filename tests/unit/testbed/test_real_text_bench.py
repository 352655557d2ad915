"""benchmarks/real_text.py's AUROC (hand-worked values, ties counted half) and its interval over problems."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from benchmarks.real_text import auroc, reward_auroc

pytestmark = pytest.mark.unit


def test_auroc_by_hand():
    # pairs (correct, wrong): (0.35, 0.1) > , (0.35, 0.4) <, (0.8, 0.1) >, (0.8, 0.4) > -> 3/4
    assert auroc([0.1, 0.4, 0.35, 0.8], [False, False, True, True]) == pytest.approx(0.75)
    assert auroc([0.5, 0.5], [True, False]) == pytest.approx(0.5)  # a tie counts half
    assert auroc([0.2, 0.2, 0.9], [False, True, True]) == pytest.approx(0.75)
    assert auroc([0.1, 0.2], [True, True]) is None  # no wrong response: undefined
    assert auroc([0.9, 0.1], [True, False]) == 1.0 and auroc([0.1, 0.9], [True, False]) == 0.0


def test_reward_auroc_pools_candidates_and_bootstraps_problems():
    def rec(pairs):
        return {
            "candidates": [{"reward": r, "correct": c} for r, c in pairs]
            + [{"reward": None, "correct": True}]
        }

    runs = [SimpleNamespace(records=[rec([(0.9, True), (0.1, False)]), rec([(0.8, True), (0.2, False)])])]
    out = reward_auroc(runs, resamples=200)
    assert out["auroc"] == 1.0 and (out["low"], out["high"]) == (1.0, 1.0)
    assert (out["responses"], out["correct"], out["problems"]) == (4, 2, 2)  # unscored candidates left out
