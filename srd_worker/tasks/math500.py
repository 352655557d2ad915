"""MATH-500 (the "Let's Verify Step by Step" MATH test subset): dataset adapter, prompt and grader.

Follows the ``openai/prm800k`` ``math_splits/test.jsonl`` layout: ``problem``, ``answer`` (the final answer
as LaTeX; a JSON or Parquet number is read as its text, as AIME-style sets store ``204``), plus
``solution``, ``subject``, ``level`` and ``unique_id``. The item id is ``unique_id`` (else
``line-<N>``); ``subject`` and ``level`` are kept in ``Item.meta``. A gold written as ``\\boxed{x}`` is
reduced to ``x``; an empty or unclosed box is refused (no response could match it). Responses are graded
on their last ``\\boxed{}`` only (no last-number fallback) with math-verify.

Left out: the worked ``solution`` (not kept on the item), the full 5,000-problem MATH test set's extra
answer normalisation rules, and few-shot prompting.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from srd_worker.tasks.base import Item
from srd_worker.tasks.generic import gold_answer
from srd_worker.tasks.grading import (
    DEFAULT_TIMEOUT_S,
    GRADER_VERSION,
    extract_answer,
    math_equal,
    same_answer,
)
from srd_worker.tasks.loading import DEFAULT_MAX_ROW_BYTES, Rows, read_rows
from srd_worker.tasks.prompts import math_messages

#: Optional fields copied into ``Item.meta`` when present.
META_FIELDS: tuple[str, ...] = ("subject", "level")


class Math500Task:
    """The MATH-500 task. ``grade_timeout_s`` bounds each answer comparison (a timeout grades as wrong)."""

    name: str = "math500"
    required_fields: tuple[str, ...] = ("problem", "answer")
    grader_version: str = GRADER_VERSION

    def __init__(
        self, *, grade_timeout_s: float = DEFAULT_TIMEOUT_S, max_row_bytes: int = DEFAULT_MAX_ROW_BYTES
    ) -> None:
        self.grade_timeout_s = grade_timeout_s
        self.max_row_bytes = max_row_bytes

    def load(self, path: str | Path) -> list[Item]:
        return read_rows(path, max_row_bytes=self.max_row_bytes).items(self._item)

    def _item(self, rows: Rows, line: int, row: dict[str, Any]) -> Item:
        rows.require(line, row, ("problem",))
        # a number too: many math sets store 204, not "204"
        gold = rows.text(line, row, "answer", numbers=True)
        meta: dict[str, Any] = {rows.unit: line}
        meta.update({k: row[k] for k in META_FIELDS if k in row})
        if "\\boxed" in gold or "\\fbox" in gold:
            gold = gold_answer(gold)
            if not gold:
                raise rows.error("has an empty or unclosed \\boxed{} answer", line, "answer")
        return Item(
            id=rows.row_id(line, row, "unique_id"),
            question=row["problem"],
            gold=gold,
            meta=meta,
        )

    def messages(self, item: Item) -> list[dict[str, str]]:
        return math_messages(item.question)

    def extract_answer(self, response: str) -> str | None:
        return extract_answer(response, fallback_last_number=False)

    def grade(self, response: str, item: Item) -> bool:
        pred = self.extract_answer(response)
        if pred is None:
            return False
        return math_equal(pred, item.gold, timeout_s=self.grade_timeout_s)

    def same_answer(self, answer: str, other: str) -> bool:
        """Votes: ``grading.same_answer`` (plain numbers by value, else math-verify as ``grade``)."""
        return same_answer(answer, other, timeout_s=self.grade_timeout_s)

    def metrics(self, response: str, item: Item) -> dict[str, float]:
        return {}
