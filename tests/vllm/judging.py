"""A judge's answers read two ways on a real engine: from one request's top logprobs of the prompt's next
token (the engines' default) and pair by pair with prompt logprobs (``next_token_top_k = 0``)."""

from __future__ import annotations

from typing import Any


def answers_both_ways(engine: Any, prompt: list[int], top: dict[int, float], also: tuple[int, ...] = ()):
    """Three answers inside ``top`` (the prompt's top next tokens), ``also``, and one outside it, scored
    both ways: (the fast path's logprobs, the pair-by-pair ones), one float per answer each."""
    inside = sorted(top, key=top.get)[:3]
    outside = next(t for t in range(100, 1000) if t not in top)
    pairs = [(prompt, [t]) for t in [*inside, *also, outside]]
    fast = engine.logprobs(pairs)
    engine.next_token_top_k = 0
    try:
        slow = engine.logprobs(pairs)
    finally:
        engine.next_token_top_k = 20
    return [r[0] for r in fast], [r[0] for r in slow]
