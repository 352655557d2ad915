"""Status-at-scale checks shared by the SQLite (unit) and PostgreSQL (integration) tests: shard counters
kept by ``crud.save_results``, their backfill by migration 0004, and ``run_status`` listing only the
notable shards (running, failed, slow) unless asked for all."""

from __future__ import annotations

import importlib.resources
import re
from datetime import timedelta

import pytest
from alembic import command
from alembic.config import Config
from sqlalchemy import Engine, update

from srd_worker.errors import StoreError
from srd_worker.status import run_status
from srd_worker.store import crud, leases
from srd_worker.store.db import session_scope
from srd_worker.store.models import Shard, utcnow
from srd_worker.tasks.base import Item

RUN = "run-status"
SHARD_SIZE = 3
N_ITEMS = 30  # ten shards


def alembic_to(url: str, revision: str, *, down: bool = False) -> None:
    config = Config()
    with importlib.resources.as_file(importlib.resources.files("srdq_migrations")) as location:
        config.set_main_option("script_location", str(location))
        config.set_main_option("sqlalchemy.url", url.replace("%", "%%"))
        (command.downgrade if down else command.upgrade)(config, revision)


def make_run(
    engine: Engine,
    *,
    run_id: str = RUN,
    name: str = "status",
    n_items: int = N_ITEMS,
    shard_size: int = SHARD_SIZE,
) -> None:
    items = [Item(id=f"q{i}", question=f"{i}+{i}?", gold=str(2 * i), meta={"i": i}) for i in range(n_items)]
    with session_scope(engine) as session:
        crud.create_run(
            session=session,
            run_id=run_id,
            name=name,
            spec={"method": "sampling", "model": "m"},
            config_hash=f"h-{run_id}",
            versions={},
            items=items,
            shard_size=shard_size,
        )


def record(index: int, *, tokens: int, error: str | None = None) -> dict:
    return {
        "item_id": f"q{index}",
        "position": index,
        "correct": error is None,
        "error": error,
        "ledger": {"gen_tokens": tokens},
    }


def finish_shard(engine: Engine, shard_index: int, records: list[dict]) -> None:
    with session_scope(engine) as session:
        crud.save_results(session=session, run_id=RUN, shard_index=shard_index, records=records)
        crud.set_shard_status(session=session, run_id=RUN, shard_index=shard_index, status="done")


def shape_run(engine: Engine) -> dict[str, int]:
    """Shards 0-1 done (one failed item), 2 running with a checkpoint, 3 running with an expired lease,
    4 failed, 5 pending after a crashed attempt (slow), 6-9 untouched. Returns the expected totals."""
    finish_shard(engine, 0, [record(i, tokens=10 + i) for i in range(3)])
    finish_shard(engine, 1, [record(3, tokens=5), record(4, tokens=6, error="boom"), record(5, tokens=7)])
    now = utcnow()
    with session_scope(engine) as session:
        lease = leases.acquire(
            session=session, run_id=RUN, shard_index=2, owner="w1", ttl_s=60, max_attempts=3
        )
        assert lease is not None
        crud.save_checkpoints(
            session=session,
            run_id=RUN,
            shard_index=2,
            round=1,
            states={"q6": {"ledger": {"gen_tokens": 4}}, "q7": {"ledger": {"gen_tokens": 3}}},
        )
        old = leases.acquire(
            session=session,
            run_id=RUN,
            shard_index=3,
            owner="w2",
            ttl_s=1,
            max_attempts=3,
            now=now - timedelta(minutes=5),
        )
        assert old is not None
        crud.set_shard_status(
            session=session, run_id=RUN, shard_index=4, status="failed", error="gave up\ntrace"
        )
        session.exec(
            update(Shard)
            .where(Shard.run_id == RUN, Shard.index == 5)
            .values(attempt=1, error="RuntimeError: crashed")
        )
    return {"done": 5, "failed": 1, "gen_tokens": 10 + 11 + 12 + 5 + 6 + 7 + 4 + 3}


def check_status(engine: Engine) -> None:
    """``run_status`` on the shaped run: totals, states, and the listed shards with and without --all."""
    want = shape_run(engine)
    st = run_status(db=engine, run_id=RUN)
    assert (st.done, st.failed, st.gen_tokens) == (want["done"], want["failed"], want["gen_tokens"])
    assert st.shard_states == {"done": 2, "failed": 1, "pending": 5, "running": 2}
    assert st.n_shards == 10 and st.listed == "notable" and st.not_listed == 0
    listed = {s.index: s for s in st.shards}
    assert sorted(listed) == [2, 3, 4, 5]
    assert listed[2].status == "running" and listed[2].lease_owner == "w1"
    # a running shard's note says when its last round was saved (a long round shows no other progress)
    assert re.fullmatch(r"round 1 saved \d+s ago", listed[2].note or ""), listed[2].note
    assert listed[3].note == "lease expired"
    assert listed[4].status == "failed" and listed[4].error == "gave up"
    assert listed[5].status == "pending" and listed[5].note == "retrying after attempt 1"
    capped = run_status(db=engine, run_id=RUN, limit=2)
    assert [s.index for s in capped.shards] == [2, 3] and capped.not_listed == 2
    every = run_status(db=engine, run_id=RUN, all_shards=True)
    assert [s.index for s in every.shards] == list(range(10)) and every.listed == "all"
    assert [(s.done, s.failed) for s in every.shards[:2]] == [(3, 0), (2, 1)]
    # a result delivered twice is stored and counted once
    with session_scope(engine) as session:
        assert (
            crud.save_results(session=session, run_id=RUN, shard_index=0, records=[record(0, tokens=10)]) == 0
        )
    again = run_status(db=engine, run_id=RUN)
    assert (again.done, again.failed, again.gen_tokens) == (st.done, st.failed, st.gen_tokens)


def check_backfill(engine: Engine, url: str) -> None:
    """Migration 0004 fills the counters from results stored before it (down to 0003 and back up)."""
    want = shape_run(engine)
    before = run_status(db=engine, run_id=RUN, all_shards=True)
    alembic_to(url, "0003", down=True)
    alembic_to(url, "head")
    after = run_status(db=engine, run_id=RUN, all_shards=True)
    assert (after.done, after.failed, after.gen_tokens) == (want["done"], want["failed"], want["gen_tokens"])
    assert [(s.done, s.failed) for s in after.shards] == [(s.done, s.failed) for s in before.shards]


def check_old_schema(engine: Engine, url: str) -> None:
    """``srdq status`` on a store an older srdq migrated (here: down to 0008, before ``started_tokens``):
    an embedded SQLite store is brought up to date and read; a fleet database is refused with one line
    naming both revisions and `srdq db upgrade`, and left as it is."""
    from click.testing import CliRunner
    from srdq_cli.main import cli

    from srd_worker.store.db import head_revision, schema_revision

    alembic_to(url, "0008", down=True)
    try:
        shown = CliRunner().invoke(cli, ["status", RUN, "--db", url])
        if engine.url.get_backend_name() == "sqlite":
            assert shown.exit_code == 0, shown.output
            assert RUN in shown.output and schema_revision(url) == head_revision()
        else:
            assert shown.exit_code == 1, shown.output
            assert f"its schema is at revision 0008, older than this srdq's {head_revision()}" in shown.output
            assert "run `srdq db upgrade` first" in shown.output and "Traceback" not in shown.output
            assert schema_revision(url) == "0008"
    finally:
        alembic_to(url, "head")


#: What a model can emit into a checkpoint's text: NUL, other control characters, a lone surrogate, a
#: number too large for any integer column, quotes and backslashes.
HOSTILE = ["a\x00b", "\x00", "\x01\x1f\x7f", "\ud800 lone", "9" * 400, 'q"\\u0000"\\', "\u2028\ufeff"]


def check_hostile_status(engine: Engine) -> None:
    """``run_status`` of a run whose unfinished shards' checkpoints hold hostile text counts their tokens
    (migration 0005: the count is a column, never read from the JSON in SQL)."""
    with session_scope(engine) as session:
        lease = leases.acquire(
            session=session, run_id=RUN, shard_index=0, owner="w1", ttl_s=60, max_attempts=3
        )
        assert lease is not None
        crud.save_checkpoints(
            session=session,
            run_id=RUN,
            shard_index=0,
            round=2,
            states={
                f"q{i}": {
                    "text": HOSTILE[i % len(HOSTILE)] * 3,
                    "candidates": [{"text": t, "tokens": [0, 1]} for t in HOSTILE],
                    "ledger": {"gen_tokens": 100 + i},
                }
                for i in range(SHARD_SIZE)
            },
        )
    st = run_status(db=engine, run_id=RUN, all_shards=True)
    assert st.gen_tokens == sum(100 + i for i in range(SHARD_SIZE))
    assert st.shards[0].status == "running" and st.shards[0].round == 2
    with session_scope(engine) as session:  # the text itself survives the round trip
        states = crud.load_checkpoints(session=session, run_id=RUN, shard_index=0)
    assert sorted(s["text"] for _r, s in states.values()) == sorted(HOSTILE[i] * 3 for i in range(SHARD_SIZE))


def check_eta(engine: Engine) -> None:
    """The rate and ETA of ``run_status`` come from the shards' finish times since the run's first lease:
    an hour in the queue before it is not work; ``srdq resume`` starts the clock again."""
    from sqlmodel import select

    from srd_worker.store.models import Run

    run_id = "run-eta"
    make_run(engine, run_id=run_id, n_items=8, shard_size=2)  # four shards of two
    now = utcnow()
    with session_scope(engine) as session:
        session.exec(update(Run).where(Run.id == run_id).values(created_at=now - timedelta(hours=1)))
    assert run_status(db=engine, run_id=run_id).eta_s is None  # nothing leased, nothing finished
    started = now - timedelta(seconds=100)
    with session_scope(engine) as session:
        lease = leases.acquire(
            session=session, run_id=run_id, shard_index=0, owner="w", ttl_s=600, max_attempts=3, now=started
        )
        assert lease is not None
        assert session.exec(select(Run.started_at).where(Run.id == run_id)).one() == started
    assert run_status(db=engine, run_id=run_id).eta_s is None  # leased, nothing finished yet: no rate
    for index, finished in ((0, now - timedelta(seconds=50)), (1, now)):
        with session_scope(engine) as session:
            crud.save_results(
                session=session,
                run_id=run_id,
                shard_index=index,
                records=[record(2 * index, tokens=30), record(2 * index + 1, tokens=20)],
            )
            session.exec(
                update(Shard)
                .where(Shard.run_id == run_id, Shard.index == index)
                .values(status="done", updated_at=finished)
            )
    st = run_status(db=engine, run_id=run_id)
    assert st.status == "running" and st.done == 4 and st.started_at == started
    # 4 items in the 100 s since the first lease: 4 left take 100 s (from creation it would be an hour)
    assert st.items_per_s is not None and abs(st.items_per_s - 0.04) < 0.004
    assert st.eta_s is not None and 90 < st.eta_s < 110
    assert abs(st.tokens_per_s - 1.0) < 0.1  # 100 tokens in those 100 s
    assert st.to_dict()["started_at"] == started.isoformat()
    # resume: the clock starts again at the next lease, and the shards finished before it are not speed
    with session_scope(engine) as session:
        assert leases.reopen_run(session=session, run_id=run_id) == [2, 3]
        assert session.exec(select(Run.started_at).where(Run.id == run_id)).one() is None
    # between the resume and the next lease nothing is under way: no rate from the earlier sitting's tokens
    idle = run_status(db=engine, run_id=run_id)
    assert idle.tokens_per_s == 0.0 and idle.items_per_s is None and idle.eta_s is None
    assert idle.gen_tokens == 100 and idle.done == 4
    with session_scope(engine) as session:
        assert leases.acquire(
            session=session, run_id=run_id, shard_index=2, owner="w", ttl_s=60, max_attempts=3
        )
        # the 100 tokens made before the resume are the baseline of the rate, not speed of this session
        assert session.exec(select(Run.started_tokens).where(Run.id == run_id)).one() == 100
    again = run_status(db=engine, run_id=run_id)
    assert again.started_at is not None and again.started_at > now - timedelta(seconds=1)
    assert again.items_per_s is None and again.eta_s is None
    assert again.gen_tokens == 100 and again.tokens_per_s == 0.0, again.tokens_per_s
    # the embedded `srdq run` starts its clock (and baseline) itself
    with session_scope(engine) as session:
        crud.set_run_status(session=session, run_id=run_id, status="running", started=True)
        assert session.exec(select(Run.started_tokens).where(Run.id == run_id)).one() == 100
    assert run_status(db=engine, run_id=run_id).tokens_per_s == 0.0
    # a sitting that stops (or a reopened one still loading its engine) stops the clock: no rate, no ETA,
    # though the run still says running and its shards still say what they were
    with session_scope(engine) as session:
        crud.stop_clock(session=session, run_id=run_id)
    stopped = run_status(db=engine, run_id=run_id)
    assert stopped.status == "running" and stopped.started_at is None
    assert stopped.tokens_per_s == 0.0 and stopped.eta_s is None and stopped.items_per_s is None
    with pytest.raises(StoreError, match="no run 'run-none'"):
        with session_scope(engine) as session:
            crud.stop_clock(session=session, run_id="run-none")


def check_eta_in_flight(engine: Engine) -> None:
    """The ETA credits the items under way with the tokens they hold: four shards running side by side,
    one finished, three 80% through. Counting finished items alone (two in 100 s) would say 300 s for the
    six left; their expected tokens less those made say 60 tokens at 3.4 tokens/s. An item that has made
    more than the mean still counts as unfinished (``IN_FLIGHT_FLOOR`` of its share)."""
    from srd_worker.status import IN_FLIGHT_FLOOR

    run_id = "run-eta-flight"
    make_run(engine, run_id=run_id, n_items=8, shard_size=2)  # four shards of two
    now = utcnow()
    started = now - timedelta(seconds=100)
    with session_scope(engine) as session:
        for index in range(4):
            assert leases.acquire(
                session=session,
                run_id=run_id,
                shard_index=index,
                owner="w",
                ttl_s=600,
                max_attempts=3,
                now=started,
            )
        crud.save_results(
            session=session,
            run_id=run_id,
            shard_index=0,
            records=[record(0, tokens=60), record(1, tokens=40)],  # 50 tokens an item
        )
        session.exec(
            update(Shard)
            .where(Shard.run_id == run_id, Shard.index == 0)
            .values(status="done", updated_at=now)
        )

    def hold(tokens: int) -> None:
        with session_scope(engine) as session:
            for index in (1, 2, 3):
                crud.save_checkpoints(
                    session=session,
                    run_id=run_id,
                    shard_index=index,
                    round=3,
                    states={f"q{i}": {"ledger": {"gen_tokens": tokens}} for i in (2 * index, 2 * index + 1)},
                )

    hold(40)
    st = run_status(db=engine, run_id=run_id)
    assert st.done == 2 and st.gen_tokens == 100 + 6 * 40
    assert st.items_per_s is not None and 250 < 6 / st.items_per_s < 350  # the finished items' reading
    # 6 x 50 expected, 240 made: 60 tokens left at 340 tokens per 100 s
    assert st.eta_s is not None and abs(st.eta_s - 60 / 3.4) < 2, st.eta_s
    hold(70)  # longer than the finished ones: not done before their results are in
    st = run_status(db=engine, run_id=run_id)
    assert st.eta_s is not None and abs(st.eta_s - IN_FLIGHT_FLOOR * 300 / 5.2) < 2, st.eta_s
