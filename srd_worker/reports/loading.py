"""Runs read back from the store for a report: ``RunRecords`` with records in dataset order."""

from __future__ import annotations

from sqlalchemy import Engine

from srd_worker.reports.rows import RunRecords
from srd_worker.store import crud, queries
from srd_worker.store.db import session_scope
from srd_worker.store.models import Status


def load_report_runs(db: Engine, run_ids: list[str]) -> list[RunRecords]:
    """``RunRecords`` for each run id, records in dataset order."""
    out = []
    with session_scope(db) as session:
        for run_id in run_ids:
            _, name, spec, status, n_items, created_at, updated_at = queries.run_header(
                session=session, run_id=run_id
            )
            records = crud.load_results(session=session, run_id=run_id)
            finished = status in (Status.DONE.value, Status.FAILED.value, Status.CANCELLED.value)
            out.append(
                RunRecords(
                    run_id=run_id,
                    name=name,
                    spec=dict(spec or {}),
                    status=status,
                    n_items=n_items,
                    wall_s=(updated_at - created_at).total_seconds() if finished else None,
                    records=records,
                    versions=dict(crud.get_run(session=session, run_id=run_id).versions or {}),
                )
            )
    return out
