"""What a fleet worker reports about its fixed cost, and the runtime record it stores once per process.

Each slice logs ``rounds_started`` (lease → first round, and the checkpointed round it resumes from) and
ends with ``compute_seconds`` (its time in the method's steps) beside ``seconds``, so the fleet's own
cost per slice is ``seconds − compute_seconds`` (benchmarks/distributed_overhead.py reads them). The
runtime record (engine and model revisions) is stored in ``run.versions`` once; a worker that stored it
does not lock the run row again on every later slice. Real SQLite store, real tiny Llama.
"""

from __future__ import annotations

import logging

from sqlalchemy import event

from srd_worker.provenance import record_runtime
from srd_worker.service import EngineCache, SliceConfig, process_shard, submit
from srd_worker.settings import Settings
from srd_worker.spec import RunSpec
from srd_worker.store import crud
from srd_worker.store.db import make_engine, session_scope
from tests.service_cases import migrated_sqlite, tiny_sampling_run


class LoadedCache(EngineCache):
    """The worker's cache with the engine already built (a warm worker)."""

    def __init__(self, settings: Settings, engine) -> None:
        super().__init__(settings)
        self.engine = engine

    def get(self, model, engine="transformers", engine_config=None, engine_args=None):
        return self.engine


def _events(caplog, name: str) -> list[logging.LogRecord]:
    return [r for r in caplog.records if getattr(r, "event", None) == name]


def test_each_slice_reports_its_setup_and_its_compute(tmp_path, datasets_dir, tiny_engine, caplog):
    prepared = tiny_sampling_run(datasets_dir, max_new_tokens=6, chunk_tokens=2)
    url = migrated_sqlite(tmp_path)
    db = make_engine(url)
    caplog.set_level(logging.INFO, logger="srdq.service")
    try:
        run_id = submit(prepared, db=db, enqueue=lambda r, i: None).run_id
        cache = LoadedCache(Settings(cache_dir=tmp_path), tiny_engine)
        cfg = SliceConfig(slice_rounds=1)
        outcomes = []
        while not outcomes or outcomes[-1] == "continued":
            outcomes.append(
                process_shard(run_id, 0, db=db, engines=cache, enqueue=lambda r, i: None, cfg=cfg)
            )
        assert outcomes[-1] == "done" and len(outcomes) >= 2, outcomes
        started = _events(caplog, "rounds_started")
        # one per slice, each resuming from the round the slice before it checkpointed
        assert [r.rounds for r in started] == list(range(len(outcomes)))
        assert all(0 <= r.seconds < 60 for r in started)
        ends = _events(caplog, "slice_ended") + _events(caplog, "shard_finished")
        assert len(ends) == len(outcomes)
        for end in ends:
            assert 0 < end.compute_seconds <= end.seconds
    finally:
        db.dispose()


def test_the_runtime_record_is_stored_once_and_not_rewritten_per_slice(tmp_path, datasets_dir, tiny_engine):
    prepared = tiny_sampling_run(datasets_dir, max_new_tokens=2)
    url = migrated_sqlite(tmp_path)
    db = make_engine(url)
    other = make_engine(url)  # another process's view of the same database
    statements: list[str] = []
    event.listen(db, "before_cursor_execute", lambda *a: statements.append(a[2]))
    try:
        run_id = submit(prepared, db=db, enqueue=lambda r, i: None).run_id
        spec = RunSpec(**prepared.spec.model_dump())
        settings = Settings(cache_dir=tmp_path)
        record = record_runtime(db, run_id, spec, tiny_engine, settings=settings)
        assert record
        statements.clear()
        assert record_runtime(db, run_id, spec, tiny_engine, settings=settings) == record
        assert statements == [], "a slice after the first locked the run row again"
        # a process that has not stored it yet checks the run's records, and adds nothing twice
        assert record_runtime(other, run_id, spec, tiny_engine, settings=settings) == record
        with session_scope(db) as session:
            assert crud.get_run(session=session, run_id=run_id).versions["runtime"] == [record]
    finally:
        db.dispose()
        other.dispose()
