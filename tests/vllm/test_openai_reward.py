"""The ``openai-rm:MODEL`` reward against a real reward server: vLLM's OpenAI-compatible server (CPU build,
``--runner pooling``) serving a random-weight LlamaForSequenceClassification (one label) on loopback,
started by the test.

- its scores are the head's raw logits, equal to ``hf-orm``'s on the same folder (the same token ids:
  the RM's chat template built from its tokenizer, read locally);
- `srdq run` with `--reward openai-rm:rm` ranks Best-of-N's candidates by the served scores.
"""

from __future__ import annotations

import json
import math

import pytest
from click.testing import CliRunner

from tests.vllm.openai_server import VLLMServer
from tests.vllm.test_reward import rm_dir  # noqa: F401 - the module's fixture: the tiny random RM

QUESTIONS = ["What is 2+3?", "What is 2+3?", "Name a duck.", "How many legs has a spider?"]
ANSWERS = ["2+3=5. The answer is 5.", "It is 7", "Donald", "Eight legs.\n\nThe answer is 8."]


@pytest.fixture(scope="module")
def rm_server(rm_dir, tmp_path_factory):  # noqa: F811
    path, _ = rm_dir
    srv = VLLMServer(
        path,
        tmp_path_factory.mktemp("rm-server"),
        served="rm",
        extra_args=("--runner", "pooling", "--max-model-len", "1024"),
    )
    srv.start()
    yield srv
    srv.kill()


def test_served_scores_are_hf_orms_raw_logits(rm_server, rm_dir):  # noqa: F811
    from srd_worker.rewards.hf_orm import HFOutcomeReward
    from srd_worker.rewards.registry import build_reward
    from srd_worker.settings import Settings

    path, _ = rm_dir
    served = build_reward(
        "openai-rm:rm", None, settings=Settings(rm_base_url=rm_server.url, rm_tokenizer=str(path))
    )
    local = HFOutcomeReward(str(path), device="cpu", dtype="float32")
    got = served.score(QUESTIONS, ANSWERS)
    want = local.score(QUESTIONS, ANSWERS)
    assert all(math.isfinite(x) for x in got)
    assert got == pytest.approx(want, abs=1e-3)
    assert served.task == "classify"
    assert len(set(round(x, 4) for x in got)) > 1  # the scores differ, so the comparison says something
    assert served.score(QUESTIONS[::-1], ANSWERS[::-1]) == pytest.approx(got[::-1], abs=1e-4)


def test_srdq_run_selects_by_the_served_reward(rm_server, rm_dir, tmp_path, monkeypatch, vllm_cache):  # noqa: F811
    from srdq_cli.main import cli

    from srd_worker.rewards.registry import build_reward
    from srd_worker.settings import Settings

    path, _ = rm_dir
    monkeypatch.setenv("SRDQ_RM_BASE_URL", rm_server.url)
    monkeypatch.setenv("SRDQ_RM_TOKENIZER", str(path))
    monkeypatch.setenv("SRDQ_CACHE_DIR", str(vllm_cache))
    args = ["run", "gsm8k", "--method", "best_of_n", "--engine", "transformers", "--model", "tiny-random-llama",
            "--reward", "openai-rm:rm", "--n", "3", "--max-new-tokens", "12", "--seed", "1", "--limit", "2",
            "--out", str(tmp_path)]  # fmt: skip
    res = CliRunner().invoke(cli, args, catch_exceptions=False)
    assert res.exit_code == 0, res.output
    (results,) = tmp_path.glob("run-*/results.jsonl")
    records = [json.loads(line) for line in results.read_text().splitlines()]
    assert len(records) == 2 and not any(r.get("error") for r in records)
    served = build_reward(
        "openai-rm:rm", None, settings=Settings(rm_base_url=rm_server.url, rm_tokenizer=str(path))
    )
    for rec in records:
        cands = rec["candidates"]
        assert len(cands) == 3 and rec["ledger"]["rm_calls"] >= 3
        rewards = [c["reward"] for c in cands]
        again = served.score([rec["question"]] * 3, [c["text"] for c in cands])
        assert rewards == pytest.approx(again, abs=1e-4)
        best = max(range(3), key=lambda i: rewards[i])
        assert rec["answer"] == cands[best]["answer"]
