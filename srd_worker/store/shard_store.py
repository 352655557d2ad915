"""``SqlShardStore``: the runner's ShardStore protocol over the SQL store, one transaction per call."""

from __future__ import annotations

from typing import Any

from sqlalchemy import Engine

from srd_worker.store import crud
from srd_worker.store.db import session_scope


class SqlShardStore:
    def __init__(self, engine: Engine, run_id: str, shard_index: int, *, expected_version: int | None = None):
        self.engine = engine
        self.run_id = run_id
        self.shard_index = shard_index
        self.expected_version = expected_version

    def load_checkpoints(self) -> dict[str, tuple[int, dict[str, Any]]]:
        with session_scope(self.engine) as session:
            return crud.load_checkpoints(session=session, run_id=self.run_id, shard_index=self.shard_index)

    def save_checkpoints(self, round_: int, states: dict[str, dict[str, Any]]) -> None:
        with session_scope(self.engine) as session:
            crud.save_checkpoints(session=session, run_id=self.run_id, shard_index=self.shard_index,
                                  round=round_, states=states, expected_version=self.expected_version)

    def save_results(self, records: list[dict[str, Any]]) -> int:
        with session_scope(self.engine) as session:
            n = crud.save_results(session=session, run_id=self.run_id, shard_index=self.shard_index,
                                  records=records)
            crud.set_shard_status(session=session, run_id=self.run_id, shard_index=self.shard_index,
                                  status="done")
            return n
