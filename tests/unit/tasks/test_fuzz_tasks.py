"""Fuzz: every task's answer extraction and grading on degenerate model output.

Extraction returns a non-empty string or ``None`` (no answer); grading returns a bool (``None`` only for
an ungraded generic task); hotpotqa's EM/F1 stay in [0, 1]. math-verify runs in a subprocess under
``grade_timeout_s``, so a grade is bounded by that timeout plus a grader restart.
"""

from __future__ import annotations

import math
import time

from hypothesis import example, given, settings
from hypothesis import strategies as st

from srd_worker.tasks.base import Item
from srd_worker.tasks.generic import GenericTask
from srd_worker.tasks.gpqa import GPQATask, extract_letter
from srd_worker.tasks.gsm8k import GSM8KTask
from srd_worker.tasks.hotpotqa import HotpotQATask, exact_match, f1_score
from srd_worker.tasks.math500 import Math500Task
from tests.unit.test_fuzz_strategies import hostile_text

GRADE_TIMEOUT_S = 0.5
#: A grade may time out and restart its grader subprocess (about half a second on two busy cores).
GRADE_BOUND_S = GRADE_TIMEOUT_S + 5.0


def _answer_ok(answer: str | None) -> bool:
    return answer is None or (isinstance(answer, str) and answer != "")


@given(hostile_text())
def test_math_extraction(text):
    for task in (Math500Task(), GSM8KTask(), GenericTask(fields={"prompt": "q", "answer": "a"})):
        assert _answer_ok(task.extract_answer(text))


@given(hostile_text())
def test_gpqa_letter(text):
    letter = extract_letter(text)
    assert letter is None or letter in "ABCD"
    item = Item(id="g", question="q", gold="A", meta={"choices": ["1", "2", "3", "\\boxed{"]})
    assert isinstance(GPQATask().grade(text, item), bool)


@given(text=hostile_text(), gold=st.sampled_from(["Paris", "yes", "no", "the 3 kings", "", "日本"]))
def test_hotpotqa_em_f1(text, gold):
    task = HotpotQATask()
    item = Item(id="h", question="q", gold=gold)
    assert _answer_ok(task.extract_answer(text))
    assert isinstance(task.grade(text, item), bool)
    m = task.metrics(text, item)
    assert set(m) == {"em", "f1", "precision", "recall"}
    assert all(isinstance(v, float) and math.isfinite(v) and 0.0 <= v <= 1.0 for v in m.values())
    f1, p, r = f1_score(text, gold)
    assert all(0.0 <= v <= 1.0 for v in (f1, p, r))
    assert isinstance(exact_match(text, gold), bool)


@settings(max_examples=8, deadline=None)  # each example runs math-verify in a subprocess
@example(text="so \\boxed{(10^{100})!}", gold="10^{10^{10}}")
@example(text="9" * 320 + " + 1 = 2", gold="42")
@given(text=hostile_text(), gold=st.sampled_from(["42", "1,250", "\\frac{1}{2}", "10^{10^{10}}"]))
def test_math_grade_is_bounded(text, gold):
    tasks = (
        Math500Task(grade_timeout_s=GRADE_TIMEOUT_S),
        GSM8KTask(grade_timeout_s=GRADE_TIMEOUT_S),
        GenericTask(fields={"prompt": "q", "answer": "a"}, grade_timeout_s=GRADE_TIMEOUT_S),
    )
    item = Item(id="m", question="q", gold=gold)
    for task in tasks:
        start = time.perf_counter()
        assert isinstance(task.grade(text, item), bool)
        assert time.perf_counter() - start < GRADE_BOUND_S


def test_ungraded_generic_task_has_no_answer():
    task = GenericTask(fields={"prompt": "q"})
    assert task.extract_answer("\\boxed{1}") is None and task.grade("\\boxed{1}", Item("i", "q", "")) is None
