"""One process per run: a second ``srdq run`` of a run that is under way in the same --out is refused with
one line naming the process that has it (it would run the pending shards twice and interleave their
results), and the kernel's lock goes with that process however it ends, so nothing stale blocks a resume."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

from srd_worker.errors import SrdqError
from srd_worker.fileutil import Locked, exclusive_lock
from srd_worker.local import run_local
from tests.unit.test_local_shard_status import _prepared

pytestmark = pytest.mark.unit

HOLD = """
import sys, time
from srd_worker.fileutil import exclusive_lock
with exclusive_lock(sys.argv[1]):
    print("held", flush=True)
    time.sleep(600)
"""


def test_a_lock_held_by_another_process_is_refused_and_freed_when_it_is_killed(tmp_path):
    path = tmp_path / "out" / ".run-x.lock"
    child = subprocess.Popen([sys.executable, "-c", HOLD, str(path)], stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout is not None and child.stdout.readline().strip() == "held"
        with pytest.raises(Locked) as caught:
            with exclusive_lock(path):
                pass
        assert f"pid {child.pid} " in caught.value.holder  # who has it, from the file
        os.kill(child.pid, signal.SIGKILL)  # no chance to clean up
        child.wait(timeout=30)
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
    deadline = time.monotonic() + 10
    while True:  # the kernel drops the dead process's lock
        try:
            with exclusive_lock(path):
                assert f"pid {os.getpid()} " in path.read_text()
            break
        except Locked:
            assert time.monotonic() < deadline, "the killed process's lock was never let go"
            time.sleep(0.1)
    assert path.read_text() == ""  # emptied on the way out: nobody holds it


def test_a_second_run_of_a_run_under_way_is_refused_and_the_first_finishes(
    tmp_path, tiny_engine, datasets_dir
):
    settings, prepared = _prepared(tmp_path, datasets_dir, "best_of_n", {"n": 2, "max_new_tokens": 8})
    out = tmp_path / "out"
    refused: list[str] = []

    def second(report) -> None:
        if refused:
            return
        with pytest.raises(SrdqError) as caught:  # its own open file: flock refuses it as another process
            run_local(prepared, out_dir=out, settings=settings, engine=tiny_engine)
        refused.append(str(caught.value))

    summary = run_local(prepared, out_dir=out, settings=settings, engine=tiny_engine, on_round=second)
    run_id = prepared.spec.run_id()
    assert refused and f"run {run_id} is already being run in {out} (pid {os.getpid()} " in refused[0]
    assert (summary.items, summary.done) == (4, 4)  # the first run was not disturbed
    lines = (out / run_id / "results.jsonl").read_text().splitlines()
    assert len(lines) == 4
    again = run_local(prepared, out_dir=out, settings=settings, engine=tiny_engine)  # free once it ended
    assert again.done == 4


HOLD_AND_FORK = """
import multiprocessing as mp, sys, time
from srd_worker.fileutil import exclusive_lock

def linger():
    time.sleep(600)

with exclusive_lock(sys.argv[1]):
    child = mp.get_context("fork").Process(target=linger)
    child.start()
    print(child.pid, flush=True)
    time.sleep(600)
"""


def test_a_forked_child_that_outlives_the_holder_does_not_keep_the_lock(tmp_path):
    """vLLM's engine runs in a forked process; if it lingers after its parent is killed, the lock must
    still go with the parent, or the resume would be refused."""
    path = tmp_path / ".run-x.lock"
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLD_AND_FORK, str(path)], stdout=subprocess.PIPE, text=True
    )
    forked = None
    try:
        assert holder.stdout is not None
        forked = int(holder.stdout.readline())
        with pytest.raises(Locked):
            with exclusive_lock(path):
                pass
        os.kill(holder.pid, signal.SIGKILL)
        holder.wait(timeout=30)
        os.kill(forked, 0)  # the forked child is still alive
        deadline = time.monotonic() + 10
        while True:
            try:
                with exclusive_lock(path):
                    break
            except Locked:
                assert time.monotonic() < deadline, "the lingering child kept the dead parent's lock"
                time.sleep(0.1)
    finally:
        if holder.poll() is None:
            holder.kill()
            holder.wait()
        if forked is not None:
            try:
                os.kill(forked, signal.SIGKILL)
            except ProcessLookupError:
                pass


def test_a_file_system_without_locks_runs_unguarded_with_a_warning(tmp_path, monkeypatch, caplog):
    """Some network mounts refuse flock (ENOLCK): the run goes on without the guard, and says so."""
    import errno
    import fcntl
    import logging

    def no_locks(fd, op):
        raise OSError(errno.ENOLCK, "No locks available")

    monkeypatch.setattr(fcntl, "flock", no_locks)
    ran = False
    with caplog.at_level(logging.WARNING, logger="srd_worker.fileutil"):
        with exclusive_lock(tmp_path / ".run-x.lock"):
            ran = True
    assert ran
    assert "could not lock" in caplog.text and "No locks available" in caplog.text
