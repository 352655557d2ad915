"""ArithmeticReward and check_claims: worked examples, the GSM8K gold solutions as a reference (their
calculator annotations are correct, so no claim in them may be judged wrong, in full or cut anywhere),
partial responses, number formats, safety, and a property test."""

from __future__ import annotations

import builtins
import json
from fractions import Fraction

import pytest
from hypothesis import given
from hypothesis import strategies as st

from srd_worker.errors import RewardError
from srd_worker.rewards.arithmetic import ArithmeticReward, Claim, check_claims, safe_eval
from srd_worker.rewards.base import RewardModel


def verdicts(text: str, **kw) -> list[tuple[str, bool]]:
    return [(c.text, c.ok) for c in check_claims(text, **kw)]


@pytest.fixture(scope="module")
def gsm8k_gold(datasets_dir) -> list[str]:
    with open(datasets_dir / "gsm8k_test.jsonl", encoding="utf-8") as f:
        return [json.loads(line)["answer"] for _, line in zip(range(100), f, strict=False)]


# ------------------------------------------------------------------------------------- worked examples


def test_correct_equation():
    [claim] = check_claims("He buys 12 * 7 = 84 apples.")
    assert claim == Claim(
        expression="12 * 7",
        claimed=84.0,
        computed=84.0,
        ok=True,
        text="12 * 7 = 84",
        source="text",
        start=8,
        end=19,
    )
    assert ArithmeticReward().score(["q"], ["He buys 12 * 7 = 84 apples."]) == [pytest.approx(2 / 3)]


def test_wrong_equation():
    text = "So 12*7 = 94 apples in total."
    [claim] = check_claims(text)
    assert (claim.expression, claim.computed, claim.claimed, claim.ok) == ("12*7", 84.0, 94.0, False)
    assert text[claim.start : claim.end] == "12*7 = 94"
    score = ArithmeticReward().score(["q"], [text])[0]
    assert score == pytest.approx(1 / 3) and score < 0.5


def test_gsm8k_annotation_counts_once():
    line = "Janet sells 16 - 3 - 4 = <<16-3-4=9>>9 duck eggs a day."
    [claim] = check_claims(line)
    assert (claim.source, claim.expression, claim.computed, claim.claimed, claim.ok) == (
        "annotation",
        "16-3-4",
        9.0,
        9.0,
        True,
    )
    assert claim.text == "<<16-3-4=9>>"
    # a wrong annotation is caught; prose that states another result than its annotation is a second claim
    assert verdicts("She sells 16 - 3 - 4 = <<16-3-4=8>>8 eggs") == [("<<16-3-4=8>>", False)]
    assert verdicts("so 2 + 2 = <<2+2=4>>5 eggs") == [("2 + 2 = <<2+2=4>>5", False), ("<<2+2=4>>", True)]
    # the prose's left side is often cut short by units; the annotation is the claim
    assert verdicts("15 pages x 1/3 = <<15*1/3=5>>5 pages") == [("<<15*1/3=5>>", True)]
    assert verdicts("She makes 9 * 2 = $<<9*2=18>>18 every day") == [("<<9*2=18>>", True)]


def test_gsm8k_gold_solutions_have_no_wrong_claims(gsm8k_gold):
    found = 0
    for i, answer in enumerate(gsm8k_gold):
        for complete in (False, True):
            claims = check_claims(answer, complete=complete)
            assert [c for c in claims if not c.ok] == [], f"row {i}"
        found += len(claims)
    assert found > 250  # the check is not vacuous: nearly every row has calculator annotations


def test_gsm8k_gold_prefixes_have_no_wrong_claims(gsm8k_gold):
    """A partial response cut anywhere (inside a number, an annotation, a chain) is never penalised."""
    for i, answer in enumerate(gsm8k_gold[:25]):
        for k in range(len(answer) + 1):
            wrong = [c for c in check_claims(answer[:k]) if not c.ok]
            assert wrong == [], f"row {i} cut at {k}: {answer[:k]!r}"


# ------------------------------------------------------------------------------------- partial responses


@pytest.mark.parametrize(
    "text",
    [
        "He has 12 * 7 =",
        "He has 12 * 7 = ",
        "He has 12 * 7 = $",
        "He has 12 * 7 = 8",  # may become 84
        "He has 12 * 7 = 84",
        "He has 12 * 7 = 84.",  # may become 84.0
        "The total is 80,000+50,000 = 130,0",  # may become 130,000
        "The total is 999,001 - 1 = 999,00",  # may become 999,000
        "He has 2*3 + 4 = 6 +",  # may become "6 + 4"
        "He has 3 + 4 = 7 \\tim",
        "So (513+487)(513-487) = (1000)(26",  # the longest valid prefix "(1000)" is not the right side
        "Janet sells 16 - 3 - 4 = <<16-3-4=9",
        "Janet sells 16 - 3 - 4 = <<16-3-",
        "Janet sells 16 - 3 - 4 = <<16-3-4=9>",
    ],
)
def test_claim_cut_at_the_end_is_not_judged(text):
    assert check_claims(text) == []
    assert ArithmeticReward().score(["q"], [text]) == [0.5]


def test_a_claim_that_cannot_grow_is_judged_at_the_end():
    # the line or the sentence has ended
    assert verdicts("He has 12 * 7 = 84\n") == [("12 * 7 = 84", True)]
    assert verdicts("He has 12 * 7 = 84. ") == [("12 * 7 = 84", True)]
    assert verdicts("**Total = 3 + 4 = 7**\n") == [("3 + 4 = 7", True)]


def test_complete_mode_judges_the_trailing_claim():
    assert verdicts("He has 12 * 7 = 8", complete=True) == [("12 * 7 = 8", False)]
    assert ArithmeticReward(complete=True).score(["q"], ["12 * 7 = 84"]) == [pytest.approx(2 / 3)]
    # once the text goes on, the claim is judged in partial mode too
    assert verdicts("He has 12 * 7 = 8 apples") == [("12 * 7 = 8", False)]


def test_earlier_claims_are_judged_while_the_last_is_open():
    assert verdicts("3 + 4 = 7 apples and 7 * 2 = 1") == [("3 + 4 = 7", True)]


# ------------------------------------------------------------------------------------- number formats


@pytest.mark.parametrize(
    "text",
    [
        "The cost is $1,200 + $300 = $1,500 in total.",
        "It costs $80,000 + $50,000 = $130,000 now.",
        "The fee is $350 000 x 5/100 = $17 500 for the agent.",
        "So 50 * 20% = 10 of them.",  # % as /100
        "So 0.25 * 100 = 25% of them.",  # % as a label
        "So 100% - 25% = 75% remain.",
        "He pays \\$5 \\times 3 = \\$15 here.",
        "Each gets 1 1/2 / 1/2 = 3 slices.",  # a tight fraction binds tighter than a spaced division
        "She ate ½ + ¼ = ¾ of it.",
        "Total: -5 + 3 = -2 degrees.",
    ],
)
def test_number_formats(text):
    [claim] = check_claims(text)
    assert claim.ok, claim


@pytest.mark.parametrize(
    ("text", "ok"),
    [
        ("Each gets 10 / 3 = 3.33 dollars.", True),
        ("Each gets 10 / 3 = 3.3 dollars.", True),
        ("Each gets 10 / 3 = 3.333333 dollars.", True),
        ("Each gets 10 / 3 = 3.4 dollars.", False),
        ("Each gets 2 / 3 = 0.67 dollars.", True),
        ("Each gets 2 / 3 = 0.66 dollars.", False),  # truncated, not rounded
        ("Each gets 7 / 2 = 3.5 dollars.", True),
        ("Each gets 7 / 2 = 3.6 dollars.", False),
        ("Each gets 45 / 4 = 11 dollars.", True),  # an integer claim shows 0 decimals: 11.25 rounds to 11
        ("Each gets 45 / 4 = 12 dollars.", False),
        ("So 0.1 + 0.2 = 0.3 litres.", True),  # exact arithmetic, no float error
    ],
)
def test_division_and_rounding(text, ok):
    [claim] = check_claims(text)
    assert claim.ok is ok, claim
    if ok:
        assert check_claims(text, accept_rounding=False)[0].ok is (
            claim.claimed == pytest.approx(claim.computed)
        )


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("So 3 x 4 = 12 and 3x4=12 and 3 × 4 = 12 and 8 ÷ 2 = 4 ok", [True, True, True, True]),
        ("So \\(3 \\times 4 = 12\\) and $6 \\div 2 = 3$ ok", [True, True]),
        ("So 2(3 + 4) = 14 ok", [True]),
        ("- 5 * 4 = 20 each", [True]),  # a list bullet, not a minus
        ("**3 + 4 = 7** apples", [True]),
        ("So 4 * 3 = 12 + 2 = 14 ok", [True, True]),  # a run-on chain
        ("So 2*3 + 4 = 6 + 4 = 10 ok", [True, True]),
        ("So 2 + 3 = 6 + 1 = 7 ok", [False, True]),
        ("So 5/0 = 3 ok", []),
        ("Let 2x + 3 + 4 = 15 so", []),  # algebra is not judged on its numeric tail
        ("Let x - 3 + 4 = 8 so", []),
        ("Let x * 3 + 4 = 10 so", []),
        ("Then x^2 + 1 = 0 so", []),
        ("Area \\frac{1}{2}(4)(4)=8 so", []),
        ("So f(1) - 1 = 0 so", []),
        ("So 3 + 4 = 7x so", []),
        ("3 hours * 60 = 180 minutes", []),  # units between numbers: no claim
        ("2^3 = 8 and 2**3 = 8 ok", []),
        ("a << 2 and 3 + 4 = 7 ok", [True]),  # "<<" that is no calculator annotation
        ("So 3 \\cdot 4 = 12 \\text{ apples}", [True]),
    ],
)
def test_claim_detection(text, expected):
    assert [c.ok for c in check_claims(text)] == expected


# ------------------------------------------------------------------------------------- safety


def test_safe_eval_accepts_only_arithmetic():
    assert safe_eval("(1 + 2) * 3 / 4 - -1") == Fraction(13, 4)
    assert safe_eval("0.1 + 0.2") == Fraction(3, 10)
    for bad in [
        "__import__('os').system('echo hi')",
        "a + 1",
        "abs(-1)",
        "2 ** 3",
        "'a' * 3",
        "True + 1",
        "[1][0]",
        "1 if 1 else 2",
        "(lambda: 1)()",
        "1 // 2",
        "1 / 0",
        "1 +",
    ]:
        with pytest.raises(ValueError):
            safe_eval(bad)


def test_names_and_calls_are_ignored_and_nothing_is_evaluated(monkeypatch):
    def boom(*args, **kwargs):
        raise AssertionError("eval/exec must never be called")

    monkeypatch.setattr(builtins, "eval", boom)
    monkeypatch.setattr(builtins, "exec", boom)
    for text in [
        "__import__('os').system('echo pwned') + 1 = 1 ok",
        "<<__import__('os').system('echo pwned')=0>> ok",
        "(lambda: 1)() + 2 = 3 ok",
        "a.b + 2 = 3 ok",
        "os.getcwd() * 2 = 0 ok",
    ]:
        assert check_claims(text) == []
    assert verdicts("<<2+2=4>> then __import__('os') + 1 = 1 ok") == [("<<2+2=4>>", True)]


# ------------------------------------------------------------------------------------- score()


def test_score_keeps_order_and_length():
    reward = ArithmeticReward()
    assert isinstance(reward, RewardModel) and reward.name == "arithmetic"
    responses = ["So 12 * 7 = 84 apples.", "So 12*7 = 94 apples.", "", "No numbers here."]
    expected = [2 / 3, 1 / 3, 1 / 2, 1 / 2]
    assert reward.score(["q"] * 4, responses) == pytest.approx(expected)
    assert reward.score(["q"] * 4, responses[::-1]) == pytest.approx(expected[::-1])
    assert reward.score([], []) == []
    with pytest.raises(RewardError):
        reward.score(["q"], responses)


def test_laplace_smoothing_and_prior():
    reward = ArithmeticReward()
    one_right = "So 1 + 1 = 2 ok."
    ten_right_one_wrong = " ".join(f"So {i} + 1 = {i + 1} ok." for i in range(10)) + " So 2 * 2 = 5 ok."
    s_none, s_one, s_mixed = reward.score(["q"] * 3, ["", one_right, ten_right_one_wrong])
    assert s_none == 0.5 < s_one  # evidence beats no evidence
    assert s_mixed == pytest.approx(11 / 13) and s_mixed > 0.5
    assert ArithmeticReward(prior_correct=2, prior_wrong=1).score(["q"], [""]) == [pytest.approx(2 / 3)]
    assert ArithmeticReward(prior_correct=0.5, prior_wrong=0.5).score(["q"], [one_right]) == [
        pytest.approx(0.75)
    ]
    for bad in [(0, 1), (1, -1)]:
        with pytest.raises(RewardError):
            ArithmeticReward(prior_correct=bad[0], prior_wrong=bad[1])


# ------------------------------------------------------------------------------------- property


OPS = {
    "+": lambda a, b: Fraction(a + b),
    "-": lambda a, b: Fraction(a - b),
    "*": lambda a, b: Fraction(a * b),
    "x": lambda a, b: Fraction(a * b),
    "×": lambda a, b: Fraction(a * b),
    "/": Fraction,
    "÷": Fraction,
}


def fmt(v: Fraction, commas: bool = False) -> str:
    if v.denominator == 1:
        return f"{int(v):,}" if commas else str(int(v))
    return repr(float(v))


@given(
    a=st.integers(0, 999),
    b=st.integers(0, 999),
    op=st.sampled_from(sorted(OPS)),
    delta=st.integers(-50, 50).filter(bool),
    commas=st.booleans(),
)
def test_true_result_scores_above_a_wrong_one(a, b, op, delta, commas):
    if op in "/÷" and b == 0:
        b = 7
    true = OPS[op](a, b)
    reward = ArithmeticReward(complete=True)
    right_text = f"{a} {op} {b} = {fmt(true, commas)}"
    wrong_text = f"{a} {op} {b} = {fmt(true + delta, commas)}"
    right, wrong = reward.score(["q", "q"], [right_text, wrong_text])
    assert right > 0.5 > wrong
    # the same inside a partial response that goes on
    right, wrong = ArithmeticReward().score(["q", "q"], [right_text + " so", wrong_text + " so"])
    assert right > wrong


def test_finished_response_is_judged_to_its_end():
    # SmolLM2's real greedy answer to "What is 13*17?": the wrong claim is the last thing it wrote
    text = "13*17 = 256."
    reward = ArithmeticReward()
    assert reward.score(["q"], [text]) == [0.5]  # as a prefix, "256." may still grow: not judged
    assert reward.score(["q"], [text], finished=[True]) == [pytest.approx(1 / 3)]
    assert reward.score(["q", "q"], [text, text], finished=[False, True]) == [0.5, pytest.approx(1 / 3)]
    with pytest.raises(RewardError, match="finished flags"):
        reward.score(["q"], [text], finished=[True, False])
