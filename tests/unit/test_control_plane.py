"""The control plane at scale, on SQLite and plain files (no services): the streamed dataset spool that
``srdq submit dataset`` uses, and ``srdq status`` summarising shards (the PostgreSQL/Redis side is in
tests/integration/test_control_plane.py)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings

from srd_worker.errors import DatasetError
from srd_worker.spec import prepare_run
from srd_worker.store.db import make_engine, sqlite_url, upgrade
from srd_worker.tasks.registry import get_task
from srd_worker.tasks.spool import spool_items
from tests.cli import run_srdq, srdq_env
from tests.hostile_cases import check_hostile_text
from tests.status_cases import (
    RUN,
    check_backfill,
    check_eta,
    check_eta_in_flight,
    check_hostile_status,
    check_old_schema,
    check_status,
    make_run,
    shape_run,
)
from tests.unit.test_fuzz_strategies import hostile_text


def gsm8k_rows(n: int) -> list[dict]:
    return [
        {"question": f'What is {i} + {i}?\n"quoted", tab\t, é ∑', "answer": f"{i}+{i}\n#### {2 * i}"}
        for i in range(n)
    ]


def write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


@pytest.mark.parametrize("batch_rows", [3, 5000])
def test_spool_gives_back_the_items_the_whole_file_loader_builds(tmp_path: Path, batch_rows: int) -> None:
    path = write_jsonl(tmp_path / "d.jsonl", gsm8k_rows(11))
    task = get_task("gsm8k")
    with spool_items(task, path, batch_rows=batch_rows) as spool:
        assert len(spool) == 11
        assert list(spool) == task.load(path)
        assert [row[0] for batch in spool.batches(4) for row in batch] == list(range(11))
    with spool_items(task, path, limit=4, batch_rows=batch_rows) as spool:
        assert list(spool) == task.load(path)[:4]


@pytest.mark.parametrize("batch_rows", [2, 5000])
def test_spool_names_a_late_duplicate_id_with_both_lines(tmp_path: Path, batch_rows: int) -> None:
    rows = [{"problem": f"p{i}", "answer": str(i), "unique_id": f"u{i}"} for i in range(9)]
    rows.append({"problem": "again", "answer": "1", "unique_id": "u2"})
    path = write_jsonl(tmp_path / "dup.jsonl", rows)
    with pytest.raises(
        DatasetError, match=r"dup\.jsonl, line 10: duplicate id 'u2' \(first used on line 3\)"
    ):
        spool_items(get_task("math500"), path, batch_rows=batch_rows)


def test_spool_reports_a_bad_row_before_an_earlier_duplicate(tmp_path: Path) -> None:
    """As the whole-file loader did: every row is validated before ids are compared."""
    rows = [{"problem": "p", "answer": "1", "unique_id": "same"}] * 2 + [{"problem": "p3"}]
    path = write_jsonl(tmp_path / "both.jsonl", rows)
    with pytest.raises(DatasetError, match=r"line 3, field 'answer': missing required field"):
        spool_items(get_task("math500"), path, batch_rows=1)


def test_spool_refuses_a_nul_character_naming_the_line(tmp_path: Path) -> None:
    rows = gsm8k_rows(3)
    rows[2]["question"] = "before\x00after"
    path = write_jsonl(tmp_path / "nul.jsonl", rows)
    with pytest.raises(DatasetError, match=r"nul\.jsonl, line 3: the item's question contains a NUL"):
        spool_items(get_task("gsm8k"), path)


def test_streamed_prepare_matches_the_list_one_and_the_run_id(tmp_path: Path) -> None:
    path = write_jsonl(tmp_path / "d.jsonl", gsm8k_rows(7))
    args = dict(
        dataset=str(path), method="sampling", params={}, model="tiny-random-llama", reward=None, shard_size=2
    )
    listed = prepare_run(**args)
    streamed = prepare_run(**args, stream=True)
    try:
        assert streamed.spec == listed.spec and streamed.spec.run_id() == listed.spec.run_id()
        assert list(streamed.items) == listed.items
    finally:
        streamed.close()
    spool_file = streamed.items.path
    assert not spool_file.exists()


def test_csv_and_parquet_stream_like_they_load(tmp_path: Path) -> None:
    pq = pytest.importorskip("pyarrow.parquet")
    import pyarrow as pa

    rows = gsm8k_rows(5)
    csv_path = tmp_path / "d.csv"
    import csv

    with open(csv_path, "w", newline="", encoding="utf-8") as fh:
        writer = csv.DictWriter(fh, fieldnames=["question", "answer"])
        writer.writeheader()
        writer.writerows(rows)
    pq_path = tmp_path / "d.parquet"
    pq.write_table(pa.Table.from_pylist(rows), pq_path, row_group_size=2)
    task = get_task("gsm8k")
    for path in (csv_path, pq_path):
        with spool_items(task, path, batch_rows=2) as spool:
            assert list(spool) == task.load(path)


@pytest.fixture
def sqlite_engine(tmp_path: Path):
    url = sqlite_url(tmp_path / "srdq.db")
    upgrade(url)
    engine = make_engine(url)
    make_run(engine)
    yield engine, url
    engine.dispose()


def test_status_sums_shards_and_lists_the_notable_ones(sqlite_engine) -> None:
    check_status(sqlite_engine[0])


def test_status_eta_counts_from_the_first_lease_not_from_submit(sqlite_engine) -> None:
    check_eta(sqlite_engine[0])


def test_status_eta_credits_the_items_under_way(sqlite_engine) -> None:
    check_eta_in_flight(sqlite_engine[0])


def test_migration_0004_backfills_the_shard_counters(sqlite_engine) -> None:
    check_backfill(*sqlite_engine)


def test_status_upgrades_an_old_embedded_store(sqlite_engine) -> None:
    check_old_schema(*sqlite_engine)


def test_status_counts_tokens_of_checkpoints_holding_hostile_text(sqlite_engine, tmp_path: Path) -> None:
    check_hostile_status(sqlite_engine[0])
    proc = run_srdq("status", RUN, "--db", str(tmp_path / "srdq.db"), env=srdq_env(COLUMNS="200"))
    assert proc.returncode == 0, proc.stderr  # the command's table too, not only the query
    assert "303 tokens" in proc.stdout and "running" in proc.stdout


def test_status_command_summarises_by_state_and_all_lists_every_shard(sqlite_engine, tmp_path: Path) -> None:
    engine, _url = sqlite_engine
    shape_run(engine)
    db = str(tmp_path / "srdq.db")
    short = run_srdq("status", RUN, "--db", db, env=srdq_env(COLUMNS="200"))
    assert short.returncode == 0, short.stderr
    assert "10 shards:" in short.stdout and "pending 5" in short.stdout and "running 2" in short.stdout
    assert "running, failed and slow shards" in short.stdout and "lease expired" in short.stdout
    data = json.loads(run_srdq("status", RUN, "--db", db, "--json").stdout)
    assert [s["index"] for s in data["shards"]] == [2, 3, 4, 5]
    assert data["shard_states"] == {"done": 2, "failed": 1, "pending": 5, "running": 2}
    every = json.loads(run_srdq("status", RUN, "--db", db, "--json", "--all").stdout)
    assert [s["index"] for s in every["shards"]] == list(range(10)) and every["listed"] == "all"


def test_reaper_leaves_a_deep_queue_alone_and_reenqueues_once_it_drains(sqlite_engine) -> None:
    """Ten pending shards all past the grace period: while the broker holds at least ten messages none is
    enqueued again (they are waiting their turn); with fewer, or an unknown depth, all are."""
    from datetime import timedelta

    from srd_worker.store import leases
    from srd_worker.store.db import session_scope
    from srd_worker.store.models import utcnow

    engine, _url = sqlite_engine
    later = utcnow() + timedelta(hours=1)
    for queued, expected in ((10, 0), (25, 0), (9, 10), (None, 10)):
        with session_scope(engine) as session:
            todo = leases.reap(session=session, pending_grace_s=60, now=later, queued=queued)
        assert len(todo) == expected, queued
        later += timedelta(hours=1)  # past the grace period again


def test_reaper_reenqueues_only_the_runs_of_its_own_queue(sqlite_engine) -> None:
    """A worker's reaper used to move every run's stale shards onto its own queue; now a run records the
    queue it was submitted to and only that queue's reapers (and any, for runs that recorded none) take
    its shards."""
    from datetime import timedelta

    from srd_worker.store import crud, leases
    from srd_worker.store.db import session_scope
    from srd_worker.store.models import utcnow
    from srd_worker.tasks.base import Item

    engine, _url = sqlite_engine  # holds RUN (no queue recorded: stored as before migration 0005)
    items = [Item(id=f"x{i}", question="q", gold="1", meta={}) for i in range(4)]
    with session_scope(engine) as session:
        for run_id, queue in (("run-gpu-a", "gpu-a"), ("run-gpu-b", "gpu-b")):
            crud.insert_run(
                session=session, run_id=run_id, name=run_id, spec={}, config_hash="h", versions={},
                items=items, shard_size=2, queue=queue,
            )  # fmt: skip
    later = utcnow() + timedelta(hours=1)
    with session_scope(engine) as session:
        mine = leases.reap(session=session, pending_grace_s=60, now=later, queue="gpu-a")
    assert {run for run, _ in mine} == {"run-gpu-a", RUN}
    with session_scope(engine) as session:
        every = leases.reap(session=session, pending_grace_s=60, now=later + timedelta(hours=1))
    assert {run for run, _ in every} == {"run-gpu-a", "run-gpu-b", RUN}


def test_a_streamed_sweep_spools_the_dataset_once_for_every_point(tmp_path: Path) -> None:
    from srd_worker.sweep import close_prepared, plan_sweep

    write_jsonl(tmp_path / "d.jsonl", gsm8k_rows(9))
    sweep = tmp_path / "sweep.yaml"
    sweep.write_text(
        "dataset: d.jsonl\nmodel: tiny-random-llama\nshard_size: 4\nseeds: [0, 1]\n"
        "methods:\n  - method: sampling\n  - method: self_consistency\n    n: [2, 3]\n",
        encoding="utf-8",
    )
    listed = plan_sweep(sweep)
    streamed = plan_sweep(sweep, stream=True)
    try:
        assert streamed.run_ids == listed.run_ids and len(streamed.run_ids) == 6
        assert len({id(p.items) for p in streamed.prepared}) == 1  # one spool, shared
        assert all(list(p.items) == q.items for p, q in zip(streamed.prepared, listed.prepared, strict=True))
    finally:
        close_prepared(streamed.prepared)
    assert not streamed.prepared[0].items.path.exists()


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(text=hostile_text())
def test_hostile_text_through_checkpoint_status_export_and_report(
    sqlite_engine, tmp_path_factory, text
) -> None:
    """Any text a model emits survives every reader of checkpoints and results (SQLite)."""
    check_hostile_text(sqlite_engine[0], text, tmp_path_factory.mktemp("hostile"))


def test_status_at_80_columns_keeps_run_ids_whole_and_a_cancelled_run_has_no_eta(
    sqlite_engine, tmp_path: Path
) -> None:
    from srd_worker.store import crud
    from srd_worker.store.db import session_scope

    engine, _url = sqlite_engine
    long_id = "run-3f2a9c1b7d20"
    make_run(engine, run_id=long_id, name="a-rather-long-run-name-for-an-80-column-terminal", n_items=1)
    with session_scope(engine) as session:
        crud.set_run_status(session=session, run_id=long_id, status="cancelled")
    db = str(tmp_path / "srdq.db")
    recent = run_srdq("status", "--db", db, env=srdq_env(COLUMNS="80"))
    assert recent.returncode == 0, recent.stderr
    assert long_id in recent.stdout  # copyable, not cut with an ellipsis
    cancelled = run_srdq("status", long_id, "--db", db, env=srdq_env(COLUMNS="80"))
    assert cancelled.returncode == 0, cancelled.stderr
    assert "ETA —" in cancelled.stdout and "cancelled" in cancelled.stdout
