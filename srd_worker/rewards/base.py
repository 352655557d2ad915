"""The RewardModel contract (DESIGN.md, Contracts; ALGORITHMS.md §0.2).

``score(prompts, responses)`` returns one float per (question, partial-or-full response) pair, in input
order. ``prompts`` are the task's question text (what a user asked, with context where the task has
some), NOT the chat-templated policy prompt; responses are decoded text, possibly cut mid-sentence:
rewards on partial responses are first-class (SRD and Speculative Rejection score prefixes).
Raw scales differ between reward models; never compare raw rewards across models.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol, runtime_checkable


@runtime_checkable
class RewardModel(Protocol):
    name: str

    def score(self, prompts: Sequence[str], responses: Sequence[str]) -> list[float]: ...
