"""The RewardModel contract (DESIGN.md, Contracts; ALGORITHMS.md §0.2).

``score(prompts, responses)`` returns one float per (question, partial-or-full response) pair, in input
order. ``prompts`` are the task's question text (what a user asked, with context where the task has
some), NOT the chat-templated policy prompt; responses are decoded text, possibly cut mid-sentence:
rewards on partial responses are first-class (SRD and Speculative Rejection score prefixes).
Raw scales differ between reward models; never compare raw rewards across models.

A reward may also accept ``finished=[bool, ...]``: True where the response is complete (ended with EOS
or a stop string), so the end of the text can be judged as final (a PRM's last step, an arithmetic claim
at the very end). Methods pass it to rewards whose ``score`` takes that keyword; others never see it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol, runtime_checkable


@runtime_checkable
class RewardModel(Protocol):
    name: str

    def score(self, prompts: Sequence[str], responses: Sequence[str]) -> list[float]: ...


def accepts_finished(reward: object) -> bool:
    """True if ``reward.score`` takes the optional ``finished`` keyword."""
    import inspect

    score = getattr(reward, "score", None)
    if not callable(score):
        return False
    try:
        params = inspect.signature(score).parameters
    except (TypeError, ValueError):
        return False
    return "finished" in params or any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())


@runtime_checkable
class DifferentiableReward(Protocol):
    """A reward whose score is differentiable w.r.t. soft response tokens (∇-Reasoner, ALGORITHMS.md §9).

    ``soft_score(question, prefix, soft, policy_vocab)`` is the reward of the response ``prefix`` (text)
    followed by the soft tokens ``soft`` (a torch ``[L, V]`` matrix of straight-through one-hot rows over
    the POLICY's vocabulary), under the same template as ``score``, as a differentiable torch scalar.
    ``policy_vocab`` is the policy's token string per id: the reward maps the soft rows into its own
    embedding space by token-string correspondence (``vocab_overlap`` says how much of the policy's
    vocabulary found a counterpart; the rest embeds as zero). Implemented by ``hf-orm``, ``hf-prm`` and
    ``lm_judge`` (the last only over an engine with gradients); rule-based rewards cannot be differentiated.
    ``soft_forward_passes`` counts the reward-model forwards made for soft scores.
    """

    name: str

    def soft_score(
        self, question: str, prefix: str, soft: Any, policy_vocab: Sequence[str | None]
    ) -> Any: ...

    def vocab_overlap(self, policy_vocab: Sequence[str | None]) -> float: ...


def differentiable(reward: object) -> bool:
    """True if ``reward`` offers a differentiable score (``DifferentiableReward``) and says it can use it
    (``lm_judge`` cannot over an engine without gradients)."""
    return isinstance(reward, DifferentiableReward) and bool(getattr(reward, "can_differentiate", True))


def scoring_engine(engine: Any, reward: str, batch_size: int) -> Any:
    """``engine`` if a reward named ``reward`` can score with it (teacher-forced ``logprobs``) in batches
    of ``batch_size``; ``RewardError`` / ``CapabilityError`` naming the reward otherwise."""
    from srd_worker.engines.base import CAP_LOGPROBS
    from srd_worker.errors import CapabilityError, RewardError

    if batch_size < 1:
        raise RewardError(f"batch_size must be >= 1, got {batch_size}")
    if CAP_LOGPROBS not in engine.capabilities:
        raise CapabilityError(
            f"the {reward} reward needs an engine with '{CAP_LOGPROBS}'; "
            f"engine '{engine.name}' has {sorted(engine.capabilities)}"
        )
    return engine
