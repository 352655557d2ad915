"""Fault injection for the isolation tests (srd_worker/isolation.py): wrappers around a REAL engine or
reward that raise on chosen requests, used by the unit tests directly and by the fleet test through
``tests/integration/fault_cli.py`` (a real worker process whose engine registry builds wrapped engines).
Nothing here is imported by the product."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from srd_worker.engines.base import Generation, GenerationRequest


class FaultyEngine:
    """A real engine that fails like a broken request or a full GPU would.

    - ``poison``: a request whose decoded prompt contains this text raises ``RuntimeError`` (the whole
      batch fails, as a real engine's batch does when one prompt breaks it);
    - ``oom_above``: a batch of more requests than this raises ``torch.OutOfMemoryError``;
    - ``oom_poison``: a request whose prompt contains this text raises ``torch.OutOfMemoryError``
      whatever the batch size (an item too big even alone);
    - ``fail_all``: every call raises this exception (an engine broken for everything);
    - ``per_request``: generate request by request, so results do not depend on the batch composition
      (lets a test compare a run that split batches with one that did not, exactly).

    ``batches`` records the size of every batch that reached the wrapped engine.
    """

    def __init__(
        self,
        inner: Any,
        *,
        poison: str | None = None,
        oom_above: int | None = None,
        oom_poison: str | None = None,
        fail_all: BaseException | None = None,
        per_request: bool = False,
    ) -> None:
        self.inner = inner
        self.name = inner.name
        self.capabilities = inner.capabilities
        self.tokenizer = inner.tokenizer
        self.max_context = inner.max_context
        self.poison, self.oom_above, self.oom_poison = poison, oom_above, oom_poison
        self.fail_all, self.per_request = fail_all, per_request
        self.batches: list[int] = []

    def _check(self, requests: Sequence[GenerationRequest]) -> None:
        import torch

        if self.fail_all is not None:
            raise self.fail_all
        if self.oom_above is not None and len(requests) > self.oom_above:
            raise torch.OutOfMemoryError(
                f"injected: {len(requests)} requests do not fit (at most {self.oom_above})"
            )
        for i, req in enumerate(requests):
            text = self.tokenizer.decode(list(req.prompt_ids))
            if self.oom_poison and self.oom_poison in text:
                raise torch.OutOfMemoryError(f"injected: request {i} does not fit even alone")
            if self.poison and self.poison in text:
                raise RuntimeError(f"injected fault: request {i} contains {self.poison!r}")

    def generate(self, requests: Sequence[GenerationRequest]) -> list[Generation]:
        self._check(requests)
        self.batches.append(len(requests))
        if self.per_request:
            return [self.inner.generate([req])[0] for req in requests]
        return self.inner.generate(requests)

    def logprobs(self, pairs: Sequence[tuple[Sequence[int], Sequence[int]]]) -> list[list[float]]:
        return self.inner.logprobs(pairs)


class FaultyReward:
    """A real reward that raises ``ValueError`` for any question containing ``poison`` (the call fails
    after the method drafted: the states were already changed when it raises)."""

    def __init__(self, inner: Any, poison: str) -> None:
        self.inner, self.poison = inner, poison
        self.name = inner.name

    def score(self, prompts: Sequence[str], responses: Sequence[str], **kwargs: Any) -> list[float]:
        for i, prompt in enumerate(prompts):
            if self.poison in prompt:
                raise ValueError(f"injected reward fault: prompt {i} contains {self.poison!r}")
        return self.inner.score(prompts, responses, **kwargs)
