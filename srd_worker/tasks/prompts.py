"""Chat prompt templates for every task, in the style of the SRD paper's appendix D.

- Math (GSM8K, MATH-500): the widely used zero-shot "reason step by step, put the final answer in
  \\boxed{}" instruction after the question (as in the Qwen2.5-Math and DeepSeek-Math evaluation
  harnesses), so the grader can always look for the last ``\\boxed{}``.
- GPQA Diamond: the same style; the question is followed by the four choices labelled ``(A)``..``(D)``
  and the model is asked for the *letter* in ``\\boxed{}``.
- HotpotQA: numbered passages (``[1] Title: text``) then the question; the model is told to reason only
  from the passages, cite the passage numbers it uses, and give a short final answer in ``\\boxed{}``.
- AlpacaEval: the raw instruction as the only user turn (no system prompt, no answer format).
- Generic files: the prompt column as is; when an answer column is mapped, the boxed instruction is added.

Each template has its own version string (``PROMPT_VERSIONS``); bump it when the wording changes, so
results from different prompts are never mixed silently. Left out: few-shot exemplars and per-model
chat-template quirks (the engine applies the model's own chat template to these messages); the exact
appendix D wording is paraphrased where the paper does not give it verbatim.
"""

from __future__ import annotations

from collections.abc import Sequence

#: Bump when the wording changes, so results from different prompts are never mixed silently.
PROMPT_VERSION: str = "math-boxed-1"

SYSTEM_PROMPT: str = "You are a helpful assistant that solves math problems carefully and accurately."

BOXED_INSTRUCTION: str = "Please reason step by step, and put your final answer within \\boxed{}."

GPQA_SYSTEM_PROMPT: str = (
    "You are a helpful assistant that answers multiple-choice science questions carefully and accurately."
)
GPQA_INSTRUCTION: str = (
    "Please reason step by step, and put the letter of your final answer (A, B, C or D) within \\boxed{}."
)
#: Choice labels, in display order.
GPQA_LETTERS: tuple[str, ...] = ("A", "B", "C", "D")

HOTPOTQA_SYSTEM_PROMPT: str = (
    "You are a helpful assistant that answers questions using only the passages you are given."
)
HOTPOTQA_INSTRUCTION: str = (
    "Answer the question using only the information in the passages above; do not use outside knowledge. "
    "Reason step by step and cite the passages you use by their numbers, e.g. [2]. Then give the final "
    "answer as a short phrase (a name, a date, a number, or yes/no), not a sentence, within \\boxed{}."
)

GENERIC_SYSTEM_PROMPT: str = "You are a helpful assistant that answers questions carefully and accurately."

PROMPT_VERSIONS: dict[str, str] = {
    "math": PROMPT_VERSION,
    "gpqa": "gpqa-letter-boxed-1",
    "hotpotqa": "hotpotqa-passages-boxed-1",
    "alpaca_eval": "raw-instruction-1",
    "generic": "generic-1",
}


def math_messages(question: str) -> list[dict[str, str]]:
    """System + user chat messages asking for step-by-step reasoning and a ``\\boxed{}`` final answer."""
    return [
        {"role": "system", "content": SYSTEM_PROMPT},
        {"role": "user", "content": f"{question.strip()}\n\n{BOXED_INSTRUCTION}"},
    ]


def format_gpqa_question(question: str, choices: Sequence[str]) -> str:
    """The question followed by its choices, one per line: ``(A) ...`` to ``(D) ...``."""
    lines = [f"({letter}) {choice.strip()}" for letter, choice in zip(GPQA_LETTERS, choices, strict=True)]
    return f"{question.strip()}\n\n" + "\n".join(lines)


def gpqa_messages(question_with_choices: str) -> list[dict[str, str]]:
    """System + user messages for a multiple-choice question (from ``format_gpqa_question``)."""
    return [
        {"role": "system", "content": GPQA_SYSTEM_PROMPT},
        {"role": "user", "content": f"{question_with_choices.strip()}\n\n{GPQA_INSTRUCTION}"},
    ]


def format_hotpotqa_question(question: str, passages: Sequence[tuple[str, str]]) -> str:
    """Numbered ``[i] Title: text`` passages, then ``Question: ...`` (what the policy and reward model see)."""
    body = "\n\n".join(
        f"[{i}] {title.strip()}: {text.strip()}" for i, (title, text) in enumerate(passages, 1)
    )
    return f"Passages:\n\n{body}\n\nQuestion: {question.strip()}"


def hotpotqa_messages(question_with_passages: str) -> list[dict[str, str]]:
    """System + user messages for a question over passages (from ``format_hotpotqa_question``)."""
    return [
        {"role": "system", "content": HOTPOTQA_SYSTEM_PROMPT},
        {"role": "user", "content": f"{question_with_passages.strip()}\n\n{HOTPOTQA_INSTRUCTION}"},
    ]


def raw_messages(instruction: str) -> list[dict[str, str]]:
    """The instruction as the only user turn, unchanged (AlpacaEval; generic files without answers)."""
    return [{"role": "user", "content": instruction}]


def generic_boxed_messages(prompt: str) -> list[dict[str, str]]:
    """A generic question with the boxed-answer instruction (generic files with an answer column)."""
    return [
        {"role": "system", "content": GENERIC_SYSTEM_PROMPT},
        {"role": "user", "content": f"{prompt.strip()}\n\n{BOXED_INSTRUCTION}"},
    ]
