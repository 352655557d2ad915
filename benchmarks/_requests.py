"""The engine requests of one Best-of-N drafting round, shared by the benchmarks that time engines."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any


def round_requests(
    tokenizer: Any, task: Any, items: Iterable[Any], params: Any, *, n: int, max_new_tokens: int
) -> list[Any]:
    """``n`` seeded requests per item (seed ``1000·item + candidate``) with the method's drafter sampling
    parameters (temperature, top-p, top-k) and ``max_new_tokens``, prompts built by the task's template."""
    from srd_worker.engines.base import GenerationRequest, SamplingParams

    prompts = [tuple(tokenizer.chat_prompt_ids(task.messages(item))) for item in items]
    return [
        GenerationRequest(
            prompt,
            SamplingParams(
                temperature=params.temperature,
                top_p=params.top_p,
                top_k=params.top_k,
                max_new_tokens=max_new_tokens,
                seed=1000 * i + c,
            ),
        )
        for i, prompt in enumerate(prompts)
        for c in range(n)
    ]
