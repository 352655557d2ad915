"""Subprocess helpers of the vllm tier: `srdq` commands in their own session, and the check that none
of their processes (vLLM's engine core and workers included) outlives them."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil

from tests.signals import default_sigint

CLI = [sys.executable, "-m", "srdq_cli.main"]


def session_pids(sid: int) -> list[int]:
    """Live processes of session ``sid`` (a `srdq` command started with start_new_session=True): vLLM's
    processes stay in it even when their parent died and they were re-parented."""
    out = []
    for p in psutil.process_iter(["pid", "status"]):
        try:
            if p.info["status"] != psutil.STATUS_ZOMBIE and os.getsid(p.info["pid"]) == sid:
                out.append(p.info["pid"])
        except (ProcessLookupError, PermissionError, psutil.Error):
            continue
    return out


def assert_no_survivors(sid: int, grace_s: float = 30.0) -> None:
    """No process of session ``sid`` is alive within ``grace_s``; kills stragglers so they do not leak
    into later tests, then fails naming them."""
    end = time.monotonic() + grace_s
    while (left := session_pids(sid)) and time.monotonic() < end:
        time.sleep(0.5)
    if left:
        names = []
        for pid in left:
            try:
                names.append(f"{pid} {' '.join(psutil.Process(pid).cmdline())[:80]}")
                os.kill(pid, signal.SIGKILL)
            except (ProcessLookupError, psutil.Error):
                pass
        raise AssertionError(f"processes of the srdq command outlived it: {names}")


def start(args: list[str], log: Path, **env: str) -> subprocess.Popen:
    """`srdq run ARGS` in a session of its own, output to ``log``."""
    f = open(log, "w")  # noqa: SIM115 - closed with the process
    return subprocess.Popen(
        [*CLI, "run", *args],
        env={**os.environ, "PYTHONUNBUFFERED": "1", **env},
        stdout=f,
        stderr=subprocess.STDOUT,
        start_new_session=True,
        preexec_fn=default_sigint,  # Ctrl-C lands even when the tier runs as a script's background job
    )


def finish(proc: subprocess.Popen, timeout: float) -> int:
    """Wait for ``proc``; a command that does not exit in time (vLLM keeping it alive) fails the test."""
    try:
        return proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        raise AssertionError(
            f"`srdq {' '.join(proc.args[3:6])} ...` did not exit within {timeout} s"
        ) from None
