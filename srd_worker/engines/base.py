"""The Engine contract (DESIGN.md, Contracts): batch in, batch out, order kept.

A request carries prompt token ids (prompt + kept prefix), so continuing a partial trajectory never
re-tokenises text. Methods import only this module, never an engine implementation.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

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


def answer_groups(
    pairs: Sequence[tuple[Sequence[int], Sequence[int]]], indices: Sequence[int]
) -> dict[tuple[int, ...], list[int]]:
    """The pairs among ``indices`` whose continuation is one token, by prefix, where a prefix has more
    than one (a judge's candidate answers): engines that can read a prefix's next-token top logprobs in
    one request score each group so (``read_answers``)."""
    groups: dict[tuple[int, ...], list[int]] = {}
    for i in indices:
        prefix, cont = pairs[i]
        if len(cont) == 1:
            groups.setdefault(tuple(int(t) for t in prefix), []).append(i)
    return {prefix: members for prefix, members in groups.items() if len(members) > 1}


def read_answers(
    pairs: Sequence[tuple[Sequence[int], Sequence[int]]],
    groups: dict[tuple[int, ...], list[int]],
    tops: Sequence[dict[int, float]],
) -> dict[int, float]:
    """Pair index -> the logprob of its one continuation token, read from its group's next-token top
    logprobs ``tops`` (one per group, in ``groups``' order); a token outside its top is left out (the
    engine scores that pair alone)."""
    found = {}
    for members, top in zip(groups.values(), tops, strict=True):
        for i in members:
            lp = top.get(int(pairs[i][1][0]))
            if lp is not None:
                found[i] = lp
    return found


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
    max_context: int

    @property
    def tokenizer(self) -> Tokenizer:
        """The engine's tokenizer (read-only: an engine may keep a richer one, such as ``HFTokenizer``)."""
        ...

    def generate(self, requests: Sequence[GenerationRequest]) -> list[Generation]:
        """Sample one continuation per request, returned in input order."""
        ...

    def logprobs(self, pairs: Sequence[tuple[Sequence[int], Sequence[int]]]) -> list[list[float]]:
        """Teacher-forced log-probabilities of each continuation token given its prefix, per pair."""
        ...


@runtime_checkable
class PolicyGradients(Protocol):
    """Differentiable access to the policy model, what an engine declaring ``CAP_GRADIENTS`` offers as
    ``engine.gradients`` (gradient-based decoding, ALGORITHMS.md §9; the transformers implementation is
    ``engines/gradients.py``). Tensors are torch tensors on the model's device; the weights stay frozen
    (gradients flow only to the soft inputs). A soft segment is an ``[L, V]`` matrix of (straight-through)
    one-hot rows over the policy's vocabulary, embedded as ``soft @ W_in``."""

    vocab_size: int

    def vocab_tokens(self) -> list[str | None]:
        """The token string of every id (None for ids the tokenizer does not define)."""
        ...

    def teacher_forced_logits(self, prefix_ids: Sequence[int], tokens: Sequence[int]) -> Any:
        """``[len(tokens), V]`` float32 logits predicting each of ``tokens`` after ``prefix_ids`` (no grad)."""
        ...

    def soft_logits(self, segments: Sequence[Any]) -> Any:
        """``[T, V]`` float32 logits at every position of the concatenated ``segments`` (token id lists, or
        soft ``[L, V]`` matrices); differentiable w.r.t. the soft segments."""
        ...

    def teacher_forced_hidden(self, prefix_ids: Sequence[int], tokens: Sequence[int]) -> Any:
        """``[len(tokens), d]`` final hidden states (after the last norm) at the positions whose logits
        predict each of ``tokens`` (no grad): ``project`` of them gives ``teacher_forced_logits``."""
        ...

    def project(self, hidden: Any) -> Any:
        """Float32 logits of hidden states through the output head; differentiable w.r.t. ``hidden``."""
        ...


def policy_gradients(engine: Engine) -> PolicyGradients:
    """``engine.gradients`` of an engine that declares ``CAP_GRADIENTS``; CapabilityError otherwise."""
    from srd_worker.errors import CapabilityError

    grads = getattr(engine, "gradients", None) if CAP_GRADIENTS in engine.capabilities else None
    if grads is None:
        raise CapabilityError(
            f"engine '{engine.name}' does not provide '{CAP_GRADIENTS}' (gradients w.r.t. input embeddings)"
        )
    return grads


# ---------------------------------------------------------------------------------------------------
# Speculative decoding (engines that declare CAP_FULL_LOGITS): a draft model proposes tokens, the engine's
# own model verifies them; the acceptance rule is the method's (pure math, ``methods/speculative_rules.py``).


@dataclass
class SpecStep:
    """What a verification rule sees for one row in one draft-and-verify iteration (numpy arrays, one
    row per drafted position, columns = the shared vocabulary). ``q`` and ``p`` are the *processed*
    distributions (temperature → top-k → top-p → renormalised; one-hot at the argmax when greedy) of the
    draft at positions 1..γ and of the target at positions 1..γ+1; ``q_logits`` / ``p_logits`` are the
    raw logits (temperature 1, nothing filtered) at the same positions."""

    draft_tokens: list[int]
    q: Any
    p: Any
    q_logits: Any
    p_logits: Any
    greedy: bool


@dataclass
class Verdict:
    """A rule's decision: keep the first ``accepted`` draft tokens, then emit ``token`` (the correction at
    the first rejected position, or the bonus token when all γ were accepted). ``counts`` are the rule's
    own counters for this iteration (e.g. ``rescued``, ``easd_rejected``), summed per request."""

    accepted: int
    token: int
    counts: dict[str, int] = field(default_factory=dict)


class VerifyRule(Protocol):
    def verify(self, row: int, step: SpecStep, rng: Any) -> Verdict:
        """Decide one iteration of request ``row``; ``rng`` is that request's ``numpy.random.Generator``
        (seeded from the request seed), the only source of randomness a rule may use."""
        ...

    def emitted(self, row: int, kept: int) -> None:
        """After every ``verify`` of ``row``: the harness emitted only the first ``kept`` tokens of its
        verdict (the kept draft tokens, then the verdict's token; fewer when EOS, a stop string or the
        budget cut them). A rule that counts what it met (CSD's memory) takes back what it counted past
        them; a stateless rule does nothing."""
        ...


@dataclass
class SpeculativeGeneration(Generation):
    """A ``Generation`` plus the harness counters of its request: ``draft_forward_passes``,
    ``target_forward_passes``, ``iterations``, ``drafted`` (draft tokens proposed), ``accepted`` (draft
    tokens kept, before the cut at EOS / stop / budget) and the rule's ``counts``."""

    stats: dict[str, int] = field(default_factory=dict)


@runtime_checkable
class SpeculativeEngine(Protocol):
    """An engine that can run draft-and-verify decoding (declares ``CAP_FULL_LOGITS``). Not part of the
    ``Engine`` check: the vLLM engine does not implement it."""

    def speculate(
        self,
        requests: Sequence[GenerationRequest],
        rule: VerifyRule,
        *,
        draft_model: str,
        gamma: int,
    ) -> list[SpeculativeGeneration]:
        """Continue every request (prompt ids + sampling parameters + seed + token budget) with draft model
        ``draft_model`` proposing ``gamma`` tokens per iteration and ``rule`` deciding, in input order."""
        ...
