"""``srdq regrade``: re-grade a run's stored responses in the database with the current grader.

Reads the run's spec, items and results, grades them again with ``tasks.regrade.regrade_results``
(pure), and writes the new records in one transaction. See ``srd_worker.tasks.regrade`` for what is
regraded and what is left as it was.
"""

from __future__ import annotations

from typing import cast

from sqlalchemy import Engine

from srd_worker.store import crud, queries
from srd_worker.store.db import session_scope
from srd_worker.tasks.base import Item, Task
from srd_worker.tasks.regrade import RegradeReport, regrade_results


def regrade(engine: Engine, run_id: str, *, task: Task | None = None) -> RegradeReport:
    """Re-grade every stored response of ``run_id``; ``StoreError`` if there is no such run.

    ``task`` defaults to the run's own task, rebuilt from its stored spec (name and field mapping).
    """
    from srd_worker.tasks.registry import task_of_spec

    with session_scope(engine) as session:
        spec = dict(crud.get_run(session=session, run_id=run_id).spec)
        # row.id is a primary key read back from the database: never None (None only before an insert).
        items = {
            cast(int, row.id): Item(
                id=row.item_key, question=row.question, gold=row.gold, meta=dict(row.meta or {})
            )
            for row in crud.list_items(session=session, run_id=run_id)
        }
        results = queries.results_by_position(session=session, run_id=run_id)
    task = task or task_of_spec(spec)
    report, updates = regrade_results(task, run_id, items, results)
    with session_scope(engine) as session:
        crud.update_result_records(session=session, records=updates)
    return report
