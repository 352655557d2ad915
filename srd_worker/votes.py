"""Majority votes over extracted answers (pure): which answers count as one, and which one wins.

Self-consistency, the weighted majority of beam search / DVTS and the k-curves' majority@k
(``reports.kcurves``) all vote over answer *classes*. Answers equal after whitespace normalisation share a
class; so do answers the task's ``same_answer`` calls equal (math-verify for the math tasks, so ``0.5``,
``\\frac{1}{2}`` and ``1/2`` vote together, as Wang et al.'s self-consistency counts answers by value).
A method gets the task's classes through ``StepContext.answer_classes``; without a task, strings are
compared.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Hashable, Sequence


def answer_key(answer: str | None) -> str | None:
    """An answer with its whitespace normalised (runs of whitespace → one space, ends stripped)."""
    return None if answer is None else " ".join(answer.split())


def answer_classes(
    answers: Sequence[str | None], same: Callable[[str, str], bool] | None = None
) -> list[int | None]:
    """The vote class of each answer: the index of the first answer of its class (None: no answer).

    An answer joins the first class, in order of first appearance, whose first answer it equals
    (``answer_key`` equality, else ``same(answer, first)``), so the classes depend only on the answers
    and their order, and each distinct string is compared once. A ``same`` that raises counts as "not
    the same": a vote never fails an item."""
    by_key: dict[str, int] = {}
    firsts: list[tuple[str, int]] = []  # (a class's first answer, its class id)
    out: list[int | None] = []
    for i, answer in enumerate(answers):
        key = answer_key(answer)
        if key is None:
            out.append(None)
            continue
        if key not in by_key:
            cls = i
            if same is not None:
                cls = next((c for first, c in firsts if _same(same, key, first)), i)
            if cls == i:
                firsts.append((key, i))
            by_key[key] = cls
        out.append(by_key[key])
    return out


def whitespace_classes(answers: Sequence[str | None]) -> list[int | None]:
    """``answer_classes`` without a task: answers are the same iff equal after whitespace normalisation."""
    return answer_classes(answers)


def _same(same: Callable[[str, str], bool], answer: str, first: str) -> bool:
    try:
        return bool(same(answer, first))
    except Exception:
        return False


def majority(classes: Sequence[Hashable | None], weights: Sequence[float] | None = None) -> int | None:
    """Index of the first member of the winning class: the most members (``weights``: the largest sum of
    weights; a non-finite weight adds nothing), ties to the class seen first; None (no vote) when every
    class is None."""
    totals: dict[Hashable, float] = {}
    first: dict[Hashable, int] = {}
    for i, cls in enumerate(classes):
        if cls is None:
            continue
        w = 1.0 if weights is None else weights[i]
        totals[cls] = totals.get(cls, 0.0) + (w if math.isfinite(w) else 0.0)
        first.setdefault(cls, i)
    if not totals:
        return None
    best = max(totals, key=lambda c: (totals[c], -first[c]))
    return first[best]
