"""Results on S3 against real servers: a ``moto_server`` process on loopback (S3 HTTP API), a real
PostgreSQL, a real Redis, and ``srdq worker`` processes running the tiny random Llama.

- upload order: a shard's parts, then its manifest; the run manifest last, once every shard is done;
- a re-upload is idempotent (same keys, same bytes), a corrupted part is caught by its sha256 and
  ``srdq sync --verify`` puts the right bytes back from PostgreSQL;
- workers upload each shard when it finishes, then the run manifest; ``read_run`` equals PostgreSQL;
- S3 unreachable during a run: the run completes in PostgreSQL, then ``srdq sync RUN`` uploads it all;
  or, with no command, a worker's reaper does;
- ``srdq export`` in parquet, jsonl and csv (to a file and to S3) equals the PostgreSQL rows, and an item
  that failed for real (a prompt longer than the model's context) is exported with its error, failed.
"""

from __future__ import annotations

import csv
import io
import json
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import text

from srd_worker.errors import ObjectStoreError
from srd_worker.results.artifacts import read_run, run_manifest_key, shard_key, verify_shard
from srd_worker.results.export import csv_cell
from srd_worker.results.objects import S3ObjectStore
from tests.integration.fleet import (
    fleet,
    free_port,
    kill,
    srdq,
    start_worker,
    worker_log,
)
from tests.integration.fleet import submit as fleet_submit

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("servers")]

CREDENTIALS = {"access_key": "testing", "secret_key": "testing"}
PREFIX = "results"


@pytest.fixture
def env(tmp_path: Path, endpoint: str) -> Iterator[dict[str, Any]]:
    """A fresh migrated database, a Redis database number, a fresh bucket; torn down after."""
    from srd_worker.store.db import make_engine

    store = S3ObjectStore(f"srdq-res-{uuid.uuid4().hex[:12]}", PREFIX, endpoint_url=endpoint, **CREDENTIALS)
    store.ensure_bucket()
    with fleet(
        tmp_path,
        "srdq_res",
        SRDQ_OBJECT_STORE_URL=f"s3://{store.bucket}/{PREFIX}",
        SRDQ_S3_ENDPOINT_URL=endpoint,
        SRDQ_AWS_ACCESS_KEY_ID="testing",
        SRDQ_AWS_SECRET_ACCESS_KEY="testing",
    ) as ctx:
        db = make_engine(ctx["db_url"])
        ctx.update(db=db, store=store)
        try:
            yield ctx
        finally:
            db.dispose()


def rows(ctx: dict, sql: str, **params) -> list:
    with ctx["db"].connect() as conn:
        return list(conn.execute(text(sql), params))


def wait_for(pred, timeout: float, what: str, poll: float = 0.3):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        value = pred()
        if value:
            return value
        time.sleep(poll)
    raise AssertionError(f"timed out waiting for {what}")


def pg_records(ctx: dict, run_id: str) -> list[dict]:
    return [
        r[0] for r in rows(ctx, "select record from result where run_id = :r order by position", r=run_id)
    ]


def upload_marks(ctx: dict, run_id: str) -> tuple[list, Any]:
    shards = [
        r[0] for r in rows(ctx, "select uploaded_at from shard where run_id = :r order by index", r=run_id)
    ]
    (manifest_at,) = rows(ctx, "select manifest_at from run where id = :r", r=run_id)[0]
    return shards, manifest_at


# --------------------------------------------------------------------- in-process, hand-made results
class RecordingStore:
    """The real S3 store, noting the key of every put in order."""

    def __init__(self, inner: S3ObjectStore) -> None:
        self.inner = inner
        self.puts: list[str] = []

    def put_bytes(self, key: str, data: bytes, content_type: str | None = None) -> None:
        self.inner.put_bytes(key, data, content_type)
        self.puts.append(key)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


N_ITEMS, SHARD_SIZE = 5, 2  # shards 0, 1, 2 (the last holds one item)


def make_run(db, run_id: str = "run-hand") -> str:
    from srd_worker.store import crud
    from srd_worker.store.db import session_scope
    from srd_worker.tasks.base import Item

    items = [
        Item(id=f"q{i}", question=f"What is {i} + {i}?", gold=str(2 * i), meta={}) for i in range(N_ITEMS)
    ]
    with session_scope(db) as session:
        crud.create_run(
            session=session,
            run_id=run_id,
            name="hand",
            spec={"method": "best_of_n", "params": {"n": 2}},
            config_hash="h",
            versions={"srdq": "test"},
            items=items,
            shard_size=SHARD_SIZE,
        )
    return run_id


def hand_record(i: int) -> dict:
    failed = i == 3
    return {
        "item_id": f"q{i}",
        "position": i,
        "question": f"What is {i} + {i}?",
        "gold": str(2 * i),
        "method": "best_of_n",
        "response": None if failed else f'{i} + {i} = {2 * i}\nSo: {2 * i}, "done"',
        "answer": None if failed else str(2 * i),
        "correct": None if failed else i % 2 == 0,
        "reward": None if failed else 0.25 * i,
        "finish_reason": None if failed else "stop",
        "ledger": None
        if failed
        else {
            "gen_tokens": 10 + i,
            "prefill_tokens": 20,
            "lm_calls": 2,
            "rm_calls": 2,
            "rm_tokens": 10 + i,
            "components": {
                "drafter": {"calls": 1, "in_tokens": 20, "out_tokens": 10 + i},
                "scorer": {"calls": 1, "in_tokens": 10 + i, "out_tokens": 0},
            },
        },
        "error": "prompt of 3000 tokens does not fit the model context of 2048" if failed else None,
        "extra": {} if failed else {"chosen": 0, "rewards": [0.25 * i, 0.1]},
        "timing": None if failed else {"drafter": 0.5 + i, "scorer": 0.01},
    }


def finish_shard(db, run_id: str, index: int) -> None:
    from srd_worker.store import leases
    from srd_worker.store.db import session_scope
    from srd_worker.store.shard_store import SqlShardStore

    positions = range(index * SHARD_SIZE, min((index + 1) * SHARD_SIZE, N_ITEMS))
    SqlShardStore(db, run_id, index).save_results([hand_record(i) for i in positions])
    with session_scope(db) as session:
        leases.finish_run_if_complete(session=session, run_id=run_id)


def test_parts_then_shard_manifest_then_run_manifest_last(env) -> None:
    from srd_worker.results.sync import sync_run

    db, run_id = env["db"], make_run(env["db"])
    store = RecordingStore(env["store"])
    finish_shard(db, run_id, 1)
    finish_shard(db, run_id, 0)
    report = sync_run(db, store, run_id)
    assert (report.uploaded, report.unfinished, report.manifest) == ([0, 1], [2], "waiting")
    assert not env["store"].exists(run_manifest_key(run_id))
    finish_shard(db, run_id, 2)
    (updated_before,) = rows(env, "select updated_at from run where id = :r", r=run_id)[0]
    report = sync_run(db, store, run_id)
    assert (report.uploaded, report.already, report.manifest) == ([2], [0, 1], "written")
    assert report.manifest_url == f"s3://{env['store'].bucket}/{PREFIX}/runs/{run_id}/manifest.json"

    def shard_puts(i: int) -> list[str]:
        return [shard_key(run_id, i, s) for s in ("jsonl", "parquet", "manifest.json")]

    assert store.puts == shard_puts(0) + shard_puts(1) + shard_puts(2) + [run_manifest_key(run_id)]
    assert read_run(env["store"], run_id) == pg_records(env, run_id)
    shards, manifest_at = upload_marks(env, run_id)
    assert all(s is not None for s in shards) and manifest_at >= max(shards)
    # recording the upload does not move the run's last status change (its wall time)
    (updated_after,) = rows(env, "select updated_at from run where id = :r", r=run_id)[0]
    assert updated_after == updated_before


def test_reupload_is_idempotent(env) -> None:
    from srd_worker.results.sync import sync_run

    db, store, run_id = env["db"], env["store"], make_run(env["db"])
    for i in range(3):
        finish_shard(db, run_id, i)
    sync_run(db, store, run_id)

    def snapshot() -> dict[str, str]:
        listing = store.client.list_objects_v2(Bucket=store.bucket, Prefix=f"{PREFIX}/runs/{run_id}/")
        return {o["Key"]: o["ETag"] for o in listing["Contents"] if not o["Key"].endswith("manifest.json")}

    before = snapshot()
    assert len(before) == 6  # jsonl + parquet for 3 shards
    again = sync_run(db, store, run_id)
    assert (again.uploaded, again.already, again.manifest) == ([], [0, 1, 2], "present")
    forced = sync_run(db, store, run_id, force=True)
    assert (forced.uploaded, forced.manifest) == ([0, 1, 2], "written")
    assert snapshot() == before  # same keys, same bytes
    assert len(store.list(f"runs/{run_id}/")) == 3 * 3 + 1
    assert read_run(store, run_id) == pg_records(env, run_id)


def test_a_corrupted_part_is_detected_and_sync_verify_repairs_it(env) -> None:
    from srd_worker.results.sync import sync_run

    db, store, run_id = env["db"], env["store"], make_run(env["db"])
    for i in range(3):
        finish_shard(db, run_id, i)
    sync_run(db, store, run_id)
    key = shard_key(run_id, 1, "jsonl")
    good = store.get_bytes(key)
    at = good.index(b'"gold":"4"') + len(b'"gold":"')
    bad = good[:at] + b"5" + good[at + 1 :]  # one byte changed, same size: only the sha256 can tell
    assert bad != good and len(bad) == len(good)
    store.put_bytes(key, bad)
    with pytest.raises(ObjectStoreError, match=r"00001\.jsonl has sha256 .* but .* says"):
        read_run(store, run_id)
    with pytest.raises(ObjectStoreError, match="sha256"):
        verify_shard(store, run_id, 1)
    # a plain sync trusts the database's upload marks; --verify checks the bytes and repairs
    assert "uploaded shards: none" in srdq(env, "sync", run_id).stdout
    proc = srdq(env, "sync", run_id, "--verify")
    assert proc.returncode == 0, proc.stderr
    assert "re-uploaded (missing or corrupt in the store): 1" in proc.stdout
    assert "run manifest written" in proc.stdout
    assert store.get_bytes(key) == good
    assert read_run(store, run_id) == pg_records(env, run_id)


def test_sync_with_the_store_down_marks_nothing_uploaded(env) -> None:
    from srd_worker.results.sync import sync_run

    db, run_id = env["db"], make_run(env["db"])
    for i in range(3):
        finish_shard(db, run_id, i)
    down = S3ObjectStore(
        env["store"].bucket,
        PREFIX,
        endpoint_url=f"http://127.0.0.1:{free_port()}",
        **CREDENTIALS,
        max_attempts=1,
        retry_attempts=1,
        connect_timeout=1.0,
    )
    with pytest.raises(ObjectStoreError, match="failed"):
        sync_run(db, down, run_id)
    assert upload_marks(env, run_id) == ([None, None, None], None)
    proc = srdq(env, "sync", run_id, SRDQ_S3_ENDPOINT_URL=down.endpoint_url)
    assert proc.returncode == 1, proc.stderr
    assert proc.stderr.strip().splitlines()[-1].startswith("Error: S3 put s3://"), proc.stderr
    assert upload_marks(env, run_id) == ([None, None, None], None)


# -------------------------------------------------------------------------- real workers, real runs
DATA_ROWS = 5


@pytest.fixture(scope="module")
def dataset(tmp_path_factory, datasets_dir) -> Path:
    """5 GSM8K problems and, third, one whose prompt is longer than tiny-random-llama's 2048-token
    context (one token per byte), so the runner marks it failed."""
    path = tmp_path_factory.mktemp("res") / "gsm8k_long.jsonl"
    lines = (datasets_dir / "gsm8k_test.jsonl").read_text(encoding="utf-8").splitlines()[:DATA_ROWS]
    long_row = {
        "question": "Count the ducks. " * 150 + "How many ducks are there?",
        "answer": "Many.\n#### 150",
    }
    lines.insert(2, json.dumps(long_row))
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


RUN_ARGS = [
    "--method",
    "best_of_n",
    "--n",
    "2",
    "--reward",
    "arithmetic",
    "--model",
    "tiny-random-llama",
    "--max-new-tokens",
    "16",
    "--set",
    "chunk_tokens=8",
    "--seed",
    "5",
    "--shard-size",
    "2",
]


def submit(ctx: dict, dataset: Path) -> str:
    return fleet_submit(ctx, str(dataset), *RUN_ARGS)


def run_done(ctx: dict, run_id: str) -> bool:
    (status,) = rows(ctx, "select status from run where id = :r", r=run_id)[0]
    assert status not in ("failed", "cancelled"), status
    return status == "done"


def closed_endpoint() -> str:
    return f"http://127.0.0.1:{free_port()}"  # nothing listens there


def unflatten(row: dict) -> dict:
    """A flat export row (Parquet, JSON columns decoded) back to the nested record."""
    record: dict[str, Any] = {}
    ledger: dict[str, Any] = {}
    components: dict[str, dict] = {}
    timing: dict[str, Any] = {}
    extra: dict[str, Any] = {}
    for name, value in row.items():
        if name in (
            "gen_tokens",
            "prefill_tokens",
            "lm_calls",
            "rm_calls",
            "rm_tokens",
            "rm_cache_hits",
            "rm_cache_hit_tokens",
        ):
            ledger[name] = value
        elif name.startswith("components."):
            _, comp, count = name.split(".")
            components.setdefault(comp, {})[count] = value
        elif name.startswith("timing."):
            timing[name.split(".", 1)[1]] = value
        elif name.startswith("extra."):
            if value is not None:
                extra[name.split(".", 1)[1]] = value
        else:
            record[name] = value
    has_ledger = any(v is not None for v in ledger.values())
    record["ledger"] = {**ledger, "components": components} if has_ledger else None
    record["timing"] = timing if any(v is not None for v in timing.values()) else None
    record["extra"] = extra
    return record


def check_exports(ctx: dict, run_id: str) -> None:
    """Every format, read back, equals the PostgreSQL rows; the failed item is there, marked failed."""
    import pyarrow.parquet as pq

    records = pg_records(ctx, run_id)
    shards = [
        r[0]
        for r in rows(ctx, "select shard_index from result where run_id = :r order by position", r=run_id)
    ]
    added = [
        {
            "run_id": run_id,
            "shard_index": s,
            "status": "failed" if r["error"] else "done",
            "failed": bool(r["error"]),
        }
        for r, s in zip(records, shards, strict=True)
    ]
    out = ctx["tmp"] / "export"
    for fmt in ("jsonl", "csv", "parquet"):
        proc = srdq(ctx, "export", run_id, "--format", fmt, "--out", str(out / f"run.{fmt}"))
        assert proc.returncode == 0, proc.stderr
        assert proc.stdout.strip() == f"{len(records)} rows (1 failed) -> {out / f'run.{fmt}'}"

    jsonl = [json.loads(line) for line in (out / "run.jsonl").read_text().splitlines()]
    assert jsonl == [{**r, **a} for r, a in zip(records, added, strict=True)]

    table = pq.read_table(out / "run.parquet")
    json_columns = set(json.loads(table.schema.metadata[b"srdq.json_columns"]))
    assert "extra.rewards" in json_columns and "gen_tokens" not in json_columns
    assert table.schema.field("gen_tokens").type == "int64" and table.schema.field("correct").type == "bool"
    flat = table.to_pylist()
    for row in flat:
        for name in json_columns:
            row[name] = None if row[name] is None else json.loads(row[name])
    assert [unflatten(r) for r in flat] == [{**r, **a} for r, a in zip(records, added, strict=True)]

    with open(out / "run.csv", newline="", encoding="utf-8") as fh:
        reader = csv.DictReader(fh)
        assert reader.fieldnames[:7] == [
            "run_id",
            "position",
            "item_id",
            "shard_index",
            "status",
            "failed",
            "error",
        ]
        assert "gen_tokens" in reader.fieldnames and "components.drafter.calls" in reader.fieldnames
        csv_rows = list(reader)
    as_text = [
        {
            k: csv_cell(
                json.dumps(v, sort_keys=True, ensure_ascii=False, separators=(",", ":"))
                if isinstance(v, list)
                else v
            )
            for k, v in r.items()
        }
        for r in flat
    ]
    assert csv_rows == as_text

    failed = [r for r in jsonl if r["failed"]]
    assert len(failed) == 1 and failed[0]["position"] == 2 and failed[0]["status"] == "failed"
    assert "does not fit the model context of 2048" in failed[0]["error"]
    assert csv_rows[2]["failed"] == "true" and csv_rows[2]["error"] == failed[0]["error"]
    assert flat[2]["failed"] is True and flat[2]["correct"] is None

    # to S3, through the object store
    key = f"exports/{run_id}.parquet"
    proc = srdq(ctx, "export", run_id, "--format", "parquet", "--out", f"s3://{ctx['store'].bucket}/{key}")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip().endswith(f"-> s3://{ctx['store'].bucket}/{key}")
    got = S3ObjectStore(
        ctx["store"].bucket, "", endpoint_url=ctx["store"].endpoint_url, **CREDENTIALS
    ).get_bytes(key)
    assert pq.read_table(io.BytesIO(got)).to_pylist() == table.to_pylist()


def test_workers_upload_shards_and_manifest_and_exports_equal_postgres(env, dataset) -> None:
    run_id = submit(env, dataset)
    start_worker(env, "a")
    wait_for(lambda: run_done(env, run_id), 240, "run to finish")
    wait_for(lambda: upload_marks(env, run_id)[1] is not None, 60, "run manifest")
    shards, manifest_at = upload_marks(env, run_id)
    assert len(shards) == 3 and all(s is not None for s in shards) and manifest_at >= max(shards)
    store = env["store"]
    assert read_run(store, run_id) == pg_records(env, run_id)
    for i in range(3):
        assert verify_shard(store, run_id, i)["n_records"] == 2
    manifest = json.loads(store.get_bytes(run_manifest_key(run_id)))
    assert manifest["n_records"] == DATA_ROWS + 1 and manifest["spec"]["method"] == "best_of_n"
    assert "uploaded" in worker_log(env, "a")
    check_exports(env, run_id)


def test_s3_down_during_the_run_then_srdq_sync_uploads_everything(env, dataset) -> None:
    run_id = submit(env, dataset)
    start_worker(env, "a", SRDQ_S3_ENDPOINT_URL=closed_endpoint())
    wait_for(lambda: run_done(env, run_id), 300, "run to finish with S3 down")
    assert upload_marks(env, run_id) == ([None, None, None], None)
    assert env["store"].list() == []
    assert "upload of run " in worker_log(env, "a") and "results (after shard" in worker_log(env, "a")
    assert len(pg_records(env, run_id)) == DATA_ROWS + 1  # nothing lost: every result is in PostgreSQL
    proc = srdq(env, "sync", run_id)
    assert proc.returncode == 0, proc.stderr
    assert "uploaded shards: 0, 1, 2" in proc.stdout and "run manifest written" in proc.stdout
    assert read_run(env["store"], run_id) == pg_records(env, run_id)
    again = srdq(env, "sync", run_id)
    assert "uploaded shards: none" in again.stdout and "run manifest already there" in again.stdout


def test_a_workers_reaper_uploads_what_could_not_be_uploaded(env, dataset) -> None:
    run_id = submit(env, dataset)
    a = start_worker(env, "a", SRDQ_S3_ENDPOINT_URL=closed_endpoint())
    wait_for(lambda: run_done(env, run_id), 300, "run to finish with S3 down")
    kill(a)
    assert upload_marks(env, run_id)[1] is None
    start_worker(env, "b")  # the store is reachable again: no command, the reaper catches up
    wait_for(lambda: upload_marks(env, run_id)[1] is not None, 120, "reaper to upload the run")
    assert all(s is not None for s in upload_marks(env, run_id)[0])
    assert read_run(env["store"], run_id) == pg_records(env, run_id)
    assert f"pending uploads: run {run_id} shards [0, 1, 2] uploaded, run manifest written" in worker_log(
        env, "b"
    )
