"""SRD's pure functions (ALGORITHMS.md §1.4): worked examples from the spec and property tests."""

from __future__ import annotations

import math
from fractions import Fraction

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from srd_worker.methods.speculative_rejection import keep_count
from srd_worker.methods.srd import (
    DISCARD,
    KEEP,
    REFINE,
    ROUTE_EPS,
    checkpoint_positions,
    efficiency_gain,
    find_boundary,
    rank_normalise,
    rank_order,
    ranks,
    resolve_boundary,
    route,
    routing_counts,
)


def tiers(scores, th, tl):
    return [route(u, th, tl) for u in rank_normalise(scores)]


def counts(ts):
    return (ts.count(KEEP), ts.count(REFINE), ts.count(DISCARD))


# -- worked examples ----------------------------------------------------------------------------------


def test_n10_default_thresholds_5_keep_2_refine_3_discard():
    assert routing_counts(10, 0.5, 0.3) == (5, 2, 3)
    scores = [0.1 * i for i in range(10)]
    ts = tiers(scores, 0.5, 0.3)
    assert counts(ts) == (5, 2, 3)
    # the five best keep, ranks 5 and 6 refine, the three worst are discarded
    assert ts == [DISCARD] * 3 + [REFINE] * 2 + [KEEP] * 5


def test_n5_has_no_refine_tier():
    assert routing_counts(5, 0.5, 0.3) == (3, 0, 2)
    assert counts(tiers([5, 4, 3, 2, 1], 0.5, 0.3)) == (3, 0, 2)


def test_rank_normalise_examples():
    assert rank_normalise([]) == []
    assert rank_normalise([3.7]) == [1.0]  # n = 1 ⇒ u = 1 (min-1 guard)
    assert rank_normalise([0.2, 0.9, 0.5]) == [0.0, 1.0, 0.5]
    u = rank_normalise(list(range(11)))  # r = 5 = (n-1)/2 gives u = 0.5 exactly
    assert u[5] == 0.5 and route(u[5], 0.5, 0.3) == KEEP
    assert rank_normalise([1.0, 1.0, 1.0]) == [1.0, 0.5, 0.0]  # ties keep index order


def test_rank_normalise_is_exact_at_thresholds():
    # 1 - 7/10 in floats is 0.30000000000000004; computed exactly it is the literal 0.3
    u = rank_normalise(list(range(11, 0, -1)))
    assert u[7] == 0.3 and route(u[7], 0.5, 0.3) == DISCARD
    assert route(1 - 0.7, 0.5, 0.3) == DISCARD  # and float noise is tolerated by route


def test_route_rules():
    assert route(0.5, 0.5, 0.3) == KEEP
    assert route(0.4, 0.5, 0.3) == REFINE
    assert route(0.3, 0.5, 0.3) == DISCARD
    assert route(0.0, 0.5, 0.3) == DISCARD
    assert route(1.0, 0.5, 0.3) == KEEP
    # θ_low = θ_high: no refine band, KEEP wins at equality
    assert route(0.5, 0.5, 0.5) == KEEP
    assert route(0.4999, 0.5, 0.5) == DISCARD


def test_top_candidate_always_kept():
    for n in range(1, 30):
        for th, tl in [(0.5, 0.3), (0.8, 0.5), (1.0, 0.9), (1.0, 1.0)]:
            scores = [math.sin(i) for i in range(n)]
            best = rank_order(scores)[0]
            assert tiers(scores, th, tl)[best] == KEEP


def test_checkpoint_positions():
    assert checkpoint_positions(10, 100) == [10, 20, 30, 40, 50, 60, 70, 80, 90, 100]
    assert checkpoint_positions(10, 45) == [10, 20, 30, 40, 45]
    assert checkpoint_positions(10, 7) == [7]
    assert checkpoint_positions(10, 0) == []


def full(m, length, values):
    return dict(zip(checkpoint_positions(m, length), values, strict=True))


def test_boundary_outside_tail_moves_to_length_minus_lmax():
    s = full(10, 100, [1, 2, 1.5, 3, 4, 5, 6, 7, 8, 9])  # first drop after checkpoint 20
    assert find_boundary(s, 10, 100, 30) == 70


def test_boundary_inside_tail_is_kept():
    s = full(10, 100, [1, 2, 3, 4, 5, 6, 7, 8, 7.5, 9])  # first drop after checkpoint 80
    assert find_boundary(s, 10, 100, 30) == 80


def test_no_drop_regenerates_the_tail():
    s = full(10, 100, list(range(10)))
    assert find_boundary(s, 10, 100, 30) == 70
    assert find_boundary(full(10, 100, [1.0] * 10), 10, 100, 30) == 70  # equal is not a drop


def test_earliest_drop_decides_even_with_a_later_drop_in_the_tail():
    s = full(10, 100, [1, 2, 1, 3, 4, 5, 6, 7, 6, 9])  # drops after 20 and after 80
    assert find_boundary(s, 10, 100, 30) == 70


def test_final_partial_checkpoint():
    s = full(10, 45, [1, 2, 3, 4, 3.9])  # the drop is between 40 and the end 45
    assert find_boundary(s, 10, 45, 30) == 40
    assert find_boundary(full(10, 45, [1, 2, 3, 4, 5]), 10, 45, 30) == 15


def test_boundary_never_negative_and_short_responses():
    assert find_boundary(full(10, 20, [1, 2]), 10, 20, 30) == 0
    assert find_boundary(full(10, 20, [2, 1]), 10, 20, 30) == 10
    assert find_boundary({}, 10, 0, 30) == 0
    assert find_boundary(full(10, 7, [0.3]), 10, 7, 30) == 0


def test_uncapped_boundary():
    s = full(10, 100, [1, 2, 1.5, 3, 4, 5, 6, 7, 8, 9])
    assert find_boundary(s, 10, 100, math.inf) == 20
    # l_max = 0 is the SRD parameter's "no cap", in the pure functions too (not "regenerate nothing")
    assert find_boundary(s, 10, 100, 0) == 20
    assert find_boundary(full(10, 30, [1, 2, 3]), 10, 30, 0) == 0  # no drop: all of it may be regenerated
    assert resolve_boundary(s, 10, 100, 0) == (20, [])


def test_absent_checkpoints_are_skipped():
    # 20 is absent: 10 → 30 is compared directly (no drop), then 30 → 40 drops
    assert find_boundary({10: 1.0, 30: 2.0, 40: 1.5}, 10, 40, 35) == 30
    assert find_boundary({0: 9.0, 10: 1.0, 20: 2.0}, 10, 20, 30) == 0  # position 0 is not a checkpoint
    j, missing = resolve_boundary({10: 1.0, 30: 2.0, 40: 1.5}, 10, 40, 35)
    assert (j, missing) == (None, [20])


def test_efficiency_gain():
    assert efficiency_gain(0.5, 0.2, 1.0) == pytest.approx(1.4)
    assert efficiency_gain(0.0, 0.2, 1.0) is None
    assert efficiency_gain(0.6, 0.0, None) == 1.0
    assert efficiency_gain(0.6, 0.2, None) is None


def test_keep_count_uses_pythons_round():
    assert [keep_count(0.5, n) for n in (1, 2, 3, 5, 10)] == [1, 1, 2, 2, 5]
    assert keep_count(0.9, 3) == 1


def test_route_tolerance_edges_are_inclusive_for_keep_and_exclusive_for_refine():
    # KEEP iff u >= θ_high - ε (the edge itself keeps); REFINE iff u > θ_low + ε (the edge itself discards)
    assert route(0.5 - ROUTE_EPS, 0.5, 0.3) == KEEP
    assert route(0.3 + ROUTE_EPS, 0.5, 0.3) == DISCARD
    assert route(math.nextafter(0.3 + ROUTE_EPS, 1.0), 0.5, 0.3) == REFINE


def test_routing_counts_with_thresholds_above_one_has_no_keep_tier():
    # The closed form's guards (keep_bound < 0, discard rank ≥ 0) cover θ > 1, where route keeps nothing.
    # n = 1: u = 1 < θ_high = 1.5 and 1 > θ_low = 0.5 → REFINE
    assert routing_counts(1, 1.5, 0.5) == (0, 1, 0) == counts(tiers([7.0], 1.5, 0.5))
    # n = 3: u = 1, 0.5, 0; θ_high = 2 keeps none; θ_low = 0 refines u = 1 and 0.5, discards u = 0
    assert routing_counts(3, 2.0, 0.0) == (0, 2, 1) == counts(tiers([3.0, 2.0, 1.0], 2.0, 0.0))
    # θ_low = 1: no u exceeds it, all three are discarded
    assert routing_counts(3, 2.0, 1.0) == (0, 0, 3) == counts(tiers([3.0, 2.0, 1.0], 2.0, 1.0))
    assert routing_counts(0, 0.5, 0.3) == (0, 0, 0)


def test_nan_ranks_below_every_score():
    # NaN ranks last even below a negative reward (not as if it scored 0.0), and below -inf too: a failed
    # score is worse than the lowest real one, whatever the candidates' order
    assert rank_order([math.nan, -1.0]) == [1, 0]
    assert ranks([math.nan, -1.0, 2.0]) == [2, 1, 0]
    assert rank_order([math.nan, -math.inf]) == [1, 0]
    assert ranks([-math.inf, math.nan, math.inf]) == [1, 2, 0]


def test_checkpoint_positions_of_a_one_token_response():
    # length 1 < m: the end itself is the only checkpoint (the length > 0 guard only excludes length 0)
    assert checkpoint_positions(10, 1) == [1]


# a drop ending exactly at the tail start (60 → 70, tail = 100 - 30 = 70) and one inside the tail (80 → 90)
TAIL_EDGE = {10: 1.0, 20: 2.0, 30: 3.0, 40: 4.0, 50: 4.5, 60: 5.0, 70: 4.0, 80: 5.0, 90: 4.0, 100: 5.0}


def test_tail_search_ignores_a_drop_ending_at_the_tail_start():
    # search="tail" reads only pairs (a, b) with b > length - L_max: the 60 → 70 drop is not one of them,
    # so the 80 → 90 drop decides j* = 80; the whole-trajectory reading takes 60 → 70 and caps to 70
    assert find_boundary(TAIL_EDGE, 10, 100, 30, search="tail") == 80
    assert resolve_boundary(TAIL_EDGE, 10, 100, 30, search="tail") == (80, [])
    assert find_boundary(TAIL_EDGE, 10, 100, 30) == 70


def test_lazy_boundary_decided_by_a_known_drop_at_the_tail_start():
    # tail = 70; the drop 70 → 80 is known, 10..60 are not: whatever they hold, the earliest drop lies at
    # or before 70, so j* = max(drop, 70) = 70 without asking for any missing checkpoint
    assert resolve_boundary({70: 5.0, 80: 4.0}, 10, 100, 30) == (70, [])
    for filled in (
        {j: float(j) for j in range(10, 101, 10)} | {70: 5.0, 80: 4.0},
        full(10, 100, [9] + [1] * 9),
    ):
        assert find_boundary(filled, 10, 100, 30) == 70


# -- properties ---------------------------------------------------------------------------------------

thresholds = st.tuples(st.integers(0, 100), st.integers(0, 100)).map(lambda t: (max(t) / 100, min(t) / 100))
reward_lists = st.lists(
    st.one_of(st.sampled_from([0.0, 0.5, 1.0, -2.0]), st.floats(-1e6, 1e6, allow_nan=False)), max_size=60
)


@settings(max_examples=300, deadline=None)
@given(reward_lists, thresholds)
def test_routing_counts_match_closed_form(scores, th_tl):
    th, tl = th_tl
    ts = tiers(scores, th, tl)
    assert counts(ts) == routing_counts(len(scores), th, tl)
    if scores:
        assert KEEP in ts  # the pool is never empty


@settings(max_examples=300, deadline=None)
@given(reward_lists)
def test_ranks_are_a_stable_permutation(scores):
    r = ranks(scores)
    assert sorted(r) == list(range(len(scores)))
    for i in range(len(scores)):
        for j in range(len(scores)):
            if scores[i] > scores[j]:
                assert r[i] < r[j]
            elif scores[i] == scores[j] and i < j:
                assert r[i] < r[j]  # ties keep index order
    u = rank_normalise(scores)
    assert all(0.0 <= x <= 1.0 for x in u)
    if len(scores) > 1:
        assert u == [float(1 - Fraction(x, len(scores) - 1)) for x in r]


@settings(max_examples=300, deadline=None)
@given(
    st.integers(1, 6),
    st.integers(0, 70),
    st.integers(0, 40),
    st.lists(st.sampled_from([0.0, 1.0, 2.0, 3.0]), min_size=80, max_size=80),
    st.lists(st.booleans(), min_size=80, max_size=80),
)
def test_lazy_resolution_agrees_with_find_boundary(m, length, l_max, values, known):
    pos = checkpoint_positions(m, length)
    s = dict(zip(pos, values, strict=False))
    expected = find_boundary(s, m, length, l_max)
    tail = 0 if l_max == 0 else max(0, length - l_max)  # l_max = 0: no cap
    assert tail <= expected <= length
    assert expected in (0, tail) or expected % m == 0
    partial = {j: v for j, v, k in zip(pos, values, known, strict=False) if k or j == length}
    j, missing = resolve_boundary(partial, m, length, l_max)
    if j is None:
        assert missing and all(x not in partial for x in missing)
        partial.update({x: s[x] for x in missing})
        j, missing = resolve_boundary(partial, m, length, l_max)
    assert (j, missing) == (expected, [])
