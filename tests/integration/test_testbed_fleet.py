"""The CPU testbed on the fleet path: its committed policy (``--model PATH``) and reward model
(``--reward hf-orm:PATH``) run through ``srdq submit dataset`` and a real worker process against real
PostgreSQL and Redis, and give the same records as ``srdq run`` (the embedded path) on the same spec."""

from __future__ import annotations

import json
import os
import subprocess
import time

import pytest
from sqlalchemy import create_engine, text

from srd_worker.testbed.train import ARTIFACTS_DIR
from tests.integration.fleet import BASE_ENV, CLI, fleet, start_worker, submit, unreachable, worker_log

pytestmark = pytest.mark.integration

ARGS = [
    "--method", "best_of_n", "--n", "2", "--limit", "3", "--seed", "1", "--shard-size", "2",
    "--model", str(ARTIFACTS_DIR / "policy"), "--reward", f"hf-orm:{ARTIFACTS_DIR / 'rm'}",
    "--max-new-tokens", "48",
]  # fmt: skip


@pytest.fixture(scope="module", autouse=True)
def _servers():
    reason = unreachable()
    if reason:
        pytest.skip(reason)


def _rows(db_url: str, run_id: str) -> list[dict]:
    eng = create_engine(db_url)
    try:
        with eng.connect() as conn:
            rows = conn.execute(
                text("select record from result where run_id = :r order by position"), {"r": run_id}
            )
            return [{k: v for k, v in row[0].items() if k != "timing"} for row in rows]
    finally:
        eng.dispose()


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
    embedded = [
        {k: v for k, v in json.loads(line).items() if k != "timing"} for line in path.read_text().splitlines()
    ]
    assert len(embedded) == 3 and all(isinstance(r["reward"], float) for r in embedded)
    with fleet(tmp_path, "srdq_testbed") as ctx:
        run_id = submit(ctx, "testbed", *ARGS)
        assert run_id == path.parent.name  # same spec, same run id
        start_worker(ctx, "w")
        deadline = time.monotonic() + 600
        while time.monotonic() < deadline:
            eng = create_engine(ctx["db_url"])
            with eng.connect() as conn:
                (status,) = conn.execute(text("select status from run where id = :r"), {"r": run_id}).one()
            eng.dispose()
            assert status not in ("failed", "cancelled"), worker_log(ctx, "w")
            if status == "done":
                break
            time.sleep(0.5)
        else:
            raise AssertionError(f"run did not finish: {worker_log(ctx, 'w')[-2000:]}")
        assert _rows(ctx["db_url"], run_id) == embedded
