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
    srd.py              this file: the ``srd`` method, which runs ``SRDLoop`` with
                        ``RankRouter(theta_high, theta_low)``; its parameters (``SRDParams``) live with the
                        loop they configure and are re-exported here.

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

from collections.abc import Sequence
from typing import Any

from srd_worker.methods.base import Method, StepContext
from srd_worker.methods.routing import (  # re-exported: SRD's pure functions (§1.4)
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
from srd_worker.methods.srd_loop import POLICIES, SRDLoop, SRDParams, SRDState

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


class SRD(Method[SRDState, SRDParams]):
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

    def width(self, state: SRDState) -> int:
        """A refinement wave's rows, else (drafting) the unfinished candidates, as ``Method.width``."""
        return self.loop.wave_rows(state) or super().width(state)

    anytime = True

    def current_best(self, state: SRDState, ctx: StepContext) -> tuple[str, float | None]:
        return self.loop.current_best(state, ctx)

    def result(self, state: SRDState) -> dict[str, Any]:
        return self.loop.result(state)
