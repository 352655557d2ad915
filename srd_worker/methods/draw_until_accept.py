"""Absolute reward-threshold rejection sampling — ALGORITHMS.md §3.2(b) (``RS_ABS``, a PROPOSED generic
baseline): draw full samples in batches until enough of them score at or above a reward threshold, or
the sample budget is spent.

- Every round drafts the item's current batch (``batch`` candidates; ``chunk_tokens`` 0 = the whole
  ``max_new_tokens`` budget in one engine call, as Best-of-N), then scores each finished response once,
  in one reward batch over every item.
- When a batch has finished and is scored: the item is done if ``accept`` samples so far score ≥
  ``threshold``, or if ``budget`` samples have been drawn; otherwise the next batch is drawn (at most what
  the budget has left).
- Answer: the highest reward among the accepted samples, else (no sample accepted: reported as
  ``accepted`` 0) among every sample drawn; ties → the earliest drawn.
- Reported: ``drawn`` (samples drawn), ``accepted``, ``samples_to_first_accept`` (1-based, in draw order;
  None when nothing was accepted) and every candidate.

Seeds: candidate ``i`` is drawn with ``ctx.seed(state, i, "draft")`` in the round its batch starts, so with
``chunk_tokens`` 0 the first batch is Best-of-N's first ``batch`` candidates draw for draw. Raw reward
scales differ between rewards (§0.2): calibrate ``threshold`` per reward, e.g. as a quantile of its scores
on held-out samples. Unlike ``rejection_sampling --set variant=absolute`` (a fixed pool of n partial drafts
pruned every Δ tokens), nothing is scored before it has finished and nothing is pruned.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from typing import Any, ClassVar

from srd_worker.errors import ConfigError
from srd_worker.methods.base import Method, StepContext, new_state, param
from srd_worker.methods.pool import (
    WHOLE_BUDGET_HELP,
    DraftParams,
    PoolState,
    draft_round,
    is_finished,
    new_candidate,
    pool_entries,
    score_responses,
    scores,
)
from srd_worker.methods.routing import rank_order


@dataclasses.dataclass(frozen=True)
class DrawUntilAcceptParams(DraftParams):
    whole_budget_allowed: ClassVar[bool] = True
    chunk_tokens: int = param(0, WHOLE_BUDGET_HELP)
    threshold: float | None = param(
        None, "reward threshold r*: a sample is accepted iff its reward >= r* (required; reward-specific)"
    )
    budget: int = param(16, "B: samples drawn at most per problem")
    batch: int = param(4, "samples drawn per batch (one engine call when chunk_tokens = 0)")
    accept: int = param(1, "accepted samples wanted before stopping (the specification's k)")

    def validate(self) -> None:
        super().validate()
        if self.threshold is None:
            raise ConfigError("draw_until_accept needs a reward threshold: --set threshold=R")
        if not math.isfinite(self.threshold):
            raise ConfigError(f"threshold must be a finite number, got {self.threshold}")
        if self.budget < 1 or self.batch < 1 or self.accept < 1:
            raise ConfigError(
                f"budget, batch and accept must be >= 1, got {self.budget}, {self.batch}, {self.accept}"
            )
        if self.batch > self.budget:
            raise ConfigError(f"batch ({self.batch}) must not exceed budget ({self.budget})")


class DrawUntilAccept(Method[PoolState, DrawUntilAcceptParams]):
    name = "draw_until_accept"
    Params = DrawUntilAcceptParams
    summary = (
        "absolute-threshold rejection sampling (§3.2b): draw batches of full samples until `accept` of "
        "them score >= threshold or the budget B is spent"
    )
    needs_reward = True

    def init_state(self, item_id: str, question: str, prompt_ids: Sequence[int]) -> PoolState:
        return {
            **new_state(item_id, question, prompt_ids),
            "candidates": [new_candidate() for _ in range(self.params.batch)],
        }

    def _accepted(self, state: PoolState) -> list[int]:
        """Indices, in draw order, of the scored samples at or above the threshold (NaN never is)."""
        r_star = self.params.threshold
        assert r_star is not None  # validate() refuses a missing threshold
        return [
            i for i, c in enumerate(state["candidates"]) if c["reward"] is not None and c["reward"] >= r_star
        ]

    def step(self, states: list[PoolState], ctx: StepContext) -> list[PoolState]:
        p = self.params
        draft_round(states, ctx, p)
        fresh = [(s, c) for s in states for c in s["candidates"] if is_finished(c) and c["reward"] is None]
        score_responses(ctx, fresh)
        for s in states:
            if all(is_finished(c) for c in s["candidates"]):  # the batch is drawn and scored
                drawn = len(s["candidates"])
                if len(self._accepted(s)) >= p.accept or drawn >= p.budget:
                    s["done"] = True
                else:
                    s["candidates"] += [new_candidate() for _ in range(min(p.batch, p.budget - drawn))]
            s["round"] += 1
        return states

    def result(self, state: PoolState) -> dict[str, Any]:
        cands = state["candidates"]
        accepted = self._accepted(state)  # samples are only appended and scored once: draw order is stable
        pool = accepted or [i for i, c in enumerate(cands) if c["reward"] is not None]
        # highest reward; the earliest drawn on ties, NaN last (rank_order's stable sort)
        chosen = pool[rank_order(scores([cands[i] for i in pool]))[0]] if pool else None
        cand = cands[chosen] if chosen is not None else None
        return {
            "response": cand["text"] if cand else "",
            "reward": cand["reward"] if cand else None,
            "finish_reason": cand["finish"] if cand else None,
            "chosen": chosen,
            "rewards": [c["reward"] for c in cands],
            "drawn": len(cands),
            "accepted": len(accepted),
            "samples_to_first_accept": accepted[0] + 1 if accepted else None,
            "threshold": self.params.threshold,
            "candidates": pool_entries(cands),
        }
