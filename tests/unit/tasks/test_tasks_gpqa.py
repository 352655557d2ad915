"""GPQA Diamond: loading the authors' CSV columns, the per-item choice order (same in every process),
letter extraction and grading. The CSV is written by the tests (GPQA is not among the built-in datasets)."""

from __future__ import annotations

import csv
import json
import os
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

from srd_worker.errors import DatasetError
from srd_worker.tasks.base import Item
from srd_worker.tasks.gpqa import SHUFFLE_SALT, GPQATask, extract_letter, permutation_for
from srd_worker.tasks.prompts import GPQA_INSTRUCTION, GPQA_SYSTEM_PROMPT
from srd_worker.tasks.registry import detect_task, load_items

ROOT = Path(__file__).resolve().parents[3]

# The authors' column layout (a subset of their many columns, in their order), with made-up questions.
HEADER = [
    "Pre-Revision Question",
    "Question",
    "Correct Answer",
    "Incorrect Answer 1",
    "Incorrect Answer 2",
    "Incorrect Answer 3",
    "Explanation",
    "Subdomain",
    "Record ID",
    "High-level domain",
]


def _gpqa_rows(n: int) -> list[dict[str, str]]:
    rows = []
    for i in range(n):
        rows.append(
            {
                "Pre-Revision Question": f"old question {i}",
                "Question": f'Question {i}: which value, with units, is right?\nConsider "quoted" text, and commas.',
                "Correct Answer": f" correct {i} eV\n",
                "Incorrect Answer 1": f"wrong {i}a",
                "Incorrect Answer 2": f"wrong {i}b",
                "Incorrect Answer 3": f"wrong {i}c",
                "Explanation": "because",
                "Subdomain": "Quantum Mechanics" if i % 2 else "Organic Chemistry",
                "Record ID": f"rec{i:04d}",
                "High-level domain": "Physics" if i % 2 else "Chemistry",
            }
        )
    return rows


def write_gpqa_csv(path: Path, n: int = 30, header: list[str] | None = None) -> Path:
    with open(path, "w", encoding="utf-8", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=header or HEADER, extrasaction="ignore")
        writer.writeheader()
        writer.writerows(_gpqa_rows(n))
    return path


@pytest.fixture()
def gpqa_csv(tmp_path: Path) -> Path:
    return write_gpqa_csv(tmp_path / "gpqa_diamond.csv")


def test_loads_the_authors_columns(gpqa_csv: Path) -> None:
    items = GPQATask().load(gpqa_csv)
    assert len(items) == 30
    first = items[0]
    assert first.id == "rec0000"
    assert first.meta["line"] == 2  # the header is line 1
    assert first.meta["High-level domain"] == "Chemistry" and first.meta["Subdomain"] == "Organic Chemistry"
    assert first.meta["shuffle_salt"] == SHUFFLE_SALT
    choices = first.meta["choices"]
    assert sorted(choices) == sorted(["correct 0 eV", "wrong 0a", "wrong 0b", "wrong 0c"])  # stripped
    assert choices["ABCD".index(first.gold)] == "correct 0 eV"
    assert [choices[k] for k in range(4)] == [
        ["correct 0 eV", "wrong 0a", "wrong 0b", "wrong 0c"][p] for p in first.meta["permutation"]
    ]
    # Multi-line, quoted question text survives the CSV round trip; choices follow it as (A)..(D).
    assert first.question.startswith('Question 0: which value, with units, is right?\nConsider "quoted" text')
    for letter, choice in zip("ABCD", choices, strict=True):
        assert f"({letter}) {choice}" in first.question


def test_record_id_optional_ids_fall_back_to_lines(tmp_path: Path) -> None:
    path = write_gpqa_csv(tmp_path / "no_ids.csv", n=3, header=[h for h in HEADER if h != "Record ID"])
    items = GPQATask().load(path)
    assert [i.id for i in items] == ["line-2", "line-5", "line-8"]  # each question spans three lines


def test_permutation_is_a_deterministic_function_of_id_and_salt() -> None:
    assert permutation_for("rec0001") == permutation_for("rec0001")
    assert sorted(permutation_for("rec0001")) == [0, 1, 2, 3]
    orders = {permutation_for(f"rec{i:04d}") for i in range(200)}
    assert len(orders) == 24  # every order occurs: the correct answer is not stuck in one place
    assert permutation_for("rec0001", salt="other") != permutation_for("rec0001") or permutation_for(
        "rec0002", salt="other"
    ) != permutation_for("rec0002")


def test_gold_letters_are_spread(gpqa_csv: Path) -> None:
    counts = Counter(item.gold for item in GPQATask().load(gpqa_csv))
    assert set(counts) == set("ABCD")


_PRINT_ORDERS = (
    "import json, sys\n"
    "from srd_worker.tasks.gpqa import GPQATask\n"
    "items = GPQATask().load(sys.argv[1])\n"
    "print(json.dumps([[i.id, i.meta['permutation'], i.gold, i.question] for i in items]))\n"
)


@pytest.mark.parametrize("hash_seed", ["0", "12345"])
def test_permutation_same_after_resume_in_another_process(gpqa_csv: Path, hash_seed: str) -> None:
    here = [[i.id, i.meta["permutation"], i.gold, i.question] for i in GPQATask().load(gpqa_csv)]
    env = {
        **os.environ,
        "PYTHONHASHSEED": hash_seed,
        "PYTHONPATH": os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p),
    }
    proc = subprocess.run(
        [sys.executable, "-c", _PRINT_ORDERS, str(gpqa_csv)],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
        check=True,
    )
    assert json.loads(proc.stdout) == here


def test_items_rebuilt_from_the_store_give_the_same_prompt(gpqa_csv: Path) -> None:
    """A worker rebuilds items from stored rows (question, gold, meta as JSON): same messages, same grade."""
    task = GPQATask()
    for item in task.load(gpqa_csv):
        stored = Item(
            id=item.id, question=item.question, gold=item.gold, meta=json.loads(json.dumps(item.meta))
        )
        assert task.messages(stored) == task.messages(item)
        assert task.grade(f"\\boxed{{{item.gold}}}", stored)


def test_messages_follow_the_appendix_style(gpqa_csv: Path) -> None:
    task = GPQATask()
    item = task.load(gpqa_csv)[0]
    system, user = task.messages(item)
    assert system == {"role": "system", "content": GPQA_SYSTEM_PROMPT}
    assert user["role"] == "user" and user["content"].endswith(GPQA_INSTRUCTION)
    assert "\\boxed{}" in user["content"] and user["content"].startswith(item.question)


@pytest.mark.parametrize(
    ("response", "letter"),
    [
        ("so the answer is \\boxed{B}.", "B"),
        ("\\boxed{(C)}", "C"),
        ("\\boxed{D)}", "D"),
        ("\\boxed{\\text{A}}", "A"),
        ("$\\boxed{\\textbf{(B)}}$", "B"),
        ("\\boxed{B. 3.5 eV}", "B"),
        ("first \\boxed{A}, on reflection \\boxed{C}", "C"),
        ("Therefore the answer is B.", "B"),
        ("The answer is (D)", "D"),
        ("**Answer: (A)**", "A"),
        ("Final answer: C", "C"),
        ("I compared the options.\n(B)", "B"),
        ("I compared the options.\nB) 3.5 eV", "B"),
        ("Looking at A) and B) ...\nthe answer is C", "C"),
        ("The answer is a bit unclear.", None),
        ("A) first\nB) second\nI am not sure.", None),
        ("\\boxed{E}", None),
        ("\\boxed{42}", None),
        ("no letter at all", None),
    ],
)
def test_letter_extraction(response: str, letter: str | None) -> None:
    assert extract_letter(response) == letter


def test_grading_gold_right_and_others_wrong(gpqa_csv: Path) -> None:
    task = GPQATask()
    for item in task.load(gpqa_csv):
        assert task.grade(f"Reasoning... The answer is \\boxed{{{item.gold}}}", item)
        assert task.grade(f"The answer is ({item.gold})", item)
        for other in "ABCD".replace(item.gold, ""):
            assert not task.grade(f"\\boxed{{{other}}}", item)
            assert not task.grade(f"the answer is {other}", item)
        assert not task.grade("I do not know.", item)
        correct_text = item.meta["choices"]["ABCD".index(item.gold)]
        assert task.grade(f"\\boxed{{{correct_text}}}", item)  # the choice text itself, boxed
        assert task.metrics("\\boxed{A}", item) == {}


def test_detected_from_csv_jsonl_and_parquet(tmp_path: Path, gpqa_csv: Path) -> None:
    assert detect_task(gpqa_csv) == "gpqa"
    rows = _gpqa_rows(4)
    jsonl = tmp_path / "gpqa.jsonl"
    jsonl.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    task, items = load_items(jsonl)
    assert task.name == "gpqa" and [i.id for i in items] == ["rec0000", "rec0001", "rec0002", "rec0003"]
    pa = pytest.importorskip("pyarrow")
    import pyarrow.parquet as pq

    parquet = tmp_path / "gpqa.parquet"
    pq.write_table(pa.Table.from_pylist(rows), parquet)
    task, from_parquet = load_items(parquet)
    assert task.name == "gpqa"
    assert [(i.id, i.gold, i.question) for i in from_parquet] == [(i.id, i.gold, i.question) for i in items]
    assert from_parquet[0].meta["row"] == 1


def test_missing_answer_column_names_line_and_field(tmp_path: Path) -> None:
    path = write_gpqa_csv(
        tmp_path / "short.csv", n=2, header=[h for h in HEADER if h != "Incorrect Answer 3"]
    )
    with pytest.raises(DatasetError) as info:
        GPQATask().load(path)
    assert str(info.value) == f"{path}, line 2, field 'Incorrect Answer 3': missing required field"
