"""GSM8K (grade-school math word problems): dataset adapter, prompt and grader.

Follows the official ``openai/grade-school-math`` JSON Lines layout: ``question`` and ``answer``, where
``answer`` is a worked solution whose last ``#### <number>`` line holds the final answer. The gold answer is
the text after the last ``####`` with thousands commas removed ("1,000" -> "1000"). Responses are graded on
their last ``\\boxed{}``, or, if they have none, on their last number (the usual GSM8K fallback).

Left out: the calculator annotations (``<<48/2=24>>``) and the worked solution itself (not kept on the
item), few-shot prompting, and the train split (any file with this layout loads the same way).
"""

from __future__ import annotations

from typing import Any

from srd_worker.tasks.base import Item
from srd_worker.tasks.grading import extract_answer, strip_number_commas
from srd_worker.tasks.loading import Rows
from srd_worker.tasks.math500 import Math500Task


def gsm8k_gold(solution: str) -> str | None:
    """The final answer of a GSM8K worked solution (after the last ``####``, commas removed), or None."""
    if "####" not in solution:
        return None
    gold = strip_number_commas(solution.rsplit("####", 1)[1].strip())
    return gold or None


class GSM8KTask(Math500Task):
    """The GSM8K task: the MATH-500 prompt, extraction and math-verify grading, with GSM8K's gold format
    (``#### n``) and a last-number fallback when the response has no ``\\boxed{}`` answer."""

    name: str = "gsm8k"
    required_fields: tuple[str, ...] = ("question", "answer")

    def _item(self, rows: Rows, line: int, row: dict[str, Any]) -> Item:
        rows.require(line, row, self.required_fields)
        gold = gsm8k_gold(row["answer"])
        if gold is None:
            raise rows.error("has no final '#### <answer>' line", line, "answer")
        return Item(
            id=rows.row_id(line, row, "id"), question=row["question"], gold=gold, meta={rows.unit: line}
        )

    def extract_answer(self, response: str) -> str | None:
        answer = extract_answer(response, fallback_last_number=True)
        return None if answer is None else strip_number_commas(answer)
