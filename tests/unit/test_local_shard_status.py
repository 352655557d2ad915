"""``srdq run``'s shards in ``srdq status``: the shards a local run has open are ``running`` while it works
on them (no lease: one process), ``done`` once their records are stored, and an interrupted run (Ctrl-C,
SIGTERM, an error) puts its open shards back to ``pending`` with the run, so the same command resumes them."""

from __future__ import annotations

import pytest
from click.testing import CliRunner
from srdq_cli.main import cli

from srd_worker.local import run_local
from srd_worker.settings import Settings
from srd_worker.spec import prepare_run
from srd_worker.status import run_status
from srd_worker.store.db import make_engine, sqlite_url

pytestmark = pytest.mark.unit


class Stop(Exception):
    pass


def test_open_shards_are_running_then_done_or_pending_again(tmp_path, tiny_engine, datasets_dir):
    settings = Settings(cache_dir=tmp_path / "cache", device="cpu", dtype="float32")
    prepared = prepare_run(
        dataset=datasets_dir / "gsm8k_test.jsonl",
        method="srd",
        params={"n": 2, "max_new_tokens": 12, "chunk_tokens": 4},
        model="tiny-random-llama",
        reward="arithmetic",
        limit=4,
        shard_size=2,
        settings=settings,
    )
    out = tmp_path / "out"
    seen: list[dict[str, int]] = []
    ids: list[str] = []

    def watch(report) -> None:
        db = make_engine(sqlite_url(out / "srdq.db"))
        try:
            status = run_status(db=db, run_id=ids[0])
        finally:
            db.dispose()
        seen.append(status.shard_states)
        assert [s.status for s in status.shards] == ["running"] * len(status.shards)  # the listed ones
        if len(seen) == 3:
            raise Stop

    with pytest.raises(Stop):
        run_local(
            prepared,
            out_dir=out,
            settings=settings,
            engine=tiny_engine,
            on_start=lambda run_id, *_: ids.append(run_id),
            on_round=watch,
        )
    assert all(states.get("running", 0) >= 1 for states in seen), seen
    db = make_engine(sqlite_url(out / "srdq.db"))
    try:
        stopped = run_status(db=db, run_id=ids[0])
    finally:
        db.dispose()
    assert stopped.status == "pending" and "running" not in stopped.shard_states, stopped.shard_states

    summary = run_local(prepared, out_dir=out, settings=settings, engine=tiny_engine)
    assert summary.items == 4
    db = make_engine(sqlite_url(out / "srdq.db"))
    try:
        done = run_status(db=db, run_id=summary.run_id)
    finally:
        db.dispose()
    assert done.status == "done" and done.shard_states == {"done": 2}

    # Piped (not a terminal), the status table is wide enough to show the whole run id.
    shown = CliRunner().invoke(cli, ["status", summary.run_id, "--db", str(out)], env={"COLUMNS": "60"})
    assert shown.exit_code == 0, shown.output
    assert summary.run_id in shown.output and "…" not in shown.output, shown.output
