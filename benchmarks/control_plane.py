"""Control plane at scale: `srdq submit dataset` memory and time by row count, `srdq status` time on the
largest run.

Generates GSM8K-format rows (the built-in GSM8K test questions, cycled, each made unique) into a temp
file, then for each row count submits the first N rows with `srdq submit dataset` as a separate process
against the real PostgreSQL and Redis (a scratch database and queue, removed afterwards) and records
its wall time and peak resident memory (``ru_maxrss`` of that process, from ``os.wait4``). On the
largest run it times `srdq status RUN` (the whole command, a fresh process each time) and the status
query itself in-process, first on the fresh run, then after marking shards done, running, failed and
retrying through SQL (as a run in progress would look; no results are written).

    nice -n 5 .venv/bin/python benchmarks/control_plane.py [--rows 100000,300000,1000000] [--shard-size 16]

Needs PostgreSQL and Redis (SRDQ_TEST_PG_URL / SRDQ_TEST_REDIS_URL, defaults on 127.0.0.1). Prints a
table and writes it into docs/PERFORMANCE.md (section control-plane) unless --no-write.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
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


def generate(path: Path, n: int) -> None:
    """n GSM8K-format rows: the built-in test rows cycled, each question prefixed with its row number."""
    from srd_worker.datasets import resolve_dataset

    src = [json.loads(line) for line in resolve_dataset("gsm8k").read_text(encoding="utf-8").splitlines()]
    with open(path, "w", encoding="utf-8") as fh:
        for i in range(n):
            row = src[i % len(src)]
            fh.write(json.dumps({"question": f"({i}) {row['question']}", "answer": row["answer"]}) + "\n")


def head(src: Path, dst: Path, n: int) -> None:
    with open(src, "rb") as fin, open(dst, "wb") as fout:
        for _ in range(n):
            fout.write(fin.readline())


def timed_process(cmd: list[str], env: dict[str, str]) -> tuple[float, float, str, float]:
    """(wall seconds, peak RSS in MiB, stdout, CPU seconds (user + system)) of one child process."""
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        start = time.perf_counter()
        proc = subprocess.Popen(cmd, env=env, stdout=out, stderr=err)
        _pid, status, usage = os.wait4(proc.pid, 0)
        wall = time.perf_counter() - start
        proc.returncode = os.waitstatus_to_exitcode(status)
        out.seek(0)
        err.seek(0)
        stdout, stderr = out.read().decode(), err.read().decode()
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(cmd[3:])} failed ({proc.returncode}): {stderr[-2000:]}")
    return wall, usage.ru_maxrss / 1024, stdout, usage.ru_utime + usage.ru_stime


def shape_progress(db_url: str, run_id: str, n_shards: int, shard_size: int) -> str:
    """Mark a fifth of the shards done (counters filled), 8 running, 3 failed, 5 retrying."""
    from sqlalchemy import create_engine, text

    eng = create_engine(db_url)
    done = n_shards // 5
    with eng.begin() as conn:
        conn.execute(
            text(
                "update shard set status='done', n_done=stop-start, gen_tokens=(stop-start)*200 "
                "where run_id=:r and index < :d"
            ),
            {"r": run_id, "d": done},
        )
        conn.execute(
            text(
                "update shard set status='running', attempt=1, round=3, lease_owner='bench', "
                "lease_expires_at=now() + interval '1 hour' where run_id=:r and index >= :d and index < :d + 8"
            ),
            {"r": run_id, "d": done},
        )
        conn.execute(
            text(
                "update shard set status='failed', error='gave up' where run_id=:r and index >= :d + 8 and index < :d + 11"
            ),
            {"r": run_id, "d": done},
        )
        conn.execute(
            text(
                "update shard set attempt=1, error='crashed' where run_id=:r and index >= :d + 11 and index < :d + 16"
            ),
            {"r": run_id, "d": done},
        )
    eng.dispose()
    return f"{done:,} done, 8 running, 3 failed, 5 retrying"


def time_status(env: dict[str, str], db_url: str, run_id: str, reps: int) -> tuple[float, float, float, int]:
    """Medians of the `srdq status RUN` command's wall and CPU time and of the in-process query time, and
    the number of shards listed."""
    from srd_worker.status import run_status
    from srd_worker.store.db import make_engine

    runs = [timed_process([*CLI, "status", run_id], env) for _ in range(reps)]
    walls, cpus = [r[0] for r in runs], [r[3] for r in runs]
    engine = make_engine(db_url)
    queries = []
    listed = 0
    for _ in range(reps):
        start = time.perf_counter()
        st = run_status(db=engine, run_id=run_id)
        queries.append(time.perf_counter() - start)
        listed = len(st.shards)
    engine.dispose()
    return statistics.median(walls), statistics.median(cpus), statistics.median(queries), listed


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", default="100000,300000,1000000", help="Comma-separated row counts.")
    ap.add_argument("--shard-size", type=int, default=16)
    ap.add_argument("--status-reps", type=int, default=3)
    ap.add_argument("--no-write", action="store_true")
    args = ap.parse_args()
    counts = sorted(int(c) for c in args.rows.split(","))

    import redis
    from sqlalchemy import create_engine
    from sqlalchemy.engine import make_url

    name = f"srdq_bench_cp_{uuid.uuid4().hex[:8]}"
    admin = create_engine(PG_URL, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.exec_driver_sql(f'CREATE DATABASE "{name}"')
    db_url = make_url(PG_URL).set(database=name).render_as_string(hide_password=False)
    broker = REDIS_URL.rsplit("/", 1)[0] + "/13"
    queue = f"bench-cp-{uuid.uuid4().hex[:8]}"
    env = {
        **os.environ,
        "SRDQ_DATABASE_URL": db_url,
        "SRDQ_BROKER_URL": broker,
        "SRDQ_QUEUE": queue,
        "PYTHONPATH": os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p),
    }
    lines: list[str] = []
    try:
        subprocess.run([*CLI, "db", "upgrade"], env=env, check=True, capture_output=True)
        with tempfile.TemporaryDirectory(prefix="srdq-bench-cp-") as tmp:
            full = Path(tmp) / f"gsm8k_{counts[-1]}.jsonl"
            generate(full, counts[-1])
            results = []
            run_id = ""
            for n in counts:
                path = full if n == counts[-1] else Path(tmp) / f"gsm8k_{n}.jsonl"
                if path != full:
                    head(full, path, n)
                size_mb = path.stat().st_size / 1e6
                wall, rss, out, cpu = timed_process(
                    [
                        *CLI,
                        "submit",
                        "dataset",
                        str(path),
                        "--method",
                        "sampling",
                        "--model",
                        "tiny-random-llama",
                        "--shard-size",
                        str(args.shard_size),
                    ],
                    env,
                )
                run_id = out.strip()
                results.append((n, size_mb, -(-n // args.shard_size), wall, cpu, rss))
                print(
                    f"{n:>9,} rows {size_mb:7.1f} MB: {wall:6.1f} s ({cpu:.1f} s CPU), peak RSS {rss:6.1f} MiB",
                    flush=True,
                )
                if path != full:
                    path.unlink()
            messages = redis.Redis.from_url(broker).llen(queue)
            n_shards = results[-1][2]
            fresh = time_status(env, db_url, run_id, args.status_reps)
            shaped = shape_progress(db_url, run_id, n_shards, args.shard_size)
            progressed = time_status(env, db_url, run_id, args.status_reps)
    finally:
        r = redis.Redis.from_url(broker)
        for key in [queue, *r.scan_iter(match=f"_kombu.binding*.{queue}")]:  # the queue and its binding
            r.delete(key)
        with admin.connect() as conn:
            conn.exec_driver_sql(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        admin.dispose()

    lines.append(
        "| rows | file (MB) | shards | submit wall (s) | submit CPU (s) | rows/s (wall) | peak RSS of submit (MiB) |"
    )
    lines.append("|---:|---:|---:|---:|---:|---:|---:|")
    for n, size_mb, shards, wall, cpu, rss in results:
        lines.append(
            f"| {n:,} | {size_mb:.0f} | {shards:,} | {wall:.1f} | {cpu:.1f} | {n / wall:,.0f} | {rss:.0f} |"
        )
    lines.append("")
    lines.append(
        f"`srdq status` on the {counts[-1]:,}-row run ({n_shards:,} shards), median of {args.status_reps}:"
    )
    lines.append("")
    lines.append(
        "| run state | whole command, fresh process: wall (s) | its CPU (s) | status query in-process (s) "
        "| shards listed |"
    )
    lines.append("|---|---:|---:|---:|---:|")
    for label, (wall, cpu, query, listed) in (
        ("just submitted (all pending)", fresh),
        (f"in progress ({shaped})", progressed),
    ):
        lines.append(f"| {label} | {wall:.2f} | {cpu:.2f} | {query:.3f} | {listed} |")
    lines.append("")
    lines.append(
        f"All {messages:,} shard messages of the {len(counts)} run(s) were in the queue afterwards. "
        f"Command: `nice -n 5 .venv/bin/python benchmarks/control_plane.py --rows {args.rows} "
        f"--shard-size {args.shard_size}` (PostgreSQL {_pg_version(db_url)} and Redis on 127.0.0.1, "
        f"{os.cpu_count()} CPU cores shared with other jobs; load average at the end "
        f"{os.getloadavg()[0]:.1f})."
    )
    body = "\n".join(lines)
    print(body)
    if not args.no_write:
        replace_section(ROOT / "docs" / "PERFORMANCE.md", "control-plane", body)


def _pg_version(db_url: str) -> str:
    from sqlalchemy import create_engine

    eng = create_engine(PG_URL)
    try:
        with eng.connect() as conn:
            return str(conn.exec_driver_sql("show server_version").scalar()).split()[0]
    finally:
        eng.dispose()


if __name__ == "__main__":
    main()
