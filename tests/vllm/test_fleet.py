"""A fleet of one `srdq worker` on vLLM (CPU build): a 2-shard Best-of-N run completes with the records
of the embedded runner on the same engine, and SIGTERM then stops the worker with no vLLM process left."""

from __future__ import annotations

import json
import os
import signal

import pytest
from click.testing import CliRunner

from tests.integration.fleet import fleet, start_worker, submit, unreachable, worker_log
from tests.vllm.conftest import Borrowed
from tests.vllm.helpers import assert_no_survivors, finish

ARGS = [
    "--method",
    "best_of_n",
    "--engine",
    "vllm",
    "--model",
    "tiny-random-llama",
    "--reward",
    "arithmetic",
    "--n",
    "2",
    "--max-new-tokens",
    "24",
    "--set",
    "chunk_tokens=8",
    "--seed",
    "3",
    "--limit",
    "4",
    "--shard-size",
    "2",
]


def test_one_vllm_worker_finishes_a_run_and_stops_cleanly(tmp_path, monkeypatch, vllm_engine):
    reason = unreachable()
    if reason:
        pytest.skip(reason)
    from srdq_cli.main import cli

    from srd_worker.engines import registry

    monkeypatch.setattr(
        registry, "build_engine", lambda name, model, settings, engine_args=None: Borrowed(vllm_engine)
    )
    ref_out = tmp_path / "ref"
    res = CliRunner().invoke(cli, ["run", "gsm8k", *ARGS, "--out", str(ref_out)], catch_exceptions=False)
    assert res.exit_code == 0, res.output
    (ref_path,) = ref_out.glob("run-*/results.jsonl")
    ref = [
        {k: v for k, v in json.loads(line).items() if k != "timing"}
        for line in ref_path.read_text().splitlines()
    ]

    with fleet(tmp_path, "srdq_vllm", SRDQ_CACHE_DIR=str(tmp_path / "cache"), OMP_NUM_THREADS="2") as ctx:
        run_id = submit(ctx, "gsm8k", *ARGS, timeout=120)
        worker = start_worker(ctx, "w")
        from tests.integration.test_service import db_rows, results, run_done, wait_for

        try:
            wait_for(lambda: run_done(ctx, run_id), 400, "the run to finish on the vLLM worker", poll=1.0)
        except AssertionError:
            raise AssertionError(worker_log(ctx, "w")[-4000:]) from None
        n_shards = db_rows(ctx, "select count(*) from shard where run_id = :r and status = 'done'", r=run_id)[
            0
        ][0]
        assert n_shards == 2
        assert results(ctx, run_id) == ref
        # SIGTERM to the worker's main process (as Kubernetes stops a container): it ends, and its pool
        # child closes the vLLM engine on the way out (worker_process_shutdown), leaving no process behind
        os.kill(worker.pid, signal.SIGTERM)
        rc = finish(worker, 120)
        assert rc == 0 or rc == -signal.SIGTERM, worker_log(ctx, "w")[-3000:]
        assert_no_survivors(worker.pid)
