"""GSM8K (grade-school math word problems): dataset adapter, prompt and grader.

Follows the official ``openai/grade-school-math`` JSON Lines layout: ``question`` and ``answer``, where
``answer`` is a worked solution whose last ``#### <number>`` line holds the final answer. The gold answer is
the text after the last ``####`` with thousands commas removed ("1,000" -> "1000"). Responses are graded on
their last ``\\boxed{}``, or, if they have none, on their last number (the usual GSM8K fallback).

Left out: the calculator annotations (``<<48/2=24>>``) and the worked solution itself (not kept on the
item), few-shot prompting, and the train split (any file with this layout loads the same way).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from srd_worker.tasks.base import Item
from srd_worker.tasks.grading import (
    DEFAULT_TIMEOUT_S,
    GRADER_VERSION,
    extract_answer,
    math_equal,
    strip_number_commas,
)
from srd_worker.tasks.loading import DEFAULT_MAX_ROW_BYTES, Rows, read_rows
from srd_worker.tasks.prompts import math_messages


def gsm8k_gold(solution: str) -> str | None:
    """The final answer of a GSM8K worked solution (after the last ``####``, commas removed), or None."""
    if "####" not in solution:
        return None
    gold = strip_number_commas(solution.rsplit("####", 1)[1].strip())
    return gold or None


class GSM8KTask:
    """The GSM8K task. ``grade_timeout_s`` bounds each answer comparison (a timeout grades as wrong)."""

    name: str = "gsm8k"
    required_fields: tuple[str, ...] = ("question", "answer")
    grader_version: str = GRADER_VERSION

    def __init__(self, *, grade_timeout_s: float = DEFAULT_TIMEOUT_S,
                 max_row_bytes: int = DEFAULT_MAX_ROW_BYTES) -> None:
        self.grade_timeout_s = grade_timeout_s
        self.max_row_bytes = max_row_bytes

    def load(self, path: str | Path) -> list[Item]:
        return read_rows(path, max_row_bytes=self.max_row_bytes).items(self._item)

    def _item(self, rows: Rows, line: int, row: dict[str, Any]) -> Item:
        rows.require(line, row, self.required_fields)
        gold = gsm8k_gold(row["answer"])
        if gold is None:
            raise rows.error("has no final '#### <answer>' line", line, "answer")
        return Item(id=rows.row_id(line, row, "id"), question=row["question"], gold=gold, meta={rows.unit: line})

    def messages(self, item: Item) -> list[dict[str, str]]:
        return math_messages(item.question)

    def extract_answer(self, response: str) -> str | None:
        answer = extract_answer(response, fallback_last_number=True)
        return None if answer is None else strip_number_commas(answer)

    def grade(self, response: str, item: Item) -> bool:
        pred = self.extract_answer(response)
        if pred is None:
            return False
        return math_equal(pred, item.gold, timeout_s=self.grade_timeout_s)

    def metrics(self, response: str, item: Item) -> dict[str, float]:
        return {}
