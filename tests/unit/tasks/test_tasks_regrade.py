"""``srdq regrade``: stored responses graded again with the current grader, without generating; result rows
(``correct``, ``error``) and records (``answer``, ``correct``, ``metrics``, ``grader_version``) updated; a
second regrade changes nothing. Runs on SQLite (the store of ``srdq run``), plus one real ``srdq run`` on a
tiny GPQA CSV followed by ``srdq regrade --out``."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from sqlalchemy import Engine, update
from sqlmodel import col, select

from srd_worker.regrade import regrade
from srd_worker.store import crud
from srd_worker.store.db import make_engine, session_scope, sqlite_url, upgrade
from srd_worker.store.models import Result
from srd_worker.tasks.base import Item
from srd_worker.tasks.grading import GRADER_VERSION
from srd_worker.tasks.hotpotqa import GRADER_VERSION as HOTPOT_VERSION
from tests.unit.tasks.test_tasks_gpqa import write_gpqa_csv

ROOT = Path(__file__).resolve().parents[3]


def _store(
    db_file: Path, run_id: str, spec: dict[str, Any], items: list[Item], records: list[dict[str, Any]]
) -> Engine:
    url = sqlite_url(db_file)
    upgrade(url)
    engine = make_engine(url)
    with session_scope(engine) as session:
        crud.create_run(
            session=session,
            run_id=run_id,
            name="t",
            spec=spec,
            config_hash="h",
            versions={},
            items=items,
            shard_size=len(items),
        )
        crud.save_results(session=session, run_id=run_id, shard_index=0, records=records)
    return engine


def _record(
    item: Item,
    position: int,
    response: str | None,
    correct: bool | None,
    *,
    error: str | None = None,
    answer: str | None = None,
    version: str = "srdq-grader-0",
) -> dict[str, Any]:
    return {
        "item_id": item.id,
        "position": position,
        "question": item.question,
        "gold": item.gold,
        "method": "sampling",
        "response": response,
        "answer": answer,
        "correct": correct,
        "grader_version": version,
        "metrics": {},
        "reward": None,
        "finish_reason": "stop",
        "ledger": None,
        "error": error,
        "extra": {"traceback": "old"} if error else {},
    }


def _rows(engine: Engine, run_id: str) -> list[Result]:
    with session_scope(engine) as session:
        return list(
            session.exec(select(Result).where(Result.run_id == run_id).order_by(col(Result.position)))
        )


GSM_ITEMS = [Item(id=k, question=f"q{k}", gold="5") for k in "abcd"]
GSM_RECORDS = [
    _record(GSM_ITEMS[0], 0, "so \\boxed{5}", False, answer="5"),  # graded wrong by an older grader
    _record(GSM_ITEMS[1], 1, "so \\boxed{7}", True, answer="7"),  # graded right by an older grader
    _record(
        GSM_ITEMS[2], 2, None, None, error="prompt of 9000 tokens does not fit the model context of 2048"
    ),
    _record(GSM_ITEMS[3], 3, "it is 5", None, error="ItemError: the grader subprocess did not start"),
]


def test_regrade_updates_rows_and_records(tmp_path: Path) -> None:
    engine = _store(
        tmp_path / "srdq.db", "run-1", {"task": "gsm8k", "method": "sampling"}, GSM_ITEMS, GSM_RECORDS
    )
    try:
        report = regrade(engine, "run-1")
        assert (report.results, report.regraded, report.skipped, report.changed, report.errors) == (
            4,
            3,
            1,
            3,
            0,
        )
        assert report.previous_versions == {"srdq-grader-0": 4}
        assert report.grader_version == GRADER_VERSION and report.task == "gsm8k"
        rows = _rows(engine, "run-1")
        assert [r.correct for r in rows] == [True, False, None, True]
        assert [r.error is None for r in rows] == [True, True, False, True]
        assert [r.record["grader_version"] for r in rows] == [
            GRADER_VERSION,
            GRADER_VERSION,
            "srdq-grader-0",
            GRADER_VERSION,
        ]
        assert [r.record["answer"] for r in rows] == ["5", "7", None, "5"]
        assert [r.record["correct"] for r in rows] == [True, False, None, True]
        assert rows[3].record["error"] is None and "traceback" not in rows[3].record["extra"]
        assert rows[2].record == GSM_RECORDS[2]  # nothing to grade: untouched
        with session_scope(engine) as session:
            assert crud.run_counts(session=session, run_id="run-1") == {"items": 4, "done": 3, "failed": 1}
        again = regrade(engine, "run-1")
        assert (again.regraded, again.changed) == (3, 0)
        assert again.previous_versions == {GRADER_VERSION: 3, "srdq-grader-0": 1}
    finally:
        engine.dispose()


def test_regrade_rebuilds_generic_task_from_the_spec_fields(tmp_path: Path) -> None:
    items = [Item(id="x", question="2+2?", gold="4")]
    spec = {"task": "generic", "fields": {"prompt": "p", "answer": "a"}, "method": "sampling"}
    engine = _store(tmp_path / "srdq.db", "run-g", spec, items, [_record(items[0], 0, "\\boxed{4}", None)])
    try:
        assert regrade(engine, "run-g").changed == 1
        assert _rows(engine, "run-g")[0].correct is True
    finally:
        engine.dispose()


def test_regrade_grades_candidates_again(tmp_path: Path) -> None:
    """Each candidate with text gets its answer and grade from the current grader; one stored without
    text (keep_candidates=answers) keeps what it had; the report counts the candidate grades changed;
    every candidate gets its vote class (an old record had none)."""
    item = Item(id="c", question="q", gold="5")
    record = _record(item, 0, "so \\boxed{5}", False, answer="5")
    record["candidates"] = [
        {"text": "so \\boxed{5}", "answer": "5", "correct": False, "reward": 0.9},  # old grader: wrong
        {"text": "maybe \\boxed{7}", "answer": None, "correct": True, "reward": 0.1},  # old: no answer
        {"answer": "5", "correct": False, "reward": 0.5},  # no text to grade from
    ]
    engine = _store(tmp_path / "srdq.db", "run-c", {"task": "gsm8k"}, [item], [record])
    try:
        report = regrade(engine, "run-c")
        assert report.candidates_changed == 2
        assert "2 candidate grades changed" in report.summary_line()
        (row,) = _rows(engine, "run-c")
        assert row.record["candidates"] == [
            {"text": "so \\boxed{5}", "answer": "5", "correct": True, "reward": 0.9, "vote": 0},
            {"text": "maybe \\boxed{7}", "answer": "7", "correct": False, "reward": 0.1, "vote": 1},
            {"answer": "5", "correct": False, "reward": 0.5, "vote": 0},
        ]
        assert regrade(engine, "run-c").candidates_changed == 0
    finally:
        engine.dispose()


def test_regrade_records_hotpotqa_metrics(tmp_path: Path) -> None:
    items = [Item(id="h", question="Passages... Question: where?", gold="Greenwich Village, New York City")]
    engine = _store(
        tmp_path / "srdq.db",
        "run-h",
        {"task": "hotpotqa"},
        items,
        [_record(items[0], 0, "\\boxed{Greenwich Village}", None)],
    )
    try:
        regrade(engine, "run-h")
        (row,) = _rows(engine, "run-h")
        assert row.correct is False and row.record["grader_version"] == HOTPOT_VERSION
        assert row.record["metrics"]["f1"] == pytest.approx(4 / 7) and row.record["metrics"]["em"] == 0.0
    finally:
        engine.dispose()


def test_regrade_unknown_run(tmp_path: Path) -> None:
    from srd_worker.errors import StoreError

    engine = _store(tmp_path / "srdq.db", "run-1", {"task": "gsm8k"}, GSM_ITEMS[:1], [])
    try:
        with pytest.raises(StoreError, match="no run 'run-2'"):
            regrade(engine, "run-2")
    finally:
        engine.dispose()


def test_cli_regrade_out_rewrites_local_results(tmp_path: Path) -> None:
    from srdq_cli.main import cli

    out = tmp_path / "OUT"
    out.mkdir()
    _store(
        out / "srdq.db", "run-1", {"task": "gsm8k", "method": "sampling"}, GSM_ITEMS, GSM_RECORDS
    ).dispose()
    (out / "run-1").mkdir()
    (out / "run-1" / "summary.json").write_text(json.dumps({"wall_seconds": 12.5}))
    result = CliRunner().invoke(cli, ["regrade", "run-1", "--out", str(out)])
    assert result.exit_code == 0, result.output
    assert result.output.startswith(
        f"regraded run-1 (task gsm8k, grader {GRADER_VERSION}; before: "
        "srdq-grader-0 (4)): 3 of 4 results regraded, 3 changed"
    )
    records = [json.loads(line) for line in (out / "run-1" / "results.jsonl").read_text().splitlines()]
    assert [r["correct"] for r in records] == [True, False, None, True]
    summary = json.loads((out / "run-1" / "summary.json").read_text())
    assert (summary["correct"], summary["done"], summary["failed"], summary["wall_seconds"]) == (
        2,
        3,
        1,
        12.5,
    )
    missing = CliRunner().invoke(cli, ["regrade", "run-1", "--out", str(tmp_path / "nowhere")])
    assert missing.exit_code == 1 and "no srdq.db" in missing.output
    both = CliRunner().invoke(cli, ["regrade", "run-1", "--out", str(out), "--db", "sqlite://"])
    assert both.exit_code == 2
    unknown = CliRunner().invoke(cli, ["regrade", "run-9", "--db", sqlite_url(out / "srdq.db")])
    assert unknown.exit_code == 1 and unknown.output.strip() == "Error: no run 'run-9'"


@pytest.mark.e2e
def test_srdq_run_then_regrade_end_to_end(tmp_path: Path) -> None:
    """A real run (tiny random model) on a GPQA CSV records the grader version; regrade restores grades."""
    data = write_gpqa_csv(tmp_path / "gpqa.csv", n=3)
    out = tmp_path / "OUT"
    env = {
        **os.environ,
        "SRDQ_DEVICE": "cpu",
        "SRDQ_DTYPE": "float32",
        "PYTHONPATH": os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p),
    }
    srdq = [sys.executable, "-m", "srdq_cli.main"]
    proc = subprocess.run(
        [
            *srdq,
            "run",
            str(data),
            "--method",
            "sampling",
            "--model",
            "tiny-random-llama",
            "--max-new-tokens",
            "6",
            "--out",
            str(out),
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    (results,) = out.glob("run-*/results.jsonl")
    run_id = results.parent.name
    first = [json.loads(line) for line in results.read_text().splitlines()]
    assert [r["grader_version"] for r in first] == ["gpqa-letter-1"] * 3
    assert all(isinstance(r["correct"], bool) for r in first)
    # Pretend an older grader stored these: flip every grade and the version, then regrade.
    engine = make_engine(sqlite_url(out / "srdq.db"))
    try:
        with session_scope(engine) as session:
            for row in session.exec(select(Result).where(Result.run_id == run_id)):
                stale = {
                    **row.record,
                    "correct": not row.record["correct"],
                    "grader_version": "gpqa-letter-0",
                }
                session.exec(
                    update(Result)
                    .where(col(Result.id) == row.id)
                    .values(record=stale, correct=stale["correct"])
                )
    finally:
        engine.dispose()
    proc = subprocess.run(
        [*srdq, "regrade", run_id, "--out", str(out)], capture_output=True, text=True, env=env, timeout=300
    )
    assert proc.returncode == 0, proc.stderr
    assert "3 of 3 results regraded, 3 changed" in proc.stdout
    assert results.read_text().splitlines() == [
        json.dumps({k: v for k, v in r.items() if k != "timing"}, sort_keys=True, ensure_ascii=False)
        for r in first
    ]


def test_tasks_do_not_import_the_store() -> None:
    """Layering: ``srd_worker.tasks`` (regrade included) is pure; the database side is ``srd_worker.regrade``."""
    code = (
        "import pkgutil, sys, importlib, srd_worker.tasks as t\n"
        "for m in pkgutil.iter_modules(t.__path__):\n"
        "    importlib.import_module('srd_worker.tasks.' + m.name)\n"
        "bad = sorted(n for n in sys.modules if n.startswith(('srd_worker.store', 'sqlalchemy', 'sqlmodel')))\n"
        "assert not bad, bad\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert proc.returncode == 0, proc.stderr
