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
