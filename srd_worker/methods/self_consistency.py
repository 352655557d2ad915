"""Self-consistency (Wang et al., 2023): draft n candidates and answer by majority vote over their
extracted final answers. No reward model.

Votes count answer classes (``votes.answer_classes`` with the task's equivalence, ``ctx.answer_classes``):
for the math tasks, math-verify's, so ``0.5`` and ``\\frac12`` vote together; a task without one compares
whitespace-normalised strings. Ties go to the class seen first in candidate order, and the class's first
candidate answers; candidates without an answer do not vote; if none has one, candidate 0 answers.
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
from srd_worker.votes import majority as vote
from srd_worker.votes import whitespace_classes


@dataclasses.dataclass(frozen=True)
class SelfConsistencyParams(PoolParams):
    whole_budget_allowed: ClassVar[bool] = True
    n: int = param(5, "number of candidates that vote")
    chunk_tokens: int = param(0, WHOLE_BUDGET_HELP)


def majority(answers: Sequence[str | None]) -> int | None:
    """Index of the first candidate holding the most common answer, answers compared as
    whitespace-normalised strings (None if nobody answered); ``votes.majority`` over given classes."""
    return vote(whitespace_classes(answers))


class VoteState(PoolState, total=False):
    answers: list[str | None]  # extracted final answers, set once every candidate has finished
    classes: list[int | None]  # their vote classes (ctx.answer_classes), set with them


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
                s["classes"] = ctx.answer_classes(s["answers"])
                s["done"] = True
        return states

    def result(self, state: VoteState) -> dict[str, Any]:
        answers = state["answers"]
        # a checkpoint written before classes were kept votes on strings, as it did then
        classes = state.get("classes") or whitespace_classes(answers)
        chosen = vote(classes)
        chosen = 0 if chosen is None else chosen
        cand = state["candidates"][chosen]
        votes = sum(1 for c in classes if c is not None and c == classes[chosen])
        return {
            "response": cand["text"],
            "reward": None,
            "finish_reason": cand["finish"],
            "chosen": chosen,
            "votes": votes,
            "answers": answers,
            "candidates": pool_entries(state["candidates"]),
        }
