"""The Task contract: a benchmark's dataset adapter, prompt template, answer extraction and grader.

A task turns validated dataset rows into ``Item``s, builds the chat messages the policy model sees,
extracts the final answer from a response and grades it against the gold answer. ``grader_version`` names
the grading logic (recorded with every result, so ``srdq regrade`` can tell old grades from new ones);
a task with no gold answers (AlpacaEval) grades ``None``. Everything a task needs to build messages and
grade must be on the ``Item`` (``question``, ``gold``, ``meta``): workers rebuild items from the store.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from srd_worker.votes import answer_classes


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

    # Read-only members: a task may keep them as class attributes or compute them (GenericTask).
    @property
    def required_fields(self) -> tuple[str, ...]:
        """The dataset fields a row must have (non-empty) for this task."""
        ...

    @property
    def grader_version(self) -> str:
        """Names the grading logic and its dependencies' versions; recorded in every result record."""
        ...

    def load(self, path: str | Path) -> list[Item]:
        """Read and validate the whole file; raise ``DatasetError`` naming file/line/field on bad input."""
        ...

    def messages(self, item: Item) -> list[dict[str, str]]:
        """Chat messages for the policy model (system + user turns)."""
        ...

    def extract_answer(self, response: str) -> str | None:
        """The final answer in a response, or None if it has none."""
        ...

    def grade(self, response: str, item: Item) -> bool | None:
        """True if the response's final answer matches the item's gold answer; None if ungraded."""
        ...

    def metrics(self, response: str, item: Item) -> dict[str, float]:
        """Extra per-item scores beyond ``grade`` (HotpotQA: em, f1, precision, recall); often empty."""
        ...


@runtime_checkable
class SameAnswer(Protocol):
    """Optional task member: whether two extracted answers are the same answer (the task's grader
    applied to them, e.g. math-verify's ``0.5`` = ``\\frac12``). Votes (``votes.answer_classes``)
    use it; a task without it compares answers as whitespace-normalised strings."""

    def same_answer(self, answer: str, other: str) -> bool: ...


def same_answer_of(task: object) -> Callable[[str, str], bool] | None:
    """The task's ``same_answer`` (``SameAnswer``), or None for a task without one."""
    return task.same_answer if isinstance(task, SameAnswer) else None


def vote_candidates(task: object, candidates: list[dict[str, Any]]) -> None:
    """Set each candidate record's ``vote``: its answer's class among the record's candidates
    (``votes.answer_classes`` with ``same_answer_of(task)``), which majority votes over the
    candidates (``reports.kcurves``) count."""
    classes = answer_classes([c.get("answer") for c in candidates], same_answer_of(task))
    for cand, cls in zip(candidates, classes, strict=True):
        cand["vote"] = cls


def grade_response(task: Task, item: Item, response: str, record: dict[str, Any]) -> None:
    """Grade an item's response into its result ``record``: ``answer`` (``task.extract_answer``),
    ``correct`` (``task.grade``; None when ungraded) and ``metrics``, in that order. The one grading rule
    of a record, when a run writes it (``runner.build_record``) and when ``srdq regrade`` grades it again
    (``tasks.regrade``); an exception propagates (each caller records it as the item's error)."""
    record["answer"] = task.extract_answer(response)
    graded = task.grade(response, item)
    record["correct"] = None if graded is None else bool(graded)
    record["metrics"] = task.metrics(response, item)


def grade_candidate(task: Task, item: Item, text: str) -> tuple[str | None, bool | None]:
    """A candidate's extracted answer and grade (None when ungraded). A failure in either leaves that
    field None instead of failing the item: a candidate is evidence, the item's response is the result."""
    try:
        answer = task.extract_answer(text)
    except Exception:
        answer = None
    try:
        graded = task.grade(text, item)
    except Exception:
        graded = None
    return answer, None if graded is None else bool(graded)
