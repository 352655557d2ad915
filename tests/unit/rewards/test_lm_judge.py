"""LMJudgeReward on the tiny random Llama engine (a reference computed by hand from engine.logprobs, order,
batching), its pure prompt / answer-token / normalisation logic, and the reward registry."""

from __future__ import annotations

import math

import pytest

from srd_worker.engines.base import CAP_SAMPLING
from srd_worker.errors import CapabilityError, ConfigError, RewardError
from srd_worker.rewards.arithmetic import ArithmeticReward
from srd_worker.rewards.base import RewardModel
from srd_worker.rewards.lm_judge import LMJudgeReward, answer_token_ids, judge_messages, yes_probability
from srd_worker.rewards.registry import REWARDS, build_reward

QUESTIONS = ["What is 3 + 4?", "Tom has 5 apples and eats 2. How many are left?", "Compute 6 * 7."]
RESPONSES = ["3 + 4 = 7", "He has 5 - 2 = 4 left", ""]


class CountingEngine:
    """Wraps an engine and records the size of every logprobs call."""

    def __init__(self, engine):
        self.inner = engine
        self.name, self.capabilities = engine.name, engine.capabilities
        self.tokenizer, self.max_context = engine.tokenizer, engine.max_context
        self.calls: list[int] = []

    def logprobs(self, pairs):
        self.calls.append(len(pairs))
        return self.inner.logprobs(pairs)


# ------------------------------------------------------------------------------------- on the engine


def test_matches_a_hand_computation_from_engine_logprobs(tiny_engine):
    judge = LMJudgeReward(tiny_engine)
    assert isinstance(judge, RewardModel) and judge.name == "lm_judge"
    tok = tiny_engine.tokenizer
    q, r = QUESTIONS[1], RESPONSES[1]
    prefix = tok.chat_prompt_ids(judge_messages(q, r), add_generation_prompt=True)
    # the prompt is the chat template with the generation prompt, holding the question and the response
    text = tok.decode(prefix)
    assert q in text and r in text and text.rstrip().endswith("assistant")
    yes = tok.encode("Yes")[:1]
    no = tok.encode("No")[:1]
    [[ly], [ln]] = tiny_engine.logprobs([(prefix, yes), (prefix, no)])
    # the byte-level tokenizer spells " Yes" as a space token then "Yes": the shared space token is
    # skipped, so the leading-space variant adds no second token here
    assert (judge.yes_ids, judge.no_ids) == (yes, no)
    expected = math.exp(ly) / (math.exp(ly) + math.exp(ln))
    assert judge.score([q], [r]) == [pytest.approx(expected, abs=1e-5)]


def test_scores_keep_order_and_length_and_allow_empty_responses(tiny_engine):
    judge = LMJudgeReward(tiny_engine)
    scores = judge.score(QUESTIONS, RESPONSES)
    assert len(scores) == 3 and all(0.0 <= s <= 1.0 for s in scores)
    assert judge.score(QUESTIONS[::-1], RESPONSES[::-1]) == pytest.approx(scores[::-1], abs=1e-5)
    assert judge.score([], []) == []
    with pytest.raises(RewardError):
        judge.score(QUESTIONS, RESPONSES[:2])


@pytest.mark.parametrize("batch_size", [1, 2, 16])
def test_batches_of_batch_size_give_the_same_scores(tiny_engine, batch_size):
    counting = CountingEngine(tiny_engine)
    judge = LMJudgeReward(counting, batch_size=batch_size)
    scores = judge.score(QUESTIONS, RESPONSES)
    pairs = len(QUESTIONS) * (len(judge.yes_ids) + len(judge.no_ids))
    assert sum(counting.calls) == pairs and max(counting.calls) <= batch_size
    assert scores == pytest.approx(LMJudgeReward(tiny_engine).score(QUESTIONS, RESPONSES), abs=1e-5)


def test_too_long_for_the_context_is_a_reward_error(tiny_engine):
    with pytest.raises(RewardError, match="context"):
        LMJudgeReward(tiny_engine).score(["q"], ["x" * (tiny_engine.max_context + 10)])


# ------------------------------------------------------------------------------------- pure logic (unit)


def test_judge_messages():
    [msg] = judge_messages("  What is 2+2?  ", "2 + 2 = 4")
    assert msg["role"] == "user"
    assert "What is 2+2?" in msg["content"] and "2 + 2 = 4" in msg["content"]
    assert msg["content"].endswith("Yes or No.")
    [empty] = judge_messages("What is 2+2?", "   ")
    assert "(no steps written yet)" in empty["content"]


class FakeTokenizer:
    """Word-level ids with an optional BOS the way some tokenizers add it."""

    def __init__(self, vocab: dict[str, list[int]], bos: int | None = None):
        self.vocab, self.bos = vocab, bos

    def encode(self, text):
        return ([self.bos] if self.bos is not None else []) + self.vocab[text]


def test_answer_token_ids_take_the_first_distinguishing_token():
    vocab = {"Yes": [10], " Yes": [11], "No": [20], " No": [21]}
    assert answer_token_ids(FakeTokenizer(vocab)) == ([10, 11], [20, 21])
    assert answer_token_ids(FakeTokenizer(vocab, bos=1)) == ([10, 11], [20, 21])  # the BOS is skipped
    shared_space = {"Yes": [10, 12], " Yes": [3, 10, 12], "No": [20], " No": [3, 20]}
    assert answer_token_ids(FakeTokenizer(shared_space)) == ([10], [20])  # duplicates counted once
    with pytest.raises(RewardError):
        answer_token_ids(FakeTokenizer({"Yes": [5], " Yes": [6], "No": [5], " No": [7]}))
    with pytest.raises(RewardError):  # a token that would count for both answers
        answer_token_ids(FakeTokenizer({"Yes": [5], " Yes": [6], "No": [6], " No": [5]}))


def test_yes_probability_normalises_over_the_two_answers():
    assert yes_probability([math.log(0.3)], [math.log(0.1)]) == pytest.approx(0.75)
    # spellings of one answer add up (logsumexp)
    assert yes_probability([math.log(0.2), math.log(0.1)], [math.log(0.1)]) == pytest.approx(0.75)
    assert yes_probability([math.log(0.1)], [math.log(0.1), math.log(0.2)]) == pytest.approx(0.25)
    assert yes_probability([-math.inf], [-math.inf]) == 0.5
    assert yes_probability([0.0], [-math.inf]) == 1.0
    assert yes_probability([-2000.0], [-1.0]) == pytest.approx(0.0, abs=1e-300)  # no overflow
    assert yes_probability([-1.0], [-2000.0]) == pytest.approx(1.0)


# ------------------------------------------------------------------------------------- registry


def test_registry_builds_each_reward(tiny_engine):
    assert set(REWARDS) == {"arithmetic", "lm_judge", "logprob", "none"}
    assert isinstance(build_reward("arithmetic", None), ArithmeticReward)
    assert isinstance(build_reward("lm_judge", tiny_engine), LMJudgeReward)
    assert build_reward("none", tiny_engine) is None


def test_registry_errors(tiny_engine):
    with pytest.raises(ConfigError, match="arithmetic, lm_judge, logprob, none"):
        build_reward("orm", tiny_engine)
    with pytest.raises(ConfigError, match="engine"):
        build_reward("lm_judge", None)

    class SamplingOnly:
        name, capabilities = "fake", frozenset({CAP_SAMPLING})
        tokenizer, max_context = tiny_engine.tokenizer, 2048

    with pytest.raises(CapabilityError):
        build_reward("lm_judge", SamplingOnly())
    with pytest.raises(RewardError):
        LMJudgeReward(tiny_engine, batch_size=0)
