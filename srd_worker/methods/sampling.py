"""Plain sampling: one candidate per problem, drafted in one round (or in chunks, ``chunk_tokens``); the
answer is that candidate.

The reference point of every comparison (a Best-of-N with n=1 gives the same text under the same seed).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any, ClassVar

from srd_worker.methods.base import Method, StepContext, new_state, param
from srd_worker.methods.pool import (
    WHOLE_BUDGET_HELP,
    DraftParams,
    PoolState,
    draft_round,
    is_finished,
    new_candidate,
    pool_entries,
)


@dataclasses.dataclass(frozen=True)
class SamplingParams(DraftParams):
    whole_budget_allowed: ClassVar[bool] = True
    chunk_tokens: int = param(0, WHOLE_BUDGET_HELP)


class Sampling(Method[PoolState, SamplingParams]):
    name = "sampling"
    Params = SamplingParams
    summary = "one sampled candidate per problem"

    def init_state(self, item_id: str, question: str, prompt_ids: Sequence[int]) -> PoolState:
        return {**new_state(item_id, question, prompt_ids), "candidates": [new_candidate()]}

    def step(self, states: list[PoolState], ctx: StepContext) -> list[PoolState]:
        draft_round(states, ctx, self.params)
        for state in states:
            state["round"] += 1
            state["done"] = all(is_finished(c) for c in state["candidates"])
        return states

    def result(self, state: PoolState) -> dict[str, Any]:
        cand = state["candidates"][0]
        return {
            "response": cand["text"],
            "reward": None,
            "finish_reason": cand["finish"],
            "chosen": 0,
            "candidates": pool_entries(state["candidates"]),
        }
