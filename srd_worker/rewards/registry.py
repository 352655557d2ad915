"""Reward models by name (DESIGN.md, Contracts: RewardModel): one entry per reward, one factory each.

``build_reward(name, engine)`` returns a RewardModel, or None for ``"none"`` (methods that use no reward).
A factory gets the run's engine: model-based rewards (``lm_judge``) score with it, rule-based ones
ignore it.

Separate reward-model checkpoints are named ``KIND:MODEL`` (``MODEL_REWARDS``):

- ``hf-orm:MODEL`` — HF sequence-classification ORM, scalar logit (``rewards.hf_orm``; AceMath-7B-RM);
  ``hf-orm:testbed-rm`` is the CPU testbed's committed RM (``MODEL_ALIASES``);
- ``hf-prm:MODEL[:STYLE]`` — HF process RM, last completed step (``rewards.hf_prm``); STYLE is ``qwen``
  (Qwen2.5-Math-PRM) or ``skywork`` (Skywork-o1-Open-PRM), default ``skywork`` when the model name
  contains "skywork", else ``qwen``. A MODEL holding ":" is not supported;
- ``vllm-rm:MODEL`` — a vLLM pooling/reward model (``rewards.vllm_reward``; needs ``srdq[vllm]``);
- ``openai-rm:MODEL`` — a reward model on a model server (``rewards.openai_reward``: vLLM's ``/pooling``
  at ``SRDQ_RM_BASE_URL``, MODEL the served name), for workers that hold no model.

``check_reward_name`` validates a name at submit time by its prefix only (the checkpoint is not looked
up). The HF adapters run on ``Settings.device`` in ``Settings.dtype``; the vLLM one takes
``0.9 - Settings.gpu_memory_utilization`` of the GPU (the generator has the rest). Checkpoint rewards are
built once per process and reused (a 7B RM is not reloaded for every shard). Left out: reward parameters
from the run spec (batch budget, step separator, system prompt): every reward is built with its defaults.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from srd_worker.engines.base import Engine
from srd_worker.errors import ConfigError
from srd_worker.paths import TESTBED_ARTIFACTS_DIR
from srd_worker.plugins import Entry, Registry
from srd_worker.rewards.base import RewardModel
from srd_worker.settings import resolve_dtype

if TYPE_CHECKING:
    from srd_worker.settings import Settings

log = logging.getLogger("srdq.rewards")


@dataclass(frozen=True)
class RewardEntry(Entry):
    """A reward named by a word (``arithmetic``); its factory gets the run's engine (None without one)."""

    factory: Callable[[Engine | None], RewardModel | None]
    needs_engine: bool  # scores with the run's own model
    differentiable: bool  # can give a differentiable score (rewards/base.py DifferentiableReward)


@dataclass(frozen=True)
class ModelRewardEntry(Entry):
    """A ``KIND:MODEL`` reward backed by a checkpoint of its own; its factory gets (model, PRM style or
    None, settings) and imports its library only when called."""

    factory: Callable[[str, str | None, Any], RewardModel]
    differentiable: bool


def _arithmetic(engine: Engine | None) -> RewardModel:
    from srd_worker.rewards.arithmetic import ArithmeticReward

    return ArithmeticReward()


def _lm_judge(engine: Engine | None) -> RewardModel:
    if engine is None:
        raise ConfigError("reward 'lm_judge' scores with the run's model and needs an engine")
    from srd_worker.rewards.lm_judge import LMJudgeReward

    return LMJudgeReward(engine)


def _logprob(engine: Engine | None) -> RewardModel:
    if engine is None:
        raise ConfigError("reward 'logprob' reads the run's model's logprobs and needs an engine")
    from srd_worker.rewards.logprob import MeanLogprobReward

    return MeanLogprobReward(engine)


def _none(engine: Engine | None) -> None:
    return None


REWARDS: Registry[RewardEntry] = Registry(
    "reward",
    [
        RewardEntry(
            name="arithmetic",
            summary="rule-based: checks the arithmetic of each `a op b = c` step (no model)",
            factory=_arithmetic,
            needs_engine=False,
            differentiable=False,
        ),
        RewardEntry(
            name="lm_judge",
            summary="the run's own model asked whether the partial solution is correct (P(Yes))",
            factory=_lm_judge,
            needs_engine=True,
            differentiable=True,
        ),
        RewardEntry(
            name="logprob",
            summary="the mean log-probability of the response under the run's own model",
            factory=_logprob,
            needs_engine=True,
            differentiable=False,
        ),
        RewardEntry(
            name="none", summary="no reward model", factory=_none, needs_engine=False, differentiable=False
        ),
    ],
)


def _batch_budget(settings: Settings) -> dict[str, Any]:
    """``max_tokens_per_batch`` from SRDQ_RM_MAX_BATCH_TOKENS when set; else nothing, so each reward keeps
    its constructor's own default."""
    n = settings.rm_max_batch_tokens
    return {} if n is None else {"max_tokens_per_batch": int(n)}


def _hf_orm(model: str, style: str | None, settings: Settings) -> RewardModel:
    from srd_worker.engines.loading import apply_attention_settings
    from srd_worker.rewards.hf_orm import HFOutcomeReward

    apply_attention_settings(settings)
    return HFOutcomeReward(
        model,
        device=settings.device,
        dtype=settings.dtype,
        **_batch_budget(settings),
    )


def _hf_prm(model: str, style: str | None, settings: Settings) -> RewardModel:
    from srd_worker.engines.loading import apply_attention_settings
    from srd_worker.rewards.hf_prm import HFProcessReward

    apply_attention_settings(settings)
    return HFProcessReward(
        model,
        style=style or "qwen",
        device=settings.device,
        dtype=settings.dtype,
        **_batch_budget(settings),
    )


def _vllm_rm(model: str, style: str | None, settings: Settings) -> RewardModel:
    from srd_worker.rewards.vllm_reward import VLLMReward

    share = round(0.9 - float(settings.gpu_memory_utilization), 3)
    if share < 0.05:
        raise ConfigError(
            f"vllm-rm needs GPU memory beside the generator: SRDQ_GPU_MEMORY_UTILIZATION="
            f"{settings.gpu_memory_utilization} leaves {share} of 0.9; lower it (e.g. 0.6)"
        )
    return VLLMReward(
        model,
        gpu_memory_utilization=share,
        dtype=resolve_dtype(settings.dtype, "cuda"),  # vllm-rm runs beside the generator on a GPU
        tensor_parallel_size=settings.tensor_parallel_size,
        **_batch_budget(settings),
    )


def rm_server_url(settings: Settings) -> str:
    """The ``openai-rm`` reward server's root URL from ``SRDQ_RM_BASE_URL`` (a trailing ``/v1`` dropped:
    vLLM serves ``/pooling`` at its root); ConfigError naming the setting when it is unset or not http(s)."""
    from srd_worker.engines.openai_engine import server_url

    base = server_url(
        settings.rm_base_url, "SRDQ_RM_BASE_URL", "reward 'openai-rm:MODEL'", "http://127.0.0.1:8002/v1"
    )
    return base.rstrip("/").removesuffix("/v1")


def judge_server_url(settings: Settings) -> str:
    """The judge server's URL (``SRDQ_JUDGE_ENGINE=openai``) from ``SRDQ_JUDGE_BASE_URL``; ConfigError naming
    that setting when it is unset or not http(s)."""
    from srd_worker.engines.openai_engine import server_url

    return server_url(
        settings.judge_base_url, "SRDQ_JUDGE_BASE_URL", "SRDQ_JUDGE_ENGINE=openai", "http://127.0.0.1:8001/v1"
    )


def _openai_rm(model: str, style: str | None, settings: Settings) -> RewardModel:
    from srd_worker.engines.openai_engine import OpenAIClient, api_key
    from srd_worker.rewards.hf_common import load_tokenizer
    from srd_worker.rewards.openai_reward import OpenAIReward

    base = rm_server_url(settings)
    client = OpenAIClient(
        base,
        api_key=api_key(settings),
        timeout_s=float(settings.openai_timeout_s),
        retry_s=float(settings.openai_retry_s),
        concurrency=1,
    )
    source = settings.rm_tokenizer or model
    return OpenAIReward(
        model,
        client=client,
        tokenizer=load_tokenizer(MODEL_ALIASES.get(source, source)),
        tokenizer_source=source,
        **_batch_budget(settings),
    )


def _judge(model: str, style: str | None, settings: Settings) -> RewardModel:
    return _build_judge("judge", model, settings)


def _judge_step(model: str, style: str | None, settings: Settings) -> RewardModel:
    return _build_judge("judge-step", model, settings)


#: The ``KIND:MODEL`` kinds whose model is a judge, run on ``settings.judge_engine``.
JUDGE_KINDS = frozenset({"judge", "judge-step"})

#: ``KIND:MODEL`` rewards backed by a separate checkpoint (see the module docstring).
MODEL_REWARDS: Registry[ModelRewardEntry] = Registry(
    "reward kind",
    [
        ModelRewardEntry(
            name="hf-orm",
            summary="Hugging Face sequence-classification outcome RM (scalar logit), e.g. "
            "hf-orm:nvidia/AceMath-7B-RM",
            factory=_hf_orm,
            differentiable=True,
        ),
        ModelRewardEntry(
            name="hf-prm",
            summary="Hugging Face process RM, last completed step; hf-prm:MODEL[:qwen|skywork]",
            factory=_hf_prm,
            differentiable=True,
        ),
        ModelRewardEntry(
            name="vllm-rm",
            summary="vLLM pooling/reward model (needs srdq[vllm]), e.g. vllm-rm:nvidia/AceMath-7B-RM",
            factory=_vllm_rm,
            differentiable=False,
        ),
        ModelRewardEntry(
            name="openai-rm",
            summary="a reward model on a model server (vLLM's /pooling: raw logit of a classifier head) at "
            "SRDQ_RM_BASE_URL, MODEL its served name, its tokenizer read locally from SRDQ_RM_TOKENIZER",
            factory=_openai_rm,
            differentiable=False,
        ),
        ModelRewardEntry(
            name="judge",
            summary="another model judging the partial solution (P(Yes) as lm_judge), e.g. "
            "judge:qwen2.5-coder-1.5b; its engine: SRDQ_JUDGE_ENGINE (transformers, vllm, or openai at "
            "SRDQ_JUDGE_BASE_URL)",
            factory=_judge,
            differentiable=False,
        ),
        ModelRewardEntry(
            name="judge-step",
            summary="as judge:MODEL, asked whether the newest step (after a blank line) is correct: a "
            "process reward for beam_search / dvts",
            factory=_judge_step,
            differentiable=False,
        ),
    ],
)
PRM_STYLES = ("qwen", "skywork")
#: Reward-model names srdq resolves to a committed folder: ``hf-orm:testbed-rm`` is the CPU testbed's
#: outcome RM (``srd_worker/testbed``, ``srdq testbed build``).
MODEL_ALIASES: dict[str, str] = {
    "testbed-rm": str(TESTBED_ARTIFACTS_DIR / "rm"),
}

_BUILT: dict[tuple[Any, ...], RewardModel] = {}


def _choices() -> str:
    return f"choose one of: {', '.join(sorted(REWARDS))}; or a checkpoint as " + ", ".join(
        f"{k}:MODEL" for k in MODEL_REWARDS
    )


def parse_reward_name(name: str) -> tuple[str, str, str | None]:
    """(kind, model, PRM style or None) of a ``KIND:MODEL[:STYLE]`` name; ConfigError when malformed."""
    kind, sep, rest = name.partition(":")
    if not sep or kind not in MODEL_REWARDS:
        raise ConfigError(f"unknown reward '{name}'; {_choices()}")
    style = None
    if kind == "hf-prm" and ":" in rest:
        rest, _, style = rest.rpartition(":")
        if style not in PRM_STYLES:
            raise ConfigError(
                f"unknown PRM style '{style}' in reward '{name}'; choose one of: {', '.join(PRM_STYLES)}"
            )
    elif ":" in rest:
        raise ConfigError(f"reward '{name}': a model name must not contain ':'")
    if not rest.strip():
        raise ConfigError(
            f"reward '{name}' names no model; write {kind}:MODEL (a Hugging Face id or a local folder)"
        )
    if kind == "hf-prm" and style is None:
        style = "skywork" if "skywork" in rest.lower() else "qwen"
    if kind == "openai-rm":  # MODEL is the name a server serves it under, not a folder of ours
        return kind, rest, style
    return kind, MODEL_ALIASES.get(rest, rest), style


def reward_differentiable(name: str) -> bool:
    """True if the reward called ``name`` can give a differentiable score (decided by the name only; the
    LM judge also needs an engine with gradients, which the method's engine check covers)."""
    if name in REWARDS:
        return REWARDS[name].differentiable
    kind = name.partition(":")[0]
    return ":" in name and kind in MODEL_REWARDS and MODEL_REWARDS[kind].differentiable


def check_reward_name(name: str) -> None:
    """ConfigError unless ``name`` is a known reward or a well-formed ``KIND:MODEL`` (not looked up)."""
    if name not in REWARDS:
        parse_reward_name(name)


def _build_model_reward(name: str, settings: Settings | None) -> RewardModel:
    kind, model, style = parse_reward_name(name)
    if settings is None:
        from srd_worker.settings import get_settings

        settings = get_settings()
    key = (
        name,
        settings.device,
        settings.dtype,
        settings.tensor_parallel_size,
        settings.gpu_memory_utilization,
        settings.judge_engine,
        settings.judge_base_url,
        settings.rm_max_batch_tokens,
        settings.cudnn_attention,
        settings.rm_base_url,
        settings.rm_tokenizer,
        settings.openai_timeout_s,
        settings.openai_retry_s,
    )
    if key in _BUILT:
        return _BUILT[key]
    reward = MODEL_REWARDS.entry(kind).factory(model, style, settings)
    _BUILT[key] = reward
    return reward


def _build_judge(kind: str, model: str, settings: Settings) -> RewardModel:
    """``judge:MODEL`` / ``judge-step:MODEL``: an ``LMJudgeReward`` over an engine of its own for MODEL,
    of kind ``settings.judge_engine``; the openai kind talks to ``settings.judge_base_url``."""
    from srd_worker.engines.registry import ENGINES, build_engine

    engine_kind = settings.judge_engine
    if engine_kind not in ENGINES:
        raise ConfigError(f"SRDQ_JUDGE_ENGINE={engine_kind!r}: choose one of {', '.join(sorted(ENGINES))}")
    judge_settings = settings
    if engine_kind == "openai":
        url = judge_server_url(settings)
        judge_settings = settings.model_copy(update={"openai_base_url": url, "openai_tokenizer": None})
    from srd_worker.rewards.lm_judge import LMJudgeReward

    engine = build_engine(engine_kind, model, judge_settings)
    return LMJudgeReward(
        engine, mode="step" if kind == "judge-step" else "prefix", name=f"{kind}:{model}", separate=True
    )


def close_rewards() -> None:
    """Close every checkpoint reward built in this process that holds an engine of its own (a judge's
    vLLM processes) and forget them all."""
    for reward in list(_BUILT.values()):
        close = getattr(reward, "close", None)
        if callable(close):
            try:
                close()
            except Exception as exc:  # noqa: BLE001 - on the way out: one failure must not keep others open
                log.warning("closing reward %s: %s", getattr(reward, "name", reward), exc)
    _BUILT.clear()


def build_reward(name: str, engine: Engine | None, *, settings: Settings | None = None) -> RewardModel | None:
    """The reward model called ``name``; None for ``"none"``. Raises ConfigError for an unknown name.
    ``settings`` (device, dtype, GPU share) is read from the environment when not given."""
    if name in REWARDS:
        return REWARDS[name].factory(engine)
    return _build_model_reward(name, settings)
