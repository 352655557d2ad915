"""Read-only queries behind ``srdq export``, ``report``, ``status`` and ``regrade``.

Like ``crud``, every function takes the session as a keyword argument. The export and report reads
select only the columns they need, so a database at an older schema (an old ``srdq-out/srdq.db``) can
still be exported and reported.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any, cast

from sqlalchemy import and_, func, or_
from sqlmodel import Session, col, select

from srd_worker.errors import StoreError
from srd_worker.store.models import Checkpoint, ItemRow, Result, Run, Shard, Status


def require_run(*, session: Session, run_id: str) -> None:
    """``StoreError`` unless the run exists (reads only its id)."""
    if session.exec(select(Run.id).where(Run.id == run_id)).first() is None:
        raise StoreError(f"no run {run_id!r} in the database")


def run_exists(*, session: Session, run_id: str) -> bool:
    return session.get(Run, run_id) is not None


def items_with_records(*, session: Session, run_id: str) -> list[tuple[int, str, int, str, str, Any]]:
    """(position, item_key, shard_index, question, gold, record or None) per item, in dataset order."""
    return list(
        session.exec(
            select(  # type: ignore[call-overload]  # SQLModel types select() for at most 4 columns
                col(ItemRow.position),
                col(ItemRow.item_key),
                col(ItemRow.shard_index),
                col(ItemRow.question),
                col(ItemRow.gold),
                col(Result.record),
            )
            .select_from(ItemRow)
            .outerjoin(Result, col(Result.item_id) == col(ItemRow.id))
            .where(ItemRow.run_id == run_id)
            .order_by(col(ItemRow.position))
        ).all()
    )


def run_header(*, session: Session, run_id: str) -> tuple[str, str, dict, str, int, datetime, datetime]:
    """(id, name, spec, status, n_items, created_at, updated_at) of the run; ``StoreError`` if none."""
    row = session.exec(
        select(  # type: ignore[call-overload]  # SQLModel types select() for at most 4 columns
            col(Run.id),
            col(Run.name),
            col(Run.spec),
            col(Run.status),
            col(Run.n_items),
            col(Run.created_at),
            col(Run.updated_at),
        ).where(Run.id == run_id)
    ).first()
    if row is None:
        raise StoreError(f"no run {run_id!r} in the database")
    return tuple(row)


def result_rows(*, session: Session, run_id: str) -> list[tuple[int, int, str | None, dict[str, Any]]]:
    """(item row id, shard_index, error, record) of every result of the run."""
    return list(
        session.exec(
            select(col(Result.item_id), col(Result.shard_index), col(Result.error), col(Result.record)).where(
                Result.run_id == run_id
            )
        ).all()
    )


def checkpoint_states(*, session: Session, run_id: str) -> list[tuple[int, dict[str, Any]]]:
    """(item row id, state) of every checkpoint of the run."""
    return list(
        session.exec(
            select(col(Checkpoint.item_id), col(Checkpoint.state)).where(Checkpoint.run_id == run_id)
        ).all()
    )


def results_by_position(*, session: Session, run_id: str) -> list[tuple[int, int, dict[str, Any]]]:
    """(result id, item row id, record copy) of every result of the run, in dataset order."""
    rows = session.exec(select(Result).where(Result.run_id == run_id).order_by(col(Result.position)))
    # r.id is a primary key read back from the database: never None (None only before an insert).
    return [(cast(int, r.id), r.item_id, dict(r.record)) for r in rows]


def recent_runs(*, session: Session, limit: int = 20) -> list[Run]:
    """The ``limit`` newest runs, newest first."""
    return list(session.exec(select(Run).order_by(col(Run.created_at).desc()).limit(limit)).all())


# ------------------------------------------------------------------------------- status at scale
def shard_states(*, session: Session, run_id: str) -> dict[str, tuple[int, int, int, int]]:
    """state -> (shards, items done, items failed, generated tokens), summed over the run's shards in SQL
    (the counters ``crud.save_results`` keeps; the (run_id, status) index)."""
    rows = session.exec(
        select(  # type: ignore[call-overload]  # SQLModel types select() for at most 4 columns
            col(Shard.status),
            func.count(),
            func.coalesce(func.sum(Shard.n_done), 0),
            func.coalesce(func.sum(Shard.n_failed), 0),
            func.coalesce(func.sum(Shard.gen_tokens), 0),
        )
        .where(Shard.run_id == run_id)
        .group_by(Shard.status)
    ).all()
    return {status: (int(n), int(done), int(failed), int(tokens)) for status, n, done, failed, tokens in rows}


def finish_timeline(
    *, session: Session, run_id: str, since: datetime | None, limit: int = 1000
) -> list[tuple[datetime, int, int]]:
    """(finished at, items, generated tokens) of the run's finished shards that hold results, finished at
    or after ``since``, oldest first: the newest ``limit`` (a shard's ``updated_at`` is its finish time
    once it is done; an upload mark leaves it as it was)."""
    conditions = [
        col(Shard.run_id) == run_id,
        col(Shard.status).in_([Status.DONE.value, Status.FAILED.value]),
        col(Shard.n_done) + col(Shard.n_failed) > 0,
    ]
    if since is not None:
        conditions.append(col(Shard.updated_at) >= since)
    rows = session.exec(
        select(Shard.updated_at, col(Shard.n_done) + col(Shard.n_failed), Shard.gen_tokens)
        .where(*conditions)
        .order_by(col(Shard.updated_at).desc())
        .limit(limit)
    ).all()
    return [(at, int(items), int(tokens)) for at, items, tokens in reversed(rows)]


def _in_flight(run_id: str) -> tuple[Any, ...]:
    """The conditions of a run's shards that are started and not done (a few at a time, however large
    the run): the shards whose items ``unfinished_tokens`` and ``unfinished_items`` read."""
    return (col(Shard.run_id) == run_id, col(Shard.status) != Status.DONE.value, col(Shard.round) > 0)


def unfinished_tokens(*, session: Session, run_id: str) -> int:
    """Generated tokens so far of items that have no result yet: their last checkpoints, read only in the
    shards that are started and not done (``_in_flight``)."""
    started = select(Shard.index).where(*_in_flight(run_id))
    has_result = select(Result.id).where(col(Result.item_id) == col(Checkpoint.item_id)).exists()
    tokens = func.sum(Checkpoint.gen_tokens)  # its own column: the state's JSON may hold any model text
    total = session.exec(
        select(func.coalesce(tokens, 0)).where(
            Checkpoint.run_id == run_id, col(Checkpoint.shard_index).in_(started), ~has_result
        )
    ).one()
    return int(total or 0)


def unfinished_items(*, session: Session, run_id: str) -> int:
    """Items with no result yet in the shards ``unfinished_tokens`` reads (started, not done): the items
    whose tokens it sums, so the two give the work in flight."""
    left = col(Shard.stop) - col(Shard.start) - col(Shard.n_done) - col(Shard.n_failed)
    total = session.exec(select(func.coalesce(func.sum(left), 0)).where(*_in_flight(run_id))).one()
    return int(total or 0)


def run_tokens(*, session: Session, run_id: str) -> int:
    """Generated tokens of the whole run so far: its shards' counters (finished items) plus the last
    checkpoints of items still under way (``unfinished_tokens``)."""
    finished = session.exec(
        select(func.coalesce(func.sum(Shard.gen_tokens), 0)).where(Shard.run_id == run_id)
    ).one()
    return int(finished or 0) + unfinished_tokens(session=session, run_id=run_id)


def notable_condition() -> Any:
    """The shards ``srdq status`` lists without ``--all``: running, failed, and slow ones (pending again
    after an attempt crashed or raised: ``attempt`` > 0 or an error kept)."""
    retrying = and_(
        col(Shard.status) == Status.PENDING.value, or_(col(Shard.attempt) > 0, col(Shard.error).is_not(None))
    )
    return or_(col(Shard.status).in_([Status.RUNNING.value, Status.FAILED.value]), retrying)


def last_saved(*, session: Session, run_id: str, shard_indices: list[int]) -> dict[int, datetime]:
    """When each of these shards last wrote a checkpoint (its items' latest), by shard index; a shard with
    no checkpoint yet is absent. One grouped query over the checkpoint index (run_id, shard_index)."""
    if not shard_indices:
        return {}
    rows = session.exec(
        select(col(Checkpoint.shard_index), func.max(Checkpoint.updated_at))
        .where(Checkpoint.run_id == run_id, col(Checkpoint.shard_index).in_(shard_indices))
        .group_by(col(Checkpoint.shard_index))
    ).all()
    return {int(index): when for index, when in rows if when is not None}


def list_status_shards(
    *, session: Session, run_id: str, everything: bool = False, limit: int | None = None
) -> tuple[list[Shard], int]:
    """(shards by index, how many match): every shard with ``everything``, else the notable ones
    (``notable_condition``), at most ``limit`` of them."""
    where = [Shard.run_id == run_id] + ([] if everything else [notable_condition()])
    total = session.exec(select(func.count()).select_from(Shard).where(*where)).one()
    query = select(Shard).where(*where).order_by(col(Shard.index))
    if limit is not None:
        query = query.limit(limit)
    return list(session.exec(query).all()), int(total)
