"""Reward models by name (DESIGN.md, Contracts: RewardModel): one entry per reward, one factory each.

``build_reward(name, engine)`` returns a RewardModel, or None for ``"none"`` (methods that use no reward).
A factory gets the run's engine: model-based rewards (``lm_judge``) score with it, rule-based ones
ignore it. Left out: separate reward-model checkpoints (HF sequence-classification ORMs/PRMs) and reward
parameters from the run spec; every reward is built with its defaults.
"""

from __future__ import annotations

from collections.abc import Callable

from srd_worker.engines.base import Engine
from srd_worker.errors import ConfigError
from srd_worker.rewards.arithmetic import ArithmeticReward
from srd_worker.rewards.base import RewardModel
from srd_worker.rewards.lm_judge import LMJudgeReward

RewardFactory = Callable[[Engine | None], RewardModel | None]


def _lm_judge(engine: Engine | None) -> RewardModel:
    if engine is None:
        raise ConfigError("reward 'lm_judge' scores with the run's model and needs an engine")
    return LMJudgeReward(engine)


REWARDS: dict[str, RewardFactory] = {
    "arithmetic": lambda engine: ArithmeticReward(),
    "lm_judge": _lm_judge,
    "none": lambda engine: None,
}


def build_reward(name: str, engine: Engine | None) -> RewardModel | None:
    """The reward model called ``name``; None for ``"none"``. Raises ConfigError for an unknown name."""
    try:
        factory = REWARDS[name]
    except KeyError:
        raise ConfigError(f"unknown reward '{name}'; choose one of: {', '.join(sorted(REWARDS))}") from None
    return factory(engine)
