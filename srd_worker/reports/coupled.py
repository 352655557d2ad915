"""Coupled comparison of SRD with its rejection-sampling ablation (ALGORITHMS.md §1.10; SRD paper App. G,
Table 7 layout).

Both runs must cover the same items with the same run seed: SRD and ``rejection_sampling`` (rank variant)
draw their drafts with the same seeds (kind ``draft``, same candidate ids), so per item the two methods
start from identical drafts and differ only by SRD's refinements. Per item we compare the best reward
among kept trajectories, R_max; the quality gain of Thm 3.5 is estimated as Δ_n = mean(R_max^SRD −
R_max^RS) over items where both have one.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

#: Spec fields two coupled runs must share: the same rows, prompts, model, reward and run seed.
SHARED_SPEC = ("dataset_sha256", "task", "fields", "model", "engine", "reward", "seed", "limit")
#: Method parameters both runs must share so the seeded drafts (and the pool they are ranked in) agree.
SHARED_PARAMS = (
    "n",
    "temperature",
    "top_p",
    "top_k",
    "max_new_tokens",
    "chunk_tokens",
    "archive_all",
    "rank_unfinished_only",
)


def coupling_mismatches(srd_spec: dict[str, Any], rs_spec: dict[str, Any]) -> list[str]:
    """Why two stored run specs are not an SRD run and its coupled rejection-sampling ablation (empty when
    they are): methods ``srd`` / ``rejection_sampling``, equal data/model/reward/seed (``SHARED_SPEC``),
    equal drafting parameters (``SHARED_PARAMS``), the rank variant with θ = SRD's θ_high (App. G: the
    ablation is SRD with θ_low = θ_high and no editor), and SRD's incremental form (the batch form drafts
    every candidate to the end before routing, so its pool differs from the ablation's from round 2 on)."""
    problems: list[str] = []
    if srd_spec.get("method") != "srd":
        problems.append(f"the first run is a {srd_spec.get('method')} run, not srd")
    if rs_spec.get("method") != "rejection_sampling":
        problems.append(f"the second run is a {rs_spec.get('method')} run, not rejection_sampling")
    for key in SHARED_SPEC:
        if srd_spec.get(key) != rs_spec.get(key):
            problems.append(f"{key} differs: {srd_spec.get(key)!r} vs {rs_spec.get(key)!r}")
    sp, rp = srd_spec.get("params") or {}, rs_spec.get("params") or {}
    for key in SHARED_PARAMS:
        if sp.get(key) != rp.get(key):
            problems.append(f"parameter {key} differs: {sp.get(key)!r} vs {rp.get(key)!r}")
    if rp.get("variant", "rank") != "rank":
        problems.append(f"the rejection-sampling run uses variant={rp.get('variant')}, not rank")
    elif sp.get("theta_high") != rp.get("theta"):
        problems.append(f"theta {rp.get('theta')!r} differs from SRD's theta_high {sp.get('theta_high')!r}")
    if sp.get("form", "incremental") != "incremental":
        problems.append(f"the SRD run uses form={sp.get('form')}; only the incremental form is coupled")
    return problems


@dataclass
class CoupledComparison:
    items: int
    mean_rmax_srd: float | None
    mean_rmax_rs: float | None
    delta_n: float | None
    wins: int
    ties: int
    losses: int
    refinements: int
    refinements_improved: float | None  # share of refinements whose reward went up
    reward_before_refine: float | None
    reward_after_refine: float | None
    delta_n_ci: tuple[float | None, float | None] = (None, None)  # paired bootstrap 95% CI of Δ_n

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _rmax(record: dict[str, Any]) -> float | None:
    value = (record.get("extra") or {}).get("R_max")
    return None if value is None else float(value)


def compare(
    srd: Sequence[dict[str, Any]], rs: Sequence[dict[str, Any]], *, tie_tol: float = 1e-12
) -> CoupledComparison:
    """Pair records by item id and compare R_max (records as stored by the runner)."""
    by_id = {r["item_id"]: r for r in rs}
    missing = [r["item_id"] for r in srd if r["item_id"] not in by_id]
    if missing:
        raise ValueError(f"items {missing[:5]} are in the SRD run but not in the rejection-sampling run")
    pairs = [(_rmax(r), _rmax(by_id[r["item_id"]])) for r in srd]
    both = [(a, b) for a, b in pairs if a is not None and b is not None]
    wins = sum(1 for a, b in both if a > b + tie_tol)
    losses = sum(1 for a, b in both if b > a + tie_tol)
    refinements = sum(int((r.get("extra") or {}).get("refinements") or 0) for r in srd)
    improved = sum(int((r.get("extra") or {}).get("refine_improved") or 0) for r in srd)
    before = sum(
        ((r.get("extra") or {}).get("reward_before_refine") or 0.0)
        * int((r.get("extra") or {}).get("refinements") or 0)
        for r in srd
    )
    after = sum(
        ((r.get("extra") or {}).get("reward_after_refine") or 0.0)
        * int((r.get("extra") or {}).get("refinements") or 0)
        for r in srd
    )

    def mean(values: list[float]) -> float | None:
        return sum(values) / len(values) if values else None

    from srd_worker.reports.stats import bootstrap_ci

    ci = bootstrap_ci([x - y for x, y in both], difference=True)
    return CoupledComparison(
        items=len(both),
        mean_rmax_srd=mean([a for a, _ in both]),
        mean_rmax_rs=mean([b for _, b in both]),
        delta_n=mean([a - b for a, b in both]),
        wins=wins,
        ties=len(both) - wins - losses,
        losses=losses,
        refinements=refinements,
        refinements_improved=improved / refinements if refinements else None,
        reward_before_refine=before / refinements if refinements else None,
        reward_after_refine=after / refinements if refinements else None,
        delta_n_ci=(ci.low, ci.high),
    )


# ----------------------------------------------------------------------------- generic paired comparison
def paired_records(
    a: Sequence[dict[str, Any]], b: Sequence[dict[str, Any]], *, metric: str = "auto", seed: int = 0
) -> tuple[str, Any]:
    """Any two runs on the same problems: pair records by item id and compare per-item correctness
    (``metric=accuracy``; 1/0, failed or ungraded items left out) or reward (``metric=reward``); ``auto``
    picks accuracy when both runs have graded items. Returns (metric, ``stats.Paired``): wins / ties /
    losses of A against B, the exact McNemar p (accuracy) and the paired bootstrap CI of mean(A - B)."""
    from srd_worker.reports.rows import correct_value, reward_value
    from srd_worker.reports.stats import paired

    by_id = {r["item_id"]: r for r in b}
    common = [r for r in a if r["item_id"] in by_id]
    if not common:
        raise ValueError("the two runs share no item: a paired comparison needs the same problems")
    if metric == "auto":
        graded = any(correct_value(r) is not None for r in common) and any(
            correct_value(by_id[r["item_id"]]) is not None for r in common
        )
        metric = "accuracy" if graded else "reward"
    if metric not in ("accuracy", "reward"):
        raise ValueError(f"unknown metric {metric!r} (accuracy, reward or auto)")
    value = correct_value if metric == "accuracy" else reward_value
    return metric, paired([value(r) for r in common], [value(by_id[r["item_id"]]) for r in common], seed=seed)
