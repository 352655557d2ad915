"""Best-of-N: draft n candidates, score each finished response with the reward model, answer with the
highest-scoring one (ties go to the lowest candidate index).

``answer=weighted_majority`` is weighted Best-of-N (search-and-learn's, as beam search and DVTS answer):
the answer class (``votes.answer_classes`` with the task's equivalence) whose candidates' rewards sum
highest, answered by its highest-scored candidate (ties: the lower index). Its weights are raw rewards,
meant for rewards that are never negative (a judge's or PRM's probabilities, ``logprob``); an item whose
candidates have a negative reward fails with an error naming the rule (use ``answer=best``).

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
    ANSWER_HELP,
    WHOLE_BUDGET_HELP,
    PoolParams,
    PoolState,
    check_answer_rule,
    draft_round,
    is_finished,
    new_candidate,
    pool_entries,
    score_responses,
    weighted_winner,
)
from srd_worker.methods.routing import rank_order


@dataclasses.dataclass(frozen=True)
class BestOfNParams(PoolParams):
    whole_budget_allowed: ClassVar[bool] = True
    chunk_tokens: int = param(0, WHOLE_BUDGET_HELP)
    answer: str = param("best", "final answer: " + ANSWER_HELP, in_id_at_default=False)

    def validate(self) -> None:
        super().validate()
        check_answer_rule(self.answer)


def argmax_first(values: Sequence[float]) -> int:
    """Index of the largest value; the first one on ties; a NaN never wins over a number (it ranks last,
    as everywhere else: ``routing.rank_order``)."""
    return rank_order(values)[0]


class BestOfNState(PoolState, total=False):
    classes: list[int | None]  # the candidates' answer classes (answer=weighted_majority), set when done


def weighted_choice(classes: Sequence[int | None], rewards: Sequence[float], *, fallback: int) -> int:
    """The highest-rewarded candidate of the answer class with the largest reward sum (NaN adds nothing;
    ties: the class seen first, then the lower index); ``fallback`` when no candidate has an answer.
    ``ValueError`` for a negative reward (``pool.weighted_winner``)."""
    first = weighted_winner(classes, rewards)
    if first is None:
        return fallback
    members = [i for i, c in enumerate(classes) if c == classes[first]]
    return members[argmax_first([rewards[i] for i in members])]


class BestOfN(Method[BestOfNState, BestOfNParams]):
    name = "best_of_n"
    Params = BestOfNParams
    summary = "draft n candidates, keep the one the reward model scores highest"
    needs_reward = True

    def init_state(self, item_id: str, question: str, prompt_ids: Sequence[int]) -> BestOfNState:
        return {
            **new_state(item_id, question, prompt_ids),
            "candidates": [new_candidate() for _ in range(self.params.n)],
        }

    def step(self, states: list[BestOfNState], ctx: StepContext) -> list[BestOfNState]:
        draft_round(states, ctx, self.params)
        ready = [s for s in states if all(is_finished(c) for c in s["candidates"])]
        score_responses(ctx, [(s, c) for s in ready for c in s["candidates"]])
        for s in ready:
            if self.params.answer == "weighted_majority":
                s["classes"] = ctx.answer_classes([ctx.extract_answer(c["text"]) for c in s["candidates"]])
            s["done"] = True
        for s in states:
            s["round"] += 1
        return states

    def result(self, state: BestOfNState) -> dict[str, Any]:
        rewards = cast("list[float]", [c["reward"] for c in state["candidates"]])  # all scored (step)
        best = argmax_first(rewards)
        if self.params.answer == "weighted_majority":
            best = weighted_choice(state["classes"], rewards, fallback=best)
        cand = state["candidates"][best]
        return {
            "response": cand["text"],
            "reward": cand["reward"],
            "finish_reason": cand["finish"],
            "chosen": best,
            "rewards": rewards,
            "candidates": pool_entries(state["candidates"]),
        }
