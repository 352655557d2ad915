"""Pure rank, route and boundary math — SRD §1.4 (rank normalisation Eq. 2, routing Eq. 3, FINDBOUNDARY
Eq. 4 with the span cap of Alg. 1 lines 17-18, the closed-form tier sizes), the efficiency gain of §1.10
(Thm 3.3), Speculative Rejection's survivor count (§2.3), and the routing strategies the SRD loop
(``srd_loop.py``) is given: ``RankRouter`` (SRD, rejection sampling ``variant=rank``) and
``ThresholdRouter`` (rejection sampling ``variant=absolute``).

No state, no engine, no reward model: plain functions over scores and positions.

PROPOSED choices (ALGORITHMS.md marks them so)
    - n_P = 1 ⇒ u = 1; ties are broken by a stable sort in candidate-id order; NaN rewards rank last.
    - ``route`` compares with a tolerance ``ROUTE_EPS`` (1e-9) so that u = θ exactly (e.g. u = 0.5 when
      r = (n_P-1)/2) is not lost to float error; valid while 1/((n_P-1)·den(θ)) ≫ 1e-9.
    - FINDBOUNDARY reads checkpoints at multiples of m plus the current end ``length`` when it is not a
      multiple of m; without a drop j* = max(0, length - L_max); then j* ← max(j*, length - L_max).
      The earliest drop is searched over the WHOLE trajectory, so a drop before the last L_max tokens
      yields j* = length - L_max even if a later drop lies inside the tail (literal Alg. 1 reading).
      ``l_max = 0`` (or ``math.inf``) disables the cap (the L_max = ∞ ablation of §1.12).
    - ``search="tail"`` (SRD's ``boundary_search=tail``) looks for the earliest drop only among the
      checkpoint pairs (a, b) that end inside the regenerable tail (b > length - L_max), so a drop before
      the tail no longer hides a later one inside it; without such a drop j* = length - L_max as before.
      With an uncapped tail (L_max = ∞) both readings coincide.
    - ``resolve_boundary`` decides j* from incomplete checkpoint scores (lazy scoring, ``srd_loop.py``):
      because of the whole-trajectory reading above, a drop before the tail decides j*, so the scan runs
      from the start and asks for the missing checkpoints up to the first drop already known (or for
      nothing, if a known drop lies at or before length - L_max). Same j* as ``find_boundary`` on the
      full set (tested).
    - Absolute threshold routing: KEEP iff reward ≥ threshold (NaN never passes), else DISCARD; if none
      passes, the best-ranked one is kept (min-1 guard, PAPER SRD App. E).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Mapping, Sequence
from fractions import Fraction

#: Tolerance of ``route`` at θ equality (documented in the module docstring).
ROUTE_EPS = 1e-9
KEEP, REFINE, DISCARD = "keep", "refine", "discard"

#: A routing strategy: the tier of each pool member from the pool's scores (pool in candidate-id order).
Router = Callable[[Sequence[float]], list[str]]


def rank_order(scores: Sequence[float]) -> list[int]:
    """Candidate indices from best to worst: descending score, stable (ties keep index order), NaN last."""

    def key(i: int) -> tuple[int, float]:
        return (0, 0.0) if math.isnan(scores[i]) else (1, scores[i])

    return sorted(range(len(scores)), key=key, reverse=True)  # reverse=True keeps the sort stable


def ranks(scores: Sequence[float]) -> list[int]:
    """Rank r of each candidate (0 = best) under ``rank_order``."""
    r = [0] * len(scores)
    for pos, i in enumerate(rank_order(scores)):
        r[i] = pos
    return r


def rank_normalise(scores: Sequence[float]) -> list[float]:
    """u = 1 - r/(n-1) [PAPER Eq. 2], computed exactly (Fraction) then rounded once to float.

    n = 1 ⇒ [1.0]; n = 0 ⇒ []. u = 0.5 comes out exactly when r = (n-1)/2.
    """
    n = len(scores)
    if n == 0:
        return []
    if n == 1:
        return [1.0]
    return [float(1 - Fraction(r, n - 1)) for r in ranks(scores)]


def route(u: float, theta_high: float, theta_low: float) -> str:
    """'keep' if u ≥ θ_high, 'refine' if θ_low < u < θ_high, else 'discard' [PAPER Eq. 3].

    KEEP is tested first, so θ_low = θ_high leaves no REFINE band. Equalities are judged with the
    tolerance ``ROUTE_EPS`` so a u that equals θ in exact arithmetic is never lost to float error.
    """
    if u >= theta_high - ROUTE_EPS:
        return KEEP
    if u > theta_low + ROUTE_EPS:
        return REFINE
    return DISCARD


def _exact(x: float) -> Fraction:
    """The decimal a threshold was written as (0.3 → 3/10), so closed forms match ``route``."""
    return Fraction(repr(float(x)))


def routing_counts(n: int, theta_high: float, theta_low: float) -> tuple[int, int, int]:
    """(#KEEP, #REFINE, #DISCARD) for a pool of n distinct ranks (§1.4 closed form).

    #KEEP = ⌊(1-θ_high)(n-1)⌋ + 1 (ranks r ≤ (1-θ_high)(n-1)); ranks r ≥ ⌈(1-θ_low)(n-1)⌉ are
    DISCARD unless already KEEP; REFINE is the rest. Exact rational arithmetic on the thresholds.
    """
    if n <= 0:
        return (0, 0, 0)
    if n == 1:
        tier = route(1.0, theta_high, theta_low)
        return (int(tier == KEEP), int(tier == REFINE), int(tier == DISCARD))
    d = n - 1
    keep_bound = (1 - _exact(theta_high)) * d
    keep = 0 if keep_bound < 0 else min(n, math.floor(keep_bound) + 1)
    discard_from = min(n, max(0, math.ceil((1 - _exact(theta_low)) * d)))
    discard = n - max(keep, discard_from)
    return (keep, n - keep - discard, discard)


@dataclasses.dataclass(frozen=True)
class RankRouter:
    """Route by rank-normalised score: ``route(u, θ_high, θ_low)`` for each member [PAPER Eq. 2-3]."""

    theta_high: float
    theta_low: float

    def __call__(self, scores: Sequence[float]) -> list[str]:
        return [route(u, self.theta_high, self.theta_low) for u in rank_normalise(scores)]


@dataclasses.dataclass(frozen=True)
class ThresholdRouter:
    """Route by raw reward: KEEP iff score ≥ ``threshold``, else DISCARD; min-1 guard [PROPOSED]."""

    threshold: float

    def __call__(self, scores: Sequence[float]) -> list[str]:
        tiers = [KEEP if s >= self.threshold else DISCARD for s in scores]  # NaN never passes
        if KEEP not in tiers and tiers:
            tiers[rank_order(scores)[0]] = KEEP  # min-1 guard: the best survives
        return tiers


def keep_count(alpha: float, pool_size: int, min_keep: int = 1) -> int:
    """Speculative Rejection's survivors of one decision: ``round((1 - α)·|pool|)`` with Python's round
    (banker's rounding, as the reference code, §2.3–2.4), at least ``min_keep``. The reference code has
    no floor (``min_keep=0``): a decision that rounds to 0 ends the search. srdq's default floor of 1 is
    its own choice: the best candidate goes on to finish instead of a partial response being the answer."""
    return max(min_keep, int(round((1 - alpha) * pool_size)))


def checkpoint_positions(m: int, length: int) -> list[int]:
    """Checkpoints FINDBOUNDARY reads: m, 2m, … ≤ length, plus ``length`` if it is not a multiple of m."""
    if m < 1:
        raise ValueError(f"scoring interval m must be >= 1, got {m}")
    pos = list(range(m, length + 1, m))
    if length > 0 and length % m:
        pos.append(length)
    return pos


def _tail_start(length: int, l_max: float) -> int:
    """Where the regenerable tail starts: ``length - l_max``, never below 0; ``l_max <= 0`` is no cap (the
    SRD parameter's 0 = ∞), so the tail is the whole trajectory."""
    return 0 if l_max <= 0 else int(max(0, length - l_max))


BOUNDARY_SEARCHES = ("whole", "tail")


def _check_search(search: str) -> None:
    if search not in BOUNDARY_SEARCHES:
        raise ValueError(f"boundary search must be one of {', '.join(BOUNDARY_SEARCHES)}, got {search!r}")


def resolve_boundary(
    scores: Mapping[int, float], m: int, length: int, l_max: float, search: str = "whole"
) -> tuple[int | None, list[int]]:
    """FINDBOUNDARY on possibly incomplete checkpoint scores.

    Returns ``(j*, [])`` when the known scores already decide j* (as ``find_boundary`` would on the full
    set), else ``(None, missing)``: the checkpoints whose scores are needed (every unknown checkpoint
    before the first drop that is already known; with ``search="tail"`` only pairs ending inside the tail
    are read).
    """
    _check_search(search)
    tail = _tail_start(length, l_max)
    pos = checkpoint_positions(m, length)
    missing: list[int] = []
    for a, b in zip(pos, pos[1:], strict=False):
        if search == "tail" and b <= tail:
            continue
        for x in (a, b):
            if x not in scores and (not missing or missing[-1] != x):
                missing.append(x)
        if a in scores and b in scores and scores[b] < scores[a]:
            if not missing:
                return max(a, tail), []
            if a <= tail:  # the earliest drop is at or before a ≤ tail: the cap decides
                return tail, []
            return None, missing
    if missing:
        return None, missing
    return tail, []


def find_boundary(
    checkpoint_scores: dict[int, float], m: int, length: int, l_max: float, search: str = "whole"
) -> int:
    """Regeneration boundary j* [PAPER Eq. 4 + Alg. 1 lines 17-18].

    Reading: checkpoints are m, 2m, … ≤ ``length`` plus ``length`` itself when it is not a multiple of m;
    j*_drop is the earliest checkpoint whose next checkpoint scores strictly lower; without a drop
    j* = max(0, length - l_max); then the span cap j* ← max(j*, length - l_max), never below 0. So at most
    the last ``l_max`` tokens are regenerated and a drop only matters when it lies inside that tail.
    A checkpoint absent from ``checkpoint_scores`` is skipped (the next checkpoint is the next present
    one); other keys (e.g. 0 or stale chunk ends) are ignored.

    ``search="whole"`` (default) takes the earliest drop over the whole trajectory (literal Alg. 1);
    ``search="tail"`` only drops between checkpoints a < b with b > length - l_max (inside the tail).
    """
    _check_search(search)
    tail = _tail_start(length, l_max)
    pos = [j for j in checkpoint_positions(m, length) if j in checkpoint_scores]
    for a, b in zip(pos, pos[1:], strict=False):
        if search == "tail" and b <= tail:
            continue
        if checkpoint_scores[b] < checkpoint_scores[a]:
            return max(a, tail)
    return tail


def efficiency_gain(p_h: float | None, p_m: float | None, rho: float | None) -> float | None:
    """1 + ρ·p_M/p_H [PAPER Thm 3.3]; None when p_H = 0, or ρ is unknown while p_M > 0."""
    if not p_h or p_m is None:
        return None
    if p_m == 0:
        return 1.0
    if rho is None:
        return None
    return 1 + rho * p_m / p_h
