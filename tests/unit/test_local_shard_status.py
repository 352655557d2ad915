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


def _prepared(tmp_path, datasets_dir, method: str, params: dict):
    """Settings and a prepared 4-problem run of ``method`` in shards of 2 on the tiny model."""
    settings = Settings(cache_dir=tmp_path / "cache", device="cpu", dtype="float32")
    prepared = prepare_run(
        dataset=datasets_dir / "gsm8k_test.jsonl",
        method=method,
        params=params,
        model="tiny-random-llama",
        reward="arithmetic",
        limit=4,
        shard_size=2,
        settings=settings,
    )
    return settings, prepared


def _stopped(prepared, out, settings, engine, on_round) -> str:
    """Run until ``on_round`` raises ``Stop``; the run id."""
    ids: list[str] = []
    with pytest.raises(Stop):
        run_local(
            prepared,
            out_dir=out,
            settings=settings,
            engine=engine,
            on_start=lambda run_id, *_: ids.append(run_id),
            on_round=on_round,
        )
    return ids[0]


def _status(out, run_id):
    db = make_engine(sqlite_url(out / "srdq.db"))
    try:
        return run_status(db=db, run_id=run_id)
    finally:
        db.dispose()


def test_open_shards_are_running_then_done_or_pending_again(tmp_path, tiny_engine, datasets_dir):
    settings, prepared = _prepared(
        tmp_path, datasets_dir, "srd", {"n": 2, "max_new_tokens": 12, "chunk_tokens": 4}
    )
    out = tmp_path / "out"
    seen: list[dict[str, int]] = []

    def watch(report) -> None:
        status = _status(out, prepared.spec.run_id())
        seen.append(status.shard_states)
        assert [s.status for s in status.shards] == ["running"] * len(status.shards)  # the listed ones
        if len(seen) == 3:
            raise Stop

    run_id = _stopped(prepared, out, settings, tiny_engine, watch)
    assert all(states.get("running", 0) >= 1 for states in seen), seen
    stopped = _status(out, run_id)
    assert stopped.status == "pending" and "running" not in stopped.shard_states, stopped.shard_states

    summary = run_local(prepared, out_dir=out, settings=settings, engine=tiny_engine)
    assert summary.items == 4
    done = _status(out, summary.run_id)
    assert done.status == "done" and done.shard_states == {"done": 2}

    # Piped (not a terminal), the status table is wide enough to show the whole run id.
    shown = CliRunner().invoke(cli, ["status", summary.run_id, "--db", str(out)], env={"COLUMNS": "60"})
    assert shown.exit_code == 0, shown.output
    assert summary.run_id in shown.output and "…" not in shown.output, shown.output


def test_a_reopened_run_shows_no_rate_from_an_earlier_sitting(tmp_path, tiny_engine, datasets_dir):
    """A sitting that stopped, cleanly or killed outright (its clock and status left as they were), shows no
    rate and no ETA in ``srdq status`` until the reopened run starts work: not the earlier tokens over the
    time since that sitting began."""
    from datetime import timedelta

    from sqlalchemy import update

    from srd_worker.store.models import Run, Shard, utcnow

    settings, prepared = _prepared(tmp_path, datasets_dir, "best_of_n", {"n": 2, "max_new_tokens": 8})
    out = tmp_path / "out"

    def first_shard_then_stop(report) -> None:
        if report.items_done >= 2:
            raise Stop

    run_id = _stopped(prepared, out, settings, tiny_engine, first_shard_then_stop)
    stopped = _status(out, run_id)
    assert stopped.status == "pending" and stopped.started_at is None and stopped.gen_tokens > 0
    assert stopped.tokens_per_s == 0.0 and stopped.eta_s is None

    # killed outright an hour into its sitting: the run still says running, its clock still runs
    db = make_engine(sqlite_url(out / "srdq.db"))
    try:
        with db.begin() as con:
            con.execute(
                update(Run)
                .where(Run.id == run_id)
                .values(status="running", started_at=utcnow() - timedelta(hours=1), started_tokens=0)
            )
            con.execute(
                update(Shard).where(Shard.run_id == run_id, Shard.status != "done").values(status="running")
            )
    finally:
        db.dispose()
    assert _status(out, run_id).tokens_per_s > 0  # the stale clock: earlier tokens over the hour
    at_start = []
    summary = run_local(
        prepared,
        out_dir=out,
        settings=settings,
        engine=tiny_engine,
        on_start=lambda run_id, *_: at_start.append(_status(out, run_id)),
    )
    assert summary.items == 4 and len(at_start) == 1
    reopened = at_start[0]  # the reopened run, before its work starts
    assert reopened.started_at is None and reopened.tokens_per_s == 0.0 and reopened.eta_s is None
    assert reopened.gen_tokens == stopped.gen_tokens
    done = _status(out, summary.run_id)
    assert (
        done.status == "done"
        and done.started_at is not None
        and done.started_at > utcnow() - timedelta(minutes=5)
    )
