"""The Task contract: a benchmark's dataset adapter, prompt template, answer extraction and grader.

A task turns validated dataset rows into ``Item``s, builds the chat messages the policy model sees,
extracts the final answer from a response and grades it against the gold answer.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol, runtime_checkable


@dataclass(frozen=True)
class Item:
    """One evaluation problem. ``id`` is stable across runs (dataset id field or ``line-N``)."""

    id: str
    question: str
    gold: str
    meta: dict[str, Any] = field(default_factory=dict)


@runtime_checkable
class Task(Protocol):
    name: str
    #: The dataset fields a row must have (non-empty) for this task.
    required_fields: tuple[str, ...]

    def load(self, path: str | Path) -> list[Item]:
        """Read and validate the whole file; raise ``DatasetError`` naming file/line/field on bad input."""
        ...

    def messages(self, item: Item) -> list[dict[str, str]]:
        """Chat messages for the policy model (system + user turns)."""
        ...

    def extract_answer(self, response: str) -> str | None:
        """The final answer in a response, or None if it has none."""
        ...

    def grade(self, response: str, item: Item) -> bool:
        """True if the response's final answer matches the item's gold answer."""
        ...
