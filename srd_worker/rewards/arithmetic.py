"""A rule-based process reward: the share of correct arithmetic claims in a (partial) response.

Follows ALGORITHMS.md §0.2 (a reward on ``(question, partial response)``, higher is better, scale private
to this model) for GSM8K-style reasoning. No model is involved: the response text is scanned for
arithmetic claims and each one is checked exactly (rational arithmetic).

What counts as a claim
    ``lhs = rhs`` where ``lhs`` is a numeric expression with at least one operator and ``rhs`` a numeric
    expression (usually one number). Numbers may carry thousands commas (or spaces after a currency
    sign: ``$350 000``), decimals, a leading currency sign (``$ € £``, also LaTeX ``\\$``) and a trailing
    ``%``; fractions ``3/4``, mixed numbers ``3 1/2`` and ``½ ¾ ⅓ …`` are numbers too (a fraction written
    without spaces binds tighter than a spaced division: ``1 1/2 / 1/2 = 3``). Operators: ``+ - * /``,
    ``x``/``X`` between numbers, ``× ÷ · − –`` and LaTeX ``\\times \\cdot \\div``; parentheses, with implicit
    multiplication before a parenthesis (``2(3+4)``). Chains ``a = b = c`` give one claim per ``=``.
    GSM8K calculator annotations ``<<expr=result>>`` are claims too; the prose around an annotation that
    states the same result (``15 pages x 1/3 = <<15*1/3=5>>5``) is the same claim and is counted once,
    as the annotation (the prose's left side is often cut short by units).
    Each side is evaluated by parsing it with :mod:`ast` and walking only numeric literals, ``+ - * /``,
    unary ``+ -`` and parentheses (:func:`safe_eval`); nothing is ever passed to ``eval``.

How a claim is judged
    Correct when the left side equals the right side within a relative tolerance (1e-6), or when the
    right side is the left side rounded to the decimals it shows (``10/3 = 3.33``; an integer claim
    shows 0 decimals, so ``10/3 = 3`` passes as well). A ``%`` is read both as "/100" and as a bare
    unit label (``50 * 20% = 10`` and ``0.25 * 100 = 25%`` both pass). In a run-on chain the claim may
    match the whole right side or only its leading number (``4 * 3 = 12 + 2 = 14`` passes).

What is not judged (neither correct nor wrong)
    - A claim cut off at the end of a partial response: no right-hand number yet, or the text ends
      right after it on the same line (the number, a decimal or a chained expression may still be
      growing: ``= 1`` may become ``= 1,200``, ``= 7.`` may become ``= 7.5``, ``= 6 +`` may become
      ``= 6 + 4``). Once a line break, a word or a sentence end (``". "``) follows, it is judged; pass
      ``complete=True`` to :func:`check_claims` to judge the trailing claim of a finished text.
    - A side that is only part of what is written: an operator binding it to a word (``2x + 3 + 4 = 15``,
      ``x * 3 + 4 = 10``, ``15 pages x 1/3 = 5``) or a number directly next to it (``3 100 + 4``): the
      claim is skipped rather than judged on a fragment.
    - Units between numbers (``3 hours * 60 = 180``), powers (``^``, ``**``), ``\\frac``, words such as
      ``of``/``times``/``half``, division by zero, and anything that is not a plain numeric literal
      (names, calls, ``__import__``): no claim is found.
    - Whether a claim is *relevant* to the question; only its arithmetic is checked.

Bounds on degenerate text (model output is untrusted)
    - A number written with more than ``_MAX_DIGITS`` (100) digits, integer and decimal digits together
      (``99999…`` runs that small models emit), is not read as a number: a claim with such a number on
      either side is not judged, and the response scores as if the claim were absent. With at most
      ``_MAX_SIDE_TOKENS`` tokens a side, a side's exact value then has a bounded number of digits.
    - At most ``_MAX_EQUALS`` (256) ``=`` signs of a text are looked at (the first ones); later ones are
      not judged. With the side bound this caps the parsing work per response.
    - The verdict is exact (fractions); ``Claim.claimed`` / ``Claim.computed`` are floats for display and
      saturate to ``±inf`` when a value is beyond the float range, so no conversion can overflow.

Score
    ``(correct + prior_correct) / (total + prior_correct + prior_wrong)``: a Beta(1, 1)-smoothed
    (Laplace) fraction of correct claims by default. Smoothing matters for partial responses, which
    often hold zero or one claim: a response with no claims scores the neutral 0.5 and one correct claim
    lifts it above (2/3), so ties between "no evidence yet" and "all correct so far" break toward
    evidence; a single wrong claim with no correct one drops it below 0.5 (1/3), and more claims move
    the score further in their direction. An unsmoothed fraction would rank a single lucky claim (1.0)
    above ten correct and one wrong (0.91) and leave the claim-free response undefined.

Why this file is over 500 lines: the claim grammar (numbers, operators, annotations, LaTeX) and its
checks are one parser; split into pieces they would each need the others' regular expressions.
"""

from __future__ import annotations

import ast
import math
import re
import sys
import unicodedata
from collections.abc import Sequence
from dataclasses import dataclass
from decimal import Decimal
from fractions import Fraction
from typing import cast

from srd_worker.errors import RewardError

#: Relative tolerance of a claim check (the brief's 1e-6).
DEFAULT_REL_TOL = 1e-6
#: Longest run of tokens considered on either side of ``=``; bounds the work on pathological text.
_MAX_SIDE_TOKENS = 64
#: Most digits a number may be written with (longer ones are not read; see the module docstring).
_MAX_DIGITS = 100
#: Most ``=`` signs looked at in one text (see the module docstring).
_MAX_EQUALS = 256
_FLOAT_MAX = Fraction(sys.float_info.max)

# Token kinds.
_NUM, _OP, _LP, _RP, _EQ, _BREAK = "num", "op", "lp", "rp", "eq", "break"
_EXPR_KINDS = frozenset({_NUM, _OP, _LP, _RP})

_CURRENCY_RE = re.compile(r"\\?[$€£]")
_VULGAR = "¼½¾⅐⅑⅒⅓⅔⅕⅖⅗⅘⅙⅚⅛⅜⅝⅞"
_VULGAR_RE = re.compile(rf"(\d+)?([{_VULGAR}])")
_SPACED_THOUSANDS_RE = re.compile(
    r"\d{1,3}(?:[ \u00a0\u202f]\d{3})+(?![\d,./])"
)  # only after a currency sign
_MIXED_RE = re.compile(r"(\d+) (\d+)/(\d+)(?![\d.,/])")
_FRACTION_RE = re.compile(r"(\d+)/(\d+)(?![\d.,/])")
_DECIMAL_RE = re.compile(r"\d{1,3}(?:,\d{3})+(?!\d)(?:\.\d+)?|\d+(?:\.\d+)?|\.\d+")
#: The span of a number too long to read: digits with the separators a number may hold.
_LONG_RUN_RE = re.compile(r"[,./]?\d+(?:[,./]\d+)*")
_PERCENT_RE = re.compile(r" ?\\?%")
_LATEX_CMD_RE = re.compile(r"\\([A-Za-z]+|.)", re.S)
_WORD_RE = re.compile(r"[^\W\d]\w*")  # letters first, then letters/digits ("x2", "H2O" are words)
_OPS = {"+": "+", "-": "-", "−": "-", "–": "-", "*": "*", "/": "/", "×": "*", "÷": "/", "·": "*", "⋅": "*"}
_LATEX_OPS = {"\\times": "*", "\\cdot": "*", "\\div": "/"}
#: LaTeX read as whitespace: sizing and spacing commands.
_LATEX_SKIP = frozenset({"\\left", "\\right", "\\,", "\\;", "\\:", "\\!", "\\ "})
#: Characters that glue a number to what comes before or after it in a way this parser does not read:
#: a power or subscript ("x^2 + 1 = 0"), a LaTeX group ("\frac{1}{2}(4)(4) = 8"), a factorial ("= 5!").
_GLUE_BEFORE = frozenset("^_{}")
_GLUE_AFTER = frozenset("^_{!")
#: LaTeX commands that only format text or add space; any other command next to a side glues it.
_LATEX_TEXT = frozenset({"\\text", "\\textbf", "\\mathrm", "\\mbox", "\\rm", "\\quad", "\\qquad"})
_X_OPERAND_RE = re.compile(rf"[ \t]*(?:\\?[$€£])?[\d.({_VULGAR}]")
#: Words that stand for an operator: a number right after one is a right operand, not a whole side.
_OPERATOR_WORDS = frozenset({"x", "times", "plus", "minus", "by"})
# What may still follow the end of a partial claim and extend it (digits would have been part of the
# number): an unfinished thousands group or decimal point ("130,0", "7."), or, on the same line, spaces,
# operators, currency, "x" or the start of a LaTeX operator ("\tim"). Expressions never span lines.
# Possessive quantifiers: a long run of spaces must not backtrack (quadratic time on degenerate text).
_CONTINUATION_RE = re.compile(r"(?:,\d{0,2}|\.)?|[ \t+\-−–*/×÷·⋅($€£%]*+(?:\\[A-Za-z]*|[xX])?[ \t]*+")
_ANNOTATION_RE = re.compile(r"<<([^<>]*)>>")
_OPEN_ANNOTATION_RE = re.compile(r"<<[^<>\nA-Za-z]*>?\Z")  # "<<16-3-4=9" at the end of a partial


@dataclass(frozen=True)
class Claim:
    """One checked arithmetic claim.

    ``expression`` is the left side as written; ``computed`` its value; ``claimed`` the right-side value
    the verdict used (the closest candidate when ``ok`` is False); ``text`` the whole claim as written;
    ``source`` is ``"text"`` or ``"annotation"`` (a GSM8K ``<<expr=result>>``); ``start``/``end`` are
    character offsets of ``text`` in the checked string.
    """

    expression: str
    claimed: float
    computed: float
    ok: bool
    text: str
    source: str
    start: int
    end: int


@dataclass(frozen=True)
class _Tok:
    kind: str
    start: int
    end: int
    op: str = ""  # _OP: normalised operator
    value: Fraction = Fraction(0)  # _NUM
    decimals: int | None = None  # _NUM: decimals shown by a decimal literal (None for fractions)
    divisions: int = 0  # _NUM: 1 for a fraction "3/4" (it is a division claim), else 0
    percent: bool = False  # _NUM
    word: str = ""  # _BREAK: the word (lower case) or LaTeX command ("\\frac"), if it is one
    char: str = ""  # _BREAK: the character, if it is a single one
    overlong: bool = False  # _NUM: written with more than _MAX_DIGITS digits, so not read (value 0)


# ---------------------------------------------------------------------------------------------------
# Safe evaluation


def safe_eval(expression: str) -> Fraction:
    """Exact value of ``expression`` built only from numeric literals, ``+ - * /``, unary ``+ -`` and
    parentheses. Raises ``ValueError`` for anything else (names, calls, attributes, ``**``, strings),
    for invalid syntax and for division by zero. Never calls ``eval``."""
    return _eval_source(expression.strip())[0]


def _eval_source(source: str, leaves: Sequence[Fraction] | None = None) -> tuple[Fraction, int]:
    """Value and number of binary operators of ``source`` (see :func:`safe_eval`). With ``leaves``,
    integer literal ``i`` stands for ``leaves[i]`` (how the claim scanner passes exact token values)."""
    try:
        tree = ast.parse(source, mode="eval")
    except (SyntaxError, ValueError) as e:  # ValueError: null bytes
        raise ValueError(f"not an arithmetic expression: {source!r}") from e
    binops = 0

    def walk(node: ast.AST) -> Fraction:
        nonlocal binops
        if isinstance(node, ast.Constant) and type(node.value) in (int, float):
            if leaves is not None:  # the source holds leaf indices only: int literals (see _values)
                return leaves[cast(int, node.value)]
            # The literal as written, exactly (a float would turn 0.1 into 0.1000000000000000055...).
            segment = ast.get_source_segment(source, node)
            return Fraction(segment if segment is not None else str(node.value))
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.UAdd, ast.USub)):
            inner = walk(node.operand)
            return -inner if isinstance(node.op, ast.USub) else inner
        if isinstance(node, ast.BinOp) and isinstance(node.op, (ast.Add, ast.Sub, ast.Mult, ast.Div)):
            binops += 1
            left, right = walk(node.left), walk(node.right)
            if isinstance(node.op, ast.Add):
                return left + right
            if isinstance(node.op, ast.Sub):
                return left - right
            if isinstance(node.op, ast.Mult):
                return left * right
            if right == 0:
                raise ValueError("division by zero")
            return left / right
        raise ValueError(f"disallowed element {type(node).__name__} in {source!r}")

    return walk(tree.body), binops


# ---------------------------------------------------------------------------------------------------
# Tokenising


class _TooLong(Exception):
    """A number with more than ``_MAX_DIGITS`` digits."""


def _int(digits: str) -> int:
    """``int(digits)``, refusing more than ``_MAX_DIGITS`` digits before any conversion work."""
    if len(digits) > _MAX_DIGITS:
        raise _TooLong
    return int(digits)


def _digit_count(text: str) -> int:
    n = sum(ch.isdigit() for ch in text)
    if n > _MAX_DIGITS:
        raise _TooLong
    return n


def _number(text: str, i: int) -> _Tok | None:
    """The number starting at ``i`` (currency sign, digits, fraction, percent), or None. A number with
    more than ``_MAX_DIGITS`` digits is an ``overlong`` token that no claim reads."""
    start = i
    cur = _CURRENCY_RE.match(text, i)
    if cur:
        i = cur.end()
    try:
        return _read_number(text, start, i, bool(cur))
    except _TooLong:
        m = _LONG_RUN_RE.match(text, i)
        assert m is not None  # every branch that can refuse starts at a digit or a separator and digit
        return _Tok(_NUM, start, m.end(), overlong=True)


def _read_number(text: str, start: int, i: int, cur: bool) -> _Tok | None:
    value: Fraction
    decimals: int | None = None
    divisions = 0
    if m := _VULGAR_RE.match(text, i):
        value = Fraction(_int(m.group(1) or "0")) + Fraction(
            unicodedata.numeric(m.group(2))
        ).limit_denominator(10)
    elif cur and (m := _SPACED_THOUSANDS_RE.match(text, i)):
        value, decimals = Fraction(_int(re.sub(r"\D", "", m.group()))), 0
    elif (m := _MIXED_RE.match(text, i)) and _int(m.group(2)) < _int(m.group(3)):
        value = _int(m.group(1)) + Fraction(_int(m.group(2)), _int(m.group(3)))
        _digit_count(m.group())
    elif (m := _FRACTION_RE.match(text, i)) and _int(m.group(2)) != 0:
        value, divisions = Fraction(_int(m.group(1)), _int(m.group(2))), 1
        _digit_count(m.group())
    elif m := _DECIMAL_RE.match(text, i):
        digits = m.group().replace(",", "")
        _digit_count(digits)
        value = Fraction(Decimal(digits))
        decimals = len(digits.split(".", 1)[1]) if "." in digits else 0
    else:
        return None
    end = m.end()
    pct = _PERCENT_RE.match(text, end)
    if pct:
        end = pct.end()
    return _Tok(_NUM, start, end, value=value, decimals=decimals, divisions=divisions, percent=bool(pct))


def _tokenize(text: str) -> list[_Tok]:
    toks: list[_Tok] = []
    i, n = 0, len(text)
    line_start = 0
    while i < n:
        c = text[i]
        if c == "\n":
            toks.append(_Tok(_BREAK, i, i + 1))
            i += 1
            line_start = i
            continue
        if c.isspace():
            i += 1
            continue
        # A list bullet ("- 5 * 4 = 20", "* step") is not an operator.
        if c in "-*+" and not text[line_start:i].strip() and i + 1 < n and text[i + 1] in " \t":
            toks.append(_Tok(_BREAK, i, i + 1))
            i += 1
            continue
        if num := _number(text, i):
            toks.append(num)
            i = num.end
            continue
        prev = toks[-1].kind if toks else None
        if text.startswith("**", i):
            # Markdown bold ("**3 + 4 = 7**"); as Python's power it is not supported either.
            toks.append(_Tok(_BREAK, i, i + 2))
            i += 2
        elif c in "xX" and prev in (_NUM, _RP) and _X_OPERAND_RE.match(text, i + 1):
            toks.append(_Tok(_OP, i, i + 1, op="*"))
            i += 1
        elif c in _OPS:
            toks.append(_Tok(_OP, i, i + 1, op=_OPS[c]))
            i += 1
        elif c == "\\" and (m := _LATEX_CMD_RE.match(text, i)):
            cmd = m.group()
            if cmd in _LATEX_OPS:
                toks.append(_Tok(_OP, i, m.end(), op=_LATEX_OPS[cmd]))
            elif cmd not in _LATEX_SKIP:
                # A command ("\frac", "\sqrt") or a delimiter ("\(", "\]"): not part of an expression.
                toks.append(_Tok(_BREAK, i, m.end(), word=cmd if cmd[1:].isalpha() else ""))
            i = m.end()
        elif c in "()=":
            toks.append(_Tok({"(": _LP, ")": _RP, "=": _EQ}[c], i, i + 1))
            i += 1
        elif m := _WORD_RE.match(text, i):
            toks.append(_Tok(_BREAK, i, m.end(), word=m.group().lower()))
            i = m.end()
        else:
            # Any other character (punctuation, "\(", "^", "<", "{") separates expressions.
            toks.append(_Tok(_BREAK, i, i + 1, char=c))
            i += 1
    return toks


# ---------------------------------------------------------------------------------------------------
# Evaluating one side


@dataclass(frozen=True)
class _Value:
    value: Fraction
    decimals: int | None  # decimals shown when the value is a single literal (rounding check), else None


def _values(toks: Sequence[_Tok]) -> tuple[list[Fraction], int] | None:
    """Every reading of ``toks`` (a ``%`` as /100 and as a label) and its operator count, or None when
    ``toks`` is not an arithmetic expression."""
    parts: list[str] = []
    nums: list[_Tok] = []
    prev: _Tok | None = None
    for t in toks:
        if t.overlong:
            return None  # a number too long to read: no claim on it
        if t.kind == _LP and prev is not None and prev.kind in (_NUM, _RP):
            parts.append("*")  # implicit multiplication: "2(3+4)", "(2)(3)"
        if t.kind == _NUM:
            parts.append(str(len(nums)))  # a leaf index, see _eval_source
            nums.append(t)
        else:
            parts.append({_OP: t.op, _LP: "(", _RP: ")"}[t.kind])
        prev = t
    source = " ".join(parts)
    readings = (True, False) if any(t.percent for t in nums) else (False,)
    values: list[Fraction] = []
    binops = 0
    for percent_as_fraction in readings:
        leaves = [t.value / 100 if t.percent and percent_as_fraction else t.value for t in nums]
        try:
            value, binops = _eval_source(source, leaves)
        except ValueError:
            return None
        if value not in values:
            values.append(value)
    return values, binops + sum(t.divisions for t in nums)


def _literal_values(tok: _Tok, negate: bool) -> list[_Value]:
    base = -tok.value if negate else tok.value
    out = [_Value(base, tok.decimals)]
    if tok.percent:
        out.insert(0, _Value(base / 100, None if tok.decimals is None else tok.decimals + 2))
    return out


def _close(computed: Fraction, claimed: _Value, rel_tol: Fraction, accept_rounding: bool) -> bool:
    diff = abs(computed - claimed.value)
    if diff <= rel_tol * max(abs(computed), abs(claimed.value)):
        return True
    # Rounded to the decimals shown: half a unit in the last place either way, so both rounding
    # directions of an exact half pass.
    return accept_rounding and claimed.decimals is not None and diff <= Fraction(1, 2 * 10**claimed.decimals)


# ---------------------------------------------------------------------------------------------------
# Finding claims


def _whole_left_side(toks: Sequence[_Tok], s: int, lo: int) -> bool:
    """False when the left side starting at token ``s`` is a fragment of something longer."""
    if s == 0:
        return True
    before, first = toks[s - 1], toks[s]
    if s > lo and before.kind != _LP:
        return False  # "x * 3 + 4", "350 000 x 5/100", "(1+2)(1+5)-2": an operand we could not read
    if before.kind == _BREAK:
        if before.char in _GLUE_BEFORE or (before.word.startswith("\\") and before.word not in _LATEX_TEXT):
            return False
        if before.word and (before.end == first.start or before.word in _OPERATOR_WORDS):
            return False  # "f(1) - 1", "15 pages x 1/3"
    if first.kind == _OP:
        # A leading sign: fine after "=", "(", a line break or punctuation ("Total: -5 + 3"), not after
        # a word or a factorial, where it is more likely a binary operator ("2x + 3 + 4 = 15").
        return before.kind in (_EQ, _LP) or (before.kind == _BREAK and not before.word and before.char != "!")
    return True


def _whole_right_side(last: _Tok, after: _Tok) -> bool:
    """False when the right side ending with ``last`` is cut short by ``after``."""
    if after.kind == _NUM:
        return False  # "= 12 000": a number we could not join
    if after.kind == _BREAK:
        if after.char in _GLUE_AFTER or (after.word.startswith("\\") and after.word not in _LATEX_TEXT):
            return False  # "= 144^2", "= 284 + 48\sqrt{35}", "= 5!"
        if len(after.word) == 1 and after.start == last.end:
            return False  # "= 6x": a variable
    return True


def _scan(
    text: str, toks: list[_Tok], *, complete: bool, source: str, rel_tol: Fraction, accept_rounding: bool
) -> list[Claim]:
    claims: list[Claim] = []
    equals = 0
    for k, eq in enumerate(toks):
        if eq.kind != _EQ:
            continue
        equals += 1
        if equals > _MAX_EQUALS:
            break
        # Left side: the longest valid suffix of the expression-token run before "=" ("Step 2 (3 + 4"
        # gives "3 + 4"). One that starts right after an operator or a number would be a fragment.
        lo = k
        while lo > 0 and toks[lo - 1].kind in _EXPR_KINDS and k - lo < _MAX_SIDE_TOKENS:
            lo -= 1
        lhs: tuple[int, list[Fraction]] | None = None
        for s in range(lo, k):
            got = _values(toks[s:k])
            if got is not None and got[1] >= 1:
                lhs = (s, got[0])
                break
        if lhs is None:
            continue
        s, computed = lhs
        if not _whole_left_side(toks, s, lo):
            continue
        # Right side: the longest valid prefix of the run after "=".
        hi = k + 1
        while hi < len(toks) and toks[hi].kind in _EXPR_KINDS and hi - k <= _MAX_SIDE_TOKENS:
            hi += 1
        rhs: tuple[int, list[_Value]] | None = None
        for e in range(hi, k + 1, -1):
            got = _values(toks[k + 1 : e])
            if got is None:
                continue
            cands: list[_Value] = []
            first = k + 1
            negate = toks[first].kind == _OP and toks[first].op == "-"
            if toks[first].kind == _OP and toks[first].op in "+-":
                first += 1
            if first < e and toks[first].kind == _NUM:
                # The leading number alone: the only reading of "= 9", the run-on reading of "= 12 + 2".
                cands.extend(_literal_values(toks[first], negate))
            if e - first > 1 or not cands:
                cands.extend(_Value(v, None) for v in got[0])
            rhs = (e, cands)
            break
        if rhs is None:
            continue
        e, claimed_values = rhs
        if e < len(toks) and not _whole_right_side(toks[e - 1], toks[e]):
            continue
        end = toks[e - 1].end
        if not complete and _CONTINUATION_RE.fullmatch(text, toks[hi - 1].end):
            continue  # the right side may still be growing ("= (1000)(26" judged on "(1000)" would be wrong)
        best: tuple[bool, Fraction, Fraction, Fraction] | None = None  # (ok, -gap, computed, claimed)
        for c in computed:
            for v in claimed_values:
                key = (_close(c, v, rel_tol, accept_rounding), -abs(c - v.value), c, v.value)
                if best is None or key[:2] > best[:2]:
                    best = key
        assert best is not None
        ok, _, computed_value, claimed_value = best
        start = toks[s].start
        claims.append(
            Claim(
                expression=text[start : eq.start].strip(),
                claimed=_to_float(claimed_value),
                computed=_to_float(computed_value),
                ok=ok,
                text=text[start:end],
                source=source,
                start=start,
                end=end,
            )
        )
    return claims


def _to_float(q: Fraction) -> float:
    """``q`` as a float for display, ``±inf`` beyond the float range (``float(q)`` would overflow)."""
    if abs(q) > _FLOAT_MAX:
        return math.inf if q > 0 else -math.inf
    return float(q)


def check_claims(
    text: str, *, complete: bool = False, rel_tol: float = DEFAULT_REL_TOL, accept_rounding: bool = True
) -> list[Claim]:
    """Every judged arithmetic claim in ``text``, in order of position.

    ``complete=False`` (the default) treats ``text`` as a partial response, so a claim at its very end
    is not judged (see the module docstring); ``complete=True`` judges it.
    """
    tol = Fraction(rel_tol)
    # Calculator annotations are judged on their own, then cut out so the prose around them reads as it
    # would without them ("9 * 2 = $<<9*2=18>>18" -> "9 * 2 = $18"). An annotation still open at the
    # end of a partial response is dropped.
    claims: list[Claim] = []
    kept: list[str] = []
    offsets: list[int] = []  # offsets[j] = position in `text` of character j of the stripped text
    cut_points: list[tuple[int, list[Claim]]] = []  # (stripped position, claims of that annotation)
    pos = 0
    for m in _ANNOTATION_RE.finditer(text):
        kept.append(text[pos : m.start()])
        offsets.extend(range(pos, m.start()))
        inner = m.group(1)
        inner_claims = [
            Claim(
                expression=c.expression,
                claimed=c.claimed,
                computed=c.computed,
                ok=c.ok,
                text=m.group(),
                source="annotation",
                start=m.start(),
                end=m.end(),
            )
            for c in _scan(
                inner,
                _tokenize(inner),
                complete=True,
                source="annotation",
                rel_tol=tol,
                accept_rounding=accept_rounding,
            )
        ]
        claims.extend(inner_claims)
        cut_points.append((len(offsets), inner_claims))
        pos = m.end()
    tail = text[pos:]
    if not complete and (opened := _OPEN_ANNOTATION_RE.search(tail)):
        tail = tail[: opened.start()]
    kept.append(tail)
    offsets.extend(range(pos, pos + len(tail)))
    stripped = "".join(kept)

    for c in _scan(
        stripped,
        _tokenize(stripped),
        complete=complete,
        source="text",
        rel_tol=tol,
        accept_rounding=accept_rounding,
    ):
        # The prose restating an annotation's result: same claim (its left side may be cut short by
        # units, "15 pages x 1/3 = <<15*1/3=5>>5"), counted once as the annotation.
        if any(c.start <= at <= c.end and any(a.claimed == c.claimed for a in ann) for at, ann in cut_points):
            continue
        start, end = offsets[c.start], offsets[c.end - 1] + 1
        claims.append(
            Claim(
                expression=c.expression,
                claimed=c.claimed,
                computed=c.computed,
                ok=c.ok,
                text=text[start:end],
                source="text",
                start=start,
                end=end,
            )
        )
    claims.sort(key=lambda c: (c.start, c.end))
    return claims


class ArithmeticReward:
    """Laplace-smoothed share of correct arithmetic claims in each response (see the module docstring).

    ``prior_correct`` / ``prior_wrong`` are the pseudo-counts of the Beta prior (1, 1 = Laplace);
    ``complete`` judges a claim at the very end of the text (for finished responses only).
    The question text is not used.
    """

    name = "arithmetic"

    def __init__(
        self,
        *,
        prior_correct: float = 1.0,
        prior_wrong: float = 1.0,
        rel_tol: float = DEFAULT_REL_TOL,
        accept_rounding: bool = True,
        complete: bool = False,
    ) -> None:
        if not prior_correct > 0 or not prior_wrong > 0:
            raise RewardError(f"prior pseudo-counts must be > 0, got ({prior_correct}, {prior_wrong})")
        if not rel_tol >= 0:
            raise RewardError(f"rel_tol must be >= 0, got {rel_tol}")
        self.prior_correct = float(prior_correct)
        self.prior_wrong = float(prior_wrong)
        self.rel_tol = float(rel_tol)
        self.accept_rounding = accept_rounding
        self.complete = complete

    def check(self, response: str, *, finished: bool = False) -> list[Claim]:
        """The claims :meth:`score` counts for ``response`` (a finished response is judged to its end)."""
        return check_claims(
            response,
            complete=self.complete or finished,
            rel_tol=self.rel_tol,
            accept_rounding=self.accept_rounding,
        )

    def score_one(self, response: str, *, finished: bool = False) -> float:
        claims = self.check(response, finished=finished)
        correct = sum(c.ok for c in claims)
        return (correct + self.prior_correct) / (len(claims) + self.prior_correct + self.prior_wrong)

    def score(
        self, prompts: Sequence[str], responses: Sequence[str], *, finished: Sequence[bool] | None = None
    ) -> list[float]:
        """``finished[i]`` True: response i is complete, so a claim at its very end is judged too."""
        if len(prompts) != len(responses):
            raise RewardError(f"got {len(prompts)} prompts but {len(responses)} responses")
        if finished is not None and len(finished) != len(responses):
            raise RewardError(f"got {len(finished)} finished flags for {len(responses)} responses")
        flags = list(finished) if finished is not None else [False] * len(responses)
        return [self.score_one(r, finished=bool(f)) for r, f in zip(responses, flags, strict=True)]
