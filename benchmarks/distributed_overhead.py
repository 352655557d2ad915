"""The fleet's fixed latency and overhead beside the embedded runner, and the checkpoint write time.

Side by side in one run, on a tiny model so the fixed costs are not hidden under the model's compute:

1. ``srdq submit dataset`` (the real command, a separate process) → a warm ``srdq worker`` (a separate
   process, real PostgreSQL and Redis, engine already built by a warm-up run) → every shard done in
   PostgreSQL; then the embedded runner (``local.run_local``, what ``srdq run`` calls, engine loaded
   beforehand) on the same shards and spec. Repeated ``--reps`` times, alternating, medians reported.
   From the worker's JSON log (``rounds_started``, ``shard_leased``, ``shard_finished``) it reports the
   latency from ``submit`` returning, and from the run being stored, to the first round's start; the
   worker's setup per slice (lease → first round); the gap between one shard's end and the next one's
   lease; each side's time outside the method's steps (wall time minus the rounds' model and reward
   time; the worker logs it as ``compute_seconds``), the per-shard fixed cost ((fleet − embedded) of
   that ÷ shards), and fleet ÷ embedded wall time, measured and at equal compute.
2. Checkpoint write time as a share of round time, for SQLite (embedded) and PostgreSQL (service).

    nice -n 5 scripts/with-services .venv/bin/python benchmarks/distributed_overhead.py [--model testbed]

Needs PostgreSQL and Redis (SRDQ_TEST_PG_URL / SRDQ_TEST_REDIS_URL; ``scripts/with-services`` starts
throwaway ones). Works in a scratch database and Redis database 14 of that server (flushed). Prints a
table and writes it into docs/PERFORMANCE.md.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from datetime import datetime
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks._doc import replace_section  # noqa: E402

PG_URL = os.environ.get("SRDQ_TEST_PG_URL", "postgresql+psycopg2://postgres@127.0.0.1:5432/postgres")
REDIS_URL = os.environ.get("SRDQ_TEST_REDIS_URL", "redis://127.0.0.1:6379/0")
CLI = [sys.executable, "-m", "srdq_cli.main"]
TESTBED_DATA = ROOT / "srd_worker" / "testbed" / "artifacts" / "data" / "test.jsonl"


def _ts(iso: str) -> float:
    return datetime.fromisoformat(iso).timestamp()


def _events(log_path: Path) -> list[dict[str, Any]]:
    """The worker's structured events (JSON lines carrying ``event``), in order."""
    out = []
    for line in log_path.read_text(encoding="utf-8", errors="replace").splitlines():
        if not line.startswith("{"):
            continue
        try:
            rec = json.loads(line)
        except ValueError:
            continue
        if "event" in rec:
            out.append(rec)
    return out


def _wait_done(pg: Any, run_id: str, timeout_s: float = 900.0) -> None:
    """Poll the run's status until done. Slowly (0.2 s): the moment it finished is read from the worker's
    log, and a fast poll would take CPU from the worker that the embedded side does not lose."""
    from sqlalchemy import text

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        with pg.connect() as conn:
            status = conn.execute(text("select status from run where id = :r"), {"r": run_id}).scalar()
        if status == "done":
            return
        if status in ("failed", "cancelled"):
            raise SystemExit(f"benchmark run {run_id} ended {status}")
        time.sleep(0.2)
    raise SystemExit(f"benchmark run {run_id} did not finish in {timeout_s} s")


def _median(xs: list[float]) -> float:
    return statistics.median(xs) if xs else float("nan")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dataset", default=str(TESTBED_DATA))
    ap.add_argument("--model", default="testbed")
    ap.add_argument("--items", type=int, default=8)
    ap.add_argument("--shard-size", type=int, default=2)
    ap.add_argument("--n", type=int, default=2)
    ap.add_argument("--max-new-tokens", type=int, default=32)
    ap.add_argument("--chunk-tokens", type=int, default=16)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--no-write", action="store_true")
    args = ap.parse_args()

    import redis
    from sqlalchemy import create_engine, text
    from sqlalchemy.engine import make_url

    from srd_worker.engines.registry import build_engine
    from srd_worker.local import run_local
    from srd_worker.methods.registry import build_method
    from srd_worker.provenance import applied_settings
    from srd_worker.rewards.registry import build_reward
    from srd_worker.runner import run_shard
    from srd_worker.settings import Settings
    from srd_worker.spec import prepare_run
    from srd_worker.store import crud
    from srd_worker.store.db import make_engine, session_scope, sqlite_url, upgrade
    from srd_worker.store.shard_store import SqlShardStore

    params = {"n": args.n, "max_new_tokens": args.max_new_tokens, "chunk_tokens": args.chunk_tokens}
    n_shards = -(-args.items // args.shard_size)
    db_name = f"srdq_bench_{uuid.uuid4().hex[:8]}"
    admin = create_engine(PG_URL, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(text(f'CREATE DATABASE "{db_name}"'))
    db_url = make_url(PG_URL).set(database=db_name).render_as_string(hide_password=False)
    broker = REDIS_URL.rsplit("/", 1)[0] + "/14"
    redis.Redis.from_url(broker).flushdb()
    env = {
        **os.environ,
        "SRDQ_DATABASE_URL": db_url,
        "SRDQ_BROKER_URL": broker,
        "SRDQ_QUEUE": "bench",
        "SRDQ_DEVICE": "cpu",
        "SRDQ_SLICE_ROUNDS": "1000",
        "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep),
    }
    os.environ.update(
        {k: env[k] for k in ("SRDQ_DATABASE_URL", "SRDQ_BROKER_URL", "SRDQ_QUEUE", "SRDQ_DEVICE")}
    )
    settings = Settings(device="cpu")
    log_path = Path(tempfile.gettempdir()) / f"srdq-bench-worker-{os.getpid()}.log"
    worker = None
    rows: list[str] = []

    def prepared_for(seed: int) -> Any:
        return prepare_run(
            dataset=args.dataset,
            method="best_of_n",
            params=params,
            model=args.model,
            reward="arithmetic",
            seed=seed,
            limit=args.items,
            shard_size=args.shard_size,
            settings=settings,
        )

    try:
        subprocess.run([*CLI, "db", "upgrade"], env=env, check=True, capture_output=True, cwd=ROOT)
        with open(log_path, "w") as log:
            worker = subprocess.Popen(
                [*CLI, "worker", "--log-format", "json"],
                env=env,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                cwd=ROOT,
            )
        pg = create_engine(db_url)

        def fleet(seed: int) -> dict[str, Any]:
            """One run through `srdq submit dataset` and the warm worker; wall clock (time.time()) marks."""
            t_start = time.time()
            out = subprocess.run(
                [
                    *CLI,
                    "submit",
                    "dataset",
                    args.dataset,
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
                    "--limit",
                    str(args.items),
                    "--shard-size",
                    str(args.shard_size),
                    "--seed",
                    str(seed),
                ],
                env=env,
                check=True,
                capture_output=True,
                text=True,
                cwd=ROOT,
            )
            t_returned = time.time()
            run_id = out.stdout.strip().splitlines()[-1]
            _wait_done(pg, run_id)
            with pg.connect() as conn:
                created = conn.execute(
                    text("select created_at from run where id = :r"), {"r": run_id}
                ).scalar_one()
            return {
                "run_id": run_id,
                "start": t_start,
                "returned": t_returned,
                "stored": created.timestamp(),
            }

        # warm-up: the worker builds its engine (and imports its graders) on its first shard
        fleet(seed=1)
        engine = build_engine(
            "transformers", args.model, applied_settings(settings, prepared_for(1).spec.engine_config)
        )

        def embedded(seed: int) -> tuple[float, float]:
            """Wall time of `run_local` on the run's shards, and its time in the method's steps."""
            prepared = prepared_for(seed)
            compute = [0.0]

            def on_round(rep: Any) -> None:
                compute[0] += rep.round_seconds - rep.checkpoint_seconds

            with tempfile.TemporaryDirectory() as tmp:
                t0 = time.perf_counter()
                run_local(prepared, out_dir=tmp, settings=settings, engine=engine, on_round=on_round)
                return time.perf_counter() - t0, compute[0]

        embedded(seed=1)  # warm-up of the in-process side alike
        fleet_runs, embedded_runs = [], []
        for rep in range(args.reps):
            # the order alternates, so a load that drifts during the run favours neither side
            if rep % 2:
                embedded_runs.append(embedded(seed=100 + rep))
                fleet_runs.append(fleet(seed=100 + rep))
            else:
                fleet_runs.append(fleet(seed=100 + rep))
                embedded_runs.append(embedded(seed=100 + rep))

        events = _events(log_path)
        first_round_from_return, first_round_from_store, setup, gaps = [], [], [], []
        for run in fleet_runs:
            mine = [e for e in events if e.get("run_id") == run["run_id"]]
            finished = [e for e in mine if e["event"] == "shard_finished"]
            # the run is done in the transaction that stores its last shard's results; the worker logs
            # `shard_finished` right after that commit
            run["done"] = max(_ts(e["ts"]) for e in finished)
            run["compute"] = sum(float(e["compute_seconds"]) for e in finished)
            starts = [_ts(e["ts"]) for e in mine if e["event"] == "rounds_started"]
            first_round_from_return.append(min(starts) - run["returned"])
            first_round_from_store.append(min(starts) - run["stored"])
            setup += [float(e["seconds"]) for e in mine if e["event"] == "rounds_started"]
            # one worker, shards back to back: a shard's end → the next shard's lease
            ends = [_ts(e["ts"]) for e in finished]
            leases = [_ts(e["ts"]) for e in mine if e["event"] == "shard_leased"]
            gaps += [lease - end for end, lease in zip(ends, leases[1:], strict=False)]
        submit_s = [r["returned"] - r["start"] for r in fleet_runs]
        fleet_cli = [r["done"] - r["start"] for r in fleet_runs]
        fleet_stored = [r["done"] - r["stored"] for r in fleet_runs]
        embedded_s = [wall for wall, _ in embedded_runs]
        emb = _median(embedded_s)
        # everything but the method's steps (model and reward calls): the part a fleet can add to
        fleet_fixed = [r["done"] - r["stored"] - r["compute"] for r in fleet_runs]
        fleet_cli_fixed = [r["done"] - r["start"] - r["compute"] for r in fleet_runs]
        emb_fixed = [wall - compute for wall, compute in embedded_runs]
        per_shard = [(f - e) / n_shards for f, e in zip(fleet_fixed, emb_fixed, strict=True)]
        # the same compute on both sides (the embedded run's): the ratio the fixed costs alone make, free of
        # the load's noise on the rounds themselves
        at_equal = [(c + f) / w for (w, c), f in zip(embedded_runs, fleet_fixed, strict=True)]
        at_equal_cli = [(c + f) / w for (w, c), f in zip(embedded_runs, fleet_cli_fixed, strict=True)]

        # checkpoint cost per round, one shard run in-process on each store
        prepared = prepared_for(2)
        reward = build_reward("arithmetic", engine)
        shard_items = prepared.items[: args.shard_size]

        def checkpoints(url: str) -> tuple[float, float, int]:
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
                    items=shard_items,
                    shard_size=len(shard_items),
                )
            outcome = run_shard(
                items=shard_items,
                positions=list(range(len(shard_items))),
                method=build_method("best_of_n", params),
                task=prepared.task,
                engine=engine,
                reward=reward,
                run_seed=2,
                store=SqlShardStore(db, run_id, 0),
            )
            db.dispose()
            return outcome.checkpoint_seconds, outcome.round_seconds, outcome.rounds

        with tempfile.TemporaryDirectory() as tmp:
            sqlite_ck, sqlite_round, rounds = checkpoints(sqlite_url(Path(tmp) / "bench.db"))
        pg_ck, pg_round, _ = checkpoints(db_url)
        load = os.getloadavg()[0]
        rows = [
            f"Measured {time.strftime('%Y-%m-%d')} on CPU, model {args.model}, {args.items} problems of "
            f"`{Path(args.dataset).name}` in {n_shards} shards of {args.shard_size}, Best-of-N n={args.n}, "
            f"max_new_tokens={args.max_new_tokens}, chunk_tokens={args.chunk_tokens}, arithmetic reward; one "
            "warm worker (engine built by a warm-up run), PostgreSQL and Redis on loopback; fleet and embedded "
            f"runs alternated, {args.reps} of each, medians (load average at the end {load:.1f} on 2 cores).",
            "",
            f"**Fleet ÷ embedded wall time, same shards, at equal compute = {_median(at_equal):.3f}**; "
            f"**including the `srdq submit` command = {_median(at_equal_cli):.3f}**. As measured (the rounds' "
            f"own time varies with the machine's load): {_median(fleet_stored) / emb:.3f} (run stored → every "
            f"shard done: {_median(fleet_stored):.2f} s; embedded `run_local`, engine loaded: {emb:.2f} s), "
            f"{_median(fleet_cli) / emb:.3f} from the start of `srdq submit` ({_median(fleet_cli):.2f} s).",
            "",
            "| fixed cost | median | min | max |",
            "|---|---:|---:|---:|",
        ]
        for label, xs in (
            ("`srdq submit` returned → first round starts on the warm worker (s)", first_round_from_return),
            ("run stored (`run.created_at`) → first round starts (s)", first_round_from_store),
            ("worker: lease → first round, per shard (s)", setup),
            ("worker: a shard's end → the next shard's lease (s)", gaps),
            ("fleet, outside the method's steps: run stored → done, per run (s)", fleet_fixed),
            ("embedded, outside the method's steps, per run (s)", emb_fixed),
            ("per shard: (fleet − embedded) outside the method's steps ÷ shards (s)", per_shard),
            ("`srdq submit` command, process start → exit (s)", submit_s),
        ):
            rows.append(f"| {label} | {_median(xs):.3f} | {min(xs):.3f} | {max(xs):.3f} |")
        rows += [
            "",
            f"Checkpoint writes, one shard of {args.shard_size} in-process ({rounds} rounds):",
            "",
            "| store | checkpoint s (all rounds) | round s (all rounds) | checkpoint share of round time | per round ms |",
            "|---|---:|---:|---:|---:|",
            f"| SQLite (embedded) | {sqlite_ck:.3f} | {sqlite_round:.2f} | {100 * sqlite_ck / sqlite_round:.2f}% | "
            f"{1000 * sqlite_ck / rounds:.1f} |",
            f"| PostgreSQL (service) | {pg_ck:.3f} | {pg_round:.2f} | {100 * pg_ck / pg_round:.2f}% | "
            f"{1000 * pg_ck / rounds:.1f} |",
            "",
            f"Command: `nice -n 5 scripts/with-services .venv/bin/python benchmarks/distributed_overhead.py "
            f"--model {args.model} --items {args.items} --shard-size {args.shard_size} --n {args.n} "
            f"--max-new-tokens {args.max_new_tokens} --chunk-tokens {args.chunk_tokens} --reps {args.reps}`",
        ]
        print("\n".join(rows))
    finally:
        if worker is not None:
            os.killpg(worker.pid, signal.SIGKILL)
            worker.wait()
        redis.Redis.from_url(broker).flushdb()
        with admin.connect() as conn:
            conn.execute(text(f'DROP DATABASE IF EXISTS "{db_name}" WITH (FORCE)'))
    if rows and not args.no_write:
        replace_section(ROOT / "docs" / "PERFORMANCE.md", "distributed-overhead", "\n".join(rows))


if __name__ == "__main__":
    main()
