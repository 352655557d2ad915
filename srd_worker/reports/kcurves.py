"""k-curves from one run (pure): pass@k, majority@k, Best-of-k and weighted majority@k for every k <= n,
computed from the candidates a non-adaptive run kept (the record's ``candidates``: ``answer``,
``correct``, ``reward`` per candidate, see ``runner.candidate_records``).

Why this is sound: the non-adaptive methods (``sampling``, ``best_of_n``, ``self_consistency``) draw
candidate i with seeds derived from (run seed, item, i, round, kind) only (``methods.base.derive_seed``),
so the first k candidates of a run at n ARE the candidates of a run at n=k, and any k of the n are k
independent draws. A k-curve therefore needs one run at the largest n (search-and-learn's Best-of-N
curves from one n=256 run; NeMo-Skills' pass@k / majority@k). Adaptive methods (SRD, rejection sampling,
speculative rejection) decide on the whole pool; their candidates cannot be subsampled.

Per problem, for a k, every metric is the expectation over a uniformly random k-subset of the n
candidates:

- ``pass@k``: the unbiased estimator of Chen et al. (2021), 1 - C(n-c, k) / C(n, k), c = correct
  candidates (exact).
- ``best_of_k``: correctness of the highest-reward candidate of the subset (ties: lowest index, as
  ``best_of_n``). Exact in closed form: with the candidates ordered by (reward desc, index asc), the one
  at position p is chosen iff it is in the subset and none before it is: C(n-1-p, k-1) / C(n, k).
  Unscored candidates (reward None) rank last.
- ``majority@k``: correctness of the majority answer of the subset (answers compared by their ``vote``
  class, the task's equivalence over the whole pool, or for records without it after whitespace
  normalisation; ties to the answer seen first in index order; candidates without an answer do not
  vote; nobody answered → the subset's lowest-index candidate), as ``self_consistency`` answers.
- ``weighted_majority@k``: the same vote with each candidate weighted by its reward (sum of rewards per
  answer; ties to the answer seen first). Only for rewards that are never negative (a PRM's or a judge's
  probabilities, the ``logprob`` reward): with negative rewards (an RM's logits) one more vote would lower
  an answer's sum, so the curve leaves it out (None).

The two votes are averaged over ALL C(n, k) subsets when C(n, k) <= ``EXACT_SUBSETS`` (exact), else over
``SAMPLED_SUBSETS`` random subsets drawn by ``numpy.random.default_rng([seed, k])`` (reproducible; the
estimate's standard error is below 0.5 / sqrt(SAMPLED_SUBSETS) ≈ 0.016 per problem). A problem's
correctness of a candidate comes from the record (``task.grade``); problems without any graded
candidate are left out of the correctness metrics. Run means are over problems.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Hashable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from srd_worker.methods.pool import weighted_winner
from srd_worker.reports.stats import bootstrap_ci
from srd_worker.votes import answer_key, majority

#: Methods whose candidates are independent seeded draws (a subset of k is a run at n=k).
NON_ADAPTIVE = ("sampling", "best_of_n", "self_consistency")
#: Vote metrics enumerate every k-subset up to this many subsets, else sample.
EXACT_SUBSETS = 5000
#: Random k-subsets per problem and k when enumerating would be too many.
SAMPLED_SUBSETS = 1000


def pass_at_k(n: int, c: int, k: int) -> float:
    """Chen et al. (2021) unbiased pass@k: 1 - C(n-c, k) / C(n, k) (1.0 when n - c < k)."""
    if not 0 < k <= n:
        raise ValueError(f"k must be in [1, n={n}], got {k}")
    if n - c < k:
        return 1.0
    return 1.0 - math.comb(n - c, k) / math.comb(n, k)


def _key(cand: dict[str, Any]) -> Hashable | None:
    """A candidate's vote class: the record's ``vote`` (the task's answer equivalence,
    ``tasks.base.vote_candidates``), or for a record from before srdq kept it, its answer's string."""
    return cand["vote"] if "vote" in cand else answer_key(cand.get("answer"))


def _reward(value: Any) -> float:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return -math.inf
    return float(value)


def _negative(value: Any) -> bool:
    """A reward below 0 (an unscorable NaN is not: it weighs 0 in a vote)."""
    return value is not None and not (isinstance(value, float) and math.isnan(value)) and float(value) < 0


def _correct(cand: dict[str, Any]) -> float:
    return 1.0 if cand.get("correct") else 0.0


def best_index(cands: Sequence[dict[str, Any]], subset: Sequence[int]) -> int:
    """The Best-of-k choice among ``subset`` (indices): highest reward, ties → lowest index."""
    return min(subset, key=lambda i: (-_reward(cands[i].get("reward")), i))


def vote_index(cands: Sequence[dict[str, Any]], subset: Sequence[int], *, weighted: bool = False) -> int:
    """The (weighted) majority choice among ``subset``: the first candidate (index order) holding the
    answer with the most votes (weighted: the largest reward sum); ties → the answer seen first; nobody
    answered → the lowest index."""
    order = sorted(subset)
    weights = [_reward(cands[i].get("reward")) for i in order] if weighted else None
    chosen = majority([_key(cands[i]) for i in order], weights)
    return order[0 if chosen is None else chosen]


def record_pool(record: dict[str, Any], *, archive_all: bool = False) -> list[dict[str, Any]]:
    """A stored pool-method record's answer pool, in the loop's order: its kept candidates by id, or with
    ``archive_all`` (and for Speculative Rejection, whose record lists only its archive) every listed
    candidate, as listed (the order they finished)."""
    cands = record.get("candidates") or []
    if archive_all:
        return list(cands)
    return sorted((c for c in cands if c.get("status") == "kept"), key=lambda c: int(c.get("id") or 0))


def revoted_correct(record: dict[str, Any], *, archive_all: bool = False) -> float | None:
    """1/0: whether an SRD-family record (SRD, rejection sampling) would have been right had it answered
    with ``answer=weighted_majority`` (``SRDLoop.choose``), from its stored candidates: the kept ones in
    id order (with ``archive_all`` every one, as listed: the archive's order), classed by their
    ``vote``, the class whose rewards sum highest (ties: the class seen first), answered by a member
    with the highest reward (a class's members give one answer, so which one does not change the grade). None when the record failed, is
    ungraded, kept no candidates or a kept reward is negative (the rule refuses it); a record whose kept
    candidates have no answer keeps its own grade (the rule falls back to the argmax)."""
    if record.get("error") or record.get("correct") is None or not record.get("candidates"):
        return None
    pool = record_pool(record, archive_all=archive_all)
    if not pool or "vote" not in pool[0]:
        return None
    try:  # the method's own vote rule
        first = weighted_winner([c.get("vote") for c in pool], [c.get("reward") for c in pool])
    except ValueError:  # a negative reward: the rule refuses the item
        return None
    if first is None:
        return 1.0 if record["correct"] else 0.0
    members = [c for c in pool if c.get("vote") == pool[first].get("vote")]
    return _correct(max(members, key=lambda c: _reward(c.get("reward"))))


def best_of_k(cands: Sequence[dict[str, Any]], k: int) -> float:
    """Expected correctness of Best-of-k over uniform k-subsets (exact, closed form)."""
    n = len(cands)
    order = sorted(range(n), key=lambda i: (-_reward(cands[i].get("reward")), i))
    total = math.comb(n, k)
    return sum(math.comb(n - 1 - p, k - 1) / total * _correct(cands[i]) for p, i in enumerate(order))


def _subsets(n: int, k: int, seed: int) -> tuple[list[tuple[int, ...]], bool]:
    if math.comb(n, k) <= EXACT_SUBSETS:
        return list(itertools.combinations(range(n), k)), True
    rng = np.random.default_rng([seed, k])
    return [
        tuple(sorted(rng.choice(n, size=k, replace=False).tolist())) for _ in range(SAMPLED_SUBSETS)
    ], False


def vote_at_k(cands: Sequence[dict[str, Any]], k: int, *, weighted: bool = False, seed: int = 0) -> float:
    """Expected correctness of (weighted) majority@k over k-subsets (exact or sampled, see module doc)."""
    subsets, _ = _subsets(len(cands), k, seed)
    return sum(_correct(cands[vote_index(cands, s, weighted=weighted)]) for s in subsets) / len(subsets)


@dataclass
class KPoint:
    """Run means at one k (None when no problem supports the metric)."""

    k: int
    problems: int  # problems with at least one graded candidate
    exact: bool  # the vote metrics averaged over every k-subset (else SAMPLED_SUBSETS random ones)
    pass_at_k: float | None
    majority: float | None
    best_of: float | None
    weighted_majority: float | None
    #: metric attribute -> (low, high) of its 95% bootstrap interval over problems (absent: no value)
    ci: dict[str, tuple[float | None, float | None]] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def usable(record: dict[str, Any]) -> list[dict[str, Any]] | None:
    """The record's candidates when it can enter a k-curve (no error, candidates kept, some graded)."""
    cands = record.get("candidates")
    if record.get("error") or not cands:
        return None
    if all(c.get("correct") is None for c in cands):
        return None
    return list(cands)


def k_curve(
    records: Sequence[dict[str, Any]], ks: Sequence[int] | None = None, *, seed: int = 0
) -> list[KPoint]:
    """Run means of every metric for each k (default: 1..n, n = the smallest candidate count over the
    usable records; a record with more candidates enters with its first n, which are a run at n).
    Best-of-k and weighted majority need every candidate scored (``best_of_n``)."""
    problems = [c for r in records if (c := usable(r)) is not None]
    if not problems:
        return []
    n = min(len(c) for c in problems)
    ks = list(range(1, n + 1)) if ks is None else [k for k in ks if 1 <= k <= n]
    scored = all(c.get("reward") is not None for cands in problems for c in cands)
    # a weighted vote needs weights >= 0: a negative reward would make an extra vote count against its answer
    weighable = scored and not any(_negative(c.get("reward")) for cands in problems for c in cands[:n])
    out = []
    for k in ks:
        sub = [c[:n] for c in problems]
        pk = [pass_at_k(n, sum(1 for x in c if x.get("correct")), k) for c in sub]
        maj = [vote_at_k(c, k, seed=seed) for c in sub]
        bok = [best_of_k(c, k) for c in sub] if scored else []
        wmaj = [vote_at_k(c, k, weighted=True, seed=seed) for c in sub] if weighable else []

        def mean(values: list[float]) -> float | None:
            return sum(values) / len(values) if values else None

        per_problem = {"pass_at_k": pk, "majority": maj, "best_of": bok, "weighted_majority": wmaj}
        intervals = {}
        for attr, values in per_problem.items():
            if values:
                ci = bootstrap_ci(values, seed=seed)
                intervals[attr] = (ci.low, ci.high)
        out.append(
            KPoint(
                k=k,
                problems=len(sub),
                exact=math.comb(n, k) <= EXACT_SUBSETS,
                pass_at_k=mean(pk),
                majority=mean(maj),
                best_of=mean(bok),
                weighted_majority=mean(wmaj),
                ci=intervals,
            )
        )
    return out
