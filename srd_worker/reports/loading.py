"""Runs read back from the store for a report: ``RunRecords`` with records in dataset order.

A record stored before candidates carried their ``vote`` class (2026-12-07) gets it here, from the run's
task (``tasks.base.vote_candidates``), so majority votes over old runs count answers by value as new
runs' do; a task that cannot be rebuilt (a plugin no longer installed) leaves string votes.
"""

from __future__ import annotations

from typing import Any

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
            add_votes(dict(spec or {}), records)
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


def add_votes(spec: dict[str, Any], records: list[dict[str, Any]]) -> None:
    """Set the ``vote`` class of every candidate of the records whose candidates have none."""
    old = [c for r in records if (c := r.get("candidates")) and any("vote" not in x for x in c)]
    if not old:
        return
    from srd_worker.tasks.base import vote_candidates
    from srd_worker.tasks.registry import task_of_spec

    try:
        task: object = task_of_spec(spec)
    except Exception:  # a task that cannot be rebuilt here: votes compare the answer strings
        task = None
    for cands in old:
        vote_candidates(task, cands)
