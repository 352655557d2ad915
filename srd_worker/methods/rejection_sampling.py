"""Rejection sampling baselines (ALGORITHMS.md §3.2, §1.8) on SRD's incremental loop.

Design: ``RejectionSamplingParams.srd_params()`` builds the SRD configuration of the ablation and the
method runs its own ``srd_loop.SRDLoop`` with it, passing the routing rule as a strategy
(``routing.RankRouter`` or ``routing.ThresholdRouter``); ``result`` drops SRD's refinement fields and
adds the variant. Nothing is inherited from the ``srd`` method.

``variant=rank`` — SRD's own rejection-sampling ablation [PAPER SRD App. G, "spec_rej mode"]: the SRD
incremental loop (Algorithm B, §1.7) with no editor (``n_refine=0``) and θ_low = θ_high = ``theta``
(0.5): every round, the candidates whose rank-normalised score u ≥ θ survive and the rest are
discarded. It runs SRD's loop itself, so with the same run seed it shares SRD's drafts (seed kind
``draft`` per candidate id and round) — the coupled Δ_n experiment of §1.10 — and SRD with
``n_refine=0, theta_low=theta_high`` gives exactly this method's results.

``variant=absolute`` — the same loop, routed by the raw reward instead of the rank [PROPOSED]: a
candidate survives a round iff its current (partial or final) reward ≥ ``threshold``; if none does,
the best-ranked one survives (min-1 guard, PAPER SRD App. E). Calibrate the threshold per reward model
(raw scales differ, §0.2), e.g. as a quantile of rewards on held-out samples.

Answer, statistics and ledger as in SRD (argmax final reward over the surviving completed trajectories,
ties → earliest finished, then lowest id; ``archive_all`` chooses among every completed draft).

§3.2(b)'s draw-until-accept loop over full samples with a total budget B and a samples-to-first-accept
report is its own method, ``draw_until_accept`` (the threshold here prunes a fixed pool of n drafts).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

from srd_worker.errors import ConfigError
from srd_worker.methods.base import Method, StepContext, param
from srd_worker.methods.pool import ANSWER_HELP, PoolParams, check_answer_rule
from srd_worker.methods.routing import RankRouter, Router, ThresholdRouter
from srd_worker.methods.srd_loop import SRDLoop, SRDParams, SRDState

VARIANTS = ("rank", "absolute")


@dataclasses.dataclass(frozen=True)
class RejectionSamplingParams(PoolParams):
    n: int = param(10, "initial candidates N")
    variant: str = param(
        "rank",
        "rank: survive iff rank-normalised u >= theta (SRD App. G); "
        "absolute: survive iff raw reward >= threshold",
    )
    theta: float = param(0.5, "rank variant: survival threshold on u (theta_low = theta_high = theta)")
    threshold: float | None = param(None, "absolute variant: raw reward threshold r* (required; RM-specific)")
    archive_all: bool = param(
        False, "answer from every completed trajectory ever drafted, not only survivors"
    )
    rank_unfinished_only: bool = param(False, "finished candidates leave the ranking pool and are kept")
    answer: str = param(
        "best",
        "final answer from the survivors (or the archive): " + ANSWER_HELP + " [PROPOSED]",
        in_id_at_default=False,
    )

    def validate(self) -> None:
        super().validate()
        if self.variant not in VARIANTS:
            raise ConfigError(f"variant must be one of {', '.join(VARIANTS)}, got {self.variant!r}")
        if not 0 <= self.theta <= 1:
            raise ConfigError(f"theta must be in [0, 1], got {self.theta}")
        if self.variant == "absolute" and self.threshold is None:
            raise ConfigError("variant=absolute needs a reward threshold: set threshold")
        check_answer_rule(self.answer)

    def srd_params(self) -> SRDParams:
        """The SRD configuration this baseline runs: no editor, no REFINE band, lazy scoring."""
        return SRDParams(
            temperature=self.temperature,
            top_p=self.top_p,
            top_k=self.top_k,
            max_new_tokens=self.max_new_tokens,
            chunk_tokens=self.chunk_tokens,
            n=self.n,
            theta_high=self.theta,
            theta_low=self.theta,
            n_refine=0,
            checkpoint_scoring="lazy",
            form="incremental",
            archive_all=self.archive_all,
            rank_unfinished_only=self.rank_unfinished_only,
            answer=self.answer,
        )


class RejectionSampling(Method[SRDState, RejectionSamplingParams]):
    name = "rejection_sampling"
    Params = RejectionSamplingParams
    summary = (
        "prune n partial drafts every round by reward rank (SRD without editor) or an absolute threshold"
    )
    needs_reward = True

    def __init__(self, params: RejectionSamplingParams) -> None:
        super().__init__(params)
        #: the SRD configuration the loop runs with
        self.cfg: SRDParams = params.srd_params()
        self.variant = params.variant
        self.threshold = params.threshold
        router: Router
        if params.variant == "rank":
            router = RankRouter(self.cfg.theta_high, self.cfg.theta_low)
        else:
            assert params.threshold is not None  # validate() refuses variant=absolute without a threshold
            router = ThresholdRouter(params.threshold)
        self.loop = SRDLoop(self.cfg, router)

    def init_state(self, item_id: str, question: str, prompt_ids: Sequence[int]) -> SRDState:
        return self.loop.init_state(item_id, question, prompt_ids)

    def step(self, states: list[SRDState], ctx: StepContext) -> list[SRDState]:
        return self.loop.step(states, ctx)

    anytime = True

    def current_best(self, state: SRDState, ctx: StepContext) -> tuple[str, float | None]:
        return self.loop.current_best(state, ctx)

    def result(self, state: SRDState) -> dict[str, Any]:
        res = self.loop.result(state)
        res["variant"] = self.variant
        res["threshold"] = self.threshold if self.variant == "absolute" else self.cfg.theta_high
        for key in (
            "policy",
            "refine_outcomes",
            "refine_improved",
            "refine_exhausted",
            "reward_before_refine",
            "reward_after_refine",
        ):
            res.pop(key, None)
        return res
