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
from tests.vllm.judging import answers_both_ways
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


def test_answers_after_one_prefix_read_the_next_tokens_top_logprobs_as_prompt_logprobs_give(engine):
    """A judge's candidate answers after one prompt, read from one request's top logprobs of the next
    token, equal what a prompt_logprobs request per answer gives (up to float rounding); an answer
    outside the top 20 is asked alone."""
    p = list(contract.prompt_ids(engine, "Is 2 + 2 = 4? Answer Yes or No."))
    (g,) = engine.generate([contract.GenerationRequest(tuple(p), contract.greedy(1))])
    top = engine._next_token_logprobs(tuple(p))
    assert len(top) >= 20 and g.token_ids[0] in top
    fast, slow = answers_both_ways(engine, p, top, also=(g.token_ids[0],))
    assert max(abs(a - b) for a, b in zip(fast, slow, strict=True)) < 1e-3


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


# ---------------------------------------------------------------------------------- the chat endpoint
@pytest.fixture(scope="module")
def chat_engine(server, vllm_cache):
    from srd_worker.engines.registry import build_engine
    from srd_worker.settings import Settings

    eng = build_engine(
        "openai", SERVED, Settings(cache_dir=vllm_cache, openai_base_url=server.url), {"api": "chat"}
    )
    yield eng
    eng.close()


def _chat_prompt(engine) -> tuple[int, ...]:
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "What is 2 + 3?"}]
    return tuple(engine.tokenizer.chat_prompt_ids(messages))


def test_chat_api_generates_what_completions_does(engine, chat_engine):
    """/v1/chat/completions over the same server: the messages recovered from srdq's prompt ids give the
    server the very prompt /v1/completions gets (vLLM returns its prompt ids), so greedy and seeded
    draws agree token for token; a kept prefix is continued with continue_final_message."""
    from srd_worker.engines.base import SamplingParams

    assert chat_engine.api == "chat" and chat_engine.capabilities == {"sampling"}
    prompt = _chat_prompt(engine)
    requests = [
        contract.GenerationRequest(prompt, contract.greedy(12)),
        contract.GenerationRequest(
            prompt, SamplingParams(temperature=1.0, top_p=0.9, max_new_tokens=12, seed=7)
        ),
    ]
    by_completions = engine.generate(requests)
    by_chat = chat_engine.generate(requests)
    assert chat_engine.token_ids_source == "server"
    assert [g.token_ids for g in by_chat] == [g.token_ids for g in by_completions]
    assert [g.finish_reason for g in by_chat] == [g.finish_reason for g in by_completions]
    # continuation: the first 5 greedy tokens kept, the rest generated after them
    full = by_completions[0].token_ids
    kept = tuple(full[:5])
    (tail,) = chat_engine.generate(
        [contract.GenerationRequest(prompt + kept, contract.greedy(len(full) - 5))]
    )
    assert tail.token_ids == full[5:]
    assert chat_engine.chat_prompt_drift == 0  # the server's prompt ids were the engine's every time
    # logprobs of sampled tokens come back from the chat answer's logprobs.content
    (with_lp,) = chat_engine.generate([contract.GenerationRequest(prompt, contract.greedy(6, logprobs=True))])
    (ref_lp,) = engine.generate([contract.GenerationRequest(prompt, contract.greedy(6, logprobs=True))])
    assert with_lp.logprobs == pytest.approx(ref_lp.logprobs, abs=1e-4)


def test_chat_api_refuses_what_it_cannot_do(server, vllm_cache, chat_engine):
    from srd_worker.engines.registry import build_engine
    from srd_worker.errors import EngineError
    from srd_worker.settings import Settings

    prompt = _chat_prompt(chat_engine)
    with pytest.raises(EngineError, match="teacher-forced scoring of given token ids needs /v1/completions"):
        chat_engine.logprobs([(prompt, (5, 6))])
    strict = build_engine(
        "openai",
        SERVED,
        Settings(cache_dir=vllm_cache, openai_base_url=server.url),
        {"api": "chat", "continue_final_message": False},
    )
    try:
        assert (
            len(strict.generate([contract.GenerationRequest(prompt, contract.greedy(3))])[0].token_ids) == 3
        )
        with pytest.raises(EngineError, match="continues a partial answer .*continue_final_message=false"):
            strict.generate([contract.GenerationRequest(prompt + (70, 71), contract.greedy(3))])
    finally:
        strict.close()
    with pytest.raises(EngineError, match="is not the tokenizer's chat template"):
        chat_engine.generate([contract.GenerationRequest((70, 71, 72), contract.greedy(3))])


def test_runs_on_the_chat_api(server, tmp_path, monkeypatch, vllm_cache):
    """`srdq run --engine openai --engine-arg api=chat`: best_of_n drafting its whole budget in one call (no
    continuation) gives the records of the completions run; in chunked rounds (every round after the first
    continues a kept prefix with continue_final_message) it runs to the end. The two are not equal there:
    the random model's tokens are bytes that are often not UTF-8 on their own, and the chat API carries the
    kept prefix as text (README, *The chat endpoint*). The run records its api."""
    from srdq_cli.main import cli

    from srd_worker.store import crud
    from srd_worker.store.db import make_engine, session_scope, sqlite_url

    monkeypatch.setenv("SRDQ_OPENAI_BASE_URL", server.url)
    monkeypatch.setenv("SRDQ_CACHE_DIR", str(vllm_cache))
    base = ["--method", "best_of_n", "--engine", "openai", "--model", SERVED, "--reward", "arithmetic", "--n", "3",
            "--max-new-tokens", "24", "--seed", "3", "--limit", "3"]  # fmt: skip
    records = {}
    for api, chunk in (("completions", 0), ("chat", 0), ("chat", 8)):
        out = tmp_path / f"{api}-{chunk}"
        args = ["run", "gsm8k", *base, "--set", f"chunk_tokens={chunk}", "--engine-arg", f"api={api}"]
        res = CliRunner().invoke(cli, [*args, "--out", str(out)], catch_exceptions=False)
        assert res.exit_code == 0, res.output
        (path,) = out.glob("run-*/results.jsonl")
        records[api, chunk] = [
            {k: v for k, v in json.loads(line).items() if k not in ("timing", "run_id")}
            for line in path.read_text().splitlines()
        ]
        db = make_engine(sqlite_url(out / "srdq.db"))
        try:
            with session_scope(db) as session:
                run = crud.get_run(session=session, run_id=path.parent.name)
                (runtime,) = run.versions["runtime"]
                assert run.spec["engine_args"] == {"api": api}
        finally:
            db.dispose()
        assert runtime["engine"]["args"] == {"api": api}
        assert runtime["model"]["served_by"]["api"] == api
    assert records["chat", 0] == records["completions", 0]
    chunked = records["chat", 8]
    assert len(chunked) == 3 and not any(r.get("error") for r in chunked)
    assert all(len(r["candidates"]) == 3 for r in chunked)
    assert any(r["ledger"]["lm_calls"] > 3 for r in chunked)  # rounds after the first: continuations
