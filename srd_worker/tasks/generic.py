"""A task for any JSONL, JSON-array, CSV or Parquet file, given which columns hold the prompt, answer and id.

The mapping comes from ``--field KEY=COLUMN`` (repeatable): ``prompt`` (required; default column
``prompt``), ``answer`` (optional) and ``id`` (optional; else ``line-<N>``, ``row-<N>`` for Parquet). With
an answer column, the prompt gets the boxed-answer instruction and responses are graded like MATH: the
last ``\\boxed{}`` (else the last number in the response, as for GSM8K) compared with math-verify
(``math_equal``); a gold written as ``\\boxed{x}`` or ``#### x`` is reduced to ``x``. Without an answer
column the prompt is sent raw and ``grade`` returns None (scored by reward and length only). Answer and id
values may be numbers (JSON numbers, Parquet integer/float columns); the prompt must be text.

Left out: prompt templates with several columns (``{question}\\n{choices}``), per-row system prompts and
graders other than math-verify (use a dedicated task for those).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from srd_worker.errors import ConfigError
from srd_worker.tasks.base import Item
from srd_worker.tasks.grading import (
    DEFAULT_TIMEOUT_S,
    commas_dropped,
    extract_answer,
    extract_boxed,
    math_equal,
    same_answer,
    strip_number_commas,
)
from srd_worker.tasks.grading import (
    GRADER_VERSION as MATH_GRADER_VERSION,
)
from srd_worker.tasks.loading import DEFAULT_MAX_ROW_BYTES, Rows, read_rows
from srd_worker.tasks.prompts import generic_boxed_messages, raw_messages

#: The keys ``--field`` accepts, and whether each must be given.
FIELD_KEYS: dict[str, str] = {
    "prompt": "column with the text sent to the model (default: 'prompt')",
    "answer": "column with the gold answer (optional; without it the run is ungraded)",
    "id": "column with a unique item id (optional; default: the line or row number)",
}
DEFAULT_FIELDS: dict[str, str] = {"prompt": "prompt"}
UNGRADED_VERSION: str = "ungraded-1"

_BOXED_RE = re.compile(r"\\(?:boxed|fbox)(?![A-Za-z])")


def parse_field_options(pairs: Iterable[str]) -> dict[str, str]:
    """``KEY=COLUMN`` strings from ``--field`` into a mapping; ``ConfigError`` on a bad key or form."""
    out: dict[str, str] = {}
    for pair in pairs:
        key, sep, column = pair.partition("=")
        key, column = key.strip(), column.strip()
        if not sep or not key or not column:
            raise ConfigError(f"--field expects KEY=COLUMN (e.g. prompt=question), got {pair!r}")
        if key in out and out[key] != column:
            raise ConfigError(f"--field {key} given twice ({out[key]!r} and {column!r})")
        out[key] = column
    return check_fields(out)


def check_fields(fields: Mapping[str, str]) -> dict[str, str]:
    """Validate a field mapping (known keys, non-empty column names); returns it as a plain dict."""
    for key, column in fields.items():
        if key not in FIELD_KEYS:
            raise ConfigError(f"unknown --field key {key!r}; valid keys: {', '.join(FIELD_KEYS)}")
        if not isinstance(column, str) or not column.strip():
            raise ConfigError(f"--field {key} needs a column name")
    return dict(fields)


def gold_answer(value: str) -> str:
    """The answer to compare against: the content of a ``\\boxed{}``, or what follows ``####``; ``""`` if
    the box is empty or never closed."""
    boxed = extract_boxed(value)
    if boxed is not None or _BOXED_RE.search(value):
        return boxed or ""  # an empty or unclosed box is no answer
    if "####" in value:
        return strip_number_commas(value.rsplit("####", 1)[1].strip())
    return value.strip()


class GenericTask:
    """Prompt (and optionally answer and id) columns of any supported file, named by ``fields``."""

    name: str = "generic"

    def __init__(
        self,
        fields: Mapping[str, str] | None = None,
        *,
        max_row_bytes: int = DEFAULT_MAX_ROW_BYTES,
        grade_timeout_s: float = DEFAULT_TIMEOUT_S,
    ) -> None:
        self.fields = {**DEFAULT_FIELDS, **check_fields(fields or {})}
        self._default_prompt = "prompt" not in (fields or {})  # the column is DEFAULT_FIELDS' guess
        self.max_row_bytes = max_row_bytes
        self.grade_timeout_s = grade_timeout_s

    @property
    def graded(self) -> bool:
        return "answer" in self.fields

    @property
    def required_fields(self) -> tuple[str, ...]:
        return tuple(self.fields[k] for k in ("prompt", "answer") if k in self.fields)

    @property
    def grader_version(self) -> str:
        return MATH_GRADER_VERSION if self.graded else UNGRADED_VERSION

    def load(self, path: str | Path) -> list[Item]:
        return read_rows(path, max_row_bytes=self.max_row_bytes).items(self._item)

    def _item(self, rows: Rows, at: int, row: dict[str, Any]) -> Item:
        prompt_col, answer_col, id_col = (
            self.fields["prompt"],
            self.fields.get("answer"),
            self.fields.get("id"),
        )
        if self._default_prompt and prompt_col not in row:
            columns = ", ".join(map(str, list(row)[:8])) + (", ..." if len(row) > 8 else "")
            raise rows.error(
                f"missing required field (the prompt column when no --field prompt=COLUMN names one; "
                f"this row's columns: {columns})",
                at,
                prompt_col,
            )
        rows.require(at, row, (prompt_col,))
        gold = ""
        if answer_col is not None:
            gold = gold_answer(rows.text(at, row, answer_col, numbers=True))
            if not gold:
                raise rows.error("has an empty \\boxed{} or '####' answer", at, answer_col)
        if id_col is not None and row.get(id_col) is None:
            raise rows.error("missing required field", at, id_col)
        item_id = rows.row_id(at, row, id_col) if id_col is not None else f"{rows.unit}-{at}"
        return Item(id=item_id, question=row[prompt_col], gold=gold, meta={rows.unit: at})

    def messages(self, item: Item) -> list[dict[str, str]]:
        return generic_boxed_messages(item.question) if self.graded else raw_messages(item.question)

    def extract_answer(self, response: str) -> str | None:
        if not self.graded:
            return None
        return extract_answer(response, fallback_last_number=True)

    def grade(self, response: str, item: Item) -> bool | None:
        if not self.graded:
            return None
        pred = self.extract_answer(response)
        if pred is None:
            return False
        pred, gold = commas_dropped(pred, item.gold)
        return math_equal(pred, gold, timeout_s=self.grade_timeout_s)

    def same_answer(self, answer: str, other: str) -> bool:
        """Votes: ``grading.same_answer`` (plain numbers by value, else math-verify as ``grade``), numbers
        read without thousands commas as ``grade`` reads them."""
        return same_answer(*commas_dropped(answer, other), timeout_s=self.grade_timeout_s)

    def metrics(self, response: str, item: Item) -> dict[str, float]:
        return {}
