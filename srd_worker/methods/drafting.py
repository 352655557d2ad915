"""Chunked drafting of a pool of candidates, shared by the sampling-based methods.

Each round drafts at most ``chunk_tokens`` more tokens for every unfinished candidate of every item in
ONE engine batch, continuing from token ids (prompt + kept prefix), never from re-tokenised text.
The paper setting for every method is temperature 0.8, top-p 0.9, top-k 50 (ALGORITHMS.md §1.3).
"""

from __future__ import annotations

import dataclasses
from typing import Any

from srd_worker.engines.base import SamplingParams
from srd_worker.errors import ConfigError
from srd_worker.methods.base import GenCall, MethodParams, StepContext, param


@dataclasses.dataclass(frozen=True)
class DraftParams(MethodParams):
    temperature: float = param(0.8, "drafter sampling temperature (0 = greedy)")
    top_p: float = param(0.9, "drafter nucleus (top-p) mass")
    top_k: int = param(50, "drafter top-k (0 = off)")
    max_new_tokens: int = param(
        500, "maximum generated tokens per candidate (paper: 500 MATH500/HotpotQA, 1000 GPQA/AlpacaEval)"
    )
    chunk_tokens: int = param(100, "tokens drafted per round (the drafting interval; a checkpoint per round)")

    def validate(self) -> None:
        if self.temperature < 0:
            raise ConfigError(f"temperature must be >= 0, got {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise ConfigError(f"top_p must be in (0, 1], got {self.top_p}")
        if self.max_new_tokens < 1:
            raise ConfigError(f"max_new_tokens must be >= 1, got {self.max_new_tokens}")
        if self.chunk_tokens < 1:
            raise ConfigError(f"chunk_tokens must be >= 1, got {self.chunk_tokens}")


@dataclasses.dataclass(frozen=True)
class PoolParams(DraftParams):
    """Drafting parameters plus the pool size n (methods redeclare n to set their own default/help)."""

    n: int = param(4, "number of candidates drafted per problem")

    def validate(self) -> None:
        super().validate()
        if self.n < 1:
            raise ConfigError(f"n must be >= 1, got {self.n}")


def new_candidate() -> dict[str, Any]:
    return {"tokens": [], "text": "", "finish": None, "reward": None}


def is_finished(cand: dict[str, Any]) -> bool:
    return cand["finish"] is not None


def draft_round(
    states: list[dict[str, Any]], ctx: StepContext, p: DraftParams, *, kind: str = "draft"
) -> None:
    """Extend every unfinished candidate of every state by one chunk (one engine batch)."""
    calls: list[GenCall] = []
    targets: list[tuple[dict[str, Any], int]] = []
    for state in states:
        for ci, cand in enumerate(state["candidates"]):
            if is_finished(cand):
                continue
            budget = min(p.chunk_tokens, p.max_new_tokens - len(cand["tokens"]))
            sp = SamplingParams(
                temperature=p.temperature,
                top_p=p.top_p,
                top_k=p.top_k,
                max_new_tokens=budget,
                seed=ctx.seed(state, ci, kind),
            )
            calls.append(GenCall(state, state["prompt_ids"] + cand["tokens"], sp, "drafter"))
            targets.append((cand, budget))
    for (cand, budget), gen in zip(targets, ctx.generate(calls), strict=True):
        cand["tokens"].extend(gen.token_ids)
        cand["text"] = ctx.decode(cand["tokens"])
        if gen.finished:
            cand["finish"] = gen.finish_reason
        elif len(cand["tokens"]) >= p.max_new_tokens:
            cand["finish"] = "length"
        elif len(gen.token_ids) < budget:
            # the engine stopped short of the budget: the context window is full
            cand["finish"] = "length"
