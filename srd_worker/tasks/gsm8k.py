"""GSM8K (grade-school math word problems): dataset adapter, prompt and grader.

Follows the official ``openai/grade-school-math`` JSON Lines layout: ``question`` and ``answer``, where
``answer`` is a worked solution whose last ``#### <number>`` line holds the final answer. The gold answer is
the text after the last ``####`` with thousands commas removed ("1,000" -> "1000"); a row whose gold is not
a number (sign, decimals or a fraction allowed) is refused, naming it. Responses are graded on
their last ``\\boxed{}``, or, if they have none, on their last number (the usual GSM8K fallback; a
fraction such as ``3/4`` is read whole).

Left out: the calculator annotations (``<<48/2=24>>``) and the worked solution itself (not kept on the
item), few-shot prompting, and the train split (any file with this layout loads the same way).
"""

from __future__ import annotations

import re
from typing import Any

from srd_worker.tasks.base import Item
from srd_worker.tasks.grading import extract_answer, strip_number_commas
from srd_worker.tasks.loading import Rows
from srd_worker.tasks.math500 import Math500Task

#: What a GSM8K final answer may be once its thousands commas are removed: a number (sign, decimals, a
#: fraction). The official test set's 1,319 answers are all integers.
GOLD_NUMBER = re.compile(r"[-+]?(?:\d+(?:\.\d*)?|\.\d+)(?:/\d+)?")


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
        if not GOLD_NUMBER.fullmatch(gold):
            # graded against a response's number, a gold that is not one could never be matched
            shown = gold if len(gold) <= 40 else gold[:40] + "..."
            raise rows.error(
                f"its final answer after '####' is {shown!r}, not a number (GSM8K answers are numbers; "
                "for other answers use --task generic or a task file)",
                line,
                "answer",
            )
        return Item(
            id=rows.row_id(line, row, "id"), question=row["question"], gold=gold, meta={rows.unit: line}
        )

    def extract_answer(self, response: str) -> str | None:
        answer = extract_answer(response, fallback_last_number=True)
        return None if answer is None else strip_number_commas(answer)
