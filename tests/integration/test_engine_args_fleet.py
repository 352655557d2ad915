"""Engine arguments on the fleet (issue 28): a run submitted with ``--engine-arg`` is stored with them and a
worker builds its engine with them; the worker runs Celery's solo pool (what ``srdq worker --gpus ...
--gpus-per-worker N`` starts for a multi-GPU vLLM engine: tasks in the worker's own, non-daemonic process),
so this also runs the solo pool end to end, on the CPU (no GPU here: the tensor-parallel engine itself is
not run)."""

from __future__ import annotations

import subprocess

import pytest

from tests.integration.fleet import CLI, submit, worker_log
from tests.integration.test_service import db_rows, run_done, wait_for

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("servers")]


def test_a_solo_pool_worker_builds_the_engine_with_the_runs_engine_args(env, datasets_dir):
    args = ["--method", "sampling", "--model", "tiny-random-llama", "--limit", "3", "--shard-size", "2",
            "--max-new-tokens", "6", "--engine-arg", "attn_implementation=eager", "--engine-arg", "max_batch_size=2"]  # fmt: skip
    run_id = submit(env, str(datasets_dir / "gsm8k_test.jsonl"), *args)
    (spec,) = db_rows(env, "select spec from run where id = :r", r=run_id)[0]
    assert spec["engine_args"] == {"attn_implementation": "eager", "max_batch_size": 2}
    log = open(env["tmp"] / "solo.log", "w")  # noqa: SIM115 - closed when the process is reaped
    proc = subprocess.Popen(
        [*CLI, "worker", "--pool", "solo", "--loglevel", "INFO"],
        env=env["env"],
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    env["workers"].append(proc)
    try:
        wait_for(lambda: run_done(env, run_id), 300, "the run to finish on the solo-pool worker", poll=0.5)
    except AssertionError:
        raise AssertionError(worker_log(env, "solo")[-4000:]) from None
    assert "solo" in worker_log(env, "solo")  # Celery's banner names the pool
    (versions,) = db_rows(env, "select versions from run where id = :r", r=run_id)[0]
    (runtime,) = versions["runtime"]
    assert runtime["engine"]["args"] == {"attn_implementation": "eager", "max_batch_size": 2}
    count = db_rows(
        env, "select count(*) from result where run_id = :r and record->>'error' is null", r=run_id
    )
    assert count[0][0] == 3
