"""The store side of ``srdq fork``: a parent run's per-round states, and a forked run created from them.

Like every store module, the functions take the session as a keyword argument and never commit: the
caller (``srd_worker.fork``) creates a fork in one transaction, so a refusal half-way writes nothing.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import func, insert, literal
from sqlalchemy import select as sql_select
from sqlalchemy.orm import aliased
from sqlmodel import Session, col, select

from srd_worker.store.crud import _dialect_insert, get_run, save_checkpoints, unpack_state
from srd_worker.store.models import Checkpoint, CheckpointRound, ItemRow, Run, Shard, UTCDateTime, utcnow


def round_states(
    *, session: Session, run_id: str, shard_index: int, at_round: int
) -> dict[str, tuple[int, dict[str, Any]]]:
    """item_key -> (round, state) of every item of the shard that has a snapshot at or before
    ``at_round``: its latest one (an item that finished before ``at_round`` keeps its final state)."""
    latest = (
        select(col(CheckpointRound.item_id), func.max(col(CheckpointRound.round)).label("round"))
        .where(
            col(CheckpointRound.run_id) == run_id,
            col(CheckpointRound.shard_index) == shard_index,
            col(CheckpointRound.round) <= at_round,
        )
        .group_by(col(CheckpointRound.item_id))
        .subquery()
    )
    rows = session.exec(
        select(col(ItemRow.item_key), col(CheckpointRound.round), col(CheckpointRound.state_z))
        .select_from(CheckpointRound)
        .join(
            latest,
            (latest.c.item_id == col(CheckpointRound.item_id))
            & (latest.c.round == col(CheckpointRound.round)),
        )
        .join(ItemRow, col(ItemRow.id) == col(CheckpointRound.item_id))
    ).all()
    return {key: (round_, unpack_state(blob)) for key, round_, blob in rows}


def checkpoint_rounds(*, session: Session, run_id: str, shard_index: int) -> dict[str, int]:
    """item_key -> round of the latest checkpoint of every checkpointed item of the shard (no state read)."""
    rows = session.exec(
        select(col(ItemRow.item_key), col(Checkpoint.round))
        .select_from(Checkpoint)
        .join(ItemRow, col(ItemRow.id) == col(Checkpoint.item_id))
        .where(col(Checkpoint.run_id) == run_id, col(Checkpoint.shard_index) == shard_index)
    ).all()
    return dict(rows)


def checkpoint_state(*, session: Session, run_id: str, item_key: str) -> dict[str, Any]:
    """The latest checkpointed state of one item."""
    return session.exec(
        select(col(Checkpoint.state))
        .select_from(Checkpoint)
        .join(ItemRow, col(ItemRow.id) == col(Checkpoint.item_id))
        .where(col(ItemRow.run_id) == run_id, col(ItemRow.item_key) == item_key)
    ).one()


def insert_fork_run(
    *,
    session: Session,
    run_id: str,
    parent_id: str,
    name: str,
    spec: dict[str, Any],
    config_hash: str,
    versions: dict[str, Any],
    at_round: int,
    queue: str | None = None,
) -> tuple[Run, bool]:
    """Create the run ``run_id`` as a copy of ``parent_id``'s shard layout and items (copied in SQL, no
    item passes through Python) and of its snapshots up to ``at_round`` (so the fork can be forked at an
    earlier round in turn); its shards start ``pending`` with no checkpoint (``save_fork_states`` writes
    them). If ``run_id`` exists nothing is written. The flag says whether this call created it."""
    parent = get_run(session=session, run_id=parent_id)
    run = Run(
        id=run_id,
        name=name,
        spec=spec,
        config_hash=config_hash,
        versions=versions,
        n_items=parent.n_items,
        n_shards=parent.n_shards,
        queue=queue,
    )
    inserted = session.exec(
        _dialect_insert(session, Run).values(**run.model_dump()).on_conflict_do_nothing(index_elements=["id"])
    ).rowcount
    if not inserted:
        return get_run(session=session, run_id=run_id), False
    session.exec(
        insert(Shard).from_select(
            ["run_id", "index", "start", "stop", "status", "attempt", "version", "round", "updated_at"],
            sql_select(
                literal(run_id),
                col(Shard.index),
                col(Shard.start),
                col(Shard.stop),
                literal("pending"),
                literal(0),
                literal(0),
                literal(0),
                literal(utcnow(), UTCDateTime()),
            ).where(col(Shard.run_id) == parent_id),
        )
    )
    session.exec(
        insert(ItemRow).from_select(
            ["run_id", "shard_index", "position", "item_key", "question", "gold", "meta"],
            sql_select(
                literal(run_id),
                col(ItemRow.shard_index),
                col(ItemRow.position),
                col(ItemRow.item_key),
                col(ItemRow.question),
                col(ItemRow.gold),
                col(ItemRow.meta),
            ).where(col(ItemRow.run_id) == parent_id),
        )
    )
    parent_item = aliased(ItemRow)
    fork_item = aliased(ItemRow)
    session.exec(
        insert(CheckpointRound).from_select(
            ["item_id", "run_id", "shard_index", "round", "state_z"],
            sql_select(
                col(fork_item.id),
                literal(run_id),
                col(CheckpointRound.shard_index),
                col(CheckpointRound.round),
                col(CheckpointRound.state_z),
            )
            .select_from(CheckpointRound)
            .join(parent_item, col(parent_item.id) == col(CheckpointRound.item_id))
            .join(
                fork_item,
                (col(fork_item.run_id) == run_id) & (col(fork_item.position) == col(parent_item.position)),
            )
            .where(col(CheckpointRound.run_id) == parent_id, col(CheckpointRound.round) <= at_round),
        )
    )
    return get_run(session=session, run_id=run_id), True


def save_fork_states(
    *, session: Session, run_id: str, shard_index: int, round: int, states: dict[str, dict[str, Any]]
) -> None:
    """The forked run's starting checkpoints of one shard (item_key -> state, the parent's states at the
    fork round), with the shard's round set to ``round`` (where its runner goes on from)."""
    save_checkpoints(session=session, run_id=run_id, shard_index=shard_index, round=round, states=states)
