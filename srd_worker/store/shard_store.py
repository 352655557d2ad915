"""``SqlShardStore``: the runner's ShardStore protocol over the SQL store, one transaction per call.

With a ``lease`` (service mode) every write is fenced by the lease's version: a worker whose lease was
taken over (or whose shard was cancelled) gets ``LeaseLost`` and writes nothing. Without one (the
embedded ``srdq run``, a single process) writes are unfenced. Every checkpointed round up to
``snapshot_rounds`` is also kept as a snapshot (``checkpoint_round``: what ``srdq fork`` starts from).
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import Engine

from srd_worker.store import crud, leases
from srd_worker.store.db import session_scope

#: Rounds kept as snapshots when the caller does not say (the default of ``SRDQ_SNAPSHOT_ROUNDS``).
DEFAULT_SNAPSHOT_ROUNDS = 64


class SqlShardStore:
    def __init__(
        self,
        engine: Engine,
        run_id: str,
        shard_index: int,
        *,
        lease: leases.Lease | None = None,
        snapshot_rounds: int = DEFAULT_SNAPSHOT_ROUNDS,
    ):
        self.engine = engine
        self.run_id = run_id
        self.shard_index = shard_index
        self.lease = lease
        self.snapshot_rounds = snapshot_rounds

    def load_checkpoints(self) -> dict[str, tuple[int, dict[str, Any]]]:
        with session_scope(self.engine) as session:
            return crud.load_checkpoints(session=session, run_id=self.run_id, shard_index=self.shard_index)

    def save_checkpoints(self, round_: int, states: dict[str, dict[str, Any]]) -> None:
        with session_scope(self.engine) as session:
            self.write_checkpoints(session, round_, states)

    def write_checkpoints(self, session: Any, round_: int, states: dict[str, dict[str, Any]]) -> None:
        """``save_checkpoints`` inside the caller's transaction (``SqlWindowStore``)."""
        if self.lease is not None:
            leases.check(session=session, lease=self.lease)
        crud.save_checkpoints(
            session=session,
            run_id=self.run_id,
            shard_index=self.shard_index,
            round=round_,
            states=states,
            expected_version=self.lease.version if self.lease else None,
            snapshot=round_ <= self.snapshot_rounds,
        )

    def save_results(self, records: list[dict[str, Any]]) -> int:
        """Insert the shard's results and mark it done, in one transaction."""
        with session_scope(self.engine) as session:
            if self.lease is not None:
                leases.check(session=session, lease=self.lease)
            n = crud.save_results(
                session=session, run_id=self.run_id, shard_index=self.shard_index, records=records
            )
            if self.lease is not None:
                leases.release(session=session, lease=self.lease, status="done")
            else:
                crud.set_shard_status(
                    session=session, run_id=self.run_id, shard_index=self.shard_index, status="done"
                )
            return n


class SqlWindowStore:
    """``run_shards``' window store over the stores of the shards it runs: one step's checkpoints of every
    shard, written in one transaction, so a crash leaves the shards at the same step (a resumed call then
    steps the same items together as the uninterrupted one)."""

    def __init__(self, stores: list[SqlShardStore]):
        self.stores = stores

    def save_window(self, writes: list[tuple[int, int, dict[str, dict[str, Any]]]]) -> None:
        if not writes:
            return
        with session_scope(self.stores[writes[0][0]].engine) as session:
            for position, round_, states in writes:
                self.stores[position].write_checkpoints(session, round_, states)
