"""HotpotQA: the built-in dev subset loads, the prompt carries the passages, and EM / F1 follow the official
``hotpot_evaluate_v1.py`` (normalisation and the yes/no/noanswer rule), checked against hand-computed
values on real rows."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from srd_worker.datasets import resolve_dataset
from srd_worker.errors import DatasetError
from srd_worker.tasks.base import Item
from srd_worker.tasks.hotpotqa import (
    HotpotQATask,
    exact_match,
    extract_short_answer,
    f1_score,
    normalize_answer,
)
from srd_worker.tasks.prompts import HOTPOTQA_INSTRUCTION, HOTPOTQA_SYSTEM_PROMPT
from srd_worker.tasks.registry import detect_task

HOTPOT_PATH = resolve_dataset("hotpotqa")


@pytest.fixture(scope="module")
def items() -> dict[str, Item]:
    return {item.id: item for item in HotpotQATask().load(HOTPOT_PATH)}


def test_loads_the_builtin_subset(items: dict[str, Item]) -> None:
    assert len(items) == 500
    first = items["5a8b57f25542995d1e6f1371"]
    assert first.gold == "yes"
    assert first.meta["type"] == "comparison" and first.meta["dev_index"] == 0
    assert first.meta["supporting_titles"] == ["Scott Derrickson", "Ed Wood"]
    assert first.meta["titles"][:2] == ["Ed Wood (film)", "Scott Derrickson"]
    assert first.question.startswith("Passages:\n\n[1] Ed Wood (film): Ed Wood is a 1994 American")
    assert first.question.endswith("Question: Were Scott Derrickson and Ed Wood of the same nationality?")
    assert "[10] Conrad Brooks" not in first.question and "[9] Conrad Brooks:" in first.question
    types = [item.meta["type"] for item in items.values()]
    assert types.count("bridge") == 250 and types.count("comparison") == 250


def test_messages(items: dict[str, Item]) -> None:
    item = items["5a8c7595554299585d9e36b6"]
    system, user = HotpotQATask().messages(item)
    assert system == {"role": "system", "content": HOTPOTQA_SYSTEM_PROMPT}
    assert user["content"] == f"{item.question}\n\n{HOTPOTQA_INSTRUCTION}"
    assert "only the information in the passages" in user["content"] and "\\boxed{}" in user["content"]


# (row id, gold as in the file, prediction, EM, F1) — F1 worked out by hand from the official formula:
# tokens after normalisation, common = multiset intersection, P = common/|pred|, R = common/|gold|.
HAND_COMPUTED = [
    # "greenwich village new york city" (5) vs "greenwich village" (2): P 1, R 2/5 -> 2*0.4/1.4 = 4/7
    ("5a8e3ea95542995a26add48d", "Greenwich Village, New York City", "Greenwich Village", 0, 4 / 7),
    # article and case dropped: "north atlantic conference" on both sides
    ("5ab3e45655429976abd1bcd4", "the North Atlantic Conference", "North Atlantic Conference", 1, 1.0),
    # one common token "conference" of 3 and 3: P = R = 1/3
    ("5ab3e45655429976abd1bcd4", "the North Atlantic Conference", "America East Conference", 0, 1 / 3),
    # punctuation removed inside numbers: "3677 seated" vs "3677": P 1, R 1/2 -> 2/3
    ("5a87ab905542996e4f3088c1", "3,677 seated", "3,677", 0, 2 / 3),
    # "from 1986 to 2013" (4) vs "1986 to 2013" (3): P 1, R 3/4 -> 6/7
    ("5ab6d09255429954757d337d", "from 1986 to 2013", "1986 to 2013", 0, 6 / 7),
    # "1969 until 1974" vs "1969 to 1974": 2 common of 3 and 3 -> 2/3
    ("5ae0d4c9554299603e418468", "1969 until 1974", "1969 to 1974", 0, 2 / 3),
    # accents are not folded by the official script: one common token of 2 and 2 -> 1/2
    ("5ae7a8175542993210983ed8", "Pedro Rodríguez", "Pedro Rodriguez", 0, 0.5),
    # apostrophe and article removed: "worlds best goalkeeper" on both sides
    ("5ae22b8d554299234fd0440f", "World's Best Goalkeeper", "the world's best goalkeeper", 1, 1.0),
    # yes/no rule: the gold is "yes" and the prediction differs -> F1 0 (plain token F1 would be 1/2)
    ("5a8b57f25542995d1e6f1371", "yes", "yes they were", 0, 0.0),
    ("5a8b57f25542995d1e6f1371", "yes", "Yes.", 1, 1.0),
    ("5adbf0a255429947ff17385a", "no", "yes", 0, 0.0),
    # ...and the same rule when the *prediction* is yes/no and the gold is not
    ("5a7bbb64554299042af8f7cc", "Terry Richardson", "no", 0, 0.0),
    # no overlap at all
    ("5a85ea095542994775f606a8", "Animorphs", "Goosebumps", 0, 0.0),
]


@pytest.mark.parametrize(("row_id", "gold", "prediction", "em", "f1"), HAND_COMPUTED)
def test_em_f1_hand_computed_on_real_rows(
    items: dict[str, Item], row_id: str, gold: str, prediction: str, em: int, f1: float
) -> None:
    item = items[row_id]
    assert item.gold == gold
    assert exact_match(prediction, item.gold) is bool(em)
    assert f1_score(prediction, item.gold)[0] == pytest.approx(f1)
    task = HotpotQATask()
    response = f"From passage [1] and [2] we learn the answer. \\boxed{{{prediction}}}"
    assert task.grade(response, item) is bool(em)
    metrics = task.metrics(response, item)
    assert metrics["em"] == em and metrics["f1"] == pytest.approx(f1)


def test_precision_recall() -> None:
    assert f1_score("Greenwich Village", "Greenwich Village, New York City") == pytest.approx(
        (4 / 7, 1.0, 0.4)
    )
    assert f1_score("a the an", "") == (0.0, 0.0, 0.0)  # both normalise to "": no tokens in common
    assert f1_score("noanswer", "no answer") == (0.0, 0.0, 0.0)


def test_normalize_answer_official_steps() -> None:
    assert normalize_answer("  The Beatles!  ") == "beatles"
    assert normalize_answer("An apple, a pear & the plum.") == "apple pear plum"
    assert normalize_answer("Theatre of the Absurd") == "theatre of absurd"  # "the" only as a word
    assert normalize_answer("U.S.A.") == "usa"


def test_every_gold_grades_correct_and_a_wrong_answer_does_not(items: dict[str, Item]) -> None:
    task = HotpotQATask()
    for item in items.values():
        assert task.grade(f"The passages say so. \\boxed{{{item.gold}}}", item), item.id
        assert task.metrics(f"\\boxed{{{item.gold}}}", item)["f1"] == 1.0
        wrong = "no" if normalize_answer(item.gold) == "yes" else "yes"
        assert not task.grade(f"\\boxed{{{wrong}}}", item), item.id
        assert task.metrics(f"\\boxed{{{wrong}}}", item)["f1"] == 0.0


@pytest.mark.parametrize(
    ("response", "answer"),
    [
        ("... so \\boxed{\\text{Chief of Protocol}}.", "Chief of Protocol"),
        ("first \\boxed{A}, then \\boxed{Animorphs}", "Animorphs"),
        ("Reasoning [1][3]. The answer is: Kansas Song.", "Kansas Song"),
        ("Answer: **YG Entertainment**", "YG Entertainment"),
        ("I cannot tell from the passages.", None),
        ("truncated \\boxed{Gre", None),
    ],
)
def test_short_answer_extraction(response: str, answer: str | None) -> None:
    assert extract_short_answer(response) == answer


def test_no_answer_scores_zero() -> None:
    item = Item(id="x", question="q", gold="Animorphs")
    task = HotpotQATask()
    assert task.grade("no idea", item) is False
    assert task.metrics("no idea", item) == {"em": 0.0, "f1": 0.0, "precision": 0.0, "recall": 0.0}


def test_official_context_format_and_detection(tmp_path: Path) -> None:
    row = {
        "_id": "abc",
        "question": "Which is older?",
        "answer": "Ann",
        "context": [
            ["Ann", ["Ann was born in 1900.", " She lived long."]],
            ["Bob", ["Bob was born in 1950."]],
        ],
        "supporting_facts": [["Ann", 0], ["Bob", 0]],
    }
    path = tmp_path / "official.jsonl"
    path.write_text(json.dumps(row) + "\n", encoding="utf-8")
    assert detect_task(path) == "hotpotqa"
    (item,) = HotpotQATask().load(path)
    assert item.id == "abc"
    assert "[1] Ann: Ann was born in 1900. She lived long.\n\n[2] Bob: Bob was born in 1950." in item.question


@pytest.mark.parametrize(
    ("context", "message"),
    [
        ("not a list", "must be a non-empty list of passages"),
        ([], "must be a non-empty list of passages"),
        ([{"title": "T"}], "passage 0 needs a string title and text"),
        ([["T", ["ok"]], 5], "passage 1 must be {title, paragraph_text} or [title, [sentences]]"),
    ],
)
def test_bad_context_names_line_and_field(tmp_path: Path, context: object, message: str) -> None:
    path = tmp_path / "bad.jsonl"
    good = {"id": "a", "question": "q?", "answer": "x", "context": [{"title": "T", "paragraph_text": "p"}]}
    path.write_text(
        json.dumps(good) + "\n" + json.dumps({**good, "id": "b", "context": context}) + "\n", encoding="utf-8"
    )
    with pytest.raises(DatasetError) as info:
        HotpotQATask().load(path)
    assert str(info.value) == f"{path}, line 2, field 'context': {message}"
