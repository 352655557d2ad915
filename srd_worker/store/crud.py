"""Store operations on runs, shards, items, checkpoints and results.

Every function takes the session as a keyword argument and works inside the caller's transaction: it
flushes but never commits (use ``db.session_scope``). Writes are idempotent through unique keys: a run
id is created once, a checkpoint is one row per item (upserted), a result is inserted at most once per
item (a redelivered task never writes a second one). Checkpoint writes can be fenced by the shard's
``version`` so a worker whose lease was taken over cannot overwrite the new holder's state.
"""

from __future__ import annotations

import csv
import io
import json
import zlib
from collections import Counter
from collections.abc import Iterable, Iterator
from typing import Any, Protocol, cast

from sqlalchemy import func, insert, update
from sqlalchemy.dialects import postgresql, sqlite
from sqlmodel import Session, SQLModel, col, select

from srd_worker.errors import StoreError
from srd_worker.store import queries
from srd_worker.store.models import (
    Checkpoint,
    CheckpointRound,
    ItemRow,
    Result,
    Run,
    Shard,
    Status,
    SweepRow,
    utcnow,
)


class ItemLike(Protocol):
    """What ``create_run`` needs of a dataset item (``srd_worker.tasks.base.Item`` fits)."""

    @property
    def id(self) -> str: ...
    @property
    def question(self) -> str: ...
    @property
    def gold(self) -> str: ...
    @property
    def meta(self) -> dict[str, Any]: ...


class ItemsLike(Protocol):
    """What ``insert_run`` takes as its items: a sized iterable of ``ItemLike`` (a sequence of them, or an
    ``srd_worker.tasks.spool.ItemSpool``)."""

    def __len__(self) -> int: ...
    def __iter__(self) -> Iterator[ItemLike]: ...


def _dialect_insert(session: Session, model: type[SQLModel]) -> Any:
    """``INSERT`` with ``ON CONFLICT`` support for the session's database."""
    name = session.get_bind().dialect.name
    if name == "postgresql":
        return postgresql.insert(model)
    if name == "sqlite":
        return sqlite.insert(model)
    raise StoreError(f"unsupported database {name!r}: the store needs PostgreSQL or SQLite")


def _status(status: str) -> str:
    try:
        return Status(status).value
    except ValueError:
        allowed = ", ".join(s.value for s in Status)
        raise StoreError(f"unknown status {status!r} (expected one of: {allowed})") from None


#: Items per bulk insert (one COPY or one executemany): what ``create_run`` holds in memory at a time.
INSERT_BATCH = 5000


def create_run(**kwargs: Any) -> Run:
    """``insert_run`` without the flag: the run, new or existing."""
    return insert_run(**kwargs)[0]


def insert_run(
    *,
    session: Session,
    run_id: str,
    name: str,
    spec: dict[str, Any],
    config_hash: str,
    versions: dict[str, Any],
    items: ItemsLike,
    shard_size: int,
    sweep_id: str | None = None,
    queue: str | None = None,
) -> tuple[Run, bool]:
    """Create a run with its shards and items; if ``run_id`` exists, return that run and create nothing
    (except that an existing run outside any sweep is tagged with ``sweep_id``). The flag says whether
    this call inserted it: decided by the insert itself, so of two racing calls exactly one is told so.

    Items keep their order (``position``); shard ``i`` covers positions ``[i*shard_size,
    min((i+1)*shard_size, len(items)))``. ``items`` is a sequence of ``ItemLike`` or an
    ``srd_worker.tasks.spool.ItemSpool`` (validated on disk, ids already unique); either way they are
    inserted ``INSERT_BATCH`` at a time (PostgreSQL: ``COPY``), so memory does not grow with the run.
    """
    if shard_size < 1:
        raise StoreError(f"shard_size must be at least 1, got {shard_size}")
    n_items = len(items)
    if not n_items:
        raise StoreError(f"run {run_id!r} has no items")
    if not getattr(items, "ids_unique", False):
        dupes = sorted(key for key, count in Counter(item.id for item in items).items() if count > 1)
        if dupes:
            raise StoreError(f"run {run_id!r}: duplicate item ids {dupes[:5]}")

    n_shards = -(-n_items // shard_size)
    run = Run(
        id=run_id,
        name=name,
        spec=spec,
        config_hash=config_hash,
        versions=versions,
        n_items=n_items,
        n_shards=n_shards,
        sweep_id=sweep_id,
        queue=queue,
    )
    # Insert-or-nothing on the primary key, not read-then-write: two processes creating the same run at
    # once both succeed and exactly one of them writes the shards and items.
    inserted = session.exec(
        _dialect_insert(session, Run).values(**run.model_dump()).on_conflict_do_nothing(index_elements=["id"])
    ).rowcount
    if inserted:
        template = Shard(run_id=run_id, index=0, start=0, stop=0).model_dump(exclude={"id"})
        for first in range(0, n_shards, INSERT_BATCH):
            session.exec(
                insert(Shard),
                params=[
                    {
                        **template,
                        "index": i,
                        "start": i * shard_size,
                        "stop": min((i + 1) * shard_size, n_items),
                    }
                    for i in range(first, min(first + INSERT_BATCH, n_shards))
                ],
            )
        for batch in _item_batches(items):
            _insert_items(session, run_id, shard_size, batch)
    elif sweep_id is not None:
        session.exec(
            update(Run).where(col(Run.id) == run_id, col(Run.sweep_id).is_(None)).values(sweep_id=sweep_id)
        )
    return get_run(session=session, run_id=run_id), bool(inserted)


def _item_batches(items: Any) -> Iterator[list[tuple[int, str, str, str, str]]]:
    """(position, item_key, question, gold, meta as JSON text) rows, ``INSERT_BATCH`` at a time."""
    batches = getattr(items, "batches", None)
    if callable(batches):  # an ItemSpool: rows come encoded already
        yield from batches(INSERT_BATCH)
        return
    batch: list[tuple[int, str, str, str, str]] = []
    for pos, item in enumerate(items):
        batch.append((pos, item.id, item.question, item.gold, json.dumps(dict(item.meta))))
        if len(batch) == INSERT_BATCH:
            yield batch
            batch = []
    if batch:
        yield batch


_ITEM_COLUMNS = ("run_id", "shard_index", "position", "item_key", "question", "gold", "meta")


def _insert_items(
    session: Session, run_id: str, shard_size: int, batch: list[tuple[int, str, str, str, str]]
) -> None:
    """Insert one batch of items in the session's transaction: ``COPY ... FROM STDIN`` on PostgreSQL
    (psycopg2), an ``executemany`` elsewhere."""
    if session.get_bind().dialect.name == "postgresql":
        buf = io.StringIO()
        writer = csv.writer(buf, quoting=csv.QUOTE_ALL, lineterminator="\n")  # quoted: "" is not NULL
        for pos, key, question, gold, meta in batch:
            writer.writerow((run_id, pos // shard_size, pos, key, question, gold, meta))
        buf.seek(0)
        dbapi = session.connection().connection.dbapi_connection  # None only once the connection closed
        if dbapi is None:
            raise RuntimeError("the database connection closed during the item COPY")
        cursor = dbapi.cursor()
        try:
            cursor.copy_expert(f"COPY item ({', '.join(_ITEM_COLUMNS)}) FROM STDIN WITH (FORMAT csv)", buf)
        finally:
            cursor.close()
        return
    session.exec(
        insert(ItemRow),
        params=[
            {
                "run_id": run_id,
                "shard_index": pos // shard_size,
                "position": pos,
                "item_key": key,
                "question": question,
                "gold": gold,
                "meta": json.loads(meta),
            }
            for pos, key, question, gold, meta in batch
        ],
    )


def create_sweep(*, session: Session, sweep_id: str, name: str, content: str, run_ids: list[str]) -> SweepRow:
    """Record a sweep; if ``sweep_id`` exists, return that sweep and write nothing."""
    if not run_ids:
        raise StoreError(f"sweep {sweep_id!r} has no runs")
    row = SweepRow(id=sweep_id, name=name, content=content, run_ids=list(run_ids))
    session.exec(
        _dialect_insert(session, SweepRow)
        .values(**row.model_dump())
        .on_conflict_do_nothing(index_elements=["id"])
    )
    return get_sweep(session=session, sweep_id=sweep_id)


def get_sweep(*, session: Session, sweep_id: str) -> SweepRow:
    """The sweep ``sweep_id``; ``StoreError`` if there is none."""
    sweep = session.get(SweepRow, sweep_id, populate_existing=True)
    if sweep is None:
        raise StoreError(f"no sweep {sweep_id!r} in the database")
    return sweep


def sweep_runs(*, session: Session, sweep_id: str) -> list[Run]:
    """The sweep's runs in expansion order (runs not stored yet are left out)."""
    ids = get_sweep(session=session, sweep_id=sweep_id).run_ids
    rows = {r.id: r for r in session.exec(select(Run).where(col(Run.id).in_(ids)))}
    return [rows[i] for i in ids if i in rows]


def get_run(*, session: Session, run_id: str) -> Run:
    """The run ``run_id``; ``StoreError`` if there is none."""
    run = session.get(Run, run_id, populate_existing=True)
    if run is None:
        raise StoreError(f"no run {run_id!r}")
    return run


def list_shards(*, session: Session, run_id: str) -> list[Shard]:
    """The run's shards, by index."""
    query = select(Shard).where(Shard.run_id == run_id).order_by(col(Shard.index))
    return list(session.exec(query, execution_options={"populate_existing": True}))


def _get_shard(session: Session, run_id: str, shard_index: int) -> Shard:
    shard = session.exec(
        select(Shard).where(Shard.run_id == run_id, Shard.index == shard_index),
        execution_options={"populate_existing": True},
    ).one_or_none()
    if shard is None:
        raise StoreError(f"no shard {shard_index} in run {run_id!r}")
    return shard


def list_items(*, session: Session, run_id: str, shard_index: int | None = None) -> list[ItemRow]:
    """The run's items (or one shard's), in dataset order."""
    query = select(ItemRow).where(ItemRow.run_id == run_id)
    if shard_index is not None:
        query = query.where(ItemRow.shard_index == shard_index)
    return list(session.exec(query.order_by(col(ItemRow.position))))


def _item_rows(session: Session, run_id: str, keys: Iterable[str]) -> dict[str, tuple[int, int, int]]:
    """item_key -> (item.id, shard_index, position) for the given keys; ``StoreError`` if one is unknown."""
    wanted = set(keys)
    rows = session.exec(
        select(ItemRow.item_key, ItemRow.id, ItemRow.shard_index, ItemRow.position).where(
            ItemRow.run_id == run_id, col(ItemRow.item_key).in_(wanted)
        )
    ).all()
    # item.id is a primary key read back from the database: never None (None only before an insert).
    found = {key: (cast(int, item_id), shard_index, position) for key, item_id, shard_index, position in rows}
    missing = sorted(wanted - found.keys())
    if missing:
        raise StoreError(f"run {run_id!r} has no items {missing[:5]}")
    return found


def load_checkpoints(
    *, session: Session, run_id: str, shard_index: int
) -> dict[str, tuple[int, dict[str, Any]]]:
    """item_key -> (round, state) of every checkpointed item of the shard."""
    rows = session.exec(
        select(col(ItemRow.item_key), col(Checkpoint.round), col(Checkpoint.state))
        .select_from(Checkpoint)
        .join(ItemRow, col(ItemRow.id) == col(Checkpoint.item_id))
        .where(Checkpoint.run_id == run_id, Checkpoint.shard_index == shard_index)
    ).all()
    return {key: (round_, state) for key, round_, state in rows}


def save_checkpoints(
    *,
    session: Session,
    run_id: str,
    shard_index: int,
    round: int,
    states: dict[str, dict[str, Any]],
    expected_version: int | None = None,
    snapshot: bool = False,
) -> None:
    """Upsert the state of every item in ``states`` (item_key -> state) and set the shard's round; with
    ``snapshot``, also keep each state as this round's snapshot (``checkpoint_round``, for ``srdq fork``).

    With ``expected_version``, the write is fenced: ``StoreError`` and nothing written unless the shard's
    version still equals it. The shard row is updated first, so on PostgreSQL its row lock keeps a
    concurrent lease takeover (which bumps the version) waiting until this transaction ends.
    """
    # Refuse bad input before writing anything, so a StoreError never leaves a half-done write behind.
    rows = _item_rows(session, run_id, states) if states else {}
    strays = sorted(key for key, (_, index, _) in rows.items() if index != shard_index)
    if strays:
        raise StoreError(f"items {strays[:5]} of run {run_id!r} are not in shard {shard_index}")
    conditions = [col(Shard.run_id) == run_id, col(Shard.index) == shard_index]
    if expected_version is None:
        version = _get_shard(session, run_id, shard_index).version
    else:
        conditions.append(col(Shard.version) == expected_version)
        version = expected_version
    updated = session.exec(update(Shard).where(*conditions).values(round=round, updated_at=utcnow())).rowcount
    if updated != 1:
        shard = _get_shard(session, run_id, shard_index)
        raise StoreError(
            f"shard {shard_index} of run {run_id!r} is at version {shard.version}, not {expected_version}: "
            "its lease was taken over; checkpoint not written"
        )
    if not states:
        return
    now = utcnow()
    stmt = _dialect_insert(session, Checkpoint)
    stmt = stmt.on_conflict_do_update(
        index_elements=["item_id"],
        set_={
            "round": stmt.excluded.round,
            "state": stmt.excluded.state,
            "gen_tokens": stmt.excluded.gen_tokens,
            "version": stmt.excluded.version,
            "updated_at": stmt.excluded.updated_at,
        },
    )
    session.exec(
        stmt,
        params=[
            {
                "item_id": rows[key][0],
                "run_id": run_id,
                "shard_index": shard_index,
                "round": round,
                "state": state,
                "gen_tokens": record_gen_tokens(state),  # its own column: SQL never reads the text
                "version": version,
                "updated_at": now,
            }
            for key, state in states.items()
        ],
    )
    if snapshot:
        snap = _dialect_insert(session, CheckpointRound)
        # a round written again (a slice redone after its lease was taken over) replaces its snapshot
        snap = snap.on_conflict_do_update(
            index_elements=["item_id", "round"], set_={"state_z": snap.excluded.state_z}
        )
        session.exec(
            snap,
            params=[
                {
                    "item_id": rows[key][0],
                    "run_id": run_id,
                    "shard_index": shard_index,
                    "round": round,
                    "state_z": pack_state(state),
                }
                for key, state in states.items()
            ],
        )


def pack_state(state: dict[str, Any]) -> bytes:
    """A state as stored in ``checkpoint_round``: compact JSON (NaN kept), zlib-compressed."""
    return zlib.compress(json.dumps(state, separators=(",", ":"), allow_nan=True).encode("utf-8"), 6)


def unpack_state(blob: bytes) -> dict[str, Any]:
    """The inverse of ``pack_state``."""
    return cast(dict[str, Any], json.loads(zlib.decompress(blob).decode("utf-8")))


def save_results(*, session: Session, run_id: str, shard_index: int, records: list[dict[str, Any]]) -> int:
    """Insert one result per record unless the item already has one; returns how many were inserted.

    Each record needs ``item_id`` (the item_key), ``position``, ``correct`` and ``error``; it is stored
    whole. A record for an item outside the shard, or with a position that is not the item's, is refused.
    """
    if not records:
        return 0
    for field in ("item_id", "position", "correct", "error"):
        lacking = [i for i, record in enumerate(records) if field not in record]
        if lacking:
            raise StoreError(f"result records {lacking[:5]} lack field {field!r}")
    keys = [record["item_id"] for record in records]
    if len(set(keys)) != len(keys):
        raise StoreError(f"duplicate item ids among results for shard {shard_index} of run {run_id!r}")
    rows = _item_rows(session, run_id, keys)
    for record in records:
        _, index, position = rows[record["item_id"]]
        if index != shard_index or position != record["position"]:
            raise StoreError(
                f"result for item {record['item_id']!r} says shard {shard_index}, position "
                f"{record['position']}; the item is at shard {index}, position {position}"
            )
    now = utcnow()
    stmt = _dialect_insert(session, Result).on_conflict_do_nothing(index_elements=["item_id"])
    inserted = done = failed = tokens = 0
    # One statement per record: rowcount is exact per row on both backends (executemany's is not on
    # psycopg2), and a shard holds at most a few hundred items.
    for record in records:
        n = session.exec(
            stmt.values(
                item_id=rows[record["item_id"]][0],
                run_id=run_id,
                shard_index=shard_index,
                position=record["position"],
                record=record,
                correct=record["correct"],
                error=record["error"],
                created_at=now,
            )
        ).rowcount
        if n:  # counted once, like the row: a redelivered result adds nothing
            inserted += n
            failed += record["error"] is not None
            done += record["error"] is None
            tokens += record_gen_tokens(record)
    if inserted:  # the shard's counters (status reads them instead of every record), same transaction
        session.exec(
            update(Shard)
            .where(col(Shard.run_id) == run_id, col(Shard.index) == shard_index)
            .values(
                n_done=col(Shard.n_done) + done,
                n_failed=col(Shard.n_failed) + failed,
                gen_tokens=col(Shard.gen_tokens) + tokens,
            )
        )
    return inserted


def record_gen_tokens(record: dict[str, Any] | None) -> int:
    """A result record's (or checkpoint state's) generated tokens: ``ledger.gen_tokens``, 0 if absent."""
    return int(((record or {}).get("ledger") or {}).get("gen_tokens", 0) or 0)


def load_results(*, session: Session, run_id: str, shard_index: int | None = None) -> list[dict[str, Any]]:
    """The run's result records (or one shard's), in dataset order."""
    query = select(col(Result.record)).where(Result.run_id == run_id)
    if shard_index is not None:
        query = query.where(Result.shard_index == shard_index)
    return list(session.exec(query.order_by(col(Result.position))))


def update_result_records(*, session: Session, records: dict[int, dict[str, Any]]) -> None:
    """Replace the record (and its ``correct`` and ``error`` columns) of each result id in ``records``."""
    for result_id, record in records.items():
        session.exec(
            update(Result)
            .where(col(Result.id) == result_id)
            .values(record=record, correct=record["correct"], error=record["error"])
        )


def set_shard_status(
    *, session: Session, run_id: str, shard_index: int, status: str, error: str | None = None
) -> None:
    """Set a shard's status and error (``None`` clears it)."""
    updated = session.exec(
        update(Shard)
        .where(col(Shard.run_id) == run_id, col(Shard.index) == shard_index)
        .values(status=_status(status), error=error, updated_at=utcnow())
    ).rowcount
    if updated != 1:
        raise StoreError(f"no shard {shard_index} in run {run_id!r}")


def stop_clock(*, session: Session, run_id: str) -> None:
    """Work on the run stopped (a sitting ended, cleanly or not): status shows no rate and no ETA until
    work starts again (``set_run_status(started=True)`` or the next lease)."""
    _update_run(session, run_id, started_at=None)


def _update_run(session: Session, run_id: str, **values: Any) -> None:
    if session.exec(update(Run).where(col(Run.id) == run_id).values(**values)).rowcount != 1:
        raise StoreError(f"no run {run_id!r}")


def set_run_status(*, session: Session, run_id: str, status: str, started: bool = False) -> None:
    """Set a run's status; ``started``: work (re)starts now (``run.started_at``, the ETA's origin, and
    ``run.started_tokens``, the tokens already made, which the rate leaves out)."""
    now = utcnow()
    values: dict[str, Any] = {"status": _status(status), "updated_at": now}
    if started:
        values["started_at"] = now
        values["started_tokens"] = queries.run_tokens(session=session, run_id=run_id)
    _update_run(session, run_id, **values)


def record_runtime(*, session: Session, run_id: str, record: dict[str, Any]) -> bool:
    """Add ``record`` (what a process ran the run with: engine, model and reward revisions; see
    ``srd_worker.provenance``) to ``run.versions["runtime"]`` unless an equal record is there. Locks the
    run row on PostgreSQL so two workers never drop each other's record. True when it was added."""
    stmt = select(Run.versions).where(col(Run.id) == run_id)
    if session.get_bind().dialect.name == "postgresql":
        stmt = stmt.with_for_update()
    versions = session.exec(stmt).first()
    if versions is None:
        raise StoreError(f"no run {run_id!r}")
    current = dict(versions or {})
    seen = list(current.get("runtime") or [])
    if record in seen:
        return False
    current["runtime"] = [*seen, record]
    session.exec(update(Run).where(col(Run.id) == run_id).values(versions=current))
    return True


def run_counts(*, session: Session, run_id: str) -> dict[str, int]:
    """``{"items": total, "done": results without error, "failed": results with error}``."""
    items = session.exec(select(func.count()).select_from(ItemRow).where(ItemRow.run_id == run_id)).one()
    done, failed = session.exec(
        select(
            func.count(col(Result.id)).filter(col(Result.error).is_(None)),
            func.count(col(Result.id)).filter(col(Result.error).is_not(None)),
        ).where(Result.run_id == run_id)
    ).one()
    return {"items": items, "done": done, "failed": failed}
