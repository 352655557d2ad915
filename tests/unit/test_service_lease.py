"""A fleet worker holds its lease from the moment it takes it: the heartbeat covers the engine build too.

A first engine build (loading weights, starting vLLM's engine core) can take longer than the lease's TTL.
Were the heartbeat started only after the build, the lease would expire meanwhile, another worker (or the
reaper) would take the shard, and the first worker's slice would end ``lost`` with its work thrown away.
Real SQLite store, real tiny Llama; the competing worker is a second ``leases.acquire`` during the build.
"""

from __future__ import annotations

import time
from typing import Any

from srd_worker.service import EngineCache, SliceConfig, process_shard, submit
from srd_worker.settings import Settings
from srd_worker.store import crud, leases
from srd_worker.store.db import make_engine, session_scope
from tests.service_cases import migrated_sqlite, tiny_sampling_run

TTL_S = 0.6


class SlowBuildCache(EngineCache):
    """Builds (returns) the engine only after longer than the lease's TTL; meanwhile another worker tries
    to take the shard, as it would when the lease had expired."""

    def __init__(self, settings: Settings, engine: Any, db: Any, run_id: str) -> None:
        super().__init__(settings)
        self.engine, self.db, self.run_id = engine, db, run_id
        self.stolen: leases.Lease | None = None

    def get(
        self, model: str, engine: str = "transformers", engine_config: Any = None, engine_args: Any = None
    ) -> Any:
        time.sleep(TTL_S * 2.5)
        with session_scope(self.db) as session:
            self.stolen = leases.acquire(
                session=session, run_id=self.run_id, shard_index=0, owner="other", ttl_s=60, max_attempts=5
            )
        return self.engine


def test_the_lease_is_renewed_while_the_engine_is_built(tmp_path, datasets_dir, tiny_engine):
    prepared = tiny_sampling_run(datasets_dir, max_new_tokens=3)
    url = migrated_sqlite(tmp_path)
    db = make_engine(url)
    try:
        run_id = submit(prepared, db=db, enqueue=lambda r, i: None).run_id
        cache = SlowBuildCache(Settings(cache_dir=tmp_path), tiny_engine, db, run_id)
        cfg = SliceConfig(lease_ttl_s=TTL_S, slice_rounds=10, max_attempts=5)
        outcome = process_shard(run_id, 0, db=db, engines=cache, enqueue=lambda r, i: None, cfg=cfg)
        assert cache.stolen is None, "another worker took the shard while its holder was building the engine"
        assert outcome == "done"
        with session_scope(db) as session:
            (shard,) = crud.list_shards(session=session, run_id=run_id)
            assert shard.status == "done"
    finally:
        db.dispose()
