"""Re-grade a run's stored responses with the current grader, without generating anything again.

For every result of the run that has a response, the run's task (rebuilt from the stored spec, with its
``--field`` mapping) extracts the answer and grades it again from the stored item (question, gold, meta);
the result row's ``correct`` and ``error`` columns and its record's ``answer``, ``correct``, ``metrics``
and ``grader_version`` are updated in one transaction. A result that failed in grading before and grades
now loses its error (and traceback); one whose grading fails now gets the new error, as the runner would
record it. Results without a response (the item failed before grading: prompt too long, generation
error) are left as they are. Regrading twice with the same grader changes nothing the second time.

The store's schema is not changed: grader versions live in the result records. Left out: regrading a run
whose items are still being generated (results written meanwhile are simply not included; run it again),
and switching a run to another task.
"""

from __future__ import annotations

import traceback
from collections import Counter
from dataclasses import asdict, dataclass, field
from typing import Any

from sqlalchemy import Engine, update
from sqlmodel import col, select

from srd_worker.store import crud
from srd_worker.store.db import session_scope
from srd_worker.store.models import Result
from srd_worker.tasks.base import Item, Task


@dataclass
class RegradeReport:
    run_id: str
    task: str
    grader_version: str
    results: int = 0
    regraded: int = 0
    skipped: int = 0
    changed: int = 0
    errors: int = 0
    previous_versions: dict[str, int] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def summary_line(self) -> str:
        before = ", ".join(f"{v} ({n})" for v, n in sorted(self.previous_versions.items())) or "none"
        return (
            f"regraded {self.run_id} (task {self.task}, grader {self.grader_version}; before: {before}): "
            f"{self.regraded} of {self.results} results regraded, {self.changed} changed, "
            f"{self.skipped} without a response skipped, {self.errors} grader errors"
        )


def regrade_record(task: Task, item: Item, record: dict[str, Any]) -> dict[str, Any]:
    """A copy of ``record`` graded again by ``task`` (as ``runner.build_record`` grades); ``record`` must
    have a response."""
    new = dict(record)
    new["extra"] = dict(record.get("extra") or {})
    new["grader_version"] = task.grader_version
    response = record["response"]
    try:
        new["answer"] = task.extract_answer(response)
        graded = task.grade(response, item)
        new["correct"] = None if graded is None else bool(graded)
        new["metrics"] = task.metrics(response, item)
        new["error"] = None
        new["extra"].pop("traceback", None)
    except Exception as exc:  # one item's grading failure must not stop the regrade
        new["error"] = f"{type(exc).__name__}: {exc}"
        new["correct"] = None
        new["extra"]["traceback"] = traceback.format_exc(limit=3)
    return new


def regrade(engine: Engine, run_id: str, *, task: Task | None = None) -> RegradeReport:
    """Re-grade every stored response of ``run_id``; ``StoreError`` if there is no such run.

    ``task`` defaults to the run's own task, rebuilt from its stored spec (name and field mapping).
    """
    from srd_worker.tasks.registry import get_task

    with session_scope(engine) as session:
        run = crud.get_run(session=session, run_id=run_id)
        spec = dict(run.spec)
        rows = {row.id: row for row in crud.list_items(session=session, run_id=run_id)}
        results = [
            (r.id, r.item_id, dict(r.record))
            for r in session.exec(
                select(Result).where(Result.run_id == run_id).order_by(col(Result.position))
            )
        ]
    task = task or get_task(spec["task"], fields=spec.get("fields") or {})
    report = RegradeReport(
        run_id=run_id, task=task.name, grader_version=task.grader_version, results=len(results)
    )
    before: Counter[str] = Counter()
    updates: list[tuple[int, dict[str, Any]]] = []
    for result_id, item_row_id, record in results:
        before[str(record.get("grader_version") or "unrecorded")] += 1
        if record.get("response") is None:
            report.skipped += 1
            continue
        row = rows[item_row_id]
        item = Item(id=row.item_key, question=row.question, gold=row.gold, meta=dict(row.meta or {}))
        new = regrade_record(task, item, record)
        report.regraded += 1
        report.errors += new["error"] is not None
        if (new.get("answer"), new.get("correct"), new.get("error")) != (
            record.get("answer"),
            record.get("correct"),
            record.get("error"),
        ):
            report.changed += 1
        updates.append((result_id, new))
    report.previous_versions = dict(before)
    with session_scope(engine) as session:
        for result_id, new in updates:
            session.exec(
                update(Result)
                .where(col(Result.id) == result_id)
                .values(record=new, correct=new["correct"], error=new["error"])
            )
    return report
