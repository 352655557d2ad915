"""benchmarks/speculative.py --qwen-work: a finished configuration's row is kept on disk and read back
instead of being run again, a folder measured with other settings is refused, and the table's header says
when its rows come from more than one start."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT))

from benchmarks import speculative  # noqa: E402

SETTINGS = {"qwen": 2, "qwen_calibration": 1, "qwen_max_new_tokens": 4, "gamma": 4, "percentile": "80"}


def _configs():
    common = {"max_new_tokens": 4, "chunk_tokens": 4}
    return [
        ("greedy", "target only (greedy)", "sampling", {**common, "temperature": 0}),
        ("sampled", "target only (T 0.8)", "sampling", common),
    ]


def test_rows_are_kept_and_read_back_instead_of_run_again(tiny_engine, tmp_path):
    from srd_worker.datasets import resolve_dataset
    from srd_worker.methods.registry import build_method
    from srd_worker.tasks.gsm8k import GSM8KTask

    task = GSM8KTask()
    items = task.load(resolve_dataset("gsm8k"))[:2]
    store = speculative.RowStore(tmp_path / "work", SETTINGS)
    rows, baseline = speculative.run_configs(
        _configs()[:1], build_method, tiny_engine, task, items, store=store
    )
    assert [r["label"] for r in rows] == ["target only (greedy)"]
    assert rows[0]["tokens"] > 0 and rows[0]["start"] == store.start
    assert sorted(p.name for p in (tmp_path / "work").iterdir()) == ["row-0.json", "settings.json"]

    # a second start: row 0 is read back (building a method would mean it ran again), row 1 is run
    built: list[str] = []

    def counting_build(name, params):
        built.append(name)
        return build_method(name, params)

    again = speculative.RowStore(tmp_path / "work", SETTINGS)
    again.start = "a later start"
    rows2, baseline2 = speculative.run_configs(
        _configs(), counting_build, tiny_engine, task, items, store=again
    )
    assert built == ["sampling"]  # only the second configuration ran
    first = rows2[0]
    assert first == rows[0]  # the same row, the Interval rebuilt
    assert first["accuracy"].mean == rows[0]["accuracy"].mean
    assert baseline2["greedy"] is first and rows2[1]["start"] == "a later start"
    note = speculative.starts_note(rows2)
    assert "2 starts" in note and "a later start" in note and store.start in note
    assert speculative.starts_note(rows) == ""
    # the table renders from read-back rows
    assert "target only (greedy)" in speculative.table(rows2, baseline2)


def test_a_folder_measured_with_other_settings_is_refused(tmp_path):
    speculative.RowStore(tmp_path, SETTINGS)
    with pytest.raises(SystemExit, match=r"qwen_max_new_tokens: 4 there, 512 now"):
        speculative.RowStore(tmp_path, {**SETTINGS, "qwen_max_new_tokens": 512})
    speculative.RowStore(tmp_path, dict(SETTINGS))  # the same settings go on


def test_a_row_of_another_configuration_at_the_same_place_is_not_reused(tmp_path):
    from srd_worker.reports.stats import Interval

    store = speculative.RowStore(tmp_path, SETTINGS)
    row = {"label": "a", "group": "g", "accuracy": Interval(0.5, 0.0, 1.0, 2, 1), "tokens": 3}
    store.save_row(0, row)
    assert store.row(0, "a")["accuracy"] == Interval(0.5, 0.0, 1.0, 2, 1)
    assert store.row(0, "b") is None and store.row(1, "a") is None


def test_the_paired_table_compares_each_row_with_its_groups_baseline():
    from srd_worker.reports.stats import Interval

    def row(label, group, correct, responses):
        acc = Interval(sum(correct) / len(correct), 0.0, 1.0, len(correct), 1)
        return {"label": label, "group": group, "accuracy": acc, "correct": correct, "responses": responses}

    base = row("target only (greedy)", "greedy", [1.0, 1.0, 0.0, 0.0], ["a", "b", "c", "d"])
    spec = row("speculative greedy", "greedy", [1.0, 0.0, 1.0, 0.0], ["a", "x", "y", "d"])
    old = {"label": "kept from before", "group": "greedy", "accuracy": base["accuracy"]}
    text = speculative.paired_table([base, spec, old], {"greedy": base})
    lines = text.splitlines()
    assert len(lines) == 3  # header, rule, one row: the baseline and the row without per-problem data skipped
    cells = [c.strip() for c in lines[2].strip("|").split("|")]
    assert cells[:2] == ["speculative greedy", "target only (greedy)"]
    assert cells[2].startswith("+0.0 pts") and cells[3] == "1 / 2 / 1" and cells[4] == "1.000"
    assert cells[5] == "2 / 4"  # problems 1 and 4 got the very same text
    assert speculative.paired_table([old], {"greedy": old}) == ""
