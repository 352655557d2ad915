"""The control plane at scale against a real PostgreSQL and Redis: ``srdq submit dataset`` streams its
rows (spool on disk, ``COPY`` in batches, pipelined enqueue) and must write exactly the rows, shards and
queue messages the whole-file path describes; a bad row at the end leaves nothing written or enqueued;
``srdq status`` sums shards and lists only the notable ones. Memory and timing are measured by
benchmarks/control_plane.py, not here."""

from __future__ import annotations

import base64
import csv
import json
import subprocess
import uuid
from pathlib import Path

import pytest
import redis
from sqlalchemy import create_engine
from sqlalchemy.engine import make_url

from srd_worker.store.db import make_engine
from srd_worker.tasks.registry import get_task
from tests.integration.fleet import CLI, PG_URL
from tests.status_cases import (
    check_backfill,
    check_eta,
    check_eta_in_flight,
    check_hostile_status,
    check_old_schema,
    check_status,
    make_run,
)

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("servers")]

# Text that a careless bulk insert gets wrong: CSV and COPY specials, line breaks, a backslash-N, unicode.
AWKWARD = 'He said "hi", then\ttabbed,\r\nbroke a line, wrote \\N and \\\\ and é ∑ 😀; '


def submit(ctx: dict, dataset: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [
            *CLI,
            "submit",
            "dataset",
            str(dataset),
            "--method",
            "sampling",
            "--model",
            "tiny-random-llama",
            *extra,
        ],
        env=ctx["env"],
        capture_output=True,
        text=True,
        timeout=300,
    )


def rows(ctx: dict, sql: str) -> list[tuple]:
    eng = create_engine(ctx["db_url"])
    try:
        with eng.connect() as conn:
            return [tuple(r) for r in conn.exec_driver_sql(sql)]
    finally:
        eng.dispose()


def queued(ctx: dict) -> list[tuple[str, list]]:
    """(task name, args) of every message waiting in the run queue."""
    r = redis.Redis.from_url(ctx["broker"])
    out = []
    for raw in r.lrange(ctx["env"]["SRDQ_QUEUE"], 0, -1):
        message = json.loads(raw)
        args, _kwargs, _embed = json.loads(base64.b64decode(message["body"]))
        out.append((message["headers"]["task"], args))
    return out


def datasets(tmp: Path) -> list[tuple[Path, str, list[str]]]:
    """(file, task, extra submit options): GSM8K JSONL, MATH-500 JSONL with meta, a generic CSV with no answer."""
    gsm = tmp / "gsm.jsonl"
    gsm.write_text(
        "".join(
            json.dumps(
                {"question": f"{AWKWARD}{i}", "answer": f"so\n#### {i}", **({"id": i} if i % 2 else {})}
            )
            + "\n"
            for i in range(23)
        )
        + "\n",
        encoding="utf-8",
    )
    math = tmp / "math.jsonl"
    math.write_text(
        "".join(
            json.dumps(
                {
                    "problem": f"{AWKWARD}{i}",
                    "answer": f"\\frac{{{i}}}{{2}}",
                    "unique_id": f"test/{i}.json",
                    "subject": 'Alg"ebra',
                    "level": i % 5,
                }
            )
            + "\n"
            for i in range(17)
        ),
        encoding="utf-8",
    )
    generic = tmp / "prompts.csv"
    with open(generic, "w", newline="", encoding="utf-8") as fh:
        writer = csv.writer(fh)
        writer.writerow(["prompt", "ref"])
        for i in range(9):
            writer.writerow([f"{AWKWARD}{i}", f"r{i}"])
    return [(gsm, "gsm8k", []), (math, "math500", []), (generic, "generic", ["--field", "prompt=prompt"])]


def test_streamed_submit_writes_exactly_the_rows_shards_and_messages_of_the_whole_file_path(env) -> None:
    shard_size = 4
    for dataset, task_name, extra in datasets(env["tmp"]):
        proc = submit(env, dataset, "--shard-size", str(shard_size), *extra)
        assert proc.returncode == 0, proc.stderr
        run_id = proc.stdout.strip()
        fields = dict(f.split("=", 1) for f in extra[1::2]) if extra else None
        expected = get_task(task_name, fields=fields).load(dataset)  # the whole-file loader
        n_shards = -(-len(expected) // shard_size)
        got = rows(
            env,
            f"select shard_index, position, item_key, question, gold, meta::text from item "
            f"where run_id = '{run_id}' order by position",
        )
        assert [(s, p, k, q, g, json.loads(m)) for s, p, k, q, g, m in got] == [
            (pos // shard_size, pos, it.id, it.question, it.gold, it.meta) for pos, it in enumerate(expected)
        ]
        assert rows(
            env,
            f"select index, start, stop, status, attempt, version, round, n_done, n_failed, gen_tokens "
            f"from shard where run_id = '{run_id}' order by index",
        ) == [
            (i, i * shard_size, min((i + 1) * shard_size, len(expected)), "pending", 0, 0, 0, 0, 0, 0)
            for i in range(n_shards)
        ]
        assert rows(env, f"select n_items, n_shards, status from run where id = '{run_id}'") == [
            (len(expected), n_shards, "pending")
        ]
        messages = [m for m in queued(env) if m[1][0] == run_id]
        assert sorted(messages, key=lambda m: m[1][1]) == [
            ("srdq.run_shard", [run_id, i]) for i in range(n_shards)
        ]
        # submitting again: the same run, nothing new stored or enqueued
        before = (len(queued(env)), rows(env, "select count(*) from item"))
        again = submit(env, dataset, "--shard-size", str(shard_size), *extra)
        assert again.returncode == 0 and again.stdout.strip() == run_id, again.stderr
        assert (len(queued(env)), rows(env, "select count(*) from item")) == before


def test_builtin_name_and_its_file_give_the_same_run(env) -> None:
    from srd_worker.datasets import resolve_dataset

    ids = []
    for dataset in ("gsm8k", str(resolve_dataset("gsm8k"))):
        proc = submit(env, Path(dataset), "--limit", "5")
        assert proc.returncode == 0, proc.stderr
        ids.append(proc.stdout.strip())
    assert ids[0] == ids[1]
    assert rows(env, "select count(*) from run") == [(1,)] and len(queued(env)) == 1


@pytest.mark.parametrize(
    "bad_row, expected",
    [
        ({"question": "no final answer", "answer": "none"}, "line 2999, field 'answer'"),
        (
            {"question": "dup", "answer": "#### 1", "id": "row-7"},
            "line 2999: duplicate id 'row-7' (first used on line 8)",
        ),
        (
            {"question": "nul \u0000 here", "answer": "#### 1"},
            "line 2999: the item's question contains a NUL",
        ),
    ],
)
def test_a_bad_row_near_the_end_stores_and_enqueues_nothing(env, bad_row, expected) -> None:
    path = env["tmp"] / "late.jsonl"
    good = [{"question": f"q{i}", "answer": f"#### {i}", "id": f"row-{i}"} for i in range(3000)]
    good[2998] = bad_row
    path.write_text("".join(json.dumps(r) + "\n" for r in good), encoding="utf-8")
    proc = submit(env, path, "--task", "gsm8k", "--shard-size", "2")
    assert proc.returncode == 1
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "late.jsonl" in lines[0] and expected in lines[0], proc.stderr
    for table in ("run", "shard", "item"):
        assert rows(env, f"select count(*) from {table}") == [(0,)]
    assert redis.Redis.from_url(env["broker"]).dbsize() == 0


@pytest.fixture
def pg_url():
    name = f"srdq_cps_{uuid.uuid4().hex[:10]}"
    admin = create_engine(PG_URL, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.exec_driver_sql(f'CREATE DATABASE "{name}"')
    try:
        yield make_url(PG_URL).set(database=name).render_as_string(hide_password=False)
    finally:
        with admin.connect() as conn:
            conn.exec_driver_sql(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        admin.dispose()


def test_submit_with_the_broker_down_says_so_in_one_line_and_the_run_resumes(env) -> None:
    """The run is stored and its shards stay pending; one line (password masked) says how it goes on;
    `srdq resume` enqueues it once the broker is back (it used to exit with a kombu traceback)."""
    dataset, _task, _extra = datasets(env["tmp"])[0]
    down = {**env, "env": {**env["env"], "SRDQ_BROKER_URL": "redis://:brokerpw@127.0.0.1:1/0"}}
    proc = submit(down, dataset, "--shard-size", "5")
    assert proc.returncode == 1
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert (
        "is stored (5 shards) but the broker redis://:***@127.0.0.1:1/0 did not take its messages" in lines[0]
    )
    assert "brokerpw" not in proc.stderr
    (run_id,) = [r for (r,) in rows(env, "select id from run")]
    assert f"srdq resume {run_id}" in lines[0]
    assert rows(env, "select count(*) from shard where status = 'pending'") == [(5,)]
    assert queued(env) == []
    again = subprocess.run(
        [*CLI, "resume", run_id], env=env["env"], capture_output=True, text=True, timeout=120
    )
    assert again.returncode == 0, again.stderr
    assert sorted(args[1] for _name, args in queued(env)) == list(range(5))


def test_racing_identical_submits_create_and_enqueue_once(pg_url, tmp_path) -> None:
    """Two identical submits at the same moment: the insert decides who created the run; the other is told
    it already existed and enqueues nothing (both used to print "submitted" and enqueue every shard)."""
    import threading

    from srd_worker import service
    from srd_worker.spec import prepare_run
    from srd_worker.store.db import upgrade

    upgrade(pg_url)
    data = tmp_path / "d.jsonl"
    data.write_text("".join(f'{{"question": "{i}+{i}?", "answer": "#### {2 * i}"}}\n' for i in range(12)))
    engine = make_engine(pg_url)
    barrier = threading.Barrier(2)
    sent: list[tuple[str, int]] = []
    outcomes: list = []
    lock = threading.Lock()

    def one() -> None:
        prepared = prepare_run(
            dataset=str(data), task="gsm8k", method="sampling", params={}, model="tiny-random-llama",
            reward=None, seed=0, limit=None, shard_size=3,
        )  # fmt: skip
        barrier.wait()
        done = service.submit(
            prepared, db=engine, enqueue=lambda r, i: (lock.acquire(), sent.append((r, i)), lock.release())
        )
        with lock:
            outcomes.append(done)

    try:
        threads = [threading.Thread(target=one) for _ in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=120)
        assert len(outcomes) == 2
        assert sorted(o.created for o in outcomes) == [False, True]
        assert outcomes[0].run_id == outcomes[1].run_id
        assert sorted(i for _r, i in sent) == [0, 1, 2, 3]  # every shard enqueued exactly once
        assert sum(o.enqueued for o in outcomes) == 4
        assert rows({"db_url": pg_url}, "select count(*) from shard") == [(4,)]
    finally:
        engine.dispose()


def test_hostile_text_through_every_reader_on_postgresql(pg_url, tmp_path) -> None:
    """NUL and other hostile text in checkpoints and results: status, export and report on PostgreSQL."""
    from hypothesis import HealthCheck, given, settings

    from srd_worker.store.db import upgrade
    from tests.hostile_cases import check_hostile_text
    from tests.unit.test_fuzz_strategies import hostile_text

    upgrade(pg_url)
    engine = make_engine(pg_url)

    @settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
    @given(text=hostile_text())
    def check(text: str) -> None:
        check_hostile_text(engine, text, tmp_path)

    try:
        check()
    finally:
        engine.dispose()


@pytest.mark.parametrize(
    "check",
    [check_status, check_backfill, check_hostile_status, check_eta, check_eta_in_flight, check_old_schema],
)
def test_status_on_postgresql(pg_url, check) -> None:
    from srd_worker.store.db import upgrade

    upgrade(pg_url)
    engine = make_engine(pg_url)
    try:
        make_run(engine)
        check(engine, pg_url) if check in (check_backfill, check_old_schema) else check(engine)
    finally:
        engine.dispose()


def test_resume_reenqueues_every_unfinished_shard_once(env) -> None:
    dataset, _task, _extra = datasets(env["tmp"])[0]
    proc = submit(env, dataset, "--shard-size", "2")
    assert proc.returncode == 0, proc.stderr
    run_id = proc.stdout.strip()
    eng = create_engine(env["db_url"])
    with eng.begin() as conn:
        conn.exec_driver_sql(f"update shard set status = 'done' where run_id = '{run_id}' and index < 3")
        conn.exec_driver_sql(
            f"update shard set status = 'failed', error = 'x' where run_id = '{run_id}' and index >= 9"
        )
    eng.dispose()
    redis.Redis.from_url(env["broker"]).delete(env["env"]["SRDQ_QUEUE"])
    out = subprocess.run(
        [*CLI, "resume", run_id], env=env["env"], capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stderr
    n_shards = rows(env, f"select n_shards from run where id = '{run_id}'")[0][0]
    assert f"{n_shards - 3} shard(s) re-enqueued" in out.stdout
    assert sorted(args[1] for _name, args in queued(env)) == list(range(3, n_shards))


def test_queue_depth_reads_the_broker(env) -> None:
    """The reaper's guard reads the queue's depth from the real broker: a queue nothing was sent to yet is
    empty (0, not "unknown"), and every waiting message counts."""
    import sys

    probe = (
        "from srd_worker.queue import enqueue, queue_depth; from srd_worker.settings import get_settings; "
        "q = get_settings().queue; before = queue_depth(q); [enqueue('run-x', i) for i in range(3)]; "
        "print(before, queue_depth(q))"
    )
    proc = subprocess.run(
        [sys.executable, "-c", probe], env=env["env"], capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["0", "3"]
    assert "unknown" not in proc.stderr
