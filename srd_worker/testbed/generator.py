"""A deterministic generator of multi-step arithmetic word problems in the GSM8K layout.

Each problem follows one quantity through ``steps`` operations (1-6): it starts with a number of
things, and every later sentence adds, removes, multiplies or shares them out. The gold solution
writes one equation per step (``29 + 31 = 60``, ``60 - 2 = 58``) and ends with ``\\boxed{58}``; the
row's ``answer`` is the same steps followed by ``#### 58``, so the ``gsm8k`` task, its math-verify
grader and the ``arithmetic`` reward read it unchanged.

Difficulty knobs: ``steps`` (how many operations) and ``max_operand`` (the largest number added or
removed; multipliers and divisors are 2-5). Every intermediate value stays an integer in
``[0, max_value]``. The same seed always gives the same rows (one ``random.Random`` per row, seeded
from the split's seed and the row index).
"""

from __future__ import annotations

import random
from dataclasses import dataclass

NAMES: tuple[str, ...] = ("Ann", "Ben", "Cara", "Dan", "Eva", "Finn", "Gia", "Hugo", "Ivy", "Jack")
PRONOUNS: dict[str, str] = {
    "Ann": "She",
    "Ben": "He",
    "Cara": "She",
    "Dan": "He",
    "Eva": "She",
    "Finn": "He",
    "Gia": "She",
    "Hugo": "He",
    "Ivy": "She",
    "Jack": "He",
}
ITEMS: tuple[str, ...] = ("apples", "coins", "books", "stamps", "marbles", "cards", "shells", "pens")

#: Sentence templates per operation; ``{p}`` is the pronoun, ``{n}`` the operand.
TEMPLATES: dict[str, tuple[str, ...]] = {
    "+": ("{p} gets {n} more.", "{p} finds {n} more.", "{p} buys {n} more."),
    "-": ("{p} gives {n} away.", "{p} loses {n}.", "{p} sells {n}."),
    "*": ("{p} makes it {n} times as many.",),
    "/": ("{p} shares them equally with {m} {friends} and keeps one share.",),
}
#: Words the tokenizer keeps whole (everything else is read one character at a time).
WORDS: tuple[str, ...] = tuple(
    sorted(
        set(NAMES)
        | set(PRONOUNS.values())
        | set(ITEMS)
        | {"has", "gets", "finds", "buys", "more", "gives", "away", "loses", "sells", "makes", "times"}
        | {"many", "shares", "them", "equally", "with", "friends", "friend", "and", "keeps", "one", "share"}
        | {"How", "does", "have", "now", "boxes", "of", "each"}
    )
)


@dataclass(frozen=True)
class Difficulty:
    """Knobs: steps per problem (inclusive range), largest added/removed operand, largest value."""

    min_steps: int = 1
    max_steps: int = 6
    max_operand: int = 50
    max_value: int = 300


def _equation(a: int, op: str, b: int) -> tuple[str, int]:
    c = {"+": a + b, "-": a - b, "*": a * b, "/": a // b if b else 0}[op]
    return f"{a} {op} {b} = {c}", c


def make_problem(rng: random.Random, steps: int, difficulty: Difficulty) -> dict:
    """One problem with ``steps`` operations: question, gold solution, answer (GSM8K), final number."""
    name = rng.choice(NAMES)
    pronoun = PRONOUNS[name]
    item = rng.choice(ITEMS)
    hi, top = difficulty.max_operand, difficulty.max_value
    lines: list[str] = []
    sentences: list[str] = []
    # First step: a product ("3 boxes of 12 apples each") or a plain start plus one operation.
    if rng.random() < 0.3:
        boxes, per = rng.randint(2, 9), rng.randint(2, min(hi, top // 9))
        sentences.append(f"{name} has {boxes} boxes of {per} {item} each.")
        line, value = _equation(boxes, "*", per)
        lines.append(line)
    else:
        value = rng.randint(2, hi)
        sentences.append(f"{name} has {value} {item}.")
    ops_done = len(lines)
    while ops_done < steps:
        choices = ["+", "-"]
        if 2 * value <= top and value > 0:
            choices.append("*")
        if any(value % d == 0 for d in range(2, 6)) and value >= 4:
            choices.append("/")
        op = rng.choice(choices)
        if op == "+":
            n = rng.randint(1, min(hi, top - value)) if value < top else 0
            if n == 0:
                continue
        elif op == "-":
            if value < 1:
                continue
            n = rng.randint(1, min(hi, value))
        elif op == "*":
            n = rng.choice([d for d in range(2, 6) if value * d <= top])
        else:
            n = rng.choice([d for d in range(2, 6) if value % d == 0])
        template = rng.choice(TEMPLATES[op])
        sentences.append(template.format(p=pronoun, n=n, m=n - 1, friends="friend" if n == 2 else "friends"))
        line, value = _equation(value, op, n)
        lines.append(line)
        ops_done += 1
    question = " ".join(sentences) + f" How many {item} does {name} have now?"
    steps_text = "\n".join(lines)
    return {
        "question": question,
        "answer": f"{steps_text}\n#### {value}",
        "solution": f"{steps_text}\n\\boxed{{{value}}}",
        "final": value,
        "steps": steps,
    }


def generate(n: int, *, seed: int, split: str, difficulty: Difficulty | None = None) -> list[dict]:
    """``n`` rows for ``split``: ids ``<split>-<i>``, steps cycling uniformly over the difficulty range."""
    d = difficulty or Difficulty()
    rows = []
    span = d.max_steps - d.min_steps + 1
    for i in range(n):
        rng = random.Random(f"{seed}:{split}:{i}")
        steps = d.min_steps + (i % span)
        row = make_problem(rng, steps, d)
        rows.append({"id": f"{split}-{i}", **row})
    return rows


def split_rows(
    *, seed: int, n_train: int, n_calibration: int, n_test: int, difficulty: Difficulty | None = None
) -> dict[str, list[dict]]:
    """The three splits; questions that appear in train are dropped from calibration and test."""
    train = generate(n_train, seed=seed, split="train", difficulty=difficulty)
    seen = {r["question"] for r in train}
    out = {"train": train}
    for split, n in (("calibration", n_calibration), ("test", n_test)):
        rows = [
            r for r in generate(n, seed=seed, split=split, difficulty=difficulty) if r["question"] not in seen
        ]
        out[split] = rows
    return out
