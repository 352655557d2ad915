"""Speculative Rejection (Sun et al., NeurIPS 2024, arXiv 2410.20290) — ALGORITHMS.md §2.

Follows the reference code's semantics (§2.3, ``Zanette-Labs/SpeculativeRejection``
``speculative_rejection.py``) with the fixed-interval port of §2.4, as SRD's reimplementation ran it
(Δ = 100 tokens, α = 0.5 [PAPER SRD App. E]):

- start with ``n`` empty candidates; every round (= decision interval) extend every unfinished candidate
  of the pool by ``chunk_tokens`` (Δ) tokens in ONE engine batch, then score every extended candidate on
  its current (partial) text in ONE reward batch (finished candidates keep their final score);
- rank the whole pool — finished candidates included: they stay in it and consume slots, but are never
  drafted again — by that reward, descending (ties: lowest candidate id), and keep the top
  ``max(min_keep, round((1 - α)·|pool|))`` (Python's ``round``: banker's rounding, as the reference code);
- stop when no kept candidate is unfinished;
- ``min_keep`` (srdq's choice, not the reference code's): with the default 1 the best candidate always
  survives, so a pool that rounds to no survivor (|pool| = 1 at α ≥ 0.5: 4 → 2 → 1 → round(0.5) = 0)
  goes on drafting its best candidate to the end. ``min_keep=0`` is the reference code (§2.3): such a
  decision ends the search, and the answer is the highest reward among the finished survivors and that
  last round's scored candidates (one that finished in that round included), which may be unfinished (a
  partial response, ``finish_reason`` None);
- a candidate that finishes in a round is ranked with that round's pool and archived only if it survives
  the ranking (the reference code keeps only finished survivors): one rejected in the round it finishes
  can never be the answer;
- answer: the highest reward among every archived (finished and surviving) candidate — a finished
  survivor pushed out of the pool in a later round is not lost, as in ``postprocess/gather_best_ans.py``;
  ties → earliest finished round, then lowest candidate id. ``answer=weighted_majority`` (srdq's option
  [PROPOSED], as SRD's): the answer class (the task's equivalence) whose archived candidates' rewards sum
  highest, then the same tie rule inside it (``pool.choose_answer``); the classes are taken when the item
  is done (``classes``). The rule changes no draw or ranking.

Drafting, scoring and the answer rule are ``pool.py``'s; the survivor count ``keep_count`` lives in
``routing.py`` (re-exported here). Seeds come from ``ctx.seed(state, candidate_id, "draft")`` — the
same draws as Best-of-N, SRD and rejection sampling for the same candidate and round.

Left out: the memory-driven initial batch size and decision points (``get_memory_constrained_batch_size``,
``LLM.get_gen_len``) — replaced by the explicit ``n`` and a fixed Δ (§2.4; §10 item 9); the self-reward
mode; the relative-GPU-compute metric (§2.5) — the ledger records tokens, calls and time instead.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any, NotRequired, cast

from srd_worker.errors import ConfigError
from srd_worker.methods.base import Method, StepContext, new_state, param
from srd_worker.methods.pool import (
    ANSWER_HELP,
    ArchiveEntry,
    PoolParams,
    TrajectoryState,
    answer_now,
    archive_entry,
    check_answer_rule,
    choose_answer,
    draft_round,
    entry_classes,
    finished_entries,
    is_finished,
    new_trajectory,
    score_positions,
)
from srd_worker.methods.routing import keep_count, rank_order

__all__ = ["SpeculativeRejection", "SpeculativeRejectionParams", "keep_count"]


@dataclasses.dataclass(frozen=True)
class SpeculativeRejectionParams(PoolParams):
    n: int = param(10, "initial candidates (the reference code's memory-driven batch, here explicit)")
    alpha: float = param(0.5, "fraction of the ranked pool rejected at each decision point, 0 <= alpha < 1")
    min_keep: int = param(
        1,
        "survivors of a decision at least (1: the best candidate always drafts on to finish; 0: the reference "
        "code, where a decision that rounds round((1 - alpha)*pool) to 0 ends the search and the answer may "
        "be that round's best partial response)",
        in_id_at_default=False,
    )
    answer: str = param(
        "best",
        "final answer from the archived candidates: " + ANSWER_HELP + " [PROPOSED]",
        in_id_at_default=False,
    )

    def validate(self) -> None:
        super().validate()
        check_answer_rule(self.answer)
        if not 0 <= self.alpha < 1:
            raise ConfigError(f"alpha must be in [0, 1), got {self.alpha}")
        if self.min_keep not in (0, 1):
            raise ConfigError(
                f"min_keep must be 0 (the reference code) or 1 (srdq's default), got {self.min_keep}"
            )


class SpecRejState(TrajectoryState):
    """``candidates``: the current pool, in candidate-id order."""

    finished: list[ArchiveEntry]  # every finished survivor, in the order it finished (ties: id order)
    stopped: list[ArchiveEntry]  # min_keep=0: a decision that kept none: its candidates not archived yet
    pool_sizes: list[list[int]]  # [pool size, kept] per decision
    classes: NotRequired[list[int | None]]  # answer=weighted_majority: answer_pool's classes, once done


class SpeculativeRejection(Method[SpecRejState, SpeculativeRejectionParams]):
    name = "speculative_rejection"
    Params = SpeculativeRejectionParams
    summary = "draft in Δ-token intervals, drop the lowest-reward fraction alpha of the pool at each"
    needs_reward = True

    def init_state(self, item_id: str, question: str, prompt_ids: Sequence[int]) -> SpecRejState:
        return {
            **new_state(item_id, question, prompt_ids),
            "candidates": [new_trajectory(i) for i in range(self.params.n)],
            "finished": [],
            "stopped": [],
            "pool_sizes": [],
        }

    def step(self, states: list[SpecRejState], ctx: StepContext) -> list[SpecRejState]:
        p = self.params
        drafted = draft_round(states, ctx, p)
        jobs = [(state, cand, [len(cand["tokens"])]) for state, cand, _ in drafted]
        score_positions(ctx, jobs)
        for state in states:
            pool = state["candidates"]
            k = keep_count(p.alpha, len(pool), p.min_keep)
            # every candidate is scored: drafted ones just now, finished ones in the round they finished
            order = rank_order(cast("list[float]", [c["reward"] for c in pool]))
            state["candidates"] = sorted((pool[i] for i in order[:k]), key=lambda c: c["id"])
            if k == 0:  # min_keep=0: the search ends; this round's scored candidates join the answer's pool
                # (those that finished in an earlier round survived it and are archived already)
                state["stopped"] = [
                    {**archive_entry(c), "round": state["round"]}
                    for c in pool
                    if not is_finished(c) or c["finished_round"] == state["round"]
                ]
            for cand in state["candidates"]:  # finished survivors only, each once: the round it finished
                if is_finished(cand) and cand["finished_round"] == state["round"]:
                    state["finished"].append(archive_entry(cand))
            state["pool_sizes"].append([len(pool), k])
            state["round"] += 1
            state["done"] = all(is_finished(c) for c in state["candidates"])
            if state["done"] and p.answer == "weighted_majority":
                state["classes"] = entry_classes(ctx, answer_pool(state))
        return states

    anytime = True

    def current_best(self, state: SpecRejState, ctx: StepContext) -> tuple[str, float | None]:
        """The answer the item would give now (anytime curves), by the same rule as ``result``."""
        return answer_now(self.params.answer, ctx, answer_pool(state))

    def result(self, state: SpecRejState) -> dict[str, Any]:
        pool = answer_pool(state)
        best = choose_answer(self.params.answer, pool, state.get("classes"))
        return {
            "response": best["text"] if best else "",
            "reward": best["reward"] if best else None,
            "finish_reason": best["finish"] if best else None,
            "chosen": best["id"] if best else None,
            "rewards": [e["reward"] for e in state["finished"]],
            "finished_ids": [e["id"] for e in state["finished"]],
            "pool_sizes": state["pool_sizes"],
            "candidates": finished_entries(pool),
            "rounds": state["round"],
            "ledger_components": {k: dict(v) for k, v in state["ledger"]["components"].items()},
        }


def answer_pool(state: SpecRejState) -> list[ArchiveEntry]:
    """What the answer is chosen from: every finished survivor (the order they finished), then, with
    ``min_keep=0``, the candidates of the decision that kept none."""
    return [*state["finished"], *state.get("stopped", [])]  # "stopped" is absent from old checkpoints
