"""The openai engine's HTTP side, and the run's provenance records.

The server here is NOT a model server: ``FaultServer`` is a few lines of ``http.server`` written for these
tests only, to inject failures (429, 5xx, a refused connection, a bad request) and to see exactly what the
engine sends; its completions are canned. The engine against a real model server (vLLM's OpenAI server)
is tested in the vllm tier: tests/vllm/test_openai.py (contract, fleet, server crash).
"""

from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from srd_worker.engines.base import GenerationRequest, SamplingParams
from srd_worker.errors import ConfigError, EngineError, EngineUnavailable
from srd_worker.settings import Settings
from tests.integration.fleet import free_port

MODEL = "tiny-random-llama"


def canned(body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
    """The fault server's default answer: ``max_tokens`` tokens 65, 66, ..., stopped by length."""
    ids = list(range(65, 65 + body.get("max_tokens", 1)))
    extra = {"logprobs": {"token_logprobs": [-1.0] * len(ids)}} if body.get("logprobs") else {}
    return 200, completion(ids, "length", **extra)


class FaultServer:
    """Fault injection only (see the module docstring). ``script`` holds (status, body) answers given to
    the next POSTs in order; after it runs out, ``default(body)`` answers."""

    def __init__(self, *, models: list[dict[str, Any]] | None = None) -> None:
        self.models = models if models is not None else [{"id": MODEL, "max_model_len": 64}]
        self.script: list[tuple[int, Any]] = []
        self.requests: list[tuple[str, str, dict[str, str], Any]] = []
        self.default = canned
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def _send(self, status: int, body: Any) -> None:
                data = json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self) -> None:  # noqa: N802
                outer.requests.append(("GET", self.path, dict(self.headers), None))
                if self.path == "/v1/models":
                    self._send(200, {"object": "list", "data": outer.models})
                else:
                    self._send(404, {"error": "not found"})

            def do_POST(self) -> None:  # noqa: N802
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                outer.requests.append(("POST", self.path, dict(self.headers), body))
                status, answer = outer.script.pop(0) if outer.script else outer.default(body)
                self._send(status, answer)

            def log_message(self, *args: Any) -> None:
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/v1"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()

    def posts(self) -> list[Any]:
        return [body for method, _, _, body in self.requests if method == "POST"]

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


def completion(token_ids: list[int] | None, reason: str, *, text: str = "", **extra: Any) -> dict[str, Any]:
    choice = {"index": 0, "text": text, "finish_reason": reason, **extra}
    if token_ids is not None:
        choice["token_ids"] = token_ids
    return {"choices": [choice]}


@pytest.fixture
def fault():
    srv = FaultServer()
    yield srv
    srv.close()


def settings(tmp_path: Path, url: str, **kw: Any) -> Settings:
    return Settings(cache_dir=tmp_path, openai_base_url=url, openai_retry_s=kw.pop("retry_s", 5), **kw)


def engine_for(tmp_path: Path, url: str, **kw: Any):
    from srd_worker.engines.registry import build_engine

    return build_engine("openai", MODEL, settings(tmp_path, url, **kw))


def test_requests_are_token_ids_with_per_request_seeds_and_sampling_params(fault, tmp_path):
    eng = engine_for(tmp_path, fault.url)
    assert eng.max_context == 64 and eng.capabilities == frozenset({"sampling", "logprobs"})
    prompt = tuple(eng.tokenizer.chat_prompt_ids([{"role": "user", "content": "hi"}]))
    sp = SamplingParams(
        temperature=0.5, top_p=0.8, top_k=0, max_new_tokens=7, stop=("zz",), seed=-1, logprobs=True
    )
    near = tuple([65] * 61)
    gens = eng.generate(
        [
            GenerationRequest(prompt, sp),
            GenerationRequest(prompt, SamplingParams(top_k=12, seed=3, max_new_tokens=2)),
            GenerationRequest(near, SamplingParams(max_new_tokens=50)),  # cut to the 3 tokens left
            GenerationRequest(prompt, SamplingParams(max_new_tokens=0, logprobs=True)),  # nothing to ask for
        ]
    )
    bodies = sorted(fault.posts(), key=lambda b: (len(b["prompt"]), b["max_tokens"]))
    assert len(bodies) == 3  # a zero budget never reaches the server
    a = next(b for b in bodies if b.get("stop"))
    assert a["prompt"] == list(prompt) and a["model"] == MODEL
    assert (a["temperature"], a["top_p"], a["max_tokens"], a["seed"], a["logprobs"]) == (
        0.5,
        0.8,
        7,
        2**63 - 1,
        1,
    )
    assert "top_k" not in a and a["stop"] == ["zz"] and a["include_stop_str_in_output"] is True
    assert a["stop_token_ids"] == sorted(eng.tokenizer.eos_token_ids) and a["return_token_ids"] is True
    b = next(b for b in bodies if b.get("top_k"))
    assert (b["top_k"], b["seed"], "logprobs" in b, "stop" in b) == (12, 3, False, False)
    assert next(b for b in bodies if b["prompt"] == list(near))["max_tokens"] == 3
    assert gens[3].token_ids == [] and gens[3].logprobs == [] and gens[3].finish_reason == "length"
    assert [len(g.token_ids) for g in gens[:3]] == [7, 2, 3] and gens[0].logprobs == [-1.0] * 7


def test_transient_failures_are_retried_with_backoff(fault, tmp_path):
    eng = engine_for(tmp_path, fault.url)
    fault.script = [(429, {"error": "slow down"}), (503, {"error": "busy"}), (502, {"error": "gateway"})]
    (gen,) = eng.generate([GenerationRequest((1, 2), SamplingParams(max_new_tokens=2))])
    assert gen.token_ids == [65, 66] and eng.client.retries == 3 and len(fault.posts()) == 4


def test_a_bad_request_fails_at_once_without_retries(fault, tmp_path):
    eng = engine_for(tmp_path, fault.url)
    fault.script = [(400, {"error": "prompt too long for this model"})]
    with pytest.raises(EngineError, match="HTTP 400.*prompt too long") as err:
        eng.generate([GenerationRequest((1, 2), SamplingParams(max_new_tokens=2))])
    assert not isinstance(err.value, EngineUnavailable) and len(fault.posts()) == 1


def test_a_server_that_stays_down_raises_engine_unavailable(fault, tmp_path):
    eng = engine_for(tmp_path, fault.url, retry_s=1.5)
    fault.default = lambda body: (503, {"error": "overloaded"})
    t0 = time.monotonic()
    with pytest.raises(EngineUnavailable, match="unavailable for 1.5 s.*SRDQ_OPENAI_RETRY_S.*HTTP 503"):
        eng.generate([GenerationRequest((1, 2), SamplingParams(max_new_tokens=2))])
    assert 1.0 < time.monotonic() - t0 < 10 and len(fault.posts()) >= 2
    # nothing listening at all (connection refused), at build time
    dead = f"http://127.0.0.1:{free_port()}/v1"
    with pytest.raises(EngineUnavailable, match=f"model server {dead} unavailable"):
        engine_for(tmp_path, dead, retry_s=1)


def test_configuration_errors_name_the_setting(fault, tmp_path):
    from srd_worker.engines.registry import build_engine

    with pytest.raises(ConfigError, match="SRDQ_OPENAI_BASE_URL"):
        build_engine("openai", MODEL, Settings(cache_dir=tmp_path))
    with pytest.raises(ConfigError, match="http"):
        build_engine("openai", MODEL, Settings(cache_dir=tmp_path, openai_base_url="127.0.0.1:8000"))
    with pytest.raises(ConfigError, match="does not serve 'other'.*serves: tiny-random-llama"):
        build_engine("openai", "other", settings(tmp_path, fault.url, openai_tokenizer=MODEL))
    fault.models = [{"id": MODEL}]  # no max_model_len reported
    with pytest.raises(ConfigError, match="SRDQ_OPENAI_MAX_CONTEXT"):
        engine_for(tmp_path, fault.url)
    assert engine_for(tmp_path, fault.url, openai_max_context=128).max_context == 128
    with pytest.raises(EngineError, match="SRDQ_OPENAI_TOKENIZER"):
        build_engine("openai", MODEL, settings(tmp_path, fault.url, openai_tokenizer=str(tmp_path / "none")))


def test_api_key_from_the_environment_is_sent_as_bearer(fault, tmp_path, monkeypatch):
    from srd_worker.engines.registry import build_engine

    monkeypatch.setenv("OPENAI_API_KEY", "sk-test-123")
    engine_for(tmp_path, fault.url)
    assert fault.requests[-1][2].get("Authorization") == "Bearer sk-test-123"
    monkeypatch.setenv("SRDQ_OPENAI_API_KEY", "srdq-key")  # srdq's own setting wins
    monkeypatch.setenv("SRDQ_OPENAI_BASE_URL", fault.url)
    build_engine("openai", MODEL, Settings(cache_dir=tmp_path))
    assert fault.requests[-1][2].get("Authorization") == "Bearer srdq-key"
    assert "srdq-key" not in repr(Settings())  # a secret: never printed with the settings


def test_answers_map_to_the_engine_contract(fault, tmp_path):
    eng = engine_for(tmp_path, fault.url)
    tok = eng.tokenizer
    eos = max(tok.eos_token_ids)
    (a_id,), (b_id,) = tok.encode("A"), tok.encode("B")
    fault.script = [
        # EOS on the last allowed token: still "eos"; the EOS token is kept, the text skips it
        (200, completion([a_id, eos], "length", logprobs={"token_logprobs": [-1.5, -0.25]})),
        (200, completion([a_id, b_id], "stop", stop_reason="B")),  # a stop string
        # no token_ids: read from logprobs tokens written as token_id:N (--return-tokens-as-token-ids)
        (
            200,
            completion(None, "length", logprobs={"tokens": [f"token_id:{a_id}"], "token_logprobs": [-3.0]}),
        ),
        (200, completion(None, "length", text="AB")),  # only text: re-encoded with the local tokenizer
    ]
    reqs = [
        GenerationRequest((1, 2), SamplingParams(max_new_tokens=2, logprobs=True)),
        GenerationRequest((1, 2), SamplingParams(max_new_tokens=5, stop=("B",))),
        GenerationRequest((1, 2), SamplingParams(max_new_tokens=1, logprobs=True)),
        GenerationRequest((1, 2), SamplingParams(max_new_tokens=2)),
    ]
    a, b, c, d = (eng.generate([r])[0] for r in reqs)
    assert (a.token_ids, a.text, a.finish_reason, a.logprobs) == ([a_id, eos], "A", "eos", [-1.5, -0.25])
    assert (b.text, b.finish_reason, b.finished) == ("AB", "stop", True)
    assert (c.token_ids, c.logprobs, c.finish_reason) == ([a_id], [-3.0], "length")
    assert (d.token_ids, d.text) == (tok.encode("AB"), "AB") and eng.token_ids_source == "re-encoded"
    fault.script = [(200, completion([a_id], "length"))]
    with pytest.raises(EngineError, match="0 logprobs for 1 tokens"):
        eng.generate([GenerationRequest((1, 2), SamplingParams(max_new_tokens=1, logprobs=True))])
    fault.script = [(200, completion([a_id], "abort"))]
    with pytest.raises(EngineError, match="finish_reason 'abort'"):
        eng.generate([GenerationRequest((1, 2), SamplingParams(max_new_tokens=1))])
    fault.script = [(200, {"object": "error"})]
    with pytest.raises(EngineError, match="no choices"):
        eng.generate([GenerationRequest((1, 2), SamplingParams(max_new_tokens=1))])


def test_teacher_forced_logprobs_read_vllm_prompt_logprobs(fault, tmp_path):
    eng = engine_for(tmp_path, fault.url)
    prefix, cont = [1, 2, 3], [7, 8]
    entries = [
        None,
        {"2": {"logprob": -0.5}},
        {"3": {"logprob": -0.1}},
        {"7": {"logprob": -1.25}, "9": {}},
        {"8": {"logprob": -2.5}},
    ]
    fault.script = [(200, completion([5], "length", prompt_logprobs=entries))]
    assert eng.logprobs([(prefix, cont), (prefix, [])]) == [[-1.25, -2.5], []]
    body = fault.posts()[-1]
    assert body["prompt"] == prefix + cont and body["prompt_logprobs"] == 1 and body["max_tokens"] == 1
    fault.script = [(200, completion([5], "length"))]  # a server without prompt_logprobs
    with pytest.raises(EngineError, match="prompt_logprobs"):
        eng.logprobs([(prefix, cont)])
    with pytest.raises(EngineError, match="no room"):
        eng.logprobs([([1] * 60, [2] * 4)])


def test_prefixes_of_one_response_are_read_from_one_request(fault, tmp_path):
    """SRD's boundary search scores prefixes of one response together: one request for the longest, from
    the earliest continuation token any of them reads (also a pair whose prefix holds part of the response)."""
    eng = engine_for(tmp_path, fault.url)
    eng.next_token_top_k = 0

    def answer(body):  # each prompt token's logprob is -(its id)
        ids = body["prompt"]
        return 200, completion(
            [5], "length", prompt_logprobs=[None] + [{str(t): {"logprob": -float(t)}} for t in ids[1:]]
        )

    fault.default = answer
    p, r = [1, 2, 3], [10, 11, 12, 13, 14]
    pairs = [(p, r[:2]), (p, r), ([*p, 10], r[1:3]), (p, [10, 99]), (p, r[:2])]
    want = [
        [-10.0, -11.0],
        [-10.0, -11.0, -12.0, -13.0, -14.0],
        [-11.0, -12.0],
        [-10.0, -99.0],
        [-10.0, -11.0],
    ]
    assert eng.logprobs(pairs) == want
    assert sorted(b["prompt"] for b in fault.posts()) == [[*p, 10, 11, 12, 13, 14], [*p, 10, 99]]


def test_candidate_answers_after_one_prefix_are_one_request_for_its_next_token(fault, tmp_path):
    """A judge's one-token answers after one prompt: one greedy request for the prompt's next token with
    its top logprobs named by id (no prompt_logprobs, so vLLM may read its prefix cache); an answer
    outside the top returned, or a server that does not name tokens by id, is asked pair by pair."""
    eng = engine_for(tmp_path, fault.url)
    prefix, other = [1, 2, 3], [4, 5]
    top = {"token_id:7": -0.5, "token_id:8": -1.5, "token_id:11": -3.0}
    pairs = [(prefix, [7]), (prefix, [8]), (prefix, [9]), (other, [7]), (prefix, [7, 8])]

    def answer(body):
        if "prompt_logprobs" in body:  # pair by pair: the last token's logprob is -(its id)
            ids = body["prompt"]
            entries = [None] + [{str(t): {"logprob": -float(t)}} for t in ids[1:]]
            return 200, completion([5], "length", prompt_logprobs=entries)
        assert body["prompt"] == prefix and body["max_tokens"] == 1 and body["temperature"] == 0.0
        assert body["logprobs"] == 20 and body["return_tokens_as_token_ids"] is True
        return 200, completion([7], "length", logprobs={"top_logprobs": [top]})

    fault.default = answer
    assert eng.logprobs(pairs) == [[-0.5], [-1.5], [-9.0], [-7.0], [-7.0, -8.0]]
    posts = fault.posts()
    assert sum("prompt_logprobs" not in b for b in posts) == 1  # one request for prefix's three answers
    asked_alone = sorted(b["prompt"] for b in posts if "prompt_logprobs" in b)
    assert asked_alone == [[1, 2, 3, 7, 8], [1, 2, 3, 9], [4, 5, 7]]  # outside the top; alone; longer
    top.clear()
    top.update({"Yes": -0.5, "No": -1.0})  # a server that names tokens by text: pair by pair
    fault.requests.clear()
    assert eng.logprobs(pairs[:2]) == [[-7.0], [-8.0]] and len(fault.posts()) == 3
    eng.next_token_top_k = 0  # off: every pair its own request
    fault.requests.clear()
    assert eng.logprobs(pairs[:2]) == [[-7.0], [-8.0]] and len(fault.posts()) == 2
    eng.next_token_top_k = (
        20  # a server that refuses 20 top logprobs (--max-logprobs 5): pair by pair from then on
    )
    fault.requests.clear()
    fault.script = [(400, {"error": "requested logprobs 20 > max_logprobs 5"})]
    assert eng.logprobs(pairs[:2]) == [[-7.0], [-8.0]] and len(fault.posts()) == 3
    assert eng.next_token_top_k == 0


# ------------------------------------------------------------------------------------- a down server in the fleet


def test_a_shard_on_a_down_server_goes_back_to_pending_without_using_attempts(fault, tmp_path, datasets_dir):
    """``service.process_shard`` with the openai engine while the server answers 503: the slice ends with
    ``unavailable``, the shard is pending again with attempt 0 and the error kept, and it is re-enqueued,
    however often that happens (the attempt cap never turns a server outage into a failed shard)."""
    from srd_worker.service import EngineCache, SliceConfig, process_shard, submit
    from srd_worker.spec import prepare_run
    from srd_worker.store import crud
    from srd_worker.store.db import make_engine, session_scope, sqlite_url, upgrade

    prepared = prepare_run(
        dataset=datasets_dir / "gsm8k_test.jsonl",
        method="sampling",
        params={"max_new_tokens": 4},
        model=MODEL,
        reward=None,
        limit=2,
        engine="openai",
    )
    url = sqlite_url(tmp_path / "fleet.db")
    upgrade(url)
    db = make_engine(url)
    enqueued: list[tuple[str, int]] = []
    try:
        run_id = submit(prepared, db=db, enqueue=lambda r, i: enqueued.append((r, i))).run_id
        fault.models = [{"id": MODEL, "max_model_len": 4096}]  # room for GSM8K prompts (byte tokenizer)
        fault.default = lambda body: (503, {"error": "model server restarting"})
        cache = EngineCache(settings(tmp_path, fault.url, retry_s=0.5))
        cfg = SliceConfig(lease_ttl_s=30, slice_rounds=2, max_attempts=2)
        for _ in range(3):  # more often than max_attempts
            assert (
                process_shard(
                    run_id, 0, db=db, engines=cache, enqueue=lambda r, i: enqueued.append((r, i)), cfg=cfg
                )
                == "unavailable"
            )
        with session_scope(db) as session:
            (shard,) = crud.list_shards(session=session, run_id=run_id)
            assert (shard.status, shard.attempt) == ("pending", 0)
            assert shard.error.startswith("EngineUnavailable: model server")
        assert enqueued == [(run_id, 0)] * 4
        fault.default = canned  # the server is back: the shard finishes
        assert process_shard(run_id, 0, db=db, engines=cache, enqueue=lambda r, i: None, cfg=cfg) in (
            "done",
            "continued",
        )
    finally:
        db.dispose()


def test_srdq_run_without_a_server_url_writes_nothing(tmp_path, monkeypatch, datasets_dir):
    from click.testing import CliRunner
    from srdq_cli.main import cli

    monkeypatch.delenv("SRDQ_OPENAI_BASE_URL", raising=False)
    out = tmp_path / "out"
    args = ["run", str(datasets_dir / "gsm8k_test.jsonl"), "--method", "sampling", "--engine", "openai"]
    res = CliRunner().invoke(cli, [*args, "--model", MODEL, "--limit", "1", "--out", str(out)])
    assert res.exit_code == 1 and "SRDQ_OPENAI_BASE_URL" in res.output and not out.exists()
    monkeypatch.setenv("SRDQ_OPENAI_BASE_URL", "localhost:8000/v1")  # no scheme
    res = CliRunner().invoke(cli, [*args, "--model", MODEL, "--limit", "1", "--out", str(out)])
    assert res.exit_code == 1 and "http(s) URL" in res.output and not out.exists()
