"""AlpacaEval (ungraded) and the generic JSONL/CSV/Parquet adapter with a --field mapping; the field
mapping's path through the run spec (run id) back to the worker's ``get_task``; ``build_record`` keeps an
ungraded item's ``correct`` as None and records the grader version."""

from __future__ import annotations

import csv
import json
from pathlib import Path
from typing import Any

import pytest

from srd_worker.datasets import resolve_dataset
from srd_worker.errors import ConfigError, DatasetError
from srd_worker.runner import build_record
from srd_worker.spec import prepare_run
from srd_worker.tasks.alpaca_eval import AlpacaEvalTask
from srd_worker.tasks.base import Item, Task
from srd_worker.tasks.generic import GenericTask, gold_answer, parse_field_options
from srd_worker.tasks.grading import GRADER_VERSION
from srd_worker.tasks.registry import TASKS, detect_task, get_task, load_items

ALPACA_PATH = resolve_dataset("alpaca_eval")

ROWS = [
    {"qid": "q1", "text": "What is 2+3?", "solution": "5", "extra": 1},
    {"qid": "q2", "text": "What is half of 1?", "solution": "\\boxed{\\frac{1}{2}}", "extra": 2},
    {"qid": "q3", "text": "How many in 1,000 and 250?", "solution": "#### 1,250", "extra": 3},
]
MAPPING = {"prompt": "text", "answer": "solution", "id": "qid"}


def _write(path: Path, rows: list[dict[str, Any]]) -> Path:
    if path.suffix == ".csv":
        with open(path, "w", encoding="utf-8", newline="") as fh:
            writer = csv.DictWriter(fh, fieldnames=list(rows[0]))
            writer.writeheader()
            writer.writerows(rows)
    elif path.suffix == ".parquet":
        pa = pytest.importorskip("pyarrow")
        import pyarrow.parquet as pq

        pq.write_table(pa.Table.from_pylist(rows), path)
    else:
        path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


class _OneResponse:
    """A stand-in method whose result is a fixed response (build_record only needs ``name`` and ``result``)."""

    name = "fixed"

    def __init__(self, response: str) -> None:
        self.response = response

    def result(self, state: dict[str, Any]) -> dict[str, Any]:
        return {"response": self.response, "reward": 0.5}


# --- AlpacaEval --------------------------------------------------------------------------------------------


def test_alpaca_eval_loads_the_builtin_file() -> None:
    assert detect_task(ALPACA_PATH) == "alpaca_eval"
    task, items = load_items(ALPACA_PATH)
    assert task.name == "alpaca_eval" and len(items) == 805
    assert (
        items[0].question
        == "What are the names of some famous actors that started their careers on Broadway?"
    )
    assert items[0].gold == "" and items[0].meta == {
        "line": 1,
        "dataset": "helpful_base",
        "datasplit": "eval",
    }
    assert {item.meta["dataset"] for item in items} == {
        "helpful_base",
        "koala",
        "oasst",
        "selfinstruct",
        "vicuna",
    }
    assert task.messages(items[0]) == [{"role": "user", "content": items[0].question}]
    for item in items:
        assert task.grade("any response at all", item) is None
        assert task.extract_answer("\\boxed{1}") is None


def test_build_record_keeps_none_for_ungraded_items() -> None:
    item = Item(id="a", question="Write a haiku.", gold="")
    record = build_record(_OneResponse("Autumn moonlight"), AlpacaEvalTask(), item, 0, {"ledger": {}})
    assert record["correct"] is None and record["error"] is None
    assert record["grader_version"] == "ungraded-1" and record["metrics"] == {}
    graded = build_record(
        _OneResponse("\\boxed{5}"), get_task("gsm8k"), Item(id="b", question="q", gold="5"), 1, {}
    )
    assert graded["correct"] is True and graded["grader_version"] == GRADER_VERSION
    wrong = build_record(
        _OneResponse("\\boxed{6}"), get_task("gsm8k"), Item(id="b", question="q", gold="5"), 1, {}
    )
    assert wrong["correct"] is False


# --- generic -----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("suffix", [".jsonl", ".csv", ".parquet"])
def test_generic_mapping_in_every_format(tmp_path: Path, suffix: str) -> None:
    path = _write(tmp_path / f"mine{suffix}", ROWS)
    task, items = load_items(path, fields=MAPPING)  # --task auto with --field means generic
    assert task.name == "generic" and task.grader_version == GRADER_VERSION
    assert [(i.id, i.question, i.gold) for i in items] == [
        ("q1", "What is 2+3?", "5"),
        ("q2", "What is half of 1?", "\\frac{1}{2}"),
        ("q3", "How many in 1,000 and 250?", "1250"),
    ]
    assert task.grade("so it is \\boxed{5}", items[0])
    assert task.grade("that makes 5 in total", items[0])  # last-number fallback
    assert not task.grade("\\boxed{6}", items[0])
    assert task.grade("\\boxed{0.5}", items[1])
    assert task.grade("\\boxed{1,250}", items[2]) and task.grade("\\boxed{1250}", items[2])
    assert not task.grade("\\boxed{1,249}", items[2])
    system, user = task.messages(items[0])
    assert user["content"].startswith("What is 2+3?") and "\\boxed{}" in user["content"]


def test_generic_numeric_answers_and_ids_from_parquet(tmp_path: Path) -> None:
    rows = [{"n": 7, "prompt": "3+4?", "gold": 7}, {"n": 8, "prompt": "1/4 as a decimal?", "gold": 0.25}]
    path = _write(tmp_path / "numbers.parquet", rows)
    task, items = load_items(path, "generic", fields={"answer": "gold", "id": "n"})
    assert [(i.id, i.gold) for i in items] == [("7", "7"), ("8", "0.25")]
    assert task.grade("\\boxed{7}", items[0]) and task.grade("\\boxed{\\frac{1}{4}}", items[1])


def test_generic_without_answer_is_ungraded(tmp_path: Path) -> None:
    path = _write(tmp_path / "prompts.csv", [{"prompt": "Tell me a story."}, {"prompt": "Write a poem."}])
    task, items = load_items(path, "generic")  # default mapping: prompt=prompt
    assert [i.id for i in items] == ["line-2", "line-3"]
    assert task.grader_version == "ungraded-1"
    assert task.grade("once upon a time", items[0]) is None
    assert task.messages(items[0]) == [{"role": "user", "content": "Tell me a story."}]


def test_generic_errors_name_file_line_field(tmp_path: Path) -> None:
    path = _write(tmp_path / "mine.jsonl", [*ROWS[:2], {"qid": "q3", "text": "x", "solution": "\\boxed{}"}])
    with pytest.raises(DatasetError) as info:
        load_items(path, fields=MAPPING)
    assert str(info.value) == f"{path}, line 3, field 'solution': has an empty \\boxed{{}} or '####' answer"
    with pytest.raises(DatasetError) as info:
        load_items(path, "generic")
    # no --field prompt=: the default column, named as such, with the row's own columns to choose from
    assert str(info.value) == (
        f"{path}, line 1, field 'prompt': missing required field (the prompt column when no --field "
        "prompt=COLUMN names one; this row's columns: qid, text, solution, extra)"
    )
    with pytest.raises(DatasetError, match=r"line 1, field 'prompt': missing required field \(the prompt"):
        load_items(path, fields={"answer": "solution"})
    with pytest.raises(DatasetError, match=r"mine\.jsonl, line 1, field 'nope': missing required field"):
        load_items(path, fields={"prompt": "text", "id": "nope"})


def test_parse_field_options() -> None:
    assert parse_field_options(["prompt=text", " answer = solution "]) == {
        "prompt": "text",
        "answer": "solution",
    }
    assert parse_field_options(["prompt=Question Text"]) == {"prompt": "Question Text"}
    for bad, message in [
        (["prompt"], "--field expects KEY=COLUMN"),
        (["=x"], "--field expects KEY=COLUMN"),
        (["prompt="], "--field expects KEY=COLUMN"),
        (["gold=x"], "unknown --field key 'gold'"),
        (["prompt=a", "prompt=b"], "--field prompt given twice"),
    ]:
        with pytest.raises(ConfigError, match=message):
            parse_field_options(bad)


def test_gold_answer_forms() -> None:
    assert gold_answer(" 42 ") == "42"
    assert gold_answer("work... \\boxed{x^2}") == "x^2"
    assert gold_answer("work\n#### 1,000") == "1000"


def test_fields_only_for_generic() -> None:
    with pytest.raises(
        ConfigError, match=r"--field applies to --task generic \(or auto\) only; task 'gsm8k'"
    ):
        get_task("gsm8k", fields={"prompt": "q"})
    assert isinstance(get_task("generic", fields={"prompt": "q"}), GenericTask)


def test_every_task_implements_the_protocol() -> None:
    for name in TASKS:
        task = get_task(name)
        assert isinstance(task, Task) and task.name == name and task.grader_version


# --- the mapping travels with the run spec -----------------------------------------------------------------


def test_fields_are_part_of_the_spec_and_run_id(tmp_path: Path) -> None:
    path = _write(tmp_path / "mine.csv", ROWS)
    a = prepare_run(dataset=path, method="sampling", params={}, model="m", reward=None, fields=MAPPING)
    assert a.spec.task == "generic" and a.spec.fields == MAPPING
    b = prepare_run(
        dataset=path,
        method="sampling",
        params={},
        model="m",
        reward=None,
        fields={"prompt": "text", "id": "qid"},
    )
    assert a.spec.run_id() != b.spec.run_id()
    # The worker rebuilds the task from the stored spec: same prompts, same grades.
    rebuilt = get_task(a.spec.task, fields=a.spec.fields)
    assert [rebuilt.messages(i) for i in a.items] == [a.task.messages(i) for i in a.items]
    assert rebuilt.grader_version == GRADER_VERSION and b.task.grader_version == "ungraded-1"


def test_specs_without_fields_keep_their_run_ids(tmp_path: Path) -> None:
    path = _write(tmp_path / "g.jsonl", [{"question": "1+1?", "answer": "#### 2"}])
    prepared = prepare_run(dataset=path, method="sampling", params={}, model="m", reward=None)
    assert prepared.spec.fields == {}
    assert prepared.spec.task_def == {}  # a built-in task: no task file definition either
    body = prepared.spec.model_dump(exclude={"dataset", "fields", "task_def", "engine_args", "forked_from"})
    import hashlib

    assert (
        prepared.spec.config_hash() == hashlib.sha256(json.dumps(body, sort_keys=True).encode()).hexdigest()
    )


def test_max_row_bytes_reaches_the_reader(tmp_path: Path) -> None:
    path = _write(tmp_path / "g.jsonl", [{"question": "1+1?" * 20, "answer": "#### 2"}])
    with pytest.raises(
        DatasetError, match=r"g\.jsonl, line 1: row is \d+ bytes, more than the limit of 50 bytes"
    ):
        prepare_run(dataset=path, method="sampling", params={}, model="m", reward=None, max_row_bytes=50)


def test_csv_quirks_are_accepted(tmp_path: Path) -> None:
    """A byte-order mark, CRLF line ends, blank lines and quoted values spanning lines are all fine."""
    path = tmp_path / "excel.csv"
    path.write_bytes(
        b'\xef\xbb\xbfprompt,answer\r\n"Line one\r\nline two, with a comma",7\r\n\r\nplain,"8"\r\n'
    )
    task, items = load_items(path, fields={"prompt": "prompt", "answer": "answer"})
    assert [(i.id, i.question, i.gold) for i in items] == [
        ("line-2", "Line one\r\nline two, with a comma", "7"),
        ("line-5", "plain", "8"),
    ]
