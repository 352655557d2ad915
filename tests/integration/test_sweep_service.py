"""``srdq submit dataset --sweep`` on the real PostgreSQL and Redis: every run and shard stored with the
sweep id, idempotent re-submission, a bad sweep storing nothing, ``srdq status SWEEP``, and a sweep that
survives a worker SIGKILLed mid-shard."""

from __future__ import annotations

import json
import os
import signal
import subprocess
from pathlib import Path

import pytest

from tests.integration.fleet import srdq as fleet_srdq
from tests.integration.fleet import start_worker
from tests.integration.test_service import db_rows, wait_for

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("servers")]


def sweep_file(tmp_path: Path, datasets_dir: Path, *, extra: str = "") -> Path:
    data = tmp_path / "gsm8k_6.jsonl"
    rows = (datasets_dir / "gsm8k_test.jsonl").read_text(encoding="utf-8").splitlines()[:6]
    data.write_text("\n".join(rows) + "\n", encoding="utf-8")
    path = tmp_path / "grid.yaml"
    path.write_text(
        "dataset: gsm8k_6.jsonl\nmodel: tiny-random-llama\nreward: arithmetic\nshard_size: 2\n"
        "seeds: [0, 1]\nmethods:\n"
        "  - method: best_of_n\n    n: 2\n    params: {max_new_tokens: 48, chunk_tokens: 4}\n"
        "  - method: self_consistency\n    n: 2\n    params: {max_new_tokens: 48, chunk_tokens: 4}\n" + extra
    )
    return path


def srdq(ctx: dict, *args: str) -> subprocess.CompletedProcess:
    return fleet_srdq(ctx, *args, timeout=180)


def test_bad_sweep_stores_and_enqueues_nothing(env, tmp_path, datasets_dir):
    path = sweep_file(tmp_path, datasets_dir)
    path.write_text(path.read_text().replace("chunk_tokens: 4}\n", "chunk_tokens: -1}\n", 1))
    proc = srdq(env, "submit", "dataset", "--sweep", str(path))
    assert proc.returncode == 1
    assert len(proc.stderr.strip().splitlines()) == 1 and "chunk_tokens" in proc.stderr
    assert db_rows(env, "select count(*) from run")[0][0] == 0
    assert db_rows(env, "select count(*) from sweep")[0][0] == 0


def test_submit_sweep_stores_runs_with_the_sweep_id_and_survives_a_killed_worker(env, tmp_path, datasets_dir):
    path = sweep_file(tmp_path, datasets_dir)
    proc = srdq(env, "submit", "dataset", "--sweep", str(path))
    assert proc.returncode == 0, proc.stderr
    sid, *run_ids = proc.stdout.split()
    assert sid.startswith("sweep-") and len(run_ids) == 4 and "12 shards enqueued" in proc.stderr
    again = srdq(env, "submit", "dataset", "--sweep", str(path))  # same ids, nothing enqueued again
    assert again.returncode == 0 and again.stdout.split() == [sid, *run_ids]
    assert "0 shards enqueued" in again.stderr
    stored = db_rows(env, "select id, sweep_id from run order by id")
    assert stored == sorted((r, sid) for r in run_ids)
    shards = db_rows(
        env, "select count(*) from shard join run on run.id = shard.run_id where run.sweep_id = :s", s=sid
    )
    assert shards[0][0] == 12
    (name, content, listed) = db_rows(env, "select name, content, run_ids from sweep where id = :s", s=sid)[0]
    assert name == "grid" and json.loads(content)["seeds"] == [0, 1] and listed == run_ids

    st = srdq(env, "status", sid)
    assert st.returncode == 0, st.stderr
    assert all(r in st.stdout for r in run_ids) and "pending" in st.stdout, st.stdout

    a = start_worker(env, "a")

    def mid_shard():
        rows = db_rows(env, "select run_id from shard where status = 'running' and round >= 2")
        return rows[0] if rows else None

    wait_for(mid_shard, 180, "a shard in progress", poll=0.02)
    os.killpg(a.pid, signal.SIGKILL)
    a.wait(timeout=10)
    start_worker(env, "b")

    def all_done():
        data = json.loads(srdq(env, "status", sid, "--json").stdout)
        return data["status"] == "done" and data

    data = wait_for(all_done, 600, "the sweep to finish after the kill", poll=1.0)
    assert [r["run_id"] for r in data["runs"]] == run_ids
    assert all(r["done"] + r["failed"] == 6 for r in data["runs"])
    count, distinct = db_rows(env, "select count(*), count(distinct item_id) from result")[0]
    assert count == distinct == 24  # exactly once, across the kill
