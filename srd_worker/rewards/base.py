"""The RewardModel contract (DESIGN.md, Contracts; ALGORITHMS.md §0.2).

``score(prompts, responses)`` returns one float per (question, partial-or-full response) pair, in input
order. ``prompts`` are the task's question text (what a user asked, with context where the task has
some), NOT the chat-templated policy prompt; responses are decoded text, possibly cut mid-sentence:
rewards on partial responses are first-class (SRD and Speculative Rejection score prefixes).
Raw scales differ between reward models; never compare raw rewards across models.

A reward may also accept ``finished=[bool, ...]``: True where the response is complete (ended with EOS
or a stop string), so the end of the text can be judged as final (a PRM's last step, an arithmetic claim
at the very end). Methods pass it to rewards whose ``score`` takes that keyword; others never see it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol, runtime_checkable


@runtime_checkable
class RewardModel(Protocol):
    name: str

    def score(self, prompts: Sequence[str], responses: Sequence[str]) -> list[float]: ...


def accepts_finished(reward: object) -> bool:
    """True if ``reward.score`` takes the optional ``finished`` keyword."""
    import inspect

    try:
        params = inspect.signature(reward.score).parameters  # type: ignore[attr-defined]
    except (TypeError, ValueError):
        return False
    return "finished" in params or any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())
