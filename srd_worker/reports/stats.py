"""Statistics for experiments (pure, numpy only): bootstrap confidence intervals over problems and seeds,
and the paired comparison of two methods on the same problems and seeds.

Data layout: a ``problems × seeds`` matrix of per-(problem, seed) values (1/0 correctness, a reward, a
token count), one column per run seed, NaN where a cell is missing (an item failed or has no grade).

Bootstrap scheme (``bootstrap_ci``): the cluster bootstrap over problems. Each of ``B`` replicates draws P
problems with replacement, each with ALL its seed cells; the replicate's statistic is the mean of every
drawn cell (missing cells ignored). The interval is the percentile interval of the replicates (2.5% and
97.5% for 95%). A problem's seeds are its nested replicates: the spread of its seed mean already carries
the decoder's sampling noise, so the variance of the replicate mean estimates (σ_b² + σ_w²/S)/P, the
variance of the estimate (σ_b² between problems, σ_w² between seeds of a problem). Drawing the seed
columns again within each drawn problem (the two-stage bootstrap srdq used before 2026-12-07) counts σ_w²
a second time, (σ_b² + σ_w²·(2S − 1)/S²)/P: at S = 2 the within-problem part 1.5 times too large, so its
intervals were too wide, most for paired differences, whose between-problem part is small (Davison and
Hinkley 1997, §3.8). With one seed it is the ordinary bootstrap over problems; a single problem with
several seeds draws its seed cells with replacement (its only randomness). Replicates are drawn from
``numpy.random.default_rng(seed)``: the same data give the same interval.

An interval of a 0/1 measure whose every cell is 0 (or every cell 1) has no spread to resample: the
percentile interval would be [0, 0], as if a 0% over P problems were certain. There ``bootstrap_ci``
gives the exact Clopper-Pearson interval of 0 (or P) successes in P trials, [0, 1 − (α/2)^(1/P)] (or
[(α/2)^(1/P), 1]), counting each problem once whatever its seeds (a problem's seeds are not independent
draws, so P is the conservative count): 0 of 200 problems right is 0.0% [0.0, 1.8]. A paired difference
(``difference=True``) keeps the point interval: an all-zero difference is not a proportion.

Paired comparison (``paired``): cells present in both matrices are pairs; a win is a > b, a tie equal, a
loss a < b. For 0/1 correctness, the exact McNemar test is the two-sided binomial test of the b
discordant pairs won by A among the b + c discordant pairs (p = min(1, 2·P[X <= min(b, c)]), X ~
Binomial(b + c, 1/2); p = 1 when there is no discordant pair). The CI of the mean difference is the same
bootstrap applied to the paired differences (problems resampled together for both methods, so the
pairing is kept).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

#: Bootstrap replicates by default.
N_BOOT = 2000


@dataclass
class Interval:
    """A mean with its bootstrap interval; ``problems`` and ``seeds`` describe the data it came from."""

    mean: float | None
    low: float | None
    high: float | None
    problems: int
    seeds: int
    level: float = 0.95

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def text(self, digits: int = 3) -> str:
        if self.mean is None:
            return "n/a"
        if self.low is None or self.high is None:
            return f"{self.mean:.{digits}f}"
        return f"{self.mean:.{digits}f} [{self.low:.{digits}f}, {self.high:.{digits}f}]"


def as_matrix(values: Any) -> np.ndarray:
    """A float ``problems × seeds`` matrix (a 1-D sequence is one seed); None → NaN."""
    arr = np.array(
        [[np.nan if v is None else float(v) for v in row] for row in values]
        if len(values) and isinstance(values[0], Sequence | np.ndarray)
        else [[np.nan if v is None else float(v)] for v in values],
        dtype=float,
    )
    return arr.reshape(len(values), -1) if arr.size else np.zeros((0, 1))


def _replicates(m: np.ndarray, n_boot: int, seed: int) -> np.ndarray:
    """The cluster bootstrap means of ``m`` (problems with at least one value only; one such problem: its
    seed cells drawn with replacement)."""
    m = m[~np.all(np.isnan(m), axis=1)]
    p, s = m.shape
    rng = np.random.default_rng(seed)
    if p >= 2:
        cells = m[rng.integers(p, size=(n_boot, p))]  # (n_boot, p, s): each drawn problem with its seeds
    else:
        cells = m[0][rng.integers(s, size=(n_boot, 1, s))]
    present = ~np.isnan(cells)
    counts = present.sum(axis=(1, 2))
    sums = np.where(present, cells, 0.0).sum(axis=(1, 2))
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(counts > 0, sums / np.maximum(counts, 1), np.nan)


def clopper_pearson_all_equal(successes_all: bool, trials: int, level: float = 0.95) -> tuple[float, float]:
    """The exact (Clopper-Pearson) interval of 0 successes in ``trials`` (or of ``trials`` successes,
    ``successes_all``): [0, 1 − (α/2)^(1/n)] (or [(α/2)^(1/n), 1]), α = 1 − level."""
    bound = ((1 - level) / 2) ** (1 / trials)
    return (bound, 1.0) if successes_all else (0.0, 1 - bound)


def bootstrap_ci(
    values: Any, *, level: float = 0.95, n_boot: int = N_BOOT, seed: int = 0, difference: bool = False
) -> Interval:
    """The mean of every present cell and its cluster bootstrap percentile interval; a 0/1 measure with
    every cell equal gets the exact interval over its problems instead (module doc), unless the values
    are a paired ``difference``."""
    m = as_matrix(values)
    kept = m[~np.all(np.isnan(m), axis=1)] if m.size else m
    problems, seeds = int(kept.shape[0]), int(m.shape[1]) if m.size else 0
    if not problems:
        return Interval(None, None, None, 0, seeds, level)
    mean = float(np.nanmean(kept))
    if problems < 2 and seeds < 2:
        return Interval(mean, None, None, problems, seeds, level)
    if not difference and mean in (0.0, 1.0) and np.all(np.isin(kept[~np.isnan(kept)], (0.0, 1.0))):
        low, high = clopper_pearson_all_equal(mean == 1.0, problems, level)
        return Interval(mean, low, high, problems, seeds, level)
    reps = _replicates(kept, n_boot, seed)
    reps = reps[~np.isnan(reps)]
    alpha = (1 - level) / 2
    low, high = np.quantile(reps, [alpha, 1 - alpha])
    return Interval(mean, float(low), float(high), problems, seeds, level)


def mcnemar_exact(b: int, c: int) -> float:
    """Two-sided exact McNemar p-value: 2·P[X <= min(b, c)], X ~ Binomial(b + c, 1/2), capped at 1."""
    n = b + c
    if n == 0:
        return 1.0
    tail = sum(math.comb(n, i) for i in range(min(b, c) + 1)) / 2**n
    return min(1.0, 2 * tail)


@dataclass
class Paired:
    """A paired comparison of A and B over the cells both have."""

    pairs: int
    problems: int
    seeds: int
    wins: int  # A > B
    ties: int
    losses: int  # A < B
    mean_a: float | None
    mean_b: float | None
    diff: Interval  # mean(A - B) with its paired bootstrap interval
    # exact McNemar p over the problems (None unless every value is 0/1): with one seed over the cells;
    # with several, the sign test of each problem's mean difference over its seeds (``problem_wins`` /
    # ``problem_losses``), since one problem's seeds are not independent pairs
    mcnemar_p: float | None
    problem_wins: int = 0  # problems whose mean A - B over their paired seeds is > 0
    problem_losses: int = 0  # ... < 0
    # Σ a·(1 − b) and Σ (1 − a)·b over the pairs: for values in [0, 1] (B a k-curve's expectation over
    # k-subsets, say) the expected number of pairs only A, only B gets right; the discordant counts for 0/1
    only_a: float = 0.0
    only_b: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def paired(
    a: Any, b: Any, *, level: float = 0.95, n_boot: int = N_BOOT, seed: int = 0, tol: float = 1e-12
) -> Paired:
    """Wins / ties / losses over the cells, the exact McNemar p (0/1 data) over the problems, and the
    paired bootstrap CI of mean(A - B). The test counts a problem once: with several seeds, by the sign
    of its mean difference (cells of one problem are correlated; counted as independent pairs, k identical
    seeds would shrink p as if there were k times as many problems)."""
    ma, mb = as_matrix(a), as_matrix(b)
    if ma.shape != mb.shape:
        raise ValueError(f"A is {ma.shape[0]}×{ma.shape[1]} and B {mb.shape[0]}×{mb.shape[1]}: not paired")
    both = ~np.isnan(ma) & ~np.isnan(mb)
    da, db = ma[both], mb[both]
    wins = int(np.sum(da > db + tol))
    losses = int(np.sum(db > da + tol))
    binary = bool(np.all(np.isin(da, (0.0, 1.0))) and np.all(np.isin(db, (0.0, 1.0))))
    diff = np.where(both, ma - mb, np.nan)
    rows = np.any(both, axis=1)
    per_problem = np.nanmean(diff[rows], axis=1) if rows.any() else np.zeros(0)
    problem_wins, problem_losses = int(np.sum(per_problem > tol)), int(np.sum(per_problem < -tol))
    return Paired(
        pairs=int(both.sum()),
        problems=int(rows.sum()),
        seeds=int(ma.shape[1]),
        wins=wins,
        ties=int(both.sum()) - wins - losses,
        losses=losses,
        mean_a=float(da.mean()) if da.size else None,
        mean_b=float(db.mean()) if db.size else None,
        diff=bootstrap_ci(diff, level=level, n_boot=n_boot, seed=seed, difference=True),
        mcnemar_p=mcnemar_exact(problem_wins, problem_losses) if binary and da.size else None,
        problem_wins=problem_wins,
        problem_losses=problem_losses,
        only_a=float(np.sum(da * (1 - db))),
        only_b=float(np.sum((1 - da) * db)),
    )
