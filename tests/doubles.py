"""Test doubles shared by the unit tests: a deterministic reward and an in-memory shard store.

Neither stands in for a model: the engines in these tests are real (the tiny random Llama).
"""

from __future__ import annotations

import hashlib
import json
from typing import Any


class HashReward:
    """Deterministic pseudo-random reward in [0, 1) per response text, so that SRD's reward drops, routing
    tiers and edits occur without a trained reward model."""

    name = "hash"

    def score(self, prompts, responses):
        return [
            int.from_bytes(hashlib.blake2b(r.encode(), digest_size=4).digest(), "big") / 2**32
            for r in responses
        ]


class MemoryStore:
    """The runner's ShardStore (``runner.ShardStore``) in memory; checkpoints go through JSON text as they
    do in the SQL stores. ``results`` holds the last records saved."""

    def __init__(self) -> None:
        self.checkpoints: dict[str, tuple[int, str]] = {}
        self.results: list[dict[str, Any]] | None = None

    def load_checkpoints(self):
        return {k: (r, json.loads(v)) for k, (r, v) in self.checkpoints.items()}

    def save_checkpoints(self, round_, states) -> None:
        self.checkpoints.update({k: (round_, json.dumps(v)) for k, v in states.items()})

    def save_results(self, records) -> int:
        self.results = records
        return len(records)


class Crash(BaseException):
    """Stands in for the process dying mid-round (not an ``Exception``: nothing may catch it)."""


class CrashingEngine:
    """The real engine; its ``crash_on``-th generate call runs and then dies before returning (never when
    ``crash_on`` is None). Subclasses change what a call records through ``_generate``."""

    def __init__(self, inner, crash_on: int | None = None) -> None:
        self.inner, self.crash_on, self.calls = inner, crash_on, 0
        self.name, self.capabilities = inner.name, inner.capabilities
        self.tokenizer, self.max_context = inner.tokenizer, inner.max_context

    def _generate(self, requests):
        return self.inner.generate(requests)

    def generate(self, requests):
        self.calls += 1
        out = self._generate(requests)
        if self.calls == self.crash_on:
            raise Crash
        return out

    def logprobs(self, pairs):
        return self.inner.logprobs(pairs)

    def close(self) -> None:
        pass


def run_to_done(method, states, ctx, max_steps: int = 100) -> None:
    """Step ``method`` over the states not yet done until every one is done; fails after ``max_steps``."""
    for _ in range(max_steps):
        active = [s for s in states if not method.done(s)]
        if not active:
            return
        method.step(active, ctx)
    assert all(method.done(s) for s in states), f"not done after {max_steps} steps"


def run_items(items, method, engine, reward, store, *, seed, positions=None, max_rows=0):
    """``run_shard`` over ``items`` (GSM8K's grading) with the given method, engine, reward and store."""
    from srd_worker.runner import run_shard
    from srd_worker.tasks.gsm8k import GSM8KTask

    return run_shard(
        items=items,
        positions=list(range(len(items))) if positions is None else positions,
        method=method,
        task=GSM8KTask(),
        engine=engine,
        reward=reward,
        run_seed=seed,
        store=store,
        max_rows=max_rows,
    )
