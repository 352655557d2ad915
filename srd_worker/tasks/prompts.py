"""The one chat prompt template shared by the math tasks (GSM8K, MATH-500).

Follows the widely used zero-shot "reason step by step, put the final answer in \\boxed{}" instruction
(as in the Qwen2.5-Math and DeepSeek-Math evaluation harnesses), so the grader can always look for the last
``\\boxed{}``. Left out: few-shot exemplars, per-model chat-template quirks (the engine applies the model's
own chat template to these messages) and prompts for non-math tasks.
"""

from __future__ import annotations

#: Bump when the wording changes, so results from different prompts are never mixed silently.
PROMPT_VERSION: str = "math-boxed-1"

SYSTEM_PROMPT: str = "You are a helpful assistant that solves math problems carefully and accurately."

BOXED_INSTRUCTION: str = "Please reason step by step, and put your final answer within \\boxed{}."


def math_messages(question: str) -> list[dict[str, str]]:
    """System + user chat messages asking for step-by-step reasoning and a ``\\boxed{}`` final answer."""
    return [
        {"role": "system", "content": SYSTEM_PROMPT},
        {"role": "user", "content": f"{question.strip()}\n\n{BOXED_INSTRUCTION}"},
    ]
