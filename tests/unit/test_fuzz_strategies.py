"""Hypothesis strategies for what degenerate models emit, shared by the fuzz tests (``test_fuzz_*.py``).

``hostile_text()`` joins fragments: long digit runs, repeated operators, deep or unbalanced brackets and
``\\boxed{``, huge powers and factorials in LaTeX, arithmetic claims (some well formed), mixed scripts and
Unicode digits, control characters and NUL bytes, whitespace, and arbitrary text; a fragment may be
repeated many times. The profile (example count, deadline, derandomize) is set in ``tests/conftest.py``.
"""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

#: Longest text a strategy builds (about a 4k-token response).
MAX_CHARS = 20_000

_DIGITS = "0123456789"
_UNICODE_DIGITS = "٠١٢٣٤٥٦٧٨٩۰۱۲۳٤०१२३४৫๑๒๓１２３𝟎𝟗²³¹⁴₅½¾⅓⅞"
_OPERATORS = "+-*/×÷·−–=%^!x"
_LATEX = [
    "10^{10^{10}}",
    "2^{2^{2^{100}}}",
    "1000!",
    "(10^{100})!",
    "\\frac{1}{",
    "\\frac{10^{999}}{3}",
    "\\sqrt{",
    "\\boxed{",
    "\\boxed{}",
    "\\boxed ",
    "\\fbox{",
    "\\times",
    "\\cdot",
    "\\div",
    "\\left(",
    "\\right)",
    "\\text{",
    "\\$",
    "\\%",
    "\\{",
    "\\}",
    "$",
    "$$",
    "1e308",
    "1e999",
    "<<",
    ">>",
    "####",
]
_PROSE = [
    "3 + 4 = 7",
    "6 * 7 = 42",
    "10 / 3 = 3.33",
    "<<2*3=6>>6",
    "$1,200 + $300 = $1,500",
    "50% of 20 = 10",
    "1 1/2 + ½ = 2",
    " = ",
    "The answer is ",
    "Answer: ",
    "the answer is (B)",
    "(C)",
    "yes",
    "no",
    "\\boxed{42}",
    "\\boxed{\\text{Paris}}",
    "Step 1:",
    "\n\n",
    "**",
    "- ",
]
_SCRIPTS = ["日本語", "Ωμέγα", "مرحبا", "שלום", "русский", "🙂", "\u200f", "\u200b", "\ufeff", "é", "ﬁ"]
_CONTROL = ["\x00", "\x01", "\x07", "\x1b", "\x7f", "\r", "\r\n", "\x0b", "\x0c", "\u2028", "\u0085", "\t"]


def _run(chars: str, max_len: int) -> st.SearchStrategy[str]:
    return st.text(st.sampled_from(chars), min_size=1, max_size=max_len)


def fragment() -> st.SearchStrategy[str]:
    """One piece of degenerate output."""
    return st.one_of(
        st.integers(1, 1200).map(lambda n: "9" * n),  # long digit runs
        _run(_DIGITS, 400),
        _run(_DIGITS + ",. /", 200),
        _run(_OPERATORS, 50),  # repeated operators
        st.integers(1, 300).map(lambda n: "(" * n),  # deep or unbalanced brackets
        st.integers(1, 300).map(lambda n: ")" * n),
        st.integers(1, 100).map(lambda n: "\\boxed{" * n),
        st.integers(1, 100).map(lambda n: "}" * n),
        st.sampled_from(_LATEX),
        st.sampled_from(_PROSE),
        _run(_UNICODE_DIGITS, 40),
        st.sampled_from(_SCRIPTS),
        st.sampled_from(_CONTROL),
        _run(" \t\n", 40),
        st.text(max_size=40),
    )


def _repeat(piece_and_count: tuple[str, int]) -> str:
    piece, count = piece_and_count
    return (piece * count)[:MAX_CHARS]


def hostile_text() -> st.SearchStrategy[str]:
    """A whole response: fragments joined, a fragment possibly repeated many times, or empty text."""
    piece = st.one_of(fragment(), st.tuples(fragment(), st.integers(2, 400)).map(_repeat))
    return st.one_of(
        st.just(""),
        _run(" \t\n\r", 30),
        st.lists(piece, max_size=20).map(lambda parts: "".join(parts)[:MAX_CHARS]),
    )


@given(hostile_text())
def test_hostile_text_stays_within_its_size(text):
    assert isinstance(text, str) and len(text) <= MAX_CHARS
