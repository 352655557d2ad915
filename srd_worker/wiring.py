"""One ``wire(spec)``: the method, engine, reward and task a run spec names, built and checked the same
way on every path (``srdq run`` in ``local.py``, a fleet worker in ``service.py``).

``check_spec`` is the static half of the check: the method's needs against the engine's declared
capabilities (``engines.registry``, no model loaded) and the reward it needs. It runs at submit time on
both paths (``spec.prepare_run``, and again in ``service.submit`` before anything is stored), and
``wire`` runs it again before building anything, then checks the built engine's own capabilities.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from srd_worker.engines.base import Engine
from srd_worker.methods.base import Method
from srd_worker.rewards.base import RewardModel
from srd_worker.tasks.base import Task

if TYPE_CHECKING:
    from srd_worker.settings import Settings


@dataclass
class Wired:
    method: Method
    engine: Engine
    reward: RewardModel | None
    task: Task


def check_spec(method: Method, *, engine: str, reward: str | None) -> None:
    """Refuse ``method`` on the engine named ``engine`` (by its static capabilities) or without a
    reward it needs: ``CapabilityError`` / ``ConfigError``. Builds and imports nothing heavy."""
    from srd_worker.engines.registry import engine_capabilities
    from srd_worker.methods.registry import check_compatible
    from srd_worker.rewards.registry import reward_differentiable

    check_compatible(
        method,
        engine_name=engine,
        capabilities=engine_capabilities(engine),
        has_reward=reward is not None,
        reward_name=reward,
        reward_differentiable=None if reward is None else reward_differentiable(reward),
    )
    draft = getattr(method.params, "draft_model", None)
    if draft:  # speculative decoding: the draft model must exist before anything is stored
        from srd_worker.engines.speculative import check_draft_model

        check_draft_model(draft)


def check_task(method: Method, task: Task) -> None:
    """Refuse a task whose stop strings ``method`` would not honour (it does not sample through
    ``StepContext.generate``: ``nabla_reasoner`` and the speculative family): ``ConfigError``."""
    from srd_worker.errors import ConfigError

    if getattr(task, "stop", ()) and not method.honours_stop:
        raise ConfigError(
            f"task {task.name!r} has stop strings, which method {method.name!r} does not apply (it decodes "
            "token by token itself); remove `stop` from the task file or choose another method"
        )


def probe_sources(spec: Any, *, settings: Settings | None = None, everything: bool = True) -> None:
    """Check that the models a spec names can be loaded (``engines.loading.probe_model``: a folder's
    config, weights and tokenizer, a built-in model's package, a cached hub id), for the policy and for
    a reward or judge backed by a model: ``ModelLoadError`` before anything is written. ``everything``
    (``srdq run``: the models must be on this machine); otherwise (``srdq submit``: the workers load
    them) only names that are folders here are checked. The openai engine's model is on its server."""
    from pathlib import Path

    from srd_worker.engines.loading import probe_model
    from srd_worker.rewards.registry import MODEL_REWARDS, parse_reward_name

    def probe(name: str, what: str, remote: bool) -> None:
        if everything or Path(name).exists():
            probe_model(name, what=what, allow_remote=remote)

    if spec.engine != "openai":
        probe(spec.model, "model", spec.engine == "vllm")
    reward = spec.reward
    if reward and ":" in reward and reward.partition(":")[0] in MODEL_REWARDS:
        kind, model, _style = parse_reward_name(reward)
        judge_engine = settings.judge_engine if settings is not None else "transformers"
        if kind in ("judge", "judge-step") and judge_engine == "openai":
            return
        remote = kind == "vllm-rm" or (kind in ("judge", "judge-step") and judge_engine == "vllm")
        probe(model, f"reward model ({kind})", remote)


def wire(spec: Any, *, settings: Settings, engine: Engine | None = None) -> Wired:
    """Build what ``spec`` (a ``spec.RunSpec``, the layer above, so not named in the signature) runs with:
    the method from its name and params, the engine (``engine`` if given, e.g. a worker's cached one, else
    built from ``spec.engine`` and ``spec.model``),
    the reward over that engine, and the task with its ``--field`` mapping. Raises before building the
    engine when the spec is incompatible, and after when the built engine lacks a capability."""
    from srd_worker.engines.registry import build_engine
    from srd_worker.methods.registry import build_method, check_compatible
    from srd_worker.rewards.base import differentiable
    from srd_worker.rewards.registry import build_reward
    from srd_worker.tasks.registry import get_task

    method = build_method(spec.method, spec.params)
    check_spec(method, engine=spec.engine, reward=spec.reward)
    task = get_task(spec.task, fields=spec.fields, definition=getattr(spec, "task_def", None))
    check_task(method, task)
    if engine is None:
        engine = build_engine(spec.engine, spec.model, settings)
    reward = build_reward(spec.reward, engine, settings=settings) if spec.reward else None
    check_compatible(
        method,
        engine_name=engine.name,
        capabilities=engine.capabilities,
        has_reward=reward is not None,
        reward_name=spec.reward,
        reward_differentiable=None if reward is None else differentiable(reward),
    )
    return Wired(method=method, engine=engine, reward=reward, task=task)
