"""The Engine contract (DESIGN.md, Contracts): batch in, batch out, order kept.

A request carries prompt token ids (prompt + kept prefix), so continuing a partial trajectory never
re-tokenises text. Methods import only this module, never an engine implementation.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

#: Capabilities an engine may declare. Methods list the ones they need; the registry checks the pair.
CAP_SAMPLING = "sampling"
CAP_LOGPROBS = "logprobs"  # per-token logprobs of sampled tokens and teacher-forced scoring
CAP_FULL_LOGITS = "full_logits"  # full next-token distributions (speculative decoding family)
CAP_GRADIENTS = "gradients"  # gradients w.r.t. input embeddings (gradient-based decoding)


@dataclass(frozen=True)
class SamplingParams:
    """How to sample one continuation. ``temperature == 0`` means greedy decoding."""

    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0  # 0 or negative = no top-k filter
    max_new_tokens: int = 256
    stop: tuple[str, ...] = ()
    seed: int | None = None
    logprobs: bool = False

    def __post_init__(self) -> None:
        if self.temperature < 0:
            raise ValueError(f"temperature must be >= 0, got {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if self.max_new_tokens < 0:
            raise ValueError(f"max_new_tokens must be >= 0, got {self.max_new_tokens}")


@dataclass(frozen=True)
class GenerationRequest:
    prompt_ids: tuple[int, ...]
    params: SamplingParams = field(default_factory=SamplingParams)


@dataclass
class Generation:
    """One continuation. ``token_ids`` holds every sampled token, the EOS token included when it was
    sampled (so ``len(token_ids)`` is the number of generated tokens); ``text`` is their decoding with
    special tokens skipped. ``finish_reason`` is ``"eos"``, ``"stop"`` (a stop string) or ``"length"``."""

    token_ids: list[int]
    text: str
    finish_reason: str
    logprobs: list[float] | None = None

    @property
    def finished(self) -> bool:
        """True when the sequence ended by itself (EOS or a stop string), not by the length cap."""
        return self.finish_reason in ("eos", "stop")


def token_budget(index: int, request: GenerationRequest, max_context: int) -> int:
    """How many tokens request ``index`` may generate: its ``max_new_tokens``, cut to what the context has
    left. An empty prompt, or one that fills the context, is an ``EngineError`` naming the request."""
    from srd_worker.errors import EngineError

    if not request.prompt_ids:
        raise EngineError(f"request {index} has an empty prompt")
    room = max_context - len(request.prompt_ids)
    if room <= 0:
        raise EngineError(
            f"request {index}: prompt of {len(request.prompt_ids)} tokens does not fit the context of {max_context}"
        )
    return min(request.params.max_new_tokens, room)


@runtime_checkable
class Tokenizer(Protocol):
    eos_token_ids: frozenset[int]

    def encode(self, text: str) -> list[int]: ...

    def decode(self, ids: Sequence[int]) -> str: ...

    def chat_prompt_ids(
        self, messages: Sequence[dict[str, str]], *, add_generation_prompt: bool = True
    ) -> list[int]:
        """Token ids of the chat template applied to ``messages``."""
        ...


@runtime_checkable
class Engine(Protocol):
    """A generation engine. Implementations: transformers (CPU/GPU), vLLM (GPU or vLLM's CPU build,
    optional extra).

    Optional ``close() -> None`` (not part of the structural check): release what the engine holds
    beyond Python memory (vLLM's engine-core and worker processes). Idempotent; the engine is unusable
    afterwards. Whoever built the engine closes it: ``run_local`` in a ``finally`` (run end, error,
    Ctrl-C), a worker's ``EngineCache.close()`` at process shutdown. The transformers engine's is a no-op.
    """

    name: str
    capabilities: frozenset[str]
    tokenizer: Tokenizer
    max_context: int

    def generate(self, requests: Sequence[GenerationRequest]) -> list[Generation]:
        """Sample one continuation per request, returned in input order."""
        ...

    def logprobs(self, pairs: Sequence[tuple[Sequence[int], Sequence[int]]]) -> list[list[float]]:
        """Teacher-forced log-probabilities of each continuation token given its prefix, per pair."""
        ...
