"""HotpotQA (Yang et al., 2018), distractor setting: dataset adapter, passages prompt, official EM / F1.

Rows: ``question``, ``answer`` and ``context``, the paragraphs shown to the model, either as
``{"title", "paragraph_text"}`` objects (the built-in ``hotpotqa`` dataset, ``hotpotqa_dev_500.jsonl``) or as the official
``[title, [sentence, ...]]`` pairs (sentences joined as they are, like the official files). The id is ``id``
(or the official ``_id``), else ``line-<N>``; ``type``, ``supporting_titles`` and the paragraph titles are
kept in ``Item.meta``. ``Item.question`` is the numbered passages followed by the question, so the policy
and the reward model see the same context.

Grading follows the official ``hotpot_evaluate_v1.py`` answer metrics: ``normalize_answer`` (lowercase,
drop ASCII punctuation, drop the articles a/an/the, collapse whitespace); EM is equality of the normalised
strings; F1 is the token-level F1 of the normalised strings, except that it is 0 when either side
normalises to ``yes``, ``no`` or ``noanswer`` and the two differ. The predicted answer is the last
``\\boxed{}`` (``\\text{}`` unwrapped); without one, the text after the last "answer is" / "Answer:". A
response with no answer scores EM 0 and F1 0. ``grade`` is EM; ``metrics`` gives em, f1, precision, recall.

Left out: supporting-fact (sp) and joint metrics (the built-in subset has paragraph-level labels only and
the prompt asks for citations, not sentence ids), and the test split (it has no answers).
"""

from __future__ import annotations

import re
import string
from collections import Counter
from typing import Any

from srd_worker.tasks.base import Item
from srd_worker.tasks.grading import extract_boxed, strip_latex_text
from srd_worker.tasks.loading import Rows, RowTask
from srd_worker.tasks.prompts import format_hotpotqa_question, hotpotqa_messages

GRADER_VERSION: str = "hotpotqa-official-em-f1-1"

META_FIELDS: tuple[str, ...] = ("type", "supporting_titles", "dev_index", "level")

_ARTICLES_RE = re.compile(r"\b(a|an|the)\b")
_PUNCTUATION = frozenset(string.punctuation)
_YES_NO = ("yes", "no", "noanswer")
_ANSWER_IS_RE = re.compile(r"(?i:answer)\s*(?:(?i:is)\s*:?|:)\s*(.+)")


def normalize_answer(s: str) -> str:
    """The official normalisation: lowercase, strip punctuation, articles and extra whitespace."""
    s = s.lower()
    s = "".join(ch for ch in s if ch not in _PUNCTUATION)
    s = _ARTICLES_RE.sub(" ", s)
    return " ".join(s.split())


def exact_match(prediction: str, gold: str) -> bool:
    return normalize_answer(prediction) == normalize_answer(gold)


def f1_score(prediction: str, gold: str) -> tuple[float, float, float]:
    """``(f1, precision, recall)`` as the official script computes them (with the yes/no/noanswer rule)."""
    pred, ref = normalize_answer(prediction), normalize_answer(gold)
    if (pred in _YES_NO or ref in _YES_NO) and pred != ref:
        return 0.0, 0.0, 0.0
    pred_tokens, ref_tokens = pred.split(), ref.split()
    same = sum((Counter(pred_tokens) & Counter(ref_tokens)).values())
    if same == 0:
        return 0.0, 0.0, 0.0
    precision = same / len(pred_tokens)
    recall = same / len(ref_tokens)
    return 2 * precision * recall / (precision + recall), precision, recall


def extract_short_answer(response: str) -> str | None:
    """The final short answer of a response (see the module docstring), or None."""
    boxed = extract_boxed(response)
    if boxed is not None:
        return strip_latex_text(boxed) or None
    found = _ANSWER_IS_RE.findall(response)
    if found:
        answer = found[-1].strip().strip("*_").strip()
        return answer.rstrip(".") or None
    return None


def _passages(rows: Rows, at: int, row: dict[str, Any]) -> list[tuple[str, str]]:
    context = row.get("context")
    if context is None:
        raise rows.error("missing required field", at, "context")
    if not isinstance(context, list) or not context:
        raise rows.error("must be a non-empty list of passages", at, "context")
    out: list[tuple[str, str]] = []
    for i, passage in enumerate(context):
        if isinstance(passage, dict):
            title, text = passage.get("title"), passage.get("paragraph_text", passage.get("text"))
        elif isinstance(passage, list | tuple) and len(passage) == 2 and isinstance(passage[1], list | tuple):
            title = passage[0]
            text = "".join(passage[1]) if all(isinstance(s, str) for s in passage[1]) else None
        else:
            raise rows.error(
                f"passage {i} must be {{title, paragraph_text}} or [title, [sentences]]", at, "context"
            )
        if not isinstance(title, str) or not isinstance(text, str):
            raise rows.error(f"passage {i} needs a string title and text", at, "context")
        out.append((title, text))
    return out


class HotpotQATask(RowTask):
    """HotpotQA question answering over given passages; graded by the official EM (F1 in ``metrics``)."""

    name: str = "hotpotqa"
    required_fields: tuple[str, ...] = ("question", "answer", "context")
    grader_version: str = GRADER_VERSION

    def _item(self, rows: Rows, at: int, row: dict[str, Any]) -> Item:
        rows.require(at, row, ("question", "answer"))
        passages = _passages(rows, at, row)
        item_id = rows.row_id(at, row, "id" if "id" in row else "_id")
        meta: dict[str, Any] = {rows.unit: at, "titles": [t for t, _ in passages]}
        meta.update({k: row[k] for k in META_FIELDS if k in row})
        return Item(
            id=item_id,
            question=format_hotpotqa_question(row["question"], passages),
            gold=row["answer"].strip(),
            meta=meta,
        )

    def messages(self, item: Item) -> list[dict[str, str]]:
        return hotpotqa_messages(item.question)

    def extract_answer(self, response: str) -> str | None:
        return extract_short_answer(response)

    def grade(self, response: str, item: Item) -> bool:
        pred = self.extract_answer(response)
        return pred is not None and exact_match(pred, item.gold)

    def same_answer(self, answer: str, other: str) -> bool:
        """Votes: the official normalisation (case, punctuation, articles), as ``grade`` compares."""
        return exact_match(answer, other)

    def metrics(self, response: str, item: Item) -> dict[str, float]:
        """``em``, ``f1``, ``precision``, ``recall`` of the response's answer (all 0 if it has none)."""
        pred = self.extract_answer(response)
        if pred is None:
            return {"em": 0.0, "f1": 0.0, "precision": 0.0, "recall": 0.0}
        f1, precision, recall = f1_score(pred, item.gold)
        return {"em": float(exact_match(pred, item.gold)), "f1": f1, "precision": precision, "recall": recall}
