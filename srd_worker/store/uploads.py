"""Store operations behind result uploads (``srd_worker.results.sync``): the upload marks ``shard.uploaded_at``
and ``run.manifest_at``, the rows an upload holds while it writes, and the runs with uploads pending.

Like ``crud``, every function takes the session as a keyword argument and works inside the caller's
transaction. Two processes never upload the same shard at once on PostgreSQL: ``lock_shard`` and
``lock_run`` take the row ``FOR UPDATE`` (``SKIP LOCKED`` unless ``wait``) for the rest of the caller's
transaction; SQLite serialises writers itself. Setting a mark leaves ``updated_at`` as it was, so a
run's wall time (``updated_at - created_at``) does not grow because its results were synced later.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import update
from sqlmodel import Session, col, select

from srd_worker.errors import StoreError
from srd_worker.store.models import Result, Run, Shard, Status, utcnow


def _locked(session: Session, stmt: Any, wait: bool) -> Any:
    """``stmt`` with ``FOR UPDATE`` (``SKIP LOCKED`` unless ``wait``) on PostgreSQL."""
    if session.get_bind().dialect.name == "postgresql":
        return stmt.with_for_update(skip_locked=not wait)
    return stmt


def run_meta(*, session: Session, run_id: str) -> tuple[dict[str, Any], dict[str, Any], str]:
    """(spec, versions, config_hash) of the run; ``StoreError`` if there is no such run."""
    row = session.exec(select(Run.spec, Run.versions, Run.config_hash).where(Run.id == run_id)).first()
    if row is None:
        raise StoreError(f"no run {run_id!r} in the database")
    return dict(row[0] or {}), dict(row[1] or {}), row[2]


def shard_records(*, session: Session, run_id: str, shard_index: int) -> list[dict[str, Any]]:
    """The shard's result records as stored, in dataset order."""
    return list(
        session.exec(
            select(col(Result.record))
            .where(Result.run_id == run_id, Result.shard_index == shard_index)
            .order_by(col(Result.position))
        )
    )


def shard_upload_states(*, session: Session, run_id: str) -> list[tuple[int, str, Any]]:
    """(index, status, uploaded_at) of every shard of the run, by index."""
    return list(
        session.exec(
            select(Shard.index, Shard.status, Shard.uploaded_at)
            .where(Shard.run_id == run_id)
            .order_by(col(Shard.index))
        ).all()
    )


def lock_shard(*, session: Session, run_id: str, shard_index: int, wait: bool) -> Shard | None:
    """The shard, its row held until the transaction ends; None while another transaction holds it
    (``wait=False`` on PostgreSQL); ``StoreError`` if there is no such shard."""
    query = select(Shard).where(Shard.run_id == run_id, Shard.index == shard_index)
    shard = session.exec(_locked(session, query, wait)).first()
    if shard is None:
        exists = session.exec(
            select(Shard.id).where(Shard.run_id == run_id, Shard.index == shard_index)
        ).first()
        if exists is None:
            raise StoreError(f"no shard {shard_index} in run {run_id!r}")
    return shard


def lock_run(*, session: Session, run_id: str, wait: bool) -> Run | None:
    """The run, its row held until the transaction ends; None while another transaction holds it;
    ``StoreError`` if there is no such run."""
    run = session.exec(_locked(session, select(Run).where(Run.id == run_id), wait)).first()
    if run is None:
        run_meta(session=session, run_id=run_id)  # raises when the run does not exist
    return run


def mark_shard_uploaded(*, session: Session, shard_id: int) -> None:
    """Set ``uploaded_at`` (``updated_at`` is set to itself so its onupdate does not fire)."""
    session.exec(
        update(Shard)
        .where(col(Shard.id) == shard_id)
        .values(uploaded_at=utcnow(), updated_at=col(Shard.updated_at))
    )


def mark_manifest_written(*, session: Session, run_id: str) -> None:
    """Set ``manifest_at`` (``updated_at`` unchanged)."""
    session.exec(
        update(Run).where(col(Run.id) == run_id).values(manifest_at=utcnow(), updated_at=col(Run.updated_at))
    )


def pending_runs(*, session: Session, limit: int = 50) -> list[str]:
    """Runs with a done shard not uploaded, or done with no run manifest yet (oldest first)."""
    shard_runs = select(Shard.run_id).where(
        Shard.status == Status.DONE.value, col(Shard.uploaded_at).is_(None)
    )
    rows = session.exec(
        select(Run.id)
        .where(
            col(Run.id).in_(shard_runs)
            | ((col(Run.status) == Status.DONE.value) & col(Run.manifest_at).is_(None))
        )
        .order_by(col(Run.created_at))
        .limit(limit)
    ).all()
    return list(rows)
