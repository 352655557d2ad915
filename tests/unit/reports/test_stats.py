"""Bootstrap intervals and paired comparisons: textbook values and simulated coverage."""

from __future__ import annotations

import math

import numpy as np
import pytest

from srd_worker.reports.stats import as_matrix, bootstrap_ci, mcnemar_exact, paired


def test_mcnemar_textbook_value():
    # b=10, c=2: 2 * P[X <= 2], X ~ Bin(12, 1/2) = 2 * (1 + 12 + 66) / 4096 = 0.0385742...
    assert mcnemar_exact(10, 2) == pytest.approx(2 * (1 + 12 + 66) / 4096)
    assert mcnemar_exact(10, 2) == pytest.approx(0.03857421875)
    assert mcnemar_exact(2, 10) == mcnemar_exact(10, 2)
    assert mcnemar_exact(0, 0) == 1.0 and mcnemar_exact(3, 3) == 1.0
    assert mcnemar_exact(5, 0) == pytest.approx(2 / 32)


def test_paired_counts_and_mcnemar():
    a = [1] * 10 + [0] * 2 + [1] * 5 + [0] * 3
    b = [0] * 10 + [1] * 2 + [1] * 5 + [0] * 3
    res = paired(a, b)
    assert (res.wins, res.ties, res.losses, res.pairs) == (10, 8, 2, 20)
    assert res.mcnemar_p == pytest.approx(mcnemar_exact(10, 2))
    assert res.diff.mean == pytest.approx(8 / 20)
    assert res.diff.low < 8 / 20 < res.diff.high
    rewards = paired([0.5, 0.7, None], [0.4, 0.9, 0.1])
    assert rewards.mcnemar_p is None and rewards.pairs == 2 and (rewards.wins, rewards.losses) == (1, 1)
    with pytest.raises(ValueError):
        paired([[1, 0]], [1, 0])


def test_mcnemar_counts_a_problem_once_whatever_its_seeds():
    # 4 wins / 0 losses over 4 problems (p = 2/16): copied over 3 seeds the p-value stays, where 12
    # independent cells would give 2/4096; the cell counts still say 12 / 3 / 0
    a, b = [1, 1, 1, 1, 0], [0, 0, 0, 0, 0]
    one, three = paired(a, b), paired([[x] * 3 for x in a], [[x] * 3 for x in b])
    assert one.mcnemar_p == three.mcnemar_p == pytest.approx(0.125)
    assert (three.wins, three.ties, three.losses) == (12, 3, 0)
    assert (three.problem_wins, three.problem_losses) == (4, 0)
    # seeds that disagree: a problem counts by the sign of its mean difference over the seeds both have
    nan = float("nan")
    mixed = paired([[1, 0], [1, 1], [0, 0], [1, nan]], [[0, 1], [0, 0], [0, 1], [0, 0]])
    assert (mixed.problem_wins, mixed.problem_losses) == (2, 1)  # 0 (tie), +1, −0.5, +1 (one seed)
    assert mixed.mcnemar_p == pytest.approx(mcnemar_exact(2, 1))


def test_matrix_and_degenerate_cases():
    assert as_matrix([1, None, 0]).shape == (3, 1) and math.isnan(as_matrix([1, None])[1, 0])
    assert as_matrix([[1, 0], [0, 0]]).shape == (2, 2)
    assert bootstrap_ci([]).mean is None
    one = bootstrap_ci([1])
    assert one.mean == 1.0 and one.low is None and one.text() == "1.000"
    allnan = bootstrap_ci([[None, None], [1, 0]])
    assert allnan.problems == 1 and allnan.mean == 0.5
    same = bootstrap_ci([[1, 1], [1, 1], [1, 1]])  # all right: the exact interval over the 3 problems
    assert same.mean == 1.0 and same.high == 1.0 and same.low == pytest.approx(0.025 ** (1 / 3))
    assert bootstrap_ci([0, 1, 1, 0, 1], seed=3) == bootstrap_ci([0, 1, 1, 0, 1], seed=3)


def _simulate(rng, problems, seeds, p_mean=0.6):
    # problem difficulty p_i ~ Beta with mean p_mean; each seed a Bernoulli(p_i) draw
    p = rng.beta(3 * p_mean, 3 * (1 - p_mean), size=problems)
    return (rng.random((problems, seeds)) < p[:, None]).astype(float)


def test_intervals_shrink_with_more_problems_and_seeds():
    rng = np.random.default_rng(0)

    def width(problems, seeds):
        cis = [bootstrap_ci(_simulate(rng, problems, seeds), n_boot=400, seed=i) for i in range(10)]
        return np.mean([ci.high - ci.low for ci in cis])

    assert width(120, 1) < width(30, 1) * 0.7
    assert width(30, 8) < width(30, 1)


def test_coverage_is_about_95_percent():
    """Two-level Bernoulli data with a known mean: the interval covers it ~95% of the time."""
    rng = np.random.default_rng(12)
    reps, hits = 300, 0
    for i in range(reps):
        m = _simulate(rng, 60, 3)
        ci = bootstrap_ci(m, n_boot=500, seed=i)
        hits += ci.low <= 0.6 <= ci.high
    assert 0.89 <= hits / reps <= 0.99


# ---- hand-worked cases that pin each comparison (mutation testing: docs/MUTANTS.md) ----------------------
def test_paired_hand_worked_with_ties_missing_cells_and_non_binary_values():
    from srd_worker.reports.stats import Interval

    nan = float("nan")
    a = [[1.0, 0.0], [0.5, nan], [1.0, 1.0]]
    b = [[1.0, 1.0], [0.2, 0.3], [0.0, 1.0]]
    p = paired(a, b, level=0.9, n_boot=500, seed=7)
    # cells: tie, loss, win, (missing in A), win, tie; an equal pair is a tie, never a win and a loss
    assert (p.pairs, p.problems, p.seeds, p.wins, p.ties, p.losses) == (5, 3, 2, 2, 2, 1)
    assert p.mean_a == pytest.approx(3.5 / 5) and p.mean_b == pytest.approx(3.2 / 5)
    assert p.mcnemar_p is None  # 0.5, 0.2 and 0.3 are not 0/1 outcomes
    expected = bootstrap_ci([[0.0, -1.0], [0.3, nan], [1.0, 0.0]], level=0.9, n_boot=500, seed=7)
    assert p.diff == expected and isinstance(p.diff, Interval) and p.diff.level == 0.9
    assert p.diff.mean == pytest.approx(0.06)
    # the defaults: seed 0, level 0.95, N_BOOT replicates
    assert paired(a, b).diff == bootstrap_ci([[0.0, -1.0], [0.3, nan], [1.0, 0.0]])


def test_paired_mcnemar_needs_both_sides_binary_and_no_pair_gives_no_means():
    one_sided = paired([1, 0, 1, 1], [0.5, 0.0, 0.0, 1.0])  # A is 0/1, B is not
    assert one_sided.mcnemar_p is None
    assert paired([1, 0, 1, 1], [0, 0, 0, 1]).mcnemar_p == pytest.approx(mcnemar_exact(2, 0))
    nan = float("nan")
    empty = paired([[nan], [1.0]], [[0.0], [nan]])
    assert (empty.pairs, empty.problems, empty.mean_a, empty.mean_b, empty.mcnemar_p) == (
        0,
        0,
        None,
        None,
        None,
    )


def test_interval_text_needs_both_ends():
    from srd_worker.reports.stats import Interval

    assert Interval(None, None, None, 0, 0).text() == "n/a"
    assert Interval(0.5, None, None, 1, 1).text() == "0.500"
    assert Interval(0.5, 0.4, None, 2, 1).text() == "0.500" == Interval(0.5, None, 0.6, 2, 1).text()
    assert Interval(0.5, 0.4, 0.6, 2, 1).text(digits=2) == "0.50 [0.40, 0.60]"


# ---- independent references: a loop-by-loop cluster bootstrap and the binomial test from its pmf ---------
def _reference_interval(matrix, *, level, n_boot, seed):
    """The module doc's scheme written out cell by cell: the same seeded draws (problems, each with all
    its seed cells; a single problem's seed cells instead), a replicate's mean over its present cells,
    replicates with no present cell dropped, and numpy's own quantile of the rest."""
    m = np.array([[np.nan if v is None else float(v) for v in row] for row in matrix], dtype=float)
    m = m[[not np.all(np.isnan(row)) for row in m]]
    p, s = m.shape
    rng = np.random.default_rng(seed)
    if p >= 2:
        drawn = [[list(m[i]) for i in rng.integers(p, size=p)] for _ in range(n_boot)]
    else:
        drawn = [[[m[0][j] for j in draw[0]]] for draw in rng.integers(s, size=(n_boot, 1, s))]
    reps = []
    for replicate in drawn:
        present = [v for row in replicate for v in row if not math.isnan(v)]
        if present:
            reps.append(sum(present) / len(present))
    alpha = (1 - level) / 2
    low, high = np.quantile(reps, [alpha, 1 - alpha])
    return float(low), float(high), len(reps)


def test_bootstrap_matches_a_cell_by_cell_reference_with_missing_cells():
    from srd_worker.reports.stats import Interval

    # problem 2 has one present cell of two, problem 4 none (left out): replicates with few or no present
    # cells occur, so the mean over present cells and the dropping of empty replicates both matter
    data = [[1.0, 0.0], [None, 0.5], [1.0, 1.0], [None, None], [0.0, 0.25]]
    low, high, kept = _reference_interval(data, level=0.8, n_boot=300, seed=11)
    got = bootstrap_ci(data, level=0.8, n_boot=300, seed=11)
    mean = (1.0 + 0.0 + 0.5 + 1.0 + 1.0 + 0.0 + 0.25) / 7
    assert got == Interval(pytest.approx(mean), pytest.approx(low), pytest.approx(high), 4, 2, 0.8)
    # a sparse matrix (each problem one present cell of three): a replicate's mean is over its present
    # cells only, never over its drawn cells with the missing ones counted as 0
    sparse = [[1.0, None, None], [None, 0.0, None], [None, None, 0.5]]
    low, high, kept = _reference_interval(sparse, level=0.8, n_boot=400, seed=5)
    assert kept == 400 and (low, high) != (0.0, 1.0 / 3)
    got = bootstrap_ci(sparse, level=0.8, n_boot=400, seed=5)
    assert got == Interval(pytest.approx(0.5), pytest.approx(low), pytest.approx(high), 3, 3, 0.8)
    # one problem with a missing seed: its seed cells are drawn, and replicates with none present dropped
    one = [[1.0, None, 0.0]]
    low, high, kept = _reference_interval(one, level=0.8, n_boot=300, seed=3)
    assert kept < 300
    got = bootstrap_ci(one, level=0.8, n_boot=300, seed=3)
    assert got == Interval(pytest.approx(0.5), pytest.approx(low), pytest.approx(high), 1, 3, 0.8)
    # the default seed is 0 (reports, the coupled comparison and the testbed call it without one)
    low0, high0, _ = _reference_interval(data, level=0.95, n_boot=2000, seed=0)
    default = bootstrap_ci(data)
    assert (default.low, default.high, default.level) == (pytest.approx(low0), pytest.approx(high0), 0.95)


def test_bootstrap_of_one_problem_with_a_missing_seed_never_leaves_its_values():
    from srd_worker.reports.stats import Interval

    # one problem, cells 0.75 and missing: a replicate draws column 0 and/or 1; every present cell is 0.75,
    # so every replicate with a present cell is 0.75 and those without one (both draws column 1) are dropped
    assert bootstrap_ci([[0.75, None]], n_boot=200) == Interval(0.75, 0.75, 0.75, 1, 2, 0.95)
    # cells 1 and missing: a 0/1 measure all right, so the exact interval of 1 success in 1 problem
    assert bootstrap_ci([[1.0, None]], n_boot=200) == Interval(1.0, pytest.approx(0.025), 1.0, 1, 2, 0.95)
    assert bootstrap_ci([[0.5, None], [0.5, 0.5]], n_boot=200) == Interval(0.5, 0.5, 0.5, 2, 2, 0.95)


def test_bootstrap_degenerate_intervals_keep_their_shape_and_level():
    from srd_worker.reports.stats import Interval

    assert bootstrap_ci([]) == Interval(None, None, None, 0, 0, 0.95)
    assert bootstrap_ci([], level=0.9) == Interval(None, None, None, 0, 0, 0.9)
    assert bootstrap_ci([[None, None, None]], level=0.9) == Interval(None, None, None, 0, 3, 0.9)
    assert bootstrap_ci([0.25], level=0.8) == Interval(0.25, None, None, 1, 1, 0.8)
    assert bootstrap_ci([[None], [0.25], [None]], level=0.8) == Interval(0.25, None, None, 1, 1, 0.8)


def test_as_matrix_of_nothing_is_one_empty_seed_column():
    # an empty run is a 1-D sequence: zero problems, one seed column (paired() reports its seeds from it)
    assert as_matrix([]).shape == (0, 1)
    assert paired([], []).seeds == 1
    assert as_matrix([[0, 1, None]]).tolist()[0][:2] == [0.0, 1.0]


def _binom_two_sided(b, c):
    """scipy's two-sided binomial test at p = 1/2, from the pmf: the probability of every outcome no more
    likely than the observed one (exact fractions; scipy is not installed here)."""
    from fractions import Fraction

    n = b + c
    pmf = [Fraction(math.comb(n, i), 2**n) for i in range(n + 1)]
    return float(min(Fraction(1), sum(q for q in pmf if q <= pmf[b])))


@pytest.mark.parametrize("b,c", [(0, 0), (1, 0), (0, 1), (1, 1), (4, 1), (7, 3), (3, 9), (12, 12), (20, 5)])
def test_mcnemar_equals_the_binomial_test(b, c):
    assert mcnemar_exact(b, c) == pytest.approx(_binom_two_sided(b, c))


def test_paired_difference_of_exactly_tol_is_a_tie():
    # 0.75 - 0.5 = 0.25 = tol exactly (binary fractions): "a > b + tol" fails both ways, so a tie
    p = paired([0.75, 0.5, 1.0], [0.5, 0.75, 0.5], tol=0.25)
    assert (p.wins, p.ties, p.losses) == (1, 2, 0)


def test_to_dict_gives_every_field():
    from srd_worker.reports.stats import Interval

    iv = Interval(0.5, 0.25, 0.75, 4, 2, 0.9)
    assert iv.to_dict() == {"mean": 0.5, "low": 0.25, "high": 0.75, "problems": 4, "seeds": 2, "level": 0.9}
    d = paired([1, 0], [1, 1]).to_dict()
    assert (d["pairs"], d["wins"], d["ties"], d["losses"], d["mean_a"], d["mean_b"]) == (2, 0, 1, 1, 0.5, 1.0)
    assert d["mcnemar_p"] == 1.0 and d["diff"]["mean"] == -0.5 and d["diff"]["problems"] == 2


def test_paired_default_seed_is_zero():
    # ten problems of distinct differences: the percentile ends depend on the resample, so on the seed
    a = [0.1 * i for i in range(10)]
    b = [0.07 * i * i % 1 for i in range(10)]
    diffs = [x - y for x, y in zip(a, b, strict=True)]
    assert paired(a, b).diff == bootstrap_ci(diffs, seed=0) != bootstrap_ci(diffs, seed=1)


@pytest.mark.parametrize("problems", [1, 3, 30, 200])
@pytest.mark.parametrize("level", [0.9, 0.95])
def test_an_all_wrong_or_all_right_measure_gets_the_exact_interval_over_its_problems(problems, level):
    # Clopper-Pearson at 0 successes in n: the upper end u solves P[Binomial(n, u) = 0] = (1 - level) / 2;
    # at n of n, the lower end l solves P[Binomial(n, l) = n] = (1 - level) / 2 (the same by symmetry)
    half = (1 - level) / 2
    wrong = bootstrap_ci([[0.0, 0.0]] * problems, level=level)
    assert (wrong.mean, wrong.low, wrong.problems, wrong.seeds) == (0.0, 0.0, problems, 2)
    assert (1 - wrong.high) ** problems == pytest.approx(half)
    right = bootstrap_ci([[1.0, None]] * problems, level=level)  # missing cells change nothing
    assert (right.mean, right.high) == (1.0, 1.0) and right.low**problems == pytest.approx(half)
    assert right.low == pytest.approx(1 - wrong.high)
    if problems == 200 and level == 0.95:
        assert wrong.text(3) == "0.000 [0.000, 0.018]"


def test_the_exact_interval_is_only_for_a_constant_zero_one_measure_and_never_a_difference():
    # one right answer among the wrong: the bootstrap again (its interval touches 0)
    some = bootstrap_ci([0.0] * 29 + [1.0])
    assert some.low == 0.0 and 0 < some.high < 0.2 and some.high != pytest.approx(1 - 0.025 ** (1 / 30))
    # a constant measure that is not 0/1 (tokens, a reward): no spread, a point interval
    assert (bootstrap_ci([[0.5, 0.5]] * 4).low, bootstrap_ci([[0.5, 0.5]] * 4).high) == (0.5, 0.5)
    # a difference of 0 everywhere is not a proportion: the point interval stays
    assert (
        bootstrap_ci([0.0] * 10, difference=True).low,
        bootstrap_ci([0.0] * 10, difference=True).high,
    ) == (0, 0)
    same = paired([1, 0, 1], [1, 0, 1])
    assert (same.diff.mean, same.diff.low, same.diff.high) == (0.0, 0.0, 0.0)
    both_wrong = paired([0, 0, 0], [0, 0, 0])
    assert (both_wrong.diff.low, both_wrong.diff.high, both_wrong.mean_a) == (0.0, 0.0, 0.0)
