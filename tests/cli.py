"""Run the ``srdq`` command as a separate process, the way a user does, with this checkout importable."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SRDQ = [sys.executable, "-m", "srdq_cli.main"]


def srdq_env(**extra: str) -> dict[str, str]:
    """The caller's environment plus ``extra``, with the checkout first on PYTHONPATH."""
    pythonpath = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)
    return {**os.environ, **extra, "PYTHONPATH": pythonpath}


def run_srdq(
    *args: str, env: dict[str, str] | None = None, cwd: Path | None = None, timeout: float = 120
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*SRDQ, *args], capture_output=True, text=True, env=env or srdq_env(), cwd=cwd, timeout=timeout
    )


def tiny_run_args(dataset: Path, out: Path) -> list[str]:
    """``run DATASET`` with the sampling method on the tiny random Llama into OUT: the arguments the
    refusal tests give before their own options."""
    return ["run", str(dataset), "--method", "sampling", "--model", "tiny-random-llama", "--out", str(out)]
