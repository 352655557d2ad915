"""vLLM engines are shut down when their user is done with them, and an engine nobody closed does not hang
the interpreter's exit.

- `srdq run` with a judge on vLLM (``SRDQ_JUDGE_ENGINE=vllm``) shuts the judge's engine down when the run
  ends, with the run's own engine, instead of leaving its engine core and workers alive until the
  interpreter exits (a benchmark that goes on analysing after its runs held them all the while). The
  policy runs on the transformers engine: one vLLM start-up, the judge's.
- A process that starts a ``VLLMEngine`` and exits without closing it exits: multiprocessing's exit hook
  joins vLLM's engine-core process, which waits for its front end to shut it down, so before
  ``vllm_engine.close_at_exit`` such a process waited forever (seen after a judge run of
  ``benchmarks/real_text.py``). One more start-up, in a subprocess.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import psutil
from click.testing import CliRunner

from tests.vllm.helpers import assert_no_survivors

FORGETFUL = """
import sys
import weakref

# a weakref.finalize made before multiprocessing is imported, as in pytest or a benchmark that imports much
# first: the finalizers' exit hook (which shuts vLLM down) then runs after multiprocessing's, too late
class Early:
    pass
early = Early()
weakref.finalize(early, print, "", end="")

from srd_worker.engines.vllm_engine import VLLMEngine
from srd_worker.settings import Settings

if __name__ == "__main__":  # vLLM spawns its engine core, which imports this file again
    engine = VLLMEngine.from_name("tiny-random-llama", settings=Settings(cache_dir=sys.argv[1]), max_model_len=512)
    print("srdq-engine-started", sorted(engine._procs.children), flush=True)
"""  # and exits without engine.close()


def test_srdq_run_shuts_its_judges_vllm_engine_down(tmp_path, monkeypatch, vllm_cache):
    from srdq_cli.main import cli

    from srd_worker.engines import vllm_engine
    from srd_worker.rewards import registry

    monkeypatch.setenv("SRDQ_CACHE_DIR", str(vllm_cache))
    monkeypatch.setenv("SRDQ_JUDGE_ENGINE", "vllm")
    started: list[int] = []
    real_start = vllm_engine.start_llm

    def start_llm(make):  # the judge's vLLM processes, to check afterwards
        llm, procs = real_start(make)
        started.extend(procs.children)
        return llm, procs

    monkeypatch.setattr(vllm_engine, "start_llm", start_llm)
    registry.close_rewards()
    args = ["run", "gsm8k", "--method", "best_of_n", "--engine", "transformers", "--model", "tiny-random-llama",
            "--reward", "judge:tiny-random-llama", "--n", "2", "--max-new-tokens", "8", "--seed", "1",
            "--limit", "2", "--out", str(tmp_path)]  # fmt: skip
    res = CliRunner().invoke(cli, args, catch_exceptions=False)
    assert res.exit_code == 0, res.output
    (results,) = tmp_path.glob("run-*/results.jsonl")
    records = [json.loads(line) for line in results.read_text().splitlines()]
    assert len(records) == 2 and not any(r.get("error") for r in records)
    assert all(c["reward"] is not None for r in records for c in r["candidates"])  # the judge scored them
    assert started, "the judge should have run on vLLM's engine core in child processes"
    alive = [
        p for p in started if psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE
    ]
    assert not alive, f"the judge's vLLM processes outlived `srdq run`: {alive}"
    assert not registry._BUILT  # forgotten: a later run builds (and closes) its own


def test_a_process_that_never_closes_its_engine_still_exits(tmp_path, vllm_cache):
    script, log = tmp_path / "forgetful.py", tmp_path / "forgetful.log"
    script.write_text(FORGETFUL, encoding="utf-8")
    with open(log, "w") as f:
        proc = subprocess.Popen(
            [sys.executable, str(script), str(vllm_cache)],
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
            stdout=f,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    # a vLLM start-up on a loaded 2-core machine took more than 300 s: wait for it, then for the exit alone
    end = time.monotonic() + 1200
    while "srdq-engine-started" not in log.read_text() and proc.poll() is None and time.monotonic() < end:
        time.sleep(0.5)
    assert "srdq-engine-started [" in log.read_text(), log.read_text()[-3000:]
    assert "srdq-engine-started []" not in log.read_text()  # vLLM ran its engine core in child processes
    try:
        rc = proc.wait(timeout=120)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        raise AssertionError("a process holding an unclosed vLLM engine did not exit") from None
    assert rc == 0, log.read_text()[-3000:]
    assert_no_survivors(proc.pid, grace_s=10)
