"""GPQA Diamond (Rein et al., 2023): dataset adapter, shuffled multiple-choice prompt, letter grader.

Follows the authors' CSV release (``gpqa_diamond.csv`` inside their password-protected ``dataset.zip``):
columns ``Question``, ``Correct Answer``, ``Incorrect Answer 1``..``3`` and, where present, ``Record ID``
(the item id; else ``line-<N>``), ``High-level domain`` and ``Subdomain`` (kept in ``Item.meta``). The
same columns in a JSONL or Parquet file load the same way.

The four choices are shown in a per-item order: permutation number ``sha256(salt + item id) mod 24`` of
``[correct, incorrect 1, incorrect 2, incorrect 3]`` (``itertools.permutations`` order). It depends only on
the id and the fixed salt, never on Python's hash seed or random module, so any process that loads the
file gets the same order; it is also stored in ``Item.meta`` (``permutation``, ``choices``) and therefore
with the run's items. The gold answer is the letter of the correct choice. A response is graded on the
letter in its last ``\\boxed{}`` (``B``, ``(B)``, ``B)``, ``\\text{B}``, ``B. text``); without one, on the
last "answer is B" / "Answer: (B)" phrase, else on a last line that is just ``(B)`` / ``B)``. A boxed
choice *text* that equals exactly one choice counts as that choice.

Left out: the Main and Extended sets' extra columns (they load the same way), the original
"Pre-Revision" questions, and chain-of-thought few-shot prompts from the paper's baselines.
"""

from __future__ import annotations

import hashlib
import itertools
import re
from typing import Any

from srd_worker.tasks.base import Item
from srd_worker.tasks.grading import extract_boxed, strip_latex_text
from srd_worker.tasks.loading import Rows, RowTask
from srd_worker.tasks.prompts import GPQA_LETTERS, format_gpqa_question, gpqa_messages

#: Changing the salt changes every item's choice order: bump GRADER_VERSION / the prompt version with it.
SHUFFLE_SALT: str = "srdq-gpqa-shuffle-1"
GRADER_VERSION: str = "gpqa-letter-1"

QUESTION = "Question"
CORRECT = "Correct Answer"
INCORRECT = ("Incorrect Answer 1", "Incorrect Answer 2", "Incorrect Answer 3")
ID_FIELD = "Record ID"
META_FIELDS: tuple[str, ...] = ("High-level domain", "Subdomain")

_PERMUTATIONS: tuple[tuple[int, ...], ...] = tuple(itertools.permutations(range(4)))
_LETTER = "[A-D]"
# Inside a box: the letter alone or followed by ")", ".", ":" or a space, optionally in parentheses.
_BOXED_LETTER_RE = re.compile(rf"^\(?({_LETTER})\)?(?:[.:)]|\s|$)")
_ANSWER_IS_RE = re.compile(
    rf"(?i:answer)\s*(?:(?i:is)|:)\s*(?:(?i:option|choice)\s*)?[*_\s]*\(?({_LETTER})\)?(?![A-Za-z0-9])"
)
_LAST_LINE_RE = re.compile(rf"^[*_\s]*\(?({_LETTER})\)[.:]?(?:\s|$)|^[*_\s]*({_LETTER})[*_\s]*$")


def permutation_for(item_id: str, salt: str = SHUFFLE_SALT) -> tuple[int, ...]:
    """The display order for ``item_id``: ``order[k]`` is the original index (0 = correct) shown at slot k."""
    digest = hashlib.sha256(f"{salt}\x00{item_id}".encode()).digest()
    return _PERMUTATIONS[int.from_bytes(digest[:8], "big") % len(_PERMUTATIONS)]


def extract_letter(response: str) -> str | None:
    """The answer letter (A-D) of a response, or None (see the module docstring for the forms read)."""
    boxed = extract_boxed(response)
    if boxed is not None:
        m = _BOXED_LETTER_RE.match(strip_latex_text(boxed))
        return m.group(1) if m else None
    found = _ANSWER_IS_RE.findall(response)
    if found:
        return found[-1]
    lines = [line for line in response.strip().splitlines() if line.strip()]
    if lines:
        m = _LAST_LINE_RE.match(lines[-1].strip())
        if m:
            return m.group(1) or m.group(2)
    return None


def _norm(text: str) -> str:
    return " ".join(strip_latex_text(text).lower().split()).rstrip(".")


class GPQATask(RowTask):
    """GPQA Diamond (or Main/Extended) multiple choice; graded by the answer letter."""

    name: str = "gpqa"
    required_fields: tuple[str, ...] = (QUESTION, CORRECT, *INCORRECT)
    grader_version: str = GRADER_VERSION

    def _item(self, rows: Rows, at: int, row: dict[str, Any]) -> Item:
        question = rows.text(at, row, QUESTION)
        original = [rows.text(at, row, CORRECT)] + [rows.text(at, row, f) for f in INCORRECT]
        item_id = rows.row_id(at, row, ID_FIELD)
        order = permutation_for(item_id)
        choices = [original[k] for k in order]
        meta: dict[str, Any] = {
            rows.unit: at,
            "permutation": list(order),
            "choices": choices,
            "shuffle_salt": SHUFFLE_SALT,
        }
        meta.update({k: row[k] for k in META_FIELDS if row.get(k) not in (None, "")})
        return Item(
            id=item_id,
            question=format_gpqa_question(question, choices),
            gold=GPQA_LETTERS[order.index(0)],
            meta=meta,
        )

    def messages(self, item: Item) -> list[dict[str, str]]:
        return gpqa_messages(item.question)

    def extract_answer(self, response: str) -> str | None:
        return extract_letter(response)

    def grade(self, response: str, item: Item) -> bool:
        letter = self.extract_answer(response)
        if letter is None:
            letter = self._letter_of_boxed_text(response, item)
        return letter == item.gold

    def metrics(self, response: str, item: Item) -> dict[str, float]:
        return {}

    @staticmethod
    def _letter_of_boxed_text(response: str, item: Item) -> str | None:
        boxed = extract_boxed(response)
        choices = item.meta.get("choices") or []
        if boxed is None or len(choices) != len(GPQA_LETTERS):
            return None
        hits = [
            letter
            for letter, choice in zip(GPQA_LETTERS, choices, strict=True)
            if _norm(choice) == _norm(boxed)
        ]
        return hits[0] if len(hits) == 1 else None
