"""Best-of-N: draft n candidates, score each finished response with the reward model, answer with the
highest-scoring one (ties go to the lowest candidate index).

Follows the baseline as used by SRD and Speculative Rejection (ALGORITHMS.md §0.2, §0.5): the reward
sees the question and the decoded response. Candidates are scored once, when every candidate of the
item has finished, in one reward batch over all items finishing in that round.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any, ClassVar, cast

from srd_worker.methods.base import Method, StepContext, new_state, param
from srd_worker.methods.pool import (
    WHOLE_BUDGET_HELP,
    PoolParams,
    PoolState,
    draft_round,
    is_finished,
    new_candidate,
    pool_entries,
    score_responses,
)
from srd_worker.methods.routing import rank_order


@dataclasses.dataclass(frozen=True)
class BestOfNParams(PoolParams):
    whole_budget_allowed: ClassVar[bool] = True
    chunk_tokens: int = param(0, WHOLE_BUDGET_HELP)


def argmax_first(values: Sequence[float]) -> int:
    """Index of the largest value; the first one on ties; a NaN never wins over a number (it ranks last,
    as everywhere else: ``routing.rank_order``)."""
    return rank_order(values)[0]


class BestOfN(Method[PoolState, BestOfNParams]):
    name = "best_of_n"
    Params = BestOfNParams
    summary = "draft n candidates, keep the one the reward model scores highest"
    needs_reward = True

    def init_state(self, item_id: str, question: str, prompt_ids: Sequence[int]) -> PoolState:
        return {
            **new_state(item_id, question, prompt_ids),
            "candidates": [new_candidate() for _ in range(self.params.n)],
        }

    def step(self, states: list[PoolState], ctx: StepContext) -> list[PoolState]:
        draft_round(states, ctx, self.params)
        ready = [s for s in states if all(is_finished(c) for c in s["candidates"])]
        score_responses(ctx, [(s, c) for s in ready for c in s["candidates"]])
        for s in ready:
            s["done"] = True
        for s in states:
            s["round"] += 1
        return states

    def result(self, state: PoolState) -> dict[str, Any]:
        rewards = [c["reward"] for c in state["candidates"]]
        best = argmax_first(cast("list[float]", rewards))  # a done item's candidates are all scored (step)
        cand = state["candidates"][best]
        return {
            "response": cand["text"],
            "reward": cand["reward"],
            "finish_reason": cand["finish"],
            "chosen": best,
            "rewards": rewards,
            "candidates": pool_entries(state["candidates"]),
        }
