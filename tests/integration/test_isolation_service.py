"""Per-item fault isolation on the fleet path: real PostgreSQL and Redis, real worker processes whose
engine raises for one poisoned prompt and runs out of memory on batches above a size
(``tests/integration/fault_cli.py`` wraps the real tiny Llama engine; the product is unchanged). The
shard holding the poisoned item finishes with that item as an error row and every other item done;
the out-of-memory error lowers the batch size instead of failing anything; the worker crashing
mid-shard (``SRDQ_CRASH_AFTER_ROUND``) and another slice resuming from the checkpoint changes nothing;
the results equal the embedded ``srdq run`` with the same faults.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.integration.fleet import BASE_ENV, CLI, fleet, submit
from tests.integration.test_service import db_rows, results, strip_timing, wait_for

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("servers")]

FAULT_CLI = [sys.executable, "-m", "tests.integration.fault_cli"]
POISON = "[poison]"
ROWS, POISONED = 6, 1
OOM_ABOVE = 6  # requests per engine call: 3 items of n=2 fit, the shard's 6 items do not
ARGS = [
    "--method",
    "best_of_n",
    "--n",
    "2",
    "--reward",
    "arithmetic",
    "--model",
    "tiny-random-llama",
    "--max-new-tokens",
    "12",
    "--set",
    "chunk_tokens=4",
    "--seed",
    "5",
    "--shard-size",
    "6",
]


@pytest.fixture
def dataset(tmp_path, datasets_dir) -> Path:
    lines = (datasets_dir / "gsm8k_test.jsonl").read_text(encoding="utf-8").splitlines()[:ROWS]
    rows = [json.loads(line) for line in lines]
    rows[POISONED]["question"] += f" {POISON}"
    path = tmp_path / "gsm8k_poisoned.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


def test_poisoned_item_is_an_error_row_and_the_shard_completes_across_a_crash(tmp_path, dataset):
    # request by request: the OOM limit restarts with each fleet slice (not in srdq run), so batches differ
    fault_env = {
        "SRDQ_TEST_POISON": POISON,
        "SRDQ_TEST_OOM_ABOVE": str(OOM_ABOVE),
        "SRDQ_TEST_PER_REQUEST": "1",
    }
    # the embedded runner with the same fault: the reference
    out = tmp_path / "ref"
    ref = subprocess.run(
        [*FAULT_CLI, "run", str(dataset), *ARGS, "--out", str(out)],
        env={**os.environ, **BASE_ENV, **fault_env},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert ref.returncode == 0, ref.stderr
    (path,) = out.glob("run-*/results.jsonl")
    reference = strip_timing([json.loads(line) for line in path.read_text().splitlines()])
    assert [r["position"] for r in reference if r["error"]] == [POISONED]

    # leases long enough for a loaded two-core machine to build the engine and run a round within one
    # (the worker heartbeats only once the engine is built); attempts for the crash and a lost lease or two
    with fleet(tmp_path, "srdq_iso", SRDQ_LEASE_TTL_S="15", SRDQ_MAX_ATTEMPTS="6") as env:
        run_id = submit(env, str(dataset), *ARGS, timeout=120)
        # the first slice dies right after committing round 2 (the poisoned item's error state was
        # committed in round 1); the reaper re-enqueues and a new pool child resumes
        log = open(tmp_path / "w.log", "w")  # noqa: SIM115 - closed below
        worker = subprocess.Popen(
            [*FAULT_CLI, "worker", "--loglevel", "INFO"],
            env={**env["env"], **fault_env, "SRDQ_CRASH_AFTER_ROUND": "2"},
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        env["workers"].append(worker)

        def settled() -> str | None:
            (status,) = db_rows(env, "select status from run where id = :r", r=run_id)[0]
            return status if status in ("done", "failed", "cancelled") else None

        assert wait_for(settled, 400, "the run to finish") == "done"
        log.close()
        got = results(env, run_id)
        assert len(got) == ROWS and len({r["item_id"] for r in got}) == ROWS
        assert got == reference  # the error row included
        bad = got[POISONED]
        assert bad["error"].startswith("RuntimeError: injected fault") and POISON in bad["error"]
        assert bad["extra"]["fault"]["kind"] == "item"
        assert all(
            r["error"] is None and r["response"] is not None for i, r in enumerate(got) if i != POISONED
        )
        assert db_rows(env, "select status from shard where run_id = :r", r=run_id) == [("done",)]

        text = (tmp_path / "w.log").read_text()
        assert f"item {reference[POISONED]['item_id']} failed at its round 0" in text
        assert "retrying its halves" in text
        assert "batch limit lowered to 3 for the rest of the slice" in text
        assert "resuming from checkpointed round 2" in text  # the crash happened and was resumed

        st = subprocess.run(
            [*CLI, "status", run_id, "--json"], env=env["env"], capture_output=True, text=True
        )
        data = json.loads(st.stdout)
        assert (data["status"], data["done"], data["failed"]) == ("done", ROWS - 1, 1)

        export = tmp_path / "out.jsonl"
        ex = subprocess.run(
            [*CLI, "export", run_id, "--format", "jsonl", "--out", str(export)],
            env=env["env"],
            capture_output=True,
            text=True,
        )
        assert ex.returncode == 0, ex.stderr
        assert "(1 failed)" in ex.stdout
        rows = [json.loads(line) for line in export.read_text().splitlines()]
        assert [r["status"] for r in rows] == ["failed" if i == POISONED else "done" for i in range(ROWS)]
        assert rows[POISONED]["error"] == bad["error"]
