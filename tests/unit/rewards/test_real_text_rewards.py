"""The rewards for real text: the policy's own mean-logprob confidence (``logprob``) and a judge that is
another model than the policy (``judge:MODEL``, ``judge-step:MODEL``), on the tiny random Llama engine
with references computed by hand from ``engine.logprobs``."""

from __future__ import annotations

import math

import pytest

from srd_worker.errors import ConfigError, RewardError
from srd_worker.rewards import registry
from srd_worker.rewards.lm_judge import LMJudgeReward, judge_messages, split_last_step
from srd_worker.rewards.logprob import MeanLogprobReward
from srd_worker.settings import Settings

pytestmark = pytest.mark.unit

QUESTIONS = ["What is 3 + 4?", "Tom has 5 apples and eats 2. How many are left?", "Compute 6 * 7."]
RESPONSES = ["3 + 4 = 7", "He has 5 - 2 = 4 left.\n\nSo the answer is 4", ""]


# ------------------------------------------------------------------------------------------ logprob
def test_logprob_is_the_geometric_mean_token_probability(tiny_engine):
    reward = MeanLogprobReward(tiny_engine, batch_size=2)
    tok = tiny_engine.tokenizer
    scores = reward.score(QUESTIONS, RESPONSES)
    for q, r, got in zip(QUESTIONS, RESPONSES, scores, strict=True):
        if not r:
            assert got == 0.0  # no evidence: below every non-empty response
            continue
        prompt = tok.chat_prompt_ids([{"role": "user", "content": q}], add_generation_prompt=True)
        [row] = tiny_engine.logprobs([(prompt, tok.encode(r))])
        assert len(row) == len(tok.encode(r))
        assert got == pytest.approx(math.exp(sum(row) / len(row)), rel=1e-5)
        assert 0.0 < got <= 1.0


def test_logprob_prefers_what_the_model_finds_likely(tiny_engine):
    """A response the model generates greedily scores at least as high as the same length of noise."""
    from srd_worker.engines.base import GenerationRequest, SamplingParams

    tok = tiny_engine.tokenizer
    q = QUESTIONS[0]
    prompt = tok.chat_prompt_ids([{"role": "user", "content": q}], add_generation_prompt=True)
    [gen] = tiny_engine.generate(
        [
            GenerationRequest(
                prompt_ids=tuple(prompt), params=SamplingParams(temperature=0.0, max_new_tokens=12)
            )
        ]
    )
    greedy = tok.decode(gen.token_ids)
    noise = "zq#~" * 3
    hi, lo = MeanLogprobReward(tiny_engine).score([q, q], [greedy, noise])
    assert hi > lo


def test_logprob_refuses_an_over_long_input(tiny_engine):
    with pytest.raises(RewardError, match="more than the engine's context"):
        MeanLogprobReward(tiny_engine).score(["q"], ["x" * (tiny_engine.max_context + 5)])
    with pytest.raises(RewardError, match="2 prompts but 1 responses"):
        MeanLogprobReward(tiny_engine).score(["a", "b"], ["c"])


def test_logprob_is_in_the_registry(tiny_engine):
    reward = registry.build_reward("logprob", tiny_engine)
    assert isinstance(reward, MeanLogprobReward)
    with pytest.raises(ConfigError, match="needs an engine"):
        registry.build_reward("logprob", None)


# -------------------------------------------------------------------------------------------- judge
def test_split_last_step():
    assert split_last_step("a\n\nb\n\nc") == ("a\n\nb", "c")
    assert split_last_step("a\n\nb\n\n") == ("a", "b")  # a trailing blank line ends the step
    assert split_last_step("only") == ("", "only")
    assert split_last_step("") == ("", "")


def test_step_mode_asks_about_the_newest_step_only():
    [msg] = judge_messages("Q?", "first step\n\nsecond step", mode="step")
    text = msg["content"]
    assert "Steps so far:\nfirst step" in text and "Newest step:\nsecond step" in text
    assert text.index("first step") < text.index("Newest step")
    [prefix] = judge_messages("Q?", "first step\n\nsecond step")
    assert "Partial solution:\nfirst step\n\nsecond step" in prefix["content"]
    with pytest.raises(RewardError, match="judge mode"):
        LMJudgeReward.__init__(object.__new__(LMJudgeReward), None, mode="verdict")  # type: ignore[arg-type]


@pytest.fixture
def judge_settings(tmp_path):
    registry.close_rewards()
    yield Settings(cache_dir=tmp_path, device="cpu", dtype="float32", judge_engine="transformers")
    registry.close_rewards()


@pytest.mark.parametrize("kind, mode", [("judge", "prefix"), ("judge-step", "step")])
def test_judge_is_another_model_on_its_own_engine(tiny_engine, judge_settings, kind, mode):
    reward = registry.build_reward(f"{kind}:tiny-random-llama", tiny_engine, settings=judge_settings)
    assert isinstance(reward, LMJudgeReward)
    assert reward.name == f"{kind}:tiny-random-llama" and reward.mode == mode
    assert reward.engine is not tiny_engine and reward.separate and not reward.can_differentiate
    # the same P(Yes)/(P(Yes)+P(No)) as the policy judging itself, asked in this mode
    q, r = QUESTIONS[1], RESPONSES[1]
    prefix = reward.engine.tokenizer.chat_prompt_ids(judge_messages(q, r, mode=mode))
    pairs = [(prefix, [t]) for t in reward.yes_ids + reward.no_ids]
    logps = [row[0] for row in reward.engine.logprobs(pairs)]
    n_yes = len(reward.yes_ids)
    ly = math.log(sum(math.exp(x) for x in logps[:n_yes]))
    ln = math.log(sum(math.exp(x) for x in logps[n_yes:]))
    assert reward.score([q], [r]) == [pytest.approx(1 / (1 + math.exp(ln - ly)), abs=1e-5)]
    # built once per process and settings
    assert registry.build_reward(f"{kind}:tiny-random-llama", tiny_engine, settings=judge_settings) is reward


def test_judge_names_and_settings_are_checked(judge_settings):
    registry.check_reward_name("judge:qwen2.5-coder-1.5b")
    registry.check_reward_name("judge-step:some/model")
    with pytest.raises(ConfigError, match="names no model"):
        registry.check_reward_name("judge:")
    bad = judge_settings.model_copy(update={"judge_engine": "magic"})
    with pytest.raises(ConfigError, match="SRDQ_JUDGE_ENGINE='magic'"):
        registry.build_reward("judge:tiny-random-llama", None, settings=bad)
    no_url = judge_settings.model_copy(update={"judge_engine": "openai"})
    with pytest.raises(ConfigError, match="SRDQ_JUDGE_BASE_URL"):
        registry.build_reward("judge:tiny-random-llama", None, settings=no_url)
    not_http = no_url.model_copy(update={"judge_base_url": "ftp://judge:8001/v1"})
    with pytest.raises(ConfigError, match="SRDQ_JUDGE_BASE_URL must be an http") as err:
        registry.build_reward("judge:tiny-random-llama", None, settings=not_http)
    assert "SRDQ_OPENAI_BASE_URL" not in str(err.value)


@pytest.mark.parametrize(
    "url, message", [(None, "set SRDQ_JUDGE_BASE_URL"), ("judge:8001", "SRDQ_JUDGE_BASE_URL must")]
)
def test_srdq_run_with_a_judge_server_checks_its_url_before_writing(
    tmp_path, monkeypatch, datasets_dir, url, message
):
    """`srdq run --reward judge:M` with SRDQ_JUDGE_ENGINE=openai: the judge is on its server, so its URL is
    checked before anything is written, and the error names SRDQ_JUDGE_BASE_URL (not the policy's URL)."""
    from click.testing import CliRunner
    from srdq_cli.main import cli

    monkeypatch.setenv("SRDQ_JUDGE_ENGINE", "openai")
    if url is None:
        monkeypatch.delenv("SRDQ_JUDGE_BASE_URL", raising=False)
    else:
        monkeypatch.setenv("SRDQ_JUDGE_BASE_URL", url)
    out = tmp_path / "out"
    args = ["run", str(datasets_dir / "gsm8k_test.jsonl"), "--method", "best_of_n", "--n", "2",
            "--model", "tiny-random-llama", "--reward", "judge:some-judge", "--max-new-tokens", "4",
            "--limit", "1", "--out", str(out)]  # fmt: skip
    res = CliRunner().invoke(cli, args)
    assert res.exit_code == 1, res.output
    assert message in res.output and "SRDQ_OPENAI_BASE_URL" not in res.output
    assert not out.exists()
