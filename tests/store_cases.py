"""Store checks shared by the SQLite (unit) and PostgreSQL (integration) test modules.

``StoreCases`` holds the tests; each backend's module subclasses it and provides a ``url`` fixture that
names a fresh, empty database. The class name does not start with ``Test``, so pytest collects the
tests only through the subclasses.
"""

from __future__ import annotations

import importlib.resources
from collections.abc import Iterator
from datetime import UTC

import pytest
from alembic import command
from alembic.autogenerate import compare_metadata
from alembic.config import Config
from alembic.migration import MigrationContext
from sqlalchemy import Engine, func, inspect, update
from sqlmodel import SQLModel, select

from srd_worker.errors import StoreError
from srd_worker.store import crud
from srd_worker.store.db import make_engine, session_scope, upgrade
from srd_worker.store.models import Checkpoint, ItemRow, Result, Run, Shard, SweepRow
from srd_worker.tasks.base import Item

TABLES = {"run", "shard", "item", "checkpoint", "result", "sweep", "score_cache"}
RUN = "run-abc"


def make_items(n: int, prefix: str = "q") -> list[Item]:
    return [
        Item(id=f"{prefix}{i}", question=f"What is {i}+{i}?", gold=str(2 * i), meta={"i": i})
        for i in range(n)
    ]


def new_run(
    engine: Engine, *, n_items: int = 10, shard_size: int = 4, run_id: str = RUN, sweep_id: str | None = None
) -> Run:
    with session_scope(engine) as session:
        return crud.create_run(
            sweep_id=sweep_id,
            session=session,
            run_id=run_id,
            name="demo",
            spec={"method": "srd", "params": {"k": 4}},
            config_hash="hash-1",
            versions={"srdq": "0.1.0"},
            items=make_items(n_items),
            shard_size=shard_size,
        )


def count(engine: Engine, model: type[SQLModel]) -> int:
    with session_scope(engine) as session:
        return session.exec(select(func.count()).select_from(model)).one()


def result_record(item: ItemRow, *, error: str | None = None) -> dict:
    return {
        "item_id": item.item_key,
        "position": item.position,
        "answer": item.gold,
        "correct": error is None,
        "error": error,
        "ledger": {"tokens": 7},
    }


def script_heads() -> tuple[str, ...]:
    """The newest revision(s) in the packaged migrations folder."""
    import importlib.resources

    from alembic.script import ScriptDirectory

    with importlib.resources.as_file(importlib.resources.files("srdq_migrations")) as location:
        return tuple(ScriptDirectory(str(location)).get_heads())


class StoreCases:
    @pytest.fixture
    def engine(self, url: str) -> Iterator[Engine]:
        upgrade(url)
        engine = make_engine(url)
        yield engine
        engine.dispose()

    # --- migrations ---------------------------------------------------------------------------------

    def test_upgrade_creates_tables_matching_the_models(self, url: str) -> None:
        upgrade(url)
        engine = make_engine(url)
        try:
            with engine.connect() as conn:
                assert TABLES <= set(inspect(conn).get_table_names())
                assert MigrationContext.configure(conn).get_current_heads() == script_heads()
                # The hand-written migration and the models agree: columns, types, nullability,
                # indexes, unique constraints, foreign keys.
                assert compare_metadata(MigrationContext.configure(conn), SQLModel.metadata) == []
        finally:
            engine.dispose()

    def test_upgrade_twice_is_a_noop(self, engine: Engine, url: str) -> None:
        new_run(engine)
        upgrade(url)
        with engine.connect() as conn:
            assert MigrationContext.configure(conn).get_current_heads() == script_heads()
        assert count(engine, ItemRow) == 10

    def test_downgrade_drops_every_table(self, engine: Engine, url: str) -> None:
        config = Config()
        with importlib.resources.as_file(importlib.resources.files("srdq_migrations")) as location:
            config.set_main_option("script_location", str(location))
            config.set_main_option("sqlalchemy.url", url.replace("%", "%%"))
            command.downgrade(config, "base")
        with engine.connect() as conn:
            assert not TABLES & set(inspect(conn).get_table_names())

    # --- runs, shards, items ------------------------------------------------------------------------

    @pytest.mark.parametrize(("n_items", "shard_size"), [(10, 4), (8, 4), (1, 5), (5, 1), (7, 7)])
    def test_shards_cover_items_exactly_once(self, engine: Engine, n_items: int, shard_size: int) -> None:
        run = new_run(engine, n_items=n_items, shard_size=shard_size)
        assert (run.n_items, run.n_shards, run.status) == (n_items, -(-n_items // shard_size), "pending")
        assert run.created_at.tzinfo == UTC
        with session_scope(engine) as session:
            shards = crud.list_shards(session=session, run_id=RUN)
            assert [s.index for s in shards] == list(range(run.n_shards))
            # Contiguous half-open ranges from 0 to n, none empty, all full except the last.
            assert shards[0].start == 0 and shards[-1].stop == n_items
            assert all(a.stop == b.start for a, b in zip(shards, shards[1:], strict=False))
            assert all(s.stop - s.start == shard_size for s in shards[:-1])
            assert 0 < shards[-1].stop - shards[-1].start <= shard_size
            assert all((s.status, s.attempt, s.version, s.round) == ("pending", 0, 0, 0) for s in shards)
            covered = []
            for shard in shards:
                items = crud.list_items(session=session, run_id=RUN, shard_index=shard.index)
                assert [i.position for i in items] == list(range(shard.start, shard.stop))
                covered += [i.item_key for i in items]
            assert covered == [item.id for item in make_items(n_items)]
            first = crud.list_items(session=session, run_id=RUN)[0]
            assert (first.question, first.gold, first.meta) == ("What is 0+0?", "0", {"i": 0})

    def test_create_run_twice_returns_the_same_run_and_writes_nothing(self, engine: Engine) -> None:
        first = new_run(engine)
        with session_scope(engine) as session:
            again = crud.create_run(
                session=session,
                run_id=RUN,
                name="other",
                spec={},
                config_hash="hash-2",
                versions={},
                items=make_items(3, prefix="x"),
                shard_size=1,
            )
        assert again.model_dump() == first.model_dump()
        assert (count(engine, Run), count(engine, Shard), count(engine, ItemRow)) == (1, 3, 10)
        # Another run may reuse the same dataset ids: keys are unique per run.
        new_run(engine, run_id="run-2")
        assert (count(engine, Run), count(engine, Shard), count(engine, ItemRow)) == (2, 6, 20)

    @pytest.mark.parametrize(
        ("items", "shard_size", "message"),
        [
            (make_items(3) + make_items(1), 2, "duplicate item ids"),
            (make_items(3), 0, "shard_size"),
            ([], 2, "no items"),
        ],
    )
    def test_create_run_refuses_bad_input(
        self, engine: Engine, items: list[Item], shard_size: int, message: str
    ) -> None:
        with pytest.raises(StoreError, match=message), session_scope(engine) as session:
            crud.create_run(
                session=session,
                run_id=RUN,
                name="bad",
                spec={},
                config_hash="h",
                versions={},
                items=items,
                shard_size=shard_size,
            )
        assert count(engine, Run) == 0

    def test_get_run_of_unknown_id_raises(self, engine: Engine) -> None:
        with pytest.raises(StoreError, match="no run"), session_scope(engine) as session:
            crud.get_run(session=session, run_id="nope")

    # --- sweeps ------------------------------------------------------------------------------------

    def test_sweep_is_recorded_once_and_lists_its_runs_in_order(self, engine: Engine) -> None:
        with session_scope(engine) as session:
            first = crud.create_sweep(
                session=session,
                sweep_id="sweep-1",
                name="grid",
                content='{"a": 1}',
                run_ids=["run-b", "run-a"],
            )
        assert (first.name, first.content, first.run_ids) == ("grid", '{"a": 1}', ["run-b", "run-a"])
        assert first.created_at.tzinfo == UTC
        new_run(engine, run_id="run-a", sweep_id="sweep-1")
        with session_scope(engine) as session:
            # only the stored runs, in the sweep's order
            assert [r.id for r in crud.sweep_runs(session=session, sweep_id="sweep-1")] == ["run-a"]
            again = crud.create_sweep(
                session=session, sweep_id="sweep-1", name="x", content="{}", run_ids=["z"]
            )
        assert again.model_dump() == first.model_dump() and count(engine, SweepRow) == 1
        new_run(engine, run_id="run-b", sweep_id="sweep-1")
        with session_scope(engine) as session:
            runs = crud.sweep_runs(session=session, sweep_id="sweep-1")
        assert [(r.id, r.sweep_id) for r in runs] == [("run-b", "sweep-1"), ("run-a", "sweep-1")]

    def test_run_keeps_its_first_sweep_and_a_plain_run_gets_tagged(self, engine: Engine) -> None:
        assert new_run(engine).sweep_id is None
        assert new_run(engine, sweep_id="sweep-1").sweep_id == "sweep-1"  # existing run outside a sweep
        assert new_run(engine, sweep_id="sweep-2").sweep_id == "sweep-1"  # first sweep kept
        assert count(engine, ItemRow) == 10

    def test_unknown_or_empty_sweep_is_refused(self, engine: Engine) -> None:
        with pytest.raises(StoreError, match="no sweep"), session_scope(engine) as session:
            crud.get_sweep(session=session, sweep_id="sweep-nope")
        with pytest.raises(StoreError, match="no runs"), session_scope(engine) as session:
            crud.create_sweep(session=session, sweep_id="sweep-0", name="e", content="{}", run_ids=[])
        assert count(engine, SweepRow) == 0

    # --- checkpoints --------------------------------------------------------------------------------

    def test_checkpoint_upsert_keeps_one_row_per_item_with_the_latest_state(self, engine: Engine) -> None:
        new_run(engine)
        with session_scope(engine) as session:
            crud.save_checkpoints(
                session=session,
                run_id=RUN,
                shard_index=1,
                round=1,
                states={"q4": {"beams": ["a"], "score": 0.5}, "q5": {"beams": ["b"]}},
            )
        with session_scope(engine) as session:
            crud.save_checkpoints(
                session=session,
                run_id=RUN,
                shard_index=1,
                round=2,
                states={"q4": {"beams": ["a", "c"], "score": 0.75}},
            )
        with session_scope(engine) as session:
            assert crud.load_checkpoints(session=session, run_id=RUN, shard_index=1) == {
                "q4": (2, {"beams": ["a", "c"], "score": 0.75}),
                "q5": (1, {"beams": ["b"]}),
            }
            assert crud.load_checkpoints(session=session, run_id=RUN, shard_index=0) == {}
            assert crud.list_shards(session=session, run_id=RUN)[1].round == 2
        assert count(engine, Checkpoint) == 2

    def test_checkpoint_for_an_item_of_another_shard_is_refused(self, engine: Engine) -> None:
        new_run(engine)
        with session_scope(engine) as session:
            for states, message in [({"q9": {}}, "not in shard 0"), ({"q0": {}, "zz": {}}, "no items")]:
                with pytest.raises(StoreError, match=message):
                    crud.save_checkpoints(session=session, run_id=RUN, shard_index=0, round=1, states=states)
            # Refused before any write, even inside the open transaction.
            assert crud.list_shards(session=session, run_id=RUN)[0].round == 0
        assert count(engine, Checkpoint) == 0

    def test_fencing_mismatch_raises_and_writes_nothing(self, engine: Engine) -> None:
        new_run(engine)
        with session_scope(engine) as session:
            # A lease takeover bumps the shard's version.
            session.exec(update(Shard).where(Shard.run_id == RUN, Shard.index == 0).values(version=3))
        with session_scope(engine) as session:
            crud.save_checkpoints(
                session=session,
                run_id=RUN,
                shard_index=0,
                round=1,
                states={"q0": {"v": 1}},
                expected_version=3,
            )
        with session_scope(engine) as session:
            with pytest.raises(StoreError, match="version 3, not 2"):
                crud.save_checkpoints(
                    session=session,
                    run_id=RUN,
                    shard_index=0,
                    round=5,
                    states={"q0": {"v": "stale"}, "q1": {"v": "stale"}},
                    expected_version=2,
                )
            # Nothing was written even inside the still-open transaction.
            assert crud.load_checkpoints(session=session, run_id=RUN, shard_index=0) == {"q0": (1, {"v": 1})}
            assert crud.list_shards(session=session, run_id=RUN)[0].round == 1
        with session_scope(engine) as session:
            checkpoint = session.exec(select(Checkpoint)).one()
            assert (checkpoint.round, checkpoint.version, checkpoint.state) == (1, 3, {"v": 1})

    # --- results ------------------------------------------------------------------------------------

    def test_save_results_twice_inserts_once(self, engine: Engine) -> None:
        new_run(engine)
        with session_scope(engine) as session:
            items = crud.list_items(session=session, run_id=RUN, shard_index=0)
            records = [result_record(item) for item in items[:3]]
            assert crud.save_results(session=session, run_id=RUN, shard_index=0, records=records) == 3
        with session_scope(engine) as session:
            assert crud.save_results(session=session, run_id=RUN, shard_index=0, records=records) == 0
            # A redelivery with one new item inserts only that one; the first record of an item wins.
            again = [dict(records[0], answer="changed"), result_record(items[3], error="too long")]
            assert crud.save_results(session=session, run_id=RUN, shard_index=0, records=again) == 1
        assert count(engine, Result) == 4
        with session_scope(engine) as session:
            assert crud.load_results(session=session, run_id=RUN)[0] == records[0]
            assert crud.run_counts(session=session, run_id=RUN) == {"items": 10, "done": 3, "failed": 1}

    def test_result_for_an_item_of_another_shard_is_refused(self, engine: Engine) -> None:
        new_run(engine)
        with pytest.raises(StoreError, match="shard 1"), session_scope(engine) as session:
            item = crud.list_items(session=session, run_id=RUN, shard_index=1)[0]
            crud.save_results(session=session, run_id=RUN, shard_index=0, records=[result_record(item)])
        with pytest.raises(StoreError, match="lack field 'error'"), session_scope(engine) as session:
            crud.save_results(
                session=session,
                run_id=RUN,
                shard_index=0,
                records=[{"item_id": "q0", "position": 0, "correct": True}],
            )
        assert count(engine, Result) == 0

    def test_load_results_in_dataset_order(self, engine: Engine) -> None:
        new_run(engine)
        with session_scope(engine) as session:
            for shard in reversed(crud.list_shards(session=session, run_id=RUN)):
                items = crud.list_items(session=session, run_id=RUN, shard_index=shard.index)
                crud.save_results(
                    session=session,
                    run_id=RUN,
                    shard_index=shard.index,
                    records=[result_record(item) for item in reversed(items)],
                )
        with session_scope(engine) as session:
            records = crud.load_results(session=session, run_id=RUN)
        assert [r["position"] for r in records] == list(range(10))
        assert [r["item_id"] for r in records] == [f"q{i}" for i in range(10)]

    # --- statuses -----------------------------------------------------------------------------------

    def test_statuses(self, engine: Engine) -> None:
        new_run(engine)
        with session_scope(engine) as session:
            crud.set_shard_status(session=session, run_id=RUN, shard_index=2, status="failed", error="boom")
            crud.set_run_status(session=session, run_id=RUN, status="running")
        with session_scope(engine) as session:
            shard = crud.list_shards(session=session, run_id=RUN)[2]
            assert (shard.status, shard.error) == ("failed", "boom")
            assert shard.updated_at.tzinfo == UTC
            assert crud.get_run(session=session, run_id=RUN).status == "running"
            crud.set_shard_status(session=session, run_id=RUN, shard_index=2, status="pending")
            assert crud.list_shards(session=session, run_id=RUN)[2].error is None
            with pytest.raises(StoreError, match="unknown status"):
                crud.set_run_status(session=session, run_id=RUN, status="finished")
            with pytest.raises(StoreError, match="no shard 9"):
                crud.set_shard_status(session=session, run_id=RUN, shard_index=9, status="done")
            with pytest.raises(StoreError, match="no run"):
                crud.set_run_status(session=session, run_id="nope", status="done")
