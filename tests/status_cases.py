"""Status-at-scale checks shared by the SQLite (unit) and PostgreSQL (integration) tests: shard counters
kept by ``crud.save_results``, their backfill by migration 0004, and ``run_status`` listing only the
notable shards (running, failed, slow) unless asked for all."""

from __future__ import annotations

import importlib.resources
from datetime import timedelta

from alembic import command
from alembic.config import Config
from sqlalchemy import Engine, update

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
    assert listed[2].status == "running" and listed[2].note is None and listed[2].lease_owner == "w1"
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
