"""Self-consistency (Wang et al., 2023): draft n candidates and answer by majority vote over their
extracted final answers. No reward model.

Votes compare the extracted answer strings after whitespace normalisation (equivalent forms such as
``0.5`` and ``\\frac12`` count as different answers: left out for now). Ties go to the answer seen first
in candidate order; candidates without an answer do not vote; if none has one, candidate 0 answers.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any, ClassVar

from srd_worker.methods.base import Method, StepContext, new_state, param
from srd_worker.methods.pool import (
    WHOLE_BUDGET_HELP,
    PoolParams,
    PoolState,
    draft_round,
    is_finished,
    new_candidate,
    pool_entries,
)


@dataclasses.dataclass(frozen=True)
class SelfConsistencyParams(PoolParams):
    whole_budget_allowed: ClassVar[bool] = True
    n: int = param(5, "number of candidates that vote")
    chunk_tokens: int = param(0, WHOLE_BUDGET_HELP)


def majority(answers: Sequence[str | None]) -> int | None:
    """Index of the first candidate holding the most common answer (None if nobody answered)."""
    counts: dict[str, int] = {}
    first: dict[str, int] = {}
    for i, a in enumerate(answers):
        if a is None:
            continue
        key = " ".join(a.split())
        counts[key] = counts.get(key, 0) + 1
        first.setdefault(key, i)
    if not counts:
        return None
    best = max(counts, key=lambda k: (counts[k], -first[k]))
    return first[best]


class VoteState(PoolState, total=False):
    answers: list[str | None]  # extracted final answers, set once every candidate has finished


class SelfConsistency(Method[VoteState, SelfConsistencyParams]):
    name = "self_consistency"
    Params = SelfConsistencyParams
    summary = "draft n candidates, answer by majority vote over their final answers"

    def init_state(self, item_id: str, question: str, prompt_ids: Sequence[int]) -> VoteState:
        return {
            **new_state(item_id, question, prompt_ids),
            "candidates": [new_candidate() for _ in range(self.params.n)],
        }

    def step(self, states: list[VoteState], ctx: StepContext) -> list[VoteState]:
        draft_round(states, ctx, self.params)
        for s in states:
            s["round"] += 1
            if all(is_finished(c) for c in s["candidates"]):
                s["answers"] = [ctx.extract_answer(c["text"]) for c in s["candidates"]]
                s["done"] = True
        return states

    def result(self, state: VoteState) -> dict[str, Any]:
        answers = state["answers"]
        chosen = majority(answers)
        chosen = 0 if chosen is None else chosen
        cand = state["candidates"][chosen]
        votes = sum(
            1
            for a in answers
            if a is not None and " ".join(a.split()) == " ".join((answers[chosen] or "").split())
        )
        return {
            "response": cand["text"],
            "reward": None,
            "finish_reason": cand["finish"],
            "chosen": chosen,
            "votes": votes if answers[chosen] is not None else 0,
            "answers": answers,
            "candidates": pool_entries(state["candidates"]),
        }
