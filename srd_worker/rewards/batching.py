"""Token-budget batching for neural reward models: long prefixes never share a batch that would not fit.

``pack_batches(lengths, max_tokens)`` sorts the sequences by length (longest first, so a batch that does
not fit in memory fails on the first call rather than after many) and packs consecutive ones while the
padded batch ``len(batch) * longest`` stays within ``max_tokens``. A sequence longer than the budget on its
own gets a batch of its own (it cannot be split). The batches hold input indices, so callers write each
score back to its input position and the output order is the input order.
"""

from __future__ import annotations

from collections.abc import Sequence

from srd_worker.errors import RewardError


def pack_batches(lengths: Sequence[int], max_tokens: int) -> list[list[int]]:
    """Input indices grouped into batches whose padded size (count x longest) is at most ``max_tokens``."""
    if max_tokens < 1:
        raise RewardError(f"max_tokens_per_batch must be >= 1, got {max_tokens}")
    order = sorted(range(len(lengths)), key=lambda i: (-lengths[i], i))
    batches: list[list[int]] = []
    current: list[int] = []
    longest = 0
    for i in order:
        n = max(int(lengths[i]), 1)
        width = max(longest, n)
        if current and width * (len(current) + 1) > max_tokens:
            batches.append(current)
            current, width = [], n
        current.append(i)
        longest = width
    if current:
        batches.append(current)
    return batches


def cut_at_stop(text: str, stop: Sequence[str]) -> str:
    """``text`` up to the first occurrence of any stop string (the stop string removed)."""
    cut = len(text)
    for s in stop:
        if s:
            k = text.find(s)
            if k != -1:
                cut = min(cut, k)
    return text[:cut]
