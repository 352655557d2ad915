"""The ``openai-rm:MODEL`` reward's requests and answers, against a small HTTP server written in the test
(fault injection and canned pooling answers only; the real server is vLLM's, in tests/vllm/test_openai.py):
token ids built as ``hf-orm`` builds them, the classify task with the raw logit asked for, batches under
the token budget, answers put back in input order, the per-token fallback, malformed answers, retries and
configuration errors."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from srd_worker.errors import ConfigError, EngineUnavailable, RewardError
from srd_worker.rewards.hf_orm import rm_chat_ids
from srd_worker.settings import Settings
from tests.unit.engines.test_openai_engine import FaultServer
from tests.unit.rewards.test_hf_rewards import QUESTIONS, RESPONSES, _tokenizer


@pytest.fixture(scope="module")
def tok_dir(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("rm-tokenizer") / "tiny-rm"
    _tokenizer().save_pretrained(path)
    return path


def pooled(body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
    """One score per sequence: its length plus its first token id / 1000, in reversed index order."""
    data = [
        {"index": k, "object": "pooling", "data": [len(ids) + ids[0] / 1000]}
        for k, ids in enumerate(body["input"])
    ]
    return 200, {"object": "list", "model": body["model"], "data": data[::-1]}


@pytest.fixture
def server():
    srv = FaultServer()
    srv.default = pooled
    yield srv
    srv.close()


def reward_for(url: str | None, tok_dir: Path, name: str = "openai-rm:rm", **kw: Any):
    from srd_worker.rewards.registry import build_reward

    settings = Settings(rm_base_url=url, rm_tokenizer=str(tok_dir), openai_retry_s=kw.pop("retry_s", 5), **kw)
    return build_reward(name, None, settings=settings)


def test_requests_carry_hf_orm_token_ids_and_ask_for_the_raw_logit(server, tok_dir):
    rm = reward_for(server.url, tok_dir)
    got = rm.score(QUESTIONS[:3], RESPONSES[:3])
    want_ids = [rm_chat_ids(_tokenizer(), q, r) for q, r in zip(QUESTIONS[:3], RESPONSES[:3], strict=True)]
    assert got == [len(ids) + ids[0] / 1000 for ids in want_ids]  # answers re-ordered by index
    (post,) = server.requests
    method, path, _, body = post
    assert (method, path) == ("POST", "/pooling")  # at the server's root: the /v1 of the setting dropped
    assert body["model"] == "rm" and body["task"] == "classify" and body["use_activation"] is False
    assert sorted(map(tuple, body["input"])) == sorted(map(tuple, want_ids))
    assert rm.name == "openai-rm:rm" and rm.base_url == server.url.removesuffix("/v1")


def test_batches_stay_under_the_token_budget(server, tok_dir):
    rm = reward_for(server.url, tok_dir, rm_max_batch_tokens=60)
    got = rm.score(QUESTIONS, RESPONSES)
    posts = server.posts()
    assert len(posts) > 1
    for body in posts:
        assert len(body["input"]) == 1 or len(body["input"]) * max(map(len, body["input"])) <= 60
    assert sorted(len(ids) for body in posts for ids in body["input"]) == sorted(
        len(rm.input_ids(q, r)) for q, r in zip(QUESTIONS, RESPONSES, strict=True)
    )
    assert got == [
        len(ids) + ids[0] / 1000
        for ids in (rm.input_ids(q, r) for q, r in zip(QUESTIONS, RESPONSES, strict=True))
    ]


def test_a_server_refusing_classify_is_asked_per_token_and_the_last_token_is_taken(server, tok_dir):
    def per_token(body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        if body["task"] != "token_classify":
            return 400, {"error": {"message": "Unsupported task: 'classify'"}}
        data = [{"index": k, "data": [[float(t)] for t in ids]} for k, ids in enumerate(body["input"])]
        return 200, {"data": data}

    server.default = per_token
    rm = reward_for(server.url, tok_dir)
    assert rm.score(QUESTIONS[:2], RESPONSES[:2]) == [
        float(rm.input_ids(q, r)[-1]) for q, r in zip(QUESTIONS[:2], RESPONSES[:2], strict=True)
    ]
    assert rm.score(QUESTIONS[2:3], RESPONSES[2:3]) == [float(rm.input_ids(QUESTIONS[2], RESPONSES[2])[-1])]
    assert [b["task"] for b in server.posts()] == ["classify", "token_classify", "token_classify"]


@pytest.mark.parametrize(
    ("answer", "message"),
    [
        ({"data": [{"index": 0, "data": [0.1, 0.2]}]}, "item 0: the reward server returned a list of 2"),
        ({"data": []}, "returned 0 results for 1 sequences"),
        ({"data": [{"index": 3, "data": [1.0]}]}, "do not cover the 1 inputs"),
        ({"oops": 1}, "returned no results"),
    ],
)
def test_malformed_answers_are_reward_errors(server, tok_dir, answer, message):
    server.default = lambda body: (200, answer)
    with pytest.raises(RewardError, match=message):
        reward_for(server.url, tok_dir).score(QUESTIONS[:1], RESPONSES[:1])


def test_a_bad_request_fails_at_once_and_names_the_reward(server, tok_dir):
    server.default = lambda body: (404, {"error": "The model `rm` does not exist."})
    with pytest.raises(
        RewardError, match=r"openai-rm:rm: the reward server refused .*HTTP 404.*does not exist"
    ):
        reward_for(server.url, tok_dir).score(QUESTIONS[:1], RESPONSES[:1])
    assert len(server.posts()) == 1


def test_transient_failures_are_retried_and_a_server_that_stays_down_is_unavailable(server, tok_dir):
    server.script = [(503, {"error": "busy"}), (429, {"error": "slow down"})]
    assert len(reward_for(server.url, tok_dir).score(QUESTIONS[:1], RESPONSES[:1])) == 1
    assert len(server.posts()) == 3
    server.default = lambda body: (503, {"error": "down"})
    with pytest.raises(EngineUnavailable, match="unavailable for 1 s"):
        reward_for(server.url, tok_dir, retry_s=1).score(QUESTIONS[:1], RESPONSES[:1])


def test_configuration_errors_name_the_setting(tok_dir, tmp_path):
    with pytest.raises(ConfigError, match="set SRDQ_RM_BASE_URL"):
        reward_for(None, tok_dir)
    with pytest.raises(ConfigError, match="SRDQ_RM_BASE_URL.*got 'localhost:8002'"):
        reward_for("localhost:8002", tok_dir)
    with pytest.raises(RewardError, match="cannot load the tokenizer of reward model"):
        reward_for("http://127.0.0.1:9/v1", tmp_path / "no-such-tokenizer")


def test_the_served_name_is_not_resolved_as_a_folder_and_its_scores_are_not_pinned():
    from srd_worker.provenance import reward_revision
    from srd_worker.rewards.registry import check_reward_name, parse_reward_name

    assert parse_reward_name("openai-rm:testbed-rm") == ("openai-rm", "testbed-rm", None)
    assert parse_reward_name("hf-orm:testbed-rm")[1] != "testbed-rm"  # a committed folder there
    # the committed folder has a revision, but a server serving a model under that name need not hold it
    assert not reward_revision("hf-orm:testbed-rm")["revision"].startswith("unknown")
    assert reward_revision("openai-rm:testbed-rm")["revision"].startswith("unknown")  # never score-cached
    with pytest.raises(ConfigError, match="names no model"):
        check_reward_name("openai-rm:")


def test_srdq_run_without_the_reward_servers_url_writes_nothing(
    tmp_path, monkeypatch, datasets_dir, server, tok_dir
):
    """`srdq run --reward openai-rm:rm` checks SRDQ_RM_BASE_URL before it writes anything (the model is on
    the server, so no folder is probed for it); with the URL set, the run scores through the server."""
    from click.testing import CliRunner
    from srdq_cli.main import cli

    monkeypatch.delenv("SRDQ_RM_BASE_URL", raising=False)
    monkeypatch.setenv("SRDQ_RM_TOKENIZER", str(tok_dir))
    out = tmp_path / "out"
    args = ["run", str(datasets_dir / "gsm8k_test.jsonl"), "--method", "best_of_n", "--n", "2",
            "--model", "tiny-random-llama", "--reward", "openai-rm:rm", "--max-new-tokens", "4",
            "--limit", "1", "--out", str(out)]  # fmt: skip
    res = CliRunner().invoke(cli, args)
    assert res.exit_code == 1 and "set SRDQ_RM_BASE_URL" in res.output and not out.exists()
    monkeypatch.setenv("SRDQ_RM_BASE_URL", server.url)
    res = CliRunner().invoke(cli, args)
    assert res.exit_code == 0, res.output
    assert [len(b["input"]) for b in server.posts()] == [2]


def test_the_api_key_is_sent_as_bearer(server, tok_dir, monkeypatch):
    monkeypatch.setenv("OPENAI_API_KEY", "sk-from-env")
    # another batch budget: a reward of its own, not one an earlier test built (rewards are cached per process)
    reward_for(server.url, tok_dir, rm_max_batch_tokens=999).score(QUESTIONS[:1], RESPONSES[:1])
    assert server.requests[-1][2]["Authorization"] == "Bearer sk-from-env"
