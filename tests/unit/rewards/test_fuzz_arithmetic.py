"""Fuzz: the ``arithmetic`` reward on degenerate model output returns a score in (0, 1) quickly.

Model output is untrusted: one response must never fail the shard's round. Found by this fuzzing (and
fixed in ``srd_worker/rewards/arithmetic.py``): a claim with a 320-digit number raised ``OverflowError``
(float conversion), a fraction with over 4300 digits raised ``ValueError`` (int conversion limit), and a
long run of spaces after a claim took quadratic time (regex backtracking).
"""

from __future__ import annotations

import math
import time

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from srd_worker.rewards.arithmetic import _MAX_DIGITS, ArithmeticReward, check_claims
from tests.unit.test_fuzz_strategies import hostile_text

#: Bound on the CPU time for one response of up to 20,000 characters (the profile's deadline is looser):
#: CPU time, not wall time, so a busy machine (a benchmark beside the tests) does not fail it; a quadratic
#: regex still does.
SECONDS_PER_RESPONSE = 1.0


def _in_range(score: float) -> bool:
    # Laplace-smoothed share: strictly between 0 and 1 with the default priors.
    return isinstance(score, float) and math.isfinite(score) and 0.0 < score < 1.0


@pytest.mark.parametrize(
    "text",
    [
        "9" * 320 + " + 1 = 2.",  # the reported response
        "9" * 320 + " + 1 = 2",
        "1 + 1 = " + "9" * 320 + ".",
        "1/3 * " + "9" * 400 + " = 5.",
        "1/" + "7" * 5000 + " + 1 = 2.",  # beyond Python's int-from-str limit
        "0." + "3" * 5000 + " + 1 = 2.",
        "$" + " 000" * 2000 + " + 1 = 2.",
        " * ".join(["9" * _MAX_DIGITS] * 40) + " = 5.",  # every literal allowed, the product is not a float
        "<<" + "9" * 320 + "+1=2>>2",
    ],
)
def test_huge_numbers_score_without_raising(text):
    reward = ArithmeticReward()
    for finished in (False, True):
        (score,) = reward.score(["q"], [text], finished=[finished])
        assert _in_range(score)


def test_a_number_over_the_digit_cap_is_not_judged():
    long = "9" * (_MAX_DIGITS + 1)
    assert check_claims(f"{long} + 1 = 2.") == []
    assert check_claims(f"1 + 1 = {long}.") == []
    assert ArithmeticReward().score_one(f"{long} + 1 = 2.", finished=True) == 0.5  # as if no claim
    # At the cap the claim is judged, exactly, and its display floats saturate instead of overflowing.
    at_cap = "9" * _MAX_DIGITS
    (claim,) = check_claims(f"{at_cap} * {at_cap} * {at_cap} * {at_cap} = 1", complete=True)
    assert not claim.ok and claim.computed == math.inf
    (claim,) = check_claims(f"{at_cap} - 1 = {at_cap[:-1]}8", complete=True)
    assert claim.ok


def test_long_whitespace_after_a_claim_is_linear():
    text = "1 + 1 = 2" + " " * 50_000 + "a"
    start = time.process_time()
    assert ArithmeticReward().score_one(text) == pytest.approx(2 / 3)
    assert time.process_time() - start < SECONDS_PER_RESPONSE


@settings(deadline=None)  # hypothesis's deadline is wall time; the bound below is CPU time
@given(text=hostile_text(), finished=st.booleans())
@example(text="9" * 320 + " + 1 = 2.", finished=False)
@example(text="1 + 1 = 2 " * 2000, finished=True)
@example(text=("(" * 60 + "1" + ")" * 60 + " = 1\n") * 200, finished=False)
def test_score_is_in_range_and_fast(text, finished):
    reward = ArithmeticReward()
    start = time.process_time()
    scores = reward.score(["q", "q"], [text, text[: len(text) // 2]], finished=[finished, False])
    elapsed = time.process_time() - start
    assert len(scores) == 2 and all(_in_range(s) for s in scores)
    assert elapsed < 2 * SECONDS_PER_RESPONSE
    # Without the flag a response is partial; the default reward agrees with finished=False.
    assert reward.score(["q"], [text])[0] == reward.score(["q"], [text], finished=[False])[0]


@given(hostile_text())
def test_claims_are_well_formed(text):
    for claim in check_claims(text, complete=True):
        assert 0 <= claim.start < claim.end <= len(text)
        assert claim.text == text[claim.start : claim.end]
        assert not math.isnan(claim.claimed) and not math.isnan(claim.computed)
