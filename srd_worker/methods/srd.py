"""Selective Regenerative Decoding (SRD; Pu et al., arXiv 2608.24338) — ALGORITHMS.md §1.

SRD drafts a pool of N trajectories in chunks, ranks them by reward, keeps the strong ones, discards the
weak ones and regenerates the tail of the middle tier from the point where its checkpoint reward drops.
The code is split by concern:

    routing.py    §1.4  rank normalisation (Eq. 2), routing (Eq. 3), FINDBOUNDARY (Eq. 4) with the span
                        cap (Alg. 1 lines 17-18), the closed-form tier sizes, the efficiency gain (§1.10);
                        pure functions, re-exported here.
    pool.py             trajectories, chunked drafting, checkpoint scoring, the archive and answer rule.
    srd_loop.py   §1.5-§1.7, §1.10  the loop: Algorithm A (``form=batch``), Algorithm B
                        (``form=incremental``, default), the refinement policies, regeneration (Eq. 5) by
                        the same LM at the editor temperature, lazy/eager checkpoint scoring, statistics.
    srd.py              this file: the parameters and the ``srd`` method, which runs ``SRDLoop`` with
                        ``RankRouter(theta_high, theta_low)``.

§1.8: the rejection-sampling ablation is the same loop with ``n_refine=0`` and ``theta_low ==
theta_high`` (``rejection_sampling.py`` builds that configuration and its own ``SRDLoop``).

PROPOSED choices that are parameters here (the others are listed where they are implemented)
    - ``l_max = 0`` disables the span cap (the L_max = ∞ ablation of §1.12).
    - ``boundary_search``: ``whole`` (default, literal Alg. 1: the earliest drop over the whole trajectory,
      then the cap — with L_max = 30 in the incremental loop the earliest drop usually lies in chunks
      already kept, so j* is mostly len - L_max) or ``tail`` (the earliest drop inside the regenerable tail
      only, which makes the localisation matter under the cap).
    - ``n_refine`` counts refinements per trajectory over its whole life; 0 disables the editor.
    - ``editor_temperature`` (1.0) with the drafter's top-p / top-k.
    - ``self_compare_fallback``: a self_compare failure keeps τ instead of dropping τ' and τ.
    - ``checkpoint_scoring=lazy`` (default) scores only what routing needs; same decisions as eager.
    - ``form``: ``incremental`` (Algorithm B) decides each round's refinement queue in Algorithm 1's
      sequential order, but is not the batch form (Algorithm A) run in rounds: unfinished τ' are judged
      on partial text and a kept unfinished τ' triggers another routing round; edits are seeded by
      trajectory and edit count in both forms (``srd_loop`` docstring, ALGORITHMS.md §1.7).
    - Final answer: argmax final reward over the completed trajectories of the kept set (ties: earliest
      finished round, then lowest candidate id), or over every completed trajectory ever produced
      (drafts, refinements, refine_bob losers) with ``archive_all``.

Left out
    - PRM step reduction (§0.2) lives in the reward model, not here; S-SRD (a larger editor model);
      prefix caching; early stop on reward; the "min active" rule beyond the degenerate cases described
      (top-ranked is always KEEP when θ_high ≤ 1, so the guard only restores the best when nothing
      survived, e.g. under an absolute threshold).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

from srd_worker.errors import ConfigError
from srd_worker.methods.base import Method, StepContext, param
from srd_worker.methods.pool import PoolParams
from srd_worker.methods.routing import (  # re-exported: SRD's pure functions (§1.4)
    BOUNDARY_SEARCHES,
    DISCARD,
    KEEP,
    REFINE,
    ROUTE_EPS,
    RankRouter,
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
from srd_worker.methods.srd_loop import SRDLoop, SRDState

__all__ = [
    "DISCARD",
    "KEEP",
    "POLICIES",
    "REFINE",
    "ROUTE_EPS",
    "SRD",
    "SRDParams",
    "checkpoint_positions",
    "efficiency_gain",
    "find_boundary",
    "rank_normalise",
    "rank_order",
    "ranks",
    "resolve_boundary",
    "route",
    "routing_counts",
]

POLICIES = ("reroute_global", "keep_on_refine", "self_compare", "force_keep", "refine_bob")


@dataclasses.dataclass(frozen=True)
class SRDParams(PoolParams):
    n: int = param(10, "initial candidates N")
    theta_high: float = param(0.5, "KEEP if rank-normalised score u >= theta_high")
    theta_low: float = param(0.3, "DISCARD if u <= theta_low; REFINE in between")
    scoring_interval: int = param(10, "m: checkpoint spacing in tokens for boundary localisation")
    l_max: int = param(30, "L_max: at most this many trailing tokens are regenerated (0 = no cap)")
    boundary_search: str = param(
        "whole",
        "whole: earliest reward drop over the whole trajectory, then the L_max cap (literal Alg. 1); "
        "tail: earliest drop inside the regenerable tail [len - L_max, len] only [PROPOSED]",
    )
    n_refine: int = param(
        2, "N_refine: refinements per trajectory over its life; 0 disables the editor [PROPOSED]"
    )
    editor_temperature: float = param(
        1.0, "editor sampling temperature (top-p/top-k as the drafter) [PROPOSED]"
    )
    policy: str = param("reroute_global", "refinement policy: " + " | ".join(POLICIES))
    self_compare_delta: float = param(
        0.02, "self_compare: keep τ' iff R(τ') >= R(τ) + delta (raw reward units)"
    )
    self_compare_fallback: bool = param(
        False, "self_compare failure keeps τ instead of dropping both [PROPOSED]"
    )
    bob_b: int = param(3, "refine_bob: parallel regenerations B per refinement")
    checkpoint_scoring: str = param(
        "lazy",
        "eager: score every checkpoint each round (paper cost profile); "
        "lazy: score chunk ends, fill checkpoints on demand (same "
        "decisions)",
    )
    form: str = param(
        "incremental",
        "incremental (Algorithm B, what the experiments ran) | batch (Algorithm A, literal Alg. 1)",
    )
    archive_all: bool = param(False, "answer from every completed trajectory ever produced, not only kept")
    rank_unfinished_only: bool = param(
        False,
        "incremental: finished candidates leave the ranking pool and are kept as they are (§1.7 alternative)",
    )

    def validate(self) -> None:
        super().validate()
        _check(
            0 <= self.theta_low <= self.theta_high <= 1,
            f"need 0 <= theta_low <= theta_high <= 1, got theta_low={self.theta_low}, "
            f"theta_high={self.theta_high}",
        )
        _check(self.scoring_interval >= 1, f"scoring_interval must be >= 1, got {self.scoring_interval}")
        _check(self.l_max >= 0, f"l_max must be >= 0 (0 = no cap), got {self.l_max}")
        _check(
            self.boundary_search in BOUNDARY_SEARCHES,
            f"boundary_search must be one of {', '.join(BOUNDARY_SEARCHES)}, got {self.boundary_search!r}",
        )
        _check(self.n_refine >= 0, f"n_refine must be >= 0, got {self.n_refine}")
        _check(
            self.editor_temperature >= 0, f"editor_temperature must be >= 0, got {self.editor_temperature}"
        )
        _check(self.policy in POLICIES, f"policy must be one of {', '.join(POLICIES)}, got {self.policy!r}")
        _check(self.bob_b >= 1, f"bob_b must be >= 1, got {self.bob_b}")
        _check(
            self.checkpoint_scoring in ("lazy", "eager"),
            f"checkpoint_scoring must be lazy or eager, got {self.checkpoint_scoring!r}",
        )
        _check(self.form in ("incremental", "batch"), f"form must be incremental or batch, got {self.form!r}")
        _check(
            not (self.rank_unfinished_only and self.form == "batch"),
            "rank_unfinished_only applies to form=incremental only",
        )


def _check(cond: bool, message: str) -> None:
    if not cond:
        raise ConfigError(message)


class SRD(Method[SRDState]):
    name = "srd"
    Params = SRDParams
    summary = "Selective Regenerative Decoding: rank-route partial drafts, regenerate the weak tails"
    needs_reward = True

    def __init__(self, params: SRDParams) -> None:
        super().__init__(params)
        #: the SRD configuration the loop runs with
        self.cfg: SRDParams = params
        self.loop = SRDLoop(params, RankRouter(params.theta_high, params.theta_low))

    def init_state(self, item_id: str, question: str, prompt_ids: Sequence[int]) -> SRDState:
        return self.loop.init_state(item_id, question, prompt_ids)

    def step(self, states: list[SRDState], ctx: StepContext) -> list[SRDState]:
        return self.loop.step(states, ctx)

    def result(self, state: SRDState) -> dict[str, Any]:
        return self.loop.result(state)
