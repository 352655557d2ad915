"""The suite's xdist groups hold: under ``-n 2 --dist loadgroup`` (what ``make test`` runs) every test of the
integration tier runs on one worker, one after another. They share the wrapper's PostgreSQL, which one of
them restarts mid-run; spread over two workers, that restart failed a sweep test beside it in CI
(pytest 9.2 renamed the attribute pytest-xdist 3.8 appends the group to, so the groups were silently
ignored). The integration tests skip here (no servers in the environment), which is all this needs."""

from __future__ import annotations

import os
import re
import subprocess
import sys

from tests.conftest import ROOT

FILES = ["tests/integration/test_sweep_service.py", "tests/integration/test_service.py"]
PYTEST = ["-m", "pytest", "-n", "2", "--dist", "loadgroup", "-v", "-p", "no:cacheprovider"]


def test_the_integration_tier_runs_on_one_worker_in_order() -> None:
    # without the wrapper's servers the tests skip: they never touch a server here
    env = {k: v for k, v in os.environ.items() if not k.startswith("SRDQ_TEST_")}
    proc = subprocess.run(
        [sys.executable, *PYTEST, *FILES],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    ran = re.findall(r"^\[(gw\d+)\] \[ *\d+%\] SKIPPED (.+?) *$", proc.stdout, flags=re.M)
    assert len(ran) > 5, proc.stdout[-3000:]
    assert {worker for worker, _ in ran} in ({"gw0"}, {"gw1"}), ran
    assert all(nodeid.endswith("@services") for _, nodeid in ran), ran
