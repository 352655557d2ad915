"""`srdq fork --submit` on the fleet: real PostgreSQL and Redis, a real worker process, the CPU testbed.

An SRD parent is submitted and run by a worker; `srdq fork PARENT --at-round 2 --set theta_high=0.9
--submit` stores the fork (its items' round-2 states copied from the parent's snapshots) and enqueues its
shards; the same worker runs it. The fork has the same run id and the same records as the embedded fork
of the embedded run of the same spec (`srdq run` then `srdq fork --db OUT`), and a refused change stores
and enqueues nothing."""

from __future__ import annotations

import json
import os
import subprocess
import time
import zlib

import pytest

from tests.integration.fleet import BASE_ENV, CLI, fleet, srdq, start_worker, submit, worker_log
from tests.integration.test_service import db_rows, results, strip_timing

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("servers")]

ARGS = [
    "--method", "srd", "--n", "8", "--max-new-tokens", "96", "--set", "chunk_tokens=6", "--seed", "3",
    "--limit", "3", "--shard-size", "2", "--model", "testbed", "--reward", "hf-orm:testbed-rm",
]  # fmt: skip
FORK = ["--at-round", "2", "--set", "theta_high=0.9"]


def _cli(*args: str) -> subprocess.CompletedProcess:
    proc = subprocess.run(
        [*CLI, *args], env={**os.environ, **BASE_ENV}, capture_output=True, text=True, timeout=600
    )
    assert proc.returncode == 0, proc.stderr
    return proc


def _wait_done(ctx: dict, run_id: str, worker: str) -> None:
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline:
        ((status,),) = db_rows(ctx, "select status from run where id = :r", r=run_id)
        assert status not in ("failed", "cancelled"), worker_log(ctx, worker)
        if status == "done":
            return
        time.sleep(0.5)
    raise AssertionError(f"run {run_id} did not finish: {worker_log(ctx, worker)[-2000:]}")


def _snapshots(ctx: dict, run_id: str) -> dict:
    rows = db_rows(
        ctx,
        "select i.item_key, c.round, c.state_z from checkpoint_round c join item i on i.id = c.item_id "
        "where c.run_id = :r and c.round <= 2",
        r=run_id,
    )
    return {(key, r): json.loads(zlib.decompress(bytes(blob))) for key, r, blob in rows}


def test_a_fork_submitted_to_the_fleet_runs_on_a_worker_as_the_embedded_fork(tmp_path) -> None:
    out = tmp_path / "embedded"
    _cli("run", "testbed", *ARGS, "--out", str(out))
    (parent_id,) = [p.name for p in out.glob("run-*")]
    fork_id = _cli("fork", parent_id, "--db", str(out), *FORK).stdout.strip().splitlines()[-1]
    embedded = strip_timing(
        [json.loads(line) for line in (out / fork_id / "results.jsonl").read_text().splitlines()]
    )
    assert len(embedded) == 3
    with fleet(tmp_path, "srdq_fork") as ctx:
        assert submit(ctx, "testbed", *ARGS) == parent_id  # same spec, same run id
        start_worker(ctx, "w")
        _wait_done(ctx, parent_id, "w")
        # a change that would invalidate the shared drafts: one line, nothing stored or enqueued
        refused = srdq(ctx, "fork", parent_id, "--at-round", "2", "--set", "seed=4", "--submit")
        assert refused.returncode == 1
        assert refused.stderr.strip().splitlines() == [
            "Error: --set seed: a fork cannot change it (the fork goes on with the parent's seed (its draws "
            "after the fork round are the parent's))"
        ]
        assert db_rows(ctx, "select count(*) from run")[0][0] == 1
        proc = srdq(ctx, "fork", parent_id, *FORK, "--submit")
        assert proc.returncode == 0, proc.stderr
        assert proc.stdout.strip() == fork_id
        assert "2 enqueued" in proc.stderr
        _wait_done(ctx, fork_id, "w")
        assert results(ctx, fork_id) == embedded
        # the fork's states at rounds <= 2 are the parent's (the shared drafts), and routing differs after
        assert _snapshots(ctx, fork_id) == _snapshots(ctx, parent_id) != {}
        assert results(ctx, fork_id) != results(ctx, parent_id)
        again = srdq(ctx, "fork", parent_id, *FORK, "--submit")
        assert again.returncode == 0 and again.stdout.strip() == fork_id and "already forked" in again.stderr
