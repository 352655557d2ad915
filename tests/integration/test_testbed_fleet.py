"""The CPU testbed on the fleet path: its committed policy (``--model PATH``) and reward model
(``--reward hf-orm:PATH``) run through ``srdq submit dataset`` and a real worker process against real
PostgreSQL and Redis, and give the same records as ``srdq run`` (the embedded path) on the same spec."""

from __future__ import annotations

import json
import os
import subprocess
import time

import pytest

from srd_worker.testbed import ARTIFACTS_DIR
from tests.integration.fleet import BASE_ENV, CLI, fleet, start_worker, submit, worker_log
from tests.integration.test_service import db_rows, results, strip_timing

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("servers")]

ARGS = [
    "--method", "best_of_n", "--n", "2", "--limit", "3", "--seed", "1", "--shard-size", "2",
    "--model", str(ARTIFACTS_DIR / "policy"), "--reward", f"hf-orm:{ARTIFACTS_DIR / 'rm'}",
    "--max-new-tokens", "48",
]  # fmt: skip


def test_testbed_policy_and_rm_on_the_fleet_match_the_embedded_run(tmp_path) -> None:
    out = tmp_path / "embedded"
    proc = subprocess.run(
        [*CLI, "run", "testbed", *ARGS, "--out", str(out)],
        env={**os.environ, **BASE_ENV},
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr
    (path,) = out.glob("run-*/results.jsonl")
    embedded = strip_timing([json.loads(line) for line in path.read_text().splitlines()])
    assert len(embedded) == 3 and all(isinstance(r["reward"], float) for r in embedded)
    with fleet(tmp_path, "srdq_testbed") as ctx:
        run_id = submit(ctx, "testbed", *ARGS)
        assert run_id == path.parent.name  # same spec, same run id
        start_worker(ctx, "w")
        deadline = time.monotonic() + 600
        while time.monotonic() < deadline:
            ((status,),) = db_rows(ctx, "select status from run where id = :r", r=run_id)
            assert status not in ("failed", "cancelled"), worker_log(ctx, "w")
            if status == "done":
                break
            time.sleep(0.5)
        else:
            raise AssertionError(f"run did not finish: {worker_log(ctx, 'w')[-2000:]}")
        assert results(ctx, run_id) == embedded
