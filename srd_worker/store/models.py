"""All database tables, in one place (SQLModel over SQLAlchemy; see DESIGN.md, Storage).

``sweep`` holds a sweep file (its canonical content and expanded run ids), ``run`` a run's spec and
status (``run.sweep_id``: the sweep that created it, if any), ``shard`` a contiguous row range of its dataset with the lease
and fencing fields the queue uses, ``item`` one dataset row, ``checkpoint`` the latest method state of
one item (one row per item, overwritten), ``checkpoint_round`` the state of one item after one round (the
snapshots ``srdq fork`` starts from; compressed, for rounds up to ``SRDQ_SNAPSHOT_ROUNDS``) and ``result`` the final record of one item (written once).
``score_cache`` holds reward scores by content, shared by every run of the store (``store.score_cache``).
Unique keys make every write idempotent: a redelivered task can never create a second result.

JSON columns use SQLAlchemy's generic ``JSON`` type so the same tables work on SQLite and PostgreSQL.
Timestamps are timezone-aware UTC on both (SQLite stores them without an offset; ``UTCDateTime`` puts
UTC back on read). The Alembic migrations in ``migrations/versions`` must match these classes exactly.
"""

from __future__ import annotations

from datetime import UTC, datetime
from enum import StrEnum
from typing import Any

from sqlalchemy import (
    JSON,
    BigInteger,
    CheckConstraint,
    DateTime,
    Dialect,
    Index,
    LargeBinary,
    Text,
    TypeDecorator,
    UniqueConstraint,
)
from sqlmodel import Field, SQLModel


class Status(StrEnum):
    """Lifecycle of a run and of a shard (stored as plain text, checked by a constraint)."""

    PENDING = "pending"
    RUNNING = "running"
    DONE = "done"
    FAILED = "failed"
    CANCELLED = "cancelled"


#: SQL condition shared by the status check constraints of ``run`` and ``shard``.
STATUS_CHECK = "status IN ('pending', 'running', 'done', 'failed', 'cancelled')"


def utcnow() -> datetime:
    """The current time, timezone-aware, in UTC."""
    return datetime.now(UTC)


class UTCDateTime(TypeDecorator[datetime]):
    """``DateTime(timezone=True)`` that only accepts aware datetimes and always returns UTC ones."""

    impl = DateTime(timezone=True)
    cache_ok = True

    def process_bind_param(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        if value.tzinfo is None:
            raise ValueError(f"naive datetime {value!r}: store timezone-aware datetimes only")
        return value.astimezone(UTC)

    def process_result_value(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        # SQLite keeps no offset: values were converted to UTC on the way in.
        return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)


class Run(SQLModel, table=True):
    """One evaluation run: what to run (spec) and where it stands."""

    __tablename__ = "run"
    __table_args__ = (CheckConstraint(STATUS_CHECK, name="ck_run_status"),)

    id: str = Field(
        primary_key=True, description="Deterministic run id, derived from the spec by the caller."
    )
    name: str = Field(description="Human-readable run name.")
    spec: dict[str, Any] = Field(default_factory=dict, sa_type=JSON, description="The validated run spec.")
    config_hash: str = Field(description="Hash of the spec the run id was derived from.")
    status: str = Field(default=Status.PENDING.value, description="pending|running|done|failed|cancelled.")
    n_items: int = Field(description="Number of dataset items in the run.")
    n_shards: int = Field(description="Number of shards the items were cut into.")
    versions: dict[str, Any] = Field(
        default_factory=dict, sa_type=JSON, description="Package and model versions the run used."
    )
    created_at: datetime = Field(default_factory=utcnow, sa_type=UTCDateTime)
    updated_at: datetime = Field(
        default_factory=utcnow, sa_type=UTCDateTime, sa_column_kwargs={"onupdate": utcnow}
    )
    manifest_at: datetime | None = Field(
        default=None,
        sa_type=UTCDateTime,
        description="When the run manifest was written to the object store.",
    )
    started_at: datetime | None = Field(
        default=None,
        sa_type=UTCDateTime,
        description="When work on the run (re)started: its first lease after submit or `srdq resume` (a call "
        "of the embedded `srdq run`); the origin of `srdq status`'s rate and ETA (migration 0006).",
    )
    started_tokens: int = Field(
        default=0,
        sa_type=BigInteger,
        sa_column_kwargs={"server_default": "0"},
        description="Generated tokens the run already held at `started_at` (finished shards and the "
        "checkpoints of unfinished ones): `srdq status` counts only the tokens made since in its rate "
        "(migration 0009).",
    )
    sweep_id: str | None = Field(
        default=None,
        index=True,
        description="The sweep that first created the run (srdq run/submit --sweep).",
    )
    queue: str | None = Field(
        default=None,
        description="The broker queue the run was submitted to (its shards are re-enqueued there by the "
        "reapers of that queue only); None: an embedded run, or one stored before migration 0005.",
    )


class SweepRow(SQLModel, table=True):
    """One sweep file: its canonical content and the run ids it expands to, in expansion order (a run
    shared by two sweeps is listed by both; ``run.sweep_id`` names the first)."""

    __tablename__ = "sweep"

    id: str = Field(primary_key=True, description="Deterministic sweep id (sweep-<12 hex>).")
    name: str = Field(description="Human-readable sweep name (default: the file's stem).")
    content: str = Field(sa_type=Text, description="The sweep file's canonical content (sorted JSON).")
    run_ids: list[str] = Field(default_factory=list, sa_type=JSON, description="Expanded run ids, in order.")
    created_at: datetime = Field(default_factory=utcnow, sa_type=UTCDateTime)


class Shard(SQLModel, table=True):
    """A contiguous, half-open range ``[start, stop)`` of a run's items: the unit of queue work."""

    __tablename__ = "shard"
    __table_args__ = (
        UniqueConstraint("run_id", "index", name="uq_shard_run_id_index"),
        CheckConstraint(STATUS_CHECK, name="ck_shard_status"),
        Index("ix_shard_run_id_status", "run_id", "status"),
    )

    id: int | None = Field(default=None, primary_key=True)
    run_id: str = Field(foreign_key="run.id", ondelete="CASCADE", index=True)
    index: int = Field(description="0-based shard number within the run.")
    start: int = Field(description="Position of the shard's first item.")
    stop: int = Field(description="One past the position of the shard's last item.")
    status: str = Field(default=Status.PENDING.value, description="pending|running|done|failed|cancelled.")
    lease_owner: str | None = Field(default=None, description="Worker holding the lease, if any.")
    lease_expires_at: datetime | None = Field(default=None, sa_type=UTCDateTime)
    heartbeat_at: datetime | None = Field(default=None, sa_type=UTCDateTime)
    attempt: int = Field(default=0, description="How many times the shard was started (capped by the queue).")
    version: int = Field(default=0, description="Fencing token: bumped on every new lease.")
    round: int = Field(default=0, description="Last round checkpointed for the shard's items.")
    error: str | None = Field(default=None, sa_type=Text, description="Why the shard failed, if it did.")
    updated_at: datetime = Field(
        default_factory=utcnow, sa_type=UTCDateTime, sa_column_kwargs={"onupdate": utcnow}
    )
    uploaded_at: datetime | None = Field(
        default=None,
        sa_type=UTCDateTime,
        description="When the shard's parts and manifest reached the object store.",
    )
    # Counters kept by crud.save_results in the transaction that inserts the results (migration 0004),
    # so `srdq status` sums shards instead of reading every result record.
    n_done: int = Field(
        default=0, sa_column_kwargs={"server_default": "0"}, description="Results without error."
    )
    n_failed: int = Field(
        default=0, sa_column_kwargs={"server_default": "0"}, description="Results with an error."
    )
    gen_tokens: int = Field(
        default=0, sa_column_kwargs={"server_default": "0"}, description="Generated tokens of those results."
    )


class ItemRow(SQLModel, table=True):
    """One dataset row of a run, in dataset order."""

    __tablename__ = "item"
    __table_args__ = (
        UniqueConstraint("run_id", "item_key", name="uq_item_run_id_item_key"),
        UniqueConstraint("run_id", "position", name="uq_item_run_id_position"),
    )

    id: int | None = Field(default=None, primary_key=True)
    run_id: str = Field(foreign_key="run.id", ondelete="CASCADE", index=True)
    shard_index: int
    position: int = Field(description="0-based order of the item in the dataset.")
    item_key: str = Field(description="The dataset's id of the item (Item.id).")
    question: str = Field(sa_type=Text)
    gold: str = Field(sa_type=Text)
    meta: dict[str, Any] = Field(default_factory=dict, sa_type=JSON)


class Checkpoint(SQLModel, table=True):
    """The latest method state of one item (upserted after every checkpointed round)."""

    __tablename__ = "checkpoint"
    __table_args__ = (
        UniqueConstraint("item_id", name="uq_checkpoint_item_id"),
        Index("ix_checkpoint_run_id_shard_index", "run_id", "shard_index"),
    )

    id: int | None = Field(default=None, primary_key=True)
    item_id: int = Field(foreign_key="item.id", ondelete="CASCADE")
    run_id: str = Field(foreign_key="run.id", ondelete="CASCADE")
    shard_index: int
    round: int = Field(description="Round the state was taken after.")
    state: dict[str, Any] = Field(default_factory=dict, sa_type=JSON, description="The method's state.")
    gen_tokens: int = Field(
        default=0,
        description="The state's ledger gen_tokens, kept apart from the JSON so status never reads model "
        "text (which may hold NUL) in SQL.",
    )
    version: int = Field(description="The shard's fencing token when the state was written.")
    updated_at: datetime = Field(default_factory=utcnow, sa_type=UTCDateTime)


class CheckpointRound(SQLModel, table=True):
    """The state of one item after one round (migration 0008): written with the checkpoint, never
    overwritten by a later round, so ``srdq fork RUN --at-round R`` finds every item's state at round R (the
    latest row with ``round <= R``: an item that finished earlier keeps its final state). ``state_z`` is the
    state's JSON, zlib-compressed (``store.crud.pack_state``); rounds above ``SRDQ_SNAPSHOT_ROUNDS`` are not
    kept."""

    __tablename__ = "checkpoint_round"
    __table_args__ = (
        UniqueConstraint("item_id", "round", name="uq_checkpoint_round_item_id_round"),
        Index("ix_checkpoint_round_run_id_shard_index", "run_id", "shard_index"),
    )

    id: int | None = Field(default=None, primary_key=True)
    item_id: int = Field(foreign_key="item.id", ondelete="CASCADE")
    run_id: str = Field(foreign_key="run.id", ondelete="CASCADE")
    shard_index: int
    round: int = Field(description="Round the state was taken after.")
    state_z: bytes = Field(sa_type=LargeBinary, description="The method's state: zlib-compressed JSON.")


class Result(SQLModel, table=True):
    """The final record of one item, written exactly once."""

    __tablename__ = "result"
    __table_args__ = (UniqueConstraint("item_id", name="uq_result_item_id"),)

    id: int | None = Field(default=None, primary_key=True)
    item_id: int = Field(foreign_key="item.id", ondelete="CASCADE")
    run_id: str = Field(foreign_key="run.id", ondelete="CASCADE", index=True)
    shard_index: int
    position: int
    record: dict[str, Any] = Field(
        sa_type=JSON, description="The whole result record, as the runner gave it."
    )
    correct: bool | None = Field(default=None)
    error: str | None = Field(default=None, sa_type=Text)
    created_at: datetime = Field(default_factory=utcnow, sa_type=UTCDateTime)


class ScoreCacheRow(SQLModel, table=True):
    """One reward score, content-addressed: ``key`` is the sha256 of (reward identity, question, response
    text, finished flag) (``store.score_cache.score_key``). Shared by every run of the store; written once
    per key (insert-or-nothing), never updated."""

    __tablename__ = "score_cache"

    key: str = Field(primary_key=True, max_length=64, description="sha256 hex of the scored input.")
    reward: str = Field(
        max_length=64, description="sha256 hex of the reward identity (model, revision, parameters)."
    )
    score: float = Field(description="The reward's score (finite; double precision).")
    created_at: datetime = Field(default_factory=utcnow, sa_type=UTCDateTime)
