"""AlpacaEval (Li et al., 2023): the 805 open-ended instructions, sent raw; no gold answer, no grade.

Rows: ``instruction`` (required) plus, as in the ``tatsu-lab/alpaca_eval`` files, ``dataset``,
``datasplit``, ``generator``, ``output`` or baseline outputs. The id is ``id`` if present, else
``line-<N>``; ``dataset`` is kept in ``Item.meta``. The prompt is the instruction as the only user turn.
There is nothing to grade against: ``grade`` returns None, so a result's ``correct`` is None and the run is
scored by reward and response length only (as in the SRD paper's AlpacaEval table before the win-rate
judge). ``Item.gold`` is the empty string.

Left out: the GPT-4 / GPT-4o-mini win-rate judge and the baseline outputs (not kept on the items: the
judge runs outside srdq, on the results file).
"""

from __future__ import annotations

from typing import Any

from srd_worker.tasks.base import Item
from srd_worker.tasks.loading import Rows, RowTask
from srd_worker.tasks.prompts import raw_messages

#: No grader: recorded so results still say which (absent) grading they went through.
GRADER_VERSION: str = "ungraded-1"

META_FIELDS: tuple[str, ...] = ("dataset", "datasplit")


class AlpacaEvalTask(RowTask):
    """Open-ended instructions with no gold answer: ``grade`` returns None."""

    name: str = "alpaca_eval"
    required_fields: tuple[str, ...] = ("instruction",)
    grader_version: str = GRADER_VERSION

    def _item(self, rows: Rows, at: int, row: dict[str, Any]) -> Item:
        rows.require(at, row, self.required_fields)
        meta: dict[str, Any] = {rows.unit: at}
        meta.update({k: row[k] for k in META_FIELDS if k in row})
        return Item(id=rows.row_id(at, row, "id"), question=row["instruction"], gold="", meta=meta)

    def messages(self, item: Item) -> list[dict[str, str]]:
        return raw_messages(item.question)

    def extract_answer(self, response: str) -> str | None:
        return None

    def grade(self, response: str, item: Item) -> bool | None:
        return None

    def metrics(self, response: str, item: Item) -> dict[str, float]:
        return {}
