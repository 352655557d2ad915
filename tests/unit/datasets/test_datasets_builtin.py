"""Every built-in dataset file (srd_worker/datasets/data): ``--task auto`` picks the right adapter (or says
clearly why the file is not a task), every row loads, gold answers grade correct against themselves and
known wrong answers grade wrong. Row-level details per benchmark live in test_tasks.py (GSM8K, MATH-500),
test_tasks_hotpotqa.py and test_tasks_generic.py (AlpacaEval); the registry itself in
test_datasets_registry.py."""

from __future__ import annotations

from pathlib import Path

import pytest

from srd_worker.datasets import DATA_DIR, DATASETS
from srd_worker.errors import ConfigError, DatasetError
from srd_worker.rewards.arithmetic import ArithmeticReward
from srd_worker.tasks.prm800k import is_prm800k_row, load_prm800k, rated_steps
from srd_worker.tasks.registry import detect_task, load_items

# file -> (task auto picks, rows); None: not a task (PRM800K step labels, see srd_worker/tasks/prm800k.py)
EXPECTED: dict[str, tuple[str | None, int]] = {
    "math500.jsonl": ("math500", 500),
    "gsm8k_test.jsonl": ("gsm8k", 1319),
    "hotpotqa_dev_500.jsonl": ("hotpotqa", 500),
    "alpaca_eval.jsonl": ("alpaca_eval", 805),
    "prm800k_phase_labels_sample.jsonl": (None, 6),
}


def _files() -> list[str]:
    return sorted(p.name for p in DATA_DIR.iterdir() if p.suffix in (".jsonl", ".csv", ".parquet"))


def _wrong(task_name: str, gold: str) -> str:
    if task_name == "gsm8k":
        return str(int(gold) + 1) if gold.lstrip("-").isdigit() else str(float(gold) + 1)
    if task_name == "math500":
        return f"{gold} + 1"
    return "no" if gold.strip().lower() == "yes" else "yes"  # hotpotqa


def test_every_builtin_file_is_covered() -> None:
    assert set(_files()) == set(EXPECTED), (
        "a new built-in dataset: add it to EXPECTED (and a task if it is one)"
    )
    # the registry agrees with what auto-detection picks and with the row counts
    assert {d.filename: (d.task, d.records) for d in DATASETS.values()} == EXPECTED


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_builtin_file_loads_and_grades(name: str) -> None:
    path = DATA_DIR / name
    expected_task, n_rows = EXPECTED[name]
    if expected_task is None:
        with pytest.raises(ConfigError) as info:
            load_items(path)
        message = str(info.value)
        assert str(path) in message and "PRM800K step labels" in message and "not a task" in message
        assert "\n" not in message
        assert len(load_prm800k(path)) == n_rows
        return
    assert detect_task(path) == expected_task
    task, items = load_items(path)
    assert task.name == expected_task and len(items) == n_rows
    assert len({item.id for item in items}) == n_rows
    for item in items:
        assert item.question.strip()
        messages = task.messages(item)
        assert messages[-1]["role"] == "user" and messages[-1]["content"].strip()
    if expected_task == "alpaca_eval":
        assert all(task.grade("Sure! Here is an answer.", item) is None for item in items)
        return
    # Every HotpotQA row (pure Python); every 20th MATH-500 row and every 50th GSM8K row (math-verify in
    # subprocesses; the first 50 rows of each are checked in test_tasks.py).
    step = {"hotpotqa": 1, "math500": 20, "gsm8k": 50}[expected_task]
    for item in items[::step]:
        assert task.grade(f"Working it out carefully. The final answer is \\boxed{{{item.gold}}}.", item), (
            item.id
        )
        assert not task.grade(f"The final answer is \\boxed{{{_wrong(expected_task, item.gold)}}}.", item), (
            item.id
        )
        assert not task.grade("I cannot solve this.", item), item.id


def test_prm800k_sample_is_usable_for_reward_model_checks() -> None:
    path = DATASETS["prm800k_sample"].path
    records = load_prm800k(path)
    assert [r.finish_reason for r in records] == [
        "solution",
        "found_error",
        "solution",
        "solution",
        "give_up",
        "solution",
    ]
    first = records[0]
    assert first.id == "line-1" and first.answer == "29" and first.problem.startswith("Three pencils")
    assert len(first.steps) == 6 and len(first.path()) == 6
    assert first.steps[1].chosen is not None and first.steps[1].chosen.source == "human"
    assert [len(r.path()) for r in records] == [6, 6, 5, 7, 8, 12]  # found_error / give_up stop early
    cases = [c for r in records for c in rated_steps(r)]
    assert len(cases) == 73 and {c.rating for c in cases} == {-1, 0, 1}
    # Cases at the same step share the prefix: a PRM check compares good and bad continuations of it.
    second_step = [c for c in cases if c.record_id == "line-1" and c.prefix == first.path()[0]]
    assert [c.rating for c in second_step] == [-1] * 5
    scores = ArithmeticReward().score([c.problem for c in cases], [f"{c.prefix}\n{c.step}" for c in cases])
    assert len(scores) == len(cases) and all(0.0 <= s <= 1.0 for s in scores)


def test_prm800k_explicit_task_and_bad_rows(tmp_path: Path) -> None:
    path = DATASETS["prm800k_sample"].path
    with pytest.raises(DatasetError, match=r"line 1, field 'problem': missing required field"):
        load_items(path, "math500")  # the problem is nested under "question"
    bad = tmp_path / "prm.jsonl"
    bad.write_text(
        '{"question": {"problem": "p"}, "label": {"steps": [{"completions": [{"text": "a", '
        '"rating": 1}], "chosen_completion": 3}]}}\n',
        encoding="utf-8",
    )
    with pytest.raises(DatasetError) as info:
        load_prm800k(bad)
    assert str(info.value) == (
        f"{bad}, line 1, field 'label.steps[0]': chosen_completion 3 is not an index into the 1 completions"
    )
    assert is_prm800k_row({"question": {"problem": "p"}, "label": {"steps": []}})
    assert not is_prm800k_row({"question": "p", "answer": "1"})


def test_cli_auto_on_prm800k_gives_one_clear_line(tmp_path: Path) -> None:
    from tests.cli import run_srdq, tiny_run_args

    path = DATASETS["prm800k_sample"].path
    out = tmp_path / "OUT"
    proc = run_srdq(*tiny_run_args(path, out))
    assert proc.returncode == 1
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"Error: {path} holds PRM800K step labels")
    assert not out.exists()


def test_auto_on_an_unknown_csv_suggests_task_or_field(tmp_path: Path) -> None:
    path = tmp_path / "mine.csv"
    path.write_text("text,label\nhello,1\n", encoding="utf-8")
    with pytest.raises(
        ConfigError,
        match=r"mine\.csv.*fields: label, text\); pass --task with one of: gsm8k, "
        r"math500, gpqa, hotpotqa, alpaca_eval, openai_batch, generic, or --field prompt=COLUMN",
    ):
        detect_task(path)
