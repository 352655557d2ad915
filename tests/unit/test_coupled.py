"""Coupled SRD vs rejection-sampling comparison on hand-made records (numbers checked by hand)."""

from __future__ import annotations

import pytest

from srd_worker.coupled import compare


def rec(item, rmax, refinements=0, improved=0, before=None, after=None):
    return {"item_id": item, "extra": {"R_max": rmax, "refinements": refinements, "refine_improved": improved,
                                       "reward_before_refine": before, "reward_after_refine": after}}


def test_wins_ties_losses_and_delta():
    srd = [rec("a", 0.9, 2, 1, 0.4, 0.6), rec("b", 0.5), rec("c", 0.2, 1, 0, 0.3, 0.1), rec("d", None)]
    rs = [rec("a", 0.7), rec("b", 0.5), rec("c", 0.4), rec("d", 0.1)]
    c = compare(srd, rs)
    assert c.items == 3  # d has no kept trajectory in SRD
    assert (c.wins, c.ties, c.losses) == (1, 1, 1)
    assert c.mean_rmax_srd == pytest.approx((0.9 + 0.5 + 0.2) / 3)
    assert c.mean_rmax_rs == pytest.approx((0.7 + 0.5 + 0.4) / 3)
    assert c.delta_n == pytest.approx((0.2 + 0.0 - 0.2) / 3)
    assert c.refinements == 3 and c.refinements_improved == pytest.approx(1 / 3)
    # means weighted by each item's number of refinements
    assert c.reward_before_refine == pytest.approx((0.4 * 2 + 0.3) / 3)
    assert c.reward_after_refine == pytest.approx((0.6 * 2 + 0.1) / 3)


def test_items_must_match():
    with pytest.raises(ValueError, match="not in the rejection-sampling run"):
        compare([rec("a", 1.0)], [rec("b", 1.0)])


def test_no_refinements_gives_none():
    c = compare([rec("a", 1.0)], [rec("a", 1.0)])
    assert c.refinements == 0 and c.refinements_improved is None and c.reward_before_refine is None
