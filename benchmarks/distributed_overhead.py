"""The distributed path's overhead, and the checkpoint write time per round.

1. Wall time of one shard through `srdq submit dataset` → a warm `srdq worker` (separate process,
   real PostgreSQL and Redis) → results in PostgreSQL, divided by the embedded runner's wall time on
   the same shard (same spec, engine already loaded). The worker is warmed first with another shard so
   neither side pays the model load.
2. Checkpoint write time as a share of round time, for SQLite (embedded) and PostgreSQL (service).

    .venv/bin/python benchmarks/distributed_overhead.py [--model smollm2] [--items 4] [--n 2]

Needs PostgreSQL and Redis (SRDQ_TEST_PG_URL / SRDQ_TEST_REDIS_URL, defaults on 127.0.0.1). Prints a
table and writes it into docs/PERFORMANCE.md.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks._doc import replace_section  # noqa: E402

PG_URL = os.environ.get("SRDQ_TEST_PG_URL", "postgresql+psycopg2://postgres@127.0.0.1:5432/postgres")
REDIS_URL = os.environ.get("SRDQ_TEST_REDIS_URL", "redis://127.0.0.1:6379/0")
CLI = [sys.executable, "-m", "srdq_cli.main"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dataset", default=str(ROOT / "examples" / "gsm8k_sample.jsonl"))
    ap.add_argument("--model", default="smollm2")
    ap.add_argument("--items", type=int, default=4)
    ap.add_argument("--n", type=int, default=2)
    ap.add_argument("--max-new-tokens", type=int, default=96)
    ap.add_argument("--chunk-tokens", type=int, default=16)
    ap.add_argument("--no-write", action="store_true")
    args = ap.parse_args()

    import redis
    from sqlalchemy import create_engine, text
    from sqlalchemy.engine import make_url

    from srd_worker.engines.transformers_engine import TransformersEngine
    from srd_worker.methods.registry import build_method
    from srd_worker.rewards.registry import build_reward
    from srd_worker.runner import run_shard
    from srd_worker.settings import Settings
    from srd_worker.spec import prepare_run
    from srd_worker.store import crud
    from srd_worker.store.db import make_engine, session_scope, sqlite_url, upgrade
    from srd_worker.store.shard_store import SqlShardStore

    params = {"n": args.n, "max_new_tokens": args.max_new_tokens, "chunk_tokens": args.chunk_tokens}
    common = [
        "--method",
        "best_of_n",
        "--n",
        str(args.n),
        "--reward",
        "arithmetic",
        "--model",
        args.model,
        "--max-new-tokens",
        str(args.max_new_tokens),
        "--set",
        f"chunk_tokens={args.chunk_tokens}",
    ]
    db_name = f"srdq_bench_{uuid.uuid4().hex[:8]}"
    admin = create_engine(PG_URL, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(text(f'CREATE DATABASE "{db_name}"'))
    db_url = make_url(PG_URL).set(database=db_name).render_as_string(hide_password=False)
    redis_db = 14
    broker = REDIS_URL.rsplit("/", 1)[0] + f"/{redis_db}"
    redis.Redis.from_url(broker).flushdb()
    env = {
        **os.environ,
        "SRDQ_DATABASE_URL": db_url,
        "SRDQ_BROKER_URL": broker,
        "SRDQ_QUEUE": "bench",
        "SRDQ_DEVICE": "cpu",
        "SRDQ_SLICE_ROUNDS": "1000",
    }
    worker = None
    rows: list[str] = []
    try:
        subprocess.run([*CLI, "db", "upgrade"], env=env, check=True, capture_output=True)
        log = open(Path(tempfile.gettempdir()) / "srdq-bench-worker.log", "w")  # noqa: SIM115
        worker = subprocess.Popen(
            [*CLI, "worker"], env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )
        pg = create_engine(db_url)

        def submit_and_wait(seed: int) -> float:
            t0 = time.perf_counter()
            out = subprocess.run(
                [
                    *CLI,
                    "submit",
                    "dataset",
                    args.dataset,
                    *common,
                    "--limit",
                    str(args.items),
                    "--shard-size",
                    str(args.items),
                    "--seed",
                    str(seed),
                ],
                env=env,
                check=True,
                capture_output=True,
                text=True,
            )
            run_id = out.stdout.strip()
            while True:
                with pg.connect() as conn:
                    status = conn.execute(
                        text("select status from run where id = :r"), {"r": run_id}
                    ).scalar()
                if status == "done":
                    return time.perf_counter() - t0
                if status in ("failed", "cancelled"):
                    raise SystemExit(f"benchmark run {run_id} ended {status}")
                time.sleep(0.05)

        submit_and_wait(seed=1)  # warm-up: the worker loads the model
        distributed_s = submit_and_wait(seed=2)

        # the embedded runner on the same shard and spec, engine loaded beforehand
        settings = Settings(device="cpu")
        engine = TransformersEngine.from_name(args.model, settings=settings)
        prepared = prepare_run(
            dataset=args.dataset,
            method="best_of_n",
            params=params,
            model=args.model,
            reward="arithmetic",
            seed=2,
            limit=args.items,
        )
        reward = build_reward("arithmetic", engine)

        def embedded(url: str) -> tuple[float, float, float, int]:
            upgrade(url)
            db = make_engine(url)
            run_id = prepared.spec.run_id() + uuid.uuid4().hex[:6]
            with session_scope(db) as session:
                crud.create_run(
                    session=session,
                    run_id=run_id,
                    name="bench",
                    spec=prepared.spec.model_dump(),
                    config_hash="",
                    versions={},
                    items=prepared.items,
                    shard_size=len(prepared.items),
                )
            t0 = time.perf_counter()
            outcome = run_shard(
                items=prepared.items,
                positions=list(range(len(prepared.items))),
                method=build_method("best_of_n", params),
                task=prepared.task,
                engine=engine,
                reward=reward,
                run_seed=2,
                store=SqlShardStore(db, run_id, 0),
            )
            wall = time.perf_counter() - t0
            db.dispose()
            return wall, outcome.checkpoint_seconds, outcome.round_seconds, outcome.rounds

        with tempfile.TemporaryDirectory() as tmp:
            sqlite_wall, sqlite_ck, sqlite_round, rounds = embedded(sqlite_url(Path(tmp) / "bench.db"))
        pg_wall, pg_ck, pg_round, _ = embedded(db_url)
        rows = [
            f"Measured {time.strftime('%Y-%m-%d')} on CPU, model {args.model}, one shard of {args.items} GSM8K "
            f"problems, Best-of-N n={args.n}, max_new_tokens={args.max_new_tokens}, chunk_tokens="
            f"{args.chunk_tokens} ({rounds} rounds), arithmetic reward; PostgreSQL and Redis on loopback.",
            "",
            f"**Distributed ÷ embedded wall time for one shard = {distributed_s / sqlite_wall:.2f}** "
            f"(submit → warm worker → results in PostgreSQL: {distributed_s:.1f} s; embedded runner: "
            f"{sqlite_wall:.1f} s)",
            "",
            "| store | checkpoint s (all rounds) | round s (all rounds) | checkpoint share of round time | per round ms |",
            "|---|---:|---:|---:|---:|",
            f"| SQLite (embedded) | {sqlite_ck:.3f} | {sqlite_round:.1f} | {100 * sqlite_ck / sqlite_round:.2f}% | "
            f"{1000 * sqlite_ck / rounds:.1f} |",
            f"| PostgreSQL (service) | {pg_ck:.3f} | {pg_round:.1f} | {100 * pg_ck / pg_round:.2f}% | "
            f"{1000 * pg_ck / rounds:.1f} |",
            "",
            f"Command: `.venv/bin/python benchmarks/distributed_overhead.py --model {args.model} --items {args.items} "
            f"--n {args.n} --max-new-tokens {args.max_new_tokens} --chunk-tokens {args.chunk_tokens}`",
        ]
        print("\n".join(rows))
    finally:
        if worker is not None:
            import signal

            os.killpg(worker.pid, signal.SIGKILL)
            worker.wait()
        redis.Redis.from_url(broker).flushdb()
        with admin.connect() as conn:
            conn.execute(text(f'DROP DATABASE IF EXISTS "{db_name}" WITH (FORCE)'))
    if rows and not args.no_write:
        replace_section(ROOT / "docs" / "PERFORMANCE.md", "distributed-overhead", "\n".join(rows))


if __name__ == "__main__":
    main()
