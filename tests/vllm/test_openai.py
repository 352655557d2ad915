"""The openai engine against a real model server: vLLM's OpenAI-compatible server (CPU build) serving the
tiny random Llama on loopback, started by the test (tests/vllm/openai_server.py).

- the engine contract (tests/unit/engines/test_engine_contract.py) holds over HTTP;
- a fleet of two `srdq worker` processes that load no model, against the server, finishes a run with the
  records of the embedded `srdq run` on the same server; the server is SIGKILLed mid-run: no shard fails
  or loses work (shards go back to pending without counting attempts), `srdq run` meanwhile exits with
  one line naming the server, and the run completes once the server is back;
- the run records the server's URL, the model it reports and its revision, shown by `srdq report`.
"""

from __future__ import annotations

import json
import subprocess

import pytest
from click.testing import CliRunner

from tests.integration.fleet import CLI, fleet, start_worker, submit, unreachable, worker_log
from tests.unit.engines import test_engine_contract as contract
from tests.vllm.openai_server import SERVED, VLLMServer

for _name in dir(contract):
    if _name.startswith("test_"):
        globals()[_name] = getattr(contract, _name)


@pytest.fixture(scope="module")
def server(vllm_cache, tmp_path_factory):
    from srd_worker.engines.vllm_engine import tiny_model_dir

    srv = VLLMServer(tiny_model_dir(vllm_cache), tmp_path_factory.mktemp("vllm-server"))
    srv.start()
    yield srv
    srv.kill()


@pytest.fixture(scope="module")
def engine(server, vllm_cache):
    from srd_worker.engines.registry import build_engine
    from srd_worker.settings import Settings

    eng = build_engine("openai", SERVED, Settings(cache_dir=vllm_cache, openai_base_url=server.url))
    yield eng
    eng.close()


def test_the_engine_talks_to_the_real_server(engine, server):
    assert engine.name == "openai" and engine.max_context == 2048
    info = engine.describe()
    assert info["server_url"] == server.url and info["server_model"]["id"] == SERVED
    assert info["server_version"] not in ("", "unknown")  # vLLM's /version
    p = contract.prompt_ids(engine, "hello")
    engine.generate([contract.GenerationRequest(p, contract.greedy(4))])
    assert engine.token_ids_source == "server"  # return_token_ids: nothing re-tokenised


ARGS = [
    "--method",
    "best_of_n",
    "--engine",
    "openai",
    "--model",
    SERVED,
    "--reward",
    "arithmetic",
    "--n",
    "4",
    "--max-new-tokens",
    "64",
    "--set",
    "chunk_tokens=8",
    "--seed",
    "3",
    "--limit",
    "12",
    "--shard-size",
    "2",
]


def test_fleet_without_models_matches_embedded_and_survives_a_server_crash(
    server, tmp_path, monkeypatch, vllm_cache
):
    reason = unreachable()
    if reason:
        pytest.skip(reason)
    from srdq_cli.main import cli

    monkeypatch.setenv("SRDQ_OPENAI_BASE_URL", server.url)
    monkeypatch.setenv("SRDQ_CACHE_DIR", str(vllm_cache))
    ref_out = tmp_path / "ref"
    res = CliRunner().invoke(cli, ["run", "gsm8k", *ARGS, "--out", str(ref_out)], catch_exceptions=False)
    assert res.exit_code == 0, res.output
    (ref_path,) = ref_out.glob("run-*/results.jsonl")
    ref = [
        {k: v for k, v in json.loads(line).items() if k != "timing"}
        for line in ref_path.read_text().splitlines()
    ]
    assert len(ref) == 12 and not any(r.get("error") for r in ref)

    env = {
        "SRDQ_OPENAI_BASE_URL": server.url,
        "SRDQ_OPENAI_RETRY_S": "3",
        "SRDQ_CACHE_DIR": str(vllm_cache),
        "SRDQ_SLICE_ROUNDS": "2",
        "OMP_NUM_THREADS": "1",
    }
    from tests.integration.test_service import db_rows, results, run_done, wait_for

    with fleet(tmp_path, "srdq_openai", **env) as ctx:
        run_id = submit(ctx, "gsm8k", *ARGS, timeout=180)
        workers = ["a", "b"]
        for name in workers:
            start_worker(ctx, name)

        def logs() -> str:
            return "\n".join(f"--- worker {w}\n{worker_log(ctx, w)[-3000:]}" for w in workers)

        def checkpoints() -> int:
            return db_rows(
                ctx,
                "select count(*) from checkpoint c join item i on i.id = c.item_id where i.run_id = :r",
                r=run_id,
            )[0][0]

        try:
            wait_for(lambda: checkpoints() > 0, 300, "the first checkpoint", poll=0.1)
        except AssertionError:
            raise AssertionError(logs()) from None
        server.kill()  # mid-run: requests in flight fail, later ones find nothing listening
        results_at_kill = len(results(ctx, run_id))
        assert results_at_kill < 12, "the run finished before the server was killed: make it longer"

        # while the server is down: slices end with EngineUnavailable, nothing fails or is lost
        try:
            wait_for(
                lambda: (
                    db_rows(
                        ctx,
                        "select count(*) from shard where run_id = :r and error like 'EngineUnavailable%'",
                        r=run_id,
                    )[0][0]
                    > 0
                ),
                120,
                "a slice to end with EngineUnavailable",
            )
        except AssertionError:
            raise AssertionError(logs()) from None
        down = subprocess.run(
            [*CLI, "run", "gsm8k", *ARGS, "--out", str(tmp_path / "down")],
            env={**ctx["env"], "SRDQ_OPENAI_RETRY_S": "2"},
            capture_output=True,
            text=True,
            timeout=180,
        )
        assert down.returncode == 1 and server.url in down.stderr + down.stdout, down.stderr[-2000:]
        assert "SRDQ_OPENAI_RETRY_S" in down.stderr + down.stdout
        shards = db_rows(ctx, "select status, attempt from shard where run_id = :r", r=run_id)
        assert all(status != "failed" for status, _ in shards), shards
        assert not run_done(ctx, run_id)

        server.start()
        try:
            wait_for(
                lambda: run_done(ctx, run_id), 600, "the run to finish after the server returned", poll=1.0
            )
        except AssertionError:
            raise AssertionError(logs()) from None
        count, distinct = db_rows(
            ctx, "select count(*), count(distinct item_id) from result where run_id = :r", r=run_id
        )[0]
        assert count == distinct == 12
        assert results(ctx, run_id) == ref

        (versions,) = db_rows(ctx, "select versions from run where id = :r", r=run_id)[0]
        (runtime,) = {json.dumps(r, sort_keys=True) for r in versions["runtime"]}  # both workers: one record
        runtime = json.loads(runtime)
        assert runtime["engine"]["name"] == "openai"
        served = runtime["model"]["served_by"]
        assert served["server_url"] == server.url and served["server_model"]["id"] == SERVED
        assert runtime["model"]["revision"].startswith("sha256:")  # the server's model folder, hashed
        report = subprocess.run(
            [*CLI, "report", run_id, "--out", str(tmp_path / "report")],
            env=ctx["env"],
            capture_output=True,
            text=True,
            timeout=180,
        )
        assert report.returncode == 0, report.stderr
        text = (tmp_path / "report" / "report.md").read_text()
        assert server.url in text and runtime["model"]["revision"] in text
